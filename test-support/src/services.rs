//! The project's services as real processes on free loopback ports: node-agents and gateways that can be
//! killed, frozen and restarted on the same ports, and the stub engine (`kvroute-stub`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub use crate::http::EventStream;
use crate::{ChildProcess, free_port, http_request, project_binary, wait_until};

/// How long the helpers below wait for state that a healthy system reaches in well under a second: long
/// enough for a loaded 2-core machine, short enough that a broken system fails in reasonable time.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A fresh loopback address on a free port.
pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// Two fresh loopback addresses on different free ports (a process binds both).
fn loopback_pair() -> (SocketAddr, SocketAddr) {
    let first = loopback();
    let second = std::iter::repeat_with(loopback).find(|candidate| *candidate != first).unwrap_or(first);
    (first, second)
}

/// A node-agent process: gRPC on `grpc`, `/metrics` and `/health` on `metrics`.
#[derive(Debug)]
pub struct AgentProcess {
    pub process: ChildProcess,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    args: Vec<String>,
    log: Option<Log>,
}

impl AgentProcess {
    /// Starts `node-agent ARGS --listen … --metrics-addr …` and waits for its gRPC port.
    pub fn start(args: &[&str]) -> AgentProcess {
        AgentProcess::start_with(args, None)
    }

    /// [`AgentProcess::start`] with the log filter `RUST_LOG=filter`, appending the agent's log to `path`.
    pub fn start_logging(args: &[&str], path: &Path, filter: &str) -> AgentProcess {
        AgentProcess::start_with(args, Some(Log { path: path.to_path_buf(), filter: filter.to_string() }))
    }

    fn start_with(args: &[&str], log: Option<Log>) -> AgentProcess {
        let args: Vec<String> = args.iter().map(|arg| (*arg).to_string()).collect();
        let (grpc, metrics) = loopback_pair();
        let mut process = spawn_agent(&args, grpc, metrics, log.as_ref());
        process.wait_for_tcp(grpc, Duration::from_secs(60)).unwrap_or_else(|message| panic!("{message}"));
        AgentProcess { process, grpc, metrics, args, log }
    }

    /// A tiny-random agent whose pool (24 blocks) and host tier (64 KiB) overflow within a few requests,
    /// spilling to the Redis tier at `redis_url`; `extra` adds arguments.
    pub fn start_tiered(redis_url: &str, id: &str, extra: &[&str]) -> AgentProcess {
        let base = ["--model", "tiny-random", "--num-blocks", "24", "--host-cache-bytes", "64KiB"];
        let agent = AgentProcess::start(&[&base[..], &["--redis-url", redis_url, "--agent-id", id], extra].concat());
        // The tier comes up on its first ping, after the agent already serves: a request before then would
        // neither read nor write Redis.
        wait_until(&format!("the network tier up on the agent at {}", agent.grpc), PATIENCE, || {
            let up = agent.metric("kvroute_agent_tier_up{tier=\"network\"}");
            if up == 1.0 { Ok(()) } else { Err(format!("kvroute_agent_tier_up{{tier=\"network\"}} = {up}")) }
        })
        .unwrap();
        agent
    }

    /// The sum of every series of metric `name` on the agent's `/metrics` (0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        metric_sum(self.metrics, name)
    }

    /// Waits until the agent's `/metrics` counts at least `requests` finished requests. The agent publishes
    /// its engine's gauges and counters together (after a step, at most every 100 ms, and every 100 ms while
    /// idle), so once this holds, every gauge shows the engine as it was after those requests finished.
    pub fn wait_finished(&self, requests: usize) -> Result<f64, String> {
        let what = format!("{requests} finished requests on the agent at {}", self.grpc);
        wait_until(&what, PATIENCE, || {
            let finished = self.metric("kvroute_agent_requests_finished_total");
            if finished >= requests as f64 { Ok(finished) } else { Err(format!("{finished} finished")) }
        })
    }

    /// Starts the agent again with the same arguments and ports (after it exited or was killed).
    pub fn restart(&mut self) {
        self.process
            .respawn(&mut agent_command(&self.args, self.grpc, self.metrics, self.log.as_ref()))
            .expect("respawn node-agent");
        self.process.wait_for_tcp(self.grpc, Duration::from_secs(60)).unwrap_or_else(|message| panic!("{message}"));
    }
}

/// [`AgentProcess::wait_finished`] for requests spread over `agents`: waits until their finished counts add
/// up to at least `requests`.
pub fn wait_finished_on(agents: &[AgentProcess], requests: usize) -> Result<f64, String> {
    wait_until(&format!("{requests} finished requests over {} agents", agents.len()), PATIENCE, || {
        let finished: f64 = agents.iter().map(|agent| agent.metric("kvroute_agent_requests_finished_total")).sum();
        if finished >= requests as f64 { Ok(finished) } else { Err(format!("{finished} finished")) }
    })
}

fn agent_command(args: &[String], grpc: SocketAddr, metrics: SocketAddr, log: Option<&Log>) -> Command {
    let mut command = Command::new(project_binary("kvroute-node-agent", "node-agent"));
    command.args(args).args(["--listen", &grpc.to_string(), "--metrics-addr", &metrics.to_string()]);
    if let Some(log) = log {
        command.env("RUST_LOG", &log.filter);
    }
    command
}

fn spawn_agent(args: &[String], grpc: SocketAddr, metrics: SocketAddr, log: Option<&Log>) -> ChildProcess {
    spawn_logged("node-agent", &mut agent_command(args, grpc, metrics, log), log)
}

/// Where a child process logs: its stderr appended to `path`, with `RUST_LOG=filter`.
#[derive(Clone, Debug)]
struct Log {
    path: PathBuf,
    filter: String,
}

/// Spawns `command` logging to `log`'s file when given (the test reads it), else to a log of its own.
fn spawn_logged(name: &str, command: &mut Command, log: Option<&Log>) -> ChildProcess {
    let spawned = match log {
        Some(log) => ChildProcess::spawn_logging(name, command, &log.path),
        None => ChildProcess::spawn(name, command),
    };
    spawned.unwrap_or_else(|error| panic!("spawn {name}: {error}"))
}

/// A gateway process: HTTP on `http`, gRPC on `grpc`. Its stderr (the log) goes to `log` when one is given.
#[derive(Debug)]
pub struct GatewayProcess {
    pub process: ChildProcess,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    args: Vec<String>,
    /// Variables added to its environment.
    env: Vec<(String, String)>,
    log: Option<Log>,
}

impl GatewayProcess {
    /// Starts a gateway in front of `agents` with extra `args`, and waits until it is ready with every agent healthy.
    pub fn start(agents: &[SocketAddr], args: &[&str]) -> GatewayProcess {
        GatewayProcess::start_with(agents, args, &[], None)
    }

    /// [`GatewayProcess::start`] with the log filter `RUST_LOG=filter`, appending the gateway's log to `path`.
    pub fn start_logging(agents: &[SocketAddr], args: &[&str], path: &Path, filter: &str) -> GatewayProcess {
        let log = Log { path: path.to_path_buf(), filter: filter.to_string() };
        GatewayProcess::start_with(agents, args, &[], Some(log))
    }

    /// [`GatewayProcess::start_logging`] with `env` added to the gateway's environment (for settings such as
    /// `KVROUTE_ADMIN_API_KEY`, which a test sets the way an operator would).
    pub fn start_logging_with_env(
        agents: &[SocketAddr],
        args: &[&str],
        env: &[(&str, &str)],
        path: &Path,
        filter: &str,
    ) -> GatewayProcess {
        let log = Log { path: path.to_path_buf(), filter: filter.to_string() };
        GatewayProcess::start_with(agents, args, env, Some(log))
    }

    fn start_with(agents: &[SocketAddr], args: &[&str], env: &[(&str, &str)], log: Option<Log>) -> GatewayProcess {
        let gateway = GatewayProcess::spawn_with(agents, args, env, log);
        gateway.wait_healthy(agents.len(), Duration::from_secs(60)).unwrap_or_else(|message| panic!("{message}"));
        gateway
    }

    /// Starts a gateway in front of `agents` and waits only for its HTTP port (for a gateway serving TLS, or
    /// one that is not expected to become ready).
    pub fn spawn(agents: &[SocketAddr], args: &[&str]) -> GatewayProcess {
        GatewayProcess::spawn_with(agents, args, &[], None)
    }

    fn spawn_with(agents: &[SocketAddr], args: &[&str], env: &[(&str, &str)], log: Option<Log>) -> GatewayProcess {
        let list: Vec<String> = agents.iter().map(SocketAddr::to_string).collect();
        // No static agents: the arguments name another source (--agents-file, --agents-dns).
        let mut all = if list.is_empty() { Vec::new() } else { vec!["--agents".to_string(), list.join(",")] };
        all.extend(args.iter().map(|arg| (*arg).to_string()));
        let env: Vec<(String, String)> =
            env.iter().map(|(name, value)| ((*name).to_string(), (*value).to_string())).collect();
        let (http, grpc) = loopback_pair();
        let process = spawn_gateway(&all, &env, http, grpc, log.as_ref());
        GatewayProcess { process, http, grpc, args: all, env, log }
    }

    /// Starts the gateway again with the same arguments, environment and ports; does not wait for readiness.
    pub fn restart(&mut self) {
        self.process
            .respawn(&mut gateway_command(&self.args, &self.env, self.http, self.grpc, self.log.as_ref()))
            .expect("respawn gateway");
        self.process.wait_for_tcp(self.http, Duration::from_secs(30)).unwrap_or_else(|message| panic!("{message}"));
    }

    /// Waits until `/ready` answers 200 with `healthy` healthy replicas.
    pub fn wait_healthy(&self, healthy: usize, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        loop {
            if let Ok(response) = http_request(self.http, "GET", "/ready", &[], b"") {
                last = response.text();
                if response.status == 200 && healthy_replicas(&last) == Some(healthy) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the gateway did not report {healthy} healthy replicas within {timeout:?}: {last}; its stderr:\n{}",
                    self.process.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl GatewayProcess {
    /// The sum of every series of metric `name` on the gateway's `/metrics` (0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        metric_sum(self.http, name)
    }

    /// Event batches the gateway has received from its agents, heartbeats included.
    pub fn event_batches(&self) -> f64 {
        self.metric("kvroute_gateway_event_batches_total")
    }

    /// Waits until the gateway has received two event batches per agent more than when called. Every agent
    /// sends a batch at once when it has events and a heartbeat every 100 ms, in order on its stream, so
    /// whatever the agents did before this call has then reached the gateway. A negative check (something did
    /// not happen) waits for this first, so that it cannot pass merely because the system is slow.
    pub fn wait_next_batches(&self, agents: usize) -> Result<f64, String> {
        let target = self.event_batches() + 2.0 * agents as f64;
        wait_until(&format!("{target} event batches at the gateway"), PATIENCE, || {
            let batches = self.event_batches();
            if batches >= target { Ok(batches) } else { Err(format!("{batches} batches")) }
        })
    }

    /// Waits until the gateway's prefix index holds at least `blocks` block hashes (the agents' stored events
    /// reached it).
    pub fn wait_indexed(&self, blocks: u64) -> Result<f64, String> {
        wait_until(&format!("{blocks} blocks in the gateway's index"), PATIENCE, || {
            let entries = self.metric("kvroute_gateway_index_entries");
            if entries >= blocks as f64 { Ok(entries) } else { Err(format!("{entries} entries")) }
        })
    }
}

/// The `healthy_replicas` count of a `/ready` body.
fn healthy_replicas(body: &str) -> Option<usize> {
    let rest = &body[body.find("\"healthy_replicas\":")? + "\"healthy_replicas\":".len()..];
    let digits: String = rest.trim_start().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn gateway_command(
    args: &[String],
    env: &[(String, String)],
    http: SocketAddr,
    grpc: SocketAddr,
    log: Option<&Log>,
) -> Command {
    let mut command = Command::new(project_binary("kvroute-gateway", "gateway"));
    command.args(args).args(["--http-addr", &http.to_string(), "--grpc-addr", &grpc.to_string()]);
    command.envs(env.iter().map(|(name, value)| (name, value)));
    if let Some(log) = log {
        command.env("RUST_LOG", &log.filter);
    }
    command
}

fn spawn_gateway(
    args: &[String],
    env: &[(String, String)],
    http: SocketAddr,
    grpc: SocketAddr,
    log: Option<&Log>,
) -> ChildProcess {
    let mut process = spawn_logged("gateway", &mut gateway_command(args, env, http, grpc, log), log);
    process.wait_for_tcp(http, Duration::from_secs(30)).unwrap_or_else(|message| panic!("{message}"));
    process
}

/// The stub engine (`kvroute-stub`, vLLM's API and KV events without a model): HTTP on `http`, its
/// ZeroMQ KV events on `events`.
#[derive(Debug)]
pub struct StubProcess {
    pub process: ChildProcess,
    pub http: SocketAddr,
    pub events: SocketAddr,
}

impl StubProcess {
    /// Starts a stub serving the tokenizer and chat template of `model_dir` as `stub-model`, and waits for
    /// its HTTP port.
    pub fn start(model_dir: &Path) -> StubProcess {
        StubProcess::start_with(model_dir, &[])
    }

    /// [`StubProcess::start`] with more arguments (`--block-size 64`, ...).
    pub fn start_with(model_dir: &Path, extra_args: &[&str]) -> StubProcess {
        let (http, events) = loopback_pair();
        let mut command = Command::new(project_binary("kvroute-bench", "kvroute-stub"));
        command.args(["--listen", &http.to_string(), "--kv-events", &events.to_string()]);
        command.arg("--model-dir").arg(model_dir).args(["--model", "stub-model"]).args(extra_args);
        let mut process = ChildProcess::spawn("kvroute-stub", &mut command).expect("spawn kvroute-stub");
        process.wait_for_tcp(http, Duration::from_secs(30)).unwrap_or_else(|message| panic!("{message}"));
        StubProcess { process, http, events }
    }

    /// POSTs `body` as JSON to `path`: the status and the JSON answer ([`crate::api::post_json`]).
    pub fn post(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        crate::api::post_json(self.http, path, &[], body)
    }

    /// POSTs `body` as JSON to `path` and returns the answer, failing the test unless it is a 200.
    pub fn json(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let (status, answer) = self.post(path, body);
        assert_eq!(status, 200, "{path}: {answer}\n{}", self.process.log_tail());
        assert!(!answer.is_null(), "{path}: the answer is not JSON");
        answer
    }
}

/// Every series of metric `name` on `addr`'s `/metrics`: its labels (as written between the braces, empty
/// for none) and its value.
pub fn metric_series(addr: SocketAddr, name: &str) -> Vec<(String, f64)> {
    let body = http_request(addr, "GET", "/metrics", &[], b"").map(|response| response.text()).unwrap_or_default();
    body.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            Some((labels.to_string(), value.trim().parse::<f64>().ok()?))
        })
        .collect()
}

/// The sum of every series of metric `name` on `addr`'s `/metrics` (0 when absent).
pub fn metric_sum(addr: SocketAddr, name: &str) -> f64 {
    let body = http_request(addr, "GET", "/metrics", &[], b"").map(|response| response.text()).unwrap_or_default();
    body.lines()
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{')))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
