//! The prompt cache on disk, across processes: a long prompt's KV cache
//! saved when one `ondo run` ends is read back by the next process whose
//! prompt starts the same way, which then answers exactly what it answers
//! with the whole prompt prefilled; mlx-lm reads the file Ondo wrote and
//! continues it to the same tokens, and Ondo continues a file
//! `mlx_lm.cache_prompt` wrote as `mlx_lm.generate --prompt-cache-file`
//! does; a damaged file is reported, removed and never used; a process
//! killed in the middle of a write leaves nothing that is read back.

mod common;
#[path = "common/served.rs"]
mod served;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use served::Served;

/// Ondo's data folder and the models of one test.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn ondo(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ondo"));
        command
            .env("ONDO_HOME", self.dir.path().join("home"))
            .env("HF_HUB_CACHE", self.dir.path().join("hf"))
            .env("ONDO_NO_KEYCHAIN", "1")
            .env("ONDO_PROMPT_CACHE_MIN_TOKENS", "32")
            .env_remove("ONDO_PROMPT_CACHE")
            .env_remove("ONDO_TEST_CACHE_WRITE_PAUSE_MS");
        command
    }

    fn synth(&self, name: &str, args: &[&str]) -> PathBuf {
        let dir = self.dir.path().join(name);
        let out = self
            .ondo()
            .args(["synth", "tiny"])
            .arg(&dir)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    }

    fn cache_folder(&self) -> PathBuf {
        self.dir.path().join("home/prompt-cache")
    }

    /// Every whole cache file saved.
    fn saved(&self) -> Vec<PathBuf> {
        files_under(&self.cache_folder(), |name| {
            name.ends_with(".safetensors") && !name.starts_with('.')
        })
    }

    /// One greedy run of `ids` on `model`, its JSON.
    fn run(&self, model: &Path, ids: &[u32], extra: &[&str]) -> (Value, String) {
        let out = self.run_output(model, ids, extra);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        (serde_json::from_slice(&out.stdout).unwrap(), stderr)
    }

    fn run_output(&self, model: &Path, ids: &[u32], extra: &[&str]) -> Output {
        self.run_command(model, ids, extra).output().unwrap()
    }

    fn run_command(&self, model: &Path, ids: &[u32], extra: &[&str]) -> Command {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        let mut command = self.ondo();
        command
            .arg("run")
            .arg(model)
            .args(["--prompt-ids", &ids.join(",")])
            .args([
                "--max-tokens",
                "8",
                "--ignore-eos",
                "--json",
                "--no-history",
            ])
            .args(extra);
        command
    }
}

fn files_under(folder: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for model in std::fs::read_dir(folder).into_iter().flatten().flatten() {
        for entry in std::fs::read_dir(model.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if keep(&entry.file_name().to_string_lossy()) {
                found.push(entry.path());
            }
        }
    }
    found
}

/// The generated ids of an `ondo run --json`.
fn ids(value: &Value) -> Vec<u32> {
    numbers(&value["token_ids"])
}

fn numbers(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// A prompt of `n` ids in a tiny model's vocabulary, starting at `seed`.
fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (seed + i * 7) % 250).collect()
}

fn mlx_lm(args: &[&str]) -> Value {
    common::python_script_json("prompt_cache_reference.py", args)
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// For a growing cache, a bounded (rotating) one and two models with state
/// layers: the second process reads the first one's cache back, answers
/// exactly as with the whole prompt prefilled, and mlx-lm continues the
/// same file to the same tokens.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn a_prefix_saved_by_one_process_is_read_back_by_the_next_and_answers_the_same() {
    let home = Home::new();
    let cases: [(&str, &[&str], &[&str]); 5] = [
        ("llama", &["--arch", "llama"], &[]),
        ("bounded", &["--arch", "qwen3"], &["--max-kv-size", "96"]),
        ("lfm2", &["--arch", "lfm2"], &[]),
        ("qwen3_next", &["--arch", "qwen3_next"], &[]),
        (
            "quantized",
            &["--arch", "llama"],
            &[
                "--kv-bits",
                "4",
                "--kv-group-size",
                "32",
                "--quantized-kv-start",
                "0",
            ],
        ),
    ];
    for (name, synth, settings) in cases {
        let model = home.synth(name, synth);
        let first_prompt = prompt(1, 80);
        let (first, _) = home.run(&model, &first_prompt, settings);
        assert_eq!(first["prefix_source"], "none", "{name}");
        let saved = home.saved();
        assert_eq!(
            saved.len(),
            1,
            "{name}: one cache saved when the process ended"
        );
        // A later save that holds all of it replaces it: keep a copy.
        let copy = home.dir.path().join(format!("{name}.safetensors"));
        std::fs::copy(&saved[0], &copy).unwrap();
        // The conversation holds the prompt and the tokens fed back (all
        // but the last generated). A model with state layers can only go
        // on from all of it; a KV cache from any prefix of it.
        let mut held = first_prompt.clone();
        held.extend(&ids(&first)[..7]);
        let stateful = name == "lfm2" || name == "qwen3_next";
        let shared = if stateful { held.len() } else { 60 };
        let mut second_prompt = held[..shared].to_vec();
        second_prompt.extend(prompt(500, 12));
        let (second, stderr) = home.run(&model, &second_prompt, settings);
        assert_eq!(second["prefix_source"], "disk", "{name}: {stderr}");
        assert_eq!(second["cached_tokens"], shared, "{name}");
        assert!(
            second["prefix_read_bytes"].as_u64().unwrap() > 1000,
            "{name}"
        );
        // Reading the cache back is part of the time to the first token.
        assert!(
            second["ttft_ms"].as_f64().unwrap() >= second["prefix_read_ms"].as_f64().unwrap(),
            "{name}: {second}"
        );
        let no_disk = [settings, &["--no-disk-cache"]].concat();
        let (prefilled, _) = home.run(&model, &second_prompt, &no_disk);
        assert_eq!(prefilled["prefix_source"], "none", "{name}");
        if name == "quantized" {
            // A prompt prefilled at once attends in floats before its
            // cache is quantized (mlx-lm's semantics); a quantized prefix
            // read back is continued as the conversation kept in memory
            // would be, which mlx-lm's continuation below checks.
            assert_eq!(
                second["kv_bits"], 4,
                "the record says the cache was in 4 bits"
            );
        } else {
            assert_eq!(
                ids(&second),
                ids(&prefilled),
                "{name}: a restored prefix answers the same"
            );
        }
        let reference = mlx_lm(&[
            "continue",
            copy.to_str().unwrap(),
            model.to_str().unwrap(),
            &shared.to_string(),
            &csv(&second_prompt[shared..]),
            "8",
        ]);
        assert_eq!(
            ids(&second),
            numbers(&reference["ids"]),
            "{name}: mlx-lm continues Ondo's file the same"
        );
        assert_eq!(reference["model"], model.display().to_string(), "{name}");
        if name == "quantized" {
            assert_eq!(reference["classes"][0], "QuantizedKVCache");
        }
        std::fs::remove_dir_all(home.cache_folder()).unwrap();
    }
}

/// A file `mlx_lm.cache_prompt` wrote continues in `ondo run
/// --prompt-cache-file` to the tokens `mlx_lm.generate --prompt-cache-file`
/// computes from it.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn a_prompt_cache_mlx_lm_wrote_continues_in_ondo_as_in_mlx_lm() {
    let home = Home::new();
    let model = home.synth("qwen3", &["--arch", "qwen3", "--seed", "5"]);
    let file = home.dir.path().join("mlx.safetensors");
    let words: Vec<String> = (0..60).map(|i| format!("w{i}")).collect();
    let cache_prompt = common::python()
        .parent()
        .unwrap()
        .join("mlx_lm.cache_prompt");
    let out = Command::new(cache_prompt)
        .arg("--model")
        .arg(&model)
        .args(["--prompt", &words.join(" ")])
        .arg("--prompt-cache-file")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let query = " and then what";
    let out = home
        .ondo()
        .arg("run")
        .arg(&model)
        .arg("--prompt-cache-file")
        .arg(&file)
        .arg(query)
        .args([
            "--max-tokens",
            "8",
            "--ignore-eos",
            "--json",
            "--no-history",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["prefix_source"], "disk");
    assert!(run["cached_tokens"].as_u64().unwrap() > 60);
    let reference = mlx_lm(&[
        "after-file",
        file.to_str().unwrap(),
        model.to_str().unwrap(),
        query,
        "8",
    ]);
    let reference_ids: Vec<u32> = reference["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids(&run), reference_ids);
    assert!(
        home.saved().is_empty(),
        "a cache without token ids is not saved again: {:?}",
        home.saved()
    );
    // Another model's file is refused by name.
    let other = home.synth("lfm2", &["--arch", "lfm2"]);
    let out = home
        .ondo()
        .arg("run")
        .arg(&other)
        .arg("--prompt-cache-file")
        .arg(&file)
        .arg(query)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not fit this model's cache"),
        "{stderr}"
    );
}

/// A saved cache with a flipped byte is never used: the run says why once,
/// the file goes, and the prompt is prefilled.
#[test]
fn a_damaged_saved_cache_is_reported_removed_and_the_prompt_prefilled() {
    let home = Home::new();
    let model = home.synth("llama", &["--arch", "llama"]);
    let first_prompt = prompt(3, 64);
    home.run(&model, &first_prompt, &[]);
    let saved = home.saved();
    assert_eq!(saved.len(), 1);
    let mut bytes = std::fs::read(&saved[0]).unwrap();
    let at = bytes.len() - 9;
    bytes[at] ^= 0x10;
    std::fs::write(&saved[0], bytes).unwrap();
    let (run, stderr) = home.run(&model, &first_prompt, &[]);
    assert_eq!(run["prefix_source"], "none");
    assert_eq!(run["cached_tokens"], 0);
    assert!(stderr.contains("was not used and was removed"), "{stderr}");
    assert!(stderr.contains("checksum"), "{stderr}");
    assert_eq!(stderr.matches("was not used").count(), 1, "{stderr}");
    // The run saved its own cache again, whole this time.
    let (again, _) = home.run(&model, &first_prompt, &[]);
    assert_eq!(again["prefix_source"], "disk");
}

/// `kill -9` while a cache is being written leaves only a temporary file,
/// which no later run reads.
#[test]
fn a_process_killed_while_writing_a_cache_leaves_nothing_that_is_read_back() {
    let home = Home::new();
    let model = home.synth("llama", &["--arch", "llama"]);
    let first_prompt = prompt(9, 64);
    let mut child = home
        .run_command(&model, &first_prompt, &[])
        .env("ONDO_TEST_CACHE_WRITE_PAUSE_MS", "400")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let partial = loop {
        let partial = files_under(&home.cache_folder(), |n| n.ends_with(".partial"));
        if !partial.is_empty() {
            break partial;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no cache write began"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before writing"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        home.saved().is_empty(),
        "no whole file after a killed write"
    );
    assert!(
        partial[0].exists(),
        "the half-written file stays under its temporary name"
    );
    let (run, _) = home.run(&model, &first_prompt, &[]);
    assert_eq!(
        run["prefix_source"], "none",
        "a half-written file is never read"
    );
    assert_eq!(run["cached_tokens"], 0);
}

/// `ondo serve` saves its conversations when it is told to stop, and the
/// next server answers the same long prompt from the disk: the OpenAI
/// dialect's `cached_tokens` and the `ondo` field say so.
#[test]
fn a_server_that_stops_saves_its_conversations_and_the_next_one_reads_them() {
    let home = Home::new();
    let words: Vec<String> = (0..200).map(|i| format!("word{i}")).collect();
    let body = serde_json::json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": words.join(" ")}],
        "max_tokens": 4,
        "temperature": 0,
    });
    let first = Served::start(home.ondo());
    let (status, answer) = first.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["ondo"]["prefix_source"], "none");
    first.stop();
    assert_eq!(
        home.saved().len(),
        1,
        "the conversation was saved when the server stopped"
    );

    let second = Served::start(home.ondo());
    let (status, again) = second.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["ondo"]["prefix_source"], "disk");
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        cached + 1,
        again["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        again["choices"][0]["message"]["content"],
        answer["choices"][0]["message"]["content"]
    );
    second.stop();
}
