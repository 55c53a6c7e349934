//! The dynamic batcher, with Triton's semantics.
//!
//! One thread owns the queue ([`Batcher`] handles send it commands over a channel; each
//! request's outputs come back over its own oneshot). Batches are formed only when a backend
//! instance is idle, so every instance has at most one batch in flight and the queue keeps
//! growing (up to `max_batch_size` rows per batch) while they are all busy:
//!
//! - rows are counted, not requests; a batch never exceeds `max_batch_size` rows;
//! - walking from the oldest request, the batch stops before a request whose non-batch shapes
//!   differ (shapes are never mixed) or that would overflow `max_batch_size`;
//! - the batch is sent at once when it is full or when the oldest request has waited
//!   `max_queue_delay_us`; otherwise, if a preferred size was reached on the way, the largest
//!   such prefix is sent; otherwise the thread sleeps until the oldest request's delay ends;
//! - `max_queue_size` waiting requests → the next one is refused (`queue_full`);
//! - a request whose deadline passed is answered `timeout`; one whose client went away (its
//!   receiver was dropped) leaves the queue and is counted as `cancelled`.
//!
//! Backends run on their own OS threads (one per instance), never on the async workers; the
//! instance thread concatenates the inputs, executes, splits the outputs back by rows and
//! answers each request directly.
//!
//! Hand-offs cost no system call that nobody needs. An instance that finishes marks itself idle
//! in a shared flag and wakes the queue thread only when requests are waiting (then before it
//! answers, so the next batch forms while it splits outputs); the queue thread publishes how
//! many wait before it looks for an idle instance, so one of the two always sees the other
//! (both sides use sequentially consistent operations). A lone request on an idle server is
//! therefore answered without waking the queue thread at all, and [`Batcher::poll_briefly`] lets
//! its HTTP handler pick the answer up without being woken either.

use crate::backend::Backend;
use crate::error::{ApiError, Rejection};
use crate::metrics::Metrics;
use crate::tensor::Tensor;
use infer_spec::RuntimeConfig;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::sync::oneshot::error::TryRecvError;

/// What a request gets back.
pub type Outcome = Result<Answer, ApiError>;

/// A request's outputs and where its time went.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// One tensor per model output, this request's rows only.
    pub outputs: Vec<Tensor>,
    /// Time from enqueue to the start of its batch.
    pub queue: Duration,
    /// Time its batch spent executing (concatenate, engine, check).
    pub compute: Duration,
}

/// One queued request.
pub struct Job {
    pub inputs: Vec<Tensor>,
    pub rows: usize,
    pub enqueued: Instant,
    pub deadline: Option<Instant>,
    pub reply: oneshot::Sender<Outcome>,
}

enum Cmd {
    Enqueue(Job),
    /// An instance became idle while requests were waiting.
    Idle,
}

/// State the queue thread, the instances and the handlers share without messages.
struct Shared {
    /// One flag per instance: idle (no batch given to it and not yet finished).
    idle: Vec<AtomicBool>,
    /// Requests waiting in the queue, as the queue thread last published it.
    waiting: AtomicUsize,
    /// The last batch's compute time, for [`Batcher::poll_briefly`].
    last_compute_ns: AtomicU64,
    /// The policy's queue delay, for [`Batcher::poll_briefly`].
    delay: Duration,
}

/// The batching policy, from `[batching]`.
#[derive(Debug, Clone)]
pub struct Policy {
    pub max_batch_size: usize,
    pub preferred: Vec<usize>,
    pub delay: Duration,
    pub max_queue_size: usize,
}

impl Policy {
    pub fn from_config(cfg: &RuntimeConfig) -> Policy {
        let b = &cfg.batching;
        Policy {
            max_batch_size: b.max_batch_size as usize,
            preferred: b.preferred().into_iter().map(|s| s as usize).collect(),
            delay: Duration::from_micros(b.max_queue_delay_us),
            max_queue_size: b.max_queue_size as usize,
        }
    }
}

/// A handle to the queue thread; cheap to clone.
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Cmd>,
    shared: Arc<Shared>,
}

impl Batcher {
    /// Starts the queue thread and one thread per backend instance.
    pub fn start(
        policy: Policy,
        backends: Vec<Box<dyn Backend>>,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Batcher> {
        let (tx, rx) = mpsc::channel::<Cmd>();
        let shared = Arc::new(Shared {
            idle: backends.iter().map(|_| AtomicBool::new(true)).collect(),
            waiting: AtomicUsize::new(0),
            last_compute_ns: AtomicU64::new(0),
            delay: policy.delay,
        });
        let mut instances = Vec::new();
        for (id, backend) in backends.into_iter().enumerate() {
            let (btx, brx) = mpsc::channel::<Vec<Job>>();
            let instance = Instance {
                id,
                backend,
                done: tx.clone(),
                shared: shared.clone(),
                metrics: metrics.clone(),
            };
            std::thread::Builder::new()
                .name(format!("backend-{id}"))
                .spawn(move || instance.run(brx))?;
            instances.push(btx);
        }
        let queue = Queue {
            policy,
            jobs: VecDeque::new(),
            shared: shared.clone(),
            instances,
            metrics,
        };
        std::thread::Builder::new()
            .name("batcher".into())
            .spawn(move || queue.run(rx))?;
        Ok(Batcher { tx, shared })
    }

    /// Polls `rx` without parking for up to `window`, when the answer can be expected that
    /// soon (the queue delay plus the last batch's compute fit in the window): the caller's
    /// core spins instead of the backend thread waking a parked async worker, which costs
    /// more than a small model's compute on a virtual machine. Returns `None` when no answer
    /// came in time; then await `rx` as usual. Meant for a lone request on an otherwise idle
    /// server: spinning under load would take a core from the work.
    pub fn poll_briefly(
        &self,
        rx: &mut oneshot::Receiver<Outcome>,
        window: Duration,
    ) -> Option<Outcome> {
        let expected =
            self.shared.delay + Duration::from_nanos(self.shared.last_compute_ns.load(Relaxed));
        if window.is_zero() || expected > window {
            return None;
        }
        let until = Instant::now() + window;
        loop {
            for _ in 0..64 {
                match rx.try_recv() {
                    Ok(outcome) => return Some(outcome),
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                    Err(TryRecvError::Closed) => {
                        // Only a dropped sender closes it: report that through the await.
                        return None;
                    }
                }
            }
            if Instant::now() >= until {
                return None;
            }
        }
    }

    /// Queues a request; its outputs (or why not) arrive on the returned receiver.
    pub fn submit(
        &self,
        inputs: Vec<Tensor>,
        rows: usize,
        deadline: Option<Instant>,
    ) -> Result<oneshot::Receiver<Outcome>, ApiError> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            inputs,
            rows,
            enqueued: Instant::now(),
            deadline,
            reply,
        };
        self.tx
            .send(Cmd::Enqueue(job))
            .map_err(|_| ApiError::Rejected(Rejection::ShuttingDown))?;
        Ok(rx)
    }
}

struct Queue {
    policy: Policy,
    jobs: VecDeque<Job>,
    shared: Arc<Shared>,
    instances: Vec<mpsc::Sender<Vec<Job>>>,
    metrics: Arc<Metrics>,
}

fn same_shapes(a: &Job, b: &Job) -> bool {
    a.inputs.len() == b.inputs.len()
        && a.inputs
            .iter()
            .zip(&b.inputs)
            .all(|(x, y)| x.shape.get(1..) == y.shape.get(1..))
}

impl Queue {
    fn run(mut self, rx: mpsc::Receiver<Cmd>) {
        let mut wake: Option<Instant> = None;
        loop {
            let first = match wake {
                Some(t) => match rx.recv_timeout(t.saturating_duration_since(Instant::now())) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                },
                None => match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                },
            };
            if let Some(c) = first {
                self.handle(c);
                while let Ok(c) = rx.try_recv() {
                    self.handle(c);
                }
            }
            wake = self.dispatch(Instant::now());
            self.metrics
                .queue_depth
                .store(self.jobs.len() as u64, Relaxed);
        }
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Enqueue(job) => {
                if self.policy.max_queue_size > 0 && self.jobs.len() >= self.policy.max_queue_size {
                    let _ = job
                        .reply
                        .send(Err(ApiError::Rejected(Rejection::QueueFull)));
                } else {
                    self.jobs.push_back(job);
                }
            }
            Cmd::Idle => {}
        }
    }

    /// The first idle instance, no longer idle.
    fn claim_idle(&self) -> Option<usize> {
        self.shared
            .idle
            .iter()
            .position(|f| f.load(SeqCst) && f.swap(false, SeqCst))
    }

    /// Removes requests whose client is gone or whose deadline passed.
    fn purge(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.jobs.len() {
            let job = &self.jobs[i];
            let expired = job.deadline.is_some_and(|d| d <= now);
            if job.reply.is_closed() {
                // A handler that timed out by itself already counted the timeout.
                if !expired {
                    self.metrics.record_rejection(Rejection::Cancelled);
                    self.metrics.failure_cancelled.fetch_add(1, Relaxed);
                }
            } else if !expired {
                i += 1;
                continue;
            }
            if let Some(job) = self.jobs.remove(i) {
                let _ = job.reply.send(Err(ApiError::Rejected(Rejection::Timeout)));
            }
        }
    }

    /// Sends batches to idle instances; returns when to look again if a batch is waiting for
    /// its delay.
    fn dispatch(&mut self, now: Instant) -> Option<Instant> {
        loop {
            // Publish before looking for an idle instance: an instance that turns idle after
            // the look sees this and wakes the thread (see the module docs).
            self.shared.waiting.store(self.jobs.len(), SeqCst);
            if self.jobs.is_empty() || !self.shared.idle.iter().any(|f| f.load(SeqCst)) {
                return None;
            }
            self.purge(now);
            let Some(first) = self.jobs.front() else {
                self.shared.waiting.store(0, SeqCst);
                return None;
            };
            let (mut rows, mut n, mut preferred_cut, mut full) = (0usize, 0usize, None, false);
            for job in &self.jobs {
                if !same_shapes(first, job) || rows + job.rows > self.policy.max_batch_size {
                    full = true;
                    break;
                }
                rows += job.rows;
                n += 1;
                if self.policy.preferred.contains(&rows) {
                    preferred_cut = Some(n);
                }
            }
            full |= rows == self.policy.max_batch_size;
            let due = first.enqueued + self.policy.delay;
            let cut = if full || now >= due {
                n
            } else if let Some(cut) = preferred_cut {
                cut
            } else {
                return Some(due);
            };
            let id = self.claim_idle()?;
            let batch: Vec<Job> = self.jobs.drain(..cut).collect();
            if let Err(mpsc::SendError(batch)) = self.instances[id].send(batch) {
                for job in batch {
                    let _ = job.reply.send(Err(ApiError::Internal(format!(
                        "backend instance {id} has stopped"
                    ))));
                }
            }
        }
    }
}

/// One backend instance and what its thread needs.
struct Instance {
    id: usize,
    backend: Box<dyn Backend>,
    done: mpsc::Sender<Cmd>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
}

impl Instance {
    fn run(mut self, rx: mpsc::Receiver<Vec<Job>>) {
        while let Ok(jobs) = rx.recv() {
            self.execute(jobs);
        }
    }

    /// Runs one batch and answers its requests.
    fn execute(&mut self, jobs: Vec<Job>) {
        let metrics = &*self.metrics;
        let start = Instant::now();
        let rows: usize = jobs.iter().map(|j| j.rows).sum();
        for j in &jobs {
            metrics.record_queue(start.saturating_duration_since(j.enqueued));
        }
        let n_inputs = jobs.first().map(|j| j.inputs.len()).unwrap_or(0);
        let inputs: Option<Vec<Tensor>> = (0..n_inputs)
            .map(|i| {
                Tensor::concat_rows(
                    &jobs
                        .iter()
                        .filter_map(|j| j.inputs.get(i))
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        let result = match inputs {
            Some(inputs) => self.backend.execute(&inputs),
            None => Err("requests in one batch have different shapes".to_owned()),
        };
        let compute = start.elapsed();
        metrics.record_batch(rows, compute);
        let shared = &*self.shared;
        shared
            .last_compute_ns
            .store(compute.as_nanos() as u64, Relaxed);
        // Free the instance before answering; wake the queue thread only when requests wait,
        // so the next batch forms while we split outputs.
        shared.idle[self.id].store(true, SeqCst);
        if shared.waiting.load(SeqCst) > 0 {
            let _ = self.done.send(Cmd::Idle);
        }
        let outputs = result.and_then(|outs| match outs.iter().find(|o| o.rows() != rows) {
            Some(o) => Err(format!(
                "the engine returned {} rows for a batch of {rows}",
                o.rows()
            )),
            None => Ok(outs),
        });
        match outputs {
            Ok(outs) => {
                let mut offset = 0;
                for job in jobs {
                    let mine: Option<Vec<Tensor>> = outs
                        .iter()
                        .map(|o| o.slice_rows(offset, job.rows))
                        .collect();
                    let queue = start.saturating_duration_since(job.enqueued);
                    let mine = mine.map(|outputs| Answer {
                        outputs,
                        queue,
                        compute,
                    });
                    offset += job.rows;
                    let _ =
                        job.reply.send(mine.ok_or_else(|| {
                            ApiError::Internal("output rows out of range".to_owned())
                        }));
                }
            }
            Err(e) => {
                for job in jobs {
                    let _ = job.reply.send(Err(ApiError::Internal(e.clone())));
                }
            }
        }
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
        fn execute(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
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
        }
    }

    fn start(p: Policy, instances: usize, sleep_ms: u64) -> (Batcher, Arc<Mutex<Vec<usize>>>) {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let backends: Vec<Box<dyn Backend>> = (0..instances)
            .map(|_| {
                Box::new(Echo {
                    sizes: sizes.clone(),
                    sleep: Duration::from_millis(sleep_ms),
                }) as Box<dyn Backend>
            })
            .collect();
        let b = Batcher::start(p, backends, Arc::new(Metrics::new("m", "1", 8))).unwrap();
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

    #[test]
    fn different_shapes_are_never_mixed() {
        let (b, sizes) = start(policy(8, &[], 0, 0), 1, 20);
        let block = b.submit(vec![row(0.0, 1)], 1, None).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let wide = Tensor {
            dtype: DataType::F32,
            shape: vec![1, 2],
            data: Bytes::from(vec![0u8; 8]),
        };
        let rxs = [
            b.submit(vec![row(1.0, 1)], 1, None).unwrap(),
            b.submit(vec![wide.clone()], 1, None).unwrap(),
            b.submit(vec![row(2.0, 1)], 1, None).unwrap(),
        ];
        wait(block).unwrap();
        for rx in rxs {
            wait(rx).unwrap();
        }
        assert_eq!(*sizes.lock().unwrap(), vec![1, 1, 1, 1]);
    }

    #[test]
    fn queue_full_timeout_and_cancel() {
        let (b, _) = start(policy(1, &[], 0, 2), 1, 50);
        let busy = b.submit(vec![row(0.0, 1)], 1, None).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        let soon = Instant::now() + Duration::from_millis(5);
        let expires = b.submit(vec![row(1.0, 1)], 1, Some(soon)).unwrap();
        let cancelled = b.submit(vec![row(2.0, 1)], 1, None).unwrap();
        let full = b.submit(vec![row(3.0, 1)], 1, None).unwrap();
        assert_eq!(wait(full), Err(ApiError::Rejected(Rejection::QueueFull)));
        drop(cancelled);
        assert!(wait(busy).is_ok());
        assert_eq!(wait(expires), Err(ApiError::Rejected(Rejection::Timeout)));
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
