//! CSV (RFC 4180): a header of the record's field names in struct order,
//! then one row per run; `None` is an empty cell; floats round-trip.

use std::io::Write;

use super::Report;
use super::fields;

/// Quotes a cell when it holds a comma, a quote or a line break.
fn quote(cell: &str) -> String {
    if cell.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", cell.replace('"', "\"\""))
    } else {
        cell.to_owned()
    }
}

fn write_line(out: &mut dyn Write, cells: impl Iterator<Item = String>) -> std::io::Result<()> {
    let line: Vec<String> = cells.map(|c| quote(&c)).collect();
    out.write_all(line.join(",").as_bytes())?;
    out.write_all(b"\r\n")
}

pub(crate) fn write_csv(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let names = fields::field_names()?;
    write_line(out, names.iter().map(|n| (*n).to_owned()))?;
    for run in report.runs {
        let row = fields::flatten(run)?;
        write_line(out, row.iter().map(|(_, cell)| cell.plain()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_what_needs_it() {
        assert_eq!(quote("plain"), "plain");
        assert_eq!(quote("a,b"), "\"a,b\"");
        assert_eq!(quote("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(quote("two\nlines"), "\"two\nlines\"");
        assert_eq!(quote(""), "");
    }
}
