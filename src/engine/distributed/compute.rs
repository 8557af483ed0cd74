//! What each rank's share of a split model costs to compute, apart from
//! the links: timed on each rank when it loads its share, with the model's
//! messages turned off (`ComputingAlone`: a stage takes its own input for
//! the previous stage's and passes nothing on, a tensor shard's sums are
//! its own part), so the time is the rank's layers alone. Each rank's
//! numbers reach rank 0 with the agreement before every split run
//! (`note_ranks`), and the records show them beside the time a step took
//! and the links' estimate: what is left of a step is waiting and transfer.

use std::cell::Cell;
use std::sync::Mutex;
use std::time::Instant;

use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;

use crate::engine::generate::fill_cache;
use crate::engine::model::decoder::{ChunkImages, Decoder};

/// A prefill chunk of the timing: long enough that the time is the
/// layers' and not the launch of their kernels.
pub const PREFILL_TOKENS: usize = 128;
/// Decode steps timed (after two not timed); the median is kept.
const DECODE_STEPS: usize = 8;

thread_local! {
    static ALONE: Cell<bool> = const { Cell::new(false) };
}

/// While alive, this thread's split model sends, receives and sums
/// nothing: each rank computes its share on its own input.
pub struct ComputingAlone(());

impl ComputingAlone {
    pub fn start() -> Self {
        ALONE.with(|alone| alone.set(true));
        Self(())
    }
}

impl Drop for ComputingAlone {
    fn drop(&mut self) {
        ALONE.with(|alone| alone.set(false));
    }
}

/// Whether this thread computes its share alone now (`ComputingAlone`).
pub fn computing_alone() -> bool {
    ALONE.with(Cell::get)
}

/// One rank's share, timed alone.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShareCompute {
    /// One decode step through this rank's share: the median of several.
    pub step_ms: f64,
    /// Prompt tokens a second through this rank's share, from one chunk
    /// of `PREFILL_TOKENS`.
    pub prefill_tps: f64,
}

/// Times `model` (this rank's share) alone: one prefill chunk, then decode
/// steps on the cache it filled, each evaluated before the next. Token ids
/// are arbitrary: the cost of a step does not depend on them.
pub fn time_share(model: &Decoder, vocab: usize) -> Result<ShareCompute, Exception> {
    let _alone = ComputingAlone::start();
    let vocab = vocab.max(2) as u32;
    let ids = |n: usize, from: usize| -> Vec<u32> {
        (from..from + n)
            .map(|i| (i as u32 * 7919 + 1) % vocab)
            .collect()
    };
    let none = ChunkImages::default();
    // Kernels are built on first use: a short chunk and its cache first.
    fill_cache(model, &mut model.make_cache(None, None), &ids(8, 0), &none)?;
    let mut cache = model.make_cache(None, None);
    let started = Instant::now();
    fill_cache(model, &mut cache, &ids(PREFILL_TOKENS, 0), &none)?;
    let prefill_s = started.elapsed().as_secs_f64();
    let mut steps = Vec::with_capacity(DECODE_STEPS);
    for (n, token) in ids(DECODE_STEPS + 2, PREFILL_TOKENS)
        .into_iter()
        .enumerate()
    {
        let started = Instant::now();
        let input = Array::from_slice(&[token], &[1, 1]);
        let hidden = model.hidden(&input, &mut cache)?;
        let logits = model.logits(&hidden.index((.., -1, ..)))?;
        let state: Vec<&Array> = cache
            .iter()
            .flat_map(crate::engine::cache::LayerCache::state)
            .chain(std::iter::once(&logits))
            .collect();
        mlx_rs::transforms::eval(state)?;
        if n >= 2 {
            steps.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    drop(cache);
    mlx_rs::memory::clear_cache()?;
    steps.sort_by(f64::total_cmp);
    Ok(ShareCompute {
        step_ms: steps[steps.len() / 2],
        prefill_tps: PREFILL_TOKENS as f64 / prefill_s.max(1e-9),
    })
}

/// Every rank's share timed alone, in rank order, as rank 0 last heard.
static RANKS: Mutex<Vec<Option<ShareCompute>>> = Mutex::new(Vec::new());

/// Keeps what each rank said of its share (at the latest split run).
pub fn note_ranks(ranks: Vec<Option<ShareCompute>>) {
    *RANKS.lock().unwrap_or_else(|e| e.into_inner()) = ranks;
}

/// What each rank said of its share, when every rank said it.
pub fn ranks() -> Option<Vec<ShareCompute>> {
    let ranks = RANKS.lock().unwrap_or_else(|e| e.into_inner());
    ranks
        .iter()
        .copied()
        .collect::<Option<Vec<_>>>()
        .filter(|r| !r.is_empty())
}
