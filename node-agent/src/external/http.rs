//! A small HTTP/1.1 client for the engine server beside the agent (on loopback or in the same pod): JSON
//! bodies, streamed responses read frame by frame, and idle connections kept for the next call, so that a
//! busy agent neither pays a TCP handshake per request nor leaves a socket in TIME_WAIT for each one.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// How long an idle connection to the engine is kept: below the 5 s after which uvicorn (vLLM's and
/// SGLang's server) closes one, so that a call rarely meets a connection the server is closing.
const IDLE_CONNECTION: Duration = Duration::from_secs(2);

/// Where the engine's HTTP API is: `http://host:port[/base]`, and the connections kept to it.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `host:port`, as connected to and sent in `Host`.
    pub authority: String,
    /// Path prefix without a trailing slash ("" for none).
    pub base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl PartialEq for Endpoint {
    fn eq(&self, other: &Endpoint) -> bool {
        self.authority == other.authority && self.base == other.base
    }
}

impl Eq for Endpoint {}

/// Why a call to the engine failed before it answered.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Protocol(String),
}

impl Endpoint {
    /// Parses `http://host:port[/base]`; `https` is not supported (the engine is beside the agent).
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url:?} is not an http:// URL"))?;
        let (authority, base) = match rest.find('/') {
            Some(slash) => (&rest[..slash], rest[slash..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = authority.rsplit_once(':').ok_or_else(|| format!("{url:?} has no port"))?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(format!("{url:?} is not http://host:port"));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(IDLE_CONNECTION).build(connector);
        Ok(Endpoint { authority: authority.to_string(), base: base.to_string(), client })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}{}", self.authority, self.base, path)
    }

    /// Sends one request; the response's head is back within `timeout`, its body is read by the caller.
    pub async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        json: Option<&serde_json::Value>,
        timeout: Duration,
    ) -> Result<hyper::Response<Incoming>, HttpError> {
        let body = json.map(|value| Bytes::from(value.to_string())).unwrap_or_default();
        let mut request = hyper::Request::builder().method(method).uri(self.url(path));
        if json.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(body)).map_err(|error| HttpError::Protocol(error.to_string()))?;
        match tokio::time::timeout(timeout, self.client.request(request)).await {
            Err(_) => Err(HttpError::Timeout(timeout)),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) if error.is_connect() => {
                Err(HttpError::Connect(self.authority.clone(), std::io::Error::other(causes(&error))))
            }
            Ok(Err(error)) => Err(HttpError::Protocol(causes(&error))),
        }
    }

    /// A whole (small) response: its status and body, read within `timeout`.
    pub async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        json: Option<&serde_json::Value>,
        timeout: Duration,
    ) -> Result<(u16, Bytes), HttpError> {
        let read = async {
            let response = self.send(method, path, json, timeout).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.map_err(|error| HttpError::Protocol(error.to_string()))?;
            Ok((status, body.to_bytes()))
        };
        tokio::time::timeout(timeout, read).await.map_err(|_| HttpError::Timeout(timeout))?
    }

    /// GET `path` and parse its JSON body; any status but 200 is an error naming it.
    pub async fn get_json(&self, path: &str, timeout: Duration) -> Result<serde_json::Value, String> {
        let (status, body) =
            self.call(hyper::Method::GET, path, None, timeout).await.map_err(|error| error.to_string())?;
        if status != 200 {
            return Err(format!("GET {} answered {status}: {}", self.url(path), lossy(&body, 300)));
        }
        serde_json::from_slice(&body).map_err(|error| format!("GET {} is not JSON: {error}", self.url(path)))
    }
}

/// The next chunk of a streamed body, or None at its end.
pub async fn next_chunk(body: &mut Incoming) -> Option<Result<Bytes, String>> {
    loop {
        match body.frame().await? {
            Ok(frame) => match frame.into_data() {
                Ok(data) => return Some(Ok(data)),
                Err(_trailers) => continue,
            },
            Err(error) => return Some(Err(error.to_string())),
        }
    }
}

/// An error and its causes, `: `-separated (the client's own message only says which stage failed).
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// At most `limit` characters of `body`, for error messages.
pub fn lossy(body: &[u8], limit: usize) -> String {
    String::from_utf8_lossy(body).chars().take(limit).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_with_and_without_a_base_path() {
        let plain = Endpoint::parse("http://127.0.0.1:8000").unwrap();
        assert_eq!((plain.authority.as_str(), plain.base.as_str()), ("127.0.0.1:8000", ""));
        assert_eq!(plain.url("/v1/models"), "http://127.0.0.1:8000/v1/models");
        let based = Endpoint::parse("http://vllm.local:80/engine/").unwrap();
        assert_eq!(based.base, "/engine");
        for bad in ["https://a:1", "http://a", "http://:80", "http://a:x", "a:80"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
