//! RunRecord as `runs` columns: the one field list, and how each Rust field
//! type is kept in SQLite.

use std::sync::LazyLock;

use rusqlite::Row;
use rusqlite::types::{FromSql, FromSqlResult, Value, ValueRef};

use super::record::{Provenance, RunRecord};

/// How a field's Rust type is kept in a column.
pub(super) trait ColumnValue: Sized {
    /// The STRICT table type: "TEXT", "INTEGER" or "REAL".
    const SQL_TYPE: &'static str;
    /// The value that rows written before the column existed read as (and
    /// that an older Ondo, which does not know the column, leaves there).
    /// `None`: the column is nullable instead.
    const DEFAULT: Option<&'static str>;

    fn to_column(&self) -> Value;
    fn from_column(value: ValueRef<'_>) -> FromSqlResult<Self>;
}

impl ColumnValue for String {
    const SQL_TYPE: &'static str = "TEXT";
    const DEFAULT: Option<&'static str> = Some("''");

    fn to_column(&self) -> Value {
        Value::Text(self.clone())
    }
    fn from_column(value: ValueRef<'_>) -> FromSqlResult<Self> {
        String::column_result(value)
    }
}

impl ColumnValue for bool {
    const SQL_TYPE: &'static str = "INTEGER";
    const DEFAULT: Option<&'static str> = Some("0");

    fn to_column(&self) -> Value {
        Value::Integer(i64::from(*self))
    }
    fn from_column(value: ValueRef<'_>) -> FromSqlResult<Self> {
        bool::column_result(value)
    }
}

impl ColumnValue for i64 {
    const SQL_TYPE: &'static str = "INTEGER";
    const DEFAULT: Option<&'static str> = Some("0");

    fn to_column(&self) -> Value {
        Value::Integer(*self)
    }
    fn from_column(value: ValueRef<'_>) -> FromSqlResult<Self> {
        i64::column_result(value)
    }
}

impl ColumnValue for u32 {
    const SQL_TYPE: &'static str = "INTEGER";
    const DEFAULT: Option<&'static str> = Some("0");

    fn to_column(&self) -> Value {
        Value::Integer(i64::from(*self))
    }
    fn from_column(value: ValueRef<'_>) -> FromSqlResult<Self> {
        u32::column_result(value)
    }
}

/// SQLite integers are i64. A u64 is kept as the i64 with the same bits, so
/// every value round-trips (a random seed may use all 64); byte counts never
/// reach 2^63, so SQL sees them as they are.
impl ColumnValue for u64 {
    const SQL_TYPE: &'static str = "INTEGER";
    const DEFAULT: Option<&'static str> = Some("0");

    fn to_column(&self) -> Value {
        Value::Integer(*self as i64)
    }
    fn from_column(value: ValueRef<'_>) -> FromSqlResult<Self> {
        i64::column_result(value).map(|bits| bits as u64)
    }
}

/// SQLite cannot store NaN (it turns into NULL), and a rate over no time is
/// NaN, so an f64 column is nullable and NULL reads back as NaN rather than
/// refusing the whole run. Inside an Option, NaN reads back as None.
impl ColumnValue for f64 {
    const SQL_TYPE: &'static str = "REAL";
    const DEFAULT: Option<&'static str> = None;

    fn to_column(&self) -> Value {
        if self.is_nan() {
            Value::Null
        } else {
            Value::Real(*self)
        }
    }
    fn from_column(value: ValueRef<'_>) -> FromSqlResult<Self> {
        match value {
            ValueRef::Null => Ok(f64::NAN),
            value => f64::column_result(value),
        }
    }
}

impl<T: ColumnValue> ColumnValue for Option<T> {
    const SQL_TYPE: &'static str = T::SQL_TYPE;
    const DEFAULT: Option<&'static str> = None;

    fn to_column(&self) -> Value {
        self.as_ref().map_or(Value::Null, T::to_column)
    }
    fn from_column(value: ValueRef<'_>) -> FromSqlResult<Self> {
        match value {
            ValueRef::Null => Ok(None),
            value => T::from_column(value).map(Some),
        }
    }
}

/// The record's enums are kept as the text serde gives them ("cold",
/// "pipelined", "bench_cold"), so SQL filters and other tools read them.
macro_rules! text_enum_column {
    ($($enum:ty),*) => {$(
        impl ColumnValue for $enum {
            const SQL_TYPE: &'static str = "TEXT";
            const DEFAULT: Option<&'static str> = Some("''");

            fn to_column(&self) -> Value {
                Value::Text(self.to_string())
            }
            fn from_column(value: ValueRef<'_>) -> FromSqlResult<Self> {
                let text = String::column_result(value)?;
                serde_json::from_value(serde_json::Value::String(text))
                    .map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
            }
        }
    )*};
}

text_enum_column!(
    crate::run_kinds::RunKind,
    crate::run_kinds::LoadKind,
    crate::run_kinds::LoopShape,
    crate::run_kinds::StopReason,
    super::record::EndpointDialect
);

/// Rows written before the column existed read as "none".
impl ColumnValue for crate::run_kinds::PrefixSource {
    const SQL_TYPE: &'static str = "TEXT";
    const DEFAULT: Option<&'static str> = Some("'none'");

    fn to_column(&self) -> Value {
        Value::Text(self.as_str().to_owned())
    }
    fn from_column(value: ValueRef<'_>) -> FromSqlResult<Self> {
        String::column_result(value).map(|text| Self::parse(&text))
    }
}

/// One `runs` column: its name and its definition for ALTER TABLE ADD COLUMN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RunColumn {
    pub name: &'static str,
    pub sql_type: &'static str,
    pub default: Option<&'static str>,
}

impl RunColumn {
    pub fn definition(&self) -> String {
        match self.default {
            Some(default) => format!("{} NOT NULL DEFAULT {default}", self.sql_type),
            None => self.sql_type.to_owned(),
        }
    }
}

fn column_of<T: ColumnValue>(name: &'static str, _field: &T) -> RunColumn {
    RunColumn {
        name,
        sql_type: T::SQL_TYPE,
        default: T::DEFAULT,
    }
}

/// Reads a column kept the way ColumnValue writes it.
pub(super) fn read_column<T: ColumnValue>(row: &Row<'_>, index: usize) -> rusqlite::Result<T> {
    let value = row.get_ref(index)?;
    T::from_column(value).map_err(|error| {
        rusqlite::Error::FromSqlConversionFailure(index, value.data_type(), Box::new(error))
    })
}

fn read_next<T: ColumnValue>(row: &Row<'_>, index: &mut usize) -> rusqlite::Result<T> {
    let value = read_column(row, *index);
    *index += 1;
    value
}

macro_rules! column_name {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident, $column:literal) => {
        $column
    };
}

/// Writes the column list, the column definitions, and the to/from row
/// functions from one list of RunRecord's fields, then its provenance's
/// (flattened into the record, so they are columns of their own). A column
/// takes the field's serde name (`as "..."` where that differs from the Rust
/// name).
macro_rules! run_columns {
    (
        $($field:ident $(as $column:literal)?),*;
        provenance { $($provenance_field:ident),* $(,)? }
    ) => {
        /// The `runs` columns in table order, named like RunRecord's serde fields.
        pub const RUN_COLUMNS: &[&str] = &[
            $(column_name!($field $(, $column)?),)*
            $(stringify!($provenance_field),)*
        ];

        /// Each column's type and default, from the field's Rust type.
        pub(super) fn run_column_types() -> Vec<RunColumn> {
            let record = RunRecord::default();
            vec![
                $(column_of(column_name!($field $(, $column)?), &record.$field),)*
                $(column_of(stringify!($provenance_field), &record.provenance.$provenance_field),)*
            ]
        }

        /// The record's values in RUN_COLUMNS order.
        pub(super) fn run_values(record: &RunRecord) -> Vec<Value> {
            vec![
                $(record.$field.to_column(),)*
                $(record.provenance.$provenance_field.to_column(),)*
            ]
        }

        /// A row selected as RUN_COLUMNS, in that order (a struct's fields
        /// are evaluated as written). Naming every field here (no `..`) is
        /// what makes a field missing from the list a compile error.
        pub(super) fn run_from_row(row: &Row<'_>) -> rusqlite::Result<RunRecord> {
            let mut index = 0;
            Ok(RunRecord {
                $($field: read_next(row, &mut index)?,)*
                provenance: Provenance {
                    $($provenance_field: read_next(row, &mut index)?,)*
                },
            })
        }
    };
}

// Adding a field to RunRecord: one line here. `Store::open` adds the column
// to existing databases (schema.rs).
run_columns! {
    run_id,
    created_at,
    kind,
    bench_id,
    test,
    repetition,
    warmup,
    conversation_id,
    user_agent,
    model_id,
    model_path,
    model_revision,
    model_type,
    quantization,
    parameters,
    weights_bytes,
    download_ms,
    load_ms,
    ttft_ms,
    prefill_ms,
    decode_ms,
    reasoning_ms,
    cold_start_ms,
    prefill_tps,
    decode_tps,
    prompt_tps,
    generation_tps,
    prompt_tokens,
    cached_tokens,
    prefill_tokens,
    generated_tokens,
    reasoning_tokens,
    mlx_peak_bytes,
    mlx_active_bytes,
    mlx_cache_bytes,
    kv_cache_bytes,
    footprint_bytes,
    pressure_start,
    pressure_max,
    pressure_end,
    swap_delta_bytes,
    decode_bytes_per_token,
    memory_bandwidth_gbps,
    decode_roofline_pct,
    load_kind,
    fresh_process,
    prefix_source,
    prefix_read_bytes,
    prefix_read_ms,
    loop_shape as "loop",
    prefill_step_size,
    max_kv_size,
    kv_bits,
    images,
    image_tokens,
    image_encode_ms,
    max_tokens,
    temperature,
    top_p,
    top_k,
    min_p,
    repetition_penalty,
    seed,
    stop_reason,
    error,
    server_name,
    endpoint_url,
    endpoint_dialect,
    server_prompt_tokens,
    server_load_ms,
    server_prefill_ms,
    server_decode_ms,
    server_prefill_tps,
    server_decode_tps,
    batch_min_rows,
    batch_median_rows,
    batch_max_rows,
    admission_wait_ms,
    waited_for,
    prefill_chunks,
    interleaved_chunks,
    constraint,
    mask_ms_per_token,
    concurrency,
    aggregate_tps,
    split,
    split_ranks,
    split_backend,
    split_hosts,
    split_step_bytes,
    split_step_link_ms,
    split_prefill_bytes,
    split_prefill_link_ms,
    split_rank_step_ms,
    split_rank_prefill_tps;
    provenance {
        app_version,
        app_commit,
        build_profile,
        mlx_version,
        mlx_rs_version,
        backend,
        os,
        cpu,
        ram_bytes,
    }
}

/// RUN_COLUMNS quoted and comma-separated ("loop" is a keyword elsewhere in SQL).
pub(super) static RUN_COLUMN_LIST: LazyLock<String> = LazyLock::new(|| {
    RUN_COLUMNS
        .iter()
        .map(|name| format!("\"{name}\""))
        .collect::<Vec<_>>()
        .join(", ")
});

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: ColumnValue>(value: &T) -> T {
        let stored = value.to_column();
        T::from_column(ValueRef::from(&stored)).unwrap()
    }

    #[test]
    fn u64_keeps_all_64_bits() {
        for value in [0, 1, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX] {
            assert_eq!(round_trip(&value), value);
        }
        assert_eq!(round_trip(&Some(u64::MAX)), Some(u64::MAX));
    }

    #[test]
    fn nan_is_stored_as_null_and_reads_back() {
        assert_eq!(f64::NAN.to_column(), Value::Null);
        assert!(round_trip(&f64::NAN).is_nan());
        assert_eq!(round_trip(&f64::INFINITY), f64::INFINITY);
        assert_eq!(round_trip(&Some(f64::NAN)), None);
    }

    #[test]
    fn every_column_appears_once() {
        let mut names = RUN_COLUMNS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RUN_COLUMNS.len());
        assert_eq!(run_column_types().len(), RUN_COLUMNS.len());
        assert_eq!(run_values(&RunRecord::default()).len(), RUN_COLUMNS.len());
    }

    #[test]
    fn optional_fields_are_nullable_columns() {
        let columns = run_column_types();
        let find = |name: &str| {
            columns
                .iter()
                .find(|c| c.name == name)
                .unwrap()
                .definition()
        };
        assert_eq!(find("bench_id"), "TEXT");
        assert_eq!(find("repetition"), "INTEGER");
        assert_eq!(find("weights_bytes"), "INTEGER NOT NULL DEFAULT 0");
        assert_eq!(find("loop"), "TEXT NOT NULL DEFAULT ''");
        assert_eq!(find("ttft_ms"), "REAL");
    }
}
