//! Reload against recompute, measured on the real engine with a real redis-server (started here on a free
//! loopback port): for each prompt length, the time to first token when the prefix is computed cold, found
//! in the pool (G1), reloaded from host RAM (G2) on the same agent, and reloaded from Redis (G3) by a second
//! agent that never computed it (the cross-replica case). Then the Redis tier's own write and read
//! throughput for this model's block records, beside `redis-benchmark` on the same server and value size,
//! and the tier's hand-written RESP client against the `redis` crate's multiplexed connections doing the same
//! pipelines: 64 SETs, 32 GETs, and the tier's read pattern (windows of 2 GETs, 8 in flight, each on its
//! own connection).
//!
//! cargo run --release -p kvroute-node-agent --example tier_reload -- [MODEL.gguf|tiny-random] [lengths,...]

#![allow(clippy::unwrap_used)]
#![allow(clippy::expect_used)]

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvroute_node_agent::block_manager::VecSink;
use kvroute_node_agent::engine::model_executor::ModelExecutor;
use kvroute_node_agent::engine::tiering::SpillFn;
use kvroute_node_agent::engine::{Engine, EngineConfig, Executor, Output, Prefetched, Tiering};
use kvroute_node_agent::model::Model;
use kvroute_node_agent::prefetch;
use kvroute_node_agent::tiers::host::HostTier;
use kvroute_node_agent::tiers::network::{NetworkConfig, NetworkTier};
use kvroute_node_agent::tiers::resp::Op;
use kvroute_node_agent::tiers::resp_client::RespPool;
use kvroute_proto::block_record::{self, ModelFingerprint};
use kvroute_proto::domain::{AgentGenerateRequest, CacheMode, KvDtype, KvEvent, SamplingParams, Tier};
use kvroute_proto::{BlockHash, BlockHasher};
use kvroute_test_support::RedisServer;

const BLOCK_SIZE: usize = kvroute_proto::block_hash::DEFAULT_BLOCK_SIZE as usize;
/// Bytes of block records written and read in the throughput measurement.
const THROUGHPUT_BYTES: usize = 256 << 20;

struct Agent {
    engine: Engine<ModelExecutor>,
    network: NetworkTier,
    stored: Arc<AtomicUsize>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.get(1).cloned().unwrap_or_else(|| "tiny-random".into());
    let lengths: Vec<usize> = match args.get(2) {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![512, 2048, 8160],
    };
    let redis = RedisServer::start();
    println!("redis-server on port {}", redis.port());
    println!("time to first token, and prompt tokens reloaded from the tier");
    println!(
        "{:>7} {:>11} {:>9} {:>27} {:>28}",
        "tokens", "cold", "G1 hit", "G2 reload (same agent)", "G3 reload (other agent)"
    );
    for &length in &lengths {
        let mut a = agent(&spec, length, &redis, 2)?;
        let vocab = a.engine.executor().vocab_size();
        let prompt = tokens(length, vocab, 1);
        let cold = ttft(&mut a, &prompt, false).await;
        // Two full hits: the second makes the blocks hot, and write-through copies them to Redis.
        ttft(&mut a, &prompt, false).await;
        let g1 = ttft(&mut a, &prompt, false).await;
        // A longer prompt evicts all of them from the pool into host RAM.
        ttft(&mut a, &tokens(length + BLOCK_SIZE, vocab, 2), false).await;
        let g2 = ttft(&mut a, &prompt, false).await;
        let blocks = length / BLOCK_SIZE;
        wait_stored(&a.stored, blocks).await;
        let mut b = agent(&spec, length, &redis, 0)?;
        let g3 = ttft(&mut b, &prompt, true).await;
        let stats = (a.engine.stats().host_hit_tokens_total, b.engine.stats().network_hit_tokens_total);
        println!(
            "{length:>7} {:>9.1}ms {:>7.1}ms {:>9.1}ms {:>5} from host {:>9.1}ms {:>5} from redis",
            ms(cold.0),
            ms(g1.0),
            ms(g2.0),
            stats.0,
            ms(g3.0),
            stats.1
        );
    }
    throughput(&spec, &redis).await?;
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn tokens(length: usize, vocab: usize, seed: usize) -> Vec<u32> {
    (0..length).map(|i| ((i * 7919 + seed * 104_729) % (vocab - 300) + 100) as u32).collect()
}

/// An agent whose pool holds one prompt of `length` tokens plus a little, with host RAM for two such prompts
/// and the Redis tier; write-through after `write_through` reuses (0: off).
fn agent(
    spec: &str,
    length: usize,
    redis: &RedisServer,
    write_through: u32,
) -> Result<Agent, Box<dyn std::error::Error>> {
    let model = Model::load(spec)?;
    let geometry = model.config().kv_geometry(KvDtype::Bf16);
    let max_context = model.config().max_context;
    let fingerprint = ModelFingerprint::new(model.model_id(), &geometry, BLOCK_SIZE as u32);
    let blocks = length.div_ceil(BLOCK_SIZE) + 2;
    let kv = model.new_kv_store(KvDtype::Bf16, blocks, BLOCK_SIZE);
    let per_block = kv.bytes_per_block() as u64;
    let stored = Arc::new(AtomicUsize::new(0));
    let counter = stored.clone();
    let events = Arc::new(move |event| {
        if let KvEvent::Stored { tier: Tier::Network, hashes } = event {
            counter.fetch_add(hashes.len(), Ordering::Relaxed);
        }
    });
    let config = NetworkConfig { url: Some(redis.url()), queue_capacity: 4096, ..NetworkConfig::default() };
    let network = NetworkTier::start(config, fingerprint, BLOCK_SIZE as u32, per_block, events);
    let spill = network.clone();
    let spill = Box::new(move |hash, bytes| spill.spill(hash, bytes)) as SpillFn;
    let host = HostTier::new(2 * blocks as u64 * per_block);
    let config = EngineConfig { max_context, ..EngineConfig::default() };
    let engine = Engine::new(config, ModelExecutor::new(model, kv), Vec::new(), Box::new(VecSink::default()))
        .with_tiering(Tiering::new(Some(host), Some(spill)).with_write_through(write_through));
    Ok(Agent { engine, network, stored })
}

/// Time to the first token of `prompt`, including the Redis prefetch when `prefetch` is set.
async fn ttft(agent: &mut Agent, prompt: &[u32], prefetch: bool) -> (Duration, u32) {
    let start = Instant::now();
    let prefetched = if prefetch {
        let hashes = BlockHasher::new(BLOCK_SIZE as u32, agent.engine.executor().model_id(), b"").hashes(prompt);
        prefetch::from_network(&agent.network, &hashes, &agent.engine.probe(&hashes), None).await
    } else {
        Prefetched::default()
    };
    let request = AgentGenerateRequest {
        request_id: String::new(),
        prompt: prompt.to_vec(),
        cache_scope: Vec::new(),
        cache_mode: CacheMode::Shared,
        sampling: SamplingParams::GREEDY,
        max_tokens: 1,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
    };
    let cached = Arc::new(Mutex::new(None));
    let sink = cached.clone();
    let output = Box::new(move |output: Output| {
        if let Some((_, usage)) = output.finished {
            *sink.lock().unwrap() = Some(usage.cached_tokens);
        }
        true
    });
    agent.engine.submit_prefetched(request, output, prefetched).unwrap();
    while cached.lock().unwrap().is_none() {
        agent.engine.step();
    }
    let cached_tokens = cached.lock().unwrap().unwrap_or(0);
    (start.elapsed(), cached_tokens)
}

async fn wait_stored(stored: &AtomicUsize, at_least: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while stored.load(Ordering::Relaxed) < at_least && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Writes and reads this model's block records through the tier, then runs redis-benchmark with the same
/// value size and pipelining depth.
async fn throughput(spec: &str, redis: &RedisServer) -> Result<(), Box<dyn std::error::Error>> {
    let model = Model::load(spec)?;
    let geometry = model.config().kv_geometry(KvDtype::Bf16);
    let fingerprint = ModelFingerprint::new(model.model_id(), &geometry, BLOCK_SIZE as u32);
    let payload_len = geometry.bytes_per_block(BLOCK_SIZE as u32);
    let tier_on = |prefix: &str| {
        let stored = Arc::new(AtomicUsize::new(0));
        let counter = stored.clone();
        let events = Arc::new(move |event| {
            if let KvEvent::Stored { tier: Tier::Network, hashes } = event {
                counter.fetch_add(hashes.len(), Ordering::Relaxed);
            }
        });
        let config = NetworkConfig {
            url: Some(redis.url()),
            queue_capacity: THROUGHPUT_BYTES.div_ceil(payload_len as usize),
            key_prefix: prefix.into(),
            ..NetworkConfig::default()
        };
        (NetworkTier::start(config, fingerprint, BLOCK_SIZE as u32, payload_len, events), stored)
    };
    let (network, stored) = tier_on("throughput");
    let count = THROUGHPUT_BYTES.div_ceil(payload_len as usize);
    let hashes = BlockHasher::new(BLOCK_SIZE as u32, "throughput", b"").hashes(&tokens(count * BLOCK_SIZE, 50_000, 9));
    let payloads: Vec<Arc<Vec<u8>>> =
        (0..count).map(|i| Arc::new(vec![(i % 251) as u8; payload_len as usize])).collect();
    let record_len = block_record::encode(&fingerprint, BLOCK_SIZE as u32, &hashes[0], &payloads[0]).len();
    let megabytes = (count * record_len) as f64 / 1e6;
    println!("block record {record_len} bytes, {count} records, {megabytes:.0} MB a round");
    let pool = RespPool::from_url(&redis.url(), record_len + 1024)?;
    let records: Vec<Arc<Vec<u8>>> = hashes
        .iter()
        .zip(&payloads)
        .map(|(hash, payload)| Arc::new(block_record::encode(&fingerprint, BLOCK_SIZE as u32, hash, payload)))
        .collect();
    // redis-benchmark's key names, so that its GETs find the values the client writes.
    let keys: Vec<String> = (0..count).map(|i| format!("key:{i:012}")).collect();
    let mut flush = redis::Client::open(redis.url())?.get_connection()?;
    let port = redis.port().to_string();
    // Connect before timing.
    network.fetch_run(&hashes[..1]).await;

    // Rounds alternate the three so that a noisy neighbour slows all three alike; the first round warms
    // connections and memory and is not counted. Every write round starts from an empty Redis.
    const ROUNDS: usize = 7;
    let crate_client = CrateClient::connect(&redis.url(), FETCHES_IN_FLIGHT).await?;
    let mut writes = Rates::default();
    for round in 0..=ROUNDS {
        redis::cmd("FLUSHALL").exec(&mut flush)?;
        let start = Instant::now();
        spill_all(&network, &stored, &hashes, &payloads).await;
        writes.add(round, TIER, megabytes / start.elapsed().as_secs_f64());
        let start = Instant::now();
        write_with_client(&pool, &keys, &records).await?;
        writes.add(round, HAND, megabytes / start.elapsed().as_secs_f64());
        let start = Instant::now();
        crate_client.write(&keys, &records).await?;
        writes.add(round, CRATE, megabytes / start.elapsed().as_secs_f64());
        if let Some(raw) = redis_benchmark(&port, "set", 1_000_000_000, count, record_len) {
            writes.add(round, RAW, raw);
        }
    }
    writes.print("writes (tier: records built and checksummed; clients: pipelines of 64 SETs)");

    redis::cmd("FLUSHALL").exec(&mut flush)?;
    spill_all(&network, &stored, &hashes, &payloads).await;
    write_with_client(&pool, &keys, &records).await?;
    let mut reads = Rates::default();
    let mut windowed = Rates::default();
    for round in 0..=ROUNDS {
        let start = Instant::now();
        let read = network.fetch_run(&hashes).await;
        reads.add(round, TIER, megabytes / start.elapsed().as_secs_f64());
        assert_eq!(read.len(), count, "every block reads back");
        drop(read);
        let start = Instant::now();
        for keys in keys.chunks(32) {
            pool.run(&keys.iter().map(|key| Op::Get(key.clone())).collect::<Vec<_>>()).await?;
        }
        reads.add(round, HAND, megabytes / start.elapsed().as_secs_f64());
        let start = Instant::now();
        assert_eq!(crate_client.read(&keys, 32, 1).await?, count * record_len, "every value reads back");
        reads.add(round, CRATE, megabytes / start.elapsed().as_secs_f64());
        if let Some(raw) = redis_benchmark(&port, "get", count, count, record_len) {
            reads.add(round, RAW, raw);
        }
        let start = Instant::now();
        assert_eq!(read_windowed_with_client(&pool, &keys).await?, count * record_len, "every value reads back");
        windowed.add(round, HAND, megabytes / start.elapsed().as_secs_f64());
        let start = Instant::now();
        let read = crate_client.read(&keys, FETCH_WINDOW, FETCHES_IN_FLIGHT).await?;
        assert_eq!(read, count * record_len, "every value reads back");
        windowed.add(round, CRATE, megabytes / start.elapsed().as_secs_f64());
    }
    reads.print("reads (tier: read back and verified; clients: pipelines of 32 GETs)");
    windowed.print("reads as the tier reads (windows of 2 GETs, 8 in flight on their own connections; not verified)");
    Ok(())
}

/// The network tier's read pattern (`NetworkTier::fetch_run`).
const FETCH_WINDOW: usize = 2;
const FETCHES_IN_FLIGHT: usize = 8;

/// Series of the throughput table.
const TIER: &str = "network tier";
const HAND: &str = "its RESP client (resp_client.rs)";
const CRATE: &str = "the redis crate (MultiplexedConnection)";
const RAW: &str = "redis-benchmark (1 client, pipeline 16)";

/// GETs every key in windows of [`FETCH_WINDOW`], [`FETCHES_IN_FLIGHT`] windows in flight, through the tier's
/// client; returns the bytes read.
async fn read_windowed_with_client(pool: &RespPool, keys: &[String]) -> Result<usize, Box<dyn std::error::Error>> {
    use futures::StreamExt;
    let windows = futures::stream::iter(keys.chunks(FETCH_WINDOW).map(|window| {
        let ops: Vec<Op> = window.iter().map(|key| Op::Get(key.clone())).collect();
        async move { pool.run(&ops).await }
    }))
    .buffered(FETCHES_IN_FLIGHT);
    let replies: Vec<_> = windows.collect().await;
    let mut bytes = 0;
    for reply in replies {
        for reply in reply? {
            if let kvroute_node_agent::tiers::resp::Reply::Bulk(Some(value)) = reply {
                bytes += value.len();
            }
        }
    }
    Ok(bytes)
}

/// The `redis` crate's client with the tier's client's shape: one pipeline per call, concurrent calls on
/// connections of their own (round robin over `connections` multiplexed connections).
struct CrateClient {
    connections: Vec<redis::aio::MultiplexedConnection>,
}

impl CrateClient {
    async fn connect(url: &str, connections: usize) -> Result<CrateClient, Box<dyn std::error::Error>> {
        let client = redis::Client::open(url)?;
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
        let mut opened = Vec::new();
        for _ in 0..connections {
            opened.push(client.get_multiplexed_async_connection_with_config(&config).await?);
        }
        Ok(CrateClient { connections: opened })
    }

    /// SETs every record under its key, in pipelines of 64 on one connection.
    async fn write(&self, keys: &[String], records: &[Arc<Vec<u8>>]) -> Result<(), Box<dyn std::error::Error>> {
        let mut connection = self.connections[0].clone();
        for (keys, records) in keys.chunks(64).zip(records.chunks(64)) {
            let mut pipe = redis::pipe();
            for (key, record) in keys.iter().zip(records) {
                pipe.set(key, record.as_slice()).ignore();
            }
            pipe.query_async::<()>(&mut connection).await?;
        }
        Ok(())
    }

    /// GETs every key in pipelines of `window`, `in_flight` of them at once (each on its own connection);
    /// returns the bytes read.
    async fn read(
        &self,
        keys: &[String],
        window: usize,
        in_flight: usize,
    ) -> Result<usize, Box<dyn std::error::Error>> {
        use futures::StreamExt;
        let pipelines = futures::stream::iter(keys.chunks(window).enumerate().map(|(i, window)| {
            let mut connection = self.connections[i % in_flight.min(self.connections.len())].clone();
            let mut pipe = redis::pipe();
            for key in window {
                pipe.get(key);
            }
            async move { pipe.query_async::<Vec<Vec<u8>>>(&mut connection).await }
        }))
        .buffered(in_flight);
        let replies: Vec<_> = pipelines.collect().await;
        let mut bytes = 0;
        for values in replies {
            bytes += values?.iter().map(Vec::len).sum::<usize>();
        }
        Ok(bytes)
    }
}

/// MB/s of `redis-benchmark -t TEST -c 1 -P 16` over `keyspace` keys; None when it cannot run.
fn redis_benchmark(port: &str, test: &str, keyspace: usize, requests: usize, value_len: usize) -> Option<f64> {
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", port, "-t", test, "-c", "1", "-P", "16", "-r", &keyspace.to_string()])
        .args(["-n", &requests.to_string(), "-d", &value_len.to_string(), "-q", "--csv"])
        .output()
        .ok()
        .filter(|output| output.status.success())?;
    String::from_utf8_lossy(&output.stdout).lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split(',').map(|f| f.trim_matches('"')).collect();
        fields.get(1).and_then(|f| f.parse::<f64>().ok()).map(|rps| rps * value_len as f64 / 1e6)
    })
}

/// Spills every block through the tier and waits until the tier reports them all stored.
async fn spill_all(network: &NetworkTier, stored: &AtomicUsize, hashes: &[BlockHash], payloads: &[Arc<Vec<u8>>]) {
    let before = stored.load(Ordering::Relaxed);
    for (hash, payload) in hashes.iter().zip(payloads) {
        assert!(network.spill(*hash, payload.clone()), "the write queue holds every block");
    }
    wait_stored(stored, before + hashes.len()).await;
}

/// SETs every record under its key, in pipelines of 64.
async fn write_with_client(
    pool: &RespPool,
    keys: &[String],
    records: &[Arc<Vec<u8>>],
) -> Result<(), Box<dyn std::error::Error>> {
    for (keys, records) in keys.chunks(64).zip(records.chunks(64)) {
        let ops = keys.iter().zip(records).map(|(key, record)| Op::Set {
            key: key.clone(),
            head: Vec::new(),
            body: record.clone(),
            ttl_seconds: None,
        });
        pool.run(&ops.collect::<Vec<_>>()).await?;
    }
    Ok(())
}

/// MB/s per series (the tier, each client, redis-benchmark), one value of each per counted round.
#[derive(Default)]
struct Rates {
    series: Vec<(&'static str, Vec<f64>)>,
}

impl Rates {
    /// Records a round's rate of `series`; round 0 is the warm-up and is dropped.
    fn add(&mut self, round: usize, series: &'static str, rate: f64) {
        if round == 0 {
            return;
        }
        match self.series.iter_mut().find(|(name, _)| *name == series) {
            Some((_, rates)) => rates.push(rate),
            None => self.series.push((series, vec![rate])),
        }
    }

    fn median(&self, series: &str) -> Option<f64> {
        let (_, values) = self.series.iter().find(|(name, _)| *name == series)?;
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied()
    }

    fn print(&self, title: &str) {
        let rounds = self.series.first().map_or(0, |(_, values)| values.len());
        println!("{title}, {rounds} rounds after a warm-up round, MB/s:");
        for (name, values) in &self.series {
            let shown = values.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", ");
            println!("  {name}: {shown} (median {:.0})", self.median(name).unwrap_or(f64::NAN));
        }
        let ratio = |a: &str, b: &str| Some(100.0 * self.median(a)? / self.median(b)?);
        if let Some(ratio) = ratio(TIER, RAW) {
            println!("  network tier / raw, medians: {ratio:.0}%");
        } else if self.median(TIER).is_some() {
            println!("  redis-benchmark not found: raw throughput not measured");
        }
        if let Some(ratio) = ratio(HAND, CRATE) {
            println!("  RESP client / redis crate, medians: {ratio:.0}%");
        }
    }
}
