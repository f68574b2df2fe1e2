//! Logits are bit-identical however a sequence is chunked, batched, cached, copied or reloaded.

// Helpers of these tests panic on failure, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;

use kvroute_node_agent::model::sampling::argmax;
use kvroute_node_agent::model::{KvStore, Model, SeqChunk};
use kvroute_proto::domain::KvDtype;

const BLOCK_SIZE: usize = kvroute_proto::DEFAULT_BLOCK_SIZE as usize;

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| Model::load("tiny-random").unwrap())
}

/// Deterministic token ids inside the vocabulary.
fn tokens(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7919 + seed * 104_729 + 13) % 100_000).collect()
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|v| v.to_bits()).collect()
}

fn store(model: &Model, dtype: KvDtype, blocks: usize) -> KvStore {
    model.new_kv_store(dtype, blocks, BLOCK_SIZE)
}

/// Computes `seq[start..]` in chunks of `chunk_size`; returns the logits after the last token.
fn run(model: &Model, kv: &mut KvStore, seq: &[u32], start: usize, table: &[u32], chunk_size: usize) -> Vec<f32> {
    let mut pos = start;
    let mut last = None;
    while pos < seq.len() {
        let end = (pos + chunk_size).min(seq.len());
        let chunk =
            SeqChunk { tokens: &seq[pos..end], start_pos: pos, block_table: table, want_logits: end == seq.len() };
        last = model.forward(kv, &[chunk]).remove(0);
        pos = end;
    }
    last.unwrap()
}

/// Logits of `seq` computed cold, in one chunk, in a fresh store with blocks 0, 1, 2, ...
fn cold(model: &Model, dtype: KvDtype, seq: &[u32]) -> Vec<f32> {
    let blocks = seq.len().div_ceil(BLOCK_SIZE);
    let table: Vec<u32> = (0..blocks as u32).collect();
    run(model, &mut store(model, dtype, blocks), seq, 0, &table, seq.len())
}

/// Greedy continuation of `steps` tokens after `seq` is in the store; returns every step's logits.
fn continue_greedy(
    model: &Model,
    kv: &mut KvStore,
    seq: &[u32],
    first: Vec<f32>,
    table: &[u32],
    steps: usize,
) -> Vec<Vec<u32>> {
    let mut seq = seq.to_vec();
    let mut out = vec![bits(&first)];
    let mut logits = first;
    for _ in 1..steps {
        seq.push(argmax(&logits));
        let pos = seq.len() - 1;
        let chunk = SeqChunk { tokens: &seq[pos..], start_pos: pos, block_table: table, want_logits: true };
        logits = model.forward(kv, &[chunk]).remove(0).unwrap();
        out.push(bits(&logits));
    }
    out
}

#[test]
fn chunk_sizes_do_not_change_logits() {
    let model = model();
    let seq = tokens(70, 1);
    let blocks = (seq.len() + 8).div_ceil(BLOCK_SIZE);
    assert_eq!(blocks, 5);
    for dtype in [KvDtype::Bf16, KvDtype::Fp8E4m3, KvDtype::F32] {
        let reference = {
            let table: Vec<u32> = (0..blocks as u32).collect();
            let mut kv = store(model, dtype, blocks);
            let first = run(model, &mut kv, &seq, 0, &table, seq.len());
            continue_greedy(model, &mut kv, &seq, first, &table, 8)
        };
        for chunk_size in [1, 7, 16, 33] {
            // Scattered block ids (a permutation: 3 and the 5 blocks are coprime), different in every run.
            let table: Vec<u32> = (0..blocks as u32).map(|b| (b * 3 + chunk_size as u32) % blocks as u32).collect();
            let mut kv = store(model, dtype, blocks);
            let first = run(model, &mut kv, &seq, 0, &table, chunk_size);
            let steps = continue_greedy(model, &mut kv, &seq, first, &table, 8);
            assert!(steps == reference, "{dtype}: chunks of {chunk_size} changed the logits");
        }
    }
}

#[test]
fn batch_companions_do_not_change_logits() {
    let model = model();
    let (a, b, c) = (tokens(41, 2), tokens(23, 3), tokens(57, 4));
    let alone: Vec<Vec<u32>> = [&a, &b, &c].iter().map(|seq| bits(&cold(model, KvDtype::Bf16, seq))).collect();
    // A prefills 41 tokens while B prefills its last 11 and C decodes its last token.
    let mut kv = store(model, KvDtype::Bf16, 12);
    let (ta, tb, tc) = ([0u32, 5, 9], [2u32, 7], [11u32, 1, 3, 6]);
    run(model, &mut kv, &b[..12], 0, &tb, 5);
    run(model, &mut kv, &c[..56], 0, &tc, 56);
    let batch = [
        SeqChunk { tokens: &a, start_pos: 0, block_table: &ta, want_logits: true },
        SeqChunk { tokens: &b[12..], start_pos: 12, block_table: &tb, want_logits: true },
        SeqChunk { tokens: &c[56..], start_pos: 56, block_table: &tc, want_logits: true },
    ];
    let together: Vec<Vec<u32>> = model.forward(&mut kv, &batch).into_iter().map(|l| bits(&l.unwrap())).collect();
    assert!(together == alone, "batching changed a sequence's logits");
}

#[test]
fn prefix_cache_hit_matches_a_cold_computation() {
    let model = model();
    for dtype in [KvDtype::Bf16, KvDtype::Fp8E4m3] {
        let prefix = tokens(48, 5);
        let first: Vec<u32> = prefix.iter().copied().chain(tokens(20, 6)).collect();
        let second: Vec<u32> = prefix.iter().copied().chain(tokens(29, 7)).collect();
        let mut kv = store(model, dtype, 12);
        // The first sequence fills blocks 4, 9, 2 with the shared prefix (and 7, 0 with the rest).
        run(model, &mut kv, &first, 0, &[4, 9, 2, 7, 0], 13);
        // The second reuses those three full blocks and computes only its own tail.
        let hit = run(model, &mut kv, &second, 48, &[4, 9, 2, 11, 3], 29);
        assert!(bits(&hit) == bits(&cold(model, dtype, &second)), "{dtype}: prefix hit differs from cold");
    }
}

#[test]
fn blocks_reloaded_from_bytes_continue_identically() {
    let model = model();
    for dtype in [KvDtype::F32, KvDtype::Bf16, KvDtype::Fp8E4m3] {
        let seq = tokens(64 + 21, 8);
        let mut source = store(model, dtype, 4);
        run(model, &mut source, &seq[..64], 0, &[0, 1, 2, 3], 64);
        let bytes: Vec<Vec<u8>> = (0..4).map(|b| source.block_to_bytes(b)).collect();
        assert!(bytes.iter().all(|b| b.len() == source.bytes_per_block()));
        // Into other block ids of a different store, then also copied within it.
        let mut target = store(model, dtype, 10);
        for (bytes, block) in bytes.iter().zip([8u32, 3, 6, 1]) {
            target.block_from_bytes(block, bytes).unwrap();
        }
        target.copy_block(6, 0);
        let reloaded = run(model, &mut target, &seq, 64, &[8, 3, 0, 1, 5, 9], 21);
        assert!(bits(&reloaded) == bits(&cold(model, dtype, &seq)), "{dtype}: reloaded blocks changed the logits");
    }
}

#[test]
fn thread_count_does_not_change_logits() {
    let seq = tokens(300, 9);
    let mut reference = None;
    for threads in [1, 2, 3] {
        let mut model = Model::load("tiny-random").unwrap();
        model.set_threads(threads);
        let logits = bits(&cold(&model, KvDtype::Bf16, &seq));
        assert!(reference.get_or_insert_with(|| logits.clone()) == &logits, "{threads} threads changed the logits");
    }
}

#[test]
fn empty_and_logit_free_chunks() {
    let model = model();
    let seq = tokens(20, 10);
    let mut kv = store(model, KvDtype::Bf16, 2);
    let table = [0u32, 1];
    let out = model.forward(
        &mut kv,
        &[
            SeqChunk { tokens: &seq[..0], start_pos: 0, block_table: &table, want_logits: true },
            SeqChunk { tokens: &seq[..19], start_pos: 0, block_table: &table, want_logits: false },
        ],
    );
    assert!(out.iter().all(Option::is_none));
    let last = run(model, &mut kv, &seq, 19, &table, 1);
    assert_eq!(last.len(), model.config().vocab_size);
    assert!(bits(&last) == bits(&cold(model, KvDtype::Bf16, &seq)));
    assert!(
        model
            .check_chunk(&kv, &SeqChunk { tokens: &seq, start_pos: 20, block_table: &table, want_logits: true })
            .is_err()
    );
    assert!(
        model
            .check_chunk(&kv, &SeqChunk { tokens: &[200_000], start_pos: 0, block_table: &table, want_logits: true })
            .is_err()
    );
    assert!(
        model
            .check_chunk(&kv, &SeqChunk { tokens: &seq, start_pos: 0, block_table: &[0, 7], want_logits: true })
            .is_err()
    );
    assert!(
        model
            .check_chunk(&kv, &SeqChunk { tokens: &seq, start_pos: 0, block_table: &table, want_logits: true })
            .is_ok()
    );
}
