//! What the gateway adds to a request: the same 1-token completion sent through the gateway's HTTP API (text,
//! so tokenization, hashing and routing are included) and straight to the agent's gRPC `Generate` (token ids),
//! with the prompt already cached on the agent so both pay the same tiny prefill. Prints p50/p99 of both and
//! the difference, then the requests per second each path sustains with several clients at once.
//!
//! Against a running gateway with one tiny-random agent behind it (builtin tokenizer):
//!   deploy/local/up.sh --agents 1 --model tiny-random
//!   cargo run --release -p kvroute-gateway --example gateway_overhead -- 127.0.0.1:8080 127.0.0.1:50061
//! A gateway whose tokenizer is a model's `tokenizer.json` (an agent in front of vLLM, SGLang or kvroute-stub)
//! needs that file as a third argument, so that the ids sent straight to the agent are the model's.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kvroute_proto::pb::{self, agent_client::AgentClient};
use kvroute_tokenizer::Tokenizer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SAMPLES: usize = 300;
const THROUGHPUT_CLIENTS: usize = 8;
const THROUGHPUT_SECONDS: u64 = 10;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (gateway, agent, tokenizer) = match args.as_slice() {
        [gateway, agent] => (gateway, agent, Tokenizer::builtin()),
        [gateway, agent, path] => (
            gateway,
            agent,
            Tokenizer::from_tokenizer_json(std::path::Path::new(path)).with_context(|| format!("loading {path}"))?,
        ),
        _ => bail!("usage: gateway_overhead GATEWAY_HTTP_ADDR AGENT_GRPC_ADDR [TOKENIZER_JSON]"),
    };
    for prompt_tokens in [2000, 200] {
        let text = prompt_of(&tokenizer, prompt_tokens);
        let ids = tokenizer.encode(&text);
        let body = serde_json::json!({"prompt": text, "max_tokens": 1, "temperature": 0}).to_string();
        let mut http = Http::connect(gateway).await?;
        let mut grpc = AgentClient::connect(format!("http://{agent}")).await?;
        // Warm both paths; the prompt is then cached on the agent.
        for _ in 0..5 {
            http.post("/v1/completions", &body).await?;
            direct(&mut grpc, &ids).await?;
        }
        let (mut through, mut straight) = (Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            let begun = Instant::now();
            http.post("/v1/completions", &body).await?;
            through.push(begun.elapsed());
            let begun = Instant::now();
            direct(&mut grpc, &ids).await?;
            straight.push(begun.elapsed());
        }
        let (t50, t99, s50, s99) = (
            percentile(&mut through, 50.0),
            percentile(&mut through, 99.0),
            percentile(&mut straight, 50.0),
            percentile(&mut straight, 99.0),
        );
        println!(
            "{} prompt tokens, 1 output token, {SAMPLES} samples: through the gateway p50 {:.3} ms p99 {:.3} ms; \
             straight to the agent p50 {:.3} ms p99 {:.3} ms; added p50 {:.3} ms p99 {:.3} ms",
            ids.len(),
            ms(t50),
            ms(t99),
            ms(s50),
            ms(s99),
            ms(t50) - ms(s50),
            ms(t99) - ms(s99),
        );
    }
    let text = prompt_of(&tokenizer, 32);
    let ids = tokenizer.encode(&text);
    let body = serde_json::json!({"prompt": text, "max_tokens": 1, "temperature": 0}).to_string();
    let deadline = Instant::now() + Duration::from_secs(THROUGHPUT_SECONDS);
    let mut tasks = Vec::new();
    for _ in 0..THROUGHPUT_CLIENTS {
        let (gateway, body) = (gateway.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut http = Http::connect(&gateway).await?;
            let mut done = 0u64;
            while Instant::now() < deadline {
                http.post("/v1/completions", &body).await?;
                done += 1;
            }
            anyhow::Ok(done)
        }));
    }
    let mut through = 0;
    for task in tasks {
        through += task.await??;
    }
    let deadline = Instant::now() + Duration::from_secs(THROUGHPUT_SECONDS);
    let mut tasks = Vec::new();
    for _ in 0..THROUGHPUT_CLIENTS {
        let (agent, ids) = (agent.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            let mut grpc = AgentClient::connect(format!("http://{agent}")).await?;
            let mut done = 0u64;
            while Instant::now() < deadline {
                direct(&mut grpc, &ids).await?;
                done += 1;
            }
            anyhow::Ok(done)
        }));
    }
    let mut straight = 0;
    for task in tasks {
        straight += task.await??;
    }
    println!(
        "{} prompt tokens, 1 output token, {THROUGHPUT_CLIENTS} clients for {THROUGHPUT_SECONDS} s: \
         through the gateway {:.0} requests/s; straight to the agent {:.0} requests/s",
        ids.len(),
        through as f64 / THROUGHPUT_SECONDS as f64,
        straight as f64 / THROUGHPUT_SECONDS as f64,
    );
    Ok(())
}

/// Text of about `tokens` tokens that does not start like any other prompt of this program.
fn prompt_of(tokenizer: &Tokenizer, tokens: usize) -> String {
    let words = ["harbour", "cargo", "manifest", "tide", "berth", "crane", "ledger", "pilot"];
    let mut text = format!("Overhead probe of {tokens} tokens:");
    let mut i = 0;
    while tokenizer.encode(&text).len() < tokens {
        text.push(' ');
        text.push_str(words[i % words.len()]);
        i += 1;
    }
    text
}

async fn direct(client: &mut AgentClient<tonic::transport::Channel>, ids: &[u32]) -> anyhow::Result<()> {
    let request = pb::AgentGenerateRequest {
        prompt_token_ids: ids.to_vec(),
        sampling: Some(pb::SamplingParams { temperature: 0.0, top_p: 0.0, seed: None }),
        max_tokens: 1,
        ..Default::default()
    };
    let mut stream = client.generate(request).await?.into_inner();
    while stream.message().await?.is_some() {}
    Ok(())
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let rank = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[rank.min(samples.len() - 1)]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// A keep-alive HTTP/1.1 client for one connection, enough for JSON responses with a Content-Length.
struct Http {
    stream: TcpStream,
    host: String,
}

impl Http {
    async fn connect(addr: &str) -> anyhow::Result<Http> {
        let stream = TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(Http { stream, host: addr.to_string() })
    }

    async fn post(&mut self, path: &str, body: &str) -> anyhow::Result<()> {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.stream.write_all(head.as_bytes()).await?;
        self.stream.write_all(body.as_bytes()).await?;
        let mut received = Vec::new();
        let mut buffer = [0u8; 8192];
        let header_end = loop {
            let n = self.stream.read(&mut buffer).await?;
            anyhow::ensure!(n > 0, "the gateway closed the connection");
            received.extend_from_slice(&buffer[..n]);
            if let Some(at) = received.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let head = String::from_utf8_lossy(&received[..header_end]).to_ascii_lowercase();
        anyhow::ensure!(head.starts_with("http/1.1 200"), "the gateway answered {}", head.lines().next().unwrap_or(""));
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .context("no content-length")?
            .trim()
            .parse()?;
        while received.len() < header_end + length {
            let n = self.stream.read(&mut buffer).await?;
            anyhow::ensure!(n > 0, "the gateway closed the connection mid-body");
            received.extend_from_slice(&buffer[..n]);
        }
        Ok(())
    }
}
