//! The engine-event path against real ZeroMQ: pyzmq (libzmq 4.3) plays a vLLM 0.32 engine's PUB and
//! replay ROUTER sockets (`zmq_engine_peer.py`), and the agent's ZMTP codec subscribes, notices the
//! batches it missed, fetches them from the replay socket, answers libzmq's heartbeats, and translates
//! every payload (fixtures encoded by vLLM's own structs) into kvroute events.
//!
//! Needs pyzmq: `KVROUTE_PYZMQ_PYTHON` (scripts/test.sh sets it) or `scripts/pyzmq-python.sh`. When
//! neither gives one the test says so on stderr and passes without running: it needs PyPI once.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use kvroute_node_agent::engine_events::frames::{self, ReplayReply};
use kvroute_node_agent::engine_events::socket::{SocketOptions, ZmtpSocket};
use kvroute_node_agent::engine_events::zmtp::SocketType;
use kvroute_node_agent::engine_events::{Source, Step, Translator, TranslatorConfig, decode_batch};
use kvroute_proto::domain::{KvEvent, Tier};
use kvroute_proto::{BlockHasher, DEFAULT_BLOCK_SIZE};
use kvroute_test_support::{ChildProcess, free_port, repo_root};

fn fixture(name: &str) -> PathBuf {
    repo_root().join("node-agent/tests/fixtures/engine_events").join(name)
}

/// The next message within `timeout`.
fn next(socket: &mut ZmtpSocket, timeout: Duration) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(message) = socket.recv().expect("the connection stays up") {
            return message;
        }
        assert!(Instant::now() < deadline, "no message within {timeout:?}");
    }
}

#[test]
fn subscriber_and_replay_client_against_libzmq() {
    let python = kvroute_test_support::pyzmq_python();
    let (pub_port, router_port) = (free_port(), free_port());
    let stored = fixture("vllm_0_32_stored.msgpack");
    let mut peer = ChildProcess::spawn(
        "zmq-engine-peer",
        Command::new(python)
            .arg(repo_root().join("node-agent/tests/processes/zmq_engine_peer.py"))
            .args([pub_port.to_string(), router_port.to_string(), "kv".into()])
            .arg(&stored)
            .arg(&stored)
            .arg(fixture("vllm_0_32_mixed.msgpack")),
    )
    .unwrap();
    let pub_address = format!("127.0.0.1:{pub_port}");
    let router_address = format!("127.0.0.1:{router_port}");
    peer.wait_for_tcp(pub_address.parse().unwrap(), Duration::from_secs(20)).unwrap();
    peer.wait_for_tcp(router_address.parse().unwrap(), Duration::from_secs(20)).unwrap();

    let mut translator = Translator::new(TranslatorConfig::new("m", 16)).unwrap();
    translator.register_scope(b"t:acme");
    let tokens: Vec<u32> = (1000..1048).collect();
    let salted = BlockHasher::new(DEFAULT_BLOCK_SIZE, "m", b"t:acme").hashes(&tokens);
    let global = BlockHasher::new(DEFAULT_BLOCK_SIZE, "m", b"").hashes(&tokens[..DEFAULT_BLOCK_SIZE as usize]);

    // Subscribed after batches 0 and 1 went out: the first live one (2) shows the gap.
    let options = SocketOptions { read_timeout: Duration::from_millis(100), ..SocketOptions::default() };
    let mut sub = ZmtpSocket::connect(&pub_address, SocketType::Sub, options).unwrap();
    assert_eq!(sub.peer_socket_type(), Some("PUB"));
    sub.subscribe(b"kv").unwrap();
    let message = next(&mut sub, Duration::from_secs(10));
    let live = frames::published(&message).unwrap();
    assert_eq!((live.topic, live.seq), (&b"kv"[..], 2));
    let live_batch = decode_batch(live.payload).unwrap();
    assert_eq!(translator.apply(live.seq, &live_batch, Source::Live), Step::Gap { missing: 0..2 });

    // The replay socket sends what was missed.
    let mut dealer = ZmtpSocket::connect(&router_address, SocketType::Dealer, options).unwrap();
    assert_eq!(dealer.peer_socket_type(), Some("ROUTER"));
    let request = frames::replay_request(0);
    dealer.send(&[&request[0], &request[1]]).unwrap();
    let mut replayed = Vec::new();
    loop {
        let message = next(&mut dealer, Duration::from_secs(10));
        match frames::replay_reply(&message).unwrap() {
            ReplayReply::End => break,
            ReplayReply::Batch(batch) => {
                assert_eq!(batch.topic, b"kv");
                let decoded = decode_batch(batch.payload).unwrap();
                replayed.push(translator.apply(batch.seq, &decoded, Source::Replay));
            }
        }
    }
    assert_eq!(
        replayed,
        vec![
            Step::Events(vec![KvEvent::Stored { tier: Tier::Gpu, hashes: salted.clone() }]),
            Step::Events(vec![
                KvEvent::Stored { tier: Tier::Host, hashes: global },
                KvEvent::Removed { tier: Tier::Gpu, hashes: vec![salted[2]] },
                KvEvent::Cleared { tier: Tier::Gpu },
                KvEvent::Cleared { tier: Tier::Host },
                KvEvent::Cleared { tier: Tier::Network },
            ]),
        ]
    );
    assert_eq!(translator.counters().other_group_events, 1, "the sliding-window group's store");
    // Then the live batch, now in order.
    assert_eq!(
        translator.apply(live.seq, &live_batch, Source::Live),
        Step::Events(vec![KvEvent::Stored { tier: Tier::Gpu, hashes: salted.clone() }])
    );

    // The PUB repeats batch 2 and sends heartbeats: the connection outlives libzmq's heartbeat timeout.
    let until = Instant::now() + Duration::from_millis(1500);
    let mut repeats = 0;
    while Instant::now() < until {
        if let Some(message) = sub.recv().expect("libzmq keeps the subscriber") {
            let again = frames::published(&message).unwrap();
            let decoded = decode_batch(again.payload).unwrap();
            assert_eq!(translator.apply(again.seq, &decoded, Source::Live), Step::Duplicate);
            repeats += 1;
        }
    }
    assert!(repeats >= 5, "only {repeats} repeats in 1.5 s");
    assert!(sub.pings_answered() > 0, "libzmq's heartbeats reached the subscriber");
    assert_eq!(translator.snapshot(), vec![KvEvent::Stored { tier: Tier::Gpu, hashes: salted }]);

    dealer.send(&[b"", b"stop"]).unwrap();
    assert_eq!(peer.wait_exit(Duration::from_secs(10)), Some(0), "{}", peer.log_tail());
}
