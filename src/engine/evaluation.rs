//! The inputs an in-process accuracy gate runs (a CPU engine computing in BF16, or in INT8 on the
//! quantised model, against itself on the FP32 model): the recipe's `[accuracy] data` (a
//! `cpu-int8` target's calibration data without it) as the converter reads it (`*.npy` for a single-input
//! model, `*.npz` with one array per input, in file-name order, each cast to the input's type),
//! or [`GENERATED_SAMPLES`](super::convert::GENERATED_SAMPLES) generated batches of one row by
//! the converter's rules (floats uniform in [-1, 1], integers 0 to 9, a text model's attention
//! mask all ones and its token type ids all zeros), from a fixed seed.
//!
//! `.npy` is read here (format versions 1 to 3, C order, little-endian or single-byte types):
//! the format is a short header and the raw array, and the only crate that reads it pulls
//! ndarray's version of its own.

use std::io::Read;
use std::path::Path;

use tract_onnx::prelude::{DatumType, IntoTValue, TValue, TVec, Tensor};

use super::spec::InputSpec;

/// The largest evaluation file read (each is read whole).
const MAX_FILE: u64 = 1 << 30;

/// Batches in the model's input order (`names`), and what they are, in words.
pub(crate) fn batches(
    inputs: &[InputSpec],
    names: &[String],
    dir: Option<&Path>,
) -> Result<(Vec<TVec<TValue>>, String), String> {
    match dir {
        Some(d) => read_dir(inputs, names, d),
        None => Ok((
            generated(inputs, names, super::convert::GENERATED_SAMPLES as usize)?,
            format!(
                "generated inputs, {} batches of one row",
                super::convert::GENERATED_SAMPLES
            ),
        )),
    }
}

fn spec<'a>(inputs: &'a [InputSpec], name: &str) -> Result<&'a InputSpec, String> {
    inputs
        .iter()
        .find(|i| i.name == name)
        .ok_or_else(|| format!("input `{name}` is not declared"))
}

fn datum(i: &InputSpec) -> Result<DatumType, String> {
    super::tract::datum_type(i.datatype)
        .ok_or_else(|| format!("input `{}`: datatype {}", i.name, i.datatype.recipe_name()))
}

/// SplitMix64: a small fixed generator, so the same recipe gates on the same inputs everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn generated(
    inputs: &[InputSpec],
    names: &[String],
    count: usize,
) -> Result<Vec<TVec<TValue>>, String> {
    let mut rng = Rng(0x5eed);
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let mut batch = TVec::new();
        for name in names {
            let i = spec(inputs, name)?;
            let dt = datum(i)?;
            let shape: Vec<usize> = (0..i.shape.len())
                .map(|d| {
                    if d == 0 {
                        1
                    } else {
                        i.sample_dim(d).unwrap_or(1).max(1) as usize
                    }
                })
                .collect();
            let n: usize = shape.iter().product();
            let t = if dt.is_float() {
                let v: Vec<f32> = (0..n).map(|_| (rng.unit() * 2.0 - 1.0) as f32).collect();
                Tensor::from_shape(&shape, &v)
            } else if dt == DatumType::Bool {
                let v: Vec<bool> = (0..n).map(|_| rng.next() % 2 == 1).collect();
                Tensor::from_shape(&shape, &v)
            } else {
                let v: Vec<i64> = (0..n)
                    .map(|_| {
                        if i.name.contains("mask") {
                            1
                        } else if i.name.contains("token_type") {
                            0
                        } else {
                            (rng.next() % 10) as i64
                        }
                    })
                    .collect();
                Tensor::from_shape(&shape, &v)
            }
            .and_then(|t| t.cast_to_dt(dt).map(|c| c.into_owned()))
            .map_err(|e| format!("input `{name}`: {e}"))?;
            batch.push(t.into_tvalue());
        }
        out.push(batch);
    }
    Ok(out)
}

fn read_dir(
    inputs: &[InputSpec],
    names: &[String],
    dir: &Path,
) -> Result<(Vec<TVec<TValue>>, String), String> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|x| x.to_str()), Some("npy" | "npz"))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("{}: no *.npy or *.npz files", dir.display()));
    }
    let mut out = Vec::with_capacity(files.len());
    for f in &files {
        let shown = f.display();
        let len = std::fs::metadata(f)
            .map_err(|e| format!("{shown}: {e}"))?
            .len();
        if len > MAX_FILE {
            return Err(format!(
                "{shown}: {len} bytes, more than the {MAX_FILE} an evaluation file may have"
            ));
        }
        let bytes = std::fs::read(f).map_err(|e| format!("{shown}: {e}"))?;
        let arrays: Vec<(String, Tensor)> = if f.extension().is_some_and(|x| x == "npy") {
            if names.len() != 1 {
                return Err(format!(
                    "{shown}: a .npy file feeds a single-input model; this one has inputs {names:?}: use .npz"
                ));
            }
            vec![(
                names[0].clone(),
                npy(&bytes).map_err(|e| format!("{shown}: {e}"))?,
            )]
        } else {
            npz(&bytes).map_err(|e| format!("{shown}: {e}"))?
        };
        let mut batch = TVec::new();
        for name in names {
            let Some((_, t)) = arrays.iter().find(|(n, _)| n == name) else {
                return Err(format!("{shown}: no array for input `{name}`"));
            };
            let i = spec(inputs, name)?;
            let dt = datum(i)?;
            let t = t
                .cast_to_dt(dt)
                .map_err(|e| format!("{shown}: input `{name}`: {e}"))?
                .into_owned();
            if t.rank() != i.shape.len() {
                return Err(format!(
                    "{shown}: input `{name}` has shape {:?}, and the model's has {} dimensions",
                    t.shape(),
                    i.shape.len()
                ));
            }
            batch.push(t.into_tvalue());
        }
        out.push(batch);
    }
    let text = format!(
        "data {}, {} batch{}",
        dir.display(),
        out.len(),
        if out.len() == 1 { "" } else { "es" }
    );
    Ok((out, text))
}

/// The arrays of an `.npz` (a zip of `.npy` members), by member name without `.npy`.
fn npz(bytes: &[u8]) -> Result<Vec<(String, Tensor)>, String> {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for k in 0..zip.len() {
        let mut member = zip.by_index(k).map_err(|e| e.to_string())?;
        let Some(name) = member.name().strip_suffix(".npy").map(str::to_owned) else {
            continue;
        };
        if member.size() > MAX_FILE {
            return Err(format!("member {name}: larger than {MAX_FILE} bytes"));
        }
        let mut data = Vec::with_capacity(member.size() as usize);
        member
            .read_to_end(&mut data)
            .map_err(|e| format!("member {name}: {e}"))?;
        out.push((
            name.clone(),
            npy(&data).map_err(|e| format!("member {name}: {e}"))?,
        ));
    }
    Ok(out)
}

/// One `.npy` array.
pub(crate) fn npy(bytes: &[u8]) -> Result<Tensor, String> {
    let rest = bytes
        .strip_prefix(b"\x93NUMPY")
        .ok_or("not an .npy array (no \\x93NUMPY magic)")?;
    let (&major, rest) = rest.split_first().ok_or("truncated header")?;
    let (_minor, rest) = rest.split_first().ok_or("truncated header")?;
    let (len, rest) = match major {
        1 => {
            let (l, r) = rest.split_at_checked(2).ok_or("truncated header")?;
            (usize::from(u16::from_le_bytes([l[0], l[1]])), r)
        }
        2 | 3 => {
            let (l, r) = rest.split_at_checked(4).ok_or("truncated header")?;
            (u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize, r)
        }
        v => return Err(format!("format version {v} (1 to 3 are read)")),
    };
    let (header, data) = rest.split_at_checked(len).ok_or("truncated header")?;
    let header = std::str::from_utf8(header).map_err(|_| "the header is not text")?;
    let field = |key: &str| -> Result<&str, String> {
        let at = header
            .find(&format!("'{key}'"))
            .ok_or_else(|| format!("the header has no '{key}'"))?;
        let after = &header[at + key.len() + 2..];
        let after = after
            .trim_start()
            .strip_prefix(':')
            .ok_or("malformed header")?;
        Ok(after.trim_start())
    };
    let descr = field("descr")?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|d| d.split('\'').next())
        .ok_or("malformed descr")?;
    if field("fortran_order")?.starts_with("True") {
        return Err("Fortran order (save it C-contiguous)".into());
    }
    let shape_text = field("shape")?;
    let shape_text = shape_text
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or("malformed shape")?;
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("shape dimension {s:?}"))
        })
        .collect::<Result<Vec<usize>, String>>()?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("the shape overflows")?;
    macro_rules! read {
        ($ty:ty) => {{
            let size = std::mem::size_of::<$ty>();
            let want = n.checked_mul(size).ok_or("the shape overflows")?;
            if data.len() != want {
                return Err(format!(
                    "{} bytes of data for shape {shape:?} of {descr}, {want} expected",
                    data.len()
                ));
            }
            let v: Vec<$ty> = data
                .chunks_exact(size)
                .map(|c| <$ty>::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect();
            Tensor::from_shape(&shape, &v).map_err(|e| e.to_string())?
        }};
    }
    Ok(match descr {
        "<f4" => read!(f32),
        "<f8" => read!(f64),
        "<i8" => read!(i64),
        "<i4" => read!(i32),
        "<i2" => read!(i16),
        "|i1" => read!(i8),
        "|u1" => read!(u8),
        "<u2" => read!(u16),
        "<u4" => read!(u32),
        "<u8" => read!(u64),
        "<f2" => {
            if data.len() != n * 2 {
                return Err(format!(
                    "{} bytes of data for {n} float16 values",
                    data.len()
                ));
            }
            let v: Vec<tract_onnx::prelude::f16> = data
                .chunks_exact(2)
                .map(|c| tract_onnx::prelude::f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect();
            Tensor::from_shape(&shape, &v).map_err(|e| e.to_string())?
        }
        "|b1" => {
            if data.len() != n {
                return Err(format!("{} bytes of data for {n} booleans", data.len()));
            }
            let v: Vec<bool> = data.iter().map(|&b| b != 0).collect();
            Tensor::from_shape(&shape, &v).map_err(|e| e.to_string())?
        }
        other => {
            return Err(format!(
                "array type {other:?} (little-endian numbers and booleans are read)"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::npy;

    fn values<T: tract_onnx::prelude::Datum + Copy>(t: &tract_onnx::prelude::Tensor) -> Vec<T> {
        t.to_plain_array_view::<T>()
            .unwrap()
            .iter()
            .copied()
            .collect()
    }

    fn file(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn npy_arrays_read_as_numpy_writes_them() {
        let f: Vec<u8> = [1.5f32, -2.0, 0.25, 8.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = npy(&file("<f4", "(2, 2)", &f)).unwrap();
        assert_eq!(t.shape(), &[2, 2]);
        assert_eq!(values::<f32>(&t), [1.5, -2.0, 0.25, 8.0]);
        let i: Vec<u8> = [7i64, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = npy(&file("<i8", "(1, 2)", &i)).unwrap();
        assert_eq!(values::<i64>(&t), [7, 9]);
        let t = npy(&file("|b1", "(3,)", &[1, 0, 1])).unwrap();
        assert_eq!(values::<bool>(&t), [true, false, true]);
        let t = npy(&file("<f8", "()", &2.5f64.to_le_bytes())).unwrap();
        assert_eq!(t.shape(), &[] as &[usize]);
    }

    #[test]
    fn malformed_npy_is_refused_with_the_reason() {
        for (bytes, reason) in [
            (b"PK\x03\x04".to_vec(), "magic"),
            (b"\x93NUMPY\x01".to_vec(), "truncated"),
            (file("<f4", "(2, 2)", &[0; 12]), "12 bytes of data"),
            (file(">f4", "(1,)", &[0; 4]), "array type \">f4\""),
            (
                file("<f4", "(99999999999, 99999999999, 99999999999)", &[]),
                "overflows",
            ),
            (
                {
                    let mut f = file("<f4", "(1,)", &[0; 4]);
                    f[6] = 9;
                    f
                },
                "format version 9",
            ),
        ] {
            let e = npy(&bytes).unwrap_err();
            assert!(e.contains(reason), "{e} / {reason}");
        }
        let mut fortran = file("<f4", "(1,)", &[0; 4]);
        let at = fortran.windows(5).position(|w| w == b"False").unwrap();
        fortran[at..at + 5].copy_from_slice(b"True ");
        assert!(npy(&fortran).unwrap_err().contains("Fortran"));
    }
}
