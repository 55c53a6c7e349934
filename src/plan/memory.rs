//! Whether a bundle's models fit one target together, before any engine is built: an estimate
//! of the memory each model needs, against what the target holds (the GPU's memory from the
//! matrix, or the pod's memory on CPU), with headroom kept free. Pure: the caller gives the
//! ONNX files' sizes.
//!
//! The estimate, per model: its weights (the ONNX file's size scaled to the target's precision;
//! on a CPU once per instance, as each instance loads the model, on a GPU once, its execution
//! contexts sharing the engine) plus, per instance, two buffers of its inputs and outputs at
//! the largest batch and shapes (a dimension an output leaves open is taken as the largest
//! bound of the inputs). Intermediate activations and allocator slack are not modelled: the
//! headroom and the fixed runtime overhead stand for them. It is an estimate and is said so.

use crate::matrix::{Matrix, Precision};
use crate::recipe::{Recipe, Tensor};

use super::{TargetKind, TargetPlan};

/// The share of a target's memory kept free.
pub(crate) const HEADROOM_PERCENT: u64 = 10;
/// What the server itself takes once: on a GPU the CUDA context and TensorRT's runtime, on a
/// CPU the server, its buffers and the tokenizer pool.
pub(crate) const GPU_OVERHEAD: u64 = 512 << 20;
pub(crate) const CPU_OVERHEAD: u64 = 64 << 20;

/// The bytes the weights keep per byte of the (fp32) ONNX file at `precision`.
fn weight_factor(precision: Precision) -> f64 {
    match precision {
        Precision::Fp32 | Precision::Tf32 => 1.0,
        Precision::Fp16 | Precision::Bf16 => 0.5,
        Precision::Int8 | Precision::Fp8 => 0.25,
        Precision::Fp4 => 0.125,
    }
}

/// The largest elements of one row (a batch of one) of `t`, `open` standing for a dimension
/// without a bound.
fn row_elements(t: &Tensor, open: u64) -> u64 {
    t.shape
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, &d)| match d {
            d if d > 0 => d as u64,
            _ => t
                .profile
                .as_ref()
                .and_then(|p| p.max.get(i - 1))
                .map_or(open, |&m| m.max(1) as u64),
        })
        .fold(1u64, u64::saturating_mul)
}

/// The estimated bytes `recipe`'s model needs on target `t`, its ONNX file being `onnx_bytes`.
pub(crate) fn model_need(recipe: &Recipe, t: &TargetPlan, onnx_bytes: u64) -> u64 {
    let instances = u64::from(recipe.batching.instances.max(1));
    let batch = u64::from(recipe.batching.max_batch_size.max(1));
    let weights = (onnx_bytes as f64 * weight_factor(t.precision)) as u64;
    let weights = match t.kind {
        TargetKind::Gpu => weights,
        TargetKind::Cpu => weights.saturating_mul(instances),
    };
    let open = recipe
        .model
        .inputs
        .iter()
        .flat_map(|i| i.profile.iter().flat_map(|p| p.max.iter().copied()))
        .max()
        .unwrap_or(1)
        .max(1) as u64;
    let io: u64 = recipe
        .model
        .inputs
        .iter()
        .chain(&recipe.model.outputs)
        .map(|t| {
            let size = t.datatype.size().unwrap_or(8) as u64;
            row_elements(t, open).saturating_mul(size)
        })
        .fold(0u64, u64::saturating_add);
    let activations = io
        .saturating_mul(batch)
        .saturating_mul(2)
        .saturating_mul(instances);
    weights.saturating_add(activations)
}

/// What target `t` holds, in bytes, and what that is: on a GPU target the smallest memory of
/// the products it serves (`None` when the matrix gives none of them a size), on a CPU target
/// the pod's memory (`pod_mib`).
pub(crate) fn capacity(matrix: &Matrix, t: &TargetPlan, pod_mib: u64) -> Option<(u64, String)> {
    match (&t.gpu, t.kind) {
        (Some(g), TargetKind::Gpu) => g
            .products
            .iter()
            .filter_map(|name| {
                let row = matrix.gpus.iter().find(|r| &r.name == name)?;
                Some(((row.memory_gb? * 1e9) as u64, name))
            })
            .min_by_key(|(bytes, _)| *bytes)
            .map(|(bytes, name)| (bytes, format!("{name}'s {:.0} GB", bytes as f64 / 1e9))),
        _ => Some((
            pod_mib.saturating_mul(1 << 20),
            format!("the pod's {pod_mib} MiB (deploy.resources.memory)"),
        )),
    }
}

/// `bytes` for people: GiB with two decimals, or MiB under 1 GiB.
pub(crate) fn human(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    }
}

/// What the server itself takes on `t`.
fn overhead(t: &TargetPlan) -> u64 {
    if t.kind == TargetKind::Gpu {
        GPU_OVERHEAD
    } else {
        CPU_OVERHEAD
    }
}

/// The bytes the models (name, estimated bytes) and the server need together on `t`.
pub(crate) fn total(t: &TargetPlan, needs: &[(String, u64)]) -> u64 {
    needs
        .iter()
        .map(|(_, b)| *b)
        .fold(overhead(t), u64::saturating_add)
}

/// The pod memory, in MiB, that holds `total` bytes with the headroom kept free.
pub(crate) fn pod_mib_for(total: u64) -> u64 {
    (total / (100 - HEADROOM_PERCENT) * 100).div_ceil(1 << 20)
}

/// The refusal when the models of a bundle (name, estimated bytes) do not fit target `t`,
/// `None` when they do or the target's memory is unknown.
pub(crate) fn refusal(
    matrix: &Matrix,
    t: &TargetPlan,
    pod_mib: u64,
    needs: &[(String, u64)],
) -> Option<String> {
    let (holds, what) = capacity(matrix, t, pod_mib)?;
    let total = total(t, needs);
    let gpu = t.kind == TargetKind::Gpu;
    let usable = holds / 100 * (100 - HEADROOM_PERCENT);
    if total <= usable {
        return None;
    }
    let parts: Vec<String> = needs
        .iter()
        .map(|(n, b)| format!("{n} {}", human(*b)))
        .chain(std::iter::once(format!(
            "the server {}",
            human(overhead(t))
        )))
        .collect();
    Some(format!(
        "target {}: the models need about {} of {} together (an estimate: {}), more than the {} usable of {what} ({HEADROOM_PERCENT}% kept free); split the bundle, lower the models' max_batch_size or instances, or {}",
        t.id,
        human(total),
        if gpu { "GPU memory" } else { "memory" },
        parts.join(", "),
        human(usable),
        if gpu {
            "target a GPU with more memory"
        } else {
            "raise deploy.resources.memory in the bundle file"
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(batch: u32, instances: u32) -> Recipe {
        let text = format!(
            "[model]\nname = \"m\"\nversion = \"1\"\nonnx = \"m.onnx\"\n[model.inputs.x]\ndatatype = \"fp32\"\nshape = [-1, 3, -1]\nprofile = {{ min = [3, 1], opt = [3, 8], max = [3, 100] }}\n[model.outputs.y]\ndatatype = \"fp16\"\nshape = [-1, -1]\n[targets]\ncpu = true\n[batching]\nmax_batch_size = {batch}\ninstances = {instances}\n"
        );
        crate::recipe::parse(&text, std::path::Path::new("r.toml")).unwrap()
    }

    fn cpu_target() -> TargetPlan {
        let r = recipe(1, 1);
        let m = crate::matrix::load(None).unwrap();
        super::super::resolve(&r, &m, None).unwrap().targets[0].clone()
    }

    #[test]
    fn a_model_needs_its_weights_and_two_buffers_of_its_largest_batch() {
        let t = cpu_target();
        // x: 3 x 100 fp32 = 1200 bytes a row; y: its open dimension taken as 100, fp16 = 200.
        assert_eq!(model_need(&recipe(1, 1), &t, 1000), 1000 + 2 * 1400);
        // Batches of 8, two instances: each instance loads the weights on a CPU.
        assert_eq!(
            model_need(&recipe(8, 2), &t, 1000),
            2 * 1000 + 2 * 2 * 8 * 1400
        );
    }

    #[test]
    fn models_that_do_not_fit_the_pod_are_refused_with_the_numbers() {
        let m = crate::matrix::load(None).unwrap();
        let t = cpu_target();
        let fits = [("a".to_string(), 10 << 20), ("b".to_string(), 20 << 20)];
        assert_eq!(refusal(&m, &t, 2048, &fits), None);
        let big = [("a".to_string(), 1 << 30), ("b".to_string(), 1 << 30)];
        let why = refusal(&m, &t, 2048, &big).unwrap();
        assert!(
            why.starts_with("target cpu-fp32: the models need about 2.06 GiB of memory together (an estimate: a 1.00 GiB, b 1.00 GiB, the server 64.0 MiB), more than the 1.80 GiB usable of the pod's 2048 MiB"),
            "{why}"
        );
    }

    #[test]
    fn every_gpu_in_the_matrix_states_its_memory() {
        let m = crate::matrix::load(None).unwrap();
        for g in &m.gpus {
            assert!(g.memory_gb.is_some_and(|v| v >= 4.0), "{}", g.name);
        }
    }
}
