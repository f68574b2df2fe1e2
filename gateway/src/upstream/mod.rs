//! The replicas behind the gateway: one gRPC client and one event
//! subscription per node-agent, their health and load, and discovery.
//!
//! Each replica's subscription task queues its batches for the [`IndexWriter`], whose thread applies them
//! to an [`IndexSink`] (the prefix index and the load ledger): a snapshot replaces what was known of the
//! replica, deltas apply in order, and a gap in `seq`, a new epoch, an invalid message or a stream quiet
//! past the heartbeat timeout drops the replica's entries, marks it unhealthy and resubscribes. The agent
//! sends heartbeats from outside its engine loop, so a long step does not look like silence.
//!
//! A replica's id is the lowest one free when it is added, and is freed when it is removed (after the
//! removal of its entries is queued, so that nothing of the old replica is ever seen under the new one).

pub mod discovery;
pub mod index_writer;
pub mod subscription;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use kvroute_proto::DEFAULT_BLOCK_SIZE;
use kvroute_proto::domain::{AgentInfo, KvEventBatch, LoadStats};
use kvroute_proto::pb::agent_client::AgentClient;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

pub use crate::routing::ReplicaId;
pub use index_writer::IndexWriter;

/// Where replica events go (the prefix index and the load ledger); called from the writer thread only.
pub trait IndexSink: Send + Sync {
    /// Applies a batch of the replica's stream: a snapshot replaces everything known about it, deltas
    /// apply in order, and its load and request accounting replace the previous batch's.
    fn batch(&self, replica: ReplicaId, batch: &KvEventBatch);
    /// Forgets the replica (unhealthy or gone): its entries, its load, what policies remember of it.
    fn forget(&self, replica: ReplicaId);
}

/// What the gateway requires of every replica.
#[derive(Clone, Debug)]
pub struct Expectations {
    /// Served model id; None accepts the first replica's and then requires it.
    pub model_id: Option<String>,
    pub block_size: u32,
    /// The gateway tokenizer's vocabulary size: a replica's must not be smaller.
    pub vocab_size: u32,
    /// The gateway tokenizer's fingerprint: a replica that reports one must report the same.
    pub tokenizer_fingerprint: String,
}

/// Subscription settings.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// A stream quiet for this long marks the replica unhealthy.
    pub heartbeat_timeout: Duration,
    /// Replicas known at once at most (ids `0..max_replicas`: the prefix index's size).
    pub max_replicas: usize,
    pub connect_timeout: Duration,
    /// Longest wait between reconnection attempts.
    pub max_backoff: Duration,
    /// Reach agents over TLS, verified with this configuration (None: plain text).
    pub agent_tls: Option<ClientTlsConfig>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            heartbeat_timeout: Duration::from_millis(2_000),
            max_replicas: crate::routing::IndexConfig::default().max_replicas,
            connect_timeout: Duration::from_millis(1_000),
            max_backoff: Duration::from_secs(2),
            agent_tls: None,
        }
    }
}

/// A replica's state as the subscription task last saw it.
#[derive(Clone, Debug, Default)]
pub struct ReplicaState {
    pub healthy: bool,
    pub info: Option<AgentInfo>,
    pub load: LoadStats,
    pub last_seen: Option<Instant>,
    /// Why the replica was refused (mismatched model or block size).
    pub refused: Option<String>,
    pub resubscriptions: u64,
}

/// One replica.
pub struct Replica {
    pub id: ReplicaId,
    pub endpoint: String,
    pub client: AgentClient<Channel>,
    /// Requests sent to it (attempts included).
    pub routed: std::sync::atomic::AtomicU64,
    state: RwLock<ReplicaState>,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica").field("id", &self.id).field("endpoint", &self.endpoint).finish()
    }
}

impl Replica {
    pub fn state(&self) -> ReplicaState {
        self.state.read().map(|state| state.clone()).unwrap_or_default()
    }

    pub fn is_healthy(&self) -> bool {
        self.state.read().map(|state| state.healthy).unwrap_or(false)
    }

    fn update(&self, change: impl FnOnce(&mut ReplicaState)) {
        if let Ok(mut state) = self.state.write() {
            change(&mut state);
        }
    }
}

/// Replica ids in use; a freed id is given out again, lowest first.
#[derive(Debug)]
struct ReplicaIds {
    free: BTreeSet<ReplicaId>,
    next: usize,
    max: usize,
}

impl ReplicaIds {
    fn take(&mut self) -> Option<ReplicaId> {
        if let Some(id) = self.free.pop_first() {
            return Some(id);
        }
        let id = ReplicaId::try_from(self.next).ok().filter(|_| self.next < self.max)?;
        self.next += 1;
        Some(id)
    }

    fn give_back(&mut self, id: ReplicaId) {
        self.free.insert(id);
    }
}

/// Every known replica; cheap to share.
pub struct Pool {
    replicas: RwLock<HashMap<String, Arc<Replica>>>,
    ids: Mutex<ReplicaIds>,
    writer: IndexWriter,
    expectations: RwLock<Expectations>,
    config: PoolConfig,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("replicas", &self.replicas().len()).finish()
    }
}

impl Pool {
    /// A pool whose replicas' batches are written to `sink` by a writer thread of its own.
    pub fn new(sink: Arc<dyn IndexSink>, expectations: Expectations, config: PoolConfig) -> std::io::Result<Arc<Pool>> {
        let ids = ReplicaIds { free: BTreeSet::new(), next: 0, max: config.max_replicas };
        Ok(Arc::new(Pool {
            replicas: RwLock::new(HashMap::new()),
            ids: Mutex::new(ids),
            writer: IndexWriter::spawn(sink)?,
            expectations: RwLock::new(expectations),
            config,
        }))
    }

    /// The writer of the routing state (to wait for it to catch up: [`IndexWriter::flush`]).
    pub fn writer(&self) -> &IndexWriter {
        &self.writer
    }

    /// Adds a replica at `host:port` and starts its subscription (idempotent).
    pub fn add(self: &Arc<Pool>, endpoint: &str) -> Result<ReplicaId, String> {
        if let Some(existing) = self.replicas.read().ok().and_then(|r| r.get(endpoint).map(|r| r.id)) {
            return Ok(existing);
        }
        let scheme = if self.config.agent_tls.is_some() { "https" } else { "http" };
        let uri = if endpoint.contains("://") { endpoint.to_string() } else { format!("{scheme}://{endpoint}") };
        let mut channel =
            Endpoint::from_shared(uri).map_err(|error| format!("bad agent address {endpoint:?}: {error}"))?;
        if let Some(tls) = &self.config.agent_tls {
            channel = channel.tls_config(tls.clone()).map_err(|error| format!("TLS to {endpoint}: {error}"))?;
        }
        let channel = channel
            .connect_timeout(self.config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_while_idle(true)
            .connect_lazy();
        let Ok(mut replicas) = self.replicas.write() else { return Err("internal lock poisoned".into()) };
        if let Some(existing) = replicas.get(endpoint) {
            return Ok(existing.id);
        }
        let id = self.ids.lock().ok().and_then(|mut ids| ids.take()).ok_or_else(|| {
            format!("the gateway already tracks {} replicas, its most (--index-max-replicas)", self.config.max_replicas)
        })?;
        let replica = Arc::new(Replica {
            id,
            endpoint: endpoint.to_string(),
            client: AgentClient::new(channel).max_decoding_message_size(64 << 20),
            routed: std::sync::atomic::AtomicU64::new(0),
            state: RwLock::new(ReplicaState::default()),
            task: std::sync::Mutex::new(None),
        });
        let task = tokio::spawn(subscription::run(self.clone(), replica.clone()));
        if let Ok(mut slot) = replica.task.lock() {
            *slot = Some(task);
        }
        replicas.insert(endpoint.to_string(), replica);
        Ok(id)
    }

    /// Removes a replica (no longer discovered): stops its task, forgets what it reported, frees its id.
    pub async fn remove(&self, endpoint: &str) {
        let removed = self.replicas.write().ok().and_then(|mut replicas| replicas.remove(endpoint));
        let Some(replica) = removed else { return };
        let task = replica.task.lock().ok().and_then(|mut task| task.take());
        if let Some(task) = task {
            task.abort();
            // Wait until it has really stopped: a task being polled as it is aborted may still queue a batch.
            let _ = task.await;
        }
        // The task is gone: nothing of this replica is queued after its removal, so the id is free.
        self.writer.forget(replica.id).await;
        if let Ok(mut ids) = self.ids.lock() {
            ids.give_back(replica.id);
        }
    }

    /// Every replica, in id order.
    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        let mut all: Vec<Arc<Replica>> =
            self.replicas.read().map(|replicas| replicas.values().cloned().collect()).unwrap_or_default();
        all.sort_by_key(|replica| replica.id);
        all
    }

    pub fn get(&self, id: ReplicaId) -> Option<Arc<Replica>> {
        self.replicas().into_iter().find(|replica| replica.id == id)
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.replicas.read().map(|replicas| replicas.keys().cloned().collect()).unwrap_or_default()
    }

    /// Replicas currently healthy.
    pub fn healthy_count(&self) -> usize {
        self.replicas().iter().filter(|replica| replica.is_healthy()).count()
    }

    /// The served model id, once known.
    pub fn model_id(&self) -> Option<String> {
        self.expectations.read().ok().and_then(|e| e.model_id.clone())
    }

    pub fn block_size(&self) -> u32 {
        self.expectations.read().map(|e| e.block_size).unwrap_or(DEFAULT_BLOCK_SIZE)
    }

    /// Stops every subscription task.
    pub fn shutdown(&self) {
        for replica in self.replicas() {
            if let Ok(mut task) = replica.task.lock()
                && let Some(task) = task.take()
            {
                task.abort();
            }
        }
    }

    /// Checks a replica's Info against the expectations; fixes the model id
    /// from the first replica when it was not configured.
    fn admit(&self, info: &AgentInfo) -> Result<(), String> {
        let Ok(mut expected) = self.expectations.write() else { return Err("internal lock poisoned".into()) };
        if info.block_size != expected.block_size {
            return Err(format!("block size {} differs from the gateway's {}", info.block_size, expected.block_size));
        }
        if !info.tokenizer_fingerprint.is_empty() && info.tokenizer_fingerprint != expected.tokenizer_fingerprint {
            return Err(format!(
                "its model's tokenizer (fingerprint {}) is not the gateway's ({}): the same text would hash to \
                 different blocks",
                info.tokenizer_fingerprint, expected.tokenizer_fingerprint
            ));
        }
        if info.vocab_size < expected.vocab_size {
            return Err(format!(
                "vocabulary of {} tokens is smaller than the gateway tokenizer's {}",
                info.vocab_size, expected.vocab_size
            ));
        }
        match &expected.model_id {
            Some(model) if *model != info.model_id => {
                Err(format!("serves model {:?}, the gateway serves {model:?}", info.model_id))
            }
            Some(_) => Ok(()),
            None => {
                expected.model_id = Some(info.model_id.clone());
                Ok(())
            }
        }
    }
}
