//! A sans-I/O ZMTP 3.x client codec (ZeroMQ's wire protocol, RFC 23 and 37) with the NULL mechanism, for
//! a SUB socket on an engine's PUB and a DEALER on its replay ROUTER. Bytes read go in with
//! [`Codec::feed`], whole multipart messages come out of [`Codec::next_message`], and bytes to write are
//! taken with [`Codec::take_output`]; [`super::socket`] drives it over a TCP stream.
//!
//! The codec greets as ZMTP 3.0, so a libzmq peer speaks 3.0 to it (subscriptions as messages whose first
//! byte is 1), and accepts any 3.x peer: it answers 3.1's PING with PONG and ignores other commands
//! after the handshake. The greeting's signature padding is not checked (libzmq sends a 1 in it).
//! Frames, messages and commands are bounded by [`Limits`]; any violation of the protocol is an error,
//! after which the codec accepts nothing more.

use std::collections::VecDeque;

use thiserror::Error;

/// The greeting's length.
pub const GREETING_LEN: usize = 64;

const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;

/// The agent's end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketType {
    /// Receives what a PUB (or XPUB) sends to its subscriptions.
    Sub,
    /// Talks to a ROUTER (vLLM's replay socket): each message it sends starts with an empty frame, as a
    /// REQ's would, and any number of answers may come back.
    Dealer,
}

impl SocketType {
    pub fn name(self) -> &'static str {
        match self {
            SocketType::Sub => "SUB",
            SocketType::Dealer => "DEALER",
        }
    }

    fn accepts(self, peer: &[u8]) -> bool {
        match self {
            SocketType::Sub => matches!(peer, b"PUB" | b"XPUB"),
            SocketType::Dealer => matches!(peer, b"ROUTER" | b"DEALER" | b"REP"),
        }
    }
}

/// Size bounds of what a peer may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes in one message (all its frames).
    pub max_message_bytes: usize,
    /// Frames in one message.
    pub max_frames: usize,
    /// Bytes in one command (READY metadata, PING).
    pub max_command_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_message_bytes: 256 << 20, max_frames: 16, max_command_bytes: 64 << 10 }
    }
}

/// A multipart message: its frames in order.
pub type Message = Vec<Vec<u8>>;

/// The peer broke the protocol (or said why it gives up).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ZmtpError {
    #[error("zmtp: not a ZMTP greeting (signature)")]
    Signature,
    #[error("zmtp: peer speaks ZMTP {0}.x; 3.0 or later is needed")]
    Version(u8),
    #[error("zmtp: peer asks for security mechanism {0:?}; only NULL is supported")]
    Mechanism(String),
    #[error("zmtp: reserved frame flag bits set ({0:#04x})")]
    Flags(u8),
    #[error("zmtp: the handshake must start with READY, got {0:?}")]
    Handshake(String),
    #[error("zmtp: malformed {0} command")]
    Command(&'static str),
    #[error("zmtp: a {ours} socket cannot talk to peer socket type {peer:?}")]
    SocketType { ours: &'static str, peer: String },
    #[error("zmtp: peer sent ERROR: {0}")]
    PeerError(String),
    #[error("zmtp: a {what} of {len} bytes is over the limit of {limit}")]
    TooLarge { what: &'static str, len: u64, limit: usize },
    #[error("zmtp: a message of more than {0} frames")]
    TooManyFrames(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Greeting,
    /// Greeted; waiting for the peer's READY.
    Handshake,
    Ready,
}

/// One connection's protocol state.
#[derive(Debug)]
pub struct Codec {
    socket_type: SocketType,
    limits: Limits,
    state: State,
    failed: Option<ZmtpError>,
    input: Vec<u8>,
    output: Vec<u8>,
    /// Messages queued before the handshake finished, sent once it does.
    queued: Vec<u8>,
    partial: Message,
    partial_bytes: usize,
    messages: VecDeque<Message>,
    peer_version: Option<(u8, u8)>,
    peer_socket_type: Option<String>,
    pings: u64,
}

/// Our greeting: ZMTP 3.0, NULL, not as-server.
pub fn greeting() -> [u8; GREETING_LEN] {
    let mut out = [0u8; GREETING_LEN];
    out[0] = 0xff;
    out[8] = 0x01;
    out[9] = 0x7f;
    out[10] = 3;
    out[11] = 0;
    out[12..16].copy_from_slice(b"NULL");
    out
}

impl Codec {
    /// A new connection; its greeting is the first output.
    pub fn new(socket_type: SocketType, limits: Limits) -> Codec {
        Codec {
            socket_type,
            limits,
            state: State::Greeting,
            failed: None,
            input: Vec::new(),
            output: greeting().to_vec(),
            queued: Vec::new(),
            partial: Vec::new(),
            partial_bytes: 0,
            messages: VecDeque::new(),
            peer_version: None,
            peer_socket_type: None,
            pings: 0,
        }
    }

    /// The handshake is done: messages flow both ways.
    pub fn is_ready(&self) -> bool {
        self.state == State::Ready && self.failed.is_none()
    }

    /// The error that stopped the connection, if any.
    pub fn error(&self) -> Option<&ZmtpError> {
        self.failed.as_ref()
    }

    /// The peer's ZMTP version, once greeted.
    pub fn peer_version(&self) -> Option<(u8, u8)> {
        self.peer_version
    }

    /// The peer's `Socket-Type`, once its READY arrived.
    pub fn peer_socket_type(&self) -> Option<&str> {
        self.peer_socket_type.as_deref()
    }

    /// PINGs (ZMTP 3.1 heartbeats) answered so far.
    pub fn pings_answered(&self) -> u64 {
        self.pings
    }

    /// Bytes to write to the peer (taken: each byte is returned once).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    pub fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// Queues a multipart message (sent as soon as the handshake is done). A DEALER's message should start
    /// with an empty frame for a ROUTER that answers like a REP (vLLM's does).
    pub fn send(&mut self, frames: &[&[u8]]) {
        let target = if self.state == State::Ready { &mut self.output } else { &mut self.queued };
        for (index, frame) in frames.iter().enumerate() {
            let more = index + 1 < frames.len();
            write_frame(target, if more { MORE } else { 0 }, &[frame]);
        }
        if frames.is_empty() {
            write_frame(target, 0, &[]);
        }
    }

    /// Subscribes a SUB to messages whose first frame starts with `topic` (empty: everything), as ZMTP 3.0
    /// does: a message of the byte 1 and the topic.
    pub fn subscribe(&mut self, topic: &[u8]) {
        let mut body = Vec::with_capacity(topic.len() + 1);
        body.push(1);
        body.extend_from_slice(topic);
        self.send(&[&body]);
    }

    /// The next whole message received.
    pub fn next_message(&mut self) -> Option<Message> {
        self.messages.pop_front()
    }

    /// Takes bytes read from the peer. After an error every call returns it again.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), ZmtpError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        self.input.extend_from_slice(bytes);
        let result = self.parse();
        if let Err(error) = &result {
            self.failed = Some(error.clone());
            self.input = Vec::new();
        }
        result
    }

    fn parse(&mut self) -> Result<(), ZmtpError> {
        let mut at = 0;
        let result = loop {
            let step = match self.state {
                State::Greeting => self.greeting(at),
                _ => self.frame(at),
            };
            match step {
                Ok(Some(used)) => at += used,
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
        self.input.drain(..at);
        result
    }

    /// Reads the peer's greeting at `at`; `Some(64)` once it is whole.
    fn greeting(&mut self, at: usize) -> Result<Option<usize>, ZmtpError> {
        let input = &self.input[at..];
        if input.first().is_some_and(|&byte| byte != 0xff) || input.get(9).is_some_and(|&byte| byte & 1 != 1) {
            return Err(ZmtpError::Signature);
        }
        if let Some(&major) = input.get(10)
            && major < 3
        {
            return Err(ZmtpError::Version(major));
        }
        if input.len() < GREETING_LEN {
            return Ok(None);
        }
        let mechanism = &input[12..32];
        let name_len = mechanism.iter().position(|&byte| byte == 0).unwrap_or(mechanism.len());
        if &mechanism[..name_len] != b"NULL" || mechanism[name_len..].iter().any(|&byte| byte != 0) {
            return Err(ZmtpError::Mechanism(String::from_utf8_lossy(&mechanism[..name_len]).into_owned()));
        }
        self.peer_version = Some((input[10], input[11]));
        self.state = State::Handshake;
        let ready = ready_body(self.socket_type);
        write_frame(&mut self.output, COMMAND, &[&ready]);
        Ok(Some(GREETING_LEN))
    }

    /// Reads one frame at `at`; `None` until it is whole.
    fn frame(&mut self, at: usize) -> Result<Option<usize>, ZmtpError> {
        let input = &self.input[at..];
        let Some(&flags) = input.first() else { return Ok(None) };
        if flags & !(MORE | LONG | COMMAND) != 0 {
            return Err(ZmtpError::Flags(flags));
        }
        let (header, len) = if flags & LONG != 0 {
            let Some(size) = input.get(1..9) else { return Ok(None) };
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(size);
            (9, u64::from_be_bytes(bytes))
        } else {
            let Some(&size) = input.get(1) else { return Ok(None) };
            (2, u64::from(size))
        };
        let command = flags & COMMAND != 0;
        let (what, limit) = if command {
            ("command", self.limits.max_command_bytes)
        } else {
            ("message", self.limits.max_message_bytes.saturating_sub(self.partial_bytes))
        };
        let body_len = usize::try_from(len).ok().filter(|&len| len <= limit);
        let Some(body_len) = body_len else { return Err(ZmtpError::TooLarge { what, len, limit }) };
        let Some(body) = input.get(header..header + body_len) else { return Ok(None) };
        let body = body.to_vec();
        if command {
            self.command(&body)?;
        } else {
            self.message_frame(body, flags & MORE != 0)?;
        }
        Ok(Some(header + body_len))
    }

    fn command(&mut self, body: &[u8]) -> Result<(), ZmtpError> {
        let Some((&name_len, rest)) = body.split_first() else { return Err(ZmtpError::Command("unnamed")) };
        let Some(name) = rest.get(..usize::from(name_len)) else { return Err(ZmtpError::Command("unnamed")) };
        let data = &rest[usize::from(name_len)..];
        match (self.state, name) {
            (_, b"ERROR") => {
                let reason = data.split_first().map(|(&len, text)| &text[..usize::from(len).min(text.len())]);
                Err(ZmtpError::PeerError(String::from_utf8_lossy(reason.unwrap_or_default()).into_owned()))
            }
            (State::Handshake, b"READY") => {
                let peer = ready_socket_type(data)?;
                if !self.socket_type.accepts(&peer) {
                    return Err(ZmtpError::SocketType {
                        ours: self.socket_type.name(),
                        peer: String::from_utf8_lossy(&peer).into_owned(),
                    });
                }
                self.peer_socket_type = Some(String::from_utf8_lossy(&peer).into_owned());
                self.state = State::Ready;
                let queued = std::mem::take(&mut self.queued);
                self.output.extend_from_slice(&queued);
                Ok(())
            }
            (State::Handshake, other) => Err(ZmtpError::Handshake(String::from_utf8_lossy(other).into_owned())),
            (_, b"PING") => {
                // ping-ttl (2 bytes), then a context of at most 16 bytes the PONG echoes.
                let Some(context) = data.get(2..) else { return Err(ZmtpError::Command("PING")) };
                let context = &context[..context.len().min(16)];
                let mut pong = vec![4];
                pong.extend_from_slice(b"PONG");
                pong.extend_from_slice(context);
                write_frame(&mut self.output, COMMAND, &[&pong]);
                self.pings += 1;
                Ok(())
            }
            // PONG, SUBSCRIBE, CANCEL, a repeated READY, commands of later versions: nothing to do.
            _ => Ok(()),
        }
    }

    fn message_frame(&mut self, body: Vec<u8>, more: bool) -> Result<(), ZmtpError> {
        if self.state != State::Ready {
            return Err(ZmtpError::Handshake("a message".into()));
        }
        if self.partial.len() >= self.limits.max_frames {
            return Err(ZmtpError::TooManyFrames(self.limits.max_frames));
        }
        self.partial_bytes += body.len();
        self.partial.push(body);
        if !more {
            self.partial_bytes = 0;
            self.messages.push_back(std::mem::take(&mut self.partial));
        }
        Ok(())
    }
}

/// READY's body: its name and the `Socket-Type` property.
fn ready_body(socket_type: SocketType) -> Vec<u8> {
    let name = socket_type.name().as_bytes();
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(name.len() as u32).to_be_bytes());
    body.extend_from_slice(name);
    body
}

/// The `Socket-Type` of a READY's metadata (other properties, such as `Identity`, are skipped).
fn ready_socket_type(mut metadata: &[u8]) -> Result<Vec<u8>, ZmtpError> {
    let mut socket_type = None;
    while let Some((&name_len, rest)) = metadata.split_first() {
        let name_len = usize::from(name_len);
        let (Some(name), Some(size)) = (rest.get(..name_len), rest.get(name_len..name_len + 4)) else {
            return Err(ZmtpError::Command("READY"));
        };
        let mut size_bytes = [0u8; 4];
        size_bytes.copy_from_slice(size);
        let value_len = u32::from_be_bytes(size_bytes) as usize;
        let start = name_len + 4;
        let Some(value) = start.checked_add(value_len).and_then(|end| rest.get(start..end)) else {
            return Err(ZmtpError::Command("READY"));
        };
        if name.eq_ignore_ascii_case(b"Socket-Type") {
            socket_type = Some(value.to_vec());
        }
        metadata = &rest[start + value_len..];
    }
    socket_type.ok_or(ZmtpError::Command("READY"))
}

/// Appends one frame of `parts` (concatenated) with `flags` (LONG is added when needed).
fn write_frame(out: &mut Vec<u8>, flags: u8, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|part| part.len()).sum();
    if let Ok(short) = u8::try_from(len) {
        out.extend_from_slice(&[flags, short]);
    } else {
        out.push(flags | LONG);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    parts.iter().for_each(|part| out.extend_from_slice(part));
}

/// The bytes a peer sends: its greeting (ZMTP `version`, NULL) and READY with `socket_type`. For tests
/// and fuzz seeds, which play the engine's side.
pub fn peer_handshake(version: (u8, u8), socket_type: &str) -> Vec<u8> {
    let mut out = greeting().to_vec();
    out[10] = version.0;
    out[11] = version.1;
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    write_frame(&mut out, COMMAND, &[&body]);
    out
}

/// The bytes of a multipart message as a peer sends it. For tests and fuzz seeds.
pub fn message_bytes(frames: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (index, frame) in frames.iter().enumerate() {
        write_frame(&mut out, if index + 1 < frames.len() { MORE } else { 0 }, &[frame]);
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// READY's frame as this codec sends it for `socket_type`.
    fn ready_frame(socket_type: SocketType) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, COMMAND, &[&ready_body(socket_type)]);
        out
    }

    fn command(name: &[u8], data: &[u8]) -> Vec<u8> {
        let mut body = vec![name.len() as u8];
        body.extend_from_slice(name);
        body.extend_from_slice(data);
        let mut out = Vec::new();
        write_frame(&mut out, COMMAND, &[&body]);
        out
    }

    fn ready_sub() -> Codec {
        let mut codec = Codec::new(SocketType::Sub, Limits::default());
        codec.feed(&peer_handshake((3, 1), "PUB")).unwrap();
        assert!(codec.is_ready());
        codec.take_output();
        codec
    }

    #[test]
    fn sub_handshake_byte_by_byte_then_subscription() {
        let mut codec = Codec::new(SocketType::Sub, Limits::default());
        let greeting = codec.take_output();
        assert_eq!(greeting.len(), GREETING_LEN);
        assert_eq!(&greeting[..12], &[0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0]);
        assert_eq!(&greeting[12..16], b"NULL");
        codec.subscribe(b"");
        let peer = peer_handshake((3, 1), "PUB");
        for (index, byte) in peer.iter().enumerate() {
            codec.feed(&[*byte]).unwrap();
            if index + 1 == GREETING_LEN {
                assert_eq!(codec.take_output(), ready_frame(SocketType::Sub), "READY follows the peer's greeting");
                assert_eq!(codec.peer_version(), Some((3, 1)));
            }
            assert_eq!(codec.is_ready(), index + 1 == peer.len());
        }
        assert_eq!(codec.peer_socket_type(), Some("PUB"));
        // The subscription waited for the handshake: a one-frame message [1] (all topics).
        assert_eq!(codec.take_output(), vec![0x00, 0x01, 0x01]);
        codec.subscribe(b"kv");
        assert_eq!(codec.take_output(), vec![0x00, 0x03, 0x01, b'k', b'v']);
    }

    #[test]
    fn multipart_messages_short_and_long_frames() {
        let mut codec = ready_sub();
        let payload = vec![7u8; 70_000];
        let seq = 5u64.to_be_bytes();
        let mut bytes = message_bytes(&[b"topic", &seq, &payload]);
        bytes.extend(message_bytes(&[b""]));
        bytes.extend(message_bytes(&[b"a", b"b"]));
        let (first, second) = bytes.split_at(1000);
        codec.feed(first).unwrap();
        assert_eq!(codec.next_message(), None);
        codec.feed(second).unwrap();
        assert_eq!(codec.next_message(), Some(vec![b"topic".to_vec(), seq.to_vec(), payload]));
        assert_eq!(codec.next_message(), Some(vec![Vec::new()]));
        assert_eq!(codec.next_message(), Some(vec![b"a".to_vec(), b"b".to_vec()]));
        assert_eq!(codec.next_message(), None);
        assert!(!codec.has_output());
    }

    #[test]
    fn ping_gets_pong_and_other_commands_are_ignored() {
        let mut codec = ready_sub();
        codec.feed(&command(b"PING", &[0, 10, b'c', b't', b'x'])).unwrap();
        assert_eq!(codec.take_output(), command(b"PONG", b"ctx"));
        assert_eq!(codec.pings_answered(), 1);
        codec.feed(&command(b"PONG", b"x")).unwrap();
        codec.feed(&command(b"SUBSCRIBE", b"t")).unwrap();
        codec.feed(&command(b"FUTURE", b"")).unwrap();
        assert!(!codec.has_output());
        assert!(codec.is_ready());
    }

    #[test]
    fn dealer_queues_messages_until_ready() {
        let mut codec = Codec::new(SocketType::Dealer, Limits::default());
        codec.take_output();
        codec.send(&[b"", &3u64.to_be_bytes()]);
        assert!(!codec.has_output(), "nothing but the greeting before the handshake");
        codec.feed(&peer_handshake((3, 0), "ROUTER")).unwrap();
        let mut expected = ready_frame(SocketType::Dealer);
        expected.extend(message_bytes(&[b"", &3u64.to_be_bytes()]));
        assert_eq!(codec.take_output(), expected);
        codec.send(&[]);
        assert_eq!(codec.take_output(), vec![0, 0], "an empty message is one empty frame");
    }

    #[test]
    fn ready_metadata_may_carry_other_properties() {
        let mut codec = Codec::new(SocketType::Dealer, Limits::default());
        let mut peer = greeting().to_vec();
        let mut metadata = vec![8];
        metadata.extend_from_slice(b"Identity");
        metadata.extend_from_slice(&2u32.to_be_bytes());
        metadata.extend_from_slice(b"id");
        metadata.push(11);
        metadata.extend_from_slice(b"socket-type");
        metadata.extend_from_slice(&6u32.to_be_bytes());
        metadata.extend_from_slice(b"ROUTER");
        peer.extend(command(b"READY", &metadata));
        codec.feed(&peer).unwrap();
        assert_eq!(codec.peer_socket_type(), Some("ROUTER"));
    }

    #[test]
    fn protocol_violations_are_errors_and_stick() {
        let handshake = |peer: &str| peer_handshake((3, 0), peer);
        let mut bad_mechanism = greeting().to_vec();
        bad_mechanism[12..17].copy_from_slice(b"PLAIN");
        let mut long_mechanism = greeting().to_vec();
        long_mechanism[16] = b'X';
        let mut v2 = greeting().to_vec();
        v2[10] = 2;
        let ready_then = |bytes: &[u8]| [handshake("PUB"), bytes.to_vec()].concat();
        let cases: Vec<(SocketType, Vec<u8>, ZmtpError)> = vec![
            (SocketType::Sub, b"GET / HTTP/1.1\r\n".to_vec(), ZmtpError::Signature),
            (SocketType::Sub, v2, ZmtpError::Version(2)),
            (SocketType::Sub, bad_mechanism, ZmtpError::Mechanism("PLAIN".into())),
            (SocketType::Sub, long_mechanism, ZmtpError::Mechanism("NULLX".into())),
            (SocketType::Sub, handshake("ROUTER"), ZmtpError::SocketType { ours: "SUB", peer: "ROUTER".into() }),
            (SocketType::Dealer, handshake("PUB"), ZmtpError::SocketType { ours: "DEALER", peer: "PUB".into() }),
            (
                SocketType::Sub,
                [greeting().to_vec(), command(b"ERROR", b"\x04nope")].concat(),
                ZmtpError::PeerError("nope".into()),
            ),
            (
                SocketType::Sub,
                [greeting().to_vec(), command(b"PING", b"\0\0")].concat(),
                ZmtpError::Handshake("PING".into()),
            ),
            (
                SocketType::Sub,
                [greeting().to_vec(), message_bytes(&[b"early"])].concat(),
                ZmtpError::Handshake("a message".into()),
            ),
            (SocketType::Sub, [greeting().to_vec(), command(b"READY", b"")].concat(), ZmtpError::Command("READY")),
            (
                SocketType::Sub,
                [greeting().to_vec(), command(b"READY", b"\x0bSocket-Type\0\0\0\x09PUB")].concat(),
                ZmtpError::Command("READY"),
            ),
            (SocketType::Sub, ready_then(&[0x08, 0x00]), ZmtpError::Flags(0x08)),
            (SocketType::Sub, ready_then(&command(b"PING", b"\0")), ZmtpError::Command("PING")),
            (SocketType::Sub, ready_then(&[0x04, 0x00]), ZmtpError::Command("unnamed")),
            (
                SocketType::Sub,
                ready_then(&[0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
                ZmtpError::TooLarge { what: "message", len: u64::MAX, limit: 256 << 20 },
            ),
        ];
        for (index, (socket_type, bytes, expected)) in cases.into_iter().enumerate() {
            let mut codec = Codec::new(socket_type, Limits::default());
            assert_eq!(codec.feed(&bytes), Err(expected.clone()), "case {index}");
            assert_eq!(codec.feed(&[]), Err(expected.clone()), "case {index}: the error sticks");
            assert_eq!(codec.error(), Some(&expected));
            assert!(!codec.is_ready());
        }
    }

    #[test]
    fn limits_bound_messages_and_commands() {
        let limits = Limits { max_message_bytes: 10, max_frames: 2, max_command_bytes: 40 };
        let mut codec = Codec::new(SocketType::Sub, limits);
        codec.feed(&peer_handshake((3, 0), "PUB")).unwrap();
        codec.feed(&message_bytes(&[b"12345", b"12345"])).unwrap();
        assert_eq!(codec.next_message().map(|message| message.len()), Some(2));
        assert_eq!(
            codec.feed(&message_bytes(&[b"123456", b"12345"])),
            Err(ZmtpError::TooLarge { what: "message", len: 5, limit: 4 })
        );
        let mut codec = Codec::new(SocketType::Sub, limits);
        codec.feed(&peer_handshake((3, 0), "PUB")).unwrap();
        assert_eq!(codec.feed(&message_bytes(&[b"1", b"2", b"3"])), Err(ZmtpError::TooManyFrames(2)));
        let mut codec = Codec::new(SocketType::Sub, limits);
        codec.feed(&peer_handshake((3, 0), "PUB")).unwrap();
        assert_eq!(
            codec.feed(&command(b"PING", &[0; 50])),
            Err(ZmtpError::TooLarge { what: "command", len: 55, limit: 40 })
        );
    }

    proptest! {
        /// However the bytes are cut, the same messages come out.
        #[test]
        fn chunking_does_not_matter(
            frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..400), 1..6),
            cuts in proptest::collection::vec(1usize..300, 0..40),
        ) {
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            let mut stream = peer_handshake((3, 1), "XPUB");
            stream.extend(command(b"PING", b"\0\x01ab"));
            stream.extend(message_bytes(&refs));
            stream.extend(message_bytes(&refs));
            let mut codec = Codec::new(SocketType::Sub, Limits::default());
            let mut rest = stream.as_slice();
            for cut in cuts {
                let (head, tail) = rest.split_at(cut.min(rest.len()));
                codec.feed(head).unwrap();
                rest = tail;
            }
            codec.feed(rest).unwrap();
            prop_assert_eq!(codec.next_message(), Some(frames.clone()));
            prop_assert_eq!(codec.next_message(), Some(frames));
            prop_assert_eq!(codec.next_message(), None);
        }
    }
}
