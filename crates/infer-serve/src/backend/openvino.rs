//! The OpenVINO backend (feature `openvino`): an ONNX model compiled at start by OpenVINO's CPU
//! plugin, through `infer-openvino` (OpenVINO's C API, opened at start from `engine.library`,
//! `libopenvino_c.so.<N>` with the rest of OpenVINO's CPU files beside it).
//!
//! Start: [`library`] opens the library and reads its release (a missing file, a foreign
//! library or another release is an error naming the path, exit 1). [`OvEngine::load`] compiles
//! the model once for every instance: one stream per instance (`batching.instances`), each on
//! `engine.threads` threads (decided at start, [`RuntimeConfig::threads`]), and checks its
//! inputs and outputs against `runtime.toml` by name and type. Each instance takes an infer
//! request of its own; requests run on their own streams in parallel and share the weights.
//!
//! OpenVINO handles variable dimensions itself: batches of any shape within the profile run on
//! the same compiled model.

use super::{Backend, Engine, Error, ExecError};
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_openvino::{Compiled, Config, Element, Input, Precision};
use infer_spec::engine::Version;
use infer_spec::{DataType, RuntimeConfig};
use std::path::Path;

/// The OpenVINO library `runtime.toml` names, opened, and its release.
pub(crate) fn library(
    cfg: &RuntimeConfig,
    base: &Path,
) -> Result<(&'static infer_openvino::Library, Version), Error> {
    let rel = cfg
        .engine
        .library
        .as_deref()
        .ok_or_else(|| Error::Library("engine.library is required for openvino".to_owned()))?;
    let p = base.join(rel);
    let path = if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    };
    let lib = infer_openvino::Library::open(&path).map_err(|e| Error::Library(e.to_string()))?;
    let version: Version = lib.release().parse().map_err(|_| {
        Error::Library(format!(
            "{}: OpenVINO reports the malformed version {:?}",
            path.display(),
            lib.version()
        ))
    })?;
    Ok((lib, version))
}

fn element(dt: DataType) -> Result<Element, Error> {
    Ok(match dt {
        DataType::Bool => Element::Bool,
        DataType::U8 => Element::U8,
        DataType::U16 => Element::U16,
        DataType::U32 => Element::U32,
        DataType::U64 => Element::U64,
        DataType::I8 => Element::I8,
        DataType::I16 => Element::I16,
        DataType::I32 => Element::I32,
        DataType::I64 => Element::I64,
        DataType::F16 => Element::F16,
        DataType::BF16 => Element::Bf16,
        DataType::F32 => Element::F32,
        DataType::F64 => Element::F64,
        DataType::Bytes => {
            return Err(Error::Engine(format!(
                "datatype {dt} is not supported by the openvino backend"
            )))
        }
    })
}

/// The compiled model and the tensors `runtime.toml` names, in its order.
pub(crate) struct OvEngine {
    compiled: Compiled,
    inputs: Vec<(String, Element)>,
    outputs: Vec<(String, DataType)>,
}

impl OvEngine {
    /// Compiles `model` for `batching.instances` streams of `engine.threads` threads each (a
    /// config that reaches here without threads gets the rule's count on this node's CPUs), in
    /// `engine.precision` (FP32 when absent).
    pub(crate) fn load(
        cfg: &RuntimeConfig,
        model: &Path,
        lib: &'static infer_openvino::Library,
    ) -> Result<OvEngine, Error> {
        let threads = match cfg.engine.threads {
            Some(t) => t as usize,
            None => cfg.threads(crate::cpus::detect().count, None).0,
        };
        let config = Config {
            streams: cfg.batching.instances.max(1) as usize,
            threads,
            precision: cfg.engine.precision.unwrap_or(Precision::Fp32),
            cache_dir: None,
        };
        let ctx = |e: infer_openvino::Error| {
            Error::Engine(format!(
                "OpenVINO {} cannot load the model {}: {e}",
                lib.release(),
                model.display()
            ))
        };
        let compiled = lib
            .core()
            .map_err(ctx)?
            .compile(model, &config)
            .map_err(ctx)?;
        // OpenVINO computes in BF16 only where the CPU has AVX-512 BF16 or AMX; elsewhere it
        // falls back to FP32: right answers, slower than the build measured (docs/engines.md).
        if config.precision != Precision::Fp32 {
            let got = compiled.inference_precision().map_err(ctx)?;
            if got != Some(config.precision) {
                crate::log::log(
                    "warn",
                    "this CPU cannot compute in the engine's precision: OpenVINO computes in another, slower than the build measured",
                    &[
                        ("precision", serde_json::json!(config.precision.to_string())),
                        (
                            "computes_in",
                            serde_json::json!(got.map_or_else(|| "unknown".to_owned(), |p| p.to_string())),
                        ),
                        ("cpu", serde_json::json!(infer_spec::engine::CpuIsa::detect().name())),
                    ],
                );
            }
        }
        let (model_in, model_out) = compiled.ports().map_err(ctx)?;
        let check = |what: &str,
                     ports: &[infer_openvino::Port],
                     name: &str,
                     dt: DataType|
         -> Result<Element, Error> {
            let want = element(dt)?;
            let port = ports.iter().find(|p| p.name == name).ok_or_else(|| {
                let names: Vec<&str> = ports.iter().map(|p| p.name.as_str()).collect();
                Error::Engine(format!(
                    "{}: the model has no {what} {name:?} (it has {names:?})",
                    model.display()
                ))
            })?;
            match port.element {
                Some(e) if e == want => Ok(want),
                found => Err(Error::Engine(format!(
                    "{}: {what} {name:?} is a tensor of {} in the model, runtime.toml says {dt}",
                    model.display(),
                    found.map_or_else(
                        || "a type infer-serve does not read".to_owned(),
                        |e| { format!("{e:?}") }
                    )
                ))),
            }
        };
        super::check_counts(cfg, model, model_in.len(), model_out.len())?;
        // By name when every name runtime.toml gives is one of the model's (OpenVINO reports
        // one name per tensor, which may be another of its names than the graph's), else by
        // position, as the other backends match them.
        let pick = |ports: &[infer_openvino::Port], specs: &[infer_spec::TensorSpec]| {
            if specs.iter().all(|s| ports.iter().any(|p| p.name == s.name)) {
                specs.iter().map(|s| s.name.clone()).collect::<Vec<_>>()
            } else {
                ports.iter().map(|p| p.name.clone()).collect()
            }
        };
        let inputs = cfg
            .inputs
            .iter()
            .zip(pick(&model_in, &cfg.inputs))
            .map(|(s, name)| {
                let e = check("input", &model_in, &name, s.datatype)?;
                Ok((name, e))
            })
            .collect::<Result<_, Error>>()?;
        let outputs = cfg
            .outputs
            .iter()
            .zip(pick(&model_out, &cfg.outputs))
            .map(|(s, name)| {
                check("output", &model_out, &name, s.datatype)?;
                Ok((name, s.datatype))
            })
            .collect::<Result<_, Error>>()?;
        Ok(OvEngine {
            compiled,
            inputs,
            outputs,
        })
    }
}

impl Engine for OvEngine {
    fn instance(&self) -> Result<Box<dyn Backend>, Error> {
        let request = self
            .compiled
            .request()
            .map_err(|e| Error::Instance(e.to_string()))?;
        Ok(Box::new(OvBackend {
            request,
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
        }))
    }
}

struct OvBackend {
    request: infer_openvino::Request,
    inputs: Vec<(String, Element)>,
    outputs: Vec<(String, DataType)>,
}

impl Backend for OvBackend {
    fn execute(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, ExecError> {
        let shapes: Vec<Vec<i64>> = inputs
            .iter()
            .map(|t| t.shape.iter().map(|&d| d as i64).collect())
            .collect();
        let feed: Vec<Input<'_>> = inputs
            .iter()
            .zip(&self.inputs)
            .zip(&shapes)
            .map(|((t, (name, element)), shape)| Input {
                name,
                element: *element,
                shape,
                data: &t.data,
            })
            .collect();
        let names: Vec<&str> = self.outputs.iter().map(|(n, _)| n.as_str()).collect();
        let outs = self
            .request
            .infer(&feed, &names)
            .map_err(|e| ExecError::Batch(e.to_string()))?;
        Ok(outs
            .into_iter()
            .zip(&self.outputs)
            .map(|(o, (_, dtype))| Tensor {
                dtype: *dtype,
                shape: o
                    .shape
                    .iter()
                    .map(|&d| usize::try_from(d).unwrap_or(0))
                    .collect(),
                data: Bytes::from(o.data),
            })
            .collect())
    }
}
