//! Mooncake-format request traces: one JSON object per line with `timestamp` (ms since the trace start),
//! `input_length` and `output_length` (tokens) and `hash_ids`, one id per 512-token unit of the prompt (the
//! last unit partial). Ids name nodes of a prefix tree: two requests share a prefix exactly as long as their
//! leading run of equal ids.
//!
//! [`TraceRequest::prompt_tokens`] turns the units into token ids deterministically (a unit's tokens depend
//! only on its id), so a replay can hash blocks of any size and two requests share exactly the blocks their
//! shared units cover. Parsing is strict and never panics: a bad line is a [`TraceError`] naming its line.

use std::collections::HashSet;

use serde::Deserialize;
use thiserror::Error;

/// Tokens per hash id.
pub const UNIT_TOKENS: usize = 512;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceRequest {
    #[serde(rename = "timestamp")]
    pub timestamp_ms: u64,
    pub input_length: u32,
    pub output_length: u32,
    pub hash_ids: Vec<u64>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TraceError {
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

impl TraceRequest {
    /// The prompt as token ids: unit `i` is the [`UNIT_TOKENS`] tokens of id `hash_ids[i]`, the last unit cut
    /// to `input_length`. Ids fall in `[100, vocab_size)` (`vocab_size` must exceed 100).
    pub fn prompt_tokens(&self, vocab_size: u32) -> Vec<u32> {
        let span = u64::from(vocab_size.max(101) - 100);
        let mut tokens = Vec::with_capacity(self.input_length as usize);
        for (unit, &id) in self.hash_ids.iter().enumerate() {
            let take = (self.input_length as usize).saturating_sub(unit * UNIT_TOKENS).min(UNIT_TOKENS);
            let mut state = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
            for _ in 0..take {
                state = splitmix(&mut state);
                tokens.push(100 + (state % span) as u32);
            }
        }
        tokens
    }

    /// Tokens in unit `unit` of this prompt (512 except for the last).
    pub fn unit_len(&self, unit: usize) -> usize {
        (self.input_length as usize).saturating_sub(unit * UNIT_TOKENS).min(UNIT_TOKENS)
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Parses a whole trace; blank lines are skipped. Every unit but the last must be full: `hash_ids` holds
/// exactly `ceil(input_length / 512)` ids.
pub fn parse(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut requests = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        requests.push(parse_line(line).map_err(|reason| TraceError::Line { line: index + 1, reason })?);
    }
    Ok(requests)
}

fn parse_line(line: &str) -> Result<TraceRequest, String> {
    let request: TraceRequest = serde_json::from_str(line).map_err(|error| error.to_string())?;
    if request.input_length == 0 {
        return Err("input_length must be positive".into());
    }
    let units = (request.input_length as usize).div_ceil(UNIT_TOKENS);
    if request.hash_ids.len() != units {
        return Err(format!(
            "{} hash_ids for an input of {} tokens (expected {units})",
            request.hash_ids.len(),
            request.input_length
        ));
    }
    Ok(request)
}

/// Prompt reuse with one cache of unbounded size, in trace order: the fraction of prompt tokens (and of
/// units) in each request's leading run of units already seen. The ceiling any router can reach.
pub fn infinite_cache_reuse(requests: &[TraceRequest]) -> (f64, f64) {
    let mut seen: HashSet<u64> = HashSet::new();
    let (mut tokens, mut reused_tokens, mut units, mut reused_units) = (0usize, 0usize, 0usize, 0usize);
    for request in requests {
        tokens += request.input_length as usize;
        units += request.hash_ids.len();
        let mut leading = true;
        for (unit, id) in request.hash_ids.iter().enumerate() {
            leading &= seen.contains(id);
            if leading {
                reused_tokens += request.unit_len(unit);
                reused_units += 1;
            }
            seen.insert(*id);
        }
    }
    (reused_tokens as f64 / tokens.max(1) as f64, reused_units as f64 / units.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(input_length: u32, hash_ids: Vec<u64>) -> TraceRequest {
        TraceRequest { timestamp_ms: 0, input_length, output_length: 1, hash_ids }
    }

    #[test]
    fn shared_units_give_shared_tokens_and_the_last_unit_is_cut() {
        let a = request(1100, vec![0, 1, 2]);
        let b = request(600, vec![0, 7]);
        let (ta, tb) = (a.prompt_tokens(50_000), b.prompt_tokens(50_000));
        assert_eq!((ta.len(), tb.len()), (1100, 600));
        assert_eq!(ta[..512], tb[..512], "unit 0 is the same everywhere");
        assert_ne!(ta[512..600], tb[512..600], "units 1 and 7 differ");
        assert!(ta.iter().all(|&t| (100..50_000).contains(&t)));
        // A unit's tokens do not depend on its position or on the request.
        let c = request(512, vec![2]);
        assert_eq!(c.prompt_tokens(50_000)[..76], ta[1024..1100]);
    }

    #[test]
    fn bad_lines_are_errors_naming_the_line() {
        let good = r#"{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}"#;
        assert_eq!(
            parse(good).unwrap()[0],
            TraceRequest { timestamp_ms: 5, input_length: 600, output_length: 3, hash_ids: vec![0, 1] }
        );
        for (bad, what) in [
            (r#"{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [0]}"#, "too few ids"),
            (r#"{"timestamp": 5, "input_length": 0, "output_length": 3, "hash_ids": []}"#, "empty input"),
            (r#"{"timestamp": -1, "input_length": 1, "output_length": 3, "hash_ids": [0]}"#, "negative time"),
            (r#"{"timestamp": 5, "input_length": 1, "output_length": 3}"#, "missing ids"),
            (r#"{"timestamp": 5, "input_length": 1, "output_length": 3, "hash_ids": [0], "x": 1}"#, "unknown field"),
            ("not json", "not JSON"),
        ] {
            let text = format!("{good}\n\n{bad}\n");
            match parse(&text) {
                Err(TraceError::Line { line, .. }) => assert_eq!(line, 3, "{what}"),
                Ok(_) => panic!("{what} was accepted"),
            }
        }
    }

    #[test]
    fn reuse_counts_only_leading_runs_of_seen_units() {
        let requests = [request(1024, vec![0, 1]), request(1024, vec![0, 2]), request(1024, vec![3, 2])];
        // Second request reuses unit 0; the third reuses nothing (its first unit is new).
        let (tokens, units) = infinite_cache_reuse(&requests);
        assert!((tokens - 512.0 / 3072.0).abs() < 1e-12);
        assert!((units - 1.0 / 6.0).abs() < 1e-12);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_lines_never_panic(line in "\\PC{0,200}") {
            let _ = parse(&line);
        }
    }
}
