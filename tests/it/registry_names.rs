//! Registry names that cannot be spelled around, registries.conf files that cannot stall a
//! pull, and registries that cannot send the client where it should not go: each against the
//! `infer-build` binary, with loopback servers (`hostile_registry::Hostile`) standing in for
//! registries, mirrors and redirect targets. No traffic leaves the machine: names that would
//! need DNS go to a loopback proxy (`ALL_PROXY`) that records what reaches it, and the
//! redirect targets are other loopback addresses (127.0.0.2).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::hostile_registry::{Hostile, Reply};
use super::registry_attacks::{image, serve};
use super::support::infer_build;

/// What a bounded run of `infer-build` did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
    /// Killed at the limit: the behaviour this file guards against.
    killed: bool,
}

/// `infer-build ARGS` with no credentials, settings or proxies of this machine (plus `env`),
/// killed after `limit`.
fn run(tmp: &Path, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Ran {
    let mut cmd = infer_build();
    cmd.args(args)
        .env("HOME", tmp)
        .env("INFER_BUILD_CACHE_DIR", tmp.join("cache"))
        .env("DOCKER_CONFIG", tmp.join("docker"))
        .env("XDG_CONFIG_HOME", tmp.join("xdg-config"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for k in [
        "XDG_RUNTIME_DIR",
        "REGISTRY_AUTH_FILE",
        "SSL_CERT_FILE",
        "CONTAINERS_REGISTRIES_CONF",
        "INFER_BUILD_REGISTRY",
        "INFER_BUILD_REGISTRY_USER",
        "INFER_BUILD_REGISTRY_PASSWORD",
        "INFER_BUILD_REGISTRY_REALMS",
        "INFER_BUILD_REGISTRY_MIN_RATE",
        "INFER_BUILD_REGISTRY_RATE_WINDOW",
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    // Drain both pipes on threads, so a chatty child never blocks on a full pipe.
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let out = read(child.stdout.take().map(|p| Box::new(p) as _));
    let err = read(child.stderr.take().map(|p| Box::new(p) as _));
    let mut killed = false;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            killed = true;
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        took: start.elapsed(),
        killed,
    }
}

/// A server that records every request and answers 404: what a bypassed rule would reach.
fn recorder() -> Hostile {
    Hostile::start(|_| Reply::status(404))
}

/// `blocked = true` holds for every spelling of a blocked name: case, a trailing dot, the
/// default port, IPv4 in inet_aton's forms, IPv4-mapped IPv6. Nothing is sent anywhere: the
/// loopback registry and the proxy every other name goes through see no request.
#[test]
fn every_spelling_of_a_blocked_registry_is_blocked() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let registry = recorder();
    let proxy = recorder();
    let port = registry.addr.rsplit_once(':').unwrap().1.to_string();
    let conf = t.join("registries.conf");
    std::fs::write(
        &conf,
        format!(
            "[[registry]]\nprefix = \"127.0.0.1:{port}\"\nblocked = true\n\
             [[registry]]\nprefix = \"localhost:{port}\"\nblocked = true\n\
             [[registry]]\nprefix = \"evil.example.com\"\nblocked = true\n\
             [[registry]]\nprefix = \"*.wild.example\"\nblocked = true\n"
        ),
    )
    .unwrap();
    let proxy_url = format!("http://{}", proxy.addr);
    let mut wrong = Vec::new();
    for spelling in [
        // As written in the file (these were blocked before too).
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "evil.example.com".to_string(),
        "a.wild.example".to_string(),
        // Other spellings of the same names.
        format!("127.1:{port}"),
        format!("127.0.0.01:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("2130706433:{port}"),
        format!("LOCALHOST:{port}"),
        "EVIL.example.com".to_string(),
        "evil.example.com.:443".to_string(),
        "A.WILD.EXAMPLE".to_string(),
        "a.wild.example:443".to_string(),
    ] {
        let reference = format!("{spelling}/x/img:v1");
        let out = t.join("out");
        let r = run(
            t,
            &[
                "pull",
                &reference,
                "--insecure",
                "--registries-conf",
                conf.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
            &[("ALL_PROXY", &proxy_url)],
            Duration::from_secs(60),
        );
        if r.code != Some(2) || !r.stderr.contains("blocked") {
            wrong.push(format!(
                "{reference}: exit {:?}, {}",
                r.code,
                r.stderr.trim()
            ));
        }
    }
    assert!(
        registry.requests().is_empty() && proxy.requests().is_empty(),
        "a blocked registry was contacted: registry saw {:?}, proxy saw {:?}",
        registry.requests(),
        proxy.requests()
    );
    assert!(wrong.is_empty(), "not blocked:\n{}", wrong.join("\n"));
}

/// A registry name or registries.conf location that is not `host[:port]` is bad input (exit
/// 2) naming what is wrong, refused before anything is sent, instead of a broken URL that is
/// retried.
#[test]
fn malformed_registry_hosts_and_ports_are_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let proxy = recorder();
    let proxy_url = format!("http://{}", proxy.addr);
    let env = [("ALL_PROXY", proxy_url.as_str())];
    let quick = Duration::from_secs(60);
    let mut wrong = Vec::new();
    let check = |what: &str, r: &Ran, says: &str| {
        (r.code != Some(2) || !r.stderr.contains(says) || r.took > Duration::from_secs(10)).then(
            || {
                format!(
                    "{what}: exit {:?} after {:?}: {}",
                    r.code,
                    r.took,
                    r.stderr.trim()
                )
            },
        )
    };
    let out = t.join("out");
    let out = out.to_str().unwrap();
    for (reference, says) in [
        ("127.0.0.1:5311#x/y:base", "`5311#x` is not a port"),
        ("127.0.0.1:99999/y:base", "port 99999 is out of range"),
        ("reg.example:0/y:base", "port 0 is out of range"),
        ("reg.example?x=1/y:base", "`?` is not allowed"),
        ("::1:5000/y:base", "brackets"),
    ] {
        let r = run(
            t,
            &["pull", reference, "--insecure", "--out", out],
            &env,
            quick,
        );
        wrong.extend(check(&format!("pull {reference}"), &r, says));
        let r = run(t, &["inspect", reference, "--insecure"], &env, quick);
        wrong.extend(check(&format!("inspect {reference}"), &r, says));
    }
    for (location, says) in [
        ("host?x=1", "`?` is not allowed"),
        ("host#f", "`#` is not allowed"),
        ("127.0.0.1:99999", "port 99999 is out of range"),
        ("mirror.example/ns?x=1", "is not host[:port][/namespace]"),
    ] {
        for table in [
            format!("[[registry]]\nprefix = \"r.example\"\nlocation = \"{location}\"\n"),
            format!(
                "[[registry]]\nprefix = \"r.example\"\n[[registry.mirror]]\nlocation = \"{location}\"\n"
            ),
        ] {
            let conf = t.join("registries.conf");
            std::fs::write(&conf, &table).unwrap();
            let r = run(
                t,
                &[
                    "pull",
                    "r.example/x/img:v1",
                    "--insecure",
                    "--registries-conf",
                    conf.to_str().unwrap(),
                    "--out",
                    out,
                ],
                &env,
                quick,
            );
            let shown = format!("{}:", conf.display());
            if !r.stderr.contains(&shown) {
                wrong.push(format!("{table}: does not name the file: {}", r.stderr));
            }
            wrong.extend(check(&format!("registries.conf {table:?}"), &r, says));
        }
    }
    let r = run(t, &["login", "r.example:99999", "-u", "ci"], &env, quick);
    wrong.extend(check("login r.example:99999", &r, "out of range"));
    assert!(
        proxy.requests().is_empty(),
        "a malformed name was sent somewhere: {:?}",
        proxy.requests()
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `[[registry]]` tables of `count` locations `prefix{i}.io`, then one blocking
/// `blocked.example`, within 1 MiB (the largest file read).
fn tables(count: usize, prefix: &str) -> String {
    let mut text = String::new();
    for i in 0..count {
        text.push_str(&format!("[[registry]]\nlocation=\"{prefix}{i}.io\"\n"));
    }
    text.push_str("[[registry]]\nprefix=\"blocked.example\"\nblocked=true\n");
    assert!(text.len() <= 1 << 20, "{} bytes", text.len());
    text
}

/// A pull of the name the last table blocks: exit 2 once the files are read.
fn pull_blocked(t: &Path, extra: &[&str], limit: Duration) -> Ran {
    let out = t.join("out");
    let mut args = vec!["pull", "blocked.example/x/img:v1", "--insecure"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--out", out.to_str().unwrap()]);
    run(t, &args, &[], limit)
}

/// One registries.conf of 1 MiB: 31,000 `[[registry]]` tables, or a version 1 list of 80,000
/// names, is read in a fraction of a second (merging them one by one against every table
/// before took seconds, and a minute for the list).
#[test]
fn a_one_mib_registries_conf_is_read_in_near_linear_time() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let v2 = t.join("v2.conf");
    std::fs::write(&v2, tables(31_000, "r")).unwrap();
    let mut v1 = String::from("[registries.block]\nregistries = [\n");
    for i in 0..80_000 {
        v1.push_str(&format!("'h{i}.io',\n"));
    }
    v1.push_str("'blocked.example',\n]\n");
    assert!(v1.len() <= 1 << 20);
    let v1_path = t.join("v1.conf");
    std::fs::write(&v1_path, v1).unwrap();
    for conf in [&v2, &v1_path] {
        let r = pull_blocked(
            t,
            &["--registries-conf", conf.to_str().unwrap()],
            Duration::from_secs(120),
        );
        assert!(
            r.code == Some(2) && r.stderr.contains("blocked"),
            "{}: exit {:?} (killed: {}): {}",
            conf.display(),
            r.code,
            r.killed,
            r.stderr
        );
        assert!(
            r.took < Duration::from_secs(2),
            "{} took {:?} to read",
            conf.display(),
            r.took
        );
    }
}

/// Four drop-ins of 1 MiB each (118,000 tables) beside the user's registries.conf merge in
/// about a second, not a minute.
#[test]
fn four_one_mib_drop_ins_merge_in_near_linear_time() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let dir = t.join(".config/containers/registries.conf.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(t.join(".config/containers/registries.conf"), "").unwrap();
    for n in 0..4 {
        std::fs::write(
            dir.join(format!("{n}.conf")),
            tables(29_000, &format!("d{n}r")),
        )
        .unwrap();
    }
    let r = pull_blocked(t, &[], Duration::from_secs(120));
    assert!(
        r.code == Some(2) && r.stderr.contains("blocked"),
        "exit {:?} (killed: {}): {}",
        r.code,
        r.killed,
        r.stderr
    );
    assert!(r.took < Duration::from_secs(8), "took {:?}", r.took);
}

/// A registries.conf listing 2,000 mirrors of one registry (all dead: a closed loopback port)
/// is refused at once, naming the bound, instead of holding the pull for minutes.
#[test]
fn two_thousand_dead_mirrors_are_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let registry = Hostile::start(serve(image(1), |_, _| None));
    let dead = super::support::free_port();
    let mut conf = format!(
        "[[registry]]\nprefix = \"{}\"\ninsecure = true\n",
        registry.addr
    );
    for i in 0..2_000 {
        conf.push_str(&format!(
            "[[registry.mirror]]\nlocation = \"127.0.0.1:{dead}/m{i}\"\ninsecure = true\n"
        ));
    }
    let path = t.join("registries.conf");
    std::fs::write(&path, conf).unwrap();
    let out = t.join("out");
    let reference = format!("{}/x/img:v1", registry.addr);
    let r = run(
        t,
        &[
            "pull",
            &reference,
            "--insecure",
            "--registries-conf",
            path.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert!(
        r.code == Some(2) && r.stderr.contains("2000 [[registry.mirror]]"),
        "exit {:?} after {:?} (killed: {}): {}",
        r.code,
        r.took,
        r.killed,
        r.stderr
    );
    assert!(r.stderr.contains("at most 16"), "{}", r.stderr);
    assert!(r.took < Duration::from_secs(10), "took {:?}", r.took);
    assert!(registry.requests().is_empty(), "{:?}", registry.requests());
}

/// Mirrors that accept connections and never answer get 30 s between them, then the registry
/// itself serves the pull, and the report says which mirrors were passed over and why. (Each
/// such mirror held a pull for three idle timeouts of a minute before.)
#[test]
fn silent_mirrors_share_one_deadline() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let registry = Hostile::start(serve(image(1), |_, _| None));
    let silent = Hostile::start(|_| Reply::Silence);
    let mut conf = format!(
        "[[registry]]\nprefix = \"{}\"\ninsecure = true\n",
        registry.addr
    );
    for i in 0..16 {
        conf.push_str(&format!(
            "[[registry.mirror]]\nlocation = \"{}/m{i}\"\ninsecure = true\n",
            silent.addr
        ));
    }
    let path = t.join("registries.conf");
    std::fs::write(&path, conf).unwrap();
    let out = t.join("out");
    let reference = format!("{}/x/img:v1", registry.addr);
    let r = run(
        t,
        &[
            "pull",
            &reference,
            "--insecure",
            "--json",
            "--registries-conf",
            path.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(150),
    );
    assert!(
        r.code == Some(0),
        "exit {:?} after {:?} (killed: {}): {}",
        r.code,
        r.took,
        r.killed,
        r.stderr
    );
    assert!(
        r.took >= Duration::from_secs(25) && r.took < Duration::from_secs(90),
        "took {:?}",
        r.took
    );
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["served_by"]["mirror"], false, "{v}");
    let failed = v["served_by"]["mirrors_failed"].as_array().unwrap();
    assert_eq!(failed.len(), 16, "{failed:?}");
    assert!(
        failed[1..]
            .iter()
            .all(|f| f.as_str().unwrap().contains("not tried")),
        "{failed:?}"
    );
    // Only the first mirror was asked anything.
    assert!(
        silent
            .requests()
            .iter()
            .all(|s| s.path().starts_with("/v2/")),
        "{:?}",
        silent.requests()
    );
}

/// A listener on 127.0.0.2 (another loopback address) counting connections; `None` (with the
/// reason printed) where that address cannot be bound.
fn listener_on_127_0_0_2(test: &str) -> Option<(String, std::sync::Arc<std::sync::Mutex<u32>>)> {
    let listener = match std::net::TcpListener::bind("127.0.0.2:0") {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skipping {test}: cannot listen on 127.0.0.2: {e}");
            return None;
        }
    };
    let addr = listener.local_addr().unwrap().to_string();
    let count = std::sync::Arc::new(std::sync::Mutex::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            *seen.lock().unwrap() += 1;
            drop(conn);
        }
    });
    Some((addr, count))
}

/// A plain-HTTP registry on 127.0.0.1 that redirects a blob to another loopback address
/// (127.0.0.2, standing in for a link-local metadata service or another local service) is
/// refused before anything connects there, exit 1, saying why; a redirect to another port of
/// the registry's own host is followed.
#[test]
fn hostile_redirect_to_another_loopback_address_is_refused() {
    let test = "hostile_redirect_to_another_loopback_address_is_refused";
    let Some((elsewhere, connections)) = listener_on_127_0_0_2(test) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let target = format!("http://{elsewhere}/storage/blob");
    let registry = Hostile::start(serve(image(1), move |_, _| {
        Some(Reply::with(307, &[("location", &target)], b""))
    }));
    let out = t.join("out");
    let reference = format!("{}/x/img:v1", registry.addr);
    let args = [
        "pull",
        &reference,
        "--insecure",
        "--out",
        out.to_str().unwrap(),
    ];
    let r = run(t, &args, &[], Duration::from_secs(120));
    assert_eq!(*connections.lock().unwrap(), 0, "the redirect was followed");
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    for says in [
        "127.0.0.2",
        "a loopback address other than the registry's own",
        "refused before connecting",
    ] {
        assert!(r.stderr.contains(says), "{says}: {}", r.stderr);
    }

    // The same blob behind a redirect to another port of 127.0.0.1: followed.
    let img = image(1);
    let blobs = img.blobs.clone();
    let storage = Hostile::start(move |seen| {
        let digest = seen.path().trim_start_matches("/storage/");
        match blobs.get(digest) {
            Some(bytes) => Reply::with(200, &[], bytes),
            None => Reply::status(404),
        }
    });
    let storage_addr = storage.addr.clone();
    let registry = Hostile::start(serve(img, move |seen, _| {
        let digest = seen.path().rsplit('/').next().unwrap_or("").to_string();
        let location = format!("http://{storage_addr}/storage/{digest}");
        Some(Reply::with(307, &[("location", &location)], b""))
    }));
    let reference = format!("{}/x/img:v1", registry.addr);
    let args = [
        "pull",
        &reference,
        "--insecure",
        "--out",
        out.to_str().unwrap(),
    ];
    let r = run(t, &args, &[], Duration::from_secs(120));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(!storage.requests().is_empty());
}
