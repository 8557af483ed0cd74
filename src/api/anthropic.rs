//! The Anthropic dialect: `POST /v1/messages` and `POST
//! /v1/messages/count_tokens`, as Anthropic's clients (its SDKs, Claude
//! Code) send and read them. A request's content blocks map onto the chat
//! template's messages: `text` is what a turn says, `image` (a base64
//! source; a URL source is refused) what a user's turn shows, `thinking` an assistant
//! turn's reasoning, `tool_use` its tool calls, and each `tool_result` a
//! `tool` turn. `tools` go to the template as function tools; `tool_choice`
//! `none` offers none, `tool` only the one named (`any` and `tool` are not
//! enforced: the model may still answer in text). `thinking` switches the
//! template's `enable_thinking`. `usage.input_tokens` counts, as Anthropic's
//! does, the prompt tokens not read from the cache; those read from the
//! conversation's KV cache are `cache_read_input_tokens`. Streams are
//! server-sent events with Anthropic's event names; a busy engine is 529
//! `overloaded_error`, as Anthropic's clients expect.

use super::output_format::{anthropic_output_format, forced_tool_call};
use std::sync::Arc;

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
use super::{LoggedAtRunEnd, ServerState, parse_body, user_agent};
use crate::engine::chat_template::ChatMessage;
use crate::engine::reply::{FunctionCall, ToolCallKind};
use crate::engine::stream::count_prompt_tokens;
use crate::engine::{Prompt, RunError, ToolCall};
use crate::run_kinds::StopReason;
use crate::store::RunRecord;

/// The route's name in the log and the in-flight line.
const ROUTE: &str = "POST /v1/messages";

/// A Messages request (count_tokens reads the same body, `max_tokens` and
/// the sampling fields aside). Fields this server has no use for
/// (`metadata`, `service_tier`, ...) are accepted and ignored.
#[derive(Debug, Deserialize)]
struct MessagesRequest {
    model: String,
    max_tokens: Option<i64>,
    system: Option<SystemIn>,
    messages: Vec<MessageIn>,
    tools: Option<Vec<ToolIn>>,
    tool_choice: Option<ToolChoiceIn>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    thinking: Option<ThinkingIn>,
    output_config: Option<OutputConfigIn>,
    /// Structured outputs as first released (`output_format`), before they
    /// moved to `output_config.format`.
    output_format: Option<Value>,
    stream: Option<bool>,
}

/// `output_config`: `effort` is Claude's own and ignored; `format` holds
/// the reply to a JSON schema.
#[derive(Debug, Deserialize)]
struct OutputConfigIn {
    format: Option<Value>,
}

/// `system`: text, or a list of text blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SystemIn {
    Text(String),
    Blocks(Vec<Value>),
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    content: ContentIn,
}

/// A message's content: text, or a list of content blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ContentIn {
    Text(String),
    Blocks(Vec<Value>),
}

#[derive(Debug, Deserialize)]
struct ToolIn {
    name: String,
    description: Option<String>,
    input_schema: Option<Value>,
    /// `custom` (or absent) for a tool the client runs; Anthropic's own
    /// server tools (`web_search_...`, `bash_...`) name themselves here and
    /// are left out.
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ToolChoiceIn {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}`, `adaptive`,
/// `between_tools` or `disabled`; the budget is not kept to.
#[derive(Debug, Deserialize)]
struct ThinkingIn {
    #[serde(rename = "type")]
    kind: String,
}

/// One content block, read.
#[derive(Debug)]
enum Block {
    Text(String),
    /// An image's file in base64.
    Image(String),
    Thinking(String),
    ToolUse(ToolCall),
    ToolResult {
        tool_use_id: String,
        content: String,
    },
    /// A block that carries nothing the template reads (a thinking block
    /// Anthropic's API redacted and a client sent back).
    Nothing,
}

#[derive(Debug, Deserialize)]
struct TextFields {
    text: String,
}

#[derive(Debug, Deserialize)]
struct ThinkingFields {
    thinking: String,
}

#[derive(Debug, Deserialize)]
struct ToolUseFields {
    id: String,
    name: String,
    #[serde(default)]
    input: Value,
}

#[derive(Debug, Deserialize)]
struct ToolResultFields {
    tool_use_id: String,
    content: Option<ContentIn>,
    #[serde(default)]
    is_error: bool,
}

#[derive(Debug, Deserialize)]
struct ImageFields {
    source: ImageSource,
}

/// An image block's source: `{"type": "base64", "media_type", "data"}`,
/// or `{"type": "url", "url"}` (refused: this server fetches nothing).
#[derive(Debug, Deserialize)]
struct ImageSource {
    #[serde(rename = "type")]
    kind: String,
    data: Option<String>,
    url: Option<String>,
}

/// An image block's file in base64.
fn image_block(block: Value, place: &str) -> Result<String, ApiError> {
    let source = fields::<ImageFields>(block, "image", place)?.source;
    let what = format!("{place} (an image block)");
    match (source.kind.as_str(), source.data, source.url) {
        ("base64", Some(data), _) => super::images::from_base64(data, &what),
        ("url", _, Some(url)) => super::images::from_url(url, &what),
        (kind, _, _) => Err(ApiError::InvalidField(format!(
            "{what} has a source of type '{kind}' without its data; send \
             {{\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": ...}}"
        ))),
    }
}

/// A block's fields as `T`, or a 400 that says where and what is wrong.
fn fields<T: serde::de::DeserializeOwned>(
    block: Value,
    kind: &str,
    place: &str,
) -> Result<T, ApiError> {
    serde_json::from_value(block)
        .map_err(|e| ApiError::InvalidField(format!("{place} (a {kind} block) is malformed: {e}")))
}

/// Reads one content block; `place` says where it is, for errors.
fn read_block(block: Value, place: &str) -> Result<Block, ApiError> {
    let kind = block
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    match kind.as_str() {
        "text" => Ok(Block::Text(fields::<TextFields>(block, &kind, place)?.text)),
        "thinking" => Ok(Block::Thinking(
            fields::<ThinkingFields>(block, &kind, place)?.thinking,
        )),
        "redacted_thinking" => Ok(Block::Nothing),
        "tool_use" => {
            let call = fields::<ToolUseFields>(block, &kind, place)?;
            Ok(Block::ToolUse(ToolCall {
                id: call.id,
                kind: ToolCallKind::Function,
                function: FunctionCall {
                    name: call.name,
                    arguments: match call.input {
                        Value::Null => Value::Object(Map::new()),
                        input => input,
                    },
                },
            }))
        }
        "tool_result" => {
            let result = fields::<ToolResultFields>(block, &kind, place)?;
            let mut content = match result.content {
                None => String::new(),
                Some(ContentIn::Text(text)) => text,
                Some(ContentIn::Blocks(blocks)) => {
                    let mut texts = Vec::new();
                    for (i, block) in blocks.into_iter().enumerate() {
                        match read_block(block, &format!("{place}, part {i}"))? {
                            Block::Text(text) => texts.push(text),
                            _ => {
                                return Err(ApiError::InvalidField(format!(
                                    "{place}, part {i}: a tool result holds text blocks only"
                                )));
                            }
                        }
                    }
                    texts.join("\n")
                }
            };
            // The template has no field for a failed call: the model reads
            // it in the result's words.
            if result.is_error {
                content = format!("Error: {content}");
            }
            Ok(Block::ToolResult {
                tool_use_id: result.tool_use_id,
                content,
            })
        }
        "image" => Ok(Block::Image(image_block(block, place)?)),
        "document" => Err(ApiError::InvalidField(format!(
            "{place} is a document block: documents are not read by Ondo; send their text"
        ))),
        "" => Err(ApiError::InvalidField(format!(
            "{place} has no type; content blocks are text, thinking, tool_use or tool_result"
        ))),
        other => Err(ApiError::InvalidField(format!(
            "{place} is of type '{other}', which this server does not read; content blocks are \
             text, thinking, tool_use or tool_result"
        ))),
    }
}

/// The system prompt's text.
fn system_text(system: SystemIn) -> Result<String, ApiError> {
    match system {
        SystemIn::Text(text) => Ok(text),
        SystemIn::Blocks(blocks) => {
            let mut texts = Vec::new();
            for (i, block) in blocks.into_iter().enumerate() {
                match read_block(block, &format!("system block {i}"))? {
                    Block::Text(text) => texts.push(text),
                    _ => {
                        return Err(ApiError::InvalidField(format!(
                            "system block {i} is not text; the system prompt is text blocks"
                        )));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
    }
}

/// A user turn's text blocks so far, as a message (none when there are none).
fn flush_user_text(texts: &mut Vec<String>, into: &mut Vec<ChatMessage>) {
    if !texts.is_empty() {
        into.push(ChatMessage::user(texts.join("\n")));
        texts.clear();
    }
}

/// The conversation as the chat template reads it: the system prompt, then
/// each message; a user message's tool results become `tool` turns (named
/// after the call they answer) in the order they came, around its text.
fn chat_messages(
    system: Option<SystemIn>,
    messages: Vec<MessageIn>,
) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::InvalidField(
            "messages is empty; send at least one message".into(),
        ));
    }
    let mut chat = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system {
        let text = system_text(system)?;
        if !text.is_empty() {
            chat.push(ChatMessage::system(text));
        }
    }
    // Tool names by call id, for the results that answer them.
    let mut called: Vec<(String, String)> = Vec::new();
    for (index, message) in messages.into_iter().enumerate() {
        let blocks = match message.content {
            ContentIn::Text(text) => vec![Block::Text(text)],
            ContentIn::Blocks(blocks) => blocks
                .into_iter()
                .enumerate()
                .map(|(i, b)| read_block(b, &format!("message {index}, block {i}")))
                .collect::<Result<Vec<_>, _>>()?,
        };
        match message.role.as_str() {
            "user" => {
                let mut texts = Vec::new();
                let mut images = Vec::new();
                let before = chat.len();
                for block in blocks {
                    match block {
                        Block::Text(text) => texts.push(text),
                        Block::Image(image) => images.push(image),
                        Block::ToolResult {
                            tool_use_id,
                            content,
                        } => {
                            flush_user_text(&mut texts, &mut chat);
                            let name = called
                                .iter()
                                .find(|(id, _)| *id == tool_use_id)
                                .map(|(_, name)| name.clone());
                            chat.push(ChatMessage {
                                role: "tool".into(),
                                tool_call_id: Some(tool_use_id),
                                name,
                                ..ChatMessage::user(content)
                            });
                        }
                        Block::Thinking(_) | Block::ToolUse(_) => {
                            return Err(ApiError::InvalidField(format!(
                                "message {index} is the user's but holds thinking or tool_use, \
                                 which only the assistant's messages hold"
                            )));
                        }
                        Block::Nothing => {}
                    }
                }
                flush_user_text(&mut texts, &mut chat);
                if chat.len() == before {
                    chat.push(ChatMessage::user(""));
                }
                // The turn's images go with its last text (its question).
                if !images.is_empty()
                    && let Some(last) = chat[before..].iter_mut().rev().find(|m| m.role == "user")
                {
                    last.images = images;
                } else if !images.is_empty() {
                    chat.push(ChatMessage {
                        images,
                        ..ChatMessage::user("")
                    });
                }
            }
            "assistant" => {
                let (mut texts, mut reasoning, mut calls) = (Vec::new(), Vec::new(), Vec::new());
                for block in blocks {
                    match block {
                        Block::Text(text) => texts.push(text),
                        Block::Thinking(thought) => reasoning.push(thought),
                        Block::ToolUse(call) => {
                            called.push((call.id.clone(), call.function.name.clone()));
                            calls.push(call);
                        }
                        Block::ToolResult { .. } => {
                            return Err(ApiError::InvalidField(format!(
                                "message {index} is the assistant's but holds a tool_result; \
                                 tool results go in the user's next message"
                            )));
                        }
                        Block::Image(_) => {
                            return Err(ApiError::InvalidField(format!(
                                "message {index} is the assistant's but holds an image; images \
                                 go in the user's messages"
                            )));
                        }
                        Block::Nothing => {}
                    }
                }
                let reasoning = reasoning.join("\n");
                chat.push(ChatMessage {
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls: (!calls.is_empty()).then_some(calls),
                    ..ChatMessage::assistant(texts.join("\n"))
                });
            }
            // Claude Code sends system-role messages among the turns. Chat
            // templates take a system prompt only first, so their text joins it.
            "system" => {
                let text = blocks
                    .into_iter()
                    .filter_map(|block| match block {
                        Block::Text(text) => Some(text),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                if !text.is_empty() {
                    match chat.first_mut().filter(|first| first.role == "system") {
                        Some(first) => {
                            first.content.push_str("\n\n");
                            first.content.push_str(&text);
                        }
                        None => chat.insert(0, ChatMessage::system(text)),
                    }
                }
            }
            other => {
                return Err(ApiError::InvalidField(format!(
                    "message {index} has the role '{other}'; messages are user, assistant or \
                     system (the system prompt may also go in `system`)"
                )));
            }
        }
    }
    Ok(chat)
}

/// The tools as the chat template takes them (OpenAI's function shape), as
/// `tool_choice` offers them. Anthropic's own server tools (web search, code
/// execution, ...) are not offered to the model: nothing here runs them,
/// and a client that sends them beside its own tools still gets an answer.
fn tools_offered(
    tools: Option<Vec<ToolIn>>,
    choice: Option<ToolChoiceIn>,
) -> Result<Option<Vec<Value>>, ApiError> {
    let tools = tools.unwrap_or_default();
    let mut offered = Vec::with_capacity(tools.len());
    for tool in tools {
        if tool.kind.as_deref().is_some_and(|k| k != "custom") {
            continue;
        }
        let Some(schema) = tool.input_schema else {
            return Err(ApiError::InvalidField(format!(
                "tool '{}' has no input_schema; give it the JSON schema of its input",
                tool.name
            )));
        };
        let mut function = Map::new();
        function.insert("name".into(), tool.name.into());
        if let Some(description) = tool.description {
            function.insert("description".into(), description.into());
        }
        function.insert("parameters".into(), schema);
        offered.push(json!({"type": "function", "function": function}));
    }
    match choice {
        None => {}
        Some(choice) => match choice.kind.as_str() {
            "auto" | "any" => {}
            "none" => offered.clear(),
            "tool" => {
                let Some(name) = choice.name else {
                    return Err(ApiError::InvalidField(
                        "tool_choice of type tool needs the name of the tool".into(),
                    ));
                };
                only_tool(&mut offered, &name)?;
            }
            other => {
                return Err(ApiError::InvalidField(format!(
                    "tool_choice is of type '{other}'; use auto, any, tool or none"
                )));
            }
        },
    }
    Ok((!offered.is_empty()).then_some(offered))
}

/// Keeps of the tools offered (in the template's function shape) only the
/// one `tool_choice` names; a name not among them is an error.
pub(super) fn only_tool(offered: &mut Vec<Value>, name: &str) -> Result<(), ApiError> {
    offered.retain(|t| t["function"]["name"] == name);
    if offered.is_empty() {
        return Err(ApiError::InvalidField(format!(
            "tool_choice names the tool '{name}', which is not among the tools"
        )));
    }
    Ok(())
}

impl MessagesRequest {
    /// The prompt the chat template renders: system, messages and tools.
    fn prompt(&mut self) -> Result<Prompt, ApiError> {
        let messages = chat_messages(self.system.take(), std::mem::take(&mut self.messages))?;
        let tools = tools_offered(self.tools.take(), self.tool_choice.take())?;
        let mut template_options = Map::new();
        if let Some(thinking) = self.thinking.take() {
            let on = match thinking.kind.as_str() {
                "enabled" | "adaptive" | "between_tools" => true,
                "disabled" => false,
                other => {
                    return Err(ApiError::InvalidField(format!(
                        "thinking is of type '{other}'; use enabled, adaptive or disabled"
                    )));
                }
            };
            template_options.insert("enable_thinking".into(), Value::Bool(on));
        }
        Ok(Prompt::Chat {
            system_prompt: None,
            messages,
            tools,
            template_options,
        })
    }

    fn settings(&self) -> Result<SettingsAsked, ApiError> {
        let max_tokens = match self.max_tokens {
            None => {
                return Err(ApiError::InvalidField(
                    "max_tokens is required: the most tokens the reply may have".into(),
                ));
            }
            Some(n) if n < 1 => {
                return Err(ApiError::InvalidField(format!(
                    "max_tokens is {n}; ask for at least 1 token"
                )));
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        Ok(SettingsAsked {
            max_tokens: Some(max_tokens),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self
                .top_k
                .map(|k| u32::try_from(k.max(0)).unwrap_or(u32::MAX)),
            ..SettingsAsked::default()
        })
    }

    fn into_ask(mut self, user_agent: Option<String>) -> Result<(Ask, bool), ApiError> {
        let constraint = anthropic_output_format(
            self.output_format.as_ref(),
            self.output_config.as_ref().and_then(|c| c.format.as_ref()),
        )?;
        let forced = self
            .tool_choice
            .as_ref()
            .is_some_and(|c| c.kind == "any" || c.kind == "tool");
        let settings = self.settings()?;
        let prompt = self.prompt()?;
        let constraint = forced_tool_call(forced, &prompt).or(constraint);
        let stream = self.stream.unwrap_or(false);
        let ask = Ask {
            route: ROUTE,
            model: self.model,
            prompt,
            settings,
            stop_strings: self.stop_sequences.unwrap_or_default(),
            ignore_eos: false,
            keep_alive: KeepAliveAsked::Unchanged,
            user_agent,
            stream,
            constraint,
        };
        Ok((ask, stream))
    }
}

/// An id with the prefix for its kind (`msg_`, `resp_`), unique like a run id.
pub(super) fn new_id(prefix: &str) -> String {
    crate::session::record::new_run_id().replacen("r-", prefix, 1)
}

/// A tool call's id as Anthropic's clients know them (`toolu_...`).
fn tool_use_id(call: &ToolCall) -> String {
    match call.id.strip_prefix("call_") {
        Some(rest) => format!("toolu_{rest}"),
        None if call.id.is_empty() => new_id("toolu_"),
        None => call.id.clone(),
    }
}

/// Why the reply ended, in Anthropic's words, and the stop sequence that
/// ended it.
fn stop_reason(result: &JobResult) -> (&'static str, Option<String>) {
    let stats = &result.outcome.stats;
    match stats.stop_reason {
        StopReason::MaxTokens => ("max_tokens", None),
        StopReason::ToolCalls => ("tool_use", None),
        StopReason::StopString => ("stop_sequence", stats.stop_string.clone()),
        StopReason::Eos | StopReason::Cancelled | StopReason::Other => ("end_turn", None),
    }
}

/// `usage` from what the run counted: `input_tokens` are those prefilled,
/// the cached ones apart (their sum is the prompt).
fn usage(prompt_tokens: u64, cached_tokens: u64, output_tokens: u64) -> Value {
    json!({
        "input_tokens": prompt_tokens.saturating_sub(cached_tokens),
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

fn run_usage(record: &RunRecord) -> Value {
    usage(
        record.prompt_tokens,
        record.cached_tokens,
        record.generated_tokens,
    )
}

fn tool_use_block(call: &ToolCall) -> Value {
    json!({
        "type": "tool_use",
        "id": tool_use_id(call),
        "name": call.function.name,
        "input": call.function.arguments,
    })
}

/// The reply's content blocks: its reasoning, its text, its tool calls. A
/// reply with none of them has one empty text block.
fn content_out(result: &JobResult) -> Vec<Value> {
    let outcome = &result.outcome;
    let mut content = Vec::new();
    if !outcome.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": outcome.reasoning, "signature": ""}));
    }
    if !outcome.text.is_empty() || (content.is_empty() && outcome.tool_calls.is_empty()) {
        content.push(json!({"type": "text", "text": outcome.text}));
    }
    content.extend(outcome.tool_calls.iter().map(tool_use_block));
    content
}

fn message_out(id: &str, model: &str, result: &JobResult) -> Value {
    let (reason, sequence) = stop_reason(result);
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_out(result),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": run_usage(&result.record),
        "ondo": result.ondo_record(),
    })
}

/// One server-sent event as Anthropic (and OpenAI's Responses API) write
/// them: its name, then its data.
pub(super) fn event(name: &str, data: &Value) -> Vec<u8> {
    format!("event: {name}\ndata: {data}\n\n").into_bytes()
}

/// The content block a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    Thinking,
    Text,
}

/// Events of one streamed reply: each part of it in a content block of its
/// own kind, opened when the part starts and closed when another starts.
struct EventEncoder {
    id: String,
    model: String,
    prompt_tokens: u64,
    cached_tokens: u64,
    open: Option<OpenBlock>,
    /// Blocks started so far (the next one's index).
    blocks: usize,
}

impl EventEncoder {
    fn close(&mut self) -> Vec<u8> {
        let Some(open) = self.open.take() else {
            return Vec::new();
        };
        let index = self.blocks - 1;
        let mut out = Vec::new();
        if open == OpenBlock::Thinking {
            // Anthropic signs its reasoning so that it comes back unaltered;
            // there is nothing to sign here, and clients keep the empty one.
            out.extend(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "signature_delta", "signature": ""}}),
            ));
        }
        out.extend(event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
        out
    }

    fn start(&mut self, block: Value) -> Vec<u8> {
        let mut out = self.close();
        out.extend(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.blocks, "content_block": block}),
        ));
        self.blocks += 1;
        out
    }

    /// Opens a block of `kind` unless one is open already.
    fn open(&mut self, kind: OpenBlock) -> Vec<u8> {
        if self.open == Some(kind) {
            return Vec::new();
        }
        let out = self.start(match kind {
            OpenBlock::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            OpenBlock::Text => json!({"type": "text", "text": ""}),
        });
        self.open = Some(kind);
        out
    }

    fn piece(&self, delta: Value) -> Vec<u8> {
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}),
        )
    }
}

impl StreamEncoder for EventEncoder {
    fn prelude(&mut self) -> Vec<u8> {
        let message = json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": usage(self.prompt_tokens, self.cached_tokens, 0),
        });
        let mut out = event(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
        out.extend(event("ping", &json!({"type": "ping"})));
        out
    }

    fn delta(&mut self, text: &str, reasoning: &str, tool_calls: &[ToolCall]) -> Vec<u8> {
        let mut out = Vec::new();
        if !reasoning.is_empty() {
            out.extend(self.open(OpenBlock::Thinking));
            out.extend(self.piece(json!({"type": "thinking_delta", "thinking": reasoning})));
        }
        // A token whose text is held back adds nothing yet.
        if !text.is_empty() {
            out.extend(self.open(OpenBlock::Text));
            out.extend(self.piece(json!({"type": "text_delta", "text": text})));
        }
        for call in tool_calls {
            let mut block = tool_use_block(call);
            let input = serde_json::to_string(&block["input"]).unwrap_or_default();
            // The input arrives as JSON text in the deltas, as Anthropic's do.
            block["input"] = json!({});
            out.extend(self.start(block));
            out.extend(self.piece(json!({"type": "input_json_delta", "partial_json": input})));
            out.extend(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.blocks - 1}),
            ));
        }
        out
    }

    fn done(&mut self, result: &JobResult) -> Vec<u8> {
        let mut out = self.close();
        if self.blocks == 0 {
            // As the whole answer: one empty text block.
            out.extend(self.open(OpenBlock::Text));
            out.extend(self.close());
        }
        let (reason, sequence) = stop_reason(result);
        out.extend(event(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": run_usage(&result.record),
                "ondo": result.ondo_record(),
            }),
        ));
        out.extend(event("message_stop", &json!({"type": "message_stop"})));
        out
    }

    fn failed(&mut self, error: &ApiError) -> Vec<u8> {
        event("error", &error_body(Dialect::Anthropic, error))
    }
}

pub(super) async fn messages(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let request: MessagesRequest = parse_body(body).map_err(ApiFailure::anthropic)?;
    let (ask, stream) = request
        .into_ask(user_agent(&headers))
        .map_err(ApiFailure::anthropic)?;
    let mut job = state.start_job(ask).await.map_err(ApiFailure::anthropic)?;
    let (prompt_tokens, cached_tokens) = job
        .started()
        .await
        .map_err(|e| ApiFailure::anthropic(e).logged())?;
    let (id, model) = (new_id("msg_"), job.model.clone());
    if stream {
        let encoder = EventEncoder {
            id,
            model,
            prompt_tokens: prompt_tokens as u64,
            cached_tokens: cached_tokens as u64,
            open: None,
            blocks: 0,
        };
        return Ok(stream_response(job, encoder, "text/event-stream"));
    }
    let result = job
        .finish()
        .await
        .map_err(|e| ApiFailure::anthropic(e).logged())?;
    let mut response = axum::Json(message_out(&id, &model, &result)).into_response();
    response.extensions_mut().insert(LoggedAtRunEnd);
    Ok(response)
}

pub(super) async fn count_tokens(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let mut request: MessagesRequest = parse_body(body).map_err(ApiFailure::anthropic)?;
    let prompt = request.prompt().map_err(ApiFailure::anthropic)?;
    let settings = state.saved_settings().await;
    let model = state
        .resolve(&request.model, &settings)
        .await
        .map_err(ApiFailure::anthropic)?;
    let dir = model.dir.clone();
    let counted = tokio::task::spawn_blocking(move || count_prompt_tokens(&dir, &prompt))
        .await
        .map_err(|e| ApiFailure::anthropic(RunError::Internal(e.to_string())))?
        .map_err(|e| ApiFailure::anthropic(ApiError::of_run(&model, e)))?;
    Ok(axum::Json(json!({"input_tokens": counted})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(body: Value) -> Result<(Ask, bool), ApiError> {
        serde_json::from_value::<MessagesRequest>(body)
            .map_err(|e| ApiError::MalformedBody(e.to_string()))?
            .into_ask(Some("test".into()))
    }

    fn with(extra: Value) -> Result<(Ask, bool), ApiError> {
        let mut body = json!({
            "model": "tiny",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
        });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        ask(body)
    }

    #[test]
    fn system_messages_among_the_turns_join_the_system_prompt() {
        // As Claude Code sends them; templates take a system prompt only first.
        let (asked, _) = ask(json!({
            "model": "tiny",
            "max_tokens": 8,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": "Today is Friday."}]},
                {"role": "user", "content": "and?"},
            ],
        }))
        .unwrap();
        let Prompt::Chat { messages, .. } = asked.prompt else {
            panic!("not a chat");
        };
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "user"]);
        assert_eq!(messages[0].content, "Be brief.\n\nToday is Friday.");
    }

    #[test]
    fn a_conversation_with_tools_maps_onto_the_templates_messages() {
        let (ask, stream) = ask(json!({
            "model": "tiny",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Seoul?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should look.", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Seoul"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "31"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ]},
            ],
            "tools": [{"name": "get_weather", "description": "Weather now", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto"},
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_k": 20,
            "metadata": {"user_id": "u"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "stream": true,
        }))
        .unwrap();
        assert!(stream && ask.stream);
        assert_eq!(ask.route, ROUTE);
        assert_eq!(ask.settings.max_tokens, Some(64));
        assert_eq!(ask.settings.temperature, Some(0.5));
        assert_eq!(ask.settings.top_k, Some(20));
        assert_eq!(ask.stop_strings, ["END"]);
        let Prompt::Chat {
            messages,
            tools,
            template_options,
            ..
        } = ask.prompt
        else {
            panic!("not a chat");
        };
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(messages[0].content, "Be brief.");
        assert_eq!(messages[2].content, "Checking.");
        assert_eq!(
            messages[2].reasoning_content.as_deref(),
            Some("I should look.")
        );
        let call = &messages[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.id, "toolu_1");
        assert_eq!(call.function.arguments, json!({"city": "Seoul"}));
        assert_eq!(messages[3].content, "31");
        assert_eq!(messages[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(messages[3].name.as_deref(), Some("get_weather"));
        assert_eq!(messages[4].content, "And tomorrow?");
        let tools = tools.unwrap();
        assert_eq!(tools[0]["function"]["name"], "get_weather");
        assert_eq!(
            tools[0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert_eq!(template_options["enable_thinking"], json!(true));
    }

    #[test]
    fn tool_choice_decides_which_tools_are_offered() {
        // A server tool beside the client's own is left out.
        let tools = json!([
            {"name": "a", "input_schema": {"type": "object"}},
            {"name": "web_search", "type": "web_search_20250305", "max_uses": 5},
            {"name": "b", "input_schema": {"type": "object"}},
        ]);
        let offered = |choice: Value| -> Option<Vec<String>> {
            let (ask, _) = with(json!({"tools": tools, "tool_choice": choice})).unwrap();
            let Prompt::Chat { tools, .. } = ask.prompt else {
                panic!("not a chat")
            };
            tools.map(|t| {
                t.iter()
                    .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                    .collect()
            })
        };
        assert_eq!(offered(json!({"type": "auto"})).unwrap(), ["a", "b"]);
        assert_eq!(offered(json!({"type": "any"})).unwrap(), ["a", "b"]);
        assert_eq!(
            offered(json!({"type": "tool", "name": "b"})).unwrap(),
            ["b"]
        );
        assert_eq!(offered(json!({"type": "none"})), None);
        // A result marked as an error says so to the model.
        let (ask, _) = with(json!({"messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "a", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": true}]},
        ]}))
        .unwrap();
        let Prompt::Chat { messages, .. } = ask.prompt else {
            panic!("not a chat")
        };
        assert_eq!(messages[1].content, "Error: boom");
    }

    #[test]
    fn what_this_server_cannot_do_is_refused_by_name() {
        let Err(missing) =
            ask(json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}))
        else {
            panic!("no max_tokens passed");
        };
        assert!(
            missing.to_string().contains("max_tokens is required"),
            "{missing}"
        );
        for (body, words) in [
            (json!({"max_tokens": 0}), "max_tokens is 0"),
            (json!({"messages": []}), "messages is empty"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}),
                "does not fetch images",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "document"}]}]}),
                "document block",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]}),
                "missing field `source`",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "hologram"}]}]}),
                "type 'hologram'",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
                "message 0, block 0 (a text block) is malformed",
            ),
            (
                json!({"messages": [{"role": "robot", "content": "hi"}]}),
                "role 'robot'",
            ),
            (
                json!({"tools": [{"name": "f"}]}),
                "tool 'f' has no input_schema",
            ),
            (
                json!({"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "g"}}),
                "'g', which is not among the tools",
            ),
            (
                json!({"tool_choice": {"type": "sometimes"}}),
                "type 'sometimes'",
            ),
            (json!({"thinking": {"type": "deep"}}), "type 'deep'"),
            (
                json!({"output_config": {"format": {"type": "json_schema"}}}),
                "output_format json_schema needs its schema",
            ),
        ] {
            let Err(error) = with(body.clone()) else {
                panic!("{body} passed");
            };
            assert_eq!(error.status().as_u16(), 400, "{body}");
            assert!(error.to_string().contains(words), "{body}: {error}");
        }
        // What newer clients send besides, and Claude's own settings, pass.
        assert!(
            with(json!({
                "output_config": {"effort": "high", "format": null},
                "cache_control": {"type": "ephemeral"},
                "metadata": {"user_id": "u"},
                "thinking": {"type": "adaptive"},
            }))
            .is_ok()
        );
    }

    #[test]
    fn call_ids_read_as_anthropics() {
        let call = ToolCall::new("f", json!({}));
        let id = tool_use_id(&call);
        assert!(id.starts_with("toolu_"), "{id}");
        assert_eq!(id["toolu_".len()..], call.id["call_".len()..]);
        let sent_back = ToolCall {
            id: "toolu_abc".into(),
            ..call
        };
        assert_eq!(tool_use_id(&sent_back), "toolu_abc");
        assert!(new_id("msg_").starts_with("msg_"));
        assert_eq!(
            usage(19, 12, 4),
            json!({"input_tokens": 7, "output_tokens": 4, "cache_read_input_tokens": 12, "cache_creation_input_tokens": 0})
        );
    }

    #[test]
    fn a_stream_opens_a_block_per_part_and_closes_each() {
        let mut encoder = EventEncoder {
            id: "msg_1".into(),
            model: "tiny".into(),
            prompt_tokens: 10,
            cached_tokens: 0,
            open: None,
            blocks: 0,
        };
        let mut out = encoder.prelude();
        out.extend(encoder.delta("", "Hmm", &[]));
        out.extend(encoder.delta("", " ok", &[]));
        out.extend(encoder.delta("", "", &[]));
        out.extend(encoder.delta("Hi", "", &[]));
        out.extend(encoder.delta("", "", &[ToolCall::new("f", json!({"x": 1}))]));
        let out = String::from_utf8(out).unwrap();
        let events: Vec<(&str, Value)> = out
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                let name = name.strip_prefix("event: ").unwrap();
                assert_eq!(data["type"], name);
                (name, data)
            })
            .collect();
        let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
            ]
        );
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 10);
        assert_eq!(events[2].1["content_block"]["type"], "thinking");
        assert_eq!(events[5].1["delta"]["type"], "signature_delta");
        assert_eq!(events[7].1["index"], 1);
        assert_eq!(
            events[8].1["delta"],
            json!({"type": "text_delta", "text": "Hi"})
        );
        assert_eq!(events[10].1["content_block"]["type"], "tool_use");
        assert_eq!(events[10].1["content_block"]["input"], json!({}));
        assert_eq!(
            events[11].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"x\":1}"})
        );
        assert_eq!(events[12].1["index"], 2);
    }
}
