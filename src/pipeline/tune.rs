//! What `bench --tune` sweeps from.

use std::path::Path;

use crate::assemble;
use crate::error::Error;

/// What `bench --tune FILE` sweeps from: a `runtime.toml` as written, or the runtime
/// configuration `build` would put in a recipe's CPU image (tract on its ONNX model, its
/// batching) with the recipe's `deploy.latency_slo_ms` and `deploy.peak_qps`. The two are told
/// apart by content ([`crate::bench::tune::input_kind`]). A recipe without a CPU target is
/// refused unless the sweep replaces the engine with the synthetic one.
pub(crate) fn tune_base(path: &Path, synthetic: bool) -> Result<crate::bench::tune::Base, Error> {
    use crate::bench::{tune::InputKind, Error as BenchError};
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("cannot read {}: {e}", path.display())))?;
    let kind = crate::bench::tune::input_kind(&text);
    let (config, slo_ms, peak_qps) = match kind {
        InputKind::Recipe => {
            let recipe = crate::recipe::load(path)?;
            if recipe.targets.cpu.is_empty() && !synthetic {
                return Err(BenchError::TuneInput(format!(
                    "a CPU target in {}: tuning runs its ONNX model on tract here (set `cpu = true` under [targets], or pass --synthetic)",
                    path.display()
                ))
                .into());
            }
            let (model, _) = assemble::safe_input(&recipe.dir, &recipe.model.onnx.value)?;
            let config = assemble::spec::runtime_config(
                &recipe,
                infer_spec::BackendKind::TractOnnx,
                &model.to_string_lossy(),
                None,
            )?;
            (
                config,
                recipe.deploy.latency_slo_ms.map(f64::from),
                recipe.deploy.peak_qps,
            )
        }
        InputKind::RuntimeConfig => (
            infer_spec::RuntimeConfig::from_toml_str(&text).map_err(|e| {
                BenchError::TuneInput(format!(
                    "a valid runtime.toml or recipe: {}: {e}",
                    path.display()
                ))
            })?,
            None,
            None,
        ),
    };
    Ok(crate::bench::tune::Base {
        kind,
        file: path.to_path_buf(),
        config,
        slo_ms,
        peak_qps,
    })
}
