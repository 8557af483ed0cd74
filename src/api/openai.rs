//! The OpenAI dialect: `GET /v1/models`, `POST /v1/chat/completions` and
//! `POST /v1/completions`, as the official clients send and read them.
//! Besides OpenAI's own fields, a request may set `top_k`, `min_p`,
//! `repetition_penalty`, `ignore_eos` and `chat_template_kwargs` (as vLLM
//! and mlx_lm.server accept them); a field it leaves out takes the default
//! the app's Settings keep. A user message's `image_url` parts carry its
//! images as `data:` URLs (`api::images`). Streams are server-sent events,
//! one chunk per token, ending with `data: [DONE]`.

use super::output_format::{forced_tool_call, openai_response_format};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::error::{ApiError, ApiFailure, Dialect, error_body};
use super::generation::{
    Ask, Job, JobResult, KeepAliveAsked, SettingsAsked, StreamEncoder, stream_response,
};
use super::{LoggedAtRunEnd, ServerState, parse_body, user_agent};
use crate::engine::chat_template::ChatMessage;
use crate::engine::reply::{FunctionCall, ToolCallKind};
use crate::engine::{Prompt, ToolCall};
use crate::resolve::TINY;
use crate::run_kinds::LoopShape;
use crate::store::RunRecord;

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StopIn {
    One(String),
    Many(Vec<String>),
}

impl StopIn {
    fn into_list(self) -> Vec<String> {
        match self {
            StopIn::One(stop) => vec![stop],
            StopIn::Many(stops) => stops,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// The sampling fields both generation routes read.
#[derive(Debug, Default, Deserialize)]
struct SamplingIn {
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<StopIn>,
    n: Option<i64>,
    logprobs: Option<Value>,
    ignore_eos: Option<bool>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    ondo: Option<EngineKnobsIn>,
}

/// Ondo's engine knobs a request may set, under one `ondo` field (the
/// field that carries Ondo's record in the answer); OpenAI's clients send
/// it as an extra body field. Unset knobs keep the server's defaults.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EngineKnobsIn {
    prefill_step_size: Option<usize>,
    max_kv_size: Option<usize>,
    kv_bits: Option<u8>,
    #[serde(rename = "loop")]
    loop_shape: Option<LoopShape>,
}

impl SamplingIn {
    /// The settings asked, refusing what this server cannot do.
    fn settings(&self) -> Result<SettingsAsked, ApiError> {
        if let Some(n) = self.n.filter(|n| *n != 1) {
            return Err(ApiError::InvalidField(format!(
                "n is {n}; this server makes one choice per request (n = 1)"
            )));
        }
        if self
            .logprobs
            .as_ref()
            .is_some_and(|l| !matches!(l, Value::Null | Value::Bool(false)))
        {
            return Err(ApiError::InvalidField(
                "logprobs are not available from this server; leave them out".into(),
            ));
        }
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(n) if n < 0 => {
                return Err(ApiError::InvalidField(format!(
                    "max_tokens is {n}; ask for at least 1 token"
                )));
            }
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => None,
        };
        let knobs = self.ondo.unwrap_or_default();
        Ok(SettingsAsked {
            max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            // vLLM's -1 (and 0) mean no top-k.
            top_k: self
                .top_k
                .map(|k| u32::try_from(k.max(0)).unwrap_or(u32::MAX)),
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            // Negative seeds are seeds too: the same bits each time.
            seed: self.seed.map(|s| s as u64),
            max_kv_size: knobs.max_kv_size,
            prefill_step_size: knobs.prefill_step_size,
            kv_bits: knobs.kv_bits,
            loop_shape: knobs.loop_shape,
        })
    }

    fn stop_strings(&mut self) -> Vec<String> {
        self.stop.take().map(StopIn::into_list).unwrap_or_default()
    }

    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }
}

#[derive(Debug, Deserialize)]
struct ChatCompletionRequest {
    model: String,
    messages: Vec<MessageIn>,
    #[serde(flatten)]
    sampling: SamplingIn,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    chat_template_kwargs: Option<Map<String, Value>>,
    response_format: Option<Value>,
}

/// A message's content: text, or a list of parts of which only text is read.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ContentIn {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    /// `{"url": "data:..."}`, or the URL alone.
    image_url: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    content: Option<ContentIn>,
    reasoning_content: Option<String>,
    tool_calls: Option<Vec<ToolCallIn>>,
    tool_call_id: Option<String>,
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ToolCallIn {
    id: Option<String>,
    function: FunctionIn,
}

#[derive(Debug, Deserialize)]
struct FunctionIn {
    name: String,
    /// A JSON string, as OpenAI sends it (an object is read too).
    arguments: Option<Value>,
}

/// The arguments of a call a client sends back: OpenAI's JSON string read
/// as the object the chat template expects.
pub(super) fn arguments_from_wire(arguments: Option<Value>) -> Value {
    match arguments {
        Some(Value::String(text)) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        Some(value) => value,
        None => Value::Object(Map::new()),
    }
}

impl MessageIn {
    fn into_chat(self, index: usize) -> Result<ChatMessage, ApiError> {
        let role = match self.role.as_str() {
            // OpenAI's newer name for the system role.
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(ApiError::InvalidField(format!(
                    "message {index} has the role '{other}'; use system, user, assistant or tool"
                )));
            }
        };
        let mut images = Vec::new();
        let content = match self.content {
            None => String::new(),
            Some(ContentIn::Text(text)) => text,
            Some(ContentIn::Parts(parts)) => {
                let mut text = String::new();
                for (n, part) in parts.into_iter().enumerate() {
                    match part.kind.as_str() {
                        "text" => text.push_str(part.text.as_deref().unwrap_or("")),
                        "image_url" => {
                            let what = format!("messages[{index}].content[{n}].image_url");
                            let url = match part.image_url {
                                Some(Value::String(url)) => url,
                                Some(Value::Object(mut o)) => match o.remove("url") {
                                    Some(Value::String(url)) => url,
                                    _ => String::new(),
                                },
                                _ => String::new(),
                            };
                            if url.is_empty() {
                                return Err(ApiError::InvalidField(format!(
                                    "{what} has no url; send {{\"url\": \"data:image/png;base64,...\"}}"
                                )));
                            }
                            images.push(super::images::from_url(url, &what)?);
                        }
                        other => {
                            return Err(ApiError::InvalidField(format!(
                                "message {index} has a part of type '{other}'; this server reads \
                                 text and image_url parts"
                            )));
                        }
                    }
                }
                text
            }
        };
        let tool_calls = self.tool_calls.map(|calls| {
            calls
                .into_iter()
                .map(|call| ToolCall {
                    id: call.id.unwrap_or_default(),
                    kind: ToolCallKind::Function,
                    function: FunctionCall {
                        name: call.function.name,
                        arguments: arguments_from_wire(call.function.arguments),
                    },
                })
                .collect()
        });
        Ok(ChatMessage {
            role: role.to_owned(),
            content,
            reasoning_content: self.reasoning_content.filter(|r| !r.is_empty()),
            tool_calls,
            tool_call_id: self.tool_call_id,
            name: (role == "tool").then_some(self.name).flatten(),
            images,
        })
    }
}

impl ChatCompletionRequest {
    fn into_ask(mut self, user_agent: Option<String>) -> Result<(Ask, bool, bool), ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::InvalidField(
                "messages is empty; send at least one message".into(),
            ));
        }
        let constraint = openai_response_format(self.response_format.as_ref())?;
        let settings = self.sampling.settings()?;
        let messages = self
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| m.into_chat(i))
            .collect::<Result<Vec<_>, _>>()?;
        let tools_refused = self.tool_choice.as_ref().and_then(Value::as_str) == Some("none");
        let mut tools = self
            .tools
            .filter(|tools| !tools.is_empty() && !tools_refused);
        // "required", or a function by name (which is then the only one
        // offered): the reply is a call, held to the tools' schemas.
        let named = self
            .tool_choice
            .as_ref()
            .and_then(|c| c.pointer("/function/name"))
            .and_then(Value::as_str);
        if let (Some(name), Some(offered)) = (named, tools.as_mut()) {
            offered.retain(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name));
            if offered.is_empty() {
                return Err(ApiError::InvalidField(format!(
                    "tool_choice names the function '{name}', which is not among the tools"
                )));
            }
        }
        let forced = named.is_some()
            || self.tool_choice.as_ref().and_then(Value::as_str) == Some("required");
        let prompt = Prompt::Chat {
            system_prompt: None,
            messages,
            tools,
            template_options: self.chat_template_kwargs.unwrap_or_default(),
        };
        let constraint = forced_tool_call(forced, &prompt).or(constraint);
        let ask = Ask {
            route: "POST /v1/chat/completions",
            model: self.model,
            prompt,
            settings,
            stop_strings: self.sampling.stop_strings(),
            ignore_eos: self.sampling.ignore_eos.unwrap_or(false),
            keep_alive: KeepAliveAsked::Unchanged,
            user_agent,
            stream: self.sampling.stream.unwrap_or(false),
            constraint,
        };
        Ok((
            ask,
            self.sampling.stream.unwrap_or(false),
            self.sampling.include_usage(),
        ))
    }
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    model: String,
    prompt: PromptIn,
    #[serde(flatten)]
    sampling: SamplingIn,
    echo: Option<bool>,
    best_of: Option<i64>,
    suffix: Option<String>,
}

/// A completion's prompt: text, or token ids (one prompt per request).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptIn {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
}

impl CompletionRequest {
    fn into_ask(mut self, user_agent: Option<String>) -> Result<(Ask, bool, bool), ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::InvalidField(
                "echo is not supported; the prompt is what you sent".into(),
            ));
        }
        if self.best_of.is_some_and(|n| n != 1) {
            return Err(ApiError::InvalidField(
                "best_of must be 1: this server makes one choice per request".into(),
            ));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::InvalidField(
                "suffix (fill in the middle) is not supported".into(),
            ));
        }
        let prompt = match self.prompt {
            PromptIn::Text(text) => Prompt::Raw { text },
            PromptIn::Tokens(ids) => Prompt::Tokens { ids },
            PromptIn::Texts(mut texts) if texts.len() == 1 => Prompt::Raw {
                text: texts.remove(0),
            },
            PromptIn::Texts(texts) => {
                return Err(ApiError::InvalidField(format!(
                    "prompt holds {} prompts; send one per request",
                    texts.len()
                )));
            }
        };
        let ask = Ask {
            route: "POST /v1/completions",
            model: self.model,
            prompt,
            settings: self.sampling.settings()?,
            stop_strings: self.sampling.stop_strings(),
            ignore_eos: self.sampling.ignore_eos.unwrap_or(false),
            keep_alive: KeepAliveAsked::Unchanged,
            user_agent,
            stream: self.sampling.stream.unwrap_or(false),
            constraint: None,
        };
        Ok((
            ask,
            self.sampling.stream.unwrap_or(false),
            self.sampling.include_usage(),
        ))
    }
}

/// `usage`, with the prompt tokens the KV cache already held and the
/// generated tokens that were reasoning (OpenAI's `completion_tokens_details`).
fn usage(record: &RunRecord) -> Value {
    json!({
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.generated_tokens,
        "total_tokens": record.prompt_tokens + record.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": record.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": record.reasoning_tokens},
    })
}

/// A tool call on the wire: `arguments` as a JSON string.
fn tool_call_out(call: &ToolCall, index: Option<usize>) -> Value {
    let mut out = json!({
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.function.name,
            "arguments": serde_json::to_string(&call.function.arguments).unwrap_or_default(),
        },
    });
    if let (Some(index), Some(object)) = (index, out.as_object_mut()) {
        object.insert("index".into(), index.into());
    }
    out
}

/// The reply as an assistant message.
fn message_out(result: &JobResult) -> Value {
    let outcome = &result.outcome;
    let mut message = Map::new();
    message.insert("role".into(), "assistant".into());
    message.insert(
        "content".into(),
        if outcome.text.is_empty() && !outcome.tool_calls.is_empty() {
            Value::Null
        } else {
            outcome.text.clone().into()
        },
    );
    if !outcome.reasoning.is_empty() {
        message.insert("reasoning_content".into(), outcome.reasoning.clone().into());
    }
    if !outcome.tool_calls.is_empty() {
        let calls = outcome
            .tool_calls
            .iter()
            .map(|c| tool_call_out(c, None))
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(message)
}

/// Identifies this server's answers (OpenAI's `system_fingerprint`).
fn fingerprint() -> String {
    format!("ondo-{}", env!("CARGO_PKG_VERSION"))
}

/// A new response id with OpenAI's prefix for its kind.
fn response_id(prefix: &str) -> String {
    crate::session::record::new_run_id().replacen("r-", &format!("{prefix}-"), 1)
}

fn chat_completion(id: &str, created: u64, model: &str, result: &JobResult) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(),
        "choices": [{
            "index": 0,
            "message": message_out(result),
            "logprobs": null,
            "finish_reason": result.finish_reason(),
        }],
        "usage": usage(&result.record),
        "ondo": result.ondo_record(),
    })
}

fn text_completion(id: &str, created: u64, model: &str, result: &JobResult) -> Value {
    json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(),
        "choices": [{
            "index": 0,
            "text": result.outcome.text,
            "logprobs": null,
            "finish_reason": result.finish_reason(),
        }],
        "usage": usage(&result.record),
        "ondo": result.ondo_record(),
    })
}

/// Server-sent events: `data: <json>` and a blank line.
fn sse(value: &Value) -> Vec<u8> {
    format!("data: {value}\n\n").into_bytes()
}

const DONE: &[u8] = b"data: [DONE]\n\n";

/// Which object the chunks are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

/// Chunks of one streamed answer.
struct ChunkEncoder {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    tool_calls_sent: usize,
    /// What every chunk of this answer starts with, up to its choice's
    /// fields: written once, so a token costs only its own text.
    head: String,
}

/// Text as a JSON string.
fn json_text(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

impl ChunkEncoder {
    fn new(
        endpoint: Endpoint,
        id: String,
        created: u64,
        model: String,
        include_usage: bool,
    ) -> Self {
        let mut encoder = Self {
            endpoint,
            id,
            created,
            model,
            include_usage,
            tool_calls_sent: 0,
            head: String::new(),
        };
        // The chunk as `chunk` writes it, cut where the choice's fields go.
        let whole = encoder.chunk(json!({"index": 0})).to_string();
        encoder.head = whole.trim_end_matches("}]}").to_owned();
        encoder
    }

    /// A chunk of one token's text: the same JSON as `delta_chunk` and
    /// `text_chunk` write, without building it field by field.
    fn token_chunk(&self, text: &str) -> Vec<u8> {
        let field = match self.endpoint {
            Endpoint::Chat => format!("\"delta\":{{\"content\":{}}}", json_text(text)),
            Endpoint::Completion => format!("\"text\":{}", json_text(text)),
        };
        format!(
            "data: {},{field},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n",
            self.head
        )
        .into_bytes()
    }

    fn chunk(&self, choice: Value) -> Value {
        let (object, choices) = match self.endpoint {
            Endpoint::Chat => ("chat.completion.chunk", json!([choice])),
            Endpoint::Completion => ("text_completion", json!([choice])),
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": fingerprint(),
            "choices": choices,
        })
    }

    fn delta_chunk(&self, delta: Value) -> Vec<u8> {
        sse(&self.chunk(json!({
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": null,
        })))
    }

    fn text_chunk(&self, text: &str, finish_reason: Option<&str>) -> Value {
        self.chunk(json!({
            "index": 0,
            "text": text,
            "logprobs": null,
            "finish_reason": finish_reason,
        }))
    }
}

impl StreamEncoder for ChunkEncoder {
    fn prelude(&mut self) -> Vec<u8> {
        match self.endpoint {
            Endpoint::Chat => self.delta_chunk(json!({"role": "assistant", "content": ""})),
            Endpoint::Completion => Vec::new(),
        }
    }

    fn delta(&mut self, text: &str, reasoning: &str, tool_calls: &[ToolCall]) -> Vec<u8> {
        let mut out = Vec::new();
        match self.endpoint {
            Endpoint::Chat => {
                if !reasoning.is_empty() {
                    out.extend(self.delta_chunk(json!({"reasoning_content": reasoning})));
                }
                // A token whose text is held back still gets its chunk.
                if !text.is_empty() || (reasoning.is_empty() && tool_calls.is_empty()) {
                    out.extend(self.token_chunk(text));
                }
                for call in tool_calls {
                    let call = tool_call_out(call, Some(self.tool_calls_sent));
                    self.tool_calls_sent += 1;
                    out.extend(self.delta_chunk(json!({"tool_calls": [call]})));
                }
            }
            // A completion has no reply to split (see engine::stream): it
            // is all text.
            Endpoint::Completion => out.extend(self.token_chunk(&format!("{reasoning}{text}"))),
        }
        out
    }

    fn done(&mut self, result: &JobResult) -> Vec<u8> {
        let reason = result.finish_reason();
        let mut last = match self.endpoint {
            Endpoint::Chat => self.chunk(json!({
                "index": 0,
                "delta": {},
                "logprobs": null,
                "finish_reason": reason,
            })),
            Endpoint::Completion => self.text_chunk("", Some(reason)),
        };
        let mut out = Vec::new();
        if self.include_usage {
            // OpenAI's usage chunk: no choices, after the one that ends.
            out.extend(sse(&last));
            last = self.chunk(Value::Null);
            last["choices"] = json!([]);
            last["usage"] = usage(&result.record);
        }
        last["ondo"] = serde_json::to_value(result.ondo_record()).unwrap_or(Value::Null);
        out.extend(sse(&last));
        out.extend(DONE);
        out
    }

    fn failed(&mut self, error: &ApiError) -> Vec<u8> {
        let mut out = sse(&error_body(Dialect::OpenAi, error));
        out.extend(DONE);
        out
    }
}

/// Answers a started job: streamed, or whole.
async fn answer(
    mut job: Job,
    endpoint: Endpoint,
    stream: bool,
    include_usage: bool,
) -> Result<Response, ApiFailure> {
    job.started()
        .await
        .map_err(|e| ApiFailure::openai(e).logged())?;
    let id = response_id(match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    });
    let (created, model) = (job.created_unix_s, job.model.clone());
    if stream {
        let encoder = ChunkEncoder::new(endpoint, id, created, model, include_usage);
        return Ok(stream_response(job, encoder, "text/event-stream"));
    }
    let result = job
        .finish()
        .await
        .map_err(|e| ApiFailure::openai(e).logged())?;
    let body = match endpoint {
        Endpoint::Chat => chat_completion(&id, created, &model, &result),
        Endpoint::Completion => text_completion(&id, created, &model, &result),
    };
    let mut response = axum::Json(body).into_response();
    response.extensions_mut().insert(LoggedAtRunEnd);
    Ok(response)
}

pub(super) async fn chat_completions(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let request: ChatCompletionRequest = parse_body(body).map_err(ApiFailure::openai)?;
    let (ask, stream, include_usage) = request
        .into_ask(user_agent(&headers))
        .map_err(ApiFailure::openai)?;
    let job = state.start_job(ask).await.map_err(ApiFailure::openai)?;
    answer(job, Endpoint::Chat, stream, include_usage).await
}

pub(super) async fn completions(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let request: CompletionRequest = parse_body(body).map_err(ApiFailure::openai)?;
    let (ask, stream, include_usage) = request
        .into_ask(user_agent(&headers))
        .map_err(ApiFailure::openai)?;
    let job = state.start_job(ask).await.map_err(ApiFailure::openai)?;
    answer(job, Endpoint::Completion, stream, include_usage).await
}

/// Every model a client may name: `tiny` and the downloaded repo ids.
async fn model_names(state: &ServerState) -> Vec<String> {
    let settings = state.saved_settings().await;
    std::iter::once(TINY.to_owned())
        .chain(
            state
                .downloaded_models(&settings)
                .await
                .into_iter()
                .map(|m| m.id),
        )
        .collect()
}

fn model_object(name: &str) -> Value {
    json!({"id": name, "object": "model", "created": 0, "owned_by": "ondo"})
}

pub(super) async fn models(State(state): State<Arc<ServerState>>) -> Response {
    let data: Vec<Value> = model_names(&state)
        .await
        .iter()
        .map(|n| model_object(n))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

pub(super) async fn model(
    State(state): State<Arc<ServerState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiFailure> {
    let names = model_names(&state).await;
    match names.iter().find(|n| n.eq_ignore_ascii_case(&id)) {
        Some(name) => Ok(axum::Json(model_object(name)).into_response()),
        None => Err(ApiFailure::openai(ApiError::Resolve(
            crate::resolve::ResolveError::NotFound {
                name: id,
                looked_in: Default::default(),
                available: names,
            },
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<(Ask, bool, bool), ApiError> {
        serde_json::from_value::<ChatCompletionRequest>(body)
            .map_err(|e| ApiError::MalformedBody(e.to_string()))?
            .into_ask(Some("test".into()))
    }

    #[test]
    fn a_chat_request_maps_onto_a_prompt_and_settings() {
        let (ask, stream, usage) = chat(json!({
            "model": "tiny",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Seoul?"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Seoul\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "31"},
            ],
            "max_completion_tokens": 7,
            "temperature": 0.5,
            "stop": "END",
            "seed": -1,
            "top_k": -1,
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {"name": "get_weather"}}],
            "chat_template_kwargs": {"enable_thinking": false},
            "user": "ignored",
        }))
        .unwrap();
        assert!(stream && usage);
        assert_eq!(ask.settings.max_tokens, Some(7));
        assert_eq!(ask.settings.temperature, Some(0.5));
        assert_eq!(ask.settings.seed, Some(u64::MAX));
        assert_eq!(ask.settings.top_k, Some(0));
        assert_eq!(ask.stop_strings, vec!["END".to_owned()]);
        let Prompt::Chat {
            messages,
            tools,
            template_options,
            ..
        } = ask.prompt
        else {
            panic!("not a chat");
        };
        assert_eq!(messages[0].role, "system");
        assert_eq!(messages[1].content, "Weather in Seoul?");
        let call = &messages[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.arguments, json!({"city": "Seoul"}));
        assert_eq!(messages[3].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(messages[3].name.as_deref(), Some("get_weather"));
        assert_eq!(tools.unwrap().len(), 1);
        assert_eq!(template_options["enable_thinking"], json!(false));
    }

    #[test]
    fn what_this_server_cannot_do_is_refused_by_name() {
        let base = |extra: Value| {
            let mut body =
                json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            chat(body)
        };
        for (extra, words) in [
            (json!({"n": 2}), "n is 2"),
            (json!({"max_tokens": -5}), "max_tokens is -5"),
            (json!({"logprobs": true}), "logprobs"),
            (
                json!({"response_format": {"type": "grammar"}}),
                "response_format type 'grammar'",
            ),
            (json!({"messages": []}), "messages is empty"),
            (
                json!({"messages": [{"role": "wizard", "content": "hi"}]}),
                "role 'wizard'",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "image_url has no url",
            ),
            (json!({"temperature": "hot"}), "invalid type"),
        ] {
            let Err(error) = base(extra.clone()) else {
                panic!("{extra} passed");
            };
            assert_eq!(error.status().as_u16(), 400, "{extra}");
            assert!(error.to_string().contains(words), "{extra}: {error}");
        }
        assert!(base(json!({"n": 1, "logprobs": false})).is_ok());
        // tool_choice none: the model is not offered the tools.
        let (ask, _, _) =
            base(json!({"tools": [{"type": "function"}], "tool_choice": "none"})).unwrap();
        assert!(matches!(ask.prompt, Prompt::Chat { tools: None, .. }));
    }

    #[test]
    fn completions_take_text_or_token_ids() {
        let ask = |prompt: Value| {
            serde_json::from_value::<CompletionRequest>(json!({"model": "tiny", "prompt": prompt}))
                .unwrap()
                .into_ask(None)
        };
        assert!(
            matches!(ask(json!("Once")).unwrap().0.prompt, Prompt::Raw { text } if text == "Once")
        );
        assert!(matches!(
            ask(json!(["Once"])).unwrap().0.prompt,
            Prompt::Raw { .. }
        ));
        assert!(
            matches!(ask(json!([1, 2, 3])).unwrap().0.prompt, Prompt::Tokens { ids } if ids == [1, 2, 3])
        );
        assert!(ask(json!(["a", "b"])).is_err());
    }

    #[test]
    fn a_tokens_chunk_is_the_same_json_however_it_is_written() {
        for endpoint in [Endpoint::Chat, Endpoint::Completion] {
            let encoder = ChunkEncoder::new(
                endpoint,
                "chatcmpl-1".into(),
                7,
                "org/\"odd\" name".into(),
                false,
            );
            for text in ["", "plain", "quote \" and \\ and\nnewline", "온도 🌡"] {
                let fast = String::from_utf8(encoder.token_chunk(text)).unwrap();
                let slow = match endpoint {
                    Endpoint::Chat => encoder.delta_chunk(json!({"content": text})),
                    Endpoint::Completion => sse(&encoder.text_chunk(text, None)),
                };
                assert_eq!(
                    fast,
                    String::from_utf8(slow).unwrap(),
                    "{endpoint:?} {text:?}"
                );
            }
        }
    }

    #[test]
    fn tool_call_arguments_go_out_as_a_json_string() {
        let call = ToolCall::new("get_weather", json!({"city": "Seoul", "days": 2}));
        let out = tool_call_out(&call, Some(0));
        assert_eq!(
            out["function"]["arguments"],
            json!(r#"{"city":"Seoul","days":2}"#)
        );
        assert_eq!(out["index"], 0);
        assert_eq!(out["type"], "function");
        assert!(out["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(
            arguments_from_wire(Some(json!("not json"))),
            json!("not json")
        );
    }
}
