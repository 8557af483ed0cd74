//! OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE
//! /v1/responses/{id}`, as the official clients and Codex CLI send and
//! read them. `input` is text or a list of items: messages (`system` and
//! `developer` are the system role), `function_call`s, their
//! `function_call_output`s and `reasoning` items, which map onto the chat
//! template's messages as in the chat completions route (a user message's
//! `input_image` parts, as `data:` URLs, are its images); `instructions` is a
//! system message first. A response's output is a reasoning item (the
//! reasoning split), a message and its function calls. Responses are kept
//! (unless `store` is false) in a bounded store in memory, so that a
//! request naming one in `previous_response_id` continues its conversation
//! (and its KV cache). Streams are server-sent events with OpenAI's event
//! names, each numbered by `sequence_number`.

use super::output_format::{forced_tool_call, responses_text_format};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::anthropic::{event, new_id, only_tool};
use super::error::{ApiError, ApiFailure, Dialect, error_body};
use super::generation::{
    Ask, JobResult, KeepAliveAsked, SettingsAsked, StreamEncoder, stream_response,
};
use super::openai::arguments_from_wire;
use super::{LoggedAtRunEnd, ServerState, lock, parse_body, user_agent};
use crate::engine::chat_template::ChatMessage;
use crate::engine::reply::{FunctionCall, ToolCallKind};
use crate::engine::{Prompt, ToolCall};
use crate::run_kinds::StopReason;
use crate::store::RunRecord;

/// The route's name in the log and the in-flight line.
const ROUTE: &str = "POST /v1/responses";

/// How many responses the store keeps; the oldest goes first.
pub(crate) const STORED_RESPONSES: usize = 256;

/// How many bytes of responses (as JSON, conversation included) the store
/// keeps: bodies may be 64 MiB each (images), and 256 of those would hold
/// 16 GiB.
pub(crate) const STORED_RESPONSE_BYTES: usize = 64 << 20;

/// A kept response: what `GET` answers, and the conversation a follow-up
/// continues (its input and its output, without its instructions, which
/// OpenAI does not carry over).
#[derive(Debug, Clone)]
struct StoredResponse {
    id: String,
    response: Value,
    conversation: Vec<ChatMessage>,
}

impl StoredResponse {
    /// Its size as JSON, which the store's bound counts.
    fn bytes(&self) -> usize {
        let conversation: usize = self
            .conversation
            .iter()
            .map(|m| serde_json::to_string(m).map_or(0, |j| j.len()))
            .sum();
        self.response.to_string().len() + conversation
    }
}

/// The last responses kept, oldest first: at most [`STORED_RESPONSES`] of
/// them and [`STORED_RESPONSE_BYTES`] in all.
#[derive(Debug, Default)]
pub(crate) struct ResponseStore {
    kept: VecDeque<(StoredResponse, usize)>,
    bytes: usize,
}

impl ResponseStore {
    fn keep(&mut self, stored: StoredResponse) {
        let bytes = stored.bytes();
        self.bytes += bytes;
        self.kept.push_back((stored, bytes));
        // The newest stays even alone over the bound: a follow-up to the
        // last response is the one most likely to come.
        while self.kept.len() > 1
            && (self.kept.len() > STORED_RESPONSES || self.bytes > STORED_RESPONSE_BYTES)
        {
            if let Some((_, gone)) = self.kept.pop_front() {
                self.bytes -= gone;
            }
        }
    }

    fn find(&self, id: &str) -> Option<&StoredResponse> {
        self.kept.iter().map(|(r, _)| r).find(|r| r.id == id)
    }

    fn remove(&mut self, id: &str) -> bool {
        let Some(at) = self.kept.iter().position(|(r, _)| r.id == id) else {
            return false;
        };
        if let Some((_, bytes)) = self.kept.remove(at) {
            self.bytes -= bytes;
        }
        true
    }
}

#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    model: String,
    input: Option<InputIn>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    max_output_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    stream: Option<bool>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    metadata: Option<Value>,
    parallel_tool_calls: Option<bool>,
    reasoning: Option<ReasoningIn>,
    text: Option<TextIn>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum InputIn {
    Text(String),
    Items(Vec<Value>),
}

/// `reasoning`: `effort` switches the template's thinking; `summary` is
/// accepted (the reasoning comes back whole, as `reasoning_text`).
#[derive(Debug, Clone, Deserialize)]
struct ReasoningIn {
    effort: Option<String>,
}

#[derive(Debug, Deserialize)]
struct TextIn {
    format: Option<Value>,
}

/// What a response echoes of its request, as OpenAI's do.
#[derive(Debug, Clone)]
struct Echo {
    instructions: Option<String>,
    tools: Vec<Value>,
    tool_choice: Value,
    temperature: Option<f32>,
    top_p: Option<f32>,
    max_output_tokens: Option<i64>,
    previous_response_id: Option<String>,
    store: bool,
    metadata: Value,
    parallel_tool_calls: bool,
    effort: Option<String>,
    /// `text.format` as asked (`{"type": "text"}` when not).
    text_format: Value,
}

/// What a client is told for a file or audio, or an image where a turn
/// cannot hold one.
fn not_read(kind: &str, place: &str) -> ApiError {
    ApiError::InvalidField(format!(
        "{place} is an {kind} part: Ondo reads text, and images in a user's message; send text"
    ))
}

/// A message's content: text, or parts of which text is read.
fn content_text(content: Option<&Value>, place: &str) -> Result<String, ApiError> {
    let (text, images) = content_parts(content, place)?;
    if !images.is_empty() {
        return Err(not_read("input_image", place));
    }
    Ok(text)
}

/// A message's content: its text, and its `input_image` parts' files in
/// base64 (a `data:` URL in `image_url`; a web address or a `file_id` is
/// refused).
fn content_parts(content: Option<&Value>, place: &str) -> Result<(String, Vec<String>), ApiError> {
    let mut images = Vec::new();
    let text = match content {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for (i, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "input_text" | "output_text" | "text" | "summary_text" | "reasoning_text" => {
                        texts.push(part.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    "refusal" => {
                        texts.push(part.get("refusal").and_then(Value::as_str).unwrap_or(""))
                    }
                    "input_image" => {
                        let what = format!("{place}, part {i}");
                        let Some(url) = part.get("image_url").and_then(Value::as_str) else {
                            return Err(ApiError::InvalidField(format!(
                                "{what} is an input_image without an image_url; send the image \
                                 as a data: URL (a file_id is not read)"
                            )));
                        };
                        images.push(super::images::from_url(url.to_owned(), &what)?);
                    }
                    "input_file" | "input_audio" => {
                        return Err(not_read(kind, &format!("{place}, part {i}")));
                    }
                    other => {
                        return Err(ApiError::InvalidField(format!(
                            "{place}, part {i} is of type '{other}'; parts are input_text or \
                             output_text"
                        )));
                    }
                }
            }
            texts.concat()
        }
        Some(other) => {
            return Err(ApiError::InvalidField(format!(
                "{place} has content {other}; send text or a list of input_text parts"
            )));
        }
    };
    Ok((text, images))
}

/// The assistant turn being read from consecutive items (reasoning, a
/// message, function calls): one chat message.
#[derive(Debug, Default)]
struct AssistantTurn {
    reasoning: Vec<String>,
    text: Vec<String>,
    calls: Vec<ToolCall>,
}

impl AssistantTurn {
    fn flush(&mut self, into: &mut Vec<ChatMessage>) {
        let turn = std::mem::take(self);
        if turn.reasoning.is_empty() && turn.text.is_empty() && turn.calls.is_empty() {
            return;
        }
        let reasoning = turn.reasoning.concat();
        into.push(ChatMessage {
            reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
            tool_calls: (!turn.calls.is_empty()).then_some(turn.calls),
            ..ChatMessage::assistant(turn.text.concat())
        });
    }
}

/// `input`'s items as the chat template's messages, after `earlier` (the
/// conversation a previous response left, whose calls results may answer).
fn input_messages(input: InputIn, earlier: &[ChatMessage]) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match input {
        InputIn::Text(text) => return Ok(vec![ChatMessage::user(text)]),
        InputIn::Items(items) => items,
    };
    let mut chat = Vec::with_capacity(items.len());
    let mut turn = AssistantTurn::default();
    for (index, item) in items.into_iter().enumerate() {
        let place = format!("input item {index}");
        let kind = item.get("type").and_then(Value::as_str);
        let kind = match kind {
            None if item.get("role").is_some() => "message",
            None => "",
            Some(kind) => kind,
        };
        let text_field = |name: &str| item.get(name).and_then(Value::as_str).map(str::to_owned);
        match kind {
            "message" => {
                let role = text_field("role").unwrap_or_default();
                let (text, images) = content_parts(item.get("content"), &place)?;
                if !images.is_empty() && role != "user" {
                    return Err(not_read("input_image", &place));
                }
                match role.as_str() {
                    "assistant" => {
                        // A message after the turn's calls starts another turn.
                        if !turn.calls.is_empty() {
                            turn.flush(&mut chat);
                        }
                        turn.text.push(text);
                    }
                    "user" | "system" | "developer" => {
                        turn.flush(&mut chat);
                        chat.push(if role == "user" {
                            ChatMessage {
                                images,
                                ..ChatMessage::user(text)
                            }
                        } else {
                            ChatMessage::system(text)
                        });
                    }
                    other => {
                        return Err(ApiError::InvalidField(format!(
                            "{place} has the role '{other}'; use user, assistant, system or \
                             developer"
                        )));
                    }
                }
            }
            "reasoning" => {
                if !turn.text.is_empty() || !turn.calls.is_empty() {
                    turn.flush(&mut chat);
                }
                let mut texts = Vec::new();
                for field in ["content", "summary"] {
                    if let Some(parts) = item.get(field).filter(|p| !p.is_null()) {
                        texts.push(content_text(Some(parts), &format!("{place}'s {field}"))?);
                    }
                }
                // The reasoning itself when there is any; its summary else.
                if let Some(text) = texts.into_iter().find(|t| !t.is_empty()) {
                    turn.reasoning.push(text);
                }
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (text_field("call_id"), text_field("name"))
                else {
                    return Err(ApiError::InvalidField(format!(
                        "{place} is a function_call without a call_id and a name"
                    )));
                };
                turn.calls.push(ToolCall {
                    id: call_id,
                    kind: ToolCallKind::Function,
                    function: FunctionCall {
                        name,
                        arguments: arguments_from_wire(item.get("arguments").cloned()),
                    },
                });
            }
            "function_call_output" => {
                turn.flush(&mut chat);
                let Some(call_id) = text_field("call_id") else {
                    return Err(ApiError::InvalidField(format!(
                        "{place} is a function_call_output without the call_id it answers"
                    )));
                };
                let output = content_text(item.get("output"), &place)?;
                let name = earlier
                    .iter()
                    .chain(chat.iter())
                    .filter_map(|m| m.tool_calls.as_ref())
                    .flatten()
                    .find(|c| c.id == call_id)
                    .map(|c| c.function.name.clone());
                chat.push(ChatMessage {
                    role: "tool".into(),
                    tool_call_id: Some(call_id),
                    name,
                    ..ChatMessage::user(output)
                });
            }
            "input_image" | "input_file" => return Err(not_read(kind, &place)),
            "" => {
                return Err(ApiError::InvalidField(format!(
                    "{place} has no type; items are messages, function_call, \
                     function_call_output or reasoning"
                )));
            }
            other => {
                return Err(ApiError::InvalidField(format!(
                    "{place} is of type '{other}', which this server does not read; items are \
                     messages, function_call, function_call_output or reasoning"
                )));
            }
        }
    }
    turn.flush(&mut chat);
    Ok(chat)
}

/// The tools as the chat template takes them (nested under `function`, as
/// chat completions sends them), as `tool_choice` offers them. Tools of
/// another type (OpenAI's hosted web_search or file_search, Codex CLI's
/// local_shell or free-form custom tools) are not offered to the model:
/// nothing here runs them, and agents such as Codex send them beside their
/// function tools on every turn, which a refusal would break. A tool
/// without a type is malformed and refused.
fn tools_offered(tools: &[Value], choice: &Value) -> Result<Option<Vec<Value>>, ApiError> {
    let mut offered = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(_) => continue,
            None => {
                return Err(ApiError::InvalidField(format!(
                    "tool {i} has no type; a function tool is {{\"type\": \"function\", \
                     \"name\": ..., \"parameters\": ...}}"
                )));
            }
        }
        let Some(name) = tool.get("name").and_then(Value::as_str) else {
            return Err(ApiError::InvalidField(format!(
                "tool {i} has no name; a function tool has a name and parameters"
            )));
        };
        let mut function = Map::new();
        function.insert("name".into(), name.into());
        for field in ["description", "parameters", "strict"] {
            if let Some(value) = tool.get(field).filter(|v| !v.is_null()) {
                function.insert(field.into(), value.clone());
            }
        }
        offered.push(json!({"type": "function", "function": function}));
    }
    match choice {
        Value::Null => {}
        Value::String(mode) => match mode.as_str() {
            // `required` is not enforced: the model may answer in text.
            "auto" | "required" => {}
            "none" => offered.clear(),
            other => {
                return Err(ApiError::InvalidField(format!(
                    "tool_choice is '{other}'; use auto, none, required or a function by name"
                )));
            }
        },
        Value::Object(choice) => match choice.get("type").and_then(Value::as_str) {
            Some("function") => {
                let Some(name) = choice.get("name").and_then(Value::as_str) else {
                    return Err(ApiError::InvalidField(
                        "tool_choice of type function needs the name of the function".into(),
                    ));
                };
                only_tool(&mut offered, name)?;
            }
            other => {
                return Err(ApiError::InvalidField(format!(
                    "tool_choice is of type '{}'; use auto, none, required or \
                     {{\"type\": \"function\", \"name\": ...}}",
                    other.unwrap_or("")
                )));
            }
        },
        other => {
            return Err(ApiError::InvalidField(format!(
                "tool_choice is {other}; use auto, none, required or a function by name"
            )));
        }
    }
    Ok((!offered.is_empty()).then_some(offered))
}

/// A request read: the run to ask for and what its response echoes.
struct Asked {
    ask: Ask,
    echo: Echo,
    /// The conversation without the instructions: what a stored response
    /// keeps (the reply is added after the run).
    conversation: Vec<ChatMessage>,
    stream: bool,
}

impl ResponsesRequest {
    /// Reads the request; `earlier` is the conversation of the response
    /// named in `previous_response_id`.
    fn into_asked(
        self,
        earlier: Vec<ChatMessage>,
        user_agent: Option<String>,
    ) -> Result<Asked, ApiError> {
        let text_format = self
            .text
            .and_then(|t| t.format)
            .filter(|f| !f.is_null())
            .unwrap_or_else(|| json!({"type": "text"}));
        let constraint = responses_text_format(Some(&text_format))?;
        let max_tokens = match self.max_output_tokens {
            Some(n) if n < 1 => {
                return Err(ApiError::InvalidField(format!(
                    "max_output_tokens is {n}; ask for at least 1 token"
                )));
            }
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => None,
        };
        let tools_in = self.tools.unwrap_or_default();
        let tool_choice = self.tool_choice.unwrap_or(Value::Null);
        let tools = tools_offered(&tools_in, &tool_choice)?;
        let forced = tool_choice == "required"
            || tool_choice.get("type").and_then(Value::as_str) == Some("function");
        let Some(input) = self.input else {
            return Err(ApiError::InvalidField(
                "input is missing; send text or a list of items".into(),
            ));
        };
        let mut conversation = earlier;
        let new = input_messages(input, &conversation)?;
        if new.is_empty() {
            return Err(ApiError::InvalidField(
                "input is empty; send at least one item".into(),
            ));
        }
        conversation.extend(new);
        let mut messages = Vec::with_capacity(conversation.len() + 1);
        if let Some(instructions) = self.instructions.as_ref().filter(|i| !i.is_empty()) {
            messages.push(ChatMessage::system(instructions.clone()));
        }
        messages.extend(conversation.iter().cloned());
        let effort = self.reasoning.and_then(|r| r.effort);
        let mut template_options = Map::new();
        if let Some(effort) = &effort {
            // Any effort but none switches the template's thinking on.
            let on = match effort.as_str() {
                "none" => false,
                "minimal" | "low" | "medium" | "high" | "xhigh" => true,
                other => {
                    return Err(ApiError::InvalidField(format!(
                        "reasoning.effort is '{other}'; use none, minimal, low, medium or high"
                    )));
                }
            };
            template_options.insert("enable_thinking".into(), Value::Bool(on));
        }
        let stream = self.stream.unwrap_or(false);
        let prompt = Prompt::Chat {
            system_prompt: None,
            messages,
            tools,
            template_options,
        };
        let constraint = forced_tool_call(forced, &prompt).or(constraint);
        let ask = Ask {
            route: ROUTE,
            model: self.model,
            prompt,
            settings: SettingsAsked {
                max_tokens,
                temperature: self.temperature,
                top_p: self.top_p,
                ..SettingsAsked::default()
            },
            stop_strings: Vec::new(),
            ignore_eos: false,
            keep_alive: KeepAliveAsked::Unchanged,
            user_agent,
            stream,
            constraint,
        };
        let echo = Echo {
            instructions: self.instructions,
            tools: tools_in,
            tool_choice: if tool_choice.is_null() {
                json!("auto")
            } else {
                tool_choice
            },
            temperature: self.temperature,
            top_p: self.top_p,
            max_output_tokens: self.max_output_tokens,
            previous_response_id: self.previous_response_id,
            store: self.store.unwrap_or(true),
            metadata: self.metadata.unwrap_or_else(|| json!({})),
            parallel_tool_calls: self.parallel_tool_calls.unwrap_or(true),
            effort,
            text_format,
        };
        Ok(Asked {
            ask,
            echo,
            conversation,
            stream,
        })
    }
}

/// The ids of one response and of its items, made once so that a stream's
/// events and its final response name the same items.
#[derive(Debug, Clone)]
struct ResponseIds {
    response: String,
    reasoning: String,
    message: String,
}

impl ResponseIds {
    fn new() -> Self {
        Self {
            response: new_id("resp_"),
            reasoning: new_id("rs_"),
            message: new_id("msg_"),
        }
    }
}

/// A function call's item id, from its call id (`call_x` is `fc_x`).
fn function_call_item_id(call: &ToolCall) -> String {
    match call.id.strip_prefix("call_") {
        Some(rest) => format!("fc_{rest}"),
        None => format!("fc_{}", call.id),
    }
}

fn reasoning_item(id: &str, text: &str, status: Option<&str>) -> Value {
    let mut item = json!({
        "type": "reasoning", "id": id, "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    });
    if let Some(status) = status {
        item["status"] = status.into();
    }
    item
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    json!({
        "type": "message", "id": id, "status": status, "role": "assistant",
        "content": text.map(|t| vec![text_part(t)]).unwrap_or_default(),
    })
}

fn function_call_item(call: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": function_call_item_id(call),
        "call_id": call.id,
        "name": call.function.name,
        "arguments": arguments,
        "status": status,
    })
}

fn call_arguments(call: &ToolCall) -> String {
    serde_json::to_string(&call.function.arguments).unwrap_or_default()
}

/// The reply's output items: its reasoning, its text, its function calls.
fn output_items(ids: &ResponseIds, result: &JobResult) -> Vec<Value> {
    let outcome = &result.outcome;
    let mut output = Vec::new();
    if !outcome.reasoning.is_empty() {
        output.push(reasoning_item(&ids.reasoning, &outcome.reasoning, None));
    }
    if !outcome.text.is_empty() || outcome.tool_calls.is_empty() {
        output.push(message_item(&ids.message, Some(&outcome.text), "completed"));
    }
    for call in &outcome.tool_calls {
        output.push(function_call_item(call, &call_arguments(call), "completed"));
    }
    output
}

/// `usage` as the Responses API counts: the cached tokens are part of the
/// input tokens.
fn usage(record: &RunRecord) -> Value {
    json!({
        "input_tokens": record.prompt_tokens,
        "input_tokens_details": {"cached_tokens": record.cached_tokens},
        "output_tokens": record.generated_tokens,
        "output_tokens_details": {"reasoning_tokens": record.reasoning_tokens},
        "total_tokens": record.prompt_tokens + record.generated_tokens,
    })
}

/// A response object; `result` is none while it is in progress.
fn response_object(
    ids: &ResponseIds,
    created: u64,
    model: &str,
    echo: &Echo,
    result: Option<&JobResult>,
) -> Value {
    let (status, incomplete, output, usage, ondo) = match result {
        None => ("in_progress", Value::Null, json!([]), Value::Null, None),
        Some(result) => {
            let cut = result.outcome.stats.stop_reason == StopReason::MaxTokens;
            (
                if cut { "incomplete" } else { "completed" },
                if cut {
                    json!({"reason": "max_output_tokens"})
                } else {
                    Value::Null
                },
                Value::Array(output_items(ids, result)),
                usage(&result.record),
                Some(result.ondo_record()),
            )
        }
    };
    let mut response = json!({
        "id": ids.response,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "model": model,
        "output": output,
        "usage": usage,
        "instructions": echo.instructions,
        "tools": echo.tools,
        "tool_choice": echo.tool_choice,
        "temperature": echo.temperature,
        "top_p": echo.top_p,
        "max_output_tokens": echo.max_output_tokens,
        "previous_response_id": echo.previous_response_id,
        "store": echo.store,
        "metadata": echo.metadata,
        "parallel_tool_calls": echo.parallel_tool_calls,
        "reasoning": {"effort": echo.effort, "summary": null},
        "text": {"format": echo.text_format},
        "truncation": "disabled",
    });
    if let Some(ondo) = ondo {
        response["ondo"] = serde_json::to_value(ondo).unwrap_or(Value::Null);
    }
    response
}

/// What finishing a response needs besides the run: its ids, the request's
/// echo and conversation, and the store it goes to.
struct Finisher {
    ids: ResponseIds,
    created: u64,
    model: String,
    echo: Echo,
    conversation: Vec<ChatMessage>,
    store: Arc<Mutex<ResponseStore>>,
}

impl Finisher {
    /// The final response, kept in the store unless `store` is false.
    fn finish(&self, result: &JobResult) -> Value {
        let response = response_object(
            &self.ids,
            self.created,
            &self.model,
            &self.echo,
            Some(result),
        );
        if self.echo.store {
            let mut conversation = self.conversation.clone();
            conversation.push(result.outcome.to_message());
            lock(&self.store).keep(StoredResponse {
                id: self.ids.response.clone(),
                response: response.clone(),
                conversation,
            });
        }
        response
    }
}

/// The item a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenItem {
    Reasoning,
    Message,
}

/// Events of one streamed response: each part of the reply in an output
/// item of its own, opened when the part starts and closed when another
/// starts.
struct EventEncoder {
    finisher: Finisher,
    sequence: u64,
    open: Option<OpenItem>,
    /// Items started so far (the next one's `output_index`).
    items: usize,
    /// The open item's text so far, for its `done` events.
    text: String,
}

impl EventEncoder {
    fn event(&mut self, name: &str, mut data: Value) -> Vec<u8> {
        data["type"] = name.into();
        data["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        event(name, &data)
    }

    fn close(&mut self) -> Vec<u8> {
        let Some(open) = self.open.take() else {
            return Vec::new();
        };
        let index = self.items - 1;
        let text = std::mem::take(&mut self.text);
        let ids = self.finisher.ids.clone();
        let mut out = Vec::new();
        match open {
            OpenItem::Reasoning => {
                out.extend(self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": ids.reasoning, "output_index": index,
                           "content_index": 0, "text": text}),
                ));
                out.extend(self.event(
                    "response.output_item.done",
                    json!({"output_index": index,
                           "item": reasoning_item(&ids.reasoning, &text, None)}),
                ));
            }
            OpenItem::Message => {
                let at = json!({"item_id": ids.message, "output_index": index, "content_index": 0});
                let mut done = at.clone();
                done["text"] = text.clone().into();
                out.extend(self.event("response.output_text.done", done));
                let mut part = at;
                part["part"] = text_part(&text);
                out.extend(self.event("response.content_part.done", part));
                out.extend(self.event(
                    "response.output_item.done",
                    json!({"output_index": index,
                           "item": message_item(&ids.message, Some(&text), "completed")}),
                ));
            }
        }
        out
    }

    /// Opens an item of `kind` unless one is open already.
    fn open(&mut self, kind: OpenItem) -> Vec<u8> {
        if self.open == Some(kind) {
            return Vec::new();
        }
        let mut out = self.close();
        let index = self.items;
        self.items += 1;
        self.open = Some(kind);
        let ids = self.finisher.ids.clone();
        match kind {
            OpenItem::Reasoning => out.extend(self.event(
                "response.output_item.added",
                json!({"output_index": index,
                       "item": reasoning_item(&ids.reasoning, "", Some("in_progress"))}),
            )),
            OpenItem::Message => {
                out.extend(self.event(
                    "response.output_item.added",
                    json!({"output_index": index,
                           "item": message_item(&ids.message, None, "in_progress")}),
                ));
                out.extend(self.event(
                    "response.content_part.added",
                    json!({"item_id": ids.message, "output_index": index,
                           "content_index": 0, "part": text_part("")}),
                ));
            }
        }
        out
    }

    fn whole(&self, result: Option<&JobResult>) -> Value {
        let f = &self.finisher;
        response_object(&f.ids, f.created, &f.model, &f.echo, result)
    }
}

impl StreamEncoder for EventEncoder {
    fn prelude(&mut self) -> Vec<u8> {
        let response = self.whole(None);
        let mut out = self.event("response.created", json!({"response": response}));
        out.extend(self.event("response.in_progress", json!({"response": response})));
        out
    }

    fn delta(&mut self, text: &str, reasoning: &str, tool_calls: &[ToolCall]) -> Vec<u8> {
        let mut out = Vec::new();
        let ids = self.finisher.ids.clone();
        if !reasoning.is_empty() {
            out.extend(self.open(OpenItem::Reasoning));
            self.text.push_str(reasoning);
            out.extend(self.event(
                "response.reasoning_text.delta",
                json!({"item_id": ids.reasoning, "output_index": self.items - 1,
                       "content_index": 0, "delta": reasoning}),
            ));
        }
        // A token whose text is held back adds nothing yet.
        if !text.is_empty() {
            out.extend(self.open(OpenItem::Message));
            self.text.push_str(text);
            out.extend(self.event(
                "response.output_text.delta",
                json!({"item_id": ids.message, "output_index": self.items - 1,
                       "content_index": 0, "delta": text, "logprobs": []}),
            ));
        }
        for call in tool_calls {
            out.extend(self.close());
            let index = self.items;
            self.items += 1;
            let (item_id, arguments) = (function_call_item_id(call), call_arguments(call));
            out.extend(self.event(
                "response.output_item.added",
                json!({"output_index": index,
                       "item": function_call_item(call, "", "in_progress")}),
            ));
            out.extend(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": arguments}),
            ));
            out.extend(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": index, "arguments": arguments}),
            ));
            out.extend(self.event(
                "response.output_item.done",
                json!({"output_index": index,
                       "item": function_call_item(call, &arguments, "completed")}),
            ));
        }
        out
    }

    fn done(&mut self, result: &JobResult) -> Vec<u8> {
        let mut out = self.close();
        if self.items == 0 {
            // As the whole response: one message, empty.
            out.extend(self.open(OpenItem::Message));
            out.extend(self.close());
        }
        let response = self.finisher.finish(result);
        let name = if response["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.extend(self.event(name, json!({"response": response})));
        out
    }

    fn failed(&mut self, error: &ApiError) -> Vec<u8> {
        let mut response = self.whole(None);
        response["status"] = "failed".into();
        let body = error_body(Dialect::OpenAi, error);
        response["error"] =
            json!({"code": body["error"]["code"], "message": body["error"]["message"]});
        let mut out = self.event(
            "error",
            json!({"code": body["error"]["code"], "message": body["error"]["message"], "param": null}),
        );
        out.extend(self.event("response.failed", json!({"response": response})));
        out
    }
}

/// OpenAI's 404 for a response it does not have; `param` names the field
/// that named it, if one did.
fn not_found(message: String, param: Option<&str>) -> Response {
    let body = json!({"error": {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": if param.is_some() { "previous_response_not_found" } else { "response_not_found" },
    }});
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

pub(super) async fn create(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let request: ResponsesRequest = parse_body(body).map_err(ApiFailure::openai)?;
    let earlier = match &request.previous_response_id {
        None => Vec::new(),
        Some(id) => match lock(&state.responses).find(id) {
            Some(stored) => stored.conversation.clone(),
            None => {
                return Ok(not_found(
                    format!("Previous response with id '{id}' not found."),
                    Some("previous_response_id"),
                ));
            }
        },
    };
    let asked = request
        .into_asked(earlier, user_agent(&headers))
        .map_err(ApiFailure::openai)?;
    let mut job = state
        .start_job(asked.ask)
        .await
        .map_err(ApiFailure::openai)?;
    job.started()
        .await
        .map_err(|e| ApiFailure::openai(e).logged())?;
    let finisher = Finisher {
        ids: ResponseIds::new(),
        created: job.created_unix_s,
        model: job.model.clone(),
        echo: asked.echo,
        conversation: asked.conversation,
        store: state.responses.clone(),
    };
    if asked.stream {
        let encoder = EventEncoder {
            finisher,
            sequence: 0,
            open: None,
            items: 0,
            text: String::new(),
        };
        return Ok(stream_response(job, encoder, "text/event-stream"));
    }
    let result = job
        .finish()
        .await
        .map_err(|e| ApiFailure::openai(e).logged())?;
    let mut response = axum::Json(finisher.finish(&result)).into_response();
    response.extensions_mut().insert(LoggedAtRunEnd);
    Ok(response)
}

pub(super) async fn retrieve(
    State(state): State<Arc<ServerState>>,
    Path(id): Path<String>,
) -> Response {
    match lock(&state.responses).find(&id) {
        Some(stored) => axum::Json(stored.response.clone()).into_response(),
        None => not_found(format!("Response with id '{id}' not found."), None),
    }
}

pub(super) async fn delete(
    State(state): State<Arc<ServerState>>,
    Path(id): Path<String>,
) -> Response {
    if lock(&state.responses).remove(&id) {
        axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        not_found(format!("Response with id '{id}' not found."), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(body: Value) -> Result<Asked, ApiError> {
        serde_json::from_value::<ResponsesRequest>(body)
            .map_err(|e| ApiError::MalformedBody(e.to_string()))?
            .into_asked(Vec::new(), Some("test".into()))
    }

    fn with(extra: Value) -> Result<Asked, ApiError> {
        let mut body = json!({"model": "tiny", "input": "hi"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        asked(body)
    }

    fn chat(asked: &Asked) -> (&Vec<ChatMessage>, &Option<Vec<Value>>, &Map<String, Value>) {
        let Prompt::Chat {
            messages,
            tools,
            template_options,
            ..
        } = &asked.ask.prompt
        else {
            panic!("not a chat");
        };
        (messages, tools, template_options)
    }

    #[test]
    fn items_map_onto_the_templates_messages() {
        let got = with(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Seoul?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "I should look."}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Seoul\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "31"},
                {"role": "user", "content": "And tomorrow?"},
            ],
            "tools": [{"type": "function", "name": "get_weather", "description": "Weather now", "parameters": {"type": "object"}, "strict": true}],
            "max_output_tokens": 64,
            "temperature": 0.5,
            "reasoning": {"effort": "low"},
            "metadata": {"k": "v"},
            "stream": true,
        }))
        .unwrap();
        assert!(got.stream && got.ask.stream);
        assert_eq!(got.ask.route, ROUTE);
        assert_eq!(got.ask.settings.max_tokens, Some(64));
        assert_eq!(got.ask.settings.temperature, Some(0.5));
        let (messages, tools, options) = chat(&got);
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(
            roles,
            ["system", "system", "user", "assistant", "tool", "user"]
        );
        assert_eq!(messages[0].content, "Be brief.");
        assert_eq!(messages[2].content, "Weather in Seoul?");
        assert_eq!(messages[3].content, "Checking.");
        assert_eq!(
            messages[3].reasoning_content.as_deref(),
            Some("I should look.")
        );
        let call = &messages[3].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.id, "call_1");
        assert_eq!(call.function.arguments, json!({"city": "Seoul"}));
        assert_eq!(messages[4].content, "31");
        assert_eq!(messages[4].name.as_deref(), Some("get_weather"));
        let tools = tools.as_ref().unwrap();
        assert_eq!(tools[0]["function"]["name"], "get_weather");
        assert_eq!(tools[0]["function"]["strict"], true);
        assert_eq!(options["enable_thinking"], json!(true));
        // The stored conversation leaves the instructions out.
        assert_eq!(got.conversation.len(), messages.len() - 1);
        assert_eq!(got.echo.metadata, json!({"k": "v"}));
        assert_eq!(got.echo.tool_choice, "auto");
    }

    #[test]
    fn a_previous_conversation_comes_first_and_names_its_calls() {
        let earlier = vec![
            ChatMessage::user("hi"),
            ChatMessage {
                tool_calls: Some(vec![ToolCall {
                    id: "call_9".into(),
                    ..ToolCall::new("f", json!({}))
                }]),
                ..ChatMessage::assistant("")
            },
        ];
        let got = serde_json::from_value::<ResponsesRequest>(json!({
            "model": "tiny",
            "input": [{"type": "function_call_output", "call_id": "call_9", "output": "done"}],
        }))
        .unwrap()
        .into_asked(earlier, None)
        .unwrap();
        let (messages, _, _) = chat(&got);
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[2].name.as_deref(), Some("f"));
    }

    #[test]
    fn tool_choice_decides_which_tools_are_offered() {
        // Codex CLI sends hosted and free-form tools beside its functions:
        // they are left out, the functions offered.
        let tools = json!([
            {"type": "function", "name": "a", "parameters": {}},
            {"type": "web_search"},
            {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
            {"type": "local_shell"},
            {"type": "function", "name": "b", "parameters": {}},
        ]);
        let offered = |choice: Value| -> Option<Vec<String>> {
            let got = with(json!({"tools": tools, "tool_choice": choice})).unwrap();
            chat(&got).1.as_ref().map(|t| {
                t.iter()
                    .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                    .collect()
            })
        };
        assert_eq!(offered(json!("auto")).unwrap(), ["a", "b"]);
        assert_eq!(offered(json!("required")).unwrap(), ["a", "b"]);
        assert_eq!(
            offered(json!({"type": "function", "name": "b"})).unwrap(),
            ["b"]
        );
        assert_eq!(offered(json!("none")), None);
    }

    #[test]
    fn what_this_server_cannot_do_is_refused_by_name() {
        for (body, words) in [
            (
                json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": 3}}}),
                "text.format: the schema cannot be enforced",
            ),
            (
                json!({"text": {"format": {"type": "grammar"}}}),
                "text.format type 'grammar'",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]}),
                "does not fetch images",
            ),
            (json!({"tools": [{"name": "f"}]}), "tool 0 has no type"),
            (
                json!({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}}),
                "'g', which is not among the tools",
            ),
            (json!({"input": [{"type": "hologram"}]}), "'hologram'"),
            (json!({"input": []}), "input is empty"),
            (json!({"max_output_tokens": 0}), "max_output_tokens is 0"),
            (json!({"reasoning": {"effort": "vast"}}), "'vast'"),
        ] {
            let Err(error) = with(body.clone()) else {
                panic!("{body} passed");
            };
            assert_eq!(error.status().as_u16(), 400, "{body}");
            assert!(error.to_string().contains(words), "{body}: {error}");
        }
        assert!(
            with(json!({"text": {"format": {"type": "text"}}, "store": false, "parallel_tool_calls": false, "reasoning": {"effort": "none", "summary": "auto"}})).is_ok()
        );
    }

    #[test]
    fn a_stream_opens_an_item_per_part_and_numbers_every_event() {
        let echo = with(json!({})).unwrap().echo;
        let mut encoder = EventEncoder {
            finisher: Finisher {
                ids: ResponseIds::new(),
                created: 1,
                model: "tiny".into(),
                echo,
                conversation: Vec::new(),
                store: Arc::default(),
            },
            sequence: 0,
            open: None,
            items: 0,
            text: String::new(),
        };
        let mut out = encoder.prelude();
        out.extend(encoder.delta("", "Hmm", &[]));
        out.extend(encoder.delta("", " ok", &[]));
        out.extend(encoder.delta("", "", &[]));
        out.extend(encoder.delta("Hi", "", &[]));
        out.extend(encoder.delta("", "", &[ToolCall::new("f", json!({"x": 1}))]));
        out.extend(encoder.failed(&ApiError::Stopping));
        let out = String::from_utf8(out).unwrap();
        let events: Vec<(&str, Value)> = out
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                (name.strip_prefix("event: ").unwrap(), data)
            })
            .collect();
        for (i, (name, data)) in events.iter().enumerate() {
            assert_eq!(data["type"], *name);
            assert_eq!(data["sequence_number"], i);
        }
        let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "error",
                "response.failed",
            ]
        );
        assert_eq!(events[0].1["response"]["status"], "in_progress");
        assert_eq!(events[5].1["text"], "Hmm ok");
        assert_eq!(events[6].1["item"]["type"], "reasoning");
        assert_eq!(events[7].1["output_index"], 1);
        assert_eq!(events[10].1["text"], "Hi");
        assert_eq!(events[13].1["item"]["type"], "function_call");
        assert_eq!(events[13].1["output_index"], 2);
        assert_eq!(events[15].1["arguments"], "{\"x\":1}");
        assert_eq!(events[18].1["response"]["status"], "failed");
        assert_eq!(events[18].1["response"]["error"]["code"], "engine_stopped");
    }

    #[test]
    fn the_store_keeps_the_last_responses() {
        let mut store = ResponseStore::default();
        for i in 0..STORED_RESPONSES + 2 {
            store.keep(StoredResponse {
                id: format!("resp_{i}"),
                response: json!({}),
                conversation: Vec::new(),
            });
        }
        assert!(store.find("resp_0").is_none() && store.find("resp_1").is_none());
        assert!(store.find("resp_2").is_some());
        assert!(store.remove("resp_2") && !store.remove("resp_2"));
        // A few large ones: the oldest go to keep the bytes bound.
        let large = "x".repeat(STORED_RESPONSE_BYTES / 3 - 1000);
        for i in 0..4 {
            store.keep(StoredResponse {
                id: format!("large_{i}"),
                response: json!({}),
                conversation: vec![ChatMessage::user(large.clone())],
            });
        }
        assert!(store.find("large_0").is_none() && store.find("resp_3").is_none());
        assert!(store.find("large_1").is_some() && store.find("large_3").is_some());
        assert!(store.bytes <= STORED_RESPONSE_BYTES, "{}", store.bytes);
        assert_eq!(
            function_call_item_id(&ToolCall::new("f", json!({})))[..3],
            *"fc_"
        );
    }
}
