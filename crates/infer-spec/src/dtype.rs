//! The V2 / Open Inference Protocol tensor datatypes, with their recipe spellings, Triton config
//! names and element sizes. The one datatype type: recipes parse into it, the builder writes it
//! into `runtime.toml`, the runtime decodes request tensors with it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A tensor element type, spelled as in the V2 protocol (`"FP32"`, `"INT64"`, `"BYTES"`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DataType {
    #[serde(rename = "BOOL")]
    Bool,
    #[serde(rename = "UINT8")]
    U8,
    #[serde(rename = "UINT16")]
    U16,
    #[serde(rename = "UINT32")]
    U32,
    #[serde(rename = "UINT64")]
    U64,
    #[serde(rename = "INT8")]
    I8,
    #[serde(rename = "INT16")]
    I16,
    #[serde(rename = "INT32")]
    I32,
    #[serde(rename = "INT64")]
    I64,
    #[serde(rename = "FP16")]
    F16,
    #[serde(rename = "BF16")]
    BF16,
    #[serde(rename = "FP32")]
    F32,
    #[serde(rename = "FP64")]
    F64,
    /// Variable-length byte strings; on the wire each element is a 4-byte little-endian
    /// length followed by the bytes.
    #[serde(rename = "BYTES")]
    Bytes,
}

impl DataType {
    /// A signed or unsigned integer type (`INT8` to `INT64`, `UINT8` to `UINT64`).
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            DataType::U8
                | DataType::U16
                | DataType::U32
                | DataType::U64
                | DataType::I8
                | DataType::I16
                | DataType::I32
                | DataType::I64
        )
    }

    /// Every datatype, in a fixed order.
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::U8,
        DataType::U16,
        DataType::U32,
        DataType::U64,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::F16,
        DataType::BF16,
        DataType::F32,
        DataType::F64,
        DataType::Bytes,
    ];

    /// The V2 protocol name (`"FP32"`).
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::U8 => "UINT8",
            DataType::U16 => "UINT16",
            DataType::U32 => "UINT32",
            DataType::U64 => "UINT64",
            DataType::I8 => "INT8",
            DataType::I16 => "INT16",
            DataType::I32 => "INT32",
            DataType::I64 => "INT64",
            DataType::F16 => "FP16",
            DataType::BF16 => "BF16",
            DataType::F32 => "FP32",
            DataType::F64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    /// Parses a V2 protocol name; `None` for anything else (case-sensitive, as the protocol).
    pub fn parse(s: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// The recipe spelling (`"fp32"`, `"int64"`, `"bytes"`): the V2 name in lower case.
    pub fn recipe_name(self) -> &'static str {
        match self {
            DataType::Bool => "bool",
            DataType::U8 => "uint8",
            DataType::U16 => "uint16",
            DataType::U32 => "uint32",
            DataType::U64 => "uint64",
            DataType::I8 => "int8",
            DataType::I16 => "int16",
            DataType::I32 => "int32",
            DataType::I64 => "int64",
            DataType::F16 => "fp16",
            DataType::BF16 => "bf16",
            DataType::F32 => "fp32",
            DataType::F64 => "fp64",
            DataType::Bytes => "bytes",
        }
    }

    /// Parses a recipe spelling, or the V2 name.
    pub fn parse_recipe(s: &str) -> Option<DataType> {
        DataType::ALL
            .into_iter()
            .find(|d| d.recipe_name() == s || d.as_str() == s)
    }

    /// The Triton model-configuration name (`"TYPE_FP32"`; `BYTES` is `TYPE_STRING`).
    pub fn triton_name(self) -> &'static str {
        match self {
            DataType::Bool => "TYPE_BOOL",
            DataType::U8 => "TYPE_UINT8",
            DataType::U16 => "TYPE_UINT16",
            DataType::U32 => "TYPE_UINT32",
            DataType::U64 => "TYPE_UINT64",
            DataType::I8 => "TYPE_INT8",
            DataType::I16 => "TYPE_INT16",
            DataType::I32 => "TYPE_INT32",
            DataType::I64 => "TYPE_INT64",
            DataType::F16 => "TYPE_FP16",
            DataType::BF16 => "TYPE_BF16",
            DataType::F32 => "TYPE_FP32",
            DataType::F64 => "TYPE_FP64",
            DataType::Bytes => "TYPE_STRING",
        }
    }

    /// Bytes per element, or `None` for the variable-length `BYTES`.
    pub fn size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::U8 | DataType::I8 => Some(1),
            DataType::U16 | DataType::I16 | DataType::F16 | DataType::BF16 => Some(2),
            DataType::U32 | DataType::I32 | DataType::F32 => Some(4),
            DataType::U64 | DataType::I64 | DataType::F64 => Some(8),
            DataType::Bytes => None,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::parse(d.as_str()), Some(d));
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, format!("\"{}\"", d.as_str()));
            assert!(d.triton_name().starts_with("TYPE_"));
        }
        assert_eq!(DataType::parse("fp32"), None);
        for d in DataType::ALL {
            assert_eq!(d.recipe_name(), d.as_str().to_ascii_lowercase());
            assert_eq!(DataType::parse_recipe(d.recipe_name()), Some(d));
            assert_eq!(DataType::parse_recipe(d.as_str()), Some(d));
        }
        assert_eq!(DataType::parse_recipe("float"), None);
        assert_eq!(DataType::F32.size(), Some(4));
        assert_eq!(DataType::Bytes.size(), None);
    }
}
