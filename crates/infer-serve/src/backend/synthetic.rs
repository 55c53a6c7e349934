//! A model-free engine for tests and benchmarks of the batcher (cargo feature `synthetic`,
//! never in default builds): a batch of `b` rows sleeps `base_ms + per_row_ms · b` and returns
//! deterministic outputs: element `j` of output row `r` is `first(r) + j`, where `first(r)` is
//! the first element of row `r` of the first input (so tests can see that rows come back to
//! the request they came from).

use super::{Backend, Engine};
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::{DataType, RuntimeConfig, TensorSpec};
use std::time::Duration;

pub struct SyntheticEngine {
    base_ms: f64,
    per_row_ms: f64,
    outputs: Vec<TensorSpec>,
}

impl SyntheticEngine {
    pub fn new(cfg: &RuntimeConfig) -> Result<SyntheticEngine, String> {
        let s = cfg
            .engine
            .synthetic
            .as_ref()
            .ok_or("engine.synthetic is missing")?;
        Ok(SyntheticEngine {
            base_ms: s.base_ms,
            per_row_ms: s.per_row_ms,
            outputs: cfg.outputs.clone(),
        })
    }
}

impl Engine for SyntheticEngine {
    fn instance(&self) -> Result<Box<dyn Backend>, String> {
        Ok(Box::new(SyntheticEngine {
            base_ms: self.base_ms,
            per_row_ms: self.per_row_ms,
            outputs: self.outputs.clone(),
        }))
    }
}

/// The first element of each row of `t`, as f64 (0 for BYTES).
fn firsts(t: &Tensor) -> Vec<f64> {
    let rows = t.rows();
    let Some(size) = t.dtype.size() else {
        return vec![0.0; rows];
    };
    let per_row = t.shape.iter().skip(1).product::<usize>() * size;
    (0..rows)
        .map(|r| {
            let b = t.data.get(r * per_row..r * per_row + size).unwrap_or(&[]);
            let mut a = [0u8; 8];
            a[..b.len()].copy_from_slice(b);
            match t.dtype {
                DataType::F32 => f64::from(f32::from_le_bytes([a[0], a[1], a[2], a[3]])),
                DataType::F64 => f64::from_le_bytes(a),
                DataType::F16 => f64::from(half::f16::from_le_bytes([a[0], a[1]])),
                DataType::BF16 => f64::from(half::bf16::from_le_bytes([a[0], a[1]])),
                DataType::I8 => f64::from(a[0] as i8),
                DataType::I16 => f64::from(i16::from_le_bytes([a[0], a[1]])),
                DataType::I32 => f64::from(i32::from_le_bytes([a[0], a[1], a[2], a[3]])),
                DataType::I64 => i64::from_le_bytes(a) as f64,
                _ => u64::from_le_bytes(a) as f64,
            }
        })
        .collect()
}

fn push(out: &mut Vec<u8>, dtype: DataType, v: f64) {
    match dtype {
        DataType::Bool => out.push(u8::from(v != 0.0)),
        DataType::U8 => out.push(v as u8),
        DataType::I8 => out.push(v as i8 as u8),
        DataType::U16 => out.extend((v as u16).to_le_bytes()),
        DataType::I16 => out.extend((v as i16).to_le_bytes()),
        DataType::U32 => out.extend((v as u32).to_le_bytes()),
        DataType::I32 => out.extend((v as i32).to_le_bytes()),
        DataType::U64 => out.extend((v as u64).to_le_bytes()),
        DataType::I64 => out.extend((v as i64).to_le_bytes()),
        DataType::F16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
        DataType::BF16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
        DataType::F32 => out.extend((v as f32).to_le_bytes()),
        DataType::F64 => out.extend(v.to_le_bytes()),
        DataType::Bytes => {
            let s = v.to_string();
            out.extend((s.len() as u32).to_le_bytes());
            out.extend(s.as_bytes());
        }
    }
}

impl Backend for SyntheticEngine {
    fn execute(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
        let rows = inputs.first().map(Tensor::rows).unwrap_or(0);
        let ms = self.base_ms + self.per_row_ms * rows as f64;
        std::thread::sleep(Duration::from_secs_f64(ms / 1e3));
        let firsts = inputs.first().map(firsts).unwrap_or_default();
        Ok(self
            .outputs
            .iter()
            .map(|spec| {
                let per_row = spec.row_elements();
                let mut data = Vec::new();
                for first in &firsts {
                    for j in 0..per_row {
                        push(&mut data, spec.datatype, first + j as f64);
                    }
                }
                let mut shape = vec![rows];
                shape.extend(spec.row_dims());
                Tensor {
                    dtype: spec.datatype,
                    shape,
                    data: Bytes::from(data),
                }
            })
            .collect())
    }
}
