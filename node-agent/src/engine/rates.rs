//! The engine's measured speeds, as the gateway's cost model needs them: how
//! long a decode-only step takes, and how many prompt tokens per second a step
//! absorbs beyond that (the marginal prefill rate); and, for the engine's own
//! admission rule, how long a running sequence waits between its tokens.
//!
//! A step that mixes prefill chunks with the running sequences' decodes costs
//! about a decode-only step plus its prefill tokens' own work. Dividing the
//! prefill tokens by the whole step time would charge them for the decodes too,
//! and under load (a few prompt tokens beside hundreds of decodes) would report
//! a rate several times too low, so a request's predicted wait would be several
//! times too long. The marginal rate is the ratio of two moving averages:
//! prefill tokens per step, and the step time beyond a decode-only step.

/// Weight of the newest step in the moving averages.
const ALPHA: f64 = 0.2;

/// Steps with fewer prefill tokens than this say too little about the rate.
const MIN_PREFILL_TOKENS: usize = 16;

/// The prefill share of a step is never taken below this fraction of the step.
/// On a GPU a small prefill rides along in the decodes' memory-bound time for
/// nearly nothing; without a floor such steps would claim an unbounded rate.
const MIN_PREFILL_SHARE: f64 = 0.1;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepRates {
    decode_step_seconds: f64,
    /// Moving average of every step that decoded, prefill or not.
    token_interval_seconds: f64,
    /// Moving averages of prefill tokens per step and of the seconds they added to their steps.
    prefill_tokens: f64,
    prefill_seconds: f64,
}

impl StepRates {
    /// Records one step: its prefill tokens, its decoded sequences and its time.
    pub fn record(&mut self, prefill: usize, decode: usize, elapsed: f64) {
        if !(elapsed > 0.0 && elapsed.is_finite()) {
            return;
        }
        if prefill == 0 && decode > 0 {
            self.decode_step_seconds = moving(self.decode_step_seconds, elapsed);
        }
        if decode > 0 {
            self.token_interval_seconds = moving(self.token_interval_seconds, elapsed);
        }
        self.record_prefill(prefill, elapsed, decode > 0);
    }

    /// Records a request's time to its first token, from outside an engine whose steps are not seen: when no
    /// other prompt was queued ahead of it, that is one step that computed its `prefill` tokens beside
    /// whatever decodes ran, so its prefill share is the time beyond a decode-only step, as in [`Self::record`].
    pub fn record_first_token(&mut self, prefill: usize, elapsed: f64) {
        if elapsed > 0.0 && elapsed.is_finite() {
            self.record_prefill(prefill, elapsed, true);
        }
    }

    fn record_prefill(&mut self, prefill: usize, elapsed: f64, beside_decodes: bool) {
        if prefill >= MIN_PREFILL_TOKENS {
            let beyond_decodes = elapsed - if beside_decodes { self.decode_step_seconds } else { 0.0 };
            let seconds = beyond_decodes.max(MIN_PREFILL_SHARE * elapsed);
            self.prefill_tokens = moving(self.prefill_tokens, prefill as f64);
            self.prefill_seconds = moving(self.prefill_seconds, seconds);
        }
    }

    /// Moving average of one decode-only step, seconds (0 until one is seen).
    pub fn decode_step_seconds(&self) -> f64 {
        self.decode_step_seconds
    }

    /// Moving average of the seconds between two tokens of a running sequence: the whole step, with the
    /// prompts computed beside the decodes (0 until a step decoded). Under steady load every step computes
    /// some prefill, so no decode-only step may be seen for a long time.
    pub fn token_interval_seconds(&self) -> f64 {
        self.token_interval_seconds
    }

    /// Marginal prefill tokens per second (0 until measured).
    pub fn prefill_tokens_per_second(&self) -> f64 {
        if self.prefill_seconds > 0.0 { self.prefill_tokens / self.prefill_seconds } else { 0.0 }
    }
}

fn moving(old: f64, new: f64) -> f64 {
    if old == 0.0 { new } else { old + ALPHA * (new - old) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_measured_reads_zero() {
        let rates = StepRates::default();
        assert_eq!(rates.prefill_tokens_per_second(), 0.0);
        assert_eq!(rates.decode_step_seconds(), 0.0);
    }

    #[test]
    fn prefill_only_steps_give_tokens_over_time() {
        let mut rates = StepRates::default();
        rates.record(1000, 0, 0.5);
        assert_eq!(rates.prefill_tokens_per_second(), 2000.0);
    }

    #[test]
    fn mixed_steps_charge_prefill_only_for_the_time_beyond_a_decode_step() {
        // A decode-only step takes 20 ms; 300 prompt tokens beside the same decodes add 10 ms.
        let mut rates = StepRates::default();
        rates.record(0, 200, 0.020);
        rates.record(300, 200, 0.030);
        let rate = rates.prefill_tokens_per_second();
        assert!((rate - 30_000.0).abs() < 1e-6, "{rate}");
        // Dividing by the whole step would have said 10,000.
    }

    #[test]
    fn prefill_hidden_in_the_decode_time_does_not_read_as_free() {
        let mut rates = StepRates::default();
        rates.record(0, 200, 0.020);
        rates.record(100, 200, 0.019);
        let rate = rates.prefill_tokens_per_second();
        assert!((rate - 100.0 / (MIN_PREFILL_SHARE * 0.019)).abs() < 1e-6, "{rate}");
    }

    #[test]
    fn small_prefills_and_bad_times_are_ignored() {
        let mut rates = StepRates::default();
        rates.record(8, 0, 0.001);
        rates.record(1000, 0, f64::NAN);
        rates.record(1000, 0, 0.0);
        assert_eq!(rates.prefill_tokens_per_second(), 0.0);
    }

    #[test]
    fn the_averages_follow_a_change_in_speed() {
        let mut rates = StepRates::default();
        rates.record(1000, 0, 1.0);
        for _ in 0..50 {
            rates.record(1000, 0, 0.1);
        }
        let rate = rates.prefill_tokens_per_second();
        assert!((rate - 10_000.0).abs() < 10.0, "{rate}");
        rates.record(0, 4, 0.5);
        for _ in 0..50 {
            rates.record(0, 4, 0.05);
        }
        assert!((rates.decode_step_seconds() - 0.05).abs() < 1e-4);
    }

    #[test]
    fn the_token_interval_is_every_decoding_step_whole() {
        let mut rates = StepRates::default();
        rates.record(1000, 0, 0.5);
        assert_eq!(rates.token_interval_seconds(), 0.0, "a step that decoded nothing says nothing of it");
        rates.record(300, 200, 0.030);
        assert_eq!((rates.token_interval_seconds(), rates.decode_step_seconds()), (0.030, 0.0));
        rates.record(0, 200, 0.020);
        assert!((rates.token_interval_seconds() - 0.028).abs() < 1e-9);
    }
}
