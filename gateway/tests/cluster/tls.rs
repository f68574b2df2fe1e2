//! TLS over real sockets, with certificates made at test time: the gateway's
//! HTTPS and gRPC ingress, and gateway-to-agent gRPC verified against the test
//! CA. Plain-text clients, and clients that do not trust the CA, are refused.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use kvroute_proto::pb::{self, generate_client::GenerateClient};
use kvroute_test_support::services::{AgentProcess, GatewayProcess, PATIENCE};
use kvroute_test_support::tls::TestPki;
use kvroute_test_support::{http_request, https_request, wait_until};
use serde_json::{Value, json};

use crate::serial;

/// One HTTP/1.1 request over TLS to `addr`, trusting only `ca_pem` (None: trusting nothing): the status and
/// the answer as JSON.
fn https(
    addr: SocketAddr,
    ca_pem: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, Value)> {
    let headers = [("Content-Type", "application/json")];
    let response = https_request(addr, ca_pem, method, path, &headers, body.as_bytes())?;
    Ok((response.status, serde_json::from_slice(&response.body).unwrap_or(Value::Null)))
}

fn healthy_over_https(gateway: SocketAddr, ca_pem: &str) -> u64 {
    https(gateway, Some(ca_pem), "GET", "/ready", "")
        .map(|(_, body)| body["healthy_replicas"].as_u64().unwrap_or(0))
        .unwrap_or(0)
}

#[test]
fn https_and_grpc_over_tls_on_the_ingress_and_to_the_agents() {
    let _serial = serial();
    let pki = TestPki::generate();
    let (cert, key, ca) = (pki.cert_path(), pki.key_path(), pki.ca_path());
    let (cert, key, ca) = (cert.to_str().unwrap(), key.to_str().unwrap(), ca.to_str().unwrap());
    // The agent logs every connection that fails its TLS handshake (tonic's "tls accept error").
    let dir = tempfile::tempdir().unwrap();
    let agent_log = dir.path().join("agent.log");
    let agent = AgentProcess::start_logging(
        &["--model", "tiny-random", "--num-blocks", "128", "--tls-cert", cert, "--tls-key", key],
        &agent_log,
        "info,tonic=debug",
    );
    // The agent's certificate names 127.0.0.1, the address the gateway dials.
    let gateway = GatewayProcess::spawn(&[agent.grpc], &["--tls-cert", cert, "--tls-key", key, "--agent-tls-ca", ca]);
    let plain_gateway = GatewayProcess::spawn(&[agent.grpc], &[]);
    wait_until("the TLS gateway reaching the TLS agent", PATIENCE, || {
        match healthy_over_https(gateway.http, &pki.ca_pem) {
            1 => Ok(()),
            healthy => Err(format!("{healthy} healthy replicas")),
        }
    })
    .unwrap();

    // HTTPS ingress: a completion runs end to end over TLS on both hops.
    let body = json!({"prompt": "Hello over TLS", "max_tokens": 3}).to_string();
    let (status, response) = https(gateway.http, Some(&pki.ca_pem), "POST", "/v1/completions", &body).unwrap();
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["usage"]["completion_tokens"], 3);
    // A client that does not trust the CA cannot connect, and plain HTTP gets no HTTP answer.
    assert!(https(gateway.http, None, "GET", "/health", "").is_err(), "an unverified server was trusted");
    let plain = http_request(gateway.http, "GET", "/health", &[], b"");
    assert!(plain.is_err() || plain.unwrap().status != 200, "plain HTTP reached the TLS listener");

    // gRPC ingress over TLS, and refused in plain text.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&pki.ca_pem))
            .domain_name("localhost");
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", gateway.grpc))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let request = pb::GenerateRequest {
            prompt: Some(pb::generate_request::Prompt::Text("Hello over gRPC and TLS".into())),
            max_tokens: 2,
            ..Default::default()
        };
        let mut stream = GenerateClient::new(channel).generate(request.clone()).await.unwrap().into_inner();
        let mut tokens = 0;
        while let Some(message) = stream.message().await.unwrap() {
            tokens += message.token_ids.len();
        }
        assert_eq!(tokens, 2);
        let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", gateway.grpc)).unwrap();
        let refused = match plain.connect_timeout(Duration::from_secs(2)).connect().await {
            Ok(channel) => GenerateClient::new(channel).generate(request).await.is_err(),
            Err(_) => true,
        };
        assert!(refused, "plain-text gRPC reached the TLS listener");
    });

    // The gateway without the CA speaks plain text to the agent, which refuses it: never healthy. Once the
    // agent has refused two of its connections, it has seen its first attempt fail and tried again.
    wait_until("the agent refusing the plain-text gateway twice", PATIENCE, || {
        let log = std::fs::read_to_string(&agent_log).unwrap_or_default();
        match log.matches("tls accept error").count() {
            refused if refused >= 2 => Ok(refused),
            refused => Err(format!("{refused} refused connections")),
        }
    })
    .unwrap();
    let ready = http_request(plain_gateway.http, "GET", "/ready", &[], b"").unwrap();
    let ready: Value = serde_json::from_slice(&ready.body).unwrap();
    assert_eq!(ready["healthy_replicas"], 0, "a plain-text gateway reached a TLS agent");
}
