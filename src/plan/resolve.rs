//! Target resolution: recipe × matrix (× lock) → targets, or every refusal at once.
//!
//! The steps in order: the recipe's GPUs grouped by SM and platform ([`gpu_groups`]), the base
//! override checked, each group × precision through the release rules ([`super::rules`]) and
//! made a target ([`gpu_target`]), the CPU target ([`cpu_target`]), then order and tags. Every
//! refusal is collected; the plan is made only when there is none.

use std::collections::BTreeMap;
use std::path::Path;

use crate::matrix::{
    self, BaseImage, ComputeCapability, ImageRole, Matrix, Platform, Precision, PrecisionApi,
    Release, Version,
};
use crate::recipe::{self, CpuEngine, Diagnostic, Located, Recipe};
use infer_spec::engine::EngineKind;

use super::lock::{self, Lock};
use super::rules::{self, Ask, Choice};
use super::types::*;
use crate::oci::Digest;

/// A refusal before it is placed in the recipe: the rule's name, the message and the way out.
pub(super) struct Refusal {
    pub rule: &'static str,
    pub message: String,
    pub hint: String,
}

pub(super) fn diag<T>(file: &Path, at: &Located<T>, r: Refusal) -> Diagnostic {
    at.diagnostic(file, format!("{} [rule: {}]", r.message, r.rule))
        .with_hint(r.hint)
}

/// One GPU architecture the recipe asks for: an SM on a platform, with its products.
pub(super) struct GpuGroup<'m> {
    pub cc: ComputeCapability,
    pub platform: Platform,
    /// Matrix rows of the products (deduplicated, in matrix order).
    pub products: Vec<&'m matrix::Gpu>,
    /// What the recipe wrote, in recipe order.
    pub requested: Vec<String>,
    /// Where the recipe first names this group.
    pub at: Located<()>,
}

impl GpuGroup<'_> {
    pub(super) fn label(&self) -> String {
        let names: Vec<&str> = self.products.iter().map(|g| g.name.as_str()).collect();
        if names.is_empty() {
            self.cc.sm().to_string()
        } else {
            format!("{} ({})", names.join(", "), self.cc.sm())
        }
    }

    pub(crate) fn tensor_cores(&self) -> Vec<Precision> {
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

/// Resolve `recipe` against `matrix`; `lock` supplies digests recorded at earlier pulls.
pub fn resolve(
    recipe: &Recipe,
    matrix: &Matrix,
    lock: Option<&Lock>,
) -> Result<BuildPlan, super::Error> {
    let mut refusals: Vec<Diagnostic> = Vec::new();
    let groups = gpu_groups(recipe, matrix, &mut refusals);
    // The base image override must be one the matrix knows, for GPU targets (its CUDA decides
    // the build); CPU targets accept any base.
    let override_row: Option<&BaseImage> = recipe
        .image
        .base
        .as_ref()
        .and_then(|b| matrix.image(split_digest(&b.value).0));
    check_base_override(
        recipe,
        matrix,
        !groups.is_empty(),
        override_row,
        &mut refusals,
    );

    let mut targets: Vec<TargetPlan> = Vec::new();
    for group in groups.values() {
        for p in &recipe.targets.precision {
            let ask = Ask {
                recipe,
                matrix,
                group,
                precision: p,
                base_override: override_row,
            };
            match rules::choose(&ask) {
                Err(d) => refusals.push(d),
                Ok(choice) => {
                    targets.push(gpu_target(recipe, matrix, lock, group, p.value, &choice))
                }
            }
        }
    }
    for p in &recipe.targets.cpu {
        targets.push(cpu_target(
            recipe,
            matrix,
            lock,
            override_row,
            p,
            &mut refusals,
        ));
    }
    // For a GPU base override, the recipe's digest pins GPU targets too.
    if let Some((_, Some(d))) = recipe.image.base.as_ref().map(|b| split_digest(&b.value)) {
        for t in targets.iter_mut().filter(|t| t.kind == TargetKind::Gpu) {
            t.base.digest = Digest::parse(d).ok();
            t.base.pinned_by = PinnedBy::Recipe;
        }
    }

    // Order, then tags (a tag may use the id, so ids come first).
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

/// The recipe's GPUs as groups by (SM, platform), products merged; unknown GPUs refused.
fn gpu_groups<'m>(
    recipe: &Recipe,
    matrix: &'m Matrix,
    refusals: &mut Vec<Diagnostic>,
) -> BTreeMap<(ComputeCapability, Platform), GpuGroup<'m>> {
    let file = recipe.file.as_path();
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
    groups
}

/// `image.base` for GPU targets: a row of the matrix, which says its CUDA. (Its digest, when
/// pinned, is checked where the recipe is read: `recipe::validate`.)
fn check_base_override(
    recipe: &Recipe,
    matrix: &Matrix,
    has_gpu_targets: bool,
    override_row: Option<&BaseImage>,
    refusals: &mut Vec<Diagnostic>,
) {
    let file = recipe.file.as_path();
    let base_override = recipe.image.base.as_ref();
    if let Some(b) = base_override {
        let (reference, _) = split_digest(&b.value);
        if has_gpu_targets && override_row.is_none() {
            refusals.push(diag(file, b, Refusal {
                rule: "known-base",
                message: format!("base image {reference} is not in the compatibility matrix, so its CUDA version is unknown"),
                hint: format!("use a runtime image from base-images/images.toml (such as {}), or add a row for it and pass --matrix DIR", matrix.images.iter().find(|i| i.role == ImageRole::Runtime).map_or("-", |i| i.reference.as_str())),
            }));
        }
    }
}

/// The CPU target: its base (the recipe's CPU base, or the matrix's default) and engine plan.
fn cpu_target(
    recipe: &Recipe,
    matrix: &Matrix,
    lock: Option<&Lock>,
    override_row: Option<&BaseImage>,
    precision: &Located<Precision>,
    refusals: &mut Vec<Diagnostic>,
) -> TargetPlan {
    let base_override = recipe.image.base.as_ref();
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
    let mut cpu = cpu_plan(recipe, matrix, lock, override_row, precision, refusals);
    let features = matrix.cpu_features_for(precision.value, Platform::X86_64);
    cpu.features = features
        .iter()
        .map(|f| CpuFeaturePin {
            name: f.name.clone(),
            nfd_label: f.nfd_label.clone(),
        })
        .collect();
    let mut notes = Vec::new();
    if precision.value != Precision::Fp32 {
        let names: Vec<&str> = features.iter().map(|f| f.name.as_str()).collect();
        let int8 = precision.value == Precision::Int8;
        notes.push(format!(
            "{}, checked against FP32 by the accuracy gate; {}",
            if int8 {
                format!("infer-build quantises the model to INT8 Q/DQ from [int8] calibration data and {} computes it with INT8 kernels", cpu.engine.as_str())
            } else {
                format!("{} computes the FP32 model in {} (its inference precision)", cpu.engine.as_str(), precision.value)
            },
            match (names.is_empty(), int8) {
                (true, _) => "the matrix names no CPU feature that computes it at speed (matrix/cpus.toml)".to_owned(),
                (false, true) => format!("at speed on CPUs with {} (matrix/cpus.toml), slower elsewhere", names.join(" or ")),
                (false, false) => format!(
                    "at speed on CPUs with {} (matrix/cpus.toml): the engine is built on such a CPU, and a node without one runs it in FP32, slower, with a warning",
                    names.join(" or ")
                ),
            }
        ));
    }
    TargetPlan {
        id: format!("cpu-{}", precision.value),
        kind: TargetKind::Cpu,
        precision: precision.value,
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
        notes,
    }
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
    let precision_mode = precision_mode(recipe, precision, r.precision_api);
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
    let builder = builder_image(matrix, lock, group.platform, choice);

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

/// How a GPU target gets its precision: natively, from builder flags, or from a model
/// infer-build converts or the recipe's Q/DQ nodes.
fn precision_mode(recipe: &Recipe, precision: Precision, api: PrecisionApi) -> PrecisionMode {
    let int8 = recipe.int8.as_ref();
    let qdq = int8.is_some_and(|i| i.qdq.value);
    match (precision, api) {
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
    }
}

/// A builder image with exactly this TensorRT; the same CUDA minor is preferred, the same major
/// is enough (engines bind to the TensorRT version, not the CUDA minor).
fn builder_image(
    matrix: &Matrix,
    lock: Option<&Lock>,
    platform: Platform,
    choice: &Choice,
) -> Option<ImagePin> {
    let builders: Vec<&BaseImage> = matrix
        .images
        .iter()
        .filter(|i| {
            i.role == ImageRole::Builder
                && i.platforms.contains(&platform)
                && i.tensorrt.as_ref() == Some(&choice.release.version)
                && i.cuda
                    .as_ref()
                    .is_some_and(|c| c.major() == choice.cuda_build.major())
        })
        .collect();
    builders
        .iter()
        .find(|i| {
            i.cuda
                .as_ref()
                .is_some_and(|c| c.major_minor() == choice.cuda_build.major_minor())
        })
        .or(builders.first())
        .map(|i| pin_image(&i.reference, i.digest.as_deref(), lock))
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
    precision: &Located<Precision>,
    refusals: &mut Vec<Diagnostic>,
) -> CpuPlan {
    // A precision beyond FP32 narrows `auto` to the engines that compute in it (the recipe
    // refuses a forced engine that does not).
    let mut engine = recipe.engine.cpu.value;
    let able: Vec<EngineKind> = EngineKind::cpu_engines()
        .filter(|d| d.computes(precision.value))
        .map(|d| d.kind)
        .collect();
    if precision.value != Precision::Fp32 && engine == CpuEngine::Auto && able.len() == 1 {
        engine = CpuEngine::Only(able[0]);
    }
    let narrowed = engine != recipe.engine.cpu.value;
    let platform = Platform::X86_64;
    let glibc_row = override_row
        .filter(|r| r.role == ImageRole::Cpu && r.glibc.is_some())
        .or_else(|| matrix.glibc_cpu_base());
    let library = matrix.library("onnxruntime", platform, None);
    let mut plan = CpuPlan {
        engine,
        glibc_base: None,
        onnxruntime: None,
        openvino: None,
        features: Vec::new(),
    };
    if engine == CpuEngine::TRACT {
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
    // OpenVINO where the matrix has it for the platform and the base's glibc is new enough.
    let openvino = matrix.library("openvino", platform, None);
    plan.openvino = openvino
        .filter(|l| {
            !matches!((glibc_row.and_then(|b| b.glibc.as_ref()), &l.glibc_min),
                (Some(have), Some(need)) if have < need)
        })
        .map(|l| LibraryPin {
            name: l.name.clone(),
            version: l.version.clone(),
            sha256: l.sha256.clone(),
            path: l.load_path(),
        });
    if engine == CpuEngine::OPENVINO {
        // Forced by the recipe's engine.cpu, or by a precision only OpenVINO computes in: the
        // refusal points at what forced it and says how out of it.
        let (at, why, way_out) = if narrowed {
            (
                precision.clone().map(|_| CpuEngine::OPENVINO),
                format!("{} on the CPU runs on OpenVINO: ", precision.value),
                Some(format!("remove \"{}\" from targets.cpu", precision.value)),
            )
        } else {
            (recipe.engine.cpu.clone(), String::new(), None)
        };
        if plan.glibc_base.is_none() {
            refusals.push(diag(&recipe.file, &at, Refusal {
                rule: "cpu-glibc-base",
                message: format!("{why}OpenVINO needs a glibc base image, and the compatibility matrix has none for the CPU target"),
                hint: format!("add a role = \"cpu\" image with glibc and default = true to base-images/images.toml and pass --matrix DIR, or {}", way_out.clone().unwrap_or_else(|| "use engine.cpu = \"tract\"".into())),
            }));
        }
        if plan.openvino.is_none() {
            let glibc = match (openvino, glibc_row.and_then(|b| b.glibc.as_ref())) {
                (Some(l), Some(have)) => format!(
                    " that runs on the base's glibc {have} (OpenVINO {} needs {})",
                    l.version,
                    l.glibc_min.as_ref().map_or("-".into(), ToString::to_string)
                ),
                _ => String::new(),
            };
            refusals.push(diag(&recipe.file, &at, Refusal {
                rule: "cpu-library",
                message: format!("{why}the compatibility matrix has no openvino library for {platform}{glibc}"),
                hint: format!("add a row to matrix/runtime-libraries.toml and pass --matrix DIR, or {}", way_out.unwrap_or_else(|| "use engine.cpu = \"auto\"".into())),
            }));
        }
    }
    if engine == CpuEngine::ONNXRUNTIME {
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
