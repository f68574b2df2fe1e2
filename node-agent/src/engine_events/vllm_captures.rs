//! Tests over bytes a real vLLM 0.32.0 server sent (`node-agent/tests/fixtures/vllm/`, captured by its
//! `capture.py`; see its README there): every published message of one server's life, in order, through
//! the frame reader, the decoder and the translator; its replay answers; the 32-byte-hash variant.

use std::collections::BTreeSet;
use std::path::PathBuf;

use kvroute_proto::block_hash::{BlockHash, BlockHasher};
use kvroute_proto::domain::{KvEvent, Tier};

use super::captured::stored_tokens;
use super::decode::{EngineEvent, EngineKey, decode_batch};
use super::frames::{self, ReplayReply};
use super::translate::{Source, Step, Translator, TranslatorConfig};

const MODEL: &str = "SmolLM2-135M-Instruct";

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm").join(name)
}

/// A `.zmq` file: each frame a 4-byte big-endian length and its bytes.
fn message(path: &PathBuf) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let mut frames = Vec::new();
    let mut rest = bytes.as_slice();
    while !rest.is_empty() {
        let (len, tail) = rest.split_at(4);
        let len = u32::from_be_bytes(len.try_into().unwrap()) as usize;
        frames.push(tail[..len].to_vec());
        rest = &tail[len..];
    }
    frames
}

/// The `.zmq` files of a directory, by name.
fn messages(name: &str) -> Vec<(String, Vec<Vec<u8>>)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir(name))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "zmq"))
        .collect();
    paths.sort();
    paths.iter().map(|path| (path.file_stem().unwrap().to_string_lossy().into_owned(), message(path))).collect()
}

fn translator() -> Translator {
    // vllm-serve.sh runs the engine with 128-token blocks.
    let mut translator = Translator::new(TranslatorConfig::new(MODEL, 128)).unwrap();
    translator.register_salt("tenant-a", b"t:a");
    translator.register_salt("tenant-b", b"t:b");
    translator
}

#[test]
fn a_whole_vllm_event_stream_translates() {
    let stream = messages("events");
    assert_eq!(stream.len(), 15);
    let mut translator = translator();
    let mut held: [BTreeSet<BlockHash>; 3] = Default::default();
    let mut outputs = Vec::new();
    for (name, message) in &stream {
        let published = frames::published(message).unwrap();
        assert_eq!(published.topic, b"", "{name}");
        let batch = decode_batch(published.payload).unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!((batch.data_parallel_rank, batch.unknown_events), (Some(0), 0), "{name}");
        let Step::Events(events) = translator.apply(published.seq, &batch, Source::Live) else {
            panic!("{name}: seq {} out of order", published.seq)
        };
        for event in &events {
            match event {
                KvEvent::Stored { tier, hashes } => held[tier.index()].extend(hashes),
                KvEvent::Removed { tier, hashes } => hashes.iter().for_each(|hash| {
                    assert!(held[tier.index()].remove(hash), "{name}: removed a block not held");
                }),
                KvEvent::Cleared { tier } => held[tier.index()].clear(),
            }
        }
        outputs.push(events);
    }
    let counters = translator.counters();
    assert_eq!(counters.batches_applied, 15);
    assert_eq!(counters.unknown_parent_blocks + counters.unknown_removed_blocks + counters.malformed_stores, 0);
    assert_eq!(counters.unknown_salt_roots + counters.unindexable_blocks + counters.other_group_events, 0);

    // 01: prompt A's two 128-token blocks are 16 kvroute blocks of the global scope.
    let a = stored_tokens(frames::published(&stream[0].1).unwrap().payload);
    assert_eq!(a.len(), 256);
    let a_hashes = BlockHasher::new(16, MODEL, b"").hashes(&a);
    assert_eq!(outputs[0], vec![KvEvent::Stored { tier: Tier::Gpu, hashes: a_hashes.clone() }]);
    // 02: prompt B continues A's first block.
    let b: Vec<u32> =
        a[..128].iter().copied().chain(stored_tokens(frames::published(&stream[1].1).unwrap().payload)).collect();
    let b_hashes = BlockHasher::new(16, MODEL, b"").hashes(&b);
    assert_eq!(b_hashes[..8], a_hashes[..8]);
    assert_eq!(outputs[1], vec![KvEvent::Stored { tier: Tier::Gpu, hashes: b_hashes[8..].to_vec() }]);
    // 03, 04: the same prompts salted "tenant-a": the scope's own chains.
    let salted = BlockHasher::new(16, MODEL, b"t:a");
    assert_eq!(outputs[2], vec![KvEvent::Stored { tier: Tier::Gpu, hashes: salted.hashes(&a) }]);
    assert_eq!(outputs[3], vec![KvEvent::Stored { tier: Tier::Gpu, hashes: salted.hashes(&b)[8..].to_vec() }]);
    // 07 evicts 5 engine blocks (40 kvroute blocks) before storing 7; 08 clears everything.
    assert!(matches!(&outputs[6][0], KvEvent::Removed { tier: Tier::Gpu, hashes } if hashes.len() == 40));
    assert!(matches!(&outputs[6][1], KvEvent::Stored { tier: Tier::Gpu, hashes } if hashes.len() == 56));
    assert_eq!(outputs[7], Tier::ALL.map(|tier| KvEvent::Cleared { tier }).to_vec());
    // 09: salted "tenant-b".
    let c = stored_tokens(frames::published(&stream[8].1).unwrap().payload);
    let c_hashes = BlockHasher::new(16, MODEL, b"t:b").hashes(&c);
    assert_eq!(outputs[8], vec![KvEvent::Stored { tier: Tier::Gpu, hashes: c_hashes.clone() }]);

    // The snapshot is what the events left.
    let mut snapshot: [BTreeSet<BlockHash>; 3] = Default::default();
    for event in translator.snapshot() {
        let KvEvent::Stored { tier, hashes } = event else { panic!("a snapshot only stores") };
        snapshot[tier.index()].extend(hashes);
    }
    assert_eq!(snapshot, held);
    assert!(c_hashes.iter().all(|hash| held[Tier::Gpu.index()].contains(hash)));
    // 22 engine blocks stored after the clear (2 + 15 + 5), of 23 usable: none evicted.
    assert_eq!(translator.tracked_blocks(), 22);
}

#[test]
fn without_the_salt_registered_salted_chains_are_not_indexed() {
    let mut translator = Translator::new(TranslatorConfig::new(MODEL, 128)).unwrap();
    for (name, message) in messages("events").iter().take(4) {
        let published = frames::published(message).unwrap();
        let batch = decode_batch(published.payload).unwrap();
        let step = translator.apply(published.seq, &batch, Source::Live);
        if name.contains("salted") {
            assert_eq!(step, Step::Events(vec![]), "{name}");
        }
    }
    let counters = translator.counters();
    assert_eq!((counters.unknown_salt_roots, counters.unknown_parent_blocks), (1, 0));
}

#[test]
fn replay_answers_carry_the_published_payloads() {
    let stream = messages("events");
    let request = message(&dir("replay").join("from-seq.request.zmq"));
    assert_eq!(request, frames::replay_request(6), "the DEALER's request, as vLLM's client sent it");
    let mut seqs = Vec::new();
    for (name, reply) in messages("replay").iter().filter(|(name, _)| name.starts_with("from-seq.reply")) {
        match frames::replay_reply(reply).unwrap_or_else(|error| panic!("{name}: {error}")) {
            ReplayReply::Batch(batch) => {
                let live = frames::published(&stream[batch.seq as usize].1).unwrap();
                assert_eq!(batch.payload, live.payload, "{name}");
                seqs.push(batch.seq);
            }
            ReplayReply::End => seqs.push(u64::MAX),
        }
    }
    assert_eq!(seqs, vec![6, 7, u64::MAX]);
    let past_the_end = message(&dir("replay").join("past-the-end.reply-1.zmq"));
    assert_eq!(frames::replay_reply(&past_the_end), Ok(ReplayReply::End));
}

#[test]
fn whole_digest_hashes_give_the_same_kvroute_blocks() {
    let translate = |name: &str| {
        let mut translator = translator();
        let mut out = Vec::new();
        for (file, message) in messages(name) {
            let published = frames::published(&message).unwrap();
            let batch = decode_batch(published.payload).unwrap();
            if name == "events-sha256-cbor" {
                let EngineEvent::Stored(stored) = &batch.events[0] else { panic!("{file}") };
                assert!(
                    stored.block_hashes.iter().all(|key| matches!(key, EngineKey::Bytes(bytes) if bytes.len() == 32))
                );
            }
            // The captures of the second server start at seq 0 as well.
            let seq = out.len() as u64;
            let Step::Events(events) = translator.apply(seq, &batch, Source::Live) else { panic!("{file}") };
            out.push(events);
        }
        out
    };
    let bytes = translate("events-sha256-cbor");
    assert_eq!(bytes.len(), 3);
    assert_eq!(bytes, translate("events")[..3]);
}
