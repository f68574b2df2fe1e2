//! Tests over bytes a real SGLang 0.5.23 server sent (`node-agent/tests/fixtures/sglang/`, see its README):
//! every published message of a server's life, in order, through the frame reader, the decoder and the
//! translator, in SGLang's default event format and in its `dynamo` format (both carry the cache salt);
//! evictions; its replay answers.

use std::collections::BTreeSet;
use std::path::PathBuf;

use kvroute_proto::block_hash::{BlockHash, BlockHasher};
use kvroute_proto::domain::{KvEvent, Tier};
use serde_json::Value;

use super::captured::stored_tokens;
use super::decode::decode_batch;
use super::frames::{self, ReplayReply};
use super::translate::{Counters, Source, Step, Translator, TranslatorConfig};

const MODEL: &str = "SmolLM2-135M-Instruct";

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sglang").join(name)
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// The messages of a `.jsonl` capture: one `{"frames": [hex, ...]}` a line.
fn messages(name: &str) -> Vec<Vec<Vec<u8>>> {
    let text = std::fs::read_to_string(path(name)).unwrap_or_else(|error| panic!("{name}: {error}"));
    text.lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).unwrap();
            value["frames"].as_array().unwrap().iter().map(|frame| hex(frame.as_str().unwrap())).collect()
        })
        .collect()
}

fn prompt(name: &str) -> Vec<u32> {
    let prompts: Value = serde_json::from_slice(&std::fs::read(path("prompts.json")).unwrap()).unwrap();
    prompts[name].as_array().unwrap().iter().map(|id| id.as_u64().unwrap() as u32).collect()
}

fn translator() -> Translator {
    // sglang-serve.sh runs the engine with 16-token pages.
    let mut translator = Translator::new(TranslatorConfig::new(MODEL, 16)).unwrap();
    translator.register_salt("alpha", b"t:alpha");
    translator.register_salt("beta", b"t:beta");
    translator
}

/// Applies every message of a capture in order, checking that removals only remove held blocks; returns
/// each message's kvroute events, what is held at the end, and the counters.
fn translate(name: &str, translator: &mut Translator) -> (Vec<Vec<KvEvent>>, BTreeSet<BlockHash>, Counters) {
    let mut held = BTreeSet::new();
    let mut outputs = Vec::new();
    for (index, message) in messages(name).iter().enumerate() {
        let published = frames::published(message).unwrap();
        assert_eq!((published.topic, published.seq), (&b""[..], index as u64), "{name} #{index}");
        let batch = decode_batch(published.payload).unwrap_or_else(|error| panic!("{name} #{index}: {error}"));
        assert_eq!(batch.unknown_events, 0, "{name} #{index}");
        let Step::Events(events) = translator.apply(published.seq, &batch, Source::Live) else {
            panic!("{name} #{index}: not applied")
        };
        for event in &events {
            match event {
                KvEvent::Stored { tier, hashes } => {
                    assert_eq!(*tier, Tier::Gpu);
                    held.extend(hashes);
                }
                KvEvent::Removed { hashes, .. } => {
                    hashes.iter().for_each(|hash| assert!(held.remove(hash), "{name} #{index}: not held"))
                }
                KvEvent::Cleared { .. } => held.clear(),
            }
        }
        outputs.push(events);
    }
    (outputs, held, translator.counters())
}

fn stored(events: &[KvEvent]) -> Vec<BlockHash> {
    events
        .iter()
        .flat_map(|event| match event {
            KvEvent::Stored { hashes, .. } => hashes.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn a_whole_sglang_event_stream_translates() {
    let mut translator = translator();
    let (outputs, held, counters) = translate("events.jsonl", &mut translator);
    assert_eq!(counters.batches_applied, 11);
    assert_eq!(counters.unknown_parent_blocks + counters.unknown_removed_blocks + counters.malformed_stores, 0);
    assert_eq!(counters.restarts, 0, "the AllBlocksCleared SGLang sends at start is no restart");
    // 0: SGLang's start clears; 1: p1's 18 full pages of its prompt, 16 tokens each, are kvroute's blocks.
    assert_eq!(outputs[0], Tier::ALL.map(|tier| KvEvent::Cleared { tier }).to_vec());
    let p1 = BlockHasher::new(16, MODEL, b"").hashes(&prompt("p1"));
    assert_eq!(p1.len(), 18);
    assert_eq!(outputs[1], vec![KvEvent::Stored { tier: Tier::Gpu, hashes: p1.clone() }]);
    // Then, when p1 finishes, the page its output completed; p_long branches off p1's 18th page.
    assert_eq!(stored(&outputs[2]).len(), 1);
    let p_long = BlockHasher::new(16, MODEL, b"").hashes(&prompt("p_long"));
    assert_eq!(stored(&outputs[3]), p_long[18..].to_vec());
    // 4, 5, 6: p2 with the salt "alpha", with "beta", without one: each in its own scope, from the event's
    // cache_salt.
    let stream = messages("events.jsonl");
    let tokens = stored_tokens(frames::published(&stream[4]).unwrap().payload);
    assert_eq!(tokens.len(), 96);
    for (message, scope) in [(4, &b"t:alpha"[..]), (5, b"t:beta"), (6, b"")] {
        assert_eq!(stored(&outputs[message]), BlockHasher::new(16, MODEL, scope).hashes(&tokens), "#{message}");
    }
    assert!(held.is_superset(&p1.iter().copied().collect()), "after the flush, p1 again");
}

#[test]
fn the_dynamo_format_puts_salted_chains_in_their_scope() {
    let mut translator = translator();
    let (outputs, held, counters) = translate("events-dynamo-format.jsonl", &mut translator);
    assert_eq!((counters.unknown_salt_roots, counters.unknown_parent_blocks), (0, 0));
    let p2 = prompt("p2");
    let alpha = BlockHasher::new(16, MODEL, b"t:alpha").hashes(&p2);
    let global = BlockHasher::new(16, MODEL, b"").hashes(&p2);
    assert_eq!(alpha.len(), 6);
    assert_eq!(outputs[1], vec![KvEvent::Stored { tier: Tier::Gpu, hashes: alpha.clone() }]);
    assert_eq!(outputs[2], vec![KvEvent::Stored { tier: Tier::Gpu, hashes: global.clone() }]);
    assert_eq!(held, alpha.iter().chain(&global).copied().collect());
}

#[test]
fn sglang_evictions_remove_exactly_what_was_stored() {
    let mut translator = translator();
    let (outputs, held, counters) = translate("events-evictions.jsonl", &mut translator);
    assert_eq!(counters.unknown_removed_blocks + counters.unknown_parent_blocks, 0);
    let removed: usize = outputs
        .iter()
        .flatten()
        .map(|event| match event {
            KvEvent::Removed { hashes, .. } => hashes.len(),
            _ => 0,
        })
        .sum();
    assert!(removed > 0, "the 2048-token cache evicted");
    // What the translator tracks is what the events left: 128 pages at most.
    assert_eq!(translator.tracked_blocks(), held.len());
    assert!(held.len() <= 128, "{}", held.len());
}

#[test]
fn sglang_replay_answers_carry_the_published_payloads() {
    let live = messages("events.jsonl");
    for (name, from) in [("replay-from-0.jsonl", 0u64), ("replay-from-5.jsonl", 5)] {
        let replies = messages(name);
        let (end, batches) = replies.split_last().unwrap();
        assert_eq!(frames::replay_reply(end).unwrap(), ReplayReply::End, "{name}");
        for (offset, reply) in batches.iter().enumerate() {
            let ReplayReply::Batch(batch) = frames::replay_reply(reply).unwrap() else { panic!("{name}") };
            assert_eq!(batch.seq, from + offset as u64, "{name}");
            assert_eq!(batch.payload, frames::published(&live[batch.seq as usize]).unwrap().payload, "{name}");
        }
        assert_eq!(batches.len() as u64, live.len() as u64 - from, "{name}");
    }
    assert_eq!(frames::replay_reply(&messages("replay-from-100000.jsonl")[0]).unwrap(), ReplayReply::End);
}
