//! The engine thread as its clients see it: it stops where asked (EOS, stop
//! strings, max tokens, cancellation), names every bad input, and keeps
//! serving the next request after any failure.

use std::path::Path;
use std::sync::{Arc, Mutex};

use ondo::engine::sample::SamplerSettings;
use ondo::engine::{CancelToken, EngineHandle, GenerateRequest, Prompt, RunError, RunEvent};
use ondo::run_kinds::{LoadKind, StopReason};
use ondo::synth::{self, SynthOptions};

fn tiny(dir: &Path) {
    let options = SynthOptions::for_preset(synth::preset_named("tiny").unwrap());
    synth::write_model(&options, dir, &mut |_| {}).unwrap();
}

fn request(dir: &Path, prompt: Prompt) -> GenerateRequest {
    GenerateRequest {
        max_tokens: 24,
        ..GenerateRequest::new(dir, prompt)
    }
}

fn run(
    engine: &EngineHandle,
    request: GenerateRequest,
) -> Result<ondo::engine::stream::RunOutcome, RunError> {
    engine.generate_blocking(request, CancelToken::new(), |_| {})
}

/// Sampled text varies from token to token (greedy on random weights
/// repeats one token), which the stop-string test needs.
fn sampled(dir: &Path) -> GenerateRequest {
    GenerateRequest {
        sampler: SamplerSettings {
            temperature: 1.0,
            seed: Some(7),
            ..SamplerSettings::default()
        },
        ..request(dir, Prompt::user("Tell me about the weather."))
    }
}

#[test]
fn events_arrive_in_order_and_the_second_run_is_warm() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir);
    let engine = EngineHandle::spawn().unwrap();
    let mut events = Vec::new();
    let first = engine
        .generate_blocking(
            request(&dir, Prompt::user("hello")),
            CancelToken::new(),
            |e| events.push(e.clone()),
        )
        .unwrap();
    assert!(matches!(
        events.first(),
        Some(RunEvent::Started {
            load_kind: LoadKind::Cold,
            cached_tokens: 0,
            ..
        })
    ));
    assert!(matches!(events.last(), Some(RunEvent::Finished { .. })));
    let streamed: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::Delta { token_ids, .. } => Some(token_ids.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(streamed, first.token_ids, "every token is streamed once");
    let s = &first.stats;
    assert_eq!(s.load_kind, LoadKind::Cold);
    assert!(s.load_ms > 0.0 && s.ttft_ms > 0.0 && s.decode_tps > 0.0);
    assert!(s.chat_template, "the synthetic model has a chat template");
    assert_eq!(s.prompt_tokens, s.prefill_tokens);
    assert!(s.mlx_peak_bytes >= s.weights_bytes && s.kv_cache_bytes > 0);

    let second = run(&engine, request(&dir, Prompt::user("hello"))).unwrap();
    assert_eq!(second.stats.load_kind, LoadKind::Warm);
    assert_eq!(second.stats.load_ms, 0.0);
    assert_eq!(second.token_ids, first.token_ids, "greedy is repeatable");
}

#[test]
fn generation_stops_at_eos_stop_strings_max_tokens_and_cancel() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir);
    let engine = EngineHandle::spawn().unwrap();

    let full = run(&engine, sampled(&dir)).unwrap();
    assert_eq!(full.stats.stop_reason, StopReason::MaxTokens);
    assert_eq!(full.token_ids.len(), 24);

    // Stop strings: the text ends right before the first occurrence.
    let chars: Vec<char> = full.text.chars().collect();
    assert!(chars.len() > 12, "sampled text: {:?}", full.text);
    let stop: String = chars[8..11].iter().collect();
    let cut = run(
        &engine,
        GenerateRequest {
            stop_strings: vec![stop.clone()],
            ..sampled(&dir)
        },
    )
    .unwrap();
    assert_eq!(cut.stats.stop_reason, StopReason::StopString);
    let expected = &full.text[..full.text.find(&stop).unwrap()];
    assert_eq!(cut.text, expected);

    // EOS: make the fifth generated token an end-of-sequence id.
    let eos = full.token_ids[4];
    let first_eos = full.token_ids.iter().position(|&t| t == eos).unwrap();
    let eos_dir = root.path().join("tiny-eos");
    tiny(&eos_dir);
    std::fs::write(
        eos_dir.join("generation_config.json"),
        format!("{{\"eos_token_id\": [{eos}]}}"),
    )
    .unwrap();
    let stopped = run(&engine, sampled(&eos_dir)).unwrap();
    assert_eq!(stopped.stats.stop_reason, StopReason::Eos);
    assert_eq!(stopped.token_ids, full.token_ids[..=first_eos]);
    let ignored = run(
        &engine,
        GenerateRequest {
            ignore_eos: true,
            ..sampled(&eos_dir)
        },
    )
    .unwrap();
    assert_eq!(ignored.token_ids, full.token_ids, "--ignore-eos runs on");

    // Cancel from the first streamed token: the run ends early, recorded.
    let cancel = CancelToken::new();
    let on_event = cancel.clone();
    let cancelled = engine
        .generate_blocking(sampled(&dir), cancel, move |e| {
            if matches!(e, RunEvent::Delta { .. }) {
                on_event.cancel();
            }
        })
        .unwrap();
    assert_eq!(cancelled.stats.stop_reason, StopReason::Cancelled);
    assert!(
        cancelled.token_ids.len() < 24,
        "{}",
        cancelled.token_ids.len()
    );
}

#[test]
fn bad_input_is_named_and_the_engine_keeps_serving() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir);
    let engine = EngineHandle::spawn().unwrap();
    let expect_err = |request: GenerateRequest, kind: &str, words: &str| {
        let err = run(&engine, request).unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
        assert!(err.to_string().contains(words), "{err}");
        // The engine is still there and answers.
        run(&engine, request_ok(&dir)).expect("the next request is served");
    };
    fn request_ok(dir: &Path) -> GenerateRequest {
        GenerateRequest {
            max_tokens: 2,
            ..GenerateRequest::new(dir, Prompt::user("ok"))
        }
    }

    expect_err(request(&dir, Prompt::user("  ")), "empty_prompt", "empty");
    expect_err(
        request(&dir, Prompt::Tokens { ids: vec![1; 5000] }),
        "prompt_too_long",
        "bound the KV cache to 4096 tokens",
    );
    expect_err(
        request(
            &dir,
            Prompt::Tokens {
                ids: vec![1, 999_999],
            },
        ),
        "invalid_settings",
        "999999",
    );
    expect_err(
        GenerateRequest {
            sampler: SamplerSettings {
                temperature: -1.0,
                ..SamplerSettings::default()
            },
            ..request(&dir, Prompt::user("hi"))
        },
        "invalid_settings",
        "temperature",
    );
    // A rotating cache lets the long prompt through.
    let rotated = run(
        &engine,
        GenerateRequest {
            max_kv_size: Some(256),
            max_tokens: 2,
            ..request(&dir, Prompt::Tokens { ids: vec![1; 5000] })
        },
    )
    .unwrap();
    assert_eq!(rotated.stats.prompt_tokens, 5000);

    // Broken folders: a missing shard, a wrong dtype, unsupported quantization.
    let sharded = root.path().join("sharded");
    let options = SynthOptions {
        max_shard_bytes: 2 << 20,
        ..SynthOptions::for_preset(synth::preset_named("tiny").unwrap())
    };
    let summary = synth::write_model(&options, &sharded, &mut |_| {}).unwrap();
    let shard = &summary.weight_files[1];
    std::fs::remove_file(sharded.join(shard)).unwrap();
    expect_err(request(&sharded, Prompt::user("hi")), "load", shard);

    // A float tensor stored as integers: patch the safetensors header (the
    // same number of bytes, so the file stays well-formed).
    let typed = root.path().join("typed");
    tiny(&typed);
    let weights = typed.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + header_len].to_vec()).unwrap();
    let patched = header.replacen("\"dtype\":\"F32\"", "\"dtype\":\"I32\"", 1);
    assert_ne!(header, patched, "the header names F32 tensors");
    bytes[8..8 + header_len].copy_from_slice(patched.as_bytes());
    std::fs::write(&weights, bytes).unwrap();
    expect_err(request(&typed, Prompt::user("hi")), "load", "dtype");

    let quant = root.path().join("quant3");
    tiny(&quant);
    let config_path = quant.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["quantization"] = serde_json::json!({"group_size": 64, "bits": 3});
    std::fs::write(&config_path, config.to_string()).unwrap();
    expect_err(request(&quant, Prompt::user("hi")), "load", "bits 3");

    let missing = root.path().join("nothing-here");
    expect_err(request(&missing, Prompt::user("hi")), "load", "config.json");
}

#[test]
fn a_dropped_sink_or_many_clients_do_not_stop_the_engine() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir);
    let engine = EngineHandle::spawn().unwrap();
    let finished = Arc::new(Mutex::new(0));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let engine = engine.clone();
            let dir = dir.clone();
            let finished = finished.clone();
            std::thread::spawn(move || {
                let outcome = run(&engine, request(&dir, Prompt::user("hi"))).unwrap();
                assert_eq!(outcome.token_ids.len(), 24);
                *finished.lock().unwrap() += 1;
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*finished.lock().unwrap(), 3);
    assert_eq!(engine.resident().unwrap().len(), 1, "loaded once, shared");
    assert!(engine.unload(&dir).unwrap());
    assert!(engine.resident().unwrap().is_empty());
}

/// A chat template in the synthetic tokenizer's format that shows the
/// request's tools and, with `enable_thinking`, opens a `<think>` block in
/// the generation prompt (as DeepSeek-R1's and Qwen3 thinking models' do).
const THINKING_TEMPLATE: &str = "{{ bos_token }}\
{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nTools: {{ tools | tojson }}<|eot_id|>{% endif %}\
{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}\
{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}";

fn thinking_request(
    dir: &Path,
    options: serde_json::Value,
    tools: Option<Vec<serde_json::Value>>,
) -> GenerateRequest {
    GenerateRequest {
        ignore_eos: true,
        ..sampled(dir)
    }
    .with_prompt(Prompt::Chat {
        system_prompt: None,
        messages: vec![ondo::engine::chat_template::ChatMessage::user(
            "Is it warm?",
        )],
        tools,
        template_options: options.as_object().cloned().unwrap_or_default(),
    })
}

trait WithPrompt {
    fn with_prompt(self, prompt: Prompt) -> Self;
}

impl WithPrompt for GenerateRequest {
    fn with_prompt(self, prompt: Prompt) -> Self {
        GenerateRequest { prompt, ..self }
    }
}

/// Every delta's reasoning and text, joined, and the token ids they carried.
fn streamed_parts(events: &[RunEvent]) -> (String, String, Vec<u32>) {
    let mut parts = (String::new(), String::new(), Vec::new());
    for event in events {
        if let RunEvent::Delta {
            text,
            reasoning,
            token_ids,
            ..
        } = event
        {
            parts.0.push_str(reasoning);
            parts.1.push_str(text);
            parts.2.extend(token_ids);
        }
    }
    parts
}

#[test]
fn a_generation_prompt_that_opens_think_makes_the_reply_reasoning() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir);
    std::fs::write(dir.join("chat_template.jinja"), THINKING_TEMPLATE).unwrap();
    let engine = EngineHandle::spawn().unwrap();

    let mut events = Vec::new();
    let thinking = engine
        .generate_blocking(
            thinking_request(&dir, serde_json::json!({"enable_thinking": true}), None),
            CancelToken::new(),
            |e| events.push(e.clone()),
        )
        .unwrap();
    // Random weights never close the block: everything said is reasoning.
    assert!(!thinking.raw_text.trim().is_empty());
    assert!(
        !thinking.raw_text.contains("</think>"),
        "{:?}",
        thinking.raw_text
    );
    assert_eq!(thinking.reasoning, thinking.raw_text.trim());
    assert_eq!(thinking.text, "");
    let (reasoning, text, ids) = streamed_parts(&events);
    assert_eq!(reasoning, thinking.reasoning);
    assert_eq!(text, "");
    assert_eq!(ids, thinking.token_ids, "token ids are streamed unchanged");
    assert!(
        matches!(&events[events.len() - 1], RunEvent::Finished { reasoning, raw_text, .. }
        if *reasoning == thinking.reasoning && *raw_text == thinking.raw_text)
    );

    // The same conversation without the option: no <think> in the prompt
    // (fewer tokens), and what the model says is its answer.
    let plain = run(&engine, thinking_request(&dir, serde_json::json!({}), None)).unwrap();
    assert!(plain.stats.prompt_tokens < thinking.stats.prompt_tokens);
    assert_eq!(plain.text, plain.raw_text);
    assert_eq!(plain.reasoning, "");

    // Text sent as it is is continued as it is, even after a `<think>` it
    // opened: only a chat has a reply to split.
    let raw = run(
        &engine,
        thinking_request(&dir, serde_json::json!({}), None).with_prompt(Prompt::Raw {
            text: "Is it warm?<think>\n".into(),
        }),
    )
    .unwrap();
    assert!(!raw.raw_text.trim().is_empty());
    assert_eq!(raw.text, raw.raw_text);
    assert_eq!(raw.reasoning, "");
}

#[test]
fn a_request_may_hear_every_token_apart() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir);
    let engine = EngineHandle::spawn().unwrap();
    let deltas = |every_token: bool| {
        let mut deltas: Vec<Vec<u32>> = Vec::new();
        let request = GenerateRequest {
            max_tokens: 64,
            ignore_eos: true,
            delta_every_token: every_token,
            ..sampled(&dir)
        };
        let outcome = engine
            .generate_blocking(request, CancelToken::new(), |e| {
                if let RunEvent::Delta { token_ids, .. } = e {
                    deltas.push(token_ids.clone());
                }
            })
            .unwrap();
        assert_eq!(deltas.concat(), outcome.token_ids);
        deltas
    };
    // Merged per 16 ms frame, a fast model's tokens come in bunches (how
    // many depends on the machine's speed, so only the count is checked).
    assert_eq!(deltas(false).concat().len(), 64);
    // One by one: a delta per token, empty while its text is held back.
    let apart = deltas(true);
    assert_eq!(apart.len(), 64, "{apart:?}");
    assert!(apart.iter().all(|ids| ids.len() == 1), "{apart:?}");
}

#[test]
fn the_requests_tools_reach_the_template_and_options_are_checked() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir);
    std::fs::write(dir.join("chat_template.jinja"), THINKING_TEMPLATE).unwrap();
    let engine = EngineHandle::spawn().unwrap();

    let tool = serde_json::json!({
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    });
    let without = run(&engine, thinking_request(&dir, serde_json::json!({}), None)).unwrap();
    let with = run(
        &engine,
        thinking_request(&dir, serde_json::json!({}), Some(vec![tool])),
    )
    .unwrap();
    assert!(
        with.stats.prompt_tokens > without.stats.prompt_tokens + 10,
        "{} vs {}",
        with.stats.prompt_tokens,
        without.stats.prompt_tokens
    );
    // No tool call in random text: the whole reply is the answer.
    assert!(with.tool_calls.is_empty());
    assert_eq!(with.text, with.raw_text);
    assert_eq!(with.stats.stop_reason, StopReason::MaxTokens);

    let refused = run(
        &engine,
        thinking_request(&dir, serde_json::json!({"messages": []}), None),
    )
    .unwrap_err();
    assert_eq!(refused.kind(), "chat_template");
    assert!(refused.to_string().contains("`messages`"), "{refused}");
}
