//! The repeated-prefix sketch's accuracy and the prefix-churn detector.
#![allow(clippy::unwrap_used)]

use kvroute_gateway::routing::{ChurnConfig, ChurnDetector, PrefixSketch, SketchConfig};
use kvroute_proto::{BlockHash, BlockHasher};

fn blocks(count: usize, variant: u32) -> Vec<BlockHash> {
    let tokens: Vec<u32> = (0..count as u32 * 16).map(|i| i ^ variant.wrapping_mul(0x9E37_79B9)).collect();
    BlockHasher::new(16, "m", b"").hashes(&tokens)
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

/// A system prompt whose block 0 carries a timestamp.
fn stamped(seconds: u32, question: u32) -> Vec<u32> {
    let mut tokens = vec![1, 2, 3, 4, 5];
    tokens.extend([50_000 + seconds / 60, 51_000 + seconds % 60]);
    tokens.extend(100..400);
    tokens.extend([question; 20]);
    tokens
}

#[test]
fn a_timestamp_at_the_top_raises_an_alarm_with_its_position() {
    let mut detector = ChurnDetector::new(ChurnConfig::default());
    let alarms: Vec<_> = (0..6).map(|i| detector.observe("acme", &stamped(600 + i, i))).collect();
    assert_eq!(alarms[..3], [None, None, None]);
    let alarm = alarms[3].clone().unwrap();
    assert_eq!((alarm.tenant.as_str(), alarm.first_differing_token, alarm.streak), ("acme", 6, 3));
    assert!(alarms[4..].iter().all(Option::is_some));
    // A stable prompt resets the streak.
    assert_eq!(detector.observe("acme", &stamped(605, 9)), None);
    assert_eq!(detector.observe("acme", &stamped(606, 9)), None);
}

#[test]
fn stable_prefixes_and_unrelated_prompts_do_not_alarm() {
    let mut detector = ChurnDetector::new(ChurnConfig::default());
    for i in 0..10 {
        assert_eq!(detector.observe("chat", &stamped(600, i)), None);
        // Unrelated prompts differ at token 0 and everywhere after.
        let unrelated: Vec<u32> = (0..300).map(|t| t * 7 + i * 1_000).collect();
        assert_eq!(detector.observe("mixed", &unrelated), None);
        // Too short to hold a block.
        assert_eq!(detector.observe("short", &[i; 8]), None);
    }
}

#[test]
fn tenants_are_bounded_and_logging_is_rate_limited() {
    let mut detector = ChurnDetector::new(ChurnConfig { max_tenants: 8, ..ChurnConfig::default() });
    for tenant in 0..100 {
        detector.observe(&format!("t{tenant}"), &stamped(0, 0));
    }
    assert_eq!(detector.tenants(), 8);
    assert!(detector.should_log(1_000));
    assert!(!detector.should_log(30_000));
    assert!(detector.should_log(61_000));
    assert!(!detector.should_log(61_001));
}

#[test]
fn a_timestamp_of_varying_length_still_counts_as_churn() {
    let mut detector = ChurnDetector::new(ChurnConfig::default());
    let prompt = |stamp: &[u32]| {
        let mut tokens = vec![1, 2, 3];
        tokens.extend_from_slice(stamp);
        tokens.extend(100..400);
        tokens
    };
    detector.observe("t", &prompt(&[7]));
    detector.observe("t", &prompt(&[8, 9]));
    detector.observe("t", &prompt(&[10]));
    let alarm = detector.observe("t", &prompt(&[11, 12, 13])).unwrap();
    assert_eq!(alarm.first_differing_token, 3);
}
