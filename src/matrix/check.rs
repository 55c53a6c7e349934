//! Cross-table checks: rows carry sources, and the tables agree with each other. Run on every
//! load, so a `--matrix DIR` that contradicts itself is refused with the row that is wrong.

use std::collections::BTreeMap;

use super::{ImageRole, Matrix, Origin, Platform, Problem};

fn problem(origin: &Option<Origin>, key: &str, message: String) -> Problem {
    let (file, line) = origin
        .as_ref()
        .map_or((String::from("?"), 0), |o| (o.file.clone(), o.line));
    Problem {
        file,
        line,
        column: 1,
        key: Some(key.to_string()),
        message,
    }
}

fn check_sources(out: &mut Vec<Problem>, origin: &Option<Origin>, what: &str, sources: &[String]) {
    if sources.is_empty() {
        out.push(problem(
            origin,
            "source",
            format!("{what} has no source: every row names the public URL it was taken from"),
        ));
    }
    for s in sources {
        if !(s.starts_with("https://") || s.starts_with("http://")) {
            out.push(problem(
                origin,
                "source",
                format!("{what}: source \"{s}\" is not a URL"),
            ));
        }
    }
}

/// The checks, in the order their problems are reported. Each reads the whole matrix and adds
/// the problems of one rule; a new cross-table rule is a new entry.
type Check = fn(&Matrix, &mut Vec<Problem>);

const CHECKS: &[(&str, Check)] = &[
    ("sources", sources),
    ("libraries", libraries),
    ("cpu-features", cpu_features),
    ("unique-keys", unique_keys),
    ("releases", releases),
    ("toolkits", toolkits),
    ("gpus-covered", gpus_covered),
    ("images", images),
    ("cpu-defaults", cpu_defaults),
];

pub(super) fn check(m: &Matrix) -> Vec<Problem> {
    let mut out = Vec::new();
    for (_, check) in CHECKS {
        check(m, &mut out);
    }
    out
}

/// Every row has a source.
fn sources(m: &Matrix, out: &mut Vec<Problem>) {
    for r in &m.releases {
        check_sources(
            out,
            &r.origin,
            &format!("TensorRT {}", r.version),
            &r.source,
        );
    }
    for r in &m.cuda_majors {
        check_sources(out, &r.origin, &format!("CUDA {}", r.major), &r.source);
    }
    for r in &m.toolkits {
        check_sources(out, &r.origin, &format!("CUDA {}", r.version), &r.source);
    }
    for r in &m.gpus {
        check_sources(out, &r.origin, &format!("GPU {}", r.name), &r.source);
    }
    for r in &m.images {
        check_sources(out, &r.origin, &format!("image {}", r.reference), &r.source);
    }
}

/// CPU features: a source, a name the runtime reads with the same kernel flags (so the plan, the
/// build's record and the node check mean one thing), a CPU precision, a Node Feature Discovery
/// label, one row per name and platform.
fn cpu_features(m: &Matrix, out: &mut Vec<Problem>) {
    use infer_spec::engine::{CpuIsa, Precision};
    let mut seen = std::collections::BTreeSet::new();
    for f in &m.cpu_features {
        let what = format!("CPU feature {} ({})", f.name, f.platform);
        check_sources(out, &f.origin, &what, &f.source);
        if !seen.insert((f.name.clone(), f.platform)) {
            out.push(problem(
                &f.origin,
                "name",
                format!("{what} is listed twice"),
            ));
        }
        match CpuIsa::EXTENSIONS.iter().find(|(n, _)| *n == f.name) {
            None => out.push(problem(
                &f.origin,
                "name",
                format!(
                    "{what}: infer-serve reads no feature of that name (it reads {})",
                    CpuIsa::EXTENSIONS
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
            Some((_, flags)) if f.kernel_flags.iter().map(String::as_str).ne(flags.iter().copied()) => {
                out.push(problem(
                    &f.origin,
                    "kernel_flags",
                    format!(
                        "{what}: kernel_flags {:?} differ from the flags infer-serve reads for it, {flags:?}",
                        f.kernel_flags
                    ),
                ))
            }
            Some(_) => {}
        }
        if let Some(p) = f.computes.iter().find(|p| !Precision::CPU.contains(p)) {
            out.push(problem(
                &f.origin,
                "computes",
                format!("{what}: {p} is not a CPU target precision"),
            ));
        }
        if !f
            .nfd_label
            .starts_with("feature.node.kubernetes.io/cpu-cpuid.")
        {
            out.push(problem(
                &f.origin,
                "nfd_label",
                format!("{what}: nfd_label must be a Node Feature Discovery cpuid label (feature.node.kubernetes.io/cpu-cpuid.*)"),
            ));
        }
    }
}

/// Runtime libraries: a source, a sha256, a wheel on PyPI's file host, members by relative path, one row per name, version and platform.
fn libraries(m: &Matrix, out: &mut Vec<Problem>) {
    for l in &m.libraries {
        let what = format!("library {} {} ({})", l.name, l.version, l.platform);
        check_sources(out, &l.origin, &what, &l.source);
        if !crate::oci::digest::is_sha256_hex(&l.sha256) {
            out.push(problem(
                &l.origin,
                "sha256",
                format!("{what}: sha256 must be 64 lowercase hex digits"),
            ));
        }
        // Wheels come from the registry's file host over TLS, nowhere else.
        if !l.url.starts_with("https://files.pythonhosted.org/") || !l.url.ends_with(".whl") {
            out.push(problem(
                &l.origin,
                "url",
                format!("{what}: url must be a wheel on https://files.pythonhosted.org/"),
            ));
        }
        if !l.files.contains(&l.load) {
            out.push(problem(
                &l.origin,
                "load",
                format!("{what}: load \"{}\" is not one of files", l.load),
            ));
        }
        let bad_member = |f: &String| {
            f.is_empty()
                || f.starts_with('/')
                || f.split('/').any(|c| c.is_empty() || c == "." || c == "..")
        };
        if l.files.is_empty() || l.files.iter().any(bad_member) {
            out.push(problem(
                &l.origin,
                "files",
                format!("{what}: files must name wheel members by relative path"),
            ));
        }
        if !l.install_dir.starts_with('/')
            || l.install_dir
                .split('/')
                .skip(1)
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            out.push(problem(
                &l.origin,
                "install_dir",
                format!("{what}: install_dir must be an absolute, normal path"),
            ));
        }
        if m.libraries
            .iter()
            .filter(|o| o.name == l.name && o.platform == l.platform && o.version == l.version)
            .count()
            > 1
        {
            out.push(problem(
                &l.origin,
                "name",
                format!("{what}: one row per library, version and platform"),
            ));
        }
    }
}

/// Unique keys: releases, toolkits, GPU names and aliases, image references.
fn unique_keys(m: &Matrix, out: &mut Vec<Problem>) {
    let mut seen = BTreeMap::new();
    for r in &m.releases {
        if seen.insert(r.version.to_string(), ()).is_some() {
            out.push(problem(
                &r.origin,
                "version",
                format!("TensorRT {} is listed twice", r.version),
            ));
        }
    }
    let mut seen = BTreeMap::new();
    for r in &m.toolkits {
        if seen.insert(r.version.to_string(), ()).is_some() {
            out.push(problem(
                &r.origin,
                "version",
                format!("CUDA {} is listed twice", r.version),
            ));
        }
    }
    let mut names = BTreeMap::new();
    for g in &m.gpus {
        for n in std::iter::once(&g.name).chain(&g.aliases) {
            let key = super::normalize(n);
            if let Some(other) = names.insert(key, g.name.clone()) {
                out.push(problem(
                    &g.origin,
                    "name",
                    format!("GPU name \"{n}\" is also used by {other}"),
                ));
            }
        }
    }
    let mut refs = BTreeMap::new();
    for i in &m.images {
        if refs.insert(i.reference.clone(), ()).is_some() {
            out.push(problem(
                &i.origin,
                "reference",
                format!("image {} is listed twice", i.reference),
            ));
        }
    }
}

/// TensorRT releases: CC range, CUDA builds with a driver floor and a runtime image.
fn releases(m: &Matrix, out: &mut Vec<Problem>) {
    for r in &m.releases {
        if r.min_cc > r.max_cc {
            out.push(problem(
                &r.origin,
                "min_cc",
                format!(
                    "TensorRT {}: min_cc {} is above max_cc {}",
                    r.version,
                    r.min_cc.dotted(),
                    r.max_cc.dotted()
                ),
            ));
        }
        if r.platforms.is_empty() {
            out.push(problem(
                &r.origin,
                "platforms",
                format!("TensorRT {} lists no platform", r.version),
            ));
        }
        if r.cuda_builds.is_empty() {
            out.push(problem(
                &r.origin,
                "cuda_builds",
                format!("TensorRT {} lists no CUDA build", r.version),
            ));
        }
        if r.incomplete.is_some() {
            // Listed for completeness, never selected: its missing facts are said in `incomplete`.
            continue;
        }
        for cb in &r.cuda_builds {
            let mm = cb.major_minor();
            if m.cuda_major(cb.major()).is_none() {
                out.push(problem(
                    &r.origin,
                    "cuda_builds",
                    format!(
                        "TensorRT {}: CUDA {} has no [[major]] row in matrix/cuda.toml",
                        r.version,
                        cb.major()
                    ),
                ));
            }
            if !m.toolkits.iter().any(|t| t.version.major_minor() == mm) {
                out.push(problem(&r.origin, "cuda_builds", format!("TensorRT {}: CUDA build {} has no [[toolkit]] row (driver floor) in matrix/cuda.toml", r.version, cb)));
            }
            for p in r.platforms.iter().filter(|p| **p != Platform::Jetson) {
                let has_image = m.images.iter().any(|i| {
                    i.role == ImageRole::Runtime
                        && i.platforms.contains(p)
                        && i.cuda.as_ref().is_some_and(|c| c.major_minor() == mm)
                });
                if !has_image {
                    out.push(problem(
                        &r.origin,
                        "cuda_builds",
                        format!(
                            "TensorRT {}: no runtime base image provides CUDA {} on {}",
                            r.version, cb, p
                        ),
                    ));
                }
            }
        }
    }
}

/// CUDA toolkits: their major has a row; driver floors do not fall below the major's floor.
fn toolkits(m: &Matrix, out: &mut Vec<Problem>) {
    for t in &m.toolkits {
        match m.cuda_major(t.version.major()) {
            None => out.push(problem(
                &t.origin,
                "version",
                format!(
                    "CUDA {}: no [[major]] row for CUDA {}",
                    t.version,
                    t.version.major()
                ),
            )),
            Some(maj) if t.min_driver < maj.minor_compat_driver => out.push(problem(
                &t.origin,
                "min_driver",
                format!(
                    "CUDA {}: min_driver {} is below the CUDA {} floor {}",
                    t.version, t.min_driver, maj.major, maj.minor_compat_driver
                ),
            )),
            Some(_) => {}
        }
    }
}

/// GPUs: some selectable release supports each one.
fn gpus_covered(m: &Matrix, out: &mut Vec<Problem>) {
    for g in &m.gpus {
        let covered = m.releases.iter().any(|r| {
            r.incomplete.is_none()
                && r.min_cc <= g.cc
                && g.cc <= r.max_cc
                && r.platforms.contains(&g.platform)
        });
        if !covered {
            out.push(problem(&g.origin, "cc", format!("GPU {} (sm {}) on {} is supported by no TensorRT release in matrix/tensorrt.toml", g.name, g.cc.dotted(), g.platform)));
        }
    }
}

/// Base images: what they provide exists in the other tables, and each role says what it must.
fn images(m: &Matrix, out: &mut Vec<Problem>) {
    for i in &m.images {
        if let Some(d) = &i.digest {
            if crate::oci::hex_of(d).is_none() {
                out.push(problem(&i.origin, "digest", format!("image {}: digest \"{d}\" is not sha256: followed by 64 lowercase hex digits", i.reference)));
            }
            if i.digest_source.is_none() {
                out.push(problem(&i.origin, "digest_source", format!("image {}: a digest needs the public source that gives it (digest_source); without one, leave the digest to the lock file", i.reference)));
            }
        }
        if i.platforms.is_empty() {
            out.push(problem(
                &i.origin,
                "platforms",
                format!("image {} lists no platform", i.reference),
            ));
        }
        let jetson_only = i.platforms.iter().all(|p| *p == Platform::Jetson);
        if let Some(c) = &i.cuda {
            // Jetson CUDA comes with JetPack under its own patch numbers: match the minor only.
            let known = if jetson_only {
                m.toolkits
                    .iter()
                    .any(|t| t.version.major_minor() == c.major_minor())
            } else {
                m.toolkit(c).is_some()
            };
            if !known {
                out.push(problem(
                    &i.origin,
                    "cuda",
                    format!(
                        "image {}: CUDA {} has no [[toolkit]] row in matrix/cuda.toml",
                        i.reference, c
                    ),
                ));
            }
        }
        if let Some(t) = &i.tensorrt {
            match m.release(t) {
                None => out.push(problem(
                    &i.origin,
                    "tensorrt",
                    format!(
                        "image {}: TensorRT {} has no [[release]] row in matrix/tensorrt.toml",
                        i.reference, t
                    ),
                )),
                Some(r) => {
                    for p in &i.platforms {
                        if !r.platforms.contains(p) {
                            out.push(problem(
                                &i.origin,
                                "tensorrt",
                                format!(
                                    "image {}: TensorRT {} is not released for {}",
                                    i.reference, t, p
                                ),
                            ));
                        }
                    }
                }
            }
        }
        match i.role {
            ImageRole::Runtime if i.cuda.is_none() => {
                out.push(problem(
                    &i.origin,
                    "cuda",
                    format!(
                        "runtime image {} must say which CUDA it provides",
                        i.reference
                    ),
                ));
            }
            ImageRole::Builder if i.tensorrt.is_none() || i.cuda.is_none() => {
                out.push(problem(
                    &i.origin,
                    "tensorrt",
                    format!(
                        "builder image {} must say which TensorRT and CUDA it provides",
                        i.reference
                    ),
                ));
            }
            ImageRole::Runtime if jetson_only && i.tensorrt.is_none() => {
                out.push(problem(
                    &i.origin,
                    "tensorrt",
                    format!(
                        "Jetson image {} must say which TensorRT its JetPack ships",
                        i.reference
                    ),
                ));
            }
            _ => {}
        }
    }
}

/// One default per CPU flavour: the static (no glibc) and the glibc one.
fn cpu_defaults(m: &Matrix, out: &mut Vec<Problem>) {
    let cpu = |glibc: bool| {
        m.images
            .iter()
            .filter(|i| i.role == ImageRole::Cpu && i.default && i.glibc.is_some() == glibc)
            .count()
    };
    let (cpu_defaults, glibc_defaults) = (cpu(false), cpu(true));
    if cpu_defaults != 1 {
        let origin = m.images.first().and_then(|i| i.origin.clone());
        out.push(problem(&origin, "default", format!("exactly one image with role = \"cpu\" and no glibc must have default = true (found {cpu_defaults})")));
    }
    if glibc_defaults > 1 {
        let origin = m.images.first().and_then(|i| i.origin.clone());
        out.push(problem(&origin, "default", format!("at most one image with role = \"cpu\" and a glibc may have default = true (found {glibc_defaults})")));
    }
}
