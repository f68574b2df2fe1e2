//! Plain TCP connections to one standalone Redis, pooled, running pipelines of [`resp`] commands. Built for
//! large values: a value is copied once into the request buffer, and a bulk reply is read straight into its
//! own allocation. A connection whose pipeline fails or is abandoned (a timeout drops the future) is closed,
//! never reused in an unknown state.

use std::sync::Mutex;

use redis::{ConnectionAddr, IntoConnectionInfo};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::resp::{self, Header, Op, Reply, RespError};

/// Idle connections kept for reuse.
const MAX_IDLE: usize = 8;
/// Initial size of a connection's read buffer.
const READ_BUFFER: usize = 64 * 1024;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Protocol(#[from] RespError),
    #[error("redis refused a command: {0}")]
    Refused(String),
    #[error("invalid Redis URL: {0}")]
    Url(String),
}

/// Where the server is and how to log in.
pub struct RespPool {
    host: String,
    port: u16,
    login: Vec<Op>,
    /// Longest bulk reply accepted.
    max_bulk: usize,
    idle: Mutex<Vec<Connection>>,
}

impl RespPool {
    /// A pool for `redis://[user:password@]host[:port][/db]`; connects lazily.
    pub fn from_url(url: &str, max_bulk: usize) -> Result<RespPool, ClientError> {
        let info = url.into_connection_info().map_err(|error| ClientError::Url(error.to_string()))?;
        let (host, port) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
            other => return Err(ClientError::Url(format!("only redis:// over TCP is supported, not {other:?}"))),
        };
        let settings = info.redis_settings();
        let mut login = Vec::new();
        if let Some(password) = settings.password() {
            login.push(Op::Auth { username: settings.username().map(str::to_string), password: password.to_string() });
        }
        if settings.db() != 0 {
            login.push(Op::Select(settings.db()));
        }
        Ok(RespPool { host, port, login, max_bulk, idle: Mutex::new(Vec::new()) })
    }

    /// Runs `ops` as one pipeline; the replies come back in order. A server error reply to any command is
    /// [`ClientError::Refused`].
    pub async fn run(&self, ops: &[Op]) -> Result<Vec<Reply>, ClientError> {
        refused(self.run_replies(ops).await?)
    }

    /// Runs `ops` as one pipeline; the replies come back in order, server errors among them.
    pub async fn run_replies(&self, ops: &[Op]) -> Result<Vec<Reply>, ClientError> {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let mut connection = match idle {
            Some(connection) => connection,
            None => self.connect().await?,
        };
        let replies = connection.pipeline(ops, self.max_bulk).await?;
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(connection);
        }
        Ok(replies)
    }

    /// The server's host and port.
    pub fn address(&self) -> (&str, u16) {
        (&self.host, self.port)
    }

    /// A pool for another server with this one's login and reply limit (a cluster's other nodes).
    pub fn at(&self, host: &str, port: u16) -> RespPool {
        RespPool {
            host: host.to_string(),
            port,
            login: self.login.clone(),
            max_bulk: self.max_bulk,
            idle: Mutex::new(Vec::new()),
        }
    }

    async fn connect(&self) -> Result<Connection, ClientError> {
        let stream = TcpStream::connect((self.host.as_str(), self.port)).await?;
        stream.set_nodelay(true)?;
        let mut connection = Connection { stream, buf: vec![0; READ_BUFFER], start: 0, end: 0 };
        if !self.login.is_empty() {
            refused(connection.pipeline(&self.login, self.max_bulk).await?)?;
        }
        Ok(connection)
    }
}

/// `replies`, or [`ClientError::Refused`] with the first server error among them.
pub fn refused(replies: Vec<Reply>) -> Result<Vec<Reply>, ClientError> {
    match replies.iter().find_map(|reply| if let Reply::Error(text) = reply { Some(text) } else { None }) {
        Some(text) => Err(ClientError::Refused(text.clone())),
        None => Ok(replies),
    }
}

struct Connection {
    stream: TcpStream,
    /// Bytes read and not parsed yet are `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Connection {
    async fn pipeline(&mut self, ops: &[Op], max_bulk: usize) -> Result<Vec<Reply>, ClientError> {
        let mut request = Vec::with_capacity(resp::encoded_len_hint(ops));
        resp::encode(ops, &mut request);
        self.stream.write_all(&request).await?;
        let mut replies = Vec::with_capacity(ops.len());
        for op in ops {
            let split = match op {
                Op::GetSplit { head_len, .. } => Some(*head_len),
                _ => None,
            };
            replies.push(self.read_reply(max_bulk, split).await?);
        }
        Ok(replies)
    }

    /// The next reply; a bulk string is split after `split` bytes when given ([`Reply::Split`]).
    async fn read_reply(&mut self, max_bulk: usize, split: Option<usize>) -> Result<Reply, ClientError> {
        loop {
            let Some((header, used)) = resp::parse_header(&self.buf[self.start..self.end], max_bulk)? else {
                self.fill().await?;
                continue;
            };
            self.start += used;
            return Ok(match (header, split) {
                (Header::Status(text), _) => Reply::Status(text),
                (Header::Error(text), _) => Reply::Error(text),
                (Header::Integer(value), _) => Reply::Integer(value),
                (Header::Nil, None) => Reply::Bulk(None),
                (Header::Nil, Some(_)) => Reply::Split(None),
                (Header::Bulk(len), None) => Reply::Bulk(Some(self.read_bulk(len, 0).await?.1)),
                (Header::Bulk(len), Some(head_len)) => Reply::Split(Some(self.read_bulk(len, head_len).await?)),
            });
        }
    }

    /// The `len` bytes of a bulk string (its first `head_len` bytes and the rest, each in its own allocation),
    /// then its CRLF: what is buffered, then the rest read directly.
    async fn read_bulk(&mut self, len: usize, head_len: usize) -> Result<(Vec<u8>, Vec<u8>), ClientError> {
        let head_len = head_len.min(len);
        let mut head = Vec::with_capacity(head_len);
        self.read_into(&mut head, head_len).await?;
        let rest = len - head_len;
        let mut body = Vec::with_capacity(rest + 2);
        self.read_into(&mut body, rest + 2).await?;
        if body[rest..] != *b"\r\n" {
            return Err(RespError::Malformed("bulk string does not end with CRLF".into()).into());
        }
        body.truncate(rest);
        Ok((head, body))
    }

    /// Appends exactly `count` bytes to `out`: what is buffered, then straight from the socket.
    async fn read_into(&mut self, out: &mut Vec<u8>, count: usize) -> Result<(), ClientError> {
        let buffered = count.min(self.end - self.start);
        out.extend_from_slice(&self.buf[self.start..self.start + buffered]);
        self.start += buffered;
        let target = out.len() + (count - buffered);
        while out.len() < target {
            let missing = (target - out.len()) as u64;
            if (&mut self.stream).take(missing).read_buf(out).await? == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
        }
        Ok(())
    }

    /// Reads more bytes into the buffer, first moving unparsed bytes to its front.
    async fn fill(&mut self) -> Result<(), ClientError> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            // parse_header refuses lines longer than resp::MAX_LINE, so this stays bounded.
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let read = self.stream.read(&mut self.buf[self.end..]).await?;
        if read == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        self.end += read;
        Ok(())
    }
}
