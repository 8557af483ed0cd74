//! What each dialect calls output held to JSON, read into one
//! `OutputConstraint`: OpenAI chat's `response_format`, the Responses API's
//! `text.format`, Ollama's `format` and Anthropic's `output_format`. A
//! schema the grammar engine cannot compile is refused here, before
//! anything is queued or loaded, with the engine's own reason.

use serde_json::Value;

use super::error::ApiError;
use crate::engine::Prompt;
use crate::engine::constrain::OutputConstraint;

/// OpenAI chat's `response_format`: `{"type": "text" | "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
pub(crate) fn openai_response_format(
    format: Option<&Value>,
) -> Result<Option<OutputConstraint>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let constraint = match type_of(format, "response_format")? {
        "text" => return Ok(None),
        "json_object" => OutputConstraint::JsonObject,
        "json_schema" => {
            let inner = format.get("json_schema").ok_or_else(|| {
                ApiError::InvalidField(
                    "response_format json_schema needs a json_schema object with its schema".into(),
                )
            })?;
            schema_in(inner, "response_format.json_schema")?
        }
        other => return Err(unknown(other, "response_format")),
    };
    checked(constraint, "response_format")
}

/// The Responses API's `text.format`: like chat's, with the schema's
/// fields beside `type` (`{"type": "json_schema", "name", "schema",
/// "strict"}`).
pub(crate) fn responses_text_format(
    format: Option<&Value>,
) -> Result<Option<OutputConstraint>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let constraint = match type_of(format, "text.format")? {
        "text" => return Ok(None),
        "json_object" => OutputConstraint::JsonObject,
        "json_schema" => schema_in(format, "text.format")?,
        other => return Err(unknown(other, "text.format")),
    };
    checked(constraint, "text.format")
}

/// Ollama's `format`: `"json"`, or a JSON schema itself. Ollama holds a
/// schema to what its grammar can express, so keywords it cannot hold are
/// left unenforced rather than refused.
pub(crate) fn ollama_format(format: Option<&Value>) -> Result<Option<OutputConstraint>, ApiError> {
    let constraint = match format {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) if s == "json" => OutputConstraint::JsonObject,
        Some(Value::String(s)) => {
            return Err(ApiError::InvalidField(format!(
                "format '{s}' is not one Ollama knows; send \"json\" or a JSON schema"
            )));
        }
        Some(schema @ Value::Object(_)) => OutputConstraint::JsonSchema {
            schema: schema.clone(),
            strict: false,
        },
        Some(other) => {
            return Err(ApiError::InvalidField(format!(
                "format must be \"json\" or a JSON schema object, not {other}"
            )));
        }
    };
    checked(constraint, "format")
}

/// Anthropic's structured outputs: `output_format` (and the newer
/// `output_config.format`), `{"type": "json_schema", "schema": {...}}`.
/// Anthropic's are always strict.
pub(crate) fn anthropic_output_format(
    output_format: Option<&Value>,
    output_config_format: Option<&Value>,
) -> Result<Option<OutputConstraint>, ApiError> {
    let format = output_format
        .filter(|f| !f.is_null())
        .or(output_config_format)
        .filter(|f| !f.is_null());
    let Some(format) = format else {
        return Ok(None);
    };
    let constraint = match type_of(format, "output_format")? {
        "json_schema" => match format.get("schema") {
            Some(schema) => OutputConstraint::JsonSchema {
                schema: schema.clone(),
                strict: true,
            },
            None => {
                return Err(ApiError::InvalidField(
                    "output_format json_schema needs its schema".into(),
                ));
            }
        },
        other => return Err(unknown(other, "output_format")),
    };
    checked(constraint, "output_format")
}

/// A call the request forces (OpenAI's `tool_choice` "required" or a
/// function by name, Anthropic's "any" or a tool by name), held to the
/// offered tools' schemas, when `prompt` offers tools. It takes the place of
/// any output format: the reply is the call.
pub(crate) fn forced_tool_call(forced: bool, prompt: &Prompt) -> Option<OutputConstraint> {
    match prompt {
        Prompt::Chat {
            tools: Some(tools), ..
        } if forced && !tools.is_empty() => Some(OutputConstraint::ToolCall {
            tools: tools.clone(),
        }),
        _ => None,
    }
}

fn type_of<'a>(format: &'a Value, field: &str) -> Result<&'a str, ApiError> {
    format.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::InvalidField(format!(
            "{field} needs a type: \"text\", \"json_object\" or \"json_schema\""
        ))
    })
}

fn unknown(kind: &str, field: &str) -> ApiError {
    ApiError::InvalidField(format!(
        "{field} type '{kind}' is not supported; use \"text\", \"json_object\" or \"json_schema\""
    ))
}

/// The `schema` and `strict` fields of `holder` (OpenAI's default for
/// `strict` is false).
fn schema_in(holder: &Value, field: &str) -> Result<OutputConstraint, ApiError> {
    let schema = holder
        .get("schema")
        .cloned()
        .ok_or_else(|| ApiError::InvalidField(format!("{field} needs its schema")))?;
    Ok(OutputConstraint::JsonSchema {
        schema,
        strict: holder
            .get("strict")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

fn checked(
    constraint: OutputConstraint,
    field: &str,
) -> Result<Option<OutputConstraint>, ApiError> {
    constraint.check().map_err(|reason| {
        ApiError::InvalidField(format!("{field}: the schema cannot be enforced: {reason}"))
    })?;
    Ok(Some(constraint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_dialect_names_the_same_constraints_its_own_way() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let held = OutputConstraint::JsonSchema {
            schema: schema.clone(),
            strict: true,
        };
        assert_eq!(
            openai_response_format(Some(&json!({"type": "json_schema",
                "json_schema": {"name": "x", "schema": schema, "strict": true}})))
            .unwrap(),
            Some(held.clone())
        );
        assert_eq!(
            responses_text_format(Some(&json!({"type": "json_schema", "name": "x",
                "schema": schema, "strict": true})))
            .unwrap(),
            Some(held.clone())
        );
        assert_eq!(
            anthropic_output_format(
                None,
                Some(&json!({"type": "json_schema", "schema": schema}))
            )
            .unwrap(),
            Some(held)
        );
        assert_eq!(
            ollama_format(Some(&json!("json"))).unwrap(),
            Some(OutputConstraint::JsonObject)
        );
        assert_eq!(
            openai_response_format(Some(&json!({"type": "text"}))).unwrap(),
            None
        );
        assert_eq!(ollama_format(Some(&json!(""))).unwrap(), None);
    }

    #[test]
    fn a_schema_the_engine_refuses_is_a_bad_request_quoting_why() {
        let error = openai_response_format(Some(&json!({"type": "json_schema",
            "json_schema": {"name": "x", "strict": true,
                "schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}})))
        .unwrap_err();
        let ApiError::InvalidField(message) = error else {
            panic!("{error:?}")
        };
        assert!(
            message.contains("response_format") && message.contains("strng"),
            "{message}"
        );
        assert!(matches!(
            openai_response_format(Some(&json!({"type": "grammar"}))),
            Err(ApiError::InvalidField(_))
        ));
        assert!(matches!(
            ollama_format(Some(&json!("yaml"))),
            Err(ApiError::InvalidField(_))
        ));
    }
}
