//! A small HTTP/1.1 client for the engine server beside the agent: one connection per call (the engine is
//! on loopback or in the same pod), JSON bodies, and streamed responses read frame by frame.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

/// Where the engine's HTTP API is: `http://host:port[/base]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `host:port`, as connected to and sent in `Host`.
    pub authority: String,
    /// Path prefix without a trailing slash ("" for none).
    pub base: String,
}

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
        Ok(Endpoint { authority: authority.to_string(), base: base.to_string() })
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
        let call = async {
            let stream = tokio::net::TcpStream::connect(&self.authority)
                .await
                .map_err(|error| HttpError::Connect(self.authority.clone(), error))?;
            let _ = stream.set_nodelay(true);
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|error| HttpError::Protocol(error.to_string()))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            let body = json.map(|value| Bytes::from(value.to_string())).unwrap_or_default();
            let mut request = hyper::Request::builder()
                .method(method)
                .uri(format!("{}{}", self.base, path))
                .header(hyper::header::HOST, &self.authority);
            if json.is_some() {
                request = request.header(hyper::header::CONTENT_TYPE, "application/json");
            }
            let request = request.body(Full::new(body)).map_err(|error| HttpError::Protocol(error.to_string()))?;
            sender.send_request(request).await.map_err(|error| HttpError::Protocol(error.to_string()))
        };
        tokio::time::timeout(timeout, call).await.map_err(|_| HttpError::Timeout(timeout))?
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
        assert_eq!(plain, Endpoint { authority: "127.0.0.1:8000".into(), base: String::new() });
        assert_eq!(plain.url("/v1/models"), "http://127.0.0.1:8000/v1/models");
        let based = Endpoint::parse("http://vllm.local:80/engine/").unwrap();
        assert_eq!(based.base, "/engine");
        for bad in ["https://a:1", "http://a", "http://:80", "http://a:x", "a:80"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
