//! The replicas behind the gateway: one gRPC client and one event
//! subscription per node-agent, their health and load, and discovery.
//!
//! Each replica's subscription task feeds the prefix index through an
//! [`IndexSink`]: a snapshot replaces what the index knew of the replica,
//! deltas apply in order, and a gap in `seq`, a new epoch, an invalid message
//! or a stream quiet past the heartbeat timeout drops the replica's entries,
//! marks it unhealthy and resubscribes.

pub mod discovery;
pub mod subscription;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use kvroute_proto::domain::{AgentInfo, KvEvent, LoadStats};
use kvroute_proto::pb::agent_client::AgentClient;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

pub use crate::routing::ReplicaId;

/// Where replica events go (the prefix index).
pub trait IndexSink: Send + Sync {
    /// Replaces everything known about the replica with a snapshot.
    fn snapshot(&self, replica: ReplicaId, events: &[KvEvent]);
    /// Applies deltas in order.
    fn apply(&self, replica: ReplicaId, events: &[KvEvent]);
    /// The replica's latest load (with every batch, heartbeats included).
    fn load(&self, replica: ReplicaId, load: &LoadStats);
    /// Forgets the replica's entries (unhealthy or gone).
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
    /// Requests this gateway sent since the replica's last event batch, and their prompt tokens not
    /// expected from a cache: load the batch does not show yet (reset by each batch).
    pub sent_since_batch: u32,
    pub sent_tokens_since_batch: u64,
}

/// One replica.
pub struct Replica {
    pub id: ReplicaId,
    pub endpoint: String,
    pub client: AgentClient<Channel>,
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

    /// Records a request sent to this replica (see [`ReplicaState::sent_since_batch`]).
    pub fn note_sent(&self, uncached_tokens: u64) {
        self.update(|state| {
            state.sent_since_batch = state.sent_since_batch.saturating_add(1);
            state.sent_tokens_since_batch = state.sent_tokens_since_batch.saturating_add(uncached_tokens);
        });
    }

    fn update(&self, change: impl FnOnce(&mut ReplicaState)) {
        if let Ok(mut state) = self.state.write() {
            change(&mut state);
        }
    }
}

/// Every known replica; cheap to share.
pub struct Pool {
    replicas: RwLock<HashMap<String, Arc<Replica>>>,
    next_id: std::sync::atomic::AtomicU16,
    sink: Arc<dyn IndexSink>,
    expectations: RwLock<Expectations>,
    config: PoolConfig,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("replicas", &self.replicas().len()).finish()
    }
}

impl Pool {
    pub fn new(sink: Arc<dyn IndexSink>, expectations: Expectations, config: PoolConfig) -> Arc<Pool> {
        Arc::new(Pool {
            replicas: RwLock::new(HashMap::new()),
            next_id: std::sync::atomic::AtomicU16::new(0),
            sink,
            expectations: RwLock::new(expectations),
            config,
        })
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
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let replica = Arc::new(Replica {
            id,
            endpoint: endpoint.to_string(),
            client: AgentClient::new(channel).max_decoding_message_size(64 << 20),
            state: RwLock::new(ReplicaState::default()),
            task: std::sync::Mutex::new(None),
        });
        let task = tokio::spawn(subscription::run(self.clone(), replica.clone()));
        if let Ok(mut slot) = replica.task.lock() {
            *slot = Some(task);
        }
        if let Ok(mut replicas) = self.replicas.write() {
            replicas.insert(endpoint.to_string(), replica);
        }
        Ok(id)
    }

    /// Removes a replica (no longer discovered): stops its task, forgets its entries.
    pub fn remove(&self, endpoint: &str) {
        let removed = self.replicas.write().ok().and_then(|mut replicas| replicas.remove(endpoint));
        if let Some(replica) = removed {
            if let Ok(mut task) = replica.task.lock()
                && let Some(task) = task.take()
            {
                task.abort();
            }
            self.sink.forget(replica.id);
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
        self.expectations.read().map(|e| e.block_size).unwrap_or(16)
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
