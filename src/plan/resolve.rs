//! Target resolution: recipe × matrix (× lock) → targets, or every refusal at once.
//!
//! Each GPU target walks the matrix's TensorRT releases newest first through a fixed series of
//! filters (pin, completeness, platform, compute capability, precision, INT8 calibration,
//! hardware compatibility, then per CUDA build: CUDA pin, base image, glibc, node driver). The
//! first candidate that passes every filter wins. When a filter removes the last candidates,
//! that filter's rule is what the user is told, with a way out.

use std::collections::BTreeMap;
use std::path::Path;

use crate::matrix::{
    self, BaseImage, ComputeCapability, HardwareCompat, ImageRole, Matrix, Platform, Precision,
    PrecisionApi, Release, Version,
};
use crate::recipe::{self, CpuEngine, Diagnostic, Located, Recipe};

use super::lock::{self, Lock};
use super::types::*;
use crate::oci::Digest;

/// A refusal before it is placed in the recipe: the rule's name, the message and the way out.
struct Refusal {
    rule: &'static str,
    message: String,
    hint: String,
}

fn diag<T>(file: &Path, at: &Located<T>, r: Refusal) -> Diagnostic {
    at.diagnostic(file, format!("{} [rule: {}]", r.message, r.rule))
        .with_hint(r.hint)
}

/// One GPU architecture the recipe asks for: an SM on a platform, with its products.
struct GpuGroup<'m> {
    cc: ComputeCapability,
    platform: Platform,
    /// Matrix rows of the products (deduplicated, in matrix order).
    products: Vec<&'m matrix::Gpu>,
    /// What the recipe wrote, in recipe order.
    requested: Vec<String>,
    /// Where the recipe first names this group.
    at: Located<()>,
}

impl GpuGroup<'_> {
    fn label(&self) -> String {
        let names: Vec<&str> = self.products.iter().map(|g| g.name.as_str()).collect();
        if names.is_empty() {
            self.cc.sm().to_string()
        } else {
            format!("{} ({})", names.join(", "), self.cc.sm())
        }
    }

    fn tensor_cores(&self) -> Vec<Precision> {
        let mut tc: Vec<Precision> = self
            .products
            .first()
            .map(|g| g.tensor_cores.clone())
            .unwrap_or_default();
        tc.sort();
        tc
    }
}

/// `reference@sha256:…` → (`reference`, digest).
fn split_digest(s: &str) -> (&str, Option<&str>) {
    match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    }
}

fn pin_image(reference: &str, row_digest: Option<&str>, lock: Option<&Lock>) -> ImagePin {
    if reference == "scratch" {
        return ImagePin {
            reference: reference.into(),
            digest: None,
            pinned_by: PinnedBy::None,
        };
    }
    // The matrix check and the lock parser refuse malformed digests before a plan is made.
    if let Some(d) = row_digest.and_then(|d| Digest::parse(d).ok()) {
        return ImagePin {
            reference: reference.into(),
            digest: Some(d),
            pinned_by: PinnedBy::Matrix,
        };
    }
    ImagePin {
        reference: reference.into(),
        digest: lock
            .and_then(|l| l.digest(reference))
            .and_then(|d| Digest::parse(d).ok()),
        pinned_by: PinnedBy::Lock,
    }
}

/// What resolution picked for one GPU target.
struct Choice<'m> {
    release: &'m Release,
    cuda_build: Version,
    base: &'m BaseImage,
}

/// Resolve `recipe` against `matrix`; `lock` supplies digests recorded at earlier pulls.
pub fn resolve(
    recipe: &Recipe,
    matrix: &Matrix,
    lock: Option<&Lock>,
) -> Result<BuildPlan, super::Error> {
    let file = recipe.file.as_path();
    let mut refusals: Vec<Diagnostic> = Vec::new();

    let tensorrt_pin = recipe.targets.tensorrt.as_ref();
    let cuda_pin = recipe.targets.cuda.as_ref();
    let node_driver = recipe.deploy.node_driver.as_ref();
    let base_override = recipe.image.base.as_ref();

    // Matrix versions of the recipe's pins (the recipe's own Version type is syntax only).
    let trt_pin_v = tensorrt_pin.map(|p| p.value.clone());
    let cuda_pin_v = cuda_pin.map(|p| p.value.clone());
    let driver_v = node_driver.map(|p| p.value.clone());

    // 1. GPUs → groups by (SM, platform).
    let mut groups: BTreeMap<(ComputeCapability, Platform), GpuGroup> = BTreeMap::new();
    for g in &recipe.targets.gpus {
        let at = Located::new((), g.span, g.key.clone());
        let (cc, platform, products): (ComputeCapability, Platform, Vec<&matrix::Gpu>) =
            match &g.value {
                recipe::Gpu::Product(name) => match matrix.gpu(name) {
                    Some(row) => (row.cc, row.platform, vec![row]),
                    None => {
                        let close = matrix.closest_gpus(name);
                        let hint = if close.is_empty() {
                            "name a product listed in matrix/gpus.toml, or an SM such as \"sm_90\""
                                .to_string()
                        } else {
                            format!(
                                "did you mean {}? or name the SM, such as \"sm_90\"",
                                close
                                    .iter()
                                    .map(|c| format!("\"{c}\""))
                                    .collect::<Vec<_>>()
                                    .join(" or ")
                            )
                        };
                        refusals.push(diag(
                            file,
                            g,
                            Refusal {
                                rule: "known-gpu",
                                message: format!(
                                    "unknown GPU \"{name}\": not in the compatibility matrix"
                                ),
                                hint,
                            },
                        ));
                        continue;
                    }
                },
                recipe::Gpu::Sm(cc) => {
                    let cc = *cc;
                    let all: Vec<&matrix::Gpu> = matrix.gpus_with_cc(cc).collect();
                    if all.is_empty() {
                        let known: Vec<String> = {
                            let mut v: Vec<ComputeCapability> =
                                matrix.gpus.iter().map(|g| g.cc).collect();
                            v.sort();
                            v.dedup();
                            v.iter().map(|c| c.sm().to_string()).collect()
                        };
                        refusals.push(diag(
                            file,
                            g,
                            Refusal {
                                rule: "known-gpu",
                                message: format!(
                                "no GPU in the compatibility matrix has compute capability {} ({})",
                                cc.dotted(),
                                cc.sm()
                            ),
                                hint: format!(
                                    "use one of {}, or add the GPU to matrix/gpus.toml",
                                    known.join(", ")
                                ),
                            },
                        ));
                        continue;
                    }
                    // An SM name means the x86_64 parts when there are any (sm_90: H100, not GH200).
                    let platform = if all.iter().any(|g| g.platform == Platform::X86_64) {
                        Platform::X86_64
                    } else {
                        all[0].platform
                    };
                    let products = all.into_iter().filter(|g| g.platform == platform).collect();
                    (cc, platform, products)
                }
            };
        let group = groups.entry((cc, platform)).or_insert_with(|| GpuGroup {
            cc,
            platform,
            products: Vec::new(),
            requested: Vec::new(),
            at: at.clone(),
        });
        group.requested.push(g.value.to_string());
        for p in products {
            if !group.products.iter().any(|q| q.name == p.name) {
                group.products.push(p);
            }
        }
    }
    for g in groups.values_mut() {
        g.products
            .sort_by_key(|p| matrix.gpus.iter().position(|q| q.name == p.name));
    }

    // 2. The base image override must be one the matrix knows, for GPU targets (its CUDA
    //    decides the build); CPU targets accept any base.
    let override_row: Option<&BaseImage> =
        base_override.and_then(|b| matrix.image(split_digest(&b.value).0));
    if let Some(b) = base_override {
        let (reference, digest) = split_digest(&b.value);
        if let Some(d) = digest {
            if crate::oci::hex_of(d).is_none() {
                refusals.push(diag(file, b, Refusal {
                    rule: "base-digest",
                    message: format!("base image digest \"{d}\" is not sha256: followed by 64 lowercase hex digits"),
                    hint: "write the digest as the registry reports it, or leave it out and let the lock file pin it".into(),
                }));
            }
        }
        if !groups.is_empty() && override_row.is_none() {
            refusals.push(diag(file, b, Refusal {
                rule: "known-base",
                message: format!("base image {reference} is not in the compatibility matrix, so its CUDA version is unknown"),
                hint: format!("use a runtime image from base-images/images.toml (such as {}), or add a row for it and pass --matrix DIR", matrix.images.iter().find(|i| i.role == ImageRole::Runtime).map_or("-", |i| i.reference.as_str())),
            }));
        }
    }

    // 3. Each GPU group × precision.
    let mut targets: Vec<TargetPlan> = Vec::new();
    let precisions: Vec<&Located<recipe::Precision>> = recipe.targets.precision.iter().collect();
    for group in groups.values() {
        for p in &precisions {
            let precision = p.value;
            match resolve_gpu_target(
                recipe,
                matrix,
                group,
                p,
                precision,
                trt_pin_v.as_ref(),
                cuda_pin_v.as_ref(),
                driver_v.as_ref(),
                override_row,
            ) {
                Err(d) => refusals.push(d),
                Ok(choice) => {
                    targets.push(gpu_target(recipe, matrix, lock, group, precision, &choice))
                }
            }
        }
    }

    // 4. The CPU target.
    if recipe.targets.cpu {
        // A GPU runtime base named for the GPU targets does not apply to the CPU image.
        let gpu_base = override_row.is_some_and(|r| r.role != ImageRole::Cpu);
        let base = match base_override.filter(|_| !gpu_base) {
            Some(b) => {
                let (reference, digest) = split_digest(&b.value);
                match digest {
                    // A malformed digest was refused above: the plan is not made.
                    Some(d) => ImagePin {
                        reference: reference.into(),
                        digest: Digest::parse(d).ok(),
                        pinned_by: PinnedBy::Recipe,
                    },
                    None => pin_image(
                        reference,
                        override_row.and_then(|r| r.digest.as_deref()),
                        lock,
                    ),
                }
            }
            None => {
                let row = matrix
                    .images
                    .iter()
                    .find(|i| i.role == ImageRole::Cpu && i.default);
                match row {
                    Some(r) => pin_image(&r.reference, r.digest.as_deref(), lock),
                    None => pin_image("scratch", None, lock),
                }
            }
        };
        let cpu = cpu_plan(recipe, matrix, lock, override_row, &mut refusals);
        targets.push(TargetPlan {
            id: "cpu-fp32".into(),
            kind: TargetKind::Cpu,
            precision: Precision::Fp32,
            platform: Platform::X86_64,
            oci_platform: Platform::X86_64.oci().into(),
            gpu: None,
            tensorrt: None,
            cuda: None,
            cudnn: None,
            driver_floor: None,
            builder: None,
            cpu: Some(cpu),
            base,
            tag: String::new(),
            image: String::new(),
            notes: Vec::new(),
        });
    }
    // For a GPU base override, the recipe's digest pins GPU targets too.
    if let Some(b) = base_override {
        if let (_, Some(d)) = split_digest(&b.value) {
            for t in targets.iter_mut().filter(|t| t.kind == TargetKind::Gpu) {
                t.base.digest = Digest::parse(d).ok();
                t.base.pinned_by = PinnedBy::Recipe;
            }
        }
    }

    // 5. Order, then tags (a tag may use the id, so ids come first).
    targets.sort_by(|a, b| {
        let key = |t: &TargetPlan| {
            (
                t.kind,
                t.gpu.as_ref().map(|g| g.compute_capability),
                t.platform,
                t.precision,
            )
        };
        key(a).cmp(&key(b))
    });
    super::tag::apply(recipe, &mut targets, &mut refusals);

    if !refusals.is_empty() {
        recipe::sort_diagnostics(&mut refusals);
        return Err(super::Error::Refused {
            file: recipe.file.clone(),
            diagnostics: refusals,
        });
    }
    Ok(BuildPlan {
        recipe: recipe.file.clone(),
        model: recipe.model.name.clone(),
        version: recipe.model.version.clone(),
        repository: recipe.image.repository.value.clone(),
        matrix: matrix.origin.clone(),
        lock_file: lock::path_for(&recipe.file),
        targets,
    })
}

fn pin_text(p: &Located<Version>) -> String {
    format!("{} = \"{}\"", p.key, p.value)
}

fn major_minors(releases: &[&Release]) -> String {
    let mut v: Vec<String> = releases
        .iter()
        .map(|r| r.version.major_minor().to_string())
        .collect();
    v.dedup();
    v.join(", ")
}

#[allow(clippy::too_many_arguments)]
fn resolve_gpu_target<'m>(
    recipe: &Recipe,
    matrix: &'m Matrix,
    group: &GpuGroup<'m>,
    p: &Located<recipe::Precision>,
    precision: Precision,
    trt_pin: Option<&Version>,
    cuda_pin: Option<&Version>,
    driver: Option<&Version>,
    base_override: Option<&'m BaseImage>,
) -> Result<Choice<'m>, Diagnostic> {
    let file = recipe.file.as_path();
    let sm = group.cc.sm().to_string();
    let label = group.label();
    let trt_at = recipe.targets.tensorrt.as_ref();
    let at_trt_or_gpu = |r: Refusal| match trt_at {
        Some(t) => diag(file, t, r),
        None => diag(file, &group.at, r),
    };

    // GPU capability, independent of TensorRT: precisions need tensor cores.
    let tc = group.tensor_cores();
    let needs_tc = match precision {
        Precision::Fp8 => Some((
            "fp8-needs-sm89",
            "FP8 tensor cores (Ada sm_89, Hopper sm_90 or newer)",
            "fp16 or int8",
        )),
        Precision::Fp4 => Some((
            "fp4-needs-blackwell",
            "FP4 tensor cores (Blackwell sm_100 or newer)",
            "fp16, int8 or fp8",
        )),
        Precision::Bf16 => Some((
            "bf16-needs-sm80",
            "BF16 tensor cores (Ampere sm_80 or newer)",
            "fp16",
        )),
        _ => None,
    };
    if let Some((rule, what, instead)) = needs_tc {
        if !group.products.is_empty() && !tc.contains(&precision) {
            return Err(diag(file, p, Refusal {
                rule,
                message: format!("{precision} needs {what}; {label} has none"),
                hint: format!("build {instead} for {sm}, or drop {precision} for this GPU (a separate recipe can target the GPUs that have it)"),
            }));
        }
    }

    // Precisions the engine stage cannot produce a model for are refused here, so that every
    // target the plan accepts builds (docs/engines.md, "Precision").
    let not_built = match precision {
        Precision::Bf16 => Some("infer-build does not build bf16 engines: no BF16 converter runs without torch, and ONNX Runtime on the CPU cannot check a BF16 model's accuracy"),
        Precision::Fp4 => Some("infer-build cannot make FP4 models: ONNX Runtime has no FP4 quantiser, and ModelOpt needs torch"),
        _ => None,
    };
    if let Some(message) = not_built {
        return Err(diag(
            file,
            p,
            Refusal {
                rule: "precision-not-built",
                message: message.into(),
                hint: format!("build fp16, int8 or fp8 (sm_89 and newer) for {sm}"),
            },
        ));
    }

    let int8 = recipe.int8.as_ref();
    let calibration = int8.and_then(|i| i.calibration.as_ref());
    let qdq = int8.is_some_and(|i| i.qdq.value);
    // A TensorRT calibration cache (a file) needs TensorRT's own calibration (10.x and older);
    // calibration data (a directory) works everywhere: infer-build quantizes with it for 11.x.
    let uses_calibration = precision == Precision::Int8
        && calibration.is_some()
        && !qdq
        && int8.and_then(|i| i.calibration_is_cache) == Some(true);

    // Releases, newest first, through the filters. When one empties the set, say why.
    let all: Vec<&Release> = matrix.releases.iter().collect();
    let mut c: Vec<&Release> = match trt_pin {
        Some(pin) => all
            .iter()
            .copied()
            .filter(|r| pin.is_prefix_of(&r.version))
            .collect(),
        None => all.clone(),
    };
    if c.is_empty() {
        let pin = trt_at.map(pin_text).unwrap_or_default();
        return Err(at_trt_or_gpu(Refusal {
            rule: "known-tensorrt",
            message: format!("no TensorRT release in the compatibility matrix matches {pin}"),
            hint: format!("pin one of {}", major_minors(&all)),
        }));
    }

    let before = c.clone();
    c.retain(|r| r.incomplete.is_none());
    if c.is_empty() {
        let r = before[0];
        return Err(at_trt_or_gpu(Refusal {
            rule: "complete-tensorrt",
            message: format!("TensorRT {} is in the compatibility matrix but incomplete: {}", r.version, r.incomplete.as_deref().unwrap_or("")),
            hint: "pin an earlier release, or complete its row in matrix/tensorrt.toml and pass --matrix DIR".into(),
        }));
    }

    let before = c.clone();
    c.retain(|r| r.platforms.contains(&group.platform));
    if c.is_empty() {
        let newest_ok = all
            .iter()
            .find(|r| r.incomplete.is_none() && r.platforms.contains(&group.platform));
        let (rule, message) = if group.platform == Platform::Jetson
            && before.iter().all(|r| r.version.major() >= 11)
        {
            (
                "tensorrt-11-no-jetson",
                format!(
                    "TensorRT {}.x does not support Jetson (JetPack): {label} stays on TensorRT 10.x",
                    before[0].version.major()
                ),
            )
        } else {
            (
                "tensorrt-platform",
                format!(
                    "TensorRT {} is not released for {} ({label})",
                    before[0].version, group.platform
                ),
            )
        };
        return Err(at_trt_or_gpu(Refusal {
            rule,
            message,
            hint: match newest_ok {
                Some(r) => format!("pin tensorrt = \"{}\" (TensorRT {} is the newest for {}), or drop {} from targets.gpus", r.version.major(), r.version, group.platform, group.requested.join(", ")),
                None => format!("drop {} from targets.gpus", group.requested.join(", ")),
            },
        }));
    }

    let before = c.clone();
    c.retain(|r| r.min_cc <= group.cc && group.cc <= r.max_cc);
    if c.is_empty() {
        let fits = |r: &&&Release| {
            r.incomplete.is_none()
                && r.platforms.contains(&group.platform)
                && r.min_cc <= group.cc
                && group.cc <= r.max_cc
        };
        let newest_ok = all.iter().find(fits);
        let r = before[0];
        let (rule, message) = if group.cc < r.min_cc {
            let why = if group.cc == ComputeCapability::new(7, 0) {
                " (TensorRT 10.5 removed Volta)"
            } else {
                ""
            };
            (
                "tensorrt-min-sm",
                format!(
                    "TensorRT {} needs compute capability {} or newer; {label} is {}{why}",
                    r.version,
                    r.min_cc.dotted(),
                    group.cc.dotted()
                ),
            )
        } else {
            ("tensorrt-max-sm", format!("TensorRT {} has no kernels for {label}: it supports compute capability up to {}", r.version, r.max_cc.dotted()))
        };
        let hint = match (newest_ok, trt_at) {
            (Some(ok), Some(_)) => format!(
                "pin tensorrt = \"{}\" (the newest release for {sm}), or drop {} from targets.gpus",
                ok.version.major_minor(),
                group.requested.join(", ")
            ),
            (Some(ok), None) => format!("TensorRT {} supports {sm}", ok.version),
            (None, _) => format!("drop {} from targets.gpus", group.requested.join(", ")),
        };
        return Err(at_trt_or_gpu(Refusal {
            rule,
            message,
            hint,
        }));
    }

    let before = c.clone();
    c.retain(|r| r.precisions.contains(&precision));
    if c.is_empty() {
        return Err(diag(file, p, Refusal {
            rule: "tensorrt-precision",
            message: format!("TensorRT {} cannot build {precision} engines", before[0].version),
            hint: format!("pick another precision for {sm}, or pin a TensorRT release that supports {precision}"),
        }));
    }

    if uses_calibration {
        let before = c.clone();
        c.retain(|r| r.precision_api == PrecisionApi::BuilderFlags);
        if c.is_empty() {
            let at = calibration.map_or(p.clone().map(|_| ()), |l| l.clone().map(|_| ()));
            return Err(diag(file, &at, Refusal {
                rule: "int8-calibration-needs-tensorrt-10",
                message: format!("a TensorRT calibration cache needs TensorRT 10.x or older; TensorRT {} removed calibrators and implicit quantization and builds INT8 only from a model with Q/DQ nodes", before[0].version.major_minor()),
                hint: "point `[int8] calibration` at a directory of calibration batches (infer-build then quantizes the model to Q/DQ), or pin tensorrt = \"10\"".into(),
            }));
        }
    }

    if let Some(h) = &recipe.targets.hardware_compatibility {
        let level = h.value;
        if level == HardwareCompat::AmperePlus && group.cc < ComputeCapability::new(8, 0) {
            return Err(diag(file, h, Refusal {
                rule: "ampere-plus-needs-sm80",
                message: format!("hardware compatibility \"ampere+\" runs only on Ampere (sm_80) or newer; {label} is older"),
                hint: format!("drop targets.hardware_compatibility, or drop {} from targets.gpus", group.requested.join(", ")),
            }));
        }
        let before = c.clone();
        c.retain(|r| r.hardware_compat.contains(&level));
        if c.is_empty() {
            return Err(diag(file, h, Refusal {
                rule: "tensorrt-hardware-compat",
                message: format!("TensorRT {} does not build \"{}\" engines", before[0].version, h.value),
                hint: "use \"ampere+\" (TensorRT 8.6+), or a TensorRT release with \"same-compute-capability\" (10.9+)".into(),
            }));
        }
    }
    if let Some(vc) = recipe
        .targets
        .version_compatible
        .as_ref()
        .filter(|v| v.value)
    {
        let before = c.clone();
        c.retain(|r| r.version_compatible);
        if c.is_empty() {
            return Err(diag(
                file,
                vc,
                Refusal {
                    rule: "tensorrt-version-compatible",
                    message: format!(
                        "TensorRT {} does not build version-compatible engines",
                        before[0].version
                    ),
                    hint: "set targets.version_compatible = false, or use TensorRT 8.6 or newer"
                        .into(),
                },
            ));
        }
    }

    // Per release, per CUDA build (newest first), per base image: CUDA pin, base, glibc, driver.
    let mut any_cuda_pin_match = false;
    let mut any_base = false;
    let mut driver_misses: Vec<(Version, Version, Version)> = Vec::new(); // (cuda, floor, release)
                                                                          // Candidate (release, CUDA build) pairs. Without a stated driver: newest TensorRT first,
                                                                          // then its newest CUDA build. With one: the newest CUDA major the driver runs first (an
                                                                          // image on the CUDA line of the fleet's driver), then the newest TensorRT, then its newest
                                                                          // CUDA build of that major; the driver filter below drops what the driver cannot run.
    let mut pairs: Vec<(&'m Release, &Version)> = c
        .iter()
        .flat_map(|r| r.cuda_builds.iter().map(move |cb| (*r, cb)))
        .collect();
    if let Some(d) = driver {
        let runs = |major: u64| {
            matrix
                .toolkits
                .iter()
                .any(|t| t.version.major() == major && &t.min_driver <= d)
        };
        pairs.sort_by_key(|(_, cb)| {
            std::cmp::Reverse(if runs(cb.major()) { cb.major() } else { 0 })
        });
    }
    for (r, cb) in pairs {
        let bases_for = |cb: &Version| -> Vec<&'m BaseImage> {
            let mut v: Vec<&BaseImage> = matrix
                .images
                .iter()
                .filter(|i| i.role == ImageRole::Runtime && i.platforms.contains(&group.platform))
                .filter(|i| {
                    if group.platform == Platform::Jetson {
                        i.tensorrt.as_ref() == Some(&r.version)
                    } else {
                        i.tensorrt.is_none()
                            && i.cuda
                                .as_ref()
                                .is_some_and(|c| c.major_minor() == cb.major_minor())
                    }
                })
                .collect();
            v.sort_by(|a, b| b.cuda.cmp(&a.cuda));
            v
        };
        {
            if let Some(pin) = cuda_pin {
                if !pin.is_prefix_of(cb) {
                    continue;
                }
            }
            any_cuda_pin_match = true;
            // The CUDA major must compile for this SM (CUDA 11.8 stops at sm_90, 13.x starts at sm_75).
            if let Some(m) = matrix.cuda_major(cb.major()) {
                if group.platform != Platform::Jetson
                    && !(m.min_cc <= group.cc && group.cc <= m.max_cc)
                {
                    continue;
                }
            }
            for base in bases_for(cb) {
                if let Some(o) = base_override {
                    if o.reference != base.reference {
                        continue;
                    }
                }
                any_base = true;
                if let (Some(min), Some(have)) = (&r.glibc_min, &base.glibc) {
                    if have < min {
                        continue;
                    }
                }
                if group.platform != Platform::Jetson {
                    if let (Some(d), Some(cuda)) = (driver, &base.cuda) {
                        let floor = matrix.toolkit(cuda).map(|t| t.min_driver.clone());
                        if let Some(floor) = floor {
                            if &floor > d {
                                driver_misses.push((cuda.clone(), floor, r.version.clone()));
                                continue;
                            }
                        }
                    }
                }
                return Ok(Choice {
                    release: r,
                    cuda_build: cb.clone(),
                    base,
                });
            }
        }
    }

    if !any_cuda_pin_match {
        let pin = recipe.targets.cuda.as_ref();
        let mut builds: Vec<String> = c
            .iter()
            .flat_map(|r| r.cuda_builds.iter().map(|b| b.to_string()))
            .collect();
        builds.sort();
        builds.dedup();
        let r = Refusal {
            rule: "tensorrt-cuda-build",
            message: format!(
                "no TensorRT release that fits {label} has a CUDA {} build",
                pin.map_or(String::new(), |p| p.value.to_string())
            ),
            hint: format!("pin targets.cuda to one of {}", builds.join(", ")),
        };
        return Err(match pin {
            Some(pin) => diag(file, pin, r),
            None => diag(file, &group.at, r),
        });
    }
    if !any_base {
        let r = match base_override {
            Some(o) => Refusal {
                rule: "base-cuda-mismatch",
                message: format!(
                    "base image {} provides CUDA {}, but no TensorRT release that fits {label}{} has a build for it",
                    o.reference,
                    o.cuda.as_ref().map_or("?".into(), |c| c.to_string()),
                    trt_at.map_or(String::new(), |t| format!(" and {}", pin_text(t))),
                ),
                hint: "pick a base image whose CUDA matches a TensorRT build (see base-images/images.toml), or drop image.base".into(),
            },
            None => Refusal {
                rule: "base-image",
                message: format!("no base image in the compatibility matrix fits {label} on {}", group.platform),
                hint: "add a runtime image for this platform to base-images/images.toml and pass --matrix DIR".into(),
            },
        };
        return Err(match recipe.image.base.as_ref() {
            Some(b) => diag(file, b, r),
            None => diag(file, &group.at, r),
        });
    }
    if let (Some(d), Some((cuda, floor, release))) =
        (recipe.deploy.node_driver.as_ref(), driver_misses.first())
    {
        let driver = driver.map(|v| v.to_string()).unwrap_or_default();
        let major_floor = matrix
            .cuda_major(cuda.major())
            .map(|m| m.minor_compat_driver.clone());
        let pinned_by = if let Some(b) = recipe.image.base.as_ref() {
            Some(b.clone().map(|_| ()))
        } else if let Some(p) = recipe.targets.cuda.as_ref() {
            Some(p.clone().map(|_| ()))
        } else {
            trt_at.map(|p| p.clone().map(|_| ()))
        };
        let below_major = major_floor.as_ref().is_some_and(|m| &d.value < m);
        let (rule, message) = if cuda.major() >= 13 && below_major {
            (
                "cuda13-needs-driver-580",
                format!(
                    "CUDA {cuda} (base of TensorRT {release} for {label}) needs NVIDIA driver {floor} or newer, and no CUDA 13 image runs below driver 580; the fleet runs {driver} (deploy.node_driver)"
                ),
            )
        } else {
            (
                "driver-floor",
                format!("CUDA {cuda} (base of TensorRT {release} for {label}) needs NVIDIA driver {floor} or newer; the fleet runs {driver} (deploy.node_driver)"),
            )
        };
        let older = matrix
            .toolkits
            .iter()
            .find(|t| t.min_driver <= d.value)
            .map(|t| t.version.major_minor().to_string());
        let hint = match older {
            Some(o) => format!("upgrade the fleet's driver to {floor} or newer (R{} branch), or pin a base the fleet runs (CUDA {o} or older: targets.cuda = \"{o}\")", floor.major()),
            None => format!("upgrade the fleet's driver to {floor} or newer"),
        };
        let r = Refusal {
            rule,
            message,
            hint,
        };
        return Err(match pinned_by {
            Some(at) => diag(file, &at, r),
            None => diag(file, d, r),
        });
    }
    Err(diag(
        file,
        &group.at,
        Refusal {
            rule: "glibc",
            message: format!(
                "no base image has the glibc TensorRT {} needs for {label}",
                c[0].version
            ),
            hint: "add a newer base image to base-images/images.toml and pass --matrix DIR".into(),
        },
    ))
}

fn gpu_target(
    recipe: &Recipe,
    matrix: &Matrix,
    lock: Option<&Lock>,
    group: &GpuGroup,
    precision: Precision,
    choice: &Choice,
) -> TargetPlan {
    let r = choice.release;
    let sm = group.cc.target_id();
    let id = match group.platform {
        Platform::X86_64 => format!("{sm}-{precision}"),
        p => format!("{sm}-{p}-{precision}"),
    };
    let int8 = recipe.int8.as_ref();
    let qdq = int8.is_some_and(|i| i.qdq.value);
    let precision_mode = match (precision, r.precision_api) {
        (Precision::Fp32, _) => PrecisionMode::Native,
        (Precision::Int8, _) if qdq => PrecisionMode::Qdq,
        // infer-build quantizes to FP8 Q/DQ from `[fp8] calibration` (the recipe requires it).
        (Precision::Fp8, _) => PrecisionMode::Convert,
        (Precision::Fp4, _) => PrecisionMode::Qdq,
        // A TensorRT calibration cache: TensorRT's own (implicit) calibration, 10.x and older.
        (Precision::Int8, PrecisionApi::BuilderFlags)
            if int8.is_some_and(|i| i.calibration_is_cache == Some(true)) =>
        {
            PrecisionMode::Calibration
        }
        // Calibration data: infer-build quantizes to Q/DQ on the CPU (gated on accuracy), and
        // every TensorRT builds the explicit-quantization model.
        (Precision::Int8, _) if int8.is_some_and(|i| i.calibration.is_some()) => {
            PrecisionMode::Convert
        }
        // TensorRT 11 has no --fp16: infer-build makes the FP16 model itself.
        (Precision::Fp16, PrecisionApi::StronglyTyped) => PrecisionMode::Convert,
        (_, PrecisionApi::BuilderFlags) => PrecisionMode::BuilderFlag,
        (_, PrecisionApi::StronglyTyped) => PrecisionMode::StronglyTyped,
    };
    let cuda = choice.base.cuda.clone();
    let driver_floor = if group.platform == Platform::Jetson {
        None
    } else {
        cuda.as_ref()
            .and_then(|c| matrix.toolkit(c))
            .map(|t| t.min_driver.clone())
    };
    let mut base = pin_image(&choice.base.reference, choice.base.digest.as_deref(), lock);
    let lean = lean_runtime(recipe, matrix, group.platform, r, &choice.cuda_build);
    let mut notes = Vec::new();
    match &lean {
        Ok((glibc_base, _)) => {
            base = pin_image(&glibc_base.reference, glibc_base.digest.as_deref(), lock)
        }
        Err(Some(why)) => notes.push(format!(
            "full TensorRT runtime on {}: {why}{}",
            choice.base.reference,
            if recipe.targets.version_compatible.is_none() {
                " (so the engine is an ordinary one, not version-compatible)"
            } else {
                ""
            }
        )),
        Err(None) => {}
    }
    let lean = lean.ok().map(|(_, l)| l);
    // Unset: version-compatible exactly where the image is lean.
    let version_compatible = match &recipe.targets.version_compatible {
        Some(v) => v.value,
        None => lean.is_some(),
    };
    // A builder with exactly this TensorRT; the same CUDA minor is preferred, the same major
    // is enough (engines bind to the TensorRT version, not the CUDA minor).
    let builders: Vec<&BaseImage> = matrix
        .images
        .iter()
        .filter(|i| {
            i.role == ImageRole::Builder
                && i.platforms.contains(&group.platform)
                && i.tensorrt.as_ref() == Some(&r.version)
                && i.cuda
                    .as_ref()
                    .is_some_and(|c| c.major() == choice.cuda_build.major())
        })
        .collect();
    let builder = builders
        .iter()
        .find(|i| {
            i.cuda
                .as_ref()
                .is_some_and(|c| c.major_minor() == choice.cuda_build.major_minor())
        })
        .or(builders.first())
        .map(|i| pin_image(&i.reference, i.digest.as_deref(), lock));

    if !r.confirmed {
        notes.push(format!(
            "TensorRT {} matrix row not fully confirmed from a primary source",
            r.version
        ));
    }
    if !choice.base.confirmed {
        notes.push(format!(
            "base image {} not confirmed from a primary source",
            choice.base.reference
        ));
    }
    for g in group.products.iter().filter(|g| !g.confirmed) {
        notes.push(format!(
            "GPU {} matrix row not confirmed from a primary source",
            g.name
        ));
    }
    if precision_mode == PrecisionMode::Convert {
        notes.push(format!("infer-build converts the ONNX to {precision} and checks its accuracy on the CPU before the TensorRT {} build", r.version.major_minor()));
    }
    if precision_mode == PrecisionMode::Qdq {
        notes.push(format!("the model must carry {precision} Q/DQ nodes"));
    }
    if precision == Precision::Int8 && !group.tensor_cores().contains(&Precision::Int8) {
        notes.push(format!(
            "{} has no INT8 tensor cores: INT8 runs on DP4A and may not beat FP16",
            group.label()
        ));
    }
    if group.platform == Platform::Jetson {
        notes.push("Jetson: the driver comes with the L4T BSP of the base image".into());
    }
    if builder.is_none() {
        notes.push(format!("no builder image with TensorRT {} in the matrix: build the engine with a local trtexec {}", r.build, r.build));
    }

    TargetPlan {
        id,
        kind: TargetKind::Gpu,
        precision,
        platform: group.platform,
        oci_platform: group.platform.oci().into(),
        gpu: Some(GpuPlan {
            sm: sm.to_string(),
            compute_capability: group.cc,
            products: group.products.iter().map(|g| g.name.clone()).collect(),
            requested: group.requested.clone(),
            arch: group
                .products
                .first()
                .map_or_else(String::new, |g| g.arch.clone()),
            tensor_cores: group.tensor_cores(),
            mig: group.products.iter().map(|g| g.mig).max().unwrap_or(0),
        }),
        tensorrt: Some(TensorRtPlan {
            version: r.version.clone(),
            build: r.build.clone(),
            cuda_build: choice.cuda_build.major_minor(),
            precision_api: r.precision_api,
            precision_mode,
            version_compatible,
            hardware_compat: recipe
                .targets
                .hardware_compatibility
                .as_ref()
                .map(|h| h.value),
            confirmed: r.confirmed,
            lean,
        }),
        cuda,
        cudnn: Some(CudnnPlan {
            version: choice
                .base
                .cudnn
                .as_ref()
                .map_or_else(|| r.cudnn_version.clone(), |c| c.to_string()),
            need: r.cudnn,
        }),
        driver_floor,
        base,
        builder,
        cpu: None,
        tag: String::new(),
        image: String::new(),
        notes,
    }
}

/// The lean image of a version-compatible GPU target: the glibc base and TensorRT's lean runtime
/// library from its pinned wheel (`tensorrt-lean-cu<major>` of exactly this release). `Err(None)`
/// when the engine is not version-compatible (the full runtime is the only one that runs it),
/// `Err(Some(why))` when it is but the matrix lacks what a lean image needs, or the recipe names
/// its own base: then the target keeps the full runtime on its CUDA base.
fn lean_runtime<'m>(
    recipe: &Recipe,
    matrix: &'m Matrix,
    platform: Platform,
    r: &Release,
    cuda_build: &Version,
) -> Result<(&'m BaseImage, LibraryPin), Option<String>> {
    let asked = recipe.targets.version_compatible.as_ref().map(|v| v.value);
    if asked == Some(false) || !r.lean_runtime || !r.version_compatible {
        return Err(None);
    }
    if recipe.image.base.is_some() {
        return Err(Some("the recipe names the base image".into()));
    }
    let name = format!("tensorrt-lean-cu{}", cuda_build.major());
    let Some(row) = matrix.library(&name, platform, Some(&r.version)) else {
        return Err(Some(format!(
            "the compatibility matrix has no {name} {} library for {platform}",
            r.version
        )));
    };
    let Some(glibc) = matrix
        .glibc_cpu_base()
        .filter(|b| b.platforms.contains(&platform))
        .filter(|b| match (&b.glibc, &row.glibc_min) {
            (Some(have), Some(need)) => have >= need,
            _ => true,
        })
    else {
        return Err(Some(format!(
            "no glibc base image in the compatibility matrix for {platform} with glibc {} or newer",
            row.glibc_min.as_ref().map_or("-".into(), |v| v.to_string())
        )));
    };
    Ok((
        glibc,
        LibraryPin {
            name: row.name.clone(),
            version: row.version.clone(),
            sha256: row.sha256.clone(),
            path: row.load_path(),
        },
    ))
}

/// The CPU target's engine choice and what an ONNX Runtime image would need: the default glibc
/// base (or the recipe's CPU base when it has a glibc) and the library row. A recipe forcing
/// ONNX Runtime where the matrix has no glibc base or no library is refused at `engine.cpu`.
fn cpu_plan(
    recipe: &Recipe,
    matrix: &Matrix,
    lock: Option<&Lock>,
    override_row: Option<&BaseImage>,
    refusals: &mut Vec<Diagnostic>,
) -> CpuPlan {
    let engine = recipe.engine.cpu.value;
    let platform = Platform::X86_64;
    let glibc_row = override_row
        .filter(|r| r.role == ImageRole::Cpu && r.glibc.is_some())
        .or_else(|| matrix.glibc_cpu_base());
    let library = matrix.library("onnxruntime", platform, None);
    let mut plan = CpuPlan {
        engine,
        glibc_base: None,
        onnxruntime: None,
    };
    if engine == CpuEngine::Tract {
        return plan;
    }
    plan.glibc_base = glibc_row.map(|r| pin_image(&r.reference, r.digest.as_deref(), lock));
    plan.onnxruntime = library.map(|l| LibraryPin {
        name: l.name.clone(),
        version: l.version.clone(),
        sha256: l.sha256.clone(),
        path: l.load_path(),
    });
    if let (Some(b), Some(l)) = (glibc_row, library) {
        if let (Some(have), Some(need)) = (&b.glibc, &l.glibc_min) {
            if have < need {
                plan.glibc_base = None;
            }
        }
    }
    if engine == CpuEngine::OnnxRuntime {
        let at = &recipe.engine.cpu;
        if plan.glibc_base.is_none() {
            refusals.push(diag(&recipe.file, at, Refusal {
                rule: "cpu-glibc-base",
                message: format!("ONNX Runtime {} needs a glibc base image with glibc {} or newer, and the compatibility matrix has none for the CPU target", library.map_or("-".into(), |l| l.version.to_string()), library.and_then(|l| l.glibc_min.as_ref()).map_or("-".into(), |v| v.to_string())),
                hint: "add a role = \"cpu\" image with glibc and default = true to base-images/images.toml and pass --matrix DIR, or use engine.cpu = \"tract\"".into(),
            }));
        }
        if plan.onnxruntime.is_none() {
            refusals.push(diag(&recipe.file, at, Refusal {
                rule: "cpu-library",
                message: format!("the compatibility matrix has no onnxruntime library for {platform}"),
                hint: "add a row to matrix/runtime-libraries.toml and pass --matrix DIR, or use engine.cpu = \"tract\"".into(),
            }));
        }
    }
    plan
}
