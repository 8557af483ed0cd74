//! The Ollama dialect: `GET /api/version`, `/api/tags`, `/api/ps`, `POST
//! /api/show`, `/api/chat` and `/api/generate`, as Ollama's clients send and
//! read them. Answers stream as JSON lines unless `"stream": false`; the
//! counters are Ollama's, in nanoseconds; `keep_alive` sets how long the
//! model stays loaded after the request (0: unload right after), through
//! the pool; `think` is the template's `enable_thinking` (or, as a word,
//! gpt-oss's `reasoning_effort`), and the reasoning comes back as `thinking`.
//! A message's (or a generate request's) `images` are base64 files.

use super::output_format::ollama_format;
use crate::engine::constrain::OutputConstraint;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::error::{ApiError, ApiFailure, Dialect, error_body};
use super::generation::{
    Ask, JobResult, KeepAliveAsked, SettingsAsked, StreamEncoder, stream_response,
};
use super::openai::arguments_from_wire;
use super::{LoggedAtRunEnd, ServerState, now_rfc3339, parse_body, user_agent};
use crate::engine::chat_template::{ChatMessage, ChatTemplate};
use crate::engine::reply::{FunctionCall, ToolCallKind};
use crate::engine::{Prompt, ToolCall};
use crate::hub::library::{self, LibraryModel, ModelSource};
use crate::resolve::TINY;
use crate::session::KeepAlive;
use crate::session::chat::GenerationSettings;

/// Ollama's `options`: the ones this server reads (others are ignored, as
/// Ollama ignores those a model does not use).
#[derive(Debug, Default, Deserialize)]
struct OptionsIn {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    num_predict: Option<i64>,
    num_ctx: Option<i64>,
    /// Prompt tokens per prefill pass (Ondo's prefill step size).
    num_batch: Option<i64>,
    seed: Option<i64>,
    stop: Option<Vec<String>>,
}

/// An option that counts tokens, refused unless it is at least 1.
fn token_count(name: &str, value: Option<i64>, what: &str) -> Result<Option<usize>, ApiError> {
    match value {
        Some(n) if n <= 0 => Err(ApiError::InvalidField(format!(
            "{name} is {n}; give {what} a size in tokens"
        ))),
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        None => Ok(None),
    }
}

impl OptionsIn {
    fn settings(&self) -> Result<SettingsAsked, ApiError> {
        let max_kv_size = token_count("num_ctx", self.num_ctx, "the context")?;
        let prefill_step_size = token_count("num_batch", self.num_batch, "the prompt batch")?;
        Ok(SettingsAsked {
            // Ollama's -1 (and -2) mean "until the model stops": as many
            // as this server allows.
            max_tokens: self.num_predict.map(|n| {
                if n < 0 {
                    GenerationSettings::LIMITS.max_tokens.1
                } else {
                    usize::try_from(n).unwrap_or(usize::MAX)
                }
            }),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self
                .top_k
                .map(|k| u32::try_from(k.max(0)).unwrap_or(u32::MAX)),
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            // A negative seed is Ollama's "random".
            seed: self.seed.and_then(|s| u64::try_from(s).ok()),
            max_kv_size,
            prefill_step_size,
            ..SettingsAsked::default()
        })
    }
}

/// The fields `/api/chat` and `/api/generate` share.
#[derive(Debug, Default, Deserialize)]
struct CommonIn {
    stream: Option<bool>,
    #[serde(default)]
    options: Option<OptionsIn>,
    keep_alive: Option<Value>,
    think: Option<Value>,
    format: Option<Value>,
}

impl CommonIn {
    /// What `format` holds the reply to.
    fn constraint(&self) -> Result<Option<OutputConstraint>, ApiError> {
        ollama_format(self.format.as_ref())
    }

    fn settings(&self) -> Result<SettingsAsked, ApiError> {
        self.options
            .as_ref()
            .map_or(Ok(SettingsAsked::default()), OptionsIn::settings)
    }

    fn stop_strings(&mut self) -> Vec<String> {
        self.options
            .as_mut()
            .and_then(|o| o.stop.take())
            .unwrap_or_default()
    }

    fn keep_alive(&self) -> Result<KeepAliveAsked, ApiError> {
        match &self.keep_alive {
            None | Some(Value::Null) => Ok(KeepAliveAsked::PoolDefault),
            Some(value) => keep_alive_from(value).map(KeepAliveAsked::For),
        }
    }

    /// The template options `think` asks for.
    fn template_options(&self) -> Result<Map<String, Value>, ApiError> {
        let mut options = Map::new();
        match &self.think {
            None | Some(Value::Null) => {}
            Some(Value::Bool(on)) => {
                options.insert("enable_thinking".into(), Value::Bool(*on));
            }
            Some(Value::String(effort)) if ["low", "medium", "high"].contains(&effort.as_str()) => {
                options.insert("reasoning_effort".into(), Value::String(effort.clone()));
            }
            Some(other) => {
                return Err(ApiError::InvalidField(format!(
                    "think is {other}; use true, false, or low, medium or high"
                )));
            }
        }
        Ok(options)
    }
}

/// Ollama's `keep_alive`: seconds as a number, or a duration ("5m", "1h30m",
/// "300ms"); negative keeps the model loaded until the pool needs room, 0
/// unloads it right after.
pub(super) fn keep_alive_from(value: &Value) -> Result<KeepAlive, ApiError> {
    let refused = || {
        ApiError::InvalidField(format!(
            "keep_alive is {value}; give seconds, or a duration such as \"5m\" (0 unloads, -1 keeps it)"
        ))
    };
    let seconds = match value {
        Value::Number(n) => n.as_f64().ok_or_else(refused)?,
        Value::String(text) => duration_seconds(text.trim()).ok_or_else(refused)?,
        _ => return Err(refused()),
    };
    if seconds < 0.0 {
        Ok(KeepAlive::Forever)
    } else {
        Duration::try_from_secs_f64(seconds)
            .map(KeepAlive::For)
            .map_err(|_| refused())
    }
}

/// A Go duration ("1h30m", "-1m", "2.5s", "0") in seconds; a bare number is
/// seconds.
fn duration_seconds(text: &str) -> Option<f64> {
    if let Ok(seconds) = text.parse::<f64>() {
        return seconds.is_finite().then_some(seconds);
    }
    let (sign, mut rest) = match text.strip_prefix('-') {
        Some(rest) => (-1.0, rest),
        None => (1.0, text.strip_prefix('+').unwrap_or(text)),
    };
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    Some(sign * total)
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    content: Option<String>,
    thinking: Option<String>,
    tool_calls: Option<Vec<ToolCallIn>>,
    tool_name: Option<String>,
    images: Option<Vec<Value>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallIn {
    function: FunctionIn,
}

#[derive(Debug, Deserialize)]
struct FunctionIn {
    name: String,
    arguments: Option<Value>,
}

/// A message's `images`: base64 strings (a `data:` URL is read too).
/// `field` names the list in errors.
fn images_of(images: Option<Vec<Value>>, field: &str) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::new();
    for (n, image) in images.unwrap_or_default().into_iter().enumerate() {
        let what = format!("{field}[{n}]");
        let Value::String(text) = image else {
            return Err(ApiError::InvalidField(format!(
                "{what} is not a string; send each image as base64"
            )));
        };
        out.push(if text.starts_with("data:") {
            super::images::from_url(text, &what)?
        } else {
            super::images::from_base64(text, &what)?
        });
    }
    Ok(out)
}

impl MessageIn {
    fn into_chat(self, index: usize) -> Result<ChatMessage, ApiError> {
        if !["system", "user", "assistant", "tool"].contains(&self.role.as_str()) {
            return Err(ApiError::InvalidField(format!(
                "message {index} has the role '{}'; use system, user, assistant or tool",
                self.role
            )));
        }
        let images = images_of(self.images, &format!("messages[{index}].images"))?;
        let tool_calls = self.tool_calls.map(|calls| {
            calls
                .into_iter()
                .map(|call| ToolCall {
                    id: String::new(),
                    kind: ToolCallKind::Function,
                    function: FunctionCall {
                        name: call.function.name,
                        arguments: arguments_from_wire(call.function.arguments),
                    },
                })
                .collect()
        });
        Ok(ChatMessage {
            role: self.role,
            content: self.content.unwrap_or_default(),
            reasoning_content: self.thinking.filter(|t| !t.is_empty()),
            tool_calls,
            tool_call_id: None,
            name: self.tool_name,
            images,
        })
    }
}

#[derive(Debug, Deserialize)]
struct ChatIn {
    model: String,
    messages: Option<Vec<MessageIn>>,
    tools: Option<Vec<Value>>,
    #[serde(flatten)]
    common: CommonIn,
}

#[derive(Debug, Deserialize)]
struct GenerateIn {
    model: String,
    prompt: Option<String>,
    system: Option<String>,
    raw: Option<bool>,
    images: Option<Vec<Value>>,
    suffix: Option<String>,
    #[serde(flatten)]
    common: CommonIn,
}

/// What a request without anything to answer asks: have the model loaded,
/// or (keep_alive 0) unloaded.
enum Asked {
    Generate(Box<Ask>, bool),
    LoadOnly(String, KeepAliveAsked),
}

impl ChatIn {
    fn into_request(mut self, user_agent: Option<String>) -> Result<Asked, ApiError> {
        let constraint = self.common.constraint()?;
        let keep_alive = self.common.keep_alive()?;
        let messages = self.messages.unwrap_or_default();
        if messages.is_empty() {
            return Ok(Asked::LoadOnly(self.model, keep_alive));
        }
        let messages = messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| m.into_chat(i))
            .collect::<Result<Vec<_>, _>>()?;
        let ask = Ask {
            route: "POST /api/chat",
            model: self.model,
            prompt: Prompt::Chat {
                system_prompt: None,
                messages,
                tools: self.tools.filter(|t| !t.is_empty()),
                template_options: self.common.template_options()?,
            },
            settings: self.common.settings()?,
            stop_strings: self.common.stop_strings(),
            ignore_eos: false,
            keep_alive,
            user_agent,
            stream: self.common.stream.unwrap_or(true),
            constraint,
        };
        Ok(Asked::Generate(
            Box::new(ask),
            self.common.stream.unwrap_or(true),
        ))
    }
}

impl GenerateIn {
    fn into_request(mut self, user_agent: Option<String>) -> Result<Asked, ApiError> {
        let constraint = self.common.constraint()?;
        let images = images_of(self.images, "images")?;
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::InvalidField(
                "suffix (fill in the middle) is not supported".into(),
            ));
        }
        let keep_alive = self.common.keep_alive()?;
        let text = self.prompt.unwrap_or_default();
        if text.is_empty() {
            return Ok(Asked::LoadOnly(self.model, keep_alive));
        }
        let prompt = if self.raw.unwrap_or(false) {
            if !images.is_empty() {
                return Err(ApiError::InvalidField(
                    "a raw prompt takes no images (the chat template places them); send \
                     them without raw"
                        .into(),
                ));
            }
            Prompt::Raw { text }
        } else {
            Prompt::Chat {
                system_prompt: self.system,
                messages: vec![ChatMessage {
                    images,
                    ..ChatMessage::user(text)
                }],
                tools: None,
                template_options: self.common.template_options()?,
            }
        };
        let ask = Ask {
            route: "POST /api/generate",
            model: self.model,
            prompt,
            settings: self.common.settings()?,
            stop_strings: self.common.stop_strings(),
            ignore_eos: false,
            keep_alive,
            user_agent,
            stream: self.common.stream.unwrap_or(true),
            constraint,
        };
        Ok(Asked::Generate(
            Box::new(ask),
            self.common.stream.unwrap_or(true),
        ))
    }
}

/// Milliseconds as Ollama's nanosecond counters.
fn nanos(ms: f64) -> u64 {
    if ms.is_finite() && ms > 0.0 {
        (ms * 1e6).round() as u64
    } else {
        0
    }
}

/// Ollama's counters and Ondo's record, added to a final answer. The
/// prompt count is the whole prompt and its duration the prefill of what
/// the cache did not hold; `eval_duration` runs from the first token to the
/// last, so `eval_count / eval_duration` is mlx-lm's generation speed.
fn add_counters(answer: &mut Value, result: &JobResult) {
    let r = &result.record;
    let fields = json!({
        "done": true,
        "done_reason": done_reason(result),
        "total_duration": result.total.as_nanos() as u64,
        "load_duration": nanos(r.load_ms),
        "prompt_eval_count": r.prompt_tokens,
        "prompt_eval_duration": nanos(r.prefill_ms),
        "eval_count": r.generated_tokens,
        "eval_duration": nanos(r.decode_ms),
        "ondo": result.ondo_record(),
    });
    if let (Some(answer), Value::Object(fields)) = (answer.as_object_mut(), fields) {
        answer.extend(fields);
    }
}

/// `stop` or `length` (Ollama says `stop` after tool calls too).
fn done_reason(result: &JobResult) -> &'static str {
    match result.finish_reason() {
        "length" => "length",
        _ => "stop",
    }
}

/// A tool call as Ollama writes it: `arguments` as an object.
fn tool_call_out(call: &ToolCall) -> Value {
    json!({"function": {"name": call.function.name, "arguments": call.function.arguments}})
}

/// The assistant message of an answer (or of one streamed piece).
fn message(text: &str, reasoning: &str, tool_calls: &[ToolCall]) -> Value {
    let mut message = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        message["thinking"] = reasoning.into();
    }
    if !tool_calls.is_empty() {
        message["tool_calls"] = tool_calls.iter().map(tool_call_out).collect();
    }
    message
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Generate,
}

/// JSON lines of one streamed answer.
struct LineEncoder {
    endpoint: Endpoint,
    model: String,
}

impl LineEncoder {
    fn piece(&self, text: &str, reasoning: &str, tool_calls: &[ToolCall]) -> Value {
        let mut piece = json!({"model": self.model, "created_at": now_rfc3339()});
        match self.endpoint {
            Endpoint::Chat => piece["message"] = message(text, reasoning, tool_calls),
            Endpoint::Generate => {
                piece["response"] = text.into();
                if !reasoning.is_empty() {
                    piece["thinking"] = reasoning.into();
                }
            }
        }
        piece["done"] = false.into();
        piece
    }
}

fn line(value: &Value) -> Vec<u8> {
    let mut bytes = value.to_string().into_bytes();
    bytes.push(b'\n');
    bytes
}

impl LineEncoder {
    /// A line of one token's plain text: the same JSON as `piece` writes,
    /// without building it field by field.
    fn token_line(&self, text: &str) -> Vec<u8> {
        let text = serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into());
        let model = serde_json::to_string(&self.model).unwrap_or_else(|_| "\"\"".into());
        let body = match self.endpoint {
            Endpoint::Chat => format!("\"message\":{{\"role\":\"assistant\",\"content\":{text}}}"),
            Endpoint::Generate => format!("\"response\":{text}"),
        };
        format!(
            "{{\"model\":{model},\"created_at\":\"{}\",{body},\"done\":false}}\n",
            now_rfc3339()
        )
        .into_bytes()
    }
}

impl StreamEncoder for LineEncoder {
    fn delta(&mut self, text: &str, reasoning: &str, tool_calls: &[ToolCall]) -> Vec<u8> {
        if reasoning.is_empty() && tool_calls.is_empty() {
            return self.token_line(text);
        }
        line(&self.piece(text, reasoning, tool_calls))
    }

    fn done(&mut self, result: &JobResult) -> Vec<u8> {
        let mut last = self.piece("", "", &[]);
        add_counters(&mut last, result);
        line(&last)
    }

    fn failed(&mut self, error: &ApiError) -> Vec<u8> {
        line(&error_body(Dialect::Ollama, error))
    }
}

/// The whole answer at once (`"stream": false`).
fn whole_answer(endpoint: Endpoint, model: &str, result: &JobResult) -> Value {
    let o = &result.outcome;
    let mut answer = json!({"model": model, "created_at": now_rfc3339()});
    match endpoint {
        Endpoint::Chat => answer["message"] = message(&o.text, &o.reasoning, &o.tool_calls),
        Endpoint::Generate => {
            answer["response"] = o.text.clone().into();
            if !o.reasoning.is_empty() {
                answer["thinking"] = o.reasoning.clone().into();
            }
        }
    }
    add_counters(&mut answer, result);
    answer
}

async fn serve(
    state: Arc<ServerState>,
    request: Asked,
    endpoint: Endpoint,
) -> Result<Response, ApiFailure> {
    let (ask, stream) = match request {
        Asked::Generate(ask, stream) => (*ask, stream),
        Asked::LoadOnly(model, keep_alive) => {
            return load_only(&state, &model, keep_alive, endpoint).await;
        }
    };
    let mut job = state.start_job(ask).await.map_err(ApiFailure::ollama)?;
    job.started()
        .await
        .map_err(|e| ApiFailure::ollama(e).logged())?;
    let model = job.model.clone();
    if stream {
        let encoder = LineEncoder { endpoint, model };
        return Ok(stream_response(job, encoder, "application/x-ndjson"));
    }
    let result = job
        .finish()
        .await
        .map_err(|e| ApiFailure::ollama(e).logged())?;
    let mut response = axum::Json(whole_answer(endpoint, &model, &result)).into_response();
    response.extensions_mut().insert(LoggedAtRunEnd);
    Ok(response)
}

/// Ollama's way to load a model ahead (no prompt) or unload it (no prompt
/// and keep_alive 0).
async fn load_only(
    state: &Arc<ServerState>,
    name: &str,
    keep_alive: KeepAliveAsked,
    endpoint: Endpoint,
) -> Result<Response, ApiFailure> {
    let (model, unload) = state
        .load_only(name, keep_alive)
        .await
        .map_err(ApiFailure::ollama)?;
    let mut answer = json!({
        "model": model.name,
        "created_at": now_rfc3339(),
        "done": true,
        "done_reason": if unload { "unload" } else { "load" },
    });
    match endpoint {
        Endpoint::Chat => answer["message"] = json!({"role": "assistant", "content": ""}),
        Endpoint::Generate => answer["response"] = "".into(),
    }
    Ok(axum::Json(answer).into_response())
}

pub(super) async fn chat(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let request: ChatIn = parse_body(body).map_err(ApiFailure::ollama)?;
    let request = request
        .into_request(user_agent(&headers))
        .map_err(ApiFailure::ollama)?;
    serve(state, request, Endpoint::Chat).await
}

pub(super) async fn generate(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let request: GenerateIn = parse_body(body).map_err(ApiFailure::ollama)?;
    let request = request
        .into_request(user_agent(&headers))
        .map_err(ApiFailure::ollama)?;
    serve(state, request, Endpoint::Generate).await
}

pub(super) async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// "1.3M", "3.2B": a parameter count as Ollama shows it.
fn parameter_size(parameters: Option<u64>) -> String {
    let Some(n) = parameters else {
        return String::new();
    };
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else {
        format!("{:.1}K", n / 1e3)
    }
}

/// "Q4", "Q8", "F32", "BF16": a quantization as Ollama labels it.
fn quantization_level(quantization: Option<&str>) -> String {
    match quantization {
        Some(q) if q.ends_with("-bit") => format!("Q{}", q.trim_end_matches("-bit")),
        Some("float32") => "F32".into(),
        Some("float16") => "F16".into(),
        Some("bfloat16") => "BF16".into(),
        Some(other) => other.to_uppercase(),
        None => String::new(),
    }
}

fn details(model: &LibraryModel) -> Value {
    let family = model.model_type.clone().unwrap_or_default();
    json!({
        "parent_model": "",
        "format": "safetensors",
        "family": family,
        "families": [family],
        "parameter_size": parameter_size(model.parameters),
        "quantization_level": quantization_level(model.quantization.as_deref()),
    })
}

/// When a folder last changed, as RFC 3339.
fn modified_at(dir: &std::path::Path) -> String {
    std::fs::metadata(dir)
        .and_then(|m| m.modified())
        .map(|t| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339())
        .unwrap_or_else(|_| now_rfc3339())
}

fn tag(name: &str, model: &LibraryModel) -> Value {
    json!({
        "name": name,
        "model": name,
        "modified_at": modified_at(&model.path),
        "size": model.size_on_disk_bytes,
        "digest": model.commit.clone().unwrap_or_default(),
        "details": details(model),
    })
}

/// The library as clients may name it: `tiny`, then downloaded repos.
async fn library_models(state: &Arc<ServerState>) -> Result<Vec<LibraryModel>, ApiError> {
    let settings = state.saved_settings().await;
    let tiny = state.resolve(TINY, &settings).await?;
    let downloaded = state.downloaded_models(&settings).await;
    let tiny = library::describe_folder(TINY.to_owned(), ModelSource::Ondo, &tiny.dir);
    Ok(std::iter::once(tiny).chain(downloaded).collect())
}

pub(super) async fn tags(State(state): State<Arc<ServerState>>) -> Result<Response, ApiFailure> {
    let models = library_models(&state).await.map_err(ApiFailure::ollama)?;
    let tags: Vec<Value> = models.iter().map(|m| tag(&m.id, m)).collect();
    Ok(axum::Json(json!({"models": tags})).into_response())
}

pub(super) async fn ps(State(state): State<Arc<ServerState>>) -> Response {
    let pool = state.pool.clone();
    let running = tokio::task::spawn_blocking(move || {
        // Memory MLX holds is the GPU's on a Mac (and with CUDA); the CPU
        // backend holds none.
        let on_gpu = pool.provenance().backend != "cpu";
        pool.resident()
            .into_iter()
            .map(|m| {
                let described =
                    library::describe_folder(m.model_id.clone(), ModelSource::Folder, &m.model_dir);
                let size = m.weights_bytes + m.kv_cache_bytes;
                let expires_at = match m.expires_in_ms {
                    Some(ms) => chrono::Utc::now() + chrono::Duration::milliseconds(ms as i64),
                    // Ollama's way to say "never": far in the future.
                    None => chrono::Utc::now() + chrono::Duration::days(365 * 100),
                };
                json!({
                    "name": m.model_id,
                    "model": m.model_id,
                    "size": size,
                    "size_vram": if on_gpu { size } else { 0 },
                    "digest": "",
                    "details": details(&described),
                    "expires_at": expires_at.to_rfc3339(),
                })
            })
            .collect::<Vec<Value>>()
    })
    .await
    .unwrap_or_default();
    axum::Json(json!({"models": running})).into_response()
}

#[derive(Debug, Deserialize)]
struct ShowIn {
    model: Option<String>,
    /// Older clients' name for `model`.
    name: Option<String>,
}

pub(super) async fn show(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let request: ShowIn = parse_body(body).map_err(ApiFailure::ollama)?;
    let name = request.model.or(request.name).ok_or_else(|| {
        ApiFailure::ollama(ApiError::InvalidField("name the model to show".into()))
    })?;
    let settings = state.saved_settings().await;
    let model = state
        .resolve(&name, &settings)
        .await
        .map_err(ApiFailure::ollama)?;
    let dir = model.dir.clone();
    let shown = tokio::task::spawn_blocking(move || {
        let source = if model.name == TINY {
            ModelSource::Ondo
        } else {
            ModelSource::HubCache
        };
        let described = library::describe_folder(model.name.clone(), source, &dir);
        let config: Value = std::fs::read(dir.join("config.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        let template = ChatTemplate::from_model_dir(&dir).ok().flatten();
        // An embedding model answers /api/embed only, as Ollama says of its own.
        let mut capabilities = vec![if described.embedding {
            "embedding"
        } else {
            "completion"
        }];
        if !described.embedding && template.as_ref().is_some_and(ChatTemplate::takes_tools) {
            capabilities.push("tools");
        }
        if !described.embedding && template.as_ref().is_some_and(ChatTemplate::thinks) {
            capabilities.push("thinking");
        }
        let template = template.map(|t| t.source().to_owned()).unwrap_or_default();
        let family = described.model_type.clone().unwrap_or_default();
        let mut info = Map::new();
        info.insert("general.architecture".into(), family.clone().into());
        info.insert(
            "general.parameter_count".into(),
            described.parameters.unwrap_or(0).into(),
        );
        for (ours, theirs) in [
            ("context_length", "max_position_embeddings"),
            ("embedding_length", "hidden_size"),
            ("block_count", "num_hidden_layers"),
            ("attention.head_count", "num_attention_heads"),
            ("attention.head_count_kv", "num_key_value_heads"),
            ("vocab_size", "vocab_size"),
        ] {
            if let Some(value) = config.get(theirs) {
                info.insert(format!("{family}.{ours}"), value.clone());
            }
        }
        json!({
            // Named, never by its folder: a client does not learn where
            // anything lives on the server.
            "modelfile": format!("# Served by Ondo\nFROM {}\n", model.name),
            "parameters": "",
            "template": template,
            "details": details(&described),
            "model_info": info,
            "capabilities": capabilities,
            "modified_at": modified_at(&dir),
        })
    })
    .await
    .map_err(|e| {
        ApiFailure::ollama(ApiError::Run(crate::engine::RunError::Internal(
            e.to_string(),
        )))
    })?;
    Ok(axum::Json(shown).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_reads_seconds_and_durations() {
        let keep = |v: Value| keep_alive_from(&v);
        assert_eq!(keep(json!(0)).unwrap(), KeepAlive::For(Duration::ZERO));
        assert_eq!(keep(json!("0")).unwrap(), KeepAlive::For(Duration::ZERO));
        assert_eq!(
            keep(json!(30)).unwrap(),
            KeepAlive::For(Duration::from_secs(30))
        );
        assert_eq!(
            keep(json!("5m")).unwrap(),
            KeepAlive::For(Duration::from_secs(300))
        );
        assert_eq!(
            keep(json!("1h30m")).unwrap(),
            KeepAlive::For(Duration::from_secs(5400))
        );
        assert_eq!(
            keep(json!("1.5s")).unwrap(),
            KeepAlive::For(Duration::from_millis(1500))
        );
        assert_eq!(
            keep(json!("300ms")).unwrap(),
            KeepAlive::For(Duration::from_millis(300))
        );
        assert_eq!(keep(json!(-1)).unwrap(), KeepAlive::Forever);
        assert_eq!(keep(json!("-1m")).unwrap(), KeepAlive::Forever);
        for bad in [
            json!("soon"),
            json!("5 minutes"),
            json!("5x"),
            json!(true),
            json!(""),
        ] {
            let Err(error) = keep(bad.clone()) else {
                panic!("{bad} passed");
            };
            assert!(error.to_string().contains("keep_alive"), "{error}");
        }
    }

    #[test]
    fn options_map_onto_settings() {
        let options: OptionsIn = serde_json::from_value(json!({
            "temperature": 0.2, "top_k": 40, "num_predict": -1, "num_ctx": 2048,
            "seed": -1, "stop": ["###"], "repeat_penalty": 1.1, "num_gpu": 99,
        }))
        .unwrap();
        let asked = options.settings().unwrap();
        assert_eq!(asked.temperature, Some(0.2));
        assert_eq!(asked.top_k, Some(40));
        assert_eq!(
            asked.max_tokens,
            Some(GenerationSettings::LIMITS.max_tokens.1)
        );
        assert_eq!(asked.max_kv_size, Some(2048));
        assert_eq!(asked.seed, None);
        assert_eq!(asked.repetition_penalty, Some(1.1));
        let zero_context: OptionsIn = serde_json::from_value(json!({"num_ctx": 0})).unwrap();
        assert!(zero_context.settings().is_err());
    }

    #[test]
    fn a_chat_request_keeps_thinking_tools_and_tool_results() {
        let request: ChatIn = serde_json::from_value(json!({
            "model": "tiny",
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "thinking": "Look it up.",
                 "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Seoul"}}}]},
                {"role": "tool", "content": "31", "tool_name": "get_weather"},
            ],
            "think": false,
            "keep_alive": "10m",
            "tools": [{"type": "function", "function": {"name": "get_weather"}}],
        }))
        .unwrap();
        let Asked::Generate(ask, stream) = request.into_request(None).unwrap() else {
            panic!("not a generation");
        };
        assert!(stream, "Ollama streams unless told not to");
        assert_eq!(
            ask.keep_alive,
            KeepAliveAsked::For(KeepAlive::For(Duration::from_secs(600)))
        );
        let Prompt::Chat {
            messages,
            template_options,
            tools,
            ..
        } = ask.prompt
        else {
            panic!("not a chat");
        };
        assert_eq!(template_options["enable_thinking"], json!(false));
        assert!(tools.is_some());
        assert_eq!(
            messages[1].reasoning_content.as_deref(),
            Some("Look it up.")
        );
        let call = &messages[1].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.arguments, json!({"city": "Seoul"}));
        assert_eq!(messages[2].name.as_deref(), Some("get_weather"));
    }

    #[test]
    fn what_this_server_cannot_do_is_refused_by_name() {
        for (body, words) in [
            (
                json!({"model": "tiny", "messages": [{"role": "user", "content": "hi", "images": [42]}]}),
                "images[0] is not a string",
            ),
            (
                json!({"model": "tiny", "messages": [{"role": "bot", "content": "hi"}]}),
                "role 'bot'",
            ),
            (
                json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "format": "yaml"}),
                "format 'yaml'",
            ),
            (
                json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "think": 3}),
                "think",
            ),
            (
                json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "keep_alive": "later"}),
                "keep_alive",
            ),
        ] {
            let request: ChatIn = serde_json::from_value(body.clone()).unwrap();
            let Err(error) = request.into_request(None) else {
                panic!("{body} passed");
            };
            assert_eq!(error.status().as_u16(), 400);
            assert!(error.to_string().contains(words), "{body}: {error}");
        }
        // No messages: load (or unload) only.
        let request: ChatIn =
            serde_json::from_value(json!({"model": "tiny", "keep_alive": 0})).unwrap();
        assert!(matches!(
            request.into_request(None).unwrap(),
            Asked::LoadOnly(_, KeepAliveAsked::For(KeepAlive::For(d))) if d.is_zero()
        ));
    }

    #[test]
    fn a_tokens_line_is_the_same_json_however_it_is_written() {
        for endpoint in [Endpoint::Chat, Endpoint::Generate] {
            let encoder = LineEncoder {
                endpoint,
                model: "org/\"odd\" name".into(),
            };
            for text in ["", "plain", "quote \" and\nnewline", "온도 🌡"] {
                let parse = |bytes: Vec<u8>| {
                    let mut value: Value = serde_json::from_slice(&bytes).unwrap();
                    // Written a moment apart.
                    value["created_at"] = Value::Null;
                    value
                };
                let fast = encoder.token_line(text);
                assert!(fast.ends_with(b"}\n"));
                assert_eq!(
                    parse(fast),
                    parse(line(&encoder.piece(text, "", &[]))),
                    "{endpoint:?} {text:?}"
                );
            }
        }
    }

    #[test]
    fn labels_read_like_ollamas() {
        assert_eq!(parameter_size(Some(1_310_720)), "1.3M");
        assert_eq!(parameter_size(Some(3_212_749_824)), "3.2B");
        assert_eq!(quantization_level(Some("4-bit")), "Q4");
        assert_eq!(quantization_level(Some("bfloat16")), "BF16");
        assert_eq!(nanos(1.5), 1_500_000);
        assert_eq!(nanos(f64::NAN), 0);
    }
}
