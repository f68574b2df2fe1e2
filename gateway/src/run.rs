//! Wires the gateway together: tokenizer, router, replica pool and discovery,
//! the HTTP and gRPC listeners, and a graceful shutdown on SIGTERM or Ctrl-C.

use std::sync::Arc;
use std::time::Duration;
use tonic::transport::server::TcpIncoming;

use anyhow::Context;

use crate::admin::AdminKey;
use crate::body_deadline::BodyDeadlineLayer;
use crate::chat::ChatRenderer;
use crate::config::{Secret, ServeArgs};
use crate::cpu_pool::CpuPool;
use crate::doctor_thread::DoctorThread;
use crate::grpc::GenerateService;
use crate::http::AppState;
use crate::prompts::Prompts;
use crate::replies::{DEFAULT_REPLY_MEMORY_TOKENS, ReplyMemory};
use crate::router::Router;
use crate::routing::{IndexConfig, Policy, ScoringConfig};
use crate::service::Gateway;
use crate::tenants::Tenants;
use crate::tls::IngressTls;
use crate::upstream::discovery::{self, Source};
use crate::upstream::{Expectations, IndexSink, Pool, PoolConfig};

/// Runs the gateway until SIGTERM or Ctrl-C.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    if args.check_config {
        println!("gateway: configuration ok");
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
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.worker_threads()).enable_all().build()?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let ingress_tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(IngressTls::load(cert, key)?),
        _ => None,
    };
    let agent_tls = args
        .agent_tls_ca
        .as_deref()
        .map(|ca| crate::tls::agent_client_config(ca, args.agent_tls_domain.as_deref()))
        .transpose()?;
    let tokenizer = Arc::new(crate::cli::load_tokenizer(&args.tokenizer).context("loading the tokenizer")?);
    let renderer = ChatRenderer::new(tokenizer.chat_template(), tokenizer.clone())
        .context("compiling the chat template")?
        .with_tool_order(args.tool_order);
    let tenants = match &args.api_keys {
        Some(path) => Tenants::load(path).with_context(|| format!("reading {}", path.display()))?,
        None => Tenants::open(),
    };
    let admin = match &args.admin_api_key {
        Some(Secret(key)) => AdminKey::new(key, &tenants).map_err(anyhow::Error::msg)?,
        None => AdminKey::off(),
    };
    let metrics = crate::metrics::install().context("installing the metrics recorder")?;
    let index = IndexConfig {
        max_entries: args.index_max_entries,
        max_replicas: args.index_max_replicas,
        ..IndexConfig::default()
    };
    let doctor = DoctorThread::start(args.doctor(), args.doctor_tenant_metrics.clone())
        .context("starting the prefix-cache doctor")?;
    let router = Arc::new(Router::new(
        Policy::new(args.policy, ScoringConfig::default()),
        index,
        args.seed,
        args.pending_ttl_ms,
        doctor,
    )?);
    let expectations = Expectations {
        model_id: args.model_id.clone(),
        block_size: args.block_size,
        vocab_size: tokenizer.vocab_size(),
        tokenizer_fingerprint: tokenizer.fingerprint().to_string(),
    };
    let pool_config = PoolConfig {
        heartbeat_timeout: args.heartbeat_timeout(),
        max_replicas: args.index_max_replicas,
        agent_tls,
        ..PoolConfig::default()
    };
    let pool = Pool::new(router.clone() as Arc<dyn IndexSink>, expectations, pool_config)
        .context("starting the index writer")?;
    discovery::add_static(&pool, &args.agents).map_err(anyhow::Error::msg)?;
    let interval = args.discovery_interval();
    let sources =
        args.agents_dns.clone().map(Source::Dns).into_iter().chain(args.agents_file.clone().map(Source::File));
    let watchers: Vec<_> = sources
        .map(|source| tokio::spawn(discovery::watch(pool.clone(), source, interval, args.agents.clone())))
        .collect();
    let gateway = Arc::new(Gateway {
        tokenizer: tokenizer.clone(),
        pool: pool.clone(),
        router: router.clone(),
        config: args.service_config(),
    });
    let prompts = Arc::new(Prompts {
        tokenizer: tokenizer.clone(),
        renderer: Arc::new(renderer),
        replies: Arc::new(ReplyMemory::new(DEFAULT_REPLY_MEMORY_TOKENS)),
    });
    let cpu = Arc::new(CpuPool::for_this_machine());
    let state = Arc::new(AppState {
        gateway: gateway.clone(),
        prompts: prompts.clone(),
        cpu: cpu.clone(),
        limits: args.limits(),
        tenants: tenants.clone(),
        admin: admin.clone(),
        redact_prefix_report: args.doctor_redact,
        metrics: Some(metrics),
        max_body_bytes: args.max_body_bytes,
        body_read_timeout: Duration::from_millis(args.body_read_timeout_ms),
    });

    let http =
        tokio::net::TcpListener::bind(args.http_addr).await.with_context(|| format!("binding {}", args.http_addr))?;
    let grpc =
        tokio::net::TcpListener::bind(args.grpc_addr).await.with_context(|| format!("binding {}", args.grpc_addr))?;
    tracing::info!(
        http = %http.local_addr()?,
        grpc = %grpc.local_addr()?,
        tls = ingress_tls.is_some(),
        policy = router.policy_name(),
        tokenizer = tokenizer.name(),
        agents = args.agents.len(),
        worker_threads = args.worker_threads(),
        debug_endpoints = admin.is_on(),
        "gateway serving"
    );
    let (stop, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut http_stop = stop.subscribe();
    let http_server = crate::http::listener::serve(
        http,
        crate::http::router(state),
        ingress_tls.as_ref().map(IngressTls::http_config).transpose()?,
        Duration::from_millis(args.header_read_timeout_ms),
        async move {
            let _ = http_stop.recv().await;
        },
    );
    // Reflection in both versions (grpcurl speaks v1, grpcio-reflection and other tools v1alpha), listing the
    // services this server has: the descriptor set also holds the agents' service.
    let reflection = |version: &str| {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(kvroute_proto::FILE_DESCRIPTOR_SET)
            .with_service_name("kvroute.v1.Generate")
            .with_service_name(format!("grpc.reflection.{version}.ServerReflection"))
    };
    let reflection_v1alpha = reflection("v1alpha").build_v1alpha()?;
    let reflection = reflection("v1").build_v1()?;
    let generate = GenerateService::new(gateway.clone(), tenants, prompts, cpu, args.limits());
    let mut grpc_stop = stop.subscribe();
    let mut grpc_builder = tonic::transport::Server::builder();
    if let Some(tls) = &ingress_tls {
        grpc_builder = grpc_builder.tls_config(tls.grpc_config()).context("configuring gRPC TLS")?;
    }
    let grpc_server = grpc_builder
        .layer(BodyDeadlineLayer::new(Duration::from_millis(args.body_read_timeout_ms)))
        .add_service(generate.into_server(args.max_body_bytes))
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(TcpIncoming::from(grpc).with_nodelay(Some(true)), async move {
            let _ = grpc_stop.recv().await;
        });
    let http_task = tokio::spawn(http_server);
    let grpc_task = tokio::spawn(grpc_server);
    shutdown_signal().await;
    tracing::info!("shutting down: no new requests; finishing in-flight ones");
    let _ = stop.send(());
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let finished = tokio::time::timeout(grace, async {
        let _ = http_task.await;
        let _ = grpc_task.await;
    })
    .await;
    if finished.is_err() {
        tracing::warn!("grace period over; closing the remaining streams");
    }
    for watcher in watchers {
        watcher.abort();
    }
    pool.shutdown();
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut terminate) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
            let _ = ctrl_c.await;
            return;
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
