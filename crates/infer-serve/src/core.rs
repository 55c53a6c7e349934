//! The inference core: the one path every route takes from a decoded request to its answer,
//! whatever the protocol (V2 over HTTP and gRPC, OpenAI's and TEI's text routes). Transports
//! decode a request into a [`Request`] and encode the [`Answer`]; everything between is here,
//! in this order:
//!
//! 1. **Admission**, before any work: the request's texts or rows, bytes and the memory its
//!    work will take are counted against their bounds (`[text] max_client_batch_size`, the
//!    queue's room, the texts' length, [`crate::budget`]: the body was already charged as it
//!    arrived). What can never fit is a 413 naming the bound; what does not fit now, a 503.
//! 2. **The response cache** (`[response_cache]`): one key for every route, the work's
//!    content and the options that change the answer (`key`).
//! 3. **Preparation**: a tensor model's inputs that index a table are checked against it
//!    ([`crate::signature::check_table_rows`]); a text model's texts are tokenized, each
//!    its own item, on the server's [`Workers`] (off the connection threads) once they hold
//!    more than [`INLINE_BYTES`], with the request's deadline checked before each text and the
//!    work abandoned when it passes or the client goes away.
//! 4. **Items in the queue**: a text request's texts go to the model's batcher as one item
//!    each ([`crate::batcher::Batcher::submit_all`], all or none), longest first, so the
//!    model's padding policy groups them with other requests' items of similar length under its
//!    token budget and padding bound; a tensor request is one item, its rows together.
//! 5. **The engine**, on the backend threads; a text model pools each item's rows there
//!    ([`crate::batcher::Reduce`]).
//! 6. **Finishing**: the request's items reassembled in order, its options applied
//!    ([`TextModel::finish`]), the answer stored in the cache (an owned copy, counted whole).
//!
//! `counted` records every request's outcome on its model's metrics. Nothing here parses a
//! protocol or writes a response.

use crate::batcher::{Answer as Outcome, Batcher};
use crate::budget::Reservation;
use crate::cache::{Cached, Key};
use crate::error::{ApiError, Rejection};
use crate::metrics::Metrics;
use crate::model::Model;
use crate::server::Server;
use crate::tensor::Tensor;
use crate::text::{Encoded, PoolOptions, TextModel, Token};
use crate::vision::{Found, Frame, Prepared, VisionModel};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Requests holding fewer text bytes than this are tokenized on the thread that read them:
/// for a few short texts the hand-off to a worker costs more than the tokenizing.
pub(crate) const INLINE_BYTES: usize = 2048;

/// Bodies larger than this are decoded on the [`Workers`] rather than on the connection's
/// thread: decoding a body of tens of megabytes takes that thread for a good part of a second.
pub(crate) const DECODE_INLINE_BYTES: usize = 256 << 10;

/// Bytes a queued item costs beyond its tensors (its job, channel and vectors).
const ITEM_OVERHEAD: u64 = 512;

/// One text, or a pair of texts (a query and a passage, for a pair model).
pub(crate) type Item = (String, Option<String>);

/// The work of one request, as a transport decoded it.
#[derive(Debug)]
pub(crate) enum Work {
    /// Tensors in the model's served signature (V2 over HTTP or gRPC): for a text model, its
    /// `text` (and `text_pair`) `BYTES` inputs.
    Tensors { inputs: Vec<Tensor>, rows: usize },
    /// Texts, or pairs (a second text), and the options that change their vectors (the text
    /// APIs).
    Texts { items: Vec<Item>, opts: PoolOptions },
    /// Encoded images (the image route): answered as labels, boxes, vectors or text lines.
    Images { images: Vec<bytes::Bytes> },
}

/// One request for the core: the model it is for, its work, the timeout it asked for (µs; 0 or
/// `None`: the model's default), when it started and what it has been charged so far (its body).
pub(crate) struct Request<'a> {
    pub model: &'a Model,
    pub work: Work,
    pub timeout_us: Option<u64>,
    pub start: Instant,
    pub charge: Reservation,
}

/// What the core answers.
#[derive(Debug)]
pub(crate) enum Output {
    /// The served outputs (V2): one tensor per output.
    Tensors(Vec<Tensor>),
    /// One vector (or scores) per text, in the request's order.
    Vectors(Arc<Vec<Vec<f32>>>),
    /// One answer per image, in the request's order.
    Found(Arc<Vec<Found>>),
}

/// An answer, where its time went, and the request's charge against the memory budget, which
/// the transport drops once it has encoded the answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub output: Output,
    pub timing: Timing,
    pub charge: Reservation,
}

/// Where a request's time went (TEI's response headers `x-tokenization-time`, `x-queue-time`,
/// `x-inference-time`, and `x-compute-tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Timing {
    pub tokenization: Duration,
    pub queue: Duration,
    pub inference: Duration,
    pub tokens: usize,
    /// An image request's decoding, resizing (with normalising) and answering (labels, boxes),
    /// summed over its images.
    pub decode: Duration,
    pub resize: Duration,
    pub postprocess: Duration,
}

/// Runs one request through the core (the module docs' steps) and returns its answer.
pub(crate) async fn infer(app: &Server, req: Request<'_>) -> Result<Answer, ApiError> {
    let Request {
        model,
        work,
        timeout_us,
        start,
        mut charge,
    } = req;
    let batcher = batcher(app, model)?;
    let deadline = deadline(model, timeout_us, start);
    if let Some(vision) = model.vision_arc() {
        let (images, v2) = match work {
            Work::Images { images } => (images, false),
            Work::Tensors { inputs, .. } => (images_of(&inputs)?, true),
            Work::Texts { .. } => {
                return Err(ApiError::BadRequest(format!(
                    "model {:?} takes images, not text (its recipe has a [vision] table)",
                    model.name()
                )))
            }
        };
        let w = ImageWork {
            model,
            vision: vision.clone(),
            batcher,
            deadline,
            start,
        };
        let (done, mut timing) = w.run(app, images, &mut charge).await?;
        let output = if v2 {
            Output::Tensors(ImageWork::tensors(&done)?)
        } else {
            let t = Instant::now();
            let found = done
                .iter()
                .map(|d| {
                    let out = d.outputs.get(vision.output_index()).ok_or_else(|| {
                        ApiError::Internal("the engine answered without its output".into())
                    })?;
                    vision.answer(out, &d.frame)
                })
                .collect::<Result<Vec<_>, _>>()?;
            timing.postprocess = t.elapsed();
            model
                .metrics
                .postprocess_us
                .add(timing.postprocess.as_micros() as u64);
            Output::Found(Arc::new(found))
        };
        return Ok(Answer {
            output,
            timing,
            charge,
        });
    }
    match model.text_arc() {
        Err(_) => {
            let Work::Tensors { inputs, rows } = work else {
                return Err(model.text_arc().err().unwrap_or(ApiError::NotReady));
            };
            let (output, timing) = tensors(
                app,
                model,
                batcher,
                inputs,
                rows,
                deadline,
                start,
                &mut charge,
            )
            .await?;
            Ok(Answer {
                output,
                timing,
                charge,
            })
        }
        Ok(text) => {
            let (items, opts, v2) = match work {
                Work::Texts { items, opts } => (items, opts, false),
                Work::Tensors { inputs, .. } => (texts_of(&inputs)?, PoolOptions::default(), true),
                Work::Images { .. } => {
                    return Err(ApiError::BadRequest(format!(
                        "model {:?} takes text, not images",
                        model.name()
                    )))
                }
            };
            let t = TextWork {
                model,
                text: text.clone(),
                batcher,
                deadline,
                start,
            };
            let (vectors, timing) = t.run(app, items, opts, &mut charge).await?;
            let output = if v2 {
                Output::Tensors(vec![TextModel::pooled_tensor(&vectors)])
            } else {
                Output::Vectors(vectors)
            };
            Ok(Answer {
                output,
                timing,
                charge,
            })
        }
    }
}

/// A request's deadline: its own timeout, never past the model's `default_timeout_ms`.
fn deadline(model: &Model, timeout_us: Option<u64>, start: Instant) -> Option<Instant> {
    let default = model.cfg.batching.default_timeout_ms * 1000;
    let timeout_us = match (default, timeout_us.filter(|&t| t > 0)) {
        (0, t) => t,
        (d, None) => Some(d),
        (d, Some(t)) => Some(t.min(d)),
    };
    timeout_us.map(|us| start + Duration::from_micros(us))
}

/// The model's batcher, once warm-up is done.
pub(crate) fn batcher<'a>(app: &Server, model: &'a Model) -> Result<&'a Batcher, ApiError> {
    model.batcher().ok_or_else(|| app.not_ready())
}

/// A tensor model's request: checked, charged, looked up in the cache, one item.
#[allow(
    clippy::too_many_arguments,
    reason = "the request's parts the tensor path reads, each once"
)]
async fn tensors(
    app: &Server,
    model: &Model,
    batcher: &Batcher,
    inputs: Vec<Tensor>,
    rows: usize,
    deadline: Option<Instant>,
    start: Instant,
    charge: &mut Reservation,
) -> Result<(Output, Timing), ApiError> {
    crate::signature::check_table_rows(model.engine().inputs, &inputs)?;
    let input_bytes: usize = inputs.iter().map(|t| t.data.len()).sum();
    let out_row: u64 = model
        .cfg
        .outputs
        .iter()
        .filter_map(infer_spec::TensorSpec::max_row_bytes)
        .fold(0, u64::saturating_add);
    // The decoded inputs, the outputs, and their encoding in the response (JSON numbers take
    // up to four times their bytes).
    let need = (input_bytes as u64)
        .saturating_add(out_row.saturating_mul(rows as u64).saturating_mul(4))
        .saturating_add(ITEM_OVERHEAD);
    charge.grow(need, "this request")?;
    let key = model.cache().map(|_| {
        let mut k = Key::new("tensors", model.name(), &model.cfg.model.version);
        for (spec, t) in model.served().inputs.iter().zip(&inputs) {
            k.tensor(&spec.name, t);
        }
        k.finish()
    });
    if let Some(Cached::Outputs(outputs)) = key.as_ref().and_then(|k| model.cached(k)) {
        return Ok((Output::Tensors(outputs), Timing::default()));
    }
    let mut rx = batcher.submit_all(vec![(inputs, rows)], deadline)?;
    let Some(rx) = rx.pop() else {
        return Err(ApiError::Internal("the batcher took no item".into()));
    };
    let answer = wait(app, batcher, rx, deadline, start).await?;
    if let Some(k) = key {
        model.remember(k, Cached::owned_outputs(&answer.outputs));
    }
    Ok((
        Output::Tensors(answer.outputs),
        Timing {
            inference: answer.compute,
            ..Timing::default()
        },
    ))
}

/// The texts (or pairs) of a V2 request to a text model: its `text` input, and `text_pair`.
fn texts_of(inputs: &[Tensor]) -> Result<Vec<Item>, ApiError> {
    let texts = inputs
        .first()
        .map(|t| TextModel::texts(t, infer_spec::text::TEXT_INPUT))
        .transpose()?
        .unwrap_or_default();
    match inputs.get(1) {
        Some(t) => {
            let pairs = TextModel::texts(t, infer_spec::text::TEXT_PAIR_INPUT)?;
            if pairs.len() != texts.len() {
                return Err(ApiError::BadRequest(format!(
                    "inputs \"text\" and \"text_pair\" have {} and {} texts",
                    texts.len(),
                    pairs.len()
                )));
            }
            Ok(texts
                .into_iter()
                .zip(pairs)
                .map(|(a, b)| (a.to_owned(), Some(b.to_owned())))
                .collect())
        }
        None => Ok(texts.into_iter().map(|t| (t.to_owned(), None)).collect()),
    }
}

/// A text request on its way through the core.
struct TextWork<'a> {
    model: &'a Model,
    text: Arc<TextModel>,
    batcher: &'a Batcher,
    deadline: Option<Instant>,
    start: Instant,
}

impl TextWork<'_> {
    async fn run(
        &self,
        app: &Server,
        items: Vec<Item>,
        opts: PoolOptions,
        charge: &mut Reservation,
    ) -> Result<(Arc<Vec<Vec<f32>>>, Timing), ApiError> {
        let (model, text) = (self.model, &*self.text);
        admit_texts(model, text, self.batcher, &items, charge)?;
        text.check_options(opts)?;
        text.check_pairs(items.iter().any(|(_, p)| p.is_some()))?;
        // The cache sits in front of tokenization; its key holds every text and every option
        // that changes the vectors, not the route: /embed, /v1/embeddings and V2 share entries.
        let key = model.cache().map(|_| key(model, &items, opts));
        if let Some(Cached::Vectors(v, tokens)) = key.as_ref().and_then(|k| model.cached(k)) {
            return Ok((
                v,
                Timing {
                    tokens,
                    ..Timing::default()
                },
            ));
        }
        let mut timing = Timing::default();
        let t = Instant::now();
        let encoded = prepare(app, model, self.text.clone(), items, self.deadline).await?;
        timing.tokenization = t.elapsed();
        timing.tokens = encoded.iter().map(|e| e.tokens).sum();
        // Longest first: the items of one request then lie in the queue in length order, so
        // the padding bound cuts the fewest batches.
        let mut order: Vec<usize> = (0..encoded.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(encoded[i].tokens));
        let mut slots: Vec<Option<Encoded>> = encoded.into_iter().map(Some).collect();
        let queued: Vec<(Vec<Tensor>, usize)> = order
            .iter()
            .filter_map(|&i| slots[i].take())
            .map(|e| (e.inputs, 1))
            .collect();
        let waiting = Instant::now();
        let receivers = self.batcher.submit_all(queued, self.deadline)?;
        let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); order.len()];
        for (&i, rx) in order.iter().zip(receivers) {
            let answer = wait(app, self.batcher, rx, self.deadline, self.start).await?;
            timing.inference = timing.inference.max(answer.compute);
            let pooled = answer
                .outputs
                .first()
                .ok_or_else(|| ApiError::Internal("the pooling returned nothing".into()))?;
            let mut v = TextModel::vectors(pooled)?;
            vectors[i] = text.finish(v.pop().unwrap_or_default(), opts);
        }
        timing.queue = waiting.elapsed().saturating_sub(timing.inference);
        model
            .metrics
            .overhead_hist
            .observe_duration(self.start.elapsed().saturating_sub(timing.inference));
        let vectors = Arc::new(vectors);
        if let Some(k) = key {
            model.remember(k, Cached::Vectors(vectors.clone(), timing.tokens));
        }
        Ok((vectors, timing))
    }
}

/// The encoded images of a V2 request to an image model: its `image` input, one per row.
fn images_of(inputs: &[Tensor]) -> Result<Vec<bytes::Bytes>, ApiError> {
    let Some(t) = inputs.first() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut at = 0usize;
    for element in crate::tensor::BytesElements::new(&t.data) {
        let element = element.map_err(|_| {
            ApiError::BadRequest(format!(
                "input {:?}: a truncated BYTES element",
                infer_spec::vision::IMAGE_INPUT
            ))
        })?;
        // The element's bytes, shared with the request's buffer (no copy).
        let start = at + 4;
        at = start + element.len();
        out.push(t.data.slice(start..at));
    }
    Ok(out)
}

/// One image's engine outputs (one row each) and where its pixels came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageDone {
    pub outputs: Vec<Tensor>,
    pub frame: Frame,
}

/// An image request on its way through the core.
struct ImageWork<'a> {
    model: &'a Model,
    vision: Arc<VisionModel>,
    batcher: &'a Batcher,
    deadline: Option<Instant>,
    start: Instant,
}

impl ImageWork<'_> {
    /// Admits, looks up, prepares and queues the images, one item each; their outputs in the
    /// request's order.
    async fn run(
        &self,
        app: &Server,
        images: Vec<bytes::Bytes>,
        charge: &mut Reservation,
    ) -> Result<(Arc<Vec<ImageDone>>, Timing), ApiError> {
        let (model, vision) = (self.model, &*self.vision);
        let n = images.len();
        if n == 0 {
            return Err(ApiError::BadRequest("no images: send at least one".into()));
        }
        let most = vision.config().max_client_batch_size as usize;
        if n > most {
            return Err(ApiError::TooLarge(format!(
                "{n} images in one request, more than the model takes ({most}, vision.max_client_batch_size): send them in several requests"
            )));
        }
        if let Some(room) = self.batcher.queue_room() {
            if n as u64 > room {
                return Err(ApiError::TooLarge(format!(
                    "{n} images in one request, more than model {:?}'s queue ever holds ({room}: batching.max_queue_size {} plus one per instance): send them in several requests",
                    model.name(),
                    model.cfg.batching.max_queue_size
                )));
            }
        }
        // Every header read before anything is decoded: a file declaring more pixels than the
        // bound is a 400 whatever else the request holds, and the decoding is charged for
        // what the files declare.
        let mut need = 0u64;
        for (i, img) in images.iter().enumerate() {
            let header = vision.probe(i, img)?;
            need = need
                .saturating_add(vision.cost(header))
                .saturating_add(ITEM_OVERHEAD);
        }
        charge.grow(need, &format!("this request of {n} images"))?;
        let key = model.cache().map(|_| {
            let mut k = Key::new("images", model.name(), &model.cfg.model.version);
            k.u64(n as u64);
            for img in &images {
                k.bytes(img);
            }
            k.finish()
        });
        if let Some(Cached::Images(done)) = key.as_ref().and_then(|k| model.cached(k)) {
            return Ok((done, Timing::default()));
        }
        let mut timing = Timing::default();
        let prepared = self.prepare(app, images).await?;
        for p in &prepared {
            timing.decode += p.decode;
            timing.resize += p.resize;
        }
        model
            .metrics
            .decode_us
            .add(timing.decode.as_micros() as u64);
        model
            .metrics
            .resize_us
            .add(timing.resize.as_micros() as u64);
        model.metrics.images.add(n as u64);
        let frames: Vec<Frame> = prepared.iter().map(|p| p.frame).collect();
        let queued: Vec<(Vec<Tensor>, usize)> =
            prepared.into_iter().map(|p| (vec![p.input], 1)).collect();
        let waiting = Instant::now();
        let receivers = self.batcher.submit_all(queued, self.deadline)?;
        let mut done = Vec::with_capacity(n);
        for (rx, frame) in receivers.into_iter().zip(frames) {
            let answer = wait(app, self.batcher, rx, self.deadline, self.start).await?;
            timing.inference = timing.inference.max(answer.compute);
            done.push(ImageDone {
                outputs: answer.outputs,
                frame,
            });
        }
        timing.queue = waiting.elapsed().saturating_sub(timing.inference);
        model
            .metrics
            .overhead_hist
            .observe_duration(self.start.elapsed().saturating_sub(timing.inference));
        let done = Arc::new(done);
        if let Some(k) = key {
            model.remember(k, Cached::owned_images(&done));
        }
        Ok((done, timing))
    }

    /// Decodes and resizes the images on the server's workers (never on a connection's
    /// thread: one photograph takes milliseconds), the deadline checked before each.
    async fn prepare(
        &self,
        app: &Server,
        images: Vec<bytes::Bytes>,
    ) -> Result<Vec<Prepared>, ApiError> {
        let vision = self.vision.clone();
        let job = move |watch: &Watch<'_>| -> Result<Vec<Prepared>, ApiError> {
            vision.prepare_all(&images, || watch.check())
        };
        match app.workers.as_ref() {
            Some(w) => w.run(self.deadline, job).await,
            None => job(&Watch::inline(self.deadline)),
        }
    }

    /// The engine's outputs of every image, each output's rows together (V2's answer).
    fn tensors(done: &[ImageDone]) -> Result<Vec<Tensor>, ApiError> {
        let outputs = done.first().map_or(0, |d| d.outputs.len());
        (0..outputs)
            .map(|o| {
                let parts: Vec<&Tensor> = done.iter().filter_map(|d| d.outputs.get(o)).collect();
                Tensor::concat_rows(&parts)
                    .ok_or_else(|| ApiError::Internal("the images' outputs differ in shape".into()))
            })
            .collect()
    }
}

/// The response-cache key of a text request: its texts and pairs and every option that
/// changes the vectors. `dimensions` and `normalize` are written with a tag for "not given",
/// so no value stands for another.
fn key(model: &Model, items: &[Item], opts: PoolOptions) -> Vec<u8> {
    let mut k = Key::new("texts", model.name(), &model.cfg.model.version);
    match opts.dimensions {
        None => k.u64(0),
        Some(d) => k.u64(1).u64(u64::from(d)),
    };
    match opts.normalize {
        None => k.u64(0),
        Some(n) => k.u64(1).u64(u64::from(n)),
    };
    k.u64(u64::from(opts.raw)).u64(items.len() as u64);
    for (a, b) in items {
        k.str(a);
        match b {
            Some(b) => k.u64(1).str(b),
            None => k.u64(0),
        };
    }
    k.finish()
}

/// Admission of a text request: at most `max_client_batch_size` texts and as many as the
/// queue can ever hold (413 past either), then its memory charged: the texts, tokenizing the
/// longest, each item's engine inputs at most `max_length` tokens, its vector and the answer.
fn admit_texts(
    model: &Model,
    text: &TextModel,
    batcher: &Batcher,
    items: &[Item],
    charge: &mut Reservation,
) -> Result<(), ApiError> {
    let n = items.len();
    if n == 0 {
        return Err(ApiError::BadRequest("no texts: send at least one".into()));
    }
    let most = text.config().max_client_batch_size as usize;
    if n > most {
        return Err(ApiError::TooLarge(format!(
            "{n} texts in one request, more than the model takes ({most}, text.max_client_batch_size): send them in several requests"
        )));
    }
    if let Some(room) = batcher.queue_room() {
        if n as u64 > room {
            return Err(ApiError::TooLarge(format!(
                "{n} texts in one request, more than model {:?}'s queue ever holds ({room}: batching.max_queue_size {} plus one per instance): send them in several requests",
                model.name(),
                model.cfg.batching.max_queue_size
            )));
        }
    }
    let bytes = |(a, b): &Item| a.len() + b.as_ref().map_or(0, String::len);
    let cut = text.max_text_bytes();
    let tokenized = |(a, b): &Item| a.len().min(cut) + b.as_ref().map_or(0, |b| b.len().min(cut));
    let held: u64 = items.iter().map(|i| bytes(i) as u64 + 48).sum();
    let longest = items.iter().map(tokenized).max().unwrap_or(0) as u64;
    let per_token = text.bytes_per_token() as u64;
    let vector = text.hidden() as u64 * 4;
    let engine: u64 = items
        .iter()
        .map(|i| {
            let tokens = (tokenized(i) + 8).min(text.max_length()) as u64;
            tokens * per_token + 3 * vector + ITEM_OVERHEAD
        })
        .sum();
    // The answer as JSON: up to 20 bytes a number.
    let answer = n as u64 * text.hidden() as u64 * 20;
    let need = held
        .saturating_add(longest.saturating_mul(crate::text::TOKENIZE_BYTES_PER_BYTE))
        .saturating_add(engine)
        .saturating_add(answer);
    charge.grow(need, &format!("this request of {n} texts"))
}

/// Tokenizes a request's items, each its own engine row: on the calling thread when they are
/// short, else on the server's workers, checking the deadline before each text.
async fn prepare(
    app: &Server,
    model: &Model,
    text: Arc<TextModel>,
    items: Vec<Item>,
    deadline: Option<Instant>,
) -> Result<Vec<Encoded>, ApiError> {
    let bytes: usize = items
        .iter()
        .map(|(a, b)| a.len() + b.as_ref().map_or(0, String::len))
        .sum();
    let started = Instant::now();
    let n = items.len();
    let encode = move |watch: &Watch<'_>| -> Result<Vec<Encoded>, ApiError> {
        let mut out = Vec::with_capacity(items.len());
        for (i, (a, b)) in items.iter().enumerate() {
            watch.check()?;
            out.push(text.encode(i, a, b.as_deref())?);
        }
        Ok(out)
    };
    let encoded = match app.workers.as_ref().filter(|_| bytes > INLINE_BYTES) {
        Some(w) => w.run(deadline, encode).await?,
        None => encode(&Watch::inline(deadline))?,
    };
    model.metrics.tokenized_texts.add(n as u64);
    model
        .metrics
        .tokenization_us
        .add(started.elapsed().as_micros() as u64);
    Ok(encoded)
}

/// `/tokenize`: the tokens each text becomes, as the model computes on them; admitted,
/// charged and run like the texts of an embedding request, without the engine. The charge comes
/// back with them, to be held until the answer is encoded.
pub(crate) async fn tokenize(
    app: &Server,
    model: &Model,
    texts: Vec<String>,
    start: Instant,
    mut charge: Reservation,
) -> Result<(Vec<Vec<Token>>, Reservation), ApiError> {
    let text = model.text_arc()?.clone();
    let batcher = batcher(app, model)?;
    let items: Vec<Item> = texts.into_iter().map(|t| (t, None)).collect();
    admit_texts(model, &text, batcher, &items, &mut charge)?;
    // Each token answered takes about 80 bytes of JSON and its strings.
    let tokens: u64 = items
        .iter()
        .map(|(t, _)| (t.len().min(text.max_text_bytes()) as u64 + 8).min(text.max_length() as u64))
        .sum();
    charge.grow(tokens * 96, "this request's tokens")?;
    let deadline = deadline(model, None, start);
    let bytes: usize = items.iter().map(|(t, _)| t.len()).sum();
    let job = move |watch: &Watch<'_>| -> Result<Vec<Vec<Token>>, ApiError> {
        let mut out = Vec::with_capacity(items.len());
        for (i, (t, _)) in items.iter().enumerate() {
            watch.check()?;
            out.push(text.tokens(i, t)?);
        }
        Ok(out)
    };
    let tokens = match app.workers.as_ref().filter(|_| bytes > INLINE_BYTES) {
        Some(w) => w.run(deadline, job).await?,
        None => job(&Watch::inline(deadline))?,
    };
    Ok((tokens, charge))
}

/// Decodes `body` with `decode`: on the calling thread when it is small, else on the server's
/// workers (see [`DECODE_INLINE_BYTES`]), so that a large body does not hold a connection
/// thread, and with it the health probes, while it is parsed.
pub(crate) async fn decode<T: Send + 'static>(
    app: &Server,
    body: bytes::Bytes,
    decode: impl FnOnce(&bytes::Bytes) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    match app
        .workers
        .as_ref()
        .filter(|_| body.len() > DECODE_INLINE_BYTES)
    {
        Some(w) => w.run(None, move |_| decode(&body)).await,
        None => decode(&body),
    }
}

/// Waits for one item's answer, until the deadline. Alone on a server that sees one request at
/// a time, it polls for the answer on this (otherwise idle) core rather than park; not when
/// requests overlap: this worker would hold up the connections it serves. Requests in flight
/// are the server's: a request to another model takes a core too.
async fn wait(
    app: &Server,
    batcher: &Batcher,
    mut rx: oneshot::Receiver<crate::batcher::Outcome>,
    deadline: Option<Instant>,
    start: Instant,
) -> Result<Outcome, ApiError> {
    let metrics = &app.metrics;
    let polled = if metrics.in_flight().load(Relaxed) == 1 && metrics.sequential(start) {
        let window = match deadline {
            Some(d) => app
                .busy_poll
                .min(d.saturating_duration_since(Instant::now())),
            None => app.busy_poll,
        };
        batcher.poll_briefly(&mut rx, window)
    } else {
        None
    };
    let outcome = match (polled, deadline) {
        (Some(outcome), _) => Ok(outcome),
        (None, Some(d)) => match tokio::time::timeout_at(d.into(), rx).await {
            Ok(r) => r,
            Err(_) => return Err(ApiError::Rejected(Rejection::Timeout)),
        },
        (None, None) => rx.await,
    };
    outcome.map_err(|_| ApiError::Internal("the batcher dropped the request".to_owned()))?
}

/// Counts an infer request in flight for as long as it lives (also when its client goes away
/// and the handler future is dropped).
struct InFlight<'a>(&'a Metrics);

impl<'a> InFlight<'a> {
    fn new(m: &'a Metrics, now: Instant) -> Self {
        m.request_started(now);
        InFlight(m)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight().fetch_sub(1, Relaxed);
    }
}

/// The model a request turned out to be for, told to [`counted`] by the work once it knows (a
/// gRPC request and the text APIs name it in the body): its series count the outcome.
#[derive(Default)]
pub(crate) struct Counting<'a>(std::sync::OnceLock<&'a Metrics>);

impl<'a> Counting<'a> {
    /// The request is for `model`; returns it.
    pub(crate) fn for_model(&self, model: &'a Model) -> &'a Model {
        let _ = self.0.set(&model.metrics);
        model
    }
}

/// Runs one request of any route (`work`, started at `start`): counts it in flight on the
/// server while it lives and records its outcome on the metrics of the model it was for
/// (`counting`), else the server's (one model: the same; a bundle: not rendered, as requests
/// naming no served model belong to none).
pub(crate) async fn counted<'a, T>(
    app: &'a Server,
    start: Instant,
    counting: &Counting<'a>,
    work: impl std::future::Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let _guard = InFlight::new(&app.metrics, start);
    let result = work.await;
    let m = counting.0.get().copied().unwrap_or(&app.metrics);
    match &result {
        Ok(_) => m.record_success(start.elapsed()),
        Err(e) => {
            let rejection = match e {
                ApiError::Rejected(r) => Some(*r),
                _ => None,
            };
            m.record_failure(
                start.elapsed(),
                rejection,
                matches!(e, ApiError::Internal(_) | ApiError::DeviceLost(_)),
            );
        }
    }
    result
}

/// A job for the workers.
type Job = Box<dyn FnOnce() + Send>;

/// The preparation workers: threads that take jobs (tokenizing, decoding large bodies) from a
/// bounded queue, off the async threads that serve the connections and the health probes. A
/// full queue refuses the request at once (503 `queue_full`, like the batcher's), so a burst of
/// long texts can neither stall the connections nor queue without bound. Cloning shares the
/// threads and the queue: every model of a server uses the same.
#[derive(Clone)]
pub struct Workers {
    tx: std::sync::mpsc::SyncSender<Job>,
}

/// What a job checks between its steps: whether its request still wants the result (its
/// deadline not passed, its client still waiting).
pub struct Watch<'a> {
    deadline: Option<Instant>,
    waiting: Option<&'a oneshot::Sender<Result<Box<dyn std::any::Any + Send>, ApiError>>>,
}

impl Watch<'_> {
    /// A watch for work done where it was asked for: only the deadline can pass.
    fn inline(deadline: Option<Instant>) -> Watch<'static> {
        Watch {
            deadline,
            waiting: None,
        }
    }

    /// `Err` once the work is abandoned: the deadline passed (503 timeout) or nobody waits.
    pub fn check(&self) -> Result<(), ApiError> {
        if self.deadline.is_some_and(|d| Instant::now() >= d)
            || self.waiting.is_some_and(oneshot::Sender::is_closed)
        {
            return Err(ApiError::Rejected(Rejection::Timeout));
        }
        Ok(())
    }
}

impl Workers {
    /// `threads` workers sharing a queue of `capacity` jobs.
    pub fn start(threads: usize, capacity: usize) -> std::io::Result<Workers> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(capacity.max(1));
        let rx = Arc::new(std::sync::Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("prepare-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })?;
        }
        Ok(Workers { tx })
    }

    /// Runs `f` on a worker and waits for its result without blocking this thread, until
    /// `deadline` (then 503 timeout; the job, watching, stops at its next check). A full queue
    /// refuses it at once.
    pub async fn run<T: Send + 'static>(
        &self,
        deadline: Option<Instant>,
        f: impl FnOnce(&Watch<'_>) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let (tx, rx) = oneshot::channel::<Result<Box<dyn std::any::Any + Send>, ApiError>>();
        let job: Job = Box::new(move || {
            let watch = Watch {
                deadline,
                waiting: Some(&tx),
            };
            if watch.check().is_err() {
                return;
            }
            let result = f(&watch).map(|v| Box::new(v) as Box<dyn std::any::Any + Send>);
            let _ = tx.send(result);
        });
        self.tx.try_send(job).map_err(|e| match e {
            std::sync::mpsc::TrySendError::Full(_) => ApiError::Rejected(Rejection::QueueFull),
            std::sync::mpsc::TrySendError::Disconnected(_) => {
                ApiError::Internal("the preparation workers are gone".into())
            }
        })?;
        let got = match deadline {
            Some(d) => match tokio::time::timeout_at(d.into(), rx).await {
                Ok(r) => r,
                Err(_) => return Err(ApiError::Rejected(Rejection::Timeout)),
            },
            None => rx.await,
        };
        let value = got.map_err(|_| {
            // The job stopped without an answer: it found the deadline passed.
            ApiError::Rejected(Rejection::Timeout)
        })??;
        value
            .downcast::<T>()
            .map(|b| *b)
            .map_err(|_| ApiError::Internal("a worker answered with another type".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_run_jobs_refuse_when_full_and_stop_work_past_its_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let w = Workers::start(1, 1).unwrap();
        assert_eq!(rt.block_on(w.run(None, |_| Ok(6 * 7))).unwrap(), 42);
        // The one worker held, one job queued: the next is refused at once.
        let (hold, release) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        let busy = w.clone();
        let held = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            rt.block_on(busy.run(None, move |_| {
                started_tx.send(()).unwrap();
                release.recv().unwrap();
                Ok(0)
            }))
        });
        started.recv().unwrap();
        let queued = w.clone();
        let steps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = steps.clone();
        let soon = Instant::now() + Duration::from_millis(50);
        let late = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            // Queued behind the held job; its deadline passes while it waits.
            rt.block_on(queued.run(Some(soon), move |watch| {
                counted.fetch_add(1, Relaxed);
                watch.check()?;
                Ok(1)
            }))
        });
        std::thread::sleep(Duration::from_millis(20));
        let refused = rt.block_on(w.run(None, |_| Ok(2))).unwrap_err();
        assert_eq!(refused, ApiError::Rejected(Rejection::QueueFull));
        assert_eq!(
            late.join().unwrap().unwrap_err(),
            ApiError::Rejected(Rejection::Timeout)
        );
        hold.send(()).unwrap();
        assert_eq!(held.join().unwrap().unwrap(), 0);
        // The worker skipped the abandoned job without running it.
        assert_eq!(rt.block_on(w.run(None, |_| Ok(3))).unwrap(), 3);
        assert_eq!(steps.load(Relaxed), 0);
    }
}
