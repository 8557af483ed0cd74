//! The record as one ordered list of named cells, read from its serde
//! derive so that every writer prints the same fields in the struct's order
//! (`loop` as serde names it) and a new field reaches every format at once.

use serde::Serialize;
use serde::ser::{self, Impossible};

use crate::store::{RUN_COLUMNS, RunRecord};

/// One field's value, as plain data.
#[derive(Debug, Clone)]
pub(crate) enum Cell {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Text(String),
}

impl Cell {
    /// The value as a number, when it is one.
    pub(crate) fn as_f64(&self) -> Option<f64> {
        match *self {
            Cell::Int(v) => Some(v as f64),
            Cell::UInt(v) => Some(v as f64),
            Cell::Float(v) => Some(v),
            _ => None,
        }
    }

    /// The value as CSV and tables print it: floats with Rust's shortest
    /// round-trip form, `None` as an empty string.
    pub(crate) fn plain(&self) -> String {
        match self {
            Cell::Null => String::new(),
            Cell::Bool(v) => v.to_string(),
            Cell::Int(v) => v.to_string(),
            Cell::UInt(v) => v.to_string(),
            Cell::Float(v) => v.to_string(),
            Cell::Text(v) => v.clone(),
        }
    }
}

/// Equal when the same variant holds the same value; floats compare by bits
/// so that grouping is an equivalence even for NaN.
impl PartialEq for Cell {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Cell::Null, Cell::Null) => true,
            (Cell::Bool(a), Cell::Bool(b)) => a == b,
            (Cell::Int(a), Cell::Int(b)) => a == b,
            (Cell::UInt(a), Cell::UInt(b)) => a == b,
            (Cell::Float(a), Cell::Float(b)) => a.to_bits() == b.to_bits(),
            (Cell::Text(a), Cell::Text(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Cell {}

impl Serialize for Cell {
    fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Cell::Null => serializer.serialize_none(),
            Cell::Bool(v) => serializer.serialize_bool(*v),
            Cell::Int(v) => serializer.serialize_i64(*v),
            Cell::UInt(v) => serializer.serialize_u64(*v),
            Cell::Float(v) => serializer.serialize_f64(*v),
            Cell::Text(v) => serializer.serialize_str(v),
        }
    }
}

/// A record's fields in struct order, with their serde names.
pub(crate) type Row = Vec<(&'static str, Cell)>;

/// The record flattened; fails only if the record gains a nested field (one
/// serde does not flatten) or a field the store keeps no column for.
pub(crate) fn flatten(record: &RunRecord) -> std::io::Result<Row> {
    record
        .serialize(RowSerializer)
        .map_err(|e| std::io::Error::other(format!("report: cannot flatten the run record: {e}")))
}

/// The field names of the record, in struct order.
pub(crate) fn field_names() -> std::io::Result<Vec<&'static str>> {
    Ok(flatten(&RunRecord::default())?
        .into_iter()
        .map(|(name, _)| name)
        .collect())
}

/// The value of one field of a flattened row (`Null` if there is no such field).
pub(crate) fn get<'r>(row: &'r Row, name: &str) -> &'r Cell {
    const MISSING: &Cell = &Cell::Null;
    row.iter()
        .find(|(n, _)| *n == name)
        .map_or(MISSING, |(_, cell)| cell)
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum FlattenError {
    #[error("{0}")]
    Custom(String),
    #[error("the record holds a {0}, which a flat row cannot")]
    Unsupported(&'static str),
}

impl ser::Error for FlattenError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        FlattenError::Custom(msg.to_string())
    }
}

/// Accepts one struct and collects its fields. A struct with a flattened
/// field (the record's provenance) arrives as a map of its fields.
struct RowSerializer;

/// Accepts one scalar (or an `Option` of one).
struct CellSerializer;

struct RowCollector {
    row: Row,
    /// A map's key, until its value arrives.
    key: Option<&'static str>,
}

/// A field name as the store's column list holds it: serde hands the
/// fields of a map over as borrowed names, and the row keeps static ones.
/// Every record field is a column (the store's row reader names each).
fn static_name(name: &str) -> Result<&'static str, FlattenError> {
    RUN_COLUMNS
        .iter()
        .copied()
        .find(|column| *column == name)
        .ok_or_else(|| FlattenError::Custom(format!("the record's field {name} has no column")))
}

impl ser::SerializeMap for RowCollector {
    type Ok = Row;
    type Error = FlattenError;

    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), FlattenError> {
        let Cell::Text(name) = key.serialize(CellSerializer)? else {
            return Err(FlattenError::Unsupported("map key that is not a name"));
        };
        self.key = Some(static_name(&name)?);
        Ok(())
    }

    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), FlattenError> {
        let key = self
            .key
            .take()
            .ok_or(FlattenError::Unsupported("map value without a key"))?;
        self.row.push((key, value.serialize(CellSerializer)?));
        Ok(())
    }

    fn end(self) -> Result<Row, FlattenError> {
        Ok(self.row)
    }
}

impl ser::SerializeStruct for RowCollector {
    type Ok = Row;
    type Error = FlattenError;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), FlattenError> {
        self.row.push((key, value.serialize(CellSerializer)?));
        Ok(())
    }

    fn end(self) -> Result<Row, FlattenError> {
        Ok(self.row)
    }
}

/// The methods that a flat record never reaches: each says what it met.
macro_rules! unsupported {
    ($ok:ty; $($method:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty = $what:literal;)*) => {
        $(
            fn $method(self, $(_: $ty),*) -> Result<$ret, FlattenError> {
                Err(FlattenError::Unsupported($what))
            }
        )*
    };
}

impl ser::Serializer for RowSerializer {
    type Ok = Row;
    type Error = FlattenError;
    type SerializeSeq = Impossible<Row, FlattenError>;
    type SerializeTuple = Impossible<Row, FlattenError>;
    type SerializeTupleStruct = Impossible<Row, FlattenError>;
    type SerializeTupleVariant = Impossible<Row, FlattenError>;
    type SerializeMap = RowCollector;
    type SerializeStruct = RowCollector;
    type SerializeStructVariant = Impossible<Row, FlattenError>;

    fn serialize_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<RowCollector, FlattenError> {
        Ok(RowCollector {
            row: Vec::with_capacity(len),
            key: None,
        })
    }

    fn serialize_map(self, len: Option<usize>) -> Result<RowCollector, FlattenError> {
        Ok(RowCollector {
            row: Vec::with_capacity(len.unwrap_or(RUN_COLUMNS.len())),
            key: None,
        })
    }

    unsupported! { Row;
        serialize_bool(v: bool) -> Row = "bool outside a struct";
        serialize_i8(v: i8) -> Row = "number outside a struct";
        serialize_i16(v: i16) -> Row = "number outside a struct";
        serialize_i32(v: i32) -> Row = "number outside a struct";
        serialize_i64(v: i64) -> Row = "number outside a struct";
        serialize_u8(v: u8) -> Row = "number outside a struct";
        serialize_u16(v: u16) -> Row = "number outside a struct";
        serialize_u32(v: u32) -> Row = "number outside a struct";
        serialize_u64(v: u64) -> Row = "number outside a struct";
        serialize_f32(v: f32) -> Row = "number outside a struct";
        serialize_f64(v: f64) -> Row = "number outside a struct";
        serialize_char(v: char) -> Row = "char outside a struct";
        serialize_str(v: &str) -> Row = "string outside a struct";
        serialize_bytes(v: &[u8]) -> Row = "byte string";
        serialize_none() -> Row = "None outside a struct";
        serialize_unit() -> Row = "unit";
        serialize_unit_struct(name: &'static str) -> Row = "unit struct";
        serialize_unit_variant(name: &'static str, index: u32, variant: &'static str) -> Row = "enum";
        serialize_seq(len: Option<usize>) -> Self::SerializeSeq = "sequence";
        serialize_tuple(len: usize) -> Self::SerializeTuple = "tuple";
        serialize_tuple_struct(name: &'static str, len: usize) -> Self::SerializeTupleStruct = "tuple struct";
        serialize_tuple_variant(name: &'static str, index: u32, variant: &'static str, len: usize) -> Self::SerializeTupleVariant = "enum";
        serialize_struct_variant(name: &'static str, index: u32, variant: &'static str, len: usize) -> Self::SerializeStructVariant = "enum";
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<Row, FlattenError> {
        Err(FlattenError::Unsupported("Some outside a struct"))
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Row, FlattenError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Row, FlattenError> {
        Err(FlattenError::Unsupported("enum"))
    }
}

impl ser::Serializer for CellSerializer {
    type Ok = Cell;
    type Error = FlattenError;
    type SerializeSeq = Impossible<Cell, FlattenError>;
    type SerializeTuple = Impossible<Cell, FlattenError>;
    type SerializeTupleStruct = Impossible<Cell, FlattenError>;
    type SerializeTupleVariant = Impossible<Cell, FlattenError>;
    type SerializeMap = Impossible<Cell, FlattenError>;
    type SerializeStruct = Impossible<Cell, FlattenError>;
    type SerializeStructVariant = Impossible<Cell, FlattenError>;

    fn serialize_bool(self, v: bool) -> Result<Cell, FlattenError> {
        Ok(Cell::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Cell, FlattenError> {
        Ok(Cell::Int(v.into()))
    }
    fn serialize_i16(self, v: i16) -> Result<Cell, FlattenError> {
        Ok(Cell::Int(v.into()))
    }
    fn serialize_i32(self, v: i32) -> Result<Cell, FlattenError> {
        Ok(Cell::Int(v.into()))
    }
    fn serialize_i64(self, v: i64) -> Result<Cell, FlattenError> {
        Ok(Cell::Int(v))
    }
    fn serialize_u8(self, v: u8) -> Result<Cell, FlattenError> {
        Ok(Cell::UInt(v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<Cell, FlattenError> {
        Ok(Cell::UInt(v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<Cell, FlattenError> {
        Ok(Cell::UInt(v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<Cell, FlattenError> {
        Ok(Cell::UInt(v))
    }
    fn serialize_f32(self, v: f32) -> Result<Cell, FlattenError> {
        Ok(Cell::Float(v.into()))
    }
    fn serialize_f64(self, v: f64) -> Result<Cell, FlattenError> {
        Ok(Cell::Float(v))
    }
    fn serialize_char(self, v: char) -> Result<Cell, FlattenError> {
        Ok(Cell::Text(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Cell, FlattenError> {
        Ok(Cell::Text(v.to_owned()))
    }
    fn serialize_none(self) -> Result<Cell, FlattenError> {
        Ok(Cell::Null)
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<Cell, FlattenError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Cell, FlattenError> {
        Ok(Cell::Null)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Cell, FlattenError> {
        Ok(Cell::Null)
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<Cell, FlattenError> {
        Ok(Cell::Text(variant.to_owned()))
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Cell, FlattenError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Cell, FlattenError> {
        Err(FlattenError::Unsupported("enum with data"))
    }

    unsupported! { Cell;
        serialize_bytes(v: &[u8]) -> Cell = "byte string";
        serialize_seq(len: Option<usize>) -> Self::SerializeSeq = "sequence";
        serialize_tuple(len: usize) -> Self::SerializeTuple = "tuple";
        serialize_tuple_struct(name: &'static str, len: usize) -> Self::SerializeTupleStruct = "tuple struct";
        serialize_tuple_variant(name: &'static str, index: u32, variant: &'static str, len: usize) -> Self::SerializeTupleVariant = "enum with data";
        serialize_map(len: Option<usize>) -> Self::SerializeMap = "map";
        serialize_struct(name: &'static str, len: usize) -> Self::SerializeStruct = "nested struct";
        serialize_struct_variant(name: &'static str, index: u32, variant: &'static str, len: usize) -> Self::SerializeStructVariant = "enum with data";
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_follow_the_struct_and_serde() {
        let names = field_names().unwrap();
        assert_eq!(names.first(), Some(&"run_id"));
        assert!(names.contains(&"loop"), "serde's name, not loop_shape");
        assert!(!names.contains(&"loop_shape"));
        // The same order serde_json writes the keys in.
        let json = serde_json::to_string(&RunRecord::default()).unwrap();
        let mut last = 0;
        for name in &names {
            let at = json.find(&format!("\"{name}\":")).unwrap();
            assert!(at >= last, "{name} out of order");
            last = at;
        }
        let parsed: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&json).unwrap();
        assert_eq!(parsed.len(), names.len(), "every field, once");
    }

    #[test]
    fn cells_keep_types_and_none() {
        let record = RunRecord {
            swap_delta_bytes: -5,
            decode_tps: 0.1,
            bench_id: None,
            repetition: Some(2),
            ..RunRecord::default()
        };
        let row = flatten(&record).unwrap();
        assert_eq!(get(&row, "swap_delta_bytes"), &Cell::Int(-5));
        assert_eq!(get(&row, "decode_tps").plain(), "0.1");
        assert_eq!(get(&row, "bench_id"), &Cell::Null);
        assert_eq!(get(&row, "repetition"), &Cell::UInt(2));
        assert_eq!(get(&row, "no_such_field"), &Cell::Null);
        assert_eq!(Cell::Float(f64::NAN), Cell::Float(f64::NAN));
    }
}
