//! The capacity calculator behind `node-agent capacity`: how many sequences a
//! KV budget holds with a contiguous reservation per sequence against paging,
//! and what grouped-query attention and an fp8 cache each multiply.

use std::fmt;

use kvroute_proto::domain::KvDtype;

/// A model's KV geometry and a serving budget.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityInput {
    pub layers: u64,
    /// Query heads (for the grouped-query factor); equal to `kv_heads` for MHA.
    pub query_heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub dtype: KvDtype,
    pub budget_bytes: u64,
    pub block_size: u64,
    /// Tokens reserved per sequence by a contiguous allocator (the max context).
    pub reserved_tokens: u64,
    /// Tokens a sequence actually uses on average.
    pub used_tokens: u64,
}

/// Concurrent sequences under each regime.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityReport {
    pub bytes_per_token: u64,
    pub contiguous: u64,
    pub paged: u64,
    /// Rungs from MHA + bf16 + contiguous up to this geometry with paging.
    pub ladder: Vec<(String, u64)>,
    /// Fraction of reserved KV memory holding nothing, contiguous vs paged.
    pub waste_contiguous: f64,
    pub waste_paged: f64,
}

fn bytes_per_token(layers: u64, kv_heads: u64, head_dim: u64, dtype: KvDtype) -> u64 {
    2 * layers * kv_heads * head_dim * dtype.bytes_per_element() as u64
}

fn sequences(budget: u64, tokens_per_sequence: u64, bytes_per_token: u64) -> u64 {
    budget.checked_div(tokens_per_sequence * bytes_per_token).unwrap_or(0)
}

/// Computes the report; all arithmetic is integer except the waste fractions.
pub fn capacity(input: &CapacityInput) -> CapacityReport {
    let block = input.block_size.max(1);
    let paged_tokens = input.used_tokens.div_ceil(block) * block;
    let per_token = bytes_per_token(input.layers, input.kv_heads, input.head_dim, input.dtype);
    let mha_bf16 = bytes_per_token(input.layers, input.query_heads.max(input.kv_heads), input.head_dim, KvDtype::Bf16);
    let gqa_bf16 = bytes_per_token(input.layers, input.kv_heads, input.head_dim, KvDtype::Bf16);
    let budget = input.budget_bytes;
    let ladder = vec![
        ("MHA, bf16, contiguous".to_string(), sequences(budget, input.reserved_tokens, mha_bf16)),
        (
            format!("+ grouped-query attention ({} KV heads)", input.kv_heads),
            sequences(budget, input.reserved_tokens, gqa_bf16),
        ),
        (format!("+ {} KV cache", input.dtype), sequences(budget, input.reserved_tokens, per_token)),
        (format!("+ paging ({} tokens used)", input.used_tokens), sequences(budget, paged_tokens, per_token)),
    ];
    let used = input.used_tokens.min(input.reserved_tokens) as f64;
    CapacityReport {
        bytes_per_token: per_token,
        contiguous: sequences(budget, input.reserved_tokens, per_token),
        paged: sequences(budget, paged_tokens, per_token),
        ladder,
        waste_contiguous: 1.0 - used / input.reserved_tokens.max(1) as f64,
        waste_paged: 1.0 - input.used_tokens as f64 / paged_tokens.max(1) as f64,
    }
}

impl fmt::Display for CapacityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "KV bytes per token: {}", self.bytes_per_token)?;
        writeln!(f, "concurrent sequences, contiguous reservation: {}", self.contiguous)?;
        writeln!(f, "concurrent sequences, paged:                  {}", self.paged)?;
        writeln!(
            f,
            "reserved memory wasted: contiguous {:.1}%, paged {:.1}%",
            self.waste_contiguous * 100.0,
            self.waste_paged * 100.0
        )?;
        writeln!(f, "ladder:")?;
        let base = self.ladder.first().map_or(1, |(_, n)| (*n).max(1));
        for (label, count) in &self.ladder {
            writeln!(f, "  {label:<44} {count:>8}  ({:.1}x)", *count as f64 / base as f64)?;
        }
        Ok(())
    }
}

/// Parses a byte size: `1048576`, `512MiB`, `53GiB`, `80GB`, `4k`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("{text:?} is not a byte size (e.g. 512MiB, 53GiB)"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        other => return Err(format!("unknown byte unit {other:?} in {text:?}")),
    };
    let bytes = number * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_input(kv_heads: u64, dtype: KvDtype) -> CapacityInput {
        CapacityInput {
            layers: 32,
            query_heads: 32,
            kv_heads,
            head_dim: 128,
            dtype,
            budget_bytes: 53 << 30,
            block_size: 16,
            reserved_tokens: 8192,
            used_tokens: 2270,
        }
    }

    #[test]
    fn the_seed_baseline_holds_13_sequences() {
        let report = capacity(&seed_input(32, KvDtype::Bf16));
        assert_eq!(report.contiguous, 13);
        assert_eq!(report.ladder[0].1, 13);
    }

    #[test]
    fn gqa_fp8_and_paging_give_the_seeds_382() {
        let report = capacity(&seed_input(8, KvDtype::Fp8E4m3));
        assert_eq!(report.ladder[0].1, 13);
        assert_eq!(report.ladder[1].1, 53);
        assert_eq!(report.ladder[2].1, 106);
        assert_eq!(report.paged, 382);
        assert!(report.waste_contiguous > 0.7);
        assert!(report.waste_paged < 0.01);
    }

    #[test]
    fn byte_sizes_parse() {
        assert_eq!(parse_bytes("53GiB"), Ok(53 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5 parsecs").is_err());
    }
}
