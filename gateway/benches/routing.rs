//! The routing core at fleet scale: prefix-index lookup of a 2,000-token prompt
//! with 64 replicas and 1,000,000 indexed blocks, the whole routing decision
//! from token ids (without and with the prefix-cache doctor's bookkeeping) and from text (2,000 and 8,000
//! tokens), event ingestion into a full index, and memory per entry.
//! Criterion reports means; p50/p99 come from a loop of single timed calls.
//! "Hot" repeats one prompt (its entries stay in cache, like a popular system
//! prompt); "cold" walks a different fully indexed chain each time.
//!
//! Run: `cargo bench -j2 -p kvroute-gateway --bench routing -- --warm-up-time 1 --measurement-time 3`

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use kvroute_gateway::doctor::{Doctor, DoctorConfig, Observation};
use kvroute_gateway::doctor_thread::{DoctorThread, Traffic};
use kvroute_gateway::routing::cache_aware::cache_aware;
use kvroute_gateway::routing::{
    IndexConfig, PrefixIndex, RandomSource, ReplicaId, ReplicaView, RouteRequest, ScoringConfig, SplitMix64,
};
use kvroute_proto::domain::{KvEvent, LoadStats, Tier};
use kvroute_proto::{BlockHash, BlockHasher};

const REPLICAS: usize = 64;
const ENTRIES: usize = 1_000_000;
const PROMPT_TOKENS: usize = 2_000;
const PROMPT_BLOCKS: usize = PROMPT_TOKENS / 16;

fn random_hash(rng: &mut SplitMix64) -> BlockHash {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&rng.next_u64().to_le_bytes());
    bytes[8..].copy_from_slice(&rng.next_u64().to_le_bytes());
    BlockHash(bytes)
}

fn prompt_tokens(variant: u32) -> Vec<u32> {
    (0..PROMPT_TOKENS as u32).map(|i| (i * 31 + variant * 7_919) % 100_000).collect()
}

/// A full index: 8,000 chains of 125 blocks, each on the gpu of one to three
/// replicas with a host-tier tail, plus the benchmark prompt's chain held by
/// four replicas (gpu, host, network) so that a lookup walks all 125 blocks.
fn full_index(prompt: &[BlockHash]) -> (PrefixIndex, Vec<Vec<BlockHash>>) {
    let index =
        PrefixIndex::new(IndexConfig { max_entries: ENTRIES, max_replicas: REPLICAS, ..IndexConfig::default() })
            .unwrap_or_else(|error| panic!("index: {error}"));
    let mut rng = SplitMix64::new(1);
    for replica in 0..REPLICAS as ReplicaId {
        let _ = index.set_network_tier_up(replica, true);
    }
    let count = (ENTRIES - PROMPT_BLOCKS) / PROMPT_BLOCKS;
    let mut chains = Vec::with_capacity(count);
    for _ in 0..count {
        let chain: Vec<BlockHash> = (0..PROMPT_BLOCKS).map(|_| random_hash(&mut rng)).collect();
        for _ in 0..=rng.below(3) {
            let replica = rng.below(REPLICAS) as ReplicaId;
            let split = 60 + rng.below(60);
            let _ = index.apply_events(
                replica,
                &[
                    KvEvent::Stored { tier: Tier::Gpu, hashes: chain[..split].to_vec() },
                    KvEvent::Stored { tier: Tier::Host, hashes: chain[split..].to_vec() },
                ],
            );
        }
        chains.push(chain);
    }
    let _ = index.apply(3, &KvEvent::Stored { tier: Tier::Gpu, hashes: prompt.to_vec() });
    let _ = index.apply(17, &KvEvent::Stored { tier: Tier::Gpu, hashes: prompt[..50].to_vec() });
    let _ = index.apply(17, &KvEvent::Stored { tier: Tier::Host, hashes: prompt[50..].to_vec() });
    let _ = index.apply(40, &KvEvent::Stored { tier: Tier::Network, hashes: prompt.to_vec() });
    (index, chains)
}

fn views() -> Vec<ReplicaView> {
    (0..REPLICAS as ReplicaId)
        .map(|id| ReplicaView {
            id,
            healthy: true,
            load: LoadStats {
                waiting_requests: u32::from(id % 5),
                running_requests: u32::from(id % 7),
                queued_prefill_tokens: u64::from(id) * 100,
                kv_blocks_used: u64::from(id) * 150,
                kv_blocks_total: 10_000,
                prefill_tokens_per_second: 10_000.0,
                decode_step_seconds: 0.02,
                host_bytes_per_second: 20e9,
                network_bytes_per_second: 2e9,
                network_tier_up: true,
                draining: false,
                queue_capacity: 256,
                ..LoadStats::default()
            },
            block_size: 16,
            bytes_per_block: 2 << 20,
            blocks_per_engine_block: 1,
            tracked: Default::default(),
        })
        .collect()
}

/// English prose of at least `tokens` tokens.
fn english_text(tokenizer: &kvroute_gateway::tokenizer::Tokenizer, tokens: usize) -> String {
    const PARAGRAPH: &str = "The harbour master kept a ledger of every ship that entered the bay, noting its \
        cargo, its crew and the weather it had met. In winter the entries grew short and cramped; in summer they \
        ran to pages, with sketches of sails in the margins and the prices of fish at the quay. ";
    let mut text = String::new();
    let mut round = 0;
    while tokenizer.encode(&text).len() < tokens {
        text.push_str(&format!("Entry {round}. {PARAGRAPH}"));
        round += 1;
    }
    text
}

/// The process's anonymous memory on transparent huge pages, from
/// `/proc/self/smaps_rollup` (the index's table asks for them).
fn huge_page_memory() -> String {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|text| text.lines().find(|line| line.starts_with("AnonHugePages:")).map(str::to_owned))
        .and_then(|line| line.split_whitespace().nth(1).map(|kb| format!("{kb} kB")))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Times `runs` single calls and prints mean, p50, p99 and max.
fn percentiles(label: &str, runs: usize, mut call: impl FnMut()) {
    let mut samples: Vec<Duration> = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        call();
        samples.push(started.elapsed());
    }
    samples.sort_unstable();
    let mean = samples.iter().sum::<Duration>() / runs as u32;
    let at = |q: f64| samples[((runs as f64 * q) as usize).min(runs - 1)];
    println!(
        "{label}: mean {:.2} us, p50 {:.2} us, p99 {:.2} us, max {:.2} us ({runs} single calls)",
        mean.as_secs_f64() * 1e6,
        at(0.50).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6,
        samples[runs - 1].as_secs_f64() * 1e6,
    );
}

fn routing(c: &mut Criterion) {
    let hasher = BlockHasher::new(16, "bench-model", b"");
    let tokens = prompt_tokens(0);
    let prompt = hasher.hashes(&tokens);
    let started = Instant::now();
    let (index, chains) = full_index(&prompt);
    let stats = index.stats();
    println!(
        "index: {} entries, {} slots of {} bytes, {:.1} MB; {:.1} bytes per entry at the cap; filled in {:.2} s",
        stats.entries,
        stats.slots,
        stats.slot_bytes,
        stats.memory_bytes as f64 / 1e6,
        index.bytes_per_entry_at_cap(),
        started.elapsed().as_secs_f64(),
    );
    println!("process memory on transparent huge pages: {}", huge_page_memory());
    let check = index.lookup(&prompt, 0);
    assert_eq!(check.get(3).gpu_blocks as usize, PROMPT_BLOCKS);
    assert_eq!(check.get(17).host_blocks as usize, PROMPT_BLOCKS - 50);
    assert_eq!(check.get(0).network_blocks as usize, PROMPT_BLOCKS);

    c.bench_function("index_lookup_125_blocks_64_replicas_1m_entries", |b| {
        b.iter(|| black_box(index.lookup(black_box(&prompt), 0)))
    });
    percentiles("index lookup, hot (125 blocks, 64 replicas, 1M entries)", 200_000, || {
        black_box(index.lookup(black_box(&prompt), 0));
    });
    let mut next = 0;
    let mut cold = || {
        next = (next + 7_919) % chains.len();
        black_box(index.lookup(black_box(&chains[next]), 0));
    };
    c.bench_function("index_lookup_cold_125_blocks_64_replicas_1m_entries", |b| b.iter(&mut cold));
    percentiles("index lookup, cold (125 blocks, 64 replicas, 1M entries)", 200_000, cold);

    let replicas = views();
    let config = ScoringConfig::default();
    let decide = |rng: &mut SplitMix64| {
        let hashes = hasher.hashes(black_box(&tokens));
        let lookup = index.lookup(&hashes, 0);
        let request = RouteRequest { hashes: &hashes, prompt_tokens: tokens.len(), session_key: None };
        black_box(cache_aware(&request, &replicas, &lookup, &config, rng))
    };
    let mut rng = SplitMix64::new(7);
    assert_eq!(decide(&mut rng).chosen, Some(3));
    c.bench_function("decision_from_2000_token_ids_64_replicas", |b| b.iter(|| decide(&mut rng)));
    percentiles("routing decision from 2,000 token ids (hash + lookup + cache_aware, 64 replicas)", 50_000, || {
        decide(&mut rng);
    });
    doctor_cost(&tokens, &mut || {
        decide(&mut rng);
    });

    // The whole decision from text: tokenize (built-in BPE, nothing cached), hash, look up, score.
    let tokenizer = kvroute_gateway::tokenizer::Tokenizer::builtin();
    for target in [2_000usize, 8_000] {
        let text = english_text(&tokenizer, target);
        let from_text = |rng: &mut SplitMix64| {
            let ids = tokenizer.encode(black_box(&text));
            let hashes = hasher.hashes(&ids);
            let lookup = index.lookup(&hashes, 0);
            let request = RouteRequest { hashes: &hashes, prompt_tokens: ids.len(), session_key: None };
            black_box(cache_aware(&request, &replicas, &lookup, &config, rng))
        };
        c.bench_function(&format!("decision_from_text_{target}_tokens_64_replicas"), |b| {
            b.iter(|| from_text(&mut rng))
        });
        percentiles(&format!("routing decision from text, {target} tokens ({} bytes)", text.len()), 2_000, || {
            from_text(&mut rng);
        });
    }

    // Ingestion into the full index: every stored block is new and evicts one.
    let mut group = c.benchmark_group("ingestion");
    group.throughput(Throughput::Elements(PROMPT_BLOCKS as u64));
    let mut source = SplitMix64::new(99);
    group.bench_function("stored_125_new_blocks_into_full_index", |b| {
        b.iter_batched(
            || {
                let hashes: Vec<BlockHash> = (0..PROMPT_BLOCKS).map(|_| random_hash(&mut source)).collect();
                (source.below(REPLICAS) as ReplicaId, [KvEvent::Stored { tier: Tier::Gpu, hashes }])
            },
            |(replica, events)| index.apply_events(replica, &events),
            BatchSize::SmallInput,
        )
    });
    group.finish();
    let batches: Vec<(ReplicaId, Vec<KvEvent>)> = (0..4_000)
        .map(|_| {
            let hashes: Vec<BlockHash> = (0..PROMPT_BLOCKS).map(|_| random_hash(&mut source)).collect();
            let removed = hashes[..25].to_vec();
            let replica = source.below(REPLICAS) as ReplicaId;
            (
                replica,
                vec![
                    KvEvent::Stored { tier: Tier::Gpu, hashes },
                    KvEvent::Removed { tier: Tier::Gpu, hashes: removed.clone() },
                    KvEvent::Stored { tier: Tier::Host, hashes: removed },
                ],
            )
        })
        .collect();
    let events: usize = batches
        .iter()
        .flat_map(|(_, events)| events)
        .map(|event| match event {
            KvEvent::Stored { hashes, .. } | KvEvent::Removed { hashes, .. } => hashes.len(),
            KvEvent::Cleared { .. } => 1,
        })
        .sum();
    let started = Instant::now();
    for (replica, events) in &batches {
        let _ = index.apply_events(*replica, events);
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "event ingestion into a full index: {events} block events in {:.3} s = {:.2} M block events/s ({} evictions so far)",
        seconds,
        events as f64 / seconds / 1e6,
        index.stats().evictions,
    );
}

/// The prefix-cache doctor's cost. On the request path the router hands the prompt (moved, not copied) to the
/// doctor's queue: the decision with and without that, timed alternately (and each first in turn) so that a
/// busy machine and warm caches weigh on both alike, in rounds of 200 that the doctor's thread then works
/// through (untimed), so that each hand-over finds room in the queue as at any sustainable rate. Off the
/// request path, the doctor's own work per prompt, on its thread.
fn doctor_cost(tokens: &[u32], decide: &mut dyn FnMut()) {
    const ROUNDS: usize = 250;
    const PER_ROUND: usize = 200;
    let doctor = DoctorThread::start(DoctorConfig::default(), Vec::new()).unwrap();
    let traffic = || Traffic { tenant: "bench".into(), user: None, scope: Some(Vec::new()), tokens: tokens.to_vec() };
    let (mut alone, mut with) = (Vec::with_capacity(ROUNDS * PER_ROUND), Vec::with_capacity(ROUNDS * PER_ROUND));
    for round in 1..=ROUNDS {
        for call in 0..PER_ROUND {
            let mut prompt = Some(traffic());
            // Which goes first alternates: the second call finds the first one's data in the caches.
            let order = if call % 2 == 0 { [false, true] } else { [true, false] };
            for with_doctor in order {
                let started = Instant::now();
                decide();
                if with_doctor && let Some(prompt) = prompt.take() {
                    black_box(doctor.observe(0, prompt, [0; 3]));
                }
                if with_doctor { &mut with } else { &mut alone }.push(started.elapsed());
            }
        }
        let handed = (round * PER_ROUND) as u64;
        while doctor.observed() < handed {
            std::thread::yield_now();
        }
    }
    let summary = |samples: &mut Vec<Duration>| {
        samples.sort_unstable();
        let mean = samples.iter().sum::<Duration>().as_secs_f64() / samples.len() as f64;
        let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)].as_secs_f64() * 1e6;
        (mean * 1e6, at(0.5), at(0.99))
    };
    let (alone, with) = (summary(&mut alone), summary(&mut with));
    println!(
        "routing decision from 2,000 token ids, alternately without and with the prefix-cache doctor's bookkeeping \
         ({} each): mean {:.2} / {:.2} us ({:+.1}%), p50 {:.2} / {:.2} us ({:+.1}%), p99 {:.2} / {:.2} us",
        ROUNDS * PER_ROUND,
        alone.0,
        with.0,
        (with.0 / alone.0 - 1.0) * 100.0,
        alone.1,
        with.1,
        (with.1 / alone.1 - 1.0) * 100.0,
        alone.2,
        with.2,
    );

    // The doctor's own work: 2,000-token chat prompts (a 1,900-token system prompt, then a question).
    let mut core = Doctor::new(DoctorConfig::default());
    let prompts: Vec<Vec<u32>> =
        (0..1_000u32).map(|i| [&tokens[..1_900], &prompt_tokens(i + 1)[..100]].concat()).collect();
    let started = Instant::now();
    for (id, prompt) in prompts.iter().enumerate() {
        let observation = Observation {
            tenant: "bench",
            user: None,
            scope: 0,
            tokens: prompt,
            prompt_len: prompt.len(),
            matched: [0; 3],
        };
        black_box(core.observe(id as u64, id as u64, &observation));
    }
    println!(
        "prefix-cache doctor, its own work per 2,000-token chat prompt (on its thread, off the request path): {:.1} us",
        started.elapsed().as_secs_f64() * 1e6 / prompts.len() as f64
    );
}

criterion_group!(benches, routing);
criterion_main!(benches);
