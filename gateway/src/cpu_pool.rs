//! Where CPU-heavy request work runs (parsing a request body, rendering a chat, tokenizing a prompt):
//! on tokio's blocking threads, never on the async workers that serve every connection.
//!
//! Two lanes bound it. A job on an input of at least [`LARGE_INPUT_BYTES`] needs one of the `large`
//! permits (half the cores, at least one); a smaller job one of the `small` permits (twice the cores).
//! So a burst of 4 MiB prompts can neither take every core nor make a short request wait behind it, and
//! the number of threads tokenizing at once stays near the number of cores instead of growing with the
//! request rate. A job waits for its permit asynchronously; a job whose client left still runs to its
//! end (it cannot be interrupted) but holds its permit until then, so abandoned work stays bounded too.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::service::ServiceError;

/// Inputs of at least this many bytes take the large lane (tokenizing 64 KiB takes a few milliseconds).
pub const LARGE_INPUT_BYTES: usize = 64 << 10;

/// The gauge of jobs per lane and state (`waiting` for a permit, `running`).
pub const JOBS_GAUGE: &str = "kvroute_gateway_prompt_jobs";

/// The two bounded lanes of CPU-heavy request work.
#[derive(Debug)]
pub struct CpuPool {
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
}

/// Keeps a lane's gauge right however the job ends (done, or dropped with its request).
struct Counted {
    lane: &'static str,
    state: &'static str,
}

impl Counted {
    fn new(lane: &'static str, state: &'static str) -> Counted {
        metrics::gauge!(JOBS_GAUGE, "lane" => lane, "state" => state).increment(1.0);
        Counted { lane, state }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        metrics::gauge!(JOBS_GAUGE, "lane" => self.lane, "state" => self.state).decrement(1.0);
    }
}

impl CpuPool {
    /// Lanes sized for `cores` cores.
    pub fn new(cores: usize) -> CpuPool {
        let cores = cores.max(1);
        metrics::describe_gauge!(
            JOBS_GAUGE,
            "Request parsing, chat rendering and tokenizing jobs off the async workers, by lane (small, large) \
             and state (waiting, running)"
        );
        for lane in ["small", "large"] {
            for state in ["waiting", "running"] {
                metrics::gauge!(JOBS_GAUGE, "lane" => lane, "state" => state).set(0.0);
            }
        }
        CpuPool { small: Arc::new(Semaphore::new(cores * 2)), large: Arc::new(Semaphore::new((cores / 2).max(1))) }
    }

    /// Lanes sized for the cores this process may use.
    pub fn for_this_machine() -> CpuPool {
        CpuPool::new(std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
    }

    /// Runs `job`, whose input is `input_bytes` long, on a blocking thread once its lane has room.
    pub async fn run<T, F>(&self, input_bytes: usize, job: F) -> Result<T, ServiceError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (lane, name) =
            if input_bytes >= LARGE_INPUT_BYTES { (&self.large, "large") } else { (&self.small, "small") };
        let waiting = Counted::new(name, "waiting");
        let permit = lane.clone().acquire_owned().await.map_err(|_| unavailable())?;
        drop(waiting);
        let running = Counted::new(name, "running");
        let outcome = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let _running = running;
            job()
        })
        .await;
        outcome.map_err(|error| {
            tracing::error!(%error, "a request preparation job failed");
            unavailable()
        })
    }
}

fn unavailable() -> ServiceError {
    ServiceError::Interrupted("the gateway could not prepare the request".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_small_job_does_not_wait_for_a_large_one() {
        let pool = Arc::new(CpuPool::new(2));
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let large = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.run(LARGE_INPUT_BYTES, move || hold.recv().is_ok()).await })
        };
        // The large lane has one permit, held by the blocked job; a small job runs anyway.
        assert_eq!(pool.run(10, || 7).await, Ok(7));
        release.send(()).unwrap();
        assert_eq!(large.await.unwrap(), Ok(true));
    }
}
