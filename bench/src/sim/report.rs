//! What a simulated run measured, per policy, and how it is printed: a table for people, or one JSON
//! document (`{"bound_hit_ratio": ..., "results": [...]}`) for machines.

use kvroute_node_agent::engine::EngineStats;
use serde::Serialize;

use crate::report::latency;

/// Raw measurements gathered while a run goes.
#[derive(Debug, Default)]
pub struct Samples {
    pub ttft: Vec<f64>,
    pub e2e: Vec<f64>,
    pub output_tokens: u64,
    pub finished: usize,
    pub rejected: usize,
    pub last_finish_s: f64,
    pub records: Vec<RequestRecord>,
}

/// One request: what routing predicted when it chose, and what happened (`kvroute-sim --requests-out`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct RequestRecord {
    pub arrival_s: f64,
    pub prompt_tokens: usize,
    /// The replica that took it (None: refused everywhere).
    pub replica: Option<usize>,
    /// Candidates tried before it (0: the first choice took it).
    pub attempt: usize,
    pub predicted_ttft_s: f64,
    pub predicted_queue_s: f64,
    pub predicted_cached_tokens: usize,
    /// The most any replica was predicted to hold.
    pub best_cached_tokens: usize,
    pub cached_tokens: usize,
    pub ttft_s: Option<f64>,
    /// The chosen replica's load as routing saw it: waiting and running requests, queued prefill tokens,
    /// KV usage.
    pub seen_waiting: u32,
    pub seen_running: u32,
    pub seen_queued_tokens: u64,
    pub seen_kv_usage: f64,
    /// The chosen replica's policy score, and the score, wait and KV usage of the replica holding the most
    /// of the prompt.
    pub chosen_score: f64,
    pub holder_score: f64,
    pub holder_wait_s: f64,
    pub holder_kv_usage: f64,
    /// The holder's load as routing saw it: waiting, running, queued prefill tokens, prefill rate.
    pub holder_seen: (u32, u32, u64, f64),
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PolicyResult {
    pub policy: String,
    pub requests: usize,
    pub rejected: usize,
    /// Cached prompt tokens over prompt tokens, all tiers.
    pub hit_ratio: f64,
    pub hit_ratio_gpu: f64,
    pub hit_ratio_host: f64,
    pub hit_ratio_network: f64,
    pub ttft_mean_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p90_s: f64,
    pub ttft_p99_s: f64,
    pub e2e_p50_s: f64,
    pub output_tokens_per_s: f64,
    /// Most prefill work on one replica over the mean.
    pub load_imbalance: f64,
    pub preemptions: u64,
    /// Requests whose first token came within `ttft_limit_s` of their arrival: under overload, the work a
    /// fleet did within the agents' promise (their queue-delay limit).
    pub served_in_limit: usize,
    pub ttft_limit_s: f64,
    /// TTFT of every request in seconds, sorted (for the CDF chart; not in the JSON).
    #[serde(skip)]
    pub ttft_sorted_s: Vec<f64>,
    /// Every request in arrival order, when the run kept them (not in the JSON).
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
}

impl Samples {
    pub fn finish(
        self,
        policy: &str,
        stats: &[EngineStats],
        prefill_tokens: &[u64],
        ttft_limit_s: f64,
    ) -> PolicyResult {
        let sum = |field: fn(&EngineStats) -> u64| stats.iter().map(field).sum::<u64>() as f64;
        let prompt = sum(|s| s.prompt_tokens_total).max(1.0);
        let (gpu, host, network) =
            (sum(|s| s.prefix_hit_tokens_total), sum(|s| s.host_hit_tokens_total), sum(|s| s.network_hit_tokens_total));
        let ttft = latency(self.ttft.clone());
        let e2e = latency(self.e2e);
        let mean_prefill = prefill_tokens.iter().sum::<u64>() as f64 / prefill_tokens.len().max(1) as f64;
        let max_prefill = prefill_tokens.iter().copied().max().unwrap_or(0) as f64;
        let mut ttft_sorted_s = self.ttft;
        ttft_sorted_s.sort_by(f64::total_cmp);
        PolicyResult {
            policy: policy.to_string(),
            requests: self.finished,
            rejected: self.rejected,
            hit_ratio: (gpu + host + network) / prompt,
            hit_ratio_gpu: gpu / prompt,
            hit_ratio_host: host / prompt,
            hit_ratio_network: network / prompt,
            ttft_mean_s: ttft.mean_ms / 1e3,
            ttft_p50_s: ttft.p50_ms / 1e3,
            ttft_p90_s: ttft.p90_ms / 1e3,
            ttft_p99_s: ttft.p99_ms / 1e3,
            e2e_p50_s: e2e.p50_ms / 1e3,
            output_tokens_per_s: if self.last_finish_s > 0.0 {
                self.output_tokens as f64 / self.last_finish_s
            } else {
                0.0
            },
            load_imbalance: if mean_prefill > 0.0 { max_prefill / mean_prefill } else { 1.0 },
            preemptions: stats.iter().map(|s| s.preemptions_recompute + s.preemptions_swap).sum(),
            served_in_limit: ttft_sorted_s.partition_point(|&ttft| ttft <= ttft_limit_s),
            ttft_limit_s,
            ttft_sorted_s,
            records: self.records,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct SimReport {
    pub bound_hit_ratio: f64,
    pub results: Vec<PolicyResult>,
}

impl SimReport {
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<13} {:>8} {:>6} {:>6} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>6} {:>7}\n",
            "policy",
            "requests",
            "refuse",
            "hit",
            "gpu",
            "host",
            "net",
            "ttft_mean",
            "ttft_p50",
            "ttft_p90",
            "ttft_p99",
            "e2e_p50",
            "out_tok/s",
            "imbal",
            "preempt"
        );
        for r in &self.results {
            out.push_str(&format!(
                "{:<13} {:>8} {:>6} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>8.2} {:>9.0} {:>6.2} {:>7}\n",
                r.policy,
                r.requests,
                r.rejected,
                r.hit_ratio,
                r.hit_ratio_gpu,
                r.hit_ratio_host,
                r.hit_ratio_network,
                r.ttft_mean_s,
                r.ttft_p50_s,
                r.ttft_p90_s,
                r.ttft_p99_s,
                r.e2e_p50_s,
                r.output_tokens_per_s,
                r.load_imbalance,
                r.preemptions
            ));
        }
        out.push_str(&format!(
            "{:<13} {:>8} {:>6} {:>6.3}   (one infinite cache)\n",
            "oracle_bound", "", "", self.bound_hit_ratio
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_in_limit_counts_the_requests_whose_first_token_came_within_the_limit() {
        let samples = Samples { ttft: vec![12.0, 0.5, 10.0, 9.9, 30.0], finished: 5, ..Samples::default() };
        let result = samples.finish("p", &[EngineStats::default()], &[1], 10.0);
        assert_eq!(result.served_in_limit, 3, "0.5, 9.9 and 10.0 s are within 10 s; 12 and 30 s are not");
        assert_eq!(result.ttft_limit_s, 10.0);
    }
}
