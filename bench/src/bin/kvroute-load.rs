//! kvroute-load: drives a gateway with a synthetic workload or a Mooncake-format trace and reports TTFT,
//! end-to-end latency, output tokens/s, the cached-token fraction and errors by kind.
//!
//! kvroute-load --url http://127.0.0.1:8080 --workload chat --sessions 20 --rate 2 --duration-secs 60
//! kvroute-load --url http://127.0.0.1:8080 --trace trace.jsonl --time-scale 0.1 --length-scale 0.05 --json
//! kvroute-load ... --requests-out requests.jsonl   # and every request's outcome, a JSON line each

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use kvroute_bench::driver::{Limits, Progress, Target, TraceScale, run_sessions, run_trace};
use kvroute_bench::report::Report;
use kvroute_bench::trace;
use kvroute_bench::workload::{WorkloadConfig, WorkloadKind, generate};

#[derive(Debug, Parser)]
#[command(name = "kvroute-load", about = "Load generator for kvroute's OpenAI-compatible gateway")]
struct Args {
    /// The gateway's HTTP address; several, comma-separated, send the requests to each in turn (client-side
    /// round robin, e.g. straight to engine servers).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Synthetic workload: chat, agent, rag, fewshot, timestamp-top, shuffled-tools (needs the gateway's
    /// --tool-order as-sent), prompt-change, ab-split or personalised.
    #[arg(long, conflicts_with = "trace")]
    workload: Option<WorkloadKind>,
    /// Replay a Mooncake-format JSONL trace instead.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Sessions of the synthetic workload.
    #[arg(long, default_value_t = WorkloadConfig::default().sessions)]
    sessions: usize,
    /// Turns per session (multi-turn workloads).
    #[arg(long, default_value_t = WorkloadConfig::default().turns)]
    turns: usize,
    /// Open loop: sessions starting per second (Poisson arrivals).
    #[arg(long, default_value_t = WorkloadConfig::default().sessions_per_second)]
    rate: f64,
    /// Closed loop instead: this many sessions (or trace requests) at once.
    #[arg(long)]
    concurrency: Option<usize>,
    /// Mean pause between a reply and the next turn, in milliseconds.
    #[arg(long, default_value_t = WorkloadConfig::default().think_ms)]
    think_ms: u64,
    #[arg(long, default_value_t = WorkloadConfig::default().max_tokens)]
    max_tokens: u32,
    /// Stop starting requests after this long.
    #[arg(long, default_value_t = 120)]
    duration_secs: u64,
    /// Stop after starting this many requests.
    #[arg(long, default_value_t = 10_000)]
    max_requests: usize,
    /// Trace replay: multiplies the gaps between arrivals.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Trace replay: multiplies prompt and output lengths (at most 1).
    #[arg(long, default_value_t = 1.0)]
    length_scale: f64,
    /// Trace replay: vocabulary size of the served model (token ids are drawn below it).
    #[arg(long, default_value_t = 49_152)]
    vocab_size: u32,
    #[arg(long)]
    model: Option<String>,
    /// API key sent as a bearer token.
    #[arg(long)]
    api_key: Option<String>,
    #[arg(long, default_value_t = WorkloadConfig::default().seed)]
    seed: u64,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Also write every request's outcome to FILE, one JSON object a line, in the order they finished.
    #[arg(long, value_name = "FILE")]
    requests_out: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let targets = args
        .url
        .split(',')
        .map(|url| {
            let mut target = Target::from_url(url.trim()).map_err(anyhow::Error::msg)?;
            target.api_key = args.api_key.clone();
            target.model = args.model.clone();
            Ok(target)
        })
        .collect::<Result<Vec<Target>>>()?;
    let limits = Limits {
        duration: Duration::from_secs(args.duration_secs),
        max_requests: args.max_requests,
        concurrency: args.concurrency,
    };
    let progress = Arc::new(Progress::default());
    let (total, run) = match (&args.workload, &args.trace) {
        (Some(kind), None) => {
            let config = WorkloadConfig {
                sessions: args.sessions,
                turns: args.turns,
                sessions_per_second: args.rate,
                think_ms: args.think_ms,
                max_tokens: args.max_tokens,
                seed: args.seed,
            };
            let sessions = generate(*kind, &config);
            let total: usize = sessions.iter().map(|s| s.turns.len()).sum();
            (total, tokio::spawn(run_sessions(targets, sessions, limits, progress.clone())))
        }
        (None, Some(path)) => {
            if !(args.length_scale > 0.0 && args.length_scale <= 1.0) || args.time_scale < 0.0 {
                bail!("--length-scale must be in (0, 1] and --time-scale not negative");
            }
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let requests = trace::parse(&text)?;
            let scale = TraceScale { time: args.time_scale, length: args.length_scale, vocab_size: args.vocab_size };
            (requests.len(), tokio::spawn(run_trace(targets, requests, scale, limits, progress.clone())))
        }
        _ => bail!("give --workload NAME or --trace FILE"),
    };
    let total = total.min(args.max_requests);
    while !run.is_finished() {
        draw(&progress, total);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    draw(&progress, total);
    eprintln!();
    let (outcomes, seconds) = run.await.context("the run panicked")?;
    if let Some(path) = &args.requests_out {
        write_requests(path, &outcomes).with_context(|| format!("writing {}", path.display()))?;
    }
    let report = Report::new(&outcomes, seconds);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.text());
    }
    Ok(())
}

/// One JSON line per request.
fn write_requests(path: &std::path::Path, outcomes: &[kvroute_bench::report::Outcome]) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for outcome in outcomes {
        serde_json::to_writer(&mut out, outcome)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// One progress line on stderr, redrawn in place.
fn draw(progress: &Progress, total: usize) {
    let finished = progress.finished.load(Ordering::Relaxed);
    let failed = progress.failed.load(Ordering::Relaxed);
    let width = 30;
    let filled = (finished * width).checked_div(total).unwrap_or(width).min(width);
    let bar = format!("{}{}", "#".repeat(filled), ".".repeat(width - filled));
    eprint!("\r[{bar}] {finished}/{total} requests, {failed} failed");
    let _ = std::io::stderr().flush();
}
