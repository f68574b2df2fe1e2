//! What the doctor can diagnose ([`Kind`]), a detector's [`Finding`] with its evidence, and the life of a
//! tenant's diagnoses: raised when a detector first finds something, kept up to date while it keeps finding
//! it, resolved after `resolve_after` prompts without it (a prompt change is an event: it stays for
//! `change_hold` after it was found).

use crate::routing::Millis;

/// The diagnoses, in the order reports list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Something that changes with every request (a timestamp, a request id, a variant header) sits near the
    /// top, while the rest of the prompt recurs.
    VaryingTop,
    /// The same content arrives in varying orders (tools or JSON keys serialised in varying order).
    UnstableOrder,
    /// A new prompt replaced the old one (a deploy that changed the system prompt): a cold cache for a while.
    PromptChanged,
    /// A few variants of the prompt are served side by side (an A/B test): each has its own cached prefix.
    Variants,
    /// Per-user content near the top: prompts share a prefix per user instead of across users.
    Personalised,
}

impl Kind {
    pub const ALL: [Kind; 5] =
        [Kind::VaryingTop, Kind::UnstableOrder, Kind::PromptChanged, Kind::Variants, Kind::Personalised];

    /// The name in reports, logs and the `kind` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::VaryingTop => "varying_top",
            Kind::UnstableOrder => "unstable_order",
            Kind::PromptChanged => "prompt_changed",
            Kind::Variants => "variants",
            Kind::Personalised => "personalised",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The token text behind a finding: where two prompts part and how each goes on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Difference {
    /// The tokens both have just before they part.
    pub context: Vec<u32>,
    /// How this prompt goes on (the differing span, or its first tokens).
    pub current: Vec<u32>,
    /// How the other goes on.
    pub previous: Vec<u32>,
}

/// One variant of a split prefix.
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    pub prompts: usize,
    /// Its share of the prompts through the split.
    pub share: f64,
    /// How it goes on where it parts from another variant.
    pub text: Vec<u32>,
}

/// What a detector saw, per kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Evidence {
    VaryingTop {
        /// Prompts (of the recent ones) that part from an earlier one here and then agree with it again.
        prompts: usize,
        /// Distinct differing spans among them.
        distinct: usize,
        /// Median tokens that agree again after the span: what the cache could have reused.
        recurring_tokens: usize,
        /// Recent examples, newest first.
        examples: Vec<Difference>,
    },
    UnstableOrder {
        /// Prompts that hold an earlier one's content in another order from here.
        prompts: usize,
        /// Blocks at which they part (lowest, highest).
        blocks: (u32, u32),
        /// Median tokens of the reordered content.
        reordered_tokens: usize,
        examples: Vec<Difference>,
    },
    PromptChanged {
        /// When the new prompt was first seen.
        changed_at: Millis,
        /// When the old one was last seen.
        old_last_seen: Millis,
        old_prompts: usize,
        new_prompts: usize,
        /// Requests of the new prompt routed before one found it cached.
        cold_requests: usize,
        /// When a request first found the new prompt cached.
        warm_at: Option<Millis>,
        /// Old (`previous`) against new (`current`).
        example: Difference,
    },
    Variants {
        variants: Vec<Variant>,
        /// The tokens all variants share just before they part.
        context: Vec<u32>,
    },
    Personalised {
        /// Users whose prompts part from other users' here.
        users: usize,
        /// Prompts that part from another user's here.
        prompts: usize,
        /// Median tokens a prompt shares with the same user's earlier prompt.
        same_user_tokens: usize,
        /// Examples: this user's span (`current`) against another user's (`previous`).
        examples: Vec<Difference>,
    },
}

/// A detector's finding.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub kind: Kind,
    /// The block (and first token) where the prompts part.
    pub block: u32,
    pub token: usize,
    /// Share of the recent prompts that show it.
    pub share: f64,
    pub evidence: Evidence,
}

/// A raised diagnosis.
#[derive(Clone, Debug, PartialEq)]
pub struct Active {
    pub finding: Finding,
    /// When it was raised.
    pub since: Millis,
    /// Prompts in a row whose check did not find it.
    misses: u32,
}

/// A diagnosis raised or resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub tenant: String,
    pub kind: Kind,
    pub raised: bool,
    pub block: u32,
    pub token: usize,
}

/// A tenant's diagnoses, one per kind.
#[derive(Clone, Debug, Default)]
pub struct Diagnoses {
    active: [Option<Active>; 5],
}

impl Diagnoses {
    /// Applies one prompt's checks of `tenant`: `found` holds what each detector found now (at most one per
    /// kind). Returns the diagnoses raised or resolved.
    pub fn update(
        &mut self,
        tenant: &str,
        now: Millis,
        found: Vec<Finding>,
        resolve_after: u32,
        change_hold: Millis,
    ) -> Vec<Change> {
        let change = |kind, raised, finding: &Finding| Change {
            tenant: tenant.to_string(),
            kind,
            raised,
            block: finding.block,
            token: finding.token,
        };
        let mut changes = Vec::new();
        let mut seen = [false; 5];
        for finding in found {
            let slot = &mut self.active[finding.kind.index()];
            seen[finding.kind.index()] = true;
            match slot {
                Some(active) => {
                    active.misses = 0;
                    active.finding = finding;
                }
                None => {
                    changes.push(change(finding.kind, true, &finding));
                    *slot = Some(Active { finding, since: now, misses: 0 });
                }
            }
        }
        for kind in Kind::ALL {
            let slot = &mut self.active[kind.index()];
            let Some(active) = slot else { continue };
            if seen[kind.index()] {
                continue;
            }
            active.misses += 1;
            let over = match kind {
                Kind::PromptChanged => now >= active.since.saturating_add(change_hold),
                _ => active.misses >= resolve_after,
            };
            if over {
                changes.push(change(kind, false, &active.finding));
                *slot = None;
            }
        }
        changes
    }

    pub fn get(&self, kind: Kind) -> Option<&Active> {
        self.active[kind.index()].as_ref()
    }

    pub fn is_active(&self, kind: Kind) -> bool {
        self.active[kind.index()].is_some()
    }

    /// The raised diagnoses, in [`Kind::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = &Active> {
        self.active.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(kind: Kind, block: u32) -> Finding {
        let evidence = Evidence::Variants { variants: Vec::new(), context: Vec::new() };
        Finding { kind, block, token: block as usize * 16, share: 1.0, evidence }
    }

    #[test]
    fn raised_once_kept_current_resolved_after_misses_and_a_change_held() {
        let mut diagnoses = Diagnoses::default();
        let mut update = |now, found| -> Vec<(Kind, bool, u32, usize)> {
            let changes = diagnoses.update("t", now, found, 3, 100);
            changes.into_iter().map(|change| (change.kind, change.raised, change.block, change.token)).collect()
        };
        let raised = update(0, vec![finding(Kind::VaryingTop, 0), finding(Kind::PromptChanged, 3)]);
        assert_eq!(raised, vec![(Kind::VaryingTop, true, 0, 0), (Kind::PromptChanged, true, 3, 48)]);
        // Found again: no change, the evidence is the newest.
        assert!(update(10, vec![finding(Kind::VaryingTop, 1)]).is_empty());
        assert!(update(20, Vec::new()).is_empty());
        assert!(update(30, Vec::new()).is_empty());
        assert_eq!(update(40, Vec::new()), vec![(Kind::VaryingTop, false, 1, 16)]);
        assert_eq!(update(50, Vec::new()), vec![], "an event is held");
        assert_eq!(update(100, Vec::new()), vec![(Kind::PromptChanged, false, 3, 48)]);
        assert_eq!(diagnoses.iter().count(), 0);
        diagnoses.update("t", 200, vec![finding(Kind::Variants, 2)], 3, 100);
        diagnoses.update("t", 300, vec![finding(Kind::Variants, 4)], 3, 100);
        let active = diagnoses.get(Kind::Variants).unwrap();
        assert_eq!((active.since, active.finding.block), (200, 4), "raised at 200, the newest evidence");
        assert!(diagnoses.is_active(Kind::Variants));
    }
}
