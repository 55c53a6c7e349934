//! The pinned Python environment precision conversion runs in.
//!
//! infer-build creates it itself, once per requirements file: `python3 -m venv` into a staging
//! directory, `pip install --require-hashes --no-deps --only-binary=:all:` of
//! `matrix/convert-requirements.txt` (every wheel, transitive ones included, pinned by sha256),
//! a version probe, then an atomic rename to `<root>/<id>` where `<id>` is derived from the
//! requirements' digest. Every process runs through [`crate::process`] with a deadline; a failure
//! carries the tool's stderr.
//!
//! Root: `$INFER_BUILD_PYENV` when set (tests share one under `target/`), else `pyenv/` beside
//! the engine cache's entries (`<cache>/v1/pyenv`). The base interpreter: `$INFER_BUILD_VENV_PYTHON`,
//! else `python3` on `PATH` (CPython 3.11 to 3.13 on x86_64 Linux: the versions the pinned wheels
//! exist for).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cache::{self, Cache, FileLock};
use super::Error;
use crate::process::{Cmd, Runner};

/// The pinned requirements (every wheel with its sha256).
pub(crate) const REQUIREMENTS: &str = include_str!("../../matrix/convert-requirements.txt");
/// The converter script run inside the environment.
pub(crate) const SCRIPT: &str = include_str!("convert.py");

const READY: &str = "versions.json";
const VENV_TIMEOUT: Duration = Duration::from_secs(300);
const PIP_TIMEOUT: Duration = Duration::from_secs(1800);
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

/// A ready environment.
#[derive(Debug, Clone)]
pub(crate) struct PyEnv {
    pub dir: PathBuf,
    /// True when it was created by this call.
    pub created: bool,
}

impl PyEnv {
    pub(crate) fn python(&self) -> PathBuf {
        self.dir.join("bin").join("python")
    }
}

/// The environment's identity: a short digest of the requirements.
pub(crate) fn env_id() -> String {
    let d = crate::oci::Digest::of(REQUIREMENTS.as_bytes()).to_string();
    format!("convert-{}", &d["sha256:".len().."sha256:".len() + 16])
}

/// The pinned version of `package` in the requirements file.
pub(crate) fn pinned(package: &str) -> Option<&'static str> {
    REQUIREMENTS.lines().find_map(|l| {
        let (name, rest) = l.trim().split_once("==")?;
        (name == package).then(|| rest.split_whitespace().next().unwrap_or(""))
    })
}

/// Where environments live for `cache`.
pub(crate) fn root_for(cache: &Cache) -> PathBuf {
    match std::env::var_os("INFER_BUILD_PYENV").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => cache.root().join("v1").join("pyenv"),
    }
}

fn base_python() -> String {
    std::env::var("INFER_BUILD_VENV_PYTHON")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "python3".into())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn run(runner: &dyn Runner, cmd: &Cmd, what: &str) -> Result<crate::process::Output, Error> {
    let out = runner.run(cmd).map_err(|e| Error::Convert {
        reason: format!("{what}: {e}"),
    })?;
    if !out.success() {
        return Err(Error::Tool {
            command: cmd.to_string(),
            code: out.code,
            tail: out.tail(12),
        });
    }
    Ok(out)
}

/// Ask the environment's interpreter for its package versions.
pub(crate) fn probe(runner: &dyn Runner, python: &Path) -> Result<BTreeMap<String, String>, Error> {
    let cmd = Cmd::new(python.to_string_lossy())
        .args(["-c", SCRIPT])
        .stdin(br#"{"command": "versions"}"#.to_vec())
        .timeout(PROBE_TIMEOUT);
    let out = run(runner, &cmd, "probing the converter environment")?;
    last_json(&out.stdout_text()).map_err(|reason| Error::ToolOutput {
        tool: "converter",
        reason,
    })
}

/// The interpreter `engine.convert = "modelopt"` runs: `$INFER_BUILD_MODELOPT_PYTHON`, else
/// `python3` on `PATH`. It is the user's (ModelOpt's ONNX tools import torch, which the pinned
/// environment does not carry), so infer-build installs nothing into it. It is not probed on its
/// own (importing torch costs seconds): the conversion imports everything first, and
/// [`missing_modelopt`] reads a failure there.
pub(crate) fn modelopt_python() -> String {
    std::env::var("INFER_BUILD_MODELOPT_PYTHON")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// The refusal of a ModelOpt interpreter whose conversion failed on an import (`output`: that
/// run); `None` when it failed for another reason.
pub(crate) fn missing_modelopt(output: &crate::process::Output) -> Option<Error> {
    let text = format!("{}{}", output.stderr_text(), output.stdout_text());
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with("ModuleNotFoundError") || l.starts_with("ImportError"))?;
    Some(Error::NoModelOpt {
        python: modelopt_python(),
        reason: line.trim().to_string(),
    })
}

/// The last line of `text` that parses as JSON.
pub(crate) fn last_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or("no output")?;
    serde_json::from_str(line)
        .map_err(|e| format!("{e} in `{}`", line.chars().take(200).collect::<String>()))
}

/// The environment under `root`, created when absent (under a lock, so concurrent builds
/// create it once).
pub(crate) fn ensure(root: &Path, runner: &dyn Runner) -> Result<PyEnv, Error> {
    let id = env_id();
    let dir = root.join(&id);
    // Ready when the marker holds the package versions the environment reported at creation.
    let ready = |dir: &Path| -> bool {
        std::fs::read(dir.join(READY))
            .ok()
            .and_then(|b| serde_json::from_slice::<BTreeMap<String, String>>(&b).ok())
            .is_some()
    };
    if ready(&dir) {
        return Ok(PyEnv {
            dir,
            created: false,
        });
    }
    std::fs::create_dir_all(root).map_err(io(root))?;
    let _lock = FileLock::acquire(&root.join(format!("{id}.lock")))?;
    if ready(&dir) {
        return Ok(PyEnv {
            dir,
            created: false,
        });
    }
    // A directory without the marker is a creation that did not finish: start again.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    let staging = root.join(format!("{id}.staging.{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
    }
    if let Err(e) = create(&staging, runner).and_then(|_| super::cache::sync_tree(&staging)) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    std::fs::rename(&staging, &dir).map_err(io(&dir))?;
    Ok(PyEnv { dir, created: true })
}

fn create(staging: &Path, runner: &dyn Runner) -> Result<BTreeMap<String, String>, Error> {
    let base = base_python();
    run(
        runner,
        &Cmd::new(&base)
            .args(["-m", "venv"])
            .arg(staging.to_string_lossy())
            .timeout(VENV_TIMEOUT),
        "creating the converter environment",
    )?;
    let reqs = staging.join("requirements.txt");
    cache::write_atomic(&reqs, REQUIREMENTS.as_bytes())?;
    let python = staging.join("bin").join("python");
    // pip is the one `venv` bundles with the interpreter (ensurepip, offline).
    let pip = Cmd::new(python.to_string_lossy())
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            "--require-hashes",
            "--no-deps",
            "--only-binary=:all:",
            "-r",
        ])
        .arg(reqs.to_string_lossy())
        .timeout(PIP_TIMEOUT);
    run(runner, &pip, "installing the pinned converter wheels")?;
    let versions = probe(runner, &python)?;
    for (pkg, key) in [
        ("onnx", "onnx"),
        ("onnxruntime", "onnxruntime"),
        ("onnxconverter-common", "onnxconverter-common"),
        ("numpy", "numpy"),
    ] {
        let want = pinned(pkg).unwrap_or_default();
        let got = versions.get(key).map(String::as_str).unwrap_or("absent");
        if want != got {
            return Err(Error::Convert {
                reason: format!(
                    "the converter environment has {pkg} {got}, the requirements pin {want}"
                ),
            });
        }
    }
    let json = serde_json::to_vec(&versions).map_err(|_| Error::Internal("versions json"))?;
    cache::write_atomic(&staging.join(READY), &json)?;
    Ok(versions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_requirement_is_pinned_by_hash() {
        let mut names = Vec::new();
        let mut current: Option<(String, usize)> = None;
        for line in REQUIREMENTS.lines() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            if l.starts_with("--hash=sha256:") {
                let hex = l
                    .trim_end_matches('\\')
                    .trim()
                    .trim_start_matches("--hash=sha256:");
                assert_eq!(hex.len(), 64, "{l}");
                assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{l}");
                if let Some((_, n)) = current.as_mut() {
                    *n += 1;
                }
                continue;
            }
            if let Some((name, n)) = current.take() {
                assert!(n > 0, "{name} has no hash");
            }
            let (name, _) = l.split_once("==").expect("name==version");
            names.push(name.to_string());
            current = Some((name.to_string(), 0));
        }
        assert!(current.is_some_and(|(_, n)| n > 0));
        for pkg in [
            "onnx",
            "onnxruntime",
            "onnxconverter-common",
            "numpy",
            "protobuf",
        ] {
            assert!(names.iter().any(|n| n == pkg), "{pkg} missing");
        }
        assert_eq!(pinned("onnxruntime"), Some("1.32.0"));
        assert!(env_id().starts_with("convert-") && env_id().len() == 24);
    }
}
