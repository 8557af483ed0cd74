//! Reports over the flat run record: one field list (`RunRecord`'s, in
//! struct order) and a printer per format. JSON, JSONL and CSV print every
//! field as stored; Markdown and HTML are for people and show only what
//! varies, with units made readable. `docs/REPORT_SCHEMA.md` describes the
//! JSON.

mod csv;
mod fields;
mod html;
mod human;
mod json;
mod markdown;
mod summary;
mod svg;
mod table;

use std::fmt;
use std::io::Write;
use std::str::FromStr;

use crate::store::{MemorySample, RunQuery, RunRecord, Store, now_rfc3339};

/// The JSON report's `schema` value.
pub const REPORT_SCHEMA: &str = "ondo.report";

/// An output format of `write`. Its serde name (what the app's format
/// picker sends) is the file extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "lowercase")]
pub enum ReportFormat {
    /// One object: the runs, their memory timelines and per-group statistics.
    Json,
    /// One run record per line, nothing else.
    Jsonl,
    /// A header of the record's field names, then one row per run.
    Csv,
    /// A llama-bench style table of groups, for people.
    #[serde(rename = "md")]
    Markdown,
    /// One self-contained page with charts, for people.
    Html,
}

impl ReportFormat {
    /// Every format, in the order `--help` lists them.
    pub const ALL: [ReportFormat; 5] = [
        ReportFormat::Json,
        ReportFormat::Jsonl,
        ReportFormat::Csv,
        ReportFormat::Markdown,
        ReportFormat::Html,
    ];

    /// The file extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            ReportFormat::Json => "json",
            ReportFormat::Jsonl => "jsonl",
            ReportFormat::Csv => "csv",
            ReportFormat::Markdown => "md",
            ReportFormat::Html => "html",
        }
    }
}

impl fmt::Display for ReportFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.extension())
    }
}

/// What can go wrong before a report is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("unknown report format {0:?}: use json, jsonl, csv, md (or markdown) or html")]
    UnknownFormat(String),
}

impl FromStr for ReportFormat {
    type Err = ReportError;

    /// Accepts the extensions and "markdown", in any case.
    fn from_str(s: &str) -> Result<Self, ReportError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "json" => Ok(ReportFormat::Json),
            "jsonl" => Ok(ReportFormat::Jsonl),
            "csv" => Ok(ReportFormat::Csv),
            "md" | "markdown" => Ok(ReportFormat::Markdown),
            "html" => Ok(ReportFormat::Html),
            _ => Err(ReportError::UnknownFormat(s.to_owned())),
        }
    }
}

/// The runs to report on and what to call the report.
#[derive(Debug, Clone)]
pub struct Report<'a> {
    /// In the order to print them (usually by `created_at`).
    pub runs: &'a [RunRecord],
    /// Memory timelines by run id; runs without one are simply absent.
    pub timelines: &'a [(String, Vec<MemorySample>)],
    pub title: String,
    /// RFC 3339; passed in so that the same runs give the same bytes.
    pub generated_at: String,
}

/// Writes `report` in `format`. Fails only when `out` does; an empty report
/// is a valid one that says "no runs".
pub fn write(report: &Report, format: ReportFormat, out: &mut dyn Write) -> std::io::Result<()> {
    match format {
        ReportFormat::Json => json::write_json(report, out),
        ReportFormat::Jsonl => json::write_jsonl(report, out),
        ReportFormat::Csv => csv::write_csv(report, out),
        ReportFormat::Markdown => markdown::write_markdown(report, out),
        ReportFormat::Html => html::write_html(report, out),
    }
}

/// The memory timelines of `runs` that have one, from the history.
pub fn timelines_of(store: &Store, runs: &[RunRecord]) -> Vec<(String, Vec<MemorySample>)> {
    runs.iter()
        .filter_map(|r| {
            let samples = store.timeline(&r.run_id).ok()?;
            (!samples.is_empty()).then(|| (r.run_id.clone(), samples))
        })
        .collect()
}

/// A title that says what `query` selected.
pub fn title_for(query: &RunQuery, count: usize) -> String {
    match (&query.bench_id, &query.model_id) {
        (Some(bench), _) => format!("Ondo benchmark {bench}"),
        (None, Some(model)) => format!("Ondo runs of {model}"),
        _ => format!("Ondo: the last {count} runs"),
    }
}

/// A report rendered in memory.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub bytes: Vec<u8>,
    pub runs: usize,
}

/// Renders `runs`, with their timelines from the history, in `format`.
pub fn render_runs(
    store: &Store,
    runs: &[RunRecord],
    title: String,
    format: ReportFormat,
) -> Rendered {
    let timelines = timelines_of(store, runs);
    let report = Report {
        runs,
        timelines: &timelines,
        title,
        generated_at: now_rfc3339(),
    };
    let mut bytes = Vec::new();
    write(&report, format, &mut bytes).expect("writing to memory cannot fail");
    Rendered {
        bytes,
        runs: runs.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_is_sent_by_its_extension() {
        for format in ReportFormat::ALL {
            let json = serde_json::to_value(format).unwrap();
            assert_eq!(json, format.extension(), "{format:?}");
            assert_eq!(
                serde_json::from_value::<ReportFormat>(json).unwrap(),
                format
            );
        }
    }

    #[test]
    fn formats_parse_and_name_their_extension() {
        for format in ReportFormat::ALL {
            assert_eq!(format.extension().parse::<ReportFormat>(), Ok(format));
        }
        assert_eq!("Markdown".parse(), Ok(ReportFormat::Markdown));
        assert_eq!(" HTML ".parse(), Ok(ReportFormat::Html));
        let error = "xlsx".parse::<ReportFormat>().unwrap_err();
        assert!(
            error.to_string().contains("use json, jsonl, csv, md"),
            "{error}"
        );
    }

    #[test]
    fn every_format_writes_an_empty_report() {
        let report = Report {
            runs: &[],
            timelines: &[],
            title: "Empty".into(),
            generated_at: "2025-01-01T00:00:00Z".into(),
        };
        for format in ReportFormat::ALL {
            let mut out = Vec::new();
            write(&report, format, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            match format {
                ReportFormat::Jsonl => assert!(text.is_empty()),
                ReportFormat::Csv => assert_eq!(text.lines().count(), 1, "the header only"),
                ReportFormat::Json => {
                    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
                    assert_eq!(value["runs"], serde_json::json!([]));
                    assert_eq!(value["summary"], serde_json::json!([]));
                }
                _ => assert!(text.contains("no runs"), "{format}: {text}"),
            }
        }
    }

    /// A caller may pass a timeline whose run is not among the runs (filtered
    /// out, or deleted since): the report is still written, the JSON keeps the
    /// timeline under its run id, the page draws it named by that id, and the
    /// formats that list runs list only the runs.
    #[test]
    fn a_timeline_without_its_run_still_writes() {
        let runs = [RunRecord {
            run_id: "r-kept".into(),
            model_id: "ondo-test/tiny".into(),
            ..RunRecord::default()
        }];
        let timelines = vec![(
            "r-lost".to_owned(),
            vec![
                MemorySample::default(),
                MemorySample {
                    t_ms: 5.0,
                    ..MemorySample::default()
                },
            ],
        )];
        let report = Report {
            runs: &runs,
            timelines: &timelines,
            title: "t".into(),
            generated_at: "2025-01-01T00:00:00Z".into(),
        };
        let written = |format| {
            let mut out = Vec::new();
            write(&report, format, &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };

        let json: serde_json::Value = serde_json::from_str(&written(ReportFormat::Json)).unwrap();
        assert_eq!(json["runs"].as_array().unwrap().len(), 1, "{json}");
        assert_eq!(json["runs"][0]["run_id"], "r-kept");
        let lost: Vec<f64> = json["timelines"]["r-lost"]
            .as_array()
            .unwrap()
            .iter()
            .map(|sample| sample["t_ms"].as_f64().unwrap())
            .collect();
        assert_eq!(lost, [0.0, 5.0], "{json}");

        let page = written(ReportFormat::Html);
        assert!(page.contains("run r-lost: memory in use"), "{page}");

        for format in [ReportFormat::Jsonl, ReportFormat::Csv] {
            let text = written(format);
            let rows = if format == ReportFormat::Csv { 2 } else { 1 };
            assert_eq!(text.lines().count(), rows, "{format}: {text}");
            assert!(text.contains("r-kept"), "{format}: {text}");
            assert!(!text.contains("r-lost"), "{format}: {text}");
        }
        let markdown = written(ReportFormat::Markdown);
        assert!(markdown.contains("1 runs in 1 groups"), "{markdown}");
        assert!(!markdown.contains("r-lost"), "{markdown}");
    }
}
