//! Downloads against a real hub server on 127.0.0.1 (crates/ondo-testhub):
//! the model arrives whole and loads, survives being killed and dropped,
//! refuses corrupted bytes, copes with the real hub's ways (busy answers
//! with Retry-After, a `main` that moves mid-pull, expiring storage links,
//! relative redirects, gated files, refused tokens), and every failure is a
//! named error that leaves nothing half-written passed off as complete.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ondo::hub::{
    DownloadCancel, DownloadEvent, DownloadOptions, DownloadSummary, Hub, HubConfig, HubError,
    ModelRef, OnCancel, config::TokenSource, library, sizing,
};
use ondo::paths::DataDirs;
use ondo::synth::{self, SynthOptions};
use ondo_testhub::TestHub;
use sha2::{Digest, Sha256};

mod common;

const REPO: &str = "ondo-test/tiny";

/// The tiny synthetic model, split into shards of about 2 MB so that a
/// download has several large files (one finished, one partial, ...).
fn sharded_tiny(dir: &Path) -> synth::SynthSummary {
    let options = SynthOptions {
        max_shard_bytes: 2_000_000,
        ..SynthOptions::for_preset(synth::preset_named("tiny").unwrap())
    };
    synth::write_model(&options, dir, &mut |_| {}).unwrap()
}

struct Fixture {
    root: tempfile::TempDir,
    hub: TestHub,
    model_dir: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let model_dir = root.path().join("served/tiny");
        sharded_tiny(&model_dir);
        let hub = TestHub::start().unwrap();
        hub.add_repo(REPO, &model_dir).unwrap();
        Self {
            root,
            hub,
            model_dir,
        }
    }

    fn dirs(&self) -> DataDirs {
        DataDirs {
            data_dir: self.root.path().join("ondo"),
            models_dir: self.root.path().join("ondo/models"),
            hf_cache_dir: self.cache_dir(),
        }
    }

    fn cache_dir(&self) -> PathBuf {
        self.root.path().join("hf/hub")
    }

    fn config(&self) -> HubConfig {
        HubConfig {
            endpoint: self.hub.url(),
            cache_dir: self.cache_dir(),
            token: None,
            token_source: None,
            offline: false,
            read_timeout: Duration::from_secs(5),
            retries: 3,
            busy_attempts: 6,
            max_busy_wait: Duration::from_secs(60),
        }
    }

    fn client(&self) -> Hub {
        Hub::new(self.config()).unwrap()
    }

    /// The environment a child `ondo` gets: this hub, this cache, no keychain.
    fn env(&self, command: &mut Command) {
        command
            .env("HF_ENDPOINT", self.hub.url())
            .env("HF_HUB_CACHE", self.cache_dir())
            .env("ONDO_HOME", self.root.path().join("ondo"))
            .env("ONDO_NO_KEYCHAIN", "1")
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE");
    }

    fn blobs_dir(&self) -> PathBuf {
        self.cache_dir().join("models--ondo-test--tiny/blobs")
    }

    fn ref_main(&self) -> Option<String> {
        std::fs::read_to_string(self.cache_dir().join("models--ondo-test--tiny/refs/main"))
            .ok()
            .map(|commit| commit.trim().to_owned())
    }

    /// Another tiny model (other weights, same shape) written beside the
    /// served one, for a push to `main`.
    fn pushed_model(&self) -> PathBuf {
        let dir = self.root.path().join("served/pushed");
        let options = SynthOptions {
            seed: 7,
            max_shard_bytes: 2_000_000,
            ..SynthOptions::for_preset(synth::preset_named("tiny").unwrap())
        };
        synth::write_model(&options, &dir, &mut |_| {}).unwrap();
        dir
    }
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

fn download(
    hub: &Hub,
    model: &str,
    events: &mut Vec<DownloadEvent>,
) -> Result<DownloadSummary, HubError> {
    let model = ModelRef::parse(model).unwrap();
    block_on(hub.download(
        &model,
        DownloadOptions::default(),
        &mut |e| events.push(e),
        &DownloadCancel::new(),
    ))
}

fn sha256_of(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

/// Every file the served folder has that a model needs is in the snapshot,
/// byte for byte.
fn assert_snapshot_matches(snapshot: &Path, served: &Path) {
    let mut compared = 0;
    for entry in std::fs::read_dir(served).unwrap().flatten() {
        let name = entry.file_name().into_string().unwrap();
        let ours = snapshot.join(&name);
        assert!(ours.is_file(), "{name} missing from the snapshot");
        assert_eq!(sha256_of(&ours), sha256_of(&entry.path()), "{name} differs");
        compared += 1;
    }
    assert!(compared >= 5, "only {compared} files compared");
}

fn partial_files(blobs: &Path) -> Vec<(PathBuf, u64)> {
    std::fs::read_dir(blobs)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .map(|e| (e.path(), e.metadata().unwrap().len()))
        .collect()
}

fn complete_blobs(blobs: &Path) -> Vec<String> {
    std::fs::read_dir(blobs)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".incomplete"))
        .collect()
}

#[test]
fn a_full_download_lands_in_the_hf_cache_and_loads() {
    let fx = Fixture::new();
    let mut events = Vec::new();
    let summary = download(&fx.client(), REPO, &mut events).unwrap();
    assert_eq!(summary.commit, fx.hub.commit_of(REPO).unwrap());
    assert_snapshot_matches(&summary.snapshot_dir, &fx.model_dir);
    // The Python tools' layout: refs/main names the commit, snapshot files
    // are relative links into blobs/.
    let repo_dir = fx.cache_dir().join("models--ondo-test--tiny");
    let main = std::fs::read_to_string(repo_dir.join("refs/main")).unwrap();
    assert_eq!(main.trim(), summary.commit);
    let link = std::fs::read_link(summary.snapshot_dir.join("config.json")).unwrap();
    assert!(
        link.is_relative() && link.starts_with("../../blobs"),
        "{link:?}"
    );
    assert!(partial_files(&fx.blobs_dir()).is_empty());
    // Every LFS file was checked, and progress reached the total.
    let verified = events
        .iter()
        .filter(|e| matches!(e, DownloadEvent::FileDone { verified: true, .. }))
        .count();
    assert!(verified >= 3, "{verified} files verified");
    let last_done = events.iter().rev().find_map(|e| match e {
        DownloadEvent::Progress {
            done_bytes,
            total_bytes,
            ..
        } => Some((*done_bytes, *total_bytes)),
        _ => None,
    });
    let (done, total) = last_done.unwrap();
    assert_eq!(done, total);

    // The files load and generate.
    let engine = ondo::engine::EngineHandle::spawn().unwrap();
    let request = ondo::engine::GenerateRequest {
        max_tokens: 4,
        ..ondo::engine::GenerateRequest::new(
            &summary.snapshot_dir,
            ondo::engine::Prompt::user("hi"),
        )
    };
    let outcome = engine
        .generate_blocking(request, ondo::engine::CancelToken::new(), |_| {})
        .unwrap();
    assert_eq!(outcome.stats.generated_tokens, 4);

    // A second pull fetches nothing.
    let served_before = fx.hub.body_bytes_served();
    let again = download(&fx.client(), REPO, &mut Vec::new()).unwrap();
    assert_eq!(again.fetched_bytes, 0);
    assert_eq!(fx.hub.body_bytes_served(), served_before);

    // The library sees it, with what it is.
    let listed = library::find_cached(&fx.cache_dir(), REPO).unwrap();
    assert!(listed.complete, "{:?}", listed.problem);
    assert_eq!(listed.model_type.as_deref(), Some("llama"));
    assert_eq!(listed.revisions, vec!["main".to_owned()]);
    assert!(listed.size_on_disk_bytes >= summary.total_bytes);
}

#[test]
fn killed_pulls_resume_without_fetching_finished_files_again() {
    let fx = Fixture::new();
    let ondo = env!("CARGO_BIN_EXE_ondo");
    // Slow enough that the pull is caught mid-file.
    fx.hub.set_bytes_per_second(Some(1_500_000));
    let blobs = fx.blobs_dir();

    // Kill 1: inside the first weight file.
    let kill_when = |ready: &dyn Fn() -> bool| {
        let mut command = Command::new(ondo);
        command
            .args(["pull", REPO, "--json"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        fx.env(&mut command);
        let mut child = command.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready() {
            assert!(
                Instant::now() < deadline,
                "the pull never reached the kill point"
            );
            assert!(
                child.try_wait().unwrap().is_none(),
                "the pull ended before the kill point"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap(); // SIGKILL: no chance to clean up
        child.wait().unwrap();
    };
    kill_when(&|| partial_files(&blobs).iter().any(|(_, len)| *len > 100_000));
    let partial_after_first = partial_files(&blobs);
    assert_eq!(partial_after_first.len(), 1);

    // Kill 2: after at least one weight file is finished and another is partial.
    let lfs_done = |blobs: &Path| {
        complete_blobs(blobs)
            .iter()
            .filter(|n| n.len() == 64)
            .count()
    };
    kill_when(&|| {
        lfs_done(&blobs) >= 1 && partial_files(&blobs).iter().any(|(_, len)| *len > 100_000)
    });
    let finished_before_last_run: Vec<String> = complete_blobs(&blobs)
        .into_iter()
        .filter(|n| n.len() == 64)
        .collect();
    assert!(!finished_before_last_run.is_empty());

    // The requests of the second run continued the first run's partial file.
    let resumed = fx
        .hub
        .requests()
        .iter()
        .filter_map(|r| r.range.clone())
        .filter(|range| range != "bytes=0-0" && !range.starts_with("bytes=0-"))
        .count();
    assert!(resumed >= 1, "no request resumed with a Range");

    // Last run, at full speed, to the end.
    fx.hub.set_bytes_per_second(None);
    let seen_before = fx.hub.requests().len();
    let mut command = Command::new(ondo);
    command.args(["pull", REPO, "--json"]);
    fx.env(&mut command);
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let snapshot = PathBuf::from(summary["snapshot_dir"].as_str().unwrap());
    assert_snapshot_matches(&snapshot, &fx.model_dir);
    for blob in complete_blobs(&blobs) {
        if blob.len() == 64 {
            assert_eq!(
                sha256_of(&blobs.join(&blob)),
                blob,
                "blob content is its sha256"
            );
        }
    }
    // Files finished before the last run were not asked for again.
    for request in &fx.hub.requests()[seen_before..] {
        for done in &finished_before_last_run {
            assert!(
                !request.path.ends_with(done.as_str()),
                "{} fetched again",
                request.path
            );
        }
    }
    assert!(summary["fetched_bytes"].as_u64().unwrap() < summary["total_bytes"].as_u64().unwrap());
}

#[test]
fn a_dropped_connection_is_resumed_from_where_it_stopped() {
    let fx = Fixture::new();
    fx.hub.drop_next_transfers(2, 300_000);
    let mut events = Vec::new();
    let summary = download(&fx.client(), REPO, &mut events).unwrap();
    assert_snapshot_matches(&summary.snapshot_dir, &fx.model_dir);
    let retries = events
        .iter()
        .filter(|e| matches!(e, DownloadEvent::Retrying { .. }))
        .count();
    assert_eq!(retries, 2, "{events:?}");
    let resumed_at_offset = fx
        .hub
        .requests()
        .iter()
        .filter_map(|r| r.range.clone())
        .any(|range| range == "bytes=300000-");
    assert!(resumed_at_offset, "{:?}", fx.hub.requests());
}

#[test]
fn a_connection_that_keeps_dropping_is_a_named_error_and_keeps_what_arrived() {
    let fx = Fixture::new();
    fx.hub.drop_next_transfers(100, 200_000);
    let err = download(&fx.client(), REPO, &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), "interrupted", "{err}");
    assert!(
        err.to_string().contains("download the model again"),
        "{err}"
    );
    assert!(
        partial_files(&fx.blobs_dir())
            .iter()
            .any(|(_, len)| *len >= 200_000)
    );
    // No ref: the revision does not resolve to a half snapshot.
    assert!(
        !fx.cache_dir()
            .join("models--ondo-test--tiny/refs/main")
            .exists()
    );
    // And the next pull, with the server behaving, finishes it.
    fx.hub.drop_next_transfers(0, 0);
    let summary = download(&fx.client(), REPO, &mut Vec::new()).unwrap();
    assert_snapshot_matches(&summary.snapshot_dir, &fx.model_dir);
}

#[test]
fn a_slow_server_still_gets_sensible_progress_and_eta() {
    let fx = Fixture::new();
    let rate = 3_000_000u64;
    fx.hub.set_bytes_per_second(Some(rate));
    let mut events = Vec::new();
    download(&fx.client(), REPO, &mut events).unwrap();
    let progress: Vec<(f64, Option<f64>, u64, u64)> = events
        .iter()
        .filter_map(|e| match e {
            DownloadEvent::Progress {
                bytes_per_second,
                eta_seconds,
                done_bytes,
                total_bytes,
                ..
            } => Some((*bytes_per_second, *eta_seconds, *done_bytes, *total_bytes)),
            _ => None,
        })
        .collect();
    assert!(progress.len() >= 10, "{} progress events", progress.len());
    // Halfway through, the speed is near the server's rate and the ETA is
    // the rest at that speed.
    let (speed, eta, done, total) = progress[progress.len() / 2];
    assert!(
        speed > rate as f64 / 4.0 && speed < rate as f64 * 4.0,
        "speed {speed} vs rate {rate}"
    );
    let expected_eta = (total - done) as f64 / rate as f64;
    let eta = eta.unwrap();
    assert!(
        eta > expected_eta / 4.0 && eta < expected_eta * 4.0 + 0.5,
        "eta {eta} s, expected about {expected_eta} s"
    );
    // Done bytes never go backwards.
    assert!(progress.windows(2).all(|w| w[0].2 <= w[1].2));
}

#[test]
fn corrupted_bytes_are_refused_and_deleted() {
    let fx = Fixture::new();
    let shard = std::fs::read_dir(&fx.model_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .find(|n| n.ends_with(".safetensors"))
        .unwrap();
    assert!(fx.hub.corrupt(REPO, &shard));
    let err = download(&fx.client(), REPO, &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), "checksum_mismatch", "{err}");
    assert!(err.to_string().contains(&shard), "{err}");
    // Neither the damaged blob nor its partial file is kept; no ref.
    let expected_sha = sha256_of(&fx.model_dir.join(&shard));
    assert!(!fx.blobs_dir().join(&expected_sha).exists());
    assert!(partial_files(&fx.blobs_dir()).is_empty());
    assert!(
        !fx.cache_dir()
            .join("models--ondo-test--tiny/refs/main")
            .exists()
    );
}

#[test]
fn hub_errors_are_named() {
    let fx = Fixture::new();
    let hub = fx.client();
    // Asked without a token, the hub answers 401 RepoNotFound: the message
    // says it may be private.
    let err = download(&hub, "ondo-test/no-such-model", &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), "repo_not_found", "{err}");
    assert!(err.to_string().contains("private"), "{err}");
    assert!(
        fx.hub
            .requests()
            .iter()
            .any(|r| r.path.contains("no-such-model") && r.status == 401)
    );
    let err = download(&hub, "ondo-test/tiny@no-such-branch", &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), "revision_not_found", "{err}");

    // A gated repo: its info is public, its files are not.
    fx.hub.set_gated(REPO, Some("hf_right"));
    let seen = fx.hub.requests().len();
    let err = download(&hub, REPO, &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), "unauthorized", "{err}");
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");
    let statuses: Vec<u16> = fx.hub.requests()[seen..].iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 401], "info, then the first file");
    let wrong = Hub::new(HubConfig {
        token: Some("hf_wrong".into()),
        ..fx.config()
    })
    .unwrap();
    let err = download(&wrong, REPO, &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), "forbidden", "{err}");
    let right = Hub::new(HubConfig {
        token: Some("hf_right".into()),
        ..fx.config()
    })
    .unwrap();
    download(&right, REPO, &mut Vec::new()).unwrap();

    // Nothing listens on this port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let unreachable = Hub::new(HubConfig {
        endpoint,
        ..fx.config()
    })
    .unwrap();
    let err = download(&unreachable, "ondo-test/other", &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), "unreachable", "{err}");
    assert!(err.to_string().contains("HF_HUB_OFFLINE"), "{err}");
}

#[test]
fn offline_mode_uses_the_cache_only() {
    let fx = Fixture::new();
    let offline = Hub::new(HubConfig {
        offline: true,
        ..fx.config()
    })
    .unwrap();
    let err = download(&offline, REPO, &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), "not_cached_offline", "{err}");
    let online = download(&fx.client(), REPO, &mut Vec::new()).unwrap();
    let seen = fx.hub.requests().len();
    let cached = download(&offline, REPO, &mut Vec::new()).unwrap();
    assert_eq!(cached.snapshot_dir, online.snapshot_dir);
    assert_eq!(fx.hub.requests().len(), seen, "offline mode made a request");
}

#[test]
fn cancel_keeps_or_removes_the_partial_file_as_asked() {
    for (on_cancel, keeps) in [
        (OnCancel::KeepPartial, true),
        (OnCancel::RemovePartial, false),
    ] {
        let fx = Fixture::new();
        fx.hub.set_bytes_per_second(Some(2_000_000));
        let cancel = DownloadCancel::new();
        let model = ModelRef::parse(REPO).unwrap();
        let hub = fx.client();
        let result = block_on(hub.download(
            &model,
            DownloadOptions {
                on_cancel,
                ..Default::default()
            },
            &mut |event| {
                if let DownloadEvent::Progress { file_bytes, .. } = event
                    && file_bytes > 200_000
                {
                    cancel.cancel();
                }
            },
            &cancel,
        ));
        assert_eq!(result.unwrap_err().kind(), "cancelled");
        let partial = partial_files(&fx.blobs_dir());
        assert_eq!(!partial.is_empty(), keeps, "{on_cancel:?}: {partial:?}");
    }
}

#[test]
fn two_repos_download_at_once() {
    let fx = Fixture::new();
    let other_dir = fx.root.path().join("served/other");
    let options = SynthOptions {
        seed: 1,
        ..SynthOptions::for_preset(synth::preset_named("tiny").unwrap())
    };
    synth::write_model(&options, &other_dir, &mut |_| {}).unwrap();
    fx.hub.add_repo("ondo-test/other", &other_dir).unwrap();
    fx.hub.set_bytes_per_second(Some(8_000_000));
    let hub = fx.client();
    let (a, b) = block_on(async {
        let cancel = DownloadCancel::new();
        let first = ModelRef::parse(REPO).unwrap();
        let second = ModelRef::parse("ondo-test/other").unwrap();
        let mut sink_a = |_e: DownloadEvent| {};
        let mut sink_b = |_e: DownloadEvent| {};
        tokio::join!(
            hub.download(&first, DownloadOptions::default(), &mut sink_a, &cancel),
            hub.download(&second, DownloadOptions::default(), &mut sink_b, &cancel),
        )
    });
    assert_snapshot_matches(&a.unwrap().snapshot_dir, &fx.model_dir);
    assert_snapshot_matches(&b.unwrap().snapshot_dir, &other_dir);
}

#[test]
fn path_tricks_in_repo_ids_are_refused_before_any_request() {
    let fx = Fixture::new();
    for bad in [
        "../../etc",
        "ondo-test/..",
        "ondo-test/tiny@../../x",
        "/abs/path",
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ondo"));
        command.args(["pull", bad, "--json"]);
        fx.env(&mut command);
        let output = command.output().unwrap();
        assert!(!output.status.success());
        let record: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let kind = record["error"]["kind"].as_str().unwrap();
        assert!(
            kind == "invalid_repo_id" || kind == "invalid_revision",
            "{bad}: {kind}"
        );
    }
    assert!(fx.hub.requests().is_empty());
    assert!(!fx.cache_dir().exists());
}

#[test]
fn a_full_disk_is_named_before_anything_is_written() {
    // A 1 MiB tmpfs as the cache, in a private mount namespace (root, or a
    // user namespace where the kernel allows them).
    let fx = Fixture::new();
    let cache = fx.cache_dir();
    std::fs::create_dir_all(&cache).unwrap();
    let ondo = env!("CARGO_BIN_EXE_ondo");
    let script = format!(
        "mount -t tmpfs -o size=1m ondo-test '{}' && exec '{ondo}' pull {REPO} --json",
        cache.display()
    );
    let mut command = Command::new("unshare");
    command.args(["--user", "--map-root-user", "--mount", "sh", "-c", &script]);
    fx.env(&mut command);
    let output = command.output().expect("unshare (util-linux) runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("mount:"),
        "cannot mount a tmpfs here: {stderr}"
    );
    assert!(!output.status.success());
    let record: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(record["error"]["kind"], "disk_full", "{record}");
    // The message is the one the app shows too; the CLI's hint names commands.
    let message = record["error"]["message"].as_str().unwrap();
    assert!(message.contains("free some space"), "{message}");
    assert!(!message.contains("ondo "), "{message}");
    let hint = record["error"]["hint"].as_str().unwrap();
    assert!(
        hint.contains("ondo rm") && hint.contains(&format!("ondo pull {REPO}")),
        "{hint}"
    );
    // The tmpfs went away with the namespace; the real folder got nothing.
    assert!(std::fs::read_dir(&cache).unwrap().next().is_none());
}

#[test]
fn the_fit_from_the_hub_matches_the_fit_from_the_folder() {
    let fx = Fixture::new();
    let hub = fx.client();
    let model = ModelRef::parse(REPO).unwrap();
    let remote = block_on(hub.facts_from_hub(&model)).unwrap();
    let local = sizing::facts_from_folder(&fx.model_dir).unwrap();
    assert_eq!(remote.weights_bytes, local.weights_bytes);
    assert_eq!(remote.shape, local.shape);
    // Nothing was downloaded to judge it.
    assert!(!fx.cache_dir().exists());
}

#[test]
fn search_finds_served_models() {
    let fx = Fixture::new();
    let hits = block_on(fx.client().search("TINY", 10)).unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].id, REPO);
    let hits = block_on(fx.client().search("nothing-like-this", 10)).unwrap();
    assert!(hits.is_empty());
}

#[test]
fn ls_and_rm_show_and_free_what_is_on_disk() {
    let fx = Fixture::new();
    download(&fx.client(), REPO, &mut Vec::new()).unwrap();
    let run = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ondo"));
        command.args(args);
        fx.env(&mut command);
        let output = command.output().unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let listed: serde_json::Value = serde_json::from_str(&run(&["ls", "--json"])).unwrap();
    let entry = &listed.as_array().unwrap()[0];
    assert_eq!(entry["id"], REPO);
    assert_eq!(entry["complete"], true);
    let table = run(&["ls"]);
    assert!(table.contains(REPO) && table.contains("MiB"), "{table}");
    let removed = run(&["rm", REPO, "--yes"]);
    assert!(
        removed.contains("freed") && removed.contains("MiB"),
        "{removed}"
    );
    assert!(library::find_cached(&fx.cache_dir(), REPO).is_none());
    let _ = fx.dirs();

    // Removing it twice: the error, then the CLI's hint naming its commands.
    let mut again = Command::new(env!("CARGO_BIN_EXE_ondo"));
    again.args(["rm", REPO, "--yes"]);
    fx.env(&mut again);
    let output = again.output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains("is not in the Hugging Face cache"),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with("hint: ") && lines[1].contains("`ondo ls` lists the models here"),
        "{stderr}"
    );
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn python_tools_find_what_ondo_downloaded() {
    let python = common::python();
    let fx = Fixture::new();
    let summary = download(&fx.client(), REPO, &mut Vec::new()).unwrap();
    let output = Command::new(python)
        .args([
            "-c",
            "import sys; from huggingface_hub import snapshot_download; \
             print(snapshot_download(sys.argv[1], local_files_only=True))",
            REPO,
        ])
        .env("HF_HUB_CACHE", fx.cache_dir())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let found = String::from_utf8(output.stdout).unwrap();
    assert_eq!(PathBuf::from(found.trim()), summary.snapshot_dir);
}

#[test]
fn the_fit_estimate_uses_the_engines_numbers() {
    // The hub repeats two engine constants rather than depend on the engine.
    assert_eq!(
        ondo::hub::fit::PREFILL_STEP_TOKENS,
        ondo::engine::generate::DEFAULT_PREFILL_STEP_SIZE as u64
    );
    assert_eq!(
        ondo::hub::fit::KV_CACHE_STEP,
        ondo::engine::cache::STEP as u64
    );
}

/// Runs `ondo` against the fixture's hub and cache.
fn ondo(fx: &Fixture, args: &[&str]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ondo"));
    command.args(args);
    fx.env(&mut command);
    command.output().unwrap()
}

#[test]
fn the_cli_pulls_with_progress_judges_the_fit_and_refuses_what_will_not_fit() {
    let fx = Fixture::new();
    fx.hub.set_bytes_per_second(Some(4_000_000));

    // The fit is judged from the hub before anything is downloaded.
    let remote = ondo(&fx, &["fit", REPO, "--json"]);
    assert!(
        remote.status.success(),
        "{}",
        String::from_utf8_lossy(&remote.stderr)
    );
    let remote: serde_json::Value = serde_json::from_slice(&remote.stdout).unwrap();
    assert_eq!(remote["source"], "hub");
    assert_eq!(remote["verdict"], "fits");
    for field in [
        "weights_bytes",
        "kv_cache_bytes",
        "overhead_bytes",
        "available_bytes",
    ] {
        assert!(remote[field].as_u64().unwrap() > 0, "{field}: {remote}");
    }
    assert!(!fx.cache_dir().join("models--ondo-test--tiny").exists());

    // Without a terminal the pull prints plain progress lines and the verdict.
    let pull = ondo(&fx, &["pull", REPO]);
    let stderr = String::from_utf8_lossy(&pull.stderr);
    assert!(pull.status.success(), "{stderr}");
    assert!(stderr.contains("fit: fits"), "{stderr}");
    assert!(stderr.contains("% "), "no progress lines: {stderr}");
    let stdout = String::from_utf8_lossy(&pull.stdout);
    assert!(stdout.contains("ondo run ondo-test/tiny"), "{stdout}");

    // The same estimate from the downloaded folder.
    let local = ondo(&fx, &["fit", REPO, "--json"]);
    let local: serde_json::Value = serde_json::from_slice(&local.stdout).unwrap();
    assert_eq!(local["source"], "folder");
    assert_eq!(local["weights_bytes"], remote["weights_bytes"]);
    assert_eq!(local["kv_cache_bytes"], remote["kv_cache_bytes"]);

    // A context no machine has memory for: the verdict, exit status 2, advice.
    let huge = ondo(&fx, &["fit", REPO, "--context", "4000000000"]);
    assert_eq!(huge.status.code(), Some(2));
    let text = String::from_utf8_lossy(&huge.stdout);
    assert!(
        text.contains("will not fit") && text.contains("context"),
        "{text}"
    );

    // `ondo run` checks the fit before loading, and --load-anyway overrides it.
    let args = [
        "run",
        REPO,
        "hi",
        "--max-tokens",
        "2",
        "--max-kv-size",
        "4000000000",
    ];
    let refused = ondo(&fx, &args);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("will not fit") && stderr.contains("--load-anyway"),
        "{stderr}"
    );
    let mut anyway = args.to_vec();
    anyway.push("--load-anyway");
    let ran = ondo(&fx, &anyway);
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );

    // Search through the CLI marks what is already downloaded.
    let search = ondo(&fx, &["search", "tiny"]);
    let text = String::from_utf8_lossy(&search.stdout);
    assert!(text.contains(REPO) && text.contains("downloaded"), "{text}");
}

fn busy_waits(events: &[DownloadEvent]) -> Vec<(Option<String>, u16, u64, u32, u32)> {
    events
        .iter()
        .filter_map(|e| match e {
            DownloadEvent::HubBusy {
                file,
                status,
                wait_ms,
                attempt,
                attempts,
            } => Some((file.clone(), *status, *wait_ms, *attempt, *attempts)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_busy_hub_is_waited_out_as_long_as_it_asks() {
    let fx = Fixture::new();
    // Busy answers to the repo info, to a file and to the storage host.
    fx.hub.answer_busy("", 1, 503, Some("1"));
    fx.hub.answer_busy("/resolve/", 1, 429, Some("1"));
    fx.hub.answer_busy("/storage/", 1, 502, Some("1"));
    let started = Instant::now();
    let mut events = Vec::new();
    let summary = download(&fx.client(), REPO, &mut events).unwrap();
    assert_snapshot_matches(&summary.snapshot_dir, &fx.model_dir);
    let waits = busy_waits(&events);
    assert_eq!(waits.len(), 3, "{waits:?}");
    assert_eq!(waits[0], (None, 503, 1000, 2, 6));
    assert_eq!(waits[1], (Some("config.json".into()), 429, 1000, 2, 6));
    let (file, status, wait_ms, attempt, _) = &waits[2];
    assert!(file.as_ref().unwrap().ends_with(".safetensors"), "{file:?}");
    assert_eq!((*status, *wait_ms, *attempt), (502, 1000, 2));
    // Each wait was as long as the hub asked.
    assert!(started.elapsed() >= Duration::from_secs(3));
    // The busy answers were retried, not counted as dropped transfers.
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, DownloadEvent::Retrying { .. }))
    );
}

#[test]
fn a_hub_that_stays_busy_is_a_named_error_and_a_long_retry_after_gives_up_at_once() {
    let fx = Fixture::new();
    let hub = Hub::new(HubConfig {
        busy_attempts: 3,
        ..fx.config()
    })
    .unwrap();
    fx.hub.answer_busy("", 3, 503, Some("1"));
    let started = Instant::now();
    let mut events = Vec::new();
    let err = download(&hub, REPO, &mut events).unwrap_err();
    assert_eq!(err.kind(), "server_error", "{err}");
    let message = err.to_string();
    assert!(
        message.contains("503") && message.contains("3 tries") && message.contains("try again"),
        "{message}"
    );
    assert_eq!(busy_waits(&events).len(), 2);
    assert!(started.elapsed() >= Duration::from_secs(2));

    // An hour is more than anyone should sit looking at a stalled download.
    fx.hub.answer_busy("", 1, 429, Some("3600"));
    let started = Instant::now();
    let err = download(&hub, REPO, &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), "rate_limited", "{err}");
    let message = err.to_string();
    assert!(
        message.contains("1 h") && message.contains("60 s") && message.contains("token"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    // Nothing was written for a download that never started.
    assert!(!fx.blobs_dir().exists());
}

#[test]
fn cancelling_cuts_a_wait_for_a_busy_hub_short() {
    for path in ["/api/models/", "/resolve/"] {
        let fx = Fixture::new();
        fx.hub.answer_busy(path, 1, 429, Some("30"));
        let cancel = DownloadCancel::new();
        let model = ModelRef::parse(REPO).unwrap();
        let started = Instant::now();
        let result = block_on(fx.client().download(
            &model,
            DownloadOptions::default(),
            &mut |event| {
                if matches!(event, DownloadEvent::HubBusy { .. }) {
                    cancel.cancel();
                }
            },
            &cancel,
        ));
        assert_eq!(result.unwrap_err().kind(), "cancelled", "{path}");
        assert!(started.elapsed() < Duration::from_secs(5), "{path}");
    }
}

#[test]
fn a_pull_stays_on_the_commit_it_started_from_when_main_moves() {
    let fx = Fixture::new();
    let first = fx.hub.commit_of(REPO).unwrap();
    let pushed = fx.pushed_model();
    // Someone pushes after the second file has been asked for.
    let second = fx.hub.move_main_after(REPO, 2, &pushed).unwrap();
    let summary = download(&fx.client(), REPO, &mut Vec::new()).unwrap();
    // `main` did move, and the download did not follow it.
    assert_eq!(fx.hub.commit_of(REPO), Some(second.commit.clone()));
    assert_eq!(summary.commit, first);
    assert_snapshot_matches(&summary.snapshot_dir, &fx.model_dir);
    assert_eq!(fx.ref_main().as_deref(), Some(first.as_str()));
    // Every file was asked for by the commit, never by the branch.
    let file_requests: Vec<String> = fx
        .hub
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/resolve/"))
        .map(|r| r.path)
        .collect();
    assert!(file_requests.len() >= 5, "{file_requests:?}");
    for path in &file_requests {
        assert!(
            path.contains(&format!("/resolve/{first}/")),
            "{path} is not by the first commit"
        );
    }

    // The next pull takes the new commit whole.
    let next = download(&fx.client(), REPO, &mut Vec::new()).unwrap();
    assert_eq!(next.commit, second.commit);
    assert_snapshot_matches(&next.snapshot_dir, &pushed);
    assert_eq!(fx.ref_main(), Some(second.commit));
}

#[test]
fn a_corrupted_small_file_is_refused_by_its_git_blob_id() {
    let fx = Fixture::new();
    assert!(fx.hub.corrupt(REPO, "config.json"));
    let mut events = Vec::new();
    let err = download(&fx.client(), REPO, &mut events).unwrap_err();
    assert_eq!(err.kind(), "checksum_mismatch", "{err}");
    let message = err.to_string();
    assert!(
        message.contains("config.json") && message.contains("git blob id"),
        "{message}"
    );
    // Neither the damaged blob nor its partial file is kept; no ref.
    let blob_id =
        ondo_testhub::git_blob_id(&std::fs::read(fx.model_dir.join("config.json")).unwrap());
    assert!(!fx.blobs_dir().join(&blob_id).exists());
    assert!(partial_files(&fx.blobs_dir()).is_empty());
    assert_eq!(fx.ref_main(), None);

    // Whole, every small file is checked too, and named by its blob id.
    let fx = Fixture::new();
    let mut events = Vec::new();
    download(&fx.client(), REPO, &mut events).unwrap();
    let config_checked = events.iter().any(|e| {
        matches!(e, DownloadEvent::FileDone { file, verified: true, .. } if file == "config.json")
    });
    assert!(config_checked, "{events:?}");
    assert!(fx.blobs_dir().join(&blob_id).is_file());
}

#[test]
fn an_expired_storage_link_is_asked_for_anew_and_the_file_continues() {
    let fx = Fixture::new();
    // The first large body drops after 1.2 MB, which at 1 MB/s is after
    // its link (good for 0.7 s) expired: the resume finds it refused.
    fx.hub.set_link_lifetime(Duration::from_millis(700));
    fx.hub.set_bytes_per_second(Some(1_000_000));
    fx.hub.drop_next_transfers(1, 1_200_000);
    let mut events = Vec::new();
    let model = ModelRef::parse(REPO).unwrap();
    let summary = block_on(fx.client().download(
        &model,
        DownloadOptions::default(),
        &mut |event| {
            if let DownloadEvent::Retrying { detail, .. } = &event
                && detail.contains("expired")
            {
                // Once the point is made, the rest may go at full speed.
                fx.hub.set_bytes_per_second(None);
            }
            events.push(event);
        },
        &DownloadCancel::new(),
    ))
    .unwrap();
    assert_snapshot_matches(&summary.snapshot_dir, &fx.model_dir);
    let retries: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            DownloadEvent::Retrying { detail, .. } => Some(detail.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        retries.len(),
        2,
        "a drop, then an expired link: {retries:?}"
    );
    assert!(
        retries[1].contains("expired") && retries[1].contains("403"),
        "{retries:?}"
    );

    // The stale link was tried with the resume's Range and refused; the hub
    // was asked again, and the fresh link continued from the same byte.
    let requests = fx.hub.requests();
    let refused = requests
        .iter()
        .position(|r| r.path.starts_with("/storage/") && r.status == 403)
        .expect("a refused storage request");
    let resumed_at = requests[refused].range.clone().unwrap();
    assert!(resumed_at.starts_with("bytes=1200000-"), "{resumed_at}");
    let after: Vec<_> = requests[refused + 1..].iter().take(2).collect();
    assert!(after[0].path.contains("/resolve/"), "{after:?}");
    assert_eq!(after[0].range.as_deref(), Some(resumed_at.as_str()));
    assert!(
        after[1].path.starts_with("/storage/") && after[1].status == 206,
        "{after:?}"
    );
    assert_eq!(after[1].range.as_deref(), Some(resumed_at.as_str()));
}

#[test]
fn the_token_goes_to_the_hub_only_and_small_files_follow_relative_redirects() {
    let fx = Fixture::new();
    let hub = Hub::new(HubConfig {
        token: Some("hf_mine".into()),
        token_source: Some(TokenSource::Environment),
        ..fx.config()
    })
    .unwrap();
    let summary = download(&hub, REPO, &mut Vec::new()).unwrap();
    assert_snapshot_matches(&summary.snapshot_dir, &fx.model_dir);
    let requests = fx.hub.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.path.starts_with("/api/resolve-cache/") && r.status == 200),
        "small files came through the hub's resolve cache"
    );
    let mut storage = 0;
    for request in &requests {
        if request.path.starts_with("/storage/") {
            storage += 1;
            assert_eq!(request.token, None, "the token went to storage");
        } else {
            assert_eq!(request.token.as_deref(), Some("hf_mine"), "{request:?}");
        }
    }
    assert!(storage >= 3, "{storage} storage requests");
}

#[test]
fn a_refused_token_is_named_with_where_it_came_from() {
    let fx = Fixture::new();
    fx.hub.refuse_token("hf_revoked");
    for source in [TokenSource::Environment, TokenSource::TokenFile] {
        let hub = Hub::new(HubConfig {
            token: Some("hf_revoked".into()),
            token_source: Some(source),
            ..fx.config()
        })
        .unwrap();
        // A public repo: the token is the only thing wrong.
        let err = download(&hub, REPO, &mut Vec::new()).unwrap_err();
        assert_eq!(err.kind(), "token_refused", "{err}");
        let message = err.to_string();
        assert!(
            message.contains("refused your Hugging Face token"),
            "{message}"
        );
        assert!(message.contains(source.describe()), "{message}");
        assert!(
            message.contains("public models download without"),
            "{message}"
        );
    }
}

#[test]
fn the_cli_pull_completes_against_a_busy_hub_whose_main_moves() {
    let fx = Fixture::new();
    let first = fx.hub.commit_of(REPO).unwrap();
    let pushed = fx.pushed_model();
    fx.hub.answer_busy("", 1, 503, Some("1"));
    fx.hub.answer_busy("/resolve/", 1, 429, Some("1"));
    let second = fx.hub.move_main_after(REPO, 3, &pushed).unwrap();

    let pull = ondo(&fx, &["pull", REPO]);
    let stderr = String::from_utf8_lossy(&pull.stderr);
    assert!(pull.status.success(), "{stderr}");
    assert!(
        stderr.contains("hub busy (503), retrying in 1 s, attempt 2 of 6"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hub busy (429) on config.json, retrying in 1 s, attempt 2 of 6"),
        "{stderr}"
    );
    assert_eq!(fx.hub.commit_of(REPO), Some(second.commit));
    assert_eq!(fx.ref_main(), Some(first.clone()));
    let snapshot = fx
        .cache_dir()
        .join("models--ondo-test--tiny/snapshots")
        .join(&first);
    assert_snapshot_matches(&snapshot, &fx.model_dir);
}

#[test]
fn the_cli_pull_gets_a_gated_repos_files_only_with_a_token_and_explains_an_unknown_repo() {
    let fx = Fixture::new();
    fx.hub.set_gated(REPO, Some("hf_right"));
    let record = |output: &std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&output.stdout).unwrap()
    };

    let anonymous = ondo(&fx, &["pull", REPO, "--json"]);
    assert!(!anonymous.status.success());
    assert_eq!(record(&anonymous)["error"]["kind"], "unauthorized");

    let mut command = Command::new(env!("CARGO_BIN_EXE_ondo"));
    command.args(["pull", REPO, "--json"]);
    fx.env(&mut command);
    let with_token = command.env("HF_TOKEN", "hf_right").output().unwrap();
    assert!(
        with_token.status.success(),
        "{}",
        String::from_utf8_lossy(&with_token.stderr)
    );
    let snapshot = PathBuf::from(record(&with_token)["snapshot_dir"].as_str().unwrap());
    assert_snapshot_matches(&snapshot, &fx.model_dir);

    // An unknown repo asked anonymously: 401 from the hub, explained.
    let unknown = ondo(&fx, &["pull", "ondo-test/nothing-here", "--json"]);
    assert!(!unknown.status.success());
    let error = &record(&unknown)["error"];
    assert_eq!(error["kind"], "repo_not_found");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("private") && message.contains("token"),
        "{message}"
    );
}

const UNSUPPORTED_REPO: &str = "ondo-test/mamba";

/// The tiny model's files with a config.json whose `model_type` the engine
/// does not run, served as [`UNSUPPORTED_REPO`]; returns its folder.
fn serve_an_unsupported_architecture(fx: &Fixture) -> PathBuf {
    let dir = fx.root.path().join("served/mamba");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&fx.model_dir).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let config_path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["model_type"] = "mamba".into();
    std::fs::write(&config_path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    fx.hub.add_repo(UNSUPPORTED_REPO, &dir).unwrap();
    dir
}

/// What the hub was asked for weights: any safetensors file (by Range too)
/// or any storage link, where LFS files are served from.
fn weight_requests(fx: &Fixture) -> Vec<String> {
    fx.hub
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with(".safetensors") || r.path.starts_with("/storage/"))
        .map(|r| format!("{} {} {:?}", r.method, r.path, r.range))
        .collect()
}

#[test]
fn an_architecture_the_engine_does_not_run_is_refused_before_any_weight_is_fetched() {
    let fx = Fixture::new();
    serve_an_unsupported_architecture(&fx);
    let runnable = ondo::family::model_types().join(", ");
    let reason = format!("not supported yet: model_type mamba (Ondo runs: {runnable})");

    // `ondo fit` reads config.json and stops there: not even the header of
    // a weight file is asked for by Range.
    let fit = ondo(&fx, &["fit", UNSUPPORTED_REPO]);
    let stderr = String::from_utf8_lossy(&fit.stderr);
    assert_eq!(fit.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: {UNSUPPORTED_REPO} is {reason}")),
        "{stderr}"
    );
    assert!(stderr.contains("hint: `ondo ls --catalog`"), "{stderr}");
    let fit = ondo(&fx, &["fit", UNSUPPORTED_REPO, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&fit.stdout).unwrap();
    assert_eq!(json["error"]["kind"], "unsupported_model_type");

    // `ondo pull`, with its verdict line and without (--json), refuses the same way.
    for args in [
        vec!["pull", UNSUPPORTED_REPO],
        vec!["pull", UNSUPPORTED_REPO, "--json"],
    ] {
        let pull = ondo(&fx, &args);
        let stderr = String::from_utf8_lossy(&pull.stderr);
        assert_eq!(pull.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(&reason), "{args:?}: {stderr}");
        assert!(!stderr.contains("% "), "a download started: {stderr}");
    }
    let pull = ondo(&fx, &["pull", UNSUPPORTED_REPO, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&pull.stdout).unwrap();
    assert_eq!(json["error"]["kind"], "unsupported_model_type");
    assert_eq!(
        json["error"]["message"],
        format!("{UNSUPPORTED_REPO} is {reason}; choose a model of one of those types")
    );

    // The library call the app's Download button makes refuses too.
    let mut events = Vec::new();
    let error = download(&fx.client(), UNSUPPORTED_REPO, &mut events).unwrap_err();
    assert!(
        matches!(&error, HubError::UnsupportedModelType { unsupported, .. }
            if unsupported.model_type.as_deref() == Some("mamba")),
        "{error}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, DownloadEvent::Planned { .. })),
        "{events:?}"
    );

    // The hub's log: config.json was read, no weights at all, and nothing
    // of the repo was written to the cache.
    assert!(
        fx.hub
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/config.json")),
        "config.json was never read"
    );
    assert_eq!(weight_requests(&fx), Vec::<String>::new());
    assert!(!fx.cache_dir().join("models--ondo-test--mamba").exists());

    // The same repo's fit is refused from its folder too.
    let served = fx.root.path().join("served/mamba");
    let fit = ondo(&fx, &["fit", served.to_str().unwrap()]);
    assert_eq!(fit.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&fit.stderr).contains(&reason));
}

#[test]
fn search_says_which_results_the_engine_does_not_run() {
    let fx = Fixture::new();
    serve_an_unsupported_architecture(&fx);
    let hits = block_on(fx.client().search("ondo-test", 10)).unwrap();
    let hit = |id: &str| hits.iter().find(|h| h.id == id).unwrap();
    assert_eq!(hit(REPO).model_type.as_deref(), Some("llama"));
    assert_eq!(hit(REPO).unsupported, None);
    assert_eq!(hit(UNSUPPORTED_REPO).model_type.as_deref(), Some("mamba"));
    let reason = hit(UNSUPPORTED_REPO).unsupported.clone().unwrap();
    assert!(
        reason.starts_with("not supported yet: model_type mamba (Ondo runs: "),
        "{reason}"
    );

    let search = ondo(&fx, &["search", "ondo-test"]);
    let text = String::from_utf8_lossy(&search.stdout);
    let line = |id: &str| text.lines().find(|l| l.starts_with(id)).unwrap().to_owned();
    assert!(line(UNSUPPORTED_REPO).contains(&reason), "{text}");
    assert!(!line(REPO).contains("not supported"), "{text}");
    // Search asked for nothing but the list.
    assert_eq!(weight_requests(&fx), Vec::<String>::new());
}

#[test]
fn the_library_lists_a_folder_the_engine_does_not_run_with_the_reason() {
    let fx = Fixture::new();
    let folder = serve_an_unsupported_architecture(&fx);
    library::add_folder(&fx.dirs(), &folder).unwrap();
    let listed: serde_json::Value =
        serde_json::from_slice(&ondo(&fx, &["ls", "--json"]).stdout).unwrap();
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["source"] == "folder")
        .unwrap();
    assert_eq!(entry["model_type"], "mamba");
    assert_eq!(entry["complete"], true);
    let reason = entry["unsupported"].as_str().unwrap();
    assert!(
        reason.starts_with("not supported yet: model_type mamba (Ondo runs: llama"),
        "{reason}"
    );

    let table = String::from_utf8(ondo(&fx, &["ls"]).stdout).unwrap();
    assert!(table.contains("(folder) [not supported yet]"), "{table}");
    assert!(table.contains(&format!(": {reason}")), "{table}");

    // A folder of a type the engine runs has no such note.
    library::add_folder(&fx.dirs(), &fx.model_dir).unwrap();
    let models = library::scan(&fx.dirs());
    let tiny = models
        .iter()
        .find(|m| m.path == std::fs::canonicalize(&fx.model_dir).unwrap())
        .unwrap();
    assert_eq!(tiny.model_type.as_deref(), Some("llama"));
    assert_eq!(tiny.unsupported, None);
}
