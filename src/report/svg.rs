//! Hand-written SVG charts for the HTML report: vertical bars, stacked
//! horizontal bars and a line chart over pressure bands. Plain markup with
//! a `<title>`, `role="img"` and an `aria-label`; no script, no fonts.
//! Every text from the caller is escaped here.

use std::fmt::Write as _;

use super::human::{self, html};

/// Colours; the pressure ones are Activity Monitor's green, yellow and red.
pub(crate) mod colour {
    pub const COLD: &str = "#d9480f";
    pub const WARM: &str = "#1971c2";
    pub const FAILED: &str = "#868e96";
    pub const PROCESS: &str = "#adb5bd";
    pub const LOAD: &str = "#e8590c";
    pub const TTFT: &str = "#5f3dc4";
    pub const USED: &str = "#1971c2";
    pub const FOOTPRINT: &str = "#c2255c";
    pub const NORMAL: &str = "#34c759";
    pub const WARNING: &str = "#ffcc00";
    pub const CRITICAL: &str = "#ff3b30";
    pub const GRID: &str = "#e9ecef";
    pub const AXIS: &str = "#495057";
}

/// The band colour and opacity of a pressure level; `None` for unknown.
pub(crate) fn pressure_fill(level: &str) -> Option<(&'static str, f64)> {
    match level {
        "normal" => Some((colour::NORMAL, 0.14)),
        "warning" => Some((colour::WARNING, 0.45)),
        "critical" => Some((colour::CRITICAL, 0.30)),
        _ => None,
    }
}

/// An SVG being written.
struct Svg {
    text: String,
}

impl Svg {
    fn new(width: f64, height: f64, label: &str, description: &str) -> Self {
        let label = html(label);
        let mut text = String::new();
        let _ = write!(
            text,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" role=\"img\" \
             aria-label=\"{label}\" width=\"{width}\" height=\"{height}\" \
             viewBox=\"0 0 {width} {height}\">\n<title>{label}</title>\n<desc>{}</desc>\n",
            html(description)
        );
        Self { text }
    }

    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, attrs: &str, tooltip: Option<&str>) {
        let _ = write!(
            self.text,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" {attrs}",
            w.max(0.0),
            h.max(0.0)
        );
        match tooltip {
            Some(tip) => {
                let _ = writeln!(self.text, "><title>{}</title></rect>", html(tip));
            }
            None => self.text.push_str("/>\n"),
        }
    }

    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str) {
        let _ = writeln!(
            self.text,
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{stroke}\"/>"
        );
    }

    /// Text; `anchor` is start, middle or end.
    fn label(&mut self, x: f64, y: f64, anchor: &str, class: &str, content: &str) {
        let _ = writeln!(
            self.text,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\" class=\"{class}\">{}</text>",
            html(content)
        );
    }

    /// Text turned to read bottom to top, for a y-axis title.
    fn vertical_label(&mut self, x: f64, y: f64, content: &str) {
        let _ = writeln!(
            self.text,
            "<text transform=\"translate({x:.1} {y:.1}) rotate(-90)\" text-anchor=\"middle\" \
             class=\"axis-title\">{}</text>",
            html(content)
        );
    }

    fn finish(mut self) -> String {
        self.text.push_str("</svg>\n");
        self.text
    }
}

/// Round tick values from 0 to at least `max`, about `target` of them.
pub(crate) fn ticks(max: f64, target: usize) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / target.max(1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = match raw / magnitude {
        n if n <= 1.0 => 1.0,
        n if n <= 2.0 => 2.0,
        n if n <= 5.0 => 5.0,
        _ => 10.0,
    } * magnitude;
    let count = (max / step).ceil().max(1.0) as usize;
    (0..=count).map(|i| i as f64 * step).collect()
}

/// `value` mapped from `[0, top]` onto `[from, to]`.
fn scale(value: f64, top: f64, from: f64, to: f64) -> f64 {
    if top <= 0.0 || !value.is_finite() {
        return from;
    }
    from + (value / top) * (to - from)
}

/// One bar of a bar chart.
pub(crate) struct Bar {
    /// Under the bar (a run number).
    pub tick: String,
    pub value: f64,
    pub fill: &'static str,
    /// Drawn pale with a dashed outline (a warm-up run).
    pub faded: bool,
    pub tooltip: String,
}

/// Vertical bars in the given order over a zero-based axis.
pub(crate) fn bar_chart(
    label: &str,
    description: &str,
    y_title: &str,
    x_title: &str,
    bars: &[Bar],
) -> String {
    let (width, height) = (560.0, 260.0);
    let (left, right, top, bottom) = (64.0, 16.0, 16.0, 48.0);
    let (x0, x1, y0, y1) = (left, width - right, height - bottom, top);
    let mut svg = Svg::new(width, height, label, description);

    let max = bars
        .iter()
        .map(|b| b.value)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let ticks = ticks(max, 5);
    let top_value = ticks.last().copied().unwrap_or(1.0);
    for &t in &ticks {
        let y = scale(t, top_value, y0, y1);
        svg.line(x0, y, x1, y, colour::GRID);
        svg.label(x0 - 6.0, y + 4.0, "end", "tick", &human::short(t));
    }
    svg.line(x0, y0, x1, y0, colour::AXIS);
    svg.vertical_label(16.0, (y0 + y1) / 2.0, y_title);
    svg.label(
        (x0 + x1) / 2.0,
        height - 8.0,
        "middle",
        "axis-title",
        x_title,
    );

    let slot = (x1 - x0) / bars.len().max(1) as f64;
    let bar_width = (slot * 0.72).max(1.0);
    let every = bars.len().div_ceil(24).max(1);
    let show_values = bars.len() <= 16;
    for (i, bar) in bars.iter().enumerate() {
        let centre = x0 + slot * (i as f64 + 0.5);
        let value = if bar.value.is_finite() {
            bar.value.max(0.0)
        } else {
            0.0
        };
        let y = scale(value, top_value, y0, y1);
        let style = if bar.faded {
            format!(
                "fill=\"{0}\" fill-opacity=\"0.35\" stroke=\"{0}\" stroke-dasharray=\"3 2\" class=\"bar\"",
                bar.fill
            )
        } else {
            format!("fill=\"{}\" class=\"bar\"", bar.fill)
        };
        svg.rect(
            centre - bar_width / 2.0,
            y,
            bar_width,
            y0 - y,
            &style,
            Some(&bar.tooltip),
        );
        if i % every == 0 {
            svg.label(centre, y0 + 16.0, "middle", "tick", &bar.tick);
        }
        if show_values && bar.value.is_finite() {
            let text = if value >= 100.0 {
                format!("{value:.0}")
            } else {
                format!("{value:.1}")
            };
            svg.label(centre, y - 4.0, "middle", "value", &text);
        }
    }
    svg.finish()
}

/// One part of a stacked bar.
pub(crate) struct Segment {
    pub value: f64,
    pub fill: &'static str,
    pub tooltip: String,
}

/// One row of a stacked bar chart.
pub(crate) struct StackedRow {
    pub label: String,
    pub segments: Vec<Segment>,
    /// After the bar ("41.7 + 92.4 = 134.1 ms").
    pub note: String,
}

/// Horizontal bars made of segments laid end to end, one row each.
pub(crate) fn stacked_bars(
    label: &str,
    description: &str,
    x_title: &str,
    rows: &[StackedRow],
) -> String {
    let width = 760.0;
    let (left, right, top, bottom) = (150.0, 250.0, 10.0, 44.0);
    let row_height = 26.0;
    let height = top + bottom + row_height * rows.len().max(1) as f64;
    let (x0, x1, y_axis) = (left, width - right, height - bottom);
    let mut svg = Svg::new(width, height, label, description);

    let max = rows
        .iter()
        .map(|r| {
            r.segments
                .iter()
                .map(|s| s.value.max(0.0))
                .filter(|v| v.is_finite())
                .sum::<f64>()
        })
        .fold(0.0, f64::max);
    let ticks = ticks(max, 6);
    let top_value = ticks.last().copied().unwrap_or(1.0);
    for &t in &ticks {
        let x = scale(t, top_value, x0, x1);
        svg.line(x, top, x, y_axis, colour::GRID);
        svg.label(x, y_axis + 16.0, "middle", "tick", &human::short(t));
    }
    svg.line(x0, top, x0, y_axis, colour::AXIS);
    svg.label(
        (x0 + x1) / 2.0,
        height - 8.0,
        "middle",
        "axis-title",
        x_title,
    );

    for (i, row) in rows.iter().enumerate() {
        let y = top + row_height * i as f64 + 5.0;
        svg.label(x0 - 8.0, y + 12.0, "end", "row-label", &row.label);
        let mut at = 0.0;
        for segment in &row.segments {
            if !segment.value.is_finite() || segment.value <= 0.0 {
                continue;
            }
            let start = scale(at, top_value, x0, x1);
            at += segment.value;
            let end = scale(at, top_value, x0, x1);
            let attrs = format!("fill=\"{}\" class=\"bar\"", segment.fill);
            svg.rect(
                start,
                y,
                (end - start).max(0.5),
                16.0,
                &attrs,
                Some(&segment.tooltip),
            );
        }
        svg.label(
            scale(at, top_value, x0, x1) + 6.0,
            y + 12.0,
            "start",
            "value",
            &row.note,
        );
    }
    svg.finish()
}

/// A point of a timeline.
pub(crate) struct TimelinePoint {
    pub t_ms: f64,
    pub level: String,
    /// One value per series, in bytes, in the series' order.
    pub values: Vec<f64>,
}

/// A series of a timeline: its name and colour; one panel each.
pub(crate) struct Series {
    pub name: String,
    pub stroke: &'static str,
}

/// A line chart per series, stacked, over the same time axis, each behind
/// bands coloured by the pressure level from one sample to the next.
pub(crate) fn timeline(
    label: &str,
    description: &str,
    series: &[Series],
    points: &[TimelinePoint],
) -> String {
    let width = 760.0;
    let (left, right, top, bottom) = (72.0, 16.0, 12.0, 44.0);
    let (panel_height, gap) = (150.0, 34.0);
    let panels = series.len().max(1) as f64;
    let height = top + bottom + panels * panel_height + (panels - 1.0) * gap;
    let (x0, x1) = (left, width - right);
    let mut svg = Svg::new(width, height, label, description);

    let t_first = points
        .iter()
        .map(|p| p.t_ms)
        .filter(|t| t.is_finite())
        .fold(f64::INFINITY, f64::min);
    let t_first = if t_first.is_finite() {
        t_first.min(0.0)
    } else {
        0.0
    };
    let t_last = points
        .iter()
        .map(|p| p.t_ms)
        .filter(|t| t.is_finite())
        .fold(0.0, f64::max);
    let t_ticks = ticks(t_last - t_first, 8);
    let t_top = t_ticks.last().copied().unwrap_or(1.0);
    let x_of = |t: f64| scale(t - t_first, t_top, x0, x1);

    for (s, one) in series.iter().enumerate() {
        let p_top = top + s as f64 * (panel_height + gap);
        let p_bottom = p_top + panel_height;
        // Bands: each sample's level holds until the next sample.
        let mut i = 0;
        while i + 1 < points.len() {
            let level = &points[i].level;
            let mut j = i + 1;
            while j + 1 < points.len() && points[j].level == *level {
                j += 1;
            }
            if let Some((fill, opacity)) = pressure_fill(level) {
                let (start, end) = (x_of(points[i].t_ms), x_of(points[j].t_ms));
                let attrs = format!("fill=\"{fill}\" fill-opacity=\"{opacity}\" class=\"band\"");
                let tip = format!(
                    "pressure {level} from {} to {} ms",
                    human::short(points[i].t_ms),
                    human::short(points[j].t_ms)
                );
                svg.rect(start, p_top, end - start, panel_height, &attrs, Some(&tip));
            }
            i = j;
        }

        let max = points
            .iter()
            .filter_map(|p| p.values.get(s).copied())
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max);
        let (divisor, unit) = crate::units::binary_unit(max);
        let v_ticks = ticks(max / divisor, 4);
        let v_top = v_ticks.last().copied().unwrap_or(1.0) * divisor;
        for &v in &v_ticks {
            let y = scale(v * divisor, v_top, p_bottom, p_top);
            svg.line(x0, y, x1, y, colour::GRID);
            svg.label(x0 - 6.0, y + 4.0, "end", "tick", &human::short(v));
        }
        svg.line(x0, p_bottom, x1, p_bottom, colour::AXIS);
        svg.line(x0, p_top, x0, p_bottom, colour::AXIS);
        svg.vertical_label(18.0, (p_top + p_bottom) / 2.0, unit);
        svg.label(
            x0 + 6.0,
            p_top + 14.0,
            "start",
            "panel-title",
            &format!("{} ({unit})", one.name),
        );

        let mut d = String::new();
        for p in points {
            let Some(&v) = p.values.get(s) else { continue };
            if !v.is_finite() || !p.t_ms.is_finite() {
                continue;
            }
            let command = if d.is_empty() { 'M' } else { 'L' };
            let _ = write!(
                d,
                "{command}{:.1} {:.1} ",
                x_of(p.t_ms),
                scale(v, v_top, p_bottom, p_top)
            );
        }
        if !d.is_empty() {
            let _ = writeln!(
                svg.text,
                "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" \
                 stroke-linejoin=\"round\" class=\"series\"><title>{}</title></path>",
                d.trim_end(),
                one.stroke,
                html(&one.name)
            );
        }
    }

    let axis_y = height - bottom;
    for &t in &t_ticks {
        svg.label(
            x_of(t + t_first),
            axis_y + 16.0,
            "middle",
            "tick",
            &human::short(t + t_first),
        );
    }
    svg.label(
        (x0 + x1) / 2.0,
        height - 8.0,
        "middle",
        "axis-title",
        "time since the request (ms)",
    );
    svg.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_maximum() {
        assert_eq!(ticks(9.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(1430.0, 5), vec![0.0, 500.0, 1000.0, 1500.0]);
        assert_eq!(
            ticks(0.0, 5).len(),
            6,
            "0 to 1 when there is nothing to show"
        );
        assert_eq!(ticks(f64::NAN, 5).last(), Some(&1.0));
    }

    #[test]
    fn charts_escape_and_label_themselves() {
        let bars = [Bar {
            tick: "1".into(),
            value: 3.0,
            fill: colour::WARM,
            faded: false,
            tooltip: "<b>x</b>".into(),
        }];
        let svg = bar_chart("Speed <1>", "d", "tok/s", "run", &bars);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("role=\"img\" aria-label=\"Speed &lt;1&gt;\""));
        assert!(svg.contains("<title>&lt;b&gt;x&lt;/b&gt;</title>"));
        assert!(!svg.contains("<b>"));
    }

    #[test]
    fn empty_inputs_draw_empty_charts() {
        assert!(bar_chart("a", "b", "c", "d", &[]).contains("</svg>"));
        assert!(stacked_bars("a", "b", "c", &[]).contains("</svg>"));
        let series = [Series {
            name: "used".into(),
            stroke: colour::USED,
        }];
        assert!(!timeline("a", "b", &series, &[]).contains("<path"));
    }
}
