//! Token generation: prefill the prompt once, then one token per step
//! through the same weights while the cache grows. No clocks here; the
//! caller times the steps.
//!
//! This is the first, simple loop (greedy, one sync per token). The engine
//! work adds sampling, chunked prefill and the pipelined loop shape.

use mlx_rs::error::Exception;
use mlx_rs::{Array, ops};

use super::cache::KvCache;
use super::model::llama::Llama;

/// Greedy generation as an iterator of token ids. The first `next()` runs the
/// prefill and returns the first token; each later one is a decode step.
pub struct GreedySteps<'m> {
    model: &'m Llama,
    cache: Vec<KvCache>,
    prompt: Option<Vec<u32>>,
    last: Option<u32>,
    prefill_step_size: usize,
}

/// Prompt tokens run through the model at once while prefilling; larger is
/// faster until the activations no longer fit (mlx-lm's default).
pub const DEFAULT_PREFILL_STEP_SIZE: usize = 2048;

impl<'m> GreedySteps<'m> {
    pub fn new(model: &'m Llama, prompt: &[u32]) -> Self {
        Self {
            cache: model.make_cache(),
            model,
            prompt: Some(prompt.to_vec()),
            last: None,
            prefill_step_size: DEFAULT_PREFILL_STEP_SIZE,
        }
    }

    /// Prefills in chunks of `size` tokens, evaluating the cache after each
    /// chunk so that peak memory is bounded by the chunk, not the prompt.
    pub fn with_prefill_step_size(mut self, size: usize) -> Self {
        self.prefill_step_size = size.max(1);
        self
    }

    /// Bytes held by the KV cache so far.
    pub fn kv_cache_bytes(&self) -> usize {
        self.cache.iter().map(KvCache::nbytes).sum()
    }

    /// Runs `tokens` through the model to fill the cache, without the
    /// output head (MLX never computes what is not evaluated).
    fn fill_cache(&mut self, tokens: &[u32]) -> Result<(), Exception> {
        let length = i32::try_from(tokens.len()).unwrap_or(i32::MAX);
        let input = Array::from_slice(tokens, &[1, length]);
        self.model.hidden(&input, &mut self.cache)?;
        let state: Vec<&Array> = self.cache.iter().flat_map(KvCache::state).collect();
        mlx_rs::transforms::eval(state)?;
        // Intermediate activations of the chunk are garbage now; give their
        // buffers back instead of keeping them cached (mlx-lm does the same).
        mlx_rs::memory::clear_cache()
    }

    /// One pass that yields the next token from the last position's logits.
    fn step(&mut self, tokens: &[u32]) -> Result<u32, Exception> {
        let length = i32::try_from(tokens.len()).unwrap_or(i32::MAX);
        let input = Array::from_slice(tokens, &[1, length]);
        let hidden = self.model.hidden(&input, &mut self.cache)?;
        // Only the last position's logits are needed for the next token.
        let last = hidden.index((.., -1.., ..));
        let logits = self.model.logits(&last)?;
        // Normalised to log-probabilities first, as mlx-lm does: in bf16 the
        // shift can merge near-ties, and greedy must pick what mlx-lm picks.
        let logprobs = ops::subtract(&logits, logits.logsumexp_axis(-1, true)?)?;
        let token = ops::indexing::argmax_axis(&logprobs, -1, None)?;
        token.eval()?;
        token
            .try_item_exact::<u32>()
            .map_err(|e| Exception::custom(e.to_string()))
    }
}

use mlx_rs::ops::indexing::IndexOp;

impl Iterator for GreedySteps<'_> {
    type Item = Result<u32, Exception>;

    fn next(&mut self) -> Option<Self::Item> {
        let input = match (self.prompt.take(), self.last) {
            (Some(prompt), _) if !prompt.is_empty() => {
                // Like mlx-lm: the cache takes all but the last prompt token,
                // then the last one runs alone and yields the first token.
                let (last, rest) = prompt.split_last()?;
                for chunk in rest.chunks(self.prefill_step_size) {
                    if let Err(e) = self.fill_cache(chunk) {
                        return Some(Err(e));
                    }
                }
                vec![*last]
            }
            (_, Some(last)) => vec![last],
            _ => return None,
        };
        let result = self.step(&input);
        if let Ok(token) = result {
            self.last = Some(token);
        } else {
            self.last = None;
        }
        Some(result)
    }
}
