//! The paged K/V pool: fixed-size blocks of token slots, indexed by block id, in f32, bf16 or fp8.
//!
//! Per layer, K and V are each one array laid out `[block][slot in block][kv_head][head_dim]`. Values are
//! quantized when written and dequantized when read, so whoever reads a position sees the same f32 values,
//! whether it was written a moment ago, copied from another block, or loaded from bytes.
//!
//! fp8 uses e4m3fn with a fixed scale, [`FP8_E4M3_SCALE`], the same for every layer: the stored code is
//! `e4m3(x / scale)` (round to nearest even, saturating at ±448) and the value read back is
//! `decode(code) * scale`. The scale is 1.0: SmolLM2-135M's K stay under 25 and its V under 15 in
//! magnitude, far inside e4m3's range, and e4m3 keeps the same relative precision (3 mantissa bits) at
//! every normal magnitude down to 2^-6, so a finer scale would only sharpen values too small to matter in
//! attention. A constant also keeps stored bytes meaningful across agents and restarts.

use kvroute_proto::domain::{KvDtype, KvGeometry};

use super::KvStoreError;
use super::quant::{E4M3_TO_F32, bf16_to_f32, f32_to_bf16, f32_to_e4m3};

/// The fixed per-layer scale of fp8 K/V (the same for every layer and every model).
pub const FP8_E4M3_SCALE: f32 = 1.0;

/// One layer's K or V elements.
#[derive(Clone)]
enum Elements {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    Fp8(Vec<u8>),
}

impl Elements {
    fn zeroed(dtype: KvDtype, len: usize) -> Elements {
        match dtype {
            KvDtype::F32 => Elements::F32(vec![0.0; len]),
            KvDtype::Bf16 => Elements::Bf16(vec![0; len]),
            KvDtype::Fp8E4m3 => Elements::Fp8(vec![0; len]),
        }
    }

    fn store(&mut self, start: usize, values: &[f32]) {
        let range = start..start + values.len();
        match self {
            Elements::F32(out) => out[range].copy_from_slice(values),
            Elements::Bf16(out) => out[range].iter_mut().zip(values).for_each(|(o, &v)| *o = f32_to_bf16(v)),
            Elements::Fp8(out) => {
                out[range].iter_mut().zip(values).for_each(|(o, &v)| *o = f32_to_e4m3(v / FP8_E4M3_SCALE))
            }
        }
    }

    fn load(&self, start: usize, out: &mut [f32]) {
        let range = start..start + out.len();
        match self {
            Elements::F32(values) => out.copy_from_slice(&values[range]),
            Elements::Bf16(values) => out.iter_mut().zip(&values[range]).for_each(|(o, &b)| *o = bf16_to_f32(b)),
            Elements::Fp8(values) => {
                out.iter_mut().zip(&values[range]).for_each(|(o, &b)| *o = E4M3_TO_F32[usize::from(b)] * FP8_E4M3_SCALE)
            }
        }
    }

    fn copy_within(&mut self, src: usize, dst: usize, len: usize) {
        match self {
            Elements::F32(values) => values.copy_within(src..src + len, dst),
            Elements::Bf16(values) => values.copy_within(src..src + len, dst),
            Elements::Fp8(values) => values.copy_within(src..src + len, dst),
        }
    }

    fn append_bytes(&self, start: usize, len: usize, out: &mut Vec<u8>) {
        let range = start..start + len;
        match self {
            Elements::F32(values) => values[range].iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Elements::Bf16(values) => values[range].iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Elements::Fp8(values) => out.extend_from_slice(&values[range]),
        }
    }

    /// Overwrites `len` elements from little-endian bytes (exactly `len * element size` of them).
    fn set_bytes(&mut self, start: usize, bytes: &[u8]) {
        match self {
            Elements::F32(values) => {
                let chunks = bytes.chunks_exact(4);
                values[start..start + chunks.len()]
                    .iter_mut()
                    .zip(chunks)
                    .for_each(|(v, b)| *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            }
            Elements::Bf16(values) => {
                let chunks = bytes.chunks_exact(2);
                values[start..start + chunks.len()]
                    .iter_mut()
                    .zip(chunks)
                    .for_each(|(v, b)| *v = u16::from_le_bytes([b[0], b[1]]));
            }
            Elements::Fp8(values) => values[start..start + bytes.len()].copy_from_slice(bytes),
        }
    }
}

#[derive(Clone)]
struct LayerKv {
    k: Elements,
    v: Elements,
}

/// The paged K/V pool of one model.
#[derive(Clone)]
pub struct KvStore {
    geometry: KvGeometry,
    num_blocks: usize,
    block_size: usize,
    /// Elements of one token in one layer for K (or V): `kv_heads * head_dim`.
    token_elems: usize,
    layers: Vec<LayerKv>,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("geometry", &self.geometry)
            .field("num_blocks", &self.num_blocks)
            .field("block_size", &self.block_size)
            .finish()
    }
}

impl KvStore {
    /// A zeroed pool of `num_blocks` blocks of `block_size` token slots.
    pub fn new(geometry: KvGeometry, num_blocks: usize, block_size: usize) -> KvStore {
        let token_elems = geometry.num_kv_heads as usize * geometry.head_dim as usize;
        let len = num_blocks * block_size * token_elems;
        let layers = (0..geometry.num_layers)
            .map(|_| LayerKv { k: Elements::zeroed(geometry.dtype, len), v: Elements::zeroed(geometry.dtype, len) })
            .collect();
        KvStore { geometry, num_blocks, block_size, token_elems, layers }
    }

    /// How many blocks fit in `bytes`.
    pub fn blocks_for_bytes(geometry: KvGeometry, block_size: usize, bytes: u64) -> usize {
        let per_block = geometry.bytes_per_block(block_size as u32);
        bytes.checked_div(per_block).map_or(0, |blocks| usize::try_from(blocks).unwrap_or(usize::MAX))
    }

    pub fn geometry(&self) -> KvGeometry {
        self.geometry
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of one block: all layers, K and V (the length of [`KvStore::block_to_bytes`]).
    pub fn bytes_per_block(&self) -> usize {
        self.geometry.bytes_per_block(self.block_size as u32) as usize
    }

    /// Elements of K (or V) for one token in one layer.
    pub fn token_elems(&self) -> usize {
        self.token_elems
    }

    fn offset(&self, block: usize, slot: usize) -> usize {
        (block * self.block_size + slot) * self.token_elems
    }

    /// Stores one token's K and V (`kv_heads * head_dim` values each), quantized to the store's dtype.
    ///
    /// Panics if `layer`, `block` or `slot` is out of range or a slice has the wrong length.
    pub fn write(&mut self, layer: usize, block: usize, slot: usize, k: &[f32], v: &[f32]) {
        assert!(slot < self.block_size && k.len() == self.token_elems && v.len() == self.token_elems);
        let start = self.offset(block, slot);
        let kv = &mut self.layers[layer];
        kv.k.store(start, k);
        kv.v.store(start, v);
    }

    /// Reads the first `slots` tokens of a block in one layer as f32, `[slot][kv_head][head_dim]`, into
    /// `k` and `v` (each `slots * kv_heads * head_dim` long).
    pub fn read(&self, layer: usize, block: usize, slots: usize, k: &mut [f32], v: &mut [f32]) {
        assert!(slots <= self.block_size && k.len() == slots * self.token_elems && v.len() == k.len());
        let start = self.offset(block, 0);
        let kv = &self.layers[layer];
        kv.k.load(start, k);
        kv.v.load(start, v);
    }

    /// Copies every layer's K and V of block `src` into block `dst`.
    ///
    /// Panics if a block id is out of range.
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        assert!((src as usize) < self.num_blocks && (dst as usize) < self.num_blocks, "block id out of range");
        let len = self.block_size * self.token_elems;
        let (src, dst) = (self.offset(src as usize, 0), self.offset(dst as usize, 0));
        for kv in &mut self.layers {
            kv.k.copy_within(src, dst, len);
            kv.v.copy_within(src, dst, len);
        }
    }

    /// The exact stored bytes of a block: for each layer, K then V, elements little-endian
    /// ([`KvStore::bytes_per_block`] bytes).
    ///
    /// Panics if the block id is out of range.
    pub fn block_to_bytes(&self, block: u32) -> Vec<u8> {
        assert!((block as usize) < self.num_blocks, "block id {block} out of range");
        let start = self.offset(block as usize, 0);
        let len = self.block_size * self.token_elems;
        let mut out = Vec::with_capacity(self.bytes_per_block());
        for kv in &self.layers {
            kv.k.append_bytes(start, len, &mut out);
            kv.v.append_bytes(start, len, &mut out);
        }
        out
    }

    /// Overwrites a block with bytes from [`KvStore::block_to_bytes`] (of a store of the same geometry and
    /// block size); the block then reads back bit-identically.
    pub fn block_from_bytes(&mut self, block: u32, bytes: &[u8]) -> Result<(), KvStoreError> {
        if block as usize >= self.num_blocks {
            return Err(KvStoreError::BlockOutOfRange { block, num_blocks: self.num_blocks });
        }
        let start = self.offset(block as usize, 0);
        if bytes.len() != self.bytes_per_block() {
            return Err(KvStoreError::ByteLength { expected: self.bytes_per_block(), found: bytes.len() });
        }
        let part = self.block_size * self.token_elems * self.geometry.dtype.bytes_per_element();
        let mut parts = bytes.chunks_exact(part);
        for kv in &mut self.layers {
            for elements in [&mut kv.k, &mut kv.v] {
                if let Some(chunk) = parts.next() {
                    elements.set_bytes(start, chunk);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(dtype: KvDtype) -> KvGeometry {
        KvGeometry { num_layers: 3, num_kv_heads: 2, head_dim: 4, dtype }
    }

    fn values(seed: f32, len: usize) -> Vec<f32> {
        (0..len).map(|i| ((i as f32 + seed) * 0.731).sin() * 3.0).collect()
    }

    #[test]
    fn fp8_holds_exactly_twice_the_blocks_of_bf16() {
        for block_size in [1usize, 16, 32] {
            let bf16 = geometry(KvDtype::Bf16);
            let fp8 = geometry(KvDtype::Fp8E4m3);
            let bytes = bf16.bytes_per_block(block_size as u32) * 1000 + 7;
            assert_eq!(KvStore::blocks_for_bytes(bf16, block_size, bytes), 1000);
            assert_eq!(KvStore::blocks_for_bytes(fp8, block_size, bytes), 2000);
            let (a, b) = (KvStore::new(bf16, 1, block_size), KvStore::new(fp8, 1, block_size));
            assert_eq!(a.bytes_per_block(), 2 * b.bytes_per_block());
        }
    }

    #[test]
    fn write_read_round_trips_within_precision() {
        for (dtype, tolerance) in [(KvDtype::F32, 0.0), (KvDtype::Bf16, 1.0 / 128.0), (KvDtype::Fp8E4m3, 1.0 / 8.0)] {
            let mut store = KvStore::new(geometry(dtype), 4, 2);
            let (k, v) = (values(1.0, 8), values(2.0, 8));
            store.write(1, 3, 1, &k, &v);
            let (mut k_out, mut v_out) = (vec![0.0; 16], vec![0.0; 16]);
            store.read(1, 3, 2, &mut k_out, &mut v_out);
            assert!(k_out[..8].iter().all(|&x| x == 0.0));
            for (a, b) in k.iter().chain(&v).zip(k_out[8..].iter().chain(&v_out[8..])) {
                assert!((a - b).abs() <= tolerance * a.abs(), "{dtype}: {a} read back as {b}");
            }
        }
    }

    #[test]
    fn bytes_and_copies_are_bit_identical() {
        for dtype in [KvDtype::F32, KvDtype::Bf16, KvDtype::Fp8E4m3] {
            let mut store = KvStore::new(geometry(dtype), 5, 2);
            for layer in 0..3 {
                for slot in 0..2 {
                    let seed = (layer * 2 + slot) as f32;
                    store.write(layer, 1, slot, &values(seed, 8), &values(seed + 0.5, 8));
                }
            }
            let bytes = store.block_to_bytes(1);
            assert_eq!(bytes.len(), store.bytes_per_block());
            store.block_from_bytes(4, &bytes).unwrap();
            store.copy_block(1, 2);
            assert_eq!(store.block_to_bytes(4), bytes);
            assert_eq!(store.block_to_bytes(2), bytes);
            let mut other = KvStore::new(geometry(dtype), 1, 2);
            other.block_from_bytes(0, &bytes).unwrap();
            for layer in 0..3 {
                let read = |s: &KvStore, block| {
                    let (mut k, mut v) = (vec![0.0f32; 16], vec![0.0f32; 16]);
                    s.read(layer, block, 2, &mut k, &mut v);
                    k.iter().chain(&v).map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                assert_eq!(read(&store, 1), read(&other, 0));
            }
        }
    }

    #[test]
    fn bad_blocks_and_lengths_are_errors() {
        let mut store = KvStore::new(geometry(KvDtype::Bf16), 2, 4);
        let bytes = store.block_to_bytes(0);
        assert!(matches!(store.block_from_bytes(1, &bytes[1..]), Err(KvStoreError::ByteLength { .. })));
        assert_eq!(store.block_from_bytes(3, &bytes), Err(KvStoreError::BlockOutOfRange { block: 3, num_blocks: 2 }));
    }
}
