//! Child processes owned by a test: killed and reaped on drop, their stderr always kept in a log file,
//! and that log's end printed when the test fails (the process is dropped while the test panics), so a
//! failure says what the server said.

use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes of a log printed when a test fails.
const LOG_TAIL: u64 = 16 * 1024;

/// A child process that is killed and reaped on drop.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    /// The log is the caller's: leave it in place.
    own_log: bool,
    /// The process leads a process group of its own, which is killed with it.
    group: bool,
}

impl ChildProcess {
    /// Spawns `command` with its stderr going to a log file of its own (whatever the command set before).
    pub fn spawn(name: &str, command: &mut Command) -> std::io::Result<ChildProcess> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join("kvroute-test-logs");
        std::fs::create_dir_all(&dir)?;
        let serial = COUNTER.fetch_add(1, Ordering::Relaxed);
        let log = dir.join(format!("{name}-{}-{serial}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        ChildProcess::spawn_with_log(name, command, &log, true)
    }

    /// Spawns `command` appending its stderr to `log` (the caller reads it; it is kept after the test).
    pub fn spawn_logging(name: &str, command: &mut Command, log: &Path) -> std::io::Result<ChildProcess> {
        ChildProcess::spawn_with_log(name, command, log, false)
    }

    fn spawn_with_log(name: &str, command: &mut Command, log: &Path, own_log: bool) -> std::io::Result<ChildProcess> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let child = command.stdin(Stdio::null()).stderr(file).spawn()?;
        Ok(ChildProcess { name: name.to_string(), child: Some(child), log: log.to_path_buf(), own_log, group: false })
    }

    /// [`ChildProcess::spawn`] in a process group of its own: killing it (or dropping it) kills every process
    /// of the group, whatever the process started.
    pub fn spawn_group(name: &str, command: &mut Command) -> std::io::Result<ChildProcess> {
        std::os::unix::process::CommandExt::process_group(command, 0);
        let mut process = ChildProcess::spawn(name, command)?;
        process.group = true;
        Ok(process)
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log's last [`LOG_TAIL`] bytes.
    pub fn log_tail(&self) -> String {
        let Ok(mut file) = std::fs::File::open(&self.log) else { return String::new() };
        let length = file.metadata().map_or(0, |meta| meta.len());
        let _ = file.seek(SeekFrom::Start(length.saturating_sub(LOG_TAIL)));
        let mut tail = Vec::new();
        let _ = file.read_to_end(&mut tail);
        String::from_utf8_lossy(&tail).into_owned()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Waits until something accepts TCP connections on `addr`; fails at once, with the log, when the
    /// process exits first, and with the log at the deadline.
    pub fn wait_for_tcp(&mut self, addr: SocketAddr, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "{} exited ({status}) before accepting connections on {addr}; its stderr:\n{}",
                    self.name,
                    self.log_tail()
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not accept connections on {addr} within {timeout:?}; its stderr:\n{}",
                    self.name,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a signal by number (for example 9 for SIGKILL, 19 for SIGSTOP).
    pub fn signal(&self, signal: i32) -> std::io::Result<()> {
        let status =
            Command::new("kill").arg(format!("-{signal}")).arg(self.id().to_string()).stderr(Stdio::null()).status()?;
        if status.success() { Ok(()) } else { Err(std::io::Error::other(format!("kill -{signal} failed"))) }
    }

    /// Waits up to `timeout` for the process to exit; returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status.code().unwrap_or(-1));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the process (and its group, for [`ChildProcess::spawn_group`]) now and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.group {
                let group = format!("-{}", child.id());
                let _ = Command::new("kill").args(["-9", "--", &group]).stderr(Stdio::null()).status();
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Replaces the process with a new one from `command`, logging to the same file.
    pub fn respawn(&mut self, command: &mut Command) -> std::io::Result<()> {
        self.kill();
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        if self.group {
            std::os::unix::process::CommandExt::process_group(command, 0);
        }
        self.child = Some(command.stdin(Stdio::null()).stderr(file).spawn()?);
        Ok(())
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- the end of {}'s stderr ({}) ---\n{}", self.name, self.log.display(), self.log_tail());
        } else if self.own_log {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
