//! The accuracy gate: a converted model's figures (see [`super::convert::Report`]), or a CPU
//! engine's in a lower precision (see [`super::openvino::gate`]), against
//! per-precision thresholds, defaults here, each overridable in the recipe's `[accuracy]`.
//! Pure.
//!
//! Figures per output: the largest absolute difference from the FP32 model, the same relative
//! to the FP32 output's largest magnitude (`max_rel`), and for classification-shaped outputs
//! (`[N, C]`, C ≥ 2) the fraction of rows whose arg-max agrees (`top1`). A model over any
//! threshold is refused with its figures (exit code 2: the model, its calibration data or the
//! thresholds are the user's to change).

use infer_spec::engine::Precision;

use super::convert::OutputFigures;

/// Limits a converted model must meet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Largest absolute difference allowed (no limit when `None`).
    pub max_abs: Option<f64>,
    /// Largest relative difference allowed.
    pub max_rel: f64,
    /// Smallest top-1 agreement for classification-shaped outputs.
    pub min_top1: f64,
}

impl Thresholds {
    /// The defaults: FP16 and BF16 keep outputs within 5% of their range and top-1 on at least
    /// 99% of rows; INT8 within 35% (small softmax heads move by a third of their range under INT8
    /// while ranking the same) with top-1 on at least 95% of rows; FP8 (E4M3, 3 mantissa bits:
    /// up to 6% error per value before accumulation) within 40% with top-1 on at least 95%.
    pub(crate) fn default_for(p: Precision) -> Thresholds {
        match p {
            Precision::Fp8 => Thresholds {
                max_abs: None,
                max_rel: 0.40,
                min_top1: 0.95,
            },
            Precision::Int8 => Thresholds {
                max_abs: None,
                max_rel: 0.35,
                min_top1: 0.95,
            },
            _ => Thresholds {
                max_abs: None,
                max_rel: 0.05,
                min_top1: 0.99,
            },
        }
    }
}

/// The figures that break a threshold, one phrase each; empty when the model passes.
pub(crate) fn failures(outputs: &[OutputFigures], t: &Thresholds) -> Vec<String> {
    let mut out = Vec::new();
    for o in outputs {
        match o.max_abs {
            None => out.push(format!("{}: non-finite values", o.name)),
            Some(a) => {
                if let Some(limit) = t.max_abs {
                    if a > limit {
                        out.push(format!("{}: max abs {a:.3e} > {limit:.3e}", o.name));
                    }
                }
            }
        }
        match o.max_rel {
            Some(r) if r > t.max_rel => {
                out.push(format!("{}: max rel {r:.3e} > {:.3e}", o.name, t.max_rel))
            }
            None if o.max_abs.is_some() => out.push(format!("{}: max rel is not finite", o.name)),
            _ => {}
        }
        if let Some(a) = o.top1_agreement {
            if a < t.min_top1 {
                out.push(format!(
                    "{}: top-1 agreement {:.2}% < {:.2}%",
                    o.name,
                    a * 100.0,
                    t.min_top1 * 100.0
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(max_abs: Option<f64>, max_rel: Option<f64>, top1: Option<f64>) -> Vec<OutputFigures> {
        vec![OutputFigures {
            name: "prob".into(),
            max_abs,
            max_rel,
            top1_agreement: top1,
            rows: top1.map(|_| 32),
        }]
    }

    #[test]
    fn thresholds_refuse_what_they_should() {
        let fp16 = Thresholds::default_for(Precision::Fp16);
        assert!(failures(&report(Some(4.5e-4), Some(4.5e-4), Some(1.0)), &fp16).is_empty());
        assert_eq!(
            failures(&report(Some(0.08), Some(0.08), Some(0.875)), &fp16),
            [
                "prob: max rel 8.000e-2 > 5.000e-2",
                "prob: top-1 agreement 87.50% < 99.00%"
            ]
        );
        assert_eq!(
            failures(&report(None, None, None), &fp16),
            ["prob: non-finite values"]
        );
        let int8 = Thresholds::default_for(Precision::Int8);
        assert!(failures(&report(Some(0.27), Some(0.27), Some(0.96875)), &int8).is_empty());
        assert_eq!(
            failures(&report(Some(0.5), Some(0.5), Some(0.72)), &int8).len(),
            2
        );
        let strict = Thresholds {
            max_abs: Some(1e-3),
            ..fp16
        };
        assert_eq!(
            failures(&report(Some(2e-3), Some(2e-3), None), &strict),
            ["prob: max abs 2.000e-3 > 1.000e-3"]
        );
    }
}
