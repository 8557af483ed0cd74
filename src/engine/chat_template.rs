//! Chat templates: finds a model's Jinja chat template and renders a
//! conversation into prompt text the way Hugging Face transformers'
//! `apply_chat_template(tokenize=False)` (and so mlx-lm) does.
//!
//! transformers compiles the template with jinja2's
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` plus
//! the `loopcontrols` extension, its own `{% generation %}` tag, a `tojson`
//! filter that does not escape HTML, and the globals `raise_exception` and
//! `strftime_now`. This module rebuilds that environment on minijinja so that
//! the same template text gives the same prompt, byte for byte.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, context};

use super::reply::ToolCall;

/// The file that newer transformers versions save the template to.
const JINJA_FILE: &str = "chat_template.jinja";
/// The file that older checkpoints keep the template (and the special tokens) in.
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// Name of the template inside the environment when it came from no file.
const INLINE_NAME: &str = "chat_template";
/// Deeper than this, `tojson` gives up rather than risk the stack; Python's own
/// recursion limit stops `json.dumps` at a similar depth.
const MAX_JSON_DEPTH: usize = 512;

/// One turn of a conversation, as the template sees it in `messages`: the
/// message dict of Hugging Face chat templates and OpenAI's chat API. Fields
/// that are `None` are left out of the dict, as transformers leaves them out.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ChatMessage {
    /// Who speaks: usually `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// What they say; for an assistant turn, the answer without its
    /// reasoning (empty for a turn of only tool calls: a dialect whose
    /// clients send `null` there maps it to "").
    pub content: String,
    /// An assistant turn's reasoning, kept apart from `content`. Templates
    /// read it as `reasoning_content` (Qwen3) or `thinking` (gpt-oss);
    /// transformers passes it under both names, and so does Ondo. (A
    /// dialect that names it otherwise, like Ollama's `thinking`, maps it.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "specta", specta(optional))]
    pub reasoning_content: Option<String>,
    /// The tools an assistant turn called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "specta", specta(optional))]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// For a `tool` turn: the id of the call this is the result of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "specta", specta(optional))]
    pub tool_call_id: Option<String>,
    /// For a `tool` turn: the name of the tool that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "specta", specta(optional))]
    pub name: Option<String>,
    /// Images the turn shows, each a whole image file (PNG, JPEG, WebP or
    /// GIF) in base64. The template sees the turn's `content` as a list of
    /// parts: one `{"type": "image"}` per image, then `{"type": "text",
    /// "text": content}`, as transformers' processors pass them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "specta", specta(optional))]
    pub images: Vec<String>,
}

impl ChatMessage {
    /// A message with the `system` role.
    pub fn system(content: impl Into<String>) -> Self {
        Self::with_role("system", content)
    }

    /// A message with the `user` role.
    pub fn user(content: impl Into<String>) -> Self {
        Self::with_role("user", content)
    }

    /// A message with the `assistant` role.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::with_role("assistant", content)
    }

    fn with_role(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.to_owned(),
            content: content.into(),
            ..Self::default()
        }
    }

    /// Whether the message says anything: text, images, or tool calls.
    pub fn is_blank(&self) -> bool {
        self.content.trim().is_empty()
            && self.images.is_empty()
            && self.tool_calls.as_ref().is_none_or(Vec::is_empty)
    }

    /// The message as the template sees it: the serialized dict, with the
    /// reasoning also under `thinking` (first), as transformers aliases it.
    fn to_template_value(&self) -> Result<Value, ChatTemplateError> {
        let value = serde_json::to_value(self).map_err(|err| ChatTemplateError::Render {
            message: format!("a message could not be passed to the template: {err}"),
        })?;
        let mut value = match (value, &self.reasoning_content) {
            (serde_json::Value::Object(fields), Some(reasoning)) => {
                let mut aliased = serde_json::Map::with_capacity(fields.len() + 1);
                aliased.insert("thinking".to_owned(), reasoning.as_str().into());
                aliased.extend(fields);
                serde_json::Value::Object(aliased)
            }
            (value, _) => value,
        };
        if let serde_json::Value::Object(fields) = &mut value
            && fields.remove("images").is_some()
        {
            let mut parts: Vec<serde_json::Value> = self
                .images
                .iter()
                .map(|_| serde_json::json!({"type": "image"}))
                .collect();
            parts.push(serde_json::json!({"type": "text", "text": self.content}));
            fields.insert("content".to_owned(), serde_json::Value::Array(parts));
        }
        Ok(template_value(&value))
    }
}

/// JSON data as a template value, maps in their keys' order (as Python's
/// dicts from `json.loads` keep it).
fn template_value(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => items.iter().map(template_value).collect(),
        serde_json::Value::Object(map) => template_value_of_map(map),
    }
}

fn template_value_of_map(map: &serde_json::Map<String, serde_json::Value>) -> Value {
    Value::from_pairs(map.iter().map(|(k, v)| (k.as_str(), template_value(v))))
}

/// Template variables Ondo sets itself; a request's template options may not.
/// The template option that turns a thinking model's reasoning on or off,
/// as transformers' `apply_chat_template(enable_thinking=...)` passes it.
pub const ENABLE_THINKING: &str = "enable_thinking";

const RESERVED_VARIABLES: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// A file of the model folder exists but could not be read or parsed.
    #[error("cannot read {}: {message}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The template does not compile, or the tokenizer config holds no usable one.
    #[error("the chat template {} is not valid: {message}", describe_origin(.path.as_deref()))]
    Invalid {
        /// The file the template came from; `None` for one given as text.
        path: Option<PathBuf>,
        /// What is wrong, with the line where minijinja knows it.
        message: String,
    },
    /// The template called `raise_exception`: it refuses this conversation
    /// (for example because the roles do not alternate).
    #[error("the chat template rejected the conversation: {message}")]
    Rejected {
        /// The template's own words.
        message: String,
    },
    /// A request's template options set a variable Ondo passes itself.
    #[error(
        "the template option `{name}` cannot be set: Ondo passes it itself; leave it out of the template options"
    )]
    ReservedOption {
        /// The option's name.
        name: String,
    },
    /// Rendering failed for another reason (an undefined attribute, a type error).
    #[error("the chat template failed to render: {message}")]
    Render {
        /// What went wrong, with the line where minijinja knows it.
        message: String,
    },
}

fn describe_origin(path: Option<&Path>) -> String {
    match path {
        Some(path) => format!("in {}", path.display()),
        None => "given as text".to_owned(),
    }
}

/// The special tokens transformers passes to every render, from its
/// `special_tokens_map`. A token the tokenizer lacks stays undefined in the
/// template, which renders as an empty string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct SpecialTokens {
    bos: Option<String>,
    eos: Option<String>,
    unk: Option<String>,
    pad: Option<String>,
}

impl SpecialTokens {
    fn from_config(config: &serde_json::Value) -> Self {
        Self {
            bos: token_field(config, "bos_token"),
            eos: token_field(config, "eos_token"),
            unk: token_field(config, "unk_token"),
            pad: token_field(config, "pad_token"),
        }
    }

    /// The tokens as template variables; only those that are set, because
    /// transformers leaves the others out rather than passing `None`.
    fn to_value(&self) -> Value {
        let pairs = [
            ("bos_token", &self.bos),
            ("eos_token", &self.eos),
            ("unk_token", &self.unk),
            ("pad_token", &self.pad),
        ];
        let map: std::collections::BTreeMap<String, Value> = pairs
            .into_iter()
            .filter_map(|(name, token)| {
                token
                    .as_ref()
                    .map(|t| (name.to_owned(), Value::from(t.as_str())))
            })
            .collect();
        Value::from(map)
    }
}

/// A token in tokenizer_config.json is either a plain string or a serialized
/// `AddedToken` object whose text is in `content`.
fn token_field(config: &serde_json::Value, key: &str) -> Option<String> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(obj) => obj.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// A compiled chat template with the special tokens it is rendered with.
///
/// The minijinja environment is built and the template compiled once, when
/// the template is loaded; each render only evaluates it.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template's name inside `env`: its file path, so errors name the file.
    name: String,
    source: String,
    /// The template named "tool_use" beside the default one, if the config
    /// lists one: transformers renders it when the request carries tools.
    tool_use: Option<NamedTemplate>,
    tokens: SpecialTokens,
    /// `tokens` as template variables, built once.
    token_values: Value,
}

/// A second template compiled into the same environment.
#[derive(Clone)]
struct NamedTemplate {
    name: String,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .field("source_len", &self.source.len())
            .field("tool_use", &self.tool_use.as_ref().map(|t| &t.name))
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Finds the template of a model folder: `chat_template.jinja` first, else
    /// `chat_template` in tokenizer_config.json (a string, or a list of
    /// `{name, template}` where the one named "default" is used, and the one
    /// named "tool_use" when a request carries tools), else `Ok(None)`.
    ///
    /// Also reads `bos_token`, `eos_token`, `unk_token` and `pad_token` from
    /// tokenizer_config.json (each either a string or an object with "content").
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>, ChatTemplateError> {
        let config_path = dir.join(TOKENIZER_CONFIG);
        let config = match read_if_present(&config_path)? {
            Some(text) => Some(serde_json::from_str::<serde_json::Value>(&text).map_err(
                |err| ChatTemplateError::Unreadable {
                    path: config_path.clone(),
                    message: err.to_string(),
                },
            )?),
            None => None,
        };
        let tokens = config
            .as_ref()
            .map(SpecialTokens::from_config)
            .unwrap_or_default();

        // transformers lets chat_template.jinja override the config's template.
        let jinja_path = dir.join(JINJA_FILE);
        if let Some(source) = read_if_present(&jinja_path)? {
            return Self::compile(source, Some(jinja_path), tokens, None).map(Some);
        }
        let Some(config) = config else {
            return Ok(None);
        };
        match template_from_config(&config, &config_path)? {
            Some((source, tool_use)) => {
                Self::compile(source, Some(config_path), tokens, tool_use).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Compiles a template given as text, with the BOS and EOS tokens it is
    /// rendered with. Compiling here, not at the first render, makes a syntax
    /// error show when the model loads.
    pub fn from_source(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let tokens = SpecialTokens {
            bos: bos_token,
            eos: eos_token,
            ..SpecialTokens::default()
        };
        Self::compile(source.into(), None, tokens, None)
    }

    /// The template text as it was loaded.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The text of the template a request renders with: the "tool_use"
    /// template when it carries tools and the model has one.
    pub fn source_for(&self, tools: bool) -> &str {
        match (&self.tool_use, tools) {
            (Some(tool_use), true) => &tool_use.source,
            _ => &self.source,
        }
    }

    /// Whether the template reads `enable_thinking` (Qwen3 and its kin): a
    /// request can then turn the model's reasoning on or off with that
    /// template option ([`ENABLE_THINKING`]).
    pub fn takes_enable_thinking(&self) -> bool {
        self.source.contains(ENABLE_THINKING)
            || self
                .tool_use
                .as_ref()
                .is_some_and(|t| t.source.contains(ENABLE_THINKING))
    }

    /// Whether tools offered with a request reach the model: its template
    /// reads `tools`, or it has a "tool_use" template for such requests.
    pub fn takes_tools(&self) -> bool {
        self.tool_use.is_some() || self.source.contains("tools")
    }

    /// Whether the model reasons before it answers: the template reads
    /// `enable_thinking`, or it closes a `<think>` block (a model that always
    /// thinks, such as DeepSeek-R1's distillations).
    pub fn thinks(&self) -> bool {
        self.takes_enable_thinking() || self.source.contains("</think>")
    }

    /// The BOS token the template is rendered with, if the tokenizer has one.
    pub fn bos_token(&self) -> Option<&str> {
        self.tokens.bos.as_deref()
    }

    /// The EOS token the template is rendered with, if the tokenizer has one.
    pub fn eos_token(&self) -> Option<&str> {
        self.tokens.eos.as_deref()
    }

    /// Renders with `messages`, `add_generation_prompt`, `bos_token`,
    /// `eos_token` (and `unk_token`, `pad_token` where known), like
    /// transformers' `apply_chat_template(tokenize=False)`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with(
            messages,
            None,
            &serde_json::Map::new(),
            add_generation_prompt,
        )
    }

    /// Renders like [`render`](Self::render), with the request's `tools`
    /// (OpenAI-style function schemas, passed to the template as they are)
    /// and its template options as further variables (`enable_thinking`),
    /// as transformers passes `tools` and the extra keyword arguments of
    /// `apply_chat_template`. Options override the special tokens, as there.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        options: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        if let Some(name) = options
            .keys()
            .find(|k| RESERVED_VARIABLES.contains(&k.as_str()))
        {
            return Err(ChatTemplateError::ReservedOption { name: name.clone() });
        }
        let messages = messages
            .iter()
            .map(ChatMessage::to_template_value)
            .collect::<Result<Vec<Value>, _>>()?;
        let options = template_value_of_map(options);
        // transformers passes `tools` and `documents` as None when there are
        // none, so `tools is defined` holds and `tools is none` too.
        let ctx = context! {
            messages => messages,
            tools => tools.map_or(Value::from(()), |t| t.iter().map(template_value).collect()),
            documents => Value::from(()),
            add_generation_prompt => add_generation_prompt,
            // The later map wins: options over the special tokens.
            ..minijinja::value::merge_maps([self.token_values.clone(), options])
        };
        let name = match (&self.tool_use, tools) {
            (Some(tool_use), Some(_)) => &tool_use.name,
            _ => &self.name,
        };
        let template = self
            .env
            .get_template(name)
            .map_err(|err| ChatTemplateError::Render {
                message: describe_error(&err),
            })?;
        template.render(ctx).map_err(|err| match rejection(&err) {
            Some(message) => ChatTemplateError::Rejected { message },
            None => ChatTemplateError::Render {
                message: describe_error(&err),
            },
        })
    }

    fn compile(
        source: String,
        path: Option<PathBuf>,
        tokens: SpecialTokens,
        tool_use_source: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let invalid = |message: String| ChatTemplateError::Invalid {
            path: path.clone(),
            message,
        };
        let name = match &path {
            Some(path) => path.display().to_string(),
            None => INLINE_NAME.to_owned(),
        };
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|err| invalid(describe_error(&err)))?;
        env.set_syntax(syntax);
        // jinja2's default: no escaping at all, whatever the template's name.
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_test("sequence", is_sequence);
        env.add_test("iterable", is_iterable);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(name.clone(), prepare_source(&source))
            .map_err(|err| invalid(describe_error(&err)))?;
        let tool_use = match tool_use_source {
            Some(source) => {
                let name = format!("{name} (tool_use)");
                env.add_template_owned(name.clone(), prepare_source(&source))
                    .map_err(|err| {
                        invalid(format!(
                            "in the tool_use template: {}",
                            describe_error(&err)
                        ))
                    })?;
                Some(NamedTemplate { name, source })
            }
            None => None,
        };
        let token_values = tokens.to_value();
        Ok(Self {
            env,
            name,
            source,
            tool_use,
            tokens,
            token_values,
        })
    }
}

/// Reads a file, or `None` when it does not exist.
fn read_if_present(path: &Path) -> Result<Option<String>, ChatTemplateError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(ChatTemplateError::Unreadable {
            path: path.to_owned(),
            message: err.to_string(),
        }),
    }
}

/// The `chat_template` entry of tokenizer_config.json, as transformers picks
/// it: the default template and the "tool_use" one, if any.
fn template_from_config(
    config: &serde_json::Value,
    path: &Path,
) -> Result<Option<(String, Option<String>)>, ChatTemplateError> {
    let invalid = |message: &str| ChatTemplateError::Invalid {
        path: Some(path.to_owned()),
        message: message.to_owned(),
    };
    match config.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(source)) => Ok(Some((source.clone(), None))),
        Some(serde_json::Value::Array(named)) => {
            // A list of {name, template}: transformers renders the one named
            // "default" unless the request carries tools and one is named
            // "tool_use", and refuses when there is no default.
            let named_source = |wanted: &str| {
                named
                    .iter()
                    .find(|entry| {
                        entry.get("name").and_then(serde_json::Value::as_str) == Some(wanted)
                    })
                    .map(|entry| match entry.get("template") {
                        Some(serde_json::Value::String(source)) => Ok(source.clone()),
                        _ => Err(invalid(&format!(
                            "the chat template named \"{wanted}\" has no \"template\" string"
                        ))),
                    })
                    .transpose()
            };
            match named_source("default")? {
                Some(source) => Ok(Some((source, named_source("tool_use")?))),
                None => Err(invalid(
                    "chat_template lists named templates but none is named \"default\"",
                )),
            }
        }
        Some(_) => Err(invalid(
            "chat_template is neither a string nor a list of named templates",
        )),
    }
}

/// What minijinja compiles: the template text with jinja2's newline
/// normalisation and transformers' `{% generation %}` tag rewritten.
fn prepare_source(source: &str) -> String {
    // jinja2's lexer turns every \r\n and \r in the template into \n.
    let normalised = if source.contains('\r') {
        source.replace("\r\n", "\n").replace('\r', "\n")
    } else {
        source.to_owned()
    };
    rewrite_generation_tags(&normalised)
}

/// transformers' AssistantTracker extension adds `{% generation %}` ...
/// `{% endgeneration %}`, which (when no assistant mask is asked for, as
/// here) renders its body unchanged in a scope of its own. minijinja does
/// not know the tag; `{% with %}` ... `{% endwith %}` does the same thing,
/// and keeping the delimiters and whitespace markers keeps trim_blocks and
/// lstrip_blocks acting exactly as they did.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let (before, tag) = rest.split_at(start);
        out.push_str(before);
        match generation_keyword(tag) {
            Some((keyword_start, keyword, keyword_len)) => {
                out.push_str(&tag[..keyword_start]);
                out.push_str(if keyword == "generation" {
                    "with"
                } else {
                    "endwith"
                });
                rest = &tag[keyword_start + keyword_len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// If `tag` (which starts with `{%`) is a `generation` or `endgeneration`
/// tag, where its keyword starts, which keyword, and how long it is.
fn generation_keyword(tag: &str) -> Option<(usize, &'static str, usize)> {
    let bytes = tag.as_bytes();
    let mut i = 2;
    if matches!(bytes.get(i), Some(b'-' | b'+')) {
        i += 1;
    }
    while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    let keyword = ["endgeneration", "generation"]
        .into_iter()
        .find(|k| tag[i..].starts_with(k))?;
    let mut j = i + keyword.len();
    while bytes.get(j).is_some_and(u8::is_ascii_whitespace) {
        j += 1;
    }
    if matches!(bytes.get(j), Some(b'-' | b'+')) {
        j += 1;
    }
    tag[j..]
        .starts_with("%}")
        .then_some((i, keyword, keyword.len()))
}

/// jinja2's `sequence` test: anything with a length and item access, so
/// strings and mappings too (minijinja's own says no to both), and Undefined.
fn is_sequence(value: &Value) -> bool {
    value.is_undefined()
        || matches!(
            value.kind(),
            ValueKind::String | ValueKind::Bytes | ValueKind::Seq | ValueKind::Map
        )
}

/// jinja2's `iterable` test. minijinja lets a loop run over `none`, so its own
/// test says yes to it; Python says no, and templates guard
/// `tools | length` with `tools is iterable` while `tools` is None.
fn is_iterable(value: &Value) -> bool {
    !value.is_none() && value.try_iter().is_ok()
}

/// The error `raise_exception` returns, kept as the source of minijinja's
/// error so that `render` can tell a refusal from a failure.
#[derive(Debug)]
struct TemplateRejection(String);

impl std::fmt::Display for TemplateRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TemplateRejection {}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: Value) -> Result<Value, Error> {
    // Python formats whatever it was given with str(); a string stays as is.
    let message = message.to_string();
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("the chat template rejected the conversation: {message}"),
    )
    .with_source(TemplateRejection(message)))
}

/// The message of a `raise_exception` call somewhere in the error's chain.
fn rejection(err: &Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(rejection) = e.downcast_ref::<TemplateRejection>() {
            return Some(rejection.0.clone());
        }
        current = e.source();
    }
    None
}

/// A minijinja error as one line: kind, detail, line, and any causes.
fn describe_error(err: &Error) -> String {
    let mut message = err.kind().to_string();
    if let Some(detail) = err.detail() {
        message.push_str(": ");
        message.push_str(detail);
    }
    if let Some(line) = err.line() {
        // Writing to a String cannot fail.
        let _ = write!(message, " (line {line})");
    }
    let mut cause = std::error::Error::source(err);
    while let Some(e) = cause {
        let _ = write!(message, ": {e}");
        cause = e.source();
    }
    message
}

/// `strftime_now(format)`: the local time, as Python's
/// `datetime.now().strftime(format)` gives it.
fn strftime_now(format: &str) -> Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    // chrono's formatter fails (and `to_string` would panic) on an unknown
    // specifier, so refuse it up front with a template error.
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now cannot use the format {format:?}"),
        ));
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.iter())
    )
    .map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now cannot use the format {format:?}"),
        )
    })?;
    Ok(out)
}

/// How `tojson` lays out its JSON, from `json.dumps`' arguments.
struct JsonLayout {
    ensure_ascii: bool,
    /// `None` writes everything on one line; `Some` puts each item on its own
    /// line, indented by this string once per level.
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// `tojson`, as transformers defines it: `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`. jinja2's and minijinja's
/// own `tojson` escape `<`, `>`, `&` and `'` for HTML, which would change the
/// prompt, so this one does not.
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = match ensure_ascii {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("ensure_ascii")?,
    };
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let separators = kwargs.get::<Option<Value>>("separators")?;
    let sort_keys = kwargs.get::<Option<Value>>("sort_keys")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(indent_string(&v)?),
    };
    let (item_separator, key_separator) = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] => match (item.as_str(), key.as_str()) {
                    (Some(item), Some(key)) => (item.to_owned(), key.to_owned()),
                    _ => return Err(json_error("tojson separators must be two strings")),
                },
                _ => return Err(json_error("tojson separators must be two strings")),
            }
        }
        // json.dumps drops the space after commas once lines are indented.
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let layout = JsonLayout {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    let mut out = String::new();
    write_json(&mut out, value, &layout, 0)?;
    Ok(Value::from(out))
}

/// `json.dumps`' indent: a string is used as is, a number is that many spaces.
fn indent_string(indent: &Value) -> Result<String, Error> {
    if let Some(s) = indent.as_str() {
        return Ok(s.to_owned());
    }
    if indent.kind() == ValueKind::Bool {
        // Python multiplies ' ' by the bool: True is one space.
        return Ok(if indent.is_true() { " " } else { "" }.to_owned());
    }
    match indent.as_i64() {
        // ' ' * n is empty for n <= 0.
        Some(n) => Ok(" ".repeat(usize::try_from(n).unwrap_or(0))),
        None => Err(json_error("tojson indent must be a number or a string")),
    }
}

fn json_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.into())
}

fn not_serializable(value: &Value) -> Error {
    json_error(format!(
        "Object of type {} is not JSON serializable",
        value.kind()
    ))
}

fn write_json(
    out: &mut String,
    value: &Value,
    layout: &JsonLayout,
    depth: usize,
) -> Result<(), Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(json_error("tojson: the value is nested too deeply"));
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value)?,
        ValueKind::String => write_json_string(out, value.as_str().unwrap_or(""), layout),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, layout, depth, ('[', ']'), &items, |out, item| {
                write_json(out, item, layout, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if layout.sort_keys {
                keys.sort();
            }
            write_container(out, layout, depth, ('{', '}'), &keys, |out, key| {
                write_json_string(out, &json_key(key)?, layout);
                out.push_str(&layout.key_separator);
                write_json(out, &value.get_item(key)?, layout, depth + 1)
            })?;
        }
        // Undefined is jinja2's Undefined, which json.dumps refuses too.
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// Writes `[...]` or `{...}` the way json.dumps lays them out.
fn write_container<T>(
    out: &mut String,
    layout: &JsonLayout,
    depth: usize,
    (open, close): (char, char),
    items: &[T],
    mut write_item: impl FnMut(&mut String, &T) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &layout.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&layout.item_separator);
        }
        newline(out, depth + 1);
        write_item(out, item)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// A map key as json.dumps writes it: strings as they are, numbers, bools
/// and None as their JSON text.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or("").to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key)?;
            Ok(s)
        }
        _ => Err(json_error(format!(
            "keys must be str, int, float, bool or None, not {}",
            key.kind()
        ))),
    }
}

fn write_number(out: &mut String, value: &Value) -> Result<(), Error> {
    if value.is_integer() {
        // An integer's display is its decimal digits, whatever its width.
        let _ = write!(out, "{value}");
        return Ok(());
    }
    let float = f64::try_from(value.clone())?;
    out.push_str(&python_float_repr(float));
    Ok(())
}

/// A float as Python's `repr` (and so json.dumps) writes it: the shortest
/// digits that read back to the same float, in plain notation for exponents
/// from -4 to 15 and scientific (`1e+16`, `1e-05`) outside.
fn python_float_repr(v: f64) -> String {
    if v.is_nan() {
        return "NaN".to_owned();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // Rust's `{:e}` also gives the shortest round-tripping digits.
    let scientific = format!("{v:e}");
    let Some((mantissa, exponent)) = scientific.split_once('e') else {
        return format!("{v}");
    };
    let Ok(exponent) = exponent.parse::<i32>() else {
        return format!("{v}");
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let body = if (-4..16).contains(&exponent) {
        if exponent >= 0 {
            let point = exponent.unsigned_abs() as usize + 1;
            if digits.len() <= point {
                format!("{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{}.{}", &digits[..point], &digits[point..])
            }
        } else {
            let zeros = "0".repeat(exponent.unsigned_abs() as usize - 1);
            format!("0.{zeros}{digits}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let mantissa = if rest.is_empty() {
            first.to_owned()
        } else {
            format!("{first}.{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{exp_sign}{:02}", exponent.unsigned_abs())
    };
    format!("{sign}{body}")
}

/// A JSON string literal with json.dumps' escapes.
fn write_json_string(out: &mut String, s: &str, layout: &JsonLayout) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            // ensure_ascii escapes everything outside printable ASCII, DEL
            // included, astral characters as surrogate pairs.
            c if layout.ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    // The templates below are written for these tests in the style of real
    // model templates. The expected strings were produced by rendering the
    // same text with Python's jinja2 3.1.6 set up as transformers sets it up.

    const LLAMA3_TEMPLATE: &str = r##"{{- bos_token }}
{%- if date_string is not defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_prompt = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_prompt = "You are a concise assistant." %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{{- 'Knowledge cutoff: December 2023\nToday: ' + date_string + '\n\n' }}
{{- system_prompt + '<|eot_id|>' }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"##;

    const CHATML_TEMPLATE: &str = r##"{%- set ns = namespace(last_user=-1, turns=0) %}
{%- for message in messages %}
    {%- if message.role == 'user' and not message.content.startswith('<tool_response>') %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if loop.first and message.role != 'system' %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('The system message must come first.') }}
        {%- endif %}
        {{- '<|im_start|>system\n' + message.content + '<|im_end|>\n' }}
    {%- else %}
        {%- if (message.role == 'user') != (ns.turns % 2 == 0) %}
            {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
        {%- endif %}
        {%- set ns.turns = ns.turns + 1 %}
        {%- if message.role == 'assistant' %}
            {%- set reply = message.content %}
            {%- if '</think>' in reply and loop.index0 < ns.last_user %}
                {%- set reply = reply.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
<|im_start|>assistant
{{ reply }}<|im_end|>
        {% else %}
            {%- set speaker = 'tool' if message.content.startswith('<tool_response>') else 'user' %}
<|im_start|>{{ speaker }}
{{ message.content }}<|im_end|>
        {% endif %}
    {%- endif %}
    {%- if loop.last and add_generation_prompt %}
        {{- '<|im_start|>assistant\n' }}
    {%- endif %}
{%- endfor %}
"##;

    const MISTRAL_TEMPLATE: &str = r##"{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"##;

    const COMPAT_TEMPLATE: &str = r##"{%- set roles = messages | map(attribute='role') | list %}
roles={{ roles | join(',') }} users={{ messages | selectattr('role', 'equalto', 'user') | list | length }}
case={{ messages[0].content.upper() }} {{ messages[0].content.lower() }} {{ messages[0].content.replace('o', '0') }}
split={{ 'a b  c'.split() | join('|') }} {{ 'k=v=w'.split('=', 1) | join('|') }}
strip=[{{ '  pad  '.strip() }}][{{ 'xxhixx'.strip('x') }}][{{ '\n\nx\n'.rstrip() }}][{{ '  y'.lstrip() }}]
ends={{ messages[-1].content.endswith('?') }} {{ messages[-1].content.startswith('Hey') }}
items={% for key, val in messages[0].items() %}{{ key }}:{{ val }};{% endfor %}

get={{ messages[0].get('name', 'anon') }} {{ messages[0].get('role') }}
slice={{ messages[1:] | length }} {{ 'abcdef'[1:3] }} {{ 'abc'[::-1] }} {{ messages[-1]['role'] }}
loop={% for m in messages %}{{ loop.index }}/{{ loop.length }}{% if not loop.last %},{% endif %}{% endfor %}

break={% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.role[0] }}{% endfor %}

continue={% for m in messages %}{% if m.role == 'assistant' %}{% continue %}{% endif %}{{ m.role[0] }}{% endfor %}

tokens=[{{ bos_token }}][{{ eos_token }}][{{ unk_token }}][{{ pad_token }}]
defined={{ tools is none }} {{ documents is defined }} {{ missing is defined }} {{ tools }}
values={{ add_generation_prompt }} {{ 7 // 2 }} {{ 1.5 * 2 }} {{ none }} {{ 'ab' ~ 3 }}
{% macro wrap(text, tag='b') -%}
<{{ tag }}>{{ text }}</{{ tag }}>
{%- endmacro %}
macro={{ wrap('x') }}{{ wrap('y', tag='i') }}
ternary={{ 'many' if messages | length > 2 else 'few' }}
tests={{ messages[0].content is string }} {{ messages is sequence }} {{ messages[0] is mapping }}
    {% if true %}
indented block tags vanish with their line
    {% endif %}
{# a comment line #}
end
"##;

    const MORE_COMPAT_TEMPLATE: &str = r##"{%- for message in messages if message.role != 'system' %}
{{ loop.index0 }}:{{ message.role | capitalize }}:{{ message.content.title() }}{% if loop.previtem is defined %} prev={{ loop.previtem.role }}{% endif %}

{% endfor %}
last={{ (messages | last).content }} first={{ (messages | first).role }} rev={{ messages[::-1] | map(attribute='role') | join(',') }}
idx={% for m in messages %}{{ (messages | length - 1) - loop.index0 }}{% endfor %}

think={{ '<think>\nA\n</think>\n\nB'.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') }}
default={{ nothing | default('dflt') }} {{ '' | default('e', true) }} int={{ '42' | int + 1 }} str={{ 5 | string ~ '!' }}
dictsort={% for k, v in {'b': 2, 'a': 1} | dictsort %}{{ k }}{{ v }}{% endfor %} items={% for k, v in {'b': 2, 'a': 1}.items() %}{{ k }}{{ v }}{% endfor %}

print={{ messages[0] }} {{ ['a', 1, none, true] }} {{ {'k': 'v'} }}
lines={{ 'a\nb'.splitlines() | length }} count={{ 'banana'.count('a') }} find={{ 'hello'.find('l') }}
role={{ (messages[0].role == 'system') and 'sys' or 'other' }} in={{ 'sys' in messages[0].content }} notin={{ 'x' not in 'abc' }}
join={{ messages | map(attribute='content') | map('trim') | join(' / ') }}
set={% set ns = namespace(found=false) %}{% for m in messages %}{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}
fmt={{ '%s-%d' | format('a', 3) }} {{ 'x' * 3 }} {{ 10 / 4 }} {{ 2 ** 10 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7.0 // 2 }} {{ 1 / 3 }}
endswith={{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.startswith('ab') }}
cmp={{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ none is none }} {{ [] | length }} {{ [] is iterable }}
batch={{ messages | length is divisibleby 3 }} {{ messages | selectattr('content') | list | length }} {{ messages | rejectattr('role', 'equalto', 'user') | list | length }}
upper={{ 'Straße'.upper() }} lower={{ 'ÀB'.lower() }} trim=[{{ '\u3000 wide \t' | trim }}]
seq={{ 'abc' is sequence }} {{ {} is sequence }} {{ none is sequence }} {{ 1 is sequence }} {{ missing is sequence }} {{ [] is sequence }} {{ messages[0] is sequence }}
it={{ 'abc' is iterable }} {{ {} is iterable }} {{ 1 is iterable }} {{ none is iterable }} {{ missing is iterable }} {{ messages is iterable }}
num={{ true is number }} {{ 1.5 is number }} {{ '1' is number }} {{ true is integer }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }}
str={{ missing is string }} {{ 'a' is string }} {{ none is none }} {{ missing is none }} {{ 0 is false }} {{ false is false }}
map={{ messages[0] is mapping }} {{ none is mapping }} {{ 'a' is mapping }} {{ missing is mapping }}
call={{ messages[0] is defined }} {{ loop is undefined }}
cmp={{ 'a' is lower }} {{ 'A' is upper }} {{ 2 is even }} {{ 3 is odd }} {{ 'a' is in ['a'] }} {{ 1 is eq 1 }} {{ 1 is ne 2 }}
tools={{ tools is iterable }} {{ tools is not none }} {{ missing | length }} {{ messages[0].content | replace('\n', ' ') }} {{ messages[0]['content'][:5] }} {{ messages[9] is defined }}
quotes={{ "it's" }} {{ 'say "x"' }} {{ '\x41\101' }}
"##;

    const TOJSON_TEMPLATE: &str = r##"{{ messages | tojson }}
{{ {'name': 'café <b> & \'q\'', 'n': 3, 'f': 0.1, 'big': 1e20, 'small': 0.00001, 'whole': 2.0, 'neg': -1.5e-7, 'none': none, 'flag': true, 'list': []} | tojson }}
{{ {'b': 1, 'a': {'y': [1, 2], 'x': {}}} | tojson(indent=2, sort_keys=true) }}
{{ ['é', 'tab\there', '😀'] | tojson(ensure_ascii=true) }}
{{ {'a': 1, 'b': [2, 3]} | tojson(separators=(',', ':')) }}
{{ [1, [2]] | tojson(indent='--') }}
"##;

    const GENERATION_TEMPLATE: &str = r##"{%- for message in messages %}
{%- if message.role == 'assistant' %}
<|assistant|>
{% generation %}
{{ message.content }}<|end|>
{% endgeneration %}
{%- else %}
<|{{ message.role }}|>
{{ message.content }}<|end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|assistant|>
{% endif %}"##;

    fn llama3() -> ChatTemplate {
        ChatTemplate::from_source(
            LLAMA3_TEMPLATE,
            Some("<|begin_of_text|>".into()),
            Some("<|eot_id|>".into()),
        )
        .unwrap()
    }

    fn chatml() -> ChatTemplate {
        ChatTemplate::from_source(CHATML_TEMPLATE, None, Some("<|im_end|>".into())).unwrap()
    }

    fn mistral() -> ChatTemplate {
        ChatTemplate::from_source(MISTRAL_TEMPLATE, Some("<s>".into()), Some("</s>".into()))
            .unwrap()
    }

    /// Renders with the local date the template will see, allowing for the
    /// date to change while rendering.
    fn render_dated(
        template: &ChatTemplate,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        expected: impl Fn(&str) -> String,
    ) {
        let before = chrono::Local::now().format("%d %b %Y").to_string();
        let rendered = template.render(messages, add_generation_prompt).unwrap();
        let after = chrono::Local::now().format("%d %b %Y").to_string();
        assert!(
            rendered == expected(&before) || rendered == expected(&after),
            "rendered:\n{rendered:?}\nexpected:\n{:?}",
            expected(&before)
        );
    }

    #[test]
    fn llama3_with_system_prompt() {
        let messages = [
            ChatMessage::system("  Be brief.  \n"),
            ChatMessage::user(" What is 2+2? "),
            ChatMessage::assistant("4"),
            ChatMessage::user("And 3+3?"),
        ];
        render_dated(&llama3(), &messages, true, |date| {
            format!(
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nKnowledge cutoff: December 2023\nToday: {date}\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
            )
        });
    }

    #[test]
    fn llama3_default_system_prompt_without_generation_prompt() {
        let messages = [ChatMessage::user("Hi")];
        render_dated(&llama3(), &messages, false, |date| {
            format!(
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nKnowledge cutoff: December 2023\nToday: {date}\n\nYou are a concise assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            )
        });
    }

    #[test]
    fn chatml_strips_old_reasoning_and_marks_tool_responses() {
        let messages = [
            ChatMessage::system("You are terse."),
            ChatMessage::user("Hi"),
            ChatMessage::assistant("<think>\nplan\n</think>\n\nHello!"),
            ChatMessage::user("Weather?"),
            ChatMessage::assistant("<think>call tool</think>\nChecking."),
            ChatMessage::user("<tool_response>\n21C\n</tool_response>"),
        ];
        let rendered = chatml().render(&messages, true).unwrap();
        assert_eq!(
            rendered,
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>call tool</think>\nChecking.<|im_end|>\n<|im_start|>tool\n<tool_response>\n21C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn chatml_adds_default_system_prompt() {
        let messages = [ChatMessage::user("Hi"), ChatMessage::assistant("Hello")];
        let rendered = chatml().render(&messages, false).unwrap();
        assert_eq!(
            rendered,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
        );
    }

    #[test]
    fn chatml_rejects_roles_that_do_not_alternate() {
        let messages = [ChatMessage::user("a"), ChatMessage::user("b")];
        match chatml().render(&messages, true) {
            Err(ChatTemplateError::Rejected { message }) => assert_eq!(
                message,
                "Conversation roles must alternate user/assistant/user/assistant/..."
            ),
            other => panic!("expected a rejection, got {other:?}"),
        }
        let late_system = [ChatMessage::user("a"), ChatMessage::system("s")];
        let err = chatml().render(&late_system, true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the chat template rejected the conversation: The system message must come first."
        );
    }

    #[test]
    fn mistral_folds_system_prompt_into_first_instruction() {
        let messages = [
            ChatMessage::system("Answer in French."),
            ChatMessage::user("Hello"),
            ChatMessage::assistant("Bonjour"),
            ChatMessage::user("Thanks"),
        ];
        let rendered = mistral().render(&messages, true).unwrap();
        assert_eq!(
            rendered,
            "<s> [INST] Answer in French.\n\nHello [/INST] Bonjour</s> [INST] Thanks [/INST]"
        );
    }

    #[test]
    fn mistral_without_system_prompt() {
        let messages = [ChatMessage::user("Hello")];
        let rendered = mistral().render(&messages, false).unwrap();
        assert_eq!(rendered, "<s> [INST] Hello [/INST]");
    }

    #[test]
    fn mistral_rejects_bad_roles() {
        let starts_with_assistant = [ChatMessage::assistant("hi")];
        match mistral().render(&starts_with_assistant, true) {
            Err(ChatTemplateError::Rejected { message }) => assert_eq!(
                message,
                "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."
            ),
            other => panic!("expected a rejection, got {other:?}"),
        }
        let tool = [
            ChatMessage::user("hi"),
            ChatMessage {
                role: "tool".into(),
                content: "{}".into(),
                ..ChatMessage::default()
            },
        ];
        // "tool" in second place passes the alternation check (it is not
        // "user") and then hits the role check.
        match mistral().render(&tool, true) {
            Err(ChatTemplateError::Rejected { message }) => assert_eq!(
                message,
                "Only user and assistant roles are supported, with the exception of an initial optional system message!"
            ),
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn messages_tools_and_options_reach_the_template_as_transformers_passes_them() {
        let template = ChatTemplate::from_source(
            "{{ bos_token }}{{ messages | tojson }}{{ tools | tojson }}{{ enable_thinking }}",
            Some("<s>".into()),
            None,
        )
        .unwrap();
        let messages = [
            ChatMessage::user("hi"),
            ChatMessage {
                reasoning_content: Some("r".into()),
                ..ChatMessage::assistant("")
            },
        ];
        let tools = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
        let options = serde_json::json!({"enable_thinking": false});
        let rendered = template
            .render_with(&messages, Some(&tools), options.as_object().unwrap(), true)
            .unwrap();
        // What transformers 5 renders for the same input: None fields left
        // out, the reasoning also as `thinking`, keys in their order.
        assert_eq!(
            rendered,
            "<s>[{\"role\": \"user\", \"content\": \"hi\"}, {\"thinking\": \"r\", \"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"r\"}][{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]False"
        );
    }

    #[test]
    fn options_override_special_tokens_but_not_what_ondo_passes() {
        let template = ChatTemplate::from_source(
            "{{ bos_token }}|{{ messages | length }}",
            Some("<s>".into()),
            None,
        )
        .unwrap();
        let options = serde_json::json!({"bos_token": "<B>"});
        assert_eq!(
            template
                .render_with(&[], None, options.as_object().unwrap(), false)
                .unwrap(),
            "<B>|0"
        );
        for name in ["messages", "tools", "documents", "add_generation_prompt"] {
            let mut options = serde_json::Map::new();
            options.insert(name.to_owned(), true.into());
            match template.render_with(&[], None, &options, false) {
                Err(ChatTemplateError::ReservedOption { name: refused }) => {
                    assert_eq!(refused, name)
                }
                other => panic!("{name}: expected a refusal, got {other:?}"),
            }
        }
    }

    #[test]
    fn model_dir_tool_use_template_renders_when_tools_are_given() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            TOKENIZER_CONFIG,
            r#"{"chat_template": [
                {"name": "default", "template": "plain:{{ messages[0].content }}"},
                {"name": "tool_use", "template": "tools:{{ tools | length }}:{{ messages[0].content }}"}
            ]}"#,
        );
        let template = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        let messages = [ChatMessage::user("x")];
        let none = serde_json::Map::new();
        assert_eq!(
            template.render_with(&messages, None, &none, true).unwrap(),
            "plain:x"
        );
        let tools = [serde_json::json!({"type": "function"})];
        assert_eq!(
            template
                .render_with(&messages, Some(&tools), &none, true)
                .unwrap(),
            "tools:1:x"
        );
        assert!(template.source_for(true).starts_with("tools:"));
        assert!(template.source_for(false).starts_with("plain:"));
        // The default template never names tools, yet the model takes them.
        assert!(template.takes_tools());
    }

    /// What Ollama's `/api/show` lists as a model's capabilities.
    #[test]
    fn tools_and_thinking_are_read_from_the_templates() {
        let plain = ChatTemplate::from_source("{{ messages[0].content }}", None, None).unwrap();
        assert!(!plain.takes_tools());
        assert!(!plain.thinks());
        let tools = ChatTemplate::from_source(
            "{% if tools %}{{ tools | length }}{% endif %}{{ messages[0].content }}",
            None,
            None,
        )
        .unwrap();
        assert!(tools.takes_tools());
        let switch = ChatTemplate::from_source(
            "{% if enable_thinking %}<think>{% endif %}{{ messages[0].content }}",
            None,
            None,
        )
        .unwrap();
        assert!(switch.thinks() && switch.takes_enable_thinking());
        let always = ChatTemplate::from_source(
            "{{ messages[0].content.split('</think>')[-1] }}<think>",
            None,
            None,
        )
        .unwrap();
        assert!(always.thinks() && !always.takes_enable_thinking());
    }

    #[test]
    fn python_compatible_methods_filters_and_whitespace() {
        let template =
            ChatTemplate::from_source(COMPAT_TEMPLATE, Some("<s>".into()), None).unwrap();
        let messages = [
            ChatMessage::user("Hello World"),
            ChatMessage::assistant("Hi"),
            ChatMessage::user("Hey, how?"),
        ];
        let rendered = template.render(&messages, true).unwrap();
        assert_eq!(
            rendered,
            "roles=user,assistant,user users=2\ncase=HELLO WORLD hello world Hell0 W0rld\nsplit=a|b|c k|v=w\nstrip=[pad][hi][\n\nx][y]\nends=True True\nitems=role:user;content:Hello World;\nget=anon user\nslice=2 bc cba user\nloop=1/3,2/3,3/3\nbreak=ua\ncontinue=uu\ntokens=[<s>][][][]\ndefined=True True False None\nvalues=True 3 3.0 None ab3\nmacro=<b>x</b><i>y</i>\nternary=many\ntests=True True True\nindented block tags vanish with their line\nend"
        );
    }

    #[test]
    fn python_compatible_tests_and_loop_details() {
        let template = ChatTemplate::from_source(MORE_COMPAT_TEMPLATE, None, None).unwrap();
        let messages = [
            ChatMessage::system("sys prompt\nhere"),
            ChatMessage::user("hello there"),
            ChatMessage::assistant(" answer one "),
            ChatMessage::user("again"),
        ];
        let rendered = template.render(&messages, true).unwrap();
        assert_eq!(
            rendered,
            "0:User:Hello There\n1:Assistant: Answer One  prev=user\n2:User:Again prev=assistant\nlast=again first=system rev=user,assistant,user,system\nidx=3210\nthink=A\ndefault=dflt e int=43 str=5!\ndictsort=a1b2 items=b2a1\nprint={'role': 'system', 'content': 'sys prompt\\nhere'} ['a', 1, None, True] {'k': 'v'}\nlines=2 count=3 find=2\nrole=sys in=True notin=True\njoin=sys prompt\nhere / hello there / answer one / again\nset=True\nfmt=a-3 xxx 2.5 1024 -4 2 3.0 0.3333333333333333\nendswith=True True\ncmp=True True True 0 True\nbatch=False 4 2\nupper=STRASSE lower=àb trim=[wide]\nseq=True True False False True True True\nit=True True False False True True\nnum=True True False False True True True\nstr=False True True False False True\nmap=True False False False\ncall=True True\ncmp=True True True True True True True\ntools=False False 0 sys prompt here sys p False\nquotes=it's say \"x\" AA"
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let template = ChatTemplate::from_source(TOJSON_TEMPLATE, None, None).unwrap();
        let messages = [ChatMessage::user("say \"hi\"\n<ok>")];
        let rendered = template.render(&messages, false).unwrap();
        assert_eq!(
            rendered,
            "[{\"role\": \"user\", \"content\": \"say \\\"hi\\\"\\n<ok>\"}]\n{\"name\": \"café <b> & 'q'\", \"n\": 3, \"f\": 0.1, \"big\": 1e+20, \"small\": 1e-05, \"whole\": 2.0, \"neg\": -1.5e-07, \"none\": null, \"flag\": true, \"list\": []}\n{\n  \"a\": {\n    \"x\": {},\n    \"y\": [\n      1,\n      2\n    ]\n  },\n  \"b\": 1\n}\n[\"\\u00e9\", \"tab\\there\", \"\\ud83d\\ude00\"]\n{\"a\":1,\"b\":[2,3]}\n[\n--1,\n--[\n----2\n--]\n]"
        );
    }

    #[test]
    fn tojson_refuses_undefined_like_python() {
        let template = ChatTemplate::from_source("{{ missing | tojson }}", None, None).unwrap();
        let err = template.render(&[], false).unwrap_err();
        assert!(
            matches!(&err, ChatTemplateError::Render { message } if message.contains("not JSON serializable")),
            "{err:?}"
        );
    }

    #[test]
    fn python_float_repr_forms() {
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.1, "0.1"),
            (123.456, "123.456"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-10, "-2.5e-10"),
            (1e300, "1e+300"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (value, expected) in cases {
            assert_eq!(python_float_repr(value), expected, "{value}");
        }
    }

    #[test]
    fn generation_tags_render_their_body() {
        let template = ChatTemplate::from_source(GENERATION_TEMPLATE, None, None).unwrap();
        let messages = [ChatMessage::user("Hi"), ChatMessage::assistant("Hello")];
        let rendered = template.render(&messages, true).unwrap();
        assert_eq!(
            rendered,
            "<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n<|assistant|>\n"
        );
    }

    #[test]
    fn generation_rewrite_keeps_other_tags() {
        assert_eq!(
            rewrite_generation_tags("{%- generation -%}x{%+endgeneration%}{% generations %}"),
            "{%- with -%}x{%+endwith%}{% generations %}"
        );
    }

    #[test]
    fn carriage_returns_become_newlines_like_jinja2() {
        let template = ChatTemplate::from_source(
            "a\r\n{% if true %}\r\nb\rc\r\n{% endif %}\r\nd\r\n",
            None,
            None,
        )
        .unwrap();
        assert_eq!(template.render(&[], false).unwrap(), "a\nb\nc\nd");
    }

    #[test]
    fn strftime_now_uses_local_time() {
        let template =
            ChatTemplate::from_source("{{ strftime_now('%Y-%m-%d %B') }}", None, None).unwrap();
        let before = chrono::Local::now().format("%Y-%m-%d %B").to_string();
        let rendered = template.render(&[], false).unwrap();
        let after = chrono::Local::now().format("%Y-%m-%d %B").to_string();
        assert!(rendered == before || rendered == after, "{rendered}");
    }

    #[test]
    fn strftime_now_with_bad_format_is_an_error_not_a_panic() {
        let template = ChatTemplate::from_source("{{ strftime_now('%Q') }}", None, None).unwrap();
        assert!(matches!(
            template.render(&[], false),
            Err(ChatTemplateError::Render { .. })
        ));
    }

    #[test]
    fn chat_template_can_move_to_the_engine_thread() {
        fn send_and_sync<T: Send + Sync>() {}
        send_and_sync::<ChatTemplate>();
        send_and_sync::<ChatTemplateError>();
    }

    #[test]
    fn renders_repeatedly_from_one_compiled_template() {
        let template = mistral();
        let messages = [ChatMessage::user("Hello")];
        let first = template.render(&messages, false).unwrap();
        let second = template.clone().render(&messages, false).unwrap();
        assert_eq!(first, second);
    }

    #[test]
    fn syntax_error_is_invalid_at_load() {
        match ChatTemplate::from_source("{% for m in messages %}{{ m.content }}", None, None) {
            Err(ChatTemplateError::Invalid {
                path: None,
                message,
            }) => {
                assert!(message.contains("syntax error"), "{message}");
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn undefined_attribute_is_a_render_error() {
        let template = ChatTemplate::from_source("{{ messages[0].content }}", None, None).unwrap();
        assert!(matches!(
            template.render(&[], false),
            Err(ChatTemplateError::Render { .. })
        ));
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn model_dir_prefers_chat_template_jinja() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            JINJA_FILE,
            "{{ bos_token }}{{ messages[0].content }}\n",
        );
        write(
            dir.path(),
            TOKENIZER_CONFIG,
            r#"{"chat_template": "from config", "bos_token": "<s>", "eos_token": "</s>"}"#,
        );
        let template = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        assert_eq!(template.bos_token(), Some("<s>"));
        assert_eq!(template.eos_token(), Some("</s>"));
        assert_eq!(
            template.render(&[ChatMessage::user("hi")], false).unwrap(),
            "<s>hi"
        );
    }

    #[test]
    fn model_dir_jinja_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            JINJA_FILE,
            "[{{ bos_token }}]{{ messages | length }}",
        );
        let template = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        assert_eq!(template.bos_token(), None);
        assert_eq!(template.render(&[], false).unwrap(), "[]0");
    }

    #[test]
    fn model_dir_string_template_in_tokenizer_config() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            TOKENIZER_CONFIG,
            r#"{
                "chat_template": "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": null
            }"#,
        );
        let template = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        let messages = [ChatMessage::user("a"), ChatMessage::assistant("b")];
        assert_eq!(
            template.render(&messages, false).unwrap(),
            "user: a</s>assistant: b</s>"
        );
    }

    #[test]
    fn model_dir_named_templates_use_default() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            TOKENIZER_CONFIG,
            r#"{"chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "default:{{ messages[0].content }}"}
            ]}"#,
        );
        let template = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        assert_eq!(
            template.render(&[ChatMessage::user("x")], true).unwrap(),
            "default:x"
        );
    }

    #[test]
    fn model_dir_named_templates_without_default_are_invalid() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            TOKENIZER_CONFIG,
            r#"{"chat_template": [{"name": "tool_use", "template": "tools"}]}"#,
        );
        match ChatTemplate::from_model_dir(dir.path()) {
            Err(ChatTemplateError::Invalid { path, .. }) => {
                assert_eq!(path, Some(dir.path().join(TOKENIZER_CONFIG)));
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn model_dir_added_token_objects() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            TOKENIZER_CONFIG,
            r#"{
                "chat_template": "{{ bos_token }}|{{ messages[0].content }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token }}",
                "bos_token": {"__type": "AddedToken", "content": "<|begin|>", "lstrip": false, "normalized": false, "rstrip": false, "single_word": false},
                "eos_token": {"__type": "AddedToken", "content": "<|end|>", "lstrip": false, "normalized": false, "rstrip": false, "single_word": false},
                "unk_token": "<unk>",
                "pad_token": {"content": "<pad>"}
            }"#,
        );
        let template = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        assert_eq!(template.eos_token(), Some("<|end|>"));
        assert_eq!(
            template.render(&[ChatMessage::user("x")], false).unwrap(),
            "<|begin|>|x|<|end|>|<unk>|<pad>"
        );
    }

    #[test]
    fn model_dir_without_template_is_none() {
        let empty = tempfile::tempdir().unwrap();
        assert!(
            ChatTemplate::from_model_dir(empty.path())
                .unwrap()
                .is_none()
        );

        let no_template = tempfile::tempdir().unwrap();
        write(
            no_template.path(),
            TOKENIZER_CONFIG,
            r#"{"eos_token": "</s>"}"#,
        );
        assert!(
            ChatTemplate::from_model_dir(no_template.path())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn model_dir_syntax_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            JINJA_FILE,
            "line one\n{% if messages %}\nnever closed\n",
        );
        let err = ChatTemplate::from_model_dir(dir.path()).unwrap_err();
        let jinja_path = dir.path().join(JINJA_FILE);
        match &err {
            ChatTemplateError::Invalid { path, .. } => assert_eq!(path.as_ref(), Some(&jinja_path)),
            other => panic!("expected Invalid, got {other:?}"),
        }
        assert!(
            err.to_string().contains(&jinja_path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn model_dir_broken_tokenizer_config_is_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), TOKENIZER_CONFIG, "{ not json");
        match ChatTemplate::from_model_dir(dir.path()) {
            Err(ChatTemplateError::Unreadable { path, .. }) => {
                assert_eq!(path, dir.path().join(TOKENIZER_CONFIG));
            }
            other => panic!("expected Unreadable, got {other:?}"),
        }
    }
}
