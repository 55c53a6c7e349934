use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use super::*;

/// A wheel (zip) with a library, a second member and a directory.
fn wheel_bytes(lib: &[u8]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let deflated = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    w.add_directory("pkg/capi/", stored).unwrap();
    w.start_file("pkg/capi/libthing.so.1.2.3", deflated)
        .unwrap();
    w.write_all(lib).unwrap();
    w.start_file("pkg/capi/libother.so", stored).unwrap();
    w.write_all(b"other").unwrap();
    w.start_file("pkg/__init__.py", deflated).unwrap();
    w.write_all(b"# not shipped\n").unwrap();
    w.finish().unwrap().into_inner()
}

fn sha(b: &[u8]) -> String {
    crate::oci::Digest::of(b).hex().to_string()
}

/// What the loopback server answers, per request, in order (the last one repeats).
#[derive(Clone)]
enum Answer {
    Ok(Vec<u8>),
    /// Headers promise the full length, the connection closes after `n` bytes.
    Cut(Vec<u8>, usize),
    Redirect(String),
    Status(u16),
}

struct Server {
    url: String,
    hits: Arc<Mutex<Vec<String>>>,
}

fn serve(answers: Vec<Answer>) -> Server {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let hits = Arc::new(Mutex::new(Vec::new()));
    let h = hits.clone();
    std::thread::spawn(move || {
        let mut i = 0;
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            h.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&req).into_owned());
            let a = answers[i.min(answers.len() - 1)].clone();
            i += 1;
            let _ = match a {
                Answer::Ok(b) => s
                    .write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", b.len()).as_bytes())
                    .and_then(|_| s.write_all(&b)),
                Answer::Cut(b, n) => s
                    .write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", b.len()).as_bytes())
                    .and_then(|_| s.write_all(&b[..n])),
                Answer::Redirect(to) => s.write_all(
                    format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
                ),
                Answer::Status(c) => s.write_all(
                    format!("HTTP/1.1 {c} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
                ),
            };
        }
    });
    Server {
        url: format!("http://{addr}/packages/pkg-1.2.3-py3-none-manylinux_2_28_x86_64.whl"),
        hits,
    }
}

fn row(url: &str, wheel: &[u8]) -> RuntimeLibrary {
    RuntimeLibrary {
        name: "thing".into(),
        version: "1.2.3".parse().unwrap(),
        platform: Platform::X86_64,
        package: "pkg".into(),
        url: url.into(),
        sha256: sha(wheel),
        size: wheel.len() as u64,
        files: vec![
            "pkg/capi/libthing.so.1.2.3".into(),
            "pkg/capi/libother.so".into(),
        ],
        load: "pkg/capi/libthing.so.1.2.3".into(),
        install_dir: "/opt/thing/lib".into(),
        glibc_min: None,
        source: vec![],
        confirmed: true,
        notes: None,
        origin: None,
    }
}

fn opts() -> fetch::Options {
    fetch::Options {
        allow_http: true,
        max_attempts: 2,
        ..fetch::Options::default()
    }
}

fn final_names(cache: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for sub in ["wheels", "files", "index"] {
        if let Ok(rd) = std::fs::read_dir(cache.join(sub)) {
            for e in rd {
                out.push(format!(
                    "{sub}/{}",
                    e.unwrap().file_name().to_string_lossy()
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn fetches_verifies_extracts_only_the_named_members_and_then_works_offline() {
    let lib = vec![7u8; 300_000];
    let wheel = wheel_bytes(&lib);
    let srv = serve(vec![Answer::Ok(wheel.clone())]);
    let r = row(&srv.url, &wheel);
    let cache = tempfile::tempdir().unwrap();
    let got = ensure(&r, cache.path(), &opts()).unwrap();
    assert!(!got.offline);
    assert_eq!(got.bytes_downloaded, wheel.len() as u64);
    assert_eq!(std::fs::read(&got.load).unwrap(), lib);
    let dests: Vec<&str> = got.files.iter().map(|(_, d)| d.as_str()).collect();
    assert_eq!(
        dests,
        [
            "/opt/thing/lib/libthing.so.1.2.3",
            "/opt/thing/lib/libother.so"
        ]
    );
    // Each file is stored under its digest.
    assert_eq!(
        got.files[0].0.file_name().unwrap().to_str().unwrap(),
        sha(&lib)
    );
    // Content-addressed: the wheel and each member under their digests, nothing else.
    let mut want = vec![
        format!("wheels/{}.whl", sha(&wheel)),
        format!("files/{}", sha(&lib)),
        format!("files/{}", sha(b"other")),
        format!("index/{}.json", sha(&wheel)),
    ];
    want.sort();
    assert_eq!(final_names(cache.path()), want);
    // No credentials, no cookies: a plain GET.
    let req = srv.hits.lock().unwrap()[0].to_ascii_lowercase();
    assert!(req.starts_with("get /packages/"), "{req}");
    assert!(
        !req.contains("authorization") && !req.contains("cookie"),
        "{req}"
    );

    // Second time: no request at all.
    let again = ensure(&r, cache.path(), &opts()).unwrap();
    assert!(again.offline);
    assert_eq!(again.files, got.files);
    assert_eq!(srv.hits.lock().unwrap().len(), 1);

    // A cached member changed behind our back is re-extracted from the cached wheel.
    std::fs::write(&got.load, b"tampered").unwrap();
    let fixed = ensure(&r, cache.path(), &opts()).unwrap();
    assert_eq!(std::fs::read(&fixed.load).unwrap(), lib);
    assert!(fixed.offline);
    assert_eq!(srv.hits.lock().unwrap().len(), 1);
}

#[test]
fn a_redirect_to_another_origin_is_refused_not_followed() {
    let wheel = wheel_bytes(b"lib");
    let other = serve(vec![Answer::Ok(wheel.clone())]);
    let srv = serve(vec![Answer::Redirect(other.url.clone())]);
    let cache = tempfile::tempdir().unwrap();
    let e = ensure(&row(&srv.url, &wheel), cache.path(), &opts())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("redirects (302)") && e.contains(&other.url),
        "{e}"
    );
    assert!(
        other.hits.lock().unwrap().is_empty(),
        "the redirect was followed"
    );
    assert!(final_names(cache.path()).is_empty());
}

#[test]
fn wrong_bytes_and_interrupted_downloads_leave_nothing_under_a_final_name() {
    let wheel = wheel_bytes(b"lib");
    let mut evil = wheel.clone();
    let last = evil.len() - 1;
    evil[last] ^= 1;
    let cache = tempfile::tempdir().unwrap();

    let srv = serve(vec![Answer::Ok(evil)]);
    let e = ensure(&row(&srv.url, &wheel), cache.path(), &opts()).unwrap_err();
    assert!(matches!(e, Error::Digest { .. }), "{e}");
    assert!(!e.is_bad_input());
    assert!(final_names(cache.path()).is_empty());

    // Cut twice (both tries): an error, no partial file kept anywhere.
    let srv = serve(vec![Answer::Cut(wheel.clone(), wheel.len() / 2)]);
    let e = ensure(&row(&srv.url, &wheel), cache.path(), &opts()).unwrap_err();
    assert!(
        matches!(e, Error::Download { .. } | Error::Digest { .. }),
        "{e}"
    );
    assert!(final_names(cache.path()).is_empty());
    assert_eq!(
        std::fs::read_dir(cache.path().join("tmp")).unwrap().count(),
        0
    );

    // Cut once, then a 503, then whole: the retry completes it.
    let srv = serve(vec![
        Answer::Cut(wheel.clone(), 10),
        Answer::Status(503),
        Answer::Ok(wheel.clone()),
    ]);
    let o = fetch::Options {
        max_attempts: 3,
        ..opts()
    };
    let got = ensure(&row(&srv.url, &wheel), cache.path(), &o).unwrap();
    assert_eq!(std::fs::read(&got.load).unwrap(), b"lib");
}

#[test]
fn plain_http_and_missing_members_are_refused() {
    let wheel = wheel_bytes(b"lib");
    let srv = serve(vec![Answer::Ok(wheel.clone())]);
    let cache = tempfile::tempdir().unwrap();
    let e = ensure(
        &row(&srv.url, &wheel),
        cache.path(),
        &fetch::Options::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("only https://"), "{e}");
    assert!(srv.hits.lock().unwrap().is_empty());

    let mut r = row(&srv.url, &wheel);
    r.files.push("pkg/capi/libmissing.so".into());
    let e = ensure(&r, cache.path(), &opts()).unwrap_err().to_string();
    assert!(e.contains("no member pkg/capi/libmissing.so"), "{e}");
}

#[test]
fn the_lock_pin_must_match_the_matrix_unless_updated() {
    let m = crate::matrix::Matrix::embedded().unwrap();
    let row = m
        .library("onnxruntime", Platform::X86_64, None)
        .unwrap()
        .clone();
    let dir = tempfile::tempdir().unwrap();
    let lock_path = dir.path().join("r.lock");
    record(&lock_path, &row, true).unwrap();
    let first = std::fs::read(&lock_path).unwrap();
    record(&lock_path, &row, true).unwrap();
    assert_eq!(std::fs::read(&lock_path).unwrap(), first, "canonical");
    let lock = crate::plan::lock::read(&lock_path).unwrap().unwrap();
    assert_eq!(
        lock.library("onnxruntime", "x86_64", None),
        Some(&locked(&row))
    );
    resolve(
        &m,
        "onnxruntime",
        Platform::X86_64,
        None,
        Some((&lock_path, &lock)),
        false,
    )
    .unwrap();

    let mut moved = lock.clone();
    let mut old = locked(&row);
    old.version = "1.0.0".into();
    old.sha256 = "0".repeat(64);
    moved.set_library(old, true);
    let e = resolve(
        &m,
        "onnxruntime",
        Platform::X86_64,
        None,
        Some((&lock_path, &moved)),
        false,
    )
    .unwrap_err();
    assert!(e.is_bad_input());
    assert!(
        e.to_string().contains("pins onnxruntime 1.0.0") && e.to_string().contains("--update-lock"),
        "{e}"
    );
    resolve(
        &m,
        "onnxruntime",
        Platform::X86_64,
        None,
        Some((&lock_path, &moved)),
        true,
    )
    .unwrap();
    let e = resolve(&m, "nothing", Platform::X86_64, None, None, false).unwrap_err();
    assert!(
        e.to_string().contains("no nothing library for x86_64"),
        "{e}"
    );
}

/// TensorRT's lean runtime has one row per release: two targets of one recipe on different
/// releases keep one pin each, and each is checked against its own row.
#[test]
fn lean_runtimes_of_different_releases_keep_a_pin_each() {
    let m = crate::matrix::Matrix::embedded().unwrap();
    let rows: Vec<_> = m
        .libraries
        .iter()
        .filter(|l| l.name == "tensorrt-lean-cu12" && l.platform == Platform::X86_64)
        .take(2)
        .cloned()
        .collect();
    assert_eq!(rows.len(), 2, "the matrix has several lean releases");
    let dir = tempfile::tempdir().unwrap();
    let lock_path = dir.path().join("r.lock");
    for r in &rows {
        record(&lock_path, r, false).unwrap();
    }
    let lock = crate::plan::lock::read(&lock_path).unwrap().unwrap();
    assert_eq!(lock.libraries.len(), 2, "{:?}", lock.libraries);
    for r in &rows {
        let got = resolve(
            &m,
            &r.name,
            Platform::X86_64,
            Some(&r.version),
            Some((&lock_path, &lock)),
            false,
        )
        .unwrap();
        assert_eq!((&got.version, &got.sha256), (&r.version, &r.sha256));
    }
    // A pin of the one-version kind replaces the other versions of its name.
    record(&lock_path, &rows[1], true).unwrap();
    let lock = crate::plan::lock::read(&lock_path).unwrap().unwrap();
    assert_eq!(lock.libraries, vec![locked(&rows[1])]);
}
