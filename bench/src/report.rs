//! What a load run measured, summarised: latency percentiles, throughput, the cached-token fraction and
//! errors by kind.

use std::collections::BTreeMap;

use serde::Serialize;

/// One finished request.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Outcome {
    /// Which request: `s3t1` (session 3, its second turn) or `r17` (the trace's 18th request to start).
    pub request: String,
    /// Seconds from the start of the run to sending it.
    pub sent_at: f64,
    /// Seconds from sending to the first generated text; None when no token arrived.
    pub ttft: Option<f64>,
    /// Seconds from sending to the end of the response.
    pub total: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Why it failed (`http-429`, `connect`, `stream`, ...), None when it succeeded.
    pub error: Option<String>,
}

/// Percentiles of a latency, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    pub requests: usize,
    pub succeeded: usize,
    pub seconds: f64,
    pub ttft: Latency,
    pub end_to_end: Latency,
    pub output_tokens_per_second: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Cached prompt tokens over prompt tokens, over the successful requests.
    pub cached_fraction: f64,
    pub errors: BTreeMap<String, usize>,
    /// How long the overloaded answers (HTTP 429) took: admission control should refuse promptly.
    pub rejections: Latency,
}

impl Report {
    /// Summarises the outcomes of a run that took `seconds`.
    pub fn new(outcomes: &[Outcome], seconds: f64) -> Report {
        let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
        let mut errors = BTreeMap::new();
        for outcome in outcomes {
            if let Some(kind) = &outcome.error {
                *errors.entry(kind.clone()).or_insert(0) += 1;
            }
        }
        let prompt_tokens: u64 = ok.iter().map(|o| o.prompt_tokens).sum();
        let cached_tokens: u64 = ok.iter().map(|o| o.cached_tokens).sum();
        let completion_tokens: u64 = ok.iter().map(|o| o.completion_tokens).sum();
        Report {
            requests: outcomes.len(),
            succeeded: ok.len(),
            seconds,
            ttft: latency(ok.iter().filter_map(|o| o.ttft).collect()),
            end_to_end: latency(ok.iter().map(|o| o.total).collect()),
            output_tokens_per_second: if seconds > 0.0 { completion_tokens as f64 / seconds } else { 0.0 },
            prompt_tokens,
            cached_tokens,
            cached_fraction: if prompt_tokens > 0 { cached_tokens as f64 / prompt_tokens as f64 } else { 0.0 },
            errors,
            rejections: latency(
                outcomes.iter().filter(|o| o.error.as_deref() == Some("http-429")).map(|o| o.total).collect(),
            ),
        }
    }

    /// A few lines for people.
    pub fn text(&self) -> String {
        let errors = if self.errors.is_empty() {
            "none".to_string()
        } else {
            self.errors.iter().map(|(kind, n)| format!("{kind} {n}")).collect::<Vec<_>>().join(", ")
        };
        format!(
            "requests {} ({} ok) in {:.1} s\n\
             TTFT ms        p50 {:.1}  p90 {:.1}  p99 {:.1}  mean {:.1}\n\
             end to end ms  p50 {:.1}  p90 {:.1}  p99 {:.1}  mean {:.1}\n\
             output tokens/s {:.1}\n\
             cached tokens {} of {} prompt tokens ({:.1}%)\n\
             errors {errors}\n\
             429 answers ms p50 {:.1}  p99 {:.1}",
            self.requests,
            self.succeeded,
            self.seconds,
            self.ttft.p50_ms,
            self.ttft.p90_ms,
            self.ttft.p99_ms,
            self.ttft.mean_ms,
            self.end_to_end.p50_ms,
            self.end_to_end.p90_ms,
            self.end_to_end.p99_ms,
            self.end_to_end.mean_ms,
            self.output_tokens_per_second,
            self.cached_tokens,
            self.prompt_tokens,
            100.0 * self.cached_fraction,
            self.rejections.p50_ms,
            self.rejections.p99_ms,
        )
    }
}

/// Nearest-rank percentiles of latencies given in seconds.
pub fn latency(mut seconds: Vec<f64>) -> Latency {
    if seconds.is_empty() {
        return Latency::default();
    }
    seconds.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = ((q * seconds.len() as f64).ceil() as usize).clamp(1, seconds.len());
        seconds[rank - 1] * 1e3
    };
    let mean = seconds.iter().sum::<f64>() / seconds.len() as f64 * 1e3;
    Latency { p50_ms: at(0.50), p90_ms: at(0.90), p99_ms: at(0.99), mean_ms: mean }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(ttft: f64, prompt: u64, cached: u64) -> Outcome {
        Outcome {
            ttft: Some(ttft),
            total: ttft + 1.0,
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: 10,
            error: None,
            ..Outcome::default()
        }
    }

    #[test]
    fn summarises_latencies_tokens_and_errors() {
        let mut outcomes: Vec<Outcome> = (1..=100).map(|i| ok(f64::from(i) / 1000.0, 100, 25)).collect();
        outcomes.push(Outcome { total: 0.002, error: Some("http-429".into()), ..Outcome::default() });
        outcomes.push(Outcome { total: 0.004, error: Some("http-429".into()), ..Outcome::default() });
        outcomes.push(Outcome { error: Some("connect".into()), ..Outcome::default() });
        let report = Report::new(&outcomes, 10.0);
        assert_eq!((report.requests, report.succeeded), (103, 100));
        assert_eq!((report.ttft.p50_ms, report.ttft.p90_ms, report.ttft.p99_ms), (50.0, 90.0, 99.0));
        assert!((report.ttft.mean_ms - 50.5).abs() < 1e-9);
        assert_eq!(report.end_to_end.p50_ms, 1050.0);
        assert_eq!(report.output_tokens_per_second, 100.0);
        assert_eq!(report.cached_fraction, 0.25);
        assert_eq!(report.errors.get("http-429"), Some(&2));
        assert_eq!((report.rejections.p50_ms, report.rejections.p99_ms), (2.0, 4.0), "only the 429 answers count");
        assert_eq!(report.errors.get("connect"), Some(&1));
        assert!(report.text().contains("http-429 2"));
    }

    #[test]
    fn an_empty_run_reports_zeros() {
        let report = Report::new(&[], 0.0);
        assert_eq!(report, Report::default());
    }
}
