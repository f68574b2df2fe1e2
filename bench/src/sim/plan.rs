//! What a simulation replays, as token ids: open-loop requests at fixed times (a Mooncake trace, the
//! `shared-prefix` experiment) and closed-loop sessions whose next turn is sent a think time after the
//! previous reply (the load generator's synthetic workloads, rendered with the built-in tokenizer).

use std::sync::Arc;

use kvroute_gateway::routing::{RandomSource, SplitMix64};
use kvroute_gateway::tokenizer::Tokenizer;
use kvroute_proto::{BlockHashMap, BlockHasher};

use crate::trace::TraceRequest;
use crate::workload::{self, WorkloadConfig, WorkloadKind};

/// A request sent at a fixed time.
#[derive(Clone, Debug)]
pub struct OpenRequest {
    pub arrival_s: f64,
    pub prompt: Prompt,
    pub output_tokens: u32,
}

/// Where an open request's prompt comes from (trace prompts are expanded when sent, to save memory).
#[derive(Clone, Debug)]
pub enum Prompt {
    Tokens(Arc<Vec<u32>>),
    Trace(usize),
}

/// A conversation: each turn resends the history with the replies the engine generated.
#[derive(Clone, Debug)]
pub struct Session {
    pub start_s: f64,
    pub system: Vec<u32>,
    /// OpenAI's `user` field of the session's requests (`personalised`).
    pub user: Option<String>,
    pub turns: Vec<SessionTurn>,
}

#[derive(Clone, Debug)]
pub struct SessionTurn {
    pub user: Vec<u32>,
    /// Replaces the system prompt (and tools) for this turn (`timestamp-top`, `shuffled-tools`).
    pub system: Option<Vec<u32>>,
    pub think_s: f64,
    pub output_tokens: u32,
}

/// Everything one simulation sends.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub open: Vec<OpenRequest>,
    pub sessions: Vec<Session>,
    pub trace: Vec<TraceRequest>,
    pub vocab_size: u32,
}

/// Parameters of llm-d's shared-prefix experiment.
#[derive(Clone, Copy, Debug)]
pub struct SharedPrefix {
    pub groups: usize,
    pub system_tokens: usize,
    pub users_per_group: usize,
    pub question_tokens: usize,
    pub output_tokens: u32,
    /// Requests sent, each a uniformly drawn (group, user) prompt.
    pub requests: usize,
    /// Requests per second (Poisson arrivals).
    pub rate: f64,
}

impl Plan {
    /// A trace replayed with its gaps divided by `rate_scale`.
    pub fn from_trace(trace: Vec<TraceRequest>, rate_scale: f64, vocab_size: u32) -> Plan {
        let open = trace
            .iter()
            .enumerate()
            .map(|(index, request)| OpenRequest {
                arrival_s: request.timestamp_ms as f64 / 1000.0 / rate_scale,
                prompt: Prompt::Trace(index),
                output_tokens: request.output_length.max(1),
            })
            .collect();
        Plan { open, sessions: Vec::new(), trace, vocab_size }
    }

    /// The load generator's synthetic sessions, tokenized; session starts sped up by `rate_scale`.
    pub fn from_workload(kind: WorkloadKind, config: &WorkloadConfig, rate_scale: f64) -> Plan {
        let tokenizer = Tokenizer::builtin();
        let encode = |text: &str| tokenizer.encode(text);
        // The system prompt with the tools after it, one JSON line each (what a chat template makes of them).
        let system_tokens = |system: &str, tools: &[serde_json::Value]| {
            let mut tokens = encode(system);
            for tool in tools {
                tokens.extend(encode(&tool.to_string()));
            }
            tokens
        };
        let sessions = workload::generate(kind, config)
            .into_iter()
            .map(|session| {
                let system = system_tokens(&session.system, &session.tools);
                let turns = session
                    .turns
                    .iter()
                    .map(|turn| SessionTurn {
                        user: encode(&turn.user),
                        system: (turn.system.is_some() || turn.tools.is_some()).then(|| {
                            let tools = turn.tools.as_deref().unwrap_or(&session.tools);
                            system_tokens(turn.system.as_deref().unwrap_or(&session.system), tools)
                        }),
                        think_s: turn.think_ms as f64 / 1000.0,
                        output_tokens: turn.max_tokens.max(1),
                    })
                    .collect();
                Session { start_s: session.start_ms as f64 / 1000.0 / rate_scale, system, user: session.user, turns }
            })
            .collect();
        Plan { open: Vec::new(), sessions, trace: Vec::new(), vocab_size: tokenizer.vocab_size() }
    }

    /// llm-d's shared-prefix experiment: groups sharing long system prompts, users asking long questions.
    pub fn shared_prefix(params: &SharedPrefix, vocab_size: u32, seed: u64, rate_scale: f64) -> Plan {
        let mut rng = SplitMix64::new(seed ^ 0x5348_4152_4544);
        let random_tokens = |n: usize, rng: &mut SplitMix64| -> Vec<u32> {
            (0..n).map(|_| (rng.next_u64() % u64::from(vocab_size.max(1))) as u32).collect()
        };
        let mut prompts = Vec::with_capacity(params.groups * params.users_per_group);
        for _ in 0..params.groups {
            let system = random_tokens(params.system_tokens, &mut rng);
            for _ in 0..params.users_per_group {
                let mut prompt = system.clone();
                prompt.extend(random_tokens(params.question_tokens, &mut rng));
                prompts.push(Arc::new(prompt));
            }
        }
        if prompts.is_empty() {
            return Plan { vocab_size, ..Plan::default() };
        }
        let mut clock = 0.0;
        let open = (0..params.requests)
            .map(|_| {
                clock += -(1.0 - unit(&mut rng)).ln() / (params.rate * rate_scale).max(1e-9);
                let prompt = prompts[rng.below(prompts.len())].clone();
                OpenRequest {
                    arrival_s: clock,
                    prompt: Prompt::Tokens(prompt),
                    output_tokens: params.output_tokens.max(1),
                }
            })
            .collect();
        Plan { open, sessions: Vec::new(), trace: Vec::new(), vocab_size }
    }

    /// The prompt of an open request.
    pub fn prompt(&self, prompt: &Prompt) -> Arc<Vec<u32>> {
        match prompt {
            Prompt::Tokens(tokens) => tokens.clone(),
            Prompt::Trace(index) => Arc::new(self.trace[*index].prompt_tokens(self.vocab_size)),
        }
    }

    /// Requests in all.
    pub fn requests(&self) -> usize {
        self.open.len() + self.sessions.iter().map(|session| session.turns.len()).sum::<usize>()
    }

    /// The hit ratio of one infinite cache that keeps every block ever computed (prompts and
    /// replies), requests taken in arrival order (sessions' turns in order): no router can beat it.
    pub fn bound_hit_ratio(&self, block_size: usize, model_id: &str) -> f64 {
        let hasher = BlockHasher::new(block_size as u32, model_id, b"");
        let mut seen: BlockHashMap<()> = BlockHashMap::default();
        let (mut hit, mut total) = (0usize, 0usize);
        let mut visit = |prompt: &[u32], output_tokens: u32| {
            let mut sequence = prompt.to_vec();
            sequence.extend(std::iter::repeat_n(0, output_tokens as usize));
            // Chain hashes: the prompt's are the first of the whole sequence's.
            let hashes = hasher.hashes(&sequence);
            let prompt_blocks = prompt.len() / block_size;
            let matched = hashes[..prompt_blocks].iter().take_while(|hash| seen.contains_key(*hash)).count();
            hit += (matched * block_size).min(prompt.len().saturating_sub(1));
            total += prompt.len();
            seen.extend(hashes.into_iter().map(|hash| (hash, ())));
        };
        for request in &self.open {
            visit(&self.prompt(&request.prompt), request.output_tokens);
        }
        for session in &self.sessions {
            let mut history = Vec::new();
            for turn in &session.turns {
                let prompt = session_prompt(session, turn, &history);
                visit(&prompt, turn.output_tokens);
                history.extend(&turn.user);
                history.extend(std::iter::repeat_n(0, turn.output_tokens as usize));
            }
        }
        if total == 0 { 0.0 } else { hit as f64 / total as f64 }
    }
}

/// A turn's prompt: its system prompt, the history so far (users' turns and replies), its user turn.
pub fn session_prompt(session: &Session, turn: &SessionTurn, history: &[u32]) -> Vec<u32> {
    let system = turn.system.as_ref().unwrap_or(&session.system);
    let mut prompt = Vec::with_capacity(system.len() + history.len() + turn.user.len());
    prompt.extend(system);
    prompt.extend(history);
    prompt.extend(&turn.user);
    prompt
}

fn unit(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}
