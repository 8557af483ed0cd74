//! One generation asked over HTTP, dialect aside: the model resolved, the
//! settings checked, the conversation whose cache it continues, a turn at
//! the engine, then `SessionPool::run` on a blocking thread whose events
//! reach the async side through a channel. Dropping the [`Job`] (the client
//! went away) cancels the generation at its next step. A request that only
//! loads or unloads a model takes the same turns.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;

use super::ServerState;
use super::conversations::PromptParts;
use super::error::ApiError;
use super::queue::Turn;
use crate::engine::constrain::OutputConstraint;
use crate::engine::stream::RunOutcome;
use crate::engine::{CancelToken, GenerateRequest, Prompt, RunEvent, ToolCall};
use crate::resolve::ResolvedModel;
use crate::run_kinds::{LoadKind, LoopShape, RunKind, StopReason};
use crate::session::KeepAlive;
use crate::session::chat::GenerationSettings;
use crate::session::record::RunContext;
use crate::store::RunRecord;

/// The settings a request sets; the rest come from the defaults the app's
/// Settings keep (`GenerationSettings`), which also checks them all.
#[derive(Debug, Clone, Default)]
pub(crate) struct SettingsAsked {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub max_kv_size: Option<usize>,
    /// Ondo's engine knobs, which a request may set too (OpenAI's `ondo`
    /// object, Ollama's `num_batch`): the app's chat with a model split
    /// over several machines sends its own this way.
    pub prefill_step_size: Option<usize>,
    pub kv_bits: Option<u8>,
    pub loop_shape: Option<LoopShape>,
}

impl SettingsAsked {
    /// `defaults` with what the request set, checked.
    pub fn over(&self, defaults: &GenerationSettings) -> Result<GenerationSettings, ApiError> {
        let settings = GenerationSettings {
            max_tokens: self.max_tokens.unwrap_or(defaults.max_tokens),
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self.repetition_penalty.or(defaults.repetition_penalty),
            seed: self.seed.or(defaults.seed),
            max_kv_size: self.max_kv_size.or(defaults.max_kv_size),
            prefill_step_size: self.prefill_step_size.unwrap_or(defaults.prefill_step_size),
            kv_bits: self.kv_bits.or(defaults.kv_bits),
            loop_shape: self.loop_shape.unwrap_or(defaults.loop_shape),
            ..defaults.clone()
        };
        settings.check().map_err(ApiError::InvalidSettings)?;
        Ok(settings)
    }
}

/// What a client's keep-alive asks of the pool after the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeepAliveAsked {
    /// Leave the model's keep-alive as it is (OpenAI clients say nothing).
    Unchanged,
    /// Back to the pool's (an Ollama request without `keep_alive`).
    PoolDefault,
    /// This long (zero: unload right after).
    For(KeepAlive),
}

/// A generation a dialect asks for.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    /// The route, for the log and the in-flight line.
    pub route: &'static str,
    /// The model as the client named it.
    pub model: String,
    pub prompt: Prompt,
    pub settings: SettingsAsked,
    pub stop_strings: Vec<String>,
    pub ignore_eos: bool,
    pub keep_alive: KeepAliveAsked,
    pub user_agent: Option<String>,
    /// The answer streams: the engine sends every token as it comes (a
    /// whole answer is better served by the engine's merged deltas).
    pub stream: bool,
    /// What the reply is held to (JSON, a JSON schema); `None`: free text.
    pub constraint: Option<OutputConstraint>,
}

/// What a running job says, in order: `Started`, any `Delta`s, then one of
/// `Done` or `Failed`.
#[derive(Debug)]
pub(crate) enum JobEvent {
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// What one token added to the reply (nothing while its text is held
    /// back: a character, a word or a marker spelled over several tokens).
    Delta {
        text: String,
        reasoning: String,
        tool_calls: Vec<ToolCall>,
    },
    Done(Box<JobResult>),
    Failed(ApiError),
}

/// A finished generation.
#[derive(Debug)]
pub(crate) struct JobResult {
    pub outcome: RunOutcome,
    pub record: RunRecord,
    /// Time waiting for the engine.
    pub queued: Duration,
    /// From the request's arrival to the end of the run.
    pub total: Duration,
}

impl JobResult {
    /// Ondo's own record of the request, for the `ondo` field.
    pub fn ondo_record(&self) -> OndoRecord {
        let r = &self.record;
        OndoRecord {
            run_id: r.run_id.clone(),
            model: r.model_id.clone(),
            load_kind: r.load_kind,
            load_ms: r.load_ms,
            queued_ms: self.queued.as_secs_f64() * 1e3,
            ttft_ms: r.ttft_ms,
            prefill_ms: r.prefill_ms,
            prefill_tps: r.prefill_tps,
            decode_ms: r.decode_ms,
            decode_tps: r.decode_tps,
            prompt_tokens: r.prompt_tokens,
            cached_tokens: r.cached_tokens,
            prefix_source: r.prefix_source,
            prefix_read_bytes: r.prefix_read_bytes,
            prefix_read_ms: r.prefix_read_ms,
            prefill_tokens: r.prefill_tokens,
            generated_tokens: r.generated_tokens,
            reasoning_tokens: r.reasoning_tokens,
            reasoning_ms: r.reasoning_ms,
            mlx_peak_bytes: r.mlx_peak_bytes,
            kv_cache_bytes: r.kv_cache_bytes,
            kv_bits: r.kv_bits,
            images: r.images,
            image_tokens: r.image_tokens,
            image_encode_ms: r.image_encode_ms,
            pressure_start: r.pressure_start.clone(),
            pressure_max: r.pressure_max.clone(),
            pressure_end: r.pressure_end.clone(),
            stop_reason: r.stop_reason,
            conversation_id: r.conversation_id.clone(),
            batch: self.outcome.stats.batch.clone(),
            constraint: self.outcome.stats.constraint.clone(),
        }
    }

    /// OpenAI's `finish_reason` (Ollama's `done_reason` uses the same words).
    pub fn finish_reason(&self) -> &'static str {
        finish_reason(self.outcome.stats.stop_reason)
    }
}

/// `stop`, `length` or `tool_calls`, as OpenAI names why a reply ended.
pub(crate) fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::MaxTokens => "length",
        StopReason::ToolCalls => "tool_calls",
        StopReason::Eos | StopReason::StopString | StopReason::Cancelled | StopReason::Other => {
            "stop"
        }
    }
}

/// Ondo's record of one API request: what no other server reports, under
/// the one field `ondo` of each final response (and last streamed chunk),
/// which OpenAI, Anthropic and Ollama clients ignore. Times in milliseconds, rates in
/// tokens per second (DESIGN's definitions, as the run history keeps them).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct OndoRecord {
    /// The run in Ondo's history (`ondo runs --kind api`).
    pub run_id: String,
    pub model: String,
    /// `cold`: this request loaded the model; `warm`: it was resident.
    pub load_kind: LoadKind,
    pub load_ms: f64,
    /// Waiting for the engine behind other requests.
    pub queued_ms: f64,
    pub ttft_ms: f64,
    pub prefill_ms: f64,
    pub prefill_tps: f64,
    pub decode_ms: f64,
    pub decode_tps: f64,
    pub prompt_tokens: u64,
    /// Prompt tokens the conversation's KV cache already held.
    pub cached_tokens: u64,
    /// Where the cached tokens came from: none, memory or disk.
    pub prefix_source: crate::run_kinds::PrefixSource,
    /// Bytes read from a prompt cache on disk and the time it took.
    pub prefix_read_bytes: Option<u64>,
    pub prefix_read_ms: Option<f64>,
    pub prefill_tokens: u64,
    pub generated_tokens: u64,
    /// Generated tokens that were reasoning, and their part of `decode_ms`.
    pub reasoning_tokens: u64,
    pub reasoning_ms: f64,
    pub mlx_peak_bytes: u64,
    pub kv_cache_bytes: u64,
    /// Bits per element of a quantized KV cache; null: float.
    pub kv_bits: Option<u64>,
    /// Images the prompt showed, the tokens they filled and what encoding
    /// them took (inside `ttft_ms`); null without images.
    pub images: u64,
    pub image_tokens: Option<u64>,
    pub image_encode_ms: Option<f64>,
    /// Memory pressure at the start, the worst during, and at the end.
    pub pressure_start: String,
    pub pressure_max: String,
    pub pressure_end: String,
    pub stop_reason: StopReason,
    /// The cached conversation this request continued.
    pub conversation_id: Option<String>,
    /// The batch the request shared with others on the engine: the
    /// sequences in its forward passes (fewest, median, most; 1, 1, 1 when
    /// it was alone), its wait to be let in and what for, and its prefill
    /// chunks run between the others' steps. `null` when it ran alone by
    /// request (a batch of 1).
    pub batch: Option<crate::engine::stats::BatchShare>,
    /// The grammar the reply was held to (`json_object`, `json_schema`),
    /// its compile time and the mask time per token; `null` for free text.
    pub constraint: Option<crate::engine::constrain::ConstraintStats>,
}

/// Cancels a generation when dropped: the client went away.
struct CancelOnDrop(CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A generation under way, seen from the request's side.
pub(crate) struct Job {
    /// The model as the library names it.
    pub model: String,
    /// When the request arrived, in Unix seconds (OpenAI's `created`).
    pub created_unix_s: u64,
    events: mpsc::UnboundedReceiver<JobEvent>,
    _cancel: CancelOnDrop,
}

impl Job {
    /// The next event; `None` once the job is over.
    pub async fn next(&mut self) -> Option<JobEvent> {
        self.events.recv().await
    }

    /// The next event if one is there already (`Some(None)`: the job is over).
    fn try_next(&mut self) -> Option<Option<JobEvent>> {
        match self.events.try_recv() {
            Ok(event) => Some(Some(event)),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => Some(None),
        }
    }

    /// Waits for the start: an error before any output comes back as an
    /// error (a status for the client) rather than as an event.
    pub async fn started(&mut self) -> Result<(usize, usize), ApiError> {
        match self.next().await {
            Some(JobEvent::Started {
                prompt_tokens,
                cached_tokens,
            }) => Ok((prompt_tokens, cached_tokens)),
            Some(JobEvent::Failed(error)) => Err(error),
            Some(JobEvent::Done(_) | JobEvent::Delta { .. }) | None => Err(ApiError::Run(
                crate::engine::RunError::Internal("the run ended without starting".into()),
            )),
        }
    }

    /// Waits for the whole reply.
    pub async fn finish(mut self) -> Result<JobResult, ApiError> {
        while let Some(event) = self.next().await {
            match event {
                JobEvent::Done(result) => return Ok(*result),
                JobEvent::Failed(error) => return Err(error),
                JobEvent::Started { .. } | JobEvent::Delta { .. } => {}
            }
        }
        Err(ApiError::Run(crate::engine::RunError::EngineStopped))
    }
}

/// Writes a job's events in a dialect's streaming format (server-sent
/// events for OpenAI, JSON lines for Ollama).
pub(crate) trait StreamEncoder: Send + 'static {
    /// What goes out as soon as the run has started.
    fn prelude(&mut self) -> Vec<u8> {
        Vec::new()
    }
    /// What one token added (a chunk even when it added nothing yet).
    fn delta(&mut self, text: &str, reasoning: &str, tool_calls: &[ToolCall]) -> Vec<u8>;
    /// The end: the reason, the counts and Ondo's record.
    fn done(&mut self, result: &JobResult) -> Vec<u8>;
    /// A failure after the response began: the error in the stream.
    fn failed(&mut self, error: &ApiError) -> Vec<u8>;
}

/// A started job streamed to the client with `encoder`. Dropping the body
/// (the client went away) drops the job, which cancels the generation.
pub(crate) fn stream_response(
    job: Job,
    mut encoder: impl StreamEncoder,
    content_type: &'static str,
) -> axum::response::Response {
    use axum::body::{Body, Bytes};
    use axum::http::{HeaderValue, header};
    use std::convert::Infallible;

    let prelude = encoder.prelude();
    let chunks = futures_util::stream::unfold(Some((job, encoder, prelude)), |state| async move {
        let (mut job, mut encoder, mut bytes) = state?;
        // Wait for an event unless the prelude is ready to go, then take
        // every event already there: a client (or a machine) that falls
        // behind gets them in one write rather than one write each.
        let mut next = if bytes.is_empty() {
            Some(job.next().await)
        } else {
            None
        };
        loop {
            let event = match next.take() {
                Some(event) => event,
                None => match job.try_next() {
                    Some(event) => event,
                    None => {
                        return Some((
                            Ok::<_, Infallible>(Bytes::from(bytes)),
                            Some((job, encoder, Vec::new())),
                        ));
                    }
                },
            };
            match event {
                Some(JobEvent::Delta {
                    text,
                    reasoning,
                    tool_calls,
                }) => bytes.extend(encoder.delta(&text, &reasoning, &tool_calls)),
                Some(JobEvent::Started { .. }) => {}
                Some(JobEvent::Done(result)) => {
                    bytes.extend(encoder.done(&result));
                    return Some((Ok(Bytes::from(bytes)), None));
                }
                Some(JobEvent::Failed(error)) => {
                    bytes.extend(encoder.failed(&error));
                    return Some((Ok(Bytes::from(bytes)), None));
                }
                None => {
                    let stopped = ApiError::Run(crate::engine::RunError::EngineStopped);
                    bytes.extend(encoder.failed(&stopped));
                    return Some((Ok(Bytes::from(bytes)), None));
                }
            }
        }
    });
    let mut response = axum::response::Response::new(Body::from_stream(chunks));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Proxies that buffer would hold the tokens back.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response.extensions_mut().insert(super::LoggedAtRunEnd);
    response
}

/// A prompt as the conversation index compares them.
fn prompt_parts(prompt: &Prompt) -> PromptParts {
    match prompt {
        Prompt::Chat {
            system_prompt,
            messages,
            tools,
            template_options,
        } => {
            let head = serde_json::json!({
                "system": system_prompt,
                "tools": tools,
                "options": template_options,
            });
            std::iter::once(head.to_string())
                .chain(
                    messages
                        .iter()
                        .map(|m| serde_json::to_string(m).unwrap_or_default()),
                )
                .collect()
        }
        Prompt::Raw { text } => vec!["raw".into(), text.clone()],
        Prompt::Tokens { ids } => {
            let ids: String = ids.iter().map(|id| format!("{id},")).collect();
            vec!["tokens".into(), ids]
        }
    }
}

impl ServerState {
    /// Resolves, checks, waits for the engine and starts the run.
    pub(crate) async fn start_job(self: &Arc<Self>, ask: Ask) -> Result<Job, ApiError> {
        let received = Instant::now();
        let created_unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let saved = self.saved_settings().await;
        let model = self.resolve(&ask.model, &saved).await?;
        let settings = ask.settings.over(&saved.generation)?;
        // An image over the limits is refused here, from its size and
        // header, before the request waits for the engine.
        for (n, image) in crate::engine::stream::prompt_images(&ask.prompt)
            .into_iter()
            .enumerate()
        {
            crate::vision::check_encoded(image, settings.image_limits())
                .map_err(|e| ApiError::InvalidField(format!("image {}: {e}", n + 1)))?;
        }
        let conversation = self
            .conversations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .conversation_for(&model.name, prompt_parts(&ask.prompt));
        let turn = self.queue.wait_turn().await?;
        let (sender, events) = mpsc::unbounded_channel();
        let cancel = CancelToken::new();
        let job = Job {
            model: model.name.clone(),
            created_unix_s,
            events,
            _cancel: CancelOnDrop(cancel.clone()),
        };
        let state = self.clone();
        let run = RunOrder {
            ask,
            model,
            settings,
            conversation,
            turn,
            received,
        };
        tokio::task::spawn_blocking(move || state.run_job(run, sender, cancel));
        Ok(job)
    }

    /// On a blocking thread: the run through the pool, its events sent on.
    fn run_job(
        &self,
        order: RunOrder,
        events: mpsc::UnboundedSender<JobEvent>,
        cancel: CancelToken,
    ) {
        let RunOrder {
            ask,
            model,
            settings,
            conversation,
            turn,
            received,
        } = order;
        let flight = self.flights.begin(&ask, &model.name, cancel.clone());
        let request = GenerateRequest {
            conversation: Some(conversation.clone()),
            stop_strings: ask.stop_strings.clone(),
            ignore_eos: ask.ignore_eos,
            delta_every_token: ask.stream,
            // As many share the engine's batch as the server gives turns.
            max_batch: self.queue.slots(),
            ..settings.request(&model.dir, ask.prompt.clone())
        }
        .hold_to(ask.constraint.clone());
        let context = RunContext {
            conversation_id: Some(conversation),
            user_agent: ask.user_agent.clone(),
            ..model.run_context(RunKind::Api)
        };
        let at_engine = Instant::now();
        let on_engine = events.clone();
        let result = self
            .pool
            .run_on_engine_thread(request, context, cancel, move |event| match event {
                RunEvent::Started {
                    prompt_tokens,
                    cached_tokens,
                    ..
                } => {
                    let _ = on_engine.send(JobEvent::Started {
                        prompt_tokens: *prompt_tokens,
                        cached_tokens: *cached_tokens,
                    });
                }
                // Every token, its text held back or not: one chunk each.
                RunEvent::Delta {
                    text,
                    reasoning,
                    tool_calls,
                    ..
                } => {
                    let _ = on_engine.send(JobEvent::Delta {
                        text: text.clone(),
                        reasoning: reasoning.clone(),
                        tool_calls: tool_calls.clone(),
                    });
                }
                _ => {}
            });
        self.queue.note_run(at_engine.elapsed());
        let keep_alive = match ask.keep_alive {
            KeepAliveAsked::Unchanged => None,
            KeepAliveAsked::PoolDefault => Some(None),
            KeepAliveAsked::For(keep_alive) => Some(Some(keep_alive)),
        };
        if let Some(keep_alive) = keep_alive {
            // Not resident (it failed to load): nothing to keep.
            let _ = self.pool.keep_model_alive(&model.dir, keep_alive);
        }
        drop(flight);
        let (event, log) = match result {
            Ok((outcome, record)) => {
                let result = JobResult {
                    outcome,
                    record,
                    queued: turn.waited,
                    total: received.elapsed(),
                };
                let log = RequestLog::of_run(&ask, &result);
                (JobEvent::Done(Box::new(result)), log)
            }
            Err(error) => {
                let error = ApiError::of_run(&model, error);
                let log = RequestLog::of_failure(
                    ask.route,
                    Some(model.name.clone()),
                    &error,
                    ask.user_agent.clone(),
                );
                (JobEvent::Failed(error), log)
            }
        };
        // Logged before the answer ends, so that a client that reads the
        // log after its answer finds the line there.
        (self.on_request)(&log);
        let _ = events.send(event);
        // The next request may have the engine.
        drop(turn);
    }

    /// Has `name` loaded (kept as `keep_alive` asks) or, with a keep-alive
    /// of zero, unloaded: a request with nothing to answer (Ollama's way).
    /// It takes its turn at the engine like a generation, so a full queue or
    /// a long wait refuses it the same way, and it holds a blocking thread
    /// only once its turn has come. Returns the model and whether it was
    /// unloaded.
    pub(crate) async fn load_only(
        self: &Arc<Self>,
        name: &str,
        keep_alive: KeepAliveAsked,
    ) -> Result<(ResolvedModel, bool), ApiError> {
        let model = self.resolve(name, &self.saved_settings().await).await?;
        let turn = self.queue.wait_turn().await?;
        let unload = keep_alive == KeepAliveAsked::For(KeepAlive::For(Duration::ZERO));
        let state = self.clone();
        let held = model.clone();
        tokio::task::spawn_blocking(move || {
            let at_engine = Instant::now();
            let done = if unload {
                state.pool.unload(&held.dir).map(|_| ())
            } else {
                let keep = match keep_alive {
                    KeepAliveAsked::For(keep) => Some(keep),
                    KeepAliveAsked::PoolDefault | KeepAliveAsked::Unchanged => None,
                };
                state
                    .pool
                    .preload(&held.dir, &held.name)
                    .and_then(|_| state.pool.keep_model_alive(&held.dir, keep))
                    .map(|_| ())
            };
            state.queue.note_run(at_engine.elapsed());
            // The next request may have the engine.
            drop(turn);
            done.map_err(|error| ApiError::of_run(&held, error))
        })
        .await
        .map_err(|e| ApiError::Run(crate::engine::RunError::Internal(e.to_string())))??;
        Ok((model, unload))
    }
}

/// Everything a run needs, moved onto its thread.
struct RunOrder {
    ask: Ask,
    model: ResolvedModel,
    settings: GenerationSettings,
    conversation: String,
    turn: Turn,
    received: Instant,
}

/// One line of the server's log: what was asked, of which model, how it
/// went, and where the time went.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct RequestLog {
    /// Method and path: `POST /v1/chat/completions`.
    pub route: String,
    pub model: Option<String>,
    pub status: u16,
    /// The error's kind and message, for a refused or failed request.
    pub error: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// Those cached tokens were read back from a prompt cache on disk.
    pub cached_from_disk: bool,
    pub generated_tokens: Option<u64>,
    pub queued_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub decode_tps: Option<f64>,
    pub stop_reason: Option<StopReason>,
    /// How it shared the engine's batch, in words ("batch 2-6 (median 4)").
    pub batch: Option<String>,
    pub user_agent: Option<String>,
}

impl RequestLog {
    fn of_run(ask: &Ask, result: &JobResult) -> Self {
        let r = &result.record;
        Self {
            route: ask.route.to_owned(),
            model: Some(r.model_id.clone()),
            status: 200,
            error: None,
            prompt_tokens: Some(r.prompt_tokens),
            cached_tokens: Some(r.cached_tokens),
            cached_from_disk: r.prefix_source == crate::run_kinds::PrefixSource::Disk,
            generated_tokens: Some(r.generated_tokens),
            queued_ms: Some(result.queued.as_secs_f64() * 1e3),
            ttft_ms: Some(r.ttft_ms),
            decode_tps: Some(r.decode_tps),
            stop_reason: Some(r.stop_reason),
            batch: result
                .outcome
                .stats
                .batch
                .as_ref()
                .map(crate::engine::stats::BatchShare::describe),
            user_agent: ask.user_agent.clone(),
        }
    }

    /// A request answered with an error.
    pub(crate) fn of_failure(
        route: &str,
        model: Option<String>,
        error: &ApiError,
        user_agent: Option<String>,
    ) -> Self {
        Self {
            route: route.to_owned(),
            model,
            status: super::Dialect::of_path(route.split(' ').nth(1).unwrap_or(route))
                .status(error)
                .as_u16(),
            error: Some(format!("{}: {error}", error.kind())),
            ..Self::plain(route, 0, user_agent)
        }
    }

    /// A request with nothing to report but its status.
    pub(crate) fn plain(route: &str, status: u16, user_agent: Option<String>) -> Self {
        Self {
            route: route.to_owned(),
            model: None,
            status,
            error: None,
            prompt_tokens: None,
            cached_tokens: None,
            cached_from_disk: false,
            generated_tokens: None,
            queued_ms: None,
            ttft_ms: None,
            decode_tps: None,
            stop_reason: None,
            batch: None,
            user_agent,
        }
    }

    /// The line `ondo serve` prints.
    pub fn line(&self) -> String {
        let mut parts = vec![self.route.clone()];
        if let Some(model) = &self.model {
            parts.push(model.clone());
        }
        parts.push(self.status.to_string());
        if let Some(error) = &self.error {
            parts.push(error.clone());
        }
        if let Some(prompt) = self.prompt_tokens {
            let cached = self.cached_tokens.unwrap_or(0);
            parts.push(if cached > 0 && self.cached_from_disk {
                format!("prompt {prompt} ({cached} cached, from disk)")
            } else if cached > 0 {
                format!("prompt {prompt} ({cached} cached)")
            } else {
                format!("prompt {prompt}")
            });
        }
        if let Some(queued) = self.queued_ms.filter(|q| *q >= 1.0) {
            parts.push(format!("queued {queued:.0} ms"));
        }
        if let Some(ttft) = self.ttft_ms {
            parts.push(format!("TTFT {ttft:.1} ms"));
        }
        if let (Some(tps), Some(tokens)) = (self.decode_tps, self.generated_tokens) {
            parts.push(format!("decode {tps:.1} tok/s ({tokens} tokens)"));
        }
        if let Some(batch) = &self.batch {
            parts.push(batch.clone());
        }
        if self.stop_reason == Some(StopReason::Cancelled) {
            parts.push("cancelled: the client went away".into());
        }
        if let Some(agent) = &self.user_agent {
            parts.push(agent.clone());
        }
        parts.join(" · ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::chat_template::ChatMessage;

    #[test]
    fn unset_fields_take_the_saved_defaults_and_all_are_checked() {
        let defaults = GenerationSettings {
            temperature: 0.7,
            max_tokens: 100,
            ..GenerationSettings::default()
        };
        let asked = SettingsAsked {
            max_tokens: Some(8),
            seed: Some(3),
            ..SettingsAsked::default()
        };
        let settings = asked.over(&defaults).unwrap();
        assert_eq!(
            (settings.max_tokens, settings.temperature, settings.seed),
            (8, 0.7, Some(3))
        );
        let too_hot = SettingsAsked {
            temperature: Some(9.0),
            ..SettingsAsked::default()
        };
        let Err(error) = too_hot.over(&defaults) else {
            panic!("a temperature of 9 passed");
        };
        assert_eq!(error.status().as_u16(), 400);
        assert!(error.to_string().contains("temperature"), "{error}");
    }

    #[test]
    fn reasons_to_stop_in_openai_words() {
        assert_eq!(finish_reason(StopReason::Eos), "stop");
        assert_eq!(finish_reason(StopReason::StopString), "stop");
        assert_eq!(finish_reason(StopReason::MaxTokens), "length");
        assert_eq!(finish_reason(StopReason::ToolCalls), "tool_calls");
    }

    #[test]
    fn a_follow_up_chat_shares_its_first_parts() {
        let first = Prompt::chat(None, vec![ChatMessage::user("hi")]);
        let second = Prompt::chat(
            None,
            vec![
                ChatMessage::user("hi"),
                ChatMessage::assistant("hello"),
                ChatMessage::user("more"),
            ],
        );
        let (a, b) = (prompt_parts(&first), prompt_parts(&second));
        assert_eq!(a.len(), 2);
        assert_eq!(b[..2], a[..]);
        let tokens = prompt_parts(&Prompt::Tokens { ids: vec![1, 22] });
        assert_eq!(tokens[1], "1,22,");
    }

    #[test]
    fn the_log_line_says_where_the_time_went() {
        let log = RequestLog {
            model: Some("tiny".into()),
            prompt_tokens: Some(19),
            cached_tokens: Some(12),
            generated_tokens: Some(40),
            queued_ms: Some(0.2),
            ttft_ms: Some(9.94),
            decode_tps: Some(1242.19),
            stop_reason: Some(StopReason::MaxTokens),
            batch: Some("batch 2-4 (median 3)".into()),
            ..RequestLog::plain(
                "POST /v1/chat/completions",
                200,
                Some("OpenAI/Python 3.57.0".into()),
            )
        };
        assert_eq!(
            log.line(),
            "POST /v1/chat/completions · tiny · 200 · prompt 19 (12 cached) · TTFT 9.9 ms · \
             decode 1242.2 tok/s (40 tokens) · batch 2-4 (median 3) · OpenAI/Python 3.57.0"
        );
        let refused = RequestLog::of_failure("POST /api/chat", None, &ApiError::KeyRefused, None);
        assert!(
            refused
                .line()
                .starts_with("POST /api/chat · 401 · api_key_refused: "),
            "{}",
            refused.line()
        );
    }
}
