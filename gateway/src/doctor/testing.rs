//! Traffic for the detectors' tests: token ids shaped like the prompts of real applications (a system
//! prompt, tools, questions, replies), fed through a [`Doctor`] one second apart.

use super::{Doctor, DoctorConfig, Kind, Observation, Observed};
use crate::routing::Millis;

/// `n` tokens of "text" from `seed` (ids below 20,000).
pub fn words(seed: u32, n: usize) -> Vec<u32> {
    let mut state = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 20_000) as u32
        })
        .collect()
}

pub fn join(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

/// A doctor fed prompts one second apart.
pub struct Feed {
    pub doctor: Doctor,
    pub now: Millis,
    next_id: u64,
}

impl Feed {
    pub fn new() -> Feed {
        Feed::with(DoctorConfig::default())
    }

    pub fn with(config: DoctorConfig) -> Feed {
        Feed { doctor: Doctor::new(config), now: 1_000, next_id: 1 }
    }

    /// Routes one prompt (nothing found cached) and finishes it with `reply`.
    pub fn send(&mut self, tenant: &str, user: Option<&str>, prompt: &[u32], reply: &[u32]) -> Observed {
        self.now += 1_000;
        let id = self.next_id;
        self.next_id += 1;
        let observation =
            Observation { tenant, user, scope: 0, tokens: prompt, prompt_len: prompt.len(), matched: [0; 3] };
        let observed = self.doctor.observe(self.now, id, &observation);
        self.doctor.finished(self.now, id, reply, prompt.len() as u64, 0);
        observed
    }

    /// The raised diagnoses of `tenant`.
    pub fn raised(&self, tenant: &str) -> Vec<Kind> {
        self.doctor.active_for(tenant).unwrap_or_default()
    }
}

/// A conversation: its turns' prompts, each the previous prompt, its reply and the next question.
pub fn conversation(system: &[u32], session: u32, turns: usize) -> Vec<(Vec<u32>, Vec<u32>)> {
    let mut history = system.to_vec();
    (0..turns as u32)
        .map(|turn| {
            history.extend(words(10_000 + session * 100 + turn, 20));
            let prompt = history.clone();
            let reply = words(50_000 + session * 100 + turn, 24);
            history.extend(&reply);
            (prompt, reply)
        })
        .collect()
}

/// Sends `sessions` conversations of `turns` turns, two at a time, with `system(session)` as their
/// system prompt and `user(session)` as their user; returns the raised diagnoses after each prompt.
pub fn chat(
    feed: &mut Feed,
    tenant: &str,
    sessions: u32,
    turns: usize,
    system: impl Fn(u32) -> Vec<u32>,
    user: impl Fn(u32) -> Option<String>,
) -> Vec<Vec<Kind>> {
    let mut raised = Vec::new();
    for pair in (0..sessions).collect::<Vec<_>>().chunks(2) {
        let conversations: Vec<_> =
            pair.iter().map(|&session| conversation(&system(session), session, turns)).collect();
        for turn in 0..turns {
            for (conversation, &session) in conversations.iter().zip(pair) {
                let (prompt, reply) = &conversation[turn];
                feed.send(tenant, user(session).as_deref(), prompt, reply);
                raised.push(feed.raised(tenant));
            }
        }
    }
    raised
}

/// The first prompt (1-based) after which `kind` was raised.
pub fn raised_after(history: &[Vec<Kind>], kind: Kind) -> Option<usize> {
    history.iter().position(|kinds| kinds.contains(&kind)).map(|index| index + 1)
}
