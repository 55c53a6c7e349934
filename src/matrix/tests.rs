use super::*;

fn embedded() -> Matrix {
    match Matrix::embedded() {
        Ok(m) => m,
        Err(e) => panic!("embedded matrix is invalid:\n{e}"),
    }
}

/// Load the embedded data with one file's text replaced.
fn with_file(file: &str, text: &str) -> Result<Matrix, Error> {
    let get = |f: &str| {
        if f == file {
            text
        } else {
            EMBEDDED.iter().find(|(n, _)| *n == f).unwrap().1
        }
    };
    Matrix::from_sources(&Sources {
        tensorrt: get(TENSORRT_FILE),
        cuda: get(CUDA_FILE),
        gpus: get(GPUS_FILE),
        images: get(IMAGES_FILE),
        libraries: if file == LIBRARIES_FILE {
            text
        } else {
            EMBEDDED_LIBRARIES
        },
        cpus: if file == CPUS_FILE {
            text
        } else {
            EMBEDDED_CPUS
        },
        root: String::new(),
    })
}

fn problems(r: Result<Matrix, Error>) -> Vec<String> {
    match r {
        Ok(_) => panic!("expected the matrix to be refused"),
        Err(Error::Invalid { problems }) => problems.iter().map(|p| p.to_string()).collect(),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn embedded_matrix_loads_and_agrees_with_itself() {
    let m = embedded();
    assert!(m.releases.len() >= 20);
    assert!(
        m.releases.windows(2).all(|w| w[0].version > w[1].version),
        "newest first"
    );
    assert!(m.releases.iter().any(|r| r.version.major() == 8));
    assert!(m.releases.iter().any(|r| r.version.major() == 10));
    assert!(m.releases.iter().any(|r| r.version.major() == 11));
}

#[test]
fn every_row_has_a_source_url() {
    let m = embedded();
    let all: Vec<(&str, &Vec<String>)> = m
        .releases
        .iter()
        .map(|r| ("release", &r.source))
        .chain(m.cuda_majors.iter().map(|r| ("major", &r.source)))
        .chain(m.toolkits.iter().map(|r| ("toolkit", &r.source)))
        .chain(m.gpus.iter().map(|r| ("gpu", &r.source)))
        .chain(m.images.iter().map(|r| ("image", &r.source)))
        .collect();
    assert!(all.len() > 80);
    for (what, src) in all {
        assert!(!src.is_empty(), "{what} without source");
        assert!(
            src.iter().all(|s| s.starts_with("https://")),
            "{what}: {src:?}"
        );
    }
}

#[test]
fn every_selectable_trt_cuda_build_has_a_driver_floor_and_a_runtime_image() {
    let m = embedded();
    for r in m.releases.iter().filter(|r| r.incomplete.is_none()) {
        for cb in &r.cuda_builds {
            let mm = cb.major_minor();
            assert!(
                m.toolkits.iter().any(|t| t.version.major_minor() == mm),
                "TRT {} CUDA {}",
                r.version,
                cb
            );
            assert!(m.cuda_major(cb.major()).is_some());
        }
    }
}

#[test]
fn base_images_refer_to_known_tensorrt_and_cuda() {
    let m = embedded();
    for i in &m.images {
        if let Some(t) = &i.tensorrt {
            assert!(m.release(t).is_some(), "{} TRT {}", i.reference, t);
        }
        if let Some(c) = &i.cuda {
            assert!(
                m.toolkits
                    .iter()
                    .any(|t| t.version.major_minor() == c.major_minor()),
                "{} CUDA {}",
                i.reference,
                c
            );
        }
        // No digest without a named public source: none is known, so none is written.
        assert!(i.digest.is_none() || i.digest_source.is_some());
    }
}

#[test]
fn gpu_lookup_by_product_alias_and_loose_spelling() {
    let m = embedded();
    let check = |name: &str, want: Option<&str>| {
        assert_eq!(m.gpu(name).map(|g| g.name.as_str()), want, "{name}");
    };
    check("H100", Some("H100"));
    check("h100-sxm", Some("H100"));
    check("NVIDIA L4", Some("L4"));
    check("Tesla V100", Some("V100"));
    check("rtx4090", Some("RTX 4090"));
    check("DGX Spark", Some("GB10"));
    check("H900", None);
    assert!(m.closest_gpus("H10").contains(&"H100"));
    assert!(m.closest_gpus("L40x").contains(&"L40"));
}

#[test]
fn known_facts_hold() {
    let m = embedded();
    let cc = |n: &str| m.gpu(n).unwrap().cc.dotted().to_string();
    assert_eq!(cc("V100"), "7.0");
    assert_eq!(cc("A10"), "8.6");
    assert_eq!(cc("L4"), "8.9");
    assert_eq!(cc("H100"), "9.0");
    assert_eq!(cc("B200"), "10.0");
    assert!(!m.gpu("A10").unwrap().tensor_cores.contains(&Precision::Fp8));
    assert!(m.gpu("L4").unwrap().tensor_cores.contains(&Precision::Fp8));
    let r = |v: &str| m.release(&v.parse().unwrap()).unwrap();
    assert_eq!(r("10.4.0").min_cc, ComputeCapability::new(7, 0));
    assert_eq!(r("10.5.0").min_cc, ComputeCapability::new(7, 5));
    assert_eq!(r("11.0.0").precision_api, PrecisionApi::StronglyTyped);
    assert_eq!(r("10.16.1").precision_api, PrecisionApi::BuilderFlags);
    assert!(!r("11.0.0").platforms.contains(&Platform::Jetson));
    assert_eq!(
        m.cuda_major(13).unwrap().minor_compat_driver.to_string(),
        "580"
    );
    assert_eq!(
        m.toolkit(&"12.9.1".parse().unwrap())
            .unwrap()
            .min_driver
            .to_string(),
        "575.57.08"
    );
}

#[test]
fn parse_errors_name_file_line_and_key() {
    let text = EMBEDDED[0]
        .1
        .replacen("min_cc = \"7.5\"", "min_cc = \"seven\"", 1);
    let p = problems(with_file(TENSORRT_FILE, &text));
    assert_eq!(p.len(), 1, "{p:?}");
    let line = text.lines().position(|l| l.contains("\"seven\"")).unwrap() + 1;
    assert!(
        p[0].starts_with(&format!("matrix/tensorrt.toml:{line}:")),
        "{}",
        p[0]
    );
    assert!(p[0].contains("key `min_cc`"), "{}", p[0]);
    assert!(p[0].contains("invalid compute capability"), "{}", p[0]);
}

#[test]
fn unknown_keys_are_refused() {
    let text = EMBEDDED[2].1.replacen(
        "arch = \"volta\"",
        "arch = \"volta\"\ncolour = \"green\"",
        1,
    );
    let p = problems(with_file(GPUS_FILE, &text));
    assert!(
        p[0].contains("matrix/gpus.toml:") && p[0].contains("colour"),
        "{p:?}"
    );
}

#[test]
fn tables_that_disagree_are_refused_with_the_row() {
    // A base image whose TensorRT is not in the TensorRT table.
    let text = EMBEDDED[3]
        .1
        .replacen("tensorrt = \"10.0.1\"", "tensorrt = \"10.0.9\"", 1);
    let p = problems(with_file(IMAGES_FILE, &text));
    assert!(
        p.iter()
            .any(|s| s.contains("TensorRT 10.0.9 has no [[release]] row")
                && s.starts_with("base-images/images.toml:")),
        "{p:?}"
    );

    // A TensorRT CUDA build with no driver-floor row.
    let text = EMBEDDED[0].1.replacen(
        "cuda_builds = [\"12.9\", \"11.8\"]",
        "cuda_builds = [\"12.7\", \"11.8\"]",
        1,
    );
    let p = problems(with_file(TENSORRT_FILE, &text));
    assert!(
        p.iter()
            .any(|s| s.contains("CUDA build 12.7 has no [[toolkit]] row")),
        "{p:?}"
    );

    // A row without a source.
    let text = EMBEDDED[2].1.replacen(
        "source = [\n  \"https://developer.nvidia.com/cuda-gpus\",\n  \"https://docs.nvidia.com/deeplearning/tensorrt/archives/tensorrt-1010/support-matrix/index.html\",\n]\nconfirmed = true\nnotes = \"INT8",
        "source = []\nconfirmed = true\nnotes = \"INT8",
        1,
    );
    let p = problems(with_file(GPUS_FILE, &text));
    assert!(
        p.iter().any(|s| s.contains("GPU V100 has no source")),
        "{p:?}"
    );

    // A digest nobody can check.
    let text = EMBEDDED[3].1.replacen(
        "reference = \"docker.io/nvidia/cuda:12.9.1-base-ubuntu24.04\"",
        "reference = \"docker.io/nvidia/cuda:12.9.1-base-ubuntu24.04\"\ndigest = \"sha256:0000000000000000000000000000000000000000000000000000000000000000\"",
        1,
    );
    let p = problems(with_file(IMAGES_FILE, &text));
    assert!(p.iter().any(|s| s.contains("digest_source")), "{p:?}");
}

#[test]
fn line_and_column_count_from_one() {
    assert_eq!(line_col("a\nbc\n", 0), (1, 1));
    assert_eq!(line_col("a\nbc\n", 3), (2, 2));
    assert_eq!(line_col("a\nbc\n", 99), (3, 1));
}

#[test]
fn library_rows_are_checked() {
    let good = EMBEDDED_LIBRARIES;
    let m = with_file(LIBRARIES_FILE, good).unwrap();
    let ort = m.library("onnxruntime", Platform::X86_64, None).unwrap();
    assert!(ort.url.starts_with("https://files.pythonhosted.org/"));
    assert!(ort.files.contains(&ort.load));
    assert!(ort
        .load_path()
        .starts_with("/opt/onnxruntime/lib/libonnxruntime.so"));
    let bad = good.replacen("sha256 = \"", "sha256 = \"XX", 1).replacen(
        "url = \"https://files.pythonhosted.org/",
        "url = \"http://example.com/",
        1,
    );
    let p = problems(with_file(LIBRARIES_FILE, &bad));
    assert!(p.iter().any(|p| p.contains("key `sha256`")), "{p:?}");
    assert!(p.iter().any(|p| p.contains("key `url`")), "{p:?}");
    // Absent from a --matrix DIR: no rows.
    let m = with_file(LIBRARIES_FILE, "").unwrap();
    assert!(m.libraries.is_empty());
}

#[test]
fn cpu_features_name_what_the_runtime_reads() {
    let m = embedded();
    let bf16: Vec<&str> = m
        .cpu_features_for(Precision::Bf16, Platform::X86_64)
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(bf16, ["avx512-bf16", "amx"]);
    assert!(m
        .cpu_features_for(Precision::Fp32, Platform::X86_64)
        .is_empty());
    // Every row agrees with the flags infer-serve reads: a name or flags that drift are refused.
    for (edit, want) in [
        (
            ("name = \"amx\"", "name = \"amx2\""),
            "CPU feature amx2 (x86_64): infer-serve reads no feature of that name",
        ),
        (
            (
                "kernel_flags = [\"avx512_bf16\"]",
                "kernel_flags = [\"avx512bf16\"]",
            ),
            "kernel_flags [\"avx512bf16\"] differ from the flags infer-serve reads for it",
        ),
        (
            ("computes = [\"bf16\"]", "computes = [\"fp16\"]"),
            "fp16 is not a CPU target precision",
        ),
        (
            (
                "nfd_label = \"feature.node.kubernetes.io/cpu-cpuid.AMXBF16\"",
                "nfd_label = \"amx\"",
            ),
            "nfd_label must be a Node Feature Discovery cpuid label",
        ),
    ] {
        let text = EMBEDDED_CPUS.replacen(edit.0, edit.1, 1);
        assert_ne!(text, EMBEDDED_CPUS, "{edit:?}");
        let p = problems(with_file(CPUS_FILE, &text));
        assert!(
            p.iter()
                .any(|p| p.starts_with("matrix/cpus.toml:") && p.contains(want)),
            "{p:?}"
        );
    }
}
