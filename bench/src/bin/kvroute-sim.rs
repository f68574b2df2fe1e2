//! `kvroute-sim`: replays a trace or a synthetic workload across N simulated replicas under each routing
//! policy, with kvroute's own engine and routing code in virtual time, and reports hit ratios and TTFT.
//!
//!   kvroute-sim --trace FILE --replicas 8 --policy all --profile h100-llama3-8b --rate-scale 4 --json

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kvroute_bench::sim::fleet::DEFAULT_EVENT_LAG;
use kvroute_bench::sim::{
    CostProfile, Fleet, FleetConfig, MODEL_ID, Plan, PolicyResult, SharedPrefix, SimReport, plot,
};
use kvroute_bench::trace;
use kvroute_bench::workload::{WorkloadConfig, WorkloadKind};
use kvroute_gateway::routing::{CostTerms, DEFAULT_PENDING_TTL_MS, PolicyKind, ScoringConfig};

/// The simulator allocates and frees millions of small block records and events: mimalloc does that
/// several times faster than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "kvroute-sim",
    version,
    about = "Simulates routing policies on a fleet, with kvroute's own engine and router"
)]
struct Args {
    /// Mooncake-format JSONL trace to replay.
    #[arg(long, conflicts_with = "workload", required_unless_present = "workload")]
    trace: Option<PathBuf>,
    /// Synthetic workload instead: shared-prefix, or one of kvroute-load's (chat, agent, rag, fewshot, timestamp-top,
    /// shuffled-tools, prompt-change, ab-split, personalised).
    #[arg(long)]
    workload: Option<String>,
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    replicas: u16,
    /// A policy name, a comma-separated list, or `all`.
    #[arg(long, default_value = "all")]
    policy: String,
    /// A built-in profile (h100-llama3-8b, h100x8-llama3-70b, cpu-tiny-random) or a profile file.
    #[arg(long, default_value = "h100-llama3-8b")]
    profile: String,
    /// Multiplies the arrival rate.
    #[arg(long, default_value_t = 1.0)]
    rate_scale: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Host RAM tier per replica in bytes (overrides the profile; 0 turns it off).
    #[arg(long)]
    host_bytes: Option<f64>,
    /// Shared network tier in bytes (overrides the profile; 0 turns it off).
    #[arg(long)]
    network_bytes: Option<f64>,
    /// KV pool per replica in bytes (overrides the profile).
    #[arg(long)]
    kv_pool_bytes: Option<f64>,
    /// How long a routed prefix counts as pending on its replica (the gateway's --pending-ttl-ms).
    #[arg(long, default_value_t = DEFAULT_PENDING_TTL_MS)]
    pending_ttl_ms: u64,
    /// Milliseconds from a replica publishing an event batch to the router applying it (default: the
    /// agent's heartbeat interval).
    #[arg(long, default_value_t = DEFAULT_EVENT_LAG.as_millis() as u64)]
    event_lag_ms: u64,
    /// cache_aware without these terms of its score, comma-separated (to measure what each buys):
    /// mean-floor, delay-to-others, eviction, memory-wait, slot-wait, in-flight, decode-delay, prefix-copy.
    #[arg(long, value_name = "TERMS")]
    without: Option<String>,
    /// Synthetic workloads: sessions.
    #[arg(long, default_value_t = 200)]
    sessions: usize,
    /// Synthetic workloads: turns per session.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Synthetic workloads: sessions starting per second; shared-prefix: requests per second.
    #[arg(long, default_value_t = 4.0)]
    rate: f64,
    #[arg(long, default_value_t = 2000)]
    think_ms: u64,
    /// Synthetic workloads: output tokens per turn.
    #[arg(long, default_value_t = 200)]
    max_tokens: u32,
    /// shared-prefix: groups sharing a system prompt.
    #[arg(long, default_value_t = 150)]
    groups: usize,
    #[arg(long, default_value_t = 6000)]
    system_tokens: usize,
    #[arg(long, default_value_t = 5)]
    users_per_group: usize,
    #[arg(long, default_value_t = 1200)]
    question_tokens: usize,
    #[arg(long, default_value_t = 1000)]
    output_tokens: u32,
    /// shared-prefix: requests sent.
    #[arg(long, default_value_t = 3000)]
    requests: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
    /// Write SVG charts (TTFT CDF, hit ratio per tier) into this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write one JSON line per request (arrival, replica, predicted and actual TTFT and cached tokens)
    /// into DIR/POLICY.jsonl.
    #[arg(long, value_name = "DIR")]
    requests_out: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kvroute-sim: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.rate_scale.is_finite() && args.rate_scale > 0.0, "--rate-scale must be positive");
    anyhow::ensure!(args.rate.is_finite() && args.rate > 0.0, "--rate must be positive");
    let mut profile = CostProfile::load(&args.profile)?;
    for (value, field, name) in [
        (args.host_bytes, &mut profile.host_bytes, "--host-bytes"),
        (args.network_bytes, &mut profile.network_bytes, "--network-bytes"),
        (args.kv_pool_bytes, &mut profile.kv_pool_bytes, "--kv-pool-bytes"),
    ] {
        if let Some(value) = value {
            anyhow::ensure!(value.is_finite() && value >= 0.0, "{name} must be a byte count");
            *field = value;
        }
    }
    anyhow::ensure!(profile.num_blocks() > 0, "the KV pool holds no block");
    let mut scoring = ScoringConfig::default();
    for name in args.without.as_deref().unwrap_or("").split(',').map(str::trim).filter(|name| !name.is_empty()) {
        scoring.terms = scoring
            .terms
            .without(name)
            .with_context(|| format!("--without: unknown term {name:?}; one of {}", CostTerms::NAMES.join(", ")))?;
    }
    let policies = policies(&args.policy)?;
    let plan = plan(&args, &profile)?;
    let bound_hit_ratio = plan.bound_hit_ratio(profile.block_size, MODEL_ID);
    let configs: Vec<FleetConfig> = policies
        .into_iter()
        .map(|policy| FleetConfig {
            replicas: usize::from(args.replicas),
            profile: profile.clone(),
            policy,
            seed: args.seed,
            pending_ttl_ms: args.pending_ttl_ms,
            event_lag: Duration::from_millis(args.event_lag_ms),
            record_requests: args.requests_out.is_some(),
            scoring: scoring.clone(),
        })
        .collect();
    let results = run_all(configs, &plan)?;
    if let Some(dir) = &args.requests_out {
        write_records(dir, &results).with_context(|| format!("writing request records into {}", dir.display()))?;
    }
    let report = SimReport { bound_hit_ratio, results };
    if let Some(dir) = &args.plot {
        plot::write(&report, dir).with_context(|| format!("writing charts into {}", dir.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

fn write_records(dir: &std::path::Path, results: &[PolicyResult]) -> anyhow::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    for result in results {
        let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join(format!("{}.jsonl", result.policy)))?);
        for record in &result.records {
            serde_json::to_writer(&mut out, record)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
    }
    Ok(())
}

fn policies(spec: &str) -> anyhow::Result<Vec<PolicyKind>> {
    if spec == "all" {
        return Ok(PolicyKind::ALL.to_vec());
    }
    spec.split(',')
        .map(|name| {
            PolicyKind::from_name(name.trim())
                .with_context(|| format!("unknown policy {name:?}; one of {} or all", PolicyKind::names().join(", ")))
        })
        .collect()
}

fn plan(args: &Args, profile: &CostProfile) -> anyhow::Result<Plan> {
    if let Some(path) = &args.trace {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let requests = trace::parse(&text).with_context(|| format!("parsing {}", path.display()))?;
        return Ok(Plan::from_trace(requests, args.rate_scale, profile.vocab_size as u32));
    }
    let name = args.workload.as_deref().unwrap_or("chat");
    if name == "shared-prefix" {
        anyhow::ensure!(args.groups > 0 && args.users_per_group > 0, "--groups and --users-per-group must be positive");
        let params = SharedPrefix {
            groups: args.groups,
            system_tokens: args.system_tokens,
            users_per_group: args.users_per_group,
            question_tokens: args.question_tokens,
            output_tokens: args.output_tokens,
            requests: args.requests,
            rate: args.rate,
        };
        return Ok(Plan::shared_prefix(&params, profile.vocab_size as u32, args.seed, args.rate_scale));
    }
    let kind: WorkloadKind = name.parse().map_err(|error: String| anyhow::anyhow!("{error}, or shared-prefix"))?;
    let config = WorkloadConfig {
        sessions: args.sessions,
        turns: args.turns,
        sessions_per_second: args.rate,
        think_ms: args.think_ms,
        max_tokens: args.max_tokens,
        seed: args.seed,
    };
    let plan = Plan::from_workload(kind, &config, args.rate_scale);
    anyhow::ensure!(
        plan.vocab_size as usize <= profile.vocab_size,
        "the profile's vocabulary is smaller than the tokenizer's"
    );
    Ok(plan)
}

/// Runs each policy on its own copy of the fleet, as many at once as there are cores; results keep the
/// order of `configs`.
fn run_all(configs: Vec<FleetConfig>, plan: &Plan) -> anyhow::Result<Vec<PolicyResult>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).max(1);
    let mut results = Vec::with_capacity(configs.len());
    for batch in configs.chunks(threads) {
        let outcomes: Vec<anyhow::Result<PolicyResult>> = std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|config| scope.spawn(move || Fleet::new(config.clone(), plan).map(Fleet::run)))
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a simulation thread panicked"))))
                .collect()
        });
        for outcome in outcomes {
            results.push(outcome?);
        }
    }
    Ok(results)
}
