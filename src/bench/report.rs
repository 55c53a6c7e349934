//! Reports: a CSV with perf_analyzer-like columns (latencies in microseconds) and a
//! self-contained HTML page with inline SVG charts (no scripts, no external assets), so the
//! file can be attached to a CI run and opened anywhere.

use std::fmt::Write as _;

use super::load::Load;
use super::Step;

/// Extra leading columns (e.g. the tuning grid point) for each step.
pub(crate) type Labels = Vec<(String, String)>;

/// CSV escaping: quote when needed, double the quotes.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}")).unwrap_or_default()
}

/// The CSV: one row per step.
pub(crate) fn csv(steps: &[(Labels, Step)]) -> String {
    let mut out = String::new();
    let extra: Vec<String> = steps
        .first()
        .map(|(l, _)| l.iter().map(|(k, _)| k.clone()).collect())
        .unwrap_or_default();
    let mut header: Vec<String> = extra.clone();
    header.extend(
        [
            "Concurrency",
            "Request Rate",
            "Batch",
            "Inferences/Second",
            "Requests/Second",
            "Requests",
            "Errors",
            "Avg latency",
            "p50 latency",
            "p90 latency",
            "p95 latency",
            "p99 latency",
            "p99.9 latency",
            "Max latency",
            "Server Queue",
            "Server Compute Infer",
            "Avg Batch Size",
            "Errors by Status",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    out.push_str(
        &header
            .iter()
            .map(|h| csv_field(h))
            .collect::<Vec<_>>()
            .join(","),
    );
    out.push('\n');
    for (labels, s) in steps {
        let (conc, rate) = match s.load {
            Load::Concurrency(c) => (c.to_string(), String::new()),
            Load::Rate(r) => (String::new(), format!("{r}")),
        };
        let errors: u64 = s.errors.values().sum();
        let by_status = s
            .errors
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let server = s.server.as_ref();
        let mut row: Vec<String> = labels.iter().map(|(_, v)| v.clone()).collect();
        row.extend([
            conc,
            rate,
            s.batch.to_string(),
            format!("{:.1}", s.infer_per_s),
            format!("{:.1}", s.req_per_s),
            s.sent.to_string(),
            errors.to_string(),
            format!("{:.0}", s.latency.mean_us),
            s.latency.p50_us.to_string(),
            s.latency.p90_us.to_string(),
            s.latency.p95_us.to_string(),
            s.latency.p99_us.to_string(),
            s.latency.p999_us.to_string(),
            s.latency.max_us.to_string(),
            opt(server.and_then(|d| d.queue_us), 0),
            opt(server.and_then(|d| d.compute_us), 0),
            opt(server.and_then(|d| d.mean_batch), 2),
            by_status,
        ]);
        out.push_str(
            &row.iter()
                .map(|f| csv_field(f))
                .collect::<Vec<_>>()
                .join(","),
        );
        out.push('\n');
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A series of (x, y) points for a line chart.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// "Nice" tick values covering [lo, hi].
pub(crate) fn ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let (lo, hi) = if hi > lo { (lo, hi) } else { (lo, lo + 1.0) };
    let raw = (hi - lo) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let start = (lo / step).floor() * step;
    let mut out = Vec::new();
    let mut v = start;
    // Up to the first tick at or above `hi` (with a little tolerance for float steps).
    while out.len() < 50 {
        out.push(v);
        if v >= hi - step * 1e-9 {
            break;
        }
        v += step;
    }
    out
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 1000.0 || v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else if (v * 10.0).fract().abs() < 1e-9 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

const W: f64 = 640.0;
const H: f64 = 360.0;
const ML: f64 = 70.0;
const MR: f64 = 150.0;
const MT: f64 = 30.0;
const MB: f64 = 50.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// A line chart with points, axes, ticks, a legend and optional horizontal reference lines.
pub(crate) fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    hlines: &[(f64, String)],
) -> String {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(hlines.iter().map(|h| h.0));
    let (xmin, xmax) = bounds(xs);
    let (_, ymax) = bounds(ys);
    let xt = ticks(if xmin >= 0.0 { 0.0 } else { xmin }, xmax, 6);
    let yt = ticks(0.0, ymax, 6);
    let (x0, x1) = (xt[0], *xt.last().unwrap_or(&1.0));
    let (y0, y1) = (yt[0], *yt.last().unwrap_or(&1.0));
    let px = |x: f64| ML + (x - x0) / (x1 - x0).max(1e-12) * (W - ML - MR);
    let py = |y: f64| H - MB - (y - y0) / (y1 - y0).max(1e-12) * (H - MT - MB);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{t}"><title>{t}</title><text x="{tx}" y="18" text-anchor="middle" class="title">{t}</text>"#,
        t = esc(title),
        tx = ML + (W - ML - MR) / 2.0
    );
    axes(&mut s, &xt, &yt, &px, &py, x_label, y_label);
    for (v, label) in hlines {
        let y = py(*v);
        let _ = write!(
            s,
            r##"<line class="ref" x1="{ML}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#888" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" class="small">{}</text>"##,
            W - MR,
            W - MR - 4.0,
            y - 4.0,
            esc(label)
        );
    }
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = se
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = write!(
            s,
            r#"<g class="series" data-name="{}"><polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            esc(&se.name),
            path.join(" ")
        );
        for &(x, y) in &se.points {
            let _ = write!(
                s,
                r#"<circle class="pt" cx="{:.1}" cy="{:.1}" r="4" fill="{c}" data-x="{x}" data-y="{y}"><title>{}: ({}, {})</title></circle>"#,
                px(x),
                py(y),
                esc(&se.name),
                fmt_tick(x),
                fmt_tick(y)
            );
        }
        let ly = MT + 18.0 * i as f64 + 10.0;
        let _ = write!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="{c}"/><text x="{:.1}" y="{:.1}" class="small">{}</text></g>"#,
            W - MR + 10.0,
            ly - 10.0,
            W - MR + 26.0,
            ly,
            esc(&se.name)
        );
    }
    s.push_str("</svg>");
    s
}

/// A bar chart: one bar per (label, value).
pub(crate) fn bar_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    bars: &[(String, f64)],
) -> String {
    let (_, ymax) = bounds(bars.iter().map(|b| b.1));
    let yt = ticks(0.0, ymax, 5);
    let y1 = *yt.last().unwrap_or(&1.0);
    let n = bars.len().max(1) as f64;
    let plot_w = W - ML - MR;
    let slot = plot_w / n;
    let px = |i: f64| ML + i * slot;
    let py = |y: f64| H - MB - y / y1.max(1e-12) * (H - MT - MB);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{t}"><title>{t}</title><text x="{tx}" y="18" text-anchor="middle" class="title">{t}</text>"#,
        t = esc(title),
        tx = ML + plot_w / 2.0
    );
    // Category axis: no numeric x ticks, labels under the bars.
    let _ = write!(
        s,
        r##"<g class="axis x-axis"><line x1="{ML}" y1="{b}" x2="{r}" y2="{b}" stroke="#000"/><text x="{cx}" y="{ly}" text-anchor="middle">{xl}</text></g>"##,
        b = H - MB,
        r = W - MR,
        cx = ML + plot_w / 2.0,
        ly = H - 10.0,
        xl = esc(x_label)
    );
    y_axis(&mut s, &yt, &py, y_label);
    for (i, (label, v)) in bars.iter().enumerate() {
        let x = px(i as f64) + slot * 0.15;
        let y = py(*v);
        let _ = write!(
            s,
            r##"<rect class="bar" x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#1f77b4" data-label="{l}" data-value="{v}"><title>{l}: {v}</title></rect><text x="{:.1}" y="{:.1}" text-anchor="middle" class="small">{l}</text>"##,
            slot * 0.7,
            (H - MB - y).max(0.0),
            x + slot * 0.35,
            H - MB + 14.0,
            l = esc(label)
        );
    }
    s.push_str("</svg>");
    s
}

fn bounds(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for v in vals.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        (0.0, 1.0)
    } else {
        (lo, hi)
    }
}

fn y_axis(s: &mut String, yt: &[f64], py: &dyn Fn(f64) -> f64, y_label: &str) {
    let _ = write!(
        s,
        r##"<g class="axis y-axis"><line x1="{ML}" y1="{MT}" x2="{ML}" y2="{}" stroke="#000"/>"##,
        H - MB
    );
    for &t in yt {
        let y = py(t);
        let _ = write!(
            s,
            r##"<line class="grid" x1="{ML}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - MR,
            ML - 6.0,
            y + 4.0,
            fmt_tick(t)
        );
    }
    let _ = write!(
        s,
        r#"<text x="16" y="{cy:.1}" text-anchor="middle" transform="rotate(-90 16 {cy:.1})">{}</text></g>"#,
        esc(y_label),
        cy = MT + (H - MT - MB) / 2.0
    );
}

fn axes(
    s: &mut String,
    xt: &[f64],
    yt: &[f64],
    px: &dyn Fn(f64) -> f64,
    py: &dyn Fn(f64) -> f64,
    x_label: &str,
    y_label: &str,
) {
    let _ = write!(
        s,
        r##"<g class="axis x-axis"><line x1="{ML}" y1="{b}" x2="{r}" y2="{b}" stroke="#000"/>"##,
        b = H - MB,
        r = W - MR
    );
    for &t in xt {
        let x = px(t);
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{b}" x2="{x:.1}" y2="{:.1}" stroke="#000"/><text class="tick" x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            H - MB + 5.0,
            H - MB + 18.0,
            fmt_tick(t),
            b = H - MB
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text></g>"#,
        ML + (W - ML - MR) / 2.0,
        H - 10.0,
        esc(x_label)
    );
    y_axis(s, yt, py, y_label);
}

/// A section of the HTML page.
pub(crate) enum Section {
    Heading(String),
    Paragraph(String),
    /// Pre-rendered SVG (from `line_chart` or `bar_chart`).
    Svg(String),
    /// A table: header and rows, all text.
    Table(Vec<String>, Vec<Vec<String>>),
}

/// The self-contained HTML document.
pub(crate) fn html(title: &str, sections: &[Section]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{t}</title>
<style>
body{{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;max-width:1100px}}
h1{{font-size:22px}} h2{{font-size:17px;margin-top:28px}}
table{{border-collapse:collapse;font-size:13px}} td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
th{{background:#f3f3f3}} svg.chart{{display:block;margin:8px 0;background:#fff;border:1px solid #ddd}}
svg text{{font-size:12px;fill:#222}} svg text.small{{font-size:11px}} svg text.title{{font-size:14px;font-weight:600}}
.charts{{display:flex;flex-wrap:wrap;gap:12px}}
</style></head><body>
<h1>{t}</h1>
"#,
        t = esc(title)
    );
    let mut in_charts = false;
    for sec in sections {
        let is_svg = matches!(sec, Section::Svg(_));
        if is_svg && !in_charts {
            s.push_str("<div class=\"charts\">\n");
            in_charts = true;
        } else if !is_svg && in_charts {
            s.push_str("</div>\n");
            in_charts = false;
        }
        match sec {
            Section::Heading(h) => {
                let _ = writeln!(s, "<h2>{}</h2>", esc(h));
            }
            Section::Paragraph(p) => {
                let _ = writeln!(s, "<p>{}</p>", esc(p));
            }
            Section::Svg(svg) => {
                s.push_str(svg);
                s.push('\n');
            }
            Section::Table(head, rows) => {
                s.push_str("<table><thead><tr>");
                for h in head {
                    let _ = write!(s, "<th>{}</th>", esc(h));
                }
                s.push_str("</tr></thead><tbody>\n");
                for r in rows {
                    s.push_str("<tr>");
                    for c in r {
                        let _ = write!(s, "<td>{}</td>", esc(c));
                    }
                    s.push_str("</tr>\n");
                }
                s.push_str("</tbody></table>\n");
            }
        }
    }
    if in_charts {
        s.push_str("</div>\n");
    }
    s.push_str("</body></html>\n");
    s
}

/// Format microseconds as milliseconds for tables.
pub(crate) fn ms(us: f64) -> String {
    format!("{:.2}", us / 1000.0)
}

/// The standard results table for steps.
pub(crate) fn steps_table(steps: &[(Labels, Step)]) -> Section {
    let mut head: Vec<String> = steps
        .first()
        .map(|(l, _)| l.iter().map(|(k, _)| k.clone()).collect())
        .unwrap_or_default();
    head.extend(
        [
            "load",
            "infer/s",
            "req/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "p99.9 ms",
            "errors",
            "avg batch",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let rows = steps
        .iter()
        .map(|(l, s)| {
            let mut r: Vec<String> = l.iter().map(|(_, v)| v.clone()).collect();
            r.extend([
                match s.load {
                    Load::Concurrency(c) => format!("concurrency {c}"),
                    Load::Rate(q) => format!("{q} req/s"),
                },
                format!("{:.1}", s.infer_per_s),
                format!("{:.1}", s.req_per_s),
                ms(s.latency.p50_us as f64),
                ms(s.latency.p90_us as f64),
                ms(s.latency.p99_us as f64),
                ms(s.latency.p999_us as f64),
                s.errors.values().sum::<u64>().to_string(),
                opt(s.server.as_ref().and_then(|d| d.mean_batch), 2),
            ]);
            r
        })
        .collect();
    Section::Table(head, rows)
}

/// The report of a plain `bench` run: latency against throughput, batch sizes per step.
pub(crate) fn bench_html(url: &str, model: &str, steps: &[(Labels, Step)]) -> String {
    let series = vec![
        Series {
            name: "p50".into(),
            points: steps
                .iter()
                .map(|(_, s)| (s.infer_per_s, s.latency.p50_us as f64 / 1000.0))
                .collect(),
        },
        Series {
            name: "p99".into(),
            points: steps
                .iter()
                .map(|(_, s)| (s.infer_per_s, s.latency.p99_us as f64 / 1000.0))
                .collect(),
        },
    ];
    let mut sections = vec![
        Section::Paragraph(format!(
            "{} steps against {url}, model {model}. Latencies are client-side, from the (scheduled) send to the last byte of the answer.",
            steps.len()
        )),
        Section::Heading("Latency against throughput".into()),
        Section::Svg(line_chart(
            "Latency vs throughput",
            "throughput (inferences/s)",
            "latency (ms)",
            &series,
            &[],
        )),
        Section::Heading("Results".into()),
        steps_table(steps),
        Section::Heading("Batch sizes formed by the server".into()),
    ];
    let mut any = false;
    for (_, s) in steps {
        if let Some(d) = s.server.as_ref().filter(|d| !d.batch_sizes.is_empty()) {
            any = true;
            let title = match s.load {
                Load::Concurrency(c) => format!("Batch sizes at concurrency {c}"),
                Load::Rate(r) => format!("Batch sizes at {r} req/s"),
            };
            let bars: Vec<(String, f64)> = d
                .batch_sizes
                .iter()
                .map(|(l, n)| (l.clone(), *n as f64))
                .collect();
            sections.push(Section::Svg(bar_chart(
                &title,
                "rows per batch",
                "batches",
                &bars,
            )));
        }
    }
    if !any {
        sections.push(Section::Paragraph(
            "The server exported no batch-size histogram at /metrics.".into(),
        ));
    }
    html(&format!("infer-build bench: {model}"), &sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_cover_the_range_with_round_steps() {
        assert_eq!(ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(0.0, 173.0, 6);
        assert_eq!(t[1] - t[0], 50.0);
        assert!(*t.last().unwrap() >= 173.0);
        assert_eq!(ticks(5.0, 5.0, 4).first(), Some(&5.0));
    }

    #[test]
    fn charts_have_axes_and_one_point_per_value() {
        let svg = line_chart(
            "t<1>",
            "x",
            "y",
            &[Series {
                name: "p99".into(),
                points: vec![(1.0, 2.0), (2.0, 3.0), (3.0, 9.5)],
            }],
            &[(8.0, "budget".into())],
        );
        assert_eq!(svg.matches("<circle class=\"pt\"").count(), 3);
        assert!(svg.contains("class=\"axis x-axis\"") && svg.contains("class=\"axis y-axis\""));
        assert!(svg.contains("t&lt;1&gt;"));
        assert!(svg.contains("class=\"ref\""));
        let bars = bar_chart("b", "x", "y", &[("1".into(), 3.0), ("2".into(), 0.0)]);
        assert_eq!(bars.matches("<rect class=\"bar\"").count(), 2);
    }

    #[test]
    fn csv_quotes_and_escapes() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("q\"x"), "\"q\"\"x\"");
        assert_eq!(csv_field("plain"), "plain");
    }
}
