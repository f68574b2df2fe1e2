//! The tests' one HTTP/1.1 client, over real sockets: plain TCP, or TLS trusting only a CA the test made
//! ([`https_request`]). A response is read whole ([`http_request`]) or as it arrives ([`EventStream`]); both
//! read its body with one reader, which also de-chunks it, and server-sent events go through one parser
//! ([`SseParser`]), which reads them as the HTML standard does (`data:` lines joined by `\n`).
//!
//! Clients that misbehave on purpose (a body sent a byte at a time, a half-sent HTTP/2 request, a request
//! whose answer is never read) stay in the tests that need them.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

/// How long a request read whole waits for its server.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an [`EventStream`] waits for the next piece of its body.
const STREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// The name a TLS server's certificate must be for (the test PKI's server certificate is).
const TLS_SERVER_NAME: &str = "localhost";

/// A minimal HTTP/1.1 response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    /// The `data` of each server-sent event of the body ([`SseParser`]).
    pub fn sse_data(&self) -> Vec<String> {
        SseParser::default().feed(&self.body)
    }
}

/// Sends one HTTP/1.1 request over a real socket and reads the whole response (`Connection: close`; a
/// chunked body is de-chunked).
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let connection = Connection::plain(addr, RESPONSE_TIMEOUT)?;
    send(connection, &addr.to_string(), method, path, headers, body)?.read_whole()
}

/// [`http_request`] over TLS, trusting only the CA certificates of `ca_pem` (`None` trusts none, so every
/// server is refused); the server's certificate must be for `localhost`.
pub fn https_request(
    addr: SocketAddr,
    ca_pem: Option<&str>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let connection = Connection::tls(addr, ca_pem, RESPONSE_TIMEOUT)?;
    send(connection, TLS_SERVER_NAME, method, path, headers, body)?.read_whole()
}

/// A streaming HTTP/1.1 response read as it arrives: status, then the `data` of its server-sent events one
/// at a time.
#[derive(Debug)]
pub struct EventStream {
    pub status: u16,
    body: Body,
    parser: SseParser,
    ready: VecDeque<String>,
}

impl EventStream {
    /// Sends a POST with a JSON body and reads the response head.
    pub fn post(addr: SocketAddr, path: &str, body: &str) -> std::io::Result<EventStream> {
        let connection = Connection::plain(addr, STREAM_TIMEOUT)?;
        let headers = [("Content-Type", "application/json")];
        let response = send(connection, &addr.to_string(), "POST", path, &headers, body.as_bytes())?;
        Ok(EventStream {
            status: response.status,
            body: response.body,
            parser: SseParser::default(),
            ready: VecDeque::new(),
        })
    }

    /// The next event's `data`; `None` when the stream ended (or broke) without another.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(data) = self.ready.pop_front() {
                return Some(data);
            }
            match self.body.next_piece() {
                Ok(Some(piece)) => self.ready.extend(self.parser.feed(&piece)),
                Ok(None) | Err(_) => return None,
            }
        }
    }
}

/// Server-sent events as the HTML standard reads them: lines end in `\r\n`, `\n` or `\r`; a `data` field
/// adds its value (less one leading space) to the event's data, the lines joined by `\n`; a blank line ends
/// the event, which counts only if it had data (so a comment or keep-alive is none); other fields and
/// comments are ignored, and an event the stream ends inside is dropped.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: Option<String>,
    after_cr: bool,
}

impl SseParser {
    /// Reads the next bytes of the stream; returns the data of each event they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &byte in bytes {
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                continue; // the second half of a `\r\n`
            }
            if byte == b'\r' || byte == b'\n' {
                self.after_cr = byte == b'\r';
                events.extend(self.end_line());
            } else {
                self.line.push(byte);
            }
        }
        events
    }

    /// Ends the current line: a blank one ends the event and returns its data, if it had any.
    fn end_line(&mut self) -> Option<String> {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            return self.data.take();
        }
        let line = String::from_utf8_lossy(&line);
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (&*line, ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            }
        }
        None
    }
}

/// Writes the request on `connection` and reads the response's head; its body is left to read.
fn send(
    mut connection: Connection,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    connection.write_all(head.as_bytes())?;
    connection.write_all(body)?;
    connection.flush()?;
    Response::read_head(BufReader::new(connection))
}

/// A response whose head has been read.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Body,
}

impl Response {
    fn read_head(mut reader: BufReader<Connection>) -> std::io::Result<Response> {
        let status_line = read_line(&mut reader)?.ok_or_else(|| std::io::Error::other("no status line"))?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status line: {status_line:?}")))?;
        let mut headers = Vec::new();
        loop {
            let line = read_line(&mut reader)?.ok_or_else(|| std::io::Error::other("no end of headers"))?;
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.push((name.trim().to_string(), value.trim().to_string()));
            }
        }
        let chunked = headers.iter().any(|(name, value)| {
            name.eq_ignore_ascii_case("transfer-encoding") && value.to_ascii_lowercase().contains("chunked")
        });
        Ok(Response { status, headers, body: Body { reader, chunked, ended: false } })
    }

    fn read_whole(self) -> std::io::Result<HttpResponse> {
        let body = self.body.read_to_end()?;
        Ok(HttpResponse { status: self.status, headers: self.headers, body })
    }
}

/// The body of a response, read to the end of the connection or, chunked, to its last chunk.
#[derive(Debug)]
struct Body {
    reader: BufReader<Connection>,
    chunked: bool,
    ended: bool,
}

impl Body {
    /// The next piece of the body as it arrives (a whole chunk of a chunked body); `None` at its end.
    fn next_piece(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if self.ended {
            return Ok(None);
        }
        if !self.chunked {
            let mut buffer = vec![0u8; 8192];
            let read = self.reader.read(&mut buffer)?;
            self.ended = read == 0;
            buffer.truncate(read);
            return Ok((read > 0).then_some(buffer));
        }
        let Some(size_line) = read_line(&mut self.reader)? else {
            self.ended = true;
            return Ok(None);
        };
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| std::io::Error::new(ErrorKind::InvalidData, format!("a chunk size of {size_line:?}")))?;
        if size == 0 {
            self.ended = true;
            return Ok(None);
        }
        let mut chunk = vec![0u8; size + 2];
        self.reader.read_exact(&mut chunk)?;
        chunk.truncate(size);
        Ok(Some(chunk))
    }

    /// The rest of the body. A chunked body cut short or garbled ends with its last whole chunk; any other
    /// failure to read is an error.
    fn read_to_end(mut self) -> std::io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            match self.next_piece() {
                Ok(Some(piece)) => body.extend_from_slice(&piece),
                Ok(None) => return Ok(body),
                Err(error)
                    if self.chunked && matches!(error.kind(), ErrorKind::UnexpectedEof | ErrorKind::InvalidData) =>
                {
                    return Ok(body);
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// One line without its line ending; `None` at the end of the stream.
fn read_line(reader: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    if reader.read_until(b'\n', &mut line)? == 0 {
        return Ok(None);
    }
    while line.last().is_some_and(|byte| *byte == b'\n' || *byte == b'\r') {
        line.pop();
    }
    Ok(Some(String::from_utf8_lossy(&line).into_owned()))
}

/// A connection to the server, plain or TLS.
enum Connection {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Connection {
    fn plain(addr: SocketAddr, timeout: Duration) -> std::io::Result<Connection> {
        Ok(Connection::Plain(connect(addr, timeout)?))
    }

    fn tls(addr: SocketAddr, ca_pem: Option<&str>, timeout: Duration) -> std::io::Result<Connection> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in ca_pem.map(|pem| CertificateDer::pem_slice_iter(pem.as_bytes())).into_iter().flatten() {
            roots.add(cert.map_err(std::io::Error::other)?).map_err(std::io::Error::other)?;
        }
        let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        let name = ServerName::try_from(TLS_SERVER_NAME).map_err(std::io::Error::other)?;
        let session = rustls::ClientConnection::new(Arc::new(config), name).map_err(std::io::Error::other)?;
        Ok(Connection::Tls(Box::new(rustls::StreamOwned::new(session, connect(addr, timeout)?))))
    }
}

/// A TCP connection to `addr` whose reads wait at most `timeout`.
fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(timeout))?;
    Ok(tcp)
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connection::Plain(tcp) => f.debug_tuple("Plain").field(tcp).finish(),
            Connection::Tls(stream) => f.debug_tuple("Tls").field(&stream.sock).finish(),
        }
    }
}

impl Read for Connection {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Connection::Plain(tcp) => tcp.read(buffer),
            Connection::Tls(stream) => stream.read(buffer),
        }
    }
}

impl Write for Connection {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            Connection::Plain(tcp) => tcp.write(bytes),
            Connection::Tls(stream) => stream.write(bytes),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Connection::Plain(tcp) => tcp.flush(),
            Connection::Tls(stream) => stream.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_parsed_as_the_standard_reads_them() {
        let stream =
            b": keep-alive\n\ndata: {\"a\":1}\n\ndata:first\r\ndata:  second\rid: 7\r\n\r\nevent: x\ndata\n\ndata: cut";
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        // Fed a byte at a time, as a stream may arrive, and all at once.
        for byte in stream {
            events.extend(parser.feed(&[*byte]));
        }
        let expected = ["{\"a\":1}", "first\n second", ""];
        assert_eq!(events, expected);
        assert_eq!(SseParser::default().feed(stream), expected);
    }
}
