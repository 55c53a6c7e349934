//! The dynamic batcher, with Triton's semantics.
//!
//! [`Batcher`] handles (one per HTTP handler, cheap to clone) send requests over a channel;
//! each request's outputs come back over its own oneshot. The queue has exactly one owner at a
//! time: the *leader*, one of the backend instance threads, which takes what the channel holds,
//! forms the next batch, hands the leadership to the next idle instance and runs the batch
//! (leader/followers: idle instances wait for the leadership, so a batch forms only when an
//! instance is free to run it, every instance has at most one batch in flight, and the queue
//! keeps growing, up to `max_batch_size` rows per batch, while they are all busy):
//!
//! - rows are counted, not requests; a batch never exceeds `max_batch_size` rows;
//! - which requests may go together is the model's [`Grouping`]: the next batch is formed from
//!   the oldest request and the requests its grouping accepts beside it, in arrival order
//!   (the others keep their place and form their own batch once one of theirs is the oldest,
//!   so none starves behind a busier group); it stops before a request that would overflow
//!   `max_batch_size`. The grouping every model has today is [`SameShapes`]: shapes are never
//!   mixed;
//! - the batch is taken at once when it is full or when the oldest request has waited
//!   `max_queue_delay_us`; otherwise, if a preferred size was reached on the way, the largest
//!   such prefix is taken; otherwise the leader waits for more until the oldest request's
//!   delay ends, but only while more can be expected (the adaptive delay, the default:
//!   [`infer_spec::batch::Arrivals`] measures the traffic; a lone request at low load goes at
//!   once instead of waiting the delay for company that cannot come). Under `strict` delay,
//!   Triton's rule, it always waits;
//! - `max_queue_size` requests waiting for an instance → the next one is refused at once, in
//!   [`Batcher::submit`] (`queue_full`); one request per idle instance is not counted, as an
//!   idle instance takes it as soon as it is seen;
//! - a request whose deadline passed is answered `timeout`; one whose client went away (its
//!   receiver was dropped) leaves the queue and is counted as `cancelled`.
//!
//! Backends run on their own OS threads (one per instance), never on the async workers and
//! never under a lock the async side takes (handlers only send on the channel); the instance
//! concatenates the inputs, executes, splits the outputs back by rows and answers each request
//! directly.
//!
//! Why no dedicated queue thread: every hand-off between threads is a wake-up, which costs more
//! than a small model's compute on a virtual machine. Here a lone request wakes one thread (the
//! waiting leader), which runs it itself; under load, requests that arrive while the instances
//! compute wake nobody. When requests come one after another, busy polling saves the two
//! wake-ups left: the idle leader polls the channel briefly before parking (`Queue::receive`)
//! and the lone request's handler polls for its answer ([`Batcher::poll_briefly`]).

use crate::backend::{Backend, ExecError};
use crate::error::{ApiError, Rejection};
use crate::metrics::{Gauge, Metrics};
use crate::tensor::Tensor;
use infer_spec::{batch, RuntimeConfig};
use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::sync::oneshot::error::TryRecvError;

/// How far a padded batch looks for requests of a length near its oldest's: this many times
/// `max_batch_size` requests.
const NEAREST_WINDOW: usize = 4;

/// How a batch's error starts when the engine panicked on it.
const PANICKED: &str = "the engine panicked";

/// Handler polls that ran out their window, net of answers found (each found answer takes
/// back 1/[`POLL_MISS_WEIGHT`] of a miss), before handlers stop polling.
pub(crate) const POLL_MISSES: u64 = 3;
/// One miss weighs as much as this many found answers.
pub(crate) const POLL_MISS_WEIGHT: u64 = 16;
/// How long handlers then stop polling.
pub(crate) const POLL_BACKOFF: Duration = Duration::from_millis(250);

/// What a request gets back.
pub(crate) type Outcome = Result<Answer, ApiError>;

/// A request's outputs and its batch's compute time.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// One tensor per model output, this request's rows only.
    pub outputs: Vec<Tensor>,
    /// Time its batch spent executing (concatenate, engine, check).
    pub compute: Duration,
}

/// One queued request.
pub(crate) struct Job {
    pub inputs: Vec<Tensor>,
    pub rows: usize,
    pub enqueued: Instant,
    pub deadline: Option<Instant>,
    pub reply: oneshot::Sender<Outcome>,
}

/// The batching policy, from `[batching]`.
#[derive(Debug, Clone)]
pub struct Policy {
    pub max_batch_size: usize,
    pub preferred: Vec<usize>,
    pub delay: Duration,
    pub max_queue_size: usize,
    /// How long an idle leader polls the channel before parking (`--busy-poll-us`; zero:
    /// never). Not part of `[batching]`: a property of the machine, set by the server.
    pub busy_poll: Duration,
    /// Wait the delay only while more requests can be expected (`[batching] delay =
    /// "adaptive"`, the default); false: always wait it, as Triton does (`"strict"`).
    pub adaptive: bool,
    /// Requests of different lengths share a batch, padded (text models); `None`: shapes
    /// are concatenated as they are.
    pub padding: Option<Padding>,
    /// What turns each request's rows of the engine's outputs into its answer on the backend
    /// thread, before the batch's outputs are dropped (a text model's pooling); `None`: the
    /// rows as they are.
    pub reduce: Option<Arc<dyn Reduce>>,
}

impl std::fmt::Debug for dyn Reduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reduce")
    }
}

/// A model's finishing step that must see a batch's outputs: run on the backend thread for
/// each request of the batch, with its rows of every output and its own sequence length (its
/// inputs' second dimension; 0 when they have none). What it returns is the request's answer.
/// A text model pools here, so the padded hidden states of a batch (rows x longest x hidden)
/// are never held past the batch, nor kept alive by one request's slice of them.
pub trait Reduce: Send + Sync + 'static {
    /// An error fails that request alone (a 500: the engine's outputs were not what the model's
    /// config says).
    fn reduce(&self, outputs: Vec<Tensor>, length: usize) -> Result<Vec<Tensor>, ApiError>;
}

/// How requests of different sequence lengths share a batch: every input (`[rows, sequence]`)
/// is padded on its sequence dimension to the batch's longest, each with its own value (the
/// attention mask hides the padding from the model), and a batch stays within `bounds`: its
/// token budget (rows x the batch's longest sequence) and its most padding. Goes with the
/// [`AnyLength`] grouping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Padding {
    /// Per engine input, in order: the value padding positions get.
    pub values: Vec<i64>,
    /// Per engine output, in order: whether its first dimension after the batch one is the
    /// padded length, cut back to each request's own (a tensor model's per-token outputs). A
    /// text model's outputs stay padded: its pooling reads the lengths itself.
    pub cut_outputs: Vec<bool>,
    /// The token budget and the padding bound (at least one request always runs, whatever its
    /// size).
    pub bounds: batch::Padded,
}

impl Padding {
    /// The sequence length of a request's inputs (their second dimension).
    fn length(inputs: &[Tensor]) -> usize {
        inputs
            .first()
            .and_then(|t| t.shape.get(1))
            .copied()
            .unwrap_or(0)
    }
}

impl Policy {
    pub fn from_config(cfg: &RuntimeConfig) -> Policy {
        let b = &cfg.batching;
        Policy {
            max_batch_size: b.max_batch_size as usize,
            preferred: b.preferred().into_iter().map(|s| s as usize).collect(),
            delay: Duration::from_micros(b.max_queue_delay_us),
            max_queue_size: b.max_queue_size as usize,
            busy_poll: Duration::ZERO,
            adaptive: b.adaptive_delay(),
            padding: None,
            reduce: None,
        }
    }
}

/// Which requests may run in one batch: a model's own batching rule, asked while the leader
/// forms a batch (under the queue's lock, on a backend thread, for each waiting request).
///
/// The batch starts from the oldest request and takes, in arrival order, the requests for
/// which [`Grouping::together`] says yes. The answer must be an equivalence (reflexive,
/// symmetric, transitive): the batch is concatenated row-wise, so whatever the grouping lets
/// through must concatenate into tensors the engine takes. A model whose engine takes padded
/// inputs would group by padded size here and pad in its pre-processing step.
pub trait Grouping: Send + 'static {
    /// Whether `other` may run in the same batch as `oldest` (the inputs of two requests, in
    /// the engine's input order).
    fn together(&self, oldest: &[Tensor], other: &[Tensor]) -> bool;
}

/// The rule of models with fixed or per-request shapes: requests go together only when every
/// input has the same non-batch dimensions.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SameShapes;

impl Grouping for SameShapes {
    #[inline]
    fn together(&self, a: &[Tensor], b: &[Tensor]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.shape.get(1..) == y.shape.get(1..))
    }
}

/// The rule of models whose requests are padded to a common length ([`Padding`]): requests
/// go together when every input has the same dimensions apart from the batch and the sequence
/// (the second) ones.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AnyLength;

impl Grouping for AnyLength {
    #[inline]
    fn together(&self, a: &[Tensor], b: &[Tensor]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                x.shape.len() == y.shape.len() && x.shape.get(2..) == y.shape.get(2..)
            })
    }
}

/// State the handles and the instances share without the queue's lock.
struct Shared {
    policy: Policy,
    /// The last batch's compute time, for [`Batcher::poll_briefly`]. (Both written per batch,
    /// so each on a line of its own, away from what every request reads.)
    last_compute_ns: Gauge,
    /// Instances not running a batch.
    idle: Gauge,
    /// Instances in all.
    instances: u64,
    /// Handler polls that ran out their window, as a leaky bucket: a miss adds
    /// [`POLL_MISS_WEIGHT`], an answer found takes one away.
    poll_misses: Gauge,
    /// Until when (ns since `epoch`) handlers do not poll, after the bucket overflowed.
    poll_off_until_ns: Gauge,
    epoch: Instant,
    metrics: Arc<Metrics>,
    /// Set once, by the first batch that found the device lost (see
    /// [`ExecError::DeviceLost`]): why. From then on nothing runs and every request is
    /// answered [`ApiError::DeviceLost`].
    lost: OnceLock<String>,
}

impl Shared {
    /// Requests submitted and not yet taken into a batch (or purged): the queue-depth gauge
    /// is the count itself, so keeping it costs no extra atomic operation per request.
    fn queued(&self) -> &AtomicU64 {
        &self.metrics.queue_depth
    }

    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Handlers' polls ran out too often lately (see [`Batcher::poll_briefly`]): neither they
    /// nor the leader poll for now.
    fn polls_backed_off(&self, now: Instant) -> bool {
        self.ns(now) < self.poll_off_until_ns.load(Relaxed)
    }

    fn dequeued(&self, n: usize) {
        self.queued().fetch_sub(n as u64, Relaxed);
    }
}

/// A handle to the queue; cheap to clone.
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

impl Batcher {
    /// Starts one thread per backend instance; the first becomes the leader. Requests are
    /// grouped by [`SameShapes`].
    pub fn start(
        policy: Policy,
        backends: Vec<Box<dyn Backend>>,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Batcher> {
        Batcher::start_grouped(policy, SameShapes, backends, metrics)
    }

    /// [`Batcher::start`] with the model's own [`Grouping`] deciding which requests go
    /// together. The handle does not depend on it: only the instance threads know it.
    pub fn start_grouped<G: Grouping>(
        policy: Policy,
        grouping: G,
        backends: Vec<Box<dyn Backend>>,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Batcher> {
        let (tx, rx) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared {
            policy,
            last_compute_ns: Gauge::new(0),
            idle: Gauge::new(backends.len() as u64),
            instances: backends.len() as u64,
            poll_misses: Gauge::new(0),
            poll_off_until_ns: Gauge::new(0),
            epoch: Instant::now(),
            metrics,
            lost: OnceLock::new(),
        });
        let queue = Arc::new(Mutex::new(Queue {
            rx,
            jobs: VecDeque::new(),
            shared: shared.clone(),
            last_gap: Duration::ZERO,
            arrivals: batch::Arrivals::default(),
            grouping,
        }));
        for (id, backend) in backends.into_iter().enumerate() {
            let instance = Instance {
                backend,
                shared: shared.clone(),
            };
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("backend-{id}"))
                .spawn(move || instance.run(&queue))?;
        }
        Ok(Batcher { tx, shared })
    }

    /// Queues a request; its outputs (or why not) arrive on the returned receiver. A full
    /// queue refuses it here (`queue_full`), without touching the queue.
    pub fn submit(
        &self,
        inputs: Vec<Tensor>,
        rows: usize,
        deadline: Option<Instant>,
    ) -> Result<oneshot::Receiver<Outcome>, ApiError> {
        // A request an idle instance is about to take is not waiting for one: as many as there
        // are idle instances do not count against the limit (the leader may not have taken
        // them from the channel yet).
        if let Some(why) = self.shared.lost.get() {
            return Err(ApiError::DeviceLost(why.clone()));
        }
        let max = self.shared.policy.max_queue_size as u64;
        let before = self.shared.queued().fetch_add(1, Relaxed);
        if max > 0 && before >= max + self.shared.idle.load(Relaxed) {
            self.shared.dequeued(1);
            return Err(ApiError::Rejected(Rejection::QueueFull));
        }
        let (reply, rx) = oneshot::channel();
        let job = Job {
            inputs,
            rows,
            enqueued: Instant::now(),
            deadline,
            reply,
        };
        self.tx.send(job).map_err(|_| {
            self.shared.dequeued(1);
            ApiError::Rejected(Rejection::ShuttingDown)
        })?;
        Ok(rx)
    }

    /// Queues the items of one request (each its own inputs and rows), all or none: `n` items
    /// count `n` against `max_queue_size`, and a queue without room for all of them refuses
    /// the request whole. Their outcomes arrive on the receivers, in the items' order.
    pub fn submit_all(
        &self,
        items: Vec<(Vec<Tensor>, usize)>,
        deadline: Option<Instant>,
    ) -> Result<Vec<oneshot::Receiver<Outcome>>, ApiError> {
        if let Some(why) = self.shared.lost.get() {
            return Err(ApiError::DeviceLost(why.clone()));
        }
        let n = items.len() as u64;
        let max = self.shared.policy.max_queue_size as u64;
        let before = self.shared.queued().fetch_add(n, Relaxed);
        if max > 0 && before + n > max + self.shared.idle.load(Relaxed) {
            self.shared.dequeued(n as usize);
            return Err(ApiError::Rejected(Rejection::QueueFull));
        }
        let now = Instant::now();
        let mut receivers = Vec::with_capacity(items.len());
        let mut left = items.len();
        for (inputs, rows) in items {
            let (reply, rx) = oneshot::channel();
            let job = Job {
                inputs,
                rows,
                enqueued: now,
                deadline,
                reply,
            };
            if self.tx.send(job).is_err() {
                self.shared.dequeued(left);
                return Err(ApiError::Rejected(Rejection::ShuttingDown));
            }
            left -= 1;
            receivers.push(rx);
        }
        Ok(receivers)
    }

    /// The most items [`Batcher::submit_all`] can ever queue at once (`max_queue_size`, plus
    /// one per instance, which takes an item as soon as it is idle); `None`: no bound.
    pub fn queue_room(&self) -> Option<u64> {
        let max = self.shared.policy.max_queue_size as u64;
        (max > 0).then(|| max + self.shared.instances)
    }

    /// Why the device is lost, once a batch found it so: the model then serves nothing more
    /// and is not ready.
    pub fn device_lost(&self) -> Option<&str> {
        self.shared.lost.get().map(String::as_str)
    }

    /// Polls `rx` without parking for up to `window`, when the answer can be expected that
    /// soon (the queue delay plus the last batch's compute fit in the window): the caller's
    /// core spins instead of the backend thread waking a parked async worker, which costs
    /// more than a small model's compute on a virtual machine. Returns `None` when no answer
    /// came in time; then await `rx` as usual. Meant for a lone request on an otherwise idle
    /// server: spinning under load would take a core from the work.
    ///
    /// Answers that often do not come although they were expected mean the backend thread is
    /// not getting a core (other processes, a CPU quota): polling then only makes that worse,
    /// so when more than about one poll in [`POLL_MISS_WEIGHT`] runs out, no handler polls
    /// for the next [`POLL_BACKOFF`]. The loop never yields: next to a CPU-bound process a
    /// yield gives the core away for a whole scheduler slice, milliseconds.
    pub fn poll_briefly(
        &self,
        rx: &mut oneshot::Receiver<Outcome>,
        window: Duration,
    ) -> Option<Outcome> {
        let shared = &*self.shared;
        let expected =
            shared.policy.delay + Duration::from_nanos(shared.last_compute_ns.load(Relaxed));
        if window.is_zero() || expected > window {
            return None;
        }
        let now = Instant::now();
        if shared.polls_backed_off(now) {
            return None;
        }
        let now_ns = shared.ns(now);
        let until = now + window;
        loop {
            for _ in 0..64 {
                match rx.try_recv() {
                    Ok(outcome) => {
                        let misses = shared.poll_misses.load(Relaxed);
                        if misses != 0 {
                            shared.poll_misses.store(misses - 1, Relaxed);
                        }
                        return Some(outcome);
                    }
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                    // Only a dropped sender closes it: report that through the await.
                    Err(TryRecvError::Closed) => return None,
                }
            }
            // Another request came in: this core is needed for it.
            if shared.metrics.in_flight().load(Relaxed) > 1 {
                return None;
            }
            if Instant::now() >= until {
                let misses = shared.poll_misses.fetch_add(POLL_MISS_WEIGHT, Relaxed);
                if misses + POLL_MISS_WEIGHT >= POLL_MISSES * POLL_MISS_WEIGHT {
                    shared.poll_misses.store(0, Relaxed);
                    let off = now_ns + (window + POLL_BACKOFF).as_nanos() as u64;
                    shared.poll_off_until_ns.store(off, Relaxed);
                }
                return None;
            }
        }
    }
}

/// The queue, owned by whichever instance holds its lock (the leader).
struct Queue<G> {
    rx: mpsc::Receiver<Job>,
    jobs: VecDeque<Job>,
    shared: Arc<Shared>,
    /// How long the last wait for a request lasted until one came.
    last_gap: Duration,
    /// The traffic as the adaptive delay sees it.
    arrivals: batch::Arrivals,
    /// The model's rule for which requests go together.
    grouping: G,
}

/// What the policy says about the queue now.
enum Cut {
    /// Take this many requests from the front.
    Take(usize),
    /// Nothing is due: wait for more requests until then (or forever when `None`).
    Wait(Option<Instant>),
}

impl<G: Grouping> Queue<G> {
    fn together(&self, oldest: &Job, other: &Job) -> bool {
        self.grouping.together(&oldest.inputs, &other.inputs)
    }

    /// Waits for the next batch and takes it from the queue, counting the calling instance
    /// busy. `None` when every handle is gone and nothing is left.
    fn next_batch(&mut self) -> Option<Vec<Job>> {
        loop {
            while let Ok(job) = self.rx.try_recv() {
                self.push(job);
            }
            let now = Instant::now();
            self.purge(now);
            let wait = match self.cut(now) {
                Cut::Take(n) => {
                    // Busy before the requests stop counting as queued (see `submit`).
                    self.shared.idle.fetch_sub(1, Relaxed);
                    let jobs = match self.nearest() {
                        Some(picked) => self.take_picked(&picked),
                        None => self.take(n),
                    };
                    self.shared.dequeued(jobs.len());
                    return Some(jobs);
                }
                Cut::Wait(wait) => wait,
            };
            match self.receive(now, wait) {
                Ok(job) => self.push(job),
                Err(RecvTimeoutError::Timeout) => {} // the delay is over
                Err(RecvTimeoutError::Disconnected) => match wait {
                    // Shutting down: what is queued still runs when its delay ends.
                    Some(due) => std::thread::sleep(due.saturating_duration_since(now)),
                    None => return None,
                },
            }
        }
    }

    /// Waits for the next request until `due` (forever when `None`). When the last wait was
    /// short (requests come one after another, as from a client that sends its next request
    /// as soon as it has the answer), polls the channel before parking, for a little longer
    /// than that last wait and at most the busy-poll window: a parked leader has to be woken
    /// by the handler, and on a virtual machine that wake-up costs more than a small model's
    /// compute. A long last wait (an idle server), overlapping requests (see
    /// `Metrics::sequential`) or handlers' polls backed off: it parks at once. The poll
    /// yields the core to any other thread that wants it (the handler or the client may
    /// share it).
    fn receive(&mut self, now: Instant, due: Option<Instant>) -> Result<Job, RecvTimeoutError> {
        // Only while requests come one at a time (under load a polling core holds up the
        // threads the kernel would otherwise move to it when it idles), and for a little
        // longer than the last gap, so that a core waiting in vain goes idle soon.
        let max = self.shared.policy.busy_poll;
        let window = max.min(self.last_gap * 2 + Duration::from_micros(10));
        if !max.is_zero()
            && self.last_gap <= max
            && self.shared.metrics.sequential(now)
            && !self.shared.polls_backed_off(now)
        {
            let until = due.map_or(now + window, |d| d.min(now + window));
            loop {
                for _ in 0..64 {
                    match self.rx.try_recv() {
                        Ok(job) => {
                            self.last_gap = now.elapsed();
                            return Ok(job);
                        }
                        Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
                        Err(mpsc::TryRecvError::Disconnected) => {
                            return Err(RecvTimeoutError::Disconnected)
                        }
                    }
                }
                if Instant::now() >= until {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let received = match due {
            Some(due) => self.rx.recv_timeout(due.saturating_duration_since(now)),
            None => self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        if received.is_ok() {
            self.last_gap = now.elapsed();
        }
        received
    }

    /// Queues a request, noting for the adaptive delay whether it found company (another
    /// request queued, or a batch running).
    fn push(&mut self, job: Job) {
        let shared = &*self.shared;
        let alone = self.jobs.is_empty() && shared.idle.load(Relaxed) >= shared.instances;
        self.arrivals.observe(shared.ns(job.enqueued), alone);
        self.jobs.push_back(job);
    }

    /// Removes requests whose client is gone or whose deadline passed.
    fn purge(&mut self, now: Instant) {
        let metrics = &*self.shared.metrics;
        let (mut i, mut gone) = (0, 0);
        while i < self.jobs.len() {
            let job = &self.jobs[i];
            let expired = job.deadline.is_some_and(|d| d <= now);
            if job.reply.is_closed() {
                // A handler that timed out by itself already counted the timeout.
                if !expired {
                    metrics.record_rejection(Rejection::Cancelled);
                    metrics.failure_cancelled.add(1);
                }
            } else if !expired {
                i += 1;
                continue;
            }
            if let Some(job) = self.jobs.remove(i) {
                let _ = job.reply.send(Err(ApiError::Rejected(Rejection::Timeout)));
            }
            gone += 1;
        }
        if gone > 0 {
            self.shared.dequeued(gone);
        }
    }

    /// For a padded policy, once a batch is due: the oldest request and, of the requests its
    /// grouping accepts among the next [`NEAREST_WINDOW`] `x max_batch_size`, those nearest to
    /// its length, as many as the batch bounds take (their indices in the queue). Items of
    /// several requests queued together (a text request's texts, longest first) then form
    /// batches of similar lengths, close to what sorting every text by length would give,
    /// while the oldest request still goes first. `None`: not padded, or nothing beside it.
    fn nearest(&self) -> Option<Vec<usize>> {
        let padding = self.shared.policy.padding.as_ref()?;
        let first = self.jobs.front()?;
        let own = Padding::length(&first.inputs);
        let window = self
            .shared
            .policy
            .max_batch_size
            .saturating_mul(NEAREST_WINDOW);
        let mut near: Vec<(usize, usize, usize)> = self
            .jobs
            .iter()
            .enumerate()
            .skip(1)
            .take(window)
            .filter(|(_, job)| self.together(first, job))
            .map(|(i, job)| (i, job.rows, Padding::length(&job.inputs)))
            .collect();
        if near.is_empty() {
            return None;
        }
        near.sort_by_key(|&(i, _, len)| (len.abs_diff(own), i));
        let order: Vec<(usize, usize, usize)> =
            std::iter::once((0, first.rows, own)).chain(near).collect();
        let n = match batch::cut_padded(
            order.iter().map(|&(_, rows, len)| (rows, len)),
            self.shared.policy.max_batch_size,
            padding.bounds,
            &[],
            true,
            false,
        ) {
            batch::Cut::Take(n) => n.max(1),
            batch::Cut::Wait => 1,
        };
        Some(order.iter().take(n).map(|&(i, _, _)| i).collect())
    }

    /// Takes the requests at `picked` (indices in the queue, the oldest first); the others keep
    /// their order.
    fn take_picked(&mut self, picked: &[usize]) -> Vec<Job> {
        let mut chosen = vec![false; self.jobs.len()];
        for &i in picked {
            if let Some(c) = chosen.get_mut(i) {
                *c = true;
            }
        }
        let mut taken: Vec<Option<Job>> = (0..picked.len()).map(|_| None).collect();
        let mut kept = VecDeque::with_capacity(self.jobs.len().saturating_sub(picked.len()));
        let slot: std::collections::HashMap<usize, usize> =
            picked.iter().enumerate().map(|(k, &i)| (i, k)).collect();
        for (i, job) in std::mem::take(&mut self.jobs).into_iter().enumerate() {
            match slot.get(&i) {
                Some(&k) if chosen[i] => taken[k] = Some(job),
                _ => kept.push_back(job),
            }
        }
        self.jobs = kept;
        taken.into_iter().flatten().collect()
    }

    /// Takes the first `n` requests of the oldest request's group, in arrival order; the
    /// others keep their order.
    fn take(&mut self, n: usize) -> Vec<Job> {
        let Some(first) = self.jobs.front() else {
            return Vec::new();
        };
        // The common case, one group: a prefix.
        if self.jobs.iter().take(n).all(|j| self.together(first, j)) {
            return self.jobs.drain(..n).collect();
        }
        let mut taken = Vec::with_capacity(n);
        let mut kept = VecDeque::with_capacity(self.jobs.len() - n);
        let mut jobs = std::mem::take(&mut self.jobs).into_iter();
        let Some(first) = jobs.next() else {
            return taken;
        };
        for job in jobs {
            if taken.len() + 1 < n && self.grouping.together(&first.inputs, &job.inputs) {
                taken.push(job);
            } else {
                kept.push_back(job);
            }
        }
        taken.insert(0, first);
        self.jobs = kept;
        taken
    }

    /// The policy applied to the queue as it is at `now`.
    fn cut(&self, now: Instant) -> Cut {
        let policy = &self.shared.policy;
        let Some(first) = self.jobs.front() else {
            return Cut::Wait(None);
        };
        let due = first.enqueued + policy.delay;
        let group = self.jobs.iter().filter(|job| self.together(first, job));
        let expect_more = !policy.adaptive || {
            let at = self.shared.ns(now);
            self.arrivals
                .expect_within(at, self.shared.ns(due).saturating_sub(at))
        };
        let cut = match &policy.padding {
            None => batch::cut(
                group.map(|job| job.rows),
                policy.max_batch_size,
                &policy.preferred,
                now >= due,
                expect_more,
            ),
            Some(padding) => batch::cut_padded(
                group.map(|job| (job.rows, Padding::length(&job.inputs))),
                policy.max_batch_size,
                padding.bounds,
                &policy.preferred,
                now >= due,
                expect_more,
            ),
        };
        match cut {
            batch::Cut::Take(n) => Cut::Take(n),
            batch::Cut::Wait => Cut::Wait(Some(due)),
        }
    }
}

/// One backend instance and what its thread needs.
struct Instance {
    backend: Box<dyn Backend>,
    shared: Arc<Shared>,
}

impl Instance {
    /// Leads (forms a batch), hands the leadership on, runs the batch; again.
    fn run<G: Grouping>(mut self, queue: &Mutex<Queue<G>>) {
        loop {
            let batch = {
                // A panicking backend cannot poison the queue: it runs outside the lock.
                let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
                q.next_batch()
            };
            match batch {
                Some(jobs) => {
                    // `next_batch` counted this instance busy.
                    self.execute(jobs);
                    self.shared.idle.fetch_add(1, Relaxed);
                }
                None => return,
            }
        }
    }

    fn execute(&mut self, jobs: Vec<Job>) {
        let shared = self.shared.clone();
        let metrics = &*shared.metrics;
        // The device is gone: nothing more runs; what was queued is answered why.
        if let Some(why) = self.shared.lost.get() {
            for job in jobs {
                let _ = job.reply.send(Err(ApiError::DeviceLost(why.clone())));
            }
            return;
        }
        let start = Instant::now();
        let rows: usize = jobs.iter().map(|j| j.rows).sum();
        for j in &jobs {
            metrics.record_queue(start.saturating_duration_since(j.enqueued));
        }
        let n_inputs = jobs.first().map(|j| j.inputs.len()).unwrap_or(0);
        let padding = shared.policy.padding.as_ref();
        let inputs: Option<Vec<Tensor>> = (0..n_inputs)
            .map(|i| {
                let parts: Vec<&Tensor> = jobs.iter().filter_map(|j| j.inputs.get(i)).collect();
                match padding {
                    Some(p) => Tensor::concat_padded(&parts, p.values.get(i).copied().unwrap_or(0)),
                    None => Tensor::concat_rows(&parts),
                }
            })
            .collect();
        let result = match inputs {
            Some(inputs) => self.run_guarded(&inputs),
            None => Err(ExecError::Batch(
                "requests in one batch have different shapes".to_owned(),
            )),
        };
        // An engine that panicked on a batch of several requests: each runs again alone, so
        // only the request that makes it panic fails.
        if matches!(&result, Err(ExecError::Batch(e)) if e.starts_with(PANICKED)) && jobs.len() > 1
        {
            for job in jobs {
                self.execute(vec![job]);
            }
            return;
        }
        let compute = start.elapsed();
        metrics.record_batch(rows, compute);
        if padding.is_some() {
            let lengths = jobs.iter().map(|j| (j.rows, Padding::length(&j.inputs)));
            let (longest, held) = lengths.fold((0, 0), |(l, h), (r, n)| (l.max(n), h + r * n));
            metrics.padded_tokens.add((rows * longest) as u64);
            metrics.sequence_tokens.add(held as u64);
        }
        self.shared
            .last_compute_ns
            .store(compute.as_nanos() as u64, Relaxed);
        let outputs = result.and_then(|outs| match outs.iter().find(|o| o.rows() != rows) {
            Some(o) => Err(ExecError::Batch(format!(
                "the engine returned {} rows for a batch of {rows}",
                o.rows()
            ))),
            None => Ok(outs),
        });
        match outputs {
            Ok(outs) => {
                let mut offset = 0;
                for job in jobs {
                    let own = padding.map(|p| (p, Padding::length(&job.inputs)));
                    let mine: Option<Vec<Tensor>> = outs
                        .iter()
                        .enumerate()
                        .map(|(k, o)| {
                            let rows = o.slice_rows(offset, job.rows)?;
                            match own {
                                Some((p, len)) if p.cut_outputs.get(k) == Some(&true) => {
                                    rows.truncate_length(len)
                                }
                                _ => Some(rows),
                            }
                        })
                        .collect();
                    let mine = match (mine, &shared.policy.reduce) {
                        (None, _) => Err(ApiError::Internal("output rows out of range".to_owned())),
                        (Some(outputs), None) => Ok(outputs),
                        (Some(outputs), Some(r)) => r.reduce(outputs, Padding::length(&job.inputs)),
                    };
                    offset += job.rows;
                    let _ = job
                        .reply
                        .send(mine.map(|outputs| Answer { outputs, compute }));
                }
            }
            Err(ExecError::Batch(e)) => {
                for job in jobs {
                    let _ = job.reply.send(Err(ApiError::Internal(e.clone())));
                }
            }
            Err(ExecError::DeviceLost(why)) => {
                self.lose_device(&why);
                for job in jobs {
                    let _ = job.reply.send(Err(ApiError::DeviceLost(why.clone())));
                }
            }
        }
    }

    /// Runs a batch on the backend, containing a panic: the batch fails (500 naming the
    /// panic), the backend drops whatever state the panic may have left half-written, and the
    /// instance goes on with the next batch. The process and the other instances are not
    /// affected (`panic = "unwind"` in every profile the runtime is built with).
    fn run_guarded(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, ExecError> {
        let backend = &mut self.backend;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| backend.execute(inputs))) {
            Ok(result) => result,
            Err(payload) => {
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".to_owned());
                self.backend.recover();
                self.shared.metrics.engine_panics.add(1);
                crate::log::error(
                    "the engine panicked on a batch: its requests fail, the server goes on",
                    &[
                        (
                            "rows",
                            serde_json::json!(inputs.first().map_or(0, Tensor::rows)),
                        ),
                        ("error", serde_json::json!(what)),
                    ],
                );
                Err(ExecError::Batch(format!("{PANICKED}: {what}")))
            }
        }
    }

    /// The first instance to find the device lost records why, counts it, turns the readiness
    /// gauge to 0 and logs it; later ones (every instance shares the device) add nothing.
    fn lose_device(&self, why: &str) {
        if self.shared.lost.set(why.to_owned()).is_err() {
            return;
        }
        let metrics = &*self.shared.metrics;
        metrics.device_lost.add(1);
        metrics.ready.store(0, Relaxed);
        crate::log::error(
            "the device is lost: no more inferences, readiness now 503 (restart infer-serve)",
            &[("error", serde_json::json!(why))],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use infer_spec::DataType;
    use std::sync::Mutex;

    /// A recording backend: echoes its input and remembers batch sizes.
    struct Echo {
        sizes: Arc<Mutex<Vec<usize>>>,
        sleep: Duration,
    }

    impl Backend for Echo {
        fn execute(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, ExecError> {
            self.sizes.lock().unwrap().push(inputs[0].rows());
            std::thread::sleep(self.sleep);
            Ok(inputs.to_vec())
        }
    }

    fn row(v: f32, rows: usize) -> Tensor {
        Tensor {
            dtype: DataType::F32,
            shape: vec![rows, 1],
            data: Bytes::from(
                (0..rows)
                    .flat_map(|i| (v + i as f32).to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        }
    }

    fn policy(max: usize, preferred: &[usize], delay_ms: u64, queue: usize) -> Policy {
        Policy {
            max_batch_size: max,
            preferred: preferred.to_vec(),
            delay: Duration::from_millis(delay_ms),
            max_queue_size: queue,
            busy_poll: Duration::ZERO,
            // These tests check Triton's rule; the adaptive delay has its own below.
            adaptive: false,
            padding: None,
            reduce: None,
        }
    }

    fn start(p: Policy, instances: usize, sleep_ms: u64) -> (Batcher, Arc<Mutex<Vec<usize>>>) {
        start_grouped(p, SameShapes, instances, sleep_ms)
    }

    /// Echo instances that record their batch sizes, grouped by `g`.
    fn start_grouped<G: Grouping>(
        p: Policy,
        g: G,
        instances: usize,
        sleep_ms: u64,
    ) -> (Batcher, Arc<Mutex<Vec<usize>>>) {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let backends: Vec<Box<dyn Backend>> = (0..instances)
            .map(|_| {
                Box::new(Echo {
                    sizes: sizes.clone(),
                    sleep: Duration::from_millis(sleep_ms),
                }) as Box<dyn Backend>
            })
            .collect();
        let m = Arc::new(Metrics::new("m", "1", 8));
        let b = Batcher::start_grouped(p, g, backends, m).unwrap();
        (b, sizes)
    }

    fn wait(rx: oneshot::Receiver<Outcome>) -> Outcome {
        rx.blocking_recv().unwrap()
    }

    #[test]
    fn rows_come_back_to_their_request() {
        let (b, sizes) = start(policy(8, &[], 50, 0), 1, 0);
        let rxs: Vec<_> = (0..4)
            .map(|i| b.submit(vec![row(10.0 * i as f32, 2)], 2, None).unwrap())
            .collect();
        for (i, rx) in rxs.into_iter().enumerate() {
            assert_eq!(wait(rx).unwrap().outputs, vec![row(10.0 * i as f32, 2)]);
        }
        // 4 requests × 2 rows fill max_batch_size 8 at once.
        assert_eq!(*sizes.lock().unwrap(), vec![8]);
    }

    #[test]
    fn delay_counts_from_the_oldest_request() {
        let (b, sizes) = start(policy(8, &[], 30, 0), 1, 0);
        let t = Instant::now();
        let rx = b.submit(vec![row(1.0, 1)], 1, None).unwrap();
        wait(rx).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert_eq!(*sizes.lock().unwrap(), vec![1]);
    }

    /// A `[1, len]` INT64 request holding `v` in every position.
    fn ids(v: i64, len: usize) -> Tensor {
        Tensor {
            dtype: DataType::I64,
            shape: vec![1, len],
            data: Bytes::from((0..len).flat_map(|_| v.to_le_bytes()).collect::<Vec<u8>>()),
        }
    }

    #[test]
    fn requests_of_different_lengths_share_a_padded_batch_within_the_token_budget() {
        let padded = |budget| Policy {
            padding: Some(Padding {
                values: vec![-1],
                cut_outputs: Vec::new(),
                bounds: batch::Padded {
                    token_budget: budget,
                    max_padding_percent: 0,
                },
            }),
            ..policy(8, &[], 30, 0)
        };
        let (b, sizes) = start_grouped(padded(1000), AnyLength, 1, 0);
        let rxs: Vec<_> = [(1, 2), (2, 5), (3, 3)]
            .iter()
            .map(|&(v, len)| b.submit(vec![ids(v, len)], 1, None).unwrap())
            .collect();
        let out: Vec<Vec<Tensor>> = rxs
            .into_iter()
            .map(|rx| wait(rx).unwrap().outputs)
            .collect();
        // One batch of three, every row padded to 5 with the input's value.
        assert_eq!(*sizes.lock().unwrap(), vec![3]);
        let mut want = ids(1, 2);
        want.shape = vec![1, 5];
        want.data = Bytes::from(
            [1i64, 1, -1, -1, -1]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        assert_eq!(out[0][0], want);
        assert_eq!(out[1][0], ids(2, 5));

        // A tensor model's per-token output is cut back to each request's own length: the
        // echo answers each request with exactly its input.
        let cut = Policy {
            padding: Some(Padding {
                cut_outputs: vec![true],
                ..padded(1000).padding.unwrap()
            }),
            ..padded(1000)
        };
        let (b, sizes) = start_grouped(cut, AnyLength, 1, 0);
        let asked = [(1, 2), (2, 5), (3, 3)];
        let rxs: Vec<_> = asked
            .iter()
            .map(|&(v, len)| b.submit(vec![ids(v, len)], 1, None).unwrap())
            .collect();
        for (rx, &(v, len)) in rxs.into_iter().zip(&asked) {
            assert_eq!(wait(rx).unwrap().outputs, [ids(v, len)]);
        }
        assert_eq!(*sizes.lock().unwrap(), vec![3], "one padded batch");

        // A budget of 10 tokens: [2] and [5] make 2 x 5 = 10; the third would make 15.
        let (b, sizes) = start_grouped(padded(10), AnyLength, 1, 0);
        let t = Instant::now();
        let rxs: Vec<_> = [(1, 2), (2, 5), (3, 3), (4, 20)]
            .iter()
            .map(|&(v, len)| b.submit(vec![ids(v, len)], 1, None).unwrap())
            .collect();
        for rx in rxs {
            wait(rx).unwrap();
        }
        // Full at the budget: the first batch goes at once, not after the delay; a request
        // over the budget on its own still runs, alone.
        assert_eq!(sizes.lock().unwrap()[0], 2, "{sizes:?}");
        assert!(sizes.lock().unwrap().contains(&1));
        assert!(t.elapsed() < Duration::from_millis(200));
    }

    /// Queued requests of two lengths, interleaved: each batch is the oldest request and those
    /// nearest its length within the padding bound, not an arrival-order prefix that the bound
    /// cuts at every change of length.
    #[test]
    fn a_padded_batch_takes_the_requests_nearest_the_oldests_length() {
        let p = Policy {
            padding: Some(Padding {
                values: vec![0],
                cut_outputs: vec![true],
                bounds: batch::Padded {
                    token_budget: 10_000,
                    max_padding_percent: 25,
                },
            }),
            ..policy(8, &[], 0, 0)
        };
        let (b, sizes) = start_grouped(p, AnyLength, 1, 30);
        // Hold the instance, then queue the interleaved lengths behind it.
        let block = b.submit(vec![ids(0, 1)], 1, None).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        let lengths = [10, 50, 11, 52, 12, 49, 10, 51];
        let rxs: Vec<_> = lengths
            .iter()
            .enumerate()
            .map(|(i, &len)| b.submit(vec![ids(i as i64 + 1, len)], 1, None).unwrap())
            .collect();
        wait(block).unwrap();
        for (i, (rx, &len)) in rxs.into_iter().zip(&lengths).enumerate() {
            assert_eq!(wait(rx).unwrap().outputs, [ids(i as i64 + 1, len)]);
        }
        // The blocking request, then one batch per length.
        assert_eq!(*sizes.lock().unwrap(), vec![1, 4, 4]);
    }

    #[test]
    fn adaptive_delay_sends_a_lone_request_at_once_and_waits_under_load() {
        let adaptive = |delay_ms| Policy {
            adaptive: true,
            ..policy(8, &[], delay_ms, 0)
        };
        // One client, each request sent once the last is answered: none waits the delay.
        let (b, sizes) = start(adaptive(200), 1, 0);
        let t = Instant::now();
        for i in 0..5 {
            wait(b.submit(vec![row(i as f32, 1)], 1, None).unwrap()).unwrap();
        }
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(*sizes.lock().unwrap(), vec![1; 5]);

        // Requests overlapping a running batch, 1 ms apart: the next batch waits for company
        // as under the strict rule and fills up to max_batch_size.
        let (b, sizes) = start(adaptive(100), 1, 30);
        let mut rxs = Vec::new();
        for i in 0..24 {
            rxs.push(b.submit(vec![row(i as f32, 1)], 1, None).unwrap());
            std::thread::sleep(Duration::from_millis(1));
        }
        for (i, rx) in rxs.into_iter().enumerate() {
            assert_eq!(wait(rx).unwrap().outputs, vec![row(i as f32, 1)]);
        }
        let sizes = sizes.lock().unwrap().clone();
        assert!(
            sizes.iter().skip(1).any(|&n| n == 8),
            "batches should fill under load: {sizes:?}"
        );
    }

    #[test]
    fn a_polling_leader_keeps_the_policy() {
        let p = Policy {
            busy_poll: Duration::from_millis(200),
            ..policy(8, &[], 30, 0)
        };
        let (b, sizes) = start(p, 1, 0);
        // The first wait polls (no gap seen yet) but still ends when the delay does.
        let t = Instant::now();
        wait(b.submit(vec![row(1.0, 1)], 1, None).unwrap()).unwrap();
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(30), "{took:?}");
        assert!(took < Duration::from_millis(190), "{took:?}");
        // Requests one after another, and after a pause longer than the window (the leader
        // has parked by then): each answered with its own rows.
        for (i, pause) in [0, 1, 0, 250, 0].into_iter().enumerate() {
            std::thread::sleep(Duration::from_millis(pause));
            let rx = b.submit(vec![row(i as f32, 1)], 1, None).unwrap();
            assert_eq!(wait(rx).unwrap().outputs, vec![row(i as f32, 1)]);
        }
        assert_eq!(*sizes.lock().unwrap(), vec![1; 6]);
    }

    #[test]
    fn polls_that_run_out_stop_polling_for_a_while() {
        // max_batch_size 1: a request behind a busy instance waits for it.
        let (b, _) = start(policy(1, &[], 0, 0), 1, 50);
        for _ in 0..POLL_MISSES {
            let busy = b.submit(vec![row(0.0, 1)], 1, None).unwrap();
            let mut rx = b.submit(vec![row(1.0, 1)], 1, None).unwrap();
            // 50 ms of compute expected (none the first time), 100 ms taken: a miss.
            let t = Instant::now();
            assert!(b.poll_briefly(&mut rx, Duration::from_millis(60)).is_none());
            assert!(t.elapsed() >= Duration::from_millis(60));
            wait(busy).unwrap();
            wait(rx).unwrap();
        }
        // The answer (50 ms of compute) would fit this window, but the last polls ran out.
        let mut rx = b.submit(vec![row(2.0, 1)], 1, None).unwrap();
        let t = Instant::now();
        assert!(b
            .poll_briefly(&mut rx, Duration::from_millis(200))
            .is_none());
        assert!(t.elapsed() < Duration::from_millis(40), "{:?}", t.elapsed());
        wait(rx).unwrap();
        std::thread::sleep(POLL_BACKOFF);
        let mut rx = b.submit(vec![row(3.0, 1)], 1, None).unwrap();
        assert_eq!(
            b.poll_briefly(&mut rx, Duration::from_millis(2000))
                .unwrap()
                .unwrap()
                .outputs,
            vec![row(3.0, 1)]
        );
    }

    #[test]
    fn preferred_size_goes_at_once() {
        let (b, sizes) = start(policy(8, &[2], 10_000, 0), 1, 0);
        let t = Instant::now();
        let a = b.submit(vec![row(1.0, 1)], 1, None).unwrap();
        let c = b.submit(vec![row(2.0, 1)], 1, None).unwrap();
        wait(a).unwrap();
        wait(c).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(*sizes.lock().unwrap(), vec![2]);
    }

    fn wide(v: f32) -> Tensor {
        Tensor {
            dtype: DataType::F32,
            shape: vec![1, 2],
            data: Bytes::from(
                [v, v + 0.5]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        }
    }

    /// Submits each of `sent` alone while `block` holds the one instance, then checks every
    /// request got its own rows back.
    fn behind(b: &Batcher, block: oneshot::Receiver<Outcome>, sent: &[Tensor]) {
        let rxs: Vec<_> = sent
            .iter()
            .map(|t| b.submit(vec![t.clone()], 1, None).unwrap())
            .collect();
        wait(block).unwrap();
        for (rx, t) in rxs.into_iter().zip(sent) {
            assert_eq!(wait(rx).unwrap().outputs, vec![t.clone()]);
        }
    }

    /// Requests of different non-batch shapes, interleaved, form one batch per shape (oldest
    /// shape first), and each gets its own rows back.
    #[test]
    fn different_shapes_are_never_mixed() {
        let (b, sizes) = start(policy(8, &[], 0, 0), 1, 20);
        let block = b.submit(vec![row(0.0, 1)], 1, None).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let sent = [
            row(1.0, 1),
            wide(10.0),
            row(2.0, 1),
            wide(20.0),
            row(3.0, 1),
        ];
        behind(&b, block, &sent);
        assert_eq!(*sizes.lock().unwrap(), vec![1, 3, 2]);
    }

    /// A shape that keeps arriving does not starve another: the oldest request's shape goes
    /// next, and a lone request of another shape keeps its delay and deadline.
    #[test]
    fn no_shape_starves() {
        let (b, sizes) = start(policy(2, &[], 30, 0), 1, 10);
        let lone = b
            .submit(
                vec![wide(1.0)],
                1,
                Some(Instant::now() + Duration::from_secs(5)),
            )
            .unwrap();
        let busy: Vec<_> = (0..6)
            .map(|i| b.submit(vec![row(i as f32, 1)], 1, None).unwrap())
            .collect();
        assert_eq!(wait(lone).unwrap().outputs, vec![wide(1.0)]);
        for rx in busy {
            wait(rx).unwrap();
        }
        // The lone wide request was oldest: its batch ran first, after its delay.
        assert_eq!(*sizes.lock().unwrap(), vec![1, 2, 2, 2]);
    }

    /// A model's own grouping decides: here requests of 1.0 never share a batch with requests
    /// of 2.0 (their last bytes differ), although their shapes are equal.
    #[test]
    fn the_grouping_decides_which_requests_go_together() {
        struct ByValue;
        impl Grouping for ByValue {
            fn together(&self, a: &[Tensor], b: &[Tensor]) -> bool {
                SameShapes.together(a, b) && a[0].data.last() == b[0].data.last()
            }
        }
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let backend = Box::new(Echo {
            sizes: sizes.clone(),
            sleep: Duration::from_millis(20),
        }) as Box<dyn Backend>;
        let b = Batcher::start_grouped(
            policy(8, &[], 0, 0),
            ByValue,
            vec![backend],
            Arc::new(Metrics::new("m", "1", 8)),
        )
        .unwrap();
        let block = b.submit(vec![row(0.0, 1)], 1, None).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let sent = [
            row(1.0, 1),
            row(2.0, 1),
            row(1.0, 1),
            row(2.0, 1),
            row(1.0, 1),
        ];
        behind(&b, block, &sent);
        assert_eq!(*sizes.lock().unwrap(), vec![1, 3, 2]);
    }

    #[test]
    fn queue_full_timeout_and_cancel() {
        let (b, _) = start(policy(1, &[], 0, 2), 1, 50);
        let busy = b.submit(vec![row(0.0, 1)], 1, None).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        let soon = Instant::now() + Duration::from_millis(5);
        let expires = b.submit(vec![row(1.0, 1)], 1, Some(soon)).unwrap();
        let cancelled = b.submit(vec![row(2.0, 1)], 1, None).unwrap();
        // Refused at once, without a round trip to the queue.
        assert!(matches!(
            b.submit(vec![row(3.0, 1)], 1, None),
            Err(ApiError::Rejected(Rejection::QueueFull))
        ));
        drop(cancelled);
        assert!(wait(busy).is_ok());
        assert_eq!(wait(expires), Err(ApiError::Rejected(Rejection::Timeout)));
    }

    #[test]
    fn requests_arriving_during_a_batch_form_the_next() {
        let (b, sizes) = start(policy(8, &[], 0, 0), 1, 50);
        let first = b.submit(vec![row(0.0, 1)], 1, None).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        let rest: Vec<_> = (1..=5)
            .map(|i| b.submit(vec![row(i as f32, 1)], 1, None).unwrap())
            .collect();
        wait(first).unwrap();
        for (i, rx) in rest.into_iter().enumerate() {
            assert_eq!(wait(rx).unwrap().outputs, vec![row(1.0 + i as f32, 1)]);
        }
        assert_eq!(*sizes.lock().unwrap(), vec![1, 5]);
    }

    #[test]
    fn instances_run_in_parallel() {
        let (b, sizes) = start(policy(1, &[], 0, 0), 2, 100);
        let t = Instant::now();
        let rxs: Vec<_> = (0..2)
            .map(|i| b.submit(vec![row(i as f32, 1)], 1, None).unwrap())
            .collect();
        for rx in rxs {
            wait(rx).unwrap();
        }
        assert!(
            t.elapsed() < Duration::from_millis(190),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(sizes.lock().unwrap().len(), 2);
    }
}
