//! INT8 calibration data → calibration cache, with NVIDIA Polygraphy in the builder environment
//! (TensorRT 8.6 and 10.x; 11.x has no calibration).
//!
//! trtexec only reads calibration caches; producing one needs a calibrator that feeds batches.
//! Polygraphy's `convert --int8` does that, given a data loader script. We write a small loader
//! next to the staging files (it reads `*.npy`/`*.npz` batches from the calibration directory,
//! named by `INFER_BUILD_CALIB_DIR`), run
//! `polygraphy convert MODEL --int8 --data-loader-script LOADER:load_data --calibration-cache OUT
//! --calib-base-cls IInt8EntropyCalibrator2 [--trt-min/opt/max-shapes …] -o SCRATCH.plan`, keep the
//! cache and discard the scratch engine (trtexec builds the real one with the cache).

use infer_spec::engine::InputProfile;

use crate::process::Cmd;

/// The data loader Polygraphy imports. Batches are files sorted by name: `*.npy` (the model has
/// one input) or `*.npz` (one array per input name).
pub const LOADER_SCRIPT: &str = r#"# Written by infer-build: feeds INT8 calibration batches to Polygraphy.
import os
import numpy as np

def load_data():
    root = os.environ["INFER_BUILD_CALIB_DIR"]
    names = os.environ["INFER_BUILD_CALIB_INPUTS"].split(",")
    files = sorted(f for f in os.listdir(root) if f.endswith((".npy", ".npz")))
    if not files:
        raise SystemExit(f"no .npy or .npz calibration batches in {root}")
    for f in files:
        path = os.path.join(root, f)
        if f.endswith(".npy"):
            if len(names) != 1:
                raise SystemExit(f"{path}: a .npy batch feeds one input, the model has {len(names)}")
            yield {names[0]: np.load(path)}
        else:
            with np.load(path) as z:
                yield {n: z[n] for n in names}
"#;

/// Polygraphy's shape syntax: `input:[1,64]`.
fn poly_shapes(profile: &[InputProfile], f: fn(&InputProfile) -> &[u64]) -> Vec<String> {
    profile
        .iter()
        .map(|p| {
            let dims: Vec<String> = f(p).iter().map(u64::to_string).collect();
            format!("{}:[{}]", p.name, dims.join(","))
        })
        .collect()
}

/// The Polygraphy command that writes `cache` from the batches in `data_dir`.
#[allow(
    clippy::too_many_arguments,
    reason = "one value per Polygraphy flag, in the order of its command line; pure and tested by the command it returns"
)]
pub(crate) fn calibration_cmd(
    program: &str,
    onnx: &str,
    loader: &str,
    data_dir: &str,
    cache: &str,
    scratch_engine: &str,
    profile: &[InputProfile],
    dynamic: bool,
) -> Cmd {
    let mut c = Cmd::new(program)
        .args(["convert", onnx, "--int8"])
        .arg("--data-loader-script")
        .arg(format!("{loader}:load_data"))
        .arg("--calibration-cache")
        .arg(cache)
        .args(["--calib-base-cls", "IInt8EntropyCalibrator2"]);
    if dynamic {
        c = c
            .arg("--trt-min-shapes")
            .args(poly_shapes(profile, |p| &p.min))
            .arg("--trt-opt-shapes")
            .args(poly_shapes(profile, |p| &p.opt))
            .arg("--trt-max-shapes")
            .args(poly_shapes(profile, |p| &p.max));
    }
    let names: Vec<&str> = profile.iter().map(|p| p.name.as_str()).collect();
    c.args(["-o", scratch_engine])
        .env("INFER_BUILD_CALIB_DIR", data_dir)
        .env("INFER_BUILD_CALIB_INPUTS", names.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_calibration_command() {
        let profile = vec![InputProfile {
            name: "input".into(),
            min: vec![1, 64],
            opt: vec![16, 64],
            max: vec![32, 64],
        }];
        let c = calibration_cmd(
            "polygraphy",
            "/m.onnx",
            "/s/loader.py",
            "/calib",
            "/s/calib.cache",
            "/s/scratch.plan",
            &profile,
            true,
        );
        assert_eq!(
            c.argv(),
            [
                "polygraphy",
                "convert",
                "/m.onnx",
                "--int8",
                "--data-loader-script",
                "/s/loader.py:load_data",
                "--calibration-cache",
                "/s/calib.cache",
                "--calib-base-cls",
                "IInt8EntropyCalibrator2",
                "--trt-min-shapes",
                "input:[1,64]",
                "--trt-opt-shapes",
                "input:[16,64]",
                "--trt-max-shapes",
                "input:[32,64]",
                "-o",
                "/s/scratch.plan",
            ]
        );
        assert_eq!(
            c.env,
            [
                ("INFER_BUILD_CALIB_DIR".to_string(), "/calib".to_string()),
                ("INFER_BUILD_CALIB_INPUTS".to_string(), "input".to_string())
            ]
        );
        let s = calibration_cmd("polygraphy", "m", "l", "d", "c", "e", &profile, false);
        assert!(!s.args.iter().any(|a| a.starts_with("--trt-")));
    }
}
