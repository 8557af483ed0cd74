//! The store against temporary database files.

use std::collections::BTreeSet;

use super::*;

fn open_temp() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("history/ondo.sqlite3")).unwrap();
    (dir, store)
}

/// Every field set, none to its default, every Option Some. Written out in
/// full (no `..Default::default()`) so that a new field must be filled here.
fn full_record() -> RunRecord {
    RunRecord {
        run_id: "r-1700000000000-0000abcd".into(),
        created_at: "2025-03-01T10:00:00.123Z".into(),
        kind: RunKind::Bench,
        bench_id: Some("b-1".into()),
        test: Some("pp128+tg128".into()),
        repetition: Some(2),
        warmup: true,
        conversation_id: Some("c-1".into()),
        user_agent: Some("OpenAI/Python 3.57.0".into()),
        model_id: "mlx-community/Llama-3.2-3B-Instruct-4bit".into(),
        model_path: "/models/llama".into(),
        model_revision: Some("0123abcd".into()),
        model_type: "llama".into(),
        quantization: "4bit".into(),
        parameters: Some(3_212_749_824),
        weights_bytes: 1_800_000_000,
        download_ms: 1.5,
        load_ms: 812.25,
        ttft_ms: 95.5,
        prefill_ms: 90.125,
        decode_ms: 2000.0,
        reasoning_ms: 1250.75,
        cold_start_ms: Some(1200.5),
        prefill_tps: 1420.0,
        decode_tps: 63.5,
        prompt_tps: 1340.0,
        generation_tps: 64.0,
        prompt_tokens: 128,
        cached_tokens: 32,
        prefill_tokens: 96,
        generated_tokens: 128,
        reasoning_tokens: 80,
        mlx_peak_bytes: 2_100_000_000,
        mlx_active_bytes: 1_900_000_000,
        mlx_cache_bytes: 150_000_000,
        kv_cache_bytes: 14_680_064,
        footprint_bytes: 2_300_000_000,
        pressure_start: "normal".into(),
        pressure_max: "warning".into(),
        pressure_end: "critical".into(),
        swap_delta_bytes: -4096,
        decode_bytes_per_token: Some(1_814_680_064),
        memory_bandwidth_gbps: Some(100.0),
        decode_roofline_pct: Some(115.25),
        load_kind: crate::run_kinds::LoadKind::Warm,
        fresh_process: true,
        prefix_source: crate::run_kinds::PrefixSource::Disk,
        prefix_read_bytes: Some(123_456),
        prefix_read_ms: Some(12.5),
        loop_shape: crate::run_kinds::LoopShape::Sync,
        prefill_step_size: 512,
        max_kv_size: Some(4096),
        kv_bits: Some(8),
        images: 1,
        image_tokens: Some(256),
        image_encode_ms: Some(41.5),
        max_tokens: 256,
        temperature: 0.7,
        top_p: 0.9,
        top_k: 40,
        min_p: 0.05,
        repetition_penalty: Some(1.1),
        // All 64 bits: SQLite's integers are signed.
        seed: Some(u64::MAX),
        stop_reason: crate::run_kinds::StopReason::Eos,
        error: Some("cancelled by user".into()),
        server_name: Some("ollama 0.12.3".into()),
        endpoint_url: Some("http://127.0.0.1:11434/api/generate".into()),
        endpoint_dialect: Some(record::EndpointDialect::Ollama),
        server_prompt_tokens: Some(129),
        server_load_ms: Some(2.5),
        server_prefill_ms: Some(80.25),
        server_decode_ms: Some(1990.5),
        server_prefill_tps: Some(1607.5),
        server_decode_tps: Some(64.25),
        batch_min_rows: Some(2),
        batch_median_rows: Some(5),
        batch_max_rows: Some(8),
        admission_wait_ms: Some(312.5),
        waited_for: Some("memory".into()),
        prefill_chunks: Some(3),
        interleaved_chunks: Some(2),
        constraint: Some("json_schema".into()),
        mask_ms_per_token: Some(0.12),
        concurrency: Some(8),
        aggregate_tps: Some(412.5),
        split: Some("tensor".into()),
        split_ranks: Some(2),
        split_backend: Some("ring".into()),
        split_hosts: Some("studio-1, studio-2".into()),
        split_step_bytes: Some(229_376),
        split_step_link_ms: Some(1.75),
        split_prefill_bytes: Some(58_720_256),
        split_prefill_link_ms: Some(41.5),
        split_rank_step_ms: Some("3.100, 3.050".into()),
        split_rank_prefill_tps: Some("1400, 1380".into()),
        provenance: Provenance {
            app_version: "0.1.0".into(),
            app_commit: "abdad0c".into(),
            build_profile: "release".into(),
            mlx_version: "0.29.0".into(),
            mlx_rs_version: "0.33.0".into(),
            backend: "metal".into(),
            os: "macOS 15.3".into(),
            cpu: "Apple M3 Pro".into(),
            ram_bytes: 36 * 1024 * 1024 * 1024,
        },
    }
}

/// A run with only what the queries look at.
fn run(run_id: &str, created_at: &str) -> RunRecord {
    RunRecord {
        run_id: run_id.into(),
        created_at: created_at.into(),
        kind: RunKind::Chat,
        model_id: "m-a".into(),
        ..RunRecord::default()
    }
}

fn timeline(len: usize) -> Vec<MemorySample> {
    (0..len)
        .map(|i| MemorySample {
            // Not monotonic: the order kept is the order given, not by time.
            t_ms: if i == 1 { 0.5 } else { i as f64 * 10.0 },
            level: ["normal", "warning", "critical"][i % 3].into(),
            used_bytes: 1_000 + i as u64,
            app_bytes: 2_000 + i as u64,
            wired_bytes: 3_000 + i as u64,
            compressed_bytes: 4_000 + i as u64,
            swap_used_bytes: u64::MAX - i as u64,
            footprint_bytes: 6_000 + i as u64,
        })
        .collect()
}

fn serde_keys(value: &serde_json::Value) -> BTreeSet<String> {
    value.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn every_serde_field_of_run_record_has_a_column() {
    let fields = serde_keys(&serde_json::to_value(RunRecord::default()).unwrap());
    let columns: BTreeSet<String> = RUN_COLUMNS.iter().map(|c| c.to_string()).collect();
    assert_eq!(fields, columns);
}

#[test]
fn the_full_record_sets_every_field() {
    let full = serde_json::to_value(full_record()).unwrap();
    let default = serde_json::to_value(RunRecord::default()).unwrap();
    for key in serde_keys(&full) {
        assert_ne!(
            full[&key], default[&key],
            "full_record() leaves {key} at its default"
        );
        assert!(!full[&key].is_null(), "full_record() leaves {key} None");
    }
}

#[test]
fn a_full_record_round_trips() {
    let (_dir, mut store) = open_temp();
    let record = full_record();
    store.insert_run(&record, &[]).unwrap();
    let read = store.run(&record.run_id).unwrap().unwrap();
    assert_eq!(read, record);
    // And field by field as the JSON record, which names the failing field.
    let read = serde_json::to_value(&read).unwrap();
    let written = serde_json::to_value(&record).unwrap();
    for key in serde_keys(&written) {
        assert_eq!(read[&key], written[&key], "{key}");
    }
    assert_eq!(
        store
            .runs(&RunQuery {
                include_warmup: true,
                ..RunQuery::default()
            })
            .unwrap(),
        vec![record]
    );
}

#[test]
fn a_record_with_every_option_none_round_trips() {
    let (_dir, mut store) = open_temp();
    let record = RunRecord {
        run_id: "r-none".into(),
        ..RunRecord::default()
    };
    store.insert_run(&record, &[]).unwrap();
    assert_eq!(store.run("r-none").unwrap(), Some(record));
    assert_eq!(store.run("r-missing").unwrap(), None);
}

#[test]
fn a_nan_rate_is_recorded_and_reads_back_as_nan() {
    let (_dir, mut store) = open_temp();
    let record = RunRecord {
        run_id: "r-nan".into(),
        decode_tps: f64::NAN,
        ..RunRecord::default()
    };
    store.insert_run(&record, &[]).unwrap();
    assert!(store.run("r-nan").unwrap().unwrap().decode_tps.is_nan());
}

#[test]
fn the_timeline_round_trips_in_order() {
    let (_dir, mut store) = open_temp();
    let samples = timeline(50);
    store
        .insert_run(&run("r-1", "2025-01-01T00:00:00.000Z"), &samples)
        .unwrap();
    store
        .insert_run(&run("r-2", "2025-01-01T00:00:01.000Z"), &timeline(3))
        .unwrap();
    assert_eq!(store.timeline("r-1").unwrap(), samples);
    assert_eq!(store.timeline("r-2").unwrap(), timeline(3));
    assert_eq!(store.timeline("r-missing").unwrap(), vec![]);
}

#[test]
fn a_failed_insert_leaves_neither_the_run_nor_part_of_its_timeline() {
    let (_dir, mut store) = open_temp();
    // Makes the 101st sample fail, after the run row and 100 samples.
    store
        .conn
        .execute_batch(
            "CREATE TEMP TRIGGER fail_midway BEFORE INSERT ON main.memory_samples
             WHEN NEW.seq = 100 BEGIN SELECT RAISE(ABORT, 'disk trouble'); END;",
        )
        .unwrap();
    let error = store
        .insert_run(&run("r-1", "2025-01-01T00:00:00.000Z"), &timeline(200))
        .unwrap_err();
    assert!(error.to_string().contains("disk trouble"), "{error}");
    assert_eq!(store.run("r-1").unwrap(), None);
    assert_eq!(store.timeline("r-1").unwrap(), vec![]);
    let samples: i64 = store
        .conn
        .query_row("SELECT count(*) FROM memory_samples", [], |row| row.get(0))
        .unwrap();
    assert_eq!(samples, 0);
}

#[test]
fn a_duplicate_run_id_is_refused_and_the_first_run_kept() {
    let (_dir, mut store) = open_temp();
    let first = run("r-1", "2025-01-01T00:00:00.000Z");
    store.insert_run(&first, &timeline(5)).unwrap();
    let error = store.insert_run(&first, &timeline(9)).unwrap_err();
    assert!(matches!(error, StoreError::DuplicateRun { ref run_id } if run_id == "r-1"));
    assert_eq!(store.timeline("r-1").unwrap(), timeline(5));
    assert_eq!(store.run_count().unwrap(), 1);
}

#[test]
fn queries_filter_and_list_oldest_first() {
    let (_dir, mut store) = open_temp();
    // Inserted out of time order; listed by created_at.
    let runs = [
        (
            "r-3",
            "2025-01-01T00:00:03.000Z",
            "m-a",
            Some("b-1"),
            "bench",
            None,
            false,
        ),
        (
            "r-1",
            "2025-01-01T00:00:01.000Z",
            "m-a",
            None,
            "chat",
            Some("c-1"),
            false,
        ),
        (
            "r-2",
            "2025-01-01T00:00:02.000Z",
            "m-b",
            Some("b-1"),
            "bench",
            None,
            true,
        ),
        (
            "r-5",
            "2025-01-01T00:00:05.000Z",
            "m-b",
            None,
            "chat",
            Some("c-1"),
            false,
        ),
        (
            "r-4",
            "2025-01-01T00:00:04.000Z",
            "m-a",
            Some("b-2"),
            "bench_cold",
            None,
            false,
        ),
    ];
    for (run_id, created_at, model_id, bench_id, kind, conversation_id, warmup) in runs {
        let record = RunRecord {
            model_id: model_id.into(),
            bench_id: bench_id.map(Into::into),
            kind: kind.parse().unwrap(),
            conversation_id: conversation_id.map(Into::into),
            warmup,
            ..run(run_id, created_at)
        };
        store.insert_run(&record, &[]).unwrap();
    }
    let ids = |query: RunQuery| -> Vec<String> {
        store
            .runs(&query)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect()
    };
    let some = |s: &str| Some(s.to_owned());

    // The warm-up r-2 is left out unless asked for.
    assert_eq!(ids(RunQuery::default()), ["r-1", "r-3", "r-4", "r-5"]);
    assert_eq!(
        ids(RunQuery {
            include_warmup: true,
            ..RunQuery::default()
        }),
        ["r-1", "r-2", "r-3", "r-4", "r-5"]
    );
    // The last N, still oldest first.
    assert_eq!(
        ids(RunQuery {
            last: Some(2),
            ..RunQuery::default()
        }),
        ["r-4", "r-5"]
    );
    assert_eq!(
        ids(RunQuery {
            last: Some(0),
            ..RunQuery::default()
        }),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(RunQuery {
            last: Some(99),
            ..RunQuery::default()
        })
        .len(),
        4
    );

    assert_eq!(
        ids(RunQuery {
            model_id: some("m-b"),
            ..RunQuery::default()
        }),
        ["r-5"]
    );
    assert_eq!(
        ids(RunQuery {
            bench_id: some("b-1"),
            include_warmup: true,
            ..RunQuery::default()
        }),
        ["r-2", "r-3"]
    );
    assert_eq!(
        ids(RunQuery {
            kind: Some(RunKind::BenchCold),
            ..RunQuery::default()
        }),
        ["r-4"]
    );
    assert_eq!(
        ids(RunQuery {
            conversation_id: some("c-1"),
            last: Some(1),
            ..RunQuery::default()
        }),
        ["r-5"]
    );
    // Filters combine.
    assert_eq!(
        ids(RunQuery {
            model_id: some("m-a"),
            kind: Some(RunKind::Chat),
            ..RunQuery::default()
        }),
        ["r-1"]
    );

    assert_eq!(store.latest_bench_id().unwrap(), some("b-2"));
    assert_eq!(store.run_count().unwrap(), 5);
}

#[test]
fn an_empty_history_answers_empty() {
    let (_dir, store) = open_temp();
    assert_eq!(store.runs(&RunQuery::default()).unwrap(), vec![]);
    assert_eq!(store.latest_bench_id().unwrap(), None);
    assert_eq!(store.run_count().unwrap(), 0);
    assert_eq!(store.pool_events(10).unwrap(), vec![]);
}

#[test]
fn foreign_keys_are_on_and_a_run_takes_its_timeline_along() {
    let (_dir, mut store) = open_temp();
    let enabled: bool = store
        .conn
        .pragma_query_value(None, "foreign_keys", |row| row.get(0))
        .unwrap();
    assert!(enabled);
    store
        .insert_run(&run("r-1", "2025-01-01T00:00:00.000Z"), &timeline(4))
        .unwrap();
    store
        .conn
        .execute("DELETE FROM runs WHERE run_id = 'r-1'", [])
        .unwrap();
    assert_eq!(store.timeline("r-1").unwrap(), vec![]);
    let orphan = store.conn.execute(
        "INSERT INTO memory_samples (run_id, seq, t_ms, level, used_bytes, app_bytes,
            wired_bytes, compressed_bytes, swap_used_bytes, footprint_bytes)
         VALUES ('r-nobody', 0, 0, 'normal', 0, 0, 0, 0, 0, 0)",
        [],
    );
    assert!(orphan.is_err());
}

#[test]
fn the_database_is_in_wal_mode_with_the_latest_schema() {
    let (_dir, store) = open_temp();
    let mode: String = store
        .conn
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let version: u32 = store
        .conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
}

#[test]
fn reopening_keeps_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let record = full_record();
    {
        let mut store = Store::open_default(dir.path()).unwrap();
        assert_eq!(store.path(), dir.path().join("ondo.sqlite3"));
        store.insert_run(&record, &timeline(3)).unwrap();
    }
    let store = Store::open_default(dir.path()).unwrap();
    assert_eq!(store.run(&record.run_id).unwrap(), Some(record.clone()));
    assert_eq!(store.timeline(&record.run_id).unwrap(), timeline(3));
}

#[test]
fn a_database_from_a_newer_ondo_is_refused_by_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ondo.sqlite3");
    drop(Store::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    let error = Store::open(&path).unwrap_err();
    assert!(matches!(error, StoreError::TooNew { .. }), "{error}");
}

#[test]
fn a_file_that_is_not_sqlite_is_named_and_can_be_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ondo.sqlite3");
    std::fs::write(&path, vec![b'x'; 8192]).unwrap();
    let error = Store::open(&path).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, StoreError::Corrupt { .. }), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("move it aside"), "{message}");
}

#[test]
fn a_folder_that_cannot_be_created_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let error = Store::open(&file.join("ondo.sqlite3")).unwrap_err();
    assert!(matches!(error, StoreError::CreateFolder { .. }), "{error}");
    assert!(error.to_string().contains("may write"), "{error}");
}

/// (id, model, title, created_at, updated_at) of every conversation, as
/// the table holds them.
fn conversation_rows(store: &Store) -> Vec<(String, String, String, String, String)> {
    let mut statement = store
        .conn
        .prepare(
            "SELECT conversation_id, model_id, title, created_at, updated_at
             FROM conversations ORDER BY conversation_id",
        )
        .unwrap();
    statement
        .query_map([], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn a_conversation_upserted_again_keeps_when_it_was_created() {
    let (_dir, mut store) = open_temp();
    assert_eq!(conversation_rows(&store), vec![]);
    store.upsert_conversation("c-1", "m-a", "First").unwrap();
    let created = conversation_rows(&store)[0].3.clone();
    std::thread::sleep(std::time::Duration::from_millis(5));
    store.upsert_conversation("c-2", "m-a", "Second").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    store
        .upsert_conversation("c-1", "m-b", "First, renamed")
        .unwrap();

    let rows = conversation_rows(&store);
    let ids: Vec<&str> = rows.iter().map(|row| row.0.as_str()).collect();
    assert_eq!(ids, ["c-1", "c-2"]);
    let (_, model_id, title, created_at, updated_at) = &rows[0];
    assert_eq!(
        (model_id.as_str(), title.as_str()),
        ("m-b", "First, renamed")
    );
    assert_eq!(created_at, &created);
    assert!(updated_at > created_at);
    assert!(updated_at > &rows[1].4, "c-1 was updated after c-2");
}

#[test]
fn an_api_run_filed_under_a_chat_lists_with_the_chats_and_keeps_its_client() {
    let (_dir, mut store) = open_temp();
    let asked = RunRecord {
        kind: RunKind::Api,
        user_agent: Some("Ondo app (chat)".into()),
        ..run("r-split", "2025-01-01T00:00:01.000Z")
    };
    store.insert_run(&asked, &[]).unwrap();
    let chats = |store: &Store| {
        let query = RunQuery {
            kind: Some(RunKind::Chat),
            ..RunQuery::default()
        };
        store
            .runs(&query)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(chats(&store), Vec::<String>::new());

    let filed = store
        .file_under_chat("r-split", "c-9", "Tell me about the sea.")
        .unwrap()
        .unwrap();
    assert_eq!(filed.kind, RunKind::Chat);
    assert_eq!(filed.conversation_id.as_deref(), Some("c-9"));
    assert_eq!(filed.user_agent.as_deref(), Some("Ondo app (chat)"));
    assert_eq!(chats(&store), ["r-split"]);
    let rows = conversation_rows(&store);
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_str(), rows[0].2.as_str()),
        ("c-9", "m-a", "Tell me about the sea.")
    );
    // A run that is not there is answered so, and nothing is created.
    assert_eq!(store.file_under_chat("r-gone", "c-10", "x").unwrap(), None);
    assert_eq!(conversation_rows(&store).len(), 1);
}

#[test]
fn pool_events_keep_the_newest_in_order() {
    let (_dir, mut store) = open_temp();
    let events: Vec<PoolEvent> = (0..5)
        .map(|i| PoolEvent {
            at: format!("2025-01-01T00:00:0{i}.000Z"),
            action: "evict".into(),
            model_id: format!("m-{i}"),
            reason: "memory budget".into(),
            bytes: (i % 2 == 0).then_some(i * 1_000_000_000),
        })
        .collect();
    for event in &events {
        store.insert_pool_event(event).unwrap();
    }
    assert_eq!(store.pool_events(3).unwrap(), events[2..]);
    assert_eq!(store.pool_events(100).unwrap(), events);
}

#[test]
fn old_pool_events_are_pruned_and_the_newest_kept() {
    let (_dir, mut store) = open_temp();
    let kept = Store::POOL_EVENTS_KEPT as usize;
    let total = kept + 250;
    for i in 0..total {
        store
            .insert_pool_event(&PoolEvent {
                at: format!("t{i}"),
                action: "hit".into(),
                model_id: "tiny".into(),
                reason: "warm".into(),
                bytes: None,
            })
            .unwrap();
    }
    let left = store.pool_events(usize::MAX).unwrap();
    assert!(
        (kept..kept + 100).contains(&left.len()),
        "{} events left of {total}",
        left.len()
    );
    assert_eq!(left.last().unwrap().at, format!("t{}", total - 1));
}

#[test]
fn settings_are_set_replaced_and_read() {
    let (_dir, mut store) = open_temp();
    assert_eq!(store.setting("memory_bandwidth_gbps").unwrap(), None);
    store.set_setting("memory_bandwidth_gbps", "98.5").unwrap();
    store.set_setting("memory_bandwidth_gbps", "101.2").unwrap();
    assert_eq!(
        store.setting("memory_bandwidth_gbps").unwrap().as_deref(),
        Some("101.2")
    );
}
