//! The CPU engine of a target, chosen by measurement between tract and the engines that run
//! from a native library (ONNX Runtime, OpenVINO: the target's [`LibraryCandidate`]s).
//!
//! - tract alone (`engine.cpu = "tract"`, or no library engine for the target): tract's
//!   engine, as [`super::tract::build`] makes it; a model tract cannot load is refused.
//! - `engine.cpu = "onnxruntime"` or `"openvino"`: that engine alone; a model it cannot load is
//!   refused.
//! - `auto`: every engine is loaded and measured on the same inputs (start-up, T(b) at every
//!   planned batch size; tract single-threaded as the runtime runs it, a library engine at each
//!   thread count up to the share the runtime gives one instance). The outputs of one row at
//!   the profile's `opt` are compared with tract's (`|a - b| <= ATOL + RTOL * |b|`,
//!   element-wise). A library engine may ship when it loads, agrees with tract, and its summed
//!   T(b) over the planned batch sizes is at most [`ORT_MARGIN`] of tract's; of those the
//!   fastest ships, tract otherwise. When tract does not load, the fastest library engine that
//!   does ships; when none loads, the build is refused with every reason.
//!
//! Everything measured goes into the profile's `selection`.
//!
//! When tract cannot load the model as it is and ONNX Runtime is at hand (the candidate's
//! library, or under `tract` the [`Folding`](super::onnxruntime::Folding) library, fetched only
//! then), tract is retried on ONNX Runtime's constant-folded graph ([`onnxruntime::fold`]):
//! many exports compute shapes at run time that tract cannot translate but that fold to
//! constants. A tract engine built that way ships the folded model and records the ONNX
//! Runtime version that folded it (`CpuMeta::folded_by`).

use infer_spec::engine::{
    Agreement, BatchTiming, CandidateMeasurement, CpuEngine, EngineFormat, EngineKind,
    EngineSelection, GateMeta, StartupMeasurement, Version,
};

use infer_spec::MeasuredThreads;

use super::onnxruntime;
use super::openvino;
use super::spec::{EngineSpec, Gate, LibraryCandidate};
use super::timing::Measured;
use super::{tract, Error};

/// Absolute and relative tolerance of the output comparison between tract and ONNX Runtime
/// (FP32 engines that fuse and reorder differently).
pub(crate) const ATOL: f64 = 1e-4;
pub(crate) const RTOL: f64 = 1e-3;

/// A library engine (ONNX Runtime, OpenVINO) ships under `auto` only when its summed T(b) is at
/// most this fraction of tract's. Its image is larger (a glibc base and the library: about 30
/// MB for ONNX Runtime, 92 MB for OpenVINO) and needs a base pulled from a registry, so a gain within the measurement's noise is not worth it, and the
/// choice does not flip between builds on noise.
pub(crate) const ORT_MARGIN: f64 = 0.9;

/// More ONNX Runtime intra-op threads ship only when their summed T(b) is at most this fraction
/// of fewer threads': extra threads contend with the server's own and with other instances for
/// the same cores, so a gain within the measurement's noise is not worth them.
pub(crate) const THREADS_MARGIN: f64 = 0.95;

/// The intra-op thread count to ship from `(threads, summed T(b) µs)` in ascending thread
/// order: the first, replaced by a later one only when it is at most [`THREADS_MARGIN`] of the
/// best so far.
pub(crate) fn best_threads(sums: &[(usize, f64)]) -> usize {
    let mut best = match sums.first() {
        Some(&first) => first,
        None => return 1,
    };
    for &(threads, sum) in &sums[1..] {
        if sum <= THREADS_MARGIN * best.1 {
            best = (threads, sum);
        }
    }
    best.0
}

/// The chosen CPU engine, ready for the cache.
pub(crate) struct Chosen {
    pub kind: EngineKind,
    pub format: EngineFormat,
    pub bytes: Vec<u8>,
    pub startup: StartupMeasurement,
    pub batches: Vec<BatchTiming>,
    pub onnxruntime: Option<Version>,
    pub openvino: Option<Version>,
    pub measured_on: String,
    pub selection: Option<EngineSelection>,
    /// The ONNX Runtime version whose constant folding tract's engine was built from.
    pub folded_by: Option<Version>,
    /// A library engine: fewer threads than the instance's share measured faster, and that
    /// share (`CpuMeta::threads` and `share`).
    pub measured: Option<MeasuredThreads>,
    /// A CPU target beyond FP32: the accuracy gate it passed.
    pub gate: Option<GateMeta>,
}

fn threads_text() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// tract's engine of `bytes`, retried on ONNX Runtime's constant-folded graph when tract cannot
/// load the model as it is and ONNX Runtime is at hand; with the version that folded it.
fn tract_build(spec: &EngineSpec, bytes: &[u8]) -> Result<(tract::Built, Option<Version>), String> {
    let first = match tract::build(spec, bytes) {
        Ok(b) => return Ok((b, None)),
        Err(e) => format!("{e:#}"),
    };
    let (library, version) = match (&spec.onnxruntime, &spec.folding) {
        (Some(c), _) => (Ok(c.library.clone()), &c.version),
        (None, Some(f)) => (f.library(), &f.version),
        (None, None) => return Err(first),
    };
    let folded = library
        .and_then(|l| onnxruntime::fold(&l, bytes))
        .map_err(|e| {
            format!("{first} (ONNX Runtime {version} could not fold the model for a retry: {e})")
        })?;
    tract::build(spec, &folded)
        .map(|b| (b, Some(version.clone())))
        .map_err(|e| {
            format!("{first} (and after ONNX Runtime {version}'s constant folding: {e:#})")
        })
}

fn tract_chosen(
    (built, folded_by): (tract::Built, Option<Version>),
    selection: Option<EngineSelection>,
) -> Chosen {
    Chosen {
        kind: EngineKind::Tract,
        format: built.format,
        bytes: built.bytes,
        startup: built.startup,
        batches: built.batches,
        onnxruntime: None,
        openvino: None,
        measured_on: format!(
            "{} cpu, tract single-threaded, {} cores visible{}",
            std::env::consts::ARCH,
            threads_text(),
            match &folded_by {
                Some(v) => format!(", the model as ONNX Runtime {v} folded it"),
                None => String::new(),
            }
        ),
        selection,
        folded_by,
        measured: None,
        gate: None,
    }
}

/// Compare a library engine's outputs with tract's.
fn agreement(
    tract_out: &[tract_onnx::prelude::TValue],
    ort_out: &[onnxruntime::Output],
    inputs: String,
) -> Agreement {
    let mut max_abs = 0f64;
    let mut max_rel = 0f64;
    let mut agreed = tract_out.len() == ort_out.len();
    for (tv, (shape, o)) in tract_out.iter().zip(ort_out) {
        let Ok(cast) = tv.cast_to::<f64>() else {
            agreed = false;
            continue;
        };
        let Ok(view) = cast.to_plain_array_view::<f64>() else {
            agreed = false;
            continue;
        };
        let t: Vec<f64> = view.iter().copied().collect();
        if tv.shape() != shape.as_slice() || t.len() != o.len() {
            agreed = false;
            continue;
        }
        for (&a, &b) in o.iter().zip(&t) {
            let d = (a - b).abs();
            if d.is_nan() {
                agreed = false;
                continue;
            }
            max_abs = max_abs.max(d);
            if b.abs() > 0.0 {
                max_rel = max_rel.max(d / b.abs());
            }
            if d > ATOL + RTOL * b.abs() {
                agreed = false;
            }
        }
    }
    Agreement {
        atol: ATOL,
        rtol: RTOL,
        max_abs,
        max_rel,
        agreed,
        inputs,
    }
}

/// Engine `c` measured with `threads` threads (the reference outputs when `reference`).
fn measure_at(
    spec: &EngineSpec,
    c: &LibraryCandidate,
    bytes: &[u8],
    threads: usize,
    reference: Option<&tract_onnx::prelude::TVec<tract_onnx::prelude::TValue>>,
) -> Result<Measured, String> {
    match c.kind {
        EngineKind::Onnxruntime => {
            onnxruntime::measure(spec, c, bytes, threads, reference).map_err(|e| e.to_string())
        }
        EngineKind::Openvino => {
            openvino::measure(spec, c, bytes, threads, reference).map_err(|e| e.to_string())
        }
        other => Err(format!("{other} does not run from a library")),
    }
}

/// Engine `c` measured at every count of its [`LibraryCandidate::counts`] (the reference
/// outputs from the first): the fastest count ([`best_threads`]) with its measurement, and one
/// candidate row per count.
fn measure_library(
    spec: &EngineSpec,
    c: &LibraryCandidate,
    bytes: &[u8],
    reference: Option<&tract_onnx::prelude::TVec<tract_onnx::prelude::TValue>>,
) -> Result<(Measured, usize, Vec<CandidateMeasurement>), String> {
    let mut measured = Vec::new();
    for (k, threads) in c.counts().into_iter().enumerate() {
        let m = measure_at(spec, c, bytes, threads, reference.filter(|_| k == 0))?;
        measured.push((threads, m));
    }
    let sums: Vec<(usize, f64)> = measured
        .iter()
        .map(|(t, m)| (*t, sum_us(&m.batches)))
        .collect();
    let best = best_threads(&sums);
    let rows = measured
        .iter()
        .map(|(threads, m)| library_row(c, *threads, Some(m), None))
        .collect();
    let outputs = measured.first_mut().and_then(|(_, m)| m.outputs.take());
    let (_, mut chosen) = measured
        .into_iter()
        .find(|(t, _)| *t == best)
        .ok_or_else(|| format!("no {} measurement", c.title()))?;
    chosen.outputs = outputs;
    Ok((chosen, best, rows))
}

fn library_row(
    c: &LibraryCandidate,
    threads: usize,
    m: Option<&Measured>,
    error: Option<String>,
) -> CandidateMeasurement {
    CandidateMeasurement {
        kind: c.kind,
        version: c.version.to_string(),
        threads: threads as u32,
        startup_ms: m.map(|m| m.startup_ms),
        batches: m.map(|m| m.batches.clone()).unwrap_or_default(),
        error,
    }
}

/// The rule of `auto` for a library engine when tract loads: it may ship when its outputs agree
/// with tract's and its summed T(b) is at most [`ORT_MARGIN`] of tract's.
pub(crate) fn ort_ships(tract_sum_us: f64, ort_sum_us: f64, agreed: bool) -> bool {
    agreed && ort_sum_us <= ORT_MARGIN * tract_sum_us
}

fn sum_us(b: &[BatchTiming]) -> f64 {
    b.iter().map(|t| t.median_us).sum()
}

fn library_chosen(
    c: &LibraryCandidate,
    bytes: &[u8],
    (m, threads): (Measured, usize),
    mut selection: EngineSelection,
) -> Chosen {
    let counts: Vec<String> = c.counts().iter().map(usize::to_string).collect();
    selection.reason.push_str(&format!(
        "; {threads} thread{} per instance, the fastest of {}{}",
        if threads == 1 { "" } else { "s" },
        counts.join(", "),
        if c.given {
            " (the recipe's engine.threads)"
        } else if threads < c.threads {
            " (a hint: runtime.toml's engine.measured, taken where an instance has the same share of CPUs)"
        } else {
            " (the instance's share of the CPUs)"
        }
    ));
    let version = Some(c.version.clone());
    Chosen {
        kind: c.kind,
        format: EngineFormat::Onnx,
        bytes: bytes.to_vec(),
        startup: StartupMeasurement {
            onnx_ms: m.startup_ms,
            nnef_ms: None,
            chosen: EngineFormat::Onnx,
            runs: m.startup_runs,
            note: Some(match c.kind {
                EngineKind::Openvino => {
                    "OpenVINO: the onnx model read and compiled for the CPU".into()
                }
                _ => format!("{} session from the onnx model", c.title()),
            }),
        },
        batches: m.batches,
        onnxruntime: version
            .clone()
            .filter(|_| c.kind == EngineKind::Onnxruntime),
        openvino: version.filter(|_| c.kind == EngineKind::Openvino),
        measured_on: format!(
            "{} cpu, {} {} with {threads} thread{} (the fastest of {}), {} cores visible",
            std::env::consts::ARCH,
            c.title(),
            c.version,
            if threads == 1 { "" } else { "s" },
            counts.join(", "),
            threads_text()
        ),
        selection: Some(selection),
        folded_by: None,
        measured: (!c.given && threads < c.threads).then_some(MeasuredThreads {
            threads: threads as u32,
            share: c.threads as u32,
        }),
        gate: None,
    }
}

/// A library engine measured under `auto`.
type Tried<'c> = (
    &'c LibraryCandidate,
    Result<(Measured, usize, Vec<CandidateMeasurement>), String>,
);

/// Choose and build the CPU engine of `spec` from the ONNX `bytes`; `fp32`: the recipe's model
/// when `bytes` is its conversion (a `cpu-int8` target's Q/DQ model), the reference of the gate.
pub(crate) fn choose(
    spec: &EngineSpec,
    bytes: &[u8],
    fp32: Option<&[u8]>,
) -> Result<Chosen, Error> {
    if let Some(gate) = &spec.gate {
        return gated(spec, (fp32.unwrap_or(bytes), bytes), gate);
    }
    let libraries: Vec<&LibraryCandidate> = spec.onnxruntime.iter().chain(&spec.openvino).collect();
    if libraries.is_empty() {
        let built = tract_build(spec, bytes).map_err(|reason| Error::Tract {
            target: spec.target.clone(),
            reason,
        })?;
        return Ok(tract_chosen(built, None));
    }
    if let Some(c) = libraries.iter().find(|c| c.forced) {
        let (m, threads, rows) =
            measure_library(spec, c, bytes, None).map_err(|reason| Error::Forced {
                target: spec.target.clone(),
                title: c.title(),
                name: c.kind.def().name,
                reason,
            })?;
        let selection = EngineSelection {
            policy: CpuEngine::Only(c.kind),
            chosen: c.kind,
            reason: "forced by engine.cpu; tract was not measured".into(),
            candidates: rows,
            agreement: None,
        };
        return Ok(library_chosen(c, bytes, (m, threads), selection));
    }

    let tract_built = tract_build(spec, bytes);
    let reference = tract_built.as_ref().ok().map(|(b, _)| &b.reference.0);
    let tried: Vec<Tried<'_>> = libraries
        .iter()
        .map(|c| (*c, measure_library(spec, c, bytes, reference)))
        .collect();
    let tract_candidate = match &tract_built {
        Ok((b, _)) => CandidateMeasurement {
            kind: EngineKind::Tract,
            version: tract::TRACT_VERSION.into(),
            threads: 1,
            startup_ms: Some(match b.startup.chosen {
                EngineFormat::TractNnefTar => b.startup.nnef_ms.unwrap_or(b.startup.onnx_ms),
                _ => b.startup.onnx_ms,
            }),
            batches: b.batches.clone(),
            error: None,
        },
        Err(e) => CandidateMeasurement {
            kind: EngineKind::Tract,
            version: tract::TRACT_VERSION.into(),
            threads: 1,
            startup_ms: None,
            batches: Vec::new(),
            error: Some(e.clone()),
        },
    };
    let mut candidates = vec![tract_candidate];
    for (c, r) in &tried {
        match r {
            Ok((_, _, rows)) => candidates.extend(rows.iter().cloned()),
            Err(e) => candidates.push(library_row(c, c.threads, None, Some(e.clone()))),
        }
    }
    match tract_built {
        Err(t) => without_tract(spec, bytes, t, tried, candidates),
        Ok(built) => against_tract(bytes, built, tried, candidates),
    }
}

/// A CPU target beyond FP32 (`cpu-bf16`, `cpu-int8`): the library engine that computes in its
/// precision (OpenVINO: the plan allows no other) on `bytes` (the recipe's model, or its INT8
/// Q/DQ conversion), gated against itself on `fp32`, the recipe's model, in FP32 on the
/// evaluation inputs (one thread), then measured at its thread counts; refused when the
/// builder's CPU cannot compute in the precision or the gate fails.
fn gated(spec: &EngineSpec, (fp32, bytes): (&[u8], &[u8]), gate: &Gate) -> Result<Chosen, Error> {
    let Some(c) = spec
        .onnxruntime
        .iter()
        .chain(&spec.openvino)
        .find(|c| c.kind.def().computes(spec.precision))
    else {
        return Err(Error::NoCpuEngine {
            target: spec.target.clone(),
            reasons: format!(
                "  {} on the CPU runs on {}, which is not at hand for this target",
                spec.precision,
                EngineKind::cpu_engines()
                    .filter(|d| d.library.is_some() && d.computes(spec.precision))
                    .map(|d| d.title)
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        });
    };
    let forced = |reason: String| Error::Forced {
        target: spec.target.clone(),
        title: c.title(),
        name: c.kind.def().name,
        reason,
    };
    // The gate first, with one thread (the figures do not depend on the machine's cores): a
    // CPU that cannot compute in the precision stops here, before any measurement.
    let (figures, evaluation) = match c.kind {
        EngineKind::Openvino => {
            openvino::gate(spec, c, (fp32, bytes), 1, gate.evaluation.as_deref()).map_err(|e| {
                match e {
                    openvino::OvError::Precision { .. } => Error::CpuPrecision {
                        target: spec.target.clone(),
                        reason: e.to_string(),
                    },
                    openvino::OvError::Evaluation(reason) => Error::Input {
                        target: spec.target.clone(),
                        input: "evaluation data".into(),
                        reason,
                    },
                    e => forced(e.to_string()),
                }
            })?
        }
        other => return Err(forced(format!("{other} has no accuracy gate"))),
    };
    let t = &gate.thresholds;
    let failures = super::accuracy::failures(&figures, t);
    let against = format!("{} {} in FP32, 1 thread", c.title(), c.version);
    if !failures.is_empty() {
        return Err(Error::Accuracy {
            target: spec.target.clone(),
            precision: spec.precision.to_string(),
            failures: failures.join("; "),
            evaluation: format!("{evaluation} ({against})"),
            figures: super::convert::summary(&figures).join("\n  "),
        });
    }
    let (m, threads, rows) = measure_library(spec, c, bytes, None).map_err(forced)?;
    let selection = EngineSelection {
        policy: CpuEngine::Only(c.kind),
        chosen: c.kind,
        reason: format!(
            "{} computes in {}, which only it does; tract was not measured; the accuracy gate passed against {against} on {evaluation}",
            c.title(),
            spec.precision
        ),
        candidates: rows,
        agreement: None,
    };
    let mut chosen = library_chosen(c, bytes, (m, threads), selection);
    chosen.gate = Some(GateMeta {
        computed_in: spec.precision,
        against,
        evaluation,
        accuracy: super::figures_meta(&figures),
        limits: {
            let mut l = format!("max_rel={:.4e} min_top1={:.4}", t.max_rel, t.min_top1);
            if let Some(a) = t.max_abs {
                l.push_str(&format!(" max_abs={a:.4e}"));
            }
            l
        },
    });
    Ok(chosen)
}

/// `auto` when tract does not load the model: the fastest library engine that does ships.
fn without_tract(
    spec: &EngineSpec,
    bytes: &[u8],
    t: String,
    tried: Vec<Tried<'_>>,
    candidates: Vec<CandidateMeasurement>,
) -> Result<Chosen, Error> {
    let mut reasons = format!("  tract: {t}");
    for (c, r) in &tried {
        if let Err(e) = r {
            reasons.push_str(&format!("\n  {}: {e}", c.title()));
        }
    }
    let loaded = tried
        .into_iter()
        .filter_map(|(c, r)| r.ok().map(|m| (c, m)));
    let Some((c, (m, threads, _))) =
        loaded.min_by(|(_, a), (_, b)| sum_us(&a.0.batches).total_cmp(&sum_us(&b.0.batches)))
    else {
        return Err(Error::NoCpuEngine {
            target: spec.target.clone(),
            reasons,
        });
    };
    let selection = EngineSelection {
        policy: CpuEngine::Auto,
        chosen: c.kind,
        reason: format!("tract does not load the model: {t}"),
        candidates,
        agreement: None,
    };
    Ok(library_chosen(c, bytes, (m, threads), selection))
}

/// `auto` when tract loads the model: each library engine that loads is compared with tract;
/// of those that agree and are at most [`ORT_MARGIN`] of tract's summed T(b), the fastest
/// ships, else tract.
fn against_tract(
    bytes: &[u8],
    built: (tract::Built, Option<Version>),
    tried: Vec<Tried<'_>>,
    candidates: Vec<CandidateMeasurement>,
) -> Result<Chosen, Error> {
    let b = &built.0;
    let inputs = format!(
        "batch 1 at the profile's opt: {}",
        b.reference
            .0
            .iter()
            .map(|t| format!("{:?}", t.shape()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let t_sum = sum_us(&b.batches);
    let batches: Vec<String> = b.batches.iter().map(|t| t.batch.to_string()).collect();
    let mut sums = format!("tract {t_sum:.1} µs");
    let mut clauses = Vec::new();
    // (candidate, measurement, threads, agreement with tract, ships by the margin, summed T(b))
    let mut judged = Vec::new();
    for (c, r) in tried {
        match r {
            Err(_) => clauses.push(format!("{} does not load or run the model", c.title())),
            Ok((m, threads, _)) => {
                let agree = agreement(
                    &b.reference.1,
                    m.outputs.as_deref().unwrap_or(&[]),
                    inputs.clone(),
                );
                let sum = sum_us(&m.batches);
                sums.push_str(&format!(
                    ", {} {sum:.1} µs ({:.2}x)",
                    c.title(),
                    sum / t_sum.max(f64::MIN_POSITIVE)
                ));
                let ships = ort_ships(t_sum, sum, agree.agreed);
                clauses.push(if !agree.agreed {
                    format!(
                        "{}'s outputs differ beyond the tolerance (max |a-b| {:.3e}, atol {ATOL:e}, rtol {RTOL:e})",
                        c.title(),
                        agree.max_abs
                    )
                } else if ships {
                    format!("{} is faster than tract", c.title())
                } else {
                    format!("{} is not enough faster than tract", c.title())
                });
                judged.push((c, m, threads, agree, ships, sum));
            }
        }
    }
    let compared = format!(
        "sum of T(b) over batch sizes {}: {sums}; an engine ships at {ORT_MARGIN}x of tract's or less",
        batches.join(", ")
    );
    let folded = match &built.1 {
        Some(v) => format!("tract loads the model after ONNX Runtime {v}'s constant folding; "),
        None => String::new(),
    };
    let winner = judged
        .iter()
        .enumerate()
        .filter(|(_, j)| j.4)
        .min_by(|(_, a), (_, b)| a.5.total_cmp(&b.5))
        .map(|(i, _)| i);
    let shown = winner.or((!judged.is_empty()).then_some(0));
    let agreement_shown = shown.map(|i| judged[i].3.clone());
    let chosen_kind = winner.map_or(EngineKind::Tract, |i| judged[i].0.kind);
    let verdict = match winner {
        Some(i) => format!("{} ships", judged[i].0.title()),
        None => "tract is kept".to_owned(),
    };
    let selection = EngineSelection {
        policy: CpuEngine::Auto,
        chosen: chosen_kind,
        reason: format!("{folded}{}; {verdict}; {compared}", clauses.join("; ")),
        candidates,
        agreement: agreement_shown,
    };
    match winner {
        Some(i) => {
            let (c, m, threads, ..) = judged.swap_remove(i);
            Ok(library_chosen(c, bytes, (m, threads), selection))
        }
        None => Ok(tract_chosen(built, Some(selection))),
    }
}

#[cfg(test)]
mod tests {
    use super::{best_threads, ort_ships};
    use crate::engine::spec::thread_counts;

    #[test]
    fn thread_counts_double_up_to_the_instance_share() {
        for (max, counts) in [
            (0, vec![1]),
            (1, vec![1]),
            (2, vec![1, 2]),
            (3, vec![1, 2, 3]),
            (4, vec![1, 2, 4]),
            (6, vec![1, 2, 4, 6]),
            (16, vec![1, 2, 4, 8, 16]),
        ] {
            assert_eq!(thread_counts(max), counts, "{max}");
        }
    }

    #[test]
    fn more_threads_ship_only_when_clearly_faster() {
        // (threads, summed T(b) µs) ascending → the count that ships
        for (sums, best) in [
            (vec![], 1),
            (vec![(1, 100.0)], 1),
            (vec![(1, 100.0), (2, 60.0)], 2),
            (vec![(1, 100.0), (2, 95.0)], 2),
            (vec![(1, 100.0), (2, 96.0)], 1),
            (vec![(1, 100.0), (2, 130.0)], 1),
            // Each step is judged against the best so far, not the previous count.
            (vec![(1, 100.0), (2, 97.0), (4, 94.0)], 4),
            (vec![(1, 100.0), (2, 60.0), (4, 58.0)], 2),
        ] {
            assert_eq!(best_threads(&sums), best, "{sums:?}");
        }
    }

    #[test]
    fn onnxruntime_ships_only_when_it_agrees_and_is_clearly_faster() {
        // (tract µs, ONNX Runtime µs, outputs agree) → ONNX Runtime ships
        for (t, o, agreed, ships) in [
            (1000.0, 100.0, true, true),
            (1000.0, 900.0, true, true),
            (1000.0, 901.0, true, false),
            (1000.0, 1000.0, true, false),
            (100.0, 1000.0, true, false),
            (1000.0, 100.0, false, false),
        ] {
            assert_eq!(ort_ships(t, o, agreed), ships, "{t} {o} {agreed}");
        }
    }
}
