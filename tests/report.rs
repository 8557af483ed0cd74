//! The report writers against a fixed benchmark: two cold and six warm runs
//! of the tiny model at two `prefill_step_size` values, one warm-up run, and
//! one run with a 20-sample memory timeline that passes through a pressure
//! warning. Each format is compared with its expected file under
//! `tests/fixtures/report/`; behaviour is asserted besides.
//!
//! After an intended change to a writer, rewrite the expected files with
//!
//!     ONDO_BLESS=1 cargo test -p ondo --test report
//!
//! and read the diff before committing it. `expected.html` is also what the
//! UI's browser test opens to check the charts render and to take
//! `docs/screenshots/report.png` (ui/scripts/report-screenshot.mjs).

use std::path::PathBuf;

use ondo::report::{self, Report, ReportFormat};
use ondo::run_kinds::{LoadKind, LoopShape, RunKind, StopReason};
use ondo::store::record::EndpointDialect;
use ondo::store::{MemorySample, Provenance, RECORD_SCHEMA_VERSION, RunRecord};

const GENERATED_AT: &str = "2025-01-01T12:00:00Z";
const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// The fields every run of the fixture shares.
fn base() -> RunRecord {
    RunRecord {
        run_id: String::new(),
        created_at: String::new(),
        kind: RunKind::Bench,
        bench_id: Some("b-1735725600000".into()),
        test: Some("pp128+tg64".into()),
        repetition: Some(0),
        warmup: false,
        conversation_id: None,
        user_agent: None,
        model_id: "tiny".into(),
        model_path: "/home/ada/.local/share/ondo/models/tiny".into(),
        model_revision: None,
        model_type: "llama".into(),
        quantization: "float32".into(),
        parameters: Some(1_310_720),
        weights_bytes: 5_242_880,
        download_ms: 0.0,
        load_ms: 0.0,
        ttft_ms: 0.0,
        prefill_ms: 0.0,
        decode_ms: 0.0,
        reasoning_ms: 0.0,
        cold_start_ms: None,
        prefill_tps: 0.0,
        decode_tps: 0.0,
        prompt_tps: 0.0,
        generation_tps: 0.0,
        prompt_tokens: 128,
        cached_tokens: 0,
        prefill_tokens: 128,
        generated_tokens: 64,
        reasoning_tokens: 0,
        mlx_peak_bytes: 0,
        mlx_active_bytes: 6_291_456,
        mlx_cache_bytes: 2_097_152,
        kv_cache_bytes: 1_572_864,
        footprint_bytes: 188 * MIB,
        pressure_start: "normal".into(),
        pressure_max: "normal".into(),
        pressure_end: "normal".into(),
        swap_delta_bytes: 0,
        decode_bytes_per_token: Some(6_815_744),
        memory_bandwidth_gbps: Some(21.5),
        decode_roofline_pct: None,
        load_kind: LoadKind::Warm,
        fresh_process: false,
        prefix_source: ondo::run_kinds::PrefixSource::None,
        prefix_read_bytes: None,
        prefix_read_ms: None,
        loop_shape: LoopShape::Pipelined,
        prefill_step_size: 256,
        max_kv_size: None,
        kv_bits: None,
        images: 0,
        image_tokens: None,
        image_encode_ms: None,
        max_tokens: 64,
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.0,
        repetition_penalty: None,
        seed: None,
        stop_reason: StopReason::MaxTokens,
        error: None,
        server_name: None,
        endpoint_url: None,
        endpoint_dialect: None,
        server_prompt_tokens: None,
        server_load_ms: None,
        server_prefill_ms: None,
        server_decode_ms: None,
        server_prefill_tps: None,
        server_decode_tps: None,
        batch_min_rows: None,
        batch_median_rows: None,
        batch_max_rows: None,
        admission_wait_ms: None,
        waited_for: None,
        prefill_chunks: None,
        interleaved_chunks: None,
        constraint: None,
        mask_ms_per_token: None,
        concurrency: None,
        aggregate_tps: None,
        split: None,
        split_ranks: None,
        split_backend: None,
        split_hosts: None,
        split_step_bytes: None,
        split_step_link_ms: None,
        split_prefill_bytes: None,
        split_prefill_link_ms: None,
        split_rank_step_ms: None,
        split_rank_prefill_tps: None,
        provenance: Provenance {
            app_version: "0.1.0".into(),
            app_commit: "abdad0c5e1f2".into(),
            build_profile: "release".into(),
            mlx_version: "0.32.2".into(),
            mlx_rs_version: "0.33.0".into(),
            backend: "cpu".into(),
            os: "Debian GNU/Linux 13 (Linux 6.12)".into(),
            cpu: "Intel Xeon Platinum 8488C, 2 cores".into(),
            ram_bytes: 16 * GIB,
        },
    }
}

/// One run: the n-th (1-based) of the benchmark, with its measurements.
fn run(
    n: u64,
    step: u64,
    repetition: u32,
    ttft_ms: f64,
    prefill_tps: f64,
    decode_tps: f64,
    peak_mib: u64,
) -> RunRecord {
    let base = base();
    let prefill_ms = 128.0 / prefill_tps * 1000.0;
    let decode_ms = 63.0 / decode_tps * 1000.0;
    RunRecord {
        run_id: format!("r-{}-{n:04}", 1_735_725_600_000 + n * 1000),
        created_at: format!("2025-01-01T10:00:{:02}.000Z", n * 3),
        repetition: Some(repetition),
        prefill_step_size: step,
        ttft_ms,
        prefill_ms,
        decode_ms,
        prefill_tps,
        decode_tps,
        prompt_tps: 128.0 / ttft_ms * 1000.0,
        generation_tps: 64.0 / (decode_ms / 1000.0),
        mlx_peak_bytes: peak_mib * MIB + n * 4096,
        decode_roofline_pct: Some(decode_tps * 6_815_744.0 / 21.5e9 * 100.0),
        ..base
    }
}

/// A fresh-process cold start: load and process start paid.
fn cold(mut record: RunRecord, load_ms: f64, cold_start_ms: f64) -> RunRecord {
    record.kind = RunKind::BenchCold;
    record.load_kind = LoadKind::Cold;
    record.fresh_process = true;
    record.load_ms = load_ms;
    record.cold_start_ms = Some(cold_start_ms);
    record
}

fn fixture_runs() -> Vec<RunRecord> {
    let mut warmup = run(2, 256, 0, 121.5, 1090.0, 402.75, 21);
    warmup.warmup = true;
    let mut pressured = run(8, 512, 1, 84.5, 1540.0, 421.0, 26);
    pressured.pressure_max = "warning".into();
    pressured.swap_delta_bytes = 8 * MIB as i64;
    vec![
        cold(run(1, 256, 0, 96.25, 1365.5, 441.25, 23), 48.5, 412.75),
        warmup,
        run(3, 256, 0, 90.5, 1432.5, 451.0, 21),
        run(4, 256, 1, 92.25, 1401.25, 447.5, 21),
        run(5, 256, 2, 88.75, 1459.0, 458.25, 21),
        cold(run(6, 512, 0, 82.5, 1590.0, 446.0, 27), 47.0, 398.0),
        run(7, 512, 0, 77.0, 1702.5, 452.5, 26),
        pressured,
        run(9, 512, 2, 76.25, 1718.0, 455.5, 26),
    ]
}

/// 20 samples, 20 ms apart; the machine is under pressure from 160 to 280 ms.
fn fixture_timeline() -> Vec<MemorySample> {
    (0..20u64)
        .map(|i| {
            let warning = (8..14).contains(&i);
            let rise = if i < 8 {
                i
            } else if warning {
                8 + (i - 8) / 2
            } else {
                20 - i
            };
            MemorySample {
                t_ms: i as f64 * 20.0,
                level: if warning { "warning" } else { "normal" }.into(),
                used_bytes: 14 * GIB
                    + 512 * MIB
                    + rise * 96 * MIB
                    + if warning { 640 * MIB } else { 0 },
                app_bytes: 9 * GIB + rise * 64 * MIB,
                wired_bytes: 2 * GIB,
                compressed_bytes: if warning {
                    900 * MIB + (i - 8) * 40 * MIB
                } else {
                    300 * MIB
                },
                swap_used_bytes: if i >= 10 { 8 * MIB } else { 0 },
                footprint_bytes: 150 * MIB + i.min(12) * 3 * MIB,
            }
        })
        .collect()
}

fn write(
    runs: &[RunRecord],
    timelines: &[(String, Vec<MemorySample>)],
    format: ReportFormat,
) -> String {
    let report = Report {
        runs,
        timelines,
        title: "tiny: prefill_step_size 256 vs 512".into(),
        generated_at: GENERATED_AT.into(),
    };
    let mut out = Vec::new();
    report::write(&report, format, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn fixture(format: ReportFormat) -> String {
    let runs = fixture_runs();
    let timelines = vec![(runs[7].run_id.clone(), fixture_timeline())];
    write(&runs, &timelines, format)
}

/// Compares with the expected file, or rewrites it under ONDO_BLESS=1.
fn check_expected(format: ReportFormat) {
    let actual = fixture(format);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/report")
        .join(format!("expected.{}", format.extension()));
    if std::env::var("ONDO_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with ONDO_BLESS=1 to write it", path.display()));
    if expected != actual {
        let line = expected
            .split('\n')
            .zip(actual.split('\n'))
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.split('\n').count().min(actual.split('\n').count()));
        panic!(
            "{} differs from the writer's output from line {}:\n  expected: {:?}\n  actual:   {:?}\n\
             If the change is intended, run ONDO_BLESS=1 cargo test -p ondo --test report and review the diff.",
            path.display(),
            line + 1,
            expected.split('\n').nth(line).unwrap_or(""),
            actual.split('\n').nth(line).unwrap_or(""),
        );
    }
}

#[test]
fn json_matches_expected() {
    check_expected(ReportFormat::Json);
}

#[test]
fn jsonl_matches_expected() {
    check_expected(ReportFormat::Jsonl);
}

#[test]
fn csv_matches_expected() {
    check_expected(ReportFormat::Csv);
}

#[test]
fn markdown_matches_expected() {
    check_expected(ReportFormat::Markdown);
}

#[test]
fn html_matches_expected() {
    check_expected(ReportFormat::Html);
}

/// RFC 4180 records: quoted fields may hold commas, quotes and line breaks.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    assert!(
        field.is_empty() && row.is_empty(),
        "the last record ends with CRLF"
    );
    rows
}

#[test]
fn csv_parses_back_to_one_row_per_run_and_a_column_per_field() {
    let mut runs = fixture_runs();
    runs[3].error = Some("stopped: \"out of memory\", then\r\nretried".into());
    let text = write(&runs, &[], ReportFormat::Csv);
    assert!(text.ends_with("\r\n"));
    let rows = parse_csv(&text);
    assert_eq!(rows.len(), 1 + runs.len(), "a header and one row per run");
    let header = &rows[0];
    let fields = serde_json::to_value(RunRecord::default())
        .unwrap()
        .as_object()
        .unwrap()
        .len();
    assert!(
        rows.iter().all(|r| r.len() == fields),
        "{fields} columns in every row"
    );
    assert_eq!(header[0], "run_id");
    let column = |name: &str| header.iter().position(|h| h == name).unwrap();
    assert!(header.contains(&"loop".to_owned()) && !header.contains(&"loop_shape".to_owned()));
    assert_eq!(
        rows[4][column("error")],
        "stopped: \"out of memory\", then\r\nretried"
    );
    assert_eq!(rows[1][column("cold_start_ms")], "412.75");
    assert_eq!(
        rows[3][column("cold_start_ms")],
        "",
        "None is an empty cell"
    );
    // Floats round-trip.
    let decode_ms: f64 = rows[1][column("decode_ms")].parse().unwrap();
    assert_eq!(decode_ms, runs[0].decode_ms);
}

fn assert_json_close(a: &serde_json::Value, b: &serde_json::Value, at: &str) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            assert_eq!(
                a.keys().collect::<Vec<_>>(),
                b.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (key, value) in a {
                assert_json_close(value, &b[key], &format!("{at}.{key}"));
            }
        }
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-12 * y.abs().max(1.0),
                "{at}: {x} != {y}"
            );
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

#[test]
fn jsonl_is_one_record_per_line() {
    let text = fixture(ReportFormat::Jsonl);
    let expected = fixture_runs();
    assert_eq!(text.lines().count(), expected.len());
    for (line, run) in text.lines().zip(&expected) {
        // serde_json's default parser may be one ulp off (its float_roundtrip
        // feature is off); the digits written are the shortest exact ones.
        let parsed: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_json_close(&parsed, &serde_json::to_value(run).unwrap(), &run.run_id);
        let _: RunRecord = serde_json::from_str(line).unwrap();
    }
    assert!(
        text.lines()
            .next()
            .unwrap()
            .starts_with("{\"run_id\":\"r-1735725601000-0001\",\"created_at\"")
    );
}

#[test]
fn json_has_the_schema_and_right_statistics() {
    let value: serde_json::Value = serde_json::from_str(&fixture(ReportFormat::Json)).unwrap();
    assert_eq!(value["schema"], "ondo.report");
    assert_eq!(value["schema_version"], RECORD_SCHEMA_VERSION);
    assert_eq!(value["generated_at"], GENERATED_AT);
    assert_eq!(value["runs"].as_array().unwrap().len(), 9);
    assert_eq!(
        value["timelines"]["r-1735725608000-0008"]
            .as_array()
            .unwrap()
            .len(),
        20
    );

    // Cold 256, warm 256, cold 512, warm 512; the warm-up is in no group.
    let summary = value["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 4);
    let warm_256 = &summary[1];
    assert_eq!(warm_256["group"]["load_kind"], "warm");
    assert_eq!(warm_256["group"]["prefill_step_size"], 256);
    assert_eq!(
        warm_256["run_ids"],
        serde_json::json!([
            "r-1735725603000-0003",
            "r-1735725604000-0004",
            "r-1735725605000-0005"
        ])
    );
    // decode_tps 451.0, 447.5, 458.25: median 451, mean 452.25,
    // sample variance (1.25² + 4.75² + 6²) / 2 = 30.0625.
    let decode = &warm_256["metrics"]["decode_tps"];
    assert_eq!(decode["median"], 451.0);
    assert_eq!(decode["mean"], 452.25);
    assert!((decode["stddev"].as_f64().unwrap() - 30.0625f64.sqrt()).abs() < 1e-9);
    assert_eq!(
        (decode["min"].as_f64(), decode["max"].as_f64()),
        (Some(447.5), Some(458.25))
    );
    assert_eq!(decode["n"], 3);
    assert_eq!(decode["samples"], serde_json::json!([451.0, 447.5, 458.25]));
    // ttft 77, 84.5, 76.25 at step 512: median 77.
    assert_eq!(summary[3]["metrics"]["ttft_ms"]["median"], 77.0);
    // Bytes stay integers; one sample has no spread; cold start only where measured.
    let cold_256 = &summary[0]["metrics"];
    assert_eq!(
        cold_256["mlx_peak_bytes"]["samples"],
        serde_json::json!([23 * MIB + 4096])
    );
    assert!(cold_256["ttft_ms"]["stddev"].is_null());
    assert_eq!(cold_256["cold_start_ms"]["median"], 412.75);
    assert!(warm_256["metrics"].get("cold_start_ms").is_none());
}

#[test]
fn markdown_shows_what_varies_and_lists_what_does_not() {
    let text = fixture(ReportFormat::Markdown);
    let header = text.lines().find(|l| l.starts_with("| model")).unwrap();
    let columns: Vec<&str> = header.trim_matches('|').split('|').map(str::trim).collect();
    for shown in [
        "model",
        "test",
        "load",
        "prefill step",
        "prefill tok/s",
        "decode tok/s",
        "TTFT ms",
        "peak MiB",
    ] {
        assert!(columns.contains(&shown), "{shown} in {columns:?}");
    }
    for constant in ["backend", "loop", "MLX", "build"] {
        assert!(
            !columns.contains(&constant),
            "{constant} is the same everywhere: {columns:?}"
        );
    }
    assert!(
        text.contains("backend cpu"),
        "constants listed once above the table"
    );
    assert!(
        text.contains("MLX 0.32.2")
            && text.contains("loop pipelined")
            && text.contains("build release")
    );
    assert!(
        text.contains("452.25 ± 5.48"),
        "warm 256 decode as mean ± sd"
    );
    assert!(text.contains(
        "Memory pressure rose above normal during 1 run: r-1735725608000-0008 (warning)"
    ));
    assert!(!text.contains("debug build"));

    let mut runs = fixture_runs();
    runs[0].provenance.build_profile = "debug".into();
    let text = write(&runs, &[], ReportFormat::Markdown);
    assert!(
        text.contains("> **Warning:** 1 of 9 runs ran in a debug build"),
        "{text}"
    );
}

#[test]
fn html_is_self_contained_has_charts_and_escapes_the_data() {
    let text = fixture(ReportFormat::Html);
    assert!(!text.to_lowercase().contains("<script"));
    assert!(text.contains(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">"
    ));
    // Nothing to fetch: no src or href attributes, no stylesheet links, no imports.
    for fetch in ["src=", "href=", "<link", "@import", "url("] {
        assert!(!text.contains(fetch), "{fetch}");
    }
    assert!(
        text.matches("<svg").count() >= 3,
        "speed, start, memory timeline"
    );
    assert_eq!(
        text.matches("<svg").count(),
        text.matches("role=\"img\"").count()
    );
    assert!(text.contains("class=\"band\""), "pressure bands");
    assert!(
        text.contains("fill=\"#ffcc00\""),
        "the warning band in Activity Monitor's yellow"
    );

    let mut runs = fixture_runs();
    runs[0].model_id = "<b>x</b>".into();
    runs[2].error = Some("<script>alert(1)</script>".into());
    let report = Report {
        runs: &runs,
        timelines: &[],
        title: "<i>title</i> & more".into(),
        generated_at: GENERATED_AT.into(),
    };
    let mut out = Vec::new();
    report::write(&report, ReportFormat::Html, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains("<b>x</b>") && text.contains("&lt;b&gt;x&lt;/b&gt;"));
    assert!(!text.contains("<script") && text.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(text.contains("<title>&lt;i&gt;title&lt;/i&gt; &amp; more</title>"));
    assert!(text.contains("No run in this report has a memory timeline."));
}

/// A request to another program's server, as `ondo bench --endpoint`
/// records it: timed at the client, the server's own numbers beside.
fn endpoint_run(n: u64, ttft_ms: f64, decode_tps: f64) -> RunRecord {
    let mut record = run(n, 256, 0, ttft_ms, f64::NAN, decode_tps, 0);
    record.kind = RunKind::Endpoint;
    record.mlx_peak_bytes = 0;
    record.prefill_ms = f64::NAN;
    record.provenance.mlx_version = String::new();
    record.provenance.mlx_rs_version = String::new();
    record.provenance.backend = String::new();
    record.server_name = Some("mlx_lm.server".into());
    record.endpoint_url = Some("http://127.0.0.1:8080/v1/completions".into());
    record.endpoint_dialect = Some(EndpointDialect::OpenAi);
    record.server_prompt_tokens = Some(128);
    record
}

#[test]
fn a_servers_runs_are_a_group_of_their_own_named_by_the_server() {
    let mut runs = fixture_runs();
    runs.extend([
        endpoint_run(10, 84.5, 390.0),
        endpoint_run(11, 86.0, 380.5),
        endpoint_run(12, 85.25, 395.25),
    ]);
    let text = write(&runs, &[], ReportFormat::Markdown);
    let header = text.lines().find(|l| l.starts_with("| model")).unwrap();
    let columns: Vec<&str> = header.trim_matches('|').split('|').map(str::trim).collect();
    for shown in ["kind", "server", "endpoint", "dialect"] {
        assert!(columns.contains(&shown), "{shown} in {columns:?}");
    }
    let row = text
        .lines()
        .find(|l| l.contains("mlx_lm.server"))
        .unwrap_or_else(|| panic!("{text}"));
    let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
    let cell = |name: &str| cells[columns.iter().position(|c| *c == name).unwrap()];
    assert_eq!(cell("kind"), "endpoint");
    assert_eq!(cell("endpoint"), "http://127.0.0.1:8080/v1/completions");
    assert_eq!(cell("n"), "3");
    assert_eq!(cell("decode tok/s"), "388.58 ± 7.48");
    assert_eq!(cell("prefill tok/s"), "–", "not seen from the client");
    assert_eq!(cell("peak MiB"), "–", "the server's memory is its own");

    // Without endpoint runs, a report says nothing of servers.
    let plain = fixture(ReportFormat::Markdown);
    assert!(
        !plain.contains("server") && !plain.contains("dialect"),
        "{plain}"
    );
}
