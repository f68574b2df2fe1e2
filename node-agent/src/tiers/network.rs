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

use kvroute_proto::block_hash::BlockHash;
use kvroute_proto::block_record::{self, Expected, ModelFingerprint};
use kvroute_proto::domain::{KvEvent, Tier};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use tokio::sync::{Mutex, mpsc};

use super::host::BlockBytes;
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
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Connection {
    /// Runs commands on keys of any slot, replies in order: one pipeline on a standalone server; on a
    /// cluster the keys live on different nodes, so every command goes to its node, all in flight at once.
    async fn run_each<T: redis::FromRedisValue>(&mut self, commands: &[redis::Cmd]) -> redis::RedisResult<Vec<T>> {
        match self {
            Connection::Single(conn) => {
                let mut pipe = redis::pipe();
                for command in commands {
                    pipe.add_command(command.clone());
                }
                pipe.query_async(conn).await
            }
            Connection::Cluster(conn) => {
                let replies = commands.iter().map(|command| {
                    let mut conn = conn.clone();
                    async move { command.query_async::<T>(&mut conn).await }
                });
                futures::future::try_join_all(replies).await
            }
        }
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
/// Blocks fetched per pipelined round trip.
const FETCH_WINDOW: usize = 16;
/// Blocks written per pipelined round trip.
const WRITE_BATCH: usize = 64;

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
            events,
        });
        tokio::spawn(write_loop(shared.clone(), queue));
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
        for window in hashes.chunks(FETCH_WINDOW) {
            let Some(mut connection) = shared.connection().await else { break };
            let gets: Vec<redis::Cmd> = window.iter().map(|hash| redis::Cmd::get(shared.key(hash))).collect();
            let reply =
                tokio::time::timeout(shared.config.timeout, connection.run_each::<Option<Vec<u8>>>(&gets)).await;
            let values = match reply {
                Ok(Ok(values)) => values,
                Ok(Err(error)) => {
                    shared.failed(&error.to_string()).await;
                    break;
                }
                Err(_) => {
                    shared.failed("read timed out").await;
                    break;
                }
            };
            let mut complete = true;
            for (hash, value) in window.iter().zip(values) {
                let Some(record) = value else {
                    complete = false;
                    break;
                };
                let expected = Expected {
                    fingerprint: &shared.fingerprint,
                    block_size: shared.block_size,
                    hash,
                    payload_len: shared.payload_len,
                };
                match block_record::decode(&record, &expected) {
                    Ok(payload) => out.push(Arc::new(payload.to_vec())),
                    Err(error) => {
                        tracing::warn!(block = %hash, %error, "discarding a network-tier record that does not verify");
                        metrics::record_tier_corrupt(Tier::Network);
                        shared.delete(*hash).await;
                        complete = false;
                        break;
                    }
                }
            }
            if !complete {
                break;
            }
        }
        if !out.is_empty() {
            let bytes: usize = out.iter().map(|b| b.len()).sum();
            let seconds = started.elapsed().as_secs_f64().max(1e-6);
            shared.record_read(bytes as f64 / seconds);
            metrics::record_tier_reload(Tier::Network, out.len(), bytes, seconds);
        }
        out
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

    async fn connect(&self) -> redis::RedisResult<Connection> {
        if !self.config.cluster_nodes.is_empty() {
            let client = redis::cluster::ClusterClient::new(self.config.cluster_nodes.clone())?;
            return Ok(Connection::Cluster(client.get_async_connection().await?));
        }
        let url = self.config.url.as_deref().unwrap_or("redis://127.0.0.1:6379/0");
        let client = redis::Client::open(url)?;
        Ok(Connection::Single(client.get_multiplexed_async_connection().await?))
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
            let delete = [redis::Cmd::del(self.key(&hash))];
            let _ = tokio::time::timeout(self.config.timeout, connection.run_each::<redis::Value>(&delete)).await;
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
        let ping = [redis::cmd("PING")];
        match tokio::time::timeout(shared.config.timeout, connection.run_each::<String>(&ping)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => shared.failed(&error.to_string()).await,
            Err(_) => shared.failed("ping timed out").await,
        }
    }
}

async fn write_loop(shared: Arc<Shared>, mut queue: mpsc::Receiver<(BlockHash, BlockBytes)>) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while let Some(first) = queue.recv().await {
        batch.push(first);
        while batch.len() < WRITE_BATCH {
            match queue.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let Some(mut connection) = shared.connection().await else {
            metrics::record_tier_drops(Tier::Network, batch.len());
            batch.clear();
            continue;
        };
        let started = Instant::now();
        let mut bytes = 0usize;
        let sets: Vec<redis::Cmd> = batch
            .iter()
            .map(|(hash, payload)| {
                let record = block_record::encode(&shared.fingerprint, shared.block_size, hash, payload);
                bytes += record.len();
                match shared.config.ttl {
                    Some(ttl) => redis::Cmd::set_ex(shared.key(hash), record, ttl.as_secs().max(1)),
                    None => redis::Cmd::set(shared.key(hash), record),
                }
            })
            .collect();
        match tokio::time::timeout(shared.config.timeout * 4, connection.run_each::<redis::Value>(&sets)).await {
            Ok(Ok(_)) => {
                let hashes: Vec<BlockHash> = batch.iter().map(|(hash, _)| *hash).collect();
                metrics::record_tier_write(Tier::Network, hashes.len(), bytes, started.elapsed().as_secs_f64());
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
        metrics::record_tier_queue(Tier::Network, queue.len());
    }
}
