//! Wires the agent together: model, KV pool, engine thread, gRPC and metrics
//! servers, and a graceful shutdown on SIGTERM or Ctrl-C.

use std::time::Duration;

use std::sync::Arc;

use anyhow::Context;
use kvroute_proto::DEFAULT_BLOCK_SIZE;
use kvroute_proto::block_record::ModelFingerprint;
use kvroute_proto::domain::{AgentInfo, Tier, TierInfo};

use crate::config::ServeArgs;
use crate::engine::model_executor::ModelExecutor;
use crate::engine::publisher::{Handover, PublisherHandle, fresh_epoch};
use crate::engine::thread::{EngineHandle, SharedSink, StreamIdentity};
use crate::engine::tiering::{PrefetchBudget, SpillFn};
use crate::engine::{Engine, Tiering};
use crate::engine_events::socket::tcp_address;
use crate::engine_events::{Translator, TranslatorConfig};
use crate::external::lock_order::{OrderedMutex, TRANSLATOR};
use crate::external::{self, EngineKind, ExternalEngine, http::Endpoint};
use crate::model::{KvStore, Model};
use crate::prometheus_sink::Prometheus;
use crate::server::AgentService;
use crate::step_log::StepLog;
use crate::tiers::host::HostTier;
use crate::tiers::network::NetworkTier;

/// Runs the agent until SIGTERM or Ctrl-C.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    if args.check_config {
        println!("node-agent: configuration ok");
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: log files and container logs get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let workers = args.worker_threads.map_or_else(default_worker_threads, |threads| threads as usize);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if args.engine != EngineKind::Builtin {
        return serve_external(args).await;
    }
    let grpc_tls = grpc_tls(&args)?;
    let mut model = Model::load(&args.model).with_context(|| format!("loading model {:?}", args.model))?;
    if let Some(threads) = args.compute_threads {
        model.set_threads(threads as usize);
    }
    let compute_threads = model.threads();
    let config = model.config().clone();
    let geometry = config.kv_geometry(args.kv_dtype);
    let block_size = args.block_size as usize;
    let num_blocks =
        args.num_blocks.unwrap_or_else(|| KvStore::blocks_for_bytes(geometry, block_size, args.kv_cache_bytes));
    anyhow::ensure!(
        num_blocks > 0,
        "the KV budget holds no block of {} bytes",
        geometry.bytes_per_block(args.block_size)
    );
    let (agent_id, epoch) = identity(&args);
    let engine_config = args.engine_config(config.max_context);
    let info = AgentInfo {
        agent_id: agent_id.clone(),
        epoch,
        model_id: model.model_id().to_string(),
        block_size: args.block_size,
        kv_geometry: geometry,
        vocab_size: config.vocab_size as u32,
        max_context_tokens: engine_config.max_context as u32,
        tiers: vec![
            TierInfo {
                tier: Tier::Gpu,
                enabled: true,
                capacity_bytes: num_blocks as u64 * geometry.bytes_per_block(args.block_size),
            },
            TierInfo { tier: Tier::Host, enabled: args.host_cache_bytes > 0, capacity_bytes: args.host_cache_bytes },
            TierInfo { tier: Tier::Network, enabled: args.network_config().is_some(), capacity_bytes: 0 },
        ],
        tokenizer_fingerprint: tokenizer_fingerprint(&args.model),
        kv_blocks_total: num_blocks as u64,
        eos_token_ids: model.eos_token_ids().to_vec(),
        engine_block_size: args.block_size,
    };
    if let Some(addr) = args.metrics_addr {
        crate::metrics::install(addr).with_context(|| format!("starting the metrics listener on {addr}"))?;
    }
    let eos = model.eos_token_ids().to_vec();
    let kv = KvStore::new(geometry, num_blocks, block_size);
    let bytes_per_block = kv.bytes_per_block() as u64;
    let sink = SharedSink::default();
    let network = args.network_config().map(|config| {
        let events = sink.clone();
        let fingerprint = ModelFingerprint::new(model.model_id(), &geometry, args.block_size);
        NetworkTier::start(
            config,
            fingerprint,
            args.block_size,
            bytes_per_block,
            Arc::new(move |event| events.push(event)),
        )
    });
    let host = (args.host_cache_bytes > 0).then(|| HostTier::new(args.host_cache_bytes));
    let spill = network.clone().map(|network| Box::new(move |hash, bytes| network.spill(hash, bytes)) as SpillFn);
    let step_log = match &args.step_log {
        Some(path) => {
            Some(Arc::new(StepLog::create(path).with_context(|| format!("creating the step log {}", path.display()))?))
        }
        None => None,
    };
    let engine = Engine::new(engine_config, ModelExecutor::new(model, kv), eos, Box::new(sink.clone()))
        .with_metrics(Arc::new(Prometheus::with_step_log(step_log)))
        .with_tiering(Tiering::new(host, spill).with_write_through(args.redis_write_through_hits));
    let engine =
        EngineHandle::spawn(engine, sink, StreamIdentity { agent_id: agent_id.clone(), epoch }, network.clone())
            .context("starting the engine thread")?;
    let budget = PrefetchBudget::new(args.prefetch_budget_bytes).with_metrics(Arc::new(Prometheus::default()));
    let service = AgentService::new(engine.clone(), info.clone(), network, budget);
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let local = listener.local_addr()?;
    tracing::info!(
        agent_id,
        model = %info.model_id,
        %local,
        num_blocks,
        kv_dtype = %args.kv_dtype,
        block_size,
        compute_threads,
        "node-agent serving"
    );
    serve_agent(listener, service, grpc_tls, shutdown_signal()).await
}

/// This agent's name and epoch (unique per start).
fn identity(args: &ServeArgs) -> (String, u64) {
    let agent_id = args.agent_id.clone().unwrap_or_else(|| format!("agent-{}", args.listen.port()));
    (agent_id, fresh_epoch())
}

/// Serves an engine server beside the agent (`--engine vllm|sglang`): checks it, then presents it.
async fn serve_external(args: ServeArgs) -> anyhow::Result<()> {
    let grpc_tls = grpc_tls(&args)?;
    let endpoint = Endpoint::parse(args.engine_url.as_deref().unwrap_or_default()).map_err(anyhow::Error::msg)?;
    let model_dir = args.model_dir.clone().unwrap_or_default();
    let wait = Duration::from_secs(args.engine_start_timeout_secs);
    let (facts, tokenizer) =
        external::startup::discover(args.engine, endpoint, args.engine_model.as_deref(), &model_dir, wait).await?;
    let facts = external::EngineFacts {
        max_running_requests: args.engine_max_running.unwrap_or(facts.max_running_requests),
        ..facts
    };
    let (agent_id, epoch) = identity(&args);
    let geometry = external::startup::kv_geometry(&model_dir);
    // kvroute's blocks in engine mode: the translator re-hashes the engine's blocks in these (validate()
    // refuses any other --block-size).
    let block_size = DEFAULT_BLOCK_SIZE;
    let info = AgentInfo {
        agent_id: agent_id.clone(),
        epoch,
        model_id: facts.model.clone(),
        block_size,
        kv_geometry: geometry,
        vocab_size: tokenizer.vocab_size(),
        max_context_tokens: facts.max_model_len,
        tiers: vec![
            TierInfo {
                tier: Tier::Gpu,
                enabled: true,
                capacity_bytes: facts.kv_blocks_total * geometry.bytes_per_block(block_size),
            },
            TierInfo { tier: Tier::Host, enabled: false, capacity_bytes: 0 },
            TierInfo { tier: Tier::Network, enabled: false, capacity_bytes: 0 },
        ],
        tokenizer_fingerprint: tokenizer.fingerprint().to_string(),
        kv_blocks_total: facts.kv_blocks_total,
        eos_token_ids: tokenizer.eos_token_ids().to_vec(),
        engine_block_size: facts.engine_block_size,
    };
    if let Some(addr) = args.metrics_addr {
        crate::metrics::install(addr).with_context(|| format!("starting the metrics listener on {addr}"))?;
    }
    let translator = Translator::new(TranslatorConfig::new(facts.model.clone(), facts.engine_block_size))?;
    let translator = Arc::new(OrderedMutex::new(TRANSLATOR, translator));
    let publisher = PublisherHandle::spawn(
        StreamIdentity { agent_id: agent_id.clone(), epoch },
        Arc::default(),
        Arc::default(),
        Handover { next_request_id: 1, ..Handover::default() },
    )
    .context("starting the event publisher")?;
    let engine = ExternalEngine::new(facts.clone(), epoch, publisher, translator.clone());
    let zmq = |endpoint: &Option<String>| endpoint.as_deref().map(tcp_address).transpose();
    let (events, replay) = (zmq(&args.engine_kv_events)?, zmq(&args.engine_kv_replay)?);
    external::events_feed::spawn(engine.clone(), translator, events.unwrap_or_default(), replay)
        .context("starting the engine's event feed")?;
    tokio::spawn(engine.clone().poll(Duration::from_millis(args.engine_poll_ms)));
    let service = AgentService::external(engine, info);
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(
        agent_id,
        engine = args.engine.name(),
        url = %facts.endpoint.url(""),
        model = %facts.model,
        engine_block_size = facts.engine_block_size,
        kv_blocks = facts.kv_blocks_total,
        local = %listener.local_addr()?,
        "node-agent serving its engine"
    );
    serve_agent(listener, service, grpc_tls, shutdown_signal()).await
}

/// Serves `service` (with gRPC reflection, v1 and v1alpha) on `listener` until `shutdown` resolves, then
/// drains its engine (new requests are refused, streams in flight finish) and stops it.
pub async fn serve_agent(
    listener: tokio::net::TcpListener,
    service: AgentService,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    // Reflection in both versions: grpcurl and most tools speak v1, grpcio-reflection (Python) v1alpha.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kvroute_proto::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kvroute_proto::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let engine = service.clone();
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls).context("configuring gRPC TLS")?;
    }
    server
        .add_service(service.clone().into_server())
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            tracing::info!("shutting down: draining");
            engine.drain();
        })
        .await?;
    service.shutdown();
    Ok(())
}

/// Async workers when `--worker-threads` is not given: one per core this process may use.
fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = terminate.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// The fingerprint of the tokenizer that goes with the served model, so that gateways with another
/// tokenizer refuse this agent instead of hashing prompts into blocks it never holds. tiny-random uses the
/// built-in tokenizer's vocabulary; a GGUF file carries its own. Empty (unchecked) when the file's
/// tokenizer is not one kvroute can read: the agent itself works on token ids only.
fn tokenizer_fingerprint(model: &str) -> String {
    let tokenizer = if model == "tiny-random" {
        Ok(kvroute_tokenizer::Tokenizer::builtin())
    } else {
        kvroute_tokenizer::Tokenizer::from_gguf_path(std::path::Path::new(model))
    };
    match tokenizer {
        Ok(tokenizer) => tokenizer.fingerprint().to_string(),
        Err(error) => {
            tracing::warn!(%error, "cannot read the model's tokenizer: gateways will not check theirs against it");
            String::new()
        }
    }
}

/// The gRPC listener's TLS configuration, when `--tls-cert` and `--tls-key` are given.
fn grpc_tls(args: &ServeArgs) -> anyhow::Result<Option<tonic::transport::ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else { return Ok(None) };
    let cert = std::fs::read(cert).with_context(|| format!("reading the certificate {}", cert.display()))?;
    let key = std::fs::read(key).with_context(|| format!("reading the private key {}", key.display()))?;
    let identity = tonic::transport::Identity::from_pem(cert, key);
    Ok(Some(tonic::transport::ServerTlsConfig::new().identity(identity)))
}
