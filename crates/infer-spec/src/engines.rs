//! The engine catalog: one row per [`EngineKind`] with everything the builder, the runtime and
//! `plan` need to know about it that is not code (its names, what times it, which files it runs
//! and through which `runtime.toml` backend, the native library it loads, which `infer-serve`
//! build serves it, whether it has its own thread pool).
//!
//! Every `match` on an engine's facts reads this table instead; what stays per engine is code: the
//! builder's module that builds and measures it (`src/engine/`) and the runtime's backend that
//! loads it (`crates/infer-serve/src/backend/`). ARCHITECTURE.md's "Add an engine" lists the rest.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::engine::{EngineFormat, EngineKind, Precision, TimedBy};
use crate::runtime::BackendKind;

/// Which `infer-serve` build serves an engine: the one image carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeFlavour {
    /// Statically linked, FROM scratch: no libc, so no library loaded at start (tract).
    Static,
    /// Dynamically linked against glibc: opens a CPU engine's library at start (ONNX Runtime).
    Dynamic,
    /// Dynamically linked against glibc with feature `tensorrt`: every GPU image, whether
    /// TensorRT comes from its base (full) or from its lean library layer.
    Gpu,
}

impl RuntimeFlavour {
    pub const fn as_str(self) -> &'static str {
        match self {
            RuntimeFlavour::Static => "static",
            RuntimeFlavour::Dynamic => "dynamic",
            RuntimeFlavour::Gpu => "gpu",
        }
    }
}

impl fmt::Display for RuntimeFlavour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is known about an engine kind without running it.
#[derive(Debug)]
pub struct EngineDef {
    pub kind: EngineKind,
    /// Its name everywhere it is written: `meta.json`'s `kind`, annotations, `engine.cpu`, logs.
    pub name: &'static str,
    /// How people call it in prose ("ONNX Runtime").
    pub title: &'static str,
    /// A CPU engine: a recipe's `engine.cpu` may name it, and `auto` measures it.
    pub cpu: bool,
    /// Other spellings `engine.cpu` accepts (case-insensitive), besides `name`.
    pub aliases: &'static [&'static str],
    /// What times its profile's T(b) in the builder.
    pub timed_by: TimedBy,
    /// The engine files it runs and the `runtime.toml` backend that runs each.
    pub formats: &'static [(EngineFormat, BackendKind)],
    /// The native library its backend opens at start, as `matrix/runtime-libraries.toml` names it
    /// (`runtime.toml`'s `engine.library`), and whether the backend needs it.
    pub library: Option<Library>,
    /// The `infer-serve` build whose images carry it.
    pub runtime: RuntimeFlavour,
    /// It computes on an intra-op pool of its own, sized by `runtime.toml`'s `engine.threads` (the
    /// server divides the CPUs between instances and models when the key is absent).
    pub threads: bool,
    /// The precisions it computes an FP32 model in as a setting at start (`runtime.toml`'s
    /// `engine.precision`; the first is the default); empty: the engine file fixes it.
    pub precisions: &'static [Precision],
    /// A CPU target of precision INT8 may ship it: it computes a Q/DQ model's quantised
    /// operators with integer kernels (a `cpu-int8` target's engine is that model).
    pub int8_qdq: bool,
}

/// The native library an engine's backend opens.
#[derive(Debug, Clone, Copy)]
pub struct Library {
    /// The library's name in `matrix/runtime-libraries.toml`.
    pub name: &'static str,
    /// The backend cannot start without `engine.library` (TensorRT finds its full runtime by its
    /// soname in a CUDA base, and takes a lean one by path).
    pub required: bool,
}

/// Every engine, in [`EngineKind`]'s order ([`EngineKind::def`] indexes it).
pub const ENGINES: [EngineDef; 4] = [
    EngineDef {
        kind: EngineKind::Tract,
        name: "tract",
        title: "tract",
        cpu: true,
        aliases: &[],
        timed_by: TimedBy::Tract,
        formats: &[
            (EngineFormat::Onnx, BackendKind::TractOnnx),
            (EngineFormat::TractNnefTar, BackendKind::TractNnef),
        ],
        library: None,
        runtime: RuntimeFlavour::Static,
        threads: false,
        precisions: &[],
        int8_qdq: false,
    },
    EngineDef {
        kind: EngineKind::Tensorrt,
        name: "tensorrt",
        title: "TensorRT",
        cpu: false,
        aliases: &[],
        timed_by: TimedBy::Trtexec,
        formats: &[(EngineFormat::TensorrtPlan, BackendKind::TensorRt)],
        library: Some(Library {
            name: "tensorrt",
            required: false,
        }),
        runtime: RuntimeFlavour::Gpu,
        threads: false,
        precisions: &[],
        int8_qdq: false,
    },
    EngineDef {
        kind: EngineKind::Onnxruntime,
        name: "onnxruntime",
        title: "ONNX Runtime",
        cpu: true,
        aliases: &["ort", "onnx-runtime"],
        timed_by: TimedBy::Onnxruntime,
        formats: &[(EngineFormat::Onnx, BackendKind::OnnxRuntime)],
        library: Some(Library {
            name: "onnxruntime",
            required: true,
        }),
        runtime: RuntimeFlavour::Dynamic,
        threads: true,
        precisions: &[],
        int8_qdq: false,
    },
    EngineDef {
        kind: EngineKind::Openvino,
        name: "openvino",
        title: "OpenVINO",
        cpu: true,
        aliases: &["ov"],
        timed_by: TimedBy::Openvino,
        formats: &[(EngineFormat::Onnx, BackendKind::OpenVino)],
        library: Some(Library {
            name: "openvino",
            required: true,
        }),
        runtime: RuntimeFlavour::Dynamic,
        threads: true,
        // OpenVINO's INFERENCE_PRECISION_HINT on the CPU plugin.
        precisions: &[Precision::Fp32, Precision::Bf16, Precision::Fp16],
        // Its CPU plugin runs QuantizeLinear/DequantizeLinear pairs as INT8 kernels. (ONNX
        // Runtime does too, but its symmetric-INT8 CPU kernels ran MiniLM 3x slower than FP32
        // on the test machine, docs/BENCHMARKS.md: not a candidate.)
        int8_qdq: true,
    },
];

impl EngineDef {
    /// True when a CPU target of precision `p` may ship it: FP32 always, INT8 where it runs
    /// Q/DQ models ([`Self::int8_qdq`]), else one of [`Self::precisions`].
    pub fn computes(&self, p: Precision) -> bool {
        p == Precision::Fp32 || self.setting(p).is_some() || (p == Precision::Int8 && self.int8_qdq)
    }

    /// `p` as this engine's `runtime.toml` `engine.precision`: `p` when it is one of
    /// [`Self::precisions`], else `None` (the engine's default, FP32; an INT8 target's
    /// precision is in its Q/DQ model, not a setting).
    pub fn setting(&self, p: Precision) -> Option<Precision> {
        self.precisions.contains(&p).then_some(p)
    }
}

impl EngineKind {
    /// This engine's row of [`ENGINES`].
    pub const fn def(self) -> &'static EngineDef {
        &ENGINES[self as usize]
    }

    /// The engines a CPU target may ship, in the table's order.
    pub fn cpu_engines() -> impl Iterator<Item = &'static EngineDef> {
        ENGINES.iter().filter(|d| d.cpu)
    }
}

impl BackendKind {
    /// The engine a `runtime.toml` backend runs; `None` for `synthetic`, which runs none.
    pub fn engine(self) -> Option<&'static EngineDef> {
        ENGINES
            .iter()
            .find(|d| d.formats.iter().any(|&(_, b)| b == self))
    }
}

/// The `runtime.toml` backends (`engine.kind`) of the engines that satisfy `keep`, sorted, as
/// prose lists them: `"a"`, `"a" or "b"`, `"a", "b" or "c"`.
pub fn backend_names(keep: impl Fn(&EngineDef) -> bool) -> String {
    let mut names: Vec<String> = ENGINES
        .iter()
        .filter(|d| keep(d))
        .flat_map(|d| d.formats.iter().map(|(_, b)| format!("\"{}\"", b.as_str())))
        .collect();
    names.sort();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_engine_kind_order_and_names_match_serde() {
        for (i, d) in ENGINES.iter().enumerate() {
            assert_eq!(d.kind as usize, i, "{}", d.name);
            assert_eq!(d.kind.def().name, d.name);
            assert_eq!(
                serde_json::to_string(&d.kind).unwrap(),
                format!("\"{}\"", d.name)
            );
            assert_eq!(d.kind.to_string(), d.name);
            assert!(!d.formats.is_empty(), "{}", d.name);
        }
    }

    #[test]
    fn every_backend_but_synthetic_runs_exactly_one_engine() {
        for b in [
            BackendKind::TractOnnx,
            BackendKind::TractNnef,
            BackendKind::TensorRt,
            BackendKind::OnnxRuntime,
            BackendKind::OpenVino,
        ] {
            let owners = ENGINES
                .iter()
                .filter(|d| d.formats.iter().any(|&(_, x)| x == b))
                .count();
            assert_eq!(owners, 1, "{}", b.as_str());
        }
        assert!(BackendKind::Synthetic.engine().is_none());
        assert_eq!(
            BackendKind::TractNnef.engine().unwrap().kind,
            EngineKind::Tract
        );
    }

    #[test]
    fn cpu_engine_spellings_come_from_the_table() {
        use crate::engine::CpuEngine;
        assert_eq!(CpuEngine::parse(" ORT "), Some(CpuEngine::ONNXRUNTIME));
        assert_eq!(
            CpuEngine::parse("onnx-runtime"),
            Some(CpuEngine::ONNXRUNTIME)
        );
        assert_eq!(CpuEngine::parse("Tract"), Some(CpuEngine::TRACT));
        assert_eq!(CpuEngine::parse("auto"), Some(CpuEngine::Auto));
        // Not a CPU engine.
        assert_eq!(CpuEngine::parse("tensorrt"), None);
        for c in [CpuEngine::Auto, CpuEngine::TRACT, CpuEngine::ONNXRUNTIME] {
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<CpuEngine>(&json).unwrap(), c);
        }
        // Documents hold the canonical spelling only.
        let e = serde_json::from_str::<CpuEngine>("\"ort\"").unwrap_err();
        assert!(
            e.to_string()
                .contains("\"auto\", \"tract\", \"onnxruntime\", \"openvino\""),
            "{e}"
        );
    }

    #[test]
    fn names_in_prose() {
        assert_eq!(
            backend_names(|d| d.threads),
            "\"onnxruntime\" or \"openvino\""
        );
        assert_eq!(
            backend_names(|d| d.library.is_some()),
            "\"onnxruntime\", \"openvino\" or \"tensorrt\""
        );
        assert_eq!(
            backend_names(|d| d.kind == EngineKind::Tract),
            "\"tract-nnef\" or \"tract-onnx\""
        );
    }
    /// `docs/engines.md`'s table of the engines, row by row.
    #[test]
    fn the_docs_table_is_the_catalog() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/engines.md");
        let Ok(doc) = std::fs::read_to_string(path) else {
            eprintln!("skipping: no {path} (the crate outside its repository)");
            return;
        };
        let code = |s: &str| format!("`{s}`");
        for d in &ENGINES {
            let spellings = if d.cpu {
                std::iter::once(d.name)
                    .chain(d.aliases.iter().copied())
                    .map(code)
                    .collect::<Vec<_>>()
                    .join(", ")
            } else {
                "(GPU targets)".to_owned()
            };
            let files = d
                .formats
                .iter()
                .map(|(f, b)| {
                    let f = serde_json::to_value(f).unwrap();
                    format!("{} ({})", code(f.as_str().unwrap()), code(b.as_str()))
                })
                .collect::<Vec<_>>()
                .join(", ");
            let library = match d.library {
                None => "none".to_owned(),
                Some(l) => format!(
                    "{} ({})",
                    code(l.name),
                    if l.required { "required" } else { "optional" }
                ),
            };
            let row = format!(
                "| {} | {spellings} | {files} | {library} | {} | {} |",
                code(d.name),
                code(d.runtime.as_str()),
                code(&d.timed_by.to_string()),
            );
            assert!(doc.contains(&row), "docs/engines.md lacks the row\n{row}");
        }
    }
}
