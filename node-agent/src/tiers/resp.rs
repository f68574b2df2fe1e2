//! The Redis protocol (RESP2) for the network tier's few commands: encoding a pipeline of them, and parsing
//! reply headers. Pure functions over bytes (no I/O), so they are unit-tested and fuzzable; the connection
//! that uses them is `resp_client`, and `resp_cluster` routes them over a Redis Cluster.

use std::sync::Arc;

use thiserror::Error;

/// One command of the network tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Get(String),
    /// A GET whose value comes back as [`Reply::Split`]: its first `head_len` bytes and the rest, each in its
    /// own allocation (a block record's header and payload, so the payload needs no move).
    GetSplit {
        key: String,
        head_len: usize,
    },
    /// SET of the value `head` followed by `body` (shared, so large values are not copied to build the
    /// command), with an optional expiry in seconds.
    Set {
        key: String,
        head: Vec<u8>,
        body: Arc<Vec<u8>>,
        ttl_seconds: Option<u64>,
    },
    Del(String),
    Ping,
    Auth {
        username: Option<String>,
        password: String,
    },
    Select(i64),
    /// Lets the next command reach a slot being migrated to this node (after an `-ASK` redirection).
    Asking,
}

/// A reply, as the tier uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`, `+PONG`, ...
    Status(String),
    Integer(i64),
    /// A bulk string; `None` for the nil reply (a missing key).
    Bulk(Option<Vec<u8>>),
    /// The value of an [`Op::GetSplit`] as (head, rest); `None` for a missing key.
    Split(Option<(Vec<u8>, Vec<u8>)>),
    /// `-ERR ...`: the server refused this command.
    Error(String),
}

/// The first line of a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Header {
    Status(String),
    Error(String),
    Integer(i64),
    /// A bulk string of this many bytes follows (then CRLF).
    Bulk(usize),
    Nil,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RespError {
    #[error("reply line longer than {MAX_LINE} bytes")]
    LineTooLong,
    #[error("malformed reply: {0}")]
    Malformed(String),
    #[error("unexpected reply type {0:?}")]
    UnexpectedType(char),
    #[error("bulk reply of {0} bytes exceeds the limit of {1}")]
    TooLarge(usize, usize),
}

/// Longest reply line accepted (status and error texts are short).
pub const MAX_LINE: usize = 64 * 1024;

/// Appends `ops` to `buf` as RESP arrays of bulk strings.
pub fn encode(ops: &[Op], buf: &mut Vec<u8>) {
    for op in ops {
        match op {
            Op::Get(key) | Op::GetSplit { key, .. } => command(buf, &[b"GET", key.as_bytes()]),
            Op::Set { key, head, body, ttl_seconds } => {
                let ttl = ttl_seconds.map(|ttl| ttl.to_string());
                let args = if ttl.is_some() { 5 } else { 3 };
                buf.extend_from_slice(format!("*{args}\r\n").as_bytes());
                argument(buf, &[b"SET"]);
                argument(buf, &[key.as_bytes()]);
                argument(buf, &[head, body]);
                if let Some(ttl) = ttl {
                    argument(buf, &[b"EX"]);
                    argument(buf, &[ttl.as_bytes()]);
                }
            }
            Op::Del(key) => command(buf, &[b"DEL", key.as_bytes()]),
            Op::Ping => command(buf, &[b"PING"]),
            Op::Auth { username: Some(user), password } => {
                command(buf, &[b"AUTH", user.as_bytes(), password.as_bytes()])
            }
            Op::Auth { username: None, password } => command(buf, &[b"AUTH", password.as_bytes()]),
            Op::Select(db) => command(buf, &[b"SELECT", db.to_string().as_bytes()]),
            Op::Asking => command(buf, &[b"ASKING"]),
        }
    }
}

/// About the bytes [`encode`] appends for `ops` (exact up to the few bytes of each length prefix), so the
/// request buffer is allocated once.
pub fn encoded_len_hint(ops: &[Op]) -> usize {
    ops.iter()
        .map(|op| match op {
            Op::Set { key, head, body, .. } => 64 + key.len() + head.len() + body.len(),
            Op::Get(key) | Op::GetSplit { key, .. } | Op::Del(key) => 32 + key.len(),
            Op::Auth { username, password } => 48 + username.as_ref().map_or(0, String::len) + password.len(),
            Op::Ping | Op::Select(_) | Op::Asking => 48,
        })
        .sum()
}

fn command(buf: &mut Vec<u8>, args: &[&[u8]]) {
    buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        argument(buf, &[arg]);
    }
}

/// One bulk-string argument made of `parts` laid end to end.
fn argument(buf: &mut Vec<u8>, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|part| part.len()).sum();
    buf.extend_from_slice(format!("${len}\r\n").as_bytes());
    for part in parts {
        buf.extend_from_slice(part);
    }
    buf.extend_from_slice(b"\r\n");
}

/// Parses the reply header at the start of `buf`: `Ok(None)` when the line is not complete yet, otherwise
/// the header and the bytes it took (including CRLF). Bulk lengths above `max_bulk` are refused.
pub fn parse_header(buf: &[u8], max_bulk: usize) -> Result<Option<(Header, usize)>, RespError> {
    let Some(end) = buf.iter().take(MAX_LINE + 2).position(|&b| b == b'\n') else {
        return if buf.len() > MAX_LINE + 1 { Err(RespError::LineTooLong) } else { Ok(None) };
    };
    if end < 2 {
        return Err(RespError::Malformed("empty reply line".into()));
    }
    if buf[end - 1] != b'\r' {
        return Err(RespError::Malformed("line does not end with CRLF".into()));
    }
    let line = &buf[1..end - 1];
    let text = || String::from_utf8_lossy(line).into_owned();
    let integer = || -> Result<i64, RespError> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|t| t.parse::<i64>().ok())
            .ok_or_else(|| RespError::Malformed(format!("not an integer: {:?}", text())))
    };
    let header = match buf[0] {
        b'+' => Header::Status(text()),
        b'-' => Header::Error(text()),
        b':' => Header::Integer(integer()?),
        b'$' => match integer()? {
            -1 => Header::Nil,
            len if len < 0 => return Err(RespError::Malformed(format!("bulk length {len}"))),
            len => {
                let len = usize::try_from(len).map_err(|_| RespError::TooLarge(usize::MAX, max_bulk))?;
                if len > max_bulk {
                    return Err(RespError::TooLarge(len, max_bulk));
                }
                Header::Bulk(len)
            }
        },
        other => return Err(RespError::UnexpectedType(other as char)),
    };
    Ok(Some((header, end + 1)))
}

/// Parses one complete reply at the start of `buf` (header and bulk body): `Ok(None)` when incomplete.
pub fn parse_reply(buf: &[u8], max_bulk: usize) -> Result<Option<(Reply, usize)>, RespError> {
    let Some((header, used)) = parse_header(buf, max_bulk)? else { return Ok(None) };
    let reply = match header {
        Header::Status(text) => Reply::Status(text),
        Header::Error(text) => Reply::Error(text),
        Header::Integer(value) => Reply::Integer(value),
        Header::Nil => Reply::Bulk(None),
        Header::Bulk(len) => {
            let Some(body) = buf.get(used..used + len + 2) else { return Ok(None) };
            if &body[len..] != b"\r\n" {
                return Err(RespError::Malformed("bulk string does not end with CRLF".into()));
            }
            return Ok(Some((Reply::Bulk(Some(body[..len].to_vec())), used + len + 2)));
        }
    };
    Ok(Some((reply, used)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_commands_as_arrays_of_bulk_strings() {
        let mut buf = Vec::new();
        encode(
            &[
                Op::Get("k".into()),
                Op::Set {
                    key: "k".into(),
                    head: b"v".to_vec(),
                    body: Arc::new(b"\r\n".to_vec()),
                    ttl_seconds: Some(30),
                },
                Op::Select(2),
            ],
            &mut buf,
        );
        let expected =
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n$2\r\nEX\r\n$2\r\n30\r\n\
                         *2\r\n$6\r\nSELECT\r\n$1\r\n2\r\n";
        assert_eq!(buf, expected.to_vec());
    }

    #[test]
    fn parses_every_reply_type_and_waits_for_incomplete_ones() {
        let stream = b"+OK\r\n-ERR no\r\n:42\r\n$-1\r\n$5\r\nab\r\nc\r\n";
        let mut rest = &stream[..];
        let mut replies = Vec::new();
        while let Some((reply, used)) = parse_reply(rest, 1024).unwrap() {
            replies.push(reply);
            rest = &rest[used..];
        }
        assert!(rest.is_empty());
        assert_eq!(
            replies,
            vec![
                Reply::Status("OK".into()),
                Reply::Error("ERR no".into()),
                Reply::Integer(42),
                Reply::Bulk(None),
                Reply::Bulk(Some(b"ab\r\nc".to_vec())),
            ]
        );
        // Every proper prefix of a reply is incomplete, never an error.
        let bulk = b"$5\r\nab\r\nc\r\n";
        for cut in 0..bulk.len() {
            assert_eq!(parse_reply(&bulk[..cut], 1024), Ok(None), "prefix of {cut} bytes");
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_parse_to_a_reply_an_error_or_incomplete(bytes in proptest::collection::vec(0u8..=255, 0..300)) {
            // Never a panic, and a parsed reply never claims more bytes than it was given.
            if let Ok(Some((_, used))) = parse_reply(&bytes, 128) {
                proptest::prop_assert!(used <= bytes.len());
            }
        }
    }

    #[test]
    fn refuses_malformed_replies() {
        for (bad, what) in [
            (&b"*1\r\n"[..], "arrays are not used"),
            (b"$abc\r\n", "length not a number"),
            (b"$-2\r\n", "negative length"),
            (b":1\n", "LF without CR"),
            (b"\r\n", "an empty line"),
            (b"\n", "a bare LF"),
            (b"$3\r\nabcXY", "bulk without CRLF"),
            (b"$2000\r\n", "bulk over the limit"),
        ] {
            assert!(parse_reply(bad, 1024).is_err(), "{what}");
        }
        let long = vec![b'+'; MAX_LINE + 10];
        assert_eq!(parse_reply(&long, 1024), Err(RespError::LineTooLong));
    }
}
