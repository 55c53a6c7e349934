//! The sweep's report: its rows for the CSV and the results table (the load generator's
//! columns plus the grid point, capacity and replayed figures), and the HTML page with the
//! p99-against-delay, capacity-against-delay and knee charts.

use super::{Measured, SweepResult, REPLAY_ARRIVALS};
use crate::bench::report::{self, Labels, Section, Series};
use crate::bench::Step;

/// One labelled row per measured point, in grid order.
pub(crate) fn rows(r: &SweepResult) -> Vec<(Labels, Step)> {
    r.results
        .iter()
        .map(|m| {
            (
                vec![
                    ("Max Batch Size".to_string(), m.point.max_batch.to_string()),
                    (
                        "Max Queue Delay (us)".to_string(),
                        m.point.delay_us.to_string(),
                    ),
                    (
                        "Capacity (rows/s)".to_string(),
                        m.capacity_rps.map_or(String::new(), |c| format!("{c:.1}")),
                    ),
                    (
                        "Replayed Capacity (rows/s)".to_string(),
                        m.predicted
                            .map_or(String::new(), |p| format!("{:.1}", p.capacity_rps)),
                    ),
                    (
                        "Replayed Mean Latency (usec)".to_string(),
                        m.predicted
                            .map_or(String::new(), |p| format!("{:.0}", p.mean_us)),
                    ),
                ],
                m.step.clone(),
            )
        })
        .collect()
}

/// The tuning report: p99 and capacity against delay per max batch, latency against capacity.
pub(crate) fn html(model: &str, r: &SweepResult, labeled: &[(Labels, Step)]) -> String {
    let mut batches: Vec<u32> = r.results.iter().map(|m| m.point.max_batch).collect();
    batches.sort_unstable();
    batches.dedup();
    let per_batch = |f: &dyn Fn(&Measured) -> Option<(f64, f64)>| -> Vec<Series> {
        batches
            .iter()
            .map(|b| Series {
                name: format!("max batch {b}"),
                points: r
                    .results
                    .iter()
                    .filter(|m| m.point.max_batch == *b)
                    .filter_map(f)
                    .collect(),
            })
            .collect()
    };
    let p99 = per_batch(&|m| Some((m.point.delay_us as f64 / 1000.0, m.p99_ms)));
    let cap = per_batch(&|m| {
        m.capacity_rps
            .map(|c| (m.point.delay_us as f64 / 1000.0, c))
    });
    let knee = per_batch(&|m| m.capacity_rps.map(|c| (c, m.p99_ms)));
    let budget = vec![(r.budget_ms, format!("p99 budget {} ms", r.budget_ms))];
    let mut sections = vec![Section::Paragraph(format!(
        "Each point: infer-serve started with that max batch size and max queue delay, driven open-loop at {} req/s. Capacity = rows per batch / compute time per batch, from the server's metrics.",
        r.rate
    ))];
    sections.push(Section::Paragraph(match (&r.model, &r.model_refused) {
        (Some(m), _) => format!(
            "Cost model fitted to all points: T(b) = {} per batch (within {:.1}% of every point). Each point was replayed against it with {} arrivals; the capacity gain and mean-latency cost of each step are read from the replay, which the short measured samples are too noisy to rank. The p99 budget and errors are judged on the measurements.",
            super::cost_formula(m),
            m.max_rel_error * 100.0,
            REPLAY_ARRIVALS
        ),
        (None, Some(why)) => format!("No cost model: {why}. Gains and costs are read from the measurements."),
        (None, None) => "No cost model.".to_string(),
    }));
    match (&r.recommendation, &r.capacity) {
        (Some(rec), Some(c)) => {
            sections.push(Section::Heading("Recommendation".into()));
            sections.push(Section::Paragraph(format!(
                "max_batch_size = {}, max_queue_delay_us = {}: p99 {:.1} ms, {:.1} rows/s per replica. {}; scale out at {:.1} req/s per replica (70% of its limit).",
                rec.point.max_batch, rec.point.delay_us, rec.p99_ms, rec.capacity_rps, c.formula, c.scale_out_qps
            )));
            for reason in &rec.reasons {
                sections.push(Section::Paragraph(reason.clone()));
            }
        }
        _ => sections.push(Section::Paragraph(format!(
            "No point kept p99 within {} ms without errors.",
            r.budget_ms
        ))),
    }
    sections.push(Section::Heading("Sweep".into()));
    sections.push(Section::Svg(report::line_chart(
        "p99 latency vs max queue delay",
        "max queue delay (ms)",
        "p99 latency (ms)",
        &p99,
        &budget,
    )));
    sections.push(Section::Svg(report::line_chart(
        "Capacity vs max queue delay",
        "max queue delay (ms)",
        "capacity (rows/s per replica)",
        &cap,
        &[],
    )));
    sections.push(Section::Svg(report::line_chart(
        "Latency vs throughput (the knee)",
        "capacity (rows/s per replica)",
        "p99 latency (ms)",
        &knee,
        &budget,
    )));
    sections.push(Section::Heading("Results".into()));
    sections.push(report::steps_table(labeled));
    sections.push(Section::Heading("Batch sizes formed by the server".into()));
    for m in &r.results {
        if let Some(d) = m.step.server.as_ref().filter(|d| !d.batch_sizes.is_empty()) {
            let bars: Vec<(String, f64)> = d
                .batch_sizes
                .iter()
                .map(|(l, n)| (l.clone(), *n as f64))
                .collect();
            sections.push(Section::Svg(report::bar_chart(
                &format!("Batch sizes, {}", m.point),
                "rows per batch",
                "batches",
                &bars,
            )));
        }
    }
    report::html(&format!("infer-build bench --tune: {model}"), &sections)
}
