//! Closure tests over plain data: synthetic ELF facts for the search rules, real Debian ELF
//! bytes for one chain.

use super::*;
use crate::slim::def::{ClosureSpec, Selection, Winner};
use crate::slim::tree::{File, Node, Source, Tree};
use std::sync::Arc;

const X86_64: u16 = goblin::elf::header::EM_X86_64;

/// A fake x86_64 ELF object with these dynamic facts; `tag` makes contents differ.
fn so(tag: &str, needed: &[&str], runpath: &[&str], rpath: &[&str]) -> Node {
    Node::File(Box::new(File {
        mode: 0o644,
        size: tag.len() as u64,
        sha256: format!("{:0>64}", hex::encode(tag)),
        elf: Some(Ok(ElfInfo {
            is_64: true,
            machine: X86_64,
            needed: needed.iter().map(|s| s.to_string()).collect(),
            runpath: runpath.iter().map(|s| s.to_string()).collect(),
            rpath: rpath.iter().map(|s| s.to_string()).collect(),
            soname: None,
            interpreter: None,
        })),
        source: Source::Inline(Arc::from(tag.as_bytes())),
    }))
}

fn base() -> Tree {
    let mut t = Tree::new();
    t.insert_symlink("lib", "usr/lib");
    t.insert(
        "usr/lib/x86_64-linux-gnu/libc.so.6",
        so("libc", &[], &[], &[]),
    );
    t.insert(
        "usr/lib/x86_64-linux-gnu/libz.so.1.2.13",
        so("zlib", &["libc.so.6"], &[], &[]),
    );
    t.insert_symlink("usr/lib/x86_64-linux-gnu/libz.so.1", "libz.so.1.2.13");
    t
}

fn builder() -> Tree {
    let mut t = base();
    t.insert(
        "usr/bin/app",
        so("app", &["libA.so", "libc.so.6"], &[], &[]),
    );
    t.insert(
        "opt/x/lib/libA.so",
        so("A", &["libB.so", "libcuda.so.1"], &[], &[]),
    );
    t.insert(
        "opt/x/lib/libB.so.2.0",
        so(
            "B",
            &["libz.so.1", "libnvidia-ml.so.1"],
            &["$ORIGIN/../deps"],
            &[],
        ),
    );
    t.insert_symlink("opt/x/lib/libB.so", "libB.so.2");
    t.insert_symlink("opt/x/lib/libB.so.2", "libB.so.2.0");
    t.insert("opt/x/deps/libz.so.1", so("other zlib", &[], &[], &[]));
    t.insert("opt/x/lib/libcuda.so.1", so("stub", &[], &[], &[]));
    t.insert("usr/include/a.h", File::inline(0o644, b"header").into());
    t
}

fn sel(paths: &[&str], on_conflict: Option<Winner>) -> Selection {
    Selection {
        paths: paths.iter().map(|s| s.to_string()).collect(),
        on_conflict,
        when_tactic: None,
    }
}

fn dirs(search: &[&str]) -> ClosureSpec {
    ClosureSpec {
        search_dirs: search.iter().map(|s| s.to_string()).collect(),
        ..ClosureSpec::default()
    }
}

/// Expected: the sorted destinations of the slim layer and the excluded names, or the error.
fn check(
    base: &Tree,
    builder: &Tree,
    sels: &[Selection],
    closure: ClosureSpec,
    expected: Result<(&[&str], &[&str]), &str>,
) {
    let sels: Vec<&Selection> = sels.iter().collect();
    let got = compute(
        base,
        builder,
        Spec {
            selections: &sels,
            closure: &closure,
        },
    )
    .map(|p| {
        (
            p.copy.keys().cloned().collect::<Vec<_>>(),
            p.excluded
                .iter()
                .map(|e| e.name.clone())
                .collect::<Vec<_>>(),
        )
    })
    .map_err(|e| e.to_string());
    let expected = expected
        .map(|(c, x)| {
            (
                c.iter().map(|s| s.to_string()).collect(),
                x.iter().map(|s| s.to_string()).collect(),
            )
        })
        .map_err(str::to_string);
    assert_eq!(got, expected);
}

#[test]
fn follows_search_dirs_symlink_chains_and_excludes_toolkit_libraries() {
    // search_dirs finds libA and libB; libB's RUNPATH ($ORIGIN/../deps) comes before the
    // default dirs, so its libz is the builder's own, not the base's.
    check(
        &base(),
        &builder(),
        &[sel(&["/usr/bin/app"], None)],
        dirs(&["/opt/x/lib"]),
        Ok((
            &[
                "opt/x/deps/libz.so.1",
                "opt/x/lib/libA.so",
                "opt/x/lib/libB.so",
                "opt/x/lib/libB.so.2",
                "opt/x/lib/libB.so.2.0",
                "usr/bin/app",
            ],
            &["libcuda.so.1", "libnvidia-ml.so.1"],
        )),
    );
}

#[test]
fn a_missing_dependency_names_the_chain() {
    let mut b = builder();
    b.remove("opt/x/deps/libz.so.1");
    b.remove("usr/lib/x86_64-linux-gnu/libz.so.1");
    let mut a = base();
    a.remove("usr/lib/x86_64-linux-gnu/libz.so.1");
    check(
        &a,
        &b,
        &[sel(&["/usr/bin/app"], None)],
        dirs(&["/opt/x/lib"]),
        Err("the slim closure cannot be built:\n  /usr/bin/app → libA.so → libB.so → libz.so.1: not found in the combined image (searched /opt/x/lib:/opt/x/deps:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64:/usr/lib64:/lib:/usr/lib)"),
    );
    // Without the search dir, libA itself is missing; every problem is reported.
    check(
        &a,
        &b,
        &[sel(&["/usr/bin/app", "/usr/bin/nothing*"], None)],
        ClosureSpec::default(),
        Err("the slim closure cannot be built:\n  /usr/bin/app → libA.so: not found in the combined image (searched /lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64:/usr/lib64:/lib:/usr/lib)\n  selection `/usr/bin/nothing*` matches no file in the builder image"),
    );
}

#[test]
fn conflicts_with_the_base_need_a_winner() {
    let mut b = builder();
    b.insert(
        "usr/lib/x86_64-linux-gnu/libz.so.1.2.13",
        so("newer zlib", &["libc.so.6"], &[], &[]),
    );
    b.insert("usr/bin/z", so("z", &["libz.so.1"], &[], &[]));
    check(
        &base(),
        &b,
        &[sel(&["/usr/bin/z"], None)],
        ClosureSpec::default(),
        Err("the slim closure cannot be built:\n  /lib/x86_64-linux-gnu/libz.so.1 (reached by /usr/bin/z → libz.so.1) differs between the base and the builder; say which wins with `on_conflict = \"base\" | \"builder\"` on its selection"),
    );
    check(
        &base(),
        &b,
        &[sel(&["/usr/bin/z"], Some(Winner::Base))],
        ClosureSpec::default(),
        Ok((&["usr/bin/z"], &[])),
    );
    // The builder wins: its file is copied through the base's `lib -> usr/lib` symlink.
    check(
        &base(),
        &b,
        &[sel(&["/usr/bin/z"], Some(Winner::Builder))],
        ClosureSpec::default(),
        Ok((
            &["usr/bin/z", "usr/lib/x86_64-linux-gnu/libz.so.1.2.13"],
            &[],
        )),
    );
    // A selected non-ELF file that differs is a conflict too; identical files are not copied.
    let mut a = base();
    a.insert(
        "usr/include/a.h",
        File::inline(0o644, b"other header").into(),
    );
    check(
        &a,
        &builder(),
        &[sel(&["/usr/include/*.h"], Some(Winner::Builder))],
        ClosureSpec::default(),
        Ok((&["usr/include/a.h"], &[])),
    );
    check(
        &builder(),
        &builder(),
        &[sel(&["/usr/include/**"], None)],
        ClosureSpec::default(),
        Ok((&[], &[])),
    );
}

#[test]
fn rpath_runpath_and_class_rules() {
    let mut b = builder();
    // RPATH of the loader is inherited by a dependency without RUNPATH.
    b.insert("usr/bin/r", so("r", &["libA.so"], &[], &["/opt/x/lib"]));
    // A 32-bit libA earlier in the search order is skipped, as the loader does.
    let mut wrong = so("A32", &[], &[], &[]);
    if let Node::File(f) = &mut wrong {
        if let Some(Ok(info)) = &mut f.elf {
            info.is_64 = false;
        }
    }
    b.insert("usr/lib/x86_64-linux-gnu/libA.so", wrong);
    check(
        &base(),
        &b,
        &[sel(&["/usr/bin/r"], None)],
        ClosureSpec::default(),
        Ok((
            &[
                "opt/x/deps/libz.so.1",
                "opt/x/lib/libA.so",
                "opt/x/lib/libB.so",
                "opt/x/lib/libB.so.2",
                "opt/x/lib/libB.so.2.0",
                "usr/bin/r",
            ],
            &["libcuda.so.1", "libnvidia-ml.so.1"],
        )),
    );
    // With a RUNPATH the RPATH is ignored: libA is then not found.
    b.insert(
        "usr/bin/r",
        so("r", &["libA.so"], &["/nowhere"], &["/opt/x/lib"]),
    );
    let err = compute(
        &base(),
        &b,
        Spec {
            selections: &[&sel(&["/usr/bin/r"], None)],
            closure: &ClosureSpec::default(),
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("/usr/bin/r → libA.so: not found"), "{err}");
}

#[test]
fn toolkit_libraries_and_dropped_files_are_never_copied_but_listed() {
    let mut c = ClosureSpec {
        drop: vec!["/**/libnvinfer_builder_resource*".into()],
        ..ClosureSpec::default()
    };
    let mut b = builder();
    b.insert(
        "opt/x/lib/libnvinfer_builder_resource.so.10.9.0",
        so("res", &[], &[], &[]),
    );
    check(
        &base(),
        &b,
        &[sel(
            &["/opt/x/lib/libcuda.so.1", "/opt/x/lib/libnvinfer*"],
            None,
        )],
        c.clone(),
        Ok((
            &[],
            &[
                "/opt/x/lib/libcuda.so.1",
                "/opt/x/lib/libnvinfer_builder_resource.so.10.9.0",
            ],
        )),
    );
    // A dependency that resolves to a dropped file fails the build.
    b.insert(
        "usr/bin/d",
        so(
            "d",
            &["libnvinfer_builder_resource.so.10.9.0"],
            &["/opt/x/lib"],
            &[],
        ),
    );
    c.exclude = vec!["libz.so*".into()];
    let err = compute(
        &base(),
        &b,
        Spec {
            selections: &[&sel(&["/usr/bin/d"], None)],
            closure: &c,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("/usr/bin/d → libnvinfer_builder_resource.so.10.9.0 resolves to /opt/x/lib/libnvinfer_builder_resource.so.10.9.0, which the definition drops"), "{err}");
}

#[test]
fn reads_ld_so_conf_of_the_base() {
    let mut a = base();
    a.insert_bytes(
        "etc/ld.so.conf",
        0o644,
        b"include /etc/ld.so.conf.d/*.conf\n",
    );
    a.insert_bytes("etc/ld.so.conf.d/b.conf", 0o644, b"# comment\n/opt/x/lib\n");
    a.insert_bytes(
        "etc/ld.so.conf.d/a.conf",
        0o644,
        b"/usr/local/lib /usr/local/cuda/lib64\n",
    );
    assert_eq!(
        ld_so_conf_dirs(&a),
        vec!["/usr/local/lib", "/usr/local/cuda/lib64", "/opt/x/lib"]
    );
    check(
        &a,
        &builder(),
        &[sel(&["/usr/bin/app"], None)],
        ClosureSpec::default(),
        Ok((
            &[
                "opt/x/deps/libz.so.1",
                "opt/x/lib/libA.so",
                "opt/x/lib/libB.so",
                "opt/x/lib/libB.so.2",
                "opt/x/lib/libB.so.2.0",
                "usr/bin/app",
            ],
            &["libcuda.so.1", "libnvidia-ml.so.1"],
        )),
    );
}

/// Copy a host file into a tree, following its symlinks (their targets are copied too).
fn add_host(t: &mut Tree, path: &str) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if meta.file_type().is_symlink() {
        let Ok(target) = std::fs::read_link(path) else {
            return false;
        };
        let target = target.to_string_lossy().into_owned();
        t.insert_symlink(path, &target);
        let next = if target.starts_with('/') {
            target
        } else {
            format!("{}/{target}", tree::parent(path))
        };
        return add_host(t, &next);
    }
    match std::fs::read(path) {
        Ok(bytes) => {
            t.insert_bytes(path, 0o644, &bytes);
            true
        }
        Err(_) => false,
    }
}

#[test]
fn real_debian_chain_libssl_to_libcrypto() {
    let dir = "/usr/lib/x86_64-linux-gnu";
    let mut a = Tree::new();
    a.insert_symlink("lib", "usr/lib");
    a.insert_symlink("lib64", "usr/lib64");
    let mut ok = add_host(&mut a, &format!("{dir}/libc.so.6"))
        && add_host(&mut a, &format!("{dir}/ld-linux-x86-64.so.2"))
        && add_host(&mut a, "/usr/lib64/ld-linux-x86-64.so.2");
    let mut b = a.clone();
    ok = ok
        && add_host(&mut b, &format!("{dir}/libssl.so.3"))
        && add_host(&mut b, &format!("{dir}/libcrypto.so.3"));
    if !ok {
        eprintln!("skipping: libssl3 / libc6 of Debian bookworm are not installed here");
        return;
    }
    // libssl needs libcrypto (copied) and libc (in the base); libc needs the loader (base).
    check(
        &a,
        &b,
        &[sel(&[&format!("{dir}/libssl.so.3")], None)],
        ClosureSpec::default(),
        Ok((
            &[
                "usr/lib/x86_64-linux-gnu/libcrypto.so.3",
                "usr/lib/x86_64-linux-gnu/libssl.so.3",
            ],
            &[],
        )),
    );

    // The same bytes with libssl's `libcrypto.so.3` entry renamed to `libcuda.so.1\0\0`: the
    // toolkit library is excluded and listed with who needs it, and nothing else is copied.
    let bytes = std::fs::read(format!("{dir}/libssl.so.3")).unwrap();
    let patched = replace_all(&bytes, b"libcrypto.so.3\0", b"libcuda.so.1\0\0\0");
    b.insert_bytes(&format!("{dir}/libssl.so.3"), 0o644, &patched);
    let sels = [sel(&[&format!("{dir}/libssl.so.3")], None)];
    let sels: Vec<&Selection> = sels.iter().collect();
    let plan = compute(
        &a,
        &b,
        Spec {
            selections: &sels,
            closure: &ClosureSpec::default(),
        },
    )
    .unwrap();
    assert_eq!(
        plan.copy.keys().collect::<Vec<_>>(),
        vec!["usr/lib/x86_64-linux-gnu/libssl.so.3"]
    );
    assert_eq!(
        plan.excluded,
        vec![Excluded {
            name: "libcuda.so.1".into(),
            needed_by: vec![format!("{dir}/libssl.so.3")],
            reason: REASON_TOOLKIT.into()
        }]
    );
    assert_eq!(
        plan.objects.get("/usr/lib/x86_64-linux-gnu/libc.so.6"),
        Some(&Origin::Base)
    );
}

fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = hay.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn selections_follow_directory_symlinks_and_bring_them_along() {
    let mut b = builder();
    b.insert_symlink("usr/local/cuda", "cuda-12.9");
    b.insert_symlink("usr/local/cuda-12.9/lib64", "targets/x86_64-linux/lib");
    b.insert(
        "usr/local/cuda-12.9/targets/x86_64-linux/lib/libcublas.so.12.9.1",
        so("cublas", &["libcublasLt.so.12"], &["$ORIGIN"], &[]),
    );
    b.insert_symlink(
        "usr/local/cuda-12.9/targets/x86_64-linux/lib/libcublas.so.12",
        "libcublas.so.12.9.1",
    );
    b.insert(
        "usr/local/cuda-12.9/targets/x86_64-linux/lib/libcublasLt.so.12",
        so("lt", &[], &[], &[]),
    );
    assert_eq!(
        expand(&b, "/usr/local/cuda/lib64/libcublas.so.*").unwrap(),
        vec![
            "usr/local/cuda/lib64/libcublas.so.12",
            "usr/local/cuda/lib64/libcublas.so.12.9.1"
        ]
    );
    assert_eq!(
        expand(&b, "/usr/local/cuda/lib64/libcublas.so.12").unwrap(),
        vec!["usr/local/cuda/lib64/libcublas.so.12"]
    );
    assert!(expand(&b, "/usr/local/cuda-12.9/targets")
        .unwrap()
        .is_empty());
    check(
        &base(),
        &b,
        &[sel(&["/usr/local/cuda/lib64/libcublas.so.12"], None)],
        ClosureSpec::default(),
        Ok((
            &[
                "usr/local/cuda",
                "usr/local/cuda-12.9/lib64",
                "usr/local/cuda-12.9/targets/x86_64-linux/lib/libcublas.so.12",
                "usr/local/cuda-12.9/targets/x86_64-linux/lib/libcublas.so.12.9.1",
                "usr/local/cuda-12.9/targets/x86_64-linux/lib/libcublasLt.so.12",
            ],
            &[],
        )),
    );
}

#[test]
fn selected_symlink_loops_and_dangling_links_are_refused() {
    let mut b = builder();
    b.insert_symlink("opt/x/lib/libloop.so", "libloop2.so");
    b.insert_symlink("opt/x/lib/libloop2.so", "libloop.so");
    b.insert_symlink("opt/x/lib/libgone.so", "libgone.so.1");
    // A link whose target only the base holds is fine: the slim image has it.
    b.insert_symlink("opt/x/lib/libz.so", "/usr/lib/x86_64-linux-gnu/libz.so.1");
    check(
        &base(),
        &b,
        &[sel(&["/opt/x/lib/libloop.so"], None)],
        ClosureSpec::default(),
        Err("the slim closure cannot be built:\n  /opt/x/lib/libloop.so: /opt/x/lib/libloop.so is a symlink loop or runs through a file"),
    );
    check(
        &base(),
        &b,
        &[sel(&["/opt/x/lib/libgone.so"], None)],
        ClosureSpec::default(),
        Err("the slim closure cannot be built:\n  /opt/x/lib/libgone.so is a dangling symlink: its target `libgone.so.1` is in neither image"),
    );
    let mut only_builder = b.clone();
    only_builder.remove("usr/lib/x86_64-linux-gnu");
    only_builder.remove("lib");
    check(
        &base(),
        &only_builder,
        &[sel(&["/opt/x/lib/libz.so"], None)],
        ClosureSpec::default(),
        Ok((&["opt/x/lib/libz.so"], &[])),
    );
}
