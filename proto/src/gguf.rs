//! A reader for GGUF model files (versions 2 and 3): metadata, tensor
//! directory, tensor bytes, and dequantization of the common tensor types.
//!
//! Both sides read the same file: the gateway takes the tokenizer and chat
//! template from it, the node-agent the hyper-parameters and weights. The
//! parser treats the file as untrusted input: every length is checked against
//! the bytes that remain, so a truncated or hostile file gives an error.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// Why a GGUF file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("not a GGUF file (bad magic)")]
    BadMagic,
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated while reading {0}")]
    Truncated(&'static str),
    #[error("invalid metadata value type {0}")]
    BadValueType(u32),
    #[error("metadata string is not UTF-8 ({0})")]
    BadUtf8(&'static str),
    #[error("tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("metadata key {key:?}: {reason}")]
    Metadata { key: String, reason: &'static str },
}

/// One metadata value.
#[derive(Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl fmt::Debug for MetaValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaValue::Array(items) => write!(f, "Array(len {})", items.len()),
            MetaValue::String(text) if text.len() > 64 => write!(f, "String(len {})", text.len()),
            MetaValue::String(text) => write!(f, "String({text:?})"),
            MetaValue::U8(v) => write!(f, "{v}u8"),
            MetaValue::I8(v) => write!(f, "{v}i8"),
            MetaValue::U16(v) => write!(f, "{v}u16"),
            MetaValue::I16(v) => write!(f, "{v}i16"),
            MetaValue::U32(v) => write!(f, "{v}u32"),
            MetaValue::I32(v) => write!(f, "{v}i32"),
            MetaValue::F32(v) => write!(f, "{v}f32"),
            MetaValue::Bool(v) => write!(f, "{v}"),
            MetaValue::U64(v) => write!(f, "{v}u64"),
            MetaValue::I64(v) => write!(f, "{v}i64"),
            MetaValue::F64(v) => write!(f, "{v}f64"),
        }
    }
}

impl MetaValue {
    /// The value as an unsigned integer, whatever its integer width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(u64::from(v)),
            MetaValue::U16(v) => Some(u64::from(v)),
            MetaValue::U32(v) => Some(u64::from(v)),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(f64::from(v)),
            MetaValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(text) => Some(text),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// The ggml element types this reader knows the size of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    BF16,
    /// A type this reader cannot size or decode (k-quants, i-quants, ...).
    Other(u32),
}

impl GgmlType {
    fn from_u32(code: u32) -> GgmlType {
        match code {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            9 => GgmlType::Q8_1,
            30 => GgmlType::BF16,
            other => GgmlType::Other(other),
        }
    }

    /// (elements per block, bytes per block), or None for unknown types.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 | GgmlType::BF16 => Some((1, 2)),
            GgmlType::Q4_0 => Some((32, 18)),
            GgmlType::Q4_1 => Some((32, 20)),
            GgmlType::Q5_0 => Some((32, 22)),
            GgmlType::Q5_1 => Some((32, 24)),
            GgmlType::Q8_0 => Some((32, 34)),
            GgmlType::Q8_1 => Some((32, 36)),
            GgmlType::Other(_) => None,
        }
    }
}

/// One entry of the tensor directory.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions as GGUF stores them: `dims[0]` is the fastest-varying
    /// (for a matrix, the length of one row).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the tensor data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub byte_len: u64,
}

impl TensorInfo {
    pub fn element_count(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file with its bytes.
pub struct GgufFile {
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    data_start: usize,
    bytes: Vec<u8>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Reads and parses a file.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io { path: path.display().to_string(), source })?;
        GgufFile::parse(bytes)
    }

    /// Parses a whole file held in memory.
    pub fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let mut cursor = Cursor { bytes: &bytes, pos: 0 };
        if cursor.take(4, "magic")? != MAGIC {
            return Err(GgufError::BadMagic);
        }
        let version = cursor.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let tensor_count = cursor.u64("tensor count")?;
        let kv_count = cursor.u64("metadata count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = cursor.string("metadata key")?;
            let value_type = cursor.u32("metadata type")?;
            let value = cursor.value(value_type, 0)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::new();
        for _ in 0..tensor_count {
            tensors.push(cursor.tensor_info()?);
        }
        let alignment = metadata.get("general.alignment").and_then(MetaValue::as_u64).unwrap_or(DEFAULT_ALIGNMENT);
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(GgufError::Metadata { key: "general.alignment".into(), reason: "must be a power of two" });
        }
        let data_start = (cursor.pos as u64).div_ceil(alignment) * alignment;
        let data_len = (bytes.len() as u64).saturating_sub(data_start);
        for tensor in &tensors {
            let end = tensor.offset.checked_add(tensor.byte_len);
            if end.is_none_or(|end| end > data_len) {
                return Err(GgufError::BadTensor {
                    name: tensor.name.clone(),
                    reason: "data lies outside the file".into(),
                });
            }
        }
        let data_start = usize::try_from(data_start).map_err(|_| GgufError::Truncated("tensor data"))?;
        Ok(GgufFile { version, metadata, tensors, data_start, bytes })
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(MetaValue::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(MetaValue::as_u64)
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(MetaValue::as_f64)
    }

    /// A metadata array of strings (for example `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?.as_array()?.iter().map(MetaValue::as_str).collect()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|tensor| tensor.name == name)
    }

    /// The raw bytes of a tensor (bounds were checked at parse time).
    pub fn tensor_bytes(&self, tensor: &TensorInfo) -> &[u8] {
        let start = self.data_start + tensor.offset as usize;
        &self.bytes[start..start + tensor.byte_len as usize]
    }

    /// A tensor's values as f32, dequantized if needed.
    pub fn tensor_f32(&self, tensor: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        dequantize(tensor.ggml_type, self.tensor_bytes(tensor), tensor.element_count() as usize)
            .map_err(|reason| GgufError::BadTensor { name: tensor.name.clone(), reason })
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(len).ok_or(GgufError::Truncated(what))?;
        let slice = self.bytes.get(self.pos..end).ok_or(GgufError::Truncated(what))?;
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let len = usize::try_from(len).map_err(|_| GgufError::Truncated(what))?;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| GgufError::BadUtf8(what))
    }

    fn value(&mut self, value_type: u32, depth: u32) -> Result<MetaValue, GgufError> {
        const WHAT: &str = "metadata value";
        Ok(match value_type {
            0 => MetaValue::U8(self.array::<1>(WHAT)?[0]),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(WHAT)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(WHAT)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(WHAT)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(WHAT)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(WHAT)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(WHAT)?)),
            7 => MetaValue::Bool(self.array::<1>(WHAT)?[0] != 0),
            8 => MetaValue::String(self.string(WHAT)?),
            9 => {
                if depth > 4 {
                    return Err(GgufError::BadValueType(value_type));
                }
                let item_type = self.u32(WHAT)?;
                let len = self.u64(WHAT)?;
                // Every item takes at least one byte: a longer array cannot fit.
                if len > self.remaining() as u64 {
                    return Err(GgufError::Truncated("metadata array"));
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(item_type, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(WHAT)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(WHAT)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(WHAT)?)),
            other => return Err(GgufError::BadValueType(other)),
        })
    }

    fn tensor_info(&mut self) -> Result<TensorInfo, GgufError> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor dims")?;
        if n_dims == 0 || n_dims > 4 {
            return Err(GgufError::BadTensor { name, reason: format!("{n_dims} dimensions") });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64("tensor dims")?);
        }
        let ggml_type = GgmlType::from_u32(self.u32("tensor type")?);
        let offset = self.u64("tensor offset")?;
        let elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let byte_len = match (elements, ggml_type.block_layout()) {
            (Some(elements), Some((per_block, block_bytes))) if elements.is_multiple_of(per_block) => {
                (elements / per_block).checked_mul(block_bytes)
            }
            (Some(_), None) => Some(0),
            _ => None,
        };
        let Some(byte_len) = byte_len else {
            return Err(GgufError::BadTensor { name, reason: "size overflows or is not whole blocks".into() });
        };
        Ok(TensorInfo { name, dims, ggml_type, offset, byte_len })
    }
}

/// Converts an IEEE half-precision value to f32 exactly.
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits >> 15) << 31;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    let magnitude = match (exponent, mantissa) {
        (0, 0) => 0,
        (0, m) => {
            // Subnormal: value = m * 2^-24, exact in f32.
            let value = m as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -value } else { value };
        }
        (0x1f, m) => 0x7f80_0000 | (m << 13),
        (e, m) => ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// Decodes `count` values of type `ggml_type` from `bytes`.
pub fn dequantize(ggml_type: GgmlType, bytes: &[u8], count: usize) -> Result<Vec<f32>, String> {
    let Some((per_block, block_bytes)) = ggml_type.block_layout() else {
        return Err(format!("tensor type {ggml_type:?} is not supported"));
    };
    let (per_block, block_bytes) = (per_block as usize, block_bytes as usize);
    if !count.is_multiple_of(per_block) || bytes.len() != count / per_block * block_bytes {
        return Err(format!("{} bytes do not hold {count} values of {ggml_type:?}", bytes.len()));
    }
    let mut out = Vec::with_capacity(count);
    let half = |b: &[u8]| f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    match ggml_type {
        GgmlType::F32 => out.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(half)),
        GgmlType::BF16 => {
            out.extend(bytes.chunks_exact(2).map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)))
        }
        GgmlType::Q8_0 => {
            for block in bytes.chunks_exact(block_bytes) {
                let scale = half(&block[0..2]);
                out.extend(block[2..34].iter().map(|&q| scale * f32::from(q as i8)));
            }
        }
        GgmlType::Q4_0 => {
            for block in bytes.chunks_exact(block_bytes) {
                let scale = half(&block[0..2]);
                let quants = &block[2..18];
                out.extend(quants.iter().map(|&q| scale * (f32::from(q & 0x0f) - 8.0)));
                out.extend(quants.iter().map(|&q| scale * (f32::from(q >> 4) - 8.0)));
            }
        }
        GgmlType::Q4_1 => {
            for block in bytes.chunks_exact(block_bytes) {
                let scale = half(&block[0..2]);
                let min = half(&block[2..4]);
                let quants = &block[4..20];
                out.extend(quants.iter().map(|&q| scale * f32::from(q & 0x0f) + min));
                out.extend(quants.iter().map(|&q| scale * f32::from(q >> 4) + min));
            }
        }
        other => return Err(format!("tensor type {other:?} is not supported")),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_string(out: &mut Vec<u8>, text: &str) {
        out.extend_from_slice(&(text.len() as u64).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }

    /// A small file: two metadata entries and one 2x2 f32 tensor.
    fn tiny_file() -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&1u64.to_le_bytes());
        out.extend_from_slice(&2u64.to_le_bytes());
        put_string(&mut out, "general.architecture");
        out.extend_from_slice(&8u32.to_le_bytes());
        put_string(&mut out, "llama");
        put_string(&mut out, "tokenizer.ggml.tokens");
        out.extend_from_slice(&9u32.to_le_bytes());
        out.extend_from_slice(&8u32.to_le_bytes());
        out.extend_from_slice(&2u64.to_le_bytes());
        put_string(&mut out, "a");
        put_string(&mut out, "b");
        put_string(&mut out, "w");
        out.extend_from_slice(&2u32.to_le_bytes());
        out.extend_from_slice(&2u64.to_le_bytes());
        out.extend_from_slice(&2u64.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        while out.len() % 32 != 0 {
            out.push(0);
        }
        for value in [1.0f32, 2.0, 3.0, 4.0] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        out
    }

    #[test]
    fn parses_metadata_and_tensors() {
        let file = GgufFile::parse(tiny_file()).unwrap();
        assert_eq!(file.get_str("general.architecture"), Some("llama"));
        assert_eq!(file.get_str_array("tokenizer.ggml.tokens"), Some(vec!["a", "b"]));
        let tensor = file.tensor("w").unwrap().clone();
        assert_eq!(file.tensor_f32(&tensor).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = tiny_file();
        for len in 0..bytes.len() {
            assert!(GgufFile::parse(bytes[..len].to_vec()).is_err(), "prefix of {len} bytes parsed");
        }
    }

    #[test]
    fn half_precision_conversion() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8001), -(2f32.powi(-24)));
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
    }

    #[test]
    fn q4_1_block_dequantizes() {
        let mut block = Vec::new();
        block.extend_from_slice(&0x3c00u16.to_le_bytes()); // scale 1
        block.extend_from_slice(&0x4000u16.to_le_bytes()); // min 2
        block.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
        let values = dequantize(GgmlType::Q4_1, &block, 32).unwrap();
        assert_eq!(values[0], 2.0);
        assert_eq!(values[15], 17.0);
        assert_eq!(values[16], 17.0);
        assert_eq!(values[31], 2.0);
    }
}
