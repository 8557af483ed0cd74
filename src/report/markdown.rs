//! Markdown, llama-bench style: the groups as a table that shows only the
//! columns that vary, the constant settings listed once above it, and
//! warnings a reader must not miss. Every value from the data is escaped.

use std::io::Write;

use super::Report;
use super::human::markdown as md;
use super::summary::Analysis;
use super::table::SummaryTable;

pub(crate) fn write_markdown(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let mut text = format!("# {}\n\n", md(&report.title));
    if report.runs.is_empty() {
        text.push_str(&format!(
            "There are no runs in this report (generated {}).\n",
            md(&report.generated_at)
        ));
        return out.write_all(text.as_bytes());
    }
    let analysis = Analysis::new(report.runs)?;
    let table = SummaryTable::new(report.runs, &analysis);

    text.push_str(&format!(
        "{} runs in {} groups · generated {}\n\n",
        report.runs.len(),
        analysis.groups.len(),
        md(&report.generated_at)
    ));
    for warning in &table.warnings {
        text.push_str(&format!("> **Warning:** {}\n\n", md(warning)));
    }
    for (topic, items) in &table.constants {
        let items: Vec<String> = items.iter().map(|i| md(i)).collect();
        text.push_str(&format!("- **{}:** {}\n", topic.name(), items.join(" · ")));
    }
    if !table.constants.is_empty() {
        text.push('\n');
    }
    if table.rows.is_empty() {
        text.push_str("No run is left for the statistics.\n\n");
    } else {
        text.push_str(&render_table(&table));
        text.push('\n');
    }
    for note in &table.notes {
        text.push_str(&format!("{}\n\n", md(note)));
    }
    out.write_all(text.trim_end().as_bytes())?;
    out.write_all(b"\n")
}

/// A pipe table padded so that it also reads well as plain text.
fn render_table(table: &SummaryTable) -> String {
    let header: Vec<String> = table.columns.iter().map(|c| md(&c.header)).collect();
    let rows: Vec<Vec<String>> = table
        .rows
        .iter()
        .map(|row| row.iter().map(|cell| md(cell)).collect())
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].chars().count(), 3])
                .max()
                .unwrap_or(3)
        })
        .collect();
    let line = |cells: &[String]| -> String {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                let pad = " ".repeat(widths[i] - cell.chars().count());
                if table.columns[i].numeric {
                    format!("{pad}{cell}")
                } else {
                    format!("{cell}{pad}")
                }
            })
            .collect();
        format!("| {} |\n", padded.join(" | "))
    };
    let mut text = line(&header);
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if table.columns[i].numeric {
                format!("{}:", "-".repeat(w - 1))
            } else {
                "-".repeat(*w)
            }
        })
        .collect();
    text.push_str(&format!("| {} |\n", rule.join(" | ")));
    for row in &rows {
        text.push_str(&line(row));
    }
    text
}
