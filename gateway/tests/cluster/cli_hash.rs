//! `gateway hash` prints the block-hash chain of the contract, from outside.

#![allow(clippy::unwrap_used)]

use std::process::Command;

fn gateway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gateway"))
}

#[test]
fn hash_prints_one_line_per_full_block() {
    let tokens: Vec<String> = (0..37).map(|i| ((i * 7919) % 49152).to_string()).collect();
    let output = gateway()
        .args(["hash", "--model", "SmolLM2-135M-Instruct", "--block-size", "16", "--tokens", &tokens.join(",")])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8(output.stdout).unwrap();
    // Golden vector "B=16, 37 tokens: 2 blocks and 5 tail tokens" (proto/testdata/block_hash_v1.json).
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../../../proto/testdata/block_hash_v1.json")).unwrap();
    let vector = golden["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"].as_str().unwrap().contains("37 tokens"))
        .unwrap();
    let expected: Vec<&str> = vector["hashes"].as_array().unwrap().iter().map(|h| h.as_str().unwrap()).collect();
    assert_eq!(stdout.lines().collect::<Vec<_>>(), expected);
}

#[test]
fn hash_with_scope_differs_and_is_stable() {
    let run = |scope: &str| {
        let output = gateway()
            .args(["hash", "--model", "m", "--scope", scope, "--block-size", "4", "--tokens", "1,2,3,4,70000,6,7,8,9"])
            .output()
            .unwrap();
        assert!(output.status.success());
        String::from_utf8(output.stdout).unwrap()
    };
    let global = run("");
    assert_eq!(global.lines().count(), 2);
    assert!(global.lines().all(|line| line.len() == 32));
    assert_ne!(global, run("t:acme"));
    assert_eq!(run("t:acme"), run("t:acme"));
}

#[test]
fn hash_of_text_tokenizes_first() {
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let output =
        gateway().args(["hash", "--model", "tiny-random", "--block-size", "16", "--text", &text]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let from_text = String::from_utf8(output.stdout).unwrap();
    let ids = kvroute_gateway::tokenizer::Tokenizer::builtin().encode(&text);
    let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    let output = gateway()
        .args(["hash", "--model", "tiny-random", "--block-size", "16", "--tokens", &ids.join(",")])
        .output()
        .unwrap();
    assert_eq!(from_text, String::from_utf8(output.stdout).unwrap());
    assert_eq!(from_text.lines().count(), ids.len() / 16);
}

#[test]
fn bad_input_is_a_clear_error() {
    let output = gateway().args(["hash", "--model", "m", "--tokens", "1,x,3"]).output().unwrap();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    assert!(String::from_utf8_lossy(&output.stderr).contains("invalid"));
    let output = gateway().args(["hash", "--model", "m", "--block-size", "0", "--tokens", "1"]).output().unwrap();
    assert!(!output.status.success());
}
