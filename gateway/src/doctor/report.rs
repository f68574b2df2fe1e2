//! The doctor's report, as `/debug/prefix-report` shows it: the fleet's and each tenant's traffic (the
//! repeated-prefix fraction beside the hit ratio per tier, where prompts diverge) and each raised diagnosis
//! with its evidence, the token text decoded and truncated, or redacted to lengths and digests. JSON
//! ([`Report`] serializes) or plain text ([`Report::to_text`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use serde::Serialize;
use serde_json::{Value, json};

use super::chain::tokens_digest;
use super::diagnosis::{Active, Difference, Evidence, Finding, Kind};
use super::tenant::TenantState;
use super::window::{Counters, DIVERGENCE_BUCKETS, divergence_label};
use super::{Doctor, Millis};

/// Token ids to text.
pub type Decode<'a> = &'a dyn Fn(&[u32]) -> String;

/// Characters of token text shown before it is cut.
pub const DEFAULT_TEXT_CHARS: usize = 120;

/// What a report shows.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportOptions {
    /// Token text as its length and a digest instead of the text.
    pub redact: bool,
    /// Only this tenant.
    pub tenant: Option<String>,
    pub max_text_chars: usize,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions { redact: false, tenant: None, max_text_chars: DEFAULT_TEXT_CHARS }
    }
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Routed prompts the doctor has observed, and replies it has seen finish (a test waits for these).
    pub observed_requests: u64,
    pub finished_requests: u64,
    /// Prompts not observed because the doctor was behind (set by the shell).
    pub dropped_requests: u64,
    pub window_seconds: f64,
    pub redacted: bool,
    pub tenants_tracked: usize,
    pub max_tenants: usize,
    pub memory_bytes: usize,
    /// Tenants with each diagnosis raised (every kind listed).
    pub active_diagnoses: BTreeMap<&'static str, usize>,
    pub fleet: Traffic,
    /// Tenants, most requests first.
    pub tenants: Vec<TenantReport>,
}

/// Traffic over the window.
#[derive(Clone, Debug, Serialize)]
pub struct Traffic {
    pub requests: u64,
    pub prompt_tokens: u64,
    /// The share of prompt tokens in a prefix the tenant sent before: the ceiling of any router's hit ratio.
    pub repeated_prefix_ratio: f64,
    pub hit_ratio: HitRatio,
    /// Requests by the block at which they left their tenant's longest previously seen prefix.
    pub divergence: Vec<Bucket>,
}

/// The share of prompt tokens found cached.
#[derive(Clone, Debug, Serialize)]
pub struct HitRatio {
    /// By the routing decisions, per tier of the chosen replica, and in all.
    pub gpu: f64,
    pub host: f64,
    pub network: f64,
    pub total: f64,
    /// By the replicas' own reports (`cached_tokens`), for the requests that finished.
    pub reported: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Bucket {
    pub blocks: String,
    pub requests: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TenantReport {
    pub tenant: String,
    /// `healthy` or `diagnosed`.
    pub status: &'static str,
    pub traffic: Traffic,
    pub diagnoses: Vec<DiagnosisReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DiagnosisReport {
    pub kind: &'static str,
    /// Seconds since it was raised.
    pub since_seconds: f64,
    /// Where prompts part: the block and its first differing token.
    pub block: u32,
    pub token: usize,
    /// Share of the tenant's recent prompts that show it.
    pub share: f64,
    pub summary: String,
    pub advice: &'static str,
    pub evidence: Value,
}

impl Traffic {
    fn of(counters: &Counters) -> Traffic {
        let divergence = (0..DIVERGENCE_BUCKETS)
            .map(|bucket| Bucket { blocks: divergence_label(bucket), requests: counters.divergence[bucket] })
            .collect();
        Traffic {
            requests: counters.requests,
            prompt_tokens: counters.prompt_tokens,
            repeated_prefix_ratio: round(counters.repeated_ratio()),
            hit_ratio: HitRatio {
                gpu: round(counters.matched_ratio(0)),
                host: round(counters.matched_ratio(1)),
                network: round(counters.matched_ratio(2)),
                total: round(counters.matched_total_ratio()),
                reported: round(counters.reported_ratio()),
            },
            divergence,
        }
    }
}

fn round(value: f64) -> f64 {
    (value * 1e4).round() / 1e4
}

/// Token text for a report.
struct Texts<'a> {
    decode: Decode<'a>,
    redact: bool,
    max_chars: usize,
}

impl Texts<'_> {
    fn text(&self, tokens: &[u32]) -> String {
        if self.redact {
            return format!("[{} tokens #{:08x}]", tokens.len(), tokens_digest(tokens) as u32);
        }
        let text = (self.decode)(tokens);
        match text.char_indices().nth(self.max_chars) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text,
        }
    }

    /// The difference with its two continuations named `current` and `previous`.
    fn difference(&self, difference: &Difference, current: &str, previous: &str) -> Value {
        let mut fields = serde_json::Map::new();
        fields.insert("context".into(), Value::String(self.text(&difference.context)));
        fields.insert(current.into(), Value::String(self.text(&difference.current)));
        fields.insert(previous.into(), Value::String(self.text(&difference.previous)));
        Value::Object(fields)
    }
}

pub(super) fn build(
    doctor: &Doctor,
    tenants: &HashMap<String, TenantState>,
    now: Millis,
    options: &ReportOptions,
    decode: Decode<'_>,
) -> Report {
    let texts = Texts { decode, redact: options.redact, max_chars: options.max_text_chars.max(1) };
    let mut shown: Vec<&TenantState> =
        tenants.values().filter(|tenant| options.tenant.as_ref().is_none_or(|name| *name == tenant.name)).collect();
    shown.sort_by_key(|tenant| (std::cmp::Reverse(tenant.window.total(now).requests), tenant.name.clone()));
    let active = doctor.active();
    let (observed, finished) = doctor.counts();
    Report {
        observed_requests: observed,
        finished_requests: finished,
        dropped_requests: 0,
        window_seconds: doctor.config().window_ms as f64 / 1e3,
        redacted: options.redact,
        tenants_tracked: tenants.len(),
        max_tenants: doctor.config().max_tenants,
        memory_bytes: doctor.memory_bytes(),
        active_diagnoses: Kind::ALL.iter().zip(active).map(|(kind, count)| (kind.as_str(), count)).collect(),
        fleet: Traffic::of(&doctor.fleet(now)),
        tenants: shown
            .into_iter()
            .map(|tenant| {
                let diagnoses: Vec<DiagnosisReport> =
                    tenant.diagnoses.iter().map(|active| diagnosis(active, now, &texts)).collect();
                TenantReport {
                    tenant: tenant.name.clone(),
                    status: if diagnoses.is_empty() { "healthy" } else { "diagnosed" },
                    traffic: Traffic::of(&tenant.window.total(now)),
                    diagnoses,
                }
            })
            .collect(),
    }
}

fn diagnosis(active: &Active, now: Millis, texts: &Texts<'_>) -> DiagnosisReport {
    let finding = &active.finding;
    let seconds = |at: Millis| now.saturating_sub(at) as f64 / 1e3;
    let evidence = match &finding.evidence {
        Evidence::VaryingTop { prompts, distinct, recurring_tokens, examples } => json!({
            "prompts": prompts,
            "distinct_values": distinct,
            "recurring_tokens": recurring_tokens,
            "examples": examples.iter().map(|e| texts.difference(e, "current", "previous")).collect::<Vec<_>>(),
        }),
        Evidence::UnstableOrder { prompts, blocks, reordered_tokens, examples } => json!({
            "prompts": prompts,
            "blocks": [blocks.0, blocks.1],
            "reordered_tokens": reordered_tokens,
            "examples": examples.iter().map(|e| texts.difference(e, "current", "previous")).collect::<Vec<_>>(),
        }),
        Evidence::PromptChanged {
            changed_at,
            old_last_seen,
            old_prompts,
            new_prompts,
            cold_requests,
            warm_at,
            example,
        } => json!({
            "changed_seconds_ago": seconds(*changed_at),
            "old_last_seen_seconds_ago": seconds(*old_last_seen),
            "old_prompts": old_prompts,
            "new_prompts": new_prompts,
            "cold_requests": cold_requests,
            "warm_after_seconds": warm_at.map(|warm| warm.saturating_sub(*changed_at) as f64 / 1e3),
            "expected_cold_period": "until each replica serving the tenant has computed the new prefix once",
            "change": texts.difference(example, "new", "old"),
        }),
        Evidence::Variants { variants, context } => json!({
            "context": texts.text(context),
            "variants": variants.iter().map(|variant| json!({
                "prompts": variant.prompts,
                "share": round(variant.share),
                "text": texts.text(&variant.text),
            })).collect::<Vec<_>>(),
        }),
        Evidence::Personalised { users, prompts, same_user_tokens, examples } => json!({
            "users": users,
            "prompts": prompts,
            "same_user_shared_tokens": same_user_tokens,
            "examples": examples.iter().map(|e| texts.difference(e, "user", "other_user")).collect::<Vec<_>>(),
        }),
    };
    DiagnosisReport {
        kind: finding.kind.as_str(),
        since_seconds: seconds(active.since),
        block: finding.block,
        token: finding.token,
        share: round(finding.share),
        summary: summary(finding),
        advice: advice(finding.kind),
        evidence,
    }
}

/// One sentence on what was found.
pub fn summary(finding: &Finding) -> String {
    let (block, token, percent) = (finding.block, finding.token, (finding.share * 100.0).round());
    match &finding.evidence {
        Evidence::VaryingTop { distinct, recurring_tokens, .. } => format!(
            "{percent}% of recent prompts differ at block {block} (token {token}) in a short span with {distinct} \
             distinct values, then agree again for about {recurring_tokens} tokens the cache cannot reuse"
        ),
        Evidence::UnstableOrder { blocks, reordered_tokens, .. } => format!(
            "{percent}% of recent prompts hold an earlier prompt's content in another order from block {} (up to \
             block {}): about {reordered_tokens} tokens recomputed per prompt",
            blocks.0, blocks.1
        ),
        Evidence::PromptChanged { new_prompts, old_prompts, cold_requests, warm_at, .. } => format!(
            "the prompt changed at block {block} (token {token}): {new_prompts} prompts of the new one since, none of \
             the old one ({old_prompts} before); {cold_requests} requests found it cold{}",
            if warm_at.is_some() { ", and it is cached now" } else { ", and it is not cached yet" }
        ),
        Evidence::Variants { variants, .. } => {
            let shares: Vec<String> =
                variants.iter().map(|variant| format!("{}%", (variant.share * 100.0).round())).collect();
            format!(
                "{} variants of the prompt part at block {block} (token {token}), served side by side ({}): each \
                 keeps its own cached prefix",
                variants.len(),
                shares.join(", ")
            )
        }
        Evidence::Personalised { users, same_user_tokens, .. } => format!(
            "prompts of {users} users part at block {block} (token {token}), where per-user content follows the \
             user field; one user's prompts share about {same_user_tokens} tokens, different users' only {token}"
        ),
    }
}

/// What to do about it.
pub fn advice(kind: Kind) -> &'static str {
    match kind {
        Kind::VaryingTop => {
            "move the varying content (a timestamp, request id or variant header) to the end of the prompt: stable \
             content first, variable content last"
        }
        Kind::UnstableOrder => {
            "serialise tools and JSON in a stable order (sorted); the gateway's --tool-order canonical (the default) \
             sorts the tools of chat requests"
        }
        Kind::PromptChanged => {
            "expected after a deploy that changed the prompt: the cache is cold until the new prefix is cached, and \
             the TTFT spike meanwhile is not a regression"
        }
        Kind::Variants => {
            "each variant (an A/B test?) has its own cached prefix tree and a share of the cache; expected while the \
             test runs"
        }
        Kind::Personalised => {
            "move the per-user content later in the prompt, after the content all users share, so the shared prefix \
             is cached once for everyone"
        }
    }
}

impl Report {
    /// The report as plain text, for a terminal.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "prefix-cache doctor: {} requests observed, {} finished, {} dropped; window {} s; {} of at most {} tenants",
            self.observed_requests,
            self.finished_requests,
            self.dropped_requests,
            self.window_seconds,
            self.tenants_tracked,
            self.max_tenants
        );
        traffic_text(&mut out, "fleet", &self.fleet);
        for tenant in &self.tenants {
            let _ = writeln!(out);
            traffic_text(&mut out, &format!("tenant {}: {}", tenant.tenant, tenant.status), &tenant.traffic);
            for diagnosis in &tenant.diagnoses {
                let _ = writeln!(
                    out,
                    "  ! {} at block {} (token {}), raised {:.0} s ago\n    {}\n    advice: {}",
                    diagnosis.kind,
                    diagnosis.block,
                    diagnosis.token,
                    diagnosis.since_seconds,
                    diagnosis.summary,
                    diagnosis.advice
                );
                evidence_text(&mut out, &diagnosis.evidence, "    ");
            }
        }
        out
    }
}

fn traffic_text(out: &mut String, title: &str, traffic: &Traffic) {
    let hit = &traffic.hit_ratio;
    let _ = writeln!(
        out,
        "{title}: {} requests, {} prompt tokens; repeated-prefix fraction {:.3} (the ceiling); hit ratio {:.3} \
         (gpu {:.3}, host {:.3}, network {:.3}), replicas reported {:.3}",
        traffic.requests,
        traffic.prompt_tokens,
        traffic.repeated_prefix_ratio,
        hit.total,
        hit.gpu,
        hit.host,
        hit.network,
        hit.reported
    );
    let buckets: Vec<String> = traffic
        .divergence
        .iter()
        .filter(|bucket| bucket.requests > 0)
        .map(|bucket| format!("{}: {}", bucket.blocks, bucket.requests))
        .collect();
    let _ = writeln!(out, "  diverging at block: {}", if buckets.is_empty() { "-".into() } else { buckets.join(", ") });
}

/// The evidence's fields, one a line, texts quoted.
fn evidence_text(out: &mut String, value: &Value, indent: &str) {
    let Value::Object(fields) = value else { return };
    for (key, value) in fields {
        match value {
            Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
                let _ = writeln!(out, "{indent}{key}:");
                for item in items {
                    let line: Vec<String> = item
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(key, value)| format!("{key} {}", scalar(value)))
                        .collect();
                    let _ = writeln!(out, "{indent}  - {}", line.join("; "));
                }
            }
            Value::Object(_) => {
                let _ = writeln!(out, "{indent}{key}:");
                evidence_text(out, value, &format!("{indent}  "));
            }
            other => {
                let _ = writeln!(out, "{indent}{key}: {}", scalar(other));
            }
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(text) => format!("{:?}", text),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Feed, join, words};
    use super::*;

    fn decode(ids: &[u32]) -> String {
        ids.iter().map(|id| format!("<{id}>")).collect()
    }

    fn stamped_feed() -> Feed {
        let mut feed = Feed::new();
        let system = words(1, 400);
        for request in 0..12u32 {
            feed.send("acme", None, &join(&[&[1, 2, 3], &[30_000 + request], &system, &words(9 + request, 20)]), &[]);
            feed.send("calm", None, &join(&[&system, &words(100 + request, 20)]), &[]);
        }
        feed
    }

    #[test]
    fn the_report_lists_diagnoses_with_decoded_or_redacted_evidence() {
        let feed = stamped_feed();
        let report = feed.doctor.report(feed.now, &ReportOptions::default(), &decode);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!((json["observed_requests"].as_u64(), json["finished_requests"].as_u64()), (Some(24), Some(24)));
        assert_eq!(json["active_diagnoses"]["varying_top"], 1);
        assert_eq!(json["active_diagnoses"]["personalised"], 0);
        assert_eq!(json["fleet"]["requests"], 24);
        let tenants = json["tenants"].as_array().unwrap();
        let acme = tenants.iter().find(|tenant| tenant["tenant"] == "acme").unwrap();
        let calm = tenants.iter().find(|tenant| tenant["tenant"] == "calm").unwrap();
        assert_eq!((acme["status"].as_str(), calm["status"].as_str()), (Some("diagnosed"), Some("healthy")));
        assert!(calm["diagnoses"].as_array().unwrap().is_empty());
        assert!(calm["traffic"]["repeated_prefix_ratio"].as_f64().unwrap() > 0.8, "{calm}");
        assert!(acme["traffic"]["repeated_prefix_ratio"].as_f64().unwrap() < 0.05, "{acme}");
        assert_eq!(acme["traffic"]["divergence"][0], serde_json::json!({"blocks": "0", "requests": 12}));
        let diagnosis = &acme["diagnoses"][0];
        assert_eq!((diagnosis["kind"].as_str(), diagnosis["block"].as_u64()), (Some("varying_top"), Some(0)));
        let example = &diagnosis["evidence"]["examples"][0];
        assert_eq!(example["context"], "<1><2><3>");
        assert_eq!(example["current"], "<30011>");
        assert_eq!(example["previous"], "<30010>");
        assert!(diagnosis["advice"].as_str().unwrap().contains("end of the prompt"));

        let redacted = ReportOptions { redact: true, tenant: Some("acme".into()), ..ReportOptions::default() };
        let json = serde_json::to_value(feed.doctor.report(feed.now, &redacted, &decode)).unwrap();
        assert_eq!(json["tenants"].as_array().unwrap().len(), 1);
        let example = &json["tenants"][0]["diagnoses"][0]["evidence"]["examples"][0];
        assert!(example["current"].as_str().unwrap().starts_with("[1 tokens #"), "{example}");
        assert!(!json.to_string().contains("<300"), "no token text when redacted");

        let text = report.to_text();
        assert!(text.contains("tenant acme: diagnosed"), "{text}");
        assert!(text.contains("! varying_top at block 0 (token 3)"), "{text}");
        assert!(text.contains("current \"<30011>\""), "{text}");
        assert!(text.contains("tenant calm: healthy"), "{text}");
    }

    #[test]
    fn long_text_is_cut() {
        let texts = Texts { decode: &|ids: &[u32]| "é".repeat(ids.len()), redact: false, max_chars: 5 };
        assert_eq!(texts.text(&[0; 3]), "ééé");
        assert_eq!(texts.text(&[0; 9]), "ééééé…");
    }
}
