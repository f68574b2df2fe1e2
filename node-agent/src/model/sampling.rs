//! Token selection from logits: greedy, or temperature with nucleus (top-p) filtering from a seeded PRNG.
//!
//! Sampling is reproducible: the same seed and the same sequence of logits give the same tokens.

use kvroute_proto::domain::SamplingParams;

use super::prng::SplitMix64;

/// Picks the next token of one sequence.
#[derive(Clone, Debug)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    rng: SplitMix64,
}

impl Sampler {
    /// Argmax; the lowest id wins ties.
    pub fn greedy() -> Sampler {
        Sampler { temperature: 0.0, top_p: 1.0, rng: SplitMix64::new(0) }
    }

    /// A sampler for `params`; the PRNG is seeded with `params.seed`, or `fallback_seed` when it has none.
    pub fn new(params: SamplingParams, fallback_seed: u64) -> Sampler {
        let top_p = if params.top_p > 0.0 && params.top_p < 1.0 { params.top_p } else { 1.0 };
        let temperature = if params.temperature.is_finite() { params.temperature.max(0.0) } else { 0.0 };
        Sampler { temperature, top_p, rng: SplitMix64::new(params.seed.unwrap_or(fallback_seed)) }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The next token id. NaN logits are never chosen; an empty slice gives 0.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.is_greedy() {
            return argmax(logits);
        }
        let max = logits.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return argmax(logits);
        }
        let inv_t = 1.0 / f64::from(self.temperature);
        let weights: Vec<f64> = logits
            .iter()
            .map(|&v| if v.is_nan() { 0.0 } else { ((f64::from(v) - f64::from(max)) * inv_t).exp() })
            .collect();
        let total: f64 = weights.iter().sum();
        let draw = self.rng.next_f64();
        if self.top_p >= 1.0 {
            return pick((0..weights.len()).map(|i| (i, weights[i])), draw * total);
        }
        let mut order: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0.0).collect();
        order.sort_unstable_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
        let target = f64::from(self.top_p) * total;
        let mut kept = 0.0;
        let mut keep = 0;
        for &i in &order {
            kept += weights[i];
            keep += 1;
            if kept >= target {
                break;
            }
        }
        pick(order[..keep].iter().map(|&i| (i, weights[i])), draw * kept)
    }
}

/// The first candidate at which the running sum of weights passes `point` (the last one if none does).
fn pick(candidates: impl Iterator<Item = (usize, f64)>, point: f64) -> u32 {
    let mut sum = 0.0;
    let mut last = 0;
    for (id, weight) in candidates {
        sum += weight;
        last = id;
        if weight > 0.0 && point < sum {
            break;
        }
    }
    last as u32
}

/// Index of the largest logit, the lowest index among equals; NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_value {
            best = i;
            best_value = v;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams { temperature, top_p, seed: Some(seed) }
    }

    #[test]
    fn greedy_takes_the_lowest_id_among_ties() {
        let mut sampler = Sampler::greedy();
        assert_eq!(sampler.sample(&[1.0, 3.0, 3.0, f32::NAN, 2.0]), 1);
        assert_eq!(sampler.sample(&[f32::NAN, -1.0]), 1);
        assert_eq!(Sampler::new(SamplingParams::GREEDY, 9).sample(&[0.0, 5.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
        let run = |seed| {
            let mut sampler = Sampler::new(params(0.8, 0.9, seed), 0);
            (0..40).map(|_| sampler.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Probabilities ~ 0.64, 0.24, 0.09, 0.03: top_p 0.7 keeps the first two only.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let mut sampler = Sampler::new(params(1.0, 0.7, 1), 0);
        let mut seen = [0usize; 4];
        for _ in 0..2000 {
            seen[sampler.sample(&logits) as usize] += 1;
        }
        assert_eq!(seen[2] + seen[3], 0);
        assert!(seen[0] > seen[1] && seen[1] > 300, "{seen:?}");
    }

    #[test]
    fn temperature_follows_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()];
        let mut sampler = Sampler::new(params(1.0, 1.0, 3), 0);
        let ones = (0..4000).filter(|_| sampler.sample(&logits) == 1).count();
        // Expected 3000 of 4000.
        assert!((2850..3150).contains(&ones), "{ones}");
    }
}
