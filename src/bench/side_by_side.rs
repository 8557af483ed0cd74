//! Ondo's engine and other programs' servers in one plan (`ondo bench
//! --endpoint`): the same text prompts for every side, sides alternating
//! who goes first, warm-up repetitions dropped, median and spread of the
//! rest, ratios against Ondo's engine (or the first endpoint when the
//! engine does not run). Every run lands in the history under one bench
//! id: Ondo's as benchmark runs, the servers' as endpoint runs with the
//! server's name and its own numbers.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::endpoint::{Endpoint, EndpointRun, EndpointSpec};
use super::text_prompt::{TextPrompt, TextPrompts};
use super::{BenchError, BenchPlan, BenchShape, Summary, plan, ratio};
use crate::engine::{CancelToken, GenerateRequest, Prompt, RunEvent};
use crate::resolve::{NamedBy, ResolvedModel, resolve_model};
use crate::run_kinds::{LoadKind, LoopShape, RunKind, StopReason};
use crate::session::SessionPool;
use crate::session::record::{RunContext, new_run_id};
use crate::store::record::EndpointDialect;
use crate::store::{Provenance, RunRecord, now_rfc3339};

/// What runs: the shape, Ondo's engine on a model (optional), and the
/// endpoints.
#[derive(Debug, Clone)]
pub struct EndpointPlan {
    /// Ondo's engine on a model, with the shape every side runs.
    pub ondo: Option<BenchPlan>,
    pub shape: BenchShape,
    pub endpoints: Vec<EndpointSpec>,
    /// For the endpoints whose URL carries no key.
    pub api_key: Option<String>,
}

/// One side of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// "ondo pipelined", or the server's name.
    pub name: String,
    pub model: String,
    /// The route asked, without credentials; `None` for Ondo's engine.
    pub endpoint_url: Option<String>,
    pub dialect: Option<EndpointDialect>,
    /// Ondo's loop shape; `None` for a server.
    #[serde(rename = "loop")]
    pub loop_shape: Option<LoopShape>,
    /// A server serving the folder Ondo's engine ran: its greedy text
    /// equalled Ondo's in every measured repetition (up to where it
    /// stopped, for a server that stops at end of sequence). `None` when
    /// the models are not known to be the same, or when the model can make
    /// ids its tokenizer has no text for (then texts do not stand for tokens).
    pub same_text_as_ondo: Option<bool>,
}

/// One side's numbers at one prompt length, measured at the client.
#[derive(Debug, Clone, Serialize)]
pub struct SideSummary {
    pub side: String,
    /// The plan's prompt length.
    pub prompt_tokens: usize,
    pub generate_tokens: usize,
    /// Ondo's count of the text sent (the engine's count for Ondo).
    pub sent_prompt_tokens: Summary,
    /// The server's own count, where it reports one.
    pub server_prompt_tokens: Option<Summary>,
    /// Tokens generated (the server's count where it reports one).
    pub generated_tokens: Summary,
    /// Handing the request over (sending it, for a server) to the first
    /// text arriving.
    pub ttft_ms: Summary,
    /// Prompt tokens (the server's count where known) over `ttft_ms`.
    pub prompt_tps: Summary,
    /// `(generated - 1)` over the time from the first text to the last: at
    /// the client for a server, by the engine's clock for Ondo (whose
    /// in-process deltas are merged per display frame after the first).
    pub decode_tps: Summary,
    /// The side's own rates where it reports them: Ondo's engine, Ollama's
    /// durations.
    pub own_prefill_tps: Option<Summary>,
    pub own_decode_tps: Option<Summary>,
    /// This side's median over the reference side's (`None` on the
    /// reference itself).
    pub ttft_ratio: Option<f64>,
    pub decode_ratio: Option<f64>,
}

/// Where the comparison ran (the client's machine and build).
#[derive(Debug, Clone, Serialize)]
pub struct ClientEnvironment {
    pub ondo_version: String,
    pub build_profile: String,
    pub mlx_version: String,
    pub backend: String,
    pub cpu: String,
    pub os: String,
    pub memory_bytes: u64,
}

impl ClientEnvironment {
    /// This machine and build, from the records' provenance.
    pub fn of(provenance: &Provenance) -> Self {
        Self {
            ondo_version: provenance.app_version.clone(),
            build_profile: provenance.build_profile.clone(),
            mlx_version: provenance.mlx_version.clone(),
            backend: provenance.backend.clone(),
            cpu: provenance.cpu.clone(),
            os: provenance.os.clone(),
            memory_bytes: provenance.ram_bytes,
        }
    }
}

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointComparison {
    pub bench_id: String,
    pub shape: BenchShape,
    /// How the prompts were sized: "tiny's tokenizer", "about 4 characters a token".
    pub prompt_sizing: String,
    pub sides: Vec<Side>,
    /// The side the ratios divide by.
    pub reference: String,
    pub results: Vec<SideSummary>,
    pub environment: ClientEnvironment,
    /// Reasons to read the numbers with care.
    pub warnings: Vec<String>,
}

/// Ollama's default context; longer prompts need a larger one asked for.
const OLLAMA_DEFAULT_CONTEXT: usize = 2048;

/// One run's numbers, as the summaries take them.
struct Sample {
    sent_prompt_tokens: f64,
    server_prompt_tokens: Option<f64>,
    generated_tokens: f64,
    ttft_ms: f64,
    prompt_tps: f64,
    decode_tps: f64,
    own_prefill_tps: Option<f64>,
    own_decode_tps: Option<f64>,
    text: String,
    stopped_early: bool,
}

/// Where a side's runs go.
enum Runner {
    Ondo(LoopShape),
    Server {
        endpoint: Box<Endpoint>,
        /// The folder the server's model is on this machine, when Ondo finds it.
        local: Option<ResolvedModel>,
    },
}

/// Runs `plan`: every side on the same prompts, alternating, each run
/// recorded. `cancel` stops it between runs.
pub fn compare_with_endpoints(
    pool: &SessionPool,
    plan: &EndpointPlan,
    cancel: &CancelToken,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EndpointComparison, BenchError> {
    let shape = &plan.shape;
    shape.check()?;
    if plan.endpoints.is_empty() {
        return Err(BenchError::Plan("give at least one endpoint".into()));
    }
    if shape.vary.is_some() || shape.max_kv_size.is_some() {
        return Err(BenchError::Plan(
            "a server's cache settings are its own; varying a setting or bounding the KV cache \
             applies to Ondo's own benchmark"
                .into(),
        ));
    }
    // Every endpoint is asked before anything runs, so a wrong URL or
    // model stops the plan at once.
    let mut runners: Vec<(String, Runner)> = Vec::new();
    if plan.ondo.is_some() {
        for &loop_shape in &shape.loops {
            runners.push((format!("ondo {loop_shape}"), Runner::Ondo(loop_shape)));
        }
    }
    for spec in &plan.endpoints {
        let endpoint = Endpoint::connect(spec, plan.api_key.as_deref())?;
        let local = resolve_model(pool, &endpoint.model, NamedBy::Local)
            .ok()
            .filter(|m| m.dir.join("tokenizer.json").is_file());
        let name = unique_name(&endpoint.name, &runners);
        runners.push((
            name,
            Runner::Server {
                endpoint: Box::new(endpoint),
                local,
            },
        ));
    }
    let prompts = match &plan.ondo {
        Some(ondo) => TextPrompts::with_tokenizer(&ondo.model_id, &ondo.model_dir)?,
        None => match runners.iter().find_map(|(_, runner)| match runner {
            Runner::Server {
                local: Some(local), ..
            } => Some(local),
            _ => None,
        }) {
            Some(local) => TextPrompts::with_tokenizer(&local.name, &local.dir)?,
            None => TextPrompts::by_characters(),
        },
    };
    let longest = shape.prompt_tokens.iter().copied().max().unwrap_or(0);
    let needed_context = longest + shape.generate_tokens + 64;
    let context_tokens =
        (needed_context > OLLAMA_DEFAULT_CONTEXT).then(|| needed_context.next_multiple_of(256));

    let bench_id = plan::new_bench_id();
    let provenance = pool.provenance();
    let ondo_dir = plan.ondo.as_ref().map(|o| canonical(&o.model_dir));
    let rounds = shape.warmup + shape.repetitions;
    let total = shape.prompt_tokens.len() * rounds * runners.len();
    let mut done = 0;
    let mut results = Vec::new();
    // Per side: did its text agree with Ondo's in every measured round.
    // Texts stand for tokens only when every id the model can produce has
    // text: a model whose embedding outgrows its tokenizer (synthetic
    // `small`) makes ids that one detokenizer writes as nothing and another
    // as the first token's text.
    let texts_comparable = match &plan.ondo {
        Some(ondo) => {
            let vocab = super::model_vocab(&ondo.model_dir)? as usize;
            prompts.vocab_size().is_some_and(|covered| covered >= vocab)
        }
        None => false,
    };
    let mut agreement: Vec<Option<bool>> = runners
        .iter()
        .map(|(_, runner)| match runner {
            Runner::Server {
                local: Some(local), ..
            } if texts_comparable && ondo_dir.as_ref() == Some(&canonical(&local.dir)) => {
                Some(true)
            }
            _ => None,
        })
        .collect();
    let mut stopped_early = vec![0usize; runners.len()];
    let mut measured_runs = 0usize;
    for (length_index, &length) in shape.prompt_tokens.iter().enumerate() {
        let test = format!("pp{length}+tg{}", shape.generate_tokens);
        let mut samples: Vec<Vec<Sample>> = runners.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            if cancel.is_cancelled() {
                return Err(BenchError::Cancelled { done, total });
            }
            let prompt = prompts.prompt(length, length_index * rounds + round)?;
            let measured = round >= shape.warmup;
            let mut order: Vec<usize> = (0..runners.len()).collect();
            // Alternate who goes first, so no side always runs on a machine
            // another has just warmed (or heated).
            if round % 2 == 1 {
                order.reverse();
            }
            let mut texts: Vec<Option<String>> = runners.iter().map(|_| None).collect();
            for side in order {
                let context = RunContext {
                    bench_id: Some(bench_id.clone()),
                    test: Some(test.clone()),
                    repetition: Some(round as u32),
                    warmup: !measured,
                    ..RunContext::default()
                };
                let name = runners_name(&runners, side);
                let sample = match &mut runners[side].1 {
                    Runner::Ondo(loop_shape) => {
                        let ondo = plan
                            .ondo
                            .as_ref()
                            .ok_or_else(|| BenchError::Plan("Ondo's side has no model".into()))?;
                        run_ondo(pool, ondo, *loop_shape, &prompt, context)?
                    }
                    Runner::Server { endpoint, local } => run_server(
                        pool,
                        provenance,
                        ServerRun {
                            endpoint: endpoint.as_mut(),
                            name,
                            local: local.as_ref(),
                            prompt: &prompt,
                            max_tokens: shape.generate_tokens,
                            context_tokens,
                        },
                        context,
                    )?,
                };
                done += 1;
                progress(done, total);
                if measured {
                    texts[side] = Some(sample.text.clone());
                    if sample.stopped_early {
                        stopped_early[side] += 1;
                    }
                    samples[side].push(sample);
                }
            }
            if measured {
                measured_runs += 1;
                let ondo_text = runners
                    .iter()
                    .position(|(_, r)| matches!(r, Runner::Ondo(_)))
                    .and_then(|i| texts[i].clone());
                for (side, agrees) in agreement.iter_mut().enumerate() {
                    if let (Some(true), Some(ours), Some(theirs)) =
                        (*agrees, &ondo_text, &texts[side])
                        && !same_greedy_text(ours, theirs)
                    {
                        *agrees = Some(false);
                    }
                }
            }
        }
        for (side, side_samples) in samples.iter().enumerate() {
            results.push(summarize(
                runners_name(&runners, side),
                length,
                shape.generate_tokens,
                side_samples,
            ));
        }
    }

    let reference = runners
        .first()
        .map(|(name, _)| name.clone())
        .unwrap_or_default();
    add_ratios(&mut results, &reference);
    let mut warnings = Vec::new();
    if provenance.build_profile == "debug" {
        warnings.push(
            "debug build: Ondo's engine is slower than it ships; compare with a release build \
             (make release)"
                .into(),
        );
    }
    if !prompts.counted() {
        warnings.push(format!(
            "no tokenizer for these models here: prompts are sized at about {} characters a \
             token; each server's own count is in the table",
            super::text_prompt::CHARACTERS_PER_TOKEN
        ));
    }
    for (side, &count) in stopped_early.iter().enumerate() {
        if count > 0 {
            warnings.push(format!(
                "{} stopped before {} tokens in {count} of {measured_runs} measured runs (it \
                 does not ignore end of sequence): its decode rate is over the tokens that \
                 arrived",
                runners_name(&runners, side),
                shape.generate_tokens
            ));
        }
    }
    let sides = runners
        .iter()
        .zip(agreement)
        .map(|((name, runner), same_text_as_ondo)| match runner {
            Runner::Ondo(loop_shape) => Side {
                name: name.clone(),
                model: plan
                    .ondo
                    .as_ref()
                    .map(|o| o.model_id.clone())
                    .unwrap_or_default(),
                endpoint_url: None,
                dialect: None,
                loop_shape: Some(*loop_shape),
                same_text_as_ondo: None,
            },
            Runner::Server { endpoint, .. } => Side {
                name: name.clone(),
                model: endpoint.model.clone(),
                endpoint_url: Some(endpoint.route_url()),
                dialect: Some(endpoint.dialect),
                loop_shape: None,
                same_text_as_ondo,
            },
        })
        .collect();
    Ok(EndpointComparison {
        bench_id,
        shape: shape.clone(),
        prompt_sizing: prompts.sizing(),
        sides,
        reference,
        results,
        environment: ClientEnvironment::of(provenance),
        warnings,
    })
}

fn runners_name(runners: &[(String, Runner)], side: usize) -> String {
    runners[side].0.clone()
}

/// `name`, or `name (2)`, `name (3)` when another side has it already.
fn unique_name(name: &str, runners: &[(String, Runner)]) -> String {
    let taken = |candidate: &str| runners.iter().any(|(n, _)| n == candidate);
    if !taken(name) {
        return name.to_owned();
    }
    (2..)
        .map(|n| format!("{name} ({n})"))
        .find(|candidate| !taken(candidate))
        .unwrap_or_else(|| name.to_owned())
}

fn canonical(dir: &Path) -> PathBuf {
    dir.canonicalize().unwrap_or_else(|_| dir.to_owned())
}

/// Greedy decoding of one model on one prompt gives one text; a server
/// that stopped at end of sequence gave a beginning of it. Leading space is
/// left out: mlx-lm's detokenizer drops the first token's, Ondo keeps it.
fn same_greedy_text(ours: &str, theirs: &str) -> bool {
    let (ours, theirs) = (ours.trim_start(), theirs.trim_start());
    ours == theirs || (!theirs.is_empty() && ours.starts_with(theirs))
}

fn run_ondo(
    pool: &SessionPool,
    ondo: &BenchPlan,
    loop_shape: LoopShape,
    prompt: &TextPrompt,
    context: RunContext,
) -> Result<Sample, BenchError> {
    let shape = &ondo.shape;
    let request = shape.with_kv(GenerateRequest {
        max_tokens: shape.generate_tokens,
        prefill_step_size: shape.prefill_step_size,
        loop_shape,
        ignore_eos: true,
        // A benchmark times prefill: no prompt cache read from the disk.
        disk_cache: false,
        ..GenerateRequest::new(
            &ondo.model_dir,
            Prompt::Raw {
                text: prompt.text.clone(),
            },
        )
    });
    let context = RunContext {
        bench_id: context.bench_id,
        test: context.test,
        repetition: context.repetition,
        warmup: context.warmup,
        ..ondo.context(RunKind::Bench)
    };
    let handed_over = Instant::now();
    let mut first_token: Option<Instant> = None;
    let (outcome, _record) = pool.run(request, context, CancelToken::new(), |event| {
        if let RunEvent::Delta { token_ids, .. } = event
            && !token_ids.is_empty()
        {
            first_token.get_or_insert_with(Instant::now);
        }
    })?;
    let stats = &outcome.stats;
    let ttft_ms = first_token.map_or(f64::NAN, |t| {
        t.duration_since(handed_over).as_secs_f64() * 1000.0
    });
    Ok(Sample {
        sent_prompt_tokens: stats.prompt_tokens as f64,
        server_prompt_tokens: None,
        generated_tokens: stats.generated_tokens as f64,
        ttft_ms,
        prompt_tps: stats.prompt_tokens as f64 / (ttft_ms / 1000.0),
        decode_tps: stats.decode_tps,
        own_prefill_tps: Some(stats.prefill_tps),
        own_decode_tps: Some(stats.decode_tps),
        text: outcome.raw_text,
        stopped_early: false,
    })
}

/// What one server run needs.
struct ServerRun<'a> {
    endpoint: &'a mut Endpoint,
    name: String,
    local: Option<&'a ResolvedModel>,
    prompt: &'a TextPrompt,
    max_tokens: usize,
    context_tokens: Option<usize>,
}

fn run_server(
    pool: &SessionPool,
    provenance: &Provenance,
    run: ServerRun<'_>,
    context: RunContext,
) -> Result<Sample, BenchError> {
    let ServerRun {
        endpoint,
        name,
        local,
        prompt,
        max_tokens,
        context_tokens,
    } = run;
    let mut outcome: Option<EndpointRun> = None;
    pool.record_outside_run(|| -> Result<RunRecord, BenchError> {
        let created_at = now_rfc3339();
        let answer = endpoint.generate(&prompt.text, max_tokens, context_tokens)?;
        let record = endpoint_record(EndpointRecord {
            endpoint,
            name: &name,
            local,
            prompt,
            max_tokens,
            answer: &answer,
            context: &context,
            provenance,
            created_at,
        });
        outcome = Some(answer);
        Ok(record)
    })?;
    let answer = outcome.ok_or_else(|| BenchError::Plan("the server's run went missing".into()))?;
    let server_prompt_tokens = answer.server.prompt_tokens.map(|n| n as f64);
    let prompt_tokens = server_prompt_tokens.unwrap_or(prompt.tokens as f64);
    let generated = answer.generated_tokens();
    Ok(Sample {
        sent_prompt_tokens: prompt.tokens as f64,
        server_prompt_tokens,
        generated_tokens: generated as f64,
        ttft_ms: answer.ttft_ms,
        prompt_tps: prompt_tokens / (answer.ttft_ms / 1000.0),
        decode_tps: answer.decode_tps(),
        own_prefill_tps: answer.server.prefill_tps(),
        own_decode_tps: answer.server.decode_tps(),
        stopped_early: (generated as usize) < max_tokens,
        text: answer.text,
    })
}

/// What an endpoint run's record is made of.
pub(super) struct EndpointRecord<'a> {
    pub endpoint: &'a Endpoint,
    pub name: &'a str,
    pub local: Option<&'a ResolvedModel>,
    pub prompt: &'a TextPrompt,
    pub max_tokens: usize,
    pub answer: &'a EndpointRun,
    pub context: &'a RunContext,
    pub provenance: &'a Provenance,
    pub created_at: String,
}

/// The flat record of one endpoint run: Ondo's fields measured at the
/// client, the server's own numbers beside them, the model described from
/// its folder when Ondo finds it here, and this machine's provenance with
/// the MLX fields left empty (they describe Ondo, not what served).
pub(super) fn endpoint_record(parts: EndpointRecord<'_>) -> RunRecord {
    let EndpointRecord {
        endpoint,
        name,
        local,
        prompt,
        max_tokens,
        answer,
        context,
        provenance,
        created_at,
    } = parts;
    let described = local.map(|m| {
        crate::hub::library::describe_folder(
            m.name.clone(),
            crate::hub::library::ModelSource::Folder,
            &m.dir,
        )
    });
    let counted_prompt = answer.server.prompt_tokens.unwrap_or(prompt.tokens as u64);
    let cached = answer.server.cached_tokens.unwrap_or(0);
    let generated = answer.generated_tokens();
    let decode_s = answer.decode_ms / 1000.0;
    RunRecord {
        run_id: new_run_id(),
        created_at,
        kind: RunKind::Endpoint,
        bench_id: context.bench_id.clone(),
        test: context.test.clone(),
        repetition: context.repetition,
        warmup: context.warmup,
        conversation_id: None,
        model_id: endpoint.model.clone(),
        model_path: local.map_or(String::new(), |m| m.dir.display().to_string()),
        model_revision: None,
        model_type: described
            .as_ref()
            .and_then(|d| d.model_type.clone())
            .unwrap_or_default(),
        quantization: described
            .as_ref()
            .and_then(|d| d.quantization.clone())
            .unwrap_or_default(),
        parameters: described.as_ref().and_then(|d| d.parameters),
        weights_bytes: 0,
        download_ms: 0.0,
        // A server's load is its own; where it reports one (Ollama) it is
        // `server_load_ms`.
        load_ms: 0.0,
        ttft_ms: answer.ttft_ms,
        // Not visible from the client: the server's prefill is inside TTFT.
        prefill_ms: f64::NAN,
        decode_ms: answer.decode_ms,
        cold_start_ms: None,
        prefill_tps: f64::NAN,
        decode_tps: answer.decode_tps(),
        prompt_tps: counted_prompt as f64 / (answer.ttft_ms / 1000.0),
        generation_tps: if decode_s > 0.0 {
            generated as f64 / decode_s
        } else {
            f64::NAN
        },
        prompt_tokens: prompt.tokens as u64,
        cached_tokens: cached,
        prefill_tokens: counted_prompt.saturating_sub(cached),
        generated_tokens: generated,
        load_kind: LoadKind::Warm,
        fresh_process: false,
        prefix_source: if cached > 0 {
            crate::run_kinds::PrefixSource::Memory
        } else {
            crate::run_kinds::PrefixSource::None
        },
        prefix_read_bytes: None,
        prefix_read_ms: None,
        max_tokens: max_tokens as u64,
        temperature: 0.0,
        stop_reason: match answer.stop_reason {
            StopReason::Other if generated >= max_tokens as u64 => StopReason::MaxTokens,
            reason => reason,
        },
        server_name: Some(name.to_owned()),
        endpoint_url: Some(endpoint.route_url()),
        endpoint_dialect: Some(endpoint.dialect),
        server_prompt_tokens: answer.server.prompt_tokens,
        server_load_ms: answer.server.load_ms,
        server_prefill_ms: answer.server.prefill_ms,
        server_decode_ms: answer.server.decode_ms,
        server_prefill_tps: answer.server.prefill_tps(),
        server_decode_tps: answer.server.decode_tps(),
        batch_min_rows: None,
        batch_median_rows: None,
        batch_max_rows: None,
        admission_wait_ms: None,
        waited_for: None,
        prefill_chunks: None,
        interleaved_chunks: None,
        constraint: None,
        mask_ms_per_token: None,
        concurrency: context.concurrency,
        aggregate_tps: None,
        provenance: Provenance {
            mlx_version: String::new(),
            mlx_rs_version: String::new(),
            backend: String::new(),
            ..provenance.clone()
        },
        ..RunRecord::default()
    }
}

fn summarize(
    side: String,
    length: usize,
    generate_tokens: usize,
    samples: &[Sample],
) -> SideSummary {
    let of = |metric: fn(&Sample) -> f64| {
        Summary::from_samples(&samples.iter().map(metric).collect::<Vec<_>>())
    };
    let optional = |metric: fn(&Sample) -> Option<f64>| {
        let values: Option<Vec<f64>> = samples.iter().map(metric).collect();
        values
            .filter(|v| !v.is_empty())
            .map(|v| Summary::from_samples(&v))
    };
    SideSummary {
        side,
        prompt_tokens: length,
        generate_tokens,
        sent_prompt_tokens: of(|s| s.sent_prompt_tokens),
        server_prompt_tokens: optional(|s| s.server_prompt_tokens),
        generated_tokens: of(|s| s.generated_tokens),
        ttft_ms: of(|s| s.ttft_ms),
        prompt_tps: of(|s| s.prompt_tps),
        decode_tps: of(|s| s.decode_tps),
        own_prefill_tps: optional(|s| s.own_prefill_tps),
        own_decode_tps: optional(|s| s.own_decode_tps),
        ttft_ratio: None,
        decode_ratio: None,
    }
}

/// Each side's medians over the reference side's at the same length.
fn add_ratios(results: &mut [SideSummary], reference: &str) {
    let references: Vec<(usize, f64, f64)> = results
        .iter()
        .filter(|r| r.side == reference)
        .map(|r| (r.prompt_tokens, r.ttft_ms.median, r.decode_tps.median))
        .collect();
    for result in results.iter_mut().filter(|r| r.side != reference) {
        if let Some(&(_, ttft, decode)) = references
            .iter()
            .find(|(length, ..)| *length == result.prompt_tokens)
        {
            result.ttft_ratio = Some(ratio(result.ttft_ms.median, ttft));
            result.decode_ratio = Some(ratio(result.decode_tps.median, decode));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_stopped_at_end_of_sequence_agrees_up_to_there() {
        assert!(same_greedy_text("a b c", "a b c"));
        assert!(same_greedy_text("a b c", "a b"));
        assert!(!same_greedy_text("a b c", "a x"));
        assert!(!same_greedy_text("a b c", ""));
        assert!(same_greedy_text(" silver G", "silver G"));
    }
}
