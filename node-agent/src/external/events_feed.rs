//! The engine's KV events into the agent's publisher, on a thread of its own: subscribe to the engine's
//! ZeroMQ publisher, translate each batch ([`Translator`]), and hand the kvroute events over.
//!
//! - A gap in the engine's sequence is filled from its replay socket. When the agent starts beside an
//!   engine that already runs, it first replays the engine's history: whatever the replay buffer still
//!   holds is applied, and the rest is given up (nothing was known yet). A gap later that the replay
//!   cannot fill ends the epoch: the replica's index is cleared and relearnt, never left wrong.
//! - An engine restart starts a new epoch the same way: seen in the engine's metrics (its server's start
//!   time changed), before the new engine's first event, or else in its sequence starting again.
//! - A lost connection is made again, once a second, for as long as the agent runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::publisher::fresh_epoch;
use crate::engine_events::frames::{self, ReplayReply};
use crate::engine_events::socket::{SocketOptions, ZmtpSocket};
use crate::engine_events::zmtp::SocketType;
use crate::engine_events::{EngineBatch, Source, Step, Translator, decode_batch};

use super::ExternalEngine;
use super::lock_order::{OrderedGuard, OrderedMutex};

/// Longest wait for the replay socket to send what it holds.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(5);

/// Between attempts to connect to the publisher.
const RECONNECT_INTERVAL: Duration = Duration::from_secs(1);

/// Starts the feed thread; it runs until the agent drains.
pub fn spawn(
    engine: ExternalEngine,
    translator: Arc<OrderedMutex<Translator>>,
    events: String,
    replay: Option<String>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("engine-events".into())
        .spawn(move || Feed { engine, translator, events, replay, started: None }.run())
}

struct Feed {
    engine: ExternalEngine,
    translator: Arc<OrderedMutex<Translator>>,
    events: String,
    replay: Option<String>,
    /// The engine start time the translator's state belongs to.
    started: Option<f64>,
}

impl Feed {
    fn translator(&self) -> OrderedGuard<'_, Translator> {
        self.translator.lock()
    }

    /// Starts a new epoch when the engine's start time changed since the translator's state was made.
    fn check_restart(&mut self) {
        let Some(now) = self.engine.engine_started() else { return };
        if self.started.is_some_and(|before| before != now) {
            tracing::warn!("the engine restarted: starting a new epoch");
            self.translator().reset();
            self.engine.new_epoch(fresh_epoch());
        }
        self.started = Some(now);
    }

    fn run(mut self) {
        let mut logged_down = false;
        while !self.engine.is_draining() {
            self.check_restart();
            let connected = ZmtpSocket::connect(&self.events, SocketType::Sub, SocketOptions::default());
            let mut socket = match connected.and_then(|mut socket| {
                // Knowing nothing yet (the agent started, or the engine restarted), learn what the engine
                // holds from its replay buffer first; a batch published before the subscription takes
                // effect shows as a gap, which the replay fills.
                if self.translator().last_seq().is_none() {
                    self.replay_from(0, u64::MAX);
                }
                socket.subscribe(b"").map(|()| socket)
            }) {
                Ok(socket) => socket,
                Err(error) => {
                    if !logged_down {
                        tracing::warn!(endpoint = %self.events, %error, "cannot subscribe to the engine's KV events; retrying");
                        logged_down = true;
                    }
                    std::thread::sleep(RECONNECT_INTERVAL);
                    continue;
                }
            };
            tracing::info!(endpoint = %self.events, "subscribed to the engine's KV events");
            logged_down = false;
            while !self.engine.is_draining() {
                self.check_restart();
                match socket.recv() {
                    Ok(None) => {}
                    Ok(Some(message)) => self.on_message(&message),
                    Err(error) => {
                        tracing::warn!(endpoint = %self.events, %error, "the engine's KV-event stream broke; reconnecting");
                        break;
                    }
                }
            }
        }
    }

    fn on_message(&mut self, message: &[Vec<u8>]) {
        // The engine may have restarted while this waited for the message: its first.
        self.check_restart();
        let published = match frames::published(message) {
            Ok(published) => published,
            Err(error) => {
                tracing::warn!(%error, "skipping a KV-event message of an unknown shape");
                return;
            }
        };
        match decode_batch(published.payload) {
            Ok(batch) => self.apply(published.seq, &batch),
            Err(error) => {
                // Not decodable now, not decodable from the replay either: go on after it.
                tracing::warn!(seq = published.seq, %error, "skipping a KV-event batch that does not decode");
                self.translator().skip_to(published.seq.saturating_add(1));
            }
        }
        let translator = self.translator();
        crate::metrics::record_engine_events(&translator.counters(), translator.parked_blocks());
    }

    /// Applies one live batch, repairing a gap before it and starting a new epoch on a restart.
    fn apply(&mut self, seq: u64, batch: &EngineBatch) {
        for _ in 0..3 {
            let step = {
                let mut translator = self.translator();
                match translator.apply(seq, batch, Source::Live) {
                    Step::Events(events) => {
                        // Published under the translator's lock, so events a request unparks stay in order.
                        if !events.is_empty() {
                            self.engine.publish(events);
                        }
                        return;
                    }
                    other => other,
                }
            };
            match step {
                Step::Events(_) | Step::Duplicate => return,
                Step::Restart => {
                    tracing::warn!(seq, "the engine restarted: starting a new epoch");
                    self.engine.new_epoch(fresh_epoch());
                    self.started = self.engine.engine_started();
                }
                Step::Gap { missing } => {
                    let knew_nothing = self.translator().last_seq().is_none();
                    let filled = self.replay_from(missing.start, seq);
                    if !filled {
                        if knew_nothing {
                            // The engine's history before the agent started: what is gone is gone.
                            self.translator().skip_to(seq);
                        } else {
                            tracing::warn!(
                                from = missing.start,
                                to = missing.end,
                                "KV-event batches lost and not replayed: clearing this replica's index to relearn it"
                            );
                            self.translator().reset();
                            self.engine.new_epoch(fresh_epoch());
                            self.translator().skip_to(seq);
                        }
                    }
                }
            }
        }
    }

    /// Asks the replay socket for every batch from `start` and applies those before `until`; true when
    /// the sequence then continues at `until`.
    fn replay_from(&self, start: u64, until: u64) -> bool {
        let Some(address) = &self.replay else { return false };
        let options = SocketOptions { read_timeout: Duration::from_millis(200), ..SocketOptions::default() };
        let mut socket = match ZmtpSocket::connect(address, SocketType::Dealer, options) {
            Ok(socket) => socket,
            Err(error) => {
                tracing::warn!(endpoint = %address, %error, "cannot reach the engine's KV-event replay socket");
                return false;
            }
        };
        let request = frames::replay_request(start);
        let frames: Vec<&[u8]> = request.iter().map(Vec::as_slice).collect();
        if socket.send(&frames).is_err() {
            return false;
        }
        let deadline = Instant::now() + REPLAY_TIMEOUT;
        while Instant::now() < deadline {
            let message = match socket.recv() {
                Ok(Some(message)) => message,
                Ok(None) => continue,
                Err(_) => break,
            };
            let batch = match frames::replay_reply(&message) {
                Ok(ReplayReply::End) => break,
                Ok(ReplayReply::Batch(batch)) => batch,
                Err(_) => break,
            };
            if batch.seq >= until {
                continue;
            }
            let decoded = match decode_batch(batch.payload) {
                Ok(decoded) => decoded,
                Err(_) => {
                    self.translator().skip_to(batch.seq.saturating_add(1));
                    continue;
                }
            };
            let mut translator = self.translator();
            if translator.last_seq().is_none() && batch.seq > start {
                // The replay buffer starts later than asked: at start-up, history before it is gone.
                translator.skip_to(batch.seq);
            }
            if let Step::Events(events) = translator.apply(batch.seq, &decoded, Source::Replay)
                && !events.is_empty()
            {
                self.engine.publish(events);
            }
        }
        let translator = self.translator();
        crate::metrics::record_engine_events(&translator.counters(), translator.parked_blocks());
        translator.last_seq().is_some_and(|last| last.saturating_add(1) == until)
    }
}
