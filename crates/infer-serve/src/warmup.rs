//! Warm-up: before the server reports ready, every backend instance runs every planned batch
//! size (`RuntimeConfig::warmup_batch_sizes`) with dtype-valid data (finite numbers in range,
//! 0/1 booleans, short strings; never raw random bytes, which would make NaNs) and the
//! outputs are checked against the config's datatypes and shapes.
//!
//! A model with variable non-batch dimensions runs every batch size at its profile's `opt`
//! shape, then one row at `min` and one at `max` ([`runs`]): the engine prepares each shape
//! it will see most (the tract backend optimises one plan per shape) and a shape at either
//! bound that the engine cannot run stops the start instead of failing the first request.
//!
//! With `[warmup] samples` ([`Samples`]), warm-up first sends every sample request as given,
//! then fills each run of a shape some sample has with that sample's rows (repeated in order
//! to the batch size); only runs of shapes no sample has get synthetic data.

use crate::backend::{Backend, ExecError};
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::{DataType, RuntimeConfig};
use std::path::Path;

/// Warm-up samples (`[warmup] samples`): each request of the file decoded exactly as the
/// server decodes a request body, so a sample the server would refuse stops the start.
#[derive(Debug, Default)]
pub(crate) struct Samples(Vec<Vec<Tensor>>);

/// Why warm-up could not run: its samples file, a batch, or the engine's outputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Error {
    /// The samples file is not a regular file (a FIFO, a device, a directory, a socket) or is
    /// larger than [`infer_spec::samples::MAX_BYTES`]: a bad config (exit 2). The message names
    /// the path.
    #[error("{0}")]
    Refused(String),
    /// The samples file could not be opened or read (missing, unreadable).
    #[error("{0}")]
    Io(String),
    /// A sample request does not decode: the file and the request.
    #[error("{0}")]
    Samples(String),
    /// The engine failed a warm-up batch.
    #[error("{0}")]
    Exec(ExecError),
    /// The engine's outputs do not match `runtime.toml`: which output, what it was.
    #[error("{0}")]
    Outputs(String),
}

impl From<ExecError> for Error {
    fn from(e: ExecError) -> Error {
        Error::Exec(e)
    }
}

/// What a file type is, for an error naming it; `None` for a regular file.
pub(crate) fn not_regular(ft: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    Some(if ft.is_file() {
        return None;
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    })
}

/// Reads the samples file at `path` as the engine's files are checked, but on the open file:
/// opened without blocking (a FIFO with no writer would block `open` for good), its type and
/// size taken from the open descriptor (not from a second look at the path, which may have
/// been replaced meanwhile), and read through a bound one byte past the limit, so a file that
/// grows while it is read is refused rather than read without end.
pub(crate) fn read_samples(path: &Path) -> Result<String, Error> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let max = infer_spec::samples::MAX_BYTES;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    if let Some(what) = not_regular(meta.file_type()) {
        return Err(Error::Refused(format!(
            "{} is {what}, not a regular file",
            path.display()
        )));
    }
    let too_large = |len: u64| {
        Error::Refused(format!(
            "{} is {len} bytes or more, more than the {max} a samples file may have",
            path.display()
        ))
    };
    if meta.len() > max {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|_| Error::Io(format!("{}: not UTF-8 text", path.display())))
}

impl Samples {
    /// Decodes the samples file's `text` (read from `path` by [`read_samples`]); the error
    /// names the file and the request.
    pub(crate) fn decode(cfg: &RuntimeConfig, path: &Path, text: &str) -> Result<Samples, Error> {
        let at = |m: String| Error::Samples(format!("warm-up samples {}: {m}", path.display()));
        let mut out = Vec::new();
        for (i, r) in infer_spec::samples::requests(text)
            .map_err(at)?
            .iter()
            .enumerate()
        {
            let body = Bytes::from(serde_json::to_vec(r).map_err(|e| at(e.to_string()))?);
            let req = crate::v2::decode_request(cfg, None, &body)
                .map_err(|e| at(format!("request {i}: {e}")))?;
            out.push(req.inputs);
        }
        Ok(Samples(out))
    }

    /// The number of sample requests.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The sample requests, as given.
    pub(crate) fn requests(&self) -> &[Vec<Tensor>] {
        &self.0
    }

    /// `rows` rows of the non-batch `shapes` from the first sample of those shapes, its rows
    /// repeated in order; `None` when no sample has them.
    pub(crate) fn at(&self, rows: usize, shapes: &Shapes) -> Option<Vec<Tensor>> {
        let sample = self.0.iter().find(|inputs| {
            inputs
                .iter()
                .zip(shapes)
                .all(|(t, dims)| t.shape.get(1..) == Some(dims.as_slice()))
        })?;
        sample
            .iter()
            .map(|t| {
                let have = t.rows().max(1);
                let parts: Vec<Tensor> = (0..rows)
                    .map(|i| t.slice_rows(i % have, 1))
                    .collect::<Option<_>>()?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                Tensor::concat_rows(&refs)
            })
            .collect()
    }
}

/// The non-batch dimensions of every input, in the config's input order.
pub(crate) type Shapes = Vec<Vec<usize>>;

/// The warm-up executions in order: `(rows, shapes)` for every warm-up batch size at the
/// profile's `opt` shape, then, for a model with variable dimensions, one row at `min` and
/// one at `max` (when they differ from `opt`).
pub(crate) fn runs(cfg: &RuntimeConfig) -> Vec<(usize, Shapes)> {
    let at = |f: fn(&infer_spec::TensorSpec) -> Vec<usize>| -> Shapes {
        cfg.inputs.iter().map(f).collect()
    };
    let opt = at(infer_spec::TensorSpec::opt_row_dims);
    let sizes = cfg.warmup_batch_sizes();
    let mut out: Vec<(usize, Shapes)> = sizes.iter().map(|&r| (r as usize, opt.clone())).collect();
    if !sizes.is_empty() && cfg.inputs.iter().any(|s| s.is_variable()) {
        for bound in [
            at(infer_spec::TensorSpec::min_row_dims),
            at(infer_spec::TensorSpec::row_dims),
        ] {
            if bound != opt && !out.iter().any(|(r, s)| *r == 1 && *s == bound) {
                out.push((1, bound));
            }
        }
    }
    out
}

/// Deterministic, valid inputs for a batch of `rows` rows at the profile's `opt` shape.
#[cfg(test)]
pub(crate) fn sample(cfg: &RuntimeConfig, rows: usize) -> Vec<Tensor> {
    let opt: Shapes = cfg.inputs.iter().map(|s| s.opt_row_dims()).collect();
    sample_at(cfg, rows, &opt)
}

/// Deterministic, valid inputs for a batch of `rows` rows of the given non-batch shapes.
pub(crate) fn sample_at(cfg: &RuntimeConfig, rows: usize, shapes: &Shapes) -> Vec<Tensor> {
    cfg.inputs
        .iter()
        .zip(shapes)
        .map(|(spec, dims)| {
            let mut shape = vec![rows];
            shape.extend(dims);
            let n: usize = shape.iter().product();
            let mut data = Vec::with_capacity(n * spec.datatype.size().unwrap_or(8));
            for i in 0..n {
                // The builder's values: the engine it checked ran on them.
                let small = infer_spec::samples::synthetic_integer(i);
                let unit = infer_spec::samples::synthetic_unit(i);
                match spec.datatype {
                    DataType::Bool => data.push(small),
                    DataType::U8 | DataType::I8 => data.push(small),
                    DataType::U16 | DataType::I16 => data.extend(u16::from(small).to_le_bytes()),
                    DataType::U32 | DataType::I32 => data.extend(u32::from(small).to_le_bytes()),
                    DataType::U64 | DataType::I64 => data.extend(u64::from(small).to_le_bytes()),
                    DataType::F16 => data.extend(half::f16::from_f64(unit).to_le_bytes()),
                    DataType::BF16 => data.extend(half::bf16::from_f64(unit).to_le_bytes()),
                    DataType::F32 => data.extend((unit as f32).to_le_bytes()),
                    DataType::F64 => data.extend(unit.to_le_bytes()),
                    DataType::Bytes => {
                        data.extend(4u32.to_le_bytes());
                        data.extend(b"warm");
                    }
                }
            }
            Tensor {
                dtype: spec.datatype,
                shape,
                data: Bytes::from(data),
            }
        })
        .collect()
}

/// Runs one warm-up execution of the given shapes, with the samples' data when one has them
/// (else synthetic), and checks its outputs.
pub(crate) fn run_at(
    cfg: &RuntimeConfig,
    backend: &mut dyn Backend,
    samples: &Samples,
    rows: usize,
    shapes: &Shapes,
) -> Result<(), Error> {
    let inputs = samples
        .at(rows, shapes)
        .unwrap_or_else(|| sample_at(cfg, rows, shapes));
    check_outputs(cfg, rows, &backend.execute(&inputs)?)
}

/// Runs one sample request as given and checks its outputs.
pub(crate) fn run_sample(
    cfg: &RuntimeConfig,
    backend: &mut dyn Backend,
    inputs: &[Tensor],
) -> Result<(), Error> {
    let rows = inputs.first().map_or(0, Tensor::rows);
    check_outputs(cfg, rows, &backend.execute(inputs)?)
}

/// Checks a batch's outputs against the config: count, datatypes, rows, and every fixed
/// dimension (a variable `-1` output dimension takes any size).
pub(crate) fn check_outputs(
    cfg: &RuntimeConfig,
    rows: usize,
    outputs: &[Tensor],
) -> Result<(), Error> {
    if outputs.len() != cfg.outputs.len() {
        return Err(Error::Outputs(format!(
            "the engine returned {} outputs, runtime.toml lists {}",
            outputs.len(),
            cfg.outputs.len()
        )));
    }
    for (o, spec) in outputs.iter().zip(&cfg.outputs) {
        let fits = o.shape.len() == spec.dims.len()
            && o.shape.first() == Some(&rows)
            && o.shape
                .iter()
                .zip(&spec.dims)
                .skip(1)
                .all(|(&got, &want)| want == -1 || i64::try_from(got).ok() == Some(want));
        if o.dtype != spec.datatype || !fits {
            let mut want: Vec<i64> = vec![rows as i64];
            want.extend(spec.dims.iter().skip(1));
            return Err(Error::Outputs(format!(
                "output {:?} is {} {:?}, runtime.toml says {} {:?}",
                spec.name, o.dtype, o.shape, spec.datatype, want
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The samples file is checked on the open descriptor: a FIFO without a writer does not
    /// block, a device is not read, a file over the bound is refused before it is read.
    #[test]
    fn read_samples_refuses_fifos_devices_and_oversized_files() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("s.fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let refused = |p: &Path, needle: &str| match read_samples(p) {
            Err(Error::Refused(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("{}: {other:?}", p.display()),
        };
        refused(&fifo, "is a FIFO, not a regular file");
        refused(Path::new("/dev/zero"), "/dev/zero is a device");
        refused(dir.path(), "is a directory");
        let big = dir.path().join("big.json");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(infer_spec::samples::MAX_BYTES + 1)
            .unwrap();
        refused(&big, "more than the 268435456 a samples file may have");
        let ok = dir.path().join("ok.json");
        std::fs::write(&ok, "{}").unwrap();
        assert_eq!(read_samples(&ok), Ok("{}".to_owned()));
        assert!(matches!(
            read_samples(&dir.path().join("missing.json")),
            Err(Error::Io(_))
        ));
    }

    /// Integer inputs get 0 and 1 only, the builder's values: a token-type id indexes a
    /// two-row embedding (an image whose engine ran at build time must warm up at start).
    #[test]
    fn synthetic_integers_are_valid_indices_into_two_rows() {
        let cfg = RuntimeConfig::from_toml_str(
            "[model]\nname = \"m\"\n[[inputs]]\nname = \"token_type_ids\"\ndatatype = \"INT64\"\ndims = [-1, 9]\n[[outputs]]\nname = \"y\"\ndatatype = \"FP32\"\ndims = [-1, 2]\n[engine]\nkind = \"tract-onnx\"\npath = \"m.onnx\"\n",
        )
        .unwrap();
        let t = &sample(&cfg, 3)[0];
        assert_eq!(t.shape, vec![3, 9]);
        let values: Vec<u64> = t
            .data
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(values.len(), 27);
        assert!(values.iter().all(|&v| v < 2), "{values:?}");
        assert!(values.contains(&0) && values.contains(&1));
    }
}
