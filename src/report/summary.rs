//! Groups of comparable runs and the statistics of each metric over a group.
//!
//! A group is every run with the same test, model, settings, run shape and
//! build: all fields but the ones that differ per repetition (ids, times,
//! measurements, outcome). Warm-up runs never enter a group; failed runs are
//! listed in their group but left out of its statistics.

use serde::Serialize;

use super::fields::{self, Cell, Row};
use crate::store::RunRecord;

/// The fields that identify a group, in struct order. Everything a user
/// set or a machine is (the test, the model, the settings, cold or warm,
/// the build) and nothing that is measured.
pub(crate) const GROUP_FIELDS: &[&str] = &[
    "kind",
    "test",
    "model_id",
    "model_path",
    "model_revision",
    "model_type",
    "quantization",
    "parameters",
    "weights_bytes",
    "load_kind",
    "fresh_process",
    "prefix_source",
    "loop",
    "prefill_step_size",
    "max_kv_size",
    "kv_bits",
    "images",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "server_name",
    "endpoint_url",
    "endpoint_dialect",
    "constraint",
    "concurrency",
    "split",
    "split_ranks",
    "split_backend",
    "split_hosts",
    "app_version",
    "app_commit",
    "build_profile",
    "mlx_version",
    "mlx_rs_version",
    "backend",
    "os",
    "cpu",
    "ram_bytes",
];

/// The fields that change from one repetition to the next: identity, time,
/// measurements and outcome. `bench_id` is here so that two invocations with
/// the same settings pool their samples; `seed` is here because benchmarks
/// vary it per repetition. Only a test reads it: it makes every new field
/// of the record a decision between the two lists.
#[cfg(test)]
pub(crate) const PER_RUN_FIELDS: &[&str] = &[
    "run_id",
    "created_at",
    "bench_id",
    "repetition",
    "warmup",
    "conversation_id",
    "user_agent",
    "download_ms",
    "load_ms",
    "ttft_ms",
    "prefill_ms",
    "decode_ms",
    "reasoning_ms",
    "cold_start_ms",
    "prefill_tps",
    "decode_tps",
    "prompt_tps",
    "generation_tps",
    "prompt_tokens",
    "cached_tokens",
    "prefill_tokens",
    "generated_tokens",
    "reasoning_tokens",
    "mlx_peak_bytes",
    "mlx_active_bytes",
    "mlx_cache_bytes",
    "kv_cache_bytes",
    "footprint_bytes",
    "pressure_start",
    "pressure_max",
    "pressure_end",
    "swap_delta_bytes",
    "decode_bytes_per_token",
    "memory_bandwidth_gbps",
    "decode_roofline_pct",
    "prefix_read_bytes",
    "prefix_read_ms",
    "image_tokens",
    "image_encode_ms",
    "seed",
    "stop_reason",
    "error",
    "server_prompt_tokens",
    "server_load_ms",
    "server_prefill_ms",
    "server_decode_ms",
    "server_prefill_tps",
    "server_decode_tps",
    "batch_min_rows",
    "batch_median_rows",
    "batch_max_rows",
    "admission_wait_ms",
    "waited_for",
    "prefill_chunks",
    "interleaved_chunks",
    "mask_ms_per_token",
    "aggregate_tps",
    "split_step_bytes",
    "split_step_link_ms",
    "split_prefill_bytes",
    "split_prefill_link_ms",
    "split_rank_step_ms",
    "split_rank_prefill_tps",
];

/// The metrics summarised per group, in output order.
pub(crate) const METRICS: &[&str] = &[
    "ttft_ms",
    "prefill_tps",
    "decode_tps",
    "mlx_peak_bytes",
    "cold_start_ms",
];

/// A metric that appears only when some run of the group has it.
const OPTIONAL_METRICS: &[&str] = &["cold_start_ms"];

/// Metrics a client cannot see of another program's server: an endpoint
/// run records them as zero, and its group shows none.
const NOT_SEEN_FROM_A_CLIENT: &[&str] = &["mlx_peak_bytes"];

/// One metric over the runs of a group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct MetricSummary {
    /// Middle value; the mean of the two middle ones for an even count.
    pub median: Option<f64>,
    pub mean: Option<f64>,
    /// Sample standard deviation (n - 1); `None` for fewer than two samples.
    pub stddev: Option<f64>,
    /// Smallest and largest sample, in the metric's own type.
    pub min: Option<Cell>,
    pub max: Option<Cell>,
    pub n: usize,
    /// Every sample, in run order, in the metric's own type (bytes stay integers).
    pub samples: Vec<Cell>,
}

impl MetricSummary {
    /// Statistics over the finite numeric cells; others are left out.
    pub(crate) fn from_cells(cells: impl IntoIterator<Item = Cell>) -> Self {
        let samples: Vec<Cell> = cells
            .into_iter()
            .filter(|c| c.as_f64().is_some_and(f64::is_finite))
            .collect();
        let values: Vec<f64> = samples.iter().filter_map(Cell::as_f64).collect();
        let n = values.len();
        if n == 0 {
            return Self {
                median: None,
                mean: None,
                stddev: None,
                min: None,
                max: None,
                n,
                samples,
            };
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
        let median = if n % 2 == 1 {
            values[order[n / 2]]
        } else {
            (values[order[n / 2 - 1]] + values[order[n / 2]]) / 2.0
        };
        let mean = values.iter().sum::<f64>() / n as f64;
        let stddev = (n > 1).then(|| {
            let squares: f64 = values.iter().map(|v| (v - mean).powi(2)).sum();
            (squares / (n - 1) as f64).sqrt()
        });
        Self {
            median: Some(median),
            mean: Some(mean),
            stddev,
            min: Some(samples[order[0]].clone()),
            max: Some(samples[order[n - 1]].clone()),
            n,
            samples,
        }
    }
}

/// Runs that share every group field.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// The group fields' values, in `GROUP_FIELDS` order.
    pub key: Vec<(&'static str, Cell)>,
    /// Indices into the report's runs, in run order.
    pub members: Vec<usize>,
    /// Members that failed (`error` set): listed, not counted.
    pub failed: Vec<usize>,
    /// (metric name, summary), in `METRICS` order.
    pub metrics: Vec<(&'static str, MetricSummary)>,
}

impl Group {
    pub(crate) fn key_value(&self, name: &str) -> &Cell {
        const MISSING: &Cell = &Cell::Null;
        self.key
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(MISSING, |(_, c)| c)
    }

    pub(crate) fn metric(&self, name: &str) -> Option<&MetricSummary> {
        self.metrics
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, m)| m)
    }

    /// How many runs the statistics cover.
    pub(crate) fn counted(&self) -> usize {
        self.members.len() - self.failed.len()
    }
}

/// The flattened runs and their groups, computed once per report.
pub(crate) struct Analysis {
    pub rows: Vec<Row>,
    pub groups: Vec<Group>,
}

impl Analysis {
    pub(crate) fn new(runs: &[RunRecord]) -> std::io::Result<Self> {
        let rows = runs
            .iter()
            .map(fields::flatten)
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut groups: Vec<Group> = Vec::new();
        for (index, (run, row)) in runs.iter().zip(&rows).enumerate() {
            if run.warmup {
                continue;
            }
            let key: Vec<(&'static str, Cell)> = GROUP_FIELDS
                .iter()
                .map(|&name| (name, fields::get(row, name).clone()))
                .collect();
            let group = match groups.iter_mut().find(|g| g.key == key) {
                Some(group) => group,
                None => {
                    groups.push(Group {
                        key,
                        members: Vec::new(),
                        failed: Vec::new(),
                        metrics: Vec::new(),
                    });
                    let last = groups.len() - 1;
                    &mut groups[last]
                }
            };
            group.members.push(index);
            if run.error.is_some() {
                group.failed.push(index);
            }
        }
        for group in &mut groups {
            let counted: Vec<&Row> = group
                .members
                .iter()
                .filter(|i| !group.failed.contains(i))
                .map(|&i| &rows[i])
                .collect();
            let endpoint = *group.key_value("kind") == Cell::Text("endpoint".into());
            for &metric in METRICS {
                let cells: Vec<Cell> = counted
                    .iter()
                    .map(|row| fields::get(row, metric).clone())
                    .filter(|c| *c != Cell::Null)
                    .filter(|_| !(endpoint && NOT_SEEN_FROM_A_CLIENT.contains(&metric)))
                    .collect();
                let present = group
                    .members
                    .iter()
                    .any(|&i| *fields::get(&rows[i], metric) != Cell::Null);
                if OPTIONAL_METRICS.contains(&metric) && !present {
                    continue;
                }
                group
                    .metrics
                    .push((metric, MetricSummary::from_cells(cells)));
            }
        }
        Ok(Self { rows, groups })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(values: &[f64]) -> MetricSummary {
        MetricSummary::from_cells(values.iter().map(|&v| Cell::Float(v)))
    }

    #[test]
    fn median_mean_and_sample_stddev() {
        let s = floats(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.mean), (Some(2.0), Some(2.0)));
        assert_eq!(
            (s.min, s.max),
            (Some(Cell::Float(1.0)), Some(Cell::Float(3.0)))
        );
        assert!((s.stddev.unwrap() - 1.0).abs() < 1e-12, "n - 1, not n");
        assert_eq!(
            s.samples,
            vec![Cell::Float(3.0), Cell::Float(1.0), Cell::Float(2.0)]
        );
        assert_eq!(floats(&[4.0, 1.0, 2.0, 3.0]).median, Some(2.5));
    }

    #[test]
    fn one_sample_has_no_spread_and_none_has_nothing() {
        let one = floats(&[5.0]);
        assert_eq!((one.n, one.median, one.stddev), (1, Some(5.0), None));
        let none = floats(&[]);
        assert_eq!((none.n, none.median, none.min), (0, None, None));
        let non_finite = floats(&[f64::NAN, 2.0, f64::INFINITY]);
        assert_eq!((non_finite.n, non_finite.median), (1, Some(2.0)));
    }

    #[test]
    fn bytes_stay_integers() {
        let s = MetricSummary::from_cells([Cell::UInt(3), Cell::UInt(4)]);
        assert_eq!(s.max, Some(Cell::UInt(4)));
        assert_eq!(s.median, Some(3.5));
    }

    #[test]
    fn every_field_is_either_a_group_field_or_a_per_run_field() {
        let names = fields::field_names().unwrap();
        for name in &names {
            let in_group = GROUP_FIELDS.contains(name);
            let per_run = PER_RUN_FIELDS.contains(name);
            assert!(
                in_group != per_run,
                "{name}: decide whether it identifies a group or changes per run"
            );
        }
        for name in GROUP_FIELDS.iter().chain(PER_RUN_FIELDS) {
            assert!(names.contains(name), "{name} is not a record field");
        }
        let in_order: Vec<&&str> = names.iter().filter(|n| GROUP_FIELDS.contains(n)).collect();
        assert!(in_order.iter().zip(GROUP_FIELDS).all(|(a, b)| **a == *b));
    }

    #[test]
    fn groups_skip_warmups_and_do_not_count_failures() {
        let run = |id: &str, step: u64, decode: f64| RunRecord {
            run_id: id.into(),
            prefill_step_size: step,
            decode_tps: decode,
            ..RunRecord::default()
        };
        let runs = vec![
            RunRecord {
                warmup: true,
                ..run("w", 256, 1.0)
            },
            run("a", 256, 10.0),
            run("b", 512, 20.0),
            run("c", 256, 30.0),
            RunRecord {
                error: Some("out of memory".into()),
                ..run("d", 256, 99.0)
            },
        ];
        let analysis = Analysis::new(&runs).unwrap();
        assert_eq!(analysis.groups.len(), 2);
        let first = &analysis.groups[0];
        assert_eq!(first.members, vec![1, 3, 4]);
        assert_eq!(first.failed, vec![4]);
        assert_eq!(first.counted(), 2);
        assert_eq!(first.metric("decode_tps").unwrap().median, Some(20.0));
        assert!(first.metric("cold_start_ms").is_none(), "no run has it");
        assert_eq!(
            analysis.groups[1].key_value("prefill_step_size"),
            &Cell::UInt(512)
        );
    }
}
