//! The JSON report (one object: runs, timelines, per-group statistics) and
//! JSONL (one record per line). `docs/REPORT_SCHEMA.md` is their contract.

use std::io::Write;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use super::fields::Cell;
use super::summary::{Analysis, Group, MetricSummary};
use super::{REPORT_SCHEMA, Report};
use crate::store::{MemorySample, RECORD_SCHEMA_VERSION, RunRecord};

#[derive(Serialize)]
struct JsonReport<'a> {
    schema: &'static str,
    schema_version: u32,
    generated_at: &'a str,
    title: &'a str,
    runs: &'a [RunRecord],
    timelines: Timelines<'a>,
    summary: Vec<GroupJson<'a>>,
}

/// `{run_id: [samples]}` in the order given; repeated ids are merged so the
/// object never has a key twice.
struct Timelines<'a>(&'a [(String, Vec<MemorySample>)]);

impl Serialize for Timelines<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut ids: Vec<&str> = Vec::new();
        for (id, _) in self.0 {
            if !ids.contains(&id.as_str()) {
                ids.push(id);
            }
        }
        let mut map = serializer.serialize_map(Some(ids.len()))?;
        for id in ids {
            let samples: Vec<&MemorySample> = self
                .0
                .iter()
                .filter(|(other, _)| other == id)
                .flat_map(|(_, samples)| samples)
                .collect();
            map.serialize_entry(id, &samples)?;
        }
        map.end()
    }
}

#[derive(Serialize)]
struct GroupJson<'a> {
    /// The group fields and their values, in the record's order.
    group: OrderedMap<'a, Cell>,
    /// Every member, failed ones included, in run order.
    run_ids: Vec<&'a str>,
    failed_run_ids: Vec<&'a str>,
    metrics: OrderedMap<'a, MetricSummary>,
}

struct OrderedMap<'a, V>(&'a [(&'static str, V)]);

impl<V: Serialize> Serialize for OrderedMap<'_, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

fn group_json<'a>(group: &'a Group, runs: &'a [RunRecord]) -> GroupJson<'a> {
    let id = |&i: &usize| runs[i].run_id.as_str();
    GroupJson {
        group: OrderedMap(&group.key),
        run_ids: group.members.iter().map(id).collect(),
        failed_run_ids: group.failed.iter().map(id).collect(),
        metrics: OrderedMap(&group.metrics),
    }
}

pub(crate) fn write_json(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let analysis = Analysis::new(report.runs)?;
    let document = JsonReport {
        schema: REPORT_SCHEMA,
        schema_version: RECORD_SCHEMA_VERSION,
        generated_at: &report.generated_at,
        title: &report.title,
        runs: report.runs,
        timelines: Timelines(report.timelines),
        summary: analysis
            .groups
            .iter()
            .map(|g| group_json(g, report.runs))
            .collect(),
    };
    serde_json::to_writer_pretty(&mut *out, &document).map_err(std::io::Error::other)?;
    out.write_all(b"\n")
}

pub(crate) fn write_jsonl(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    for run in report.runs {
        serde_json::to_writer(&mut *out, run).map_err(std::io::Error::other)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_timeline_ids_merge_into_one_key() {
        let sample = |t_ms| MemorySample {
            t_ms,
            ..MemorySample::default()
        };
        let timelines = vec![
            ("a".to_owned(), vec![sample(0.0)]),
            ("b".to_owned(), vec![sample(0.0)]),
            ("a".to_owned(), vec![sample(1.0)]),
        ];
        let text = serde_json::to_string(&Timelines(&timelines)).unwrap();
        assert!(text.starts_with("{\"a\":[{\"t_ms\":0.0"), "{text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["a"].as_array().unwrap().len(), 2);
        assert_eq!(value.as_object().unwrap().len(), 2);
    }
}
