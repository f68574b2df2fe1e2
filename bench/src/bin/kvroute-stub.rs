//! kvroute-stub: an OpenAI-compatible stub engine that answers every request at once with a canned reply,
//! keeps a prefix cache and publishes vLLM-format KV events, for measuring routers' own cost.
//!
//! kvroute-stub --listen 127.0.0.1:8300 --kv-events 127.0.0.1:8301 --model-dir ~/.cache/kvroute/models/SmolLM2-135M-Instruct-hf

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use kvroute_bench::stub::publisher::Publisher;
use kvroute_bench::stub::server::{Stub, StubConfig, router};
use kvroute_tokenizer::Tokenizer;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "kvroute-stub", about = "An OpenAI-compatible stub engine with instant canned answers")]
struct Args {
    /// HTTP address to serve on.
    #[arg(long, default_value = "127.0.0.1:8300")]
    listen: SocketAddr,
    /// Address of the ZeroMQ PUB socket for KV events (vLLM's format); none when not given.
    #[arg(long)]
    kv_events: Option<SocketAddr>,
    /// Model directory with `tokenizer.json` (and the chat template in `tokenizer_config.json`).
    #[arg(long)]
    model_dir: PathBuf,
    /// Name the model is served under (default: the model directory's name, less a `-hf` suffix).
    #[arg(long)]
    model: Option<String>,
    /// Context length: longer prompts are refused.
    #[arg(long, default_value_t = 8192)]
    max_model_len: u32,
    /// Tokens per KV block (a multiple of 16 for kvroute's agent).
    #[arg(long, default_value_t = kvroute_proto::block_hash::DEFAULT_BLOCK_SIZE as usize)]
    block_size: usize,
    /// KV blocks the prefix cache holds.
    #[arg(long, default_value_t = 65536)]
    blocks: usize,
    /// Worker threads of the HTTP server.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let args = Args::parse();
    anyhow::ensure!(args.block_size > 0 && args.blocks > 0, "--block-size and --blocks must be positive");
    let tokenizer_path = args.model_dir.join("tokenizer.json");
    let tokenizer = Tokenizer::from_tokenizer_json(&tokenizer_path)
        .map_err(|error| anyhow::anyhow!("loading {}: {error}", tokenizer_path.display()))?;
    let model = args.model.clone().unwrap_or_else(|| {
        let name = args.model_dir.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        name.strip_suffix("-hf").map(str::to_string).unwrap_or(name)
    });
    let config =
        StubConfig { model, max_model_len: args.max_model_len, block_size: args.block_size, blocks: args.blocks };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads.max(1)).enable_all().build()?;
    runtime.block_on(async move {
        let publisher = match args.kv_events {
            Some(address) => Some(Publisher::serve(
                tokio::net::TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?,
            )),
            None => None,
        };
        let stub = Arc::new(Stub::new(config, tokenizer, publisher)?);
        let listener =
            tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
        tracing::info!(listen = %args.listen, kv_events = ?args.kv_events, "kvroute-stub serving");
        axum::serve(listener, router(stub))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        Ok(())
    })
}
