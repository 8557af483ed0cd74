//! Benchmark plans (docs/ARCHITECTURE.md, "Benchmarks"): test cases from prompt lengths,
//! loop shapes and one varied setting; warm-up repetitions recorded but left
//! out of the statistics; synthetic prompts that differ per repetition;
//! cold starts in fresh processes, measured apart; every run recorded through
//! the session pool with its memory; warnings when the numbers are suspect.

use std::path::Path;
use std::process::Command;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{
    AnatomySummary, BenchError, BenchPlan, BenchShape, Summary, model_vocab, peer, synthetic_prompt,
};
use crate::engine::{CancelToken, GenerateRequest, Prompt, RunStats, StepAnatomy};
use crate::run_kinds::{LoopShape, RunKind};
use crate::session::SessionPool;
use crate::session::record::{self, MemoryDuringRun, RunContext};
use crate::session::roofline;
use crate::store::{Provenance, RunRecord};

/// The one setting a plan varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum VarySetting {
    PrefillStepSize,
    MaxKvSize,
}

/// `--vary prefill_step_size=512,2048`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Vary {
    pub setting: VarySetting,
    pub values: Vec<usize>,
}

impl FromStr for Vary {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let (name, values) = text.split_once('=').ok_or_else(|| {
            format!("expected SETTING=V1,V2 (for example prefill_step_size=512,2048), got '{text}'")
        })?;
        let setting = match name.trim() {
            "prefill_step_size" | "prefill-step-size" => VarySetting::PrefillStepSize,
            "max_kv_size" | "max-kv-size" => VarySetting::MaxKvSize,
            other => {
                return Err(format!(
                    "cannot vary '{other}': prefill_step_size and max_kv_size can be varied \
                     (prompt length and loop shape have their own flags)"
                ));
            }
        };
        let values = values
            .split(',')
            .map(|v| v.trim().parse::<usize>().ok().filter(|n| *n > 0))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("'{values}' is not a list of positive whole numbers"))?;
        if values.is_empty() {
            return Err("give at least one value".into());
        }
        Ok(Self { setting, values })
    }
}

/// One combination of the plan's dimensions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct TestCase {
    /// llama-bench's name for the shape: "pp128+tg128".
    pub test: String,
    pub prompt_tokens: usize,
    #[serde(rename = "loop")]
    pub loop_shape: LoopShape,
    pub prefill_step_size: usize,
    pub max_kv_size: Option<usize>,
}

/// The statistics of one test case over its measured repetitions.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct CaseSummary {
    pub case: TestCase,
    pub ttft_ms: Summary,
    pub prefill_tps: Summary,
    pub decode_tps: Summary,
    pub mlx_peak_bytes: Summary,
    pub decode_roofline_pct: Option<Summary>,
    /// Where Ondo's decode steps spent the host's time (`bench::AnatomySummary`).
    #[serde(default)]
    pub anatomy: Option<AnatomySummary>,
}

/// Everything a plan produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct BenchOutcome {
    pub bench_id: String,
    pub plan: BenchPlan,
    /// Every run, warm-ups and cold starts included, as recorded.
    pub records: Vec<RunRecord>,
    pub cases: Vec<CaseSummary>,
    /// Process start to first token in fresh processes.
    pub cold_start_ms: Option<Summary>,
    pub memory_bandwidth_gbps: Option<f64>,
    /// Reasons to distrust the numbers (debug build, memory pressure).
    pub warnings: Vec<String>,
}

/// What the runner is doing, for a progress bar.
#[derive(Debug, Clone)]
pub struct BenchProgress {
    pub done: usize,
    pub total: usize,
    pub what: String,
}

impl BenchShape {
    /// The test cases in the order they run.
    pub fn cases(&self) -> Vec<TestCase> {
        let varied: Vec<(usize, Option<usize>)> = match &self.vary {
            None => vec![(self.prefill_step_size, self.max_kv_size)],
            Some(v) => v
                .values
                .iter()
                .map(|&value| match v.setting {
                    VarySetting::PrefillStepSize => (value, self.max_kv_size),
                    VarySetting::MaxKvSize => (self.prefill_step_size, Some(value)),
                })
                .collect(),
        };
        let mut cases = Vec::new();
        for &prompt_tokens in &self.prompt_tokens {
            for &(prefill_step_size, max_kv_size) in &varied {
                for &loop_shape in &self.loops {
                    cases.push(TestCase {
                        test: format!("pp{prompt_tokens}+tg{}", self.generate_tokens),
                        prompt_tokens,
                        loop_shape,
                        prefill_step_size,
                        max_kv_size,
                    });
                }
            }
        }
        cases
    }
}

/// A new benchmark id: "b-<unix ms>".
pub fn new_bench_id() -> String {
    format!("b-{}", chrono::Utc::now().timestamp_millis())
}

/// Runs `plan` through `pool` (which records every run). `cancel` stops it
/// between runs (the run in progress finishes and is recorded).
pub fn run_plan(
    pool: &SessionPool,
    plan: &BenchPlan,
    cancel: &CancelToken,
    progress: &mut dyn FnMut(BenchProgress),
) -> Result<BenchOutcome, BenchError> {
    let shape = &plan.shape;
    shape.check()?;
    let bench_id = new_bench_id();
    let provenance = pool.provenance();
    let cases = shape.cases();
    let rounds = shape.warmup + shape.repetitions;
    let total = cases.len() * rounds + shape.cold_repetitions + 1;
    let mut done = 0;
    let mut tell = |done: usize, what: String| progress(BenchProgress { done, total, what });

    tell(done, "measuring memory bandwidth (once per machine)".into());
    let bandwidth = pool
        .with_store(|store| {
            roofline::bandwidth_gbps(pool, store, &provenance.backend, pool.device_name()).ok()
        })
        .flatten()
        .or_else(|| roofline::measure_bandwidth_gbps(pool).ok());
    done += 1;

    let vocab = model_vocab(&plan.model_dir)?;
    let mut records = Vec::new();
    let mut summaries = Vec::new();
    for case in &cases {
        let mut measured: Vec<RunRecord> = Vec::new();
        let mut anatomies: Vec<StepAnatomy> = Vec::new();
        let mut counted: Option<StepAnatomy> = None;
        for round in 0..rounds {
            if cancel.is_cancelled() {
                return Err(BenchError::Cancelled { done, total });
            }
            let warmup = round < shape.warmup;
            tell(
                done,
                format!(
                    "{} {}{}",
                    case.test,
                    case.loop_shape,
                    if warmup { " (warm-up)" } else { "" }
                ),
            );
            let request = shape.with_kv(GenerateRequest {
                max_tokens: shape.generate_tokens,
                prefill_step_size: case.prefill_step_size,
                max_kv_size: case.max_kv_size,
                loop_shape: case.loop_shape,
                ignore_eos: true,
                // Counting prints the graph once: in the first warm-up only.
                count_graph_nodes: round == 0 && warmup,
                // A benchmark times prefill: no prompt cache read from the disk.
                disk_cache: false,
                ..GenerateRequest::new(
                    &plan.model_dir,
                    Prompt::Tokens {
                        ids: synthetic_prompt(case.prompt_tokens, round, vocab),
                    },
                )
            });
            let context = RunContext {
                bench_id: Some(bench_id.clone()),
                test: Some(case.test.clone()),
                repetition: Some(round as u32),
                warmup,
                ..plan.context(RunKind::Bench)
            };
            let (outcome, mut record) = pool.run(request, context, CancelToken::new(), |_| {})?;
            if outcome.anatomy.graph_nodes.is_some() {
                counted = Some(outcome.anatomy);
            }
            if record.memory_bandwidth_gbps.is_none() {
                fill_roofline(&mut record, bandwidth);
            }
            if !warmup {
                measured.push(record.clone());
                anatomies.push(outcome.anatomy);
            }
            records.push(record);
            done += 1;
        }
        let mut summary = summarize(case, &measured);
        summary.anatomy = AnatomySummary::from_runs(&anatomies, counted.as_ref());
        summaries.push(summary);
    }

    let mut cold = Vec::new();
    for repetition in 0..shape.cold_repetitions {
        if cancel.is_cancelled() {
            return Err(BenchError::Cancelled { done, total });
        }
        tell(done, "cold start in a fresh process".into());
        let prompt = synthetic_prompt(shape.prompt_tokens[0], 1000 + repetition, vocab);
        let mut record = cold_start_run(
            pool,
            plan,
            &bench_id,
            repetition,
            &prompt,
            shape.generate_tokens,
        )?;
        fill_roofline(&mut record, bandwidth);
        cold.extend(record.cold_start_ms);
        records.push(record);
        done += 1;
    }
    tell(done, "done".into());

    let warnings = warnings(&records, provenance);
    Ok(BenchOutcome {
        bench_id,
        plan: plan.clone(),
        records,
        cases: summaries,
        cold_start_ms: (!cold.is_empty()).then(|| Summary::from_samples(&cold)),
        memory_bandwidth_gbps: bandwidth,
        warnings,
    })
}

/// One cold start in a fresh `ondo run` process (spawn to first token),
/// recorded as part of the benchmark `bench_id` (kind `bench_cold`).
pub(super) fn cold_start_run(
    pool: &SessionPool,
    plan: &BenchPlan,
    bench_id: &str,
    repetition: usize,
    prompt: &[u32],
    generate_tokens: usize,
) -> Result<RunRecord, BenchError> {
    let shape = &plan.shape;
    let (stats, cold_start_ms) = fresh_process_run(
        &plan.model_dir,
        prompt,
        generate_tokens,
        shape.prefill_step_size,
        shape.loops[0],
    )?;
    let context = RunContext {
        bench_id: Some(bench_id.to_owned()),
        test: Some(format!("pp{}+tg{generate_tokens}", prompt.len())),
        repetition: Some(repetition as u32),
        ..plan.context(RunKind::BenchCold)
    };
    let (mut record, timeline) = fresh_process_record(pool, &stats, &context, generate_tokens);
    record.cold_start_ms = Some(cold_start_ms);
    pool.with_store(|store| store.insert_run(&record, &timeline));
    Ok(record)
}

/// The record of a run another `ondo run` process made (`stats`, its
/// `--json` record), for this benchmark's history: its memory was its own,
/// so this process saw none of it.
pub(super) fn fresh_process_record(
    pool: &SessionPool,
    stats: &RunStats,
    context: &RunContext,
    max_tokens: usize,
) -> (RunRecord, Vec<crate::store::MemorySample>) {
    let unknown = MemoryDuringRun {
        pressure_start: "unknown".into(),
        pressure_max: "unknown".into(),
        pressure_end: "unknown".into(),
        ..MemoryDuringRun::default()
    };
    let (mut record, timeline) =
        record::record_from_stats(stats, context, pool.provenance(), unknown, None);
    record.fresh_process = true;
    record.max_tokens = max_tokens as u64;
    (record, timeline)
}

fn fill_roofline(record: &mut RunRecord, bandwidth: Option<f64>) {
    if let (Some(bw), Some(bytes)) = (bandwidth, record.decode_bytes_per_token)
        && bw > 0.0
    {
        record.memory_bandwidth_gbps = Some(bw);
        record.decode_roofline_pct = Some(record.decode_tps * bytes as f64 / (bw * 1e9) * 100.0);
    }
}

fn summarize(case: &TestCase, runs: &[RunRecord]) -> CaseSummary {
    let of = |metric: fn(&RunRecord) -> f64| {
        Summary::from_samples(&runs.iter().map(metric).collect::<Vec<_>>())
    };
    let roofline: Vec<f64> = runs.iter().filter_map(|r| r.decode_roofline_pct).collect();
    CaseSummary {
        case: case.clone(),
        ttft_ms: of(|r| r.ttft_ms),
        prefill_tps: of(|r| r.prefill_tps),
        decode_tps: of(|r| r.decode_tps),
        mlx_peak_bytes: of(|r| r.mlx_peak_bytes as f64),
        decode_roofline_pct: (!roofline.is_empty()).then(|| Summary::from_samples(&roofline)),
        anatomy: None,
    }
}

/// Reasons the numbers may not mean what they seem.
fn warnings(records: &[RunRecord], provenance: &Provenance) -> Vec<String> {
    let mut warnings = Vec::new();
    if provenance.build_profile == "debug" {
        warnings.push(
            "debug build: timings understate Ondo; compare with a release build (make release)"
                .into(),
        );
    }
    let pressured: Vec<&RunRecord> = records
        .iter()
        .filter(|r| matches!(r.pressure_max.as_str(), "warning" | "critical"))
        .collect();
    if !pressured.is_empty() {
        let worst = if pressured.iter().any(|r| r.pressure_max == "critical") {
            "critical"
        } else {
            "warning"
        };
        warnings.push(format!(
            "memory pressure reached {worst} during {} of {} runs: those numbers may include \
             swapping or compression; close other apps and run again",
            pressured.len(),
            records.len()
        ));
    }
    let swapped: i64 = records.iter().map(|r| r.swap_delta_bytes.max(0)).sum();
    if swapped > 64 << 20 {
        warnings.push(format!(
            "swap grew by {} MiB during the benchmark",
            swapped >> 20
        ));
    }
    warnings
}

/// One `ondo run` in a fresh process: its statistics and the time from
/// spawn to first token.
pub(super) fn fresh_process_run(
    model_dir: &Path,
    prompt: &[u32],
    max_tokens: usize,
    prefill_step_size: usize,
    loop_shape: LoopShape,
) -> Result<(RunStats, f64), BenchError> {
    let spawned_at = peer::wall_clock_ns();
    let mut command =
        ondo_run_command(model_dir, prompt, max_tokens, prefill_step_size, loop_shape);
    command.arg("--load-anyway").env(
        crate::environment::SPAWNED_AT_NS.name,
        spawned_at.to_string(),
    );
    let record = ondo_run_json(command, "the fresh-process run")?;
    let cold_start_ms = record["cold_start_ms"].as_f64().ok_or_else(|| {
        BenchError::Plan("the fresh process did not report its cold start time".into())
    })?;
    let stats: RunStats = serde_json::from_value(record).map_err(|e| {
        BenchError::Plan(format!("the fresh process's record could not be read: {e}"))
    })?;
    Ok((stats, cold_start_ms))
}

/// `ondo run` of `prompt` (token ids, EOS ignored) with a `--json` record,
/// no history and no prompt cache from the disk (a fresh process pays its
/// whole prefill); callers add their own arguments.
pub(super) fn ondo_run_command(
    model_dir: &Path,
    prompt: &[u32],
    max_tokens: usize,
    prefill_step_size: usize,
    loop_shape: LoopShape,
) -> Command {
    let exe = std::env::current_exe().unwrap_or_else(|_| "ondo".into());
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let mut command = Command::new(exe);
    command
        .arg("run")
        .arg(model_dir)
        .args(["--prompt-ids", &ids.join(",")])
        .args(["--max-tokens", &max_tokens.to_string()])
        .args(["--prefill-step-size", &prefill_step_size.to_string()])
        .args(["--loop", &loop_shape.to_string()])
        .args(["--ignore-eos", "--json", "--no-history", "--no-disk-cache"]);
    command
}

/// Runs `command` (an `ondo_run_command`) and reads its `--json` record;
/// `what` names the run in errors, with what it said on failure.
pub(super) fn ondo_run_json(
    mut command: Command,
    what: &str,
) -> Result<serde_json::Value, BenchError> {
    let out = command
        .output()
        .map_err(|e| BenchError::Plan(format!("could not start {what}: {e}")))?;
    serde_json::from_slice(&out.stdout).map_err(|_| {
        BenchError::Plan(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> BenchShape {
        BenchShape {
            prompt_tokens: vec![128, 1024],
            loops: vec![LoopShape::Sync, LoopShape::Pipelined],
            prefill_step_size: 2048,
            cold_repetitions: 0,
            ..BenchShape::default()
        }
    }

    #[test]
    fn vary_parses_one_setting_with_values() {
        let v: Vary = "prefill_step_size=512,2048".parse().unwrap();
        assert_eq!(v.setting, VarySetting::PrefillStepSize);
        assert_eq!(v.values, vec![512, 2048]);
        assert!("max_kv_size=256".parse::<Vary>().is_ok());
        assert!(
            "temperature=0.5"
                .parse::<Vary>()
                .unwrap_err()
                .contains("cannot vary")
        );
        assert!("prefill_step_size=0".parse::<Vary>().is_err());
        assert!("prefill_step_size".parse::<Vary>().is_err());
    }

    #[test]
    fn cases_cross_prompt_lengths_the_varied_setting_and_loops() {
        let mut p = plan();
        p.vary = Some("prefill_step_size=512,2048".parse().unwrap());
        let cases = p.cases();
        assert_eq!(cases.len(), 2 * 2 * 2);
        assert_eq!(cases[0].test, "pp128+tg128");
        assert_eq!(cases[0].prefill_step_size, 512);
        assert_eq!(cases[7].test, "pp1024+tg128");
        assert_eq!(cases[7].prefill_step_size, 2048);
        // Everything not varied stays as planned.
        assert!(cases.iter().all(|c| c.max_kv_size.is_none()));
        p.vary = Some("max_kv_size=256".parse().unwrap());
        assert!(
            p.cases()
                .iter()
                .all(|c| c.max_kv_size == Some(256) && c.prefill_step_size == 2048)
        );
    }
}
