//! Memory waste of paged allocation against a contiguous reservation of the
//! maximum context per request, on a mixed workload, using the real block
//! manager. Each request reserves (contiguous) or holds (paged) its KV while
//! it runs; waste is reserved-but-unused token slots over reserved slots,
//! averaged over the run.
//!
//! cargo run --release -p kvroute-node-agent --example memory_waste -- [max_context] [block_size]

#![allow(clippy::unwrap_used)]

use kvroute_node_agent::block_manager::{BlockManager, VecSink};

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let max_context: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(8192);
    let block_size: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(16);
    let mut rng = Rng(7);
    // Mixed traffic: short chats, long documents, agents; prompt and output lengths vary widely.
    let kinds = [("chat", 50, 800, 20, 400), ("document", 1500, 6000, 50, 600), ("agent", 800, 3000, 10, 200)];
    let requests = 2000;
    let concurrent = 64;
    let blocks = concurrent * max_context / block_size;
    let mut manager = BlockManager::new(blocks, block_size, "waste", Box::new(VecSink::default()));
    let (mut paged_allocated, mut paged_used, mut contiguous_reserved) = (0u128, 0u128, 0u128);
    let mut live: Vec<(u64, usize, usize)> = Vec::new(); // (seq, tokens now, final tokens)
    let mut next = 0u64;
    let mut samples = 0u64;
    while next < requests || !live.is_empty() {
        while live.len() < concurrent && next < requests {
            let (_, pmin, pmax, omin, omax) = kinds[(rng.next() % 3) as usize];
            let prompt = rng.range(pmin, pmax) as usize;
            let output = rng.range(omin, omax) as usize;
            let tokens: Vec<u32> = (0..prompt as u32).map(|i| i + (next as u32) * 10_000).collect();
            manager.place(next, &tokens, None).expect("the pool holds every live request");
            live.push((next, prompt, (prompt + output).min(max_context)));
            next += 1;
        }
        // One decode step for every live request.
        for (seq, now, _) in &mut live {
            *now += 1;
            manager.grow(*seq, *now).expect("the pool holds every live request");
        }
        for (seq, now, _) in &live {
            paged_allocated += (manager.block_table(*seq).len() * block_size) as u128;
            paged_used += *now as u128;
            contiguous_reserved += max_context as u128;
        }
        samples += 1;
        live.retain(|(seq, now, end)| {
            let done = now >= end;
            if done {
                manager.release(*seq);
            }
            !done
        });
    }
    let paged_waste = 1.0 - paged_used as f64 / paged_allocated as f64;
    let contiguous_waste = 1.0 - paged_used as f64 / contiguous_reserved as f64;
    println!(
        "mixed workload: {requests} requests (chat, document, agent), {concurrent} concurrent, {samples} decode steps"
    );
    println!("max context {max_context} tokens, block size {block_size}");
    println!("contiguous reservation: {:.1}% of reserved KV memory unused", contiguous_waste * 100.0);
    println!("paged allocation:       {:.1}% of allocated KV memory unused", paged_waste * 100.0);
    println!("concurrency in the same memory: {:.1}x", contiguous_reserved as f64 / paged_allocated as f64);
}
