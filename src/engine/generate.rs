//! Token generation: prefill the prompt once, then one token per step
//! through the same weights while the cache grows. The run's timings (time
//! to first token, decode time) are the caller's to take; this layer reads
//! the clock only for a decode step's anatomy: the host's time building and
//! queueing each step, and its time waiting for the token.
//!
//! Two loop shapes, both kept because the difference is the point:
//! - `Sync` evaluates each token and reads it back before building the next
//!   step: the device idles while the host reads and schedules.
//! - `Pipelined` builds step n+1 from the (still lazy) token n and queues it
//!   with `async_eval` before reading token n, so the next step is already
//!   computing while the host handles the current token.

use std::collections::VecDeque;
use std::time::Instant;

use mlx_rs::error::Exception;
use mlx_rs::{Array, ops};

use super::anatomy::{StepAnatomy, StepClock, graph_size};

use super::cache::{CacheSnapshot, LayerCache};
use super::constrain::TokenConstraint;
use super::model::decoder::ChunkImages;
use super::model::decoder::Decoder;
use super::request::CancelToken;
use super::sample::{RecentTokens, Sampler, SamplerSettings};
use super::vision::PromptImages;
use crate::run_kinds::LoopShape;

/// Prompt tokens run through the model at once while prefilling; larger is
/// faster until the activations no longer fit (mlx-lm's default).
pub const DEFAULT_PREFILL_STEP_SIZE: usize = 2048;

/// Generation as an iterator of token ids. The first `next()` runs the
/// prefill and returns the first token; each later one is a decode step.
/// The cache is borrowed, so a conversation keeps it between turns and a
/// follow-up only prefills what the cache does not hold yet.
pub struct TokenSteps<'a> {
    model: &'a Decoder,
    cache: &'a mut [LayerCache],
    prompt: Option<Vec<u32>>,
    /// The token produced last (still lazy in the pipelined shape) and the
    /// log-probabilities it was drawn from.
    pending: Option<(Array, Array)>,
    /// Log-probabilities of the token returned last.
    last_logprobs: Option<Array>,
    prefill_step_size: usize,
    shape: LoopShape,
    sampler: Sampler,
    /// The tokens the repetition penalty looks at, when there is one.
    recent: Option<RecentTokens>,
    /// Checked before each prefill chunk, so a long prompt can be stopped.
    cancel: Option<CancelToken>,
    /// Host time per decode step, for the benchmark's anatomy.
    clock: StepClock,
    /// Count the nodes of the first decode step's graph (benchmarks ask).
    count_graph: bool,
    /// The state layers as the prefill left them (before the last prompt
    /// token), for a conversation to branch from later; `None` for a model
    /// without state layers.
    prefill_snapshot: Option<CacheSnapshot>,
    /// The grammar the tokens are held to, when there is one.
    constraint: Option<TokenConstraint>,
    /// The prompt's images, encoded, counted from the first token fed.
    images: Option<PromptImages>,
    /// On a split model, the stop flags of the steps built and not read yet,
    /// oldest first (`push_stop_flag`).
    stop_flags: VecDeque<Array>,
    /// Rank 0 ends the other ranks' steps (it is ending on an error).
    stopping_others: bool,
}

impl<'a> TokenSteps<'a> {
    /// Steps that feed `prompt` (the tokens the cache does not hold yet)
    /// into `cache`, greedy unless `with_sampler` says otherwise.
    pub fn new(
        model: &'a Decoder,
        cache: &'a mut [LayerCache],
        prompt: &[u32],
    ) -> Result<Self, Exception> {
        Ok(Self {
            model,
            cache,
            prompt: Some(prompt.to_vec()),
            pending: None,
            last_logprobs: None,
            prefill_step_size: DEFAULT_PREFILL_STEP_SIZE,
            shape: LoopShape::default(),
            sampler: Sampler::new(SamplerSettings::default())?,
            recent: None,
            cancel: None,
            clock: StepClock::default(),
            count_graph: false,
            prefill_snapshot: None,
            constraint: None,
            images: None,
            stop_flags: VecDeque::new(),
            stopping_others: false,
        })
    }

    /// Puts `images`' embeddings in place of their tokens (positions
    /// counted from the first token the steps feed).
    pub fn with_images(mut self, images: Option<PromptImages>) -> Self {
        self.images = images;
        self
    }

    /// Holds the tokens to `constraint`'s grammar; the steps end when the
    /// grammar is complete.
    pub fn with_constraint(mut self, constraint: Option<TokenConstraint>) -> Self {
        self.constraint = constraint;
        self
    }

    /// The grammar, once the steps are done with it.
    pub fn constraint(&self) -> Option<&TokenConstraint> {
        self.constraint.as_ref()
    }

    /// Whether the steps ended because the grammar was complete.
    pub fn grammar_complete(&self) -> bool {
        self.constraint
            .as_ref()
            .is_some_and(TokenConstraint::is_complete)
    }

    /// Prefills in chunks of `size` tokens, evaluating the cache after each
    /// chunk so that peak memory is bounded by the chunk, not the prompt.
    pub fn with_prefill_step_size(mut self, size: usize) -> Self {
        self.prefill_step_size = size.max(1);
        self
    }

    /// Chooses the decode loop shape.
    pub fn with_loop_shape(mut self, shape: LoopShape) -> Self {
        self.shape = shape;
        self
    }

    /// Chooses how tokens are drawn.
    pub fn with_sampler(mut self, sampler: Sampler) -> Self {
        self.sampler = sampler;
        self
    }

    /// Stops prefilling between chunks once `cancel` is set (the caller
    /// checks it between decode steps itself).
    pub fn with_cancel(mut self, cancel: CancelToken) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Counts the nodes of one decode step's graph (MLX prints the graph
    /// once; a benchmark asks, a chat does not).
    pub fn with_graph_count(mut self, count: bool) -> Self {
        self.count_graph = count;
        self
    }

    /// Where the decode steps so far spent the host's time.
    pub fn anatomy(&self) -> StepAnatomy {
        self.clock.anatomy()
    }

    /// Log-probabilities `[1, vocab]` the last returned token was drawn from.
    pub fn last_logprobs(&self) -> Option<&Array> {
        self.last_logprobs.as_ref()
    }

    /// The state layers as the prefill left them, once (see the field).
    pub fn take_prefill_snapshot(&mut self) -> Option<CacheSnapshot> {
        self.prefill_snapshot.take()
    }

    /// Bytes held by the KV cache so far.
    pub fn kv_cache_bytes(&self) -> usize {
        self.cache.iter().map(LayerCache::nbytes).sum()
    }

    /// Builds (without evaluating) one step: `input` `[1, 1]` token id in,
    /// the next token `[1]` and its log-probabilities `[1, vocab]` out.
    fn build_step(&mut self, input: &Array) -> Result<(Array, Array), Exception> {
        let logprobs = self.build_logprobs(input)?;
        let token = self.sampler.sample(&logprobs)?;
        Ok((token, logprobs))
    }

    /// Builds one step's forward pass up to the log-probabilities
    /// `[1, vocab]` of the next token, without drawing it.
    fn build_logprobs(&mut self, input: &Array) -> Result<Array, Exception> {
        // After a 3-D rope's images, text positions are shifted.
        let shift = self.images.as_ref().map_or(0, PromptImages::rope_shift);
        let hidden = self
            .model
            .hidden_with(input, &ChunkImages::shifted(shift), self.cache)?;
        // Only the last position's logits are needed for the next token.
        let last = hidden.index((.., -1.., ..));
        let mut logits = self.model.logits(&last)?.squeeze_axes(&[1])?;
        if let Some(recent) = &mut self.recent {
            logits = recent.penalize(&logits, input)?;
        }
        self.push_stop_flag()?;
        // Normalised to log-probabilities first, as mlx-lm does: in bf16 the
        // shift can merge near-ties, and greedy must pick what mlx-lm picks.
        ops::subtract(&logits, logits.logsumexp_axis(-1, true)?)
    }

    /// On a split model, every step carries a one-element sum across the
    /// ranks of rank 0's wish to stop (its request was cancelled, its client
    /// left, or it ends on an error), built with the step and read with the
    /// step's token. The ranks draw the same tokens and stop at the same
    /// EOS, stop string and token budget on their own; this is how they
    /// also stop together on what only rank 0 knows. Rank 0 decides after
    /// the next step is queued, so every rank runs one or two steps more.
    fn push_stop_flag(&mut self) -> Result<(), Exception> {
        if let Some(flag) = self.stop_vote()? {
            self.stop_flags.push_back(flag);
        }
        Ok(())
    }

    /// Rank 0's wish to stop (its request was cancelled, or it ends on an
    /// error of its own), summed across the ranks: one lazy element that
    /// every rank reads the same. `None` on a model that is not split.
    fn stop_vote(&self) -> Result<Option<Array>, Exception> {
        let Some(group) = self.model.split_group() else {
            return Ok(None);
        };
        let stop = group.rank() == 0
            && (self.stopping_others
                || self.cancel.as_ref().is_some_and(CancelToken::is_cancelled));
        group
            .all_sum(&Array::from_slice(&[f32::from(u8::from(stop))], &[1]))
            .map(Some)
    }

    /// Reads a summed stop wish (`stop_vote`): whether rank 0 stops the
    /// ranks. A rank other than 0 then marks its own request cancelled, so
    /// it ends as rank 0's does.
    fn heard_stop(&self, flag: &Array) -> Result<bool, Exception> {
        let stop = flag
            .try_item_exact::<f32>()
            .map_err(|e| Exception::custom(e.to_string()))?
            > 0.5;
        if stop && let Some(cancel) = &self.cancel {
            cancel.cancel();
        }
        Ok(stop)
    }

    /// Reads the stop flag of the step whose token was just read: `Err`
    /// when rank 0 stops the ranks there.
    fn read_stop_flag(&mut self) -> Result<(), Exception> {
        let Some(flag) = self.stop_flags.pop_front() else {
            return Ok(());
        };
        if self.heard_stop(&flag)? {
            return Err(Exception::custom("rank 0 stopped the split run"));
        }
        Ok(())
    }

    /// Between two prefill chunks of a split model: whether the ranks stop
    /// there, all of them or none (the chunk before has been evaluated
    /// already, so reading the vote costs one small sum).
    fn ranks_stop_prefill(&self) -> Result<bool, Exception> {
        match self.stop_vote()? {
            Some(flag) => self.heard_stop(&flag),
            None => Ok(false),
        }
    }

    /// Whether the model runs split across ranks, whose steps stop
    /// together (`push_stop_flag`).
    pub fn is_split(&self) -> bool {
        self.model.split_group().is_some()
    }

    /// On rank 0 of a split model that ends early on an error of its own:
    /// runs the steps until the other ranks have read the stop, so none is
    /// left waiting in a collective.
    pub fn stop_other_ranks(&mut self) {
        if !self.is_split() || self.pending.is_none() {
            return;
        }
        self.stopping_others = true;
        for _ in 0..4 {
            if !matches!(self.advance(), Ok(Some(_))) {
                break;
            }
        }
        self.pending = None;
    }

    /// The arrays to evaluate with a step: its own, and the stop flags not
    /// read yet (evaluating one twice costs nothing).
    fn with_flags<'b>(&'b self, arrays: &'b [&'b Array]) -> impl Iterator<Item = &'b Array> {
        arrays.iter().copied().chain(self.stop_flags.iter())
    }

    /// Draws from `logprobs` among the tokens the grammar allows next. The
    /// forward pass behind `logprobs` is already queued: the mask is worked
    /// out while it runs.
    fn draw_constrained(&mut self, logprobs: Array) -> Result<(Array, Array), Exception> {
        let Some(constraint) = self.constraint.as_mut() else {
            return Err(Exception::custom("a constrained draw without a grammar"));
        };
        let mask = constraint.next_mask().map_err(Exception::custom)?;
        let masked = constraint.grammars().apply(&logprobs, &mask, 1)?;
        let token = self.sampler.sample(&masked)?;
        Ok((token, logprobs))
    }

    /// Moves the grammar past `token`.
    fn accept(&mut self, token: u32) -> Result<(), Exception> {
        match self.constraint.as_mut() {
            Some(constraint) => constraint.accept(token).map_err(Exception::custom),
            None => Ok(()),
        }
    }

    /// The first token: prefill, then the last prompt token alone (as
    /// mlx-lm does: the cache takes all but the last prompt token).
    fn first(&mut self, prompt: Vec<u32>) -> Result<(Array, Array), Exception> {
        let last = self.prefill(prompt)?;
        self.build_step(&last)
    }

    /// Fills the cache with all but the last prompt token; that one, `[1, 1]`,
    /// is the first step's input.
    fn prefill(&mut self, prompt: Vec<u32>) -> Result<Array, Exception> {
        let Some((last, rest)) = prompt.split_last() else {
            return Err(Exception::custom("the prompt has no tokens"));
        };
        self.recent = RecentTokens::new(self.sampler.settings(), rest);
        for (n, chunk) in rest.chunks(self.prefill_step_size).enumerate() {
            let cancelled = if self.is_split() {
                // Every rank stops at the same chunk or none does: a rank
                // stopping alone would leave the others waiting in the
                // chunk's collectives. The first chunk needs no vote (the
                // order to run arrived just now).
                n > 0 && self.ranks_stop_prefill()?
            } else {
                self.cancel.as_ref().is_some_and(CancelToken::is_cancelled)
            };
            if cancelled {
                return Err(Exception::custom("cancelled during prefill"));
            }
            let start = n * self.prefill_step_size;
            let images = match &self.images {
                Some(images) => images.within(start, start + chunk.len())?,
                None => ChunkImages::default(),
            };
            fill_cache(self.model, self.cache, chunk, &images)?;
        }
        self.prefill_snapshot = CacheSnapshot::take(self.cache);
        Ok(Array::from_slice(&[*last], &[1, 1]))
    }

    fn read(token: &Array) -> Result<u32, Exception> {
        token
            .try_item_exact::<u32>()
            .map_err(|e| Exception::custom(e.to_string()))
    }

    /// Counts `step`'s graph once, the first time a decode step is built
    /// while counting is asked for.
    fn count_once(&mut self, step: &(Array, Array)) {
        if self.count_graph && self.clock.graph.is_none() {
            self.clock.graph = Some(graph_size(&[&step.0, &step.1]).ok());
        }
    }

    /// A step held to a grammar. Each draw waits for its mask, which needs
    /// the token before it; the forward pass does not, so it is queued
    /// first and the mask worked out while it runs. In the pipelined shape
    /// the pass for step n+1 is queued from the lazy token n before n is
    /// read, as unconstrained; only its draw waits.
    fn advance_constrained(&mut self) -> Result<Option<u32>, Exception> {
        if self.grammar_complete() {
            self.pending = None;
            return Ok(None);
        }
        let decoding = self.prompt.is_none();
        let (current, logprobs) = match (self.prompt.take(), self.pending.take()) {
            (Some(prompt), _) => {
                let last = self.prefill(prompt)?;
                let logprobs = self.build_logprobs(&last)?;
                mlx_rs::transforms::async_eval(self.with_flags(&[&logprobs]))?;
                self.draw_constrained(logprobs)?
            }
            (None, Some(previous)) => previous,
            (None, None) => return Ok(None),
        };
        let started = Instant::now();
        let (token, next_logprobs, waited) = match self.shape {
            LoopShape::Sync => {
                mlx_rs::transforms::eval(self.with_flags(&[&current]))?;
                let token = Self::read(&current)?;
                let waited = started.elapsed();
                self.read_stop_flag()?;
                self.accept(token)?;
                if self.grammar_complete() {
                    (token, None, waited)
                } else {
                    let next = self.build_logprobs(&Array::from_slice(&[token], &[1, 1]))?;
                    mlx_rs::transforms::async_eval(self.with_flags(&[&next]))?;
                    (token, Some(next), waited)
                }
            }
            LoopShape::Pipelined => {
                let next = self.build_logprobs(&current.reshape(&[1, 1])?)?;
                mlx_rs::transforms::async_eval(self.with_flags(&[&next]))?;
                let asked = Instant::now();
                let token = Self::read(&current)?;
                let waited = asked.elapsed();
                self.read_stop_flag()?;
                self.accept(token)?;
                (token, Some(next), waited)
            }
        };
        self.last_logprobs = Some(logprobs);
        self.pending = match next_logprobs {
            Some(next) if !self.grammar_complete() => Some(self.draw_constrained(next)?),
            _ => None,
        };
        if decoding {
            self.clock.add(started.elapsed() - waited, waited);
        }
        Ok(Some(token))
    }

    fn advance(&mut self) -> Result<Option<u32>, Exception> {
        if self.constraint.is_some() {
            return self.advance_constrained();
        }
        // The call that returns the first token waits for the prefill; the
        // ones after it are decode steps, and only those are clocked.
        let decoding = self.prompt.is_none();
        let (current, logprobs) = match (self.prompt.take(), self.pending.take()) {
            (Some(prompt), _) => {
                let first = self.first(prompt)?;
                if self.shape == LoopShape::Pipelined {
                    mlx_rs::transforms::async_eval(self.with_flags(&[&first.0, &first.1]))?;
                }
                first
            }
            (None, Some(previous)) => previous,
            (None, None) => return Ok(None),
        };
        match self.shape {
            LoopShape::Sync => {
                let asked = Instant::now();
                mlx_rs::transforms::eval(self.with_flags(&[&current, &logprobs]))?;
                let token = Self::read(&current)?;
                let ready = Instant::now();
                self.read_stop_flag()?;
                self.last_logprobs = Some(logprobs);
                // The next step starts only after the host has the token.
                let next = self.build_step(&Array::from_slice(&[token], &[1, 1]))?;
                let built = Instant::now();
                if decoding {
                    self.clock.add(built - ready, ready - asked);
                    self.count_once(&next);
                }
                self.pending = Some(next);
                Ok(Some(token))
            }
            LoopShape::Pipelined => {
                // Queue step n+1, fed by the lazy token n, before reading n.
                let started = Instant::now();
                let next = self.build_step(&current.reshape(&[1, 1])?)?;
                let built = Instant::now();
                if decoding {
                    self.count_once(&next);
                }
                let counted = Instant::now();
                mlx_rs::transforms::async_eval(self.with_flags(&[&next.0, &next.1]))?;
                let queued = Instant::now();
                let token = Self::read(&current)?;
                let ready = Instant::now();
                self.read_stop_flag()?;
                if decoding {
                    self.clock
                        .add((built - started) + (queued - counted), ready - queued);
                }
                self.last_logprobs = Some(logprobs);
                self.pending = Some(next);
                Ok(Some(token))
            }
        }
    }
}

/// Runs `tokens` through `model` to fill `cache` (with what the prompt's
/// images bring to them: `Decoder::hidden_with`), without the output head
/// (MLX never computes what is not evaluated), and evaluates the cache.
pub fn fill_cache(
    model: &Decoder,
    cache: &mut [LayerCache],
    tokens: &[u32],
    images: &ChunkImages,
) -> Result<(), Exception> {
    let length = i32::try_from(tokens.len()).unwrap_or(i32::MAX);
    let input = Array::from_slice(tokens, &[1, length]);
    model.hidden_with(&input, images, cache)?;
    // On a rank of a split model, the send to the next stage too: nothing
    // in this rank's caches reads it, and the next stage waits for it.
    let sent = model.take_sent();
    let state: Vec<&Array> = cache
        .iter()
        .flat_map(LayerCache::state)
        .chain(sent.as_ref())
        .collect();
    mlx_rs::transforms::eval(state)?;
    // Intermediate activations of the chunk are garbage now; give their
    // buffers back instead of keeping them cached (mlx-lm does the same).
    mlx_rs::memory::clear_cache()
}

use mlx_rs::ops::indexing::IndexOp;

impl Iterator for TokenSteps<'_> {
    type Item = Result<u32, Exception>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.advance() {
            Ok(Some(token)) => Some(Ok(token)),
            Ok(None) => None,
            Err(e) => {
                self.pending = None;
                Some(Err(e))
            }
        }
    }
}
