//! G3: the network tier shared by every agent, on Redis (standalone or cluster).
//!
//! One self-describing record per block (`kvroute_proto::block_record`) under
//! `{prefix}:{model fingerprint}:{block hash}`; the scope is inside the hash, so
//! tenants and models never collide. Writes go through a bounded queue to one
//! writer task that pipelines them; a full queue drops the spill and counts it,
//! so the engine never waits on Redis. Reads fetch the leading run of a chain
//! with pipelined GETs, verify every record, and treat anything that does not
//! verify as a miss (deleted and counted). Redis being down, slow or erroring
//! makes the tier a miss, never a failed request; the connection is retried
//! with backoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kvroute_proto::block_hash::BlockHash;
use kvroute_proto::block_record::{self, Expected, ModelFingerprint};
use kvroute_proto::domain::{KvEvent, Tier};
use tokio::sync::{Mutex, mpsc};

use super::host::BlockBytes;
use super::resp::{Op, Reply};
use super::resp_client::RespPool;
use super::resp_cluster::ClusterPool;
use crate::metrics;

/// Where the shared tier lives and how it is used.
#[derive(Clone, Debug)]
pub struct NetworkConfig {
    /// `redis://host:port/db` for a standalone server.
    pub url: Option<String>,
    /// Node URLs of a Redis Cluster (takes precedence over `url`).
    pub cluster_nodes: Vec<String>,
    pub key_prefix: String,
    /// Expiry of stored blocks; none when absent.
    pub ttl: Option<Duration>,
    /// Blocks queued for writing before spills are dropped.
    pub queue_capacity: usize,
    /// Upper bound on one read or write round trip.
    pub timeout: Duration,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            url: None,
            cluster_nodes: Vec::new(),
            key_prefix: "kvroute".into(),
            ttl: None,
            queue_capacity: 1024,
            timeout: Duration::from_millis(500),
        }
    }
}

/// Receives the tier's events (stored, removed, cleared).
pub type EventCallback = Arc<dyn Fn(KvEvent) + Send + Sync>;

#[derive(Clone)]
enum Connection {
    Single(Arc<RespPool>),
    Cluster(Arc<ClusterPool>),
}

impl Connection {
    /// Runs commands on keys of any slot, replies in order: one pipeline on a standalone server; on a
    /// cluster one pipeline per node that serves the keys, all at once. A server error reply to any command
    /// fails the whole call.
    async fn run_each(&mut self, ops: Vec<Op>) -> Result<Vec<Reply>, String> {
        let replies = match self {
            Connection::Single(pool) => pool.run(&ops).await,
            Connection::Cluster(pool) => pool.run(&ops).await,
        };
        replies.map_err(|error| error.to_string())
    }
}

struct Link {
    connection: Option<Connection>,
    next_attempt: Instant,
    backoff: Duration,
}

struct Shared {
    config: NetworkConfig,
    fingerprint: ModelFingerprint,
    key_base: String,
    block_size: u32,
    payload_len: u64,
    link: Mutex<Link>,
    up: AtomicBool,
    /// The tier's state was announced at least once.
    announced: AtomicBool,
    /// Moving average of read bandwidth, f64 bits (0 = not measured yet).
    read_bandwidth: AtomicU64,
    /// The write queue's sending side, weak so that the writers end when the tier is dropped.
    writes: mpsc::WeakSender<(BlockHash, BlockBytes)>,
    events: EventCallback,
}

/// Handle to the network tier; cheap to clone.
#[derive(Clone)]
pub struct NetworkTier {
    shared: Arc<Shared>,
    writes: mpsc::Sender<(BlockHash, BlockBytes)>,
}

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Blocks fetched per pipelined round trip. Small, so that each record is verified as soon as it lands
/// while the next windows travel: on 2 cores, windows of 32 read at 41% of raw Redis, windows of 1-2 at
/// 50-76% (docs/benchmarks.md).
const FETCH_WINDOW: usize = 2;
/// Fetch round trips in flight at once, each on its own pooled connection.
const FETCHES_IN_FLIGHT: usize = 8;
/// Blocks written per pipelined round trip.
const WRITE_BATCH: usize = 64;
/// Writer tasks, each with one batch in flight.
const WRITERS: usize = 4;

impl NetworkTier {
    /// Starts the tier: connects in the background, spawns the writer task.
    /// Must run inside a tokio runtime.
    pub fn start(
        config: NetworkConfig,
        fingerprint: ModelFingerprint,
        block_size: u32,
        payload_len: u64,
        events: EventCallback,
    ) -> NetworkTier {
        let key_base = format!("{}:{}:", config.key_prefix, fingerprint.short_hex());
        let (writes, queue) = mpsc::channel(config.queue_capacity.max(1));
        let shared = Arc::new(Shared {
            config,
            fingerprint,
            key_base,
            block_size,
            payload_len,
            link: Mutex::new(Link { connection: None, next_attempt: Instant::now(), backoff: MIN_BACKOFF }),
            up: AtomicBool::new(false),
            announced: AtomicBool::new(false),
            read_bandwidth: AtomicU64::new(0),
            writes: writes.downgrade(),
            events,
        });
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..WRITERS {
            tokio::spawn(write_loop(shared.clone(), queue.clone()));
        }
        let weak = Arc::downgrade(&shared);
        tokio::spawn(probe_loop(weak));
        NetworkTier { shared, writes }
    }

    pub fn is_up(&self) -> bool {
        self.shared.up.load(Ordering::Relaxed)
    }

    /// Measured read bandwidth in bytes per second (0 until measured).
    pub fn read_bandwidth(&self) -> f64 {
        f64::from_bits(self.shared.read_bandwidth.load(Ordering::Relaxed))
    }

    /// The Redis key of a block.
    pub fn key(&self, hash: &BlockHash) -> String {
        self.shared.key(hash)
    }

    /// Queues a block for writing; returns false (and counts a drop) when the
    /// queue is full. Never waits.
    pub fn spill(&self, hash: BlockHash, bytes: BlockBytes) -> bool {
        match self.writes.try_send((hash, bytes)) {
            Ok(()) => {
                metrics::record_tier_queue(Tier::Network, self.queue_depth());
                true
            }
            Err(_) => {
                metrics::record_tier_drop(Tier::Network);
                false
            }
        }
    }

    /// Blocks waiting in the write queue.
    pub fn queue_depth(&self) -> usize {
        self.writes.max_capacity() - self.writes.capacity()
    }

    /// Fetches the leading run of `hashes` present in the tier, verified;
    /// stops at the first miss, error or record that does not verify.
    pub async fn fetch_run(&self, hashes: &[BlockHash]) -> Vec<BlockBytes> {
        let shared = &self.shared;
        let mut out = Vec::new();
        let started = Instant::now();
        let Some(connection) = shared.connection().await else { return out };
        // Each window is its own task: the next one travels (and verifies, on another core) while this one
        // is taken apart. Windows past a miss are aborted when the stream is dropped.
        let windows: Vec<Vec<BlockHash>> = hashes.chunks(FETCH_WINDOW).map(<[BlockHash]>::to_vec).collect();
        let mut fetched = futures::stream::iter(windows)
            .map(|window| AbortOnDrop(tokio::spawn(fetch_window(shared.clone(), connection.clone(), window))))
            .buffered(FETCHES_IN_FLIGHT);
        while let Some(window) = fetched.next().await {
            let Ok(window) = window else { break };
            out.extend(window.blocks);
            match window.end {
                None => {}
                Some(WindowEnd::Miss(hash)) => {
                    // Gone although this or another agent once stored it (expired or evicted by Redis, or never
                    // written): say so, so that gateways stop counting on it.
                    (shared.events)(KvEvent::Removed { tier: Tier::Network, hashes: vec![hash] });
                    break;
                }
                Some(WindowEnd::Failed(reason)) => {
                    shared.failed(&reason).await;
                    break;
                }
                Some(WindowEnd::Corrupt(hash, error)) => {
                    tracing::warn!(block = %hash, %error, "discarding a network-tier record that does not verify");
                    metrics::record_tier_corrupt(Tier::Network);
                    shared.delete(hash).await;
                    break;
                }
            }
        }
        if !out.is_empty() {
            let bytes: usize = out.iter().map(|b| b.len()).sum();
            let seconds = started.elapsed().as_secs_f64().max(1e-6);
            shared.record_read(bytes as f64 / seconds);
            metrics::record_tier_reload(Tier::Network, bytes, seconds);
        }
        out
    }
}

/// What one fetched window of a chain holds: its leading verified blocks, and why it stopped short.
struct Window {
    blocks: Vec<BlockBytes>,
    end: Option<WindowEnd>,
}

enum WindowEnd {
    /// The first block of the window that the tier does not hold.
    Miss(BlockHash),
    Failed(String),
    Corrupt(BlockHash, block_record::RecordError),
}

/// Fetches and verifies one window of a chain.
async fn fetch_window(shared: Arc<Shared>, mut connection: Connection, window: Vec<BlockHash>) -> Window {
    let gets: Vec<Op> =
        window.iter().map(|hash| Op::GetSplit { key: shared.key(hash), head_len: block_record::HEADER_LEN }).collect();
    let replies = match tokio::time::timeout(shared.config.timeout, connection.run_each(gets)).await {
        Ok(Ok(replies)) => replies,
        Ok(Err(error)) => return Window { blocks: Vec::new(), end: Some(WindowEnd::Failed(error)) },
        Err(_) => return Window { blocks: Vec::new(), end: Some(WindowEnd::Failed("read timed out".into())) },
    };
    let mut blocks = Vec::with_capacity(window.len());
    for (hash, reply) in window.iter().zip(replies) {
        let expected = Expected {
            fingerprint: &shared.fingerprint,
            block_size: shared.block_size,
            hash,
            payload_len: shared.payload_len,
        };
        // The client splits the record's header from its payload as it reads (a plain GET's whole value, as a
        // record written by another version might come, is split here).
        let (head, payload) = match reply {
            Reply::Split(Some(parts)) => parts,
            Reply::Bulk(Some(mut record)) => {
                let payload = record.split_off(record.len().min(block_record::HEADER_LEN));
                (record, payload)
            }
            _ => return Window { blocks, end: Some(WindowEnd::Miss(*hash)) },
        };
        match block_record::verify_parts(&head, &payload, &expected) {
            Ok(()) => blocks.push(Arc::new(payload)),
            Err(error) => return Window { blocks, end: Some(WindowEnd::Corrupt(*hash, error)) },
        }
    }
    Window { blocks, end: None }
}

/// A spawned task that is aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl Shared {
    fn key(&self, hash: &BlockHash) -> String {
        format!("{}{hash}", self.key_base)
    }

    /// A live connection, or None while the tier is down (retried with backoff).
    async fn connection(&self) -> Option<Connection> {
        let mut link = self.link.lock().await;
        if let Some(connection) = &link.connection {
            return Some(connection.clone());
        }
        if Instant::now() < link.next_attempt {
            return None;
        }
        match tokio::time::timeout(self.config.timeout * 2, self.connect()).await {
            Ok(Ok(connection)) => {
                link.connection = Some(connection.clone());
                link.backoff = MIN_BACKOFF;
                self.announced.store(true, Ordering::Relaxed);
                if !self.up.swap(true, Ordering::Relaxed) {
                    tracing::info!("network tier up");
                }
                metrics::record_tier_up(Tier::Network, true);
                Some(connection)
            }
            result => {
                let reason = match result {
                    Ok(Err(error)) => error.to_string(),
                    _ => "connect timed out".to_string(),
                };
                link.next_attempt = Instant::now() + link.backoff;
                link.backoff = (link.backoff * 2).min(MAX_BACKOFF);
                drop(link);
                self.mark_down(&reason);
                None
            }
        }
    }

    async fn connect(&self) -> Result<Connection, String> {
        // Room for a record's header beyond its payload.
        let max_bulk = self.payload_len as usize + 4096;
        if !self.config.cluster_nodes.is_empty() {
            let pool =
                ClusterPool::from_urls(&self.config.cluster_nodes, max_bulk).map_err(|error| error.to_string())?;
            // Reach a node now, so that "up" means reachable.
            pool.run(&[Op::Ping]).await.map_err(|error| error.to_string())?;
            return Ok(Connection::Cluster(Arc::new(pool)));
        }
        let url = self.config.url.as_deref().unwrap_or("redis://127.0.0.1:6379/0");
        let pool = RespPool::from_url(url, max_bulk).map_err(|error| error.to_string())?;
        // Connect (and log in) now, so that "up" means reachable.
        pool.run(&[Op::Ping]).await.map_err(|error| error.to_string())?;
        Ok(Connection::Single(Arc::new(pool)))
    }

    /// Drops the connection after an error; the next use reconnects.
    async fn failed(&self, reason: &str) {
        metrics::record_redis_error();
        let mut link = self.link.lock().await;
        link.connection = None;
        link.next_attempt = Instant::now() + link.backoff;
        link.backoff = (link.backoff * 2).min(MAX_BACKOFF);
        drop(link);
        self.mark_down(reason);
    }

    fn mark_down(&self, reason: &str) {
        let was_up = self.up.swap(false, Ordering::Relaxed);
        if was_up || !self.announced.swap(true, Ordering::Relaxed) {
            tracing::warn!(reason, "network tier down");
            // What the tier held is unknown until it is back: gateways forget it.
            (self.events)(KvEvent::Cleared { tier: Tier::Network });
        }
        metrics::record_tier_up(Tier::Network, false);
    }

    async fn delete(&self, hash: BlockHash) {
        if let Some(mut connection) = self.connection().await {
            let delete = vec![Op::Del(self.key(&hash))];
            let _ = tokio::time::timeout(self.config.timeout, connection.run_each(delete)).await;
        }
        (self.events)(KvEvent::Removed { tier: Tier::Network, hashes: vec![hash] });
    }

    fn record_read(&self, bytes_per_second: f64) {
        const ALPHA: f64 = 0.2;
        let old = f64::from_bits(self.read_bandwidth.load(Ordering::Relaxed));
        let new = if old == 0.0 { bytes_per_second } else { old + ALPHA * (bytes_per_second - old) };
        self.read_bandwidth.store(new.to_bits(), Ordering::Relaxed);
    }
}

/// Keeps the tier's up/down state true without traffic: reconnects (with
/// backoff) while down, pings while up. Ends when the tier is dropped.
async fn probe_loop(shared: std::sync::Weak<Shared>) {
    const INTERVAL: Duration = Duration::from_millis(500);
    loop {
        tokio::time::sleep(INTERVAL).await;
        let Some(shared) = shared.upgrade() else { return };
        let Some(mut connection) = shared.connection().await else { continue };
        match tokio::time::timeout(shared.config.timeout, connection.run_each(vec![Op::Ping])).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => shared.failed(&error.to_string()).await,
            Err(_) => shared.failed("ping timed out").await,
        }
    }
}

/// One writer: takes a batch off the shared queue, writes it in one pipelined round trip, repeats.
async fn write_loop(shared: Arc<Shared>, queue: Arc<Mutex<mpsc::Receiver<(BlockHash, BlockBytes)>>>) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    loop {
        {
            let mut queue = queue.lock().await;
            let Some(first) = queue.recv().await else { return };
            batch.push(first);
            while batch.len() < WRITE_BATCH {
                match queue.try_recv() {
                    Ok(item) => batch.push(item),
                    Err(_) => break,
                }
            }
        }
        let Some(mut connection) = shared.connection().await else {
            metrics::record_tier_drops(Tier::Network, batch.len());
            batch.clear();
            continue;
        };
        let mut bytes = 0usize;
        let sets: Vec<Op> = batch
            .iter()
            .map(|(hash, payload)| {
                let head = block_record::encode_header(&shared.fingerprint, shared.block_size, hash, payload);
                bytes += head.len() + payload.len();
                let ttl_seconds = shared.config.ttl.map(|ttl| ttl.as_secs().max(1));
                Op::Set { key: shared.key(hash), head, body: payload.clone(), ttl_seconds }
            })
            .collect();
        match tokio::time::timeout(shared.config.timeout * 4, connection.run_each(sets)).await {
            Ok(Ok(_)) => {
                let hashes: Vec<BlockHash> = batch.iter().map(|(hash, _)| *hash).collect();
                metrics::record_tier_write(Tier::Network, hashes.len(), bytes);
                (shared.events)(KvEvent::Stored { tier: Tier::Network, hashes });
            }
            Ok(Err(error)) => {
                metrics::record_tier_drops(Tier::Network, batch.len());
                shared.failed(&error.to_string()).await;
            }
            Err(_) => {
                metrics::record_tier_drops(Tier::Network, batch.len());
                shared.failed("write timed out").await;
            }
        }
        batch.clear();
        if let Some(writes) = shared.writes.upgrade() {
            metrics::record_tier_queue(Tier::Network, writes.max_capacity() - writes.capacity());
        }
    }
}
