//! Median and spread of repeated measurements, with the raw samples kept.

use serde::{Deserialize, Serialize};

/// A set of samples of one metric.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    /// Sample standard deviation (n - 1); 0 for fewer than two samples.
    pub stddev: f64,
    pub samples: Vec<f64>,
}

impl Summary {
    pub fn from_samples(samples: &[f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let stddev = if n > 1 {
            (sorted.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Self {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            mean,
            stddev,
            samples: samples.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread_of_odd_and_even_counts() {
        let s = Summary::from_samples(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.mean), (2.0, 1.0, 3.0, 2.0));
        assert!((s.stddev - 1.0).abs() < 1e-12);
        assert_eq!(s.samples, vec![3.0, 1.0, 2.0], "samples kept in run order");
        assert_eq!(Summary::from_samples(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert_eq!(Summary::from_samples(&[5.0]).stddev, 0.0);
        assert_eq!(Summary::from_samples(&[]).median, 0.0);
    }
}
