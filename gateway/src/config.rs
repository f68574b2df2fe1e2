//! Configuration of `gateway` (serving); every default lives here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kvroute_proto::DEFAULT_BLOCK_SIZE;
use kvroute_proto::block_hash::MAX_BLOCK_SIZE;

use crate::chat::ToolOrder;
use crate::doctor::{DEFAULT_MAX_TENANTS, DEFAULT_WINDOW_MS, DoctorConfig};
use crate::request_checks::{DEFAULT_MAX_MESSAGES, Limits};
use crate::routing::index::MAX_REPLICAS;
use crate::routing::{DEFAULT_PENDING_TTL_MS, IndexConfig, PolicyKind};
use crate::service::ServiceConfig;
use crate::upstream::PoolConfig;

/// A secret from the command line or the environment, kept out of `Debug` output and logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(text: &str) -> Result<Secret, Self::Err> {
        Ok(Secret(text.to_string()))
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// HTTP listen address (OpenAI-compatible API, /health, /ready, /metrics).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
    /// gRPC listen address (kvroute.v1.Generate, with reflection).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub grpc_addr: SocketAddr,
    /// Node-agents as host:port, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub agents: Vec<String>,
    /// A DNS name:port re-resolved periodically (e.g. a Kubernetes headless service).
    #[arg(long)]
    pub agents_dns: Option<String>,
    /// A file of node-agent addresses (`host:port` per line, `#` comments) re-read periodically.
    #[arg(long)]
    pub agents_file: Option<PathBuf>,
    /// Seconds between DNS re-resolutions (and re-reads of --agents-file); fractions allowed.
    #[arg(long, default_value_t = 5.0)]
    pub dns_interval_secs: f64,
    /// Served model id; default: the first replica's.
    #[arg(long)]
    pub model_id: Option<String>,
    /// Tokenizer: `builtin` (cl100k_base), the `.gguf` model file the agents serve, or a `tokenizer.json`.
    #[arg(long, default_value = "builtin")]
    pub tokenizer: String,
    /// Tokens per KV block; replicas with another block size are refused.
    #[arg(
        long,
        default_value_t = DEFAULT_BLOCK_SIZE,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BLOCK_SIZE))
    )]
    pub block_size: u32,
    /// Routing policy.
    #[arg(long, default_value = "cache_aware", value_parser = parse_policy)]
    pub policy: PolicyKind,
    /// API keys file (`KEY TENANT [private|global|off]` per line); none: open mode.
    #[arg(long)]
    pub api_keys: Option<PathBuf>,
    /// Largest accepted request in bytes: an HTTP body, or a gRPC request message.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Most messages in one chat request; more are answered 400. The default leaves room for long agent
    /// sessions while bounding the work of rendering one request.
    #[arg(long, default_value_t = DEFAULT_MAX_MESSAGES)]
    pub max_messages: usize,
    /// Async worker threads serving connections (default: the cores this process may use). Parsing,
    /// rendering and tokenizing run on separate, bounded threads.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: Option<u16>,
    /// The operator's key for `/debug/route`, which shows what every replica caches; without one
    /// `/debug/route` is off. It must differ from every tenant key. Prefer the environment variable: a
    /// command line is visible to every local user.
    #[arg(long, env = "KVROUTE_ADMIN_API_KEY", hide_env_values = true)]
    pub admin_api_key: Option<Secret>,
    /// A client must send its request headers within this many milliseconds of starting them
    /// (or of its previous response, on a kept-alive connection), or the connection is closed.
    #[arg(long, default_value_t = 30_000)]
    pub header_read_timeout_ms: u64,
    /// A client must send its whole request body within this many milliseconds (else HTTP 408, or gRPC
    /// DEADLINE_EXCEEDED).
    #[arg(long, default_value_t = 30_000)]
    pub body_read_timeout_ms: u64,
    /// Block hashes kept in the prefix index. Its table is allocated for this cap at start: about
    /// 12 + 34 x ceil(R / 64) bytes per entry for R = --index-max-replicas (149 bytes at the default 256).
    #[arg(long, default_value_t = IndexConfig::default().max_entries)]
    pub index_max_entries: usize,
    /// Replicas the gateway tracks at once (their ids are reused as replicas come and go).
    #[arg(long, default_value_t = IndexConfig::default().max_replicas, value_parser = parse_max_replicas)]
    pub index_max_replicas: usize,
    /// A replica whose event stream is quiet this long is unhealthy (milliseconds).
    #[arg(long, default_value_t = PoolConfig::default().heartbeat_timeout.as_millis() as u64)]
    pub heartbeat_timeout_ms: u64,
    /// How long routed blocks count as pending on their replica (milliseconds).
    #[arg(long, default_value_t = DEFAULT_PENDING_TTL_MS)]
    pub pending_ttl_ms: u64,
    /// Longest wait for a replica's first token before the request moves to the next replica (milliseconds);
    /// the abandoned attempt's work is dropped by that replica at its next step.
    #[arg(long, default_value_t = ServiceConfig::default().first_token_timeout.as_millis() as u64)]
    pub first_token_timeout_ms: u64,
    /// How long a stream may go without a token before the gateway checks its replica is alive (milliseconds):
    /// a replica whose heartbeats stopped loses the stream then; a live one keeps it for up to
    /// --first-token-timeout-ms of silence.
    #[arg(long, default_value_t = ServiceConfig::default().inter_token_timeout.as_millis() as u64)]
    pub inter_token_timeout_ms: u64,
    /// Replicas tried per request before giving up.
    #[arg(long, default_value_t = ServiceConfig::default().max_attempts)]
    pub max_attempts: usize,
    /// max_tokens when a request gives none.
    #[arg(long, default_value_t = ServiceConfig::default().default_max_tokens)]
    pub default_max_tokens: u32,
    /// Seed of the routing tie-break RNG.
    #[arg(long, default_value_t = 0x6b76_726f_7574_65)]
    pub seed: u64,
    /// Seconds to let in-flight requests finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace_secs: u64,
    /// PEM certificate chain of the HTTP and gRPC ingress; with `--tls-key`, both listeners speak TLS only.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate that signed the agents' certificates: the gateway then reaches agents over TLS.
    #[arg(long)]
    pub agent_tls_ca: Option<PathBuf>,
    /// Name the agents' certificates are checked against (default: the host of each agent address).
    #[arg(long, requires = "agent_tls_ca")]
    pub agent_tls_domain: Option<String>,
    /// Tenants the prefix-cache doctor tracks at once (the least recently seen one makes room); each takes at
    /// most about 0.42 MB (docs/operations.md).
    #[arg(long, default_value_t = DEFAULT_MAX_TENANTS)]
    pub doctor_max_tenants: usize,
    /// The prefix-cache doctor's sliding window, in seconds: its counts, the prompts it compares, and how
    /// long a prompt change stays reported.
    #[arg(long, default_value_t = DEFAULT_WINDOW_MS / 1000)]
    pub doctor_window_secs: u64,
    /// Tenants whose prefix-cache figures get metrics of their own (a `tenant` label), comma-separated;
    /// the others count only in the fleet's.
    #[arg(long, value_delimiter = ',')]
    pub doctor_tenant_metrics: Vec<String>,
    /// `/debug/prefix-report` never shows token text, only its length and a digest (as with `?redact=true`).
    #[arg(long)]
    pub doctor_redact: bool,
    /// The order chat requests' tools are rendered in: `canonical` (sorted by name, so that the order a
    /// client lists them in cannot change the prompt's tokens) or `as-sent` (the request's order: only to
    /// reproduce what unstable ordering does to the prefix cache).
    #[arg(long, default_value = "canonical", value_parser = parse_tool_order)]
    pub tool_order: ToolOrder,
    /// Parse and check the configuration, then exit.
    #[arg(long)]
    pub check_config: bool,
}

fn parse_max_replicas(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(count) if (1..=MAX_REPLICAS).contains(&count) => Ok(count),
        _ => Err(format!("must be a whole number from 1 to {MAX_REPLICAS}")),
    }
}

fn parse_tool_order(name: &str) -> Result<ToolOrder, String> {
    ToolOrder::from_name(name).ok_or_else(|| format!("unknown tool order {name:?}; one of canonical, as-sent"))
}

fn parse_policy(name: &str) -> Result<PolicyKind, String> {
    PolicyKind::from_name(name)
        .ok_or_else(|| format!("unknown policy {name:?}; one of {}", PolicyKind::names().join(", ")))
}

impl ServeArgs {
    pub fn validate(&self) -> Result<(), String> {
        if self.agents.is_empty() && self.agents_dns.is_none() && self.agents_file.is_none() {
            return Err("give --agents host:port[,host:port...], --agents-dns name:port or --agents-file PATH".into());
        }
        if self.max_attempts == 0
            || self.first_token_timeout_ms == 0
            || self.inter_token_timeout_ms == 0
            || self.heartbeat_timeout_ms == 0
            || self.index_max_entries == 0
            || self.header_read_timeout_ms == 0
            || self.body_read_timeout_ms == 0
            || self.max_messages == 0
            || self.max_body_bytes == 0
            || self.doctor_max_tenants == 0
            || self.doctor_window_secs == 0
        {
            return Err("--max-attempts, --first-token-timeout-ms, --inter-token-timeout-ms, --heartbeat-timeout-ms, --index-max-entries, \
                        --header-read-timeout-ms, --body-read-timeout-ms, --max-messages, --max-body-bytes, \
                        --doctor-max-tenants and --doctor-window-secs must be positive"
                .into());
        }
        if !(self.dns_interval_secs.is_finite() && self.dns_interval_secs >= 0.01) {
            return Err(format!("--dns-interval-secs must be at least 0.01, got {}", self.dns_interval_secs));
        }
        if let Some(Secret(key)) = &self.admin_api_key
            && (key.is_empty() || key.chars().any(char::is_whitespace))
        {
            return Err("--admin-api-key (KVROUTE_ADMIN_API_KEY) must be non-empty and have no white space".into());
        }
        if let Some(dns) = &self.agents_dns
            && !dns.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
        {
            return Err(format!("--agents-dns {dns:?} is not name:port"));
        }
        Ok(())
    }

    pub fn service_config(&self) -> ServiceConfig {
        ServiceConfig {
            max_attempts: self.max_attempts,
            default_max_tokens: self.default_max_tokens,
            first_token_timeout: Duration::from_millis(self.first_token_timeout_ms),
            inter_token_timeout: Duration::from_millis(self.inter_token_timeout_ms),
        }
    }

    /// The prefix-cache doctor's configuration.
    pub fn doctor(&self) -> DoctorConfig {
        let window_ms = self.doctor_window_secs.saturating_mul(1000);
        DoctorConfig {
            block_size: self.block_size as usize,
            max_tenants: self.doctor_max_tenants,
            window_ms,
            change_hold_ms: window_ms,
            ..DoctorConfig::default()
        }
    }

    pub fn discovery_interval(&self) -> Duration {
        Duration::from_secs_f64(self.dns_interval_secs)
    }

    /// The request limits both ingresses enforce.
    pub fn limits(&self) -> Limits {
        Limits { max_messages: self.max_messages, default_max_tokens: self.default_max_tokens }
    }

    /// The runtime's async worker threads.
    pub fn worker_threads(&self) -> usize {
        self.worker_threads
            .map(usize::from)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
    }

    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_millis(self.heartbeat_timeout_ms)
    }
}
