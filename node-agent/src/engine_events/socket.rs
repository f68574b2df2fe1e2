//! A blocking ZMTP connection over [`std::net::TcpStream`]: the thin shell that drives a
//! [`zmtp::Codec`] from a thread of the agent, with a read timeout so that thread can look up between
//! messages (to stop, or to ask the replay socket for what it missed).
//!
//! Unlike libzmq it does not reconnect by itself: when [`ZmtpSocket::recv`] fails, the caller connects
//! again (and resubscribes, which a new SUB connection needs anyway).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::zmtp::{Codec, Limits, Message, SocketType, ZmtpError};

/// How a connection waits.
#[derive(Clone, Copy, Debug)]
pub struct SocketOptions {
    /// For the TCP connection and, again, for the greeting and READY exchange.
    pub connect_timeout: Duration,
    /// [`ZmtpSocket::recv`] returns `Ok(None)` after this long without a whole message.
    pub read_timeout: Duration,
    pub limits: Limits,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_millis(500),
            limits: Limits::default(),
        }
    }
}

#[derive(Debug, Error)]
pub enum SocketError {
    #[error("zmtp endpoint {0:?}: expected tcp://HOST:PORT")]
    Endpoint(String),
    #[error("zmtp connection: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Protocol(#[from] ZmtpError),
    #[error("zmtp: the peer closed the connection")]
    Closed,
    #[error("zmtp: no handshake within {0:?}")]
    HandshakeTimeout(Duration),
}

/// `HOST:PORT` of a ZeroMQ `tcp://` endpoint; the wildcard host a publisher binds (`tcp://*:5557`) is
/// this machine's loopback.
pub fn tcp_address(endpoint: &str) -> Result<String, SocketError> {
    let bad = || SocketError::Endpoint(endpoint.to_string());
    let rest = endpoint.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    let host = match host {
        "*" | "0.0.0.0" => "127.0.0.1",
        "[::]" | "[*]" => "[::1]",
        host => host,
    };
    Ok(format!("{host}:{port}"))
}

/// One connection, handshaken.
#[derive(Debug)]
pub struct ZmtpSocket {
    stream: TcpStream,
    codec: Codec,
    options: SocketOptions,
    buffer: Vec<u8>,
}

impl ZmtpSocket {
    /// Connects to `address` (`HOST:PORT`) as `socket_type` and completes the handshake.
    pub fn connect(address: &str, socket_type: SocketType, options: SocketOptions) -> Result<ZmtpSocket, SocketError> {
        let mut last_error = None;
        let mut stream = None;
        for candidate in address.to_socket_addrs()? {
            match TcpStream::connect_timeout(&candidate, options.connect_timeout) {
                Ok(connected) => {
                    stream = Some(connected);
                    break;
                }
                Err(error) => last_error = Some(error),
            }
        }
        let Some(stream) = stream else {
            return Err(last_error
                .unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{address} resolves to nothing")))
                .into());
        };
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(options.connect_timeout))?;
        let mut socket =
            ZmtpSocket { stream, codec: Codec::new(socket_type, options.limits), options, buffer: vec![0; 64 << 10] };
        socket.flush()?;
        let deadline = Instant::now() + options.connect_timeout;
        while !socket.codec.is_ready() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SocketError::HandshakeTimeout(options.connect_timeout));
            }
            socket.stream.set_read_timeout(Some(left))?;
            if !socket.read_some()? {
                return Err(SocketError::HandshakeTimeout(options.connect_timeout));
            }
        }
        socket.stream.set_read_timeout(Some(options.read_timeout.max(Duration::from_millis(1))))?;
        Ok(socket)
    }

    /// The peer's `Socket-Type`.
    pub fn peer_socket_type(&self) -> Option<&str> {
        self.codec.peer_socket_type()
    }

    /// PINGs (heartbeats) of the peer answered so far.
    pub fn pings_answered(&self) -> u64 {
        self.codec.pings_answered()
    }

    /// Subscribes (a SUB) to messages whose first frame starts with `topic`; empty: everything.
    pub fn subscribe(&mut self, topic: &[u8]) -> Result<(), SocketError> {
        self.codec.subscribe(topic);
        self.flush()
    }

    /// Sends a multipart message.
    pub fn send(&mut self, frames: &[&[u8]]) -> Result<(), SocketError> {
        self.codec.send(frames);
        self.flush()
    }

    /// The next message; `Ok(None)` when none arrived within the read timeout.
    pub fn recv(&mut self) -> Result<Option<Message>, SocketError> {
        let deadline = Instant::now() + self.options.read_timeout;
        loop {
            if let Some(message) = self.codec.next_message() {
                return Ok(Some(message));
            }
            if Instant::now() >= deadline || !self.read_some()? {
                return Ok(None);
            }
        }
    }

    /// Reads what is there into the codec (answering PINGs); `false` on a read timeout.
    fn read_some(&mut self) -> Result<bool, SocketError> {
        match self.stream.read(&mut self.buffer) {
            Ok(0) => Err(SocketError::Closed),
            Ok(read) => {
                self.codec.feed(&self.buffer[..read])?;
                self.flush()?;
                Ok(true)
            }
            Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(false),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(error) => Err(error.into()),
        }
    }

    fn flush(&mut self) -> Result<(), SocketError> {
        if self.codec.has_output() {
            let output = self.codec.take_output();
            self.stream.write_all(&output)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::super::zmtp::{message_bytes, peer_handshake};
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(tcp_address("tcp://127.0.0.1:5557").unwrap(), "127.0.0.1:5557");
        assert_eq!(tcp_address("tcp://*:5557").unwrap(), "127.0.0.1:5557");
        assert_eq!(tcp_address("tcp://0.0.0.0:1").unwrap(), "127.0.0.1:1");
        assert_eq!(tcp_address("tcp://[::]:5557").unwrap(), "[::1]:5557");
        assert_eq!(tcp_address("tcp://engine-0.local:5557").unwrap(), "engine-0.local:5557");
        for bad in ["ipc:///tmp/x", "tcp://host", "tcp://:5557", "tcp://h:port", "tcp://h:70000"] {
            assert!(matches!(tcp_address(bad), Err(SocketError::Endpoint(_))), "{bad}");
        }
    }

    /// A peer on a loopback port that greets as a PUB, reads our greeting, READY and subscription, then
    /// sends `after` and closes.
    fn peer(after: Vec<u8>) -> (String, std::thread::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let thread = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            stream.write_all(&peer_handshake((3, 1), "PUB")).unwrap();
            // Greeting (64), READY (2 + 25), the subscription [1, b'k'] (2 + 2).
            let mut received = vec![0; 64 + 27 + 4];
            stream.read_exact(&mut received).unwrap();
            stream.write_all(&after).unwrap();
            received
        });
        (address, thread)
    }

    #[test]
    fn connects_receives_times_out_and_sees_the_close() {
        let (address, peer) = peer(message_bytes(&[b"k", &1u64.to_be_bytes(), b"payload"]));
        let options = SocketOptions { read_timeout: Duration::from_millis(50), ..SocketOptions::default() };
        let mut socket = ZmtpSocket::connect(&address, SocketType::Sub, options).unwrap();
        assert_eq!(socket.peer_socket_type(), Some("PUB"));
        socket.subscribe(b"k").unwrap();
        let received = peer.join().unwrap();
        assert_eq!(&received[..10], &[0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f]);
        assert_eq!(&received[received.len() - 4..], &[0, 2, 1, b'k']);
        let message = socket.recv().unwrap().unwrap();
        assert_eq!(message[2], b"payload");
        // The peer closed: the next read says so (or times out first, then says so).
        let error = loop {
            match socket.recv() {
                Ok(None) => continue,
                Ok(Some(message)) => panic!("unexpected {message:?}"),
                Err(error) => break error,
            }
        };
        assert!(matches!(error, SocketError::Closed | SocketError::Io(_)), "{error}");
    }

    #[test]
    fn a_peer_that_never_greets_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let options = SocketOptions { connect_timeout: Duration::from_millis(200), ..SocketOptions::default() };
        let error = ZmtpSocket::connect(&address, SocketType::Dealer, options).unwrap_err();
        assert!(matches!(error, SocketError::HandshakeTimeout(_)), "{error}");
        drop(listener);
    }

    #[test]
    fn a_peer_that_is_no_zmtp_peer_is_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let thread = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
        });
        let error = ZmtpSocket::connect(&address, SocketType::Sub, SocketOptions::default()).unwrap_err();
        assert!(matches!(error, SocketError::Protocol(ZmtpError::Signature)), "{error}");
        thread.join().unwrap();
    }
}
