//! Prompts as text, for benchmarks that reach a server: a server takes
//! text, not token ids, so a prompt of N tokens is words added until a
//! tokenizer counts N (the model's own where Ondo has it, which is exact
//! up to a token or two; otherwise about four characters a token). Each
//! prompt starts with a different word, so no server's prompt cache can
//! carry one prompt's work into the next beyond the first token.

use std::path::Path;

use super::BenchError;

/// Ordinary words, none of them special to any tokenizer.
const WORDS: &[&str] = &[
    "river", "stone", "window", "garden", "letter", "morning", "silver", "forest", "number",
    "market", "winter", "yellow", "bridge", "candle", "doctor", "engine", "flower", "guitar",
    "harbor", "island", "jacket", "kitchen", "ladder", "mirror", "needle", "orange", "pencil",
    "quiet", "rabbit", "saddle", "ticket", "umbrella", "valley", "wagon", "anchor", "basket",
    "castle", "desert", "empire", "falcon", "glacier", "hammer", "insect", "jungle", "kettle",
    "lantern", "meadow", "nephew", "oyster", "parrot", "quarry", "ribbon", "shadow", "throne",
    "velvet", "walnut", "account", "balance", "cabinet", "dolphin", "eclipse", "fortune",
    "gallery", "harvest", "journey", "kingdom", "library", "machine", "network", "october",
    "passage", "quarter", "railway", "science", "thunder", "uniform", "village", "weather",
    "blanket", "compass", "diamond", "feather", "holiday", "lettuce", "mineral", "nothing",
    "picture", "reptile", "station", "teacher", "traffic", "volcano", "whistle", "airport",
    "battery", "chimney", "cottage", "cushion", "factory", "kitten", "monster", "octopus",
    "pumpkin", "sandals", "theatre", "tractor", "trumpet", "vampire", "biscuit", "captain",
    "cricket", "crystal", "curtain", "dentist", "element", "evening", "fiction", "freedom",
    "giraffe", "gravity", "history", "horizon", "lobster", "mustard", "notebook", "painter",
    "pyramid", "sunrise", "tornado", "whisper", "zephyr",
];

/// Words tried at the end to reach the count exactly.
const ONE_TOKEN_FILLERS: &[&str] = &["a", "I", "it", "is", "to", "of", "and", "the", "in"];

/// Characters per token where no tokenizer is at hand, as a rule of thumb
/// for English text.
pub const CHARACTERS_PER_TOKEN: usize = 4;

/// A prompt and its size.
#[derive(Debug, Clone, PartialEq)]
pub struct TextPrompt {
    pub text: String,
    /// Tokens as the sizing tokenizer counts them (its BOS included), or
    /// the estimate.
    pub tokens: usize,
}

/// How prompts are sized.
pub struct TextPrompts {
    /// The model whose tokenizer counts, with the tokenizer; `None`: by
    /// characters.
    tokenizer: Option<(String, tokenizers::Tokenizer)>,
}

impl TextPrompts {
    /// Sized with the tokenizer in `dir` (the model called `model`).
    pub fn with_tokenizer(model: &str, dir: &Path) -> Result<Self, BenchError> {
        let path = dir.join("tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(&path).map_err(|e| {
            BenchError::Plan(format!(
                "the tokenizer in {} could not be read to size the prompts: {e}",
                path.display()
            ))
        })?;
        Ok(Self {
            tokenizer: Some((model.to_owned(), tokenizer)),
        })
    }

    /// Sized at about `CHARACTERS_PER_TOKEN` characters a token.
    pub fn by_characters() -> Self {
        Self { tokenizer: None }
    }

    /// How the prompts were sized, for the report: "tiny's tokenizer".
    pub fn sizing(&self) -> String {
        match &self.tokenizer {
            Some((model, _)) => format!("{model}'s tokenizer"),
            None => format!("about {CHARACTERS_PER_TOKEN} characters a token"),
        }
    }

    /// Every id the tokenizer has text for (special tokens included), when
    /// prompts are sized by one.
    pub fn vocab_size(&self) -> Option<usize> {
        self.tokenizer
            .as_ref()
            .map(|(_, tokenizer)| tokenizer.get_vocab_size(true))
    }

    /// Whether the counts are exact (a tokenizer's) rather than estimates.
    pub fn counted(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// A prompt of about `tokens` tokens; `variant` picks its words, and
    /// different variants start with different words.
    pub fn prompt(&self, tokens: usize, variant: usize) -> Result<TextPrompt, BenchError> {
        let tokens = tokens.max(1);
        let Some((_, tokenizer)) = &self.tokenizer else {
            let mut text = String::new();
            let mut index = 0;
            while text.len() < tokens * CHARACTERS_PER_TOKEN {
                push_word(&mut text, word(variant, index));
                index += 1;
            }
            return Ok(TextPrompt {
                tokens: text.len().div_ceil(CHARACTERS_PER_TOKEN),
                text,
            });
        };
        let count = |text: &str| -> Result<usize, BenchError> {
            tokenizer
                .encode(text, true)
                .map(|e| e.get_ids().len())
                .map_err(|e| BenchError::Plan(format!("the prompt could not be tokenized: {e}")))
        };
        let words = |n: usize| {
            let mut text = String::new();
            for index in 0..n {
                push_word(&mut text, word(variant, index));
            }
            text
        };
        // Every word is at least one token, so `tokens` words are enough;
        // the largest count of words that stays within the size wins.
        let (mut low, mut high) = (1, tokens);
        while low < high {
            let middle = (low + high).div_ceil(2);
            if count(&words(middle))? <= tokens {
                low = middle;
            } else {
                high = middle - 1;
            }
        }
        let mut text = words(low);
        let mut counted = count(&text)?;
        'filling: while counted < tokens {
            for filler in ONE_TOKEN_FILLERS {
                let mut longer = text.clone();
                push_word(&mut longer, filler);
                let longer_count = count(&longer)?;
                if longer_count == counted + 1 {
                    text = longer;
                    counted = longer_count;
                    continue 'filling;
                }
            }
            break;
        }
        Ok(TextPrompt {
            text,
            tokens: counted,
        })
    }
}

fn push_word(text: &mut String, word: &str) {
    if !text.is_empty() {
        text.push(' ');
    }
    text.push_str(word);
}

/// The `index`th word of prompt `variant`: the first differs between
/// variants (for as many variants as there are words), the rest follow a
/// sequence seeded by the variant.
fn word(variant: usize, index: usize) -> &'static str {
    if index == 0 {
        return WORDS[variant % WORDS.len()];
    }
    let seed = (variant as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64;
    // SplitMix64's finaliser: well spread, and the same on every machine.
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    WORDS[(z % WORDS.len() as u64) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_tokenizer_prompts_are_four_characters_a_token() {
        let prompts = TextPrompts::by_characters();
        let prompt = prompts.prompt(128, 0).unwrap();
        assert!(prompt.text.len() >= 512 && prompt.text.len() < 512 + 12);
        assert_eq!(prompt.tokens, prompt.text.len().div_ceil(4));
        assert!(!prompts.counted());
        assert_eq!(prompts.sizing(), "about 4 characters a token");
    }

    #[test]
    fn variants_start_differently_and_repeat_exactly() {
        let prompts = TextPrompts::by_characters();
        let first_words: std::collections::HashSet<String> = (0..WORDS.len())
            .map(|v| {
                let text = prompts.prompt(64, v).unwrap().text;
                text.split(' ').next().unwrap().to_owned()
            })
            .collect();
        assert_eq!(first_words.len(), WORDS.len());
        let prompt = |variant| prompts.prompt(64, variant).unwrap();
        assert_eq!(prompt(3), prompt(3));
        assert_ne!(prompt(3), prompt(4));
    }

    #[test]
    fn with_the_models_tokenizer_prompts_count_what_was_asked() {
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::synth::tokenizer::TokenizerSpec {
            vocab_size: 2048,
            seed: 0,
        };
        crate::synth::tokenizer::write_tokenizer(&spec, dir.path()).unwrap();
        let prompts = TextPrompts::with_tokenizer("tiny", dir.path()).unwrap();
        assert!(prompts.counted());
        assert_eq!(prompts.sizing(), "tiny's tokenizer");
        let tokenizer =
            tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
        for (length, variant) in [(16, 0), (128, 5), (1000, 9)] {
            let prompt = prompts.prompt(length, variant).unwrap();
            let counted = tokenizer.encode(prompt.text.as_str(), true).unwrap().len();
            assert_eq!(prompt.tokens, counted, "the count is the tokenizer's");
            // Within a token or two: a word that would pass the size is left out.
            assert!(
                counted <= length && counted + 2 >= length,
                "{counted} for {length}"
            );
        }
    }
}
