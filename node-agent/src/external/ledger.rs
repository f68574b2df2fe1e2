//! The agent's own account of the requests it sent to its engine, and the load it reports from it: which
//! requests are open (exactly: the agent opened and closed each stream), how many prompt tokens the engine
//! still has to compute for those waiting for their first token (a prompt less the prefix its pool held
//! when it was sent, as the engine's events said: the rest the engine takes from its cache), the engine's prefill rate and decode step time as measured on those streams, and the
//! engine's own gauges (running against waiting, KV usage) read from its metrics. Synchronous; the caller
//! passes every time in.

use std::collections::HashMap;

use kvroute_proto::domain::LoadStats;

use super::engine_metrics::EngineGauges;
use crate::engine::rates::StepRates;

/// Requests the engine has and their measured speeds.
#[derive(Debug)]
pub struct Ledger {
    next_request_id: u64,
    open: HashMap<u64, Open>,
    finished: Vec<u64>,
    rates: StepRates,
    gauges: EngineGauges,
    /// kvroute blocks (of 16 tokens) the engine's KV cache holds.
    kv_blocks_total: u64,
    /// Sequences the engine runs at once at most (0: unknown).
    max_running_requests: u32,
}

#[derive(Debug)]
struct Open {
    prompt_tokens: u32,
    /// The prompt tokens the engine has to compute: those beyond the prefix its pool held when sent.
    uncached_tokens: u32,
    /// Another prompt was waiting for its first token when this one was sent: its time to first token
    /// includes that one's, and says nothing of the prefill rate.
    queued_behind: bool,
    /// Seconds from sending to the first token, once it came.
    first_token_after: Option<f64>,
    /// When (seconds, the caller's clock) the latest token came.
    last_token_at: Option<f64>,
}

impl Ledger {
    /// Engine ids start at 1 (0 is "not acknowledged" on the wire).
    pub fn new(kv_blocks_total: u64, max_running_requests: u32) -> Ledger {
        Ledger {
            next_request_id: 1,
            open: HashMap::new(),
            finished: Vec::new(),
            rates: StepRates::default(),
            gauges: EngineGauges::default(),
            kv_blocks_total,
            max_running_requests,
        }
    }

    /// Opens a request of `prompt_tokens`, of which the engine's pool held the first `pool_prefix_tokens`
    /// when it was sent; returns its id.
    pub fn open(&mut self, prompt_tokens: u32, pool_prefix_tokens: u32) -> u64 {
        let id = self.next_request_id;
        self.next_request_id += 1;
        // The engine computes at least the prompt's last token, whatever it holds.
        let uncached_tokens =
            if prompt_tokens == 0 { 0 } else { prompt_tokens.saturating_sub(pool_prefix_tokens).max(1) };
        let queued_behind = self.open.values().any(|open| open.first_token_after.is_none());
        let open = Open { prompt_tokens, uncached_tokens, queued_behind, first_token_after: None, last_token_at: None };
        self.open.insert(id, open);
        id
    }

    /// Tokens of request `id` arrived at `now` (seconds on the caller's clock), `since_sent` after it was
    /// sent; `count` tokens came in this piece.
    pub fn tokens(&mut self, id: u64, count: usize, now: f64, since_sent: f64) {
        let Some(open) = self.open.get_mut(&id) else { return };
        match open.last_token_at {
            None => open.first_token_after = Some(since_sent),
            Some(previous) if count > 0 => self.rates.record(0, 1, (now - previous) / count as f64),
            Some(_) => {}
        }
        if count > 0 {
            open.last_token_at = Some(now);
        }
    }

    /// Closes request `id`; `cached_tokens` is what the engine reported. Its prompt's uncached part and its
    /// time to first token are one sample of the prefill rate, unless another prompt was queued ahead of it
    /// ([`StepRates::record_first_token`]: the time beyond a decode step). Counting the wait behind other
    /// prompts made a busy replica's rate read several times too low.
    pub fn close(&mut self, id: u64, cached_tokens: Option<u32>) {
        let Some(open) = self.open.remove(&id) else { return };
        self.finished.push(id);
        if let (Some(cached), Some(seconds), false) = (cached_tokens, open.first_token_after, open.queued_behind) {
            let computed = open.prompt_tokens.saturating_sub(cached) as usize;
            self.rates.record_first_token(computed, seconds);
        }
    }

    pub fn set_gauges(&mut self, gauges: EngineGauges) {
        self.gauges = gauges;
    }

    /// Ids closed since the last call.
    pub fn take_finished(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.finished)
    }

    /// The id the next request gets: the load counts every earlier one still open.
    pub fn next_request_id(&self) -> u64 {
        self.next_request_id
    }

    pub fn open_requests(&self) -> usize {
        self.open.len()
    }

    /// The load to report. Running and waiting add up to the open requests exactly; the engine's gauges
    /// only say how they split.
    pub fn load(&self, draining: bool) -> LoadStats {
        let open = self.open.len() as u32;
        let waiting = (self.gauges.waiting.unwrap_or(0.0).max(0.0) as u32).min(open);
        let queued_prefill_tokens = self
            .open
            .values()
            .filter(|open| open.first_token_after.is_none())
            .map(|open| u64::from(open.uncached_tokens))
            .sum();
        let kv_blocks_used = ((self.gauges.kv_usage.unwrap_or(0.0) * self.kv_blocks_total as f64).round() as u64)
            .min(self.kv_blocks_total);
        LoadStats {
            waiting_requests: waiting,
            running_requests: open - waiting,
            queued_prefill_tokens,
            kv_blocks_used,
            kv_blocks_total: self.kv_blocks_total,
            prefill_tokens_per_second: self.rates.prefill_tokens_per_second(),
            decode_step_seconds: self.rates.decode_step_seconds(),
            draining,
            max_running_requests: self.max_running_requests,
            ..LoadStats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_requests_are_the_load_until_closed_and_their_ids_are_reported_once() {
        let mut ledger = Ledger::new(100, 48);
        let (a, b) = (ledger.open(300, 0), ledger.open(50, 0));
        assert_eq!((a, b, ledger.next_request_id()), (1, 2, 3));
        ledger.set_gauges(EngineGauges { waiting: Some(5.0), kv_usage: Some(0.5), ..EngineGauges::default() });
        let load = ledger.load(false);
        assert_eq!((load.running_requests, load.waiting_requests), (0, 2), "waiting never exceeds the open requests");
        assert_eq!((load.queued_prefill_tokens, load.kv_blocks_used, load.kv_blocks_total), (350, 50, 100));
        assert_eq!(load.max_running_requests, 48, "the engine's cap goes out with every load");
        ledger.tokens(a, 1, 10.0, 0.5);
        assert_eq!(ledger.load(false).queued_prefill_tokens, 50);
        ledger.close(a, Some(100));
        assert_eq!(ledger.take_finished(), [a]);
        assert!(ledger.take_finished().is_empty());
        assert_eq!(ledger.open_requests(), 1);
        // 200 computed tokens in 0.5 s.
        assert!((ledger.load(true).prefill_tokens_per_second - 400.0).abs() < 1e-9);
        assert!(ledger.load(true).draining);
    }

    #[test]
    fn queued_prompt_tokens_are_those_the_engine_has_to_compute() {
        let mut ledger = Ledger::new(100, 0);
        // 800 tokens, 768 of them in the pool: the engine computes 32 before the first token.
        let mostly_cached = ledger.open(800, 768);
        let cold = ledger.open(200, 0);
        assert_eq!(ledger.load(false).queued_prefill_tokens, 232);
        ledger.tokens(cold, 1, 1.0, 1.0);
        assert_eq!(ledger.load(false).queued_prefill_tokens, 32, "a prompt stops counting at its first token");
        ledger.tokens(mostly_cached, 1, 1.1, 0.2);
        assert_eq!(ledger.load(false).queued_prefill_tokens, 0);
        // A prompt the pool holds whole still has its last token computed.
        let whole = ledger.open(64, 64);
        assert_eq!(ledger.load(false).queued_prefill_tokens, 1);
        // The prefill rate is sampled from what the engine reported cached, not from the estimate.
        ledger.tokens(whole, 1, 2.0, 0.5);
        ledger.close(whole, Some(0));
        assert!((ledger.load(false).prefill_tokens_per_second - 128.0).abs() < 1e-9);
    }

    #[test]
    fn the_prefill_rate_counts_neither_the_wait_behind_other_prompts_nor_the_decode_step() {
        let mut ledger = Ledger::new(0, 0);
        // A running sequence: its tokens come every 0.1 s.
        let running = ledger.open(10, 0);
        for (i, now) in [1.0, 1.1, 1.2].into_iter().enumerate() {
            ledger.tokens(running, 1, now, 0.1 * (i + 1) as f64);
        }
        // 300 prompt tokens computed beside it: the first token 0.7 s after sending, 0.6 s beyond a decode step.
        let alone = ledger.open(300, 0);
        ledger.tokens(alone, 1, 2.0, 0.7);
        ledger.close(alone, Some(0));
        let rate = ledger.load(false).prefill_tokens_per_second;
        assert!((rate - 500.0).abs() < 1e-9, "{rate}");
        // One sent while another prompt waited ahead of it waited for that one's prefill too: not a sample.
        let ahead = ledger.open(1000, 0);
        let behind = ledger.open(300, 0);
        ledger.tokens(ahead, 1, 4.0, 2.0);
        ledger.tokens(behind, 1, 4.5, 2.5);
        ledger.close(behind, Some(0));
        assert!((ledger.load(false).prefill_tokens_per_second - 500.0).abs() < 1e-9);
    }

    #[test]
    fn decode_step_time_is_the_gap_between_tokens() {
        let mut ledger = Ledger::new(0, 0);
        let id = ledger.open(10, 0);
        ledger.tokens(id, 1, 1.0, 0.1);
        ledger.tokens(id, 1, 1.05, 0.15);
        ledger.tokens(id, 1, 1.10, 0.2);
        assert!((ledger.load(false).decode_step_seconds - 0.05).abs() < 1e-9);
        ledger.close(id, None);
        ledger.close(id, None);
        assert_eq!(ledger.take_finished(), [id], "closing twice reports once");
    }
}
