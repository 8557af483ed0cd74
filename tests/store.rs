//! The run history in real files under real processes: a writer killed
//! mid-write leaves a readable database holding every run it committed, each
//! with its whole timeline, and two writers at once both get through.
//!
//! The writers are this test binary run again (`writer_child`), so they use
//! the library exactly as `ondo bench` would.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ondo::run_kinds::RunKind;
use ondo::store::{MemorySample, RunRecord, Store};

/// Set in a child: the database to write to.
const WRITER_DB: &str = "ONDO_STORE_WRITER";
/// Set in a child: run ids start with this.
const WRITER_PREFIX: &str = "ONDO_STORE_WRITER_PREFIX";
/// Set in a child: stop after this many runs (else write until killed).
const WRITER_RUNS: &str = "ONDO_STORE_WRITER_RUNS";
/// Set in a child: the other writers' prefixes. The child opens the store,
/// says so with a file next to it, and starts writing only once every peer
/// has opened too, so the writes really overlap even where one process
/// could otherwise finish before the other starts.
const WRITER_PEERS: &str = "ONDO_STORE_WRITER_PEERS";

const SAMPLES_PER_RUN: usize = 200;
/// A child left behind by a failed parent stops by itself after this.
const WRITER_LIFETIME: Duration = Duration::from_secs(60);

fn timeline() -> Vec<MemorySample> {
    (0..SAMPLES_PER_RUN)
        .map(|i| MemorySample {
            t_ms: i as f64 * 5.0,
            level: "normal".into(),
            used_bytes: 1_000_000 + i as u64,
            app_bytes: 2_000_000 + i as u64,
            wired_bytes: 3_000_000,
            compressed_bytes: 4_000_000,
            swap_used_bytes: 0,
            footprint_bytes: 5_000_000 + i as u64,
        })
        .collect()
}

/// Not a test on its own but the writer process of the tests below, which
/// run it with `--ignored --exact writer_child`: ignored, it does not count
/// among the tests of a normal run. Inserts runs as fast as it can and prints
/// each run id once its transaction has committed.
#[test]
#[ignore = "the writer process of this file's tests, not a test on its own"]
fn writer_child() {
    let Some(db) = std::env::var_os(WRITER_DB) else {
        eprintln!("writer_child writes only when a test of this file runs it");
        return;
    };
    let prefix = std::env::var(WRITER_PREFIX).unwrap();
    let runs: Option<usize> = std::env::var(WRITER_RUNS).ok().map(|n| n.parse().unwrap());
    let mut store = Store::open(Path::new(&db)).unwrap();
    let opened = |prefix: &str| Path::new(&db).with_extension(format!("{prefix}.opened"));
    std::fs::write(opened(&prefix), b"").unwrap();
    if let Ok(peers) = std::env::var(WRITER_PEERS) {
        let started = Instant::now();
        while !peers.split(',').all(|peer| opened(peer).exists()) {
            assert!(
                started.elapsed() < WRITER_LIFETIME,
                "the peers never opened"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let samples = timeline();
    let started = Instant::now();
    let mut stdout = std::io::stdout().lock();
    for n in 0_u64.. {
        if runs.is_some_and(|runs| n >= runs as u64) || started.elapsed() > WRITER_LIFETIME {
            break;
        }
        let record = RunRecord {
            run_id: format!("{prefix}-{n:06}"),
            created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            kind: RunKind::Bench,
            model_id: "ondo-test/tiny".into(),
            generated_tokens: n,
            ..RunRecord::default()
        };
        store.insert_run(&record, &samples).unwrap();
        use std::io::Write;
        writeln!(stdout, "committed {}", record.run_id).unwrap();
        stdout.flush().unwrap();
    }
}

fn spawn_writer(db: &Path, prefix: &str, runs: Option<usize>, peers: &[&str]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--ignored",
            "--exact",
            "writer_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WRITER_DB, db)
        .env(WRITER_PREFIX, prefix)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(runs) = runs {
        command.env(WRITER_RUNS, runs.to_string());
    }
    if !peers.is_empty() {
        command.env(WRITER_PEERS, peers.join(","));
    }
    command.spawn().unwrap()
}

/// Reads the child's "committed <id>" lines, up to `wanted` of them or to
/// the end of its output. A line cut short by the kill does not count.
fn read_committed(stdout: &mut BufReader<ChildStdout>, wanted: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut line = String::new();
    while ids.len() < wanted {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 {
            break;
        }
        // The first line shares its start with the test harness's own
        // "test writer_child ... ", which it prints without a newline.
        if let Some(id) = line
            .split_once("committed ")
            .and_then(|(_, l)| l.strip_suffix('\n'))
        {
            ids.push(id.to_owned());
        }
    }
    ids
}

fn integrity_check(db: &Path) -> String {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap()
}

/// Every run in the database with how many samples it has.
fn runs_with_sample_counts(db: &Path) -> Vec<(String, i64)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut statement = conn
        .prepare(
            "SELECT run_id, (SELECT count(*) FROM memory_samples s WHERE s.run_id = r.run_id)
             FROM runs r",
        )
        .unwrap();
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn a_killed_writer_leaves_every_committed_run_whole() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ondo.sqlite3");
    let expected_timeline = timeline();
    let mut printed = BTreeSet::new();

    for round in 0..3 {
        let mut child = spawn_writer(&db, &format!("kill{round}"), None, &[]);
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let first = read_committed(&mut stdout, 1);
        let started = Instant::now();
        let mut seen = read_committed(&mut stdout, 19);
        let period = started.elapsed() / 19;
        seen.extend(first);
        assert_eq!(seen.len(), 20, "round {round}: the writer stopped early");
        // Each round kills at another point of a write: as soon as a commit
        // is seen, then a third and two thirds of a run's time after.
        std::thread::sleep(period * round as u32 / 3);
        // SIGKILL: no destructor, no rollback, no checkpoint.
        child.kill().unwrap();
        child.wait().unwrap();
        // Lines printed between the 20th and the kill are committed runs too.
        printed.extend(seen);
        printed.extend(read_committed(&mut stdout, usize::MAX));

        assert_eq!(integrity_check(&db), "ok", "round {round}");
        let store = Store::open(&db).unwrap();
        for run_id in &printed {
            assert!(
                store.run(run_id).unwrap().is_some(),
                "{run_id} was committed but is missing"
            );
            assert_eq!(
                store.timeline(run_id).unwrap(),
                expected_timeline,
                "{run_id}"
            );
        }
        let in_db = runs_with_sample_counts(&db);
        for (run_id, samples) in &in_db {
            assert_eq!(
                *samples, SAMPLES_PER_RUN as i64,
                "{run_id} has a partial timeline"
            );
        }
        // Each kill may land between a commit and its line: at most one
        // committed run per round that was never printed.
        let unprinted = in_db.iter().filter(|(id, _)| !printed.contains(id)).count();
        assert!(unprinted <= round + 1, "{unprinted} runs nobody committed");
    }
}

#[test]
fn two_writers_at_once_both_get_through() {
    let dir = tempfile::tempdir().unwrap();
    // Not created beforehand: both children also migrate a fresh file at once.
    let db = dir.path().join("history/ondo.sqlite3");
    let runs = 150;
    let writers = [
        spawn_writer(&db, "a", Some(runs), &["b"]),
        spawn_writer(&db, "b", Some(runs), &["a"]),
    ];
    for writer in writers {
        let output = writer.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "a writer failed: {:?}",
            output.status
        );
        let committed = String::from_utf8(output.stdout).unwrap();
        assert_eq!(committed.matches("committed ").count(), runs);
    }

    assert_eq!(integrity_check(&db), "ok");
    let in_db = runs_with_sample_counts(&db);
    assert_eq!(in_db.len(), 2 * runs);
    assert!(
        in_db
            .iter()
            .all(|(_, samples)| *samples == SAMPLES_PER_RUN as i64)
    );

    // They really overlapped: each wrote while the other was writing.
    let store = Store::open(&db).unwrap();
    let all = store.runs(&Default::default()).unwrap();
    let span = |prefix: &str| {
        let times: Vec<&String> = all
            .iter()
            .filter(|r| r.run_id.starts_with(prefix))
            .map(|r| &r.created_at)
            .collect();
        (times[0].clone(), times[times.len() - 1].clone())
    };
    let (a, b) = (span("a-"), span("b-"));
    assert!(
        a.0 < b.1 && b.0 < a.1,
        "the writers did not overlap: {a:?} {b:?}"
    );
}
