//! The `gateway` binary.

use clap::Parser;
use kvroute_gateway::cli::{Cli, Command, run_hash};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Hash(args) => run_hash(args, &mut std::io::stdout().lock()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gateway: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
