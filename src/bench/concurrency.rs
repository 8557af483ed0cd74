//! Several streams at once (`ondo bench --concurrency 1,2,4,8`): on each
//! side (Ondo's engine, and any server), C generations sent together on C
//! different prompts, measured at the client. What a server's users feel
//! when several clients share it: the tokens all the streams get per second
//! (the aggregate: every stream's tokens over the round's wall time, from
//! the first request sent to the last token arriving), each stream's own
//! decode rate, the time to first token at the median and at the 95th
//! percentile (a new request's prefill waits behind, or stalls, the
//! others), and Ondo's peak memory. Each level runs the warm-up rounds
//! unmeasured, then the measured ones; sides alternate who goes first.
//! Every stream lands in the history with its round's concurrency and
//! aggregate rate.

use std::sync::Barrier;
use std::time::Instant;

use serde::Serialize;

use super::endpoint::{Endpoint, EndpointSpec};
use super::side_by_side::{ClientEnvironment, EndpointRecord, endpoint_record};
use super::text_prompt::{TextPrompt, TextPrompts};
use super::{BenchError, BenchPlan, BenchShape, Summary, plan, ratio};
use crate::engine::{CancelToken, GenerateRequest, Prompt, RunEvent};
use crate::resolve::{NamedBy, ResolvedModel, resolve_model};
use crate::run_kinds::{LoopShape, RunKind};
use crate::session::SessionPool;
use crate::session::record::RunContext;
use crate::store::now_rfc3339;

/// What runs: Ondo's engine on a model (optional), the servers, the shape
/// and the stream counts.
#[derive(Debug, Clone)]
pub struct ConcurrencyPlan {
    pub ondo: Option<BenchPlan>,
    pub shape: BenchShape,
    /// Streams sent at once, one level after another.
    pub levels: Vec<usize>,
    pub endpoints: Vec<EndpointSpec>,
    pub api_key: Option<String>,
}

/// The most streams a level may send at once.
pub const MOST_STREAMS: usize = 64;

/// One side at one level, over the measured rounds.
#[derive(Debug, Clone, Serialize)]
pub struct ConcurrencyRow {
    pub side: String,
    pub prompt_tokens: usize,
    pub concurrency: usize,
    /// Every stream's tokens over the round's wall time.
    pub aggregate_tps: Summary,
    /// The median stream's own decode rate in each round.
    pub stream_decode_tps: Summary,
    /// Each round's median and 95th-percentile time to first token.
    pub ttft_p50_ms: Summary,
    pub ttft_p95_ms: Summary,
    /// Ondo's engine: MLX's peak allocation in each round (`None` for a
    /// server, whose memory is its own).
    pub peak_bytes: Option<Summary>,
    /// This side's aggregate over its own at the lowest level: how far
    /// sharing the weights' reads pays (1 at that level).
    pub scaling: f64,
    /// This side's aggregate over the reference side's at the same level
    /// (`None` on the reference).
    pub aggregate_ratio: Option<f64>,
}

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub struct ConcurrencyResult {
    pub bench_id: String,
    pub shape: BenchShape,
    pub levels: Vec<usize>,
    pub prompt_sizing: String,
    pub sides: Vec<String>,
    /// The side the ratios divide by: Ondo's engine when it runs.
    pub reference: String,
    pub rows: Vec<ConcurrencyRow>,
    pub environment: ClientEnvironment,
    pub warnings: Vec<String>,
}

/// One stream as the client saw it.
struct Stream {
    sent: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    generated: usize,
    run_id: String,
    peak_bytes: Option<u64>,
}

/// Where a side's streams go.
enum Runner {
    Ondo(BenchPlan),
    /// One connection per stream of the largest level.
    Server {
        endpoints: Vec<Endpoint>,
        local: Option<ResolvedModel>,
    },
}

/// Runs `plan`. `cancel` stops it between rounds.
pub fn run_concurrency(
    pool: &SessionPool,
    plan: &ConcurrencyPlan,
    cancel: &CancelToken,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConcurrencyResult, BenchError> {
    let shape = &plan.shape;
    shape.check()?;
    let mut levels = plan.levels.clone();
    levels.sort_unstable();
    levels.dedup();
    if levels.is_empty() || levels[0] == 0 || levels[levels.len() - 1] > MOST_STREAMS {
        return Err(BenchError::Plan(format!(
            "--concurrency takes stream counts from 1 to {MOST_STREAMS}, e.g. 1,2,4,8"
        )));
    }
    if shape.vary.is_some() || shape.max_kv_size.is_some() {
        return Err(BenchError::Plan(
            "a concurrency benchmark runs one setting: leave out --vary and --max-kv-size".into(),
        ));
    }
    let most = levels[levels.len() - 1];
    let mut runners: Vec<(String, Runner)> = Vec::new();
    if let Some(ondo) = &plan.ondo {
        runners.push(("ondo".to_owned(), Runner::Ondo(ondo.clone())));
    }
    for spec in &plan.endpoints {
        let mut endpoints = Vec::with_capacity(most);
        for _ in 0..most {
            endpoints.push(Endpoint::connect(spec, plan.api_key.as_deref())?);
        }
        let first = &endpoints[0];
        let local = resolve_model(pool, &first.model, NamedBy::Local)
            .ok()
            .filter(|m| m.dir.join("tokenizer.json").is_file());
        let mut name = first.name.clone();
        let mut n = 2;
        while runners.iter().any(|(taken, _)| *taken == name) {
            name = format!("{} ({n})", first.name);
            n += 1;
        }
        runners.push((name, Runner::Server { endpoints, local }));
    }
    if runners.is_empty() {
        return Err(BenchError::Plan(
            "name a model for Ondo's engine, or a server with --endpoint".into(),
        ));
    }
    let prompts = match (&plan.ondo, runners.iter().find_map(local_model)) {
        (Some(ondo), _) => TextPrompts::with_tokenizer(&ondo.model_id, &ondo.model_dir)?,
        (None, Some(local)) => TextPrompts::with_tokenizer(&local.name, &local.dir)?,
        (None, None) => TextPrompts::by_characters(),
    };

    let bench_id = plan::new_bench_id();
    let provenance = pool.provenance();
    let rounds = shape.warmup + shape.repetitions;
    let total = shape.prompt_tokens.len() * levels.len() * rounds * runners.len();
    let mut done = 0;
    let mut rows = Vec::new();
    let mut variant = 0;
    for &length in &shape.prompt_tokens {
        for &level in &levels {
            let test = format!("pp{length}+tg{} x{level}", shape.generate_tokens);
            let mut measured: Vec<Vec<Vec<Stream>>> = runners.iter().map(|_| Vec::new()).collect();
            for round in 0..rounds {
                if cancel.is_cancelled() {
                    return Err(BenchError::Cancelled { done, total });
                }
                // Every stream its own prompt, new each round, so no cache
                // carries one round's work to the next.
                let round_prompts = (0..level)
                    .map(|i| prompts.prompt(length, variant + i))
                    .collect::<Result<Vec<_>, _>>()?;
                variant += level;
                let mut order: Vec<usize> = (0..runners.len()).collect();
                if round % 2 == 1 {
                    order.reverse();
                }
                for side in order {
                    let context = RunContext {
                        bench_id: Some(bench_id.clone()),
                        test: Some(test.clone()),
                        repetition: Some(round as u32),
                        warmup: round < shape.warmup,
                        concurrency: Some(level as u64),
                        ..RunContext::default()
                    };
                    let (name, runner) = &mut runners[side];
                    let streams = match runner {
                        Runner::Ondo(ondo) => ondo_round(pool, ondo, &round_prompts, context)?,
                        Runner::Server { endpoints, local } => server_round(
                            pool,
                            ServerRound {
                                endpoints: &mut endpoints[..level],
                                name,
                                local: local.as_ref(),
                                prompts: &round_prompts,
                                max_tokens: shape.generate_tokens,
                                provenance,
                            },
                            context,
                        )?,
                    };
                    let aggregate = aggregate_tps(&streams);
                    let ids: Vec<String> = streams.iter().map(|s| s.run_id.clone()).collect();
                    if let Some(Err(error)) =
                        pool.with_store(|store| store.set_aggregate_tps(&ids, aggregate))
                    {
                        return Err(BenchError::Plan(format!(
                            "the history could not take the round's aggregate rate: {error}"
                        )));
                    }
                    done += 1;
                    progress(done, total);
                    if round >= shape.warmup {
                        measured[side].push(streams);
                    }
                }
            }
            for (side, rounds) in measured.iter().enumerate() {
                rows.push(summarize(&runners[side].0, length, level, rounds));
            }
        }
    }
    let reference = runners[0].0.clone();
    add_ratios(&mut rows, &reference);
    let mut warnings = Vec::new();
    if provenance.build_profile == "debug" {
        warnings.push(
            "debug build: Ondo's engine is slower than it ships; compare with a release build \
             (make release)"
                .into(),
        );
    }
    if let Some(ondo) = &plan.ondo
        && levels[levels.len() - 1] > crate::session::chat::DEFAULT_MAX_BATCH
    {
        warnings.push(format!(
            "Ondo's engine decodes up to {most} of {}'s streams together in this benchmark \
             (the app's and `ondo serve`'s default is {})",
            ondo.model_id,
            crate::session::chat::DEFAULT_MAX_BATCH
        ));
    }
    Ok(ConcurrencyResult {
        bench_id,
        shape: shape.clone(),
        levels,
        prompt_sizing: prompts.sizing(),
        sides: runners.iter().map(|(name, _)| name.clone()).collect(),
        reference,
        rows,
        environment: ClientEnvironment::of(provenance),
        warnings,
    })
}

fn local_model((_, runner): &(String, Runner)) -> Option<&ResolvedModel> {
    match runner {
        Runner::Server { local, .. } => local.as_ref(),
        Runner::Ondo(_) => None,
    }
}

/// One round on Ondo's engine: every prompt sent at once from its own
/// thread, all joining one batch.
fn ondo_round(
    pool: &SessionPool,
    ondo: &BenchPlan,
    prompts: &[TextPrompt],
    context: RunContext,
) -> Result<Vec<Stream>, BenchError> {
    let start = Barrier::new(prompts.len());
    let context = RunContext {
        bench_id: context.bench_id,
        test: context.test,
        repetition: context.repetition,
        warmup: context.warmup,
        concurrency: context.concurrency,
        ..ondo.context(RunKind::Bench)
    };
    std::thread::scope(|scope| {
        let threads: Vec<_> = prompts
            .iter()
            .map(|prompt| {
                let (start, context) = (&start, context.clone());
                scope.spawn(move || -> Result<Stream, BenchError> {
                    let request = ondo.shape.with_kv(GenerateRequest {
                        max_tokens: ondo.shape.generate_tokens,
                        prefill_step_size: ondo.shape.prefill_step_size,
                        loop_shape: LoopShape::Pipelined,
                        ignore_eos: true,
                        delta_every_token: true,
                        max_batch: prompts.len(),
                        // A benchmark times prefill: no prompt cache read from the disk.
                        disk_cache: false,
                        ..GenerateRequest::new(
                            &ondo.model_dir,
                            Prompt::Raw {
                                text: prompt.text.clone(),
                            },
                        )
                    });
                    let mut first = None;
                    let mut last = None;
                    start.wait();
                    let sent = Instant::now();
                    let (outcome, record) =
                        pool.run(request, context, CancelToken::new(), |event| {
                            if let RunEvent::Delta { token_ids, .. } = event
                                && !token_ids.is_empty()
                            {
                                let now = Instant::now();
                                first.get_or_insert(now);
                                last = Some(now);
                            }
                        })?;
                    Ok(Stream {
                        sent,
                        first,
                        last,
                        generated: outcome.stats.generated_tokens,
                        run_id: record.run_id,
                        peak_bytes: Some(record.mlx_peak_bytes),
                    })
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(BenchError::Plan("a stream's thread panicked".into())))
            })
            .collect()
    })
}

/// What one round on a server needs.
struct ServerRound<'a> {
    endpoints: &'a mut [Endpoint],
    name: &'a str,
    local: Option<&'a ResolvedModel>,
    prompts: &'a [TextPrompt],
    max_tokens: usize,
    provenance: &'a crate::store::Provenance,
}

/// One round on a server: every prompt sent at once, each on its own
/// connection, each stream recorded as an endpoint run.
fn server_round(
    pool: &SessionPool,
    round: ServerRound<'_>,
    context: RunContext,
) -> Result<Vec<Stream>, BenchError> {
    let ServerRound {
        endpoints,
        name,
        local,
        prompts,
        max_tokens,
        provenance,
    } = round;
    let start = Barrier::new(prompts.len());
    std::thread::scope(|scope| {
        let threads: Vec<_> = endpoints
            .iter_mut()
            .zip(prompts)
            .map(|(endpoint, prompt)| {
                let (start, context) = (&start, &context);
                scope.spawn(move || -> Result<Stream, BenchError> {
                    start.wait();
                    let sent = Instant::now();
                    let mut answer = None;
                    let record = pool.record_outside_run(|| -> Result<_, BenchError> {
                        let created_at = now_rfc3339();
                        let run = endpoint.generate(&prompt.text, max_tokens, None)?;
                        let record = endpoint_record(EndpointRecord {
                            endpoint,
                            name,
                            local,
                            prompt,
                            max_tokens,
                            answer: &run,
                            context,
                            provenance,
                            created_at,
                        });
                        answer = Some(run);
                        Ok(record)
                    })?;
                    let answer = answer
                        .ok_or_else(|| BenchError::Plan("the server's run went missing".into()))?;
                    let at = |ms: f64| {
                        (ms.is_finite() && ms >= 0.0)
                            .then(|| sent + std::time::Duration::from_secs_f64(ms / 1e3))
                    };
                    Ok(Stream {
                        sent,
                        first: at(answer.ttft_ms),
                        last: at(answer.ttft_ms + answer.decode_ms),
                        generated: answer.generated_tokens() as usize,
                        run_id: record.run_id,
                        peak_bytes: None,
                    })
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(BenchError::Plan("a stream's thread panicked".into())))
            })
            .collect()
    })
}

/// Every stream's tokens over the round's wall time (first sent to last
/// token); 0 when no token came.
fn aggregate_tps(streams: &[Stream]) -> f64 {
    let (Some(sent), Some(last)) = (
        streams.iter().map(|s| s.sent).min(),
        streams.iter().filter_map(|s| s.last).max(),
    ) else {
        return 0.0;
    };
    let seconds = (last - sent).as_secs_f64();
    let tokens: usize = streams.iter().map(|s| s.generated).sum();
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

/// The value below which `share` of `sorted`'s values lie (nearest rank).
fn percentile(sorted: &[f64], share: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (share * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summarize(side: &str, length: usize, level: usize, rounds: &[Vec<Stream>]) -> ConcurrencyRow {
    let mut aggregate = Vec::new();
    let mut stream_decode = Vec::new();
    let mut p50 = Vec::new();
    let mut p95 = Vec::new();
    let mut peaks = Vec::new();
    for streams in rounds {
        aggregate.push(aggregate_tps(streams));
        let mut ttfts: Vec<f64> = streams
            .iter()
            .filter_map(|s| s.first.map(|f| (f - s.sent).as_secs_f64() * 1e3))
            .collect();
        ttfts.sort_by(f64::total_cmp);
        p50.push(percentile(&ttfts, 0.5));
        p95.push(percentile(&ttfts, 0.95));
        let mut rates: Vec<f64> = streams
            .iter()
            .filter_map(|s| match (s.first, s.last) {
                (Some(first), Some(last)) if s.generated > 1 && last > first => {
                    Some((s.generated - 1) as f64 / (last - first).as_secs_f64())
                }
                _ => None,
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        stream_decode.push(percentile(&rates, 0.5));
        if let Some(peak) = streams.iter().filter_map(|s| s.peak_bytes).max() {
            peaks.push(peak as f64);
        }
    }
    ConcurrencyRow {
        side: side.to_owned(),
        prompt_tokens: length,
        concurrency: level,
        aggregate_tps: Summary::from_samples(&aggregate),
        stream_decode_tps: Summary::from_samples(&stream_decode),
        ttft_p50_ms: Summary::from_samples(&p50),
        ttft_p95_ms: Summary::from_samples(&p95),
        peak_bytes: (!peaks.is_empty()).then(|| Summary::from_samples(&peaks)),
        scaling: 1.0,
        aggregate_ratio: None,
    }
}

/// Each row's scaling (over its side's lowest level) and its aggregate over
/// the reference side's at the same level.
fn add_ratios(rows: &mut [ConcurrencyRow], reference: &str) {
    let snapshot: Vec<(String, usize, usize, f64)> = rows
        .iter()
        .map(|r| {
            (
                r.side.clone(),
                r.prompt_tokens,
                r.concurrency,
                r.aggregate_tps.median,
            )
        })
        .collect();
    for row in rows.iter_mut() {
        let lowest = snapshot
            .iter()
            .filter(|(side, length, ..)| *side == row.side && *length == row.prompt_tokens)
            .min_by_key(|(_, _, level, _)| *level);
        if let Some((.., base)) = lowest {
            row.scaling = ratio(row.aggregate_tps.median, *base);
        }
        if row.side != reference
            && let Some((.., theirs)) = snapshot.iter().find(|(side, length, level, _)| {
                side == reference && *length == row.prompt_tokens && *level == row.concurrency
            })
        {
            row.aggregate_ratio = Some(ratio(row.aggregate_tps.median, *theirs));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn stream(sent: Instant, first_ms: u64, last_ms: u64, generated: usize) -> Stream {
        Stream {
            sent,
            first: Some(sent + Duration::from_millis(first_ms)),
            last: Some(sent + Duration::from_millis(last_ms)),
            generated,
            run_id: String::new(),
            peak_bytes: None,
        }
    }

    #[test]
    fn the_aggregate_counts_every_stream_over_the_rounds_wall_time() {
        let t0 = Instant::now();
        // Two streams of 50 tokens, the second sent 100 ms later, the last
        // token at 1 s: 100 tokens in one second.
        let streams = [
            stream(t0, 50, 900, 50),
            stream(t0 + Duration::from_millis(100), 60, 900, 50),
        ];
        assert!((aggregate_tps(&streams) - 100.0).abs() < 1e-9);
        assert_eq!(aggregate_tps(&[]), 0.0);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let sorted: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 0.5), 10.0);
        assert_eq!(percentile(&sorted, 0.95), 19.0);
        assert_eq!(percentile(&[3.0], 0.95), 3.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn rows_scale_over_their_lowest_level_and_compare_with_the_reference() {
        let row = |side: &str, level: usize, aggregate: f64| ConcurrencyRow {
            side: side.into(),
            prompt_tokens: 128,
            concurrency: level,
            aggregate_tps: Summary::from_samples(&[aggregate]),
            stream_decode_tps: Summary::default(),
            ttft_p50_ms: Summary::default(),
            ttft_p95_ms: Summary::default(),
            peak_bytes: None,
            scaling: 1.0,
            aggregate_ratio: None,
        };
        let mut rows = vec![
            row("ondo", 1, 100.0),
            row("ondo", 8, 600.0),
            row("mlx", 1, 80.0),
            row("mlx", 8, 200.0),
        ];
        add_ratios(&mut rows, "ondo");
        assert_eq!(rows[1].scaling, 6.0);
        assert_eq!(rows[3].scaling, 2.5);
        assert_eq!(rows[0].aggregate_ratio, None);
        assert_eq!(rows[3].aggregate_ratio, Some(200.0 / 600.0));
    }
}
