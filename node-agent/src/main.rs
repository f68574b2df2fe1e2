//! The `node-agent` binary: serves one replica's engine over gRPC.

use clap::Parser;
use kvroute_node_agent::capacity::{CapacityInput, capacity};
use kvroute_node_agent::config::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Capacity(args)) => {
            let report = capacity(&CapacityInput {
                layers: args.layers,
                query_heads: args.query_heads.unwrap_or(args.kv_heads),
                kv_heads: args.kv_heads,
                head_dim: args.head_dim,
                dtype: args.kv_dtype,
                budget_bytes: args.memory,
                block_size: args.block_size,
                reserved_tokens: args.reserved_tokens,
                used_tokens: args.used_tokens,
            });
            print!("{report}");
            Ok(())
        }
        None => kvroute_node_agent::run::run(cli.serve),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("node-agent: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
