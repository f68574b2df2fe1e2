//! The tiers below the pool with a real redis-server: blocks evicted from the
//! pool reload from host RAM and from Redis, on the same engine and on a second
//! engine sharing the Redis, bit-identical to a cold computation; records that
//! do not verify are misses; Redis down or restarted never fails a request;
//! scopes never share.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvroute_node_agent::engine::model_executor::ModelExecutor;
use kvroute_node_agent::engine::thread::SharedSink;
use kvroute_node_agent::engine::tiering::SpillFn;
use kvroute_node_agent::engine::{Engine, EngineConfig, Output, Prefetched, Tiering};
use kvroute_node_agent::model::{KvStore, Model};
use kvroute_node_agent::prefetch;
use kvroute_node_agent::tiers::host::HostTier;
use kvroute_node_agent::tiers::network::{NetworkConfig, NetworkTier};
use kvroute_proto::block_record::ModelFingerprint;
use kvroute_proto::domain::{AgentGenerateRequest, CacheMode, KvDtype, KvEvent, SamplingParams, Tier};
use kvroute_proto::{BlockHash, BlockHasher};
use kvroute_test_support::services::PATIENCE;
use kvroute_test_support::{RedisCluster, RedisServer, free_port};

const BLOCK: usize = 4;

#[derive(Clone, Debug, Default)]
struct Received {
    tokens: Vec<u32>,
    logits: Vec<Vec<u32>>,
    cached_tokens: u32,
}

struct Agent {
    engine: Engine<ModelExecutor>,
    network: Option<NetworkTier>,
    events: SharedSink,
    /// Every block the network tier reported written, in order (kept, where `events` is taken).
    written: Arc<Mutex<Vec<BlockHash>>>,
    /// Marker blocks queued by [`Agent::settle_writes`], left out of [`Agent::stored`].
    markers: Vec<BlockHash>,
}

fn fingerprint(model: &Model) -> ModelFingerprint {
    ModelFingerprint::new(model.model_id(), &model.config().kv_geometry(KvDtype::Bf16), BLOCK as u32)
}

/// An engine whose pool holds `blocks` blocks, with a host tier of
/// `host_blocks` blocks and an optional standalone Redis tier.
fn agent(blocks: usize, host_blocks: usize, redis: Option<String>) -> Agent {
    let network = redis.map(|url| NetworkConfig { url: Some(url), ..network_config() });
    agent_with(blocks, host_blocks, network, 0)
}

fn network_config() -> NetworkConfig {
    NetworkConfig { timeout: Duration::from_millis(300), ..NetworkConfig::default() }
}

/// [`agent`] with any network tier and write-through after `write_through` reuses (0: off).
fn agent_with(blocks: usize, host_blocks: usize, network: Option<NetworkConfig>, write_through: u32) -> Agent {
    let model = Model::load("tiny-random").unwrap();
    let geometry = model.config().kv_geometry(KvDtype::Bf16);
    let kv = KvStore::new(geometry, blocks, BLOCK);
    let per_block = kv.bytes_per_block() as u64;
    let events = SharedSink::default();
    let written: Arc<Mutex<Vec<BlockHash>>> = Arc::default();
    let network = network.map(|config| {
        let (sink, log) = (events.clone(), written.clone());
        let callback = move |event: KvEvent| {
            let stored = match &event {
                KvEvent::Stored { tier: Tier::Network, hashes } => hashes.clone(),
                _ => Vec::new(),
            };
            sink.push(event);
            log.lock().unwrap().extend(stored);
        };
        NetworkTier::start(config, fingerprint(&model), BLOCK as u32, per_block, Arc::new(callback))
    });
    let host = (host_blocks > 0).then(|| HostTier::new(host_blocks as u64 * per_block));
    let spill = network.clone().map(|n| Box::new(move |h, b| n.spill(h, b)) as SpillFn);
    let config = EngineConfig { capture_logits: true, ..EngineConfig::default() };
    let engine = Engine::new(config, ModelExecutor::new(model, kv), Vec::new(), Box::new(events.clone()))
        .with_tiering(Tiering::new(host, spill).with_write_through(write_through));
    Agent { engine, network, events, written, markers: Vec::new() }
}

fn request(prompt: &[u32], scope: &[u8]) -> AgentGenerateRequest {
    AgentGenerateRequest {
        request_id: String::new(),
        prompt: prompt.to_vec(),
        cache_scope: scope.to_vec(),
        cache_mode: CacheMode::Shared,
        sampling: SamplingParams::GREEDY,
        max_tokens: 6,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (seed * 7919 + i * 104_729) % 100_000).collect()
}

impl Agent {
    /// Runs one request to completion, prefetching from the network tier first.
    async fn run(&mut self, prompt: &[u32], scope: &[u8]) -> Received {
        let prefetched = match &self.network {
            Some(network) => {
                let hashes = BlockHasher::new(BLOCK as u32, "tiny-random", scope).hashes(prompt);
                prefetch::from_network(network, &hashes, &self.engine.probe(&hashes), None).await
            }
            None => Prefetched::default(),
        };
        let received = Arc::new(Mutex::new(Received::default()));
        let sink = received.clone();
        let output = Box::new(move |output: Output| {
            let mut r = sink.lock().unwrap();
            r.tokens.extend(&output.tokens);
            if let Some(logits) = output.logits {
                r.logits.push(logits.iter().map(|x| x.to_bits()).collect());
            }
            if let Some((_, usage)) = output.finished {
                r.cached_tokens = usage.cached_tokens;
            }
            true
        });
        self.engine.submit_prefetched(request(prompt, scope), output, prefetched).unwrap();
        while self.engine.has_work() {
            self.engine.step();
        }
        received.lock().unwrap().clone()
    }

    /// Fills the pool (and host tier) with other prompts so earlier blocks leave.
    async fn churn(&mut self, rounds: u32) {
        for seed in 0..rounds {
            self.run(&prompt(500 + seed, 20), b"churn").await;
        }
    }

    fn removed(&mut self, tier: Tier) -> Vec<BlockHash> {
        self.events
            .take()
            .into_iter()
            .filter_map(|e| match e {
                KvEvent::Removed { tier: t, hashes } if t == tier => Some(hashes),
                _ => None,
            })
            .flatten()
            .collect()
    }

    fn stored(&mut self, tier: Tier) -> Vec<BlockHash> {
        let mut events = self.events.take();
        events.extend(self.engine.take_tier_events());
        events
            .into_iter()
            .filter_map(|e| match e {
                KvEvent::Stored { tier: t, hashes } if t == tier => Some(hashes),
                _ => None,
            })
            .flatten()
            .filter(|hash| !self.markers.contains(hash))
            .collect()
    }

    /// Waits until the network tier has reported every block of `hashes` written to Redis.
    async fn wait_written(&self, hashes: &[BlockHash]) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let missing = {
                let written = self.written.lock().unwrap();
                hashes.iter().filter(|hash| !written.contains(hash)).count()
            };
            if missing == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "{missing} of {} blocks were never written to Redis", hashes.len());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the writes queued so far are done: queues a marker block behind them and waits until the
    /// tier reports it written (writers take the queue in order). A check that something was *not* written
    /// comes after this.
    async fn settle_writes(&mut self) {
        let network = self.network.clone().unwrap();
        let seed = self.markers.len() as u32;
        let marker = BlockHasher::new(BLOCK as u32, "tiny-random", b"write marker").hashes(&[seed; BLOCK])[0];
        self.markers.push(marker);
        assert!(network.spill(marker, Arc::new(vec![0; 64])), "the write queue took the marker");
        self.wait_written(&[marker]).await;
    }
}

/// The hashes of `prompt`'s full blocks in `scope`.
fn hashes(prompt: &[u32], scope: &[u8]) -> Vec<BlockHash> {
    BlockHasher::new(BLOCK as u32, "tiny-random", scope).hashes(prompt)
}

/// Waits up to `seconds` for the tier to report itself up (or down); the caller asserts the outcome.
async fn wait_for_tier(network: &NetworkTier, up: bool, seconds: u64) {
    for _ in 0..seconds * 10 {
        if network.is_up() == up {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_same(a: &Received, b: &Received) {
    assert_eq!(a.tokens, b.tokens);
    assert!(a.logits == b.logits, "logits are not bit-identical");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_tier_reload_is_bit_identical() {
    let target = prompt(1, 22);
    let cold = agent(64, 0, None).run(&target, b"").await;
    let mut agent = agent(12, 64, None);
    let first = agent.run(&target, b"").await;
    assert_same(&cold, &first);
    agent.churn(4).await;
    assert!(agent.engine.blocks().probe(&BlockHasher::new(4, "tiny-random", b"").hashes(&target)).0 == 0);
    assert!(!agent.stored(Tier::Host).is_empty(), "evicted blocks were stored in host RAM");
    let again = agent.run(&target, b"").await;
    assert_eq!(again.cached_tokens, 20, "five blocks reloaded from host RAM");
    assert_same(&cold, &again);
    assert_eq!(agent.engine.stats().host_hit_tokens_total, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reload_on_the_same_and_a_second_agent_is_bit_identical() {
    let redis = RedisServer::start();
    let target = prompt(2, 22);
    let cold = agent(64, 0, None).run(&target, b"t:a").await;
    // No host tier: blocks leaving the pool go straight to Redis.
    let mut a = agent(12, 0, Some(redis.url()));
    assert_same(&cold, &a.run(&target, b"t:a").await);
    a.churn(4).await;
    a.wait_written(&hashes(&target, b"t:a")).await;
    assert!(!a.stored(Tier::Network).is_empty(), "the writer reported network-tier stores");
    let again = a.run(&target, b"t:a").await;
    assert_eq!(again.cached_tokens, 20);
    assert_same(&cold, &again);
    assert_eq!(a.engine.stats().network_hit_tokens_total, 20);

    // A second agent shares the Redis: it serves the prefix it never computed.
    let mut b = agent(64, 0, Some(redis.url()));
    let on_b = b.run(&target, b"t:a").await;
    assert_eq!(on_b.cached_tokens, 20);
    assert_same(&cold, &on_b);

    // Another tenant sending the same prompt gets nothing from any tier.
    let mut c = agent(64, 0, Some(redis.url()));
    let other_tenant = c.run(&target, b"t:b").await;
    assert_eq!(other_tenant.cached_tokens, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_records_are_misses_deleted_and_recomputed() {
    let redis = RedisServer::start();
    let target = prompt(3, 22);
    let cold = agent(64, 0, None).run(&target, b"").await;
    let mut a = agent(12, 0, Some(redis.url()));
    a.run(&target, b"").await;
    a.churn(4).await;
    let network = a.network.clone().unwrap();
    let hashes = hashes(&target, b"");
    a.wait_written(&hashes).await;
    // Corrupt block 2's record: flip a payload byte.
    let key = network.key(&hashes[2]);
    let raw = redis.command(&[b"GET", key.as_bytes()]).unwrap();
    assert!(raw.starts_with(b"$"), "block 2 is in Redis");
    redis.command(&[b"SETRANGE", key.as_bytes(), b"150", b"\xff\xfe"]).unwrap();
    let mut b = agent(64, 0, Some(redis.url()));
    let result = b.run(&target, b"").await;
    assert_eq!(result.cached_tokens, 8, "blocks 0 and 1 reload; block 2 does not verify");
    assert_same(&cold, &result);
    assert_eq!(redis.command(&[b"EXISTS", key.as_bytes()]).unwrap(), b":0\r\n", "the corrupt record was deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_start_then_back_never_fails_a_request() {
    let target = prompt(4, 22);
    let cold = agent(64, 0, None).run(&target, b"").await;
    // Nothing listens on this port yet.
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/0");
    let mut a = agent(12, 0, Some(url));
    for _ in 0..3 {
        assert_same(&cold, &a.run(&target, b"").await);
        a.churn(3).await;
    }
    assert!(!a.network.as_ref().unwrap().is_up());
    // Redis comes up on that port: the tier recovers within the backoff.
    let redis = RedisServer::start_on_port(port);
    let network = a.network.clone().unwrap();
    // The tier probes in the background: it comes back without any traffic.
    wait_for_tier(&network, true, 10).await;
    assert!(network.is_up(), "the tier reconnected");
    a.run(&target, b"").await;
    a.churn(4).await;
    a.wait_written(&hashes(&target, b"")).await;
    let again = a.run(&target, b"").await;
    assert_eq!(again.cached_tokens, 20, "reloaded from the Redis that came back");
    assert_same(&cold, &again);

    // Killed mid-run: requests still complete, from recomputation, and the
    // tier reports itself down.
    let mut redis = redis;
    redis.kill();
    for _ in 0..3 {
        a.churn(2).await;
        assert_same(&cold, &a.run(&target, b"").await);
    }
    wait_for_tier(&network, false, 5).await;
    assert!(!network.is_up(), "a dead Redis is reported down");
    redis.restart();
    wait_for_tier(&network, true, 10).await;
    assert!(network.is_up(), "and up again once it is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_shares_hot_blocks_before_any_eviction() {
    let redis = RedisServer::start();
    let target = prompt(5, 22);
    let hashes = BlockHasher::new(4, "tiny-random", b"").hashes(&target);
    let cold = agent(64, 0, None).run(&target, b"").await;
    let network = Some(NetworkConfig { url: Some(redis.url()), ..network_config() });
    // A large pool: nothing is ever evicted. The prompt is computed once, then reused twice.
    let mut a = agent_with(64, 64, network.clone(), 2);
    for _ in 0..3 {
        assert_same(&cold, &a.run(&target, b"").await);
    }
    a.wait_written(&hashes).await;
    a.settle_writes().await;
    assert_eq!(a.engine.blocks().probe(&hashes).0, 5, "the prompt's blocks are still in the pool");
    let mut written = a.stored(Tier::Network);
    written.sort();
    let mut expected = hashes.clone();
    expected.sort();
    assert_eq!(written, expected, "each of the five hot blocks was written once");
    // Another replica serves the hot prefix from Redis.
    let mut b = agent_with(64, 0, network.clone(), 2);
    let on_b = b.run(&target, b"").await;
    assert_eq!(on_b.cached_tokens, 20);
    assert_same(&cold, &on_b);

    // Off: reuse alone writes nothing.
    let mut c = agent_with(64, 64, network, 0);
    for _ in 0..3 {
        c.run(&prompt(6, 22), b"").await;
    }
    c.settle_writes().await;
    assert!(c.stored(Tier::Network).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_or_failing_redis_never_fails_a_request() {
    let redis = RedisServer::start();
    let target = prompt(7, 22);
    let cold = agent(64, 0, None).run(&target, b"").await;
    let mut a = agent(12, 0, Some(redis.url()));
    a.run(&target, b"").await;
    a.churn(4).await;
    let network = a.network.clone().unwrap();
    a.wait_written(&hashes(&target, b"")).await;

    // Frozen: reads time out, the request is recomputed, and it completes while Redis is still frozen.
    redis.pause();
    let frozen = tokio::time::timeout(Duration::from_secs(10), a.run(&target, b"")).await;
    redis.resume();
    let frozen = frozen.expect("a request completes while Redis is frozen");
    assert_eq!(frozen.cached_tokens, 0);
    assert_same(&cold, &frozen);

    // Refusing writes (out of memory, no eviction): spills fail, requests do not.
    wait_for_tier(&network, true, 10).await;
    assert!(network.is_up(), "the tier came back after the freeze");
    redis.command(&[b"CONFIG", b"SET", b"maxmemory-policy", b"noeviction"]).unwrap();
    redis.command(&[b"CONFIG", b"SET", b"maxmemory", b"1"]).unwrap();
    for seed in 0..3 {
        let other = prompt(100 + seed, 22);
        a.run(&other, b"").await;
        a.churn(4).await;
        assert_same(&cold, &a.run(&target, b"").await);
    }
    redis.command(&[b"CONFIG", b"SET", b"maxmemory", b"0"]).unwrap();
    wait_for_tier(&network, true, 10).await;
    assert!(network.is_up(), "the tier recovers once Redis accepts writes again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_tier_shares_blocks_across_agents() {
    let cluster = RedisCluster::start(3);
    let target = prompt(8, 22);
    let cold = agent(64, 0, None).run(&target, b"").await;
    let config = NetworkConfig { cluster_nodes: cluster.node_urls(), ..network_config() };
    let mut a = agent_with(12, 0, Some(config.clone()), 0);
    a.run(&target, b"").await;
    a.churn(4).await;
    a.wait_written(&hashes(&target, b"")).await;
    assert!(!a.stored(Tier::Network).is_empty());
    let holding =
        cluster.nodes.iter().filter(|node| node.command(&[b"DBSIZE"]).is_ok_and(|reply| reply != b":0\r\n")).count();
    assert!(holding >= 2, "blocks are spread over the cluster's nodes ({holding} hold keys)");
    let mut b = agent_with(64, 0, Some(config), 0);
    let on_b = b.run(&target, b"").await;
    assert_eq!(on_b.cached_tokens, 20);
    assert_same(&cold, &on_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_client_logs_in_selects_the_database_and_reports_refusals() {
    use kvroute_node_agent::tiers::resp::{Op, Reply};
    use kvroute_node_agent::tiers::resp_client::RespPool;
    let redis = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let port = redis.port();
    let set = |key: &str, value: &[u8]| Op::Set {
        key: key.into(),
        head: value[..1].to_vec(),
        body: Arc::new(value[1..].to_vec()),
        ttl_seconds: Some(60),
    };
    let db3 = RespPool::from_url(&format!("redis://:s3cret@127.0.0.1:{port}/3"), 1024).unwrap();
    let replies = db3.run(&[set("k", b"value"), Op::Get("k".into()), Op::Get("missing".into())]).await.unwrap();
    assert_eq!(replies[1], Reply::Bulk(Some(b"value".to_vec())), "head and body joined");
    assert_eq!(replies[2], Reply::Bulk(None));
    let db0 = RespPool::from_url(&format!("redis://:s3cret@127.0.0.1:{port}/0"), 1024).unwrap();
    assert_eq!(db0.run(&[Op::Get("k".into())]).await.unwrap(), vec![Reply::Bulk(None)], "another database");
    let wrong = RespPool::from_url(&format!("redis://:nope@127.0.0.1:{port}/0"), 1024).unwrap();
    let error = wrong.run(&[Op::Ping]).await.unwrap_err().to_string();
    assert!(error.contains("refused"), "{error}");
    let anonymous = RespPool::from_url(&format!("redis://127.0.0.1:{port}/0"), 1024).unwrap();
    let error = anonymous.run(&[Op::Ping]).await.unwrap_err().to_string();
    assert!(error.contains("NOAUTH"), "{error}");
    // A value past the client's limit is a protocol error, not an allocation of whatever size was announced.
    db3.run(&[set("big", &[7u8; 4096])]).await.unwrap();
    let error = db3.run(&[Op::Get("big".into())]).await.unwrap_err().to_string();
    assert!(error.contains("exceeds"), "{error}");
    assert!(RespPool::from_url("unix:///tmp/redis.sock", 1024).is_err(), "only TCP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_gone_from_redis_is_reported_removed() {
    let redis = RedisServer::start();
    let target = prompt(9, 22);
    let cold = agent(64, 0, None).run(&target, b"").await;
    let mut a = agent(12, 0, Some(redis.url()));
    a.run(&target, b"").await;
    a.churn(4).await;
    let hashes = hashes(&target, b"");
    a.wait_written(&hashes).await;
    // Block 2 expires (or Redis evicts it): no event tells anyone.
    let key = a.network.as_ref().unwrap().key(&hashes[2]);
    redis.command(&[b"DEL", key.as_bytes()]).unwrap();
    // The next agent to look for it finds the gap, serves what precedes it, and reports the block gone.
    let mut b = agent(64, 0, Some(redis.url()));
    let result = b.run(&target, b"").await;
    assert_eq!(result.cached_tokens, 8);
    assert_same(&cold, &result);
    assert_eq!(b.removed(Tier::Network), vec![hashes[2]]);
}
