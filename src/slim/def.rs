//! Slim base definitions (`base-images/slim/*.toml`): "start from image A, add these files of
//! image B and their shared-library closure". Pure: text in, validated [`Definition`] out.

use std::collections::BTreeSet;

use serde::Deserialize;

use super::Error;

/// Which TensorRT plans a definition serves: the plan's compatibility mode, read from its engine
/// metadata (`GpuMeta`). Decides which runtime libraries the slim base keeps.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum PlanCompat {
    /// Built with `kVERSION_COMPATIBLE`: runs on the dispatch + lean runtime.
    VersionCompatible,
    /// Any other engine: needs the full `libnvinfer` of the exact version that built it.
    Full,
}

impl PlanCompat {
    /// The spelling of definitions and reports: `version-compatible` or `full`.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanCompat::VersionCompatible => "version-compatible",
            PlanCompat::Full => "full",
        }
    }
}

impl std::fmt::Display for PlanCompat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tactic source whose library is loaded at run time only when the engine uses it.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Tactic {
    Cudnn,
    Cublas,
    Cublaslt,
}

/// Which side wins when a file copied from the builder exists in the base with other content.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Winner {
    Base,
    Builder,
}

/// An image reference, spelled as in `base-images/images.toml`: a name for people and the
/// digest that is actually used.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ImageRef {
    /// `registry/repository:tag`, for people, for the lock file and for
    /// `org.opencontainers.image.base.name`.
    pub reference: String,
    /// `sha256:<64 hex>` of the manifest (or index), ONLY where a public source gives it, named
    /// in `digest_source`. Absent: the image is pinned at its first pull through the recipe's
    /// lock file (`plan::lock`).
    #[serde(default)]
    pub digest: Option<String>,
    #[serde(default)]
    pub digest_source: Option<String>,
}

/// Files to take from the builder: by path or glob (`*` stays inside one directory, `**` crosses
/// directories), all absolute paths inside the image.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    pub paths: Vec<String>,
    /// Who wins when a selected file, or a dependency reached from it, exists in the base with
    /// different content. Absent: such a file fails the build.
    #[serde(default)]
    pub on_conflict: Option<Winner>,
    /// Take this selection only when the engine uses this tactic source.
    #[serde(default)]
    pub when_tactic: Option<Tactic>,
}

/// How dependencies are searched and what is never copied.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClosureSpec {
    /// Extra library directories (ld.so.conf-style), searched after `DT_RPATH` and before
    /// `DT_RUNPATH`, exactly as `LD_LIBRARY_PATH` is: the slim image's config gets them as its
    /// `LD_LIBRARY_PATH`, so what is resolved here is what the loader does at run time.
    #[serde(default)]
    pub search_dirs: Vec<String>,
    /// Library names (globs on the file name) left out on top of [`TOOLKIT_INJECTED`]: they
    /// must come from the node at run time, and are listed in the build output.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Paths (globs) never copied even when selected, e.g. the builder-only
    /// `libnvinfer_builder_resource*`; a dependency that resolves to one fails the build.
    #[serde(default)]
    pub drop: Vec<String>,
}

/// One slim base definition.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    /// Identifier, unique in `base-images/slim/`.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The engines it serves.
    pub engine: PlanCompat,
    /// The TensorRT major (or major.minor) it carries; informational for people and `plan`.
    #[serde(default)]
    pub tensorrt: Option<String>,
    /// Image A: the layers of the result start with all of its layers.
    pub base: ImageRef,
    /// Image B: files are taken from it.
    pub builder: ImageRef,
    #[serde(default)]
    pub closure: ClosureSpec,
    #[serde(rename = "select")]
    pub selections: Vec<Selection>,
}

/// Libraries the NVIDIA container toolkit mounts from the node's driver at run time
/// (libnvidia-container's compute, utility, video and graphics lists). Copying them from a
/// builder would shadow the driver actually present on the node, so they are never copied.
pub(crate) const TOOLKIT_INJECTED: &[&str] = &[
    "libcuda.so*",
    "libcudadebugger.so*",
    "libnvidia-*.so*",
    "libnvcuvid.so*",
    "libnvoptix.so*",
    "libvdpau_nvidia.so*",
    "libGLX_nvidia.so*",
    "libEGL_nvidia.so*",
    "libGLESv1_CM_nvidia.so*",
    "libGLESv2_nvidia.so*",
];

/// The definitions of `base-images/slim/`, embedded at compile time (file name, text), sorted by
/// file name; `--matrix DIR` reads `DIR/base-images/slim` instead (`image::definitions`).
pub(crate) const EMBEDDED: [(&str, &str); 2] = [
    (
        "base-images/slim/trt10-cuda12-full.toml",
        include_str!("../../base-images/slim/trt10-cuda12-full.toml"),
    ),
    (
        "base-images/slim/trt10-cuda12-vc.toml",
        include_str!("../../base-images/slim/trt10-cuda12-vc.toml"),
    ),
];

/// Parse the embedded definitions (names are unique; checked by a test).
pub(crate) fn embedded() -> Result<Vec<Definition>, Error> {
    EMBEDDED
        .iter()
        .map(|(origin, text)| Definition::parse(origin, text))
        .collect()
}

/// The definition called `name`; an unknown name lists the known ones.
pub(crate) fn find<'a>(defs: &'a [Definition], name: &str) -> Result<&'a Definition, Error> {
    defs.iter()
        .find(|d| d.name == name)
        .ok_or_else(|| Error::UnknownDefinition {
            name: name.to_string(),
            known: defs.iter().map(|d| d.name.clone()).collect(),
        })
}

/// What the engine at hand needs, from its metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    pub tactics: BTreeSet<Tactic>,
}

impl Definition {
    /// Parse and validate a definition; `origin` names the file in messages.
    pub fn parse(origin: &str, text: &str) -> Result<Definition, Error> {
        let def: Definition = toml::from_str(text).map_err(|e| Error::Definition {
            origin: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let bad = |message: String| Error::Definition {
            origin: origin.to_string(),
            message,
        };
        if def.name.is_empty() {
            return Err(bad("`name` is empty".into()));
        }
        for (key, r) in [("base", &def.base), ("builder", &def.builder)] {
            if r.digest.is_some() && r.digest_source.is_none() {
                return Err(bad(format!("`{key}.digest` needs a `{key}.digest_source` naming the public source that gives it")));
            }
            if let Some(d) = &r.digest {
                if crate::oci::hex_of(d).is_none() {
                    return Err(bad(format!(
                        "`{key}.digest` is `{d}`, expected sha256:<64 lowercase hex>"
                    )));
                }
            }
        }
        if def.selections.is_empty() {
            return Err(bad(
                "no `[[select]]` entry: nothing would be taken from the builder".into(),
            ));
        }
        let globs = def
            .selections
            .iter()
            .flat_map(|s| s.paths.iter())
            .chain(def.closure.drop.iter())
            .chain(def.closure.exclude.iter());
        for g in globs {
            super::closure::glob(g).map_err(|e| bad(format!("bad glob `{g}`: {e}")))?;
        }
        for (i, s) in def.selections.iter().enumerate() {
            if s.paths.is_empty() {
                return Err(bad(format!("`select[{i}].paths` is empty")));
            }
            if let Some(p) = s.paths.iter().find(|p| !p.starts_with('/')) {
                return Err(bad(format!(
                    "`select[{i}].paths` entry `{p}` is not absolute"
                )));
            }
        }
        if let Some(d) = def.closure.search_dirs.iter().find(|d| !d.starts_with('/')) {
            return Err(bad(format!(
                "`closure.search_dirs` entry `{d}` is not absolute"
            )));
        }
        Ok(def)
    }

    /// The images named without a digest: a build from them is not reproducible.
    pub fn unpinned(&self) -> Vec<&str> {
        [&self.base, &self.builder]
            .into_iter()
            .filter(|r| r.digest.is_none())
            .map(|r| r.reference.as_str())
            .collect()
    }

    /// The selections that apply to an engine with these needs.
    pub fn selections_for(&self, needs: &Needs) -> Vec<&Selection> {
        self.selections
            .iter()
            .filter(|s| s.when_tactic.is_none_or(|t| needs.tactics.contains(&t)))
            .collect()
    }
}

/// What a TensorRT engine needs from its slim base, from its metadata: the engine kind, the
/// tactic-source libraries, and the TensorRT version for [`choose`].
///
/// The metadata does not record tactic sources yet. TensorRT 10 enables none of the cuBLAS,
/// cuBLASLt or cuDNN sources by default, and hardware-compatible engines cannot use them, so an
/// engine needs them only when its build enabled them; `extra` says which (e.g. from the
/// recipe's trtexec `--tacticSources`). Hardware-compatible engines ignore `extra`.
pub(crate) fn engine_needs(
    gpu: &infer_spec::engine::GpuMeta,
    extra: &[Tactic],
) -> (PlanCompat, Needs, String) {
    let kind = if gpu.version_compatible {
        PlanCompat::VersionCompatible
    } else {
        PlanCompat::Full
    };
    let tactics = if gpu.hardware_compat == infer_spec::engine::HardwareCompat::None {
        extra.iter().copied().collect()
    } else {
        BTreeSet::new()
    };
    (kind, Needs { tactics }, gpu.tensorrt.to_string())
}

/// The definition that serves an engine: same kind and, when both say, the same TensorRT
/// version prefix (`"10"` serves `"10.16.1"`). The first in name order wins.
pub fn choose<'a>(
    defs: &'a [Definition],
    kind: PlanCompat,
    tensorrt: Option<&str>,
) -> Result<&'a Definition, Error> {
    let mut fitting: Vec<&Definition> = defs
        .iter()
        .filter(|d| d.engine == kind)
        .filter(|d| match (d.tensorrt.as_deref(), tensorrt) {
            (Some(want), Some(have)) => have == want || have.starts_with(&format!("{want}.")),
            _ => true,
        })
        .collect();
    fitting.sort_by(|a, b| a.name.cmp(&b.name));
    fitting.first().copied().ok_or_else(|| Error::NoDefinition {
        kind,
        tensorrt: tensorrt.unwrap_or("any").to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "t"
engine = "version-compatible"
tensorrt = "10"
[base]
reference = "debian:bookworm"
digest = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
digest_source = "the test"
[builder]
reference = "builder"
[closure]
search_dirs = ["/opt/lib"]
drop = ["/**/libnvinfer_builder_resource*"]
[[select]]
paths = ["/usr/bin/curl"]
[[select]]
paths = ["/usr/lib/**/libcudnn*.so*"]
when_tactic = "cudnn"
on_conflict = "base"
"#;

    fn check(text: &str, expected: Result<(), &str>) {
        let got = Definition::parse("t.toml", text)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(got, expected.map_err(str::to_string));
    }

    #[test]
    fn parses_and_validates() {
        check(GOOD, Ok(()));
        check(
            &GOOD.replace("sha256:0000", "sha256:XX00"),
            Err(&format!("slim definition t.toml: `base.digest` is `sha256:XX{}`, expected sha256:<64 lowercase hex>", "0".repeat(62))),
        );
        check(
            &GOOD.replace("\"/usr/bin/curl\"", "\"usr/bin/curl\""),
            Err("slim definition t.toml: `select[0].paths` entry `usr/bin/curl` is not absolute"),
        );
        check(
            &GOOD.replace("\"/opt/lib\"", "\"opt\""),
            Err("slim definition t.toml: `closure.search_dirs` entry `opt` is not absolute"),
        );
        check(&GOOD.replace("/usr/bin/curl", "/usr/{bin"), Err("slim definition t.toml: bad glob `/usr/{bin`: unclosed alternate group; missing '}' (maybe escape '{' with '[{]'?)"));
        let unknown = Definition::parse("t.toml", &GOOD.replace("on_conflict", "on_clash"))
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("unknown field `on_clash`"), "{unknown}");
    }

    #[test]
    fn tactic_selections_apply_only_when_needed() {
        let def = Definition::parse("t.toml", GOOD).unwrap();
        assert_eq!(def.unpinned(), vec!["builder"]);
        assert_eq!(def.selections_for(&Needs::default()).len(), 1);
        let needs = Needs {
            tactics: [Tactic::Cudnn].into(),
        };
        assert_eq!(def.selections_for(&needs).len(), 2);
    }

    #[test]
    fn engine_metadata_decides_kind_and_tactics() {
        use infer_spec::engine::{GpuMeta, HardwareCompat};
        let mut gpu = GpuMeta {
            sm: "sm_90".parse().unwrap(),
            tensorrt: "10.11.0.33".parse().unwrap(),
            cuda: "12.9".parse().unwrap(),
            driver_floor: "575.51.03".parse().unwrap(),
            hardware_compat: HardwareCompat::None,
            version_compatible: true,
            exclude_lean_runtime: false,
            builder_gpu: "NVIDIA H100".into(),
        };
        let (kind, needs, trt) = engine_needs(&gpu, &[Tactic::Cudnn]);
        assert_eq!(
            (kind, trt.as_str()),
            (PlanCompat::VersionCompatible, "10.11.0.33")
        );
        assert_eq!(needs.tactics, [Tactic::Cudnn].into());
        gpu.version_compatible = false;
        gpu.hardware_compat = HardwareCompat::AmperePlus;
        let (kind, needs, _) = engine_needs(&gpu, &[Tactic::Cudnn]);
        assert_eq!((kind, needs), (PlanCompat::Full, Needs::default()));
    }

    #[test]
    fn embedded_definitions_are_every_file_of_the_directory() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("base-images/slim");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".toml"))
            .map(|n| format!("base-images/slim/{n}"))
            .collect();
        files.sort();
        let names: Vec<&str> = EMBEDDED.iter().map(|(f, _)| *f).collect();
        assert_eq!(names, files);
        for (f, text) in EMBEDDED {
            assert_eq!(
                std::fs::read_to_string(dir.parent().unwrap().parent().unwrap().join(f)).unwrap(),
                text
            );
        }
        let defs = embedded().unwrap();
        assert_eq!(
            find(&defs, "trt10-cuda12-vc").unwrap().engine,
            PlanCompat::VersionCompatible
        );
        assert_eq!(
            find(&defs, "trt9").unwrap_err().to_string(),
            "no slim base definition `trt9` (known: trt10-cuda12-full, trt10-cuda12-vc)"
        );
    }

    #[test]
    fn chooses_by_engine_kind_and_version() {
        let vc = Definition::parse("t.toml", GOOD).unwrap();
        let mut full = vc.clone();
        full.name = "f".into();
        full.engine = PlanCompat::Full;
        let defs = [vc, full];
        assert_eq!(
            choose(&defs, PlanCompat::Full, Some("10.16.1"))
                .unwrap()
                .name,
            "f"
        );
        assert_eq!(
            choose(&defs, PlanCompat::VersionCompatible, Some("10"))
                .unwrap()
                .name,
            "t"
        );
        assert_eq!(
            choose(&defs, PlanCompat::Full, Some("11.4"))
                .unwrap_err()
                .to_string(),
            "no slim base definition serves full engines of TensorRT 11.4"
        );
        assert!(choose(&defs, PlanCompat::Full, Some("100")).is_err());
    }
}
