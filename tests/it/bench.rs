//! `infer-build bench` against the real runtime: `infer-serve` on the example MLP (tract) and
//! on the synthetic cost model T(b) = 40 + 6·b ms, on ephemeral loopback ports.
//!
//! The runtime is `support::serve_test_binary` (built with the `synthetic` feature), started
//! by `support::start_serve`.

use std::path::Path;
use std::process::Command;

use super::support;

fn mlp_config() -> String {
    let onnx = support::root().join("examples/mlp/mlp.onnx");
    support::mlp_runtime_config(&format!(
        r#"[batching]
max_batch_size = 32
preferred_batch_sizes = [8, 16, 32]
max_queue_delay_us = 1000
max_queue_size = 1024
default_timeout_ms = 10000
instances = 1

[engine]
kind = "tract-onnx"
path = "{}"

[server]
host = "127.0.0.1"
port = PORT
drain_delay_s = 0
"#,
        onnx.display()
    ))
}

/// Count occurrences of `needle` in `hay`.
fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

/// The HTML report's structure: charts with both axes, one point per step and series, bars for
/// the server's batch sizes, and a results row per step.
fn check_report_structure(html: &str, steps: usize) {
    assert!(html.starts_with("<!DOCTYPE html>"), "not an HTML document");
    assert!(
        !html.contains("<script"),
        "the report must not need scripts"
    );
    assert!(
        !html.contains("src=\"http"),
        "the report must be self-contained"
    );
    // Latency vs throughput: p50 and p99 series, one point per step each.
    assert!(count(html, "<svg class=\"chart\"") >= 2, "charts missing");
    assert!(html.contains("Latency vs throughput"));
    assert_eq!(count(html, "<circle class=\"pt\""), 2 * steps);
    assert!(count(html, "class=\"axis x-axis\"") >= 2);
    assert!(count(html, "class=\"axis y-axis\"") >= 2);
    assert!(count(html, "class=\"tick\"") >= 8, "axes need tick labels");
    // The server exported its batch-size histogram: one bar chart per step, with bars.
    assert_eq!(count(html, "aria-label=\"Batch sizes at "), steps);
    assert!(count(html, "<rect class=\"bar\"") >= steps);
    assert_eq!(count(html, "<tr><td>"), steps, "one results row per step");
}

#[test]
fn bench_mlp_closed_loop_writes_csv_and_html() {
    let dir = tempfile::tempdir().unwrap();
    let serve = support::start_serve(dir.path(), &mlp_config());
    let csv = dir.path().join("bench.csv");
    let html = dir.path().join("bench.html");
    let out = support::run(&[
        "bench",
        &serve.url,
        "--model",
        "mlp",
        "--concurrency",
        "1,8",
        "--duration",
        "1s",
        "--warmup",
        "300ms",
        "--csv",
        csv.to_str().unwrap(),
        "--report",
        html.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", support::stderr(&out));
    // Progress goes to stderr, one line per step.
    let err = support::stderr(&out);
    assert!(
        err.contains("bench: concurrency   1:") && err.contains("bench: concurrency   8:"),
        "{err}"
    );

    let csv = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 3, "{csv}");
    let head: Vec<&str> = rows[0].split(',').collect();
    let col = |name: &str| {
        head.iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name} in {csv}"))
    };
    for (row, conc) in rows[1..].iter().zip(["1", "8"]) {
        let f: Vec<&str> = row.split(',').collect();
        assert_eq!(f[col("Concurrency")], conc);
        assert_eq!(f[col("Errors")], "0", "{row}");
        let ips: f64 = f[col("Inferences/Second")].parse().unwrap();
        assert!(ips > 50.0, "{row}");
        let p50: u64 = f[col("p50 latency")].parse().unwrap();
        let p99: u64 = f[col("p99 latency")].parse().unwrap();
        assert!(p50 > 0 && p50 <= p99, "{row}");
        // The server's own numbers came through /metrics.
        let batch: f64 = f[col("Avg Batch Size")].parse().unwrap();
        assert!(batch >= 1.0, "{row}");
    }

    // The JSON document on stdout agrees with the CSV.
    let v: serde_json::Value = serde_json::from_str(&support::stdout(&out)).unwrap();
    assert_eq!(v["steps"].as_array().unwrap().len(), 2);
    assert!(v["steps"][1]["ok"].as_u64().unwrap() > 0);

    check_report_structure(&std::fs::read_to_string(&html).unwrap(), 2);
}

#[test]
fn bench_mlp_open_loop_json_counts_what_it_sent() {
    let dir = tempfile::tempdir().unwrap();
    let serve = support::start_serve(dir.path(), &mlp_config());
    let csv = dir.path().join("rate.csv");
    let html = dir.path().join("rate.html");
    let out = support::run(&[
        "bench",
        &serve.url,
        "--model",
        "mlp",
        "--protocol",
        "json",
        "--rate",
        "200",
        "--arrival",
        "constant",
        "--duration",
        "1s",
        "--warmup",
        "200ms",
        "--csv",
        csv.to_str().unwrap(),
        "--report",
        html.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", support::stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&support::stdout(&out)).unwrap();
    let s = &v["steps"][0];
    // 200 req/s evenly spaced for 1 s: 200 sends in the window (one boundary either way).
    let sent = s["sent"].as_u64().unwrap();
    assert!((199..=201).contains(&sent), "{s}");
    assert_eq!(s["ok"].as_u64().unwrap(), sent, "{s}");
    let rate = s["req_per_s"].as_f64().unwrap();
    assert!((150.0..=210.0).contains(&rate), "{s}");
    // The server saw the same requests, but for the window's edges: the count before the window
    // is scraped while the first sends go out, so one request can land on either side.
    let seen = s["server"]["requests"].as_u64().unwrap();
    assert!((sent.saturating_sub(1)..=sent).contains(&seen), "{s}");
}

#[test]
fn bench_unknown_model_and_bad_url_are_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let serve = support::start_serve(dir.path(), &mlp_config());
    let out = support::run(&["bench", &serve.url, "--model", "nope", "--concurrency", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", support::stderr(&out));
    assert!(
        support::stderr(&out).contains("404"),
        "{}",
        support::stderr(&out)
    );
    let out = support::run(&["bench", "https://x", "--model", "m"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(support::stderr(&out).contains("https is not supported"));
}

#[test]
fn bench_report_renders_in_headless_chromium() {
    if !support::have_tool("chromium", "bench_report_renders_in_headless_chromium") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let serve = support::start_serve(dir.path(), &mlp_config());
    let html = dir.path().join("r.html");
    let csv = dir.path().join("r.csv");
    let out = support::run(&[
        "bench",
        &serve.url,
        "--model",
        "mlp",
        "--concurrency",
        "1,2,4",
        "--duration",
        "500ms",
        "--warmup",
        "100ms",
        "--csv",
        csv.to_str().unwrap(),
        "--report",
        html.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", support::stderr(&out));
    let png = dir.path().join("r.png");
    let shot = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,1600",
        ])
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.display()))
        .output()
        .expect("run chromium");
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let bytes = std::fs::read(&png).expect("chromium wrote no screenshot");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    // A blank page compresses to a few KB; charts, text and a table do not.
    assert!(
        bytes.len() > 30_000,
        "screenshot is {} bytes: blank page?",
        bytes.len()
    );
    if let Ok(keep) = std::env::var("INFER_BUILD_KEEP_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }
}

/// The tables after the synthetic model's inputs and outputs ([`support::synthetic_runtime_config`]).
const SYNTHETIC_TAIL: &str = r#"[batching]
max_batch_size = 8
max_queue_delay_us = 0
max_queue_size = 1024
default_timeout_ms = 10000
instances = 1

[engine]
kind = "synthetic"

[engine.synthetic]
base_ms = 1.0
per_row_ms = 0.0

[server]
host = "127.0.0.1"
port = 8000
"#;
/// The synthetic model's runtime.toml tail under Triton's rule: every request waits the delay.
fn strict_tail() -> String {
    SYNTHETIC_TAIL.replace(
        "max_queue_delay_us = 0\n",
        "max_queue_delay_us = 0\nqueue_delay = \"strict\"\n",
    )
}

/// `infer-build bench --tune CONFIG ARGS` from `dir`, each grid point served by the synthetic
/// test runtime.
fn tune_command(dir: &Path, config: &Path) -> Command {
    let mut c = support::infer_build();
    c.current_dir(dir)
        .env("INFER_SERVE", support::serve_test_binary())
        .args(["bench", "--tune"])
        .arg(config);
    c
}

/// The field notes' worked example: T(b) = 40 + 6b ms, 20 QPS open loop, 200 ms p99 budget.
/// The recommendation must be what the sweep's own measurements support, within one 10 ms
/// grid step of the notes' ~30 ms, and the replica count must follow the formula.
#[test]
fn bench_tune_on_the_known_cost_model() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("runtime.toml");
    // The notes' example is about Triton's rule, every request waiting the delay: under the
    // adaptive delay (the default) requests 50 ms apart never wait for one another, every point
    // forms the same batches, and there is nothing to tune.
    std::fs::write(&cfg, support::synthetic_runtime_config(&strict_tail())).unwrap();
    let csv = dir.path().join("tune.csv");
    let html = dir.path().join("tune.html");
    let out = tune_command(dir.path(), &cfg)
        .args([
            "--synthetic",
            "40,6",
            "--rate",
            "20",
            "--peak-qps",
            "20",
            "--budget-ms",
            "200",
            "--delays-ms",
            "0,10,20,30,40,50",
            "--max-batch",
            "8",
            "--duration",
            "8s",
            "--warmup",
            "1s",
            "--headroom",
            "1.3",
            "--json",
        ])
        .arg("--csv")
        .arg(&csv)
        .arg("--report")
        .arg(&html)
        .output()
        .unwrap();
    let err = support::stderr(&out);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&support::stdout(&out)).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 6, "{err}");
    let rec = &v["recommendation"];
    let delay_ms = rec["point"]["delay_us"].as_u64().unwrap() as f64 / 1000.0;
    let budget = 200.0;

    // The cost model fitted to the sweep is the synthetic backend's T(b) = 40 + 6b ms (plus
    // sleep overshoot), and its replay reproduces the batches the server really formed.
    let model = &v["model"];
    // The sweep's batches are 1 to 2 rows on average, so what the data pins down is T(b) over
    // that range, not its intercept and slope apart: a few hundred microseconds of sleep
    // overshoot on a busy machine trade one against the other (38.4 + 7.5b fits as well as
    // 40 + 6b there). T(1) = 46 ms and T(2) = 52 ms, late by at most a few ms, and T grows.
    let fixed = model["fixed_us"].as_f64().expect("a cost model") / 1000.0;
    let per_row = model["per_row_us"].as_f64().unwrap() / 1000.0;
    let t = |b: f64| fixed + per_row * b;
    assert!((44.0..50.0).contains(&t(1.0)), "{model}\n{err}");
    assert!((50.0..57.0).contains(&t(2.0)), "{model}\n{err}");
    assert!((3.0..10.0).contains(&per_row), "{model}\n{err}");
    for r in results {
        let (meas, pred) = (
            r["mean_batch"].as_f64().unwrap(),
            r["predicted"]["mean_batch"].as_f64().unwrap(),
        );
        assert!((pred / meas - 1.0).abs() < 0.2, "{r}\n{err}");
    }

    // Supported by its own measurements: within budget there, and the next step is over
    // budget, has errors, or gains less capacity than the noise floor (2%) or than it adds
    // mean latency (both read from the replay, as the recommendation does).
    let at = |d: f64| {
        results
            .iter()
            .find(|r| (r["point"]["delay_us"].as_u64().unwrap() as f64 / 1000.0 - d).abs() < 1e-6)
    };
    let here = at(delay_ms).unwrap();
    assert!(here["p99_ms"].as_f64().unwrap() <= budget, "{here}");
    if let Some(next) = at(delay_ms + 10.0) {
        let over = next["p99_ms"].as_f64().unwrap() > budget;
        let errors = next["step"]["errors"]
            .as_object()
            .is_some_and(|e| !e.is_empty());
        let pred = |r: &serde_json::Value, k: &str| r["predicted"][k].as_f64().unwrap();
        let gain = pred(next, "capacity_rps") / pred(here, "capacity_rps") - 1.0;
        let cost = pred(next, "mean_us") / pred(here, "mean_us") - 1.0;
        assert!(
            over || errors || gain < 0.02 || gain < cost,
            "next step {next} supports going further\n{err}"
        );
    }
    assert!(
        (20.0..=40.0).contains(&delay_ms),
        "recommended {delay_ms} ms, the field notes say ~30 ms\n{err}"
    );

    // Capacity: replicas = ceil(peak / per replica x headroom).
    let cap = &v["capacity"];
    let per = cap["per_replica_qps"].as_f64().unwrap();
    assert!((per - rec["capacity_rps"].as_f64().unwrap()).abs() < 1e-9);
    let expected = (20.0 / per * 1.3 - 1e-9).ceil().max(1.0) as u64;
    assert_eq!(cap["replicas"].as_u64().unwrap(), expected, "{cap}");
    assert!((cap["scale_out_qps"].as_f64().unwrap() - 0.7 * per).abs() < 1e-9);

    // The cost model shows through: a batch of b rows takes 40 + 6b ms, so capacity is
    // b / (40 + 6b) rows per ms at the measured mean batch b (sleep overshoot allowed).
    for r in results {
        let b = r["mean_batch"].as_f64().unwrap();
        let c = r["capacity_rps"].as_f64().unwrap();
        let model = b / (40.0 + 6.0 * b) * 1000.0;
        assert!(
            c <= model * 1.01 && c >= model * 0.85,
            "capacity {c} vs model {model} at batch {b}"
        );
    }

    let csv = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv.lines().count(), 7, "{csv}");
    assert!(
        csv.starts_with("Max Batch Size,Max Queue Delay (us),Capacity (rows/s)"),
        "{csv}"
    );
    let html = std::fs::read_to_string(&html).unwrap();
    assert!(html.contains("p99 budget 200 ms") && html.contains("max_queue_delay_us"));
    assert_eq!(count(&html, "<circle class=\"pt\""), 3 * 6);
}

/// A padded tensor model (`[-1, -1]` token inputs that say their `pad`) on the synthetic
/// engine at T = 2 ms + 0.1 ms per token computed: `bench --tune` sends requests of mixed
/// lengths, reads the tokens the batches computed from the server, fits T per token instead
/// of per row, and replays the runtime's padded batching with those lengths: its predicted
/// batches are the server's.
#[test]
fn bench_tune_fits_a_padded_model_per_token() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("runtime.toml");
    let input = |name: &str| {
        format!(
            "[[inputs]]\nname = \"{name}\"\ndatatype = \"INT64\"\ndims = [-1, -1]\npad = 0\n\
             profile = {{ min = [1], opt = [32], max = [64] }}\n\n"
        )
    };
    let padded = format!(
        "[model]\nname = \"padded\"\n\n{}{}[[outputs]]\nname = \"pooled\"\ndatatype = \"FP32\"\ndims = [-1, 4]\n\n",
        input("input_ids"),
        input("attention_mask")
    );
    std::fs::write(&cfg, format!("{padded}{}", strict_tail())).unwrap();
    let out = tune_command(dir.path(), &cfg)
        .args([
            "--synthetic",
            "2,0,0.1",
            "--lengths",
            "4-48",
            "--rate",
            "60",
            "--budget-ms",
            "500",
            "--delays-ms",
            "0,15,30",
            "--max-batch",
            "8",
            "--duration",
            "4s",
            "--warmup",
            "500ms",
            "--json",
        ])
        .output()
        .unwrap();
    let err = support::stderr(&out);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&support::stdout(&out)).unwrap();
    let model = &v["model"];
    let per_token = model["per_token_us"].as_f64().expect("a cost model") / 1000.0;
    assert!((0.08..0.13).contains(&per_token), "{model}\n{err}");
    assert_eq!(model["per_row_us"].as_f64(), Some(0.0), "{model}");
    assert!(err.contains("x tokens ms"), "{err}");
    for r in v["results"].as_array().unwrap() {
        let server = &r["step"]["server"];
        let (computed, held) = (
            server["batch_tokens"].as_u64().unwrap(),
            server["sequence_tokens"].as_u64().unwrap(),
        );
        // Requests of 4 to 48 tokens: every batch computes at least its own tokens, and a
        // lone request of 4 to 48 tokens at most 48 per row.
        let rows = server["rows"].as_u64().unwrap();
        assert!(held <= computed && computed <= 48 * rows, "{server}");
        assert!(held >= 4 * rows, "{server}");
        let (meas, pred) = (
            r["mean_batch"].as_f64().unwrap(),
            r["predicted"]["mean_batch"].as_f64().unwrap(),
        );
        assert!((pred / meas - 1.0).abs() < 0.2, "{r}\n{err}");
    }
}

/// `bench --tune RECIPE`: the recipe's batching is the base config, tract runs its ONNX model,
/// `deploy.latency_slo_ms` is the p99 budget and `deploy.peak_qps` the peak (and the rate);
/// a flag still overrides. Short grid: 2 points of 2 s, then 1 point of 1 s.
#[test]
fn bench_tune_takes_a_recipe_and_its_slo() {
    let recipe_path = support::root().join("examples/mlp/recipe.toml");
    let recipe = infer_build::recipe::load(&recipe_path).unwrap();
    let slo = f64::from(
        recipe
            .deploy
            .latency_slo_ms
            .expect("the example sets an SLO"),
    );
    let peak = recipe
        .deploy
        .peak_qps
        .expect("the example sets a peak rate");
    let dir = tempfile::tempdir().unwrap();
    let tune = |recipe: &Path, extra: &[&str]| {
        let out = tune_command(dir.path(), recipe)
            .args(["--warmup", "500ms", "--json"])
            .args(extra)
            .output()
            .unwrap();
        let err = support::stderr(&out);
        assert!(out.status.success(), "{err}");
        let v: serde_json::Value = serde_json::from_str(&support::stdout(&out)).unwrap();
        (v, err)
    };
    let (v, err) = tune(&recipe_path, &["--delays-ms", "0,2", "--duration", "2s"]);
    assert_eq!(v["budget_ms"].as_f64(), Some(slo), "{err}");
    assert_eq!(v["rate"].as_f64(), Some(peak));
    assert_eq!(v["capacity"]["peak_qps"].as_f64(), Some(peak));
    assert_eq!(v["input"]["kind"], "recipe");
    assert_eq!(v["input"]["budget_ms_from"], "deploy.latency_slo_ms");
    assert_eq!(v["input"]["peak_qps_from"], "deploy.peak_qps");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        // The grid's max batch is the recipe's, and tract really served the model.
        assert_eq!(
            r["point"]["max_batch"].as_u64(),
            Some(u64::from(recipe.batching.max_batch_size))
        );
        assert!(r["step"]["ok"].as_u64().unwrap_or(0) > 0, "{r}");
    }
    assert!(err.contains("deploy.latency_slo_ms"), "{err}");
    assert!(dir.path().join("tune-mlp.csv").is_file());

    // A flag overrides the recipe; a recipe named without a directory (`recipe.toml` in the
    // current directory) works too.
    for f in ["recipe.toml", "mlp.onnx"] {
        std::fs::copy(recipe_path.with_file_name(f), dir.path().join(f)).unwrap();
    }
    let (v, _) = tune(
        Path::new("recipe.toml"),
        &["--delays-ms", "0", "--duration", "1s", "--budget-ms", "250"],
    );
    assert_eq!(v["budget_ms"].as_f64(), Some(250.0));
    assert_eq!(v["input"]["budget_ms_from"], "--budget-ms");
    assert_eq!(v["capacity"]["peak_qps"].as_f64(), Some(peak));
}

#[test]
fn bench_drives_a_mix_of_a_bundles_models_and_reports_each() {
    // A bundle of two synthetic models: `fast` (1 ms a batch) and `slow` (20 ms a batch).
    let dir = tempfile::tempdir().unwrap();
    for (name, base) in [("fast", "1.0"), ("slow", "20.0")] {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        let cfg = support::synthetic_runtime_config(
            &SYNTHETIC_TAIL.replace("base_ms = 1.0", &format!("base_ms = {base}")),
        )
        .replace("name = \"synthetic\"", &format!("name = \"{name}\""));
        std::fs::write(d.join("runtime.toml"), cfg).unwrap();
    }
    let serve = support::start_serve(
        dir.path(),
        "[server]\nhost = \"127.0.0.1\"\nport = PORT\ndrain_delay_s = 0\n\n[[models]]\npath = \"fast\"\n\n[[models]]\npath = \"slow\"\n",
    );
    let csv = dir.path().join("mix.csv");
    let out = support::run(&[
        "bench",
        &serve.url,
        "--model",
        "fast=3,slow=1",
        "--concurrency",
        "4",
        "--duration",
        "1s",
        "--warmup",
        "200ms",
        "--csv",
        csv.to_str().unwrap(),
        "--report",
        dir.path().join("mix.html").to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", support::stderr(&out));
    let err = support::stderr(&out);
    assert!(
        err.contains("fast: bench: concurrency   3")
            && err.contains("slow: bench: concurrency   1"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_str(&support::stdout(&out)).unwrap();
    for (name, workers) in [("fast", 3u32), ("slow", 1)] {
        let s = &v["models"][name][0];
        assert_eq!(s["load"]["Concurrency"], workers, "{name}: {s}");
        let ok = s["ok"].as_u64().unwrap();
        assert!(ok > 0, "{name}: {s}");
        // The server's counts are this model's own series, not the bundle's sum.
        let seen = s["server"]["requests"].as_u64().unwrap();
        assert!(
            seen.abs_diff(ok) <= u64::from(workers),
            "{name}: ok {ok}, server {seen}: {s}"
        );
    }
    // The fast model, three workers at 1 ms, answers many times what the slow one does.
    let fast = v["models"]["fast"][0]["ok"].as_u64().unwrap();
    let slow = v["models"]["slow"][0]["ok"].as_u64().unwrap();
    assert!(fast > 5 * slow, "fast {fast}, slow {slow}");
    let table = std::fs::read_to_string(&csv).unwrap();
    assert!(table.contains("fast") && table.contains("slow"), "{table}");
}
