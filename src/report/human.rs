//! Numbers as people read them, and escaping for HTML; sizes are
//! `crate::units`', Markdown's escaping `crate::text_table`'s. Only the
//! Markdown and HTML printers use this; the data formats print values as
//! stored.

/// A large count with an SI suffix ("1.31 M", "3.21 B").
pub(crate) fn count(value: u64) -> String {
    let v = value as f64;
    if v >= 1e9 {
        format!("{:.2} B", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} K", v / 1e3)
    } else {
        value.to_string()
    }
}

/// A measurement with two decimals, the precision of llama-bench's tables.
pub(crate) fn fixed2(value: f64) -> String {
    format!("{value:.2}")
}

/// A number as short as it can be without losing what matters on an axis:
/// at most three decimals, trailing zeros dropped.
pub(crate) fn short(value: f64) -> String {
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

/// Text safe inside HTML elements and double- or single-quoted attributes.
pub(crate) fn html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_short_numbers() {
        assert_eq!(count(1_310_720), "1.31 M");
        assert_eq!(count(999), "999");
        assert_eq!(short(2.50), "2.5");
        assert_eq!(short(200.0), "200");
        assert_eq!(short(-0.0001), "0");
    }

    #[test]
    fn escapes() {
        assert_eq!(
            html("<b>x</b> & 'y' \"z\""),
            "&lt;b&gt;x&lt;/b&gt; &amp; &#39;y&#39; &quot;z&quot;"
        );
    }
}
