//! What a model says, split once into its parts: reasoning, the answer and
//! tool calls. The stream layer feeds the detokenized text to a
//! [`ReplySplitter`] as it arrives; the app, the CLI and the API read the
//! parts from the engine's events and never parse model text themselves.
//!
//! Each model family marks the parts its own way ([`ReplyFormat`]): a
//! `<think>` block before the answer (Qwen3, DeepSeek-R1), tool calls in
//! `<tool_call>` tags (Qwen, Hermes; JSON, or Qwen3-Coder's and Qwen 3.5's
//! `<function=name><parameter=key>value</parameter></function>`, or GLM's
//! `name<arg_key>key</arg_key><arg_value>value</arg_value>`), after
//! `[TOOL_CALLS]` (Mistral), as a bare JSON object (Llama 3.1 and 3.2),
//! Gemma 4's thought channel and `<|tool_call>call:name{...}<tool_call|>`
//! calls, or gpt-oss's harmony channels. Text that only looks like a tool call
//! (its JSON does not parse) stays in the answer: nothing the model said is
//! lost, and the raw text is kept beside the split.

use std::hash::{BuildHasher, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A function call the model asked for, in the shape OpenAI's chat API and
/// chat templates use: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`. The same type carries a call back to the template in the
/// assistant message of the next turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ToolCall {
    /// Names the call so a tool result (`tool_call_id`) can answer it. The
    /// engine makes one for every call it reads; a client may leave it out.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "specta", specta(optional))]
    pub id: String,
    /// Always `function`: the only kind of tool chat models call.
    #[serde(rename = "type", default)]
    pub kind: ToolCallKind,
    pub function: FunctionCall,
}

/// What kind of tool a [`ToolCall`] calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "lowercase")]
pub enum ToolCallKind {
    #[default]
    Function,
}

/// The function a [`ToolCall`] names and the arguments it passes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct FunctionCall {
    pub name: String,
    /// A JSON object of argument names and values, in the model's order
    /// (OpenAI's wire format sends it as a JSON string; the API converts).
    pub arguments: Value,
}

impl ToolCall {
    /// A call with a fresh id.
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        Self {
            id: new_call_id(),
            kind: ToolCallKind::Function,
            function: FunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }
}

/// `call_` and 24 hex digits, unique in this process and unlikely to repeat
/// across processes (the history and clients keep ids across turns).
fn new_call_id() -> String {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let count = CALLS.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // RandomState's keys are random per process: a cheap source of noise.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(nanos);
    hasher.write_u64(count);
    format!("call_{:016x}{:08x}", hasher.finish(), count as u32)
}

/// One piece of a reply, in the order the model said it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplySegment {
    /// Thinking before (or, in harmony, beside) the answer.
    Reasoning(String),
    /// Text of the answer.
    Answer(String),
    /// A complete, parsed tool call.
    ToolCall(ToolCall),
}

/// Where the reasoning block of a thinking model starts, and its markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkStart {
    /// The model opens `<think>` itself, at the start of its reply (Qwen3).
    /// A reply that starts otherwise has no reasoning.
    ModelOpens,
    /// The prompt already opened it (templates whose generation prompt ends
    /// with `<think>`: DeepSeek-R1, Qwen3 thinking-only models): the reply
    /// is reasoning until `</think>`.
    PromptOpened,
    /// The model opens a thought channel itself, `<|channel>thought` to
    /// `<channel|>`, at the start of its reply (Gemma 4).
    ModelOpensChannel,
}

impl ThinkStart {
    /// The markers that open and close the reasoning block.
    fn markers(self) -> (&'static str, &'static str) {
        match self {
            ThinkStart::ModelOpens | ThinkStart::PromptOpened => (THINK_OPEN, THINK_CLOSE),
            ThinkStart::ModelOpensChannel => (CHANNEL_THOUGHT_OPEN, CHANNEL_CLOSE),
        }
    }
}

pub use crate::family::ToolCallSyntax;
use crate::family::{ReplyStyle, ThinkMarkers};

/// How a model marks reasoning and tool calls in what it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyFormat {
    /// Plain text with an optional `<think>` block first and tool calls in
    /// one syntax. Both `None` means everything is answer.
    Marked {
        think: Option<ThinkStart>,
        tool_calls: Option<ToolCallSyntax>,
    },
    /// gpt-oss's harmony messages: `<|channel|>analysis<|message|>...<|end|>`
    /// is reasoning, the `final` (and a plain `commentary`) channel is the
    /// answer, and a message addressed `to=functions.NAME` is a tool call.
    /// Its markers are special tokens, so the text must be decoded with them.
    Harmony {
        /// Read messages to a function as tool calls (the request offered tools).
        tool_calls: bool,
    },
}

impl ReplyFormat {
    /// Everything the model says is answer.
    pub const PLAIN: ReplyFormat = ReplyFormat::Marked {
        think: None,
        tool_calls: None,
    };

    /// The format of a model's replies, from its chat template's text, the
    /// prompt this request rendered, and where those do not say, its
    /// family's reply style (`crate::family`, by `model_type`). Tool calls
    /// are only read when the request offered tools: a model that was given
    /// none may still answer with JSON, and that JSON is its answer.
    pub fn detect(
        model_type: &str,
        template: Option<&str>,
        prompt: Option<&str>,
        tools_offered: bool,
    ) -> Self {
        let style = crate::family::find(model_type).map_or(ReplyStyle::PLAIN, |f| f.reply);
        let mentions = |needle: &str| template.is_some_and(|t| t.contains(needle));
        if style.harmony || mentions("<|channel|>") {
            return ReplyFormat::Harmony {
                tool_calls: tools_offered,
            };
        }
        // Only the very end of the prompt counts: a `<think>` the user typed
        // earlier must not turn the whole answer into reasoning.
        let prompt_opened = prompt.is_some_and(|p| p.trim_end().ends_with(THINK_OPEN));
        let think = if prompt_opened {
            Some(ThinkStart::PromptOpened)
        } else if mentions(CHANNEL_CLOSE) || style.thinks == Some(ThinkMarkers::Channel) {
            Some(ThinkStart::ModelOpensChannel)
        } else if mentions(THINK_CLOSE) || style.thinks == Some(ThinkMarkers::Tags) {
            Some(ThinkStart::ModelOpens)
        } else {
            None
        };
        let tool_calls = tools_offered.then(|| {
            if mentions(MISTRAL_CALLS) {
                ToolCallSyntax::Mistral
            } else if mentions(GEMMA_CALL_OPEN) {
                ToolCallSyntax::GemmaCall
            } else if mentions(LIST_CALL_OPEN) {
                ToolCallSyntax::PythonList
            } else if mentions(TOOL_CALL_OPEN) {
                ToolCallSyntax::Tagged
            } else if mentions(PYTHON_TAG) {
                ToolCallSyntax::BareJson
            } else {
                style.tool_calls
            }
        });
        ReplyFormat::Marked { think, tool_calls }
    }

    /// Whether the text must be decoded with special tokens for this format
    /// to see its markers.
    pub fn needs_special_tokens(&self) -> bool {
        matches!(
            self,
            ReplyFormat::Harmony { .. }
                | ReplyFormat::Marked {
                    tool_calls: Some(
                        ToolCallSyntax::PythonList
                            | ToolCallSyntax::Mistral
                            | ToolCallSyntax::GemmaCall,
                    ),
                    ..
                }
                | ReplyFormat::Marked {
                    think: Some(ThinkStart::ModelOpensChannel),
                    ..
                }
        )
    }
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_CALL_OPEN: &str = "<tool_call>";
const TOOL_CALL_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const LIST_CALL_OPEN: &str = "<|tool_call_start|>";
const LIST_CALL_CLOSE: &str = "<|tool_call_end|>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
const CHANNEL_THOUGHT_OPEN: &str = "<|channel>thought";
const CHANNEL_CLOSE: &str = "<channel|>";
const GEMMA_CALL_OPEN: &str = "<|tool_call>";
const GEMMA_CALL_CLOSE: &str = "<tool_call|>";
/// Gemma 4's string delimiter in a call's arguments.
const GEMMA_QUOTE: &str = "<|\"|>";

impl ToolCallSyntax {
    /// The markers around a call (or a list of calls), for the syntaxes
    /// that have them.
    fn tags(self) -> Option<(&'static str, &'static str)> {
        match self {
            ToolCallSyntax::Tagged => Some((TOOL_CALL_OPEN, TOOL_CALL_CLOSE)),
            ToolCallSyntax::PythonList => Some((LIST_CALL_OPEN, LIST_CALL_CLOSE)),
            // Nothing closes Mistral's calls: they end with the reply.
            ToolCallSyntax::Mistral => Some((MISTRAL_CALLS, "")),
            ToolCallSyntax::GemmaCall => Some((GEMMA_CALL_OPEN, GEMMA_CALL_CLOSE)),
            ToolCallSyntax::BareJson => None,
        }
    }

    /// The calls between the markers; `None` when the text is not calls.
    fn parse_tagged(self, body: &str, types: &ParameterTypes) -> Option<Vec<ToolCall>> {
        match self {
            ToolCallSyntax::PythonList => python_calls(body),
            ToolCallSyntax::Mistral => mistral_calls(body),
            ToolCallSyntax::GemmaCall => gemma_calls(body),
            _ => parse_call(body, false)
                .or_else(|| xml_function_call(body, types))
                .or_else(|| key_value_call(body, types))
                .map(|call| vec![call]),
        }
    }
}

const HARMONY_START: &str = "<|start|>";
const HARMONY_CHANNEL: &str = "<|channel|>";
const HARMONY_MESSAGE: &str = "<|message|>";
const HARMONY_END: &str = "<|end|>";
const HARMONY_RETURN: &str = "<|return|>";
const HARMONY_CALL: &str = "<|call|>";
/// Markers that end a harmony message body.
const HARMONY_BODY_ENDS: [&str; 5] = [
    HARMONY_END,
    HARMONY_RETURN,
    HARMONY_CALL,
    HARMONY_START,
    HARMONY_CHANNEL,
];

/// What a harmony message body is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HarmonyBody {
    Reasoning,
    Answer,
    /// A call to this tool; the body is its JSON arguments, collected here.
    Call {
        name: String,
        arguments: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Before anything is known: a `<think>` may open (model-opened think).
    Opening,
    /// Inside the reasoning block; `started` once non-blank text went out
    /// (blank lines after `<think>` are dropped).
    Reasoning { started: bool },
    /// The answer; `skip_space` drops the blank lines after `</think>` or a
    /// tool call.
    Answer { skip_space: bool },
    /// Inside a call's markers (`<tool_call>`, `<|tool_call_start|>`);
    /// `space_before` is the whitespace that preceded the marker, given back
    /// if the call does not parse.
    TaggedCall {
        syntax: ToolCallSyntax,
        space_before: String,
    },
    /// The answer starts like a bare JSON call and is held until it is one.
    BareCall,
    /// After a bare JSON call: `;` and blanks, then perhaps another call.
    BetweenBareCalls,
    /// Harmony: before the first header (plain text means no headers at all).
    HarmonyOpening,
    /// Harmony: a header (`<|start|>assistant<|channel|>final`), to `<|message|>`.
    HarmonyHeader,
    /// Harmony: a message body.
    HarmonyBody(HarmonyBody),
}

/// Splits a reply into [`ReplySegment`]s as its text arrives. Text is held
/// back only while it may still be the start of a marker (a `<thi` that may
/// become `<think>`), whitespace next to a marker (dropped with it), or a
/// tool call that is not complete yet.
#[derive(Debug, Clone)]
pub struct ReplySplitter {
    format: ReplyFormat,
    state: State,
    /// Text received and not yet given out.
    pending: String,
    /// Non-blank answer text has gone out (bare JSON calls only start an answer).
    answer_started: bool,
    /// Bare JSON calls can still start here (false once the answer is text).
    bare_calls_possible: bool,
    /// Bytes of text pushed so far.
    received: usize,
    /// Where the reasoning was in the text pushed, markers included (byte
    /// ranges), so the stream can tell which tokens were reasoning.
    reasoning_spans: Vec<Range<usize>>,
    /// The start of a reasoning part not closed yet.
    reasoning_from: Option<usize>,
    /// The offered tools' parameter types, for calls whose values are text.
    parameter_types: ParameterTypes,
}

impl ReplySplitter {
    pub fn new(format: ReplyFormat) -> Self {
        let state = match format {
            ReplyFormat::Marked { think: Some(_), .. } => State::Opening,
            ReplyFormat::Marked { think: None, .. } => State::Answer { skip_space: false },
            ReplyFormat::Harmony { .. } => State::HarmonyOpening,
        };
        Self {
            format,
            state,
            pending: String::new(),
            answer_started: false,
            bare_calls_possible: matches!(
                format,
                ReplyFormat::Marked {
                    tool_calls: Some(ToolCallSyntax::BareJson),
                    ..
                }
            ),
            received: 0,
            reasoning_spans: Vec::new(),
            reasoning_from: None,
            parameter_types: ParameterTypes::default(),
        }
    }

    /// Reads the values of calls written as text (Qwen 3.5's XML
    /// parameters) as the offered tools declare them: a parameter of type
    /// `integer` comes back as a number, not the string `"3"`.
    pub fn with_tools(mut self, tools: &[Value]) -> Self {
        self.parameter_types = ParameterTypes::of_tools(tools);
        self
    }

    pub fn format(&self) -> ReplyFormat {
        self.format
    }

    /// Where the reasoning was in the text pushed so far: byte ranges, with
    /// the markers around it (`<think>`, `</think>`, a harmony header and its
    /// end) counted in, since the tokens that wrote them were part of the
    /// thinking. A part still open reaches to the end of the text.
    pub fn reasoning_spans(&self) -> Vec<Range<usize>> {
        let mut spans = self.reasoning_spans.clone();
        spans.extend(self.reasoning_from.map(|from| from..self.received));
        spans
    }

    /// Bytes of the text pushed that the state machine has gone past: the
    /// next byte it reads is at this offset.
    fn read_upto(&self) -> usize {
        self.received - self.pending.len()
    }

    fn open_reasoning(&mut self, from: usize) {
        self.reasoning_from.get_or_insert(from);
    }

    fn close_reasoning(&mut self, upto: usize) {
        if let Some(from) = self.reasoning_from.take() {
            self.reasoning_spans.push(from..upto);
        }
    }

    /// Adds the next text of the reply; returns what became certain.
    pub fn push(&mut self, text: &str) -> Vec<ReplySegment> {
        self.received += text.len();
        self.pending.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// Ends the reply: everything still held goes out (an unfinished tool
    /// call as answer text).
    pub fn finish(&mut self) -> Vec<ReplySegment> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        out
    }

    /// Moves the state machine once; true if it should run again.
    fn step(&mut self, out: &mut Vec<ReplySegment>, end: bool) -> bool {
        match std::mem::replace(&mut self.state, State::Answer { skip_space: false }) {
            State::Opening => self.opening(end),
            State::Reasoning { started } => self.reasoning(started, out, end),
            State::Answer { skip_space } => self.answer(skip_space, out, end),
            State::TaggedCall {
                syntax,
                space_before,
            } => self.tagged_call(syntax, space_before, out, end),
            State::BareCall => self.bare_call(out, end),
            State::BetweenBareCalls => self.between_bare_calls(end),
            State::HarmonyOpening => self.harmony_opening(end),
            State::HarmonyHeader => self.harmony_header(end),
            State::HarmonyBody(body) => self.harmony_body(body, out, end),
        }
    }

    /// The markers of the reasoning block, for a format that has one.
    fn think_markers(&self) -> (&'static str, &'static str) {
        match self.format {
            ReplyFormat::Marked {
                think: Some(start), ..
            } => start.markers(),
            _ => (THINK_OPEN, THINK_CLOSE),
        }
    }

    fn opening(&mut self, end: bool) -> bool {
        let rest = self.pending.trim_start();
        let prompt_opened = matches!(
            self.format,
            ReplyFormat::Marked {
                think: Some(ThinkStart::PromptOpened),
                ..
            }
        );
        let (open, _) = self.think_markers();
        if let Some(after) = rest.strip_prefix(open) {
            let after = after.to_owned();
            self.open_reasoning(self.read_upto());
            self.pending = after;
            self.state = State::Reasoning { started: false };
            return true;
        }
        if !end && open.starts_with(rest) {
            // Blank so far, or the start of the opening marker: wait.
            self.state = State::Opening;
            return false;
        }
        self.state = if prompt_opened {
            self.open_reasoning(self.read_upto());
            State::Reasoning { started: false }
        } else {
            State::Answer { skip_space: false }
        };
        true
    }

    fn reasoning(&mut self, started: bool, out: &mut Vec<ReplySegment>, end: bool) -> bool {
        let (_, close) = self.think_markers();
        if let Some(at) = self.pending.find(close) {
            let text = self.pending[..at].trim_end();
            let text = if started { text } else { text.trim_start() };
            push_segment(out, ReplySegment::Reasoning(text.to_owned()));
            self.pending.drain(..at + close.len());
            self.close_reasoning(self.read_upto());
            self.state = State::Answer { skip_space: true };
            return true;
        }
        // Hold a possible closing marker and the blanks before it (dropped
        // with it).
        let cut = if end {
            self.pending.trim_end().len()
        } else {
            let cut = self.pending.len() - partial_marker_len(&self.pending, &[close]);
            self.pending[..cut].trim_end().len()
        };
        let text = &self.pending[..cut];
        let skipped = if started {
            0
        } else {
            text.len() - text.trim_start().len()
        };
        let started = started || cut > skipped;
        push_segment(out, ReplySegment::Reasoning(text[skipped..].to_owned()));
        self.pending.drain(..cut);
        if end {
            self.pending.clear();
            self.close_reasoning(self.received);
        }
        self.state = State::Reasoning { started };
        false
    }

    fn answer(&mut self, skip_space: bool, out: &mut Vec<ReplySegment>, end: bool) -> bool {
        if skip_space {
            let blank = self.pending.len() - self.pending.trim_start().len();
            self.pending.drain(..blank);
            if self.pending.is_empty() {
                self.state = State::Answer { skip_space: !end };
                return false;
            }
        }
        self.state = State::Answer { skip_space: false };
        let tool_calls = match self.format {
            ReplyFormat::Marked { tool_calls, .. } => tool_calls,
            ReplyFormat::Harmony { .. } => None,
        };
        match tool_calls {
            Some(
                syntax @ (ToolCallSyntax::Tagged
                | ToolCallSyntax::PythonList
                | ToolCallSyntax::Mistral
                | ToolCallSyntax::GemmaCall),
            ) => {
                let (open, _) = syntax.tags().unwrap_or((TOOL_CALL_OPEN, TOOL_CALL_CLOSE));
                if let Some(at) = self.pending.find(open) {
                    let before = &self.pending[..at];
                    let text = before.trim_end();
                    let space_before = before[text.len()..].to_owned();
                    self.emit_answer(out, text.to_owned());
                    self.pending.drain(..at + open.len());
                    self.state = State::TaggedCall {
                        syntax,
                        space_before,
                    };
                    return true;
                }
                let cut = if end {
                    self.pending.len()
                } else {
                    // Blanks may precede a call (and go with it).
                    let cut = self.pending.len() - partial_marker_len(&self.pending, &[open]);
                    self.pending[..cut].trim_end().len()
                };
                let text: String = self.pending.drain(..cut).collect();
                self.emit_answer(out, text);
                false
            }
            Some(ToolCallSyntax::BareJson) if self.bare_calls_possible && !self.answer_started => {
                let rest = self.pending.trim_start();
                if rest.is_empty() && !end {
                    return false;
                }
                if rest.starts_with('{')
                    || rest.starts_with(PYTHON_TAG)
                    || (!end && !rest.is_empty() && PYTHON_TAG.starts_with(rest))
                {
                    self.state = State::BareCall;
                    return true;
                }
                self.bare_calls_possible = false;
                true
            }
            _ => {
                let text = std::mem::take(&mut self.pending);
                self.emit_answer(out, text);
                false
            }
        }
    }

    fn emit_answer(&mut self, out: &mut Vec<ReplySegment>, text: String) {
        if !text.trim().is_empty() {
            self.answer_started = true;
        }
        push_segment(out, ReplySegment::Answer(text));
    }

    fn tagged_call(
        &mut self,
        syntax: ToolCallSyntax,
        space_before: String,
        out: &mut Vec<ReplySegment>,
        end: bool,
    ) -> bool {
        let (open, close) = syntax.tags().unwrap_or((TOOL_CALL_OPEN, TOOL_CALL_CLOSE));
        // A syntax without a closing marker holds its calls to the end.
        let closed_at = (!close.is_empty())
            .then(|| self.pending.find(close))
            .flatten();
        if let Some(at) = closed_at {
            let body = &self.pending[..at];
            match syntax.parse_tagged(body, &self.parameter_types) {
                Some(calls) => {
                    out.extend(calls.into_iter().map(ReplySegment::ToolCall));
                    self.state = State::Answer { skip_space: true };
                }
                None => {
                    let text = format!("{space_before}{open}{body}{close}");
                    self.emit_answer(out, text);
                    self.state = State::Answer { skip_space: false };
                }
            }
            self.pending.drain(..at + close.len());
            return true;
        }
        if !end {
            self.state = State::TaggedCall {
                syntax,
                space_before,
            };
            return false;
        }
        // The reply ended inside the tags: whole calls still count (the
        // model may stop right after them), anything else is text.
        let body = std::mem::take(&mut self.pending);
        match syntax.parse_tagged(&body, &self.parameter_types) {
            Some(calls) => out.extend(calls.into_iter().map(ReplySegment::ToolCall)),
            None => self.emit_answer(out, format!("{space_before}{open}{body}")),
        }
        self.state = State::Answer { skip_space: false };
        false
    }

    fn bare_call(&mut self, out: &mut Vec<ReplySegment>, end: bool) -> bool {
        let lead = self.pending.len() - self.pending.trim_start().len();
        if !end
            && PYTHON_TAG.len() > self.pending.len() - lead
            && PYTHON_TAG.starts_with(&self.pending[lead..])
        {
            self.state = State::BareCall;
            return false;
        }
        let mut start = lead;
        if let Some(after) = self.pending[lead..].strip_prefix(PYTHON_TAG) {
            start = self.pending.len() - after.trim_start().len();
        }
        let json = &self.pending[start..];
        match bare_call_prefix(json) {
            BarePrefix::Complete(len) => {
                if let Some(call) = parse_call(&json[..len], true) {
                    out.push(ReplySegment::ToolCall(call));
                    self.pending.drain(..start + len);
                    self.state = State::BetweenBareCalls;
                    return true;
                }
            }
            BarePrefix::Possible if !end => {
                self.state = State::BareCall;
                return false;
            }
            _ => {}
        }
        // Not a call after all: the text is the answer, and the rest too.
        self.bare_calls_possible = false;
        self.state = State::Answer { skip_space: false };
        true
    }

    fn between_bare_calls(&mut self, end: bool) -> bool {
        let skip = self.pending.len()
            - self
                .pending
                .trim_start_matches(|c: char| c.is_whitespace() || c == ';')
                .len();
        self.pending.drain(..skip);
        if self.pending.is_empty() && !end {
            self.state = State::BetweenBareCalls;
            return false;
        }
        if self.pending.starts_with('{') || self.pending.starts_with(PYTHON_TAG) {
            self.state = State::BareCall;
        } else {
            self.bare_calls_possible = false;
            self.state = State::Answer { skip_space: false };
        }
        !self.pending.is_empty()
    }

    fn harmony_opening(&mut self, end: bool) -> bool {
        if self.pending.starts_with("<|") {
            self.state = State::HarmonyHeader;
            return true;
        }
        if (self.pending.is_empty() || self.pending == "<") && !end {
            self.state = State::HarmonyOpening;
            return false;
        }
        // No header at all: the model wrote plain text.
        self.state = State::HarmonyBody(HarmonyBody::Answer);
        !self.pending.is_empty()
    }

    fn harmony_header(&mut self, end: bool) -> bool {
        if let Some(at) = self.pending.find(HARMONY_MESSAGE) {
            let body = self.harmony_body_kind(&self.pending[..at]);
            if body == HarmonyBody::Reasoning {
                // The header is still all pending: the part starts with it.
                self.open_reasoning(self.read_upto());
            }
            self.pending.drain(..at + HARMONY_MESSAGE.len());
            self.state = State::HarmonyBody(body);
            return true;
        }
        // A header without a message (the reply was cut) says nothing.
        if end {
            self.pending.clear();
        }
        self.state = State::HarmonyHeader;
        false
    }

    /// What the message after `header` is: `to=NAME` makes it a tool call,
    /// the `analysis` channel reasoning, anything else answer.
    fn harmony_body_kind(&self, header: &str) -> HarmonyBody {
        let word_after = |marker: &str| {
            header.rfind(marker).map(|at| {
                let rest = &header[at + marker.len()..];
                let end = rest
                    .find(|c: char| c.is_whitespace() || c == '<')
                    .unwrap_or(rest.len());
                rest[..end].to_owned()
            })
        };
        let tool_calls = matches!(self.format, ReplyFormat::Harmony { tool_calls: true });
        if let Some(recipient) = word_after("to=").filter(|r| !r.is_empty())
            && tool_calls
        {
            let name = recipient
                .strip_prefix("functions.")
                .unwrap_or(&recipient)
                .to_owned();
            return HarmonyBody::Call {
                name,
                arguments: String::new(),
            };
        }
        match word_after(HARMONY_CHANNEL).as_deref() {
            Some("analysis") => HarmonyBody::Reasoning,
            _ => HarmonyBody::Answer,
        }
    }

    fn harmony_body(
        &mut self,
        mut body: HarmonyBody,
        out: &mut Vec<ReplySegment>,
        end: bool,
    ) -> bool {
        let found = HARMONY_BODY_ENDS
            .iter()
            .filter_map(|m| self.pending.find(m).map(|at| (at, *m)))
            .min();
        let cut = match found {
            Some((at, _)) => at,
            None if end => self.pending.len(),
            None => self.pending.len() - partial_marker_len(&self.pending, &HARMONY_BODY_ENDS),
        };
        let text: String = self.pending.drain(..cut).collect();
        match &mut body {
            HarmonyBody::Reasoning => push_segment(out, ReplySegment::Reasoning(text)),
            HarmonyBody::Answer => self.emit_answer(out, text),
            HarmonyBody::Call { arguments, .. } => arguments.push_str(&text),
        }
        let closed = match found {
            Some((_, marker)) => {
                // `<|start|>` and `<|channel|>` open the next header themselves.
                if matches!(marker, HARMONY_END | HARMONY_RETURN | HARMONY_CALL) {
                    self.pending.drain(..marker.len());
                }
                true
            }
            None => end,
        };
        if !closed {
            self.state = State::HarmonyBody(body);
            return false;
        }
        if body == HarmonyBody::Reasoning {
            self.close_reasoning(self.read_upto());
        }
        if let HarmonyBody::Call { name, arguments } = body {
            match serde_json::from_str::<Value>(arguments.trim()) {
                Ok(args @ Value::Object(_)) => {
                    out.push(ReplySegment::ToolCall(ToolCall::new(name, args)))
                }
                _ => self.emit_answer(out, arguments),
            }
        }
        self.state = State::HarmonyHeader;
        found.is_some()
    }
}

/// Appends text, merging with a segment of the same kind; empty text is dropped.
fn push_segment(out: &mut Vec<ReplySegment>, segment: ReplySegment) {
    match (out.last_mut(), segment) {
        (_, ReplySegment::Reasoning(t) | ReplySegment::Answer(t)) if t.is_empty() => {}
        (Some(ReplySegment::Reasoning(last)), ReplySegment::Reasoning(t)) => last.push_str(&t),
        (Some(ReplySegment::Answer(last)), ReplySegment::Answer(t)) => last.push_str(&t),
        (_, segment) => out.push(segment),
    }
}

/// How many bytes at the end of `text` are the start of one of `markers`
/// (never all of a marker: a whole one would have been found).
fn partial_marker_len(text: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .flat_map(|marker| {
            (1..marker.len().min(text.len() + 1))
                .rev()
                .filter(|&n| marker.is_char_boundary(n) && text.ends_with(&marker[..n]))
                .take(1)
        })
        .max()
        .unwrap_or(0)
}

/// A tool call's JSON: `{"name": ..., "arguments": {...}}` (or `parameters`,
/// Llama's word). Arguments given as a JSON string are read as the object
/// inside. Inside tags, none at all is a call without arguments; a bare
/// object must have them, or any JSON answer with a `name` would be a call.
fn parse_call(text: &str, arguments_required: bool) -> Option<ToolCall> {
    let Value::Object(mut call) = serde_json::from_str::<Value>(text.trim()).ok()? else {
        return None;
    };
    let name = match call.remove("name")? {
        Value::String(name) if !name.trim().is_empty() => name,
        _ => return None,
    };
    let arguments = match call
        .remove("arguments")
        .or_else(|| call.remove("parameters"))
    {
        None if arguments_required => return None,
        None => Value::Object(serde_json::Map::new()),
        Some(args @ Value::Object(_)) => args,
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text).ok()? {
            args @ Value::Object(_) => args,
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(ToolCall::new(name, arguments))
}

/// A call written as Qwen3-Coder's and Qwen 3.5's templates write it,
/// `<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>`:
/// each parameter's value is its text (one newline either side dropped),
/// read as the tool's schema declares it ([`ParameterTypes`]), as mlx-lm's
/// `qwen3_coder` parser reads it. `None` unless the text is one such call.
fn xml_function_call(text: &str, types: &ParameterTypes) -> Option<ToolCall> {
    const PARAMETER_OPEN: &str = "<parameter=";
    const PARAMETER_CLOSE: &str = "</parameter>";
    let inner = text
        .trim()
        .strip_prefix("<function=")?
        .strip_suffix("</function>")?;
    // A name runs to a blank or a bracket, and its `>` closes it.
    let name_of = |text: &str| -> Option<(String, usize)> {
        let start = text.len() - text.trim_start().len();
        let rest = &text[start..];
        let length = rest
            .find(|c: char| c.is_whitespace() || c == '<' || c == '>')
            .unwrap_or(rest.len());
        if length == 0 {
            return None;
        }
        let mut end = start + length;
        if text[end..].starts_with('>') {
            end += 1;
        }
        Some((rest[..length].to_owned(), end))
    };
    let (name, mut at) = name_of(inner)?;
    let mut arguments = serde_json::Map::new();
    while let Some(open) = inner[at..].find(PARAMETER_OPEN) {
        let body_start = at + open + PARAMETER_OPEN.len();
        let close = inner[body_start..].find(PARAMETER_CLOSE)?;
        let body = &inner[body_start..body_start + close];
        at = body_start + close + PARAMETER_CLOSE.len();
        let Some((key, value_start)) = name_of(body) else {
            continue;
        };
        let value = &body[value_start..];
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let value = types.value(&name, &key, value);
        arguments.insert(key, value);
    }
    Some(ToolCall::new(name, Value::Object(arguments)))
}

/// The declared types of the offered tools' parameters (each property's
/// JSON-schema `type`), by tool and parameter name. A call written as text
/// has only strings; these give its values back the type the tool expects,
/// the way mlx-lm's `qwen3_coder` parser converts them.
#[derive(Debug, Clone, Default)]
pub struct ParameterTypes {
    /// Tool name to its parameters' schemas (`parameters.properties`).
    tools: std::collections::HashMap<String, serde_json::Map<String, Value>>,
}

impl ParameterTypes {
    /// The parameters of tools in the chat API's shape, `{"type":
    /// "function", "function": {"name", "parameters": {"properties"}}}`.
    pub fn of_tools(tools: &[Value]) -> Self {
        let tools = tools
            .iter()
            .filter_map(|tool| {
                let function = tool.get("function").unwrap_or(tool);
                let name = function.get("name")?.as_str()?.to_owned();
                let properties = function
                    .pointer("/parameters/properties")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                Some((name, properties))
            })
            .collect();
        Self { tools }
    }

    /// Whether `tool` declares `parameter` a string.
    fn declares_string(&self, tool: &str, parameter: &str) -> bool {
        self.tools
            .get(tool)
            .and_then(|p| p.get(parameter))
            .and_then(|schema| schema.get("type"))
            .is_some_and(|kind| kind == "string")
    }

    /// `text` as the value of `tool`'s `parameter`: `null` is null; a
    /// parameter the schema does not declare stays text; one declared
    /// without a type is JSON when it is an object or an array; numbers,
    /// booleans, objects and arrays are read as such, and text that does not
    /// read as its declared type stays text rather than being lost.
    fn value(&self, tool: &str, parameter: &str, text: &str) -> Value {
        if text.eq_ignore_ascii_case("null") {
            return Value::Null;
        }
        let as_text = || Value::String(text.to_owned());
        let Some(schema) = self.tools.get(tool).and_then(|p| p.get(parameter)) else {
            return as_text();
        };
        let declared = match schema.get("type") {
            Some(Value::String(name)) => Some(name.trim().to_ascii_lowercase()),
            // `["integer", "null"]`: the type besides null.
            Some(Value::Array(names)) => names
                .iter()
                .filter_map(Value::as_str)
                .find(|name| *name != "null")
                .map(str::to_ascii_lowercase),
            _ => None,
        };
        let Some(kind) = declared else {
            return match serde_json::from_str::<Value>(text) {
                Ok(value @ (Value::Object(_) | Value::Array(_))) => value,
                _ => as_text(),
            };
        };
        let kind = kind.as_str();
        let number = || text.trim().parse::<f64>().ok().filter(|n| n.is_finite());
        let whole = |n: f64| (n.fract() == 0.0 && n.abs() < 9.0e15).then_some(n as i64);
        if matches!(
            kind,
            "string" | "str" | "text" | "varchar" | "char" | "enum"
        ) {
            as_text()
        } else if ["int", "uint", "long", "short", "unsigned"]
            .iter()
            .any(|p| kind.starts_with(p))
        {
            number().and_then(whole).map_or_else(as_text, Value::from)
        } else if kind.starts_with("num") || kind.starts_with("float") {
            number().map_or_else(as_text, |n| whole(n).map_or(Value::from(n), Value::from))
        } else if matches!(kind, "boolean" | "bool" | "binary") {
            Value::Bool(text.trim().eq_ignore_ascii_case("true"))
        } else {
            serde_json::from_str(text)
                .ok()
                .or_else(|| {
                    let mut reader = PythonLiteral {
                        text: text.trim(),
                        at: 0,
                    };
                    reader.value().filter(|_| reader.rest().trim().is_empty())
                })
                .unwrap_or_else(as_text)
        }
    }
}

/// Mistral's calls, the text after the first `[TOOL_CALLS]`: each call
/// `name[ARGS]{json}` (a `[CALL_ID]id` may precede `[ARGS]`), further
/// `[TOOL_CALLS]` markers between them, or one JSON list of `{"name",
/// "arguments"}` objects (arguments also as a JSON string). `None` unless
/// all of the text is such calls, so a reply cut short stays text.
fn mistral_calls(text: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for part in text.split(MISTRAL_CALLS) {
        let mut rest = part.trim();
        if rest.starts_with('[') {
            calls.extend(listed_calls(rest)?);
            continue;
        }
        while !rest.is_empty() {
            let header_end = rest.find(MISTRAL_ARGS)?;
            let header = &rest[..header_end];
            let (name, id) = match header.split_once(MISTRAL_CALL_ID) {
                Some((name, id)) => (name.trim(), Some(id.trim())),
                None => (header.trim(), None),
            };
            let not_a_name = |c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if name.is_empty() || name.contains(not_a_name) {
                return None;
            }
            let json = &rest[header_end + MISTRAL_ARGS.len()..];
            let mut values = serde_json::Deserializer::from_str(json).into_iter::<Value>();
            let arguments = match values.next()? {
                Ok(arguments @ Value::Object(_)) => arguments,
                _ => return None,
            };
            let mut call = ToolCall::new(name, arguments);
            if let Some(id) = id.filter(|id| !id.is_empty()) {
                call.id = id.to_owned();
            }
            calls.push(call);
            rest = json[values.byte_offset()..].trim_start();
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// `[{"name": ..., "arguments": {...}}, ...]` as calls (the arguments may
/// be a JSON string of an object); `None` unless every item is a call.
fn listed_calls(text: &str) -> Option<Vec<ToolCall>> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) else {
        return None;
    };
    items
        .into_iter()
        .map(|item| {
            let name = item.get("name")?.as_str()?;
            let arguments = match item.get("arguments") {
                None => Value::Object(Default::default()),
                Some(Value::String(text)) => serde_json::from_str(text).ok()?,
                Some(arguments) => arguments.clone(),
            };
            if !arguments.is_object() {
                return None;
            }
            let mut call = ToolCall::new(name, arguments);
            if let Some(id) = item.get("id").and_then(Value::as_str) {
                call.id = id.to_owned();
            }
            Some(call)
        })
        .collect()
}

/// A call written as GLM-4.5's template writes it,
/// `get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n`:
/// the name, then each argument's key and value in tags (a call without
/// arguments is its name alone). A value the tool declares a string is its
/// text; any other is read as JSON, else as a Python literal, else as its
/// text, as mlx-lm's `glm47` parser reads them. `None` unless the text is
/// one such call.
fn key_value_call(text: &str, types: &ParameterTypes) -> Option<ToolCall> {
    const KEY_OPEN: &str = "<arg_key>";
    const KEY_CLOSE: &str = "</arg_key>";
    const VALUE_OPEN: &str = "<arg_value>";
    const VALUE_CLOSE: &str = "</arg_value>";
    let text = text.trim();
    let (name, mut rest) = match text.find(KEY_OPEN) {
        Some(at) => (text[..at].trim(), &text[at..]),
        None => (text, ""),
    };
    let not_a_name = |c: char| c.is_whitespace() || matches!(c, '<' | '>' | '{' | '}');
    if name.is_empty() || name.contains(not_a_name) {
        return None;
    }
    let mut arguments = serde_json::Map::new();
    while !rest.is_empty() {
        let key_text = rest.strip_prefix(KEY_OPEN)?;
        let key_end = key_text.find(KEY_CLOSE)?;
        let value_text = key_text[key_end + KEY_CLOSE.len()..]
            .trim_start()
            .strip_prefix(VALUE_OPEN)?;
        let value_end = value_text.find(VALUE_CLOSE)?;
        let key = key_text[..key_end].trim();
        let value = value_text[..value_end].trim();
        let value = if types.declares_string(name, key) {
            Value::String(value.to_owned())
        } else {
            loose_value(value)
        };
        arguments.insert(key.to_owned(), value);
        rest = value_text[value_end + VALUE_CLOSE.len()..].trim_start();
    }
    Some(ToolCall::new(name, Value::Object(arguments)))
}

/// `text` as JSON, else as one Python literal, else as a string.
fn loose_value(text: &str) -> Value {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return value;
    }
    let mut reader = PythonLiteral { text, at: 0 };
    match reader.value() {
        Some(value) if reader.rest().trim().is_empty() => value,
        _ => Value::String(text.to_owned()),
    }
}

/// A Python-style list of calls with keyword arguments, `[get_weather(
/// city="Paris", days=2), ...]` (the brackets may be left out), as tool
/// calls whose arguments are the keywords as JSON; `None` unless the whole
/// text is such calls.
fn python_calls(text: &str) -> Option<Vec<ToolCall>> {
    let mut reader = PythonLiteral {
        text: text.trim(),
        at: 0,
    };
    let bracketed = reader.eat('[');
    let mut calls = Vec::new();
    loop {
        reader.skip_space();
        if (bracketed && reader.eat(']')) || (!bracketed && reader.rest().is_empty()) {
            break;
        }
        if !calls.is_empty() && !reader.eat(',') {
            return None;
        }
        reader.skip_space();
        let name = reader.identifier()?;
        reader.skip_space();
        if !reader.eat('(') {
            return None;
        }
        let mut arguments = serde_json::Map::new();
        loop {
            reader.skip_space();
            if reader.eat(')') {
                break;
            }
            if !arguments.is_empty() && !reader.eat(',') {
                return None;
            }
            reader.skip_space();
            if reader.eat(')') {
                break;
            }
            let key = reader.identifier()?;
            reader.skip_space();
            if !reader.eat('=') {
                return None;
            }
            let value = reader.value()?;
            arguments.insert(key, value);
        }
        calls.push(ToolCall::new(name, Value::Object(arguments)));
    }
    reader.skip_space();
    (reader.rest().is_empty() && !calls.is_empty()).then_some(calls)
}

/// Gemma 4's calls, `call:get_weather{city:<|"|>Paris<|"|>,days:2}` (one
/// or more, blanks between): bare keys, strings between `<|"|>`, other
/// values as JSON writes them, as mlx-lm's `gemma4` parser reads them.
/// `None` unless the whole text is such calls.
fn gemma_calls(text: &str) -> Option<Vec<ToolCall>> {
    let mut reader = GemmaLiteral {
        text: text.trim(),
        at: 0,
    };
    let mut calls = Vec::new();
    loop {
        reader.skip_space();
        if reader.rest().is_empty() {
            break;
        }
        if !reader.eat("call:") {
            return None;
        }
        let name = reader.name()?;
        let arguments = reader.object()?;
        calls.push(ToolCall::new(name, Value::Object(arguments)));
    }
    (!calls.is_empty()).then_some(calls)
}

/// Reads Gemma 4's argument values as JSON values.
struct GemmaLiteral<'a> {
    text: &'a str,
    at: usize,
}

impl GemmaLiteral<'_> {
    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, marker: &str) -> bool {
        if self.rest().starts_with(marker) {
            self.at += marker.len();
            true
        } else {
            false
        }
    }

    /// A name or a bare key: letters, digits, `_` and `-`.
    fn name(&mut self) -> Option<String> {
        let rest = self.rest();
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-')))
            .unwrap_or(rest.len());
        let name = rest[..len].to_owned();
        self.at += len;
        (!name.is_empty()).then_some(name)
    }

    /// Text between two `<|"|>`, as it is.
    fn string(&mut self) -> Option<String> {
        if !self.eat(GEMMA_QUOTE) {
            return None;
        }
        let len = self.rest().find(GEMMA_QUOTE)?;
        let text = self.rest()[..len].to_owned();
        self.at += len + GEMMA_QUOTE.len();
        Some(text)
    }

    /// `{key:value,...}`.
    fn object(&mut self) -> Option<serde_json::Map<String, Value>> {
        self.skip_space();
        if !self.eat("{") {
            return None;
        }
        let mut map = serde_json::Map::new();
        loop {
            self.skip_space();
            if self.eat("}") {
                return Some(map);
            }
            if !map.is_empty() {
                if !self.eat(",") {
                    return None;
                }
                self.skip_space();
            }
            let key = if self.rest().starts_with(GEMMA_QUOTE) {
                self.string()?
            } else {
                self.name()?
            };
            self.skip_space();
            if !self.eat(":") {
                return None;
            }
            let value = self.value()?;
            map.insert(key, value);
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.skip_space();
        if self.rest().starts_with(GEMMA_QUOTE) {
            return self.string().map(Value::String);
        }
        if self.rest().starts_with('{') {
            return self.object().map(Value::Object);
        }
        if self.eat("[") {
            let mut list = Vec::new();
            loop {
                self.skip_space();
                if self.eat("]") {
                    return Some(Value::Array(list));
                }
                if !list.is_empty() && !self.eat(",") {
                    return None;
                }
                list.push(self.value()?);
            }
        }
        let rest = self.rest();
        let len = rest
            .find(|c: char| matches!(c, ',' | '}' | ']') || c.is_whitespace())
            .unwrap_or(rest.len());
        let word = rest[..len].to_owned();
        self.at += len;
        match word.as_str() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            "null" => Some(Value::Null),
            _ => serde_json::from_str::<serde_json::Number>(&word)
                .ok()
                .map(Value::Number),
        }
    }
}

/// Reads Python literals (strings, numbers, True/False/None, lists, tuples,
/// dicts) as JSON values.
struct PythonLiteral<'a> {
    text: &'a str,
    at: usize,
}

impl PythonLiteral<'_> {
    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, c: char) -> bool {
        if self.rest().starts_with(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }

    /// A name: letters, digits, `_`, `.` and `-` (tool names use them).
    fn identifier(&mut self) -> Option<String> {
        let rest = self.rest();
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '-')))
            .unwrap_or(rest.len());
        let name = rest[..len].to_owned();
        self.at += len;
        (!name.is_empty()).then_some(name)
    }

    /// Items up to `close`, separated by commas (a trailing one allowed),
    /// each read by `item`.
    fn items(&mut self, close: char, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        let mut first = true;
        loop {
            self.skip_space();
            if self.eat(close) {
                return Some(());
            }
            if !first {
                if !self.eat(',') {
                    return None;
                }
                self.skip_space();
                if self.eat(close) {
                    return Some(());
                }
            }
            first = false;
            item(self)?;
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.skip_space();
        let first = self.rest().chars().next()?;
        match first {
            '"' | '\'' => self.string(first).map(Value::String),
            '[' | '(' => {
                self.at += 1;
                let close = if first == '[' { ']' } else { ')' };
                let mut list = Vec::new();
                self.items(close, |reader| {
                    list.push(reader.value()?);
                    Some(())
                })?;
                Some(Value::Array(list))
            }
            '{' => {
                self.at += 1;
                let mut map = serde_json::Map::new();
                self.items('}', |reader| {
                    let key = match reader.value()? {
                        Value::String(key) => key,
                        other => other.to_string(),
                    };
                    reader.skip_space();
                    if !reader.eat(':') {
                        return None;
                    }
                    map.insert(key, reader.value()?);
                    Some(())
                })?;
                Some(Value::Object(map))
            }
            _ => {
                let rest = self.rest();
                let len = rest
                    .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '+')))
                    .unwrap_or(rest.len());
                let word = rest[..len].to_owned();
                self.at += len;
                match word.as_str() {
                    "True" | "true" => Some(Value::Bool(true)),
                    "False" | "false" => Some(Value::Bool(false)),
                    "None" | "null" => Some(Value::Null),
                    _ => serde_json::from_str::<serde_json::Number>(&word)
                        .ok()
                        .map(Value::Number),
                }
            }
        }
    }

    /// A quoted string with Python's common escapes.
    fn string(&mut self, quote: char) -> Option<String> {
        self.at += quote.len_utf8();
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    let (_, escaped) = chars.next()?;
                    out.push(match escaped {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        other => other,
                    });
                }
                c if c == quote => {
                    self.at += i + c.len_utf8();
                    return Some(out);
                }
                c => out.push(c),
            }
        }
        None
    }
}

/// How far text is from being a bare JSON tool call.
#[derive(Debug, PartialEq, Eq)]
enum BarePrefix {
    /// A whole JSON object ends at this byte.
    Complete(usize),
    /// It may still become one.
    Possible,
    /// It cannot.
    Impossible,
}

/// Reads `text` as the start of a JSON object whose first key is `name` or
/// `type` (what Llama writes), up to the brace that closes it.
fn bare_call_prefix(text: &str) -> BarePrefix {
    let Some(inner) = text.strip_prefix('{') else {
        return if text.is_empty() {
            BarePrefix::Possible
        } else {
            BarePrefix::Impossible
        };
    };
    let key = inner.trim_start();
    let first_key_fits = ["\"name\"", "\"type\""]
        .iter()
        .any(|k| k.starts_with(key) || key.starts_with(k));
    if !first_key_fits {
        return BarePrefix::Impossible;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (at, c) in text.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return BarePrefix::Complete(at + 1);
                }
            }
            _ => {}
        }
    }
    BarePrefix::Possible
}

/// Splits a whole reply at once (for callers that have all the text).
pub fn split_reply(format: ReplyFormat, text: &str) -> Vec<ReplySegment> {
    let mut splitter = ReplySplitter::new(format);
    let mut segments = splitter.push(text);
    for segment in splitter.finish() {
        push_segment(&mut segments, segment);
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const THINK: ReplyFormat = ReplyFormat::Marked {
        think: Some(ThinkStart::ModelOpens),
        tool_calls: None,
    };
    const THINK_OPENED: ReplyFormat = ReplyFormat::Marked {
        think: Some(ThinkStart::PromptOpened),
        tool_calls: None,
    };
    const QWEN_TOOLS: ReplyFormat = ReplyFormat::Marked {
        think: Some(ThinkStart::ModelOpens),
        tool_calls: Some(ToolCallSyntax::Tagged),
    };
    const LLAMA_TOOLS: ReplyFormat = ReplyFormat::Marked {
        think: None,
        tool_calls: Some(ToolCallSyntax::BareJson),
    };
    const HARMONY: ReplyFormat = ReplyFormat::Harmony { tool_calls: true };

    fn reasoning(text: &str) -> ReplySegment {
        ReplySegment::Reasoning(text.to_owned())
    }

    fn answer(text: &str) -> ReplySegment {
        ReplySegment::Answer(text.to_owned())
    }

    /// A call as the splitter gives it, minus the id it makes up.
    fn call(name: &str, arguments: Value) -> ReplySegment {
        ReplySegment::ToolCall(ToolCall {
            id: String::new(),
            ..ToolCall::new(name, arguments)
        })
    }

    /// Segments merged as a client would join them, ids blanked; also checks
    /// every call has an id.
    fn normalised(segments: Vec<ReplySegment>) -> Vec<ReplySegment> {
        let mut out = Vec::new();
        for segment in segments {
            match segment {
                ReplySegment::ToolCall(mut call) => {
                    assert!(call.id.starts_with("call_"), "{call:?}");
                    call.id.clear();
                    out.push(ReplySegment::ToolCall(call));
                }
                text => push_segment(&mut out, text),
            }
        }
        out
    }

    /// Splits `text` fed whole, in two pieces at every byte position that is
    /// a character boundary, and one character at a time; all must agree
    /// with `expected`.
    /// The reasoning spans also agree however the text was cut.
    fn check(format: ReplyFormat, text: &str, expected: &[ReplySegment]) {
        assert_eq!(
            normalised(split_reply(format, text)),
            expected,
            "whole text {text:?}"
        );
        let mut whole = ReplySplitter::new(format);
        whole.push(text);
        whole.finish();
        let spans = whole.reasoning_spans();
        for at in (0..=text.len()).filter(|&at| text.is_char_boundary(at)) {
            let mut splitter = ReplySplitter::new(format);
            let mut segments = splitter.push(&text[..at]);
            segments.extend(splitter.push(&text[at..]));
            segments.extend(splitter.finish());
            assert_eq!(
                normalised(segments),
                expected,
                "split into {:?} + {:?}",
                &text[..at],
                &text[at..]
            );
            assert_eq!(
                splitter.reasoning_spans(),
                spans,
                "reasoning spans when split into {:?} + {:?}",
                &text[..at],
                &text[at..]
            );
        }
        let mut splitter = ReplySplitter::new(format);
        let mut segments = Vec::new();
        for c in text.chars() {
            segments.extend(splitter.push(c.encode_utf8(&mut [0; 4])));
        }
        segments.extend(splitter.finish());
        assert_eq!(normalised(segments), expected, "one character at a time");
        assert_eq!(splitter.reasoning_spans(), spans, "one character at a time");
    }

    /// The text of each reasoning span of a whole reply.
    fn reasoning_texts(format: ReplyFormat, text: &str) -> Vec<&str> {
        let mut splitter = ReplySplitter::new(format);
        splitter.push(text);
        splitter.finish();
        splitter
            .reasoning_spans()
            .into_iter()
            .map(|span| &text[span])
            .collect()
    }

    #[test]
    fn qwen3_reasoning_then_answer() {
        check(
            THINK,
            "<think>\nThe user greets me.\nBe brief.\n</think>\n\nHello! 온도 is 31°C.",
            &[
                reasoning("The user greets me.\nBe brief."),
                answer("Hello! 온도 is 31°C."),
            ],
        );
    }

    #[test]
    fn a_think_model_that_does_not_think_answers_plainly() {
        check(
            THINK,
            "Plain answer, and <think>this</think> is answer text too.",
            &[answer(
                "Plain answer, and <think>this</think> is answer text too.",
            )],
        );
        // Qwen3 with enable_thinking=false: the template closed an empty
        // block itself, so the reply is all answer.
        check(
            THINK,
            "\n\n<b>bold</b> answer\n",
            &[answer("\n\n<b>bold</b> answer\n")],
        );
    }

    #[test]
    fn reasoning_opened_by_the_prompt_lasts_until_the_closing_tag() {
        check(
            THINK_OPENED,
            "Let me add: 2+2=4.\n</think>\n\nThe sum is **4**.",
            &[reasoning("Let me add: 2+2=4."), answer("The sum is **4**.")],
        );
        // Some models open the block again.
        check(
            THINK_OPENED,
            "<think>\nhmm\n</think>\nok",
            &[reasoning("hmm"), answer("ok")],
        );
        // Cut off while thinking: all of it is reasoning.
        check(
            THINK_OPENED,
            "Still thinking about </thi",
            &[reasoning("Still thinking about </thi")],
        );
    }

    #[test]
    fn qwen_tool_calls_after_reasoning() {
        check(
            QWEN_TOOLS,
            "<think>\nI need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
            &[
                reasoning("I need the weather."),
                call("get_weather", json!({"city": "Paris", "unit": "celsius"})),
            ],
        );
    }

    #[test]
    fn qwen3_5_calls_tools_as_functions_with_parameters_in_tags() {
        let format = ReplyFormat::detect("qwen3_5", None, None, true);
        assert_eq!(format, QWEN_TOOLS);
        check(
            format,
            "<think>\nI need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n<parameter=unit>\nnull\n</parameter>\n</function>\n</tool_call>",
            &[
                reasoning("I need the weather."),
                call(
                    "get_weather",
                    json!({"city": "Paris", "note": "line one\nline two", "unit": null}),
                ),
            ],
        );
        // Text that is neither JSON nor a function stays in the answer.
        check(
            format,
            "<tool_call>\n<function>oops</function>\n</tool_call>",
            &[answer(
                "<tool_call>\n<function>oops</function>\n</tool_call>",
            )],
        );
    }

    #[test]
    fn mistral_calls_run_from_their_marker_to_the_end_of_the_reply() {
        let format = ReplyFormat::detect("ministral3", None, None, true);
        assert!(
            format.needs_special_tokens(),
            "[TOOL_CALLS] is a control token"
        );
        check(
            format,
            "Let me check. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
            &[
                answer("Let me check."),
                call("get_weather", json!({"city": "Paris"})),
                call("get_time", json!({})),
            ],
        );
        // Two calls after one marker, and the older JSON list.
        check(
            format,
            "[TOOL_CALLS]a[ARGS]{\"x\": 1} b[ARGS]{\"y\": [2]}",
            &[call("a", json!({"x": 1})), call("b", json!({"y": [2]}))],
        );
        // The model's own call id is kept: its template wants it back.
        let with_id = split_reply(format, "[TOOL_CALLS]b[CALL_ID]abc123def[ARGS]{\"y\": 2}");
        let [ReplySegment::ToolCall(call_b)] = &with_id[..] else {
            panic!("{with_id:?}")
        };
        assert_eq!(
            (call_b.id.as_str(), &call_b.function.arguments),
            ("abc123def", &json!({"y": 2}))
        );
        check(
            format,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}]",
            &[call("get_weather", json!({"city": "Rome"}))],
        );
        // A reply cut off inside the arguments is kept as text.
        let cut = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Par";
        check(format, cut, &[answer(cut)]);
        // Mistral's template names the syntax whatever the family says.
        assert_eq!(
            ReplyFormat::detect("llama", Some("{{ '[TOOL_CALLS]' }}"), None, true),
            ReplyFormat::Marked {
                think: None,
                tool_calls: Some(ToolCallSyntax::Mistral)
            }
        );
    }

    /// XML parameters are text; the offered tool's schema says what each
    /// value is, as mlx-lm's `qwen3_coder` parser reads them.
    #[test]
    fn xml_parameters_take_the_types_the_tool_declares() {
        let tool = json!({"type": "function", "function": {"name": "plan", "parameters": {
            "type": "object",
            "properties": {
                "days": {"type": "integer"}, "budget": {"type": "number"},
                "ratio": {"type": "number"}, "hotel": {"type": "boolean"},
                "stops": {"type": "array"}, "prefs": {"type": "object"},
                "city": {"type": "string"}, "zip": {"type": "string"},
                "maybe": {"type": ["integer", "null"]}, "loose": {},
                "count": {"type": "integer"}
            }
        }}});
        let text = "<tool_call>\n<function=plan>\n\
            <parameter=days>\n3\n</parameter>\n<parameter=budget>\n1500.0\n</parameter>\n\
            <parameter=ratio>\n0.25\n</parameter>\n<parameter=hotel>\nTrue\n</parameter>\n\
            <parameter=stops>\n[\"Lyon\", \"Nice\"]\n</parameter>\n\
            <parameter=prefs>\n{'view': 'sea'}\n</parameter>\n\
            <parameter=city>\n42\n</parameter>\n<parameter=zip>\nnull\n</parameter>\n\
            <parameter=maybe>\n7\n</parameter>\n<parameter=loose>\n{\"a\": 1}\n</parameter>\n\
            <parameter=count>\nmany\n</parameter>\n<parameter=extra>\n5\n</parameter>\n\
            </function>\n</tool_call>";
        let format = ReplyFormat::detect("qwen3_5", None, None, true);
        let mut splitter = ReplySplitter::new(format).with_tools(&[tool]);
        let mut segments = splitter.push(text);
        segments.extend(splitter.finish());
        let expected = json!({
            "days": 3, "budget": 1500, "ratio": 0.25, "hotel": true,
            "stops": ["Lyon", "Nice"], "prefs": {"view": "sea"},
            "city": "42", "zip": null, "maybe": 7, "loose": {"a": 1},
            // Not a whole number, and not declared: kept as written.
            "count": "many", "extra": "5"
        });
        assert_eq!(normalised(segments), vec![call("plan", expected)]);
        // Without the tools, every value is its text.
        let plain = split_reply(format, text);
        let ReplySegment::ToolCall(call) = &plain[0] else {
            panic!("{plain:?}")
        };
        assert_eq!(call.function.arguments["days"], json!("3"));
    }

    #[test]
    fn glm_calls_tools_by_name_with_keys_and_values_in_tags() {
        let format = ReplyFormat::detect("glm4_moe", None, None, true);
        assert_eq!(format, QWEN_TOOLS);
        check(
            format,
            "<think>The user wants the weather.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>units</arg_key>\n<arg_value>['C', 'F']</arg_value>\n<arg_key>note</arg_key>\n<arg_value>{\"rain\": true}</arg_value>\n</tool_call><tool_call>now\n</tool_call>",
            &[
                reasoning("The user wants the weather."),
                call(
                    "get_weather",
                    json!({"city": "Paris", "days": 2, "units": ["C", "F"], "note": {"rain": true}}),
                ),
                call("now", json!({})),
            ],
        );
        // A parameter the tool declares a string stays text.
        let tool = json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let mut splitter = ReplySplitter::new(format).with_tools(&[tool]);
        let mut segments = splitter
            .push("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>1984</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>");
        segments.extend(splitter.finish());
        assert_eq!(
            normalised(segments),
            vec![call("get_weather", json!({"city": "1984", "days": 2}))]
        );
        // GLM's template says which syntax, whatever the family.
        let template = "{%- if tools %}<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value></tool_call>{%- endif %}</think>";
        assert_eq!(
            ReplyFormat::detect("llama", Some(template), None, true),
            QWEN_TOOLS
        );
        // A name with a blank in it, or a key without its value, is text.
        for text in [
            "<tool_call>get the weather</tool_call>",
            "<tool_call>f<arg_key>city</arg_key>Paris</tool_call>",
        ] {
            check(format, text, &[answer(text)]);
        }
    }

    #[test]
    fn smollm3_reasons_in_a_block_it_opens_and_calls_tools_in_tags() {
        // No template text to go by: the family's style decides.
        let thinking = ReplyFormat::detect("smollm3", None, Some("<|im_start|>assistant\n"), true);
        assert_eq!(thinking, QWEN_TOOLS);
        check(
            thinking,
            "<think>\nThe user wants Paris.\n</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            &[
                reasoning("The user wants Paris."),
                call("get_weather", json!({"city": "Paris"})),
            ],
        );
        // `/no_think`: the prompt closes an empty block, and the reply is
        // the answer.
        let direct = ReplyFormat::detect(
            "smollm3",
            None,
            Some("<|im_start|>assistant\n<think>\n\n</think>\n"),
            false,
        );
        check(direct, "Sunny in Paris.", &[answer("Sunny in Paris.")]);
    }

    #[test]
    fn several_tagged_calls_after_some_answer_text() {
        check(
            QWEN_TOOLS,
            "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": [1, {\\\"y\\\": \\\"}\\\"}]}\"}\n</tool_call>",
            &[
                answer("Let me check both."),
                call("a", json!({})),
                call("b", json!({"x": [1, {"y": "}"}]})),
            ],
        );
    }

    #[test]
    fn a_tool_call_that_does_not_parse_stays_answer_text() {
        let text =
            "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}}\n</tool_call>\nDone.";
        check(QWEN_TOOLS, text, &[answer(text)]);
        let no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
        check(QWEN_TOOLS, no_name, &[answer(no_name)]);
        // Cut off inside the call.
        let cut = "Checking <tool_call>\n{\"name\": \"get_weather\", \"argu";
        check(QWEN_TOOLS, cut, &[answer(cut)]);
    }

    #[test]
    fn a_whole_call_without_its_closing_tag_still_counts() {
        check(
            QWEN_TOOLS,
            "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n",
            &[call("now", json!({}))],
        );
    }

    const LFM2_TOOLS: ReplyFormat = ReplyFormat::Marked {
        think: None,
        tool_calls: Some(ToolCallSyntax::PythonList),
    };

    #[test]
    fn lfm2_python_list_calls() {
        check(
            LFM2_TOOLS,
            "Checking.<|tool_call_start|>[get_weather(city=\"Paris, France\", days=2), \
             get_time(zone='UTC', exact=True, hours=[1, 2.5], where={'a': None}, )]\
             <|tool_call_end|>",
            &[
                answer("Checking."),
                call("get_weather", json!({"city": "Paris, France", "days": 2})),
                call(
                    "get_time",
                    json!({"zone": "UTC", "exact": true, "hours": [1, 2.5], "where": {"a": null}}),
                ),
            ],
        );
        check(
            LFM2_TOOLS,
            "<|tool_call_start|>[now()]<|tool_call_end|>",
            &[call("now", json!({}))],
        );
        // Quotes and brackets inside strings are text; a body that is not
        // calls stays answer text.
        check(
            LFM2_TOOLS,
            "<|tool_call_start|>[say(text=\"a) \\\"b\\\" ]\")]<|tool_call_end|>",
            &[call("say", json!({"text": "a) \"b\" ]"}))],
        );
        let broken = "<|tool_call_start|>[say(text=)]<|tool_call_end|>";
        check(LFM2_TOOLS, broken, &[answer(broken)]);
        assert_eq!(
            ReplyFormat::detect("lfm2", None, None, true),
            LFM2_TOOLS,
            "LFM2's family says so where the template does not"
        );
        assert_eq!(
            ReplyFormat::detect("llama", Some("{{ '<|tool_call_start|>' }}"), None, true),
            LFM2_TOOLS,
            "a template that writes the markers says so"
        );
    }

    #[test]
    fn tool_tags_are_text_when_no_tools_were_offered() {
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
        check(THINK, text, &[answer(text)]);
        check(ReplyFormat::PLAIN, text, &[answer(text)]);
    }

    #[test]
    fn llama_json_calls() {
        check(
            LLAMA_TOOLS,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}",
            &[call("get_weather", json!({"city": "Paris", "days": 2}))],
        );
        check(
            LLAMA_TOOLS,
            "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"{x}\"}}; {\"type\": \"function\", \"name\": \"time\", \"parameters\": {}}",
            &[call("search", json!({"q": "{x}"})), call("time", json!({}))],
        );
    }

    #[test]
    fn llama_answers_that_are_not_calls_are_answers() {
        for text in [
            "The weather is fine.",
            "{\"answer\": 42}",
            "{\"name\": \"Ada\", \"age\": 36} is a JSON object.",
            "{\"name\": \"Ada\"",
            "{ not json at all }",
            "  <|python_ta",
        ] {
            check(LLAMA_TOOLS, text, &[answer(text)]);
        }
        // A call must be the start of the answer.
        let later = "Call it like {\"name\": \"f\", \"parameters\": {}}";
        check(LLAMA_TOOLS, later, &[answer(later)]);
    }

    #[test]
    fn harmony_channels_and_calls() {
        check(
            HARMONY,
            "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.",
            &[reasoning("User asks 2+2. Easy."), answer("2 + 2 = 4.")],
        );
        // The reply of a call ends at <|call|>, an EOS token the engine
        // stops on, so the text ends with the arguments.
        check(
            HARMONY,
            "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
            &[
                reasoning("Need the weather."),
                call("get_weather", json!({"city": "Paris"})),
            ],
        );
        check(HARMONY, "No markers here.", &[answer("No markers here.")]);
        // Arguments that do not parse are shown rather than lost.
        check(
            HARMONY,
            "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{broken<|call|>",
            &[answer("{broken")],
        );
    }

    #[test]
    fn reasoning_spans_cover_the_thinking_with_its_markers() {
        assert_eq!(
            reasoning_texts(THINK, "\n<think>\nHm.\n</think>\n\nYes."),
            ["\n<think>\nHm.\n</think>"]
        );
        assert_eq!(
            reasoning_texts(THINK_OPENED, "Hm, 2+2.\n</think>4"),
            ["Hm, 2+2.\n</think>"]
        );
        // Cut off while thinking: the whole reply.
        assert_eq!(
            reasoning_texts(THINK_OPENED, "Still </thi"),
            ["Still </thi"]
        );
        assert!(reasoning_texts(THINK, "No thinking <think>here</think>").is_empty());
        assert!(reasoning_texts(ReplyFormat::PLAIN, "<think>x</think>").is_empty());
        assert_eq!(
            reasoning_texts(
                HARMONY,
                "<|channel|>analysis<|message|>A.<|end|><|start|>assistant<|channel|>final<|message|>B<|return|>"
            ),
            ["<|channel|>analysis<|message|>A.<|end|>"]
        );
        // Two analysis messages around a commentary one; one cut off.
        assert_eq!(
            reasoning_texts(
                HARMONY,
                "<|channel|>analysis<|message|>A<|end|><|start|>assistant<|channel|>commentary<|message|>c<|end|><|start|>assistant<|channel|>analysis<|message|>B"
            ),
            [
                "<|channel|>analysis<|message|>A<|end|>",
                "<|start|>assistant<|channel|>analysis<|message|>B"
            ]
        );
    }

    #[test]
    fn answer_text_goes_out_as_soon_as_it_cannot_be_a_marker() {
        let mut splitter = ReplySplitter::new(THINK);
        assert_eq!(splitter.push("<thi"), vec![]);
        assert_eq!(splitter.push("nk>\nI"), vec![reasoning("I")]);
        assert_eq!(splitter.push(" wonder.\n</"), vec![reasoning(" wonder.")]);
        assert_eq!(splitter.push("think>\n\nYes"), vec![answer("Yes")]);
        // Without tool calls nothing in the answer is held, not even `<`.
        assert_eq!(splitter.push(", <"), vec![answer(", <")]);
        assert_eq!(splitter.push("br>\n"), vec![answer("br>\n")]);

        let mut splitter = ReplySplitter::new(QWEN_TOOLS);
        assert_eq!(splitter.push("Hi"), vec![answer("Hi")]);
        // A tool call may follow: `<tool` and the blank before it wait.
        assert_eq!(splitter.push(" there <tool"), vec![answer(" there")]);
        assert_eq!(splitter.push("bar>"), vec![answer(" <toolbar>")]);
    }

    #[test]
    fn detect_reads_the_template_and_the_prompt() {
        let qwen3 =
            "{%- if tools %}<tool_call>{%- endif %}{%- if '</think>' in content %}{%- endif %}";
        assert_eq!(
            ReplyFormat::detect("qwen3", Some(qwen3), Some("<|im_start|>assistant\n"), true),
            QWEN_TOOLS
        );
        assert_eq!(
            ReplyFormat::detect("qwen3", Some(qwen3), Some("<|im_start|>assistant\n"), false),
            THINK
        );
        // A generation prompt that ends inside <think>.
        assert_eq!(
            ReplyFormat::detect(
                "llama",
                Some("... '</think>' ..."),
                Some("<｜Assistant｜><think>\n"),
                false
            ),
            THINK_OPENED
        );
        // A <think> the user typed is not the end of the prompt.
        assert_eq!(
            ReplyFormat::detect(
                "llama",
                Some("{{ messages }}"),
                Some("user: what does <think> mean?\nassistant:"),
                false
            ),
            ReplyFormat::PLAIN
        );
        let llama31 = "{{- '<|python_tag|>' + tool_call.name }}";
        assert_eq!(
            ReplyFormat::detect("llama", Some(llama31), None, true),
            LLAMA_TOOLS
        );
        let gpt_oss = "<|start|>assistant<|channel|>final<|message|>";
        assert_eq!(
            ReplyFormat::detect("gpt_oss", Some(gpt_oss), None, false),
            ReplyFormat::Harmony { tool_calls: false }
        );
        assert!(ReplyFormat::detect("x", Some(gpt_oss), None, true).needs_special_tokens());
        assert!(!QWEN_TOOLS.needs_special_tokens());
    }

    const GEMMA4: ReplyFormat = ReplyFormat::Marked {
        think: Some(ThinkStart::ModelOpensChannel),
        tool_calls: Some(ToolCallSyntax::GemmaCall),
    };

    #[test]
    fn gemma4_thinks_in_its_channel_and_calls_tools_in_its_own_syntax() {
        check(
            GEMMA4,
            "<|channel>thought\nThe user wants Paris.\n<channel|>It is sunny.",
            &[reasoning("The user wants Paris."), answer("It is sunny.")],
        );
        // With thinking off the template closes an empty channel in the
        // prompt, and the reply is the answer.
        check(GEMMA4, "It is sunny.", &[answer("It is sunny.")]);
        check(
            GEMMA4,
            "<|channel>thought\nCheck both.<channel|><|tool_call>call:get_weather{\
             city:<|\"|>Paris, {France}<|\"|>,days:2,metric:true,hours:[1,2.5],\
             where:{zone:<|\"|>UTC<|\"|>,exact:null}}<tool_call|>\
             <|tool_call>call:now{}<tool_call|>",
            &[
                reasoning("Check both."),
                call(
                    "get_weather",
                    json!({"city": "Paris, {France}", "days": 2, "metric": true,
                           "hours": [1, 2.5], "where": {"zone": "UTC", "exact": null}}),
                ),
                call("now", json!({})),
            ],
        );
        // A body that is not calls stays answer text.
        let broken = "<|tool_call>call:f{city:Paris}<tool_call|>";
        check(GEMMA4, broken, &[answer(broken)]);
        // Gemma 4's template writes both markers; its family says so where
        // there is no template; either way the markers are special tokens.
        let template = "{{- '<|channel>thought\\n' + thinking_text + '\\n<channel|>' -}}\
                        {{- '<|tool_call>call:' + function['name'] + '{' -}}";
        assert_eq!(
            ReplyFormat::detect("llama", Some(template), None, true),
            GEMMA4
        );
        assert_eq!(ReplyFormat::detect("gemma4", None, None, true), GEMMA4);
        assert_eq!(
            ReplyFormat::detect("gemma4_text", None, None, false),
            ReplyFormat::Marked {
                think: Some(ThinkStart::ModelOpensChannel),
                tool_calls: None,
            }
        );
        assert!(GEMMA4.needs_special_tokens());
    }

    #[test]
    fn a_tool_call_serializes_as_openai_and_templates_expect() {
        let call = ToolCall::new("get_weather", json!({"city": "Paris", "at": "noon"}));
        let value = serde_json::to_value(&call).unwrap();
        assert_eq!(
            serde_json::to_string(&value["function"]).unwrap(),
            r#"{"name":"get_weather","arguments":{"city":"Paris","at":"noon"}}"#,
            "arguments keep the model's order"
        );
        assert_eq!(value["type"], "function");
        assert!(value["id"].as_str().unwrap().starts_with("call_"));
        let read: ToolCall =
            serde_json::from_value(json!({"function": {"name": "f", "arguments": {}}})).unwrap();
        assert_eq!(read.id, "");
        assert_eq!(read.kind, ToolCallKind::Function);
        assert_ne!(
            ToolCall::new("f", json!({})).id,
            ToolCall::new("f", json!({})).id
        );
    }
}
