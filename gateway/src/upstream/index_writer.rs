//! The one thread that writes the routing state replicas report: event batches into the prefix index and
//! load ledger, and a replica's removal. Snapshots, `Cleared` events and removals scan the whole index
//! table (tens of milliseconds at a million entries); here they never hold up an async worker, and the
//! subscription tasks only queue their batches, in order, with back-pressure when the writer is behind.

use std::sync::Arc;

use kvroute_proto::domain::KvEventBatch;
use tokio::sync::{mpsc, oneshot};

use super::{IndexSink, ReplicaId};

/// Writes queued before a subscription task waits for the writer.
const WRITE_QUEUE: usize = 4096;

enum Write {
    Batch(ReplicaId, Box<KvEventBatch>),
    Forget(ReplicaId),
    /// Answered once every write queued before it was applied.
    Flush(oneshot::Sender<()>),
}

/// The queue in front of the writer thread; cheap to clone. The thread ends when every clone is dropped.
#[derive(Clone)]
pub struct IndexWriter {
    writes: mpsc::Sender<Write>,
}

impl std::fmt::Debug for IndexWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexWriter").finish()
    }
}

impl IndexWriter {
    /// Starts the writer thread in front of `sink`.
    pub fn spawn(sink: Arc<dyn IndexSink>) -> std::io::Result<IndexWriter> {
        let (writes, mut queue) = mpsc::channel(WRITE_QUEUE);
        std::thread::Builder::new().name("index-writer".into()).spawn(move || {
            while let Some(write) = queue.blocking_recv() {
                match write {
                    Write::Batch(replica, batch) => sink.batch(replica, &batch),
                    Write::Forget(replica) => sink.forget(replica),
                    Write::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        })?;
        Ok(IndexWriter { writes })
    }

    /// Queues a batch of `replica`'s stream (in stream order).
    pub async fn batch(&self, replica: ReplicaId, batch: KvEventBatch) {
        let _ = self.writes.send(Write::Batch(replica, Box::new(batch))).await;
    }

    /// Queues the removal of everything `replica` reported; writes queued after it see none of it.
    pub async fn forget(&self, replica: ReplicaId) {
        let _ = self.writes.send(Write::Forget(replica)).await;
    }

    /// Waits until every write queued so far is applied.
    pub async fn flush(&self) {
        let (done, applied) = oneshot::channel();
        if self.writes.send(Write::Flush(done)).await.is_ok() {
            let _ = applied.await;
        }
    }
}
