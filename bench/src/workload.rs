//! Synthetic workloads: sessions of chat turns whose prompts share prefixes the way applications do (or, for
//! `timestamp-top`, fail to). A driver sends each session's turns in order, resending the history with the
//! replies it received. Deterministic for a seed.
//!
//! - `chat`: every user shares one system prompt and talks for several turns.
//! - `agent`: a system prompt with long tool definitions; each turn brings a tool observation, so the
//!   scratchpad (the history) grows.
//! - `rag`: one question per session with passages retrieved for it: a fixed system prompt, then text that
//!   differs per query.
//! - `fewshot`: a large fixed block of examples and a short query.
//! - `timestamp-top`: `chat` with the current time at the top of the system prompt, the mistake that makes
//!   every prompt differ from its first block.

use std::fmt;
use std::str::FromStr;

use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadKind {
    Chat,
    Agent,
    Rag,
    Fewshot,
    TimestampTop,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 5] =
        [WorkloadKind::Chat, WorkloadKind::Agent, WorkloadKind::Rag, WorkloadKind::Fewshot, WorkloadKind::TimestampTop];

    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Chat => "chat",
            WorkloadKind::Agent => "agent",
            WorkloadKind::Rag => "rag",
            WorkloadKind::Fewshot => "fewshot",
            WorkloadKind::TimestampTop => "timestamp-top",
        }
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WorkloadKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        WorkloadKind::ALL.into_iter().find(|kind| kind.name() == text).ok_or_else(|| {
            let names: Vec<&str> = WorkloadKind::ALL.iter().map(|kind| kind.name()).collect();
            format!("unknown workload {text:?} (known: {})", names.join(", "))
        })
    }
}

/// How much of a workload to generate.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub sessions: usize,
    /// Turns per session for the multi-turn workloads (`rag` and `fewshot` have one).
    pub turns: usize,
    /// Sessions starting per second (Poisson arrivals).
    pub sessions_per_second: f64,
    /// Mean pause between a reply and the user's next turn.
    pub think_ms: u64,
    pub max_tokens: u32,
    pub seed: u64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig { sessions: 32, turns: 4, sessions_per_second: 1.0, think_ms: 1000, max_tokens: 32, seed: 1 }
    }
}

/// One conversation.
#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    pub id: u64,
    /// When the first turn is sent, from the start of the run.
    pub start_ms: u64,
    pub system: String,
    /// Tool definitions sent with every turn (OpenAI `tools`), empty for most workloads.
    pub tools: Vec<Value>,
    pub turns: Vec<Turn>,
}

/// One user message, sent after the previous reply and a pause.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub user: String,
    /// Replaces the session's system prompt for this turn (`timestamp-top`).
    pub system: Option<String>,
    pub max_tokens: u32,
    /// Pause after the previous reply (0 for the first turn).
    pub think_ms: u64,
}

/// The sessions of a workload, ordered by start time.
pub fn generate(kind: WorkloadKind, config: &WorkloadConfig) -> Vec<Session> {
    let mut rng = Rng(config.seed ^ 0x6B76_726F_7574_6521);
    let system = format!("You are the assistant of Harbourline, a shipping company. {}", rng.prose(300));
    let tools = if kind == WorkloadKind::Agent { agent_tools(&mut rng) } else { Vec::new() };
    let examples = (0..24)
        .map(|i| format!("Example {i}. Question: {} Answer: {}", rng.prose(30), rng.prose(25)))
        .collect::<Vec<_>>()
        .join("\n");
    let passages: Vec<String> = (0..200).map(|i| format!("[passage {i}] {}", rng.prose(110))).collect();
    let mut start_ms = 0.0;
    let mut sessions = Vec::with_capacity(config.sessions);
    for id in 0..config.sessions as u64 {
        start_ms += rng.exponential(1000.0 / config.sessions_per_second.max(1e-6));
        let turns = match kind {
            WorkloadKind::Rag | WorkloadKind::Fewshot => 1,
            _ => config.turns.max(1),
        };
        let mut session_turns = Vec::with_capacity(turns);
        for turn in 0..turns {
            let think_ms = if turn == 0 { 0 } else { rng.exponential(config.think_ms as f64) as u64 };
            let (user, system_override) = match kind {
                WorkloadKind::Chat => (rng.question(), None),
                WorkloadKind::TimestampTop => {
                    let now = start_ms as u64 + turn as u64 * config.think_ms;
                    (rng.question(), Some(format!("Current time: {}. {system}", clock(now))))
                }
                WorkloadKind::Agent if turn == 0 => (format!("Task: {}", rng.prose(40)), None),
                WorkloadKind::Agent => (format!("Observation from the last tool call: {}", rng.prose(150)), None),
                WorkloadKind::Rag => {
                    let chosen: Vec<&str> = (0..3).map(|_| passages[rng.below(passages.len())].as_str()).collect();
                    (format!("Context:\n{}\n\nQuestion: {}", chosen.join("\n"), rng.question()), None)
                }
                WorkloadKind::Fewshot => (format!("{examples}\n\nQuestion: {}", rng.question()), None),
            };
            session_turns.push(Turn { user, system: system_override, max_tokens: config.max_tokens, think_ms });
        }
        let system = match kind {
            WorkloadKind::Fewshot => "Answer in the style of the examples.".to_string(),
            _ => system.clone(),
        };
        sessions.push(Session { id, start_ms: start_ms as u64, system, tools: tools.clone(), turns: session_turns });
    }
    sessions
}

fn agent_tools(rng: &mut Rng) -> Vec<Value> {
    ["track_shipment", "book_berth", "quote_freight", "list_vessels", "customs_status", "weather_at_port"]
        .iter()
        .map(|name| {
            json!({"type": "function", "function": {
                "name": name,
                "description": rng.prose(60),
                "parameters": {"type": "object", "properties": {
                    "id": {"type": "string", "description": rng.prose(20)},
                    "port": {"type": "string", "description": rng.prose(20)},
                    "date": {"type": "string", "description": rng.prose(15)},
                }, "required": ["id"]},
            }})
        })
        .collect()
}

/// `HH:MM:SS.mmm` of a millisecond offset: a clock that changes with every request.
fn clock(ms: u64) -> String {
    format!("{:02}:{:02}:{:02}.{:03}", ms / 3_600_000 % 24, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
}

const WORDS: [&str; 64] = [
    "the",
    "ship",
    "port",
    "cargo",
    "crew",
    "harbour",
    "tide",
    "berth",
    "manifest",
    "customs",
    "weather",
    "schedule",
    "route",
    "container",
    "crane",
    "dock",
    "vessel",
    "captain",
    "pilot",
    "anchor",
    "storm",
    "north",
    "south",
    "delay",
    "arrival",
    "departure",
    "freight",
    "invoice",
    "ledger",
    "season",
    "winter",
    "summer",
    "fuel",
    "engine",
    "radio",
    "signal",
    "channel",
    "bay",
    "pier",
    "lock",
    "canal",
    "insurance",
    "claim",
    "damage",
    "inspection",
    "record",
    "price",
    "market",
    "fish",
    "grain",
    "timber",
    "steel",
    "coal",
    "oil",
    "of",
    "and",
    "to",
    "in",
    "with",
    "for",
    "on",
    "at",
    "by",
    "from",
];

/// SplitMix64, for reproducible text and timings.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    fn prose(&mut self, words: usize) -> String {
        let mut text = String::new();
        for i in 0..words {
            if i > 0 {
                text.push(if i % 12 == 0 { '.' } else { ' ' });
                if i % 12 == 0 {
                    text.push(' ');
                }
            }
            text.push_str(WORDS[self.below(WORDS.len())]);
        }
        text.push('.');
        text
    }

    fn question(&mut self) -> String {
        let words = 8 + self.below(16);
        let mut question = self.prose(words);
        question.pop();
        question.push('?');
        question
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(kind: WorkloadKind) -> Vec<Session> {
        generate(kind, &WorkloadConfig { sessions: 6, turns: 3, ..WorkloadConfig::default() })
    }

    #[test]
    fn names_round_trip() {
        for kind in WorkloadKind::ALL {
            assert_eq!(kind.name().parse::<WorkloadKind>(), Ok(kind));
        }
        assert!("chatty".parse::<WorkloadKind>().unwrap_err().contains("timestamp-top"));
    }

    #[test]
    fn the_same_seed_gives_the_same_workload_and_another_seed_another() {
        let config = WorkloadConfig::default();
        assert_eq!(generate(WorkloadKind::Agent, &config), generate(WorkloadKind::Agent, &config));
        let other = WorkloadConfig { seed: 2, ..config.clone() };
        assert_ne!(generate(WorkloadKind::Agent, &config), generate(WorkloadKind::Agent, &other));
    }

    #[test]
    fn each_workload_shares_what_its_application_shares() {
        for kind in WorkloadKind::ALL {
            let all = sessions(kind);
            assert_eq!(all.len(), 6);
            assert!(all.windows(2).all(|w| w[0].start_ms <= w[1].start_ms), "{kind}: ordered arrivals");
            assert!(all.iter().all(|s| s.system == all[0].system), "{kind}: one system prompt");
            let turns = if matches!(kind, WorkloadKind::Rag | WorkloadKind::Fewshot) { 1 } else { 3 };
            assert!(all.iter().all(|s| s.turns.len() == turns), "{kind}");
        }
        let agent = sessions(WorkloadKind::Agent);
        assert_eq!(agent[0].tools.len(), 6);
        assert!(agent.iter().all(|s| s.tools == agent[0].tools), "tool definitions are shared");
        let fewshot = sessions(WorkloadKind::Fewshot);
        let block = |s: &Session| s.turns[0].user.split("\n\nQuestion:").next().map(str::to_string);
        assert!(fewshot.iter().all(|s| block(s) == block(&fewshot[0])), "the example block is shared");
        assert!(fewshot[0].turns[0].user.len() > 5_000, "and large");
        let rag = sessions(WorkloadKind::Rag);
        assert_ne!(rag[0].turns[0].user, rag[1].turns[0].user, "retrieved passages differ per query");
    }

    #[test]
    fn timestamp_top_puts_a_different_time_first_in_every_prompt() {
        let all = sessions(WorkloadKind::TimestampTop);
        let systems: Vec<&str> = all.iter().flat_map(|s| &s.turns).filter_map(|t| t.system.as_deref()).collect();
        assert_eq!(systems.len(), 18);
        assert!(systems.iter().all(|s| s.starts_with("Current time: ") && s.ends_with(&all[0].system)));
        let mut distinct = systems.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), systems.len(), "no two prompts share their first characters' time");
    }
}
