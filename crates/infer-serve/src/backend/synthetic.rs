//! A model-free engine for tests and benchmarks of the batcher (cargo feature `synthetic`,
//! never in default builds): a batch of `b` rows sleeps `base_ms + per_row_ms · b` (plus
//! `per_token_ms` for each of its `b × l` tokens, `l` the first input's second dimension) and returns
//! deterministic outputs: element `j` of output row `r` is `first(r) + j`, where `first(r)` is
//! the first element of row `r` of the first input (so tests can see that rows come back to
//! the request they came from).
//!
//! Faults for the server's tests, when [`FAULTS_ENV`] asks for them
//! (`batch_error=V,device_lost=W,panic=P`, each part optional): a batch with a row whose first
//! element is `V` fails as an ordinary batch error; one with a row starting with `W` loses the
//! device, as a sticky CUDA error does: that batch and every later one, on every instance, fail
//! with [`ExecError::DeviceLost`]; one with a row starting with `P` panics, as an engine reading
//! past a table does.

use super::{Backend, Engine, Error, ExecError};
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::{DataType, RuntimeConfig, TensorSpec};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// The environment variable that injects faults (see the module's documentation).
pub(crate) const FAULTS_ENV: &str = "INFER_SERVE_SYNTHETIC_FAULTS";

/// The row values that inject a fault.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Faults {
    pub batch_error: Option<f64>,
    pub device_lost: Option<f64>,
    pub panic: Option<f64>,
}

impl Faults {
    /// Parses `batch_error=V,device_lost=W,panic=P` (each part optional; empty: none).
    pub(crate) fn parse(text: &str) -> Result<Faults, String> {
        let mut f = Faults::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{FAULTS_ENV}: `{part}` is not key=value"))?;
            let v: f64 = value
                .trim()
                .parse()
                .map_err(|_| format!("{FAULTS_ENV}: `{value}` is not a number"))?;
            match key.trim() {
                "batch_error" => f.batch_error = Some(v),
                "device_lost" => f.device_lost = Some(v),
                "panic" => f.panic = Some(v),
                k => {
                    return Err(format!(
                        "{FAULTS_ENV}: unknown fault `{k}` (batch_error, device_lost, panic)"
                    ))
                }
            }
        }
        Ok(f)
    }
}

pub(crate) struct SyntheticEngine {
    base_ms: f64,
    per_row_ms: f64,
    per_token_ms: f64,
    outputs: Vec<TensorSpec>,
    faults: Faults,
    /// Shared by every instance: the device is lost for all of them at once.
    lost: Arc<AtomicBool>,
}

impl SyntheticEngine {
    pub(crate) fn new(cfg: &RuntimeConfig) -> Result<SyntheticEngine, Error> {
        let s = cfg
            .engine
            .synthetic
            .as_ref()
            .ok_or_else(|| Error::Engine("engine.synthetic is missing".to_owned()))?;
        let faults = match std::env::var(FAULTS_ENV) {
            Ok(text) => Faults::parse(&text).map_err(Error::Engine)?,
            Err(_) => Faults::default(),
        };
        Ok(SyntheticEngine {
            base_ms: s.base_ms,
            per_row_ms: s.per_row_ms,
            per_token_ms: s.per_token_ms,
            outputs: cfg.outputs.clone(),
            faults,
            lost: Arc::new(AtomicBool::new(false)),
        })
    }
}

impl Engine for SyntheticEngine {
    fn instance(&self) -> Result<Box<dyn Backend>, Error> {
        Ok(Box::new(SyntheticEngine {
            base_ms: self.base_ms,
            per_row_ms: self.per_row_ms,
            per_token_ms: self.per_token_ms,
            outputs: self.outputs.clone(),
            faults: self.faults,
            lost: self.lost.clone(),
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
    fn execute(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, ExecError> {
        let rows = inputs.first().map(Tensor::rows).unwrap_or(0);
        let length = inputs
            .first()
            .and_then(|t| t.shape.get(1))
            .copied()
            .unwrap_or(1);
        let ms = self.base_ms
            + self.per_row_ms * rows as f64
            + self.per_token_ms * (rows * length) as f64;
        std::thread::sleep(Duration::from_secs_f64(ms / 1e3));
        let firsts = inputs.first().map(firsts).unwrap_or_default();
        let has = |v: Option<f64>| v.is_some_and(|v| firsts.contains(&v));
        if has(self.faults.device_lost) {
            self.lost.store(true, Relaxed);
        }
        if self.lost.load(Relaxed) {
            return Err(ExecError::DeviceLost(
                "cuStreamSynchronize failed: CUDA error 700 (an illegal memory access was \
                 encountered; injected by the synthetic engine)"
                    .to_owned(),
            ));
        }
        if has(self.faults.panic) {
            #[allow(
                clippy::panic,
                reason = "the injected fault: an engine that panics, as tract does past a table"
            )]
            {
                panic!("index out of bounds: the synthetic engine panicked (injected)");
            }
        }
        if has(self.faults.batch_error) {
            return Err(ExecError::Batch(
                "the synthetic engine failed this batch (injected)".to_owned(),
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(faults: Faults) -> SyntheticEngine {
        SyntheticEngine {
            base_ms: 0.0,
            per_row_ms: 0.0,
            per_token_ms: 0.0,
            outputs: Vec::new(),
            faults,
            lost: Arc::new(AtomicBool::new(false)),
        }
    }

    fn row(v: f32) -> Vec<Tensor> {
        vec![Tensor {
            dtype: DataType::F32,
            shape: vec![1, 1],
            data: Bytes::from(v.to_le_bytes().to_vec()),
        }]
    }

    #[test]
    fn injected_faults_a_batch_error_passes_a_lost_device_stays() {
        assert_eq!(Faults::parse("").unwrap(), Faults::default());
        let f = Faults::parse("batch_error=-1, device_lost=-2").unwrap();
        assert_eq!((f.batch_error, f.device_lost), (Some(-1.0), Some(-2.0)));
        assert!(Faults::parse("lost=1")
            .unwrap_err()
            .contains("unknown fault"));
        assert!(Faults::parse("device_lost").is_err());
        let e = engine(f);
        let mut a = e.instance().unwrap();
        let mut b = e.instance().unwrap();
        a.execute(&row(1.0)).unwrap();
        assert!(matches!(a.execute(&row(-1.0)), Err(ExecError::Batch(_))));
        a.execute(&row(1.0)).unwrap();
        assert!(matches!(
            a.execute(&row(-2.0)),
            Err(ExecError::DeviceLost(_))
        ));
        // Sticky, and on every instance.
        assert!(matches!(
            a.execute(&row(1.0)),
            Err(ExecError::DeviceLost(_))
        ));
        assert!(matches!(
            b.execute(&row(1.0)),
            Err(ExecError::DeviceLost(_))
        ));
    }
}
