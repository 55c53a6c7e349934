//! The one tensor representation inside the runtime: datatype, shape and little-endian bytes.
//!
//! Both request encodings (JSON numbers and the binary extension) decode into it, batches are
//! formed by concatenating rows of it, and outputs are split back by slicing it, so the batcher
//! never looks at element types. `BYTES` tensors hold the wire form (4-byte length + bytes per
//! element).

use crate::error::ApiError;
use bytes::Bytes;
use infer_spec::DataType;

/// A dense tensor: `shape[0]` is the batch dimension (rows).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DataType,
    pub shape: Vec<usize>,
    pub data: Bytes,
}

impl Tensor {
    /// Rows (the batch dimension).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }

    /// Elements in the whole tensor.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Elements `range` of an FP32 or FP16 tensor, as f32: what the text and image answers read
    /// from the engine's output. Another datatype, or a range past the data, is the engine's
    /// fault (a 500).
    pub(crate) fn floats(&self, range: std::ops::Range<usize>) -> Result<Vec<f32>, ApiError> {
        let size = match self.dtype {
            DataType::F32 | DataType::F16 => self.dtype.size().unwrap_or(4),
            other => {
                return Err(ApiError::Internal(format!(
                    "the engine's output is {other}, not FP32 or FP16"
                )))
            }
        };
        let bytes = self
            .data
            .get(range.start * size..range.end * size)
            .ok_or_else(|| {
                ApiError::Internal("the engine's output is shorter than its shape".to_owned())
            })?;
        Ok(match self.dtype {
            DataType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            _ => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        })
    }

    /// The byte range of rows `start..start + n` for fixed-size types; `None` for `BYTES` or
    /// when out of range.
    pub fn row_bytes(&self, start: usize, n: usize) -> Option<std::ops::Range<usize>> {
        let size = self.dtype.size()?;
        let row: usize = self.shape.iter().skip(1).product::<usize>() * size;
        let range = start * row..(start + n) * row;
        (range.end <= self.data.len()).then_some(range)
    }

    /// Rows `start..start + n` as a new tensor (cheap: shares the bytes).
    pub fn slice_rows(&self, start: usize, n: usize) -> Option<Tensor> {
        let range = match self.dtype {
            DataType::Bytes => bytes_row_range(self, start, n)?,
            _ => self.row_bytes(start, n)?,
        };
        let mut shape = self.shape.clone();
        *shape.first_mut()? = n;
        Some(Tensor {
            dtype: self.dtype,
            shape,
            data: self.data.slice(range),
        })
    }

    /// The tensor with its first dimension after the batch one cut to `len` (a padded batch's
    /// output handed back to one request of that length). `None` when it is shorter than
    /// `len`, has no such dimension, or holds `BYTES`.
    pub fn truncate_length(&self, len: usize) -> Option<Tensor> {
        let longest = *self.shape.get(1)?;
        if longest == len {
            return Some(self.clone());
        }
        if longest < len {
            return None;
        }
        let size = self.dtype.size()?;
        let inner: usize = self.shape.iter().skip(2).product::<usize>() * size;
        let (keep, stride) = (len * inner, longest * inner);
        let mut data = Vec::with_capacity(self.rows() * keep);
        for row in self.data.chunks_exact(stride.max(1)).take(self.rows()) {
            data.extend_from_slice(&row[..keep]);
        }
        let mut shape = self.shape.clone();
        shape[1] = len;
        (data.len() == self.rows() * keep).then(|| Tensor {
            dtype: self.dtype,
            shape,
            data: Bytes::from(data),
        })
    }

    /// Concatenates tensors along the batch dimension; all must share dtype and row shape.
    pub fn concat_rows(parts: &[&Tensor]) -> Option<Tensor> {
        let first = parts.first()?;
        if parts.len() == 1 {
            return Some((*first).clone());
        }
        let mut rows = 0;
        let mut data = Vec::with_capacity(parts.iter().map(|t| t.data.len()).sum());
        for t in parts {
            if t.dtype != first.dtype || t.shape.get(1..) != first.shape.get(1..) {
                return None;
            }
            rows += t.rows();
            data.extend_from_slice(&t.data);
        }
        let mut shape = first.shape.clone();
        shape[0] = rows;
        Some(Tensor {
            dtype: first.dtype,
            shape,
            data: Bytes::from(data),
        })
    }

    /// [`Tensor::concat_rows`] of `[rows, sequence]` integer tensors of different sequence
    /// lengths: each padded on the right to the longest with `pad`. Other tensors are
    /// concatenated as they are.
    pub fn concat_padded(parts: &[&Tensor], pad: i64) -> Option<Tensor> {
        let first = parts.first()?;
        let longest = parts
            .iter()
            .map(|t| t.shape.get(1).copied().unwrap_or(0))
            .max()?;
        let size = match first.dtype {
            DataType::I64 | DataType::I32 if first.shape.len() == 2 => first.dtype.size()?,
            _ => return Tensor::concat_rows(parts),
        };
        if parts.iter().all(|t| t.shape.get(1) == Some(&longest)) {
            return Tensor::concat_rows(parts);
        }
        let pad_bytes = match first.dtype {
            DataType::I32 => (pad as i32).to_le_bytes().to_vec(),
            _ => pad.to_le_bytes().to_vec(),
        };
        let rows: usize = parts.iter().map(|t| t.rows()).sum();
        let mut data = Vec::with_capacity(rows * longest * size);
        for t in parts {
            if t.dtype != first.dtype || t.shape.len() != 2 {
                return None;
            }
            let len = t.shape[1];
            for row in t.data.chunks_exact((len * size).max(1)).take(t.rows()) {
                data.extend_from_slice(row);
                for _ in len..longest {
                    data.extend_from_slice(&pad_bytes);
                }
            }
        }
        (data.len() == rows * longest * size).then(|| Tensor {
            dtype: first.dtype,
            shape: vec![rows, longest],
            data: Bytes::from(data),
        })
    }
}

/// The byte range of rows of a `BYTES` tensor, walking its length prefixes.
fn bytes_row_range(t: &Tensor, start: usize, n: usize) -> Option<std::ops::Range<usize>> {
    let per_row: usize = t.shape.iter().skip(1).product();
    let mut elements = BytesElements::new(&t.data);
    let offset = |e: &BytesElements| t.data.len() - e.remaining();
    let mut begin = None;
    for i in 0..(start + n) * per_row {
        if i == start * per_row {
            begin = Some(offset(&elements));
        }
        elements.next()?.ok()?;
    }
    Some(begin.unwrap_or(offset(&elements))..offset(&elements))
}

/// Where `BYTES` wire data ends too soon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncated {
    /// Fewer than 4 bytes left for an element's length prefix.
    Prefix,
    /// The prefix announces this many bytes, more than are left.
    Announced(usize),
}

/// The elements of `BYTES` wire data (each a 4-byte little-endian length, then its bytes), in
/// order: the one walk over the format that the decoders' check, row slicing and the text
/// models share. Ends with the data, or after one `Err` where an element runs past it.
pub struct BytesElements<'a> {
    rest: &'a [u8],
    failed: bool,
}

impl<'a> BytesElements<'a> {
    pub fn new(data: &'a [u8]) -> BytesElements<'a> {
        BytesElements {
            rest: data,
            failed: false,
        }
    }

    /// Bytes not yet walked.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }
}

impl<'a> Iterator for BytesElements<'a> {
    type Item = Result<&'a [u8], Truncated>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let Some((len, tail)) = self.rest.split_first_chunk::<4>() else {
            self.failed = true;
            return Some(Err(Truncated::Prefix));
        };
        let len = u32::from_le_bytes(*len) as usize;
        let Some((element, tail)) = tail.split_at_checked(len) else {
            self.failed = true;
            return Some(Err(Truncated::Announced(len)));
        };
        self.rest = tail;
        Some(Ok(element))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor {
            dtype: DataType::F32,
            shape: shape.to_vec(),
            data: Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
        }
    }

    #[test]
    fn a_padded_length_is_cut_back_row_by_row() {
        // Two rows of length 3 (padded), two values per position: keep the first two positions.
        let padded = f32s(
            &[2, 3, 2],
            &[1., 2., 3., 4., 0., 0., 5., 6., 7., 8., 9., 9.],
        );
        assert_eq!(
            padded.truncate_length(2),
            Some(f32s(&[2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]))
        );
        assert_eq!(padded.truncate_length(3), Some(padded.clone()));
        assert_eq!(padded.truncate_length(4), None);
        assert_eq!(f32s(&[2], &[1., 2.]).truncate_length(1), None);
    }

    #[test]
    fn concat_and_split_round_trip() {
        let a = f32s(&[1, 2], &[1.0, 2.0]);
        let b = f32s(&[2, 2], &[3.0, 4.0, 5.0, 6.0]);
        let c = Tensor::concat_rows(&[&a, &b]).unwrap();
        assert_eq!(c.shape, vec![3, 2]);
        assert_eq!(c.slice_rows(0, 1).unwrap(), a);
        assert_eq!(c.slice_rows(1, 2).unwrap(), b);
        assert_eq!(c.slice_rows(2, 2), None);
        assert_eq!(Tensor::concat_rows(&[&a, &f32s(&[1, 1], &[1.0])]), None);
    }

    #[test]
    fn bytes_rows() {
        let mut data = Vec::new();
        for s in ["a", "bcd", ""] {
            data.extend_from_slice(&(s.len() as u32).to_le_bytes());
            data.extend_from_slice(s.as_bytes());
        }
        let t = Tensor {
            dtype: DataType::Bytes,
            shape: vec![3, 1],
            data: Bytes::from(data),
        };
        assert_eq!(&t.slice_rows(1, 1).unwrap().data[..], b"\x03\0\0\0bcd");
        assert_eq!(&t.slice_rows(2, 1).unwrap().data[..], b"\0\0\0\0");
        assert_eq!(t.slice_rows(2, 2), None);
    }
}
