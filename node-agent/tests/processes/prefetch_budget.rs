//! Blocks fetched from Redis for a request not yet admitted fit the agent's prefetch budget: an agent with
//! room for two blocks reloads two of a prompt's blocks from the shared tier and recomputes the rest, one
//! with the default budget reloads them all.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use kvroute_proto::domain::AgentInfo;
use kvroute_proto::pb::{self, agent_client::AgentClient};
use kvroute_test_support::services::AgentProcess;
use kvroute_test_support::{RedisServer, wait_until};

/// Runs `prompt` on the agent at `addr`; returns the cached tokens it reports.
async fn cached_tokens(addr: SocketAddr, prompt: &[u32]) -> u32 {
    let mut client = AgentClient::connect(format!("http://{addr}")).await.unwrap();
    let request = pb::AgentGenerateRequest { prompt_token_ids: prompt.to_vec(), max_tokens: 1, ..Default::default() };
    let mut stream = client.generate(request).await.unwrap().into_inner();
    let mut usage = None;
    while let Some(message) = stream.message().await.unwrap() {
        usage = message.usage.or(usage);
    }
    usage.unwrap().cached_tokens
}

async fn block_bytes(addr: SocketAddr) -> u64 {
    let mut client = AgentClient::connect(format!("http://{addr}")).await.unwrap();
    let info = AgentInfo::try_from(client.info(pb::InfoRequest {}).await.unwrap().into_inner()).unwrap();
    info.kv_geometry.bytes_per_block(info.block_size)
}

fn keys(redis: &RedisServer) -> u64 {
    let reply = redis.command(&[b"DBSIZE"]).unwrap();
    String::from_utf8_lossy(&reply).trim().trim_start_matches(':').parse().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_prefetches_no_more_than_its_budget_and_recomputes_the_rest() {
    let redis = RedisServer::start();
    // Eight full blocks and one more token; the writer sends a block to Redis once it is reused.
    let prompt: Vec<u32> = (0..129).map(|i| 1_000 + i * 3).collect();
    let writer = AgentProcess::start_tiered(&redis.url(), "writer", &["--redis-write-through-hits", "1"]);
    cached_tokens(writer.grpc, &prompt).await;
    assert_eq!(cached_tokens(writer.grpc, &prompt).await, 128, "the repeat hits the writer's pool");
    wait_until("the prompt's eight blocks in Redis", Duration::from_secs(30), || {
        let keys = keys(&redis);
        if keys >= 8 { Ok(keys) } else { Err(format!("{keys} keys")) }
    })
    .unwrap();

    let two_blocks = (2 * block_bytes(writer.grpc).await).to_string();
    let small = AgentProcess::start_tiered(&redis.url(), "small", &["--prefetch-budget-bytes", &two_blocks]);
    assert_eq!(cached_tokens(small.grpc, &prompt).await, 32, "two blocks reloaded, six recomputed");
    let default = AgentProcess::start_tiered(&redis.url(), "default", &[]);
    assert_eq!(cached_tokens(default.grpc, &prompt).await, 128, "all eight reloaded");
}
