//! The response cache (`[response_cache]` of `runtime.toml`, opt-in per model): a request
//! identical to an earlier one gets the stored answer without tokenizing or running the engine.
//!
//! The key is the whole request as far as it changes the answer, written out byte for byte
//! (never only a hash of it, so two requests can share an entry only when they are equal): the
//! model's name and version, the kind of work (tensors or texts), every input's name, datatype,
//! shape and bytes, or the texts and every parameter that changes the vectors (`dimensions`,
//! `normalize`, `raw_scores`). The route is not in it (the core builds one key for all), nor what
//! only changes how the answer is written (output selection, binary or JSON, `encoding_format`,
//! `return_text`). Entries are bounded by the bytes they keep alive (keys, owned copies of the
//! answers and their buffers' capacity), least recently used first out; only successful answers
//! are stored.

use crate::tensor::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// What a cached request is answered with.
#[derive(Debug, Clone, PartialEq)]
pub enum Cached {
    /// A V2 request's outputs (served signature, every output).
    Outputs(Vec<Tensor>),
    /// A text API's vectors (or scores) and its token count.
    Vectors(Arc<Vec<Vec<f32>>>, usize),
    /// An image request's engine outputs, per image, and where its pixels came from: V2 and
    /// the image route answer from the same entry.
    Images(Arc<Vec<crate::core::ImageDone>>),
}

impl Cached {
    /// Outputs to keep: copies of their bytes. An engine's outputs are views into its whole
    /// batch's buffer; keeping a view would keep the batch alive, uncounted.
    pub fn owned_outputs(outputs: &[Tensor]) -> Cached {
        Cached::Outputs(
            outputs
                .iter()
                .map(|t| Tensor {
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    data: bytes::Bytes::copy_from_slice(&t.data),
                })
                .collect(),
        )
    }

    /// Image outputs to keep: copies of their bytes (see [`Cached::owned_outputs`]).
    pub fn owned_images(done: &[crate::core::ImageDone]) -> Cached {
        Cached::Images(Arc::new(
            done.iter()
                .map(|d| crate::core::ImageDone {
                    outputs: match Cached::owned_outputs(&d.outputs) {
                        Cached::Outputs(o) => o,
                        _ => Vec::new(),
                    },
                    frame: d.frame,
                })
                .collect(),
        ))
    }

    /// The bytes an entry keeps alive, for the bound: every buffer at its capacity, and the
    /// vectors' and tensors' own headers.
    fn size(&self) -> usize {
        match self {
            Cached::Outputs(o) => {
                o.iter()
                    .map(|t| t.data.len() + t.shape.capacity() * 8 + 64)
                    .sum::<usize>()
                    + o.capacity() * 64
            }
            Cached::Vectors(v, _) => {
                v.iter().map(|x| x.capacity() * 4 + 24).sum::<usize>() + v.capacity() * 24 + 48
            }
            Cached::Images(done) => {
                done.iter()
                    .map(|d| {
                        d.outputs
                            .iter()
                            .map(|t| t.data.len() + t.shape.capacity() * 8 + 64)
                            .sum::<usize>()
                            + d.outputs.capacity() * 48
                            + 96
                    })
                    .sum::<usize>()
                    + done.capacity() * 96
                    + 48
            }
        }
    }
}

/// A key being written: every field length-prefixed, so no two different requests write the
/// same bytes.
#[derive(Debug, Default)]
pub(crate) struct Key(Vec<u8>);

impl Key {
    /// A key for `kind` of work (`"tensors"`, `"texts"`) for model `name` at `version`.
    pub(crate) fn new(kind: &str, name: &str, version: &str) -> Key {
        let mut k = Key(Vec::with_capacity(256));
        k.str(kind).str(name).str(version);
        k
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Key {
        self.0.extend_from_slice(&(b.len() as u64).to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }

    pub(crate) fn str(&mut self, s: &str) -> &mut Key {
        self.bytes(s.as_bytes())
    }

    pub(crate) fn u64(&mut self, v: u64) -> &mut Key {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// An input: its name, datatype, shape and bytes.
    pub(crate) fn tensor(&mut self, name: &str, t: &Tensor) -> &mut Key {
        self.str(name)
            .str(t.dtype.as_str())
            .u64(t.shape.len() as u64);
        for &d in &t.shape {
            self.u64(d as u64);
        }
        self.bytes(&t.data)
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        self.0
    }
}

struct Entry {
    value: Cached,
    used: u64,
    size: usize,
}

#[derive(Default)]
struct Lru {
    entries: HashMap<Arc<[u8]>, Entry>,
    /// Last use → key, oldest first.
    order: BTreeMap<u64, Arc<[u8]>>,
    clock: u64,
    bytes: usize,
}

/// A bounded LRU map from request keys to answers; shared by a model's handlers.
pub struct ResponseCache {
    max_bytes: usize,
    inner: Mutex<Lru>,
}

/// Bytes an entry costs beyond its key and value (map and order bookkeeping).
const ENTRY_OVERHEAD: usize = 96;

impl ResponseCache {
    pub fn new(max_bytes: u64) -> ResponseCache {
        ResponseCache {
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            inner: Mutex::new(Lru::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer stored for `key`, now the most recently used.
    pub fn get(&self, key: &[u8]) -> Option<Cached> {
        let mut lru = self.lock();
        lru.clock += 1;
        let now = lru.clock;
        let (k, e) = lru.entries.get_key_value(key)?;
        let (k, old) = (k.clone(), e.used);
        let e = lru.entries.get_mut(key)?;
        e.used = now;
        let value = e.value.clone();
        lru.order.remove(&old);
        lru.order.insert(now, k);
        Some(value)
    }

    /// Stores an answer, evicting the least recently used entries until it fits; one larger
    /// than the whole cache is not stored. Returns how many entries were evicted.
    pub fn put(&self, key: Vec<u8>, value: Cached) -> usize {
        let size = key.len() + value.size() + ENTRY_OVERHEAD;
        if size > self.max_bytes {
            return 0;
        }
        let key: Arc<[u8]> = key.into();
        let mut lru = self.lock();
        let lru = &mut *lru;
        if let Some(old) = lru.entries.remove(&key) {
            lru.order.remove(&old.used);
            lru.bytes -= old.size;
        }
        let mut evicted = 0;
        while lru.bytes + size > self.max_bytes {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some(e) = lru.entries.remove(&oldest) {
                lru.bytes -= e.size;
                evicted += 1;
            }
        }
        lru.clock += 1;
        let used = lru.clock;
        lru.order.insert(used, key.clone());
        lru.entries.insert(key, Entry { value, used, size });
        lru.bytes += size;
        evicted
    }

    /// Entries and bytes held now.
    pub fn usage(&self) -> (usize, usize) {
        let lru = self.lock();
        (lru.entries.len(), lru.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use infer_spec::DataType;

    fn tensor(dtype: DataType, shape: &[usize], data: &[u8]) -> Tensor {
        Tensor {
            dtype,
            shape: shape.to_vec(),
            data: Bytes::copy_from_slice(data),
        }
    }

    fn key(t: &Tensor) -> Vec<u8> {
        let mut k = Key::new("v2", "m", "1");
        k.tensor("x", t);
        k.finish()
    }

    #[test]
    fn requests_that_differ_in_shape_datatype_or_parameter_never_share_an_entry() {
        let bytes = [0u8; 8];
        let keys = [
            key(&tensor(DataType::F32, &[1, 2], &bytes)),
            key(&tensor(DataType::F32, &[2, 1], &bytes)),
            key(&tensor(DataType::I32, &[1, 2], &bytes)),
            key(&tensor(DataType::F32, &[1, 2], &[1u8; 8])),
            {
                let mut k = Key::new("embed", "m", "1");
                k.str("a b").u64(0);
                k.finish()
            },
            {
                let mut k = Key::new("embed", "m", "1");
                k.str("a").str("b").u64(0);
                k.finish()
            },
            {
                let mut k = Key::new("embed", "m", "1");
                k.str("a b").u64(8);
                k.finish()
            },
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        let c = ResponseCache::new(1 << 20);
        let v = |x: f32| Cached::Vectors(Arc::new(vec![vec![x]]), 1);
        for (i, k) in keys.iter().enumerate() {
            c.put(k.clone(), v(i as f32));
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(c.get(k), Some(v(i as f32)));
        }
        assert_eq!(c.get(b"other"), None);
    }

    #[test]
    fn the_least_recently_used_entries_go_first_and_the_bound_holds() {
        let entry = |n: u8| {
            (
                vec![n; 100],
                Cached::Vectors(Arc::new(vec![vec![0.0; 25]]), 1),
            )
        };
        let (k, v) = entry(0);
        let one = k.len() + v.size() + ENTRY_OVERHEAD;
        let c = ResponseCache::new((one * 3) as u64);
        for n in 0..3 {
            let (k, v) = entry(n);
            assert_eq!(c.put(k, v), 0);
        }
        // 0 is used again: 1 is now the oldest and goes for 3.
        assert!(c.get(&[0; 100]).is_some());
        let (k, v) = entry(3);
        assert_eq!(c.put(k, v), 1);
        assert!(c.get(&[1; 100]).is_none());
        assert!(c.get(&[0; 100]).is_some() && c.get(&[3; 100]).is_some());
        assert_eq!(c.usage(), (3, one * 3));
        // Larger than the whole cache: not stored, nothing evicted.
        let big = Cached::Vectors(Arc::new(vec![vec![0.0; 1000]]), 1);
        assert_eq!(c.put(vec![9; 10], big), 0);
        assert_eq!(c.usage().0, 3);
        // The same key again replaces its entry.
        let (k, v) = entry(3);
        c.put(k, v);
        assert_eq!(c.usage(), (3, one * 3));
    }
}
