//! A model's signature: the tensors one side of the runtime sees, and the one check of a
//! request's tensors against them, which the HTTP and gRPC decoders both run.
//!
//! A model has two: the **served** signature, what a request carries and what metadata shows,
//! and the **engine**'s, what the backend takes. Today every model serves its engine's
//! tensors as they are, so both are `runtime.toml`'s `[[inputs]]` and `[[outputs]]`
//! ([`Signature::from`] a config); a model with a pre-processing step in front of its engine
//! (a tokenizer: strings served, token tensors to the engine) gets a served signature of its
//! own from its [`crate::model::Model`] slot, and the decoders, metadata and response
//! encoders follow it without a change.
//!
//! [`Signature`] is a borrowed view (copied freely, no allocation): the slot owns the specs.

use crate::error::ApiError;
use crate::tensor::Tensor;
use crate::v2::RequestedOutput;
use bytes::Bytes;
use infer_spec::runtime::ModelSection;
use infer_spec::{DataType, RuntimeConfig, TensorSpec};

/// The tensors of one side of a model, with the model's name and version (responses carry
/// them) and the rows a request may have.
#[derive(Debug, Clone, Copy)]
pub struct Signature<'a> {
    pub model: &'a ModelSection,
    pub inputs: &'a [TensorSpec],
    pub outputs: &'a [TensorSpec],
    /// The most rows one request may carry: `batching.max_batch_size`, or for a text or image
    /// model, whose rows are items of the queue, its `max_client_batch_size`.
    pub max_batch_size: u32,
    /// The key that bound is, as errors name it.
    pub rows_key: &'static str,
}

impl<'a> From<&'a RuntimeConfig> for Signature<'a> {
    /// The engine's signature of `runtime.toml`, which is also what a model without a
    /// pre-processing step serves.
    fn from(cfg: &'a RuntimeConfig) -> Signature<'a> {
        Signature {
            model: &cfg.model,
            inputs: &cfg.inputs,
            outputs: &cfg.outputs,
            max_batch_size: cfg.batching.max_batch_size,
            rows_key: "max_batch_size",
        }
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// An input a request declares, checked: its place in the signature, datatype and shape, and
/// the `input "name": ` prefix every later message about it starts with.
#[derive(Debug)]
pub struct Declared {
    pub index: usize,
    pub dtype: DataType,
    pub shape: Vec<usize>,
    pub at: String,
}

impl Declared {
    /// Its element count (the shape is bounded, so the product fits).
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A request's inputs while a decoder reads them: each declared once, then given its bytes.
/// [`Inputs::finish`] returns them in the signature's order.
pub struct Inputs<'a> {
    sig: Signature<'a>,
    slots: Vec<Option<Tensor>>,
}

impl<'a> Signature<'a> {
    /// Checks a model name and (optional, empty: any) version against this model; the same
    /// messages as the HTTP routes.
    pub fn check_model(&self, name: &str, version: &str) -> Result<(), ApiError> {
        if name != self.model.name {
            return Err(ApiError::NotFound(format!("unknown model {name:?}")));
        }
        if !version.is_empty() && version != self.model.version {
            return Err(ApiError::NotFound(format!(
                "unknown version {version:?} of model {name:?}"
            )));
        }
        Ok(())
    }

    /// Starts reading a request's inputs.
    pub fn request(self) -> Inputs<'a> {
        Inputs {
            sig: self,
            slots: vec![None; self.inputs.len()],
        }
    }

    /// A requested output by name, checked: known, not requested twice (`chosen` so far),
    /// and, asked for as a classification, of a numeric datatype. Returns its index.
    pub fn output(
        &self,
        name: &str,
        classification: Option<u32>,
        chosen: &[RequestedOutput],
    ) -> Result<usize, ApiError> {
        let index = self
            .outputs
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| {
                let known: Vec<&str> = self.outputs.iter().map(|s| s.name.as_str()).collect();
                bad(format!(
                    "unknown output {name:?} (the model's outputs are {known:?})"
                ))
            })?;
        let dtype = self.outputs[index].datatype;
        if classification.is_some() && matches!(dtype, DataType::Bool | DataType::Bytes) {
            return Err(bad(format!(
                "output {name:?}: classification needs numbers, the output is {dtype}"
            )));
        }
        if chosen.iter().any(|r| r.index == index) {
            return Err(bad(format!("output {name:?}: requested twice")));
        }
        Ok(index)
    }

    /// Every output, in the signature's order (a request that names none).
    pub fn all_outputs(&self, binary: bool) -> Vec<RequestedOutput> {
        (0..self.outputs.len())
            .map(|index| RequestedOutput {
                index,
                binary,
                classification: None,
            })
            .collect()
    }

    /// Checks a request's shape against the input's spec: as many dimensions, at least one
    /// row and at most `max_batch_size`, fixed dimensions equal, variable ones within their
    /// profile's bounds.
    pub fn check_shape(&self, spec: &TensorSpec, shape: &[u64]) -> Result<Vec<usize>, String> {
        let mismatch = || format!("shape {shape:?} does not match the model's {:?}", spec.dims);
        if shape.len() != spec.dims.len() {
            return Err(mismatch());
        }
        let rows = shape.first().copied().unwrap_or(0);
        if rows == 0 {
            return Err(format!("shape {shape:?} has no rows"));
        }
        let max = u64::from(self.max_batch_size);
        if rows > max {
            return Err(format!(
                "shape {shape:?} has {rows} rows, more than {} {max}",
                self.rows_key
            ));
        }
        for (axis, (&got, &want)) in shape.iter().zip(&spec.dims).enumerate().skip(1) {
            if want != -1 {
                if i64::try_from(got).ok() != Some(want) {
                    return Err(mismatch());
                }
                continue;
            }
            let Some((min, max)) = spec.bounds(axis) else {
                return Err(mismatch());
            };
            let got_i = i64::try_from(got).unwrap_or(i64::MAX);
            if got_i < min || got_i > max {
                let name = spec
                    .dim_name(axis)
                    .map(|n| format!(" ({n:?})"))
                    .unwrap_or_default();
                return Err(format!(
                    "shape {shape:?}: dimension {axis}{name} is {got}, outside the model's bounds {min}..={max}"
                ));
            }
        }
        // All dimensions are now bounded by the config (rows by max_batch_size), so the
        // product fits; `checked` keeps it total anyway.
        shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| mismatch()))
            .collect::<Result<Vec<usize>, String>>()
            .and_then(|s| {
                s.iter()
                    .try_fold(1usize, |a, &d| a.checked_mul(d))
                    .map(|_| s)
                    .ok_or_else(mismatch)
            })
    }

    /// Inputs whose dimensions share a name (`dim_names`, from the model's `dim_param`) must
    /// give them the same size: a 400 names both inputs, the dimension and the two sizes.
    pub fn check_shared_dims(&self, inputs: &[Tensor]) -> Result<(), ApiError> {
        let mut seen: Vec<(&str, &str, usize)> = Vec::new();
        for (spec, t) in self.inputs.iter().zip(inputs) {
            for (axis, &size) in t.shape.iter().enumerate().skip(1) {
                let Some(name) = spec.dim_name(axis) else {
                    continue;
                };
                match seen.iter().find(|(n, _, _)| *n == name) {
                    Some(&(_, other, s)) if s != size => {
                        let (other, this) = (other, &spec.name);
                        return Err(bad(format!(
                            "inputs {other:?} and {this:?} disagree on dimension {name:?}: {s} and {size}"
                        )));
                    }
                    Some(_) => {}
                    None => seen.push((name, &spec.name, size)),
                }
            }
        }
        Ok(())
    }
}

impl Inputs<'_> {
    /// Checks an input's header as the request gives it (name, V2 datatype name, shape): a
    /// known input, given once, of the model's datatype and an accepted shape. `shape` is
    /// `Err` with the reason when the request's shape is not one at all (gRPC's negative
    /// dimensions); it is reported after the name and datatype checks.
    pub fn declare(
        &self,
        name: &str,
        datatype: &str,
        shape: Result<&[u64], String>,
    ) -> Result<Declared, ApiError> {
        let sig = &self.sig;
        let Some(index) = sig.inputs.iter().position(|s| s.name == name) else {
            let known: Vec<&str> = sig.inputs.iter().map(|s| s.name.as_str()).collect();
            return Err(bad(format!(
                "unknown input {name:?} (the model's inputs are {known:?})"
            )));
        };
        if self.slots[index].is_some() {
            return Err(bad(format!("input {name:?} is given twice")));
        }
        let spec = &sig.inputs[index];
        let at = format!("input {name:?}: ");
        let dtype = DataType::parse(datatype)
            .ok_or_else(|| bad(format!("{at}unknown datatype {datatype:?}")))?;
        if dtype != spec.datatype {
            return Err(bad(format!(
                "{at}datatype {dtype} does not match the model's {}",
                spec.datatype
            )));
        }
        let shape = shape
            .and_then(|shape| sig.check_shape(spec, shape))
            .map_err(|m| bad(format!("{at}{m}")))?;
        Ok(Declared {
            index,
            dtype,
            shape,
            at,
        })
    }

    /// Gives a declared input its bytes (already checked against its datatype and shape).
    pub fn set(&mut self, d: Declared, data: Bytes) {
        self.slots[d.index] = Some(Tensor {
            dtype: d.dtype,
            shape: d.shape,
            data,
        });
    }

    /// The inputs in the signature's order, and their rows: every input given, all with the
    /// same number of rows, named dimensions agreeing.
    pub fn finish(self) -> Result<(Vec<Tensor>, usize), ApiError> {
        let mut inputs = Vec::with_capacity(self.slots.len());
        for (slot, spec) in self.slots.into_iter().zip(self.sig.inputs) {
            inputs.push(slot.ok_or_else(|| bad(format!("missing input {:?}", spec.name)))?);
        }
        let rows = inputs.first().map(Tensor::rows).unwrap_or(0);
        if let Some(t) = inputs.iter().find(|t| t.rows() != rows) {
            return Err(bad(format!(
                "inputs disagree on the batch dimension: {rows} and {} rows",
                t.rows()
            )));
        }
        self.sig.check_shared_dims(&inputs)?;
        Ok((inputs, rows))
    }
}

/// Checks the integer inputs that index a table inside the model (`table_rows`) against it:
/// every value in `-rows..rows` (ONNX's range for `Gather`), else a 400 naming the input, the
/// first value out of range, where it is and the bound. Engines read past a table's end
/// otherwise (tract aborts the process). Runs on both protocols' requests, in the core.
pub(crate) fn check_table_rows(specs: &[TensorSpec], inputs: &[Tensor]) -> Result<(), ApiError> {
    for (spec, t) in specs.iter().zip(inputs) {
        let Some(rows) = spec.table_rows else {
            continue;
        };
        let rows = i128::from(rows);
        let size = t.dtype.size().unwrap_or(0);
        if size == 0 {
            continue;
        }
        let value = |b: &[u8]| -> i128 {
            match t.dtype {
                DataType::I8 => i128::from(b[0] as i8),
                DataType::U8 => i128::from(b[0]),
                DataType::I16 => i128::from(i16::from_le_bytes([b[0], b[1]])),
                DataType::U16 => i128::from(u16::from_le_bytes([b[0], b[1]])),
                DataType::I32 => i128::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                DataType::U32 => i128::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                DataType::I64 => i128::from(i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))),
                DataType::U64 => i128::from(u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))),
                _ => 0,
            }
        };
        if let Some((at, v)) = t
            .data
            .chunks_exact(size)
            .map(value)
            .enumerate()
            .find(|&(_, v)| v < -rows || v >= rows)
        {
            return Err(bad(format!(
                "input {:?}: value {v} (element {at}) is outside the model's table of {rows} rows: values must be in {}..={}",
                spec.name,
                -rows,
                rows - 1
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn values_past_a_table_are_refused_naming_the_input_the_value_and_the_bound() {
        let spec = |dtype| TensorSpec {
            name: "input_ids".into(),
            datatype: dtype,
            dims: vec![-1, -1],
            profile: None,
            dim_names: Vec::new(),
            pad: None,
            table_rows: Some(30522),
        };
        let ids = |dtype: DataType, values: &[i64]| Tensor {
            dtype,
            shape: vec![1, values.len()],
            data: Bytes::from(
                values
                    .iter()
                    .flat_map(|&v| match dtype {
                        DataType::I32 => (v as i32).to_le_bytes().to_vec(),
                        _ => v.to_le_bytes().to_vec(),
                    })
                    .collect::<Vec<u8>>(),
            ),
        };
        let ok = ids(DataType::I64, &[101, 30521, 102, -30522]);
        assert!(check_table_rows(&[spec(DataType::I64)], &[ok]).is_ok());
        let e = check_table_rows(
            &[spec(DataType::I64)],
            &[ids(DataType::I64, &[101, 30522, 102])],
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "input \"input_ids\": value 30522 (element 1) is outside the model's table of 30522 rows: values must be in -30522..=30521"
        );
        assert!(
            check_table_rows(&[spec(DataType::I32)], &[ids(DataType::I32, &[-30523])]).is_err()
        );
        // An input without a table is not read.
        let mut free = spec(DataType::I64);
        free.table_rows = None;
        assert!(check_table_rows(&[free], &[ids(DataType::I64, &[i64::MAX])]).is_ok());
    }
}
