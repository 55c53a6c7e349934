//! The builder-side GPU check: query the GPU with `nvidia-smi` (through [`crate::process`]) and
//! refuse to build an engine for a target the GPU cannot produce.

use infer_spec::engine::{ComputeCapability, HardwareCompat, Version};

use super::spec::TrtSpec;
use super::Error;
use crate::process::{Cmd, Runner};

/// One GPU as `nvidia-smi` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuInfo {
    pub sm: ComputeCapability,
    pub driver: Version,
    pub name: String,
}

/// The query: compute capability, driver version and name, one CSV line per GPU.
pub(crate) fn query_cmd() -> Cmd {
    Cmd::new("nvidia-smi").args([
        "--query-gpu=compute_cap,driver_version,name",
        "--format=csv,noheader",
    ])
}

/// Parse `8.9, 570.86.10, NVIDIA L4` lines (names may contain commas: everything after the
/// second comma is the name).
pub(crate) fn parse_query(text: &str) -> Result<Vec<GpuInfo>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, ',');
        let (Some(cc), Some(driver), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "line {}: expected `compute_cap, driver_version, name`, got `{line}`",
                i + 1
            ));
        };
        let sm = cc
            .trim()
            .parse()
            .map_err(|e| format!("line {}: {e}", i + 1))?;
        let driver = driver
            .trim()
            .parse()
            .map_err(|e| format!("line {}: {e}", i + 1))?;
        out.push(GpuInfo {
            sm,
            driver,
            name: name.trim().to_string(),
        });
    }
    if out.is_empty() {
        return Err("no GPU listed".into());
    }
    Ok(out)
}

/// A `trtexec` command on the GPU [`query`] describes. CUDA numbers devices fastest first by
/// default while `nvidia-smi` lists them in PCI bus order: with `CUDA_DEVICE_ORDER=PCI_BUS_ID`
/// trtexec's device 0 is the first GPU `nvidia-smi` lists, so the GPU checked against the target
/// is the GPU that builds the engine. (`CUDA_VISIBLE_DEVICES` is honoured by both: see
/// [`query_cmd_for`].)
pub(crate) fn trtexec_cmd(trtexec: &str) -> Cmd {
    Cmd::new(trtexec).env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
}

/// The query restricted to the first GPU of `CUDA_VISIBLE_DEVICES` (an index or a `GPU-…`
/// UUID, which `nvidia-smi --id` takes as they are) when it names one: CUDA's device 0 is then
/// that GPU, which `nvidia-smi` (blind to the variable) would otherwise not list first.
pub(crate) fn query_cmd_for(visible: Option<&str>) -> Cmd {
    let first = visible
        .and_then(|v| v.split(',').next())
        .map(str::trim)
        .filter(|id| !id.is_empty() && !id.starts_with("MIG-"));
    match first {
        Some(id) => query_cmd().args([format!("--id={id}")]),
        None => query_cmd(),
    }
}

/// Ask `nvidia-smi` for the first visible GPU: CUDA's device 0 in PCI order, as trtexec sees it.
pub(crate) fn query(runner: &dyn Runner) -> Result<GpuInfo, Error> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let cmd = query_cmd_for(visible.as_deref());
    let out = runner.run(&cmd).map_err(Error::Process)?;
    if !out.success() {
        return Err(Error::Tool {
            command: cmd.to_string(),
            code: out.code,
            tail: out.tail(5),
        });
    }
    let gpus = parse_query(&out.stdout_text()).map_err(|reason| Error::ToolOutput {
        tool: "nvidia-smi",
        reason,
    })?;
    // parse_query never returns an empty list.
    gpus.into_iter()
        .next()
        .ok_or(Error::Internal("empty gpu list"))
}

/// Can this GPU build the target's engine?
/// - Without a hardware-compatibility level (or with `sameComputeCapability`) the GPU's compute
///   capability must equal the target's.
/// - With `ampere+` the builder must be Ampere or newer (compute capability ≥ 8.0).
/// - The driver must be at or above the target's floor.
pub(crate) fn check_builder(target: &str, gpu: &GpuInfo, trt: &TrtSpec) -> Result<(), Error> {
    let refuse = |reason: String| Error::GpuMismatch {
        target: target.to_string(),
        gpu: format!("{} ({}, driver {})", gpu.name, gpu.sm.sm(), gpu.driver),
        reason,
    };
    match trt.hardware_compat {
        HardwareCompat::AmperePlus => {
            if gpu.sm < ComputeCapability::new(8, 0) {
                return Err(refuse(format!(
                    "hardware compatibility level ampere+ needs an Ampere or newer builder (sm_80+), this GPU is {}",
                    gpu.sm.sm()
                )));
            }
        }
        HardwareCompat::None | HardwareCompat::SameComputeCapability => {
            if gpu.sm != trt.sm {
                return Err(refuse(format!(
                    "the target needs {} and sets no hardware compatibility level; build on a {} GPU",
                    trt.sm.sm(), trt.sm.sm()
                )));
            }
        }
    }
    if gpu.driver < trt.driver_floor {
        return Err(refuse(format!(
            "driver {} is below the target's floor {} (CUDA {})",
            gpu.driver, trt.driver_floor, trt.cuda
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Result<Vec<(&str, &str, &str)>, &str>) {
        let got = parse_query(text).map(|v| {
            v.into_iter()
                .map(|g| (g.sm.sm().to_string(), g.driver.to_string(), g.name))
                .collect::<Vec<_>>()
        });
        let expected = expected
            .map(|v| {
                v.into_iter()
                    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
                    .collect::<Vec<_>>()
            })
            .map_err(String::from);
        assert_eq!(got, expected, "{text:?}");
    }

    #[test]
    fn the_gpu_checked_is_the_gpu_trtexec_builds_on() {
        let argv = |v: Option<&str>| query_cmd_for(v).argv().join(" ");
        let plain = "nvidia-smi --query-gpu=compute_cap,driver_version,name --format=csv,noheader";
        assert_eq!(argv(None), plain);
        assert_eq!(argv(Some("")), plain);
        assert_eq!(argv(Some("2,0")), format!("{plain} --id=2"));
        assert_eq!(argv(Some("GPU-5f1e,1")), format!("{plain} --id=GPU-5f1e"));
        // A MIG instance is no GPU nvidia-smi's --id takes: the plain query stays.
        assert_eq!(argv(Some("MIG-3b2a")), plain);
        let t = trtexec_cmd("trtexec");
        assert_eq!(
            t.env,
            vec![("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string())]
        );
    }

    #[test]
    fn parses_nvidia_smi_csv() {
        check(
            "8.9, 570.86.10, NVIDIA L4\n",
            Ok(vec![("sm_89", "570.86.10", "NVIDIA L4")]),
        );
        check(
            "9.0, 580.95.05, NVIDIA H100 80GB HBM3\n9.0, 580.95.05, NVIDIA H100 80GB HBM3\n",
            Ok(vec![("sm_90", "580.95.05", "NVIDIA H100 80GB HBM3"); 2]),
        );
        check(
            "12.0, 590.44.01, NVIDIA RTX PRO 6000 Blackwell, Server Edition\n",
            Ok(vec![(
                "sm_120",
                "590.44.01",
                "NVIDIA RTX PRO 6000 Blackwell, Server Edition",
            )]),
        );
        check("", Err("no GPU listed"));
        check(
            "8.9, 570.86.10\n",
            Err("line 1: expected `compute_cap, driver_version, name`, got `8.9, 570.86.10`"),
        );
        check("[N/A], 570.86.10, NVIDIA L4\n", Err("line 1: invalid compute capability `[N/A]`: expected sm_XY or X.Y, such as sm_89 or 8.9"));
    }

    #[test]
    fn builder_checks() {
        let v = |s: &str| s.parse::<Version>().unwrap();
        let mut trt = TrtSpec::new(
            v("10.8.0.43"),
            v("12.8"),
            ComputeCapability::new(8, 9),
            v("570.26"),
        );
        let l4 = GpuInfo {
            sm: ComputeCapability::new(8, 9),
            driver: v("570.86.10"),
            name: "NVIDIA L4".into(),
        };
        assert!(check_builder("sm89-fp16", &l4, &trt).is_ok());
        let a100 = GpuInfo {
            sm: ComputeCapability::new(8, 0),
            ..l4.clone()
        };
        let e = check_builder("sm89-fp16", &a100, &trt).unwrap_err();
        assert_eq!(e.to_string(), "cannot build target sm89-fp16 on NVIDIA L4 (sm_80, driver 570.86.10): the target needs sm_89 and sets no hardware compatibility level; build on a sm_89 GPU");
        trt.hardware_compat = HardwareCompat::AmperePlus;
        assert!(check_builder("sm89-fp16", &a100, &trt).is_ok());
        let t4 = GpuInfo {
            sm: ComputeCapability::new(7, 5),
            ..l4.clone()
        };
        assert!(check_builder("x", &t4, &trt).is_err());
        let old = GpuInfo {
            driver: v("550.54.14"),
            ..l4
        };
        let e = check_builder("sm89-fp16", &old, &trt).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("driver 550.54.14 is below the target's floor 570.26 (CUDA 12.8)"),
            "{e}"
        );
    }
}
