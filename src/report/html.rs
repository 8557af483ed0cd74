//! One self-contained HTML page: speed per run, cold against warm start,
//! memory timelines over pressure bands, the summary table and where the
//! numbers come from. No script, no network, no external style or font (a
//! strict Content-Security-Policy says so); every value from the data is
//! escaped.

use std::fmt::Write as _;
use std::io::Write;

use super::fields::{self, Cell};
use super::human::{self, html};
use super::summary::{Analysis, GROUP_FIELDS};
use super::svg::{self, Bar, Segment, Series, StackedRow, TimelinePoint, colour};
use super::table::{self, SummaryTable};
use super::{REPORT_SCHEMA, Report};
use crate::run_kinds::LoadKind;
use crate::store::{MemorySample, RECORD_SCHEMA_VERSION, RunRecord};
use crate::units::{human_bytes, mib};

const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:";

const STYLE: &str = r#"
:root { color-scheme: light; }
body { margin: 0; background: #fff; color: #212529;
  font: 14px/1.45 -apple-system, BlinkMacSystemFont, "Segoe UI", system-ui, sans-serif; }
header, main { max-width: 1180px; margin: 0 auto; padding: 0 24px; }
main { padding-bottom: 32px; }
h1 { font-size: 24px; margin: 24px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; padding-bottom: 4px; border-bottom: 1px solid #dee2e6; }
.meta { color: #495057; margin: 0 0 12px; }
.warning { background: #fff3bf; border-left: 4px solid #f08c00; padding: 8px 12px; margin: 8px 0; }
.note, figcaption { color: #495057; font-size: 13px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px 24px; }
figure { margin: 0 0 12px; }
figcaption { max-width: 760px; }
svg.chart { display: block; max-width: 100%; height: auto; }
svg text { fill: #212529; font-family: inherit; }
svg .tick { font-size: 11px; fill: #495057; }
svg .axis-title, svg .row-label, svg .panel-title { font-size: 12px; }
svg .panel-title { font-weight: 600; }
svg .value { font-size: 10px; fill: #343a40; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 18px; list-style: none; padding: 0; margin: 4px 0 10px; font-size: 13px; }
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 6px; vertical-align: -1px; border-radius: 2px; }
.swatch.faded { opacity: 0.4; }
.swatch.line { height: 3px; vertical-align: 3px; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; margin: 8px 0; }
caption { text-align: left; color: #495057; padding-bottom: 4px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #dee2e6; text-align: left; white-space: nowrap; }
th { background: #f1f3f5; font-weight: 600; }
.num { text-align: right; }
ul.constants { padding-left: 20px; margin: 6px 0; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 18px; }
dt { font-weight: 600; color: #495057; }
dd { margin: 0; overflow-wrap: anywhere; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
details summary { cursor: pointer; }
"#;

pub(crate) fn write_html(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let mut page = String::new();
    let title = html(&report.title);
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"color-scheme\" content=\"light\">\n<title>{title}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<header>\n<h1>{title}</h1>\n"
    );
    if report.runs.is_empty() {
        let _ = write!(
            page,
            "<p class=\"meta\">There are no runs in this report (generated {}).</p>\n</header>\n</body>\n</html>\n",
            html(&report.generated_at)
        );
        return out.write_all(page.as_bytes());
    }
    let analysis = Analysis::new(report.runs)?;
    let summary = SummaryTable::new(report.runs, &analysis);
    let runs = RunLabels::new(report.runs, &analysis);

    let _ = writeln!(
        page,
        "<p class=\"meta\">{} runs in {} groups · generated {}</p>\n</header>\n<main>",
        report.runs.len(),
        analysis.groups.len(),
        html(&report.generated_at)
    );
    for warning in &summary.warnings {
        let _ = writeln!(
            page,
            "<p class=\"warning\" role=\"note\"><strong>Warning:</strong> {}</p>",
            html(warning)
        );
    }
    speed_section(&mut page, report.runs, &runs);
    concurrency_section(&mut page, report.runs);
    start_section(&mut page, report.runs, &runs);
    memory_section(&mut page, report, &runs);
    summary_section(&mut page, &summary);
    runs_section(&mut page, report.runs, &analysis, &runs);
    provenance_section(&mut page, report);
    page.push_str("</main>\n</body>\n</html>\n");
    out.write_all(page.as_bytes())
}

/// How each run is named in charts: "#3", and what sets it apart.
struct RunLabels {
    /// "warm · prefill step 256 · warm-up", per run.
    traits: Vec<String>,
    /// The group fields that differ between runs, as (field, label).
    varying: Vec<&'static str>,
}

impl RunLabels {
    fn new(runs: &[RunRecord], analysis: &Analysis) -> Self {
        let keys: Vec<Vec<(&'static str, Cell)>> = analysis
            .rows
            .iter()
            .map(|row| {
                GROUP_FIELDS
                    .iter()
                    .map(|&name| (name, fields::get(row, name).clone()))
                    .collect()
            })
            .collect();
        let varying = table::varying_fields(&keys);
        let traits = runs
            .iter()
            .zip(&keys)
            .map(|(run, key)| {
                let mut parts: Vec<String> = varying
                    .iter()
                    .map(|name| match *name {
                        "load_kind" => table::display(name, fields::get(key, name)),
                        _ => format!(
                            "{} {}",
                            table::label(name).0,
                            table::display(name, fields::get(key, name))
                        ),
                    })
                    .collect();
                if run.warmup {
                    parts.push("warm-up".into());
                }
                if run.error.is_some() {
                    parts.push("failed".into());
                }
                parts.join(" · ")
            })
            .collect();
        Self { traits, varying }
    }

    fn describe(&self, index: usize, run: &RunRecord) -> String {
        let traits = &self.traits[index];
        if traits.is_empty() {
            format!("#{} {}", index + 1, run.run_id)
        } else {
            format!("#{} {} ({traits})", index + 1, run.run_id)
        }
    }
}

fn run_fill(run: &RunRecord) -> &'static str {
    if run.error.is_some() {
        colour::FAILED
    } else if run.load_kind == LoadKind::Cold {
        colour::COLD
    } else {
        colour::WARM
    }
}

fn legend(page: &mut String, items: &[(&str, &str, &str)]) {
    page.push_str("<ul class=\"legend\">");
    for (fill, class, text) in items {
        let _ = write!(
            page,
            "<li><span class=\"swatch {class}\" style=\"background:{fill}\"></span>{}</li>",
            html(text)
        );
    }
    page.push_str("</ul>\n");
}

fn figure(page: &mut String, svg: &str, caption: &str) {
    let _ = writeln!(
        page,
        "<figure>\n{svg}<figcaption>{}</figcaption>\n</figure>",
        html(caption)
    );
}

fn speed_section(page: &mut String, runs: &[RunRecord], labels: &RunLabels) {
    page.push_str("<section aria-labelledby=\"speed\">\n<h2 id=\"speed\">Prefill and decode speed per run</h2>\n");
    let mut items = Vec::new();
    if runs
        .iter()
        .any(|r| r.load_kind == LoadKind::Cold && r.error.is_none())
    {
        items.push((colour::COLD, "", "cold (model loaded for the run)"));
    }
    if runs
        .iter()
        .any(|r| r.load_kind != LoadKind::Cold && r.error.is_none())
    {
        items.push((colour::WARM, "", "warm (model already resident)"));
    }
    if runs.iter().any(|r| r.warmup) {
        items.push((
            colour::WARM,
            "faded",
            "warm-up (pale; not in the statistics)",
        ));
    }
    if runs.iter().any(|r| r.error.is_some()) {
        items.push((colour::FAILED, "", "failed"));
    }
    legend(page, &items);
    page.push_str("<div class=\"charts\">\n");
    type Metric = fn(&RunRecord) -> f64;
    let charts: [(&str, &str, Metric); 2] = [
        ("Prefill", "prefill tok/s", |r| r.prefill_tps),
        ("Decode", "decode tok/s", |r| r.decode_tps),
    ];
    for (name, unit, value) in charts {
        let bars: Vec<Bar> = runs
            .iter()
            .enumerate()
            .map(|(i, run)| Bar {
                tick: (i + 1).to_string(),
                value: value(run),
                fill: run_fill(run),
                faded: run.warmup,
                tooltip: format!(
                    "{}: {} {unit}",
                    labels.describe(i, run),
                    human::fixed2(value(run))
                ),
            })
            .collect();
        let finite: Vec<f64> = runs.iter().map(value).filter(|v| v.is_finite()).collect();
        let low = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let high = finite.iter().copied().fold(0.0, f64::max);
        let description = if finite.is_empty() {
            format!("{name} speed of {} runs: no values.", runs.len())
        } else {
            format!(
                "{name} speed of {} runs in run order, from {} to {} {unit}.",
                runs.len(),
                human::fixed2(low),
                human::fixed2(high)
            )
        };
        let chart = svg::bar_chart(
            &format!("{name} speed per run ({unit})"),
            &description,
            unit,
            "run, in order",
            &bars,
        );
        figure(
            page,
            &chart,
            &format!(
                "{name} tokens per second of each run, numbered in run order (hover a bar for its run)."
            ),
        );
    }
    page.push_str("</div>\n</section>\n");
}

/// Each side's median aggregate rate at each stream count of a
/// concurrency benchmark (`ondo bench --concurrency`): one round per
/// (side, test, repetition), its aggregate read from any of its streams.
/// Pairs of (side, streams) with their rounds' aggregates, sides in the
/// order they first appear and stream counts rising.
pub(crate) fn concurrency_points(runs: &[RunRecord]) -> Vec<(String, u64, Vec<f64>)> {
    let mut rounds: Vec<(String, u64, String, Option<u32>, f64)> = Vec::new();
    for run in runs.iter().filter(|r| !r.warmup && r.error.is_none()) {
        let (Some(streams), Some(aggregate)) = (run.concurrency, run.aggregate_tps) else {
            continue;
        };
        let side = run.server_name.clone().unwrap_or_else(|| "ondo".to_owned());
        let test = format!(
            "{}/{}",
            run.bench_id.as_deref().unwrap_or(""),
            run.test.as_deref().unwrap_or("")
        );
        if !rounds.iter().any(|(s, n, t, rep, _)| {
            *s == side && *n == streams && *t == test && *rep == run.repetition
        }) {
            rounds.push((side, streams, test, run.repetition, aggregate));
        }
    }
    let mut sides: Vec<String> = Vec::new();
    for (side, ..) in &rounds {
        if !sides.contains(side) {
            sides.push(side.clone());
        }
    }
    let mut points = Vec::new();
    for side in sides {
        let mut counts: Vec<u64> = rounds
            .iter()
            .filter(|(s, ..)| *s == side)
            .map(|(_, n, ..)| *n)
            .collect();
        counts.sort_unstable();
        counts.dedup();
        for n in counts {
            let values = rounds
                .iter()
                .filter(|(s, c, ..)| *s == side && *c == n)
                .map(|(.., v)| *v)
                .collect();
            points.push((side.clone(), n, values));
        }
    }
    points
}

/// The middle value (the mean of the two middle ones for an even count).
fn median_of(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn concurrency_section(page: &mut String, runs: &[RunRecord]) {
    let points = concurrency_points(runs);
    if points.is_empty() {
        return;
    }
    page.push_str(
        "<section aria-labelledby=\"concurrency\">\n<h2 id=\"concurrency\">Streams at once: aggregate decode</h2>\n",
    );
    let fills = [colour::WARM, colour::COLD, colour::FAILED];
    let mut sides: Vec<&str> = Vec::new();
    let bars: Vec<Bar> = points
        .iter()
        .map(|(side, streams, values)| {
            if !sides.contains(&side.as_str()) {
                sides.push(side);
            }
            let index = sides.iter().position(|s| *s == side).unwrap_or(0);
            let median = median_of(values);
            Bar {
                tick: format!("{side} ×{streams}"),
                value: median,
                fill: fills[index % fills.len()],
                faded: false,
                tooltip: format!(
                    "{side}, {streams} streams at once: {} tok/s in all (median of {} rounds)",
                    human::fixed2(median),
                    values.len()
                ),
            }
        })
        .collect();
    let description = format!(
        "Median aggregate decode rate of {} sides at each number of streams sent at once.",
        sides.len()
    );
    let chart = svg::bar_chart(
        "Aggregate decode against streams at once (tok/s)",
        &description,
        "tok/s, all streams",
        "side × streams at once",
        &bars,
    );
    figure(
        page,
        &chart,
        "Every stream's tokens over the round's wall time, median over the measured rounds: \
         what several clients get in all when they share one engine or server.",
    );
    page.push_str("</section>\n");
}

fn start_section(page: &mut String, runs: &[RunRecord], labels: &RunLabels) {
    page.push_str(
        "<section aria-labelledby=\"start\">\n<h2 id=\"start\">Cold and warm start</h2>\n",
    );
    let mut order: Vec<usize> = (0..runs.len())
        .filter(|&i| runs[i].load_kind == LoadKind::Cold)
        .collect();
    order.extend((0..runs.len()).filter(|&i| runs[i].load_kind != LoadKind::Cold));
    let mut with_process = false;
    let rows: Vec<StackedRow> = order
        .iter()
        .map(|&i| {
            let run = &runs[i];
            let load = run.load_ms.max(0.0);
            let ttft = run.ttft_ms.max(0.0);
            let process = run
                .cold_start_ms
                .map(|c| c - load - ttft)
                .filter(|p| p.is_finite() && *p > 0.0);
            let who = labels.describe(i, run);
            let mut segments = Vec::new();
            let mut note = Vec::new();
            if let Some(p) = process {
                with_process = true;
                segments.push(Segment {
                    value: p,
                    fill: colour::PROCESS,
                    tooltip: format!(
                        "{who}: process start and library init {} ms",
                        human::fixed2(p)
                    ),
                });
                note.push(format!("start {}", human::fixed2(p)));
            }
            segments.push(Segment {
                value: load,
                fill: colour::LOAD,
                tooltip: format!("{who}: load {} ms", human::fixed2(load)),
            });
            segments.push(Segment {
                value: ttft,
                fill: colour::TTFT,
                tooltip: format!("{who}: time to first token {} ms", human::fixed2(ttft)),
            });
            // A warm run's zero load is said by its label; listing it is noise.
            if load > 0.0 || run.load_kind == LoadKind::Cold {
                note.push(format!("load {}", human::fixed2(load)));
            }
            note.push(format!("TTFT {} ms", human::fixed2(ttft)));
            let mut label = format!("#{} {}", i + 1, run.load_kind);
            if run.warmup {
                label.push_str(" (warm-up)");
            }
            StackedRow {
                label,
                segments,
                note: note.join(" · "),
            }
        })
        .collect();
    let mut items = Vec::new();
    if with_process {
        items.push((
            colour::PROCESS,
            "",
            "process start and library init (fresh-process runs)",
        ));
    }
    items.push((colour::LOAD, "", "load_ms: weights read and resident"));
    items.push((colour::TTFT, "", "ttft_ms: request to first token"));
    legend(page, &items);
    let cold = runs
        .iter()
        .filter(|r| r.load_kind == LoadKind::Cold)
        .count();
    let description = format!(
        "{cold} cold and {} other runs; each bar is load time then time to first token{}.",
        runs.len() - cold,
        if with_process {
            ", after process start for fresh-process runs"
        } else {
            ""
        }
    );
    let chart = svg::stacked_bars(
        "Time to first token, split into load and TTFT, cold runs first",
        &description,
        "milliseconds from the request (from process start for fresh-process runs)",
        &rows,
    );
    figure(
        page,
        &chart,
        "Where the wait before the first token goes: a cold run loads the weights first; a warm run only prefills.",
    );
    page.push_str("</section>\n");
}

fn memory_section(page: &mut String, report: &Report, labels: &RunLabels) {
    page.push_str(
        "<section aria-labelledby=\"memory\">\n<h2 id=\"memory\">Memory during the run</h2>\n",
    );
    let mut shown: Vec<&str> = Vec::new();
    for (run_id, _) in report.timelines {
        if shown.contains(&run_id.as_str()) {
            continue;
        }
        let samples: Vec<&MemorySample> = report
            .timelines
            .iter()
            .filter(|(id, _)| id == run_id)
            .flat_map(|(_, s)| s)
            .collect();
        if samples.len() < 2 {
            continue;
        }
        if shown.is_empty() {
            legend(
                page,
                &[
                    (
                        colour::USED,
                        "line",
                        "used_bytes: memory in use on the machine",
                    ),
                    (colour::FOOTPRINT, "line", "footprint_bytes: this process"),
                    (colour::NORMAL, "", "pressure normal"),
                    (colour::WARNING, "", "pressure warning"),
                    (colour::CRITICAL, "", "pressure critical"),
                ],
            );
        }
        shown.push(run_id);
        let who = match report.runs.iter().position(|r| &r.run_id == run_id) {
            Some(i) => labels.describe(i, &report.runs[i]),
            None => format!("run {run_id}"),
        };
        let points: Vec<TimelinePoint> = samples
            .iter()
            .map(|s| TimelinePoint {
                t_ms: s.t_ms,
                level: s.level.clone(),
                values: vec![s.used_bytes as f64, s.footprint_bytes as f64],
            })
            .collect();
        let mut levels: Vec<&str> = Vec::new();
        for s in &samples {
            if !levels.contains(&s.level.as_str()) {
                levels.push(&s.level);
            }
        }
        let description = format!(
            "{} samples over {} ms; pressure levels seen: {}.",
            samples.len(),
            human::short(samples.iter().map(|s| s.t_ms).fold(0.0, f64::max)),
            levels.join(", ")
        );
        let series = [
            Series {
                name: "memory used".into(),
                stroke: colour::USED,
            },
            Series {
                name: "process footprint".into(),
                stroke: colour::FOOTPRINT,
            },
        ];
        let chart = svg::timeline(
            &format!("Memory timeline of {who}"),
            &description,
            &series,
            &points,
        );
        figure(
            page,
            &chart,
            &format!(
                "{who}: memory in use on the machine and this process's footprint; the background shows the memory pressure level."
            ),
        );
    }
    if shown.is_empty() {
        page.push_str("<p class=\"note\">No run in this report has a memory timeline.</p>\n");
    }
    page.push_str("</section>\n");
}

fn summary_section(page: &mut String, summary: &SummaryTable) {
    page.push_str("<section aria-labelledby=\"summary\">\n<h2 id=\"summary\">Summary</h2>\n");
    if !summary.constants.is_empty() {
        page.push_str("<ul class=\"constants\">\n");
        for (topic, items) in &summary.constants {
            let items: Vec<String> = items.iter().map(|i| html(i)).collect();
            let _ = writeln!(
                page,
                "<li><strong>{}:</strong> {}</li>",
                topic.name(),
                items.join(" · ")
            );
        }
        page.push_str("</ul>\n");
    }
    if summary.rows.is_empty() {
        page.push_str("<p class=\"note\">No run is left for the statistics.</p>\n");
    } else {
        page.push_str("<div class=\"table-wrap\">\n<table>\n<caption>Groups of runs that differ only per repetition</caption>\n<thead><tr>");
        for column in &summary.columns {
            let class = if column.numeric { " class=\"num\"" } else { "" };
            let _ = write!(
                page,
                "<th scope=\"col\"{class}>{}</th>",
                html(&column.header)
            );
        }
        page.push_str("</tr></thead>\n<tbody>\n");
        for row in &summary.rows {
            page.push_str("<tr>");
            for (cell, column) in row.iter().zip(&summary.columns) {
                let class = if column.numeric { " class=\"num\"" } else { "" };
                let _ = write!(page, "<td{class}>{}</td>", html(cell));
            }
            page.push_str("</tr>\n");
        }
        page.push_str("</tbody>\n</table>\n</div>\n");
    }
    for note in &summary.notes {
        let _ = writeln!(page, "<p class=\"note\">{}</p>", html(note));
    }
    page.push_str("</section>\n");
}

fn runs_section(page: &mut String, runs: &[RunRecord], analysis: &Analysis, labels: &RunLabels) {
    page.push_str("<section aria-labelledby=\"runs\">\n<h2 id=\"runs\">Runs</h2>\n");
    let _ = writeln!(
        page,
        "<details>\n<summary>All {} runs, in order</summary>\n<div class=\"table-wrap\">\n<table>",
        runs.len()
    );
    let mut headers: Vec<(String, bool)> = vec![
        ("#".into(), true),
        ("run id".into(), false),
        ("created at".into(), false),
    ];
    headers.extend(
        labels
            .varying
            .iter()
            .map(|n| (table::label(n).0.to_owned(), false)),
    );
    for (h, numeric) in [
        ("warm-up", false),
        ("load ms", true),
        ("TTFT ms", true),
        ("prefill tok/s", true),
        ("decode tok/s", true),
        ("peak MiB", true),
        ("pressure max", false),
        ("outcome", false),
    ] {
        headers.push((h.into(), numeric));
    }
    page.push_str("<thead><tr>");
    for (h, numeric) in &headers {
        let class = if *numeric { " class=\"num\"" } else { "" };
        let _ = write!(page, "<th scope=\"col\"{class}>{}</th>", html(h));
    }
    page.push_str("</tr></thead>\n<tbody>\n");
    for (i, (run, row)) in runs.iter().zip(&analysis.rows).enumerate() {
        let mut cells: Vec<String> = vec![
            (i + 1).to_string(),
            run.run_id.clone(),
            run.created_at.clone(),
        ];
        cells.extend(
            labels
                .varying
                .iter()
                .map(|n| table::display(n, fields::get(row, n))),
        );
        cells.push(if run.warmup {
            "yes".into()
        } else {
            String::new()
        });
        // A server's load, prefill alone and memory are not seen from the client.
        let endpoint = run.kind == crate::run_kinds::RunKind::Endpoint;
        let unseen = |text: String| if endpoint { "–".to_owned() } else { text };
        cells.push(unseen(human::fixed2(run.load_ms)));
        cells.push(human::fixed2(run.ttft_ms));
        cells.push(unseen(human::fixed2(run.prefill_tps)));
        cells.push(human::fixed2(run.decode_tps));
        cells.push(unseen(format!("{:.1}", mib(run.mlx_peak_bytes as f64))));
        cells.push(run.pressure_max.clone());
        cells.push(match &run.error {
            Some(error) => format!("error: {error}"),
            None => run.stop_reason.to_string(),
        });
        page.push_str("<tr>");
        for (cell, (_, numeric)) in cells.iter().zip(&headers) {
            let class = if *numeric { " class=\"num\"" } else { "" };
            let _ = write!(page, "<td{class}>{}</td>", html(cell));
        }
        page.push_str("</tr>\n");
    }
    page.push_str("</tbody>\n</table>\n</div>\n</details>\n</section>\n");
}

/// The distinct values of one field across runs, in first-seen order.
fn distinct(runs: &[RunRecord], value: impl Fn(&RunRecord) -> String) -> String {
    let mut seen: Vec<String> = Vec::new();
    for run in runs {
        let v = value(run);
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    seen.iter()
        .map(|v| if v.is_empty() { "–" } else { v.as_str() })
        .collect::<Vec<_>>()
        .join(", ")
}

fn provenance_section(page: &mut String, report: &Report) {
    let runs = report.runs;
    page.push_str(
        "<section aria-labelledby=\"provenance\">\n<h2 id=\"provenance\">Provenance</h2>\n<dl>\n",
    );
    let first = runs
        .iter()
        .map(|r| r.created_at.as_str())
        .min()
        .unwrap_or("");
    let last = runs
        .iter()
        .map(|r| r.created_at.as_str())
        .max()
        .unwrap_or("");
    let mut entries: Vec<(&str, String)> = vec![
        (
            "report",
            format!(
                "{REPORT_SCHEMA} schema {RECORD_SCHEMA_VERSION}, generated {}",
                report.generated_at
            ),
        ),
        (
            "runs",
            format!("{} runs, made from {first} to {last}", runs.len()),
        ),
        (
            "benchmarks",
            distinct(runs, |r| r.bench_id.clone().unwrap_or_default()),
        ),
        (
            "Ondo",
            distinct(runs, |r| {
                format!("{} ({})", r.provenance.app_version, r.provenance.app_commit)
            }),
        ),
        (
            "build profile",
            distinct(runs, |r| r.provenance.build_profile.clone()),
        ),
        ("MLX", distinct(runs, |r| r.provenance.mlx_version.clone())),
        (
            "mlx-rs",
            distinct(runs, |r| r.provenance.mlx_rs_version.clone()),
        ),
        ("backend", distinct(runs, |r| r.provenance.backend.clone())),
        ("OS", distinct(runs, |r| r.provenance.os.clone())),
        ("CPU", distinct(runs, |r| r.provenance.cpu.clone())),
        (
            "RAM",
            distinct(runs, |r| human_bytes(r.provenance.ram_bytes)),
        ),
    ];
    let models = distinct(runs, |r| {
        format!(
            "{} · revision {} · {} · {} · {} parameters · {} on disk · {}",
            r.model_id,
            r.model_revision.as_deref().unwrap_or("–"),
            r.model_type,
            r.quantization,
            r.parameters.map_or_else(|| "?".to_owned(), human::count),
            human_bytes(r.weights_bytes),
            r.model_path
        )
    });
    entries.insert(3, ("model", models));
    for (term, value) in entries {
        let _ = writeln!(page, "<dt>{}</dt><dd>{}</dd>", html(term), html(&value));
    }
    page.push_str("</dl>\n</section>\n");
}
