//! The gateway's ingress against real processes on loopback: a 4 MiB prompt tokenizing off the async
//! workers while a small request is served; the same checks and limits on HTTP and gRPC; the message
//! cap; gRPC reflection in both versions; `/debug/route` behind the admin key, rendering exactly what
//! the request path sends; and replies remembered only when their ids spell their text.
//!
//! Every process logs to a temporary directory, printed when a test fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvroute_gateway::chat::{ChatMessage, ChatRenderer};
use kvroute_gateway::tokenizer::Tokenizer;
use kvroute_proto::pb::{self, generate_client::GenerateClient};
use kvroute_test_support::api::post_json;
use kvroute_test_support::services::{AgentProcess, GatewayProcess};
use kvroute_test_support::{http_request, project_binary, wait_until};
use serde_json::{Value, json};

/// One set of processes at a time: each test starts an agent and a gateway on a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

const ADMIN_KEY: &str = "sk-admin-4bd6c1e2";

/// A directory of process logs, printed when the test fails.
struct Logs {
    dir: tempfile::TempDir,
}

impl Logs {
    fn new() -> Logs {
        Logs { dir: tempfile::tempdir().unwrap() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let mut entries: Vec<_> = std::fs::read_dir(self.dir.path()).into_iter().flatten().flatten().collect();
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for entry in entries {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(200)..];
            eprintln!(
                "----- {} (last {} lines) -----\n{}",
                entry.file_name().to_string_lossy(),
                tail.len(),
                tail.join("\n")
            );
        }
    }
}

/// A tiny-random agent and a gateway in front of it. Fields drop in order: processes, then logs.
struct Setup {
    gateway: GatewayProcess,
    _agent: AgentProcess,
    logs: Logs,
    _serial: std::sync::MutexGuard<'static, ()>,
}

fn setup(gateway_args: &[&str]) -> Setup {
    let serial = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let logs = Logs::new();
    let agent =
        AgentProcess::start_logging(&["--model", "tiny-random", "--num-blocks", "512"], &logs.path("agent"), "info");
    let gateway = GatewayProcess::start_logging(&[agent.grpc], gateway_args, &logs.path("gateway"), "info");
    Setup { gateway, _agent: agent, logs, _serial: serial }
}

fn admin() -> [(&'static str, &'static str); 1] {
    [("Authorization", "Bearer sk-admin-4bd6c1e2")]
}

/// The value of one series of the gateway's `/metrics` (0 when absent).
fn series(addr: SocketAddr, name: &str, labels: &[&str]) -> f64 {
    let body = http_request(addr, "GET", "/metrics", &[], b"").map(|response| response.text()).unwrap_or_default();
    body.lines()
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .find(|line| labels.iter().all(|label| line.contains(label)))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Text that is slow to tokenize: pseudo-random words of Latin, accented and Cyrillic letters.
fn slow_text(bytes: usize) -> String {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |bound: u32| {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as u32 % bound
    };
    let scripts = [(0x61, 26), (0xe0, 30), (0x430, 32)];
    let mut text = String::with_capacity(bytes + 64);
    while text.len() < bytes {
        for _ in 0..1 + next(12) {
            let (base, count) = scripts[next(3) as usize];
            text.push(char::from_u32(base + next(count)).unwrap());
        }
        text.push(' ');
    }
    text
}

#[test]
fn a_four_mib_prompt_does_not_delay_a_small_request() {
    let _serial = crate::serial();
    // One async worker: on it, tokenizing the large prompt inline would hold every other request.
    let setup = setup(&["--worker-threads", "1"]);
    let http = setup.gateway.http;
    let large = json!({"prompt": slow_text((4 << 20) - 4096), "max_tokens": 1}).to_string();
    assert!(large.len() < 4 << 20, "the body fits the default limit");
    let finished: Arc<Mutex<Vec<&str>>> = Arc::default();
    let sender = {
        let finished = finished.clone();
        std::thread::spawn(move || {
            let headers = [("Content-Type", "application/json")];
            let response = http_request(http, "POST", "/v1/completions", &headers, large.as_bytes()).unwrap();
            finished.lock().unwrap().push("large");
            response
        })
    };
    let running = ["lane=\"large\"", "state=\"running\""];
    wait_until("the large prompt to be tokenizing", Duration::from_secs(60), || {
        let jobs = series(http, "kvroute_gateway_prompt_jobs", &running);
        if jobs >= 1.0 || !finished.lock().unwrap().is_empty() { Ok(()) } else { Err(format!("{jobs} running")) }
    })
    .unwrap();
    let (status, small) = post_json(http, "/v1/completions", &[], &json!({"prompt": "Hello", "max_tokens": 1}));
    finished.lock().unwrap().push("small");
    assert_eq!(status, 200, "{small}");
    let large = sender.join().unwrap();
    assert_eq!(
        *finished.lock().unwrap(),
        ["small", "large"],
        "the small request finished after the large one (which answered {}: {})",
        large.status,
        large.text().chars().take(300).collect::<String>()
    );
    // The large prompt was tokenized (about 2 million tokens); the agent refuses it as longer than its context.
    assert_eq!(large.status, 400, "{}", large.text().chars().take(300).collect::<String>());
}

/// A bad request as HTTP and gRPC send it, and what both must answer.
struct Case {
    name: &'static str,
    http: Value,
    grpc: pb::GenerateRequest,
    status: u16,
    code: tonic::Code,
    /// The parameter HTTP names (for 400s the gateway raises itself).
    param: Option<&'static str>,
}

fn text(prompt: &str) -> Option<pb::generate_request::Prompt> {
    Some(pb::generate_request::Prompt::Text(prompt.into()))
}

fn grpc(request: pb::GenerateRequest) -> pb::GenerateRequest {
    pb::GenerateRequest { prompt: request.prompt.or_else(|| text("Hello")), ..request }
}

fn sampling(temperature: f32, top_p: f32) -> Option<pb::SamplingParams> {
    Some(pb::SamplingParams { temperature, top_p, seed: None })
}

fn salt(salt: &str) -> Option<pb::TenantMetadata> {
    Some(pb::TenantMetadata { user: String::new(), cache_salt: salt.into() })
}

#[test]
fn http_and_grpc_refuse_the_same_requests_alike() {
    let setup = setup(&["--max-body-bytes", "65536"]);
    let five: Vec<String> = ["a", "b", "c", "d", "e"].map(String::from).to_vec();
    let long = "s".repeat(300);
    let huge = "word ".repeat(20_000);
    let default = pb::GenerateRequest::default;
    let cases = [
        Case {
            name: "empty prompt",
            http: json!({"prompt": ""}),
            grpc: pb::GenerateRequest { prompt: text(""), ..default() },
            status: 400,
            code: tonic::Code::InvalidArgument,
            param: Some("prompt"),
        },
        Case {
            name: "no prompt ids",
            http: json!({"prompt": []}),
            grpc: pb::GenerateRequest {
                prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids: vec![] })),
                ..default()
            },
            status: 400,
            code: tonic::Code::InvalidArgument,
            param: Some("prompt"),
        },
        Case {
            name: "five stop strings",
            http: json!({"prompt": "Hello", "stop": five}),
            grpc: grpc(pb::GenerateRequest { stop: five.clone(), ..default() }),
            status: 400,
            code: tonic::Code::InvalidArgument,
            param: Some("stop"),
        },
        Case {
            name: "a stop string of 300 bytes",
            http: json!({"prompt": "Hello", "stop": [long]}),
            grpc: grpc(pb::GenerateRequest { stop: vec![long.clone()], ..default() }),
            status: 400,
            code: tonic::Code::InvalidArgument,
            param: Some("stop"),
        },
        Case {
            name: "temperature 3",
            http: json!({"prompt": "Hello", "temperature": 3.0}),
            grpc: grpc(pb::GenerateRequest { sampling: sampling(3.0, 1.0), ..default() }),
            status: 400,
            code: tonic::Code::InvalidArgument,
            param: Some("temperature"),
        },
        Case {
            name: "top_p 1.5",
            http: json!({"prompt": "Hello", "top_p": 1.5}),
            grpc: grpc(pb::GenerateRequest { sampling: sampling(1.0, 1.5), ..default() }),
            status: 400,
            code: tonic::Code::InvalidArgument,
            param: Some("top_p"),
        },
        Case {
            name: "a cache salt of 300 bytes",
            http: json!({"prompt": "Hello", "cache_salt": long}),
            grpc: grpc(pb::GenerateRequest { tenant: salt(&long), ..default() }),
            status: 400,
            code: tonic::Code::InvalidArgument,
            param: Some("cache_salt"),
        },
        Case {
            name: "a token id outside the vocabulary",
            http: json!({"prompt": [u32::MAX]}),
            grpc: pb::GenerateRequest {
                prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids: vec![u32::MAX] })),
                ..default()
            },
            status: 400,
            code: tonic::Code::InvalidArgument,
            param: Some("prompt"),
        },
        Case {
            name: "more tokens than the context holds",
            http: json!({"prompt": "Hello", "max_tokens": 100_000}),
            grpc: grpc(pb::GenerateRequest { max_tokens: 100_000, ..default() }),
            status: 400,
            code: tonic::Code::InvalidArgument,
            param: None,
        },
        Case {
            name: "an unknown model",
            http: json!({"prompt": "Hello", "model": "no-such-model"}),
            grpc: grpc(pb::GenerateRequest { model: "no-such-model".into(), ..default() }),
            status: 404,
            code: tonic::Code::NotFound,
            param: None,
        },
        Case {
            name: "a request over --max-body-bytes",
            http: json!({"prompt": huge}),
            grpc: pb::GenerateRequest { prompt: text(&huge), ..default() },
            status: 413,
            code: tonic::Code::OutOfRange,
            param: None,
        },
    ];
    let runtime = runtime();
    let mut client = runtime.block_on(GenerateClient::connect(format!("http://{}", setup.gateway.grpc))).unwrap();
    for case in cases {
        let (status, body) = post_json(setup.gateway.http, "/v1/completions", &[], &case.http);
        assert_eq!(status, case.status, "{}: HTTP {body}", case.name);
        let message = body["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(!message.is_empty(), "{}: HTTP error without a message: {body}", case.name);
        assert!(body["error"]["type"].is_string(), "{}: {body}", case.name);
        if let Some(param) = case.param {
            assert_eq!(body["error"]["param"], param, "{}: {body}", case.name);
        }
        let refused = runtime.block_on(client.generate(case.grpc)).map(|_| ()).unwrap_err();
        assert_eq!(refused.code(), case.code, "{}: gRPC {refused:?}", case.name);
        assert!(!refused.message().is_empty(), "{}: gRPC status without a message", case.name);
        if case.status != 413 {
            assert_eq!(refused.message(), message, "{}: the same message on both", case.name);
        }
    }
    // Four stop strings are fine on both.
    let four: Vec<String> = five[..4].to_vec();
    let (status, body) = post_json(
        setup.gateway.http,
        "/v1/completions",
        &[],
        &json!({"prompt": "Hello", "max_tokens": 2, "stop": four}),
    );
    assert_eq!(status, 200, "{body}");
    let request = grpc(pb::GenerateRequest { max_tokens: 2, stop: four, ..pb::GenerateRequest::default() });
    assert!(runtime.block_on(client.generate(request)).is_ok());
}

fn chat(messages: usize) -> Value {
    let messages: Vec<Value> = (0..messages)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("turn {i}")}))
        .collect();
    json!({"messages": messages, "max_tokens": 1})
}

#[test]
fn chats_with_too_many_messages_are_refused() {
    let setup = setup(&["--max-messages", "3", "--admin-api-key", ADMIN_KEY]);
    let http = setup.gateway.http;
    let (status, body) = post_json(http, "/v1/chat/completions", &[], &chat(3));
    assert_eq!(status, 200, "{body}");
    for path in ["/v1/chat/completions", "/debug/route"] {
        let (status, body) = post_json(http, path, &admin(), &chat(4));
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert_eq!(body["error"]["param"], "messages", "{body}");
        assert_eq!(body["error"]["message"], "at most 3 messages per request, got 4", "{body}");
    }
    let (status, body) = post_json(http, "/v1/chat/completions", &[], &json!({"messages": []}));
    assert_eq!((status, &body["error"]["param"]), (400, &json!("messages")), "{body}");
}

#[test]
fn reflection_v1_and_v1alpha_find_generate() {
    let setup = setup(&[]);
    let endpoint = format!("http://{}", setup.gateway.grpc);
    let runtime = runtime();
    runtime.block_on(async {
        use tokio_stream::StreamExt;
        {
            use tonic_reflection::pb::v1::ServerReflectionRequest;
            use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
            let mut client = ServerReflectionClient::new(channel(&endpoint).await);
            let requests = [
                MessageRequest::ListServices(String::new()),
                MessageRequest::FileContainingSymbol("kvroute.v1.Generate".into()),
            ]
            .map(|message| ServerReflectionRequest { host: String::new(), message_request: Some(message) });
            let mut answers = client.server_reflection_info(tokio_stream::iter(requests)).await.unwrap().into_inner();
            let Some(MessageResponse::ListServicesResponse(list)) =
                answers.next().await.unwrap().unwrap().message_response
            else {
                panic!("v1: no service list")
            };
            let names: Vec<&str> = list.service.iter().map(|service| service.name.as_str()).collect();
            // The services this server has (the agents' service is in the descriptors, not served here).
            assert_eq!(names, ["kvroute.v1.Generate", "grpc.reflection.v1.ServerReflection"], "v1");
            let Some(MessageResponse::FileDescriptorResponse(files)) =
                answers.next().await.unwrap().unwrap().message_response
            else {
                panic!("v1: no file descriptor")
            };
            assert!(describes_generate(&files.file_descriptor_proto), "v1: the file does not define Generate");
        }
        {
            use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
            use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
            let mut client = ServerReflectionClient::new(channel(&endpoint).await);
            let requests = [
                MessageRequest::ListServices(String::new()),
                MessageRequest::FileContainingSymbol("kvroute.v1.Generate".into()),
            ]
            .map(|message| ServerReflectionRequest { host: String::new(), message_request: Some(message) });
            let mut answers = client.server_reflection_info(tokio_stream::iter(requests)).await.unwrap().into_inner();
            let Some(MessageResponse::ListServicesResponse(list)) =
                answers.next().await.unwrap().unwrap().message_response
            else {
                panic!("v1alpha: no service list")
            };
            let names: Vec<&str> = list.service.iter().map(|service| service.name.as_str()).collect();
            // The services this server has (the agents' service is in the descriptors, not served here).
            assert_eq!(names, ["kvroute.v1.Generate", "grpc.reflection.v1alpha.ServerReflection"], "v1alpha");
            let Some(MessageResponse::FileDescriptorResponse(files)) =
                answers.next().await.unwrap().unwrap().message_response
            else {
                panic!("v1alpha: no file descriptor")
            };
            assert!(describes_generate(&files.file_descriptor_proto), "v1alpha: the file does not define Generate");
        }
        // The service found is the one that answers.
        let mut client = GenerateClient::connect(endpoint).await.unwrap();
        let request = pb::GenerateRequest { prompt: text("Hello"), max_tokens: 3, ..Default::default() };
        let mut stream = client.generate(request).await.unwrap().into_inner();
        let mut usage = None;
        while let Some(message) = stream.message().await.unwrap() {
            usage = message.usage.or(usage);
        }
        assert_eq!(usage.map(|usage| usage.completion_tokens), Some(3));
    });
}

async fn channel(endpoint: &str) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(endpoint.to_string()).unwrap().connect().await.unwrap()
}

/// Whether serialized file descriptors define the service `Generate` with its method and messages.
fn describes_generate(files: &[Vec<u8>]) -> bool {
    let contains = |bytes: &[u8], needle: &[u8]| bytes.windows(needle.len()).any(|window| window == needle);
    files.iter().any(|file| {
        contains(file, b"kvroute/v1/generate.proto")
            && contains(file, b"GenerateRequest")
            && contains(file, b"GenerateResponse")
    })
}

// --------------------------------------------------------------------------------------------------------
// Replies and /debug/route.

fn chatml() -> ChatRenderer {
    ChatRenderer::new(None, Arc::new(Tokenizer::builtin())).unwrap()
}

fn message(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn wire(messages: &[ChatMessage]) -> Value {
    serde_json::to_value(messages).unwrap()
}

/// The sampling of the replies test: seeded, so HTTP and gRPC sample the same tokens (greedy decoding of
/// the random test model repeats one token).
const SEED: u64 = 7;

/// The continuation of `prompt` (token ids) sampled with `seed`, as the agent generates it.
fn continuation(grpc: SocketAddr, prompt: Vec<u32>, max_tokens: u32, seed: u64) -> Vec<u32> {
    runtime().block_on(async {
        let mut client = GenerateClient::connect(format!("http://{grpc}")).await.unwrap();
        let request = pb::GenerateRequest {
            prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids: prompt })),
            max_tokens,
            sampling: Some(pb::SamplingParams { temperature: 1.0, top_p: 1.0, seed: Some(seed) }),
            ..Default::default()
        };
        let mut stream = client.generate(request).await.unwrap().into_inner();
        let mut ids = Vec::new();
        while let Some(message) = stream.message().await.unwrap() {
            ids.extend(message.token_ids);
        }
        ids
    })
}

/// The prompt tokens of a chat turn as the gateway counted them.
fn prompt_tokens(http: SocketAddr, headers: &[(&str, &str)], messages: &[ChatMessage]) -> u64 {
    let (status, body) = post_json(
        http,
        "/v1/chat/completions",
        headers,
        &json!({"messages": wire(messages), "max_tokens": 1, "temperature": 0}),
    );
    assert_eq!(status, 200, "{body}");
    body["usage"]["prompt_tokens"].as_u64().unwrap()
}

#[test]
fn replies_cut_by_a_multi_token_stop_string_are_remembered_only_when_exact() {
    let setup = setup(&[]);
    let http = setup.gateway.http;
    let tokenizer = Tokenizer::builtin();
    let renderer = chatml();
    let question = [message("system", "You are terse."), message("user", "Tell me a story.")];
    let generated = continuation(setup.gateway.grpc, renderer.render_tokens(&question, &[], true).unwrap(), 32, SEED);
    let decode = |ids: &[u32]| tokenizer.decode(ids).ok().filter(|_| ids.iter().all(|&id| !tokenizer.is_special(id)));
    // A stop string made of the text of three generated tokens, first seen where they start: at `cut`
    // (a token boundary), or `inside` bytes into the first of them.
    let find = |inside: usize| {
        (2..generated.len().saturating_sub(3)).find_map(|cut| {
            let before = decode(&generated[..cut])?;
            let first = decode(&generated[cut..=cut])?;
            if inside > 0 && !(first.len() > inside && first.is_char_boundary(inside)) {
                return None;
            }
            let stop = decode(&generated[cut..cut + 3])?[inside..].to_string();
            let through = decode(&generated[..cut + 3])?;
            let reply = format!("{before}{}", &first[..inside]);
            (through.find(&stop) == Some(reply.len()) && stop.len() <= 256 && !reply.trim().is_empty())
                .then_some((cut, stop, reply))
        })
    };
    for inside in [0, 1] {
        let (cut, stop, reply) =
            find(inside).unwrap_or_else(|| panic!("no stop string {inside} bytes into a token in {generated:?}"));
        let (status, body) = post_json(
            http,
            "/v1/chat/completions",
            &[],
            &json!({"messages": wire(&question), "max_tokens": 32, "temperature": 1, "seed": SEED, "stop": [stop]}),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["message"]["content"], reply.as_str(), "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
        let next = [&question[..], &[message("assistant", &reply), message("user", "And then?")]].concat();
        // Exact ids when the reply ends on a token boundary; its text otherwise.
        let exact = &generated[..cut];
        let expected = if inside == 0 {
            renderer
                .render_tokens_with_replies(&next, &[], true, &|text| (text == reply).then(|| exact.into()))
                .unwrap()
        } else {
            renderer.render_tokens(&next, &[], true).unwrap()
        };
        // What dropping one id from the ids seen up to the stop string would have replayed.
        let dropped = &generated[..cut + 2];
        let wrong = renderer
            .render_tokens_with_replies(&next, &[], true, &|text| (text == reply).then(|| dropped.into()))
            .unwrap();
        assert_ne!(expected.len(), wrong.len(), "the case tells the two apart");
        assert_eq!(prompt_tokens(http, &[], &next), expected.len() as u64, "{inside} bytes into a token");
    }
}

#[test]
fn debug_route_needs_the_admin_key_and_renders_as_the_request_path() {
    let setup = setup(&[]);
    let agent = [setup._agent.grpc];
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), "sk-acme-0001 acme\n").unwrap();
    let keys_path = keys.path().to_str().unwrap();
    let gateway = GatewayProcess::start_logging_with_env(
        &agent,
        &["--api-keys", keys_path],
        &[("KVROUTE_ADMIN_API_KEY", ADMIN_KEY)],
        &setup.logs.path("gateway-with-admin-key"),
        "info",
    );
    let http = gateway.http;
    let tenant = [("Authorization", "Bearer sk-acme-0001")];
    let explain = |headers: &[(&str, &str)], body: &Value| post_json(http, "/debug/route", headers, body);
    let prompt = json!({"prompt": "Hello there", "tenant": "acme"});
    // Without the admin key: refused with OpenAI's error shape.
    for (headers, status, kind) in [
        (&[][..], 401, "authentication_error"),
        (&tenant[..], 403, "permission_error"),
        (&[("Authorization", "Bearer sk-nobody")][..], 401, "authentication_error"),
    ] {
        let (got, body) = explain(headers, &prompt);
        assert_eq!(got, status, "{headers:?}: {body}");
        assert_eq!(body["error"]["type"], kind, "{body}");
        assert!(body["error"]["message"].as_str().is_some_and(|message| !message.is_empty()), "{body}");
    }
    let (status, body) = explain(&admin(), &json!({"prompt": "Hello there"}));
    assert_eq!((status, &body["error"]["param"]), (400, &json!("tenant")), "{body}");
    let (status, body) = explain(&admin(), &prompt);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["prompt_tokens"], Tokenizer::builtin().encode("Hello there").len(), "{body}");

    // Turn 2 of a chat: the explain endpoint renders turn 1's reply with its generated ids, as the request
    // does. The reply is cut where its ids, tokenized again from text, would be a different number of tokens.
    let question = [message("user", "Tell me a story.")];
    let tokenizer = Tokenizer::builtin();
    let prompt = chatml().render_tokens(&question, &[], true).unwrap();
    // Sampled tokens are mostly whole words that tokenize back alike: try seeds until some do not.
    let (seed, generated, length) = (1..64)
        .find_map(|seed| {
            let generated = continuation(setup.gateway.grpc, prompt.clone(), 32, seed);
            let length = (1..=generated.len()).find(|&length| {
                let ids = &generated[..length];
                ids.iter().all(|&id| !tokenizer.is_special(id))
                    && tokenizer.decode(ids).is_ok_and(|text| tokenizer.encode(&text).len() != length)
            })?;
            Some((seed, generated, length))
        })
        .expect("a reply whose text tokenizes back to another number of tokens");
    let body = json!({"messages": wire(&question), "max_tokens": length, "temperature": 1, "seed": seed});
    let (status, turn1) = post_json(http, "/v1/chat/completions", &tenant, &body);
    assert_eq!(status, 200, "{turn1}");
    let reply = turn1["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert_eq!(reply, tokenizer.decode(&generated[..length]).unwrap(), "{turn1}");
    let next = [&question[..], &[message("assistant", &reply), message("user", "And then?")]].concat();
    let (status, explained) = explain(&admin(), &json!({"messages": wire(&next), "tenant": "acme"}));
    assert_eq!(status, 200, "{explained}");
    let replayed = chatml()
        .render_tokens_with_replies(&next, &[], true, &|text| (text == reply).then(|| generated[..length].into()))
        .unwrap();
    assert_ne!(replayed.len(), chatml().render_tokens(&next, &[], true).unwrap().len());
    assert_eq!(explained["prompt_tokens"], replayed.len(), "{explained}");
    assert_eq!(explained["prompt_tokens"], prompt_tokens(http, &tenant, &next), "{explained}");

    // A gateway without an admin key has the endpoint off.
    let (status, body) = post_json(setup.gateway.http, "/debug/route", &admin(), &json!({"prompt": "Hello"}));
    assert_eq!(status, 404, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("KVROUTE_ADMIN_API_KEY"), "{body}");
    // And the admin key cannot be a tenant key.
    let clash = std::process::Command::new(project_binary("kvroute-gateway", "gateway"))
        .args([
            "--agents",
            "127.0.0.1:1",
            "--api-keys",
            keys_path,
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
        ])
        .env("KVROUTE_ADMIN_API_KEY", "sk-acme-0001")
        .output()
        .unwrap();
    assert!(!clash.status.success());
    assert!(String::from_utf8_lossy(&clash.stderr).contains("tenant"), "{}", String::from_utf8_lossy(&clash.stderr));
}
