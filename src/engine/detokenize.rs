//! Turning a stream of token ids into text deltas that never split a UTF-8
//! character: byte-level tokenizers emit a multi-byte character (é, 온, 🌡)
//! as several tokens, and the decoder shows U+FFFD until the last byte
//! arrives. Text is held back while it ends in U+FFFD.

use std::sync::Arc;

use tokenizers::Tokenizer;

const REPLACEMENT: char = '\u{FFFD}';

/// Incremental detokenizer over one answer.
pub struct StreamingDetokenizer {
    tokenizer: Arc<Tokenizer>,
    ids: Vec<u32>,
    /// Start of the window that is decoded again for context (decoders
    /// may drop a leading space when a piece is decoded alone).
    prefix_offset: usize,
    /// Ids before this position have been turned into emitted text.
    read_offset: usize,
    emitted: String,
    /// Leave special tokens out of the text (the default), or keep them
    /// where a reply format needs its markers (gpt-oss's harmony).
    skip_special_tokens: bool,
}

impl StreamingDetokenizer {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            emitted: String::new(),
            skip_special_tokens: true,
        }
    }

    /// A detokenizer whose text keeps special tokens (`<|channel|>`).
    pub fn keeping_special_tokens(tokenizer: Arc<Tokenizer>) -> Self {
        Self {
            skip_special_tokens: false,
            ..Self::new(tokenizer)
        }
    }

    fn decode(&self, ids: &[u32]) -> Result<String, tokenizers::Error> {
        self.tokenizer.decode(ids, self.skip_special_tokens)
    }

    /// Adds one token; returns the text that became complete (often empty
    /// while a character is still arriving).
    pub fn push(&mut self, id: u32) -> Result<String, tokenizers::Error> {
        self.ids.push(id);
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.decode(&self.ids[self.prefix_offset..])?;
        if full.len() <= prefix.len() || full.ends_with(REPLACEMENT) {
            return Ok(String::new());
        }
        let delta = match full.get(prefix.len()..) {
            Some(delta) if full.starts_with(&prefix) => delta.to_owned(),
            // The decoder rewrote the context (rare); emit what is new by
            // comparing with everything emitted so far.
            _ => {
                let all = self.decode(&self.ids)?;
                all.get(self.emitted.len()..).unwrap_or_default().to_owned()
            }
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.emitted.push_str(&delta);
        Ok(delta)
    }

    /// Ends the stream: whatever is still held back (an incomplete
    /// character at the very end) is returned as the decoder shows it.
    pub fn finish(&mut self) -> Result<String, tokenizers::Error> {
        let all = self.decode(&self.ids)?;
        let rest = all.get(self.emitted.len()..).unwrap_or_default().to_owned();
        self.emitted.push_str(&rest);
        self.read_offset = self.ids.len();
        self.prefix_offset = self.read_offset;
        Ok(rest)
    }

    /// All text emitted so far.
    pub fn text(&self) -> &str {
        &self.emitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::tokenizer::{TokenizerSpec, write_tokenizer};

    fn tokenizer() -> (tempfile::TempDir, Arc<Tokenizer>) {
        let dir = tempfile::tempdir().unwrap();
        write_tokenizer(
            &TokenizerSpec {
                vocab_size: 1024,
                seed: 3,
            },
            dir.path(),
        )
        .unwrap();
        let tokenizer = Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
        (dir, Arc::new(tokenizer))
    }

    #[test]
    fn deltas_add_up_to_the_whole_text_and_never_hold_half_a_character() {
        let (_dir, tokenizer) = tokenizer();
        let text = "La température monte: 온도 is 31°C 🦀🌡 — done.\nNext line";
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        let mut stream = StreamingDetokenizer::new(tokenizer.clone());
        let mut joined = String::new();
        for id in &ids {
            let delta = stream.push(*id).unwrap();
            assert!(
                !delta.contains(REPLACEMENT),
                "delta {delta:?} has a broken character"
            );
            joined.push_str(&delta);
        }
        joined.push_str(&stream.finish().unwrap());
        assert_eq!(joined, tokenizer.decode(&ids, true).unwrap());
        assert_eq!(joined, text);
    }

    #[test]
    fn special_tokens_are_left_out_unless_kept() {
        let (_dir, tokenizer) = tokenizer();
        let ids = tokenizer
            .encode("<|start_header_id|>assistant<|end_header_id|>hi", false)
            .unwrap()
            .get_ids()
            .to_vec();
        let stream_all = |mut stream: StreamingDetokenizer| {
            let mut text: String = ids.iter().map(|id| stream.push(*id).unwrap()).collect();
            text.push_str(&stream.finish().unwrap());
            text
        };
        assert_eq!(
            stream_all(StreamingDetokenizer::new(tokenizer.clone())),
            "assistanthi"
        );
        assert_eq!(
            stream_all(StreamingDetokenizer::keeping_special_tokens(
                tokenizer.clone()
            )),
            "<|start_header_id|>assistant<|end_header_id|>hi"
        );
    }

    #[test]
    fn a_character_split_over_byte_tokens_arrives_whole() {
        let (_dir, tokenizer) = tokenizer();
        // A crab is not in the training text, so it is four byte tokens.
        let ids = tokenizer.encode("🦀", false).unwrap().get_ids().to_vec();
        assert!(ids.len() > 1, "expected the emoji to be split, got {ids:?}");
        let mut stream = StreamingDetokenizer::new(tokenizer.clone());
        let (last, first) = ids.split_last().unwrap();
        for id in first {
            assert_eq!(stream.push(*id).unwrap(), "");
        }
        assert_eq!(stream.push(*last).unwrap(), "🦀");
    }

    #[test]
    fn a_truncated_character_at_the_end_is_flushed_as_the_decoder_shows_it() {
        let (_dir, tokenizer) = tokenizer();
        let ids = tokenizer.encode("ok 🦀", false).unwrap().get_ids().to_vec();
        let mut stream = StreamingDetokenizer::new(tokenizer.clone());
        for id in &ids[..ids.len() - 1] {
            stream.push(*id).unwrap();
        }
        // The space may travel with the emoji's first byte token.
        let held = stream.text();
        assert!(held == "ok" || held == "ok ", "{held:?}");
        let rest = stream.finish().unwrap();
        assert!(rest.contains(REPLACEMENT), "{rest:?}");
    }
}
