//! Markdown, llama-bench style: the groups as a table that shows only the
//! columns that vary, the constant settings listed once above it, and
//! warnings a reader must not miss. Every value from the data is escaped.

use std::io::Write;

use super::Report;
use super::summary::Analysis;
use super::table::SummaryTable;
use crate::text_table::{self, Align, Column, TableStyle, markdown_text as md};

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
    let columns: Vec<Column> = table
        .columns
        .iter()
        .map(|column| Column {
            header: &column.header,
            align: if column.numeric {
                Align::Right
            } else {
                Align::Left
            },
        })
        .collect();
    text_table::render(TableStyle::Markdown, &columns, &table.rows)
}
