//! The prefix-cache doctor's core on the synthetic workloads as the simulator renders them (token ids of the
//! built-in tokenizer; turns in the order their sessions would send them, each resending its history with
//! a reply): each workload that reproduces a cause of a cold cache is diagnosed as that cause within a
//! bounded number of requests, and the ordinary workloads raise nothing. Deterministic: no processes, no
//! clock.

#![allow(clippy::unwrap_used)]

use kvroute_bench::sim::plan::{Plan, session_prompt};
use kvroute_bench::workload::{WorkloadConfig, WorkloadKind};
use kvroute_gateway::doctor::{Doctor, DoctorConfig, Kind, Observation};

/// Feeds `kind`'s requests to a doctor in arrival order; returns the diagnoses raised after each request.
fn diagnose(kind: WorkloadKind, sessions: usize, turns: usize) -> (Doctor, Vec<Vec<Kind>>) {
    let config = WorkloadConfig { sessions, turns, sessions_per_second: 0.5, think_ms: 1_000, max_tokens: 16, seed: 7 };
    let plan = Plan::from_workload(kind, &config, 1.0);
    // Each turn's send time: its session's start plus the think times before it (replies take no time here).
    let mut sends: Vec<(f64, usize, usize)> = Vec::new();
    for (index, session) in plan.sessions.iter().enumerate() {
        let mut at = session.start_s;
        for (turn, step) in session.turns.iter().enumerate() {
            at += step.think_s;
            sends.push((at, index, turn));
        }
    }
    sends.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut histories: Vec<Vec<u32>> = vec![Vec::new(); plan.sessions.len()];
    let mut doctor = Doctor::new(DoctorConfig::default());
    let mut raised = Vec::new();
    for (id, &(at, index, turn)) in sends.iter().enumerate() {
        let session = &plan.sessions[index];
        let step = &session.turns[turn];
        let prompt = session_prompt(session, step, &histories[index]);
        let observation = Observation {
            tenant: "app",
            user: session.user.as_deref(),
            scope: 0,
            tokens: &prompt,
            prompt_len: prompt.len(),
            matched: [0; 3],
        };
        let now = (at * 1e3) as u64;
        doctor.observe(now, id as u64, &observation);
        let reply: Vec<u32> =
            (0..step.output_tokens).map(|i| 1_000 + (index as u32 * 97 + turn as u32 * 31 + i) % 5_000).collect();
        doctor.finished(now, id as u64, &reply, prompt.len() as u64, 0);
        histories[index].extend(&step.user);
        histories[index].extend(&reply);
        raised.push(doctor.active_for("app").unwrap_or_default());
    }
    (doctor, raised)
}

/// The first request (1-based) after which `kind` was raised.
fn raised_after(raised: &[Vec<Kind>], kind: Kind) -> Option<usize> {
    raised.iter().position(|kinds| kinds.contains(&kind)).map(|index| index + 1)
}

#[test]
fn ordinary_workloads_raise_nothing() {
    for kind in [WorkloadKind::Chat, WorkloadKind::Agent, WorkloadKind::Rag, WorkloadKind::Fewshot] {
        let (doctor, raised) = diagnose(kind, 24, 3);
        let ever: Vec<&Vec<Kind>> = raised.iter().filter(|kinds| !kinds.is_empty()).collect();
        assert!(ever.is_empty(), "{kind}: {:?}", ever.first());
        assert_eq!(doctor.active(), [0; 5], "{kind}");
    }
}

/// Each workload that keeps a cache cold, the diagnosis it must get, and the most requests that may take.
const CASES: [(WorkloadKind, Kind, usize); 5] = [
    (WorkloadKind::TimestampTop, Kind::VaryingTop, 8),
    (WorkloadKind::ShuffledTools, Kind::UnstableOrder, 10),
    (WorkloadKind::PromptChange, Kind::PromptChanged, 32),
    (WorkloadKind::AbSplit, Kind::Variants, 24),
    (WorkloadKind::Personalised, Kind::Personalised, 24),
];

#[test]
fn each_cold_cache_workload_gets_its_diagnosis_and_no_other() {
    for (workload, expected, within) in CASES {
        let (doctor, raised) = diagnose(workload, 16, 2);
        let at = raised_after(&raised, expected);
        assert!(at.is_some_and(|at| at <= within), "{workload}: {expected:?} after {at:?} requests (at most {within})");
        let others: Vec<Kind> = raised.iter().flatten().copied().filter(|&kind| kind != expected).collect();
        assert!(others.is_empty(), "{workload}: also {others:?}");
        assert!(doctor.active_for("app").unwrap().contains(&expected), "{workload}: still raised at the end");
    }
}
