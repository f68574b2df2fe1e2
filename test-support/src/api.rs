//! The gateway's HTTP API as the tests call it: a JSON POST and its answer, the cached tokens a completion
//! reports, and `/debug/route`'s explanation of a routing decision.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::http_request;

/// POSTs `body` as JSON to `path` with `headers`; returns the status and the answer as JSON (`Null` when it
/// is not JSON). A request that got no HTTP answer is status 0 with `{"io_error": ...}`, so that a test
/// under faults can count it among the others.
pub fn post_json(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
    let headers = [headers, &[("Content-Type", "application/json")]].concat();
    match http_request(addr, "POST", path, &headers, body.to_string().as_bytes()) {
        Ok(response) => (response.status, serde_json::from_slice(&response.body).unwrap_or(Value::Null)),
        Err(error) => (0, json!({ "io_error": error.to_string() })),
    }
}

/// The prompt tokens a completion's answer says were served from cache
/// (`usage.prompt_tokens_details.cached_tokens`); fails the test when it has none.
pub fn cached_tokens(response: &Value) -> u64 {
    response["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage.prompt_tokens_details.cached_tokens in {response}"))
}

/// The gateway's explanation of how it would route `request` (`POST /debug/route` with the admin key
/// `admin_key`); fails the test unless the gateway answers 200.
pub fn debug_route(http: SocketAddr, admin_key: &str, request: &Value) -> Value {
    let bearer = format!("Bearer {admin_key}");
    let (status, explained) = post_json(http, "/debug/route", &[("Authorization", &bearer)], request);
    assert_eq!(status, 200, "/debug/route: {explained}");
    explained
}

/// Each candidate replica's GPU blocks of the prompt, by replica, from a `/debug/route` explanation.
pub fn gpu_blocks_by_replica(explained: &Value) -> BTreeMap<String, u64> {
    let candidates = explained["candidates"].as_array().unwrap_or_else(|| panic!("no candidates in {explained}"));
    candidates
        .iter()
        .map(|candidate| {
            let replica = candidate["replica"].as_str().unwrap_or_else(|| panic!("a candidate without a replica"));
            let blocks = candidate["gpu_blocks"].as_u64().unwrap_or_else(|| panic!("{replica} without gpu_blocks"));
            (replica.to_string(), blocks)
        })
        .collect()
}
