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
//!
//! Four more reproduce what else keeps a prefix cache cold, each a case the gateway's prefix-cache doctor
//! (`/debug/prefix-report`) diagnoses:
//! - `shuffled-tools`: `agent` with its tools listed in a new order every turn (a serializer iterating a hash
//!   map); the gateway sorts tools unless it runs with `--tool-order as-sent`, which lets the order through.
//! - `prompt-change`: `chat` whose system prompt has one word changed for the second half of the sessions (a
//!   deploy that touched the prompt).
//! - `ab-split`: `chat` with two system prompts (one has an extra sentence near the top), each session on
//!   one of them at random (an A/B test).
//! - `personalised`: `chat` whose system prompt names the user (profile after the first sentence), with
//!   OpenAI's `user` field set; every user has two sessions.

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
    ShuffledTools,
    PromptChange,
    AbSplit,
    Personalised,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 9] = [
        WorkloadKind::Chat,
        WorkloadKind::Agent,
        WorkloadKind::Rag,
        WorkloadKind::Fewshot,
        WorkloadKind::TimestampTop,
        WorkloadKind::ShuffledTools,
        WorkloadKind::PromptChange,
        WorkloadKind::AbSplit,
        WorkloadKind::Personalised,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Chat => "chat",
            WorkloadKind::Agent => "agent",
            WorkloadKind::Rag => "rag",
            WorkloadKind::Fewshot => "fewshot",
            WorkloadKind::TimestampTop => "timestamp-top",
            WorkloadKind::ShuffledTools => "shuffled-tools",
            WorkloadKind::PromptChange => "prompt-change",
            WorkloadKind::AbSplit => "ab-split",
            WorkloadKind::Personalised => "personalised",
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
    /// OpenAI's `user` field, sent with every turn (`personalised`).
    pub user: Option<String>,
    pub turns: Vec<Turn>,
}

/// One user message, sent after the previous reply and a pause.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub user: String,
    /// Replaces the session's system prompt for this turn (`timestamp-top`).
    pub system: Option<String>,
    /// Replaces the session's tools for this turn (`shuffled-tools`: the same tools in another order).
    pub tools: Option<Vec<Value>>,
    pub max_tokens: u32,
    /// Pause after the previous reply (0 for the first turn).
    pub think_ms: u64,
}

/// The sessions of a workload, ordered by start time.
pub fn generate(kind: WorkloadKind, config: &WorkloadConfig) -> Vec<Session> {
    let mut rng = Rng(config.seed ^ 0x6B76_726F_7574_6521);
    let prose = rng.prose(300);
    let system = format!("{SYSTEM_OPENING} {prose}");
    let tools = if matches!(kind, WorkloadKind::Agent | WorkloadKind::ShuffledTools) {
        agent_tools(&mut rng)
    } else {
        Vec::new()
    };
    let examples = (0..24)
        .map(|i| format!("Example {i}. Question: {} Answer: {}", rng.prose(30), rng.prose(25)))
        .collect::<Vec<_>>()
        .join("\n");
    let passages: Vec<String> = (0..200).map(|i| format!("[passage {i}] {}", rng.prose(110))).collect();
    let users = config.sessions.div_ceil(2).max(1);
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
                WorkloadKind::Chat
                | WorkloadKind::PromptChange
                | WorkloadKind::AbSplit
                | WorkloadKind::Personalised => (rng.question(), None),
                WorkloadKind::TimestampTop => {
                    let now = start_ms as u64 + turn as u64 * config.think_ms;
                    (rng.question(), Some(format!("Current time: {}. {system}", clock(now))))
                }
                WorkloadKind::Agent | WorkloadKind::ShuffledTools if turn == 0 => {
                    (format!("Task: {}", rng.prose(40)), None)
                }
                WorkloadKind::Agent | WorkloadKind::ShuffledTools => {
                    (format!("Observation from the last tool call: {}", rng.prose(150)), None)
                }
                WorkloadKind::Rag => {
                    let chosen: Vec<&str> = (0..3).map(|_| passages[rng.below(passages.len())].as_str()).collect();
                    (format!("Context:\n{}\n\nQuestion: {}", chosen.join("\n"), rng.question()), None)
                }
                WorkloadKind::Fewshot => (format!("{examples}\n\nQuestion: {}", rng.question()), None),
            };
            let turn_tools = (kind == WorkloadKind::ShuffledTools).then(|| rng.shuffled(&tools));
            session_turns.push(Turn {
                user,
                system: system_override,
                tools: turn_tools,
                max_tokens: config.max_tokens,
                think_ms,
            });
        }
        let user = (kind == WorkloadKind::Personalised).then(|| id as usize % users);
        let system = match kind {
            WorkloadKind::Fewshot => "Answer in the style of the examples.".to_string(),
            WorkloadKind::PromptChange if id as usize >= config.sessions / 2 => one_word_changed(&system),
            WorkloadKind::AbSplit if rng.below(2) == 1 => format!("{SYSTEM_OPENING} {VARIANT_B_SENTENCE} {prose}"),
            WorkloadKind::Personalised => {
                format!("{SYSTEM_OPENING} You are helping {}. {prose}", profile(user.unwrap_or(0)))
            }
            _ => system.clone(),
        };
        sessions.push(Session {
            id,
            start_ms: start_ms as u64,
            system,
            tools: tools.clone(),
            user: user.map(|user| format!("user-{user:04}")),
            turns: session_turns,
        });
    }
    sessions
}

/// The first sentence of every workload's system prompt (`fewshot`'s aside).
const SYSTEM_OPENING: &str = "You are the assistant of Harbourline, a shipping company.";

/// The sentence `ab-split`'s second variant adds after the first one.
const VARIANT_B_SENTENCE: &str = "Keep every answer under three sentences and never guess a date.";

/// The system prompt with its word a third of the way in replaced (`prompt-change`'s new prompt).
fn one_word_changed(system: &str) -> String {
    let mut words: Vec<&str> = system.split(' ').collect();
    let at = words.len() / 3;
    let replacement = if words[at].ends_with('.') { "revised." } else { "revised" };
    words[at] = replacement;
    words.join(" ")
}

/// A user's profile as `personalised` writes it into the system prompt.
fn profile(user: usize) -> String {
    const NAMES: [&str; 8] = [
        "Ada Moreau",
        "Bjorn Castell",
        "Chidi Okafor",
        "Dana Whitlock",
        "Emeka Stone",
        "Farah Quist",
        "Goran Vale",
        "Hana Ito",
    ];
    const PLANS: [&str; 3] = ["freight", "priority", "standard"];
    format!("{} (customer {:05}, {} plan)", NAMES[user % NAMES.len()], 10_000 + user * 37, PLANS[user % PLANS.len()])
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

    /// The items in a random order (Fisher-Yates).
    fn shuffled<T: Clone>(&mut self, items: &[T]) -> Vec<T> {
        let mut items = items.to_vec();
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
        items
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

    /// The workloads whose sessions do not all share one system prompt.
    const OWN_SYSTEM_PROMPTS: [WorkloadKind; 3] =
        [WorkloadKind::PromptChange, WorkloadKind::AbSplit, WorkloadKind::Personalised];

    #[test]
    fn each_workload_shares_what_its_application_shares() {
        for kind in WorkloadKind::ALL {
            let all = sessions(kind);
            assert_eq!(all.len(), 6);
            assert!(all.windows(2).all(|w| w[0].start_ms <= w[1].start_ms), "{kind}: ordered arrivals");
            let one_system = all.iter().all(|s| s.system == all[0].system);
            assert_eq!(one_system, !OWN_SYSTEM_PROMPTS.contains(&kind), "{kind}: one system prompt");
            assert_eq!(all.iter().all(|s| s.user.is_some()), kind == WorkloadKind::Personalised, "{kind}: users");
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

    #[test]
    fn shuffled_tools_lists_the_agent_tools_in_a_new_order_each_turn() {
        let all = sessions(WorkloadKind::ShuffledTools);
        let names = |tools: &[Value]| -> Vec<String> {
            tools.iter().map(|tool| tool["function"]["name"].as_str().unwrap().to_string()).collect()
        };
        let mut sorted_session = names(&all[0].tools);
        sorted_session.sort();
        let orders: Vec<Vec<String>> =
            all.iter().flat_map(|s| &s.turns).map(|turn| names(turn.tools.as_deref().unwrap())).collect();
        assert_eq!(orders.len(), 18);
        for order in &orders {
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(sorted, sorted_session, "the same tools");
        }
        let mut distinct = orders.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() >= 12, "in varying orders: {} distinct of 18", distinct.len());
        assert_eq!(all[0].tools, sessions(WorkloadKind::Agent)[0].tools, "the agent's tools");
    }

    #[test]
    fn prompt_change_changes_one_word_for_the_second_half() {
        let all = generate(WorkloadKind::PromptChange, &WorkloadConfig { sessions: 8, ..WorkloadConfig::default() });
        let (old, new) = (&all[0].system, &all[7].system);
        assert!(all[..4].iter().all(|s| &s.system == old) && all[4..].iter().all(|s| &s.system == new));
        let differing: Vec<(&str, &str)> = old.split(' ').zip(new.split(' ')).filter(|(a, b)| a != b).collect();
        assert_eq!(differing.len(), 1, "{differing:?}");
        assert!(differing[0].1.starts_with("revised"));
        assert_eq!(old.split(' ').count(), new.split(' ').count());
    }

    #[test]
    fn ab_split_serves_two_system_prompts_that_differ_near_the_top() {
        let all = generate(WorkloadKind::AbSplit, &WorkloadConfig { sessions: 16, ..WorkloadConfig::default() });
        let b = all.iter().filter(|s| s.system.contains(VARIANT_B_SENTENCE)).count();
        assert!((4..=12).contains(&b), "{b} of 16 sessions on B");
        let a = all.iter().find(|s| !s.system.contains(VARIANT_B_SENTENCE)).unwrap();
        assert_eq!(a.system, sessions(WorkloadKind::Chat)[0].system, "A is chat's");
        let b = all.iter().find(|s| s.system.contains(VARIANT_B_SENTENCE)).unwrap();
        assert_eq!(b.system.replace(&format!(" {VARIANT_B_SENTENCE}"), ""), a.system);
    }

    #[test]
    fn personalised_names_each_user_early_and_every_user_comes_twice() {
        let all = generate(WorkloadKind::Personalised, &WorkloadConfig { sessions: 8, ..WorkloadConfig::default() });
        for session in &all {
            let twin = all.iter().filter(|other| other.user == session.user).collect::<Vec<_>>();
            assert_eq!(twin.len(), 2, "{:?}", session.user);
            assert!(twin.iter().all(|other| other.system == session.system), "one user, one system prompt");
            assert!(session.system.starts_with(&format!("{SYSTEM_OPENING} You are helping ")));
        }
        let mut systems: Vec<&str> = all.iter().map(|s| s.system.as_str()).collect();
        systems.sort_unstable();
        systems.dedup();
        assert_eq!(systems.len(), 4, "four users, four system prompts");
    }
}
