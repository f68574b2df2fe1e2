//! Fuzzing on the stable toolchain. [`targets`] names every parser of outside
//! bytes; [`fuzz`] runs one for a bounded time or a fixed number of mutated
//! inputs ([`Budget`]): it mutates a corpus that starts from the target's valid
//! seeds, keeps inputs with an outcome it has not seen, and stops at the first
//! panic, returning the input that caused it. Crashes found are kept under
//! `fuzz/regressions/TARGET/` and replayed by the tests.

pub mod mutate;
pub mod targets;

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use targets::Target;

/// How long one run goes on.
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    /// Mutated inputs until this much time has passed (manual runs: the longer, the more it finds).
    Time(Duration),
    /// Exactly this many mutated inputs: the same work, and for a seed the same inputs, however fast the
    /// machine is (the tests).
    Executions(u64),
}

/// Limits of one run.
#[derive(Clone, Copy, Debug)]
pub struct RunConfig {
    pub budget: Budget,
    pub seed: u64,
    /// Longest generated input, in bytes.
    pub max_len: usize,
    /// Print each outcome the first time it is seen.
    pub verbose: bool,
}

/// What a run did.
#[derive(Debug)]
pub struct Report {
    pub executions: u64,
    pub corpus: usize,
    pub outcomes: usize,
    /// The input that panicked, with the panic's message.
    pub crash: Option<(Vec<u8>, String)>,
}

/// Runs `input` through `target`, turning a panic into `Err(message)`.
pub fn execute(target: &Target, input: &[u8]) -> Result<String, String> {
    std::panic::catch_unwind(AssertUnwindSafe(|| (target.run)(input))).map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|text| (*text).to_string()))
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// Fuzzes `target` until `config.budget` is spent or an input panics; the seeds and `extra_corpus` run
/// first, outside the budget.
pub fn fuzz(target: &Target, config: RunConfig, extra_corpus: Vec<Vec<u8>>) -> Report {
    let mut rng = mutate::Rng::new(config.seed);
    let mut corpus: Vec<Vec<u8>> = (target.seeds)();
    corpus.extend(extra_corpus);
    let mut outcomes = HashSet::new();
    let mut executions = 0u64;
    for input in corpus.clone() {
        executions += 1;
        match execute(target, &input) {
            Ok(outcome) => {
                outcomes.insert(outcome);
            }
            Err(message) => {
                return Report {
                    executions,
                    corpus: corpus.len(),
                    outcomes: outcomes.len(),
                    crash: Some((input, message)),
                };
            }
        }
    }
    let started = Instant::now();
    let mut mutated = 0u64;
    while match config.budget {
        Budget::Time(duration) => started.elapsed() < duration,
        Budget::Executions(count) => mutated < count,
    } {
        mutated += 1;
        let base = &corpus[rng.below(corpus.len())];
        let other = &corpus[rng.below(corpus.len())];
        let input = mutate::mutate(&mut rng, base, other, target.dictionary, config.max_len);
        executions += 1;
        match execute(target, &input) {
            Ok(outcome) => {
                if config.verbose && !outcomes.contains(&outcome) {
                    println!("  new outcome: {outcome}");
                }
                if outcomes.insert(outcome) && corpus.len() < 4096 {
                    corpus.push(input);
                }
            }
            Err(message) => {
                return Report {
                    executions,
                    corpus: corpus.len(),
                    outcomes: outcomes.len(),
                    crash: Some((input, message)),
                };
            }
        }
    }
    Report { executions, corpus: corpus.len(), outcomes: outcomes.len(), crash: None }
}

/// `fuzz/regressions/TARGET/`: inputs that once crashed the target, replayed by the tests.
pub fn regressions_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions").join(target)
}

/// The files of a directory (none when it does not exist), sorted by name.
pub fn read_inputs(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut inputs: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|path| path.is_file())
                .filter_map(|path| std::fs::read(&path).ok().map(|bytes| (path, bytes)))
                .collect()
        })
        .unwrap_or_default();
    inputs.sort();
    inputs
}

/// A file name for a crashing input: `crash-` and the first 16 hex digits of its blake3 hash.
pub fn crash_name(input: &[u8]) -> String {
    format!("crash-{}", &blake3::hash(input).to_hex()[..16])
}
