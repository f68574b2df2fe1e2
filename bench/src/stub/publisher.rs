//! The stub's ZeroMQ PUB socket, as vLLM's `ZmqEventPublisher` serves it: ZMTP 3.0 over TCP with the NULL
//! mechanism, every subscriber sent every batch as `[topic, seq (8 bytes, big-endian), payload]` with an
//! empty topic. What subscribers send (their greeting, READY and subscriptions) is read and ignored: every
//! subscriber gets everything, as one subscribed to the empty topic would. A subscriber too slow to keep up
//! loses batches (its next batch's seq shows the gap), as with a real PUB's high-water mark; there is no
//! replay socket.

use std::sync::Arc;

use kvroute_node_agent::engine_events::zmtp::{message_bytes, peer_handshake};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

/// Batches a subscriber may fall behind by before it loses some.
const BACKLOG: usize = 1024;

/// The sending end; cheap to clone.
#[derive(Clone, Debug)]
pub struct Publisher {
    sender: broadcast::Sender<Arc<Vec<u8>>>,
}

impl Publisher {
    /// Serves subscribers on `listener` until the runtime stops.
    pub fn serve(listener: TcpListener) -> Publisher {
        let (sender, _) = broadcast::channel(BACKLOG);
        let publisher = Publisher { sender };
        let accepting = publisher.clone();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(subscriber(stream, accepting.sender.subscribe()));
                    }
                    Err(error) => {
                        // Out of descriptors, say: do not spin on the machine being measured.
                        tracing::warn!(%error, "accepting a KV-event subscriber");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        });
        publisher
    }

    /// Sends batch number `seq` to every subscriber connected now. Callers keep `seq` in order.
    pub fn publish(&self, seq: u64, payload: &[u8]) {
        let message = message_bytes(&[b"", &seq.to_be_bytes(), payload]);
        let _ = self.sender.send(Arc::new(message));
    }
}

async fn subscriber(stream: tokio::net::TcpStream, mut batches: broadcast::Receiver<Arc<Vec<u8>>>) {
    let (mut reader, mut writer) = stream.into_split();
    tokio::spawn(async move {
        let mut sink = [0u8; 4096];
        while matches!(reader.read(&mut sink).await, Ok(read) if read > 0) {}
    });
    if writer.write_all(&peer_handshake((3, 0), "PUB")).await.is_err() {
        return;
    }
    loop {
        match batches.recv().await {
            Ok(message) => {
                if writer.write_all(&message).await.is_err() {
                    return;
                }
            }
            Err(broadcast::error::RecvError::Lagged(lost)) => {
                tracing::warn!(lost, "a KV-event subscriber fell behind: batches lost");
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
