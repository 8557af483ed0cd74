//! Tables as people read them: columns padded to their widest cell, as
//! plain text for a terminal or as a Markdown pipe table that reads as well
//! unrendered. `ondo ls`, `ondo search`, `ondo runs`, `ondo bench` and the
//! Markdown report all print through it, so their tables line up by one rule.

/// Which edge of its column a cell keeps to: text left, numbers right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A column's header and alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column<'a> {
    pub header: &'a str,
    pub align: Align,
}

impl<'a> Column<'a> {
    pub fn left(header: &'a str) -> Self {
        Self {
            header,
            align: Align::Left,
        }
    }

    pub fn right(header: &'a str) -> Self {
        Self {
            header,
            align: Align::Right,
        }
    }
}

/// How a table is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableStyle {
    /// Columns two spaces apart, no spaces at the end of a line.
    Plain,
    /// A pipe table under a delimiter row (a colon marks a right-aligned
    /// column), every cell escaped so that its text shows literally.
    Markdown,
}

/// Some Markdown renderers want three dashes in each delimiter cell.
const MARKDOWN_MIN_WIDTH: usize = 3;

/// The header and the rows as lines, each ending in a newline. A column is
/// as wide as its widest cell or header, counted in characters: the text
/// Ondo puts in a table (names, numbers, "—", "±") is one terminal column a
/// character. A row with fewer cells than columns ends in empty cells; a
/// cell past the last column is not shown.
pub fn render<R: AsRef<[String]>>(style: TableStyle, columns: &[Column<'_>], rows: &[R]) -> String {
    let escape = |text: &str| match style {
        TableStyle::Plain => text.to_owned(),
        TableStyle::Markdown => markdown_text(text),
    };
    let header: Vec<String> = columns.iter().map(|column| escape(column.header)).collect();
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let row = row.as_ref();
            (0..columns.len())
                .map(|i| row.get(i).map_or_else(String::new, |cell| escape(cell)))
                .collect()
        })
        .collect();
    let min_width = match style {
        TableStyle::Plain => 0,
        TableStyle::Markdown => MARKDOWN_MIN_WIDTH,
    };
    let widths: Vec<usize> = (0..columns.len())
        .map(|i| {
            body.iter()
                .map(|row| width(&row[i]))
                .chain([width(&header[i]), min_width])
                .max()
                .unwrap_or(min_width)
        })
        .collect();
    let line = |cells: &[String]| -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(columns)
            .zip(&widths)
            .map(|((cell, column), &width_of_column)| {
                let pad = " ".repeat(width_of_column - width(cell));
                match column.align {
                    Align::Left => format!("{cell}{pad}"),
                    Align::Right => format!("{pad}{cell}"),
                }
            })
            .collect();
        match style {
            TableStyle::Plain => format!("{}\n", padded.join("  ").trim_end()),
            TableStyle::Markdown => format!("| {} |\n", padded.join(" | ")),
        }
    };
    let mut text = line(&header);
    if style == TableStyle::Markdown {
        let rule: Vec<String> = columns
            .iter()
            .zip(&widths)
            .map(|(column, &width_of_column)| match column.align {
                Align::Left => "-".repeat(width_of_column),
                Align::Right => format!("{}:", "-".repeat(width_of_column - 1)),
            })
            .collect();
        text.push_str(&format!("| {} |\n", rule.join(" | ")));
    }
    for row in &body {
        text.push_str(&line(row));
    }
    text
}

fn width(text: &str) -> usize {
    text.chars().count()
}

/// Text that Markdown shows literally, table cells included: markup
/// characters are backslash-escaped and line breaks become spaces.
pub fn markdown_text(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    for (i, &c) in chars.iter().enumerate() {
        // An underscore inside a word never starts emphasis: keep
        // `prefill_step_size` readable as plain text.
        let inside_word = |at: Option<&char>| at.is_some_and(|c| c.is_alphanumeric());
        let intraword = c == '_'
            && inside_word(i.checked_sub(1).and_then(|j| chars.get(j)))
            && inside_word(chars.get(i + 1));
        match c {
            '_' if intraword => out.push(c),
            '\\' | '|' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '#' => {
                out.push('\\');
                out.push(c);
            }
            '\r' | '\n' => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells<const N: usize>(row: [&str; N]) -> Vec<String> {
        row.map(str::to_owned).to_vec()
    }

    #[test]
    fn plain_columns_are_as_wide_as_their_widest_cell_two_spaces_apart() {
        let columns = [Column::left("model"), Column::right("tok/s")];
        let rows = [cells(["tiny", "1234.5"]), cells(["llama-3.2-1b", "7.0"])];
        assert_eq!(
            render(TableStyle::Plain, &columns, &rows),
            "model          tok/s\n\
             tiny          1234.5\n\
             llama-3.2-1b     7.0\n"
        );
    }

    #[test]
    fn a_header_wider_than_every_cell_sets_the_width() {
        let columns = [Column::right("decode tok/s"), Column::left("side")];
        let rows = [cells(["9.5", "a"])];
        assert_eq!(
            render(TableStyle::Plain, &columns, &rows),
            "decode tok/s  side\n\
             \x20        9.5  a\n"
        );
    }

    /// A left-aligned last column would pad its shorter cells with spaces
    /// that a terminal shows as nothing and a diff shows as a change.
    #[test]
    fn plain_lines_end_without_spaces() {
        let columns = [Column::left("MODEL"), Column::left("NOTE")];
        let rows = [cells(["a", ""]), cells(["b", "downloaded"])];
        let text = render(TableStyle::Plain, &columns, &rows);
        assert_eq!(text, "MODEL  NOTE\na\nb      downloaded\n");
        assert!(text.lines().all(|line| !line.ends_with(' ')), "{text:?}");
    }

    /// "—" and "±" are three and two bytes but one column in a terminal.
    #[test]
    fn width_counts_characters_not_bytes() {
        let columns = [Column::right("x")];
        let rows = [cells(["—"]), cells(["1.0 ± 0.2"]), cells(["12"])];
        assert_eq!(
            render(TableStyle::Plain, &columns, &rows),
            "        x\n        —\n1.0 ± 0.2\n       12\n"
        );
    }

    #[test]
    fn markdown_has_a_delimiter_row_with_colons_on_right_aligned_columns() {
        let columns = [Column::left("side"), Column::right("TTFT ms")];
        let rows = [cells(["ondo", "12.5"]), cells(["mlx-lm", "13.0"])];
        assert_eq!(
            render(TableStyle::Markdown, &columns, &rows),
            "| side   | TTFT ms |\n\
             | ------ | ------: |\n\
             | ondo   |    12.5 |\n\
             | mlx-lm |    13.0 |\n"
        );
    }

    #[test]
    fn markdown_columns_are_at_least_three_wide() {
        let columns = [Column::left("a"), Column::right("n")];
        let rows = [cells(["x", "1"])];
        assert_eq!(
            render(TableStyle::Markdown, &columns, &rows),
            "| a   |   n |\n\
             | --- | --: |\n\
             | x   |   1 |\n"
        );
    }

    /// A pipe in a name would otherwise split its cell in two; the width is
    /// that of the escaped text, so the columns still line up.
    #[test]
    fn markdown_cells_are_escaped_and_measured_escaped() {
        let columns = [Column::left("side"), Column::right("n")];
        let rows = [cells(["a|b", "1"]), cells(["c", "2"])];
        assert_eq!(
            render(TableStyle::Markdown, &columns, &rows),
            "| side |   n |\n\
             | ---- | --: |\n\
             | a\\|b |   1 |\n\
             | c    |   2 |\n"
        );
        assert_eq!(
            render(TableStyle::Plain, &columns, &rows),
            "side  n\na|b   1\nc     2\n",
            "plain text is left as it is"
        );
    }

    #[test]
    fn a_short_row_ends_in_empty_cells_and_extra_cells_are_not_shown() {
        let columns = [Column::left("a"), Column::left("b")];
        let rows = [cells(["1"]), cells(["2", "3", "4"])];
        assert_eq!(
            render(TableStyle::Plain, &columns, &rows),
            "a  b\n1\n2  3\n"
        );
    }

    #[test]
    fn markdown_text_escapes_markup_but_not_underscores_inside_words() {
        assert_eq!(
            markdown_text("a|b <i>\nc_d _e_"),
            "a\\|b \\<i\\> c_d \\_e\\_"
        );
    }
}
