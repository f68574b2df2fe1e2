//! `kvroute-fuzz`: runs fuzz targets for a bounded time (or number of inputs) each. A crashing input
//! is written to `--artifacts/TARGET/crash-HASH` and the exit status is 1; copy
//! it to `fuzz/regressions/TARGET/` once fixed, and the tests replay it.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kvroute_fuzz::{Budget, RunConfig, crash_name, fuzz, read_inputs, regressions_dir, targets};

#[derive(Debug, Parser)]
#[command(name = "kvroute-fuzz", about = "Fuzz kvroute's parsers of outside bytes for a bounded time.")]
struct Args {
    /// Targets to run (`all`, or names: request_json, wire_messages, event_stream, block_record, redis_reply, gguf,
    /// engine_events, engine_http).
    #[arg(default_value = "all")]
    targets: Vec<String>,
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Mutated inputs per target instead of a time: a run that repeats exactly for its seed.
    #[arg(long)]
    executions: Option<u64>,
    /// Seed of the mutations (a run repeats for its seed, up to timing; exactly with --executions).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Longest input, in bytes.
    #[arg(long, default_value_t = 4096)]
    max_len: usize,
    /// Print each new outcome (what the fuzzer treats as new behaviour).
    #[arg(long)]
    verbose: bool,
    /// Where crashing inputs are written.
    #[arg(long, default_value = "fuzz/artifacts")]
    artifacts: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let selected: Vec<targets::Target> = if args.targets.iter().any(|name| name == "all") {
        targets::all()
    } else {
        args.targets
            .iter()
            .map(|name| {
                targets::by_name(name).ok_or_else(|| {
                    let names: Vec<&str> = targets::all().iter().map(|target| target.name).collect();
                    anyhow::anyhow!("unknown target {name:?}; one of {}", names.join(", "))
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    // Panics are findings, reported below with their input; the default hook would print each one twice.
    std::panic::set_hook(Box::new(|_| {}));
    let mut crashed = false;
    for target in selected {
        let regressions = read_inputs(&regressions_dir(target.name)).into_iter().map(|(_, bytes)| bytes).collect();
        let budget = match args.executions {
            Some(count) => Budget::Executions(count),
            None => Budget::Time(Duration::from_secs(args.seconds)),
        };
        let config = RunConfig { budget, seed: args.seed, max_len: args.max_len, verbose: args.verbose };
        let report = fuzz(&target, config, regressions);
        println!(
            "{:<14} {:>9} executions  {:>5} inputs kept  {:>5} distinct outcomes  {}",
            target.name,
            report.executions,
            report.corpus,
            report.outcomes,
            if report.crash.is_some() { "CRASH" } else { "ok" }
        );
        if let Some((input, message)) = report.crash {
            crashed = true;
            let dir = args.artifacts.join(target.name);
            std::fs::create_dir_all(&dir)?;
            let path = dir.join(crash_name(&input));
            std::fs::write(&path, &input)?;
            println!("  panic: {message}\n  input: {}", path.display());
        }
    }
    if crashed {
        std::process::exit(1);
    }
    Ok(())
}
