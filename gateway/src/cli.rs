//! Command-line interface of the `gateway` binary.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use kvroute_proto::block_hash::MAX_BLOCK_SIZE;
use kvroute_proto::{BlockHasher, DEFAULT_BLOCK_SIZE};

use crate::tokenizer::Tokenizer;

#[derive(Debug, Parser)]
#[command(name = "gateway", version, about = "kvroute gateway: cache-aware routing for LLM replicas")]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: crate::config::ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the v1 block-hash chain of a prompt: one 32-hex-character hash per full block.
    Hash(HashArgs),
}

#[derive(Debug, Args)]
pub struct HashArgs {
    /// Served model id (part of every hash).
    #[arg(long)]
    pub model: String,
    /// Cache-sharing scope: empty for global, `t:<tenant>`, optionally `|s:<salt>`.
    #[arg(long, default_value = "")]
    pub scope: String,
    /// Tokens per block.
    #[arg(
        long,
        default_value_t = DEFAULT_BLOCK_SIZE,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BLOCK_SIZE))
    )]
    pub block_size: u32,
    /// Comma-separated token ids.
    #[arg(long, conflicts_with = "text", required_unless_present = "text", value_delimiter = ',')]
    pub tokens: Option<Vec<u32>>,
    /// Text to tokenize with the configured tokenizer first.
    #[arg(long)]
    pub text: Option<String>,
    /// Tokenizer: `builtin` (cl100k_base), a `.gguf` model file, or a `tokenizer.json`.
    #[arg(long, default_value = "builtin")]
    pub tokenizer: String,
}

/// Loads a tokenizer from a `--tokenizer` value.
pub fn load_tokenizer(source: &str) -> anyhow::Result<Tokenizer> {
    if source == "builtin" {
        return Ok(Tokenizer::builtin());
    }
    let path = PathBuf::from(source);
    let tokenizer = if path.extension().is_some_and(|ext| ext == "gguf") {
        Tokenizer::from_gguf_path(&path)?
    } else {
        Tokenizer::from_tokenizer_json(&path)?
    };
    Ok(tokenizer)
}

/// Runs `gateway hash`, writing the hashes to `out`.
pub fn run_hash(args: &HashArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let tokens = match (&args.tokens, &args.text) {
        (Some(tokens), _) => tokens.clone(),
        (None, Some(text)) => load_tokenizer(&args.tokenizer)?.encode(text),
        (None, None) => anyhow::bail!("give --tokens or --text"),
    };
    let hasher = BlockHasher::new(args.block_size, &args.model, args.scope.as_bytes());
    for hash in hasher.hashes(&tokens) {
        writeln!(out, "{hash}")?;
    }
    Ok(())
}
