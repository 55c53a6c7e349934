//! Warm-up: before the server reports ready, every backend instance runs every planned batch
//! size (`RuntimeConfig::warmup_batch_sizes`) with dtype-valid data (finite numbers in range,
//! 0/1 booleans, short strings; never raw random bytes, which would make NaNs) and the
//! outputs are checked against the config's datatypes and shapes.

use crate::backend::Backend;
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::{DataType, RuntimeConfig};

/// Deterministic, valid inputs for a batch of `rows` rows.
pub fn sample(cfg: &RuntimeConfig, rows: usize) -> Vec<Tensor> {
    cfg.inputs
        .iter()
        .map(|spec| {
            let mut shape = vec![rows];
            shape.extend(spec.row_dims());
            let n: usize = shape.iter().product();
            let mut data = Vec::with_capacity(n * spec.datatype.size().unwrap_or(8));
            for i in 0..n {
                let small = (i % 7) as u8;
                let unit = (i % 255) as f64 / 255.0;
                match spec.datatype {
                    DataType::Bool => data.push(small & 1),
                    DataType::U8 | DataType::I8 => data.push(small),
                    DataType::U16 | DataType::I16 => data.extend(u16::from(small).to_le_bytes()),
                    DataType::U32 | DataType::I32 => data.extend(u32::from(small).to_le_bytes()),
                    DataType::U64 | DataType::I64 => data.extend(u64::from(small).to_le_bytes()),
                    DataType::F16 => data.extend(half::f16::from_f64(unit).to_le_bytes()),
                    DataType::BF16 => data.extend(half::bf16::from_f64(unit).to_le_bytes()),
                    DataType::F32 => data.extend((unit as f32).to_le_bytes()),
                    DataType::F64 => data.extend(unit.to_le_bytes()),
                    DataType::Bytes => {
                        data.extend(4u32.to_le_bytes());
                        data.extend(b"warm");
                    }
                }
            }
            Tensor {
                dtype: spec.datatype,
                shape,
                data: Bytes::from(data),
            }
        })
        .collect()
}

/// Runs one warm-up sample and checks its outputs; the error names what was wrong.
pub fn run(cfg: &RuntimeConfig, backend: &mut dyn Backend, rows: usize) -> Result<(), String> {
    let outputs = backend.execute(&sample(cfg, rows))?;
    if outputs.len() != cfg.outputs.len() {
        return Err(format!(
            "the engine returned {} outputs, runtime.toml lists {}",
            outputs.len(),
            cfg.outputs.len()
        ));
    }
    for (o, spec) in outputs.iter().zip(&cfg.outputs) {
        let mut want = vec![rows];
        want.extend(spec.row_dims());
        if o.dtype != spec.datatype || o.shape != want {
            return Err(format!(
                "output {:?} is {} {:?}, runtime.toml says {} {:?}",
                spec.name, o.dtype, o.shape, spec.datatype, want
            ));
        }
    }
    Ok(())
}
