//! The chat templates of real model families (tests/fixtures/chat_templates)
//! rendered by Ondo and by Hugging Face transformers give the same prompt,
//! byte for byte: with tools, tool calls and their results, reasoning kept
//! or dropped by the template, and template options such as Qwen3's
//! `enable_thinking`. Each case also checks the part of the prompt it is
//! about, so that two renderings that agree on nothing useful still fail.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use ondo::engine::chat_template::{ChatMessage, ChatTemplate, ChatTemplateError};
use serde_json::{Value, json};

use common::python;

struct Case {
    name: &'static str,
    /// A file in tests/fixtures/chat_templates.
    template: &'static str,
    /// The conversation as a client sends it (OpenAI / transformers dicts).
    messages: Value,
    tools: Option<Value>,
    options: Value,
    /// Text the prompt must contain.
    expect: &'static [&'static str],
    /// Text it must not contain.
    absent: &'static [&'static str],
}

fn special_tokens(template: &str) -> (Option<&'static str>, Option<&'static str>) {
    match template {
        "qwen3.jinja" => (None, Some("<|im_end|>")),
        "llama3.1.jinja" => (Some("<|begin_of_text|>"), Some("<|eot_id|>")),
        "gemma3.jinja" => (Some("<bos>"), Some("<eos>")),
        "phi4-mini.jinja" => (None, Some("<|endoftext|>")),
        "gpt-oss.jinja" => (Some("<|startoftext|>"), Some("<|return|>")),
        "qwen3_5.jinja" | "smollm3.jinja" => (None, Some("<|im_end|>")),
        "lfm2.jinja" => (Some("<|startoftext|>"), Some("<|im_end|>")),
        other => panic!("no special tokens known for {other}"),
    }
}

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat_templates")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn weather_tool() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city, <in> degrees & words.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["city"]
            }
        }
    })
}

fn time_tool() -> Value {
    json!({
        "type": "function",
        "function": {"name": "get_time", "description": "Local time.", "parameters": {"type": "object", "properties": {}}}
    })
}

fn cases() -> Vec<Case> {
    let weather_call = || {
        json!({
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
        })
    };
    vec![
        Case {
            name: "qwen3: one question",
            template: "qwen3.jinja",
            messages: json!([{"role": "user", "content": "What is 2+2?"}]),
            tools: None,
            options: json!({}),
            expect: &["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"],
            absent: &["<think>"],
        },
        Case {
            name: "qwen3: enable_thinking false closes an empty think block",
            template: "qwen3.jinja",
            messages: json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"}
            ]),
            tools: None,
            options: json!({"enable_thinking": false}),
            expect: &["<|im_start|>assistant\n<think>\n\n</think>\n\n"],
            absent: &[],
        },
        Case {
            name: "qwen3: tools in the system prompt",
            template: "qwen3.jinja",
            messages: json!([
                {"role": "system", "content": "You help with travel."},
                {"role": "user", "content": "Weather in Paris?"}
            ]),
            tools: Some(json!([weather_tool(), time_tool()])),
            options: json!({"enable_thinking": true}),
            expect: &[
                "You help with travel.\n\n# Tools",
                "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The current weather in a city, <in> degrees & words.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}",
                "\"get_time\"",
            ],
            absent: &[],
        },
        Case {
            name: "qwen3: a tool call with its reasoning and its result",
            template: "qwen3.jinja",
            messages: json!([
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "I need the weather.", "tool_calls": [weather_call()]},
                {"role": "tool", "content": "{\"temperature\": 21}", "tool_call_id": "call_1", "name": "get_weather"}
            ]),
            tools: Some(json!([weather_tool()])),
            options: json!({}),
            expect: &[
                "<|im_start|>assistant\n<think>\nI need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call><|im_end|>",
                "<|im_start|>user\n<tool_response>\n{\"temperature\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
            ],
            absent: &[],
        },
        Case {
            name: "qwen3: two calls, text before them, two results",
            template: "qwen3.jinja",
            messages: json!([
                {"role": "user", "content": "Weather and time in Paris?"},
                {"role": "assistant", "content": "Checking both.", "tool_calls": [
                    weather_call(),
                    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"Europe/Paris\"}"}}
                ]},
                {"role": "tool", "content": "21 °C", "tool_call_id": "call_1", "name": "get_weather"},
                {"role": "tool", "content": "14:05", "tool_call_id": "call_2", "name": "get_time"}
            ]),
            tools: Some(json!([weather_tool(), time_tool()])),
            options: json!({}),
            expect: &[
                "Checking both.\n<tool_call>",
                "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}",
                "21 °C\n</tool_response>\n<tool_response>\n14:05",
            ],
            absent: &[],
        },
        Case {
            name: "qwen3: reasoning of an earlier turn is dropped",
            template: "qwen3.jinja",
            messages: json!([
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
                {"role": "user", "content": "And 3+3?"}
            ]),
            tools: None,
            options: json!({}),
            expect: &["<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?"],
            absent: &["Two and two"],
        },
        Case {
            name: "gemma3: the system prompt is folded into the first user turn",
            template: "gemma3.jinja",
            messages: json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "  What is 2+2? "},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "And 3+3?"}
            ]),
            tools: None,
            options: json!({}),
            expect: &[
                "<bos><start_of_turn>user\nBe brief.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n<start_of_turn>model\n",
            ],
            absent: &["system"],
        },
        Case {
            name: "gemma3: two user turns in a row are refused",
            template: "gemma3.jinja",
            messages: json!([
                {"role": "user", "content": "Hi"},
                {"role": "user", "content": "Hello?"}
            ]),
            tools: None,
            options: json!({}),
            expect: &[],
            absent: &[],
        },
        Case {
            name: "phi4-mini: roles in bars, the answer opened",
            template: "phi4-mini.jinja",
            messages: json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"}
            ]),
            tools: None,
            options: json!({}),
            expect: &["<|system|>Be brief.<|end|><|user|>What is 2+2?<|end|><|assistant|>"],
            absent: &["<|tool|>"],
        },
        Case {
            name: "gpt-oss: the system prompt becomes the developer's instructions",
            template: "gpt-oss.jinja",
            messages: json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
                {"role": "user", "content": "And 3+3?"}
            ]),
            tools: None,
            options: json!({"reasoning_effort": "low"}),
            expect: &[
                "Reasoning: low\n\n# Valid channels: analysis, commentary, final.",
                "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>",
                "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final<|message|>4<|end|><|start|>user<|message|>And 3+3?<|end|><|start|>assistant",
            ],
            absent: &["Two and two"],
        },
        Case {
            name: "gpt-oss: tools as a TypeScript namespace, a call and its result",
            template: "gpt-oss.jinja",
            messages: json!([
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [weather_call()]},
                {"role": "tool", "content": "{\"temperature\": 21}", "tool_call_id": "call_1", "name": "get_weather"}
            ]),
            tools: Some(json!([weather_tool(), time_tool()])),
            options: json!({}),
            expect: &[
                "Calls to these tools must go to the commentary channel: 'functions'.",
                "namespace functions {\n\n// The current weather in a city, <in> degrees & words.\ntype get_weather = (_: {\n// City name, e.g. Zürich\ncity: string,\nunit?: \"celsius\" | \"fahrenheit\",\n}) => any;\n\n// Local time.\ntype get_time = () => any;\n\n} // namespace functions",
                "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>",
                "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>",
            ],
            absent: &[],
        },
        Case {
            name: "gpt-oss: a tool result without a call is refused",
            template: "gpt-oss.jinja",
            messages: json!([
                {"role": "user", "content": "Hi"},
                {"role": "tool", "content": "42", "tool_call_id": "call_9", "name": "f"}
            ]),
            tools: None,
            options: json!({}),
            expect: &[],
            absent: &[],
        },
        Case {
            name: "llama3.1: a system prompt",
            template: "llama3.1.jinja",
            messages: json!([
                {"role": "system", "content": "  Be brief. "},
                {"role": "user", "content": "Hi"}
            ]),
            tools: None,
            options: json!({}),
            expect: &[
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>",
            ],
            absent: &["Environment: ipython"],
        },
        Case {
            name: "llama3.1: tools in the first user message",
            template: "llama3.1.jinja",
            messages: json!([{"role": "user", "content": "Weather in Paris?"}]),
            tools: Some(json!([weather_tool()])),
            options: json!({}),
            expect: &[
                "Environment: ipython\n",
                "Given the following functions",
                "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",",
                "\n\nWeather in Paris?<|eot_id|>",
            ],
            absent: &[],
        },
        Case {
            name: "llama3.1: a tool call and its result",
            template: "llama3.1.jinja",
            messages: json!([
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [weather_call()]},
                {"role": "tool", "content": "{\"temperature\": 21}", "tool_call_id": "call_1", "name": "get_weather"}
            ]),
            tools: Some(json!([weather_tool()])),
            options: json!({}),
            expect: &[
                "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}<|eot_id|>",
                // A string result is iterable, so the template quotes it as JSON.
                "<|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temperature\\\": 21}\"<|eot_id|>",
            ],
            absent: &[],
        },
        Case {
            name: "llama3.1: tools in the system message, a date given",
            template: "llama3.1.jinja",
            messages: json!([{"role": "user", "content": "Weather?"}]),
            tools: Some(json!([weather_tool()])),
            options: json!({"tools_in_user_message": false, "date_string": "01 Jan 2025"}),
            expect: &["Today Date: 01 Jan 2025\n\nYou have access to the following functions."],
            absent: &["Given the following functions"],
        },
        Case {
            name: "llama3.1: two calls in one turn are refused",
            template: "llama3.1.jinja",
            messages: json!([
                {"role": "user", "content": "Both?"},
                {"role": "assistant", "content": "", "tool_calls": [weather_call(), weather_call()]}
            ]),
            tools: Some(json!([weather_tool()])),
            options: json!({}),
            expect: &[],
            absent: &[],
        },
        Case {
            name: "qwen3_5: the generation prompt opens the thinking block",
            template: "qwen3_5.jinja",
            messages: json!([{"role": "user", "content": "What is 2+2?"}]),
            tools: None,
            options: json!({}),
            expect: &["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n"],
            absent: &["</think>"],
        },
        Case {
            name: "qwen3_5: enable_thinking false closes an empty think block",
            template: "qwen3_5.jinja",
            messages: json!([{"role": "user", "content": "What is 2+2?"}]),
            tools: None,
            options: json!({"enable_thinking": false}),
            expect: &["<|im_start|>assistant\n<think>\n\n</think>\n\n"],
            absent: &[],
        },
        Case {
            name: "qwen3_5: tools as XML with every schema key",
            template: "qwen3_5.jinja",
            messages: json!([
                {"role": "system", "content": "You help with travel."},
                {"role": "user", "content": "Weather in Paris?"}
            ]),
            tools: Some(json!([weather_tool(), time_tool()])),
            options: json!({}),
            expect: &[
                "<|im_start|>system\nYou help with travel.\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n<function>\n<name>get_weather</name>",
                "<description>The current weather in a city, <in> degrees & words.</description>",
                "<parameter>\n<name>city</name>\n<type>string</type>\n<description>City name, e.g. Zürich</description>\n</parameter>",
                "<enum>[\"celsius\", \"fahrenheit\"]</enum>",
                "<required>[\"city\"]</required>",
                "<name>get_time</name>",
            ],
            absent: &[],
        },
        Case {
            name: "qwen3_5: a call with its reasoning, then its result",
            template: "qwen3_5.jinja",
            messages: json!([
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "I should look it up.", "tool_calls": [weather_call()]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}
            ]),
            tools: Some(json!([weather_tool()])),
            options: json!({}),
            expect: &[
                "<|im_start|>assistant\n<think>\nI should look it up.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call><|im_end|>\n",
                "<|im_start|>user\n<tool_response>\n{\"temperature\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n",
            ],
            absent: &[],
        },
        Case {
            name: "qwen3_5: an earlier turn's reasoning is dropped",
            template: "qwen3_5.jinja",
            messages: json!([
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\nFour."},
                {"role": "user", "content": "And 3+3?"}
            ]),
            tools: None,
            options: json!({}),
            expect: &["<|im_start|>assistant\nFour.<|im_end|>\n<|im_start|>user\nAnd 3+3?"],
            absent: &["Two and two."],
        },
        Case {
            name: "lfm2: tools as a JSON list in the system prompt",
            template: "lfm2.jinja",
            messages: json!([
                {"role": "system", "content": "You help with travel."},
                {"role": "user", "content": "Weather in Paris?"}
            ]),
            tools: Some(json!([weather_tool(), time_tool()])),
            options: json!({}),
            expect: &[
                "<|startoftext|><|im_start|>system\nYou help with travel.\nList of tools: <|tool_list_start|>[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"",
                "}}, {\"type\": \"function\", \"function\": {\"name\": \"get_time\"",
                "]<|tool_list_end|><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n",
            ],
            absent: &[],
        },
        Case {
            name: "lfm2: a call in the answer's text and its result",
            template: "lfm2.jinja",
            messages: json!([
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "<|tool_call_start|>[get_weather(city=\"Paris\")]<|tool_call_end|>"},
                {"role": "tool", "content": "{\"temperature\": 21}"}
            ]),
            tools: Some(json!([weather_tool()])),
            options: json!({}),
            expect: &[
                "<|im_start|>assistant\n<|tool_call_start|>[get_weather(city=\"Paris\")]<|tool_call_end|><|im_end|>\n",
                "<|im_start|>tool\n<|tool_response_start|>{\"temperature\": 21}<|tool_response_end|><|im_end|>\n",
            ],
            absent: &[],
        },
        Case {
            name: "smollm3: thinking by default, with its metadata",
            template: "smollm3.jinja",
            messages: json!([{"role": "user", "content": "What is 2+2?"}]),
            tools: None,
            options: json!({}),
            expect: &[
                "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: ",
                "Reasoning Mode: /think\n\n## Custom Instructions\n\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role",
                "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
            ],
            absent: &["<think>\n\n</think>"],
        },
        Case {
            name: "smollm3: /no_think in the system message",
            template: "smollm3.jinja",
            messages: json!([
                {"role": "system", "content": "Be brief. /no_think"},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "Four."},
                {"role": "user", "content": "And 3+3?"}
            ]),
            tools: None,
            options: json!({}),
            expect: &[
                "Reasoning Mode: /no_think\n\n## Custom Instructions\n\nBe brief.\n\n<|im_end|>",
                "<|im_start|>assistant\n<think>\n\n</think>\nFour.<|im_end|>",
                "<|im_start|>assistant\n<think>\n\n</think>\n",
            ],
            absent: &["/no_think<"],
        },
        Case {
            name: "smollm3: tools written as Python dicts, enable_thinking false",
            template: "smollm3.jinja",
            messages: json!([{"role": "user", "content": "Weather in Paris?"}]),
            tools: Some(json!([weather_tool()])),
            options: json!({"enable_thinking": false}),
            expect: &[
                "### Tools\n\nYou may call one or more functions to assist with the user query.",
                "<tools>\n{'type': 'function', 'function': {'name': 'get_weather'",
                "</tools>\n\nFor each function call, return a json object",
            ],
            absent: &[],
        },
    ]
}

/// Ondo's rendering of a case.
fn render_in_rust(case: &Case) -> Result<String, ChatTemplateError> {
    let (bos, eos) = special_tokens(case.template);
    let template = ChatTemplate::from_source(
        fixture(case.template),
        bos.map(str::to_owned),
        eos.map(str::to_owned),
    )
    .expect("the fixture compiles");
    let messages: Vec<ChatMessage> =
        serde_json::from_value(case.messages.clone()).expect("Ondo reads the client's messages");
    let tools: Option<Vec<Value>> = case
        .tools
        .clone()
        .map(|t| serde_json::from_value(t).unwrap());
    let options = case.options.as_object().cloned().unwrap_or_default();
    template.render_with(&messages, tools.as_deref(), &options, true)
}

/// transformers' renderings of all cases, in order.
fn render_in_python(python: &Path, cases: &[Case]) -> Vec<Value> {
    let input: Vec<Value> = cases
        .iter()
        .map(|case| {
            let (bos, eos) = special_tokens(case.template);
            let mut tokens = serde_json::Map::new();
            if let Some(bos) = bos {
                tokens.insert("bos_token".into(), bos.into());
            }
            if let Some(eos) = eos {
                tokens.insert("eos_token".into(), eos.into());
            }
            json!({
                "template": fixture(case.template),
                "messages": case.messages,
                "tools": case.tools,
                "special_tokens": tokens,
                "options": case.options,
                "add_generation_prompt": true,
            })
        })
        .collect();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/render_chat_template.py");
    let mut child = Command::new(python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&input).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "render_chat_template.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script prints JSON")
}

#[test]
fn real_templates_render_like_transformers() {
    let cases = cases();
    // Ondo's side first: what each case is about holds without Python too.
    let ours: Vec<Result<String, ChatTemplateError>> = cases.iter().map(render_in_rust).collect();
    for (case, rendered) in cases.iter().zip(&ours) {
        if case.expect.is_empty() && case.absent.is_empty() {
            continue;
        }
        let text = rendered
            .as_ref()
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        for needle in case.expect {
            assert!(
                text.contains(needle),
                "{}: missing {needle:?} in\n{text}",
                case.name
            );
        }
        for needle in case.absent {
            assert!(
                !text.contains(needle),
                "{}: has {needle:?} in\n{text}",
                case.name
            );
        }
    }
    // Without Python (ONDO_SKIP_PYTHON), the checks above are all there is.
    if cfg!(ondo_skip_python) {
        eprintln!("note: ONDO_SKIP_PYTHON: not compared with transformers");
        return;
    }
    let theirs = render_in_python(&python(), &cases);
    assert_eq!(theirs.len(), cases.len());
    for ((case, ours), theirs) in cases.iter().zip(ours).zip(theirs) {
        match (ours, theirs.get("text").and_then(Value::as_str)) {
            (Ok(ours), Some(theirs)) => assert_eq!(ours, theirs, "{}", case.name),
            (Err(ChatTemplateError::Rejected { message }), None) => {
                let error = theirs["error"].as_str().unwrap_or_default();
                assert!(
                    error.contains(&message),
                    "{}: {message:?} vs {error:?}",
                    case.name
                );
            }
            (ours, _) => panic!("{}: Ondo gave {ours:?}, transformers {theirs}", case.name),
        }
    }
}

/// The app offers its Think switch for the templates that read
/// `enable_thinking`: Qwen3's, not Llama 3.1's.
#[test]
fn the_thinking_switch_is_read_from_the_template() {
    let compile = |name: &str| {
        let (bos, eos) = special_tokens(name);
        ChatTemplate::from_source(
            fixture(name),
            bos.map(str::to_owned),
            eos.map(str::to_owned),
        )
        .expect("the fixture compiles")
    };
    assert!(compile("qwen3.jinja").takes_enable_thinking());
    assert!(!compile("llama3.1.jinja").takes_enable_thinking());
}

/// A tool call in the history is written by the template the way the model
/// writes one, so the reply splitter of the model's family must read the
/// template's own rendering of a call back as that call, its values of the
/// types the tool declares: for Qwen3's JSON calls and Qwen 3.5's XML ones.
#[test]
fn a_call_the_template_writes_is_read_back_as_that_call() {
    use ondo::engine::reply::{ReplyFormat, ReplySegment, ReplySplitter};
    let arguments = json!({"city": "Paris", "unit": "celsius", "days": 3});
    for (model_type, template_file) in [("qwen3", "qwen3.jinja"), ("qwen3_5", "qwen3_5.jinja")] {
        let (bos, eos) = special_tokens(template_file);
        let source = fixture(template_file);
        let template = ChatTemplate::from_source(
            source.clone(),
            bos.map(str::to_owned),
            eos.map(str::to_owned),
        )
        .expect("the fixture compiles");
        let messages: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": arguments}
            }]}
        ]))
        .unwrap();
        let mut tool = weather_tool();
        tool["function"]["parameters"]["properties"]["days"] = json!({"type": "integer"});
        let tools = [tool];
        let prompt = template
            .render_with(&messages, Some(&tools), &Default::default(), false)
            .unwrap();
        let turn = prompt
            .rsplit("<|im_start|>assistant\n")
            .next()
            .and_then(|turn| turn.strip_suffix("<|im_end|>\n"))
            .unwrap_or_else(|| panic!("{model_type}: no assistant turn in\n{prompt}"));
        let format = ReplyFormat::detect(model_type, Some(&source), None, true);
        let mut splitter = ReplySplitter::new(format).with_tools(&tools);
        let mut segments = splitter.push(turn);
        segments.extend(splitter.finish());
        let calls: Vec<_> = segments
            .into_iter()
            .filter_map(|segment| match segment {
                ReplySegment::ToolCall(call) => Some(call.function),
                ReplySegment::Answer(text) if !text.trim().is_empty() => {
                    panic!("{model_type}: answer text {text:?} left from\n{turn}")
                }
                _ => None,
            })
            .collect();
        assert_eq!(calls.len(), 1, "{model_type}: {turn}");
        assert_eq!(calls[0].name, "get_weather", "{model_type}");
        assert_eq!(calls[0].arguments, arguments, "{model_type}: {turn}");
    }
}
