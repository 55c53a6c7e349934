//! Checks on the files a build ships: input paths stay inside their root, are regular files,
//! and the runtime binary suits the image (statically linked for scratch images, built for the
//! image's architecture).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::Error;

/// Resolve `rel` (relative to `root`, or absolute) to a regular file inside `root`, following
/// symlinks only while they stay inside. Returns the resolved path and its size.
pub fn safe_input(root: &Path, rel: &Path) -> Result<(PathBuf, u64), Error> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Input { path, source }
    };
    // A recipe in the current directory has an empty directory (`recipe.toml`, not `./…`).
    let root = if root.as_os_str().is_empty() {
        Path::new(".")
    } else {
        root
    };
    let root_c = fs::canonicalize(root).map_err(io(root))?;
    let joined = root_c.join(rel);
    let resolved = fs::canonicalize(&joined).map_err(io(&joined))?;
    if !resolved.starts_with(&root_c) {
        return Err(Error::EscapesRoot {
            path: joined,
            root: root_c,
        });
    }
    let m = fs::metadata(&resolved).map_err(io(&resolved))?;
    check_regular(&resolved, &m)?;
    Ok((resolved, m.len()))
}

/// Refuse anything but a regular file (directories, FIFOs, sockets, devices).
pub(crate) fn check_regular(path: &Path, m: &fs::Metadata) -> Result<(), Error> {
    if m.is_file() {
        return Ok(());
    }
    let kind = file_kind(m);
    Err(Error::NotRegular {
        path: path.into(),
        kind,
    })
}

fn file_kind(m: &fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = m.file_type();
        if t.is_fifo() {
            return "FIFO";
        }
        if t.is_socket() {
            return "socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "device";
        }
    }
    if m.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// Find `infer-serve`: `flag` (from `--runtime`), else `$INFER_SERVE_BIN`, else an
/// `infer-serve` next to the running executable.
pub fn locate_runtime(
    flag: Option<&Path>,
    env: Option<&str>,
    exe: Option<&Path>,
) -> Result<PathBuf, Error> {
    locate(RuntimeFlavour::Static, flag, env, exe)
}

pub use infer_spec::engines::RuntimeFlavour;

/// The command-line flag, the environment variable and the file name next to infer-build that
/// locate the `flavour` runtime.
pub fn flavour_names(flavour: RuntimeFlavour) -> (&'static str, &'static str, &'static str) {
    match flavour {
        RuntimeFlavour::Static => ("--runtime", "INFER_SERVE_BIN", "infer-serve"),
        RuntimeFlavour::Dynamic => (
            "--runtime-dynamic",
            "INFER_SERVE_DYNAMIC_BIN",
            "infer-serve-dynamic",
        ),
        RuntimeFlavour::Gpu => ("--runtime-gpu", "INFER_SERVE_GPU_BIN", "infer-serve-gpu"),
    }
}

/// How to build the `flavour` runtime, for errors about a missing or unfit binary.
pub(crate) fn build_hint(flavour: RuntimeFlavour) -> &'static str {
    match flavour {
        RuntimeFlavour::Static => {
            "`scripts/build-runtime.sh` builds the statically linked infer-serve of scratch images"
        }
        RuntimeFlavour::Dynamic => {
            "`FLAVOUR=dynamic scripts/build-runtime.sh` builds the dynamically linked infer-serve of ONNX Runtime images"
        }
        RuntimeFlavour::Gpu => {
            "`FLAVOUR=gpu scripts/build-runtime.sh` (or `scripts/install.sh --with-gpu`) builds the infer-serve of GPU images: TensorRT backend, dynamically linked"
        }
    }
}

/// Find the `flavour` runtime: its flag, else its environment variable, else its file next to
/// the running executable.
pub fn locate(
    flavour: RuntimeFlavour,
    flag: Option<&Path>,
    env: Option<&str>,
    exe: Option<&Path>,
) -> Result<PathBuf, Error> {
    let (flag_name, env_name, file) = flavour_names(flavour);
    let mut looked = Vec::new();
    if let Some(p) = flag {
        return Ok(p.to_path_buf());
    }
    looked.push(flag_name.to_string());
    if let Some(e) = env.filter(|e| !e.is_empty()) {
        return Ok(PathBuf::from(e));
    }
    looked.push(format!("${env_name}"));
    if let Some(dir) = exe.and_then(Path::parent) {
        let p = dir.join(file);
        if p.is_file() {
            return Ok(p);
        }
        looked.push(p.display().to_string());
    }
    Err(match flavour {
        RuntimeFlavour::Static => Error::NoRuntime {
            looked: looked.join(", "),
        },
        RuntimeFlavour::Dynamic => Error::NoDynamicRuntime {
            looked: looked.join(", "),
        },
        RuntimeFlavour::Gpu => Error::NoGpuRuntime {
            looked: looked.join(", "),
        },
    })
}

/// Check the `flavour` runtime binary: an ELF whose machine matches `arch` (OCI name); the
/// static flavour of scratch images has no `PT_INTERP` program header (static and static-pie
/// pass), the dynamic ones have one (they `dlopen` ONNX Runtime or TensorRT, which a static
/// glibc binary cannot do reliably).
pub fn check_runtime_binary(path: &Path, arch: &str, flavour: RuntimeFlavour) -> Result<(), Error> {
    let bad = |why: String| Error::BadRuntime {
        path: path.into(),
        why,
        hint: build_hint(flavour).to_owned(),
    };
    let m = fs::metadata(path).map_err(|source| Error::Input {
        path: path.into(),
        source,
    })?;
    check_regular(path, &m)?;
    let mut head = vec![0u8; 64 * 1024];
    let mut f = fs::File::open(path).map_err(|source| Error::Input {
        path: path.into(),
        source,
    })?;
    let n = f.read(&mut head).map_err(|source| Error::Input {
        path: path.into(),
        source,
    })?;
    head.truncate(n);
    let elf = parse_elf(&head)
        .ok_or_else(|| bad("is not a 64-bit little-endian ELF executable".into()))?;
    let want = match arch {
        "amd64" => 62,
        "arm64" => 183,
        _ => return Err(bad(format!("targets an unsupported architecture `{arch}`"))),
    };
    if elf.machine != want {
        return Err(bad(format!(
            "is built for ELF machine {} but the image is {arch}",
            elf.machine
        )));
    }
    match (flavour, elf.interp) {
        (RuntimeFlavour::Static, true) => Err(bad(
            "is dynamically linked (it names a program interpreter), and a scratch image has no libc".into(),
        )),
        (RuntimeFlavour::Dynamic | RuntimeFlavour::Gpu, false) => Err(bad(format!(
            "is statically linked, so it cannot open {} at run time (`{}` takes the dynamically linked flavour)",
            if flavour == RuntimeFlavour::Gpu { "TensorRT and the NVIDIA driver" } else { "ONNX Runtime" },
            flavour_names(flavour).0
        ))),
        _ => Ok(()),
    }
}

/// The release of the TensorRT headers the GPU runtime at `path` names in its binary
/// ([`infer_spec::engine::TENSORRT_HEADERS_MARKER`]); `None` when it names none, as a runtime
/// built without the TensorRT backend does.
pub fn runtime_tensorrt_headers(path: &Path) -> Result<Option<crate::matrix::Version>, Error> {
    let bytes = fs::read(path).map_err(|source| Error::Input {
        path: path.into(),
        source,
    })?;
    Ok(infer_spec::engine::tensorrt_headers_in(&bytes))
}

/// The GPU runtime at `path`, whose binary names `headers` ([`runtime_tensorrt_headers`]), for
/// target `target` on TensorRT `tensorrt`: its TensorRT backend must be compiled in, against
/// headers of the same major; otherwise every image would be refused at start, on the GPU node.
pub fn check_gpu_runtime_headers(
    path: &Path,
    headers: Option<&crate::matrix::Version>,
    target: &str,
    tensorrt: &crate::matrix::Version,
) -> Result<(), Error> {
    let bad = |why: String| Error::BadRuntime {
        path: path.into(),
        why,
        hint: format!(
            "{}, with TENSORRT_ROOT at TensorRT {}.x headers",
            build_hint(RuntimeFlavour::Gpu),
            tensorrt.major()
        ),
    };
    match headers {
        None => Err(bad(format!(
            "has no TensorRT backend (it does not name the TensorRT headers it was compiled against), \
             so target {target} could not serve its engine"
        ))),
        Some(h) if h.major() != tensorrt.major() => Err(bad(format!(
            "has its TensorRT backend compiled against TensorRT {h} headers, but target {target} uses \
             TensorRT {tensorrt}: it would refuse that library at start (virtual-table layouts differ \
             between majors)"
        ))),
        Some(_) => Ok(()),
    }
}

/// A warning when a GPU runtime's TensorRT headers are a newer release of the major than the
/// library target `target`'s image runs on: `infer-serve` refuses a library older than its
/// headers (TensorRT is compatible from older headers to newer libraries only), so such an
/// image would not start on a GPU. Not an error here: the image is still the one asked for, and
/// a node's library may be newer than the target's. `None` when the headers are not newer.
pub fn headers_newer(
    headers: &crate::matrix::Version,
    library: &crate::matrix::Version,
    target: &str,
) -> Option<String> {
    let minor = |v: &crate::matrix::Version| (v.major(), v.part(1));
    (headers.major() == library.major() && minor(headers) > minor(library)).then(|| {
        format!(
            "target {target}: warning: the GPU runtime's TensorRT backend is compiled against \
             TensorRT {headers} headers, newer than the TensorRT {library} its image runs on; \
             infer-serve refuses a library older than its headers, so this image will not start \
             on a GPU with that library. Build the runtime against TensorRT {}.{} headers or \
             older (TENSORRT_ROOT)",
            library.major(),
            library.part(1)
        )
    })
}

struct Elf {
    machine: u16,
    interp: bool,
}

fn parse_elf(b: &[u8]) -> Option<Elf> {
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let machine = u16_at(18)?;
    let phoff = usize::try_from(u64_at(32)?).ok()?;
    let phentsize = u16_at(54)? as usize;
    let phnum = u16_at(56)? as usize;
    let mut interp = false;
    for i in 0..phnum {
        let o = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(o)? == 3 {
            interp = true;
        }
    }
    Some(Elf { machine, interp })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_escapes_and_special_files() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("recipe");
        fs::create_dir(&root).unwrap();
        fs::write(root.join("m.onnx"), b"x").unwrap();
        fs::write(d.path().join("secret"), b"s").unwrap();
        assert_eq!(safe_input(&root, Path::new("m.onnx")).unwrap().1, 1);
        assert!(matches!(
            safe_input(&root, Path::new("../secret")),
            Err(Error::EscapesRoot { .. })
        ));
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("../secret", root.join("link")).unwrap();
            assert!(matches!(
                safe_input(&root, Path::new("link")),
                Err(Error::EscapesRoot { .. })
            ));
            std::os::unix::fs::symlink("m.onnx", root.join("inside")).unwrap();
            assert!(safe_input(&root, Path::new("inside")).is_ok());
            let fifo = root.join("fifo");
            assert!(std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success());
            let e = safe_input(&root, Path::new("fifo")).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "`{}` is a FIFO, not a regular file",
                    fs::canonicalize(&fifo).unwrap().display()
                )
            );
            assert!(matches!(
                safe_input(&root, Path::new("/dev/null")),
                Err(Error::EscapesRoot { .. })
            ));
        }
        assert!(matches!(
            safe_input(&root, Path::new(".")),
            Err(Error::NotRegular {
                kind: "directory",
                ..
            })
        ));
    }

    #[test]
    fn elf_checks() {
        let exe = std::env::current_exe().unwrap();
        // The test binary itself is a dynamically linked host executable.
        let arch = if cfg!(target_arch = "x86_64") {
            "amd64"
        } else {
            "arm64"
        };
        use RuntimeFlavour::{Dynamic, Gpu, Static};
        assert!(check_runtime_binary(&exe, arch, Dynamic).is_ok());
        assert!(check_runtime_binary(&exe, arch, Gpu).is_ok());
        let e = check_runtime_binary(&exe, arch, Static).unwrap_err();
        assert!(e.to_string().contains("dynamically linked"), "{e}");
        assert!(e.to_string().contains("scripts/build-runtime.sh"));
        let other = if arch == "amd64" { "arm64" } else { "amd64" };
        assert!(check_runtime_binary(&exe, other, Dynamic).is_err());
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("sh"), b"#!/bin/sh\n").unwrap();
        assert!(check_runtime_binary(&d.path().join("sh"), arch, Static).is_err());
        // A static binary (an ELF header without program headers, so no PT_INTERP) passes for
        // scratch images and is refused where the runtime must open a library.
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[18..20].copy_from_slice(&(if arch == "amd64" { 62u16 } else { 183 }).to_le_bytes());
        let st = d.path().join("static");
        fs::write(&st, &elf).unwrap();
        assert!(check_runtime_binary(&st, arch, Static).is_ok());
        for (flavour, lib, flag) in [
            (Gpu, "TensorRT", "--runtime-gpu"),
            (Dynamic, "ONNX Runtime", "--runtime-dynamic"),
        ] {
            let e = check_runtime_binary(&st, arch, flavour)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("statically linked") && e.contains(lib) && e.contains(flag),
                "{e}"
            );
            assert!(e.contains(build_hint(flavour)), "{e}");
        }
    }

    #[test]
    fn gpu_runtime_must_name_headers_of_the_targets_major() {
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("infer-serve-gpu");
        let v = |s: &str| -> crate::matrix::Version { s.parse().unwrap() };
        let check = |tensorrt: &str| {
            let headers = runtime_tensorrt_headers(&bin).unwrap();
            check_gpu_runtime_headers(&bin, headers.as_ref(), "sm89-fp16", &v(tensorrt))
        };
        fs::write(&bin, b"\x7fELF... no backend").unwrap();
        let e = check("10.16.1").unwrap_err().to_string();
        assert!(
            e.contains("has no TensorRT backend") && e.contains("sm89-fp16"),
            "{e}"
        );
        assert!(e.contains("TensorRT 10.x headers"), "{e}");
        let marked = format!(
            "\x7fELF...{}10.16.0;...",
            infer_spec::engine::TENSORRT_HEADERS_MARKER
        );
        fs::write(&bin, marked).unwrap();
        check("10.1.0").unwrap();
        let e = check("11.1.0").unwrap_err().to_string();
        assert!(
            e.contains("TensorRT 10.16.0 headers")
                && e.contains("TensorRT 11.1.0")
                && e.contains("TensorRT 11.x headers"),
            "{e}"
        );
        assert!(runtime_tensorrt_headers(&d.path().join("missing")).is_err());
    }

    #[test]
    fn headers_newer_than_the_images_library_are_said() {
        let v = |s: &str| -> crate::matrix::Version { s.parse().unwrap() };
        let w = headers_newer(&v("10.16.0"), &v("10.11.0"), "sm89-fp16").unwrap();
        assert!(
            w.contains("sm89-fp16")
                && w.contains("TensorRT 10.16.0 headers")
                && w.contains("10.11 headers"),
            "{w}"
        );
        for (headers, library) in [
            ("10.16.0", "10.16.1"),
            ("10.16.0", "10.17.0"),
            ("10.1.0", "10.16.1"),
            ("11.1.0", "10.11.0"),
        ] {
            assert_eq!(
                headers_newer(&v(headers), &v(library), "t"),
                None,
                "{headers} {library}"
            );
        }
    }

    #[test]
    fn runtime_lookup_order() {
        let d = tempfile::tempdir().unwrap();
        let exe = d.path().join("infer-build");
        assert_eq!(
            locate_runtime(Some(Path::new("/a")), Some("/b"), Some(&exe)).unwrap(),
            PathBuf::from("/a")
        );
        assert_eq!(
            locate_runtime(None, Some("/b"), Some(&exe)).unwrap(),
            PathBuf::from("/b")
        );
        assert!(matches!(
            locate_runtime(None, None, Some(&exe)),
            Err(Error::NoRuntime { .. })
        ));
        fs::write(d.path().join("infer-serve"), b"").unwrap();
        assert_eq!(
            locate_runtime(None, Some(""), Some(&exe)).unwrap(),
            d.path().join("infer-serve")
        );
    }

    #[test]
    fn dynamic_runtime_lookup_is_separate_from_the_static_one() {
        let d = tempfile::tempdir().unwrap();
        let exe = d.path().join("infer-build");
        fs::write(d.path().join("infer-serve"), b"").unwrap();
        let e = locate(RuntimeFlavour::Dynamic, None, None, Some(&exe)).unwrap_err();
        assert!(matches!(e, Error::NoDynamicRuntime { .. }));
        let msg = e.to_string();
        assert!(
            msg.contains("--runtime-dynamic")
                && msg.contains("$INFER_SERVE_DYNAMIC_BIN")
                && msg.contains("infer-serve-dynamic"),
            "{msg}"
        );
        let e = locate(RuntimeFlavour::Gpu, None, None, Some(&exe)).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("--runtime-gpu")
                && msg.contains("$INFER_SERVE_GPU_BIN")
                && msg.contains("infer-serve-gpu")
                && msg.contains("FLAVOUR=gpu"),
            "{msg}"
        );
        fs::write(d.path().join("infer-serve-dynamic"), b"").unwrap();
        assert_eq!(
            locate(RuntimeFlavour::Dynamic, None, None, Some(&exe)).unwrap(),
            d.path().join("infer-serve-dynamic")
        );
        assert_eq!(
            locate(RuntimeFlavour::Dynamic, None, Some("/d"), Some(&exe)).unwrap(),
            PathBuf::from("/d")
        );
    }
}
