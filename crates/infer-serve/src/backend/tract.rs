//! The CPU backend: an ONNX model, or the NNEF archive `infer-build engine` writes from it
//! (already decluttered, with its input facts: it loads faster), run by tract (pure Rust).
//!
//! The model is loaded and optimised once, with a symbolic batch dimension `N` and the fixed
//! non-batch dimensions from `runtime.toml` (tract cannot optimise symbolic sequence lengths on
//! BERT-style graphs, so text models use fixed sequence buckets). Every instance shares the
//! optimised plan and keeps its own execution state.

use super::{Backend, Engine};
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::{DataType, RuntimeConfig};
use std::path::Path;
use std::sync::Arc;
use tract_onnx::prelude::*;

pub struct TractEngine {
    plan: Arc<TypedSimplePlan>,
    outputs: Vec<DataType>,
}

fn datum(dt: DataType) -> Result<DatumType, String> {
    Ok(match dt {
        DataType::Bool => DatumType::Bool,
        DataType::U8 => DatumType::U8,
        DataType::U16 => DatumType::U16,
        DataType::U32 => DatumType::U32,
        DataType::U64 => DatumType::U64,
        DataType::I8 => DatumType::I8,
        DataType::I16 => DatumType::I16,
        DataType::I32 => DatumType::I32,
        DataType::I64 => DatumType::I64,
        DataType::F16 => DatumType::F16,
        DataType::F32 => DatumType::F32,
        DataType::F64 => DatumType::F64,
        DataType::BF16 | DataType::Bytes => {
            return Err(format!(
                "datatype {dt} is not supported by the tract-onnx backend"
            ))
        }
    })
}

impl TractEngine {
    pub fn load(cfg: &RuntimeConfig, path: &Path) -> Result<TractEngine, String> {
        let ctx = |e: TractError| format!("loading {}: {e:#}", path.display());
        let mut model = tract_onnx::onnx().model_for_path(path).map_err(ctx)?;
        let n = model.sym("N");
        for (i, spec) in cfg.inputs.iter().enumerate() {
            let mut dims: TVec<TDim> = tvec![n.clone().into()];
            dims.extend(spec.row_dims().into_iter().map(TDim::from));
            let fact = InferenceFact::dt_shape(datum(spec.datatype)?, dims);
            model = model.with_input_fact(i, fact).map_err(ctx)?;
        }
        for o in &cfg.outputs {
            datum(o.datatype)?;
        }
        let model = model.into_optimized().map_err(ctx)?;
        Self::from_optimized(cfg, path, model)
    }

    /// Load `model.nnef.tar` as written by `infer-build engine` (the builder's
    /// `engine::tract::nnef()`: tract core, resource and ONNX extensions; both sides must agree).
    pub fn load_nnef(cfg: &RuntimeConfig, path: &Path) -> Result<TractEngine, String> {
        use tract_nnef::framework::Nnef;
        let ctx = |e: TractError| format!("loading {}: {e:#}", path.display());
        let file =
            std::fs::File::open(path).map_err(|e| format!("loading {}: {e}", path.display()))?;
        let nnef: Nnef = tract_nnef::nnef().with_tract_resource().with_onnx();
        let model = nnef
            .model_for_read(&mut std::io::BufReader::new(file))
            .map_err(ctx)?
            .into_optimized()
            .map_err(ctx)?;
        Self::from_optimized(cfg, path, model)
    }

    fn from_optimized(
        cfg: &RuntimeConfig,
        path: &Path,
        model: TypedModel,
    ) -> Result<TractEngine, String> {
        let ctx = |e: TractError| format!("loading {}: {e:#}", path.display());
        let outputs = cfg
            .outputs
            .iter()
            .map(|o| datum(o.datatype).map(|_| o.datatype))
            .collect::<Result<Vec<_>, _>>()?;
        if model.inputs.len() != cfg.inputs.len() || model.outputs.len() != cfg.outputs.len() {
            return Err(format!(
                "{}: the model has {} inputs and {} outputs, runtime.toml lists {} and {}",
                path.display(),
                model.inputs.len(),
                model.outputs.len(),
                cfg.inputs.len(),
                cfg.outputs.len()
            ));
        }
        let plan = model.into_runnable().map_err(ctx)?;
        Ok(TractEngine { plan, outputs })
    }
}

impl Engine for TractEngine {
    fn instance(&self) -> Result<Box<dyn Backend>, String> {
        let state = TypedSimpleState::new(&self.plan).map_err(|e| format!("{e:#}"))?;
        Ok(Box::new(TractBackend {
            state,
            outputs: self.outputs.clone(),
        }))
    }
}

struct TractBackend {
    state: TypedSimpleState,
    outputs: Vec<DataType>,
}

/// Little-endian bytes to a tract tensor, without `unsafe`: decode element by element.
fn to_tract(t: &Tensor) -> Result<TValue, String> {
    macro_rules! typed {
        ($ty:ty, $n:expr) => {{
            let v: Vec<$ty> = t
                .data
                .chunks_exact($n)
                .map(|c| <$ty>::from_le_bytes(c.try_into().unwrap_or([0; $n])))
                .collect();
            tract_ndarray::ArrayD::from_shape_vec(t.shape.clone(), v)
                .map_err(|e| e.to_string())?
                .into_tensor()
        }};
    }
    let tensor = match t.dtype {
        DataType::Bool => {
            let v: Vec<bool> = t.data.iter().map(|&b| b != 0).collect();
            tract_ndarray::ArrayD::from_shape_vec(t.shape.clone(), v)
                .map_err(|e| e.to_string())?
                .into_tensor()
        }
        DataType::U8 => typed!(u8, 1),
        DataType::U16 => typed!(u16, 2),
        DataType::U32 => typed!(u32, 4),
        DataType::U64 => typed!(u64, 8),
        DataType::I8 => typed!(i8, 1),
        DataType::I16 => typed!(i16, 2),
        DataType::I32 => typed!(i32, 4),
        DataType::I64 => typed!(i64, 8),
        DataType::F16 => {
            let v: Vec<f16> = t
                .data
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect();
            tract_ndarray::ArrayD::from_shape_vec(t.shape.clone(), v)
                .map_err(|e| e.to_string())?
                .into_tensor()
        }
        DataType::F32 => typed!(f32, 4),
        DataType::F64 => typed!(f64, 8),
        DataType::BF16 | DataType::Bytes => {
            return Err(format!("datatype {} is not supported", t.dtype))
        }
    };
    Ok(tensor.into_tvalue())
}

impl Backend for TractBackend {
    fn execute(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
        let values = inputs
            .iter()
            .map(to_tract)
            .collect::<Result<TVec<_>, _>>()?;
        let outs = self.state.run(values).map_err(|e| format!("{e:#}"))?;
        outs.iter()
            .zip(&self.outputs)
            .map(|(o, &dtype)| {
                let want = datum(dtype)?;
                let o = if o.datum_type() == want {
                    o.clone().into_tensor()
                } else {
                    o.cast_to_dt(want)
                        .map_err(|e| format!("{e:#}"))?
                        .into_owned()
                };
                // x86-64 and aarch64 are little-endian, so tract's plain storage already is the
                // wire format.
                Ok(Tensor {
                    dtype,
                    shape: o.shape().to_vec(),
                    data: Bytes::copy_from_slice(o.as_bytes()),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = include_str!("../../testdata/mlp.runtime.toml");

    fn run(engine: &TractEngine, rows: usize) -> Vec<f32> {
        let x: Vec<u8> = (0..rows * 64)
            .flat_map(|i| ((i % 13) as f32 / 13.0).to_le_bytes())
            .collect();
        let input = Tensor {
            dtype: DataType::F32,
            shape: vec![rows, 64],
            data: Bytes::from(x),
        };
        let out = engine.instance().unwrap().execute(&[input]).unwrap();
        assert_eq!(out[0].shape, vec![rows, 10]);
        out[0]
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// The NNEF archive written as the builder writes it (decluttered typed model, tract core,
    /// resource and ONNX extensions) loads and computes what the ONNX computes.
    #[test]
    fn nnef_archive_serves_like_its_onnx() {
        let cfg = RuntimeConfig::from_toml_str(CFG).unwrap();
        let onnx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/mlp/mlp.onnx");
        let mut model = tract_onnx::onnx().model_for_path(&onnx).unwrap();
        let n = model.sym("N");
        let dims: TVec<TDim> = tvec![n.into(), 64.into()];
        let fact = InferenceFact::dt_shape(f32::datum_type(), dims);
        model = model.with_input_fact(0, fact).unwrap();
        let typed = model.into_typed().unwrap().into_decluttered().unwrap();
        let path =
            std::env::temp_dir().join(format!("infer-serve-nnef-{}.tar", std::process::id()));
        let nnef = tract_nnef::nnef().with_tract_resource().with_onnx();
        nnef.write_to_tar(&typed, std::fs::File::create(&path).unwrap())
            .unwrap();
        let from_nnef = TractEngine::load_nnef(&cfg, &path);
        let _ = std::fs::remove_file(&path);
        let from_nnef = from_nnef.unwrap();
        let from_onnx = TractEngine::load(&cfg, &onnx).unwrap();
        for rows in [1, 3, 8] {
            let (a, b) = (run(&from_nnef, rows), run(&from_onnx, rows));
            assert_eq!(a.len(), rows * 10);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-5, "{a:?}\n{b:?}");
            }
        }
        // Bytes that are not an NNEF archive are a load error, not a panic.
        let bad = std::env::temp_dir().join(format!("infer-serve-bad-{}.tar", std::process::id()));
        std::fs::write(&bad, b"not a tar").unwrap();
        let e = TractEngine::load_nnef(&cfg, &bad);
        let _ = std::fs::remove_file(&bad);
        assert!(e.is_err());
    }
}
