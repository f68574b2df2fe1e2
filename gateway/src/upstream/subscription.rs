//! One replica's subscription loop: Info, then the event stream (snapshot,
//! deltas, heartbeats) into the index, resubscribing on any inconsistency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvroute_proto::domain::{AgentInfo, KvEventBatch};
use kvroute_proto::pb;

use super::{Pool, Replica};
use crate::metrics;

/// Why a subscription ended.
#[derive(Debug)]
enum Ended {
    /// Nothing arrived within the heartbeat timeout.
    Quiet,
    /// The stream closed or failed.
    Closed(String),
    /// A gap in seq, a new epoch, or a message that does not validate.
    Inconsistent(String),
    /// The replica does not match the gateway (model, block size).
    Refused(String),
}

impl Ended {
    fn reason(&self) -> &str {
        match self {
            Ended::Quiet => "no event or heartbeat within the timeout",
            Ended::Closed(reason) | Ended::Inconsistent(reason) | Ended::Refused(reason) => reason,
        }
    }
}

/// Runs until the task is aborted (replica removed or gateway stopping).
pub async fn run(pool: Arc<Pool>, replica: Arc<Replica>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let ended = subscribe_once(&pool, &replica).await;
        let was_healthy = replica.is_healthy();
        replica.update(|state| {
            state.healthy = false;
            state.resubscriptions += 1;
        });
        pool.writer.forget(replica.id).await;
        match &ended {
            Ended::Refused(reason) => {
                tracing::error!(agent = %replica.endpoint, reason, "refusing replica");
                metrics::record_replica_refused();
                replica.update(|state| state.refused = Some(reason.clone()));
            }
            other if was_healthy => {
                tracing::warn!(agent = %replica.endpoint, reason = other.reason(), "replica unhealthy; resubscribing");
                metrics::record_resubscription();
            }
            _ => {}
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(pool.config.max_backoff);
        if matches!(ended, Ended::Inconsistent(_) | Ended::Quiet) {
            backoff = Duration::from_millis(50);
        }
    }
}

async fn subscribe_once(pool: &Pool, replica: &Replica) -> Ended {
    let timeout = pool.config.heartbeat_timeout;
    let mut client = replica.client.clone();
    let info = match tokio::time::timeout(timeout, client.info(pb::InfoRequest {})).await {
        Ok(Ok(response)) => match AgentInfo::try_from(response.into_inner()) {
            Ok(info) => info,
            Err(error) => return Ended::Inconsistent(format!("invalid Info: {error}")),
        },
        Ok(Err(status)) => return Ended::Closed(format!("Info failed: {}", status.message())),
        Err(_) => return Ended::Quiet,
    };
    if let Err(reason) = pool.admit(&info) {
        return Ended::Refused(reason);
    }
    let request = pb::SubscribeKvEventsRequest { subscriber: "gateway".into() };
    let mut stream = match tokio::time::timeout(timeout, client.subscribe_kv_events(request)).await {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(status)) => return Ended::Closed(format!("subscribe failed: {}", status.message())),
        Err(_) => return Ended::Quiet,
    };
    let mut check = StreamCheck::new(info.epoch);
    replica.update(|state| {
        state.info = Some(info);
        state.refused = None;
    });
    loop {
        let message = match tokio::time::timeout(timeout, stream.message()).await {
            Err(_) => return Ended::Quiet,
            Ok(Err(status)) => return Ended::Closed(status.message().to_string()),
            Ok(Ok(None)) => return Ended::Closed("stream ended".into()),
            Ok(Ok(Some(message))) => message,
        };
        let batch = match check.accept(message) {
            Ok(batch) => batch,
            Err(reason) => return Ended::Inconsistent(reason),
        };
        metrics::record_event_lag(batch.sent_unix_micros);
        metrics::record_event_batch();
        let healthy = !batch.load.draining;
        let load = batch.load.clone();
        let snapshot = batch.snapshot;
        pool.writer.batch(replica.id, batch).await;
        if snapshot {
            // Routable only once the index holds what the replica holds.
            pool.writer.flush().await;
        }
        replica.update(|state| {
            state.healthy = healthy;
            state.load = load;
            state.last_seen = Some(Instant::now());
        });
    }
}

/// Checks the messages of one event stream in order: each must convert, keep the epoch the agent announced,
/// and carry the next sequence number, the first (and only the first) being the snapshot. Any failure ends
/// the subscription, and the resubscription's snapshot replaces the replica's state.
#[derive(Debug)]
pub struct StreamCheck {
    epoch: u64,
    expected_seq: u64,
}

impl StreamCheck {
    pub fn new(epoch: u64) -> StreamCheck {
        StreamCheck { epoch, expected_seq: 0 }
    }

    /// The batch of `message`, or why the stream is inconsistent.
    pub fn accept(&mut self, message: pb::KvEventBatch) -> Result<KvEventBatch, String> {
        let batch = KvEventBatch::try_from(message).map_err(|error| format!("invalid event batch: {error}"))?;
        if batch.epoch != self.epoch {
            return Err(format!("epoch changed from {} to {}", self.epoch, batch.epoch));
        }
        if batch.seq != self.expected_seq || batch.snapshot != (self.expected_seq == 0) {
            return Err(format!("expected seq {}, got {}", self.expected_seq, batch.seq));
        }
        self.expected_seq += 1;
        Ok(batch)
    }
}
