//! Output held to a grammar: any JSON object, or JSON valid against a
//! schema. `llguidance` (the grammar engine behind llama.cpp's and vLLM's
//! structured outputs) walks the grammar as tokens are drawn and says, for
//! each step, which tokens may come next; the step's log-probabilities of
//! every other token become -inf before the sampler draws.
//!
//! The mask for a step needs the token before it, so a constrained step
//! cannot be queued from a lazy token as the pipelined loop queues an
//! unconstrained one. The forward pass needs no mask, though: it is queued
//! first, and the mask is worked out on the host while the device runs it;
//! only the draw (a few element-wise operations) waits for the mask.
//!
//! A mask crosses to the device as bytes (one bit per token, vocab/8
//! bytes) and is unpacked there, so the host copies kilobytes per token,
//! not a float per token of the vocabulary.

use std::sync::Arc;
use std::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv};
use llguidance::{Matcher, ParserFactory};
use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, ops};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::family::ToolCallSyntax;

/// Whitespace between two JSON tokens, at most this many characters: a
/// model cannot spend its tokens on blank space, and pretty-printing a
/// dozen levels deep still fits.
const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,32}";

/// What a reply is held to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum OutputConstraint {
    /// Any JSON object (OpenAI's `json_object`, Ollama's `"json"`).
    JsonObject,
    /// JSON valid against `schema`. `strict` refuses a schema with keywords
    /// the grammar cannot hold the output to; otherwise those keywords are
    /// left unenforced (OpenAI's `strict: false`).
    JsonSchema {
        schema: Value,
        #[serde(default)]
        strict: bool,
    },
    /// A call to one of `tools` (OpenAI-style function tools), in the
    /// model's own tool-call syntax, its arguments valid against the
    /// tool's parameters: what `tool_choice` "required" (Anthropic's "any")
    /// or a tool by name asks for.
    ToolCall { tools: Vec<Value> },
}

impl OutputConstraint {
    /// The record's word for it: "json_object" or "json_schema".
    pub fn kind(&self) -> &'static str {
        match self {
            OutputConstraint::JsonObject => "json_object",
            OutputConstraint::JsonSchema { .. } => "json_schema",
            OutputConstraint::ToolCall { .. } => "tool_call",
        }
    }

    /// The grammar llguidance compiles: the schema with Ondo's whitespace
    /// bound, unless the schema sets its own `x-guidance` options. A tool
    /// call's grammar needs the model's tool-call `syntax`; `None` when the
    /// syntax is one Ondo does not hold calls to (the call is then left to
    /// the model).
    fn grammar(&self, syntax: Option<ToolCallSyntax>) -> Result<Option<TopLevelGrammar>, String> {
        let (mut schema, strict) = match self {
            OutputConstraint::JsonObject => (json!({"type": "object"}), true),
            OutputConstraint::JsonSchema { schema, strict } => (schema.clone(), *strict),
            OutputConstraint::ToolCall { tools } => return tool_call_grammar(tools, syntax),
        };
        match &mut schema {
            Value::Object(map) => {
                map.entry("x-guidance").or_insert_with(
                    || json!({"whitespace_pattern": JSON_WHITESPACE, "lenient": !strict}),
                );
            }
            // `true` accepts any JSON; `false` none; anything else is no schema.
            Value::Bool(_) => {}
            other => {
                return Err(format!(
                    "a JSON schema is an object (or true/false), not {}",
                    json_kind(other)
                ));
            }
        }
        Ok(Some(TopLevelGrammar::from_json_schema(schema)))
    }

    /// Checks that the grammar compiles, without a model: what a server
    /// answers 400 with before anything is queued or loaded. The reason is
    /// llguidance's own words.
    pub fn check(&self) -> Result<(), String> {
        let Some(grammar) = self.grammar(Some(ToolCallSyntax::Tagged))? else {
            return Ok(());
        };
        let factory = ParserFactory::new_simple(&ApproximateTokEnv::single_byte_env())
            .map_err(|e| e.to_string())?;
        let mut factory = factory;
        factory.quiet();
        factory
            .create_parser(grammar)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// One call to one of `tools`, in `syntax`: Hermes/Qwen's
/// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` or Llama's
/// bare `{"name": ..., "parameters": {...}}`.
fn tool_call_grammar(
    tools: &[Value],
    syntax: Option<ToolCallSyntax>,
) -> Result<Option<TopLevelGrammar>, String> {
    let (arguments, wrap): (&str, fn(&str) -> String) = match syntax {
        Some(ToolCallSyntax::Tagged) => ("arguments", |call| {
            format!("start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: {call}\n")
        }),
        Some(ToolCallSyntax::BareJson) => {
            ("parameters", |call| format!("start: call\ncall: {call}\n"))
        }
        _ => return Ok(None),
    };
    let mut calls = Vec::with_capacity(tools.len());
    for tool in tools {
        let function = tool.get("function").unwrap_or(tool);
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or("a tool has no name")?;
        let parameters = function
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        calls.push(json!({
            "type": "object",
            "properties": {"name": {"const": name}, arguments: parameters},
            "required": ["name", arguments],
            "additionalProperties": false,
        }));
    }
    let mut schema = match <[Value; 1]>::try_from(calls) {
        Ok([only]) => only,
        Err(calls) if calls.is_empty() => return Err("no tool to call".into()),
        Err(calls) => json!({"anyOf": calls}),
    };
    schema["x-guidance"] = json!({"whitespace_pattern": JSON_WHITESPACE, "lenient": true});
    Ok(Some(TopLevelGrammar::from_lark(wrap(&format!(
        "%json {schema}"
    )))))
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A model's vocabulary as the grammar engine sees it (each token's bytes),
/// and the arrays that unpack a mask on the device. Built once per loaded
/// model, the first time a constrained request arrives.
pub struct Grammars {
    factory: ParserFactory,
    /// Token i's mask byte, `i / 8`, and its bit's value, `2^(i % 8)`.
    byte_of_token: Array,
    bit_of_token: Array,
    vocab: usize,
    /// The model's stop tokens: drawing one ends the reply, grammar or not.
    stop_tokens: Vec<u32>,
    /// Milliseconds it took to build.
    pub build_ms: f64,
}

impl Grammars {
    /// The vocabulary of `tokenizer.json` (padded to `vocab`, the width of
    /// the model's logits), ending with any of `stop_tokens`.
    pub fn new(
        tokenizer_json: &std::path::Path,
        stop_tokens: &[u32],
        vocab: usize,
    ) -> Result<Self, String> {
        let started = Instant::now();
        let mut tokenizer = toktrie_hf_tokenizers::ByteTokenizer::from_file(tokenizer_json)
            .map_err(|e| format!("the tokenizer cannot be read as bytes: {e}"))?;
        let stops: Vec<u32> = stop_tokens
            .iter()
            .copied()
            .filter(|&t| (t as usize) < tokenizer.tokrx_info().vocab_size as usize)
            .collect();
        if !stops.is_empty() {
            tokenizer.set_eos_tokens(&stops);
        }
        let env: TokEnv = tokenizer
            .into_tok_env(Some(vocab))
            .map_err(|e| format!("the tokenizer does not fit the model's vocabulary: {e}"))?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        let byte_of_token: Vec<i32> = (0..vocab as i32).map(|i| i / 8).collect();
        let bit_of_token: Vec<i32> = (0..vocab as i32).map(|i| 1 << (i % 8)).collect();
        Ok(Self {
            factory,
            byte_of_token: Array::from_slice(&byte_of_token, &[vocab as i32]),
            bit_of_token: Array::from_slice(&bit_of_token, &[vocab as i32]),
            vocab,
            stop_tokens: stop_tokens.to_vec(),
            build_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Bytes a mask of this vocabulary takes.
    pub fn mask_len(&self) -> usize {
        self.vocab.div_ceil(32) * 4
    }

    /// A walker of `constraint`'s grammar from its start, for a reply in
    /// `syntax` (a tool call's); `None` when the grammar needs a syntax
    /// Ondo does not hold calls to.
    pub fn start(
        self: &Arc<Self>,
        constraint: &OutputConstraint,
        syntax: Option<ToolCallSyntax>,
    ) -> Result<Option<TokenConstraint>, String> {
        let started = Instant::now();
        let Some(grammar) = constraint.grammar(syntax)? else {
            return Ok(None);
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(error);
        }
        Ok(Some(TokenConstraint {
            grammars: Arc::clone(self),
            matcher,
            kind: constraint.kind(),
            compile_ms: started.elapsed().as_secs_f64() * 1e3,
            mask_secs: 0.0,
            masks: 0,
        }))
    }

    /// `logprobs` (`[B, vocab]`) with every token a row's mask leaves out at
    /// -inf; `masks` holds one packed mask per row (`mask_len` bytes), all
    /// ones for a row that is not constrained.
    pub fn apply(&self, logprobs: &Array, masks: &[u8], rows: usize) -> Result<Array, Exception> {
        let width = self.mask_len() as i32;
        let packed = Array::from_slice(masks, &[rows as i32, width]).as_dtype(Dtype::Int32)?;
        let bytes = packed.take_axis(&self.byte_of_token, 1)?;
        let allowed = ops::ne(
            &ops::remainder(
                &ops::floor_divide(&bytes, &self.bit_of_token)?,
                Array::from_int(2),
            )?,
            Array::from_int(0),
        )?;
        let neg_inf = Array::from_f32(f32::NEG_INFINITY).as_dtype(logprobs.dtype())?;
        ops::select(&allowed, logprobs, &neg_inf)
    }

    /// A mask that allows every token.
    pub fn allow_all(&self) -> Vec<u8> {
        vec![0xff; self.mask_len()]
    }
}

/// One reply's walk through its grammar.
pub struct TokenConstraint {
    grammars: Arc<Grammars>,
    matcher: Matcher,
    kind: &'static str,
    compile_ms: f64,
    mask_secs: f64,
    masks: usize,
}

/// What a constrained run records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ConstraintStats {
    /// "json_object", "json_schema" or "tool_call".
    pub kind: String,
    /// Compiling the grammar for this run (the vocabulary's own set-up,
    /// once per loaded model, included when this run paid it).
    pub compile_ms: f64,
    /// Host time working out which tokens may come next, per token.
    pub mask_ms_per_token: f64,
    /// Masks worked out (one per token drawn).
    pub masks: usize,
}

impl TokenConstraint {
    pub fn grammars(&self) -> &Arc<Grammars> {
        &self.grammars
    }

    /// Adds set-up time this run paid beside its own grammar (the
    /// vocabulary's, when this run was the model's first constrained one).
    pub fn add_setup_ms(&mut self, ms: f64) {
        self.compile_ms += ms;
    }

    /// The packed mask of the tokens that may come next (`mask_len` bytes,
    /// bit `i % 8` of byte `i / 8` for token `i`): the stop tokens only
    /// once the grammar is complete.
    pub fn next_mask(&mut self) -> Result<Vec<u8>, String> {
        let started = Instant::now();
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| {
            format!("the output constraint failed: {e}; send the request again without it")
        })?;
        let mut bytes = Vec::with_capacity(self.grammars.mask_len());
        for word in mask.as_slice() {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.resize(self.grammars.mask_len(), 0);
        self.mask_secs += started.elapsed().as_secs_f64();
        self.masks += 1;
        Ok(bytes)
    }

    /// Moves past `token`, one the last mask allowed (a stop token ends
    /// the reply, so the grammar has nothing to move past).
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        if self.grammars.stop_tokens.contains(&token) {
            return Ok(());
        }
        let started = Instant::now();
        let result = self
            .matcher
            .consume_token(token)
            .map_err(|e| format!("the model's token {token} left the output's grammar: {e}"));
        self.mask_secs += started.elapsed().as_secs_f64();
        result
    }

    /// The grammar is complete and allows nothing more: the reply ends
    /// here, as if the model had drawn its stop token.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }

    pub fn stats(&self) -> ConstraintStats {
        ConstraintStats {
            kind: self.kind.into(),
            compile_ms: self.compile_ms,
            mask_ms_per_token: if self.masks == 0 {
                0.0
            } else {
                self.mask_secs * 1e3 / self.masks as f64
            },
            masks: self.masks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_the_grammar_cannot_hold_is_refused_with_its_reason() {
        let strict = OutputConstraint::JsonSchema {
            schema: json!({"type": "object", "properties": {"a": {"type": "strng"}}}),
            strict: true,
        };
        let reason = strict.check().unwrap_err();
        assert!(reason.contains("strng"), "{reason}");
        let not_a_schema = OutputConstraint::JsonSchema {
            schema: json!("object"),
            strict: false,
        };
        assert!(not_a_schema.check().unwrap_err().contains("a string"));
        assert!(OutputConstraint::JsonObject.check().is_ok());
        let fine = OutputConstraint::JsonSchema {
            schema: json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
            strict: true,
        };
        assert!(fine.check().is_ok());
    }
}
