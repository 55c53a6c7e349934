//! The engine cache key: sha256 over a canonical serialisation of every input that changes the
//! engine or what is stored with it, and of nothing else.
//!
//! In the key: the ONNX bytes' digest, the target id, the precision, the shape profile, the
//! profiled batch sizes, the backend (tract version; or TensorRT version and build, CUDA, SM,
//! driver floor and the full trtexec argument vector with paths replaced by placeholders), the
//! calibration input's digest, a CPU target's accuracy gate (limits and evaluation data digest),
//! and infer-build's own version. Not in the key: file paths, the
//! cache location, the clock, the environment.

use infer_spec::engine::{canonical_json, CpuEngine, InputProfile, Precision};
use serde::Serialize;

/// Version of the key derivation; bump when the material below changes meaning.
pub(crate) const KEY_SCHEME: &str = "infer-build-engine-key/1";

/// The version of infer-build that goes into every key.
pub const TOOL_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The backend-specific part of the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum BackendKey {
    Tract {
        tract: String,
        /// `engine.cpu` and the ONNX Runtime version when ONNX Runtime was a candidate
        /// (absent for tract alone, so those keys are unchanged).
        #[serde(skip_serializing_if = "Option::is_none")]
        cpu_engine: Option<CpuEngine>,
        #[serde(skip_serializing_if = "Option::is_none")]
        onnxruntime: Option<String>,
        /// The OpenVINO version when OpenVINO was a candidate (absent otherwise, so the keys
        /// of engines it never measured are unchanged).
        #[serde(skip_serializing_if = "Option::is_none")]
        openvino: Option<String>,
        /// The recipe's `[engine] threads`, the one count ONNX Runtime is measured with when
        /// given. (The counts measured otherwise, from the builder's CPUs, are not in the key:
        /// the runtime decides the threads where it runs, the measurement is a hint.)
        #[serde(skip_serializing_if = "Option::is_none")]
        threads: Option<u32>,
    },
    Tensorrt {
        /// Version with build number.
        tensorrt: String,
        cuda: String,
        sm: String,
        driver_floor: String,
        /// trtexec build arguments with placeholder paths.
        builder_flags: Vec<String>,
        /// `sha256:<hex>` of the calibration cache or data, when used.
        calibration: Option<String>,
    },
}

/// Everything that determines an engine cache entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyMaterial {
    pub scheme: String,
    pub tool: String,
    pub onnx: String,
    pub target: String,
    pub precision: Precision,
    pub shape_profile: Vec<InputProfile>,
    pub batch_sizes: Vec<u32>,
    pub backend: BackendKey,
    /// The conversion cache key when infer-build converted the model first (its key covers
    /// the source ONNX, the tool and versions, the options and the calibration data).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversion: Option<String>,
    /// A CPU target beyond FP32: the accuracy gate's limits and its evaluation data's digest
    /// (`generated` without data), so a changed limit or data gates again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
}

impl KeyMaterial {
    /// The canonical bytes that are hashed.
    pub fn canonical(&self) -> Vec<u8> {
        canonical_json(self)
    }

    /// The key: lowercase hex sha256 of [`KeyMaterial::canonical`].
    pub fn key(&self) -> String {
        crate::oci::Digest::of(&self.canonical()).hex().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> KeyMaterial {
        KeyMaterial {
            scheme: KEY_SCHEME.into(),
            tool: "0.1.0".into(),
            onnx: crate::oci::Digest::of(b"model").to_string(),
            target: "sm89-fp16".into(),
            precision: Precision::Fp16,
            shape_profile: vec![InputProfile {
                name: "input".into(),
                min: vec![1, 64],
                opt: vec![16, 64],
                max: vec![32, 64],
            }],
            batch_sizes: vec![1, 8, 16, 32],
            backend: BackendKey::Tensorrt {
                tensorrt: "10.8.0.43".into(),
                cuda: "12.8".into(),
                sm: "sm_89".into(),
                driver_floor: "570.26".into(),
                builder_flags: vec!["--onnx=<onnx>".into(), "--fp16".into()],
                calibration: None,
            },
            conversion: None,
            gate: None,
        }
    }

    #[test]
    fn golden_key_is_stable() {
        // Changing this value invalidates every user's cache: only with a KEY_SCHEME bump.
        let m = base();
        assert_eq!(
            String::from_utf8(m.canonical()).unwrap(),
            "{\"backend\":{\"builder_flags\":[\"--onnx=<onnx>\",\"--fp16\"],\"calibration\":null,\"cuda\":\"12.8\",\"driver_floor\":\"570.26\",\"kind\":\"tensorrt\",\"sm\":\"sm_89\",\"tensorrt\":\"10.8.0.43\"},\"batch_sizes\":[1,8,16,32],\"onnx\":\"sha256:ce8e2fc9b3f84e4f8f6b4eb2b2c42b8a9b4f3d3e4b1f9a83dcbb0b6cd6d3d3b1\",\"precision\":\"fp16\",\"scheme\":\"infer-build-engine-key/1\",\"shape_profile\":[{\"max\":[32,64],\"min\":[1,64],\"name\":\"input\",\"opt\":[16,64]}],\"target\":\"sm89-fp16\",\"tool\":\"0.1.0\"}\n"
                .replace(
                    "sha256:ce8e2fc9b3f84e4f8f6b4eb2b2c42b8a9b4f3d3e4b1f9a83dcbb0b6cd6d3d3b1",
                    &crate::oci::Digest::of(b"model").to_string()
                )
        );
        assert_eq!(m.key().len(), 64);
        assert_eq!(m.key(), base().key());
    }

    #[test]
    fn every_field_changes_the_key() {
        let k0 = base().key();
        type Mutation = Box<dyn Fn(&mut KeyMaterial)>;
        let mutations: Vec<(&str, Mutation)> = vec![
            (
                "onnx",
                Box::new(|m| m.onnx = crate::oci::Digest::of(b"modem").to_string()),
            ),
            ("target", Box::new(|m| m.target = "sm89-fp16b".into())),
            ("precision", Box::new(|m| m.precision = Precision::Int8)),
            ("tool", Box::new(|m| m.tool = "0.1.1".into())),
            (
                "profile",
                Box::new(|m| m.shape_profile[0].opt = vec![8, 64]),
            ),
            ("batches", Box::new(|m| m.batch_sizes.push(4))),
            (
                "conversion",
                Box::new(|m| m.conversion = Some("c0ffee".into())),
            ),
            (
                "gate",
                Box::new(|m| m.gate = Some("max_rel=0.05 evaluation=generated".into())),
            ),
            (
                "backend",
                Box::new(|m| {
                    m.backend = BackendKey::Tract {
                        tract: "0.23.9".into(),
                        cpu_engine: None,
                        onnxruntime: None,
                        openvino: None,
                        threads: None,
                    }
                }),
            ),
            (
                "trt",
                Box::new(|m| {
                    if let BackendKey::Tensorrt { tensorrt, .. } = &mut m.backend {
                        *tensorrt = "10.8.0.44".into()
                    }
                }),
            ),
            (
                "flags",
                Box::new(|m| {
                    if let BackendKey::Tensorrt { builder_flags, .. } = &mut m.backend {
                        builder_flags.push("--versionCompatible".into())
                    }
                }),
            ),
            (
                "calib",
                Box::new(|m| {
                    if let BackendKey::Tensorrt { calibration, .. } = &mut m.backend {
                        *calibration = Some(crate::oci::Digest::of(b"c").to_string())
                    }
                }),
            ),
            (
                "driver",
                Box::new(|m| {
                    if let BackendKey::Tensorrt { driver_floor, .. } = &mut m.backend {
                        *driver_floor = "580".into()
                    }
                }),
            ),
        ];
        let mut seen = std::collections::BTreeSet::from([k0.clone()]);
        for (name, f) in mutations {
            let mut m = base();
            f(&mut m);
            assert!(seen.insert(m.key()), "{name} did not change the key");
        }
    }
}
