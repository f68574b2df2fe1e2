//! Command-line configuration of the `node-agent` binary; every default lives here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use kvroute_proto::DEFAULT_BLOCK_SIZE;
use kvroute_proto::block_hash::MAX_BLOCK_SIZE;
use kvroute_proto::domain::KvDtype;

use crate::capacity::parse_bytes;
use crate::engine::{DEFAULT_WRITE_THROUGH_HITS, EngineConfig, PreemptionMode};
use crate::external::EngineKind;
use crate::tiers::network::NetworkConfig;

#[derive(Debug, Parser)]
#[command(name = "node-agent", version, about = "kvroute node-agent: the paged KV-cache engine of one replica")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Concurrent sequences a KV budget holds, contiguous against paged.
    Capacity(CapacityArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:50061")]
    pub listen: SocketAddr,
    /// Prometheus metrics listen address (`GET /metrics`); off when absent.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// `tiny-random` or a path to a llama-architecture GGUF file.
    #[arg(long, default_value = "tiny-random")]
    pub model: String,
    /// Threads the model's products run on (default: every core this process may use). Several agents
    /// sharing a machine each want their share, not all of it.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub compute_threads: Option<u32>,
    /// Name of this agent in events and logs (default: agent-<port>).
    #[arg(long)]
    pub agent_id: Option<String>,
    /// KV pool size in bytes (e.g. 256MiB); ignored when --num-blocks is given.
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    pub kv_cache_bytes: u64,
    /// KV pool size in blocks.
    #[arg(long)]
    pub num_blocks: Option<usize>,
    /// Tokens per KV block (the built-in engine; with `--engine vllm|sglang` only the default is accepted).
    #[arg(
        long,
        default_value_t = DEFAULT_BLOCK_SIZE,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BLOCK_SIZE))
    )]
    pub block_size: u32,
    /// KV element type: bf16, fp8 (e4m3) or f32.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    pub kv_dtype: KvDtype,
    /// How a sequence preempted for lack of blocks gets its KV back.
    #[arg(long, value_enum, default_value_t = PreemptionMode::Recompute)]
    pub preemption: PreemptionMode,
    /// Tokens computed per step across the batch.
    #[arg(long, default_value_t = EngineConfig::default().max_batch_tokens)]
    pub max_batch_tokens: usize,
    /// Sequences running at once.
    #[arg(long, default_value_t = EngineConfig::default().max_running)]
    pub max_running: usize,
    /// Requests queued before new ones are refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = EngineConfig::default().max_waiting)]
    pub max_waiting: usize,
    /// New requests are refused (RESOURCE_EXHAUSTED, which gateways answer with 429 when every replica
    /// refuses) while a queued request has waited longer than this many milliseconds; 0 turns it off.
    #[arg(long, default_value_t = EngineConfig::default().max_queue_delay.map_or(0, |delay| delay.as_millis() as u64))]
    pub max_queue_delay_ms: u64,
    /// Fraction of the pool kept free at admission for decode growth.
    #[arg(long, default_value_t = EngineConfig::default().watermark)]
    pub watermark: f64,
    /// Longest sequence in tokens (default: the model's context length).
    #[arg(long)]
    pub max_context: Option<usize>,
    /// Host-RAM tier (G2) size in bytes; 0 turns it off.
    #[arg(long, default_value = "512MiB", value_parser = parse_bytes)]
    pub host_cache_bytes: u64,
    /// Shared network tier (G3) on a standalone Redis: redis://host:port/db.
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Shared network tier on a Redis Cluster: comma-separated node URLs.
    #[arg(long, value_delimiter = ',')]
    pub redis_cluster_nodes: Vec<String>,
    /// Prefix of every key the agent writes to Redis.
    #[arg(long, default_value_t = NetworkConfig::default().key_prefix)]
    pub redis_key_prefix: String,
    /// Expiry of blocks in Redis, in seconds; none when absent.
    #[arg(long)]
    pub redis_ttl: Option<u64>,
    /// Write a pool block to Redis as soon as new requests have reused it this many times, so a hot prefix
    /// reaches the other replicas before it is evicted; 0 writes blocks only when host RAM evicts them.
    #[arg(long, default_value_t = DEFAULT_WRITE_THROUGH_HITS)]
    pub redis_write_through_hits: u32,
    /// Blocks queued for writing to Redis before spills are dropped.
    #[arg(long, default_value_t = NetworkConfig::default().queue_capacity)]
    pub redis_queue: usize,
    /// Upper bound on one Redis round trip, in milliseconds.
    #[arg(long, default_value_t = NetworkConfig::default().timeout.as_millis() as u64)]
    pub redis_timeout_ms: u64,
    /// Bytes of blocks fetched from Redis that requests waiting for admission may hold at once (e.g. 256MiB);
    /// past it, the rest of a prompt is recomputed instead of fetched.
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    pub prefetch_budget_bytes: u64,
    /// Append each engine step's cost (new tokens, sampled sequences, attention work, seconds) to FILE as
    /// one JSON line: the records `bench/fit-step-profile.py` fits a simulator profile to. Built-in engine only.
    #[arg(long, value_name = "FILE")]
    pub step_log: Option<PathBuf>,
    /// Threads of the async runtime that serves gRPC and metrics (default: the cores this process may
    /// use). The engine and the event publisher have threads of their own.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub worker_threads: Option<u32>,
    /// PEM certificate chain of the gRPC listener; with `--tls-key`, it speaks TLS only.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The engine this agent serves: `builtin` (kvroute's own, on this process's CPU), or an engine server
    /// beside it that the agent presents as an ordinary replica: `vllm` or `sglang`.
    #[arg(long, value_enum, default_value_t = EngineKind::Builtin)]
    pub engine: EngineKind,
    /// Base URL of the engine server's HTTP API (with `--engine vllm|sglang`), e.g. http://127.0.0.1:8000.
    #[arg(long)]
    pub engine_url: Option<String>,
    /// The engine's ZMQ KV-event publisher, e.g. tcp://127.0.0.1:5557.
    #[arg(long)]
    pub engine_kv_events: Option<String>,
    /// The engine's ZMQ KV-event replay socket, e.g. tcp://127.0.0.1:5558: sequence gaps are repaired from
    /// it (without it a gap clears this replica's index and it relearns).
    #[arg(long)]
    pub engine_kv_replay: Option<String>,
    /// Directory of the served model in Hugging Face layout (`tokenizer.json`, `tokenizer_config.json`
    /// with the chat template, `config.json`): the agent checks the engine tokenizes as this does.
    #[arg(long)]
    pub model_dir: Option<PathBuf>,
    /// The model name the engine serves under (default: the only one its `/v1/models` lists).
    #[arg(long)]
    pub engine_model: Option<String>,
    /// Seconds to wait at start for the engine to answer (it may still be loading its model).
    #[arg(long, default_value_t = 600)]
    pub engine_start_timeout_secs: u64,
    /// Sequences the engine runs at once at most (vLLM `--max-num-seqs`, SGLang `--max-running-requests`),
    /// reported to gateways so that routing predicts the wait for a running slot. SGLang's is read from its
    /// `/server_info` unless this is given; vLLM publishes none, so without this a vLLM replica's cap is
    /// unknown and routing predicts no slot wait there.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub engine_max_running: Option<u32>,
    /// How often (ms) the agent reads its engine's `/health` and `/metrics` (the load gauges it reports, and
    /// the liveness check: three failed reads in a row mark the engine down).
    #[arg(long, default_value_t = crate::external::DEFAULT_POLL_INTERVAL.as_millis() as u64, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub engine_poll_ms: u64,
    /// Parse and check the configuration, then exit.
    #[arg(long)]
    pub check_config: bool,
}

fn parse_dtype(text: &str) -> Result<KvDtype, String> {
    text.parse::<KvDtype>().map_err(|error| error.to_string())
}

impl ServeArgs {
    /// Checks what clap's types cannot.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..0.5).contains(&self.watermark) {
            return Err(format!("--watermark must be in [0, 0.5), got {}", self.watermark));
        }
        if self.max_batch_tokens == 0 || self.max_running == 0 {
            return Err("--max-batch-tokens and --max-running must be positive".into());
        }
        if self.num_blocks == Some(0) || (self.num_blocks.is_none() && self.kv_cache_bytes == 0) {
            return Err("the KV pool must hold at least one block".into());
        }
        for url in self.redis_url.iter().chain(&self.redis_cluster_nodes) {
            if !url.starts_with("redis://") {
                return Err(format!("{url:?} is not a redis:// URL (TLS is not supported)"));
            }
        }
        if let Some(url) = &self.redis_url {
            crate::tiers::resp_client::RespPool::from_url(url, 0).map_err(|error| format!("--redis-url: {error}"))?;
        }
        if self.redis_queue == 0 || self.redis_timeout_ms == 0 {
            return Err("--redis-queue and --redis-timeout-ms must be positive".into());
        }
        self.validate_engine()
    }

    fn validate_engine(&self) -> Result<(), String> {
        let external = [
            ("--engine-url", self.engine_url.is_some()),
            ("--engine-kv-events", self.engine_kv_events.is_some()),
            ("--model-dir", self.model_dir.is_some()),
        ];
        if self.engine == EngineKind::Builtin {
            let extra = [
                ("--engine-kv-replay", self.engine_kv_replay.is_some()),
                ("--engine-max-running", self.engine_max_running.is_some()),
            ];
            return match external.iter().chain(&extra).filter(|(_, given)| *given).map(|(flag, _)| *flag).next() {
                Some("--engine-max-running") => {
                    Err("--engine-max-running is for --engine vllm|sglang; the built-in engine's is --max-running"
                        .into())
                }
                Some(flag) => Err(format!("{flag} needs --engine vllm or --engine sglang")),
                None => Ok(()),
            };
        }
        if let Some((flag, _)) = external.iter().find(|(_, given)| !given) {
            return Err(format!("--engine {} needs {flag}", self.engine.name()));
        }
        if self.step_log.is_some() {
            return Err(format!("--step-log records the built-in engine's steps, not --engine {}", self.engine.name()));
        }
        if self.block_size != DEFAULT_BLOCK_SIZE {
            return Err(format!(
                "--block-size {} with --engine {}: the agent presents the engine's cache in kvroute's blocks of \
                 {DEFAULT_BLOCK_SIZE} tokens; the engine's own block size (a multiple of {DEFAULT_BLOCK_SIZE}) is \
                 set on the engine (vLLM --block-size, SGLang --page-size)",
                self.block_size,
                self.engine.name()
            ));
        }
        let url = self.engine_url.as_deref().unwrap_or_default();
        crate::external::http::Endpoint::parse(url).map_err(|error| format!("--engine-url: {error}"))?;
        for (flag, value) in
            [("--engine-kv-events", &self.engine_kv_events), ("--engine-kv-replay", &self.engine_kv_replay)]
        {
            if let Some(value) = value {
                crate::engine_events::socket::tcp_address(value).map_err(|error| format!("{flag}: {error}"))?;
            }
        }
        Ok(())
    }

    /// The network tier's settings, when one is configured.
    pub fn network_config(&self) -> Option<NetworkConfig> {
        if self.redis_url.is_none() && self.redis_cluster_nodes.is_empty() {
            return None;
        }
        Some(NetworkConfig {
            url: self.redis_url.clone(),
            cluster_nodes: self.redis_cluster_nodes.clone(),
            key_prefix: self.redis_key_prefix.clone(),
            ttl: self.redis_ttl.map(std::time::Duration::from_secs),
            queue_capacity: self.redis_queue,
            timeout: std::time::Duration::from_millis(self.redis_timeout_ms),
        })
    }

    pub fn engine_config(&self, model_context: usize) -> EngineConfig {
        EngineConfig {
            max_batch_tokens: self.max_batch_tokens,
            max_running: self.max_running,
            max_waiting: self.max_waiting,
            max_queue_delay: (self.max_queue_delay_ms > 0).then(|| Duration::from_millis(self.max_queue_delay_ms)),
            watermark: self.watermark,
            preemption: self.preemption,
            max_context: self.max_context.unwrap_or(model_context).min(model_context),
            capture_logits: false,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct CapacityArgs {
    #[arg(long)]
    pub layers: u64,
    /// Query heads (default: equal to --kv-heads, i.e. multi-head attention).
    #[arg(long)]
    pub query_heads: Option<u64>,
    #[arg(long)]
    pub kv_heads: u64,
    #[arg(long)]
    pub head_dim: u64,
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    pub kv_dtype: KvDtype,
    /// KV memory budget (e.g. 53GiB).
    #[arg(long, value_parser = parse_bytes)]
    pub memory: u64,
    #[arg(long, default_value_t = u64::from(DEFAULT_BLOCK_SIZE))]
    pub block_size: u64,
    /// Context reserved per sequence by a contiguous allocator.
    #[arg(long, default_value_t = 8192)]
    pub reserved_tokens: u64,
    /// Tokens a sequence actually uses on average.
    #[arg(long)]
    pub used_tokens: u64,
}
