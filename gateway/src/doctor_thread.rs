//! The prefix-cache doctor ([`crate::doctor`]) off the request path. The router hands each routed prompt,
//! and the service each finished reply, to a bounded queue without waiting; one thread takes what the queue
//! holds every [`DRAIN_INTERVAL`] (so a request never pays for waking it), feeds it to the synchronous
//! [`Doctor`], records the doctor's metrics and logs each diagnosis it raises or resolves. When the queue is
//! full a prompt is dropped and counted (`kvroute_gateway_prefix_doctor_dropped_total`), so a request never
//! waits for the doctor. `/debug/prefix-report` locks the doctor while it builds a report.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::doctor::report::summary;
use crate::doctor::{Doctor, DoctorConfig, Kind, Observation, Report, ReportOptions};
use crate::metrics;
use crate::routing::Millis;

/// Messages the queue holds at most; each holds at most a prompt's tracked tokens or [`MAX_REPLY_TOKENS`]
/// (16 KiB at the defaults).
pub const QUEUE_CAPACITY: usize = 256;

/// Tokens of a reply kept for the doctor (more would go past the blocks it tracks at the defaults).
pub const MAX_REPLY_TOKENS: usize = 4096;

/// How often the doctor's thread takes what the queue holds. It never blocks on the queue: a sender would
/// then have to wake it, a system call on every routed request.
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(20);

/// A routed prompt for the doctor: whose it is, and its tokens (moved in, not copied).
#[derive(Clone, Debug)]
pub struct Traffic {
    pub tenant: String,
    /// The request's `user` field.
    pub user: Option<String>,
    /// The request's cache scope (None: caching off).
    pub scope: Option<Vec<u8>>,
    pub tokens: Vec<u32>,
}

/// Names a routed prompt when its reply finishes; 0 when the doctor did not take it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DoctorTicket(u64);

enum Message {
    Observe { id: u64, now: Millis, traffic: Traffic, prompt_len: usize, matched: [u64; 3] },
    Finished { id: u64, now: Millis, reply: Vec<u32>, prompt_tokens: u64, cached_tokens: u64 },
}

/// The doctor and the thread that feeds it.
pub struct DoctorThread {
    doctor: Arc<Mutex<Doctor>>,
    sender: Option<SyncSender<Message>>,
    thread: Option<JoinHandle<()>>,
    next_id: AtomicU64,
    dropped: AtomicU64,
    /// Tokens of a prompt the doctor reads: more are cut off before they are queued.
    max_tokens: usize,
}

impl std::fmt::Debug for DoctorThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DoctorThread").field("dropped", &self.dropped.load(Ordering::Relaxed)).finish()
    }
}

impl DoctorThread {
    /// Starts the doctor's thread. Tenants named in `labelled` get metrics of their own (a `tenant` label).
    pub fn start(config: DoctorConfig, labelled: Vec<String>) -> std::io::Result<DoctorThread> {
        let max_tokens = (config.tracked_blocks * config.block_size.max(1)).max(config.head_tokens);
        let doctor = Arc::new(Mutex::new(Doctor::new(config)));
        let (sender, receiver) = sync_channel(QUEUE_CAPACITY);
        let fed = doctor.clone();
        let labelled: HashSet<String> = labelled.into_iter().collect();
        let thread =
            std::thread::Builder::new().name("prefix-doctor".into()).spawn(move || run(&fed, &receiver, &labelled))?;
        Ok(DoctorThread {
            doctor,
            sender: Some(sender),
            thread: Some(thread),
            next_id: AtomicU64::new(1),
            dropped: AtomicU64::new(0),
            max_tokens,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Doctor> {
        self.doctor.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands a routed prompt to the doctor; `matched` is what the routing decision found cached per tier
    /// (tokens). Never waits: when the queue is full the prompt is dropped.
    pub fn observe(&self, now: Millis, mut traffic: Traffic, matched: [u64; 3]) -> DoctorTicket {
        let prompt_len = traffic.tokens.len();
        if prompt_len > self.max_tokens {
            traffic.tokens.truncate(self.max_tokens);
            traffic.tokens.shrink_to_fit();
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let message = Message::Observe { id, now, traffic, prompt_len, matched };
        if self.send(message) {
            DoctorTicket(id)
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::record_prefix_doctor_dropped();
            DoctorTicket(0)
        }
    }

    /// The reply to a routed prompt finished: its token ids and the replica's count of cached prompt tokens.
    pub fn finished(&self, ticket: DoctorTicket, now: Millis, reply: Vec<u32>, prompt_tokens: u64, cached_tokens: u64) {
        if ticket != DoctorTicket(0) {
            self.send(Message::Finished { id: ticket.0, now, reply, prompt_tokens, cached_tokens });
        }
    }

    /// Queues a message unless the queue is full (a finished reply that does not fit is only not
    /// remembered).
    fn send(&self, message: Message) -> bool {
        let Some(sender) = &self.sender else { return false };
        match sender.try_send(message) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }

    /// The doctor's report at `now`.
    pub fn report(&self, now: Millis, options: &ReportOptions, decode: &dyn Fn(&[u32]) -> String) -> Report {
        let mut report = self.lock().report(now, options, decode);
        report.dropped_requests = self.dropped.load(Ordering::Relaxed);
        report
    }

    /// Prompts handed to the doctor that it is done with: observed, or dropped because the queue was full.
    pub fn observed(&self) -> u64 {
        self.lock().counts().0 + self.dropped.load(Ordering::Relaxed)
    }

    /// Whether `tenant` is tracked.
    pub fn knows(&self, tenant: &str) -> bool {
        self.lock().active_for(tenant).is_some()
    }
}

impl Drop for DoctorThread {
    fn drop(&mut self) {
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// The thread: every [`DRAIN_INTERVAL`], applies the messages queued, until every sender is gone.
fn run(doctor: &Mutex<Doctor>, receiver: &Receiver<Message>, labelled: &HashSet<String>) {
    loop {
        match receiver.try_recv() {
            Ok(message) => apply(doctor, message, labelled),
            Err(TryRecvError::Empty) => std::thread::park_timeout(DRAIN_INTERVAL),
            Err(TryRecvError::Disconnected) => return,
        }
    }
}

/// Applies one message: observes a prompt (recording its metrics and logging the diagnoses it raises or
/// resolves) or a finished reply.
fn apply(doctor: &Mutex<Doctor>, message: Message, labelled: &HashSet<String>) {
    let mut doctor = doctor.lock().unwrap_or_else(PoisonError::into_inner);
    match message {
        Message::Observe { id, now, traffic, prompt_len, matched } => {
            let scope = traffic.scope.as_deref().map_or(0, crate::doctor::chain::digest);
            let observation = Observation {
                tenant: &traffic.tenant,
                user: traffic.user.as_deref(),
                scope,
                tokens: &traffic.tokens,
                prompt_len,
                matched,
            };
            let observed = doctor.observe(now, id, &observation);
            if let Some(block) = observed.divergence_block {
                metrics::record_prefix_divergence(block);
            }
            if observed.churned {
                metrics::record_prefix_churn();
            }
            for change in &observed.changes {
                let kind = change.kind.as_str();
                if change.raised {
                    metrics::record_prefix_diagnosis(kind);
                    let summary = doctor.finding(&change.tenant, change.kind).map(summary).unwrap_or_default();
                    tracing::warn!(
                        tenant = %change.tenant,
                        kind,
                        block = change.block,
                        token = change.token,
                        "prefix-cache diagnosis: {summary} (details: GET /debug/prefix-report)"
                    );
                } else {
                    tracing::info!(tenant = %change.tenant, kind, "prefix-cache diagnosis resolved");
                }
            }
            publish(&doctor, now, &traffic.tenant, labelled);
        }
        Message::Finished { id, now, reply, prompt_tokens, cached_tokens } => {
            doctor.finished(now, id, &reply, prompt_tokens, cached_tokens);
        }
    }
}

/// The doctor's gauges: tenants per raised diagnosis, the fleet's ratios, and a labelled tenant's own.
fn publish(doctor: &Doctor, now: Millis, tenant: &str, labelled: &HashSet<String>) {
    let active = doctor.active();
    for (kind, count) in Kind::ALL.iter().zip(active) {
        metrics::record_prefix_diagnoses_active(kind.as_str(), count);
    }
    metrics::record_prefix_ratios(&doctor.fleet(now));
    if labelled.contains(tenant)
        && let (Some(counters), Some(kinds)) = (doctor.tenant(tenant, now), doctor.active_for(tenant))
    {
        metrics::record_tenant_prefix(tenant, &counters, &kinds);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Waits until the doctor has seen `finished` replies; returns its report.
    fn report_after(thread: &DoctorThread, finished: u64) -> Report {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let report = thread.report(2_000, &ReportOptions::default(), &|_| String::new());
            if report.finished_requests >= finished {
                return report;
            }
            assert!(Instant::now() < deadline, "the doctor's thread did not count {finished} replies");
            std::thread::yield_now();
        }
    }

    #[test]
    fn prompts_and_replies_reach_the_doctor_and_long_prompts_count_in_full() {
        let thread = DoctorThread::start(DoctorConfig::default(), Vec::new()).unwrap();
        let traffic =
            |tokens: Vec<u32>| Traffic { tenant: "acme".into(), user: None, scope: Some(b"t:acme".to_vec()), tokens };
        let short = thread.observe(1_000, traffic((0..100).collect()), [32, 16, 0]);
        assert_ne!(short, DoctorTicket(0));
        thread.finished(short, 1_000, vec![7; 20], 100, 48);
        // Longer than the doctor reads: cut before queueing, counted in full.
        let long = thread.observe(1_500, traffic((0..10_000).collect()), [0; 3]);
        thread.finished(long, 1_500, Vec::new(), 10_000, 0);
        let report = report_after(&thread, 2);
        assert_eq!((report.observed_requests, report.dropped_requests), (2, 0));
        let traffic = &report.tenants[0].traffic;
        assert_eq!((traffic.requests, traffic.prompt_tokens), (2, 10_100));
        assert_eq!((traffic.hit_ratio.gpu, traffic.hit_ratio.host), (0.0032, 0.0016));
        assert_eq!(traffic.hit_ratio.reported, 0.0048);
        // The long prompt repeats the short one's six blocks.
        assert_eq!(traffic.repeated_prefix_ratio, (6.0 * 16.0 / (100.0 + 4_096.0) * 1e4_f64).round() / 1e4);
        assert_eq!(DoctorTicket::default(), DoctorTicket(0), "no ticket: no reply is sent");
        thread.finished(DoctorTicket::default(), 2_000, vec![1], 1, 1);
    }
}
