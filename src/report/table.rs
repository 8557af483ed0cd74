//! What Markdown and HTML both show: the table of groups with only the
//! columns that vary, the settings that do not (listed once), and the
//! warnings. Plain strings here; each printer escapes them its own way.

use super::fields::{self, Cell, Row};
use super::human;
use super::summary::{Analysis, GROUP_FIELDS, Group, MetricSummary};
use crate::store::RunRecord;

/// Columns that every summary table shows, whether they vary or not.
const ALWAYS_SHOWN: &[&str] = &["model_id", "test"];

/// Fields only endpoint runs have: a report without any says nothing of them.
const ENDPOINT_FIELDS: &[&str] = &["server_name", "endpoint_url", "endpoint_dialect"];

/// Where a constant group field is listed above the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Topic {
    Model,
    Settings,
    Build,
}

impl Topic {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Topic::Model => "model",
            Topic::Settings => "settings",
            Topic::Build => "build",
        }
    }
}

/// A split model's fields, said only of runs that had one.
const SPLIT_FIELDS: &[&str] = &["split", "split_ranks", "split_backend", "split_hosts"];

/// A group field's short label and topic.
pub(crate) fn label(name: &str) -> (&'static str, Topic) {
    match name {
        "kind" => ("kind", Topic::Settings),
        "test" => ("test", Topic::Settings),
        "model_id" => ("model", Topic::Model),
        "model_path" => ("path", Topic::Model),
        "model_revision" => ("revision", Topic::Model),
        "model_type" => ("type", Topic::Model),
        "quantization" => ("quant", Topic::Model),
        "parameters" => ("params", Topic::Model),
        "weights_bytes" => ("weights", Topic::Model),
        "load_kind" => ("load", Topic::Settings),
        "prefix_source" => ("prefix", Topic::Settings),
        "fresh_process" => ("process", Topic::Settings),
        "loop" => ("loop", Topic::Settings),
        "prefill_step_size" => ("prefill step", Topic::Settings),
        "max_kv_size" => ("max kv", Topic::Settings),
        "kv_bits" => ("kv bits", Topic::Settings),
        "images" => ("images", Topic::Settings),
        "max_tokens" => ("max tokens", Topic::Settings),
        "temperature" => ("temp", Topic::Settings),
        "top_p" => ("top p", Topic::Settings),
        "top_k" => ("top k", Topic::Settings),
        "min_p" => ("min p", Topic::Settings),
        "repetition_penalty" => ("rep penalty", Topic::Settings),
        "server_name" => ("server", Topic::Model),
        "endpoint_url" => ("endpoint", Topic::Model),
        "endpoint_dialect" => ("dialect", Topic::Model),
        "constraint" => ("held to", Topic::Settings),
        "concurrency" => ("streams", Topic::Settings),
        "split" => ("split", Topic::Settings),
        "split_ranks" => ("ranks", Topic::Settings),
        "split_backend" => ("link", Topic::Settings),
        "split_hosts" => ("hosts", Topic::Settings),
        "app_version" => ("ondo", Topic::Build),
        "app_commit" => ("commit", Topic::Build),
        "build_profile" => ("build", Topic::Build),
        "mlx_version" => ("MLX", Topic::Build),
        "mlx_rs_version" => ("mlx-rs", Topic::Build),
        "backend" => ("backend", Topic::Build),
        "os" => ("OS", Topic::Build),
        "cpu" => ("CPU", Topic::Build),
        "ram_bytes" => ("RAM", Topic::Build),
        _ => ("?", Topic::Settings),
    }
}

/// A group field's value as people read it.
pub(crate) fn display(name: &str, cell: &Cell) -> String {
    match (name, cell) {
        ("weights_bytes" | "ram_bytes", Cell::UInt(bytes)) => crate::units::human_bytes(*bytes),
        ("parameters", Cell::UInt(v)) => human::count(*v),
        ("fresh_process", Cell::Bool(true)) => "fresh".into(),
        ("fresh_process", Cell::Bool(false)) => "same".into(),
        ("max_kv_size", Cell::Null) => "unbounded".into(),
        ("kv_bits", Cell::Null) => "float".into(),
        ("repetition_penalty", Cell::Null) => "off".into(),
        ("constraint", Cell::Null) => "free text".into(),
        ("split", Cell::Null) => "one process".into(),
        ("split", Cell::Text(how)) if how == "pipeline" => "by layers".into(),
        ("split", Cell::Text(how)) if how == "tensor" => "by heads".into(),
        ("prefix_source", Cell::Text(source)) if source == "none" => "prefilled".into(),
        ("prefix_source", Cell::Text(source)) if source == "disk" => "from disk".into(),
        ("prefix_source", Cell::Text(source)) if source == "memory" => "from memory".into(),
        ("app_commit", Cell::Text(commit)) => commit.chars().take(12).collect(),
        (_, Cell::Null) => "–".into(),
        (_, Cell::Text(text)) if text.is_empty() => "–".into(),
        (_, c) => c.plain(),
    }
}

/// One constant as listed above the table ("backend cpu", "fresh process").
fn constant_item(name: &str, cell: &Cell) -> String {
    let (label, _) = label(name);
    let value = display(name, cell);
    match name {
        "fresh_process" => format!("{value} process"),
        "app_version" => format!("ondo {value}"),
        _ => format!("{label} {value}"),
    }
}

/// The group fields whose value is not the same everywhere.
pub(crate) fn varying_fields(keys: &[Vec<(&'static str, Cell)>]) -> Vec<&'static str> {
    GROUP_FIELDS
        .iter()
        .copied()
        .filter(|name| {
            let mut values = keys.iter().map(|key| fields::get(key, name));
            match values.next() {
                Some(first) => values.any(|v| v != first),
                None => false,
            }
        })
        .collect()
}

/// A right-aligned (numeric) or left-aligned column.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    pub header: String,
    pub numeric: bool,
}

/// The summary table, its constants and its warnings, as plain text.
#[derive(Debug, Clone)]
pub(crate) struct SummaryTable {
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<String>>,
    /// (topic, items) of the group fields that are the same in every group.
    pub constants: Vec<(Topic, Vec<String>)>,
    /// Things that make the numbers less trustworthy.
    pub warnings: Vec<String>,
    /// Things a reader should know (what was left out, what a column means).
    pub notes: Vec<String>,
}

/// "1234.56 ± 12.34"; no spread below two samples; "–" with none.
pub(crate) fn mean_sd(metric: Option<&MetricSummary>, scale: f64) -> String {
    match metric {
        Some(MetricSummary {
            mean: Some(mean),
            stddev,
            ..
        }) => match stddev {
            Some(sd) => format!(
                "{} ± {}",
                human::fixed2(mean / scale),
                human::fixed2(sd / scale)
            ),
            None => human::fixed2(mean / scale),
        },
        _ => "–".into(),
    }
}

fn peak_mib(group: &Group) -> String {
    group
        .metric("mlx_peak_bytes")
        .and_then(|m| m.max.as_ref())
        .and_then(Cell::as_f64)
        .map_or_else(
            || "–".into(),
            |bytes| format!("{:.1}", crate::units::mib(bytes)),
        )
}

impl SummaryTable {
    pub(crate) fn new(runs: &[RunRecord], analysis: &Analysis) -> Self {
        let groups = &analysis.groups;
        let keys: Vec<Vec<(&'static str, Cell)>> = groups.iter().map(|g| g.key.clone()).collect();
        let varying = varying_fields(&keys);
        let shown: Vec<&'static str> = GROUP_FIELDS
            .iter()
            .copied()
            .filter(|name| ALWAYS_SHOWN.contains(name) || varying.contains(name))
            .collect();
        // Model first, then test, like llama-bench; the rest in record order.
        let mut key_columns: Vec<&'static str> = ALWAYS_SHOWN.to_vec();
        key_columns.extend(shown.iter().filter(|n| !ALWAYS_SHOWN.contains(n)));

        let with_cold_start = groups.iter().any(|g| g.metric("cold_start_ms").is_some());
        let mut columns: Vec<Column> = key_columns
            .iter()
            .map(|name| Column {
                header: label(name).0.to_owned(),
                numeric: matches!(
                    name,
                    &("parameters"
                        | "weights_bytes"
                        | "prefill_step_size"
                        | "max_kv_size"
                        | "kv_bits"
                        | "images"
                        | "max_tokens")
                ),
            })
            .collect();
        let metric_headers: &[&str] = if with_cold_start {
            &[
                "n",
                "prefill tok/s",
                "decode tok/s",
                "TTFT ms",
                "cold start ms",
                "peak MiB",
            ]
        } else {
            &["n", "prefill tok/s", "decode tok/s", "TTFT ms", "peak MiB"]
        };
        columns.extend(metric_headers.iter().map(|h| Column {
            header: (*h).to_owned(),
            numeric: true,
        }));

        let rows = groups
            .iter()
            .map(|group| {
                let mut row: Vec<String> = key_columns
                    .iter()
                    .map(|name| display(name, group.key_value(name)))
                    .collect();
                row.push(group.counted().to_string());
                row.push(mean_sd(group.metric("prefill_tps"), 1.0));
                row.push(mean_sd(group.metric("decode_tps"), 1.0));
                row.push(mean_sd(group.metric("ttft_ms"), 1.0));
                if with_cold_start {
                    row.push(mean_sd(group.metric("cold_start_ms"), 1.0));
                }
                row.push(peak_mib(group));
                row
            })
            .collect();

        let mut constants: Vec<(Topic, Vec<String>)> = Vec::new();
        if let Some(first) = groups.first() {
            for topic in [Topic::Model, Topic::Settings, Topic::Build] {
                let items: Vec<String> = first
                    .key
                    .iter()
                    .filter(|(name, _)| !key_columns.contains(name) && label(name).1 == topic)
                    .filter(|(name, cell)| {
                        !((ENDPOINT_FIELDS.contains(name) || SPLIT_FIELDS.contains(name))
                            && *cell == Cell::Null)
                    })
                    .map(|(name, cell)| constant_item(name, cell))
                    .collect();
                if !items.is_empty() {
                    constants.push((topic, items));
                }
            }
        }

        let (warnings, notes) = warnings_and_notes(runs, &analysis.rows, groups);
        Self {
            columns,
            rows,
            constants,
            warnings,
            notes,
        }
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn warnings_and_notes(
    runs: &[RunRecord],
    rows: &[Row],
    groups: &[Group],
) -> (Vec<String>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut notes = Vec::new();

    let debug = runs
        .iter()
        .filter(|r| r.provenance.build_profile == "debug")
        .count();
    if debug > 0 {
        warnings.push(format!(
            "{debug} of {} ran in a debug build: timings are not representative; measure a release build.",
            plural(runs.len(), "run", "runs")
        ));
    }
    let pressured: Vec<String> = runs
        .iter()
        .filter(|r| matches!(r.pressure_max.as_str(), "warning" | "critical"))
        .map(|r| format!("{} ({})", r.run_id, r.pressure_max))
        .collect();
    if !pressured.is_empty() {
        warnings.push(format!(
            "Memory pressure rose above normal during {}: {}. Their timings may include swapping or compression; compare them with care.",
            plural(pressured.len(), "run", "runs"),
            pressured.join(", ")
        ));
    }
    let unmeasured = runs
        .iter()
        .filter(|r| !matches!(r.pressure_max.as_str(), "normal" | "warning" | "critical"))
        .count();
    if unmeasured > 0 {
        warnings.push(format!(
            "Memory pressure was not measured during {}.",
            plural(unmeasured, "run", "runs")
        ));
    }
    let failed: Vec<String> = runs
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| format!("{} ({e})", r.run_id)))
        .collect();
    if !failed.is_empty() {
        warnings.push(format!(
            "{} failed and {} left out of the statistics: {}.",
            plural(failed.len(), "run", "runs"),
            if failed.len() == 1 { "is" } else { "are" },
            failed.join(", ")
        ));
    }

    let warmups = runs.iter().filter(|r| r.warmup).count();
    if warmups > 0 {
        notes.push(format!(
            "{} left out of the statistics.",
            plural(warmups, "warm-up run", "warm-up runs")
        ));
    }
    if !groups.is_empty() {
        notes.push(
            "Speeds and TTFT are mean ± sample standard deviation over the group's runs; \
             peak MiB is the largest mlx_peak_bytes among them."
                .to_owned(),
        );
    }
    let fresh = rows
        .iter()
        .filter(|row| fields::get(row, "fresh_process") == &Cell::Bool(true))
        .count();
    if fresh > 0 {
        notes.push(format!(
            "{} started a fresh process: their cold start includes process start and library initialisation.",
            plural(fresh, "run", "runs")
        ));
    }
    (warnings, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(runs: &[RunRecord]) -> SummaryTable {
        SummaryTable::new(runs, &Analysis::new(runs).unwrap())
    }

    fn run(step: u64, backend: &str) -> RunRecord {
        RunRecord {
            model_id: "m".into(),
            prefill_step_size: step,
            pressure_max: "normal".into(),
            provenance: crate::store::Provenance {
                backend: backend.into(),
                build_profile: "release".into(),
                ..Default::default()
            },
            ..RunRecord::default()
        }
    }

    #[test]
    fn only_varying_fields_become_columns() {
        let t = table(&[run(256, "cpu"), run(512, "cpu")]);
        let headers: Vec<&str> = t.columns.iter().map(|c| c.header.as_str()).collect();
        assert_eq!(&headers[..3], &["model", "test", "prefill step"]);
        assert!(!headers.contains(&"backend"));
        let build = t
            .constants
            .iter()
            .find(|(topic, _)| *topic == Topic::Build)
            .unwrap();
        assert!(build.1.contains(&"backend cpu".to_owned()));
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    }

    #[test]
    fn warns_about_debug_builds_and_pressure() {
        let mut debug = run(256, "cpu");
        debug.provenance.build_profile = "debug".into();
        let mut pressured = run(256, "cpu");
        pressured.run_id = "r-2".into();
        pressured.pressure_max = "critical".into();
        let t = table(&[debug, pressured]);
        assert!(
            t.warnings[0].contains("1 of 2 runs ran in a debug build"),
            "{:?}",
            t.warnings
        );
        assert!(t.warnings[1].contains("r-2 (critical)"), "{:?}", t.warnings);
        assert_eq!(t.columns[2].header, "build", "debug and release differ");
    }

    #[test]
    fn spread_only_from_two_samples() {
        let one = MetricSummary::from_cells([Cell::Float(2.0)]);
        assert_eq!(mean_sd(Some(&one), 1.0), "2.00");
        let two = MetricSummary::from_cells([Cell::Float(1.0), Cell::Float(3.0)]);
        assert_eq!(mean_sd(Some(&two), 1.0), "2.00 ± 1.41");
        assert_eq!(mean_sd(None, 1.0), "–");
    }
}
