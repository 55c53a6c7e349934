//! [`EngineSpec`]: everything the engine stage needs to know about one target, as plain values.
//!
//! The spec is derived from the recipe and the target's plan row (see [`super::adapt`]); tests
//! build it directly. Deriving the shape profile and checking the inputs are pure.

use std::path::PathBuf;

use infer_spec::engine::{ComputeCapability, HardwareCompat, InputProfile, Precision, Version};

use super::Error;

/// One model input as the recipe declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputSpec {
    pub name: String,
    pub datatype: infer_spec::DataType,
    /// Dimensions, batch first; `-1` is dynamic.
    pub shape: Vec<i64>,
    /// min/opt/max of the dimensions after the batch dimension (fixed ones repeat their size);
    /// required when one of them is dynamic.
    pub profile: Option<DimRanges>,
}

/// min, opt and max sizes of the dimensions after the batch dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DimRanges {
    pub min: Vec<u64>,
    pub opt: Vec<u64>,
    pub max: Vec<u64>,
}

impl InputSpec {
    /// The size of dimension `i` (≥ 1) to use for sample data: its fixed size, else the
    /// profile's opt.
    pub(crate) fn sample_dim(&self, i: usize) -> Option<u64> {
        match self.shape.get(i) {
            Some(&d) if d >= 1 => Some(d as u64),
            Some(_) => self
                .profile
                .as_ref()
                .and_then(|p| p.opt.get(i - 1).copied()),
            None => None,
        }
    }
}

/// INT8 calibration input (TensorRT 8.6 and 10.x only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Calibration {
    /// A ready calibration cache (`TRT-<version>-EntropyCalibration2` text file).
    Cache(PathBuf),
    /// A directory of calibration batches (`*.npy` for single-input models, `*.npz` keyed by
    /// input name otherwise), turned into a cache with Polygraphy before the build.
    Data(PathBuf),
}

/// TensorRT settings of one target, from the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct TrtSpec {
    /// TensorRT version with its build number, e.g. `10.8.0.43`.
    pub tensorrt: Version,
    pub cuda: Version,
    /// The target's compute capability.
    pub sm: ComputeCapability,
    pub driver_floor: Version,
    pub hardware_compat: HardwareCompat,
    /// Build a version-compatible engine without the lean runtime inside
    /// (`--versionCompatible --excludeLeanRuntime`): the image ships the lean runtime.
    pub lean_runtime: bool,
    pub calibration: Option<Calibration>,
    /// `--builderOptimizationLevel` (8.6+), when set.
    pub builder_optimization_level: Option<u8>,
    /// `--memPoolSize=workspace:<MiB>`, when set.
    pub workspace_mib: Option<u64>,
    /// The trtexec program (default `trtexec`, found on PATH).
    pub trtexec: String,
    /// The polygraphy program (default `polygraphy`).
    pub polygraphy: String,
}

impl TrtSpec {
    /// Settings with defaults for everything optional.
    pub fn new(
        tensorrt: Version,
        cuda: Version,
        sm: ComputeCapability,
        driver_floor: Version,
    ) -> TrtSpec {
        TrtSpec {
            tensorrt,
            cuda,
            sm,
            driver_floor,
            hardware_compat: HardwareCompat::None,
            lean_runtime: false,
            calibration: None,
            builder_optimization_level: None,
            workspace_mib: None,
            trtexec: "trtexec".into(),
            polygraphy: "polygraphy".into(),
        }
    }
}

/// What builds a target's engine: the CPU engines (tract, and ONNX Runtime as `engine.cpu` allows)
/// or trtexec with its TensorRT settings. (A spec is built once per target: the size difference
/// is harmless.)
#[allow(
    clippy::large_enum_variant,
    reason = "one value per target, built once: boxing the TensorRT settings buys nothing"
)]
#[derive(Debug, Clone, PartialEq)]
pub enum Toolchain {
    /// tract on the CPU.
    Cpu,
    /// A TensorRT plan built with trtexec.
    Tensorrt(TrtSpec),
}

/// One target's engine build, as values.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSpec {
    /// Model name, for messages.
    pub model: String,
    /// Target id, e.g. `sm89-fp16` or `cpu-fp32`.
    pub target: String,
    pub precision: Precision,
    /// The ONNX file.
    pub onnx: PathBuf,
    /// Inputs in the model's order.
    pub inputs: Vec<InputSpec>,
    /// Largest batch the engine accepts (the `max` of the shape profile).
    pub max_batch: u32,
    /// Batch size the engine is tuned for (the `opt` of the shape profile).
    pub opt_batch: u32,
    /// Batch sizes to profile: T(b) is measured for each. Sorted and deduplicated by
    /// [`EngineSpec::planned_batches`].
    pub batch_sizes: Vec<u32>,
    pub toolchain: Toolchain,
    /// ONNX Runtime as a candidate of a CPU target (`engine.cpu` `auto` or `onnxruntime`, with
    /// the library at hand); `None`: not measured.
    pub onnxruntime: Option<LibraryCandidate>,
    /// OpenVINO as a candidate of a CPU target (`engine.cpu` `auto` or `openvino`, with the
    /// library at hand); `None`: not measured.
    pub openvino: Option<LibraryCandidate>,
    /// `engine.cpu = "tract"`: the ONNX Runtime whose constant folding tract is retried on when
    /// it cannot load the model as it is (see `super::onnxruntime::fold`). Under `auto` and
    /// `onnxruntime` the candidate's library serves.
    pub folding: Option<super::onnxruntime::Folding>,
    /// Convert the ONNX to the target's precision before the engine is built (TensorRT 11:
    /// FP16, INT8 Q/DQ; a `cpu-int8` target: INT8 Q/DQ), gated on accuracy; see
    /// `super::convert`.
    pub convert: Option<super::convert::ConvertSpec>,
    /// A CPU target of a precision beyond FP32 (`cpu-bf16`, `cpu-int8`): the accuracy gate its
    /// engine passes against the same engine on the FP32 model.
    pub gate: Option<Gate>,
}

/// The accuracy gate of a CPU engine that computes the FP32 model in a lower precision.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// `[accuracy.<precision>]` over the defaults.
    pub thresholds: super::accuracy::Thresholds,
    /// `[accuracy] data`: a directory of `*.npy` / `*.npz` batches; generated inputs otherwise.
    pub evaluation: Option<PathBuf>,
}

/// A CPU engine that runs from a native library (ONNX Runtime, OpenVINO) as a candidate of a CPU
/// target.
#[derive(Debug, Clone, PartialEq)]
pub struct LibraryCandidate {
    /// Which engine ([`EngineKind::def`](infer_spec::engine::EngineKind::def) has a library).
    pub kind: infer_spec::engine::EngineKind,
    /// The library it loads, on this machine (the library cache).
    pub library: std::path::PathBuf,
    /// Its version (the matrix row, checked against the wheel's sha256 by the library cache).
    pub version: infer_spec::engine::Version,
    /// The most threads one runtime instance may use (its share of the CPUs); the engine stage
    /// measures the counts `thread_counts` gives up to it. When `given`, the recipe's `[engine] threads`, the
    /// one count measured.
    pub threads: usize,
    /// `threads` is the recipe's `[engine] threads`.
    pub given: bool,
    /// True when the recipe forces this engine (`engine.cpu` names it): no other is tried.
    pub forced: bool,
}

impl LibraryCandidate {
    /// The thread counts the engine stage measures: the recipe's, or [`thread_counts`] up to
    /// the instance's share.
    pub(crate) fn counts(&self) -> Vec<usize> {
        if self.given {
            vec![self.threads.max(1)]
        } else {
            thread_counts(self.threads)
        }
    }

    /// Its title ("ONNX Runtime").
    pub(crate) fn title(&self) -> &'static str {
        self.kind.def().title
    }
}

/// The thread counts measured for an instance that may use `max` threads: 1, 2, 4, … below
/// `max`, and `max`.
pub(crate) fn thread_counts(max: usize) -> Vec<usize> {
    let max = max.max(1);
    let mut out = Vec::new();
    let mut n = 1;
    while n < max {
        out.push(n);
        n *= 2;
    }
    out.push(max);
    out
}

impl EngineSpec {
    /// The single optimisation profile: min batch 1, opt `opt_batch`, max `max_batch`. Inputs
    /// whose first dimension is fixed keep that shape for min, opt and max.
    pub fn shape_profile(&self) -> Result<Vec<InputProfile>, Error> {
        let bad = |input: &str, reason: String| Error::Input {
            target: self.target.clone(),
            input: input.to_string(),
            reason,
        };
        if self.inputs.is_empty() {
            return Err(bad("-", "the recipe declares no inputs".into()));
        }
        if self.max_batch == 0 || self.opt_batch == 0 || self.opt_batch > self.max_batch {
            return Err(bad(
                "-",
                format!(
                    "batch sizes must satisfy 1 <= opt ({}) <= max ({})",
                    self.opt_batch, self.max_batch
                ),
            ));
        }
        let mut out = Vec::with_capacity(self.inputs.len());
        for input in &self.inputs {
            if input.shape.is_empty() {
                return Err(bad(
                    &input.name,
                    "has no dimensions (scalars cannot be batched)".into(),
                ));
            }
            let n = input.shape.len() - 1;
            let (mut rmin, mut ropt, mut rmax) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            for (i, &d) in input.shape.iter().enumerate().skip(1) {
                if d >= 1 {
                    rmin.push(d as u64);
                    ropt.push(d as u64);
                    rmax.push(d as u64);
                    continue;
                }
                let Some(p) = &input.profile else {
                    return Err(bad(
                        &input.name,
                        format!(
                            "dimension {i} is dynamic ({d}) and the input has no shape profile"
                        ),
                    ));
                };
                match (p.min.get(i - 1), p.opt.get(i - 1), p.max.get(i - 1)) {
                    (Some(&a), Some(&o), Some(&m)) if 1 <= a && a <= o && o <= m => {
                        rmin.push(a);
                        ropt.push(o);
                        rmax.push(m);
                    }
                    _ => {
                        return Err(bad(
                            &input.name,
                            format!("the shape profile of dimension {i} must satisfy 1 <= min <= opt <= max"),
                        ))
                    }
                }
            }
            let join = |b: u64, rest: &[u64]| {
                std::iter::once(b)
                    .chain(rest.iter().copied())
                    .collect::<Vec<u64>>()
            };
            let first = input.shape[0];
            let p = match first {
                -1 => InputProfile {
                    name: input.name.clone(),
                    min: join(1, &rmin),
                    opt: join(self.opt_batch as u64, &ropt),
                    max: join(self.max_batch as u64, &rmax),
                },
                d if d >= 1 => InputProfile {
                    name: input.name.clone(),
                    min: join(d as u64, &rmin),
                    opt: join(d as u64, &ropt),
                    max: join(d as u64, &rmax),
                },
                d => {
                    return Err(bad(
                        &input.name,
                        format!("dimension 0 is {d}; use -1 for a dynamic batch"),
                    ))
                }
            };
            out.push(p);
        }
        Ok(out)
    }

    /// True when the first input has a dynamic batch dimension.
    pub(crate) fn dynamic_batch(&self) -> bool {
        self.inputs.first().and_then(|i| i.shape.first()) == Some(&-1)
    }

    /// The batch sizes to profile: the declared ones within 1..=max, sorted, deduplicated, and
    /// always including 1 and `max_batch`. A static-batch model profiles only its batch.
    pub fn planned_batches(&self) -> Vec<u32> {
        if !self.dynamic_batch() {
            let b = self
                .inputs
                .first()
                .and_then(|i| i.shape.first())
                .map(|&d| d.max(1) as u32)
                .unwrap_or(1);
            return vec![b];
        }
        let mut v: Vec<u32> = self
            .batch_sizes
            .iter()
            .copied()
            .filter(|&b| b >= 1 && b <= self.max_batch)
            .chain([1, self.max_batch])
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn mlp_spec(toolchain: Toolchain) -> EngineSpec {
        EngineSpec {
            model: "mlp".into(),
            target: "cpu-fp32".into(),
            precision: Precision::Fp32,
            onnx: PathBuf::from("examples/mlp/mlp.onnx"),
            inputs: vec![InputSpec {
                name: "input".into(),
                datatype: infer_spec::DataType::F32,
                shape: vec![-1, 64],
                profile: None,
            }],
            max_batch: 32,
            opt_batch: 16,
            batch_sizes: vec![16, 8, 32],
            toolchain,
            onnxruntime: None,
            openvino: None,
            folding: None,
            convert: None,
            gate: None,
        }
    }

    type MinOptMax = (Vec<u64>, Vec<u64>, Vec<u64>);

    fn check(shape: Vec<i64>, expected: Result<MinOptMax, &str>) {
        let mut s = mlp_spec(Toolchain::Cpu);
        s.inputs[0].shape = shape;
        let got = s
            .shape_profile()
            .map(|p| (p[0].min.clone(), p[0].opt.clone(), p[0].max.clone()))
            .map_err(|e| e.to_string());
        assert_eq!(got, expected.map_err(String::from));
    }

    #[test]
    fn shape_profiles() {
        check(vec![-1, 64], Ok((vec![1, 64], vec![16, 64], vec![32, 64])));
        check(
            vec![-1, 3, 224, 224],
            Ok((
                vec![1, 3, 224, 224],
                vec![16, 3, 224, 224],
                vec![32, 3, 224, 224],
            )),
        );
        check(vec![4, 64], Ok((vec![4, 64], vec![4, 64], vec![4, 64])));
        check(
            vec![-1, -1],
            Err("target cpu-fp32, input `input`: dimension 1 is dynamic (-1) and the input has no shape profile"),
        );
        check(
            vec![],
            Err("target cpu-fp32, input `input`: has no dimensions (scalars cannot be batched)"),
        );
        check(
            vec![0, 3],
            Err("target cpu-fp32, input `input`: dimension 0 is 0; use -1 for a dynamic batch"),
        );
    }

    #[test]
    fn dynamic_inner_dimensions_take_the_profile() {
        let mut s = mlp_spec(Toolchain::Cpu);
        s.inputs[0].shape = vec![-1, -1, 3];
        s.inputs[0].profile = Some(DimRanges {
            min: vec![8, 3],
            opt: vec![128, 3],
            max: vec![512, 3],
        });
        let p = s.shape_profile().unwrap();
        assert_eq!(
            (p[0].min.clone(), p[0].opt.clone(), p[0].max.clone()),
            (vec![1, 8, 3], vec![16, 128, 3], vec![32, 512, 3])
        );
        assert_eq!(s.inputs[0].sample_dim(1), Some(128));
        s.inputs[0].profile = Some(DimRanges {
            min: vec![8, 3],
            opt: vec![4, 3],
            max: vec![512, 3],
        });
        assert!(s
            .shape_profile()
            .unwrap_err()
            .to_string()
            .ends_with("the shape profile of dimension 1 must satisfy 1 <= min <= opt <= max"));
    }

    #[test]
    fn planned_batches_include_one_and_max() {
        let s = mlp_spec(Toolchain::Cpu);
        assert_eq!(s.planned_batches(), vec![1, 8, 16, 32]);
        let mut s = mlp_spec(Toolchain::Cpu);
        s.batch_sizes = vec![64, 0, 4, 4];
        assert_eq!(s.planned_batches(), vec![1, 4, 32]);
        s.inputs[0].shape = vec![8, 64];
        assert_eq!(s.planned_batches(), vec![8]);
    }
}
