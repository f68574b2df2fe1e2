//! Every target accepts its seeds and every input kept under `fuzz/regressions/`
//! (inputs that once crashed it) without panicking, and a short fuzzing run of
//! each target (a fixed number of inputs) finds nothing.

use kvroute_fuzz::{Budget, RunConfig, execute, fuzz, read_inputs, regressions_dir, targets};

#[test]
fn seeds_and_kept_crashes_run_clean() {
    for target in targets::all() {
        for seed in (target.seeds)() {
            if let Err(message) = execute(&target, &seed) {
                panic!("{}: a seed panics: {message}", target.name);
            }
        }
        for (path, input) in read_inputs(&regressions_dir(target.name)) {
            if let Err(message) = execute(&target, &input) {
                panic!("{}: {} panics again: {message}", target.name, path.display());
            }
        }
    }
}

#[test]
fn seeds_reach_the_parsers_success_paths() {
    // A seed that every parser refused would fuzz only the error paths.
    for target in targets::all() {
        let outcomes: Vec<String> = (target.seeds)().iter().map(|seed| execute(&target, seed).unwrap()).collect();
        assert!(
            outcomes.iter().any(|outcome| outcome.contains("ok") || outcome.contains("snapshot")),
            "{}: no seed parses: {outcomes:?}",
            target.name
        );
    }
}

/// Mutated inputs per target in the tests: a fixed amount of work, the same inputs every run (about 5 s for
/// all eight targets on a 2-core machine; `scripts/fuzz.sh` runs for a time instead).
const EXECUTIONS: u64 = 200_000;

#[test]
fn a_short_run_of_every_target_finds_nothing() {
    for target in targets::all() {
        let config = RunConfig { budget: Budget::Executions(EXECUTIONS), seed: 7, max_len: 2048, verbose: false };
        let report = fuzz(&target, config, Vec::new());
        assert!(report.executions > EXECUTIONS, "{}: only {} executions", target.name, report.executions);
        if let Some((input, message)) = report.crash {
            panic!("{}: {message} on {:?}", target.name, String::from_utf8_lossy(&input));
        }
    }
}
