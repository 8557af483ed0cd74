//! One request on a resident model: the prompt's tokens (chat template or
//! not), reuse of the conversation's cache, the steps, the text stream with
//! its stops, and the clocks (the only layer of the engine that reads them).

use std::time::{Duration, Instant};

use super::cache::LayerCache;
use super::chat_template::ChatMessage;
use super::detokenize::StreamingDetokenizer;
use super::generate::TokenSteps;
use super::load::LoadedModel;
use super::request::{CancelToken, GenerateRequest, Prompt, RunError, RunEvent};
use super::sample::Sampler;
use super::stats::{LoadKind, RunStats, StopReason, per_second};

/// A KV cache and the token ids it holds, kept between the turns of a
/// conversation.
pub struct Conversation {
    pub tokens: Vec<u32>,
    pub cache: Vec<LayerCache>,
    pub max_kv_size: Option<usize>,
}

impl Conversation {
    pub fn new(model: &LoadedModel, max_kv_size: Option<usize>) -> Self {
        Self {
            tokens: Vec::new(),
            cache: model.model.make_cache(max_kv_size),
            max_kv_size,
        }
    }

    /// Bytes the cache holds.
    pub fn kv_cache_bytes(&self) -> usize {
        self.cache.iter().map(LayerCache::nbytes).sum()
    }

    /// Keeps the longest prefix of the cached tokens that `prompt` starts
    /// with (at most all but its last token, which must run to give the
    /// first logits); returns how many prompt tokens are cached. A cache that
    /// cannot be trimmed exactly (a wrapped rotating cache) starts over.
    fn reuse_prefix(&mut self, model: &LoadedModel, prompt: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1));
        let cached = self.cache.first().map_or(0, |c| c.offset()) as usize;
        let drop = cached.saturating_sub(common);
        if common == 0 || (drop > 0 && !self.cache.iter().all(LayerCache::can_trim)) {
            *self = Conversation::new(model, self.max_kv_size);
            return 0;
        }
        for layer in &mut self.cache {
            layer.trim(drop as i32);
        }
        self.tokens.truncate(common);
        common
    }
}

/// The prompt's token ids and whether the chat template made them.
pub fn prompt_ids(model: &LoadedModel, prompt: &Prompt) -> Result<(Vec<u32>, bool), RunError> {
    let encode = |text: &str, add_special: bool| -> Result<Vec<u32>, RunError> {
        model
            .tokenizer
            .encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| RunError::Tokenizer(e.to_string()))
    };
    match prompt {
        Prompt::Tokens { ids } => Ok((ids.clone(), false)),
        Prompt::Raw { text } => Ok((encode(text, true)?, false)),
        Prompt::Chat {
            system_prompt,
            messages,
        } => {
            let mut all: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
            if let Some(system) = system_prompt.as_ref().filter(|s| !s.trim().is_empty()) {
                all.push(ChatMessage::system(system.clone()));
            }
            all.extend(messages.iter().cloned());
            match &model.chat_template {
                // The template writes the special tokens itself (BOS
                // included), as transformers' apply_chat_template does.
                Some(template) => Ok((encode(&template.render(&all, true)?, false)?, true)),
                // No template: the messages' text as it is, like mlx-lm.
                None => {
                    let text: Vec<&str> = all.iter().map(|m| m.content.as_str()).collect();
                    Ok((encode(&text.join("\n"), true)?, false))
                }
            }
        }
    }
}

/// Whether a prompt has any text in it.
fn is_empty(prompt: &Prompt) -> bool {
    match prompt {
        Prompt::Tokens { ids } => ids.is_empty(),
        Prompt::Raw { text } => text.trim().is_empty(),
        Prompt::Chat { messages, .. } => messages.iter().all(|m| m.content.trim().is_empty()),
    }
}

/// Text held back because it might be the start of a stop string.
fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .flat_map(|stop| {
            (1..stop.len())
                .rev()
                .filter(|&n| stop.is_char_boundary(n) && text.ends_with(&stop[..n]))
                .take(1)
        })
        .max()
        .unwrap_or(0)
}

/// Deltas after the first are merged over this long (one display frame).
const DELTA_INTERVAL: Duration = Duration::from_millis(16);

/// How a run went, for the caller that records it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub stats: RunStats,
}

/// Runs `request` on `model` with `conversation`'s cache, streaming events to
/// `sink` (all but the final `Finished`/`Failed`, which the caller sends).
#[allow(clippy::too_many_arguments)]
pub fn run(
    model: &LoadedModel,
    conversation: &mut Conversation,
    request: &GenerateRequest,
    load_kind: LoadKind,
    load_ms: f64,
    accepted_at: Instant,
    cancel: &CancelToken,
    sink: &mut dyn FnMut(RunEvent),
) -> Result<RunOutcome, RunError> {
    request.sampler.validate()?;
    if is_empty(&request.prompt) {
        return Err(RunError::EmptyPrompt);
    }
    if request.max_tokens == 0 {
        return Err(RunError::InvalidSettings(
            "max_tokens is 0; ask for at least one token".into(),
        ));
    }
    let (prompt, templated) = prompt_ids(model, &request.prompt)?;
    if prompt.is_empty() {
        return Err(RunError::EmptyPrompt);
    }
    let vocab = model.config.vocab_size.max(0) as u32;
    if let Some(bad) = prompt.iter().find(|&&id| id >= vocab) {
        // MLX would read past the embedding table instead of failing.
        return Err(RunError::InvalidSettings(format!(
            "token id {bad} is outside the vocabulary of {} ({vocab} ids)",
            model.dir.display()
        )));
    }
    if let (None, Some(context)) = (request.max_kv_size, model.config.max_position_embeddings)
        && prompt.len() > context
    {
        return Err(RunError::PromptTooLong(format!(
            "the prompt has {} tokens but {} reads at most {context}; shorten it, or bound \
             the KV cache to {context} tokens (a rotating cache keeps the start and the latest \
             tokens)",
            prompt.len(),
            model.dir.display(),
        )));
    }
    let cached = conversation.reuse_prefix(model, &prompt);
    sink(RunEvent::Started {
        load_kind,
        load_ms,
        prompt_tokens: prompt.len(),
        cached_tokens: cached,
    });

    let sampler = Sampler::new(request.sampler.clone())?;
    let new_tokens = &prompt[cached..];
    let mut steps = TokenSteps::new(&model.model, &mut conversation.cache, new_tokens)?
        .with_prefill_step_size(request.prefill_step_size)
        .with_loop_shape(request.loop_shape)
        .with_sampler(sampler)
        .with_cancel(cancel.clone());
    let mut detokenizer = StreamingDetokenizer::new(&model.tokenizer);
    let mut generated: Vec<u32> = Vec::with_capacity(request.max_tokens);
    // The text of the answer and how much of it has been sent.
    let mut text = String::new();
    let mut sent = 0;
    let mut pending_ids: Vec<u32> = Vec::new();
    let prefill_started = Instant::now();
    let mut first_token_at = None;
    let mut last_token_at = prefill_started;
    let mut stop_reason = StopReason::MaxTokens;
    let mut last_sent: Option<Instant> = None;

    while generated.len() < request.max_tokens {
        if cancel.is_cancelled() {
            stop_reason = StopReason::Cancelled;
            break;
        }
        let token = match steps.next() {
            Some(Ok(token)) => token,
            Some(Err(_)) if cancel.is_cancelled() => {
                stop_reason = StopReason::Cancelled;
                break;
            }
            Some(Err(e)) => return Err(e.into()),
            None => break,
        };
        last_token_at = Instant::now();
        first_token_at.get_or_insert(last_token_at);
        generated.push(token);
        if !request.ignore_eos && model.eos_token_ids.contains(&token) {
            stop_reason = StopReason::Eos;
            break;
        }
        pending_ids.push(token);
        text.push_str(
            &detokenizer
                .push(token)
                .map_err(|e| RunError::Tokenizer(e.to_string()))?,
        );
        if let Some(at) = request
            .stop_strings
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                text[sent.min(text.len())..]
                    .find(s.as_str())
                    .map(|i| i + sent)
            })
            .min()
        {
            text.truncate(at);
            stop_reason = StopReason::StopString;
            break;
        }
        let ready = text.len() - held_back(&text, &request.stop_strings);
        // The first token is sent at once, even empty, so TTFT is visible;
        // later ones at most once a frame: waking the client's thread for
        // every token costs decode speed on a machine with few cores.
        let due = last_sent.is_none_or(|at| last_token_at - at >= DELTA_INTERVAL);
        if generated.len() == 1 || (ready > sent && due) {
            last_sent = Some(last_token_at);
            sink(RunEvent::Delta {
                text: text[sent..ready].to_owned(),
                token_ids: std::mem::take(&mut pending_ids),
            });
            sent = ready;
        }
    }
    if stop_reason != StopReason::StopString {
        text.push_str(
            &detokenizer
                .finish()
                .map_err(|e| RunError::Tokenizer(e.to_string()))?,
        );
    }
    if text.len() > sent || !pending_ids.is_empty() {
        sink(RunEvent::Delta {
            text: text.get(sent..).unwrap_or_default().to_owned(),
            token_ids: pending_ids,
        });
    }
    let kv_cache_bytes = steps.kv_cache_bytes();
    drop(steps);
    // The cache now holds the prompt and every generated token (each step
    // feeds its token in before the next is read).
    conversation.tokens = prompt.clone();
    conversation.tokens.extend(&generated);
    let synced = conversation.cache.first().map_or(0, |c| c.offset()) as usize;
    conversation.tokens.truncate(synced);

    let first = first_token_at.unwrap_or(last_token_at);
    let prefill_ms = (first - prefill_started).as_secs_f64() * 1e3;
    let ttft_ms = (first - accepted_at).as_secs_f64() * 1e3;
    let decode_ms = (last_token_at - first).as_secs_f64() * 1e3;
    let prefill_tokens = prompt.len() - cached;
    let stats = RunStats {
        model_dir: model.dir.display().to_string(),
        model_type: model.model_type.clone(),
        quantization: model.quantization_label(),
        weights_bytes: model.weights_bytes as u64,
        load_kind,
        load_ms,
        ttft_ms: if generated.is_empty() { 0.0 } else { ttft_ms },
        prefill_ms: if generated.is_empty() {
            0.0
        } else {
            prefill_ms
        },
        decode_ms,
        prompt_tokens: prompt.len(),
        cached_tokens: cached,
        prefill_tokens,
        generated_tokens: generated.len(),
        prefill_tps: per_second(prefill_tokens, prefill_ms),
        decode_tps: per_second(generated.len().saturating_sub(1), decode_ms),
        // mlx-lm counts the tokens it was given: those not already cached.
        prompt_tps: per_second(prefill_tokens, ttft_ms),
        generation_tps: per_second(generated.len(), decode_ms),
        mlx_peak_bytes: mlx_rs::memory::peak_memory()? as u64,
        mlx_active_bytes: mlx_rs::memory::active_memory()? as u64,
        mlx_cache_bytes: mlx_rs::memory::cache_memory()? as u64,
        kv_cache_bytes: kv_cache_bytes as u64,
        loop_shape: request.loop_shape,
        prefill_step_size: request.prefill_step_size,
        max_kv_size: request.max_kv_size,
        sampler: request.sampler.clone(),
        stop_reason,
        chat_template: templated,
    };
    Ok(RunOutcome {
        text,
        token_ids: generated,
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_may_start_a_stop_string_is_held_back() {
        let stops = vec!["</answer>".to_owned(), "STOP".to_owned()];
        assert_eq!(held_back("hello </ans", &stops), 5);
        assert_eq!(held_back("hello ST", &stops), 2);
        assert_eq!(held_back("hello", &stops), 0);
        assert_eq!(held_back("", &stops), 0);
    }
}
