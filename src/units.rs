//! Sizes as people read them: the one rule for every byte figure Ondo shows
//! (CLI output, messages, the people's report formats), in binary units
//! labelled as such (1 GiB = 2^30 bytes). The app's `formatBytes`
//! (ui/src/lib/format.ts) follows the same rule and its tests check the
//! same cases, so a size reads the same in the popover, in an error message
//! and in the terminal.

/// Bytes in a kibibyte, mebibyte, gibibyte and tebibyte.
pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];

/// The largest binary unit in which `value` (bytes) is at least 1, as its
/// divisor and its name: what a chart's axis of bytes is labelled in.
pub fn binary_unit(value: f64) -> (f64, &'static str) {
    let (divisor, index) = unit_for(value.abs());
    (divisor, UNITS[index])
}

fn unit_for(magnitude: f64) -> (f64, usize) {
    let mut divisor = 1.0;
    let mut index = 0;
    while index + 1 < UNITS.len() && magnitude >= divisor * 1024.0 {
        divisor *= 1024.0;
        index += 1;
    }
    (divisor, index)
}

/// Bytes as a short figure with three significant digits: "512 B",
/// "12.0 KiB", "565 MiB", "2.55 GiB", "16.0 GiB". Halves round up. A figure
/// that would read 1024 is written in the next unit ("1.00 GiB", never
/// "1024 MiB").
pub fn human_bytes(bytes: u64) -> String {
    let value = bytes as f64;
    let (mut divisor, mut index) = unit_for(value);
    if index == 0 {
        return format!("{bytes} B");
    }
    loop {
        let figure = value / divisor;
        // The decimals follow the rounded figure, so 9.996 reads "10.0".
        for decimals in [2u32, 1] {
            let scale = 10u64.pow(decimals);
            let scaled = (figure * scale as f64).round() as u64;
            // Three digits at most: below 10.00 with two decimals, below
            // 100.0 with one.
            if scaled < 1000 {
                let whole = scaled / scale;
                let fraction = scaled % scale;
                return format!(
                    "{whole}.{fraction:0width$} {}",
                    UNITS[index],
                    width = decimals as usize
                );
            }
        }
        let whole = figure.round() as u64;
        if whole < 1024 || index + 1 == UNITS.len() {
            return format!("{whole} {}", UNITS[index]);
        }
        divisor *= 1024.0;
        index += 1;
    }
}

/// Bytes as mebibytes: the value of a column whose header names the unit
/// ("peak MiB"), where every row must be in the same unit.
pub fn mib(bytes: f64) -> f64 {
    bytes / MIB as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases ui/src/lib/format.test.ts checks too.
    const CASES: [(u64, &str); 14] = [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        // 1.125 KiB: a half rounds up.
        (1152, "1.13 KiB"),
        (12 * KIB, "12.0 KiB"),
        // 9.994 KiB and 9.995 KiB: the second carries into two digits.
        (10_234, "9.99 KiB"),
        (10_235, "10.0 KiB"),
        (102_348, "99.9 KiB"),
        (102_349, "100 KiB"),
        (512 * MIB, "512 MiB"),
        (1_932_735_283, "1.80 GiB"),
        // 1023.999 MiB would read "1024 MiB": the next unit instead.
        (GIB - 1, "1.00 GiB"),
        (16 * GIB, "16.0 GiB"),
        (2048 * GIB, "2.00 TiB"),
    ];

    #[test]
    fn three_significant_digits_in_the_largest_unit_that_keeps_one() {
        for (bytes, text) in CASES {
            assert_eq!(human_bytes(bytes), text, "{bytes} bytes");
        }
        // The largest unit has no next one: its figure grows instead.
        assert_eq!(human_bytes(5000 * TIB), "5000 TiB");
        assert_eq!(human_bytes(u64::MAX), "16777216 TiB");
        // 1023.4 MiB still reads in MiB.
        assert_eq!(human_bytes(1023 * MIB + 400 * KIB), "1023 MiB");
    }

    #[test]
    fn an_axis_takes_the_largest_unit_its_top_reaches() {
        assert_eq!(binary_unit(0.0), (1.0, "B"));
        assert_eq!(binary_unit(1023.0), (1.0, "B"));
        assert_eq!(binary_unit(3.0 * MIB as f64), (MIB as f64, "MiB"));
        assert_eq!(binary_unit(-2.0 * GIB as f64), (GIB as f64, "GiB"));
        assert_eq!(mib(13_107_200.0), 12.5);
    }
}
