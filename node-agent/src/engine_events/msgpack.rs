//! A small MessagePack reader (and writer, for tests and fuzz seeds) for the engines' event payloads.
//!
//! Hand-written instead of a crate: the payloads use a handful of types, and a reader of outside bytes
//! here must be total. [`parse`] borrows strings and binaries from the input, nests at most
//! [`MAX_DEPTH`] deep, and reserves memory only for elements the remaining bytes can hold (each takes at
//! least one byte), so a forged length costs nothing before it fails.

use thiserror::Error;

/// Deepest nesting [`parse`] accepts; event payloads nest five deep.
pub const MAX_DEPTH: usize = 32;

/// One MessagePack value, borrowing its strings and binaries from the input.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    Nil,
    Bool(bool),
    /// A non-negative integer (any width).
    Uint(u64),
    /// A negative integer.
    Int(i64),
    Float(f64),
    /// A str: UTF-8 by the spec, kept as bytes so a bad one is the reader's choice to refuse.
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(Vec<Value<'a>>),
    Map(Vec<(Value<'a>, Value<'a>)>),
    Ext(i8, &'a [u8]),
}

impl<'a> Value<'a> {
    /// The text of a str that is valid UTF-8.
    pub fn as_str(&self) -> Option<&'a str> {
        match self {
            Value::Str(bytes) => std::str::from_utf8(bytes).ok(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value<'a>]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Value<'a>, Value<'a>)]> {
        match self {
            Value::Map(entries) => Some(entries),
            _ => None,
        }
    }

    pub fn is_nil(&self) -> bool {
        matches!(self, Value::Nil)
    }

    /// The value of `key` in a map whose keys are strs (the first, if repeated).
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        self.as_map()?.iter().find(|(name, _)| name.as_str() == Some(key)).map(|(_, value)| value)
    }
}

/// Bytes that are not one whole MessagePack value.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum MsgpackError {
    #[error("msgpack: input ends inside a value at byte {0}")]
    Truncated(usize),
    #[error("msgpack: byte 0xc1 (never used) at byte {0}")]
    Reserved(usize),
    #[error("msgpack: nested deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("msgpack: {0} bytes after the value")]
    Trailing(usize),
}

/// Parses exactly one value filling `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Value<'_>, MsgpackError> {
    let mut reader = Reader { bytes, at: 0 };
    let value = reader.value(0)?;
    if reader.at != bytes.len() {
        return Err(MsgpackError::Trailing(bytes.len() - reader.at));
    }
    Ok(value)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], MsgpackError> {
        let end = self.at.checked_add(len).filter(|&end| end <= self.bytes.len());
        let Some(end) = end else { return Err(MsgpackError::Truncated(self.at)) };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn byte(&mut self) -> Result<u8, MsgpackError> {
        Ok(self.take(1)?[0])
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], MsgpackError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn len8(&mut self) -> Result<usize, MsgpackError> {
        Ok(usize::from(self.byte()?))
    }

    fn len16(&mut self) -> Result<usize, MsgpackError> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }

    fn len32(&mut self) -> Result<usize, MsgpackError> {
        // A length past usize cannot fit in the input either: `take` refuses it.
        Ok(usize::try_from(u32::from_be_bytes(self.be()?)).unwrap_or(usize::MAX))
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, MsgpackError> {
        if depth >= MAX_DEPTH {
            return Err(MsgpackError::TooDeep);
        }
        let start = self.at;
        let marker = self.byte()?;
        Ok(match marker {
            0x00..=0x7f => Value::Uint(u64::from(marker)),
            0x80..=0x8f => self.map(usize::from(marker & 0x0f), depth)?,
            0x90..=0x9f => self.array(usize::from(marker & 0x0f), depth)?,
            0xa0..=0xbf => Value::Str(self.take(usize::from(marker & 0x1f))?),
            0xc0 => Value::Nil,
            0xc1 => return Err(MsgpackError::Reserved(start)),
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4 => {
                let len = self.len8()?;
                Value::Bin(self.take(len)?)
            }
            0xc5 => {
                let len = self.len16()?;
                Value::Bin(self.take(len)?)
            }
            0xc6 => {
                let len = self.len32()?;
                Value::Bin(self.take(len)?)
            }
            0xc7 => {
                let len = self.len8()?;
                self.ext(len)?
            }
            0xc8 => {
                let len = self.len16()?;
                self.ext(len)?
            }
            0xc9 => {
                let len = self.len32()?;
                self.ext(len)?
            }
            0xca => Value::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Value::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Value::Uint(u64::from(self.byte()?)),
            0xcd => Value::Uint(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Value::Uint(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Value::Uint(u64::from_be_bytes(self.be()?)),
            0xd0 => int(i64::from(i8::from_be_bytes(self.be()?))),
            0xd1 => int(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => int(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => int(i64::from_be_bytes(self.be()?)),
            0xd4 => self.ext(1)?,
            0xd5 => self.ext(2)?,
            0xd6 => self.ext(4)?,
            0xd7 => self.ext(8)?,
            0xd8 => self.ext(16)?,
            0xd9 => {
                let len = self.len8()?;
                Value::Str(self.take(len)?)
            }
            0xda => {
                let len = self.len16()?;
                Value::Str(self.take(len)?)
            }
            0xdb => {
                let len = self.len32()?;
                Value::Str(self.take(len)?)
            }
            0xdc => {
                let len = self.len16()?;
                self.array(len, depth)?
            }
            0xdd => {
                let len = self.len32()?;
                self.array(len, depth)?
            }
            0xde => {
                let len = self.len16()?;
                self.map(len, depth)?
            }
            0xdf => {
                let len = self.len32()?;
                self.map(len, depth)?
            }
            0xe0..=0xff => Value::Int(i64::from(marker as i8)),
        })
    }

    fn ext(&mut self, len: usize) -> Result<Value<'a>, MsgpackError> {
        let kind = self.byte()? as i8;
        Ok(Value::Ext(kind, self.take(len)?))
    }

    fn array(&mut self, len: usize, depth: usize) -> Result<Value<'a>, MsgpackError> {
        let mut items = Vec::with_capacity(len.min(self.bytes.len() - self.at));
        for _ in 0..len {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, len: usize, depth: usize) -> Result<Value<'a>, MsgpackError> {
        let mut entries = Vec::with_capacity(len.min((self.bytes.len() - self.at) / 2));
        for _ in 0..len {
            let key = self.value(depth + 1)?;
            let value = self.value(depth + 1)?;
            entries.push((key, value));
        }
        Ok(Value::Map(entries))
    }
}

/// A signed integer in its canonical variant: non-negative ones are [`Value::Uint`].
fn int(value: i64) -> Value<'static> {
    match u64::try_from(value) {
        Ok(value) => Value::Uint(value),
        Err(_) => Value::Int(value),
    }
}

/// Appends the MessagePack encoding of `value` to `out` (the smallest form of each number and length, as
/// msgspec writes them). For tests and fuzz seeds: the agent never sends MessagePack.
pub fn write(value: &Value<'_>, out: &mut Vec<u8>) {
    match value {
        Value::Nil => out.push(0xc0),
        Value::Bool(false) => out.push(0xc2),
        Value::Bool(true) => out.push(0xc3),
        Value::Uint(value) => write_uint(*value, out),
        Value::Int(value) => write_int(*value, out),
        Value::Float(value) => {
            out.push(0xcb);
            out.extend_from_slice(&value.to_be_bytes());
        }
        Value::Str(bytes) => {
            write_len(bytes.len(), [Some(0xa0), Some(0xd9), Some(0xda), Some(0xdb)], 31, out);
            out.extend_from_slice(bytes);
        }
        Value::Bin(bytes) => {
            write_len(bytes.len(), [None, Some(0xc4), Some(0xc5), Some(0xc6)], 0, out);
            out.extend_from_slice(bytes);
        }
        Value::Array(items) => {
            write_len(items.len(), [Some(0x90), None, Some(0xdc), Some(0xdd)], 15, out);
            items.iter().for_each(|item| write(item, out));
        }
        Value::Map(entries) => {
            write_len(entries.len(), [Some(0x80), None, Some(0xde), Some(0xdf)], 15, out);
            for (key, value) in entries {
                write(key, out);
                write(value, out);
            }
        }
        Value::Ext(kind, bytes) => {
            write_len(bytes.len(), [None, Some(0xc7), Some(0xc8), Some(0xc9)], 0, out);
            out.push(*kind as u8);
            out.extend_from_slice(bytes);
        }
    }
}

/// The encoding of `value` as a new buffer.
pub fn to_vec(value: &Value<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    write(value, &mut out);
    out
}

fn write_uint(value: u64, out: &mut Vec<u8>) {
    if value < 0x80 {
        out.push(value as u8);
    } else if let Ok(value) = u8::try_from(value) {
        out.extend_from_slice(&[0xcc, value]);
    } else if let Ok(value) = u16::try_from(value) {
        out.push(0xcd);
        out.extend_from_slice(&value.to_be_bytes());
    } else if let Ok(value) = u32::try_from(value) {
        out.push(0xce);
        out.extend_from_slice(&value.to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

fn write_int(value: i64, out: &mut Vec<u8>) {
    if let Ok(value) = u64::try_from(value) {
        write_uint(value, out);
    } else if value >= -32 {
        out.push(value as u8);
    } else if let Ok(value) = i8::try_from(value) {
        out.extend_from_slice(&[0xd0, value as u8]);
    } else if let Ok(value) = i16::try_from(value) {
        out.push(0xd1);
        out.extend_from_slice(&value.to_be_bytes());
    } else if let Ok(value) = i32::try_from(value) {
        out.push(0xd2);
        out.extend_from_slice(&value.to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// A length in the smallest of: the fix form (`markers[0]`, lengths up to `fix_max`), 8, 16 or 32 bits.
fn write_len(len: usize, markers: [Option<u8>; 4], fix_max: usize, out: &mut Vec<u8>) {
    match markers {
        [Some(fix), ..] if len <= fix_max => out.push(fix | len as u8),
        [_, Some(marker), ..] if len <= 0xff => out.extend_from_slice(&[marker, len as u8]),
        [_, _, Some(marker), _] if len <= 0xffff => {
            out.push(marker);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        [_, _, _, Some(marker)] => {
            out.push(marker);
            out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_marker_family() {
        let cases: Vec<(Vec<u8>, Value<'static>)> = vec![
            (vec![0x05], Value::Uint(5)),
            (vec![0xff], Value::Int(-1)),
            (vec![0xcc, 0xc8], Value::Uint(200)),
            (vec![0xcd, 0x01, 0x00], Value::Uint(256)),
            (vec![0xce, 0, 1, 0, 0], Value::Uint(65536)),
            (vec![0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], Value::Uint(u64::MAX)),
            (vec![0xd0, 0x80], Value::Int(-128)),
            (vec![0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], Value::Int(i64::MIN)),
            (vec![0xd1, 0x00, 0x07], Value::Uint(7)),
            (vec![0xc0], Value::Nil),
            (vec![0xc3], Value::Bool(true)),
            (vec![0xca, 0x3f, 0xc0, 0, 0], Value::Float(1.5)),
            (vec![0xa2, b'h', b'i'], Value::Str(b"hi")),
            (vec![0xd9, 0x01, b'x'], Value::Str(b"x")),
            (vec![0xc4, 0x02, 1, 2], Value::Bin(&[1, 2])),
            (vec![0x92, 0x01, 0xc0], Value::Array(vec![Value::Uint(1), Value::Nil])),
            (vec![0xdc, 0x00, 0x01, 0x07], Value::Array(vec![Value::Uint(7)])),
            (vec![0x81, 0xa1, b'k', 0x02], Value::Map(vec![(Value::Str(b"k"), Value::Uint(2))])),
            (vec![0xd4, 0x01, 0x09], Value::Ext(1, &[9])),
        ];
        for (bytes, expected) in cases {
            assert_eq!(parse(&bytes), Ok(expected), "{bytes:02x?}");
        }
    }

    #[test]
    fn refuses_what_is_not_one_value() {
        assert_eq!(parse(&[]), Err(MsgpackError::Truncated(0)));
        assert_eq!(parse(&[0xc1]), Err(MsgpackError::Reserved(0)));
        assert_eq!(parse(&[0x01, 0x02]), Err(MsgpackError::Trailing(1)));
        assert_eq!(parse(&[0x92, 0x01]), Err(MsgpackError::Truncated(2)));
        // A forged 4-billion-element array fails at the end of the input, having reserved nothing large.
        assert_eq!(parse(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01]), Err(MsgpackError::Truncated(6)));
        assert_eq!(parse(&[0xdb, 0xff, 0xff, 0xff, 0xff]), Err(MsgpackError::Truncated(5)));
        assert_eq!(parse(&[0x91; 100]), Err(MsgpackError::TooDeep));
    }

    #[test]
    fn writes_what_it_reads() {
        let long_text = "t".repeat(300);
        let long_list: Vec<Value<'_>> = (0..70_000u64).map(Value::Uint).collect();
        let values = vec![
            Value::Array(vec![
                Value::Float(1.25),
                Value::Array(vec![Value::Map(vec![
                    (Value::Str(b"type"), Value::Str(b"BlockStored")),
                    (Value::Str(b"n"), Value::Int(-9_000_000_000)),
                    (Value::Str(b"b"), Value::Bin(&[0; 40])),
                ])]),
                Value::Nil,
            ]),
            Value::Str(long_text.as_bytes()),
            Value::Array(long_list),
            Value::Int(-33),
            Value::Int(-129),
            Value::Int(-40_000),
            Value::Uint(u64::from(u32::MAX) + 1),
            Value::Ext(-2, &[1, 2, 3]),
        ];
        for value in values {
            let bytes = to_vec(&value);
            assert_eq!(parse(&bytes), Ok(value));
        }
    }

    #[test]
    fn map_lookup_and_accessors() {
        let bytes = [0x82, 0xa1, b'a', 0x01, 0xa1, b'b', 0x91, 0xc0];
        let value = parse(&bytes).unwrap();
        assert_eq!(value.get("a"), Some(&Value::Uint(1)));
        assert_eq!(value.get("b").and_then(Value::as_array).map(<[_]>::len), Some(1));
        assert_eq!(value.get("c"), None);
        assert_eq!(Value::Str(&[0xff]).as_str(), None, "invalid UTF-8 is no text");
    }
}
