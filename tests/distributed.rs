//! Ranks as processes on this machine over MLX's ring backend on
//! 127.0.0.1, started as `mlx.launch` starts them (MLX_RANK and
//! MLX_HOSTFILE): they join, introduce themselves, refuse each other when
//! their model snapshots differ, and give up on a rank that never starts
//! instead of waiting forever. Every wait is bounded.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
#[path = "common/served.rs"]
mod served;

/// Free ports on 127.0.0.1, one per rank (found by binding port 0; freed
/// before the ranks bind them).
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

struct Ranks {
    dir: tempfile::TempDir,
    hostfile: PathBuf,
}

impl Ranks {
    /// A hostfile of `count` ranks on 127.0.0.1, as mlx.launch writes one.
    fn new(count: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let hosts: Vec<Vec<String>> = free_ports(count)
            .into_iter()
            .map(|port| vec![format!("127.0.0.1:{port}")])
            .collect();
        let hostfile = dir.path().join("hosts.json");
        std::fs::write(&hostfile, serde_json::to_string(&hosts).unwrap()).unwrap();
        Self { dir, hostfile }
    }

    fn ondo(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ondo"));
        command
            .env("ONDO_HOME", self.dir.path().join("home"))
            .env("ONDO_NO_KEYCHAIN", "1")
            .args(args);
        command
    }

    /// Starts rank `rank` with `args`.
    fn start(&self, rank: usize, args: &[&str]) -> Child {
        self.start_with(rank, args, &[])
    }

    /// `start`, with more environment.
    fn start_with(&self, rank: usize, args: &[&str], env: &[(&str, &str)]) -> Child {
        self.ondo(args)
            .envs(env.iter().copied())
            .env("MLX_RANK", rank.to_string())
            .env("MLX_HOSTFILE", &self.hostfile)
            .env("ONDO_RANK_JOIN_TIMEOUT_S", "20")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn synth(&self, name: &str, args: &[&str]) -> PathBuf {
        self.synth_as(name, "tiny", args)
    }

    /// `synth` of another preset shape.
    fn synth_as(&self, name: &str, preset: &str, args: &[&str]) -> PathBuf {
        let dir = self.dir.path().join(name);
        let mut all = vec!["synth", preset, dir.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = self.ondo(&all).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    }
}

/// Waits for every child, killing all of them after `limit`: a test of
/// ranks must never hang.
fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<Output> {
    let started = Instant::now();
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    loop {
        let mut running = 0;
        for child in children.iter_mut().flatten() {
            if child.try_wait().unwrap().is_none() {
                running += 1;
            }
        }
        if running == 0 {
            break;
        }
        if started.elapsed() > limit {
            let said: Vec<String> = children
                .iter_mut()
                .map(|c| {
                    let mut child = c.take().unwrap();
                    let _ = child.kill();
                    let out = child.wait_with_output().unwrap();
                    text(&out.stderr)
                })
                .collect();
            panic!("ranks still running after {limit:?}; they said: {said:#?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    children
        .iter_mut()
        .map(|c| c.take().unwrap().wait_with_output().unwrap())
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn doctor(ranks: &Ranks, models: &[Option<&Path>]) -> Vec<Output> {
    let children = models
        .iter()
        .enumerate()
        .map(|(rank, model)| {
            let mut args = vec!["doctor", "--distributed", "--json"];
            if let Some(model) = model {
                args.extend(["--model", model.to_str().unwrap()]);
            }
            ranks.start(rank, &args)
        })
        .collect();
    wait_all(children, Duration::from_secs(120))
}

#[test]
fn two_and_three_ranks_join_introduce_themselves_and_time_their_links() {
    for count in [2, 3] {
        let ranks = Ranks::new(count);
        let model = ranks.synth("tiny", &[]);
        let outputs = doctor(&ranks, &vec![Some(model.as_path()); count]);
        for (rank, out) in outputs.iter().enumerate() {
            assert!(out.status.success(), "rank {rank}: {}", text(&out.stderr));
        }
        // Rank 0 reports; the others say nothing.
        assert!(outputs[1..].iter().all(|o| o.stdout.is_empty()));
        let report: Value = serde_json::from_slice(&outputs[0].stdout).unwrap();
        assert_eq!(report["backend"], "ring");
        let listed = report["ranks"].as_array().unwrap();
        assert_eq!(listed.len(), count);
        for (rank, identity) in listed.iter().enumerate() {
            assert_eq!(identity["rank"], rank);
            assert_eq!(identity["ondo_version"], listed[0]["ondo_version"]);
            assert!(!identity["host"].as_str().unwrap().is_empty());
            assert_eq!(identity["model"]["name"], "tiny");
            assert_eq!(identity["model"]["digest"], listed[0]["model"]["digest"]);
        }
        let hosts: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(&ranks.hostfile).unwrap()).unwrap();
        assert_eq!(report["addresses"][count - 1], hosts[count - 1][0]);
        // Each message size went around the group and was summed across it.
        let links = report["links"].as_array().unwrap();
        assert_eq!(links.len(), 3);
        for link in links {
            assert!(link["hop_ms"].as_f64().unwrap() > 0.0, "{link}");
            assert!(link["all_sum_ms"].as_f64().unwrap() > 0.0, "{link}");
        }
    }
}

#[test]
fn ranks_with_different_snapshots_are_refused_naming_the_rank_and_the_difference() {
    let ranks = Ranks::new(2);
    let small = ranks.synth("small", &[]);
    let wide = ranks.synth("wide", &["--arch", "qwen3"]);
    let outputs = doctor(&ranks, &[Some(small.as_path()), Some(wide.as_path())]);
    for (rank, out) in outputs.iter().enumerate() {
        assert!(!out.status.success(), "rank {rank} went on");
        let message = text(&out.stderr);
        assert!(
            message.contains("rank 1 (")
                && message.contains("wide (")
                && message.contains("same snapshot"),
            "rank {rank}: {message}"
        );
    }
}

#[test]
fn a_rank_that_never_starts_ends_the_wait_with_the_ranks_named() {
    let ranks = Ranks::new(2);
    let started = Instant::now();
    let mut only = ranks
        .ondo(&["doctor", "--distributed"])
        .env("MLX_RANK", "0")
        .env("MLX_HOSTFILE", &ranks.hostfile)
        .env("ONDO_RANK_JOIN_TIMEOUT_S", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = {
        let deadline = Instant::now() + Duration::from_secs(60);
        while only.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = only.kill();
                panic!("rank 0 still waiting after a minute");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        only.wait_with_output().unwrap()
    };
    assert!(!out.status.success());
    let message = text(&out.stderr);
    assert!(
        message.contains("waited 2 s") && message.contains("rank 1 at 127.0.0.1:"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_process_not_started_as_a_rank_says_how_to_start_one() {
    let ranks = Ranks::new(1);
    let out = ranks
        .ondo(&["doctor", "--distributed"])
        .env_remove("MLX_RANK")
        .env_remove("MLX_HOSTFILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let message = text(&out.stderr);
    assert!(
        message.contains("mlx.launch") && message.contains("MLX_HOSTFILE"),
        "{message}"
    );
    // A server started as a rank needs the model to split, on every rank.
    let out = ranks
        .ondo(&["serve", "--port", "0", "--no-history"])
        .env("MLX_RANK", "0")
        .env("MLX_HOSTFILE", &Ranks::new(2).hostfile)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let message = text(&out.stderr);
    assert!(message.contains("needs the MODEL"), "{message}");
}

/// Starts `ondo run` on every rank with the same arguments (as mlx.launch
/// does) and waits for all of them.
fn split_run(ranks: &Ranks, count: usize, args: &[&str]) -> Vec<Output> {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    let children = (0..count).map(|rank| ranks.start(rank, &all)).collect();
    wait_all(children, Duration::from_secs(180))
}

/// `ondo run ARGS` as rank 0 of a `--hostfile` launch (it starts the other
/// ranks itself), waited for within 180 s.
fn hostfile_run(ranks: &Ranks, args: &[&str]) -> Output {
    let child = ranks
        .ondo(&[&["run"][..], args].concat())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_all(vec![child], Duration::from_secs(180)).remove(0)
}

fn run_json(out: &Output, what: &str) -> Value {
    assert!(out.status.success(), "{what}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: {e}: {}", text(&out.stdout)))
}

fn ids(run: &Value) -> Vec<u64> {
    run["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn a_model_split_layer_by_layer_answers_the_tokens_one_process_does() {
    let prompt: Vec<String> = (0..37)
        .map(|i| ((i * 7919 + 13) % 1900).to_string())
        .collect();
    let prompt = prompt.join(",");
    // Dense attention, gated DeltaNet beside attention, and sliding-window
    // attention: five layers each, split 3+2 and 2+2+1.
    for arch in ["llama", "qwen3_5", "gemma3_text"] {
        let (two, three) = (Ranks::new(2), Ranks::new(3));
        let ranks = &two;
        let model = ranks.synth(arch, &["--arch", arch, "--layers", "5", "--untied-head"]);
        let model = model.to_str().unwrap();
        let args = [
            model,
            "--prompt-ids",
            &prompt,
            "--max-tokens",
            "16",
            "--prefill-step-size",
            "8",
            "--json",
        ];
        let alone = ranks
            .ondo(&[&["run"][..], &args[..]].concat())
            .output()
            .unwrap();
        let alone = run_json(&alone, &format!("{arch} alone"));
        let want = ids(&alone);
        let distinct: std::collections::HashSet<_> = want.iter().collect();
        assert!(
            distinct.len() >= 2,
            "{arch}: {want:?} repeats itself: a test that cannot fail"
        );
        for (count, shape) in [(2, "pipelined"), (2, "sync"), (3, "pipelined")] {
            let mut with_loop = args.to_vec();
            with_loop.extend(["--loop", shape]);
            let group = if count == 2 { &two } else { &three };
            let outputs = split_run(group, count, &with_loop);
            let what = format!("{arch} on {count} ranks, {shape} loop");
            let split = run_json(&outputs[0], &what);
            assert_eq!(ids(&split), want, "{what}");
            for (rank, out) in outputs.iter().enumerate().skip(1) {
                assert!(
                    out.status.success(),
                    "{what}, rank {rank}: {}",
                    text(&out.stderr)
                );
                assert!(out.stdout.is_empty(), "{what}: rank {rank} printed");
            }
            // Rank 0 says who holds which layers, and holds only its share.
            let said = text(&outputs[0].stderr);
            let expected = if count == 2 { "rank 0 (" } else { "rank 2 (" };
            assert!(
                said.contains(&format!("split by layers over {count} ranks"))
                    && said.contains(expected),
                "{what}: {said}"
            );
            let layers = if count == 2 {
                "layers 2-4"
            } else {
                "layers 3-4"
            };
            assert!(said.contains(layers), "{what}: {said}");
            assert!(
                split["weights_bytes"].as_u64() < alone["weights_bytes"].as_u64(),
                "{what}: {} of {} bytes",
                split["weights_bytes"],
                alone["weights_bytes"]
            );
        }
    }
}

#[test]
fn a_rank_killed_mid_decode_ends_the_run_naming_it_and_nothing_hangs() {
    use std::io::Read;
    let ranks = Ranks::new(2);
    let model = ranks.synth("tiny", &["--layers", "4", "--untied-head"]);
    let args = [
        "run",
        model.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3,4,5,6,7,8",
        "--max-tokens",
        "32768",
        "--ignore-eos",
    ];
    // A collective can wait forever on a rank that is gone; the stall
    // limit ends it where MLX does not.
    let stall = [("ONDO_RANK_STALL_TIMEOUT_S", "5")];
    let mut answering = ranks.start_with(0, &args, &stall);
    let mut other = ranks.start_with(1, &args, &stall);
    // Kill rank 1 once rank 0 is decoding: its answer has begun to stream.
    let mut stdout = answering.stdout.take().unwrap();
    let (began, waiting) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        let _ = stdout.read(&mut byte);
        let _ = began.send(());
        let mut rest = Vec::new();
        let _ = stdout.read_to_end(&mut rest);
    });
    waiting
        .recv_timeout(Duration::from_secs(120))
        .expect("rank 0 never began to answer");
    other.kill().unwrap();
    let _ = other.wait();
    let killed_at = Instant::now();
    let out = wait_all(vec![answering], Duration::from_secs(60)).remove(0);
    assert!(!out.status.success(), "rank 0 went on without rank 1");
    let message = text(&out.stderr);
    assert!(
        message.contains("lost its link to rank 1 (") && message.contains("127.0.0.1:"),
        "{message}"
    );
    assert!(killed_at.elapsed() < Duration::from_secs(60));
}

/// mlx-lm's own split run of `model` over `ranks` (its `sharded_load`, by
/// heads or by layers): the greedy ids rank 0 prints.
fn mlx_lm_split(ranks: &Ranks, count: usize, model: &Path, prompt: &str, split: &str) -> Vec<u64> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mlx_lm_sharded_generate.py");
    let children = (0..count)
        .map(|rank| {
            Command::new(common::python())
                .arg(&script)
                .arg(model)
                .args([
                    "--prompt-ids",
                    prompt,
                    "--max-tokens",
                    "16",
                    "--split",
                    split,
                ])
                .env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &ranks.hostfile)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs = wait_all(children, Duration::from_secs(180));
    for (rank, out) in outputs.iter().enumerate() {
        assert!(
            out.status.success(),
            "mlx-lm rank {rank}: {}",
            text(&out.stderr)
        );
    }
    let json: Value = serde_json::from_slice(&outputs[0].stdout).unwrap();
    json["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "compares with mlx-lm (ONDO_SKIP_PYTHON)")]
fn a_model_split_by_heads_answers_the_tokens_mlx_lms_split_does() {
    let prompt: Vec<String> = (0..37)
        .map(|i| ((i * 7919 + 13) % 1900).to_string())
        .collect();
    let prompt = prompt.join(",");
    // 4-bit weights: each rank's share of the output and down projections'
    // inputs is a whole number of quantization groups.
    for arch in ["llama", "qwen3"] {
        let ranks = Ranks::new(2);
        let model = ranks.synth(
            arch,
            &[
                "--arch",
                arch,
                "--layers",
                "4",
                "--bits",
                "4",
                "--untied-head",
            ],
        );
        let want = mlx_lm_split(&ranks, 2, &model, &prompt, "tensor");
        let distinct: std::collections::HashSet<_> = want.iter().collect();
        assert!(
            distinct.len() >= 2,
            "{arch}: {want:?} repeats itself: a test that cannot fail"
        );
        let args = [
            model.to_str().unwrap(),
            "--prompt-ids",
            &prompt,
            "--max-tokens",
            "16",
            "--prefill-step-size",
            "8",
            "--json",
        ];
        let alone = run_json(
            &ranks
                .ondo(&[&["run"][..], &args[..]].concat())
                .output()
                .unwrap(),
            &format!("{arch} alone"),
        );
        for shape in ["pipelined", "sync"] {
            let mut split_args = args.to_vec();
            split_args.extend(["--loop", shape, "--split", "tensor"]);
            let outputs = split_run(&ranks, 2, &split_args);
            let what = format!("{arch} split by heads, {shape} loop");
            let split = run_json(&outputs[0], &what);
            assert_eq!(
                ids(&split),
                want,
                "{what}: mlx-lm's split answered otherwise"
            );
            assert!(
                outputs[1].status.success(),
                "{what}: {}",
                text(&outputs[1].stderr)
            );
            assert!(outputs[1].stdout.is_empty(), "{what}: rank 1 printed");
            let said = text(&outputs[0].stderr);
            assert!(
                said.contains("split by heads over 2 ranks") && said.contains("1/2 of every layer"),
                "{what}: {said}"
            );
            assert!(
                split["weights_bytes"].as_u64() < alone["weights_bytes"].as_u64(),
                "{what}: {} of {} bytes",
                split["weights_bytes"],
                alone["weights_bytes"]
            );
        }
    }
}

#[test]
fn a_model_that_cannot_be_split_by_heads_is_refused_on_every_rank_with_the_way_that_works() {
    // Four heads do not divide over three ranks; gated DeltaNet layers are
    // not attention at all.
    let three = Ranks::new(3);
    let llama = three.synth("llama", &["--layers", "3"]);
    let args = [
        "run",
        llama.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--split",
        "tensor",
    ];
    let children = (0..3).map(|rank| three.start(rank, &args)).collect();
    for (rank, out) in wait_all(children, Duration::from_secs(120))
        .iter()
        .enumerate()
    {
        assert!(!out.status.success(), "rank {rank} ran");
        let said = text(&out.stderr);
        assert!(
            said.contains("4 attention heads do not divide over 3 ranks")
                && said.contains("--split pipeline"),
            "rank {rank}: {said}"
        );
    }
    let two = Ranks::new(2);
    let delta = two.synth("qwen3_5", &["--arch", "qwen3_5", "--layers", "4"]);
    let args = [
        "run",
        delta.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--split",
        "tensor",
    ];
    let children = (0..2).map(|rank| two.start(rank, &args)).collect();
    for (rank, out) in wait_all(children, Duration::from_secs(120))
        .iter()
        .enumerate()
    {
        let said = text(&out.stderr);
        assert!(
            !out.status.success()
                && said.contains("not attention")
                && said.contains("--split pipeline"),
            "rank {rank}: {said}"
        );
    }
    // Outside a launch, --split says what it is for.
    let out = two.ondo(&args).output().unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("mlx.launch"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_model_too_large_for_each_ranks_memory_runs_split_and_answers_as_one_process_does() {
    let ranks = Ranks::new(2);
    // About 400 MiB of weights: with the KV cache and MLX's overhead, more
    // than 720 MiB on one machine, about 590 MiB on each of two.
    let model = ranks.synth_as("small", "small", &["--layers", "8", "--untied-head"]);
    let model = model.to_str().unwrap();
    let args = [
        "run",
        model,
        "--prompt-ids",
        "5,17,99,3,250,7,41",
        "--max-tokens",
        "8",
        "--json",
    ];
    let limit = [("ONDO_MEMORY_LIMIT", "720MiB")];
    let refused = ranks.ondo(&args).envs(limit).output().unwrap();
    assert!(
        !refused.status.success(),
        "one machine ran what does not fit it"
    );
    assert!(
        text(&refused.stderr).contains("will not fit"),
        "{}",
        text(&refused.stderr)
    );
    let want = ids(&run_json(
        &ranks.ondo(&args).output().unwrap(),
        "alone, unlimited",
    ));
    for split in ["pipeline", "tensor"] {
        let mut split_args = args.to_vec();
        split_args.extend(["--split", split]);
        let children = (0..2)
            .map(|rank| ranks.start_with(rank, &split_args, &limit))
            .collect();
        let outputs = wait_all(children, Duration::from_secs(180));
        let what = format!("split by {split} within 720 MiB a rank");
        assert_eq!(ids(&run_json(&outputs[0], &what)), want, "{what}");
        let said = text(&outputs[0].stderr);
        assert!(
            said.contains("split over 2 ranks") && said.contains("of 720 MiB on rank 1 ("),
            "{what}: {said}"
        );
    }
    // Less than a share on each: every rank refuses before loading,
    // naming the ranks and what would help.
    let low = [("ONDO_MEMORY_LIMIT", "400MiB")];
    let children = (0..2)
        .map(|rank| ranks.start_with(rank, &args, &low))
        .collect();
    for (rank, out) in wait_all(children, Duration::from_secs(120))
        .iter()
        .enumerate()
    {
        let said = text(&out.stderr);
        assert!(!out.status.success(), "rank {rank} ran");
        assert!(
            said.contains("will not fit split over 2 ranks")
                && said.contains("rank 1 (")
                && said.contains("split over more ranks"),
            "rank {rank}: {said}"
        );
    }
}

/// The weight files in `cache`'s snapshot of `repo`.
fn cached_weight_files(cache: &Path, repo: &str) -> std::collections::BTreeSet<String> {
    let snapshots = cache
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("snapshots");
    let mut files = std::collections::BTreeSet::new();
    for snapshot in std::fs::read_dir(&snapshots).unwrap().flatten() {
        for file in std::fs::read_dir(snapshot.path()).unwrap().flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.ends_with(".safetensors") {
                files.insert(name);
            }
        }
    }
    files
}

#[test]
fn each_rank_fetches_from_the_hub_only_the_weight_files_of_its_layers() {
    let ranks = Ranks::new(2);
    // Six layers in 20 files of about 1 MB, some holding two layers.
    let model = ranks.synth("sharded", &["--layers", "6", "--max-shard-size", "1000000"]);
    let every_file: std::collections::BTreeSet<String> = std::fs::read_dir(&model)
        .unwrap()
        .flatten()
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".safetensors"))
        .collect();
    let hub = ondo_testhub::TestHub::start().unwrap();
    hub.add_repo("ondo-test/split", &model).unwrap();
    let cache = |rank: usize| ranks.dir.path().join(format!("hf-cache-{rank}"));
    let prompt = "5,17,301,42,7,99,1000,3";
    let args = [
        "run",
        "ondo-test/split",
        "--prompt-ids",
        prompt,
        "--max-tokens",
        "12",
        "--json",
    ];
    let split_run_from = |endpoint: &str| {
        let children = (0..2)
            .map(|rank| {
                let cache = cache(rank);
                let env = [
                    ("HF_ENDPOINT", endpoint),
                    ("HF_HUB_CACHE", cache.to_str().unwrap()),
                ];
                ranks.start_with(rank, &args, &env)
            })
            .collect();
        wait_all(children, Duration::from_secs(180))
    };
    let outputs = split_run_from(&hub.url());
    let split = run_json(&outputs[0], "split, each rank fetching its share");
    assert!(
        outputs[1].status.success(),
        "rank 1: {}",
        text(&outputs[1].stderr)
    );
    assert!(
        text(&outputs[1].stderr).contains("fetching from the hub what rank 1 of 2 reads"),
        "{}",
        text(&outputs[1].stderr)
    );
    let alone = ranks
        .ondo(&[&["run", model.to_str().unwrap()][..], &args[2..]].concat())
        .output()
        .unwrap();
    assert_eq!(ids(&split), ids(&run_json(&alone, "one process")));

    // Each rank holds the files of its own layers (and the embedding's,
    // the final norm's), none holds every file, and together they hold all.
    let (first, last) = (
        cached_weight_files(&cache(1), "ondo-test/split"),
        cached_weight_files(&cache(0), "ondo-test/split"),
    );
    assert!(
        first.len() < every_file.len() && last.len() < every_file.len(),
        "rank 1 holds {first:?}, rank 0 holds {last:?}"
    );
    assert_eq!(
        first
            .union(&last)
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        every_file
    );
    assert!(
        first.contains("model-00002-of-00020.safetensors")
            && !last.contains("model-00002-of-00020.safetensors")
    );

    // The next split run reads what each cache holds: the hub is gone.
    drop(hub);
    let again = split_run_from("http://127.0.0.1:9");
    assert_eq!(
        ids(&run_json(&again[0], "split again from the caches")),
        ids(&split)
    );

    // Alone, a rank's share is not a model: named, with what to do.
    let partial = ranks
        .ondo(&["run", "ondo-test/split", "Hi"])
        .env("HF_HUB_CACHE", cache(1))
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let said = text(&partial.stderr);
    assert!(
        !partial.status.success() && said.contains("partly downloaded"),
        "{said}"
    );
}

#[test]
fn ondo_starts_the_other_ranks_itself_from_a_hostfile() {
    let ranks = Ranks::new(2);
    let model = ranks.synth("tiny", &["--layers", "4", "--untied-head"]);
    let model = model.to_str().unwrap();
    let args = [
        "--prompt-ids",
        "5,17,99,3,250,7,41",
        "--max-tokens",
        "8",
        "--json",
    ];
    let alone = ids(&run_json(
        &ranks
            .ondo(&[&["run", model][..], &args[..]].concat())
            .output()
            .unwrap(),
        "alone",
    ));
    // Two ranks on this machine: no ssh, no launcher, no MLX_RANK.
    let hosts = ranks.dir.path().join("two-here.json");
    std::fs::write(&hosts, r#"["localhost", "127.0.0.1"]"#).unwrap();
    let hostfile = hosts.to_str().unwrap();
    for split in ["pipeline", "tensor"] {
        let out = hostfile_run(
            &ranks,
            &[
                &["--hostfile", hostfile, model, "--split", split][..],
                &args[..],
            ]
            .concat(),
        );
        let what = format!("--hostfile, split by {split}");
        assert_eq!(ids(&run_json(&out, &what)), alone, "{what}");
        assert!(
            text(&out.stderr).contains("over 2 ranks"),
            "{what}: {}",
            text(&out.stderr)
        );
    }
    // Sampled without a seed: the ranks sample with rank 0's, which the
    // run reports, and one process given that seed draws the same tokens
    // (ranks that drew their own would have fed the first layers other
    // tokens than rank 0 chose).
    let split_sampled = hostfile_run(
        &ranks,
        &[
            &["--hostfile", hostfile, model, "--temp", "1", "--no-history"][..],
            &args[..],
        ]
        .concat(),
    );
    let sampled = run_json(&split_sampled, "sampled, split");
    let seed = sampled["sampler"]["seed"]
        .as_u64()
        .unwrap_or_else(|| panic!("no seed reported: {sampled}"));
    let seed = seed.to_string();
    let replayed = ranks
        .ondo(
            &[
                &["run", model, "--temp", "1", "--seed", &seed, "--no-history"][..],
                &args[..],
            ]
            .concat(),
        )
        .output()
        .unwrap();
    assert_eq!(ids(&run_json(&replayed, "sampled alone")), ids(&sampled));
    // The history says how each run was split, over what, and what a
    // decode step moved; the one-process run says nothing of it.
    let report = ranks
        .ondo(&["report", "--last", "3", "--format", "jsonl"])
        .output()
        .unwrap();
    assert!(report.status.success(), "{}", text(&report.stderr));
    let runs: Vec<Value> = text(&report.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert!(runs[0]["split"].is_null(), "{}", runs[0]);
    for (run, how) in runs[1..].iter().zip(["pipeline", "tensor"]) {
        assert_eq!(run["split"], how, "{run}");
        assert_eq!(run["split_ranks"], 2, "{run}");
        assert_eq!(run["split_backend"], "ring", "{run}");
        assert_eq!(
            run["split_hosts"].as_str().unwrap().matches(", ").count(),
            1,
            "{run}"
        );
        assert!(run["split_step_bytes"].as_u64().unwrap() > 0, "{run}");
        assert!(run["split_step_link_ms"].as_f64().unwrap() > 0.0, "{run}");
        // The prefill moves a decode step's message for every prompt token
        // it runs, in chunks, and takes longer on the links than one step.
        assert_eq!(
            run["split_prefill_bytes"].as_u64(),
            Some(
                run["prefill_tokens"].as_u64().unwrap() * run["split_step_bytes"].as_u64().unwrap()
            ),
            "{run}"
        );
        assert!(
            run["split_prefill_link_ms"].as_f64().unwrap()
                > run["split_step_link_ms"].as_f64().unwrap(),
            "{run}"
        );
        // Each rank's share timed alone: one number a rank, in rank order.
        for field in ["split_rank_step_ms", "split_rank_prefill_tps"] {
            let each: Vec<f64> = run[field]
                .as_str()
                .unwrap_or_else(|| panic!("no {field}: {run}"))
                .split(", ")
                .map(|n| n.parse().unwrap())
                .collect();
            assert!(
                each.len() == 2 && each.iter().all(|n| *n > 0.0),
                "{field}: {run}"
            );
        }
    }
    // By heads, every layer sums twice: more bytes a step than by layers.
    assert!(runs[2]["split_step_bytes"].as_u64() > runs[1]["split_step_bytes"].as_u64());
    let table = ranks
        .ondo(&["report", "--last", "3", "--format", "md"])
        .output()
        .unwrap();
    let table = text(&table.stdout);
    assert!(
        table.contains("by layers") && table.contains("by heads") && table.contains("one process"),
        "{table}"
    );
    // The doctor starts the others the same way.
    let doctor = ranks
        .ondo(&[
            "doctor",
            "--distributed",
            "--hostfile",
            hostfile,
            "--model",
            model,
            "--json",
        ])
        .output()
        .unwrap();
    let doctor = run_json(&doctor, "doctor --hostfile");
    assert_eq!(doctor["ranks"].as_array().unwrap().len(), 2, "{doctor}");
    assert_eq!(doctor["links"].as_array().unwrap().len(), 3, "{doctor}");
    // `ondo bench --hostfile`: one process against both splits, each a
    // fresh run, with the same greedy tokens, and every run in the history.
    let bench = ranks
        .ondo(&[
            "bench",
            model,
            "--hostfile",
            hostfile,
            "--prompt-tokens",
            "16",
            "--gen",
            "8",
            "--reps",
            "2",
            "--warmup",
            "0",
            "--json",
        ])
        .output()
        .unwrap();
    let bench = run_json(&bench, "bench --hostfile");
    let sides = bench["sides"].as_array().unwrap();
    let names: Vec<&str> = sides.iter().map(|s| s["side"].as_str().unwrap()).collect();
    assert_eq!(names, ["one process", "by layers", "by heads"], "{bench}");
    for side in &sides[1..] {
        assert_eq!(side["same_tokens_as_one_process"], true, "{side}");
        assert!(side["decode_ratio"].as_f64().unwrap() > 0.0, "{side}");
        assert!(side["step_bytes"].as_u64().unwrap() > 0, "{side}");
    }
    let bench_id = bench["bench_id"].as_str().unwrap();
    let report = ranks
        .ondo(&["report", "--bench", bench_id, "--format", "jsonl"])
        .output()
        .unwrap();
    let recorded: Vec<Value> = text(&report.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(recorded.len(), 6, "{}", text(&report.stdout));
    assert_eq!(
        recorded.iter().filter(|r| r["split"] == "tensor").count(),
        2
    );
    // A host that cannot be reached ends the run at once, naming it.
    let far = ranks.dir.path().join("far.json");
    std::fs::write(
        &far,
        r#"["localhost", {"ssh": "nohost.invalid", "ips": ["10.255.255.1"]}]"#,
    )
    .unwrap();
    let started = Instant::now();
    let child = ranks
        .ondo(
            &[
                &["run", "--hostfile", far.to_str().unwrap(), model][..],
                &args[..],
            ]
            .concat(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_all(vec![child], Duration::from_secs(60)).remove(0);
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(said.contains("rank 1 (nohost.invalid)"), "{said}");
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "{:?}",
        started.elapsed()
    );
}

/// Runs `tests/python/openai_client.py SCENARIO` against `served`.
fn openai_client(served: &served::Served, scenario: &str, args: &Value) -> Value {
    let out = Command::new(common::python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py"))
        .args([&served.url, scenario, &args.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai_client.py {scenario}: {}\nserver log:\n{}",
        text(&out.stderr),
        served.log()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What `basics` got that one model's greedy answers decide: the texts.
fn answers(basics: &Value) -> Vec<Value> {
    [
        &basics["chat"]["text"],
        &basics["streamed"]["text"],
        &basics["follow_up"]["text"],
        &basics["completion"]["text"],
        &basics["completion_streamed"],
    ]
    .into_iter()
    .cloned()
    .collect()
}

/// The one other rank a server of two ranks started (its child process).
fn the_other_rank(served: &served::Served) -> u32 {
    let out = Command::new("pgrep")
        .args(["-P", &served.pid().to_string()])
        .output()
        .unwrap();
    let children: Vec<u32> = text(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert_eq!(children.len(), 1, "{children:?}");
    children[0]
}

fn is_running(pid: u32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

#[test]
#[cfg_attr(
    ondo_skip_python,
    ignore = "needs the openai package in the project venv (make setup)"
)]
fn a_split_model_serves_the_openai_client_and_its_ranks_stop_together() {
    let ranks = Ranks::new(2);
    let model = ranks.synth("served", &["--layers", "4", "--untied-head"]);
    // Room for a prompt whose prefill takes many chunks.
    let config = model.join("config.json");
    let mut settings: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    settings["max_position_embeddings"] = json!(32768);
    std::fs::write(&config, settings.to_string()).unwrap();
    let hosts = ranks.dir.path().join("two-here.json");
    std::fs::write(&hosts, r#"["localhost", "127.0.0.1"]"#).unwrap();
    let serve = |split: &[&str]| {
        let mut ondo = ranks.ondo(&[]);
        ondo.env("ONDO_RANK_JOIN_TIMEOUT_S", "30");
        let mut args = vec![std::ffi::OsStr::new("--no-history"), model.as_os_str()];
        args.extend(split.iter().map(std::ffi::OsStr::new));
        served::Served::start_with(ondo, &args)
    };
    let args = json!({
        "model": "served", "system": "You answer briefly.", "user": "Tell me about the sea.",
        "max_tokens": 12, "long_tokens": 30000,
    });
    // One process's answers: what the split server must say.
    let alone = serve(&[]);
    let basics = openai_client(&alone, "basics", &args);
    let expected = answers(&basics);
    // The follow-up continues the first turn's cache.
    let reused = |basics: &Value| {
        basics["follow_up"]["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let reused_alone = reused(&basics);
    assert!(reused_alone > 0, "{basics}");
    // Sampled with a seed: every rank must draw what one process draws.
    let sampled_chat = json!({
        "model": "served", "max_tokens": 12, "temperature": 1.0, "seed": 11,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
    });
    let sampled = |served: &served::Served| {
        let (status, body) = served.post("/v1/chat/completions", &sampled_chat);
        assert_eq!(status, 200, "{body}");
        body["choices"][0]["message"]["content"].clone()
    };
    let sampled_alone = sampled(&alone);
    assert!(alone.stop().success());

    let hostfile = hosts.to_str().unwrap();
    let by_heads = serve(&["--hostfile", hostfile, "--split", "tensor"]);
    let log = by_heads.log();
    assert!(
        log.contains("split by heads over 2 ranks") && log.contains("clients name"),
        "{log}"
    );
    let basics = openai_client(&by_heads, "basics", &args);
    assert!(
        basics["models"]
            .as_array()
            .unwrap()
            .contains(&json!("served")),
        "{basics}"
    );
    assert_eq!(answers(&basics), expected, "split by heads");
    // Every rank kept the conversation and reused the same positions.
    assert_eq!(reused(&basics), reused_alone, "{basics}");
    assert_eq!(sampled(&by_heads), sampled_alone, "sampled, split by heads");
    // A client that leaves mid-answer: rank 0 stops every rank on the same
    // step, so the next request starts at once and the ranks still agree.
    let dropped = openai_client(&by_heads, "drop", &args);
    assert_eq!(dropped["received"], 5);
    let (before, after) = (
        dropped["before"].as_f64().unwrap(),
        dropped["after"].as_f64().unwrap(),
    );
    assert!(
        after < (before * 10.0).max(2.0),
        "before {before} s, after {after} s"
    );
    assert!(
        by_heads.log().contains("cancelled: the client went away"),
        "{}",
        by_heads.log()
    );
    // Rank 0 lets the model go (a client's keep_alive 0) while the other
    // rank keeps its share and conversations: the ranks find they would
    // reuse different positions and all start the prompts afresh.
    let (status, unloaded) = by_heads.post(
        "/api/generate",
        &json!({"model": "served", "keep_alive": 0}),
    );
    assert_eq!(status, 200, "{unloaded}");
    assert_eq!(
        answers(&openai_client(&by_heads, "basics", &args)),
        expected,
        "after the drop and an unload on rank 0"
    );
    // Stopping rank 0 tells the other rank to finish; it ends too.
    let follower = the_other_rank(&by_heads);
    assert!(by_heads.stop().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_running(follower) {
        assert!(Instant::now() < deadline, "rank 1 outlived rank 0");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A rank that dies: the split model answers why, the others serve on.
    let by_layers = serve(&["--hostfile", hostfile]);
    assert_eq!(
        answers(&openai_client(&by_layers, "basics", &args)),
        expected,
        "split by layers"
    );
    // A client that gives up during a long prompt's prefill: every rank
    // stops at the same chunk, so the next request starts at once (the
    // whole prefill takes many seconds here) and the ranks still agree.
    let impatient = json!({
        "model": "served", "system": "You answer briefly.", "user": "Tell me about the sea.",
        "long_user": "the sea and the sky ".repeat(1800), "patience_s": 1.0,
    });
    let gave_up = openai_client(&by_layers, "give_up", &impatient);
    assert_eq!(gave_up["given_up"], true, "{gave_up}");
    let (before, after) = (
        gave_up["before"].as_f64().unwrap(),
        gave_up["after"].as_f64().unwrap(),
    );
    assert!(
        after < (before * 10.0).max(4.0),
        "before {before} s, after giving up {after} s"
    );
    assert!(
        by_layers.log().contains("cancelled: the client went away"),
        "{}",
        by_layers.log()
    );
    assert_eq!(
        answers(&openai_client(&by_layers, "basics", &args)),
        expected,
        "split by layers, after a prefill given up"
    );
    let follower = the_other_rank(&by_layers);
    // SAFETY: a plain signal to a process this test's server started.
    unsafe {
        libc::kill(follower as i32, libc::SIGKILL);
    }
    let ask = |model: &str| {
        by_layers.post(
            "/v1/chat/completions",
            &json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, error) = loop {
        let (status, body) = ask("served");
        if status != 200 {
            break (status, body);
        }
        assert!(
            Instant::now() < deadline,
            "the split model answered without rank 1"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status, 502, "{error}");
    assert_eq!(error["error"]["code"], "distributed", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("rank 1") && message.contains("restart"),
        "{message}"
    );
    let (status, body) = ask("tiny");
    assert_eq!(status, 200, "{body}");
    assert!(by_layers.stop().success());
}
