//! The project's services as real processes on free loopback ports: node-agents
//! and gateways that can be killed, frozen and restarted on the same ports, and
//! a reader for a server-sent event stream that arrives bit by bit.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

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
    log: Option<Log>,
}

impl GatewayProcess {
    /// Starts a gateway in front of `agents` with extra `args`, and waits until it is ready with every agent healthy.
    pub fn start(agents: &[SocketAddr], args: &[&str]) -> GatewayProcess {
        GatewayProcess::start_with(agents, args, None)
    }

    /// [`GatewayProcess::start`] with the log filter `RUST_LOG=filter`, appending the gateway's log to `path`.
    pub fn start_logging(agents: &[SocketAddr], args: &[&str], path: &Path, filter: &str) -> GatewayProcess {
        let log = Log { path: path.to_path_buf(), filter: filter.to_string() };
        GatewayProcess::start_with(agents, args, Some(log))
    }

    fn start_with(agents: &[SocketAddr], args: &[&str], log: Option<Log>) -> GatewayProcess {
        let gateway = GatewayProcess::spawn_with(agents, args, log);
        gateway.wait_healthy(agents.len(), Duration::from_secs(60)).unwrap_or_else(|message| panic!("{message}"));
        gateway
    }

    /// Starts a gateway in front of `agents` and waits only for its HTTP port (for a gateway serving TLS, or
    /// one that is not expected to become ready).
    pub fn spawn(agents: &[SocketAddr], args: &[&str]) -> GatewayProcess {
        GatewayProcess::spawn_with(agents, args, None)
    }

    fn spawn_with(agents: &[SocketAddr], args: &[&str], log: Option<Log>) -> GatewayProcess {
        let list: Vec<String> = agents.iter().map(SocketAddr::to_string).collect();
        // No static agents: the arguments name another source (--agents-file, --agents-dns).
        let mut all = if list.is_empty() { Vec::new() } else { vec!["--agents".to_string(), list.join(",")] };
        all.extend(args.iter().map(|arg| (*arg).to_string()));
        let (http, grpc) = loopback_pair();
        let process = spawn_gateway(&all, http, grpc, log.as_ref());
        GatewayProcess { process, http, grpc, args: all, log }
    }

    /// Starts the gateway again with the same arguments and ports; does not wait for readiness.
    pub fn restart(&mut self) {
        self.process
            .respawn(&mut gateway_command(&self.args, self.http, self.grpc, self.log.as_ref()))
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

fn gateway_command(args: &[String], http: SocketAddr, grpc: SocketAddr, log: Option<&Log>) -> Command {
    let mut command = Command::new(project_binary("kvroute-gateway", "gateway"));
    command.args(args).args(["--http-addr", &http.to_string(), "--grpc-addr", &grpc.to_string()]);
    if let Some(log) = log {
        command.env("RUST_LOG", &log.filter);
    }
    command
}

fn spawn_gateway(args: &[String], http: SocketAddr, grpc: SocketAddr, log: Option<&Log>) -> ChildProcess {
    let mut process = spawn_logged("gateway", &mut gateway_command(args, http, grpc, log), log);
    process.wait_for_tcp(http, Duration::from_secs(30)).unwrap_or_else(|message| panic!("{message}"));
    process
}

/// A streaming HTTP/1.1 response read as it arrives: status, then the `data:`
/// payloads of its server-sent events one at a time.
#[derive(Debug)]
pub struct EventStream {
    pub status: u16,
    reader: BufReader<TcpStream>,
    chunked: bool,
    pending: Vec<u8>,
}

impl EventStream {
    /// Sends a POST with a JSON body and reads the response head.
    pub fn post(addr: SocketAddr, path: &str, body: &str) -> std::io::Result<EventStream> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes())?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status line: {line:?}")))?;
        let mut chunked = false;
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
        }
        Ok(EventStream { status, reader, chunked, pending: Vec::new() })
    }

    /// The next `data:` payload; `None` when the stream ended (or broke) without one.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.pending.windows(2).position(|window| window == b"\n\n") {
                let event: Vec<u8> = self.pending.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&event).into_owned();
                let data: Vec<&str> =
                    text.lines().filter_map(|line| line.strip_prefix("data:")).map(str::trim_start).collect();
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(data.join("\n"));
            }
            if !self.read_more() {
                return None;
            }
        }
    }

    /// Appends the next piece of body to `pending`; false at the end of the body or on an error.
    fn read_more(&mut self) -> bool {
        if !self.chunked {
            let mut buffer = [0u8; 4096];
            return match self.reader.read(&mut buffer) {
                Ok(0) | Err(_) => false,
                Ok(read) => {
                    self.pending.extend_from_slice(&buffer[..read]);
                    true
                }
            };
        }
        let mut size_line = String::new();
        if self.reader.read_line(&mut size_line).unwrap_or(0) == 0 {
            return false;
        }
        let Ok(size) = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or(""), 16) else {
            return false;
        };
        if size == 0 {
            return false;
        }
        let mut chunk = vec![0u8; size + 2];
        if self.reader.read_exact(&mut chunk).is_err() {
            return false;
        }
        chunk.truncate(size);
        self.pending.extend_from_slice(&chunk);
        true
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
