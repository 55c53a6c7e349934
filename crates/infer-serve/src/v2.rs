//! The V2 inference request decoder and response encoder (JSON tensors and Triton's binary
//! tensor data extension). Pure: bytes and the model signature in, tensors or an
//! [`ApiError`] out; no I/O, no batching, no model.
//!
//! Decoding checks everything a backend would otherwise trip over: names, datatypes, shapes
//! (fixed non-batch dimensions from `runtime.toml`, rows ≤ `max_batch_size`), element counts,
//! binary sizes, `BOOL` bytes and `BYTES` length prefixes. Every problem is a 400 naming the
//! tensor; no input can make it panic (see the mutation test below and the fuzz target
//! `fuzz/fuzz_targets/v2_request.rs`). Names, datatypes and shapes are checked against the
//! model's served `Signature` by `signature::Inputs`, which the gRPC decoder runs
//! too; what is left here is the JSON and binary framing.

use crate::error::ApiError;
use crate::signature::Signature;
use crate::tensor::{Tensor, Truncated};
use bytes::Bytes;
use infer_spec::DataType;
#[cfg(test)]
use infer_spec::RuntimeConfig;
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// The header that carries the JSON part's length when binary tensor data follows it.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// A decoded, validated inference request.
#[derive(Debug, Clone, PartialEq)]
pub struct InferRequest {
    /// The request `id`, echoed in the response.
    pub id: Option<String>,
    /// One tensor per model input, in the config's input order.
    pub inputs: Vec<Tensor>,
    /// The outputs to return, in the order requested.
    pub outputs: Vec<RequestedOutput>,
    /// The `timeout` parameter, in µs.
    pub timeout_us: Option<u64>,
    /// Rows (the batch dimension shared by all inputs).
    pub rows: usize,
}

/// One output to return: its index in the config's outputs, whether it goes as binary, and
/// the classification extension's count (`parameters.classification`): that many of each row's
/// largest values as `BYTES` strings, `value:index[:label]`, in place of the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestedOutput {
    pub index: usize,
    pub binary: bool,
    pub classification: Option<u32>,
}

/// The most classes the classification extension returns per row: every class of the largest
/// outputs real classifiers have (ImageNet-21k's 21,841), with room to spare.
pub const MAX_CLASSIFICATION: u64 = 1 << 16;

/// The classification extension's count from a request's output parameter: 1 to
/// [`MAX_CLASSIFICATION`] (0, as Triton's clients send for "none", is no classification).
pub(crate) fn classification_count(v: Option<u64>, at: &str) -> Result<Option<u32>, ApiError> {
    match v {
        None | Some(0) => Ok(None),
        Some(k) if k <= MAX_CLASSIFICATION => Ok(Some(k as u32)),
        Some(k) => Err(bad(format!(
            "{at}parameter \"classification\" {k} is more than {MAX_CLASSIFICATION} classes"
        ))),
    }
}

/// Each requested output's tensor from the model's `outputs`, in the order requested; an
/// output asked for as a classification becomes its classes ([`classify`]), labelled by
/// `labels(index)` when the model has labels for that output.
pub(crate) fn select_outputs<'t, 'l>(
    requested: &[RequestedOutput],
    outputs: &'t [Tensor],
    labels: impl Fn(usize) -> Option<&'l [String]>,
) -> Vec<(RequestedOutput, std::borrow::Cow<'t, Tensor>)> {
    requested
        .iter()
        .filter_map(|r| {
            let t = outputs.get(r.index)?;
            Some(match r.classification {
                None => (*r, std::borrow::Cow::Borrowed(t)),
                Some(k) => (
                    *r,
                    std::borrow::Cow::Owned(classify(t, k as usize, labels(r.index))),
                ),
            })
        })
        .collect()
}

/// Triton's classification extension on one output: for each row (the first dimension), its
/// `k` largest values, largest first (ties: the lower index first), each as the string
/// `value:index`, or `value:index:label` when `labels` has as many labels as the row has
/// classes. Values are written as C's `%f` writes them (six decimals) for floating-point
/// outputs, as integers for integer ones. The answer is a `BYTES` tensor `[rows, min(k,
/// classes)]`. The datatype was checked when the request was read
/// (`Signature::output`): `BOOL` and `BYTES` never get here, and are passed through.
pub(crate) fn classify(t: &Tensor, k: usize, labels: Option<&[String]>) -> Tensor {
    let rows = t.rows().max(1);
    let classes = t.shape.iter().skip(1).product::<usize>();
    let Some(size) = t.dtype.size() else {
        return t.clone();
    };
    if classes == 0 || t.data.len() != rows * classes * size {
        return t.clone();
    }
    let labels = labels.filter(|l| l.len() == classes);
    let value = |b: &[u8]| -> f64 {
        match t.dtype {
            DataType::U8 => f64::from(b[0]),
            DataType::I8 => f64::from(b[0] as i8),
            DataType::U16 => f64::from(u16::from_le_bytes([b[0], b[1]])),
            DataType::I16 => f64::from(i16::from_le_bytes([b[0], b[1]])),
            DataType::U32 => f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DataType::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DataType::U64 => u64::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DataType::I64 => i64::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DataType::F16 => f64::from(half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            DataType::BF16 => f64::from(half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            DataType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DataType::F64 => f64::from_le_bytes(b.try_into().unwrap_or_default()),
            DataType::Bool | DataType::Bytes => 0.0,
        }
    };
    let text = |b: &[u8]| -> String {
        match t.dtype {
            DataType::U64 => u64::from_le_bytes(b.try_into().unwrap_or_default()).to_string(),
            DataType::I64 => i64::from_le_bytes(b.try_into().unwrap_or_default()).to_string(),
            DataType::U8
            | DataType::I8
            | DataType::U16
            | DataType::I16
            | DataType::U32
            | DataType::I32 => format!("{}", value(b)),
            _ => c_fixed(value(b)),
        }
    };
    let kept = k.min(classes);
    let mut out = Vec::with_capacity(rows * kept * 24);
    let mut values: Vec<f64> = Vec::with_capacity(classes);
    let mut order: Vec<usize> = Vec::with_capacity(classes);
    for row in t.data.chunks_exact(classes * size) {
        values.clear();
        values.extend(row.chunks_exact(size).map(value));
        order.clear();
        order.extend(0..classes);
        // Largest first; NaN after every number; equal values by index (a stable sort).
        order.sort_by(|&a, &b| {
            let (x, y) = (values[a], values[b]);
            match (x.is_nan(), y.is_nan()) {
                (false, false) => y.total_cmp(&x),
                (a_nan, b_nan) => a_nan.cmp(&b_nan),
            }
        });
        for &i in &order[..kept] {
            let mut s = format!("{}:{i}", text(&row[i * size..(i + 1) * size]));
            if let Some(l) = labels {
                s.push(':');
                s.push_str(&l[i]);
            }
            out.extend((s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
    }
    Tensor {
        dtype: DataType::Bytes,
        shape: vec![rows, kept],
        data: Bytes::from(out),
    }
}

/// `v` as C's `printf("%f")` (and C++'s `std::to_string`) writes it: six decimals, `nan`,
/// `inf`, `-inf`.
fn c_fixed(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{v:.6}")
    }
}

#[derive(Deserialize)]
struct RawRequest<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Option<BTreeMap<String, Value>>,
    #[serde(borrow)]
    inputs: Vec<RawInput<'a>>,
    #[serde(default)]
    outputs: Option<Vec<RawOutput>>,
}

#[derive(Deserialize)]
struct RawInput<'a> {
    name: String,
    shape: Vec<u64>,
    datatype: String,
    #[serde(default)]
    parameters: Option<BTreeMap<String, Value>>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawOutput {
    name: String,
    #[serde(default)]
    parameters: Option<BTreeMap<String, Value>>,
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

fn param_bool(
    params: &Option<BTreeMap<String, Value>>,
    key: &str,
    at: &str,
) -> Result<Option<bool>, ApiError> {
    match params.as_ref().and_then(|p| p.get(key)) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(bad(format!(
            "{at}parameter {key:?} must be a boolean, got {v}"
        ))),
    }
}

fn param_u64(
    params: &Option<BTreeMap<String, Value>>,
    key: &str,
    at: &str,
) -> Result<Option<u64>, ApiError> {
    match params.as_ref().and_then(|p| p.get(key)) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            bad(format!(
                "{at}parameter {key:?} must be a non-negative integer, got {v}"
            ))
        }),
    }
}

/// Parses the `Inference-Header-Content-Length` header value.
pub fn parse_header_length(value: &[u8]) -> Result<usize, ApiError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .ok_or_else(|| {
            bad(format!(
                "{HEADER_LENGTH} must be a non-negative integer, got {:?}",
                String::from_utf8_lossy(value)
            ))
        })
}

/// Decodes a request body against the model's served signature (`sig`: a `Signature`, or
/// a `&RuntimeConfig` for a model served as its engine takes it). `header_length` is the
/// parsed `Inference-Header-Content-Length` (present when binary data follows the JSON; 0
/// means the whole body is the one input's raw bytes).
pub fn decode_request<'a>(
    sig: impl Into<Signature<'a>>,
    header_length: Option<usize>,
    body: &Bytes,
) -> Result<InferRequest, ApiError> {
    let sig = sig.into();
    let (json, binary) = match header_length {
        Some(0) => return decode_raw_binary(sig, body),
        Some(n) if n > body.len() => {
            return Err(bad(format!(
                "{HEADER_LENGTH} is {n} but the body has only {} bytes",
                body.len()
            )))
        }
        Some(n) => (&body[..n], body.slice(n..)),
        None => (&body[..], Bytes::new()),
    };
    let json =
        std::str::from_utf8(json).map_err(|e| bad(format!("request JSON is not UTF-8: {e}")))?;
    let raw: RawRequest =
        serde_json::from_str(json).map_err(|e| bad(format!("malformed request JSON: {e}")))?;

    let timeout_us = param_u64(&raw.parameters, "timeout", "")?;
    let binary_all = param_bool(&raw.parameters, "binary_data_output", "")?.unwrap_or(false);

    let mut given = sig.request();
    let mut cursor = 0usize;
    for input in &raw.inputs {
        let declared = given.declare(&input.name, &input.datatype, Ok(&input.shape))?;
        let (at, dtype, elements) = (&declared.at, declared.dtype, declared.elements());
        let data = match (
            param_u64(&input.parameters, "binary_data_size", at)?,
            input.data,
        ) {
            (Some(_), Some(_)) => {
                return Err(bad(format!("{at}has both \"data\" and binary_data_size")))
            }
            (None, None) => {
                return Err(bad(format!(
                    "{at}has neither \"data\" nor binary_data_size"
                )))
            }
            (Some(size), None) => {
                let size = usize::try_from(size)
                    .map_err(|_| bad(format!("{at}binary_data_size {size} is too large")))?;
                let end = cursor.checked_add(size).filter(|&e| e <= binary.len()).ok_or_else(|| {
                    bad(format!(
                        "{at}binary_data_size {size} runs past the end of the body (binary data is truncated: {} bytes left)",
                        binary.len() - cursor
                    ))
                })?;
                let data = binary.slice(cursor..end);
                cursor = end;
                check_binary(dtype, elements, &data).map_err(|m| bad(format!("{at}{m}")))?;
                data
            }
            (None, Some(raw_data)) => {
                let mut out = Vec::with_capacity(elements * dtype.size().unwrap_or(8));
                let mut count = 0usize;
                let mut de = serde_json::Deserializer::from_str(raw_data.get());
                Flat {
                    dtype,
                    out: &mut out,
                    count: &mut count,
                    limit: elements,
                }
                .deserialize(&mut de)
                .map_err(|e| bad(format!("{at}bad \"data\": {e}")))?;
                if count != elements {
                    return Err(bad(format!(
                        "{at}\"data\" has {count} elements but shape {:?} needs {elements}",
                        input.shape
                    )));
                }
                Bytes::from(out)
            }
        };
        given.set(declared, data);
    }
    if cursor != binary.len() {
        return Err(bad(format!(
            "{} bytes of binary data after the JSON header are not claimed by any input's binary_data_size",
            binary.len() - cursor
        )));
    }
    let (inputs, rows) = given.finish()?;

    let outputs = match &raw.outputs {
        None => sig.all_outputs(binary_all),
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for o in list {
                let at = format!("output {:?}: ", o.name);
                let classification =
                    classification_count(param_u64(&o.parameters, "classification", &at)?, &at)?;
                let index = sig.output(&o.name, classification, &out)?;
                let binary = param_bool(&o.parameters, "binary_data", &at)?.unwrap_or(binary_all);
                out.push(RequestedOutput {
                    index,
                    binary,
                    classification,
                });
            }
            out
        }
    };
    Ok(InferRequest {
        id: raw.id,
        inputs,
        outputs,
        timeout_us,
        rows,
    })
}

/// `Inference-Header-Content-Length: 0`: the body is the raw bytes of the model's only input,
/// one row; every output is returned as binary.
fn decode_raw_binary(sig: Signature, body: &Bytes) -> Result<InferRequest, ApiError> {
    let [spec] = sig.inputs else {
        return Err(bad(format!(
            "a raw binary request ({HEADER_LENGTH}: 0) needs a model with exactly one input, this one has {}",
            sig.inputs.len()
        )));
    };
    if spec.is_variable() {
        return Err(bad(format!(
            "a raw binary request ({HEADER_LENGTH}: 0) needs fixed dims, input {:?} has {:?}: send a JSON header with its shape",
            spec.name, spec.dims
        )));
    }
    let mut shape = vec![1usize];
    shape.extend(spec.row_dims());
    let elements: usize = shape.iter().product();
    check_binary(spec.datatype, elements, body)
        .map_err(|m| bad(format!("input {:?}: {m}", spec.name)))?;
    Ok(InferRequest {
        id: None,
        inputs: vec![Tensor {
            dtype: spec.datatype,
            shape,
            data: body.clone(),
        }],
        outputs: sig.all_outputs(true),
        timeout_us: None,
        rows: 1,
    })
}

/// Checks binary tensor bytes: exact size for fixed-size types, 0/1 for `BOOL`, well-formed
/// length prefixes and the element count for `BYTES`. Shared by the HTTP and gRPC decoders.
pub(crate) fn check_binary(dtype: DataType, elements: usize, data: &[u8]) -> Result<(), String> {
    match dtype.size() {
        Some(size) => {
            let want = elements * size;
            if data.len() != want {
                return Err(format!(
                    "binary data has {} bytes but {elements} {dtype} elements need {want}",
                    data.len()
                ));
            }
            if dtype == DataType::Bool && data.iter().any(|&b| b > 1) {
                return Err("BOOL binary data must be 0 or 1 bytes".to_owned());
            }
            Ok(())
        }
        None => {
            let mut walk = crate::tensor::BytesElements::new(data);
            for i in 0..elements {
                match walk.next() {
                    Some(Ok(_)) => {}
                    Some(Err(Truncated::Announced(len))) => {
                        return Err(format!(
                            "BYTES element {i} is truncated ({len} bytes announced)"
                        ))
                    }
                    Some(Err(Truncated::Prefix)) | None => {
                        return Err(format!("BYTES element {i} is truncated (no length prefix)"))
                    }
                }
            }
            if walk.remaining() != 0 {
                return Err(format!(
                    "BYTES data has {} bytes after its {elements} elements",
                    walk.remaining()
                ));
            }
            Ok(())
        }
    }
}

/// Flattens nested JSON arrays of numbers/bools/strings into little-endian bytes of `dtype`,
/// counting elements and stopping early once more than `limit` arrive (so a huge array
/// cannot make the buffer grow past what the shape allows).
struct Flat<'b> {
    dtype: DataType,
    out: &'b mut Vec<u8>,
    count: &'b mut usize,
    limit: usize,
}

impl Flat<'_> {
    fn reborrow(&mut self) -> Flat<'_> {
        Flat {
            dtype: self.dtype,
            out: self.out,
            count: self.count,
            limit: self.limit,
        }
    }

    fn bump<E: de::Error>(&mut self) -> Result<(), E> {
        *self.count += 1;
        if *self.count > self.limit {
            return Err(E::custom(format!(
                "more than the {} elements the shape allows",
                self.limit
            )));
        }
        Ok(())
    }

    fn int<E: de::Error>(&mut self, v: i128) -> Result<(), E> {
        self.bump()?;
        let out = &mut *self.out;
        let range = || E::custom(format!("{v} is out of range for {}", self.dtype));
        match self.dtype {
            DataType::U8 => out.extend(u8::try_from(v).map_err(|_| range())?.to_le_bytes()),
            DataType::U16 => out.extend(u16::try_from(v).map_err(|_| range())?.to_le_bytes()),
            DataType::U32 => out.extend(u32::try_from(v).map_err(|_| range())?.to_le_bytes()),
            DataType::U64 => out.extend(u64::try_from(v).map_err(|_| range())?.to_le_bytes()),
            DataType::I8 => out.extend(i8::try_from(v).map_err(|_| range())?.to_le_bytes()),
            DataType::I16 => out.extend(i16::try_from(v).map_err(|_| range())?.to_le_bytes()),
            DataType::I32 => out.extend(i32::try_from(v).map_err(|_| range())?.to_le_bytes()),
            DataType::I64 => out.extend(i64::try_from(v).map_err(|_| range())?.to_le_bytes()),
            DataType::F16 => out.extend(half::f16::from_f64(v as f64).to_le_bytes()),
            DataType::BF16 => out.extend(half::bf16::from_f64(v as f64).to_le_bytes()),
            DataType::F32 => out.extend((v as f32).to_le_bytes()),
            DataType::F64 => out.extend((v as f64).to_le_bytes()),
            DataType::Bool | DataType::Bytes => {
                return Err(E::custom(format!(
                    "a number is not a {} element",
                    self.dtype
                )))
            }
        }
        Ok(())
    }

    fn float<E: de::Error>(&mut self, v: f64) -> Result<(), E> {
        match self.dtype {
            DataType::F16 => self.out.extend(half::f16::from_f64(v).to_le_bytes()),
            DataType::BF16 => self.out.extend(half::bf16::from_f64(v).to_le_bytes()),
            DataType::F32 => self.out.extend((v as f32).to_le_bytes()),
            DataType::F64 => self.out.extend(v.to_le_bytes()),
            _ if v.fract() == 0.0 && v.abs() < 1e19 => return self.int(v as i128),
            _ => return Err(E::custom(format!("{v} is not a {} element", self.dtype))),
        }
        self.bump()
    }
}

impl<'de> DeserializeSeed<'de> for Flat<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Flat<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} elements, flat or nested in arrays", self.dtype)
    }

    fn visit_bool<E: de::Error>(mut self, v: bool) -> Result<(), E> {
        if self.dtype != DataType::Bool {
            return Err(E::custom(format!(
                "a boolean is not a {} element",
                self.dtype
            )));
        }
        self.bump()?;
        self.out.push(u8::from(v));
        Ok(())
    }

    fn visit_i64<E: de::Error>(mut self, v: i64) -> Result<(), E> {
        self.int(i128::from(v))
    }

    fn visit_u64<E: de::Error>(mut self, v: u64) -> Result<(), E> {
        self.int(i128::from(v))
    }

    fn visit_f64<E: de::Error>(mut self, v: f64) -> Result<(), E> {
        self.float(v)
    }

    fn visit_str<E: de::Error>(mut self, v: &str) -> Result<(), E> {
        if self.dtype != DataType::Bytes {
            return Err(E::custom(format!(
                "a string is not a {} element",
                self.dtype
            )));
        }
        let len =
            u32::try_from(v.len()).map_err(|_| E::custom("BYTES element longer than 4 GiB"))?;
        self.bump()?;
        self.out.extend(len.to_le_bytes());
        self.out.extend_from_slice(v.as_bytes());
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self.reborrow())?.is_some() {}
        Ok(())
    }
}

/// Encodes a response. `outputs` pairs each requested output with its tensor (already split
/// to this request's rows). Returns the body and, when any output is binary, the JSON
/// header's length for `Inference-Header-Content-Length`.
pub fn encode_response<'a>(
    sig: impl Into<Signature<'a>>,
    id: Option<&str>,
    outputs: &[(RequestedOutput, &Tensor)],
) -> (Vec<u8>, Option<usize>) {
    let sig = sig.into();
    let mut out = Vec::with_capacity(
        128 + outputs
            .iter()
            .map(|(r, t)| if r.binary { 64 } else { 64 + t.data.len() * 3 })
            .sum::<usize>(),
    );
    out.extend_from_slice(b"{\"model_name\":");
    push_json_str(&mut out, &sig.model.name);
    out.extend_from_slice(b",\"model_version\":");
    push_json_str(&mut out, &sig.model.version);
    if let Some(id) = id {
        out.extend_from_slice(b",\"id\":");
        push_json_str(&mut out, id);
    }
    out.extend_from_slice(b",\"outputs\":[");
    let mut any_binary = false;
    for (i, (req, t)) in outputs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"name\":");
        let name = sig
            .outputs
            .get(req.index)
            .map(|s| s.name.as_str())
            .unwrap_or("");
        push_json_str(&mut out, name);
        out.extend_from_slice(b",\"datatype\":\"");
        out.extend_from_slice(t.dtype.as_str().as_bytes());
        out.extend_from_slice(b"\",\"shape\":[");
        let mut ib = itoa::Buffer::new();
        for (j, d) in t.shape.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            out.extend_from_slice(ib.format(*d).as_bytes());
        }
        out.push(b']');
        if req.binary {
            any_binary = true;
            out.extend_from_slice(b",\"parameters\":{\"binary_data_size\":");
            out.extend_from_slice(ib.format(t.data.len()).as_bytes());
            out.push(b'}');
        } else {
            out.extend_from_slice(b",\"data\":[");
            push_json_data(&mut out, t);
            out.push(b']');
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    if !any_binary {
        return (out, None);
    }
    let header = out.len();
    for (req, t) in outputs {
        if req.binary {
            out.extend_from_slice(&t.data);
        }
    }
    (out, Some(header))
}

fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn push_json_data(out: &mut Vec<u8>, t: &Tensor) {
    let mut ib = itoa::Buffer::new();
    let mut fb = ryu::Buffer::new();
    let mut first = true;
    let mut sep = |out: &mut Vec<u8>| {
        if !first {
            out.push(b',');
        }
        first = false;
    };
    macro_rules! ints {
        ($t:ty, $n:expr) => {
            for c in t.data.chunks_exact($n) {
                sep(out);
                let v = <$t>::from_le_bytes(c.try_into().unwrap_or([0; $n]));
                out.extend_from_slice(ib.format(v).as_bytes());
            }
        };
    }
    macro_rules! floats {
        ($n:expr, $conv:expr) => {
            for c in t.data.chunks_exact($n) {
                sep(out);
                let v = $conv(c.try_into().unwrap_or([0; $n]));
                if v.is_finite() {
                    out.extend_from_slice(fb.format_finite(v).as_bytes());
                } else {
                    out.extend_from_slice(b"null");
                }
            }
        };
    }
    match t.dtype {
        DataType::Bool => {
            for &b in t.data.iter() {
                sep(out);
                out.extend_from_slice(if b != 0 { b"true" } else { b"false" });
            }
        }
        DataType::U8 => ints!(u8, 1),
        DataType::U16 => ints!(u16, 2),
        DataType::U32 => ints!(u32, 4),
        DataType::U64 => ints!(u64, 8),
        DataType::I8 => ints!(i8, 1),
        DataType::I16 => ints!(i16, 2),
        DataType::I32 => ints!(i32, 4),
        DataType::I64 => ints!(i64, 8),
        DataType::F16 => floats!(2, |b| half::f16::from_le_bytes(b).to_f32()),
        DataType::BF16 => floats!(2, |b| half::bf16::from_le_bytes(b).to_f32()),
        DataType::F32 => floats!(4, f32::from_le_bytes),
        DataType::F64 => floats!(8, f64::from_le_bytes),
        DataType::Bytes => {
            let mut rest = &t.data[..];
            while rest.len() >= 4 {
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let Some(s) = rest.get(4..4 + len) else { break };
                sep(out);
                push_json_str(out, &String::from_utf8_lossy(s));
                rest = &rest[4 + len..];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RuntimeConfig {
        crate::fixtures::decoder_model("INT64", false)
    }

    fn le<T: Copy>(v: &[T], f: fn(T) -> Vec<u8>) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }

    /// Decodes `body` (a JSON header followed by `binary`) and compares with `expected`:
    /// `Ok((x bytes, ids bytes, rows))` or `Err(substring of the 400 message)`.
    fn check(json: &str, binary: &[u8], expected: Result<(Vec<u8>, Vec<u8>, usize), &str>) {
        let mut body = json.as_bytes().to_vec();
        body.extend_from_slice(binary);
        let header = (!binary.is_empty()).then_some(json.len());
        let got = decode_request(&cfg(), header, &Bytes::from(body));
        match (got, expected) {
            (Ok(r), Ok((x, ids, rows))) => {
                assert_eq!(&r.inputs[0].data[..], &x[..], "{json}");
                assert_eq!(&r.inputs[1].data[..], &ids[..], "{json}");
                assert_eq!(r.rows, rows);
            }
            (Err(ApiError::BadRequest(m)), Err(want)) => {
                assert!(m.contains(want), "{m:?} lacks {want:?}")
            }
            (got, want) => panic!("{json}: got {got:?}, want {want:?}"),
        }
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        le(v, |x| x.to_le_bytes().to_vec())
    }
    fn i64s(v: &[i64]) -> Vec<u8> {
        le(v, |x| x.to_le_bytes().to_vec())
    }

    #[test]
    fn json_tensors() {
        let ok = Ok((f32s(&[1.0, 2.5]), i64s(&[3, -4]), 1));
        check(
            r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2.5]},{"name":"ids","shape":[1,2],"datatype":"INT64","data":[3,-4]}]}"#,
            b"",
            ok.clone(),
        );
        // Nested data, inputs in any order, unknown fields ignored.
        check(
            r#"{"id":"a","extra":1,"inputs":[{"name":"ids","shape":[1,2],"datatype":"INT64","data":[[3,-4]]},{"name":"x","shape":[1,2],"datatype":"FP32","data":[[1.0,2.5]]}]}"#,
            b"",
            ok,
        );
        check(
            r#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2,3,4]},{"name":"ids","shape":[2,2],"datatype":"INT64","data":[1,2,3,4.0]}]}"#,
            b"",
            Ok((f32s(&[1.0, 2.0, 3.0, 4.0]), i64s(&[1, 2, 3, 4]), 2)),
        );
    }

    #[test]
    fn binary_tensors() {
        let json = r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}},{"name":"ids","shape":[1,2],"datatype":"INT64","parameters":{"binary_data_size":16}}]}"#;
        let mut bin = f32s(&[1.0, 2.0]);
        bin.extend(i64s(&[7, 8]));
        check(json, &bin, Ok((f32s(&[1.0, 2.0]), i64s(&[7, 8]), 1)));
        check(json, &bin[..20], Err("binary data is truncated"));
        let mut long = bin.clone();
        long.push(0);
        check(
            json,
            &long,
            Err("1 bytes of binary data after the JSON header are not claimed"),
        );
        // Mixed: one binary, one JSON.
        let json = r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]},{"name":"ids","shape":[1,2],"datatype":"INT64","parameters":{"binary_data_size":16}}]}"#;
        check(
            json,
            &i64s(&[7, 8]),
            Ok((f32s(&[1.0, 2.0]), i64s(&[7, 8]), 1)),
        );
        check(json, &i64s(&[7]), Err("binary data is truncated"));
    }

    /// Variable dims: within the profile's bounds, else a 400 naming the bound; inputs that
    /// share a named dimension agree, else a 400 naming both.
    #[test]
    fn variable_dims() {
        let cfg = RuntimeConfig::from_toml_str(
            &crate::fixtures::decoder_model_toml("INT64", false).replace(
                "dims = [-1, 2]\n[[inputs]]\nname = \"ids\"\ndatatype = \"INT64\"\ndims = [-1, 2]",
                "dims = [-1, -1, 2]\nprofile = { min = [2, 2], opt = [3, 2], max = [4, 2] }\ndim_names = [\"seq\", \"\"]\n[[inputs]]\nname = \"ids\"\ndatatype = \"INT64\"\ndims = [-1, -1]\nprofile = { min = [1], opt = [3], max = [4] }\ndim_names = [\"seq\"]",
            ),
        )
        .unwrap();
        let req = |xs: usize, ids: usize| {
            format!(
                r#"{{"inputs":[{{"name":"x","shape":[1,{xs},2],"datatype":"FP32","data":{:?}}},{{"name":"ids","shape":[1,{ids}],"datatype":"INT64","data":{:?}}}]}}"#,
                vec![0.5f32; xs * 2],
                vec![1i64; ids]
            )
        };
        let decode = |j: String| decode_request(&cfg, None, &Bytes::from(j));
        for n in [2, 3, 4] {
            let r = decode(req(n, n)).unwrap();
            assert_eq!(r.inputs[0].shape, vec![1, n, 2]);
            assert_eq!(r.inputs[1].shape, vec![1, n]);
        }
        let msg = |r: Result<InferRequest, ApiError>| match r {
            Err(ApiError::BadRequest(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            msg(decode(req(5, 5))),
            "input \"x\": shape [1, 5, 2]: dimension 1 (\"seq\") is 5, outside the model's bounds 2..=4"
        );
        assert_eq!(
            msg(decode(req(1, 1))),
            "input \"x\": shape [1, 1, 2]: dimension 1 (\"seq\") is 1, outside the model's bounds 2..=4"
        );
        assert_eq!(
            msg(decode(req(3, 2))),
            "inputs \"x\" and \"ids\" disagree on dimension \"seq\": 3 and 2"
        );
        // A fixed dimension after a variable one is still checked.
        assert!(msg(decode(req(3, 3).replace("[1,3,2]", "[1,3,3]"))).contains("does not match"));
        // Raw binary needs fixed dims.
        let one = RuntimeConfig {
            inputs: vec![cfg.inputs[1].clone()],
            ..cfg.clone()
        };
        assert!(
            msg(decode_request(&one, Some(0), &Bytes::from(vec![0u8; 8])))
                .contains("needs fixed dims")
        );
    }

    #[test]
    fn rejects() {
        let x = r#"{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}"#;
        let ids = r#"{"name":"ids","shape":[1,2],"datatype":"INT64","data":[1,2]}"#;
        let req = |a: &str, b: &str| format!(r#"{{"inputs":[{a},{b}]}}"#);
        check("{", b"", Err("malformed request JSON"));
        check("[]", b"", Err("malformed request JSON"));
        check(
            &format!(r#"{{"inputs":[{x}]}}"#),
            b"",
            Err("missing input \"ids\""),
        );
        check(&req(x, x), b"", Err("input \"x\" is given twice"));
        check(
            &req(x, &ids.replace("ids", "idz")),
            b"",
            Err("unknown input \"idz\""),
        );
        check(
            &req(&x.replace("FP32", "FP64"), ids),
            b"",
            Err("datatype FP64 does not match the model's FP32"),
        );
        check(
            &req(&x.replace("FP32", "FLOAT"), ids),
            b"",
            Err("unknown datatype \"FLOAT\""),
        );
        check(
            &req(&x.replace("[1,2],", "[1,3],"), ids),
            b"",
            Err("shape [1, 3] does not match the model's [-1, 2]"),
        );
        check(
            &req(&x.replace("[1,2],", "[2],"), ids),
            b"",
            Err("shape [2] does not match"),
        );
        check(
            &req(&x.replace("[1,2],", "[5,2],"), ids),
            b"",
            Err("more than max_batch_size 4"),
        );
        check(
            &req(&x.replace("[1,2],", "[0,2],"), ids),
            b"",
            Err("has no rows"),
        );
        check(
            &req(&x.replace("[1,2],", "[-1,2],"), ids),
            b"",
            Err("malformed request JSON"),
        );
        check(
            &req(&x.replace("[1,2]}", "[1]}"), ids),
            b"",
            Err("\"data\" has 1 elements but shape [1, 2] needs 2"),
        );
        check(
            &req(&x.replace("[1,2]}", "[1,2,3]}"), ids),
            b"",
            Err("more than the 2 elements"),
        );
        check(
            &req(&x.replace("[1,2]}", "[1,\"a\"]}"), ids),
            b"",
            Err("a string is not a FP32 element"),
        );
        check(
            &req(x, &ids.replace("[1,2]}", "[1,2.5]}")),
            b"",
            Err("2.5 is not a INT64 element"),
        );
        check(
            &req(x, &ids.replace("[1,2]}", "[1,true]}")),
            b"",
            Err("a boolean is not a INT64 element"),
        );
        check(
            &req(x, &ids.replace("[1,2]}", "[1,1e30]}")),
            b"",
            Err("is not a INT64 element"),
        );
        check(
            &req(x, &ids.replace("[1,2]}", "[1,{}]}")),
            b"",
            Err("bad \"data\""),
        );
        check(
            &req(x, &ids.replace(",\"data\":[1,2]", "")),
            b"",
            Err("has neither \"data\" nor binary_data_size"),
        );
        check(
            &req(
                &x.replace("[1,2],", "[1,2],\"parameters\":{\"binary_data_size\":-1},"),
                ids,
            ),
            b"",
            Err("binary_data_size\" must be a non-negative integer"),
        );
        let two = r#"{"name":"ids","shape":[2,2],"datatype":"INT64","data":[1,2,3,4]}"#;
        check(
            &req(x, two),
            b"",
            Err("inputs disagree on the batch dimension"),
        );
        check(
            &format!(r#"{{"parameters":{{"timeout":"soon"}},"inputs":[{x},{ids}]}}"#),
            b"",
            Err("\"timeout\" must be a non-negative integer"),
        );
        check(
            &format!(r#"{{"outputs":[{{"name":"w"}}],"inputs":[{x},{ids}]}}"#),
            b"",
            Err("unknown output \"w\""),
        );
    }

    #[test]
    fn header_length_and_raw_binary() {
        let c = cfg();
        assert!(
            matches!(decode_request(&c, Some(100), &Bytes::from_static(b"{}")), Err(ApiError::BadRequest(m)) if m.contains("body has only 2 bytes"))
        );
        assert!(
            matches!(decode_request(&c, Some(0), &Bytes::from_static(b"abc")), Err(ApiError::BadRequest(m)) if m.contains("exactly one input"))
        );
        assert!(parse_header_length(b"12").is_ok());
        assert!(parse_header_length(b"-1").is_err());
    }

    #[test]
    fn dtypes_from_json() {
        type Case<'a> = (DataType, &'a str, Result<Vec<u8>, &'a str>);
        let cases: &[Case] = &[
            (DataType::Bool, "[true,false]", Ok(vec![1, 0])),
            (DataType::U8, "[0,255]", Ok(vec![0, 255])),
            (
                DataType::U8,
                "[0,256]",
                Err("256 is out of range for UINT8"),
            ),
            (DataType::I8, "[-128,127]", Ok(vec![0x80, 0x7f])),
            (DataType::U16, "[1,2]", Ok(vec![1, 0, 2, 0])),
            (DataType::F16, "[1,0.5]", Ok(vec![0, 0x3c, 0, 0x38])),
            (DataType::BF16, "[1,-2]", Ok(vec![0x80, 0x3f, 0, 0xc0])),
            (
                DataType::F64,
                "[1,0.5]",
                Ok([1f64.to_le_bytes(), 0.5f64.to_le_bytes()].concat()),
            ),
            (
                DataType::U64,
                "[18446744073709551615,0]",
                Ok([u64::MAX.to_le_bytes(), [0; 8]].concat()),
            ),
            (
                DataType::Bytes,
                r#"["ab",""]"#,
                Ok(b"\x02\0\0\0ab\0\0\0\0".to_vec()),
            ),
            (
                DataType::Bytes,
                "[1,2]",
                Err("a number is not a BYTES element"),
            ),
        ];
        for (dtype, data, want) in cases {
            let mut out = Vec::new();
            let mut count = 0;
            let mut de = serde_json::Deserializer::from_str(data);
            let got = Flat {
                dtype: *dtype,
                out: &mut out,
                count: &mut count,
                limit: 2,
            }
            .deserialize(&mut de)
            .map(|()| out)
            .map_err(|e| e.to_string());
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(&g, w, "{dtype} {data}"),
                (Err(g), Err(w)) => assert!(g.contains(w), "{g:?} lacks {w:?}"),
                (g, w) => panic!("{dtype} {data}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn encode_json_and_binary() {
        let c = cfg();
        let y = Tensor {
            dtype: DataType::F32,
            shape: vec![1, 2],
            data: Bytes::from(f32s(&[0.5, 1.0])),
        };
        let z = Tensor {
            dtype: DataType::I64,
            shape: vec![1, 1],
            data: Bytes::from(i64s(&[-3])),
        };
        let (body, header) = encode_response(
            &c,
            Some("r1"),
            &[
                (
                    RequestedOutput {
                        index: 0,
                        binary: false,
                        classification: None,
                    },
                    &y,
                ),
                (
                    RequestedOutput {
                        index: 1,
                        binary: false,
                        classification: None,
                    },
                    &z,
                ),
            ],
        );
        assert_eq!(header, None);
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"model_name":"m","model_version":"1","id":"r1","outputs":[{"name":"y","datatype":"FP32","shape":[1,2],"data":[0.5,1.0]},{"name":"z","datatype":"INT64","shape":[1,1],"data":[-3]}]}"#
        );
        let (body, header) = encode_response(
            &c,
            None,
            &[(
                RequestedOutput {
                    index: 0,
                    binary: true,
                    classification: None,
                },
                &y,
            )],
        );
        let h = header.unwrap();
        assert_eq!(
            std::str::from_utf8(&body[..h]).unwrap(),
            r#"{"model_name":"m","model_version":"1","outputs":[{"name":"y","datatype":"FP32","shape":[1,2],"parameters":{"binary_data_size":8}}]}"#
        );
        assert_eq!(&body[h..], &f32s(&[0.5, 1.0])[..]);
    }

    /// Deterministic mutation test: every single-byte change, truncation and duplication of
    /// valid requests decodes to `Ok` or a 400, never a panic or another error.
    #[test]
    fn mutations_never_panic() {
        let json = r#"{"id":"q","parameters":{"timeout":5,"binary_data_output":true},"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}},{"name":"ids","shape":[1,2],"datatype":"INT64","data":[[1,2]]}],"outputs":[{"name":"y","parameters":{"binary_data":false}}]}"#;
        let mut body = json.as_bytes().to_vec();
        body.extend(f32s(&[1.0, 2.0]));
        let c = cfg();
        let try_one = |b: Vec<u8>, h: Option<usize>| match decode_request(&c, h, &Bytes::from(b)) {
            Ok(_) | Err(ApiError::BadRequest(_)) => {}
            Err(e) => panic!("unexpected {e:?}"),
        };
        let replacements = [
            b'0', b'9', b'-', b'"', b'[', b']', b'{', b'}', b',', b':', 0u8, 0xff, b'e', b'.',
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for i in 0..body.len() {
            for &r in &replacements {
                let mut m = body.clone();
                m[i] = r;
                try_one(m, Some(json.len()));
            }
            try_one(body[..i].to_vec(), Some(json.len()));
            try_one(body[..i].to_vec(), None);
            let mut dup = body.clone();
            dup.insert(i, body[i]);
            try_one(dup, Some(json.len()));
            // A few pseudo-random header lengths as well.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            try_one(
                body.clone(),
                Some((state % (body.len() as u64 + 2)) as usize),
            );
        }
    }

    #[test]
    fn classification_is_each_rows_largest_as_triton_writes_them() {
        let strings = |t: &Tensor| -> Vec<String> {
            let mut out = Vec::new();
            let mut rest = &t.data[..];
            while rest.len() >= 4 {
                let n = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
                out.push(String::from_utf8(rest[4..4 + n].to_vec()).unwrap());
                rest = &rest[4 + n..];
            }
            out
        };
        let f32s =
            |v: &[f32]| Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
        // Two rows of four classes: largest first, ties by index, NaN last.
        let t = Tensor {
            dtype: DataType::F32,
            shape: vec![2, 4],
            data: f32s(&[0.25, 0.5, 0.5, -1.0, f32::NAN, 2.0, f32::NEG_INFINITY, 1e-7]),
        };
        let c = classify(&t, 3, None);
        assert_eq!((c.dtype, c.shape.clone()), (DataType::Bytes, vec![2, 3]));
        assert_eq!(
            strings(&c),
            [
                "0.500000:1",
                "0.500000:2",
                "0.250000:0",
                "2.000000:1",
                "0.000000:3",
                "-inf:2"
            ]
        );
        // More than the classes: every class; labels when there is one per class.
        let labels: Vec<String> = ["cat", "dog", "eel", "fox"].map(String::from).to_vec();
        let c = classify(&t, 9, Some(&labels));
        assert_eq!(c.shape, vec![2, 4]);
        assert_eq!(strings(&c)[..2], ["0.500000:1:dog", "0.500000:2:eel"]);
        assert_eq!(strings(&c)[7], "nan:0:cat");
        let c = classify(&t, 1, Some(&labels[..3]));
        assert_eq!(strings(&c), ["0.500000:1", "2.000000:1"]);
        // Integers as integers.
        let t = Tensor {
            dtype: DataType::I64,
            shape: vec![1, 3],
            data: Bytes::from(
                [-5i64, 7, i64::MAX]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        };
        assert_eq!(
            strings(&classify(&t, 2, None)),
            [format!("{}:2", i64::MAX), "7:1".into()]
        );
        // The count's bounds.
        assert_eq!(classification_count(None, "").ok(), Some(None));
        assert_eq!(classification_count(Some(0), "").ok(), Some(None));
        assert_eq!(
            classification_count(Some(65536), "").ok(),
            Some(Some(65536))
        );
        assert!(classification_count(Some(65537), "").is_err());
    }
}
