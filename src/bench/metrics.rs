//! Reading a server's Prometheus `/metrics` text: the batch-size histogram and the
//! Triton-compatible `nv_inference_*` counters, scraped before and after a run and
//! subtracted, so the report shows what the server did during that run only.

use std::collections::BTreeMap;

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parse the Prometheus text exposition format (comments and malformed lines are skipped).
pub(crate) fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(r) = rest.strip_prefix('{') {
        let close = find_label_end(r)?;
        labels = parse_labels(&r[..close])?;
        rest = &r[close + 1..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Index of the closing `}` of a label set, skipping quoted values.
fn find_label_end(s: &str) -> Option<usize> {
    let mut in_quote = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quote => escaped = true,
            '"' => in_quote = !in_quote,
            '}' if !in_quote => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_labels(s: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_string();
        let r = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = r.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return None,
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end?;
        out.insert(key, value);
        rest = r[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Some(out)
}

/// Sum of all samples called `name` (over every label set, e.g. every model).
fn total(samples: &[Sample], name: &str) -> Option<f64> {
    let mut found = false;
    let mut sum = 0.0;
    for s in samples.iter().filter(|s| s.name == name) {
        found = true;
        sum += s.value;
    }
    found.then_some(sum)
}

/// A cumulative histogram: upper bounds (`le`) with cumulative counts, plus sum and count.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Histogram {
    pub name: String,
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

/// The server's batch-size histogram: the first histogram family whose name contains
/// `batch_size` (bucket counts summed over label sets other than `le`).
pub(crate) fn batch_histogram(samples: &[Sample]) -> Option<Histogram> {
    let bucket = samples
        .iter()
        .find(|s| s.name.ends_with("_bucket") && s.name.contains("batch_size"))?;
    let base = bucket.name.trim_end_matches("_bucket").to_string();
    let bucket_name = format!("{base}_bucket");
    let mut by_le: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == bucket_name) {
        let le = match s.labels.get("le").map(String::as_str) {
            Some("+Inf") => f64::INFINITY,
            Some(v) => match v.parse::<f64>() {
                Ok(v) => v,
                Err(_) => continue,
            },
            None => continue,
        };
        let e = by_le.entry(le.to_bits()).or_insert((le, 0.0));
        e.1 += s.value;
    }
    let mut buckets: Vec<(f64, f64)> = by_le.into_values().collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    Some(Histogram {
        sum: total(samples, &format!("{base}_sum")).unwrap_or(0.0),
        count: total(samples, &format!("{base}_count")).unwrap_or(0.0),
        name: base,
        buckets,
    })
}

/// What the server did between two scrapes.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct ServerDelta {
    /// Batch-size distribution: (bucket label, batches in that bucket), non-cumulative.
    pub batch_sizes: Vec<(String, u64)>,
    /// Batches executed (`nv_inference_exec_count`, or the histogram's count).
    pub batches: u64,
    /// Rows inferred (`nv_inference_count`, or the histogram's sum).
    pub rows: u64,
    /// Successful requests (`nv_inference_request_success`).
    pub requests: u64,
    /// Mean queue time per request, µs (`nv_inference_queue_duration_us`).
    pub queue_us: Option<f64>,
    /// Mean compute time per request, µs (`nv_inference_compute_infer_duration_us`).
    pub compute_us: Option<f64>,
    /// Mean rows per executed batch.
    pub mean_batch: Option<f64>,
    /// Total compute time over the run, µs (`nv_inference_compute_infer_duration_us`; in
    /// infer-serve it grows once per executed batch).
    pub compute_total_us: Option<f64>,
    /// Padded models: tokens the batches computed, rows x each batch's longest sequence
    /// (`infer_serve_batch_tokens_total`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_tokens: Option<u64>,
    /// Padded models: tokens the requests held (`infer_serve_sequence_tokens_total`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_tokens: Option<u64>,
}

fn delta(before: &[Sample], after: &[Sample], name: &str) -> Option<f64> {
    let a = total(after, name)?;
    let b = total(before, name).unwrap_or(0.0);
    Some((a - b).max(0.0))
}

/// The samples of `model`: those labelled with it, and those without a `model` label (a
/// server's own series). A bundle's `/metrics` has every model's series; a step counts its
/// model's only.
pub(crate) fn of_model(samples: Vec<Sample>, model: &str) -> Vec<Sample> {
    samples
        .into_iter()
        .filter(|s| s.labels.get("model").is_none_or(|m| m == model))
        .collect()
}

/// Subtract two scrapes.
pub(crate) fn server_delta(before: &[Sample], after: &[Sample]) -> ServerDelta {
    let mut out = ServerDelta::default();
    let hist_after = batch_histogram(after);
    let hist_before = batch_histogram(before);
    if let Some(ha) = &hist_after {
        let mut prev_cum = 0.0;
        let mut prev_le: Option<f64> = None;
        for &(le, cum_a) in &ha.buckets {
            let cum_b = hist_before
                .as_ref()
                .and_then(|h| h.buckets.iter().find(|(l, _)| l.to_bits() == le.to_bits()))
                .map_or(0.0, |&(_, c)| c);
            let cum = (cum_a - cum_b).max(0.0);
            let n = (cum - prev_cum).max(0.0);
            prev_cum = cum;
            let label = bucket_label(prev_le, le);
            prev_le = Some(le);
            out.batch_sizes.push((label, n.round() as u64));
        }
        // Drop empty buckets past the last non-empty one, keep the shape below it.
        while out.batch_sizes.last().is_some_and(|(_, n)| *n == 0) {
            out.batch_sizes.pop();
        }
    }
    let hist_count = hist_after
        .as_ref()
        .map(|h| (h.count - hist_before.as_ref().map_or(0.0, |b| b.count)).max(0.0));
    let hist_sum = hist_after
        .as_ref()
        .map(|h| (h.sum - hist_before.as_ref().map_or(0.0, |b| b.sum)).max(0.0));
    let batches = delta(before, after, "nv_inference_exec_count").or(hist_count);
    let rows = delta(before, after, "nv_inference_count").or(hist_sum);
    let requests = delta(before, after, "nv_inference_request_success");
    out.batches = batches.unwrap_or(0.0).round() as u64;
    out.rows = rows.unwrap_or(0.0).round() as u64;
    out.requests = requests.unwrap_or(0.0).round() as u64;
    if let (Some(r), Some(b)) = (rows, batches) {
        if b > 0.0 {
            out.mean_batch = Some(r / b);
        }
    }
    out.compute_total_us = delta(before, after, "nv_inference_compute_infer_duration_us");
    let tokens = |name| delta(before, after, name).map(|v| v.round() as u64);
    out.batch_tokens = tokens("infer_serve_batch_tokens_total").filter(|&t| t > 0);
    out.sequence_tokens = tokens("infer_serve_sequence_tokens_total").filter(|&t| t > 0);
    if let Some(req) = requests.filter(|&r| r > 0.0) {
        out.queue_us = delta(before, after, "nv_inference_queue_duration_us").map(|q| q / req);
        out.compute_us =
            delta(before, after, "nv_inference_compute_infer_duration_us").map(|c| c / req);
    }
    out
}

/// A readable label for the bucket (prev, le]: integer batch sizes print as `3` or `5-8`.
fn bucket_label(prev: Option<f64>, le: f64) -> String {
    if le.is_infinite() {
        return match prev {
            Some(p) => format!(">{}", fmt_num(p)),
            None => "all".to_string(),
        };
    }
    let lo = prev.map_or(0.0, |p| p.floor() + 1.0);
    if lo >= le.floor() || prev.is_none() && le <= 1.0 {
        fmt_num(le)
    } else {
        format!("{}-{}", fmt_num(lo), fmt_num(le))
    }
}

fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# HELP infer_batch_size rows per executed batch
# TYPE infer_batch_size histogram
infer_batch_size_bucket{model="mlp",le="1"} 10
infer_batch_size_bucket{model="mlp",le="2"} 10
infer_batch_size_bucket{model="mlp",le="4"} 12
infer_batch_size_bucket{model="mlp",le="8"} 12
infer_batch_size_bucket{model="mlp",le="+Inf"} 12
infer_batch_size_sum{model="mlp"} 18
infer_batch_size_count{model="mlp"} 12
nv_inference_exec_count{model="mlp",version="1"} 12
nv_inference_count{model="mlp",version="1"} 18
nv_inference_request_success{model="mlp",version="1"} 18
nv_inference_queue_duration_us{model="mlp",version="1"} 1800
"#;
    const AFTER: &str = r#"infer_batch_size_bucket{model="mlp",le="1"} 20
infer_batch_size_bucket{model="mlp",le="2"} 30
infer_batch_size_bucket{model="mlp",le="4"} 42
infer_batch_size_bucket{model="mlp",le="8"} 42
infer_batch_size_bucket{model="mlp",le="+Inf"} 42
infer_batch_size_sum{model="mlp"} 104
infer_batch_size_count{model="mlp"} 42
nv_inference_exec_count{model="mlp",version="1"} 42
nv_inference_count{model="mlp",version="1"} 104
nv_inference_request_success{model="mlp",version="1"} 104
nv_inference_queue_duration_us{model="mlp",version="1"} 10400
nv_inference_compute_infer_duration_us{model="mlp",version="1"} 8600
"#;

    #[test]
    fn parses_labels_escapes_and_specials() {
        let s = parse("a{x=\"1,}\\\"\",y=\"2\"} 3.5\n# c\nb 7\nc{le=\"+Inf\"} +Inf\nbroken{ 1\n");
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].labels["x"], "1,}\"");
        assert_eq!(s[0].value, 3.5);
        assert_eq!(s[1].name, "b");
        assert!(s[2].value.is_infinite());
    }

    #[test]
    fn delta_gives_the_run_only() {
        let d = server_delta(&parse(BEFORE), &parse(AFTER));
        assert_eq!(
            d.batch_sizes,
            vec![("1".into(), 10), ("2".into(), 10), ("3-4".into(), 10)]
        );
        assert_eq!((d.batches, d.rows, d.requests), (30, 86, 86));
        assert!((d.mean_batch.unwrap() - 86.0 / 30.0).abs() < 1e-9);
        assert!((d.queue_us.unwrap() - 100.0).abs() < 1e-9);
        // The compute counter is new in the second scrape: counted from zero.
        assert!((d.compute_us.unwrap() - 100.0).abs() < 1e-9);
        assert_eq!(d.compute_total_us, Some(8600.0));
    }

    #[test]
    fn no_metrics_no_numbers() {
        let d = server_delta(&[], &parse("up 1\n"));
        assert_eq!(d, ServerDelta::default());
    }
}
