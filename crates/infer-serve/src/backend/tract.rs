//! The CPU backend: an ONNX model, or the NNEF archive `infer-build engine` writes from it
//! (already decluttered, with its input facts: it loads faster), run by tract (pure Rust).
//!
//! A model whose non-batch dimensions are fixed is loaded and optimised once, with a symbolic
//! batch dimension `N`; every instance shares that plan and keeps its own execution state.
//!
//! A model with variable non-batch dimensions (`-1` with a profile in `runtime.toml`) keeps
//! its parsed ONNX graph and gets one plan per concrete non-batch shape, optimised the first
//! time that shape runs (warm-up runs the profile's `opt`, `min` and `max`): tract optimises
//! concrete shapes far better than symbolic ones and cannot optimise symbolic sequence lengths
//! on BERT-style graphs at all. At most [`MAX_PLANS`] plans are kept (least recently used goes
//! first), and each instance keeps the execution states of its last [`MAX_STATES`] shapes, so
//! memory stays bounded whatever shapes clients send; clients that bucket or pad their
//! inputs to a few sizes never wait for an optimisation after warm-up.

use super::{Backend, Engine, Error, ExecError};
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::{DataType, RuntimeConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tract_onnx::prelude::*;

/// The most per-shape plans a variable-shape model keeps.
pub(crate) const MAX_PLANS: usize = 16;
/// The most per-shape execution states one instance keeps.
pub(crate) const MAX_STATES: usize = 4;

/// The non-batch dimensions of every input: what a per-shape plan is for.
type ShapeKey = Vec<Vec<usize>>;

pub(crate) struct TractEngine {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    outputs: Vec<DataType>,
    inputs: Vec<DatumType>,
    /// Per model input (the graph's order), the index of its runtime.toml input: requests
    /// arrive in runtime.toml's order, which need not be the graph's.
    in_order: Vec<usize>,
    /// Per runtime.toml output, the index of the graph output it is.
    out_order: Vec<usize>,
    /// The one plan of a fixed-shape model.
    fixed: Option<Arc<TypedSimplePlan>>,
    /// The parsed graph of a variable-shape model, and its plans by shape, most recent last.
    template: Option<InferenceModel>,
    plans: Mutex<Vec<(ShapeKey, Arc<TypedSimplePlan>)>>,
}

impl Inner {
    /// The plan for a batch with these non-batch dims: the fixed plan, a cached one, or a new
    /// one optimised now (outside the lock, so other instances keep running).
    fn plan(&self, key: &ShapeKey) -> Result<Arc<TypedSimplePlan>, String> {
        if let Some(p) = &self.fixed {
            return Ok(p.clone());
        }
        let Some(template) = &self.template else {
            return Err("the engine has no plan".to_owned());
        };
        {
            let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = plans.iter().position(|(k, _)| k == key) {
                let entry = plans.remove(i);
                let plan = entry.1.clone();
                plans.push(entry);
                return Ok(plan);
            }
        }
        let ctx = |e: TractError| {
            format!(
                "optimising {} for shape {key:?}: {e:#}",
                self.path.display()
            )
        };
        let mut model = template.clone();
        let n = model.sym("N");
        for (i, &c) in self.in_order.iter().enumerate() {
            let mut shape: TVec<TDim> = tvec![n.clone().into()];
            shape.extend(key[c].iter().map(|&d| TDim::from(d)));
            model = model
                .with_input_fact(i, InferenceFact::dt_shape(self.inputs[c], shape))
                .map_err(ctx)?;
        }
        // The ONNX file's output facts may name symbols the concrete inputs now fix: let
        // tract infer them.
        for i in 0..model.outputs.len() {
            model = model
                .with_output_fact(i, InferenceFact::default())
                .map_err(ctx)?;
        }
        let plan = model
            .into_optimized()
            .and_then(|m| m.into_runnable())
            .map_err(ctx)?;
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if !plans.iter().any(|(k, _)| k == key) {
            if plans.len() >= MAX_PLANS {
                plans.remove(0);
            }
            plans.push((key.clone(), plan.clone()));
        }
        Ok(plan)
    }
}

fn datum(dt: DataType) -> Result<DatumType, Error> {
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
            return Err(Error::Engine(format!(
                "datatype {dt} is not supported by the tract-onnx backend"
            )))
        }
    })
}

impl TractEngine {
    pub(crate) fn load(cfg: &RuntimeConfig, path: &Path) -> Result<TractEngine, Error> {
        let ctx = |e: TractError| Error::Engine(format!("loading {}: {e:#}", path.display()));
        let model = tract_onnx::onnx().model_for_path(path).map_err(ctx)?;
        let inputs = cfg
            .inputs
            .iter()
            .map(|s| datum(s.datatype))
            .collect::<Result<Vec<_>, _>>()?;
        if model.inputs.len() != cfg.inputs.len() || model.outputs.len() != cfg.outputs.len() {
            return Err(count_mismatch(
                cfg,
                path,
                model.inputs.len(),
                model.outputs.len(),
            ));
        }
        let (in_order, out_order) = io_order(cfg, &model);
        if cfg.inputs.iter().any(|s| s.is_variable()) {
            let engine = TractEngine {
                inner: Arc::new(Inner {
                    path: path.to_owned(),
                    outputs: outputs(cfg)?,
                    inputs,
                    in_order,
                    out_order,
                    fixed: None,
                    template: Some(model),
                    plans: Mutex::new(Vec::new()),
                }),
            };
            // Optimise the profile's `opt` shape now: a graph tract cannot run fails at start.
            let opt: ShapeKey = cfg.inputs.iter().map(|s| s.opt_row_dims()).collect();
            engine.inner.plan(&opt).map_err(Error::Engine)?;
            return Ok(engine);
        }
        let fixed = |mut model: InferenceModel| -> Result<TypedModel, Error> {
            let n = model.sym("N");
            for (i, &c) in in_order.iter().enumerate() {
                let mut dims: TVec<TDim> = tvec![n.clone().into()];
                dims.extend(cfg.inputs[c].row_dims().into_iter().map(TDim::from));
                let fact = InferenceFact::dt_shape(inputs[c], dims);
                model = model.with_input_fact(i, fact).map_err(ctx)?;
            }
            model.into_optimized().map_err(ctx)
        };
        let model = match fixed(model) {
            Ok(m) => m,
            // The file's shape hints (`value_info`, output shapes) may name symbols the fixed
            // inputs contradict (an export with dynamic height and width, served at one size):
            // without them tract infers every shape from the inputs, as the builder did.
            Err(first) => tract_onnx::onnx()
                .with_ignore_value_info(true)
                .with_ignore_output_shapes(true)
                .model_for_path(path)
                .map_err(ctx)
                .and_then(fixed)
                .map_err(|_| first)?,
        };
        Self::from_optimized(cfg, path, model, (in_order, out_order))
    }

    /// Load `model.nnef.tar` as written by `infer-build engine` (the builder's
    /// `engine::tract::nnef()`: tract core, resource and ONNX extensions; both sides must agree).
    /// The builder writes NNEF only for models whose non-batch dimensions are fixed.
    pub(crate) fn load_nnef(cfg: &RuntimeConfig, path: &Path) -> Result<TractEngine, Error> {
        use tract_nnef::framework::Nnef;
        if let Some(s) = cfg.inputs.iter().find(|s| s.is_variable()) {
            return Err(Error::Engine(format!(
                "{}: input {:?} has variable dims {:?}; a tract-nnef engine needs fixed ones (ship the ONNX model as tract-onnx)",
                path.display(),
                s.name,
                s.dims
            )));
        }
        let ctx = |e: TractError| Error::Engine(format!("loading {}: {e:#}", path.display()));
        let file = std::fs::File::open(path)
            .map_err(|e| Error::Engine(format!("loading {}: {e}", path.display())))?;
        let nnef: Nnef = tract_nnef::nnef().with_tract_resource().with_onnx();
        let model = nnef
            .model_for_read(&mut std::io::BufReader::new(file))
            .map_err(ctx)?
            .into_optimized()
            .map_err(ctx)?;
        // NNEF keeps the order `infer-build engine` wrote, runtime.toml's own.
        let order = (
            (0..cfg.inputs.len()).collect(),
            (0..cfg.outputs.len()).collect(),
        );
        Self::from_optimized(cfg, path, model, order)
    }

    fn from_optimized(
        cfg: &RuntimeConfig,
        path: &Path,
        model: TypedModel,
        (in_order, out_order): (Vec<usize>, Vec<usize>),
    ) -> Result<TractEngine, Error> {
        let ctx = |e: TractError| Error::Engine(format!("loading {}: {e:#}", path.display()));
        let outputs = outputs(cfg)?;
        if model.inputs.len() != cfg.inputs.len() || model.outputs.len() != cfg.outputs.len() {
            return Err(count_mismatch(
                cfg,
                path,
                model.inputs.len(),
                model.outputs.len(),
            ));
        }
        let inputs = cfg
            .inputs
            .iter()
            .map(|s| datum(s.datatype))
            .collect::<Result<Vec<_>, _>>()?;
        let plan = model.into_runnable().map_err(ctx)?;
        Ok(TractEngine {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                outputs,
                inputs,
                in_order,
                out_order,
                fixed: Some(plan),
                template: None,
                plans: Mutex::new(Vec::new()),
            }),
        })
    }
}

fn outputs(cfg: &RuntimeConfig) -> Result<Vec<DataType>, Error> {
    cfg.outputs
        .iter()
        .map(|o| datum(o.datatype).map(|_| o.datatype))
        .collect()
}

/// Which runtime.toml input feeds each graph input, and which graph output each runtime.toml
/// output is, matched by name; by position when the names do not all match (a runtime.toml
/// that renames the model's tensors).
fn io_order(cfg: &RuntimeConfig, model: &InferenceModel) -> (Vec<usize>, Vec<usize>) {
    let by_name = |names: Vec<String>, want: Vec<&str>| -> Vec<usize> {
        let found: Option<Vec<usize>> = names
            .iter()
            .map(|n| want.iter().position(|w| w == n))
            .collect();
        match found {
            Some(order) if order.len() == want.len() => order,
            _ => (0..want.len()).collect(),
        }
    };
    let graph_inputs: Vec<String> = model
        .inputs
        .iter()
        .map(|o| model.node(o.node).name.clone())
        .collect();
    let in_order = by_name(
        graph_inputs,
        cfg.inputs.iter().map(|s| s.name.as_str()).collect(),
    );
    let graph_outputs: Vec<&str> = model
        .outputs
        .iter()
        .map(|o| {
            model
                .outlet_label(*o)
                .unwrap_or(model.node(o.node).name.as_str())
        })
        .collect();
    // Per runtime.toml output, its graph position.
    let out_order = by_name(
        cfg.outputs.iter().map(|s| s.name.clone()).collect(),
        graph_outputs,
    );
    (in_order, out_order)
}

fn count_mismatch(cfg: &RuntimeConfig, path: &Path, inputs: usize, outputs: usize) -> Error {
    Error::Engine(format!(
        "{}: the model has {inputs} inputs and {outputs} outputs, runtime.toml lists {} and {}",
        path.display(),
        cfg.inputs.len(),
        cfg.outputs.len()
    ))
}

impl Engine for TractEngine {
    fn instance(&self) -> Result<Box<dyn Backend>, Error> {
        Ok(Box::new(TractBackend {
            inner: self.inner.clone(),
            states: Vec::new(),
        }))
    }
}

struct TractBackend {
    inner: Arc<Inner>,
    /// Execution states by shape, most recent last (one entry for a fixed-shape model).
    states: Vec<(ShapeKey, TypedSimpleState)>,
}

impl TractBackend {
    fn state(&mut self, key: ShapeKey) -> Result<&mut TypedSimpleState, String> {
        let key = if self.inner.fixed.is_some() {
            Vec::new()
        } else {
            key
        };
        match self.states.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                let entry = self.states.remove(i);
                self.states.push(entry);
            }
            None => {
                let plan = self.inner.plan(&key)?;
                let state = TypedSimpleState::new(&plan).map_err(|e| format!("{e:#}"))?;
                if self.states.len() >= MAX_STATES {
                    self.states.remove(0);
                }
                self.states.push((key, state));
            }
        }
        match self.states.last_mut() {
            Some((_, state)) => Ok(state),
            None => Err("no execution state".to_owned()),
        }
    }
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
    fn execute(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, ExecError> {
        self.run(inputs).map_err(ExecError::Batch)
    }

    /// The execution states hold the values of a run in progress: a panic mid-run leaves them
    /// as it found them, so they go (the plans, shared and read-only, stay).
    fn recover(&mut self) {
        self.states.clear();
    }
}

impl TractBackend {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
        let values = self
            .inner
            .in_order
            .iter()
            .map(|&c| to_tract(&inputs[c]))
            .collect::<Result<TVec<_>, _>>()?;
        let key: ShapeKey = inputs
            .iter()
            .map(|t| t.shape.get(1..).unwrap_or_default().to_vec())
            .collect();
        let outputs = self.inner.outputs.clone();
        let out_order = self.inner.out_order.clone();
        let outs = self.state(key)?.run(values).map_err(|e| format!("{e:#}"))?;
        out_order
            .iter()
            .map(|&g| {
                outs.get(g)
                    .ok_or_else(|| format!("the model has no output {g}"))
            })
            .zip(&outputs)
            .map(|(o, &dtype)| {
                let o = o?;
                let want = datum(dtype).map_err(|e| e.to_string())?;
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

    /// runtime.toml may list tensors in another order than the graph (the builder writes the
    /// recipe's): inputs are fed and outputs returned by name. `two_io.onnx` computes
    /// `diff = a - b` and `sum = a + b` (made with onnx.helper, graph order a, b / diff, sum).
    #[test]
    fn inputs_and_outputs_follow_their_names_not_their_positions() {
        let cfg = RuntimeConfig::from_toml_str(
            "[model]\nname = \"m\"\n\
             [[inputs]]\nname = \"b\"\ndatatype = \"FP32\"\ndims = [-1, 2]\n\
             [[inputs]]\nname = \"a\"\ndatatype = \"FP32\"\ndims = [-1, 2]\n\
             [[outputs]]\nname = \"sum\"\ndatatype = \"FP32\"\ndims = [-1, 2]\n\
             [[outputs]]\nname = \"diff\"\ndatatype = \"FP32\"\ndims = [-1, 2]\n\
             [engine]\nkind = \"tract-onnx\"\npath = \"two_io.onnx\"\n",
        )
        .unwrap();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/two_io.onnx");
        let engine = TractEngine::load(&cfg, &path).unwrap();
        let tensor = |v: [f32; 2]| Tensor {
            dtype: DataType::F32,
            shape: vec![1, 2],
            data: Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
        };
        // Request order is runtime.toml's: b, then a.
        let out = engine
            .instance()
            .unwrap()
            .execute(&[tensor([1.0, 2.0]), tensor([5.0, 7.0])])
            .unwrap();
        let floats = |t: &Tensor| -> Vec<f32> {
            t.data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        assert_eq!(floats(&out[0]), [6.0, 9.0], "sum");
        assert_eq!(floats(&out[1]), [4.0, 5.0], "diff = a - b");
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
