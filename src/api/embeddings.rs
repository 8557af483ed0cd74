//! Embeddings over HTTP: OpenAI's `POST /v1/embeddings` and Ollama's
//! `POST /api/embed` (and its older `POST /api/embeddings`). Each dialect
//! reads its body into one `EmbedRequest`; the inputs of a request run as
//! one batch on the engine, in the pool's warm model, recorded as a run of
//! kind `embed`. Errors take each dialect's shape (`error.rs`).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::generation::{KeepAliveAsked, RequestLog};
use super::{ApiError, ApiFailure, ServerState, parse_body, user_agent};
use crate::engine::RunError;
use crate::engine::embed::{EmbedInput, EmbedOutcome, EmbedRequest};
use crate::resolve::ResolvedModel;
use crate::run_kinds::RunKind;
use crate::session::record::RunContext;
use crate::store::RunRecord;

/// What a dialect asks of the engine.
struct EmbedAsk {
    route: &'static str,
    model: String,
    inputs: Vec<EmbedInput>,
    truncate: bool,
    dimensions: Option<usize>,
    keep_alive: KeepAliveAsked,
    user_agent: Option<String>,
}

/// What came back, with the times a dialect reports.
struct Embedded {
    model: ResolvedModel,
    outcome: EmbedOutcome,
    record: RunRecord,
    total_ns: u64,
}

impl ServerState {
    /// Resolves the model, waits a turn at the engine and embeds.
    async fn embed(self: &Arc<Self>, ask: EmbedAsk) -> Result<Embedded, ApiError> {
        let received = Instant::now();
        let saved = self.saved_settings().await;
        let model = match self.resolve(&ask.model, &saved).await {
            Ok(model) => model,
            Err(error) => {
                self.log_failure(&ask, &error);
                return Err(error);
            }
        };
        let turn = self.queue.wait_turn().await?;
        let state = self.clone();
        let held = model.clone();
        let request = EmbedRequest {
            model_dir: model.dir.clone(),
            inputs: ask.inputs.clone(),
            truncate: ask.truncate,
            dimensions: ask.dimensions,
        };
        let context = RunContext {
            user_agent: ask.user_agent.clone(),
            ..model.run_context(RunKind::Embed)
        };
        let keep_alive = ask.keep_alive;
        let (route, user_agent) = (ask.route, ask.user_agent.clone());
        let result = tokio::task::spawn_blocking(move || {
            // In the server's status while it runs, and counted as served.
            let flight = state.flights.begin_route(
                route,
                user_agent,
                &held.name,
                crate::engine::CancelToken::new(),
            );
            let at_engine = Instant::now();
            let result = state.pool.embed(request, context);
            drop(flight);
            state.queue.note_run(at_engine.elapsed());
            let keep = match keep_alive {
                KeepAliveAsked::Unchanged => None,
                KeepAliveAsked::PoolDefault => Some(None),
                KeepAliveAsked::For(keep) => Some(Some(keep)),
            };
            if let Some(keep) = keep {
                let _ = state.pool.keep_model_alive(&held.dir, keep);
            }
            // The next request may have the engine.
            drop(turn);
            result
        })
        .await
        .map_err(|e| ApiError::Run(RunError::Internal(e.to_string())))?;
        match result {
            Ok((outcome, record)) => {
                let log = RequestLog {
                    model: Some(model.name.clone()),
                    prompt_tokens: Some(record.prompt_tokens),
                    ttft_ms: Some(record.prefill_ms),
                    ..RequestLog::plain(ask.route, 200, ask.user_agent.clone())
                };
                (self.on_request)(&log);
                Ok(Embedded {
                    model,
                    outcome,
                    record,
                    total_ns: received.elapsed().as_nanos() as u64,
                })
            }
            Err(error) => {
                let error = ApiError::of_run(&model, error);
                self.log_failure(&ask, &error);
                Err(error)
            }
        }
    }

    fn log_failure(&self, ask: &EmbedAsk, error: &ApiError) {
        (self.on_request)(&RequestLog::of_failure(
            ask.route,
            Some(ask.model.clone()),
            error,
            ask.user_agent.clone(),
        ));
    }
}

/// OpenAI's `input`: a string, a list of strings, a list of token ids, or a
/// list of lists of token ids.
fn openai_inputs(input: &Value) -> Result<Vec<EmbedInput>, ApiError> {
    let refused = || {
        ApiError::InvalidField(
            "input must be a string, a list of strings, a list of token ids or a list of lists of token ids".into(),
        )
    };
    let token = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    let inputs = match input {
        Value::String(text) => vec![EmbedInput::Text(text.clone())],
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::InvalidField(
                "input is an empty list; send at least one string".into(),
            ));
        }
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .map(|v| EmbedInput::Text(v.as_str().unwrap_or_default().to_owned()))
            .collect(),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            let ids: Option<Vec<u32>> = items.iter().map(token).collect();
            vec![EmbedInput::Tokens(ids.ok_or_else(refused)?)]
        }
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|row| {
                let ids: Option<Vec<u32>> = row.as_array()?.iter().map(token).collect();
                ids.map(EmbedInput::Tokens)
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(refused)?,
        _ => return Err(refused()),
    };
    if inputs.iter().any(|i| match i {
        EmbedInput::Text(text) => text.is_empty(),
        EmbedInput::Tokens(ids) => ids.is_empty(),
    }) {
        return Err(ApiError::InvalidField(
            "input holds an empty string (or an empty list of tokens); every input needs text"
                .into(),
        ));
    }
    Ok(inputs)
}

#[derive(Debug, Deserialize)]
struct OpenAiEmbeddingsIn {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    /// The end user, for abuse monitoring: nothing to do with it here.
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

/// `POST /v1/embeddings`.
pub(super) async fn openai_embeddings(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let request: OpenAiEmbeddingsIn = parse_body(body).map_err(ApiFailure::openai)?;
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiFailure::openai(ApiError::InvalidField(format!(
                "encoding_format is '{other}'; use 'float' or 'base64'"
            ))));
        }
    };
    let inputs = openai_inputs(&request.input).map_err(ApiFailure::openai)?;
    let ask = EmbedAsk {
        route: "POST /v1/embeddings",
        model: request.model,
        inputs,
        // OpenAI refuses an input beyond the model's context.
        truncate: false,
        dimensions: request.dimensions,
        keep_alive: KeepAliveAsked::Unchanged,
        user_agent: user_agent(&headers),
    };
    let done = state.embed(ask).await.map_err(ApiFailure::openai)?;
    let data: Vec<Value> = done
        .outcome
        .vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                Value::String(base64_f32_le(vector))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let tokens = done.record.prompt_tokens;
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": done.model.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// Ollama's `input`: a string or a list of strings.
fn ollama_inputs(input: &Value) -> Result<Vec<EmbedInput>, ApiError> {
    match input {
        Value::Null => Ok(Vec::new()),
        Value::String(text) if text.is_empty() => Ok(Vec::new()),
        Value::String(text) => Ok(vec![EmbedInput::Text(text.clone())]),
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::String(text) if !text.is_empty() => Ok(EmbedInput::Text(text.clone())),
                _ => Err(ApiError::InvalidField(
                    "input must be a string or a list of non-empty strings".into(),
                )),
            })
            .collect(),
        _ => Err(ApiError::InvalidField(
            "input must be a string or a list of strings".into(),
        )),
    }
}

#[derive(Debug, Deserialize)]
struct OllamaEmbedIn {
    model: String,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    keep_alive: Option<Value>,
}

fn ollama_keep_alive(value: Option<&Value>) -> Result<KeepAliveAsked, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(KeepAliveAsked::PoolDefault),
        Some(value) => super::ollama::keep_alive_from(value).map(KeepAliveAsked::For),
    }
}

/// `POST /api/embed`.
pub(super) async fn ollama_embed(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let request: OllamaEmbedIn = parse_body(body).map_err(ApiFailure::ollama)?;
    let inputs = ollama_inputs(&request.input).map_err(ApiFailure::ollama)?;
    let keep_alive = ollama_keep_alive(request.keep_alive.as_ref()).map_err(ApiFailure::ollama)?;
    if inputs.is_empty() {
        // Ollama answers an empty input with no vectors (it loads the model).
        return Ok(axum::Json(json!({"model": request.model, "embeddings": []})).into_response());
    }
    let ask = EmbedAsk {
        route: "POST /api/embed",
        model: request.model,
        inputs,
        // Ollama cuts an input to the context unless told not to.
        truncate: request.truncate.unwrap_or(true),
        dimensions: request.dimensions,
        keep_alive,
        user_agent: user_agent(&headers),
    };
    let done = state.embed(ask).await.map_err(ApiFailure::ollama)?;
    let load_ns = (done.outcome.stats.load_ms * 1e6) as u64;
    Ok(axum::Json(json!({
        "model": done.model.name,
        "embeddings": done.outcome.vectors,
        "total_duration": done.total_ns,
        "load_duration": load_ns,
        "prompt_eval_count": done.record.prompt_tokens,
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
struct OllamaEmbeddingsIn {
    model: String,
    prompt: String,
    #[serde(default)]
    keep_alive: Option<Value>,
}

/// `POST /api/embeddings`: Ollama's older route, one prompt, one vector.
pub(super) async fn ollama_embeddings(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let request: OllamaEmbeddingsIn = parse_body(body).map_err(ApiFailure::ollama)?;
    let keep_alive = ollama_keep_alive(request.keep_alive.as_ref()).map_err(ApiFailure::ollama)?;
    if request.prompt.is_empty() {
        return Ok(axum::Json(json!({"embedding": []})).into_response());
    }
    let ask = EmbedAsk {
        route: "POST /api/embeddings",
        model: request.model,
        inputs: vec![EmbedInput::Text(request.prompt)],
        truncate: true,
        dimensions: None,
        keep_alive,
        user_agent: user_agent(&headers),
    };
    let done = state.embed(ask).await.map_err(ApiFailure::ollama)?;
    let vector = done.outcome.vectors.into_iter().next().unwrap_or_default();
    Ok(axum::Json(json!({"embedding": vector})).into_response())
}

/// A vector as OpenAI's `encoding_format: "base64"` sends it: the f32
/// values' little-endian bytes in standard base64 with padding.
fn base64_f32_le(vector: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_encoding() {
        // 1.0f32 is 00 00 80 3f little-endian: "AACAPw==".
        assert_eq!(base64_f32_le(&[1.0]), "AACAPw==");
        // Two values: 8 bytes, one padding character.
        assert_eq!(base64_f32_le(&[1.0, -2.0]), "AACAPwAAAMA=");
        assert_eq!(base64_f32_le(&[]), "");
    }

    #[test]
    fn openai_input_takes_every_shape() {
        assert_eq!(openai_inputs(&json!("a")).unwrap().len(), 1);
        assert_eq!(openai_inputs(&json!(["a", "b"])).unwrap().len(), 2);
        assert_eq!(
            openai_inputs(&json!([1, 2, 3])).unwrap(),
            vec![EmbedInput::Tokens(vec![1, 2, 3])]
        );
        assert_eq!(openai_inputs(&json!([[1], [2, 3]])).unwrap().len(), 2);
        assert!(openai_inputs(&json!([])).is_err());
        assert!(openai_inputs(&json!("")).is_err());
        assert!(openai_inputs(&json!([-1])).is_err());
        assert!(openai_inputs(&json!({"a": 1})).is_err());
    }
}
