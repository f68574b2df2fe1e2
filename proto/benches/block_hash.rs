//! Hashing throughput of the v1 block-hash chain (bytes of token ids per second).

#![allow(clippy::unwrap_used)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvroute_proto::BlockHasher;
use std::hint::black_box;

fn bench_block_hash(c: &mut Criterion) {
    let hasher = BlockHasher::new(16, "SmolLM2-135M-Instruct", b"t:bench");
    let mut group = c.benchmark_group("block_hash_v1");
    for tokens in [2_048usize, 8_192] {
        let prompt: Vec<u32> = (0..tokens as u32).map(|i| i.wrapping_mul(2_654_435_761) % 49_152).collect();
        group.throughput(Throughput::Bytes((tokens * 4) as u64));
        group.bench_function(format!("{tokens}_tokens"), |b| b.iter(|| hasher.hashes(black_box(&prompt))));
    }
    group.finish();
}

criterion_group!(benches, bench_block_hash);
criterion_main!(benches);
