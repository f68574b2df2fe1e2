//! The engine's own Prometheus `/metrics`, read for what the agent reports as load: requests running and
//! waiting, and the fraction of its KV cache in use; and, from vLLM's `cache_config_info`, its block size
//! and number of KV blocks. Names of vLLM (`vllm:`) and SGLang (`sglang:`) are both understood.

/// What the engine's metrics say about its load.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineGauges {
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    /// Fraction in [0, 1].
    pub kv_usage: Option<f64>,
    pub block_size: Option<u32>,
    pub num_blocks: Option<u64>,
    /// When the engine's server process started (Unix seconds): it changes when the engine restarts.
    pub start_time: Option<f64>,
}

/// Reads the gauges out of a Prometheus text exposition; lines it does not know are skipped, and the
/// values of several label sets of one gauge (one per model or engine) are summed.
pub fn parse(text: &str) -> EngineGauges {
    let mut gauges = EngineGauges::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, value) = match split_sample(line) {
            Some(sample) => sample,
            None => continue,
        };
        let add = |slot: &mut Option<f64>| *slot = Some(slot.unwrap_or(0.0) + value);
        match name {
            "vllm:num_requests_running" | "sglang:num_running_reqs" => add(&mut gauges.running),
            "vllm:num_requests_waiting" | "sglang:num_queue_reqs" => add(&mut gauges.waiting),
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" | "sglang:token_usage" => {
                gauges.kv_usage = Some(gauges.kv_usage.unwrap_or(0.0).max(value.clamp(0.0, 1.0)));
            }
            "process_start_time_seconds" => gauges.start_time = Some(gauges.start_time.unwrap_or(0.0).max(value)),
            "vllm:cache_config_info" => {
                gauges.block_size = label(labels, "block_size").and_then(|value| value.parse().ok());
                gauges.num_blocks = label(labels, "num_gpu_blocks").and_then(|value| value.parse().ok());
            }
            _ => {}
        }
    }
    gauges
}

/// `name{labels} value [timestamp]` → (name, labels, value); None for a line that is not a sample.
fn split_sample(line: &str) -> Option<(&str, &str, f64)> {
    let (series, rest) = match line.find('{') {
        Some(open) => {
            let close = line[open..].rfind('}')? + open;
            (&line[..open], (&line[open + 1..close], line[close + 1..].trim()))
        }
        None => {
            let (name, rest) = line.split_once(char::is_whitespace)?;
            (name, ("", rest.trim()))
        }
    };
    let (labels, rest) = rest;
    let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
    value.is_finite().then_some((series, labels, value))
}

/// The value of label `name` in `a="1",b="2"` (values without escaped quotes, as these gauges have).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.strip_prefix('"')?;
        let end = after.find('"')?;
        if key.trim().trim_start_matches(',').trim() == name {
            return Some(&after[..end]);
        }
        rest = &after[end + 1..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_gauges_are_read_and_summed_over_label_sets() {
        let text = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2"} 2.0
vllm:num_requests_running{engine="1",model_name="smollm2"} 1.0
vllm:num_requests_waiting{engine="0",model_name="smollm2"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.25
vllm:cache_config_info{block_size="128",cache_dtype="auto",num_gpu_blocks="455",prefix_caching_hash_algo="sha256"} 1.0
vllm:prompt_tokens_total{engine="0",model_name="smollm2"} 1234.0
process_start_time_seconds 1.76461071286e+09
"#;
        let gauges = parse(text);
        assert_eq!(gauges.running, Some(3.0));
        assert_eq!(gauges.waiting, Some(3.0));
        assert_eq!(gauges.kv_usage, Some(0.25));
        assert_eq!(gauges.block_size, Some(128));
        assert_eq!(gauges.num_blocks, Some(455));
        assert_eq!(gauges.start_time, Some(1_764_610_712.86));
    }

    #[test]
    fn a_captured_vllm_exposition_gives_the_block_size_and_blocks() {
        let text = include_str!("../../tests/fixtures/vllm/http/metrics.body");
        let gauges = parse(text);
        assert_eq!((gauges.block_size, gauges.num_blocks), (Some(128), Some(24)));
        assert!(gauges.running.is_some() && gauges.waiting.is_some() && gauges.kv_usage.is_some(), "{gauges:?}");
    }

    #[test]
    fn sglang_names_and_junk_lines() {
        let text =
            "sglang:num_running_reqs{model_name=\"m\"} 4\nsglang:num_queue_reqs 1\nnot a sample\n{}\nx{a=\"1\" NaN\n";
        let gauges = parse(text);
        assert_eq!((gauges.running, gauges.waiting, gauges.kv_usage), (Some(4.0), Some(1.0), None));
        assert_eq!(parse(""), EngineGauges::default());
    }
}
