//! Cost profiles: what one simulated replica is (its KV pool, tiers and scheduler settings) and what its
//! work costs. A profile is a small `key = value` file with `#` comments; the documented ones live in
//! `bench/profiles/` and are built in by name.

use std::collections::HashMap;

/// Profiles known by name (`--profile NAME`); any other value is read as a file path.
pub const BUILTIN: [(&str, &str); 4] = [
    ("h100-llama3-8b", include_str!("../../profiles/h100-llama3-8b.profile")),
    ("h100x8-llama3-70b", include_str!("../../profiles/h100x8-llama3-70b.profile")),
    ("cpu-tiny-random", include_str!("../../profiles/cpu-tiny-random.profile")),
    ("dynamo-mocker", include_str!("../../profiles/dynamo-mocker.profile")),
];

#[derive(Clone, Debug, PartialEq)]
pub struct CostProfile {
    pub name: String,
    pub block_size: usize,
    pub vocab_size: usize,
    /// Parameters: 2 FLOPs each per token.
    pub params: f64,
    pub layers: f64,
    /// Query heads times head dimension (attention FLOPs per token and context position).
    pub attention_width: f64,
    /// Bytes every step reads once.
    pub weight_bytes: f64,
    /// Optional (0 when absent): seconds each sequence that samples a token adds to a step beyond the
    /// roofline. On a CPU its row of the LM head and the sampling over the vocabulary cost milliseconds; on
    /// a GPU both hide inside the step and the profiles leave this out.
    pub sample_seconds: f64,
    pub kv_bytes_per_token: f64,
    /// KV pool of one replica.
    pub kv_pool_bytes: f64,
    pub peak_flops: f64,
    pub compute_efficiency: f64,
    pub memory_bandwidth: f64,
    pub memory_efficiency: f64,
    pub step_overhead_seconds: f64,
    /// Host RAM tier per replica; 0 turns it off.
    pub host_bytes: f64,
    pub host_bandwidth: f64,
    /// Shared network tier for the whole fleet; 0 turns it off.
    pub network_bytes: f64,
    pub network_bandwidth: f64,
    pub network_latency_seconds: f64,
    pub max_batch_tokens: usize,
    pub max_running: usize,
    pub max_waiting: usize,
    pub max_context: usize,
    /// Fitted step times that replace the roofline, when the profile gives them.
    pub polynomial: Option<PolynomialTiming>,
}

/// A step time fitted as polynomials, as Dynamo's mocker (AIsimulate's `perf_model.rs`) times a step: a
/// step with N new prompt tokens costs `prefill(N) = n2 N^2 + n1 N + n0` milliseconds, and a step with
/// decoding sequences whose contexts fill a fraction p of the pool `decode(p) = max(min, p2 p^2 + p1 p
/// + p0)` milliseconds more.
#[derive(Clone, Debug, PartialEq)]
pub struct PolynomialTiming {
    pub prefill_ms: [f64; 3],
    pub decode_ms: [f64; 3],
    pub decode_min_ms: f64,
}

impl PolynomialTiming {
    /// Keys of a profile that gives polynomial timing: all of them, or none.
    const KEYS: [&str; 7] = [
        "prefill_ms_n2",
        "prefill_ms_n1",
        "prefill_ms_n0",
        "decode_ms_p2",
        "decode_ms_p1",
        "decode_ms_p0",
        "decode_ms_min",
    ];

    fn seconds(&self, prefill_tokens: f64, decode_context_fraction: Option<f64>) -> f64 {
        let [n2, n1, n0] = self.prefill_ms;
        let prefill =
            if prefill_tokens > 0.0 { n2 * prefill_tokens * prefill_tokens + n1 * prefill_tokens + n0 } else { 0.0 };
        let decode = decode_context_fraction.map_or(0.0, |p| {
            let [p2, p1, p0] = self.decode_ms;
            (p2 * p * p + p1 * p + p0).max(self.decode_min_ms)
        });
        (prefill + decode) / 1000.0
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProfileError {
    #[error("line {line}: expected `key = value`")]
    Syntax { line: usize },
    #[error("line {line}: {key} is not a number: {value:?}")]
    Number { line: usize, key: String, value: String },
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    #[error("missing key {0:?}")]
    Missing(&'static str),
    #[error("{0} must be positive")]
    NotPositive(&'static str),
}

impl CostProfile {
    /// A built-in profile by name, or the profile file at `name_or_path`.
    pub fn load(name_or_path: &str) -> anyhow::Result<CostProfile> {
        let text = match BUILTIN.iter().find(|(name, _)| *name == name_or_path) {
            Some((_, text)) => text.to_string(),
            None => std::fs::read_to_string(name_or_path).map_err(|error| {
                let names: Vec<&str> = BUILTIN.iter().map(|(name, _)| *name).collect();
                anyhow::anyhow!(
                    "profile {name_or_path:?} is neither built in ({}) nor a readable file: {error}",
                    names.join(", ")
                )
            })?,
        };
        Ok(CostProfile::parse(&text)?)
    }

    pub fn parse(text: &str) -> Result<CostProfile, ProfileError> {
        let mut name = None;
        let mut numbers: HashMap<String, f64> = HashMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (key, value) = line.split_once('=').ok_or(ProfileError::Syntax { line: index + 1 })?;
            let (key, value) = (key.trim(), value.trim());
            if key == "name" {
                name = Some(value.to_string());
                continue;
            }
            let number = value.parse::<f64>().ok().filter(|v| v.is_finite()).ok_or_else(|| ProfileError::Number {
                line: index + 1,
                key: key.to_string(),
                value: value.to_string(),
            })?;
            numbers.insert(key.to_string(), number);
        }
        let sample_seconds = numbers.remove("sample_seconds").unwrap_or(0.0);
        let timing: Vec<Option<f64>> = PolynomialTiming::KEYS.iter().map(|key| numbers.remove(*key)).collect();
        let polynomial = match timing.as_slice() {
            [Some(n2), Some(n1), Some(n0), Some(p2), Some(p1), Some(p0), Some(min)] => {
                Some(PolynomialTiming { prefill_ms: [*n2, *n1, *n0], decode_ms: [*p2, *p1, *p0], decode_min_ms: *min })
            }
            given if given.iter().all(Option::is_none) => None,
            given => {
                let missing = PolynomialTiming::KEYS.iter().zip(given).find(|(_, value)| value.is_none());
                return Err(ProfileError::Missing(missing.map_or("decode_ms_min", |(key, _)| *key)));
            }
        };
        let mut take = |key: &'static str| numbers.remove(key).ok_or(ProfileError::Missing(key));
        let positive =
            |key: &'static str, value: f64| if value > 0.0 { Ok(value) } else { Err(ProfileError::NotPositive(key)) };
        let profile = CostProfile {
            name: name.ok_or(ProfileError::Missing("name"))?,
            block_size: positive("block_size", take("block_size")?)? as usize,
            vocab_size: positive("vocab_size", take("vocab_size")?)? as usize,
            params: positive("params", take("params")?)?,
            layers: positive("layers", take("layers")?)?,
            attention_width: positive("attention_width", take("attention_width")?)?,
            weight_bytes: take("weight_bytes")?,
            sample_seconds,
            kv_bytes_per_token: positive("kv_bytes_per_token", take("kv_bytes_per_token")?)?,
            kv_pool_bytes: positive("kv_pool_bytes", take("kv_pool_bytes")?)?,
            peak_flops: positive("peak_flops", take("peak_flops")?)?,
            compute_efficiency: positive("compute_efficiency", take("compute_efficiency")?)?,
            memory_bandwidth: positive("memory_bandwidth", take("memory_bandwidth")?)?,
            memory_efficiency: positive("memory_efficiency", take("memory_efficiency")?)?,
            step_overhead_seconds: take("step_overhead_seconds")?,
            host_bytes: take("host_bytes")?,
            host_bandwidth: positive("host_bandwidth", take("host_bandwidth")?)?,
            network_bytes: take("network_bytes")?,
            network_bandwidth: positive("network_bandwidth", take("network_bandwidth")?)?,
            network_latency_seconds: take("network_latency_seconds")?,
            max_batch_tokens: positive("max_batch_tokens", take("max_batch_tokens")?)? as usize,
            max_running: positive("max_running", take("max_running")?)? as usize,
            max_waiting: positive("max_waiting", take("max_waiting")?)? as usize,
            max_context: positive("max_context", take("max_context")?)? as usize,
            polynomial,
        };
        if let Some(key) = numbers.keys().next() {
            return Err(ProfileError::UnknownKey(key.clone()));
        }
        Ok(profile)
    }

    /// KV bytes of one block.
    pub fn block_bytes(&self) -> f64 {
        self.kv_bytes_per_token * self.block_size as f64
    }

    /// Blocks in one replica's pool.
    pub fn num_blocks(&self) -> usize {
        (self.kv_pool_bytes / self.block_bytes()) as usize
    }

    /// Prefill tokens per second of a batch of short prompts (the rate reload decisions compare against).
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.peak_flops * self.compute_efficiency / (2.0 * self.params)
    }

    /// Seconds of one step whose chunks are (new tokens, context before them, whether the chunk samples a
    /// token): prefill chunks and decodes alike. The larger of compute time and memory time, plus each
    /// sampled sequence's cost, plus the overhead.
    pub fn step_seconds(&self, chunks: impl Iterator<Item = (usize, usize, bool)>) -> f64 {
        if let Some(polynomial) = &self.polynomial {
            return self.polynomial_step_seconds(polynomial, chunks);
        }
        let (mut flops, mut kv_read_tokens, mut sampled, mut any) = (0.0, 0.0, 0.0, false);
        for (new_tokens, context, samples) in chunks {
            any = true;
            let new = new_tokens as f64;
            let mean_context = context as f64 + new / 2.0;
            flops += 2.0 * self.params * new + 4.0 * self.layers * self.attention_width * new * mean_context;
            kv_read_tokens += (context + new_tokens) as f64;
            sampled += f64::from(u8::from(samples));
        }
        if !any {
            return 0.0;
        }
        let compute = flops / (self.peak_flops * self.compute_efficiency);
        let bytes = self.weight_bytes + kv_read_tokens * self.kv_bytes_per_token;
        let memory = bytes / (self.memory_bandwidth * self.memory_efficiency);
        self.step_overhead_seconds + compute.max(memory) + self.sample_seconds * sampled
    }

    /// A step timed by fitted polynomials: its new prompt tokens, and its decoding sequences' contexts
    /// over the pool's tokens. A one-token chunk after a context is a decode; anything else is prefill.
    fn polynomial_step_seconds(
        &self,
        polynomial: &PolynomialTiming,
        chunks: impl Iterator<Item = (usize, usize, bool)>,
    ) -> f64 {
        let (mut prefill, mut decode_context, mut decoding) = (0.0, 0.0, false);
        for (new_tokens, context, _) in chunks {
            if new_tokens == 1 && context > 0 {
                decoding = true;
                decode_context += (context + 1) as f64;
            } else {
                prefill += new_tokens as f64;
            }
        }
        let pool_tokens = (self.num_blocks() * self.block_size) as f64;
        polynomial.seconds(prefill, decoding.then(|| decode_context / pool_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_profile_parses() {
        for (name, text) in BUILTIN {
            let profile = CostProfile::parse(text).unwrap_or_else(|error| panic!("{name}: {error}"));
            assert_eq!(profile.name, name);
            assert!(profile.num_blocks() > 0);
        }
    }

    #[test]
    fn llama3_8b_numbers_are_the_documented_ones() {
        let profile = CostProfile::load("h100-llama3-8b").unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(profile.kv_bytes_per_token, 131072.0);
        assert_eq!(profile.block_bytes(), 2.0 * 1024.0 * 1024.0);
        // 60 GB of pool at 2 MiB a block.
        assert_eq!(profile.num_blocks(), 28610);
        // ~31k prefill tokens per second at half of the dense bf16 peak.
        let rate = profile.prefill_tokens_per_second();
        assert!((30_000.0..32_000.0).contains(&rate), "{rate}");
        // A decode step of one short sequence is memory bound: weights over 70% of the bandwidth, plus overhead.
        let decode = profile.step_seconds([(1, 100, true)].into_iter());
        let expected = 0.002 + (16.06e9 + 101.0 * 131072.0) / (3.35e12 * 0.7);
        assert!((decode - expected).abs() < 1e-9, "{decode} vs {expected}");
        // A long prefill chunk is compute bound, and attention makes later chunks dearer.
        let early = profile.step_seconds([(8192, 0, false)].into_iter());
        let late = profile.step_seconds([(8192, 16384, true)].into_iter());
        assert!(early > decode * 5.0 && late > early, "{early} {late}");
    }

    #[test]
    fn each_sampling_sequence_adds_the_profiles_per_sample_cost() {
        let cpu = CostProfile::load("cpu-tiny-random").unwrap_or_else(|error| panic!("{error}"));
        assert!(cpu.sample_seconds > 0.0);
        let one = cpu.step_seconds([(1, 400, true)].into_iter());
        let three = cpu.step_seconds([(1, 400, true), (1, 400, true), (1, 400, true)].into_iter());
        // Three decodes are still memory bound in the body: the difference is two sequences' sampling.
        assert!((three - one - 2.0 * cpu.sample_seconds).abs() < 1e-4, "{one} {three}");
        // A chunk that does not end its prompt samples nothing.
        let middle = cpu.step_seconds([(32, 0, false)].into_iter());
        let last = cpu.step_seconds([(32, 0, true)].into_iter());
        assert!((last - middle - cpu.sample_seconds).abs() < 1e-12);
        // The GPU profiles leave it out.
        let gpu = CostProfile::load("h100-llama3-8b").unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(gpu.sample_seconds, 0.0);
    }

    #[test]
    fn bad_profiles_say_what_is_wrong() {
        assert_eq!(CostProfile::parse("name = x\nblock_size 16"), Err(ProfileError::Syntax { line: 2 }));
        assert!(matches!(CostProfile::parse("name = x\nblock_size = sixteen"), Err(ProfileError::Number { .. })));
        assert_eq!(CostProfile::parse("name = x"), Err(ProfileError::Missing("block_size")));
        let (_, text) = BUILTIN[0];
        let extra = format!("{text}\ncolour = 3\n");
        assert_eq!(CostProfile::parse(&extra), Err(ProfileError::UnknownKey("colour".into())));
        let zero = text.replace("block_size = 16", "block_size = 0");
        assert_eq!(CostProfile::parse(&zero), Err(ProfileError::NotPositive("block_size")));
        assert!(CostProfile::load("no-such-profile").is_err());
    }
}
