//! A model split over several machines against the same model in one
//! process (`ondo bench MODEL --hostfile hosts.json`): every side is a
//! fresh `ondo run` on the same prompt, one process alone or split by
//! layers or by heads over the hostfile's machines (Ondo starting the
//! other ranks), the sides alternating who goes first, warm-up repetitions
//! dropped. Where the model fits one machine too, this says what the split
//! costs or gains, and what each decode step moved between the ranks.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{BenchError, BenchPlan, Summary, model_vocab, plan, ratio, synthetic_prompt};
use crate::engine::RunStats;
use crate::engine::distributed::SplitKind;
use crate::run_kinds::RunKind;
use crate::session::SessionPool;
use crate::session::record::RunContext;
use crate::store::RunRecord;

/// What runs: the model and shape, the machines, and the splits to try.
#[derive(Debug, Clone)]
pub struct SplitPlan {
    pub plan: BenchPlan,
    pub hostfile: PathBuf,
    pub splits: Vec<SplitKind>,
}

/// One side's numbers over the measured repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct SplitSide {
    /// "one process", "by layers", "by heads".
    pub side: String,
    pub split: Option<SplitKind>,
    pub ttft_ms: Summary,
    pub prefill_tps: Summary,
    pub decode_tps: Summary,
    /// The most bytes a rank sent per decode step, and that step's time on
    /// the links (estimated at the join); `None` for one process.
    pub step_bytes: Option<u64>,
    pub step_link_ms: Option<Summary>,
    /// The most bytes a rank sent over the prefill, and its time on the
    /// links (estimated); `None` for one process.
    pub prefill_bytes: Option<u64>,
    pub prefill_link_ms: Option<Summary>,
    /// Each rank's share of a decode step computed alone, ms in rank order
    /// (timed when it loaded; the first repetition's); `None` for one
    /// process.
    pub rank_step_ms: Option<String>,
    /// Decode over one process's (medians).
    pub decode_ratio: Option<f64>,
    /// Its greedy tokens equalled one process's in every repetition.
    pub same_tokens_as_one_process: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SplitBenchOutcome {
    pub bench_id: String,
    pub model_dir: PathBuf,
    pub hostfile: PathBuf,
    /// Each rank's host, in rank order (from the split runs' records).
    pub hosts: Vec<String>,
    pub backend: Option<String>,
    pub prompt_tokens: usize,
    pub generate_tokens: usize,
    pub repetitions: usize,
    pub warmup: usize,
    pub sides: Vec<SplitSide>,
    #[serde(skip)]
    pub records: Vec<RunRecord>,
}

/// One `ondo run` of the plan's prompt in a fresh process, alone or split.
struct SplitRun {
    stats: RunStats,
    token_ids: Vec<u64>,
    /// Its `--json` record, which has the split fields of a split run.
    split: serde_json::Value,
}

fn run_once(
    plan: &BenchPlan,
    hostfile: &Path,
    split: Option<SplitKind>,
    prompt: &[u32],
) -> Result<SplitRun, BenchError> {
    let shape = &plan.shape;
    let mut command = plan::ondo_run_command(
        &plan.model_dir,
        prompt,
        shape.generate_tokens,
        shape.prefill_step_size,
        shape.loops[0],
    );
    if let Some(split) = split {
        command
            .arg("--hostfile")
            .arg(hostfile)
            .args(["--split", split.name()]);
    }
    let what = split.map_or("the run in one process".to_owned(), |s| {
        format!("the run split {}", s.described())
    });
    let json = plan::ondo_run_json(command, &what)?;
    let token_ids = json["token_ids"]
        .as_array()
        .map(|ids| ids.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default();
    let stats: RunStats = serde_json::from_value(json.clone())
        .map_err(|e| BenchError::Plan(format!("{what} printed a record Ondo cannot read: {e}")))?;
    Ok(SplitRun {
        stats,
        token_ids,
        split: json,
    })
}

/// Runs `plan`: one process and each split, alternating, every measured
/// run recorded under one bench id; `progress` hears (done, total).
pub fn run_split_bench(
    pool: &SessionPool,
    plan: &SplitPlan,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SplitBenchOutcome, BenchError> {
    let shape = &plan.plan.shape;
    let vocab = model_vocab(&plan.plan.model_dir)?;
    let prompt_tokens = shape.prompt_tokens[0];
    let bench_id = plan::new_bench_id();
    let sides: Vec<Option<SplitKind>> = std::iter::once(None)
        .chain(plan.splits.iter().copied().map(Some))
        .collect();
    let rounds = shape.warmup + shape.repetitions;
    let total = rounds * sides.len();
    let mut done = 0;
    let mut runs: Vec<Vec<SplitRun>> = sides.iter().map(|_| Vec::new()).collect();
    let mut records = Vec::new();
    for round in 0..rounds {
        let prompt = synthetic_prompt(prompt_tokens, round, vocab);
        let warmup = round < shape.warmup;
        // Who goes first turns with each round.
        let order: Vec<usize> = (0..sides.len())
            .map(|i| (i + round) % sides.len())
            .collect();
        for side in order {
            let run = run_once(&plan.plan, &plan.hostfile, sides[side], &prompt)?;
            done += 1;
            progress(done, total);
            let context = RunContext {
                bench_id: Some(bench_id.clone()),
                test: Some(format!("pp{prompt_tokens}+tg{}", shape.generate_tokens)),
                repetition: Some(round.saturating_sub(shape.warmup) as u32),
                warmup,
                ..plan.plan.context(RunKind::Bench)
            };
            let (mut record, timeline) =
                plan::fresh_process_record(pool, &run.stats, &context, shape.generate_tokens);
            record = with_split_fields(record, &run.split);
            pool.with_store(|store| store.insert_run(&record, &timeline));
            records.push(record);
            if !warmup {
                runs[side].push(run);
            }
        }
    }
    let alone_decode = median_of(&runs[0], |r| r.stats.decode_tps);
    let alone_ids: Vec<Vec<u64>> = runs[0].iter().map(|r| r.token_ids.clone()).collect();
    let summaries = sides
        .iter()
        .zip(&runs)
        .map(|(split, runs)| {
            let of = |f: fn(&SplitRun) -> f64| {
                Summary::from_samples(&runs.iter().map(f).collect::<Vec<_>>())
            };
            let times = |field: &str| {
                let found: Vec<f64> = runs
                    .iter()
                    .filter_map(|r| r.split[field].as_f64())
                    .collect();
                (!found.is_empty()).then(|| Summary::from_samples(&found))
            };
            let bytes = |field: &str| runs.first().and_then(|r| r.split[field].as_u64());
            let decode = of(|r| r.stats.decode_tps);
            SplitSide {
                side: split.map_or("one process", SplitKind::described).into(),
                split: *split,
                ttft_ms: of(|r| r.stats.ttft_ms),
                prefill_tps: of(|r| r.stats.prefill_tps),
                step_bytes: bytes("split_step_bytes"),
                step_link_ms: times("split_step_link_ms"),
                prefill_bytes: bytes("split_prefill_bytes"),
                prefill_link_ms: times("split_prefill_link_ms"),
                rank_step_ms: runs
                    .first()
                    .and_then(|r| r.split["split_rank_step_ms"].as_str())
                    .map(str::to_owned),
                decode_ratio: split.map(|_| ratio(decode.median, alone_decode)),
                same_tokens_as_one_process: split.map(|_| {
                    runs.iter()
                        .zip(&alone_ids)
                        .all(|(r, alone)| &r.token_ids == alone)
                }),
                decode_tps: decode,
            }
        })
        .collect::<Vec<_>>();
    let first_split = records.iter().find(|r| r.split.is_some());
    Ok(SplitBenchOutcome {
        bench_id,
        model_dir: plan.plan.model_dir.clone(),
        hostfile: plan.hostfile.clone(),
        hosts: first_split
            .and_then(|r| r.split_hosts.as_ref())
            .map(|h| h.split(", ").map(str::to_owned).collect())
            .unwrap_or_default(),
        backend: first_split.and_then(|r| r.split_backend.clone()),
        prompt_tokens,
        generate_tokens: shape.generate_tokens,
        repetitions: shape.repetitions,
        warmup: shape.warmup,
        sides: summaries,
        records,
    })
}

fn median_of(runs: &[SplitRun], f: fn(&SplitRun) -> f64) -> f64 {
    Summary::from_samples(&runs.iter().map(f).collect::<Vec<_>>()).median
}

/// `record` with the split fields (`split*`) `ondo run --json` printed of
/// a split run's own record, whatever they are; unchanged if they do not
/// fit.
fn with_split_fields(record: RunRecord, printed: &serde_json::Value) -> RunRecord {
    let (Ok(serde_json::Value::Object(mut fields)), Some(printed)) =
        (serde_json::to_value(&record), printed.as_object())
    else {
        return record;
    };
    for (name, value) in printed.iter().filter(|(name, _)| name.starts_with("split")) {
        fields.insert(name.clone(), value.clone());
    }
    serde_json::from_value(serde_json::Value::Object(fields)).unwrap_or(record)
}
