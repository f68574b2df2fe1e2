//! The public Mooncake conversation trace parses whole and reproduces its published figures: 12,031
//! requests, mean input 12,035 and output 343 tokens, and 37.4% of prompt tokens (36.6% of units) reusable
//! with one unbounded cache.

#![allow(clippy::unwrap_used)]

use kvroute_bench::trace::{infinite_cache_reuse, parse};

#[test]
fn the_mooncake_conversation_trace_reproduces_its_published_figures() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/mooncake_conversation_trace.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let requests = parse(&text).unwrap();
    assert_eq!(requests.len(), 12_031);
    let n = requests.len() as f64;
    let mean_input = requests.iter().map(|r| f64::from(r.input_length)).sum::<f64>() / n;
    let mean_output = requests.iter().map(|r| f64::from(r.output_length)).sum::<f64>() / n;
    assert_eq!(mean_input.round(), 12_035.0);
    assert_eq!(mean_output.round(), 343.0);
    assert!(requests.windows(2).all(|w| w[0].timestamp_ms <= w[1].timestamp_ms), "in time order");
    let (tokens, units) = infinite_cache_reuse(&requests);
    assert_eq!((tokens * 1000.0).round() / 10.0, 37.4, "token reuse {tokens}");
    assert_eq!((units * 1000.0).round() / 10.0, 36.6, "unit reuse {units}");
}
