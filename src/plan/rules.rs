//! The rules a GPU target's TensorRT release must pass, as data: [`RULES`] is the ordered list,
//! each rule a function that keeps the releases it accepts or refuses with its own text. The
//! first rule that removes the last candidate is what the user is told. What is left then walks
//! [`build_for`]: per release, per CUDA build, per base image (CUDA pin, the CUDA major's SMs,
//! base override, glibc, node driver); the first fit wins, and when none fits, [`no_build`] says
//! which of those stopped it.

use crate::matrix::{
    BaseImage, ComputeCapability, HardwareCompat, ImageRole, Matrix, Platform, Precision,
    PrecisionApi, Release, Version,
};
use crate::recipe::{Diagnostic, Located, Recipe};

use super::resolve::{diag, GpuGroup, Refusal};

/// One GPU target being resolved: everything the rules read.
pub(super) struct Ask<'a, 'm> {
    pub recipe: &'a Recipe,
    pub matrix: &'m Matrix,
    pub group: &'a GpuGroup<'m>,
    /// The precision, as the recipe's entry (where precision refusals point).
    pub precision: &'a Located<Precision>,
    /// `image.base` when it names a row of the matrix.
    pub base_override: Option<&'m BaseImage>,
}

impl Ask<'_, '_> {
    fn file(&self) -> &std::path::Path {
        &self.recipe.file
    }

    fn sm(&self) -> String {
        self.group.cc.sm().to_string()
    }

    fn requested(&self) -> String {
        self.group.requested.join(", ")
    }

    fn tensorrt_pin(&self) -> Option<&Located<Version>> {
        self.recipe.targets.tensorrt.as_ref()
    }

    fn cuda_pin(&self) -> Option<&Version> {
        self.recipe.targets.cuda.as_ref().map(|p| &p.value)
    }

    fn driver(&self) -> Option<&Version> {
        self.recipe.deploy.node_driver.as_ref().map(|p| &p.value)
    }

    /// At the TensorRT pin when there is one, else where the recipe names the GPU.
    fn at_tensorrt_or_gpu(&self, r: Refusal) -> Diagnostic {
        match self.tensorrt_pin() {
            Some(t) => diag(self.file(), t, r),
            None => diag(self.file(), &self.group.at, r),
        }
    }

    fn at_precision(&self, r: Refusal) -> Diagnostic {
        diag(self.file(), self.precision, r)
    }
}

/// The releases still in the running, newest first.
type Releases<'m> = Vec<&'m Release>;

/// A rule: the releases it keeps, or its refusal when it keeps none (or when the GPU itself
/// cannot have the target, whatever the release).
pub(super) type Rule =
    for<'a, 'm> fn(&Ask<'a, 'm>, Releases<'m>) -> Result<Releases<'m>, Diagnostic>;

/// The rules, in the order they run; the name is the rule's, its refusals may be more precise
/// (`platform` refuses as `tensorrt-11-no-jetson` or `tensorrt-platform`).
pub(super) const RULES: &[(&str, Rule)] = &[
    ("tensor-cores", tensor_cores),
    ("precision-built", precision_built),
    ("known-tensorrt", known_tensorrt),
    ("complete-tensorrt", complete_tensorrt),
    ("platform", platform),
    ("compute-capability", compute_capability),
    ("tensorrt-precision", tensorrt_precision),
    ("int8-calibration", int8_calibration),
    ("hardware-compatibility", hardware_compatibility),
    ("version-compatible", version_compatible),
];

/// What resolution picked for one GPU target.
pub(super) struct Choice<'m> {
    pub release: &'m Release,
    pub cuda_build: Version,
    pub base: &'m BaseImage,
}

/// Every rule over the matrix's releases, then the CUDA build and base image.
pub(super) fn choose<'m>(ask: &Ask<'_, 'm>) -> Result<Choice<'m>, Diagnostic> {
    let mut c: Releases<'m> = ask.matrix.releases.iter().collect();
    for (_, rule) in RULES {
        c = rule(ask, c)?;
    }
    build_for(ask, &c).map_err(|miss| no_build(ask, &c, &miss))
}

/// `c` without the releases `keep` rejects; when none is left, `refuse` of the newest release
/// there was.
fn keep<'m>(
    c: Releases<'m>,
    keep: impl Fn(&Release) -> bool,
    refuse: impl FnOnce(&'m Release) -> Diagnostic,
) -> Result<Releases<'m>, Diagnostic> {
    let kept: Releases<'m> = c.iter().copied().filter(|r| keep(r)).collect();
    match (kept.is_empty(), c.first()) {
        (true, Some(newest)) => Err(refuse(newest)),
        _ => Ok(kept),
    }
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

/// GPU capability, independent of TensorRT: some precisions need tensor cores the GPU has.
fn tensor_cores<'m>(ask: &Ask<'_, 'm>, c: Releases<'m>) -> Result<Releases<'m>, Diagnostic> {
    let precision = ask.precision.value;
    let (rule, what, instead) = match precision {
        Precision::Fp8 => (
            "fp8-needs-sm89",
            "FP8 tensor cores (Ada sm_89, Hopper sm_90 or newer)",
            "fp16 or int8",
        ),
        Precision::Fp4 => (
            "fp4-needs-blackwell",
            "FP4 tensor cores (Blackwell sm_100 or newer)",
            "fp16, int8 or fp8",
        ),
        Precision::Bf16 => (
            "bf16-needs-sm80",
            "BF16 tensor cores (Ampere sm_80 or newer)",
            "fp16",
        ),
        _ => return Ok(c),
    };
    let group = ask.group;
    if group.products.is_empty() || group.tensor_cores().contains(&precision) {
        return Ok(c);
    }
    let (label, sm) = (group.label(), ask.sm());
    Err(ask.at_precision(Refusal {
        rule,
        message: format!("{precision} needs {what}; {label} has none"),
        hint: format!("build {instead} for {sm}, or drop {precision} for this GPU (a separate recipe can target the GPUs that have it)"),
    }))
}

/// Precisions the engine stage cannot produce a model for are refused here, so that every
/// target the plan accepts builds (docs/engines.md, "Precision").
fn precision_built<'m>(ask: &Ask<'_, 'm>, c: Releases<'m>) -> Result<Releases<'m>, Diagnostic> {
    let message = match ask.precision.value {
        Precision::Bf16 => "infer-build does not build bf16 engines: no BF16 converter runs without torch, and ONNX Runtime on the CPU cannot check a BF16 model's accuracy",
        Precision::Fp4 => "infer-build cannot make FP4 models: ONNX Runtime has no FP4 quantiser, and ModelOpt needs torch",
        _ => return Ok(c),
    };
    Err(ask.at_precision(Refusal {
        rule: "precision-not-built",
        message: message.into(),
        hint: format!("build fp16, int8 or fp8 (sm_89 and newer) for {}", ask.sm()),
    }))
}

/// `targets.tensorrt` pins a release prefix; the matrix must have one that matches.
fn known_tensorrt<'m>(ask: &Ask<'_, 'm>, c: Releases<'m>) -> Result<Releases<'m>, Diagnostic> {
    let kept: Releases<'m> = match ask.tensorrt_pin() {
        Some(pin) => c
            .iter()
            .copied()
            .filter(|r| pin.value.is_prefix_of(&r.version))
            .collect(),
        None => c.clone(),
    };
    if !kept.is_empty() {
        return Ok(kept);
    }
    let pin = ask.tensorrt_pin().map(pin_text).unwrap_or_default();
    Err(ask.at_tensorrt_or_gpu(Refusal {
        rule: "known-tensorrt",
        message: format!("no TensorRT release in the compatibility matrix matches {pin}"),
        hint: format!("pin one of {}", major_minors(&c)),
    }))
}

/// A release row the matrix marks incomplete is never used.
fn complete_tensorrt<'m>(ask: &Ask<'_, 'm>, c: Releases<'m>) -> Result<Releases<'m>, Diagnostic> {
    keep(
        c,
        |r| r.incomplete.is_none(),
        |r| {
            ask.at_tensorrt_or_gpu(Refusal {
            rule: "complete-tensorrt",
            message: format!("TensorRT {} is in the compatibility matrix but incomplete: {}", r.version, r.incomplete.as_deref().unwrap_or("")),
            hint: "pin an earlier release, or complete its row in matrix/tensorrt.toml and pass --matrix DIR".into(),
        })
        },
    )
}

/// The release must be built for the GPU's platform (TensorRT 11 has no Jetson build).
fn platform<'m>(ask: &Ask<'_, 'm>, c: Releases<'m>) -> Result<Releases<'m>, Diagnostic> {
    let group = ask.group;
    let all_11 = c.iter().all(|r| r.version.major() >= 11);
    keep(
        c,
        |r| r.platforms.contains(&group.platform),
        |newest| {
            let label = group.label();
            let newest_ok = ask
                .matrix
                .releases
                .iter()
                .find(|r| r.incomplete.is_none() && r.platforms.contains(&group.platform));
            let (rule, message) = if group.platform == Platform::Jetson && all_11 {
                (
                "tensorrt-11-no-jetson",
                format!(
                    "TensorRT {}.x does not support Jetson (JetPack): {label} stays on TensorRT 10.x",
                    newest.version.major()
                ),
            )
            } else {
                (
                    "tensorrt-platform",
                    format!(
                        "TensorRT {} is not released for {} ({label})",
                        newest.version, group.platform
                    ),
                )
            };
            ask.at_tensorrt_or_gpu(Refusal {
            rule,
            message,
            hint: match newest_ok {
                Some(r) => format!("pin tensorrt = \"{}\" (TensorRT {} is the newest for {}), or drop {} from targets.gpus", r.version.major(), r.version, group.platform, ask.requested()),
                None => format!("drop {} from targets.gpus", ask.requested()),
            },
        })
        },
    )
}

/// The release must have kernels for the GPU's compute capability.
fn compute_capability<'m>(ask: &Ask<'_, 'm>, c: Releases<'m>) -> Result<Releases<'m>, Diagnostic> {
    let group = ask.group;
    let cc = group.cc;
    let fits_cc = |r: &Release| r.min_cc <= cc && cc <= r.max_cc;
    keep(c, fits_cc, |newest| {
        let label = group.label();
        let newest_ok = ask.matrix.releases.iter().find(|r| {
            r.incomplete.is_none() && r.platforms.contains(&group.platform) && fits_cc(r)
        });
        let (rule, message) = if cc < newest.min_cc {
            let why = if cc == ComputeCapability::new(7, 0) {
                " (TensorRT 10.5 removed Volta)"
            } else {
                ""
            };
            (
                "tensorrt-min-sm",
                format!(
                    "TensorRT {} needs compute capability {} or newer; {label} is {}{why}",
                    newest.version,
                    newest.min_cc.dotted(),
                    cc.dotted()
                ),
            )
        } else {
            ("tensorrt-max-sm", format!("TensorRT {} has no kernels for {label}: it supports compute capability up to {}", newest.version, newest.max_cc.dotted()))
        };
        let sm = ask.sm();
        let hint = match (newest_ok, ask.tensorrt_pin()) {
            (Some(ok), Some(_)) => format!(
                "pin tensorrt = \"{}\" (the newest release for {sm}), or drop {} from targets.gpus",
                ok.version.major_minor(),
                ask.requested()
            ),
            (Some(ok), None) => format!("TensorRT {} supports {sm}", ok.version),
            (None, _) => format!("drop {} from targets.gpus", ask.requested()),
        };
        ask.at_tensorrt_or_gpu(Refusal {
            rule,
            message,
            hint,
        })
    })
}

/// The release must build engines of the precision.
fn tensorrt_precision<'m>(ask: &Ask<'_, 'm>, c: Releases<'m>) -> Result<Releases<'m>, Diagnostic> {
    let precision = ask.precision.value;
    keep(
        c,
        |r| r.precisions.contains(&precision),
        |newest| {
            ask.at_precision(Refusal {
            rule: "tensorrt-precision",
            message: format!("TensorRT {} cannot build {precision} engines", newest.version),
            hint: format!("pick another precision for {}, or pin a TensorRT release that supports {precision}", ask.sm()),
        })
        },
    )
}

/// A TensorRT calibration cache (a file) needs TensorRT's own calibration (10.x and older);
/// calibration data (a directory) works everywhere: infer-build quantizes with it for 11.x.
fn int8_calibration<'m>(ask: &Ask<'_, 'm>, c: Releases<'m>) -> Result<Releases<'m>, Diagnostic> {
    let int8 = ask.recipe.int8.as_ref();
    let calibration = int8.and_then(|i| i.calibration.as_ref());
    let uses_cache = ask.precision.value == Precision::Int8
        && calibration.is_some()
        && !int8.is_some_and(|i| i.qdq.value)
        && int8.and_then(|i| i.calibration_is_cache) == Some(true);
    if !uses_cache {
        return Ok(c);
    }
    keep(
        c,
        |r| r.precision_api == PrecisionApi::BuilderFlags,
        |newest| {
            let at =
                calibration.map_or(ask.precision.clone().map(|_| ()), |l| l.clone().map(|_| ()));
            diag(ask.file(), &at, Refusal {
            rule: "int8-calibration-needs-tensorrt-10",
            message: format!("a TensorRT calibration cache needs TensorRT 10.x or older; TensorRT {} removed calibrators and implicit quantization and builds INT8 only from a model with Q/DQ nodes", newest.version.major_minor()),
            hint: "point `[int8] calibration` at a directory of calibration batches (infer-build then quantizes the model to Q/DQ), or pin tensorrt = \"10\"".into(),
        })
        },
    )
}

/// `targets.hardware_compatibility`: the GPU must be able to run it, the release build it.
fn hardware_compatibility<'m>(
    ask: &Ask<'_, 'm>,
    c: Releases<'m>,
) -> Result<Releases<'m>, Diagnostic> {
    let Some(h) = &ask.recipe.targets.hardware_compatibility else {
        return Ok(c);
    };
    let level = h.value;
    if level == HardwareCompat::AmperePlus && ask.group.cc < ComputeCapability::new(8, 0) {
        return Err(diag(ask.file(), h, Refusal {
            rule: "ampere-plus-needs-sm80",
            message: format!("hardware compatibility \"ampere+\" runs only on Ampere (sm_80) or newer; {} is older", ask.group.label()),
            hint: format!("drop targets.hardware_compatibility, or drop {} from targets.gpus", ask.requested()),
        }));
    }
    keep(
        c,
        |r| r.hardware_compat.contains(&level),
        |newest| {
            diag(ask.file(), h, Refusal {
            rule: "tensorrt-hardware-compat",
            message: format!("TensorRT {} does not build \"{}\" engines", newest.version, h.value),
            hint: "use \"ampere+\" (TensorRT 8.6+), or a TensorRT release with \"same-compute-capability\" (10.9+)".into(),
        })
        },
    )
}

/// `targets.version_compatible = true`: the release must build version-compatible engines.
fn version_compatible<'m>(ask: &Ask<'_, 'm>, c: Releases<'m>) -> Result<Releases<'m>, Diagnostic> {
    let Some(vc) = ask
        .recipe
        .targets
        .version_compatible
        .as_ref()
        .filter(|v| v.value)
    else {
        return Ok(c);
    };
    keep(
        c,
        |r| r.version_compatible,
        |newest| {
            diag(
                ask.file(),
                vc,
                Refusal {
                    rule: "tensorrt-version-compatible",
                    message: format!(
                        "TensorRT {} does not build version-compatible engines",
                        newest.version
                    ),
                    hint: "set targets.version_compatible = false, or use TensorRT 8.6 or newer"
                        .into(),
                },
            )
        },
    )
}

/// Why [`build_for`] found no CUDA build and base image: what each step saw.
#[derive(Default)]
struct Miss {
    /// Some CUDA build matched `targets.cuda` (or there is no pin).
    cuda_pin_matched: bool,
    /// Some base image fit a CUDA build (and the override, if any).
    base_found: bool,
    /// (CUDA, its driver floor, release) of bases the node driver is too old for.
    driver_misses: Vec<(Version, Version, Version)>,
}

/// The (release, CUDA build) pairs in the order they are tried. Without a stated driver: newest
/// TensorRT first, then its newest CUDA build. With one: the newest CUDA major the driver runs
/// first (an image on the CUDA line of the fleet's driver), then the newest TensorRT, then its
/// newest CUDA build of that major; the driver check drops what the driver cannot run.
fn pairs<'m>(ask: &Ask<'_, 'm>, c: &[&'m Release]) -> Vec<(&'m Release, &'m Version)> {
    let mut pairs: Vec<(&'m Release, &'m Version)> = c
        .iter()
        .flat_map(|r| r.cuda_builds.iter().map(move |cb| (*r, cb)))
        .collect();
    if let Some(d) = ask.driver() {
        let runs = |major: u64| {
            ask.matrix
                .toolkits
                .iter()
                .any(|t| t.version.major() == major && &t.min_driver <= d)
        };
        pairs.sort_by_key(|(_, cb)| {
            std::cmp::Reverse(if runs(cb.major()) { cb.major() } else { 0 })
        });
    }
    pairs
}

/// The runtime base images of release `r`'s CUDA build `cb` on the group's platform, newest
/// CUDA first (on Jetson: the images of exactly that TensorRT).
fn bases_for<'m>(ask: &Ask<'_, 'm>, r: &Release, cb: &Version) -> Vec<&'m BaseImage> {
    let platform = ask.group.platform;
    let mut v: Vec<&'m BaseImage> = ask
        .matrix
        .images
        .iter()
        .filter(|i| i.role == ImageRole::Runtime && i.platforms.contains(&platform))
        .filter(|i| {
            if platform == Platform::Jetson {
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
}

/// The first (release, CUDA build, base image) that passes the CUDA pin, the CUDA major's SM
/// range, the base override, glibc and the node driver.
fn build_for<'m>(ask: &Ask<'_, 'm>, c: &[&'m Release]) -> Result<Choice<'m>, Miss> {
    let group = ask.group;
    let mut miss = Miss::default();
    for (r, cb) in pairs(ask, c) {
        if ask.cuda_pin().is_some_and(|pin| !pin.is_prefix_of(cb)) {
            continue;
        }
        miss.cuda_pin_matched = true;
        // The CUDA major must compile for this SM (CUDA 11.8 stops at sm_90, 13.x starts at sm_75).
        if let Some(m) = ask.matrix.cuda_major(cb.major()) {
            if group.platform != Platform::Jetson && !(m.min_cc <= group.cc && group.cc <= m.max_cc)
            {
                continue;
            }
        }
        for base in bases_for(ask, r, cb) {
            if ask
                .base_override
                .is_some_and(|o| o.reference != base.reference)
            {
                continue;
            }
            miss.base_found = true;
            if let (Some(min), Some(have)) = (&r.glibc_min, &base.glibc) {
                if have < min {
                    continue;
                }
            }
            if group.platform != Platform::Jetson {
                if let (Some(d), Some(cuda)) = (ask.driver(), &base.cuda) {
                    if let Some(floor) = ask.matrix.toolkit(cuda).map(|t| &t.min_driver) {
                        if floor > d {
                            miss.driver_misses.push((
                                cuda.clone(),
                                floor.clone(),
                                r.version.clone(),
                            ));
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
    Err(miss)
}

/// The refusal for a [`Miss`]: the first step that stopped every pair, in walk order.
fn no_build(ask: &Ask<'_, '_>, c: &[&Release], miss: &Miss) -> Diagnostic {
    if !miss.cuda_pin_matched {
        return no_cuda_build(ask, c);
    }
    if !miss.base_found {
        return no_base(ask);
    }
    if let (Some(d), Some(first)) = (
        ask.recipe.deploy.node_driver.as_ref(),
        miss.driver_misses.first(),
    ) {
        return driver_too_old(ask, d, first);
    }
    diag(
        ask.file(),
        &ask.group.at,
        Refusal {
            rule: "glibc",
            message: format!(
                "no base image has the glibc TensorRT {} needs for {}",
                c.first().map_or("-".into(), |r| r.version.to_string()),
                ask.group.label()
            ),
            hint: "add a newer base image to base-images/images.toml and pass --matrix DIR".into(),
        },
    )
}

fn no_cuda_build(ask: &Ask<'_, '_>, c: &[&Release]) -> Diagnostic {
    let pin = ask.recipe.targets.cuda.as_ref();
    let mut builds: Vec<String> = c
        .iter()
        .flat_map(|r| r.cuda_builds.iter().map(|b| b.to_string()))
        .collect();
    builds.sort();
    builds.dedup();
    let r = Refusal {
        rule: "tensorrt-cuda-build",
        message: format!(
            "no TensorRT release that fits {} has a CUDA {} build",
            ask.group.label(),
            pin.map_or(String::new(), |p| p.value.to_string())
        ),
        hint: format!("pin targets.cuda to one of {}", builds.join(", ")),
    };
    match pin {
        Some(pin) => diag(ask.file(), pin, r),
        None => diag(ask.file(), &ask.group.at, r),
    }
}

fn no_base(ask: &Ask<'_, '_>) -> Diagnostic {
    let label = ask.group.label();
    let r = match ask.base_override {
        Some(o) => Refusal {
            rule: "base-cuda-mismatch",
            message: format!(
                "base image {} provides CUDA {}, but no TensorRT release that fits {label}{} has a build for it",
                o.reference,
                o.cuda.as_ref().map_or("?".into(), |c| c.to_string()),
                ask.tensorrt_pin().map_or(String::new(), |t| format!(" and {}", pin_text(t))),
            ),
            hint: "pick a base image whose CUDA matches a TensorRT build (see base-images/images.toml), or drop image.base".into(),
        },
        None => Refusal {
            rule: "base-image",
            message: format!("no base image in the compatibility matrix fits {label} on {}", ask.group.platform),
            hint: "add a runtime image for this platform to base-images/images.toml and pass --matrix DIR".into(),
        },
    };
    match ask.recipe.image.base.as_ref() {
        Some(b) => diag(ask.file(), b, r),
        None => diag(ask.file(), &ask.group.at, r),
    }
}

/// The node driver is below the floor of every base that fit: at the key that chose the CUDA
/// line (base, CUDA pin or TensorRT pin), else at `deploy.node_driver`.
fn driver_too_old(
    ask: &Ask<'_, '_>,
    d: &Located<Version>,
    (cuda, floor, release): &(Version, Version, Version),
) -> Diagnostic {
    let recipe = ask.recipe;
    let label = ask.group.label();
    let driver = &d.value;
    let major_floor = ask
        .matrix
        .cuda_major(cuda.major())
        .map(|m| m.minor_compat_driver.clone());
    let pinned_by = if let Some(b) = recipe.image.base.as_ref() {
        Some(b.clone().map(|_| ()))
    } else if let Some(p) = recipe.targets.cuda.as_ref() {
        Some(p.clone().map(|_| ()))
    } else {
        ask.tensorrt_pin().map(|p| p.clone().map(|_| ()))
    };
    let below_major = major_floor.as_ref().is_some_and(|m| driver < m);
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
    let older = ask
        .matrix
        .toolkits
        .iter()
        .find(|t| &t.min_driver <= driver)
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
    match pinned_by {
        Some(at) => diag(ask.file(), &at, r),
        None => diag(ask.file(), d, r),
    }
}
