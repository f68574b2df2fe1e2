//! The `gateway` binary: serves by default; `gateway hash` prints block hashes.

use clap::Parser;
use kvroute_gateway::cli::{Cli, Command, run_hash};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Command::Hash(args)) => run_hash(args, &mut std::io::stdout().lock()),
        None => kvroute_gateway::run::run(cli.serve),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gateway: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
