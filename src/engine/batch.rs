//! Several sequences decoded together: one forward pass per step for every
//! sequence that is decoding (`[B, 1]` tokens in), each row at its own
//! position, over its own cache row, drawn by its own sampler and stopped
//! by its own limits.
//!
//! A sequence joins with the prompt tokens its cache does not hold yet.
//! Its prompt is prefilled alone, as `generate` prefills it, one chunk per
//! step (so a long prompt delays the others' next token by one chunk at
//! most); then its cache joins the batch's (`LayerCache::extend`) at the
//! next step, whose input for it is its last prompt token. It leaves when
//! it has its tokens, draws a stop token, is cancelled, or its owner takes
//! it out (a stop string, a client gone), and it leaves with its cache, one
//! row at its own position, for a conversation to keep.
//!
//! The loop is `generate`'s pipelined shape: each step builds and queues
//! the next forward pass from the sampled tokens while they are still
//! lazy, then reads the tokens of the pass before. A sequence whose next
//! token is its last is left out of the pass queued beside it, so no pass
//! computes a token nobody reads; one that draws a stop token was already
//! in the next pass, and that row's work is dropped with it.

use std::collections::VecDeque;

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, ops};

use std::sync::Arc;

use super::cache::{CacheError, CacheSnapshot, LayerCache};
use super::constrain::{ConstraintStats, TokenConstraint};
use super::generate::{DEFAULT_PREFILL_STEP_SIZE, fill_cache};
use super::model::decoder::ChunkImages;
use super::model::decoder::Decoder;
use super::request::{CancelToken, RunError};
use super::sample::{RecentTokens, Sampler};
use super::vision::PromptImages;
use crate::run_kinds::StopReason;

/// The most prompt tokens a joining sequence prefills per step while
/// others decode. Within it the chunk follows the batch: as many tokens as
/// prefill in about one decode step's time (both measured as the batch
/// runs), so a long prompt arriving mid-batch delays the others' next
/// token by about one step, and never by more than this many tokens' work.
pub const PREFILL_BUDGET: usize = 512;

/// The fewest prompt tokens a chunk prefills while others decode: smaller
/// chunks would spend more on each pass's fixed costs than on the prompt.
pub const SMALLEST_INTERLEAVED_CHUNK: usize = 32;

/// Weight of the newest measurement in the batch's running estimates.
const ESTIMATE_WEIGHT: f64 = 0.3;

/// A sequence in a batch, for as long as the batch knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceId(u64);

impl std::fmt::Display for SequenceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sequence {}", self.0)
    }
}

/// What a sequence brings to a batch.
pub struct NewSequence {
    /// The prompt tokens its cache does not hold yet (at least one: the
    /// last is the first step's input).
    pub prompt: Vec<u32>,
    /// Its own cache, one row: empty (`Decoder::make_cache`), or holding
    /// the prefix a conversation kept.
    pub cache: Vec<LayerCache>,
    pub sampler: Sampler,
    /// It leaves after this many tokens.
    pub max_tokens: usize,
    /// It leaves after drawing one of these (the model's end-of-sequence
    /// ids; empty to ignore them).
    pub stop_tokens: Vec<u32>,
    /// It leaves, at the next step, once this is cancelled.
    pub cancel: Option<CancelToken>,
    /// Prompt tokens per prefill chunk while no other sequence decodes
    /// (`None`: the batch's); while others decode, the batch's prefill
    /// budget bounds it too.
    pub prefill_step_size: Option<usize>,
    /// The grammar its tokens are held to; it leaves once the grammar is
    /// complete.
    pub constraint: Option<TokenConstraint>,
    /// Its prompt's images, encoded, counted from the first token of
    /// `prompt`.
    pub images: Option<PromptImages>,
}

/// What a step gave.
pub enum BatchEvent {
    /// A sequence's next token, and the log-probabilities (`[vocab]`) it
    /// was drawn from.
    Token {
        id: SequenceId,
        token: u32,
        logprobs: Array,
    },
    /// A sequence is done and out of the batch.
    Finished(FinishedSequence),
}

/// A sequence that left the batch.
pub struct FinishedSequence {
    pub id: SequenceId,
    pub reason: StopReason,
    /// Its cache, one row: the prompt and every token fed back (all it
    /// generated, or all but the last when it left at `max_tokens`, or
    /// less when it left between steps; `LayerCache::offset` says).
    pub cache: Vec<LayerCache>,
    /// Its state layers as the prefill left them (before the last prompt
    /// token), for a conversation to branch from; `None` for a model
    /// without state layers, or a sequence that left while prefilling.
    pub prefill_snapshot: Option<CacheSnapshot>,
    /// Tokens it was given.
    pub generated: usize,
    /// The rows of each forward pass it was in, in order (its length is the
    /// passes it was in).
    pub batch_sizes: Vec<usize>,
    /// Prefill chunks its prompt took, and those that ran while other
    /// sequences decoded.
    pub prefill_chunks: usize,
    pub interleaved_chunks: usize,
    /// What holding it to its grammar cost, when it had one.
    pub constraint: Option<ConstraintStats>,
}

/// Why a batch could not take a sequence or run a step. After a failed
/// step the batch is unusable: every sequence in it has failed.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("the prompt has no tokens; a sequence needs at least one to start from")]
    EmptyPrompt,
    #[error("max_tokens is 0; ask for at least one token")]
    NoTokens,
    #[error("the batch's cache: {0}")]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Mlx(#[from] Exception),
}

impl From<BatchError> for RunError {
    fn from(e: BatchError) -> Self {
        match e {
            BatchError::EmptyPrompt => RunError::EmptyPrompt,
            BatchError::NoTokens => RunError::InvalidSettings(e.to_string()),
            BatchError::Cache(e) => RunError::Internal(e.to_string()),
            BatchError::Mlx(e) => RunError::from(e),
        }
    }
}

/// A sequence's sampling and limits, wherever it is in the batch.
struct Row {
    id: SequenceId,
    sampler: Sampler,
    recent: Option<RecentTokens>,
    /// Tokens its cache holds, counting the input of the pass queued last.
    position: i32,
    /// Added to `position` for the rope: what a 3-D rope's images saved
    /// (Qwen3-VL), zero otherwise.
    rope_shift: i32,
    /// Tokens read so far.
    generated: usize,
    max_tokens: usize,
    stop_tokens: Vec<u32>,
    cancel: Option<CancelToken>,
    prefill_snapshot: Option<CacheSnapshot>,
    batch_sizes: Vec<usize>,
    prefill_step_size: Option<usize>,
    prefill_chunks: usize,
    interleaved_chunks: usize,
    constraint: Option<TokenConstraint>,
}

impl Row {
    fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(CancelToken::is_cancelled)
    }

    fn finished(self, reason: StopReason, cache: Vec<LayerCache>) -> FinishedSequence {
        FinishedSequence {
            id: self.id,
            reason,
            cache,
            prefill_snapshot: self.prefill_snapshot,
            generated: self.generated,
            batch_sizes: self.batch_sizes,
            prefill_chunks: self.prefill_chunks,
            interleaved_chunks: self.interleaved_chunks,
            constraint: self.constraint.as_ref().map(TokenConstraint::stats),
        }
    }
}

/// A sequence whose prompt is being prefilled, alone.
struct Prefill {
    row: Row,
    cache: Vec<LayerCache>,
    /// The prompt before its last token (what the prefill feeds).
    before_last: Vec<u32>,
    last: u32,
    /// Tokens of `before_last` in the cache.
    filled: usize,
    images: Option<PromptImages>,
}

/// A sequence prefilled and waiting to join at the next step.
struct Ready {
    row: Row,
    cache: Vec<LayerCache>,
    last: u32,
}

/// A forward pass queued (lazy, computing) and not read yet.
struct Pass {
    /// The token drawn for each row, `[B]`; `None` until the draw of a pass
    /// with a row held to a grammar, which waits for the tokens before it.
    tokens: Option<Array>,
    /// What each was drawn from, `[B, vocab]`.
    logprobs: Array,
    /// The rows, in order.
    ids: Vec<SequenceId>,
}

impl Pass {
    /// The pass without the rows `gone` (their work is dropped).
    fn without(self, gone: &[SequenceId]) -> Result<Option<Pass>, Exception> {
        let keep: Vec<i32> = (0..self.ids.len())
            .filter(|&i| !gone.contains(&self.ids[i]))
            .map(|i| i as i32)
            .collect();
        if keep.len() == self.ids.len() {
            return Ok(Some(self));
        }
        if keep.is_empty() {
            return Ok(None);
        }
        let indices = Array::from_slice(&keep, &[keep.len() as i32]);
        Ok(Some(Pass {
            tokens: match self.tokens {
                Some(tokens) => Some(tokens.take_axis(&indices, 0)?),
                None => None,
            },
            logprobs: self.logprobs.take_axis(&indices, 0)?,
            ids: keep.iter().map(|&i| self.ids[i as usize]).collect(),
        }))
    }
}

/// Sequences decoded together. `step` runs the batch; `join` and `leave`
/// change who is in it between steps.
pub struct Batch {
    next_id: u64,
    prefill_step_size: usize,
    prefill_budget: usize,
    /// Seconds a decode step takes (without a prefill chunk), and prompt
    /// tokens a chunk prefills per second: running estimates that size the
    /// chunks run between decode steps.
    decode_step_secs: Option<f64>,
    prefill_tokens_per_sec: Option<f64>,
    /// Waiting for their prompts to be prefilled, first come first.
    prefilling: VecDeque<Prefill>,
    /// Prefilled, joining at the next step.
    ready: Vec<Ready>,
    /// Decoding, in the order of the batch's rows.
    rows: Vec<Row>,
    /// The decoding rows' caches, one batched cache per layer (empty while
    /// no row decodes).
    cache: Vec<LayerCache>,
    /// Out of the batch, waiting for their last token from `pass`.
    finishing: Vec<(Row, Vec<LayerCache>)>,
    /// The pass queued last.
    pass: Option<Pass>,
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl Batch {
    /// An empty batch prefilling `DEFAULT_PREFILL_STEP_SIZE` tokens a step.
    pub fn new() -> Self {
        Self {
            next_id: 0,
            prefill_step_size: DEFAULT_PREFILL_STEP_SIZE,
            prefill_budget: PREFILL_BUDGET,
            decode_step_secs: None,
            prefill_tokens_per_sec: None,
            prefilling: VecDeque::new(),
            ready: Vec::new(),
            rows: Vec::new(),
            cache: Vec::new(),
            finishing: Vec::new(),
            pass: None,
        }
    }

    /// Prefills at most `size` prompt tokens a step (unless a sequence says
    /// otherwise).
    pub fn with_prefill_step_size(mut self, size: usize) -> Self {
        self.prefill_step_size = size.max(1);
        self
    }

    /// Prefills at most `budget` prompt tokens a step while other sequences
    /// decode: the longest a joining prompt delays their next token is one
    /// chunk of `budget`.
    pub fn with_prefill_budget(mut self, budget: usize) -> Self {
        self.prefill_budget = budget.max(1);
        self
    }

    /// Takes a sequence in: its prompt is prefilled over the next steps,
    /// and it decodes once that is done.
    pub fn join(&mut self, sequence: NewSequence) -> Result<SequenceId, BatchError> {
        let Some((&last, before_last)) = sequence.prompt.split_last() else {
            return Err(BatchError::EmptyPrompt);
        };
        if sequence.max_tokens == 0 {
            return Err(BatchError::NoTokens);
        }
        if let Some(batched) = sequence.cache.iter().find(|layer| layer.rows() > 1) {
            return Err(BatchError::Cache(CacheError::Mismatch(format!(
                "a sequence joins with a cache of its own, not a batch of {} rows",
                batched.rows()
            ))));
        }
        let id = SequenceId(self.next_id);
        self.next_id += 1;
        let recent = RecentTokens::new(sequence.sampler.settings(), before_last);
        let row = Row {
            id,
            sampler: sequence.sampler,
            recent,
            position: 0,
            rope_shift: sequence.images.as_ref().map_or(0, PromptImages::rope_shift),
            generated: 0,
            max_tokens: sequence.max_tokens,
            stop_tokens: sequence.stop_tokens,
            cancel: sequence.cancel,
            prefill_snapshot: None,
            batch_sizes: Vec::new(),
            prefill_step_size: sequence.prefill_step_size,
            prefill_chunks: 0,
            interleaved_chunks: 0,
            constraint: sequence.constraint,
        };
        let prefill = Prefill {
            row,
            cache: sequence.cache,
            before_last: before_last.to_vec(),
            last,
            filled: 0,
            images: sequence.images,
        };
        if prefill.before_last.is_empty() {
            self.ready.push(prefill.into_ready());
        } else {
            self.prefilling.push_back(prefill);
        }
        Ok(id)
    }

    /// Sequences decoding.
    pub fn decoding(&self) -> usize {
        self.rows.len() + self.finishing.len()
    }

    /// Sequences waiting to decode (prefilling, or prefilled and joining at
    /// the next step).
    pub fn waiting(&self) -> usize {
        self.prefilling.len() + self.ready.len()
    }

    /// Whether no sequence is in the batch.
    pub fn is_empty(&self) -> bool {
        self.decoding() == 0 && self.waiting() == 0
    }

    /// Bytes the decoding rows' batched cache holds (padding included).
    pub fn kv_cache_bytes(&self) -> usize {
        self.cache.iter().map(LayerCache::nbytes).sum()
    }

    /// Takes `id` out of the batch now, for `reason` (a stop string, a
    /// client gone); `None` when it is not in the batch.
    pub fn leave(
        &mut self,
        id: SequenceId,
        reason: StopReason,
    ) -> Result<Option<FinishedSequence>, BatchError> {
        Ok(self.remove(&[id], reason)?.pop())
    }

    /// One step: the rows whose next token is their last leave the batch;
    /// the prefilled sequences join it; the next forward pass is queued;
    /// the tokens of the pass before are read (sequences that drew a stop
    /// token or have all their tokens leave); and one chunk of a waiting
    /// prompt is prefilled. Cancelled sequences leave first.
    pub fn step(&mut self, model: &Decoder) -> Result<Vec<BatchEvent>, BatchError> {
        let started = std::time::Instant::now();
        let mut events = Vec::new();
        let cancelled: Vec<SequenceId> = self
            .prefilling
            .iter()
            .map(|p| &p.row)
            .chain(self.ready.iter().map(|r| &r.row))
            .chain(&self.rows)
            .chain(self.finishing.iter().map(|(row, _)| row))
            .filter(|row| row.cancelled())
            .map(|row| row.id)
            .collect();
        if !cancelled.is_empty() {
            let gone = self.remove(&cancelled, StopReason::Cancelled)?;
            events.extend(gone.into_iter().map(BatchEvent::Finished));
        }
        self.set_aside_last_tokens()?;
        let queued = self.queue(model)?;
        let read = std::mem::replace(&mut self.pass, queued);
        let decoded = read.is_some();
        if let Some(read) = read {
            self.read(read, &mut events)?;
        }
        self.draw_held()?;
        let chunk_secs = self.prefill_chunk(model)?;
        if decoded {
            // The step's own decode work: all of it, less the chunk's.
            let secs = started.elapsed().as_secs_f64() - chunk_secs.unwrap_or(0.0);
            if secs > 0.0 {
                self.decode_step_secs = Some(blend(self.decode_step_secs, secs));
            }
        }
        Ok(events)
    }

    /// Prompt tokens a chunk takes while others decode: about one decode
    /// step's worth, within `SMALLEST_INTERLEAVED_CHUNK` and the budget.
    pub fn interleaved_chunk(&self) -> usize {
        let smallest = SMALLEST_INTERLEAVED_CHUNK.min(self.prefill_budget);
        match (self.decode_step_secs, self.prefill_tokens_per_sec) {
            (Some(step), Some(rate)) => {
                ((step * rate) as usize).clamp(smallest, self.prefill_budget)
            }
            _ => smallest,
        }
    }

    /// Rows whose token in the queued pass is their last leave the batch
    /// before the next pass, with their caches.
    fn set_aside_last_tokens(&mut self) -> Result<(), BatchError> {
        if self.pass.is_none() {
            return Ok(());
        }
        let last: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.rows[i].generated + 1 >= self.rows[i].max_tokens)
            .collect();
        if last.is_empty() {
            return Ok(());
        }
        for (row, cache) in self.take_rows(&last)? {
            self.finishing.push((row, cache));
        }
        Ok(())
    }

    /// Takes the decoding rows at `indices` out of the batch's rows and
    /// cache, each with its cache split off at its own position. The
    /// queued pass keeps them (its tokens are still theirs to read).
    fn take_rows(&mut self, indices: &[usize]) -> Result<Vec<(Row, Vec<LayerCache>)>, BatchError> {
        let mut caches = Vec::with_capacity(indices.len());
        for &i in indices {
            let position = self.rows[i].position;
            let cache = self
                .cache
                .iter()
                .map(|layer| layer.split_row(i, position))
                .collect::<Result<Vec<_>, _>>()?;
            caches.push(cache);
        }
        let keep: Vec<usize> = (0..self.rows.len())
            .filter(|i| !indices.contains(i))
            .collect();
        self.cache = if keep.is_empty() {
            Vec::new()
        } else {
            self.cache
                .iter()
                .map(|layer| layer.filter(&keep))
                .collect::<Result<_, _>>()?
        };
        let mut rows: Vec<Option<Row>> = std::mem::take(&mut self.rows)
            .into_iter()
            .map(Some)
            .collect();
        let taken = indices
            .iter()
            .zip(caches)
            .filter_map(|(&i, cache)| rows[i].take().map(|row| (row, cache)))
            .collect();
        self.rows = rows.into_iter().flatten().collect();
        Ok(taken)
    }

    /// Removes the sequences `ids` wherever they are, for `reason`.
    fn remove(
        &mut self,
        ids: &[SequenceId],
        reason: StopReason,
    ) -> Result<Vec<FinishedSequence>, BatchError> {
        let mut gone = Vec::new();
        let (leaving, staying): (Vec<Prefill>, Vec<Prefill>) = std::mem::take(&mut self.prefilling)
            .into_iter()
            .partition(|p| ids.contains(&p.row.id));
        self.prefilling = staying.into();
        gone.extend(leaving.into_iter().map(|p| p.row.finished(reason, p.cache)));
        let (leaving, staying): (Vec<Ready>, Vec<Ready>) = std::mem::take(&mut self.ready)
            .into_iter()
            .partition(|r| ids.contains(&r.row.id));
        self.ready = staying;
        gone.extend(leaving.into_iter().map(|r| r.row.finished(reason, r.cache)));
        let (leaving, staying): (Vec<_>, Vec<_>) = std::mem::take(&mut self.finishing)
            .into_iter()
            .partition(|(row, _)| ids.contains(&row.id));
        self.finishing = staying;
        gone.extend(
            leaving
                .into_iter()
                .map(|(row, cache)| row.finished(reason, cache)),
        );
        let decoding: Vec<usize> = (0..self.rows.len())
            .filter(|&i| ids.contains(&self.rows[i].id))
            .collect();
        if !decoding.is_empty() {
            for (row, cache) in self.take_rows(&decoding)? {
                gone.push(row.finished(reason, cache));
            }
        }
        if let Some(pass) = self.pass.take() {
            self.pass = pass.without(ids)?;
        }
        Ok(gone)
    }

    /// Builds the next forward pass for the decoding rows and the
    /// sequences joining now, and queues it; `None` when no row decodes.
    fn queue(&mut self, model: &Decoder) -> Result<Option<Pass>, BatchError> {
        let joining = std::mem::take(&mut self.ready);
        if self.rows.is_empty() && joining.is_empty() {
            return Ok(None);
        }
        // The decoding rows' inputs are their tokens in the queued pass,
        // still lazy; the joining ones' are their last prompt tokens.
        let mut inputs = Vec::with_capacity(2);
        if !self.rows.is_empty() {
            inputs.push(self.queued_tokens()?);
        }
        if !joining.is_empty() {
            let last: Vec<u32> = joining.iter().map(|r| r.last).collect();
            inputs.push(Array::from_slice(&last, &[last.len() as i32]));
            let layers = joining.first().map_or(0, |r| r.cache.len());
            let mut by_layer: Vec<Vec<LayerCache>> = (0..layers)
                .map(|_| Vec::with_capacity(joining.len()))
                .collect();
            for ready in joining {
                for (layer, cache) in by_layer.iter_mut().zip(ready.cache) {
                    layer.push(cache);
                }
                self.rows.push(ready.row);
            }
            self.cache = if self.cache.is_empty() {
                by_layer
                    .iter()
                    .map(|rows| LayerCache::stack(rows))
                    .collect::<Result<_, _>>()?
            } else {
                self.cache
                    .iter()
                    .zip(&by_layer)
                    .map(|(batch, rows)| batch.extend(rows))
                    .collect::<Result<_, _>>()?
            };
        }
        let inputs = match <[Array; 1]>::try_from(inputs) {
            Ok([only]) => only,
            Err(parts) => ops::concatenate(&parts, 0)?,
        };
        let rows = self.rows.len();
        let positions: Vec<i32> = self
            .rows
            .iter()
            .map(|r| r.position + r.rope_shift)
            .collect();
        let hidden = model.hidden_rows(
            &inputs.reshape(&[rows as i32, 1])?,
            &positions,
            &mut self.cache,
        )?;
        let logits = model.logits(&hidden)?.squeeze_axes(&[1])?;
        let logprobs = self.logprobs(logits, &inputs)?;
        // A row held to a grammar needs its mask for this draw, and the mask
        // needs the token before, read after this pass is queued: the draw
        // waits (`draw_held`) while the forward pass runs.
        let tokens = if self.rows.iter().any(|r| r.constraint.is_some()) {
            mlx_rs::transforms::async_eval([&logprobs])?;
            None
        } else {
            let tokens = self.draw(&logprobs)?;
            mlx_rs::transforms::async_eval([&tokens, &logprobs])?;
            Some(tokens)
        };
        for row in &mut self.rows {
            row.position += 1;
            row.batch_sizes.push(rows);
        }
        Ok(Some(Pass {
            tokens,
            logprobs,
            ids: self.rows.iter().map(|r| r.id).collect(),
        }))
    }

    /// The tokens the queued pass draws for the decoding rows, in their
    /// order (the pass may also hold rows that have left the batch).
    fn queued_tokens(&self) -> Result<Array, BatchError> {
        let Some((pass, tokens)) = self
            .pass
            .as_ref()
            .and_then(|p| p.tokens.as_ref().map(|t| (p, t)))
        else {
            return Err(BatchError::Mlx(Exception::custom(
                "decoding rows without a drawn pass to take their inputs from",
            )));
        };
        let order: Vec<SequenceId> = self.rows.iter().map(|r| r.id).collect();
        if pass.ids == order {
            return Ok(tokens.clone());
        }
        let indices = order
            .iter()
            .map(|id| {
                pass.ids
                    .iter()
                    .position(|p| p == id)
                    .map(|i| i as i32)
                    .ok_or_else(|| {
                        Exception::custom(format!("{id} decodes but is not in the queued pass"))
                    })
            })
            .collect::<Result<Vec<i32>, Exception>>()?;
        Ok(tokens.take_axis(Array::from_slice(&indices, &[indices.len() as i32]), 0)?)
    }

    /// Each row's log-probabilities from `logits` (`[B, vocab]`): its
    /// repetition penalty applied (`inputs`, `[B]`, join its recent
    /// tokens), then normalized as `generate` does.
    fn logprobs(&mut self, logits: Array, inputs: &Array) -> Result<Array, Exception> {
        let logits = if self.rows.iter().any(|r| r.recent.is_some()) {
            let mut parts = Vec::with_capacity(self.rows.len());
            for (i, row) in self.rows.iter_mut().enumerate() {
                let r = i as i32;
                let own = logits.index(r..r + 1);
                parts.push(match &mut row.recent {
                    Some(recent) => recent.penalize(&own, &inputs.index(r..r + 1))?,
                    None => own,
                });
            }
            ops::concatenate(&parts, 0)?
        } else {
            logits
        };
        ops::subtract(&logits, logits.logsumexp_axis(-1, true)?)
    }

    /// Each decoding row's token from `logprobs`, drawn by its own sampler.
    /// Greedy rows take one argmax over the whole batch.
    fn draw(&mut self, logprobs: &Array) -> Result<Array, Exception> {
        if self.rows.iter().all(|r| r.sampler.settings().is_greedy()) {
            return ops::indexing::argmax_axis(logprobs, -1, None);
        }
        let mut drawn = Vec::with_capacity(self.rows.len());
        for (i, row) in self.rows.iter_mut().enumerate() {
            let r = i as i32;
            drawn.push(row.sampler.sample(&logprobs.index(r..r + 1))?);
        }
        ops::concatenate(&drawn, 0)
    }

    /// Draws the queued pass's tokens when it waited for its rows' grammars:
    /// each constrained row's mask, worked out now that the token before it
    /// is read, bars the tokens its grammar does not allow; then each row's
    /// sampler draws as in `draw`.
    fn draw_held(&mut self) -> Result<(), BatchError> {
        let Some(mut pass) = self.pass.take() else {
            return Ok(());
        };
        if pass.tokens.is_some() {
            self.pass = Some(pass);
            return Ok(());
        }
        let mut grammars = None;
        let mut masks = Vec::with_capacity(pass.ids.len());
        for id in &pass.ids {
            let row = self
                .rows
                .iter_mut()
                .chain(self.finishing.iter_mut().map(|(row, _)| row))
                .find(|row| row.id == *id);
            let mask = match row.and_then(|row| row.constraint.as_mut()) {
                Some(constraint) => {
                    grammars.get_or_insert_with(|| Arc::clone(constraint.grammars()));
                    Some(constraint.next_mask().map_err(Exception::custom)?)
                }
                None => None,
            };
            masks.push(mask);
        }
        let masked = match &grammars {
            Some(grammars) => {
                let bytes: Vec<u8> = masks
                    .into_iter()
                    .flat_map(|mask| mask.unwrap_or_else(|| grammars.allow_all()))
                    .collect();
                grammars.apply(&pass.logprobs, &bytes, pass.ids.len())?
            }
            None => pass.logprobs.clone(),
        };
        let greedy = pass.ids.iter().all(|id| {
            self.rows
                .iter()
                .chain(self.finishing.iter().map(|(row, _)| row))
                .find(|row| row.id == *id)
                .is_none_or(|row| row.sampler.settings().is_greedy())
        });
        let tokens = if greedy {
            ops::indexing::argmax_axis(&masked, -1, None)?
        } else {
            let mut drawn = Vec::with_capacity(pass.ids.len());
            for (i, id) in pass.ids.iter().enumerate() {
                let r = i as i32;
                let own = masked.index(r..r + 1);
                let row = self
                    .rows
                    .iter_mut()
                    .chain(self.finishing.iter_mut().map(|(row, _)| row))
                    .find(|row| row.id == *id);
                drawn.push(match row {
                    Some(row) => row.sampler.sample(&own)?,
                    None => ops::indexing::argmax_axis(&own, -1, None)?,
                });
            }
            ops::concatenate(&drawn, 0)?
        };
        mlx_rs::transforms::async_eval([&tokens])?;
        pass.tokens = Some(tokens);
        self.pass = Some(pass);
        Ok(())
    }

    /// Reads the tokens of `pass`; rows that drew a stop token or have all
    /// their tokens leave.
    fn read(&mut self, pass: Pass, events: &mut Vec<BatchEvent>) -> Result<(), BatchError> {
        let Some(drawn) = &pass.tokens else {
            return Err(BatchError::Mlx(Exception::custom(
                "a pass read before its tokens were drawn",
            )));
        };
        drawn.eval()?;
        let tokens: Vec<u32> = drawn.as_slice::<u32>().to_vec();
        let mut stopped = Vec::new();
        for (i, (&id, &token)) in pass.ids.iter().zip(&tokens).enumerate() {
            let row = match self.rows.iter_mut().find(|r| r.id == id) {
                Some(row) => row,
                None => match self.finishing.iter_mut().find(|(r, _)| r.id == id) {
                    Some((row, _)) => row,
                    // It left after the pass was queued.
                    None => continue,
                },
            };
            row.generated += 1;
            events.push(BatchEvent::Token {
                id,
                token,
                logprobs: pass.logprobs.index(i as i32),
            });
            let complete = match &mut row.constraint {
                Some(constraint) => {
                    constraint.accept(token).map_err(Exception::custom)?;
                    constraint.is_complete()
                }
                None => false,
            };
            // A grammar that allows nothing more ends the reply as a stop
            // token would.
            if row.stop_tokens.contains(&token) || complete {
                stopped.push((id, StopReason::Eos));
            } else if row.generated >= row.max_tokens {
                stopped.push((id, StopReason::MaxTokens));
            }
        }
        for reason in [StopReason::Eos, StopReason::MaxTokens] {
            let ids: Vec<SequenceId> = stopped
                .iter()
                .filter(|(_, r)| *r == reason)
                .map(|(id, _)| *id)
                .collect();
            if !ids.is_empty() {
                let gone = self.remove(&ids, reason)?;
                events.extend(gone.into_iter().map(BatchEvent::Finished));
            }
        }
        Ok(())
    }

    /// Prefills one chunk of the first waiting prompt; a prompt done joins
    /// at the next step. The seconds it took, when one ran.
    fn prefill_chunk(&mut self, model: &Decoder) -> Result<Option<f64>, BatchError> {
        let interleaved = self.interleaved_chunk();
        let Some(prefill) = self.prefilling.front_mut() else {
            return Ok(None);
        };
        let own = prefill
            .row
            .prefill_step_size
            .unwrap_or(self.prefill_step_size);
        let others_decode = !self.rows.is_empty() || !self.finishing.is_empty();
        let chunk = if others_decode {
            own.min(interleaved)
        } else {
            own
        };
        let end = (prefill.filled + chunk.max(1)).min(prefill.before_last.len());
        prefill.row.prefill_chunks += 1;
        if others_decode {
            prefill.row.interleaved_chunks += 1;
        }
        let chunk_started = std::time::Instant::now();
        let images = match &prefill.images {
            Some(images) => images.within(prefill.filled, end)?,
            None => ChunkImages::default(),
        };
        fill_cache(
            model,
            &mut prefill.cache,
            &prefill.before_last[prefill.filled..end],
            &images,
        )?;
        let secs = chunk_started.elapsed().as_secs_f64();
        let tokens = end - prefill.filled;
        prefill.filled = end;
        if end == prefill.before_last.len()
            && let Some(done) = self.prefilling.pop_front()
        {
            self.ready.push(done.into_ready());
        }
        if secs > 0.0 {
            self.prefill_tokens_per_sec =
                Some(blend(self.prefill_tokens_per_sec, tokens as f64 / secs));
        }
        Ok(Some(secs))
    }
}

/// A running estimate moved toward `newest`.
fn blend(estimate: Option<f64>, newest: f64) -> f64 {
    match estimate {
        Some(old) => old + ESTIMATE_WEIGHT * (newest - old),
        None => newest,
    }
}

impl Prefill {
    /// The prefilled sequence, at the position its cache holds, with its
    /// state layers as the prefill left them.
    fn into_ready(mut self) -> Ready {
        self.row.position = self.cache.first().map_or(0, LayerCache::offset);
        self.row.prefill_snapshot = CacheSnapshot::take(&self.cache);
        Ready {
            row: self.row,
            cache: self.cache,
            last: self.last,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sample::SamplerSettings;

    fn sequence(prompt: &[u32], max_tokens: usize, cache: Vec<LayerCache>) -> NewSequence {
        NewSequence {
            prompt: prompt.to_vec(),
            cache,
            sampler: Sampler::new(SamplerSettings::default()).unwrap(),
            max_tokens,
            stop_tokens: Vec::new(),
            cancel: None,
            prefill_step_size: None,
            constraint: None,
            images: None,
        }
    }

    /// A row of `n` positions, `[1, 1, n, 2]` keys and values.
    fn filled(n: i32) -> LayerCache {
        let mut cache = LayerCache::new(None);
        let kv = ops::zeros::<f32>(&[1, 1, n, 2]).unwrap();
        cache.update_and_fetch(&kv, &kv).unwrap();
        cache
    }

    #[test]
    fn a_sequence_needs_a_prompt_a_token_to_give_and_a_cache_of_its_own() {
        let mut batch = Batch::new();
        let refused = |result: Result<SequenceId, BatchError>| result.err().unwrap().to_string();
        assert!(refused(batch.join(sequence(&[], 4, vec![filled(1)]))).contains("no tokens"));
        assert!(refused(batch.join(sequence(&[1], 0, vec![filled(1)]))).contains("max_tokens"));
        let two_rows = LayerCache::stack(&[filled(1), filled(3)]).unwrap();
        assert!(refused(batch.join(sequence(&[1], 4, vec![two_rows]))).contains("2 rows"));
        assert!(batch.is_empty(), "nothing refused is in the batch");
        // A prompt of one token has nothing to prefill: it joins at the next step.
        let id = batch.join(sequence(&[7], 4, vec![filled(2)])).unwrap();
        assert_eq!((batch.waiting(), batch.decoding()), (1, 0));
        let left = batch.leave(id, StopReason::StopString).unwrap().unwrap();
        assert_eq!(left.reason, StopReason::StopString);
        assert_eq!(
            left.cache[0].offset(),
            2,
            "it leaves with the cache it came with"
        );
        assert!(batch.is_empty());
    }
}
