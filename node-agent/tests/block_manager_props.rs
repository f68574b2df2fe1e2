//! Property tests of the block manager's invariants under random operations:
//! ref counts never negative, capacity never exceeded, every block exactly one
//! of free / cached / in use, the hash map and the pool agree, and every
//! eviction is reported to the sink.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use kvroute_node_agent::block_manager::BlockManager;
use kvroute_proto::domain::KvEvent;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Place a prompt made of `family`'s shared stem plus `tail` private tokens.
    Place {
        family: u8,
        stem_blocks: u8,
        tail: u8,
        scope: u8,
        cache: bool,
    },
    /// Register computed tokens of the nth live sequence, growing it by `extra` generated tokens.
    Compute {
        nth: u8,
        extra: u8,
    },
    Release {
        nth: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4, 0u8..4, 0u8..9, 0u8..2, proptest::bool::weighted(0.8)).prop_map(
            |(family, stem_blocks, tail, scope, cache)| Op::Place { family, stem_blocks, tail, scope, cache }
        ),
        (any::<u8>(), 0u8..9).prop_map(|(nth, extra)| Op::Compute { nth, extra }),
        any::<u8>().prop_map(|nth| Op::Release { nth }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn invariants_hold_under_random_operations(ops in proptest::collection::vec(op(), 1..80), blocks in 2usize..24) {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let mut bm = BlockManager::new(blocks, 4, "m", Box::new(move |e| sink.lock().unwrap().push(e)));
        let mut live: Vec<(u64, Vec<u32>)> = Vec::new();
        let mut next_seq = 0u64;
        let mut evicted_total = 0usize;
        for op in ops {
            match op {
                Op::Place { family, stem_blocks, tail, scope, cache } => {
                    let mut tokens: Vec<u32> = (0..u32::from(stem_blocks) * 4).map(|i| u32::from(family) * 100 + i).collect();
                    tokens.extend((0..u32::from(tail)).map(|i| 10_000 + next_seq as u32 * 16 + i));
                    if tokens.is_empty() {
                        tokens.push(7);
                    }
                    let hasher = cache.then(|| bm.hasher(&[scope]));
                    let before = bm.num_available();
                    match bm.place(next_seq, &tokens, hasher) {
                        Ok(placement) => {
                            prop_assert!(placement.cached_tokens < tokens.len());
                            prop_assert_eq!(bm.block_table(next_seq).len(), tokens.len().div_ceil(4));
                            live.push((next_seq, tokens));
                        }
                        Err(_) => prop_assert_eq!(bm.num_available(), before, "a refused placement changed the pool"),
                    }
                    next_seq += 1;
                }
                Op::Compute { nth, extra } => {
                    if live.is_empty() { continue; }
                    let index = usize::from(nth) % live.len();
                    let (seq, tokens) = &mut live[index];
                    let want = tokens.len() + usize::from(extra);
                    if bm.grow(*seq, want).is_ok() {
                        for i in 0..extra {
                            tokens.push(50_000 + u32::from(i));
                        }
                    }
                    bm.register_computed(*seq, tokens);
                }
                Op::Release { nth } => {
                    if live.is_empty() { continue; }
                    let index = usize::from(nth) % live.len();
                    let (seq, _) = live.swap_remove(index);
                    bm.release(seq);
                }
            }
            evicted_total += bm.take_evicted().len();
            prop_assert!(bm.num_used() + bm.num_cached() <= bm.num_blocks());
            if let Err(violation) = bm.check_invariants() {
                return Err(TestCaseError::fail(violation));
            }
        }
        let events = events.lock().unwrap();
        let removed: usize = events.iter().map(|e| match e { KvEvent::Removed { hashes, .. } => hashes.len(), _ => 0 }).sum();
        let stored: usize = events.iter().map(|e| match e { KvEvent::Stored { hashes, .. } => hashes.len(), _ => 0 }).sum();
        prop_assert_eq!(removed, evicted_total, "every eviction is reported");
        prop_assert_eq!(stored - removed, bm.registered_hashes().len(), "events replay to the registered set");
    }
}
