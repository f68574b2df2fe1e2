//! The repeated-prefix sketch's accuracy. (Why the ratio is what it is: the prefix-cache doctor, `doctor/`.)
#![allow(clippy::unwrap_used)]

use kvroute_gateway::routing::{PrefixSketch, SketchConfig};
use kvroute_proto::{BlockHash, BlockHasher, DEFAULT_BLOCK_SIZE};

fn blocks(count: usize, variant: u32) -> Vec<BlockHash> {
    let tokens: Vec<u32> =
        (0..count as u32 * DEFAULT_BLOCK_SIZE).map(|i| i ^ variant.wrapping_mul(0x9E37_79B9)).collect();
    BlockHasher::new(DEFAULT_BLOCK_SIZE, "m", b"").hashes(&tokens)
}

#[test]
fn unique_traffic_reads_near_zero_and_repeats_read_one() {
    let sketch = PrefixSketch::new(&SketchConfig { window_blocks: 100_000, ..SketchConfig::default() });
    let mut seen = 0;
    let mut total = 0;
    for variant in 0..500 {
        let (s, t) = sketch.observe(&blocks(100, variant));
        seen += s;
        total += t;
    }
    let false_positive = seen as f64 / total as f64;
    assert!(false_positive < 0.02, "false positives {false_positive}");
    for variant in 400..500 {
        assert_eq!(sketch.observe(&blocks(100, variant)), (100, 100), "recent prompt {variant}");
    }
    assert_eq!(sketch.totals().1, 60_000);
}

#[test]
fn the_ratio_tracks_the_repeated_share_and_old_traffic_is_forgotten() {
    let sketch = PrefixSketch::new(&SketchConfig { window_blocks: 20_000, ..SketchConfig::default() });
    assert_eq!(sketch.ratio(), 0.0);
    // Every prompt: a shared 30-block system prompt, then 70 blocks of its own.
    let shared = blocks(30, 0);
    for variant in 1..=300u32 {
        let mut prompt = shared.clone();
        prompt.extend(blocks(70, variant));
        sketch.observe(&prompt);
    }
    let ratio = sketch.ratio();
    assert!((0.27..0.33).contains(&ratio), "ratio {ratio}");
    // Three windows of unrelated traffic later, the old prompts are gone.
    for variant in 1_000..1_600 {
        sketch.observe(&blocks(100, variant));
    }
    let (seen, _) = sketch.observe(&blocks(100, 1));
    assert!(seen <= 5, "seen {seen}");
    assert!(sketch.ratio() < 0.05);
}
