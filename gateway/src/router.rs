//! Glue between the async shell and the synchronous routing core: feeds the
//! prefix index and the load ledger from replica events, builds replica views
//! from the pool and the ledger, runs the policy and the repeated-prefix
//! sketch, and hands each routed prompt to the prefix-cache doctor.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use kvroute_proto::BlockHash;
use kvroute_proto::domain::KvEventBatch;
use serde_json::{Value, json};

use crate::doctor::{Report, ReportOptions};
use crate::doctor_thread::{DoctorThread, DoctorTicket, Traffic};
use crate::metrics;
use crate::routing::{
    CandidateScore, Decision, Exclusion, IndexConfig, LoadLedger, LookupResult, Millis, Policy, PrefixIndex,
    PrefixSketch, ReplicaView, RouteRequest, SendTicket, SketchConfig, SplitMix64, fleet_rates,
};
use crate::upstream::{IndexSink, Pool, ReplicaId};

/// A routing decision in the shell's terms.
#[derive(Clone, Debug, Default)]
pub struct RoutePlan {
    /// Eligible replicas, best first: a failed attempt moves to the next.
    pub candidates: Vec<CandidateScore>,
    pub predicted_cached_tokens: usize,
    /// Every known replica is excluded because its queue is full.
    pub all_full: bool,
    /// Names the prompt to the prefix-cache doctor when its reply finishes ([`Router::finished`]).
    pub doctor: DoctorTicket,
}

/// The gateway's routing state.
pub struct Router {
    index: PrefixIndex,
    policy: Mutex<Policy>,
    rng: Mutex<SplitMix64>,
    sketch: PrefixSketch,
    doctor: DoctorThread,
    ledger: Mutex<LoadLedger>,
    pending_ttl: Millis,
    origin: Instant,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").field("index_entries", &self.index.len()).finish()
    }
}

impl Router {
    /// A router that hands each routed prompt to `doctor`.
    pub fn new(
        policy: Policy,
        index: IndexConfig,
        seed: u64,
        pending_ttl: Millis,
        doctor: DoctorThread,
    ) -> anyhow::Result<Router> {
        Ok(Router {
            index: PrefixIndex::new(index).map_err(|error| anyhow::anyhow!("prefix index: {error}"))?,
            policy: Mutex::new(policy),
            rng: Mutex::new(SplitMix64::new(seed)),
            sketch: PrefixSketch::new(&SketchConfig::default()),
            doctor,
            ledger: Mutex::new(LoadLedger::new()),
            pending_ttl,
            origin: Instant::now(),
        })
    }

    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.lock().map(|policy| policy.name()).unwrap_or("unknown")
    }

    fn now(&self) -> Millis {
        self.origin.elapsed().as_millis() as Millis
    }

    /// The ledger; a panic while it was held cannot leave it inconsistent (every update is one call).
    fn ledger(&self) -> MutexGuard<'_, LoadLedger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a request sent to `replica` with its prompt's full `blocks` and at most `output_tokens` to
    /// generate in its load until its replica's reports count it.
    pub fn sent_request(
        &self,
        replica: ReplicaId,
        uncached_tokens: u64,
        output_tokens: u32,
        blocks: Arc<[BlockHash]>,
    ) -> SendTicket {
        let now = self.now();
        self.ledger().sent(replica, uncached_tokens, output_tokens, blocks, now)
    }

    /// The replica accepted the request as `engine_id`.
    pub fn accepted(&self, ticket: SendTicket, engine_id: u64) {
        self.ledger().accepted(ticket, engine_id);
    }

    /// The request's first token came back: the replica has computed its prompt.
    pub fn prefilled(&self, ticket: SendTicket) {
        let now = self.now();
        self.ledger().prefilled(ticket, now);
    }

    /// The request failed before the replica accepted it.
    pub fn abandoned(&self, ticket: SendTicket) {
        self.ledger().abandoned(ticket);
    }

    /// Requests this gateway has on `replica` that it has not reported finished.
    pub fn in_flight(&self, replica: ReplicaId) -> usize {
        self.ledger().in_flight(replica)
    }

    /// Replica views for scoring: each replica's load from the ledger (its latest report and the requests
    /// sent that the report does not count), unmeasured rates filled in ([`fleet_rates`]).
    /// Each replica as routing sees it for a request with these prompt `hashes`.
    fn views(&self, pool: &Pool, hashes: &[BlockHash]) -> Vec<ReplicaView> {
        let replicas = pool.replicas();
        let now = self.now();
        let ledger = self.ledger();
        let mut views: Vec<ReplicaView> = replicas
            .iter()
            .filter_map(|replica| {
                let state = replica.state();
                let info = state.info?;
                Some(ReplicaView {
                    id: replica.id,
                    healthy: state.healthy,
                    load: ledger.load(replica.id, info.block_size),
                    tracked: ledger.tracked(replica.id, hashes, now),
                    block_size: info.block_size,
                    bytes_per_block: info.kv_geometry.bytes_per_block(info.block_size),
                    blocks_per_engine_block: info.blocks_per_engine_block(),
                })
            })
            .collect();
        drop(ledger);
        fleet_rates(&mut views);
        views
    }

    fn decide(
        &self,
        hashes: &[BlockHash],
        prompt_tokens: usize,
        views: &[ReplicaView],
        record: bool,
    ) -> (Decision, LookupResult) {
        let lookup = self.index.lookup(hashes, self.now());
        let request = RouteRequest { hashes, prompt_tokens, session_key: None };
        let mut fallback = SplitMix64::new(0);
        let mut rng_guard = self.rng.lock();
        let rng: &mut SplitMix64 = match rng_guard.as_mut() {
            Ok(rng) => rng,
            Err(_) => &mut fallback,
        };
        let decision = match self.policy.lock() {
            Ok(mut policy) if record => policy.decide(&request, views, &lookup, rng),
            Ok(policy) => policy.explain(&request, views, &lookup, rng),
            Err(_) => Decision { policy: "unavailable", chosen: None, rule: "internal", candidates: Vec::new() },
        };
        (decision, lookup)
    }

    /// Chooses replicas for a request, updates the repeated-prefix sketch and hands the prompt (moved, not
    /// copied) to the prefix-cache doctor, which works on it off the request path.
    pub fn plan(&self, hashes: &[BlockHash], pool: &Pool, traffic: Traffic) -> RoutePlan {
        let prompt_tokens = traffic.tokens.len();
        let views = self.views(pool, hashes);
        let (decision, _) = self.decide(hashes, prompt_tokens, &views, true);
        if tracing::enabled!(target: DECISION_LOG, tracing::Level::DEBUG) {
            tracing::debug!(
                target: DECISION_LOG,
                policy = decision.policy,
                rule = decision.rule,
                chosen = ?decision.chosen,
                prompt_tokens,
                candidates = %describe_candidates(&decision.candidates),
                "routing decision"
            );
        }
        self.sketch.observe(hashes);
        metrics::record_repeated_prefix_ratio(self.sketch.ratio());
        let block_size = pool.block_size();
        let chosen = decision.candidates.iter().find(|candidate| Some(candidate.replica) == decision.chosen);
        let matched = chosen.map_or([0; 3], |chosen| {
            [chosen.gpu_blocks, chosen.host_blocks, chosen.network_blocks]
                .map(|blocks| u64::from(blocks) * u64::from(block_size))
        });
        let doctor = self.doctor.observe(self.now(), traffic, matched);
        let all_full = !decision.candidates.is_empty()
            && decision.candidates.iter().all(|candidate| candidate.excluded == Some(Exclusion::QueueFull));
        RoutePlan {
            candidates: decision.ranked().into_iter().cloned().collect(),
            predicted_cached_tokens: decision.predicted_cached_tokens(block_size) as usize,
            all_full,
            doctor,
        }
    }

    /// A routed request's reply finished: the doctor remembers its blocks and the replica's cached tokens.
    pub fn finished(&self, ticket: DoctorTicket, reply: Vec<u32>, prompt_tokens: u32, cached_tokens: u32) {
        self.doctor.finished(ticket, self.now(), reply, u64::from(prompt_tokens), u64::from(cached_tokens));
    }

    /// The prefix-cache doctor's report; `decode` turns token ids into text.
    pub fn prefix_report(&self, options: &ReportOptions, decode: &dyn Fn(&[u32]) -> String) -> Report {
        self.doctor.report(self.now(), options, decode)
    }

    /// Whether the prefix-cache doctor tracks `tenant`.
    pub fn doctor_knows(&self, tenant: &str) -> bool {
        self.doctor.knows(tenant)
    }

    /// Records that a request's blocks are on their way to `candidate`'s replica: those it will
    /// compute count as pending there.
    pub fn sent(&self, candidate: &CandidateScore, hashes: &[BlockHash]) {
        self.index.add_pending(candidate.replica, candidate.unreached(hashes), self.now(), self.pending_ttl);
    }

    /// Each replica's matched blocks per tier, predicted TTFT, and the choice.
    pub fn explain(&self, hashes: &[BlockHash], prompt_tokens: usize, pool: &Pool) -> Value {
        let views = self.views(pool, hashes);
        let (decision, _) = self.decide(hashes, prompt_tokens, &views, false);
        let endpoint = |id: ReplicaId| pool.get(id).map(|replica| replica.endpoint.clone()).unwrap_or_default();
        let candidates: Vec<Value> = decision
            .candidates
            .iter()
            .map(|candidate| {
                json!({
                    "replica": endpoint(candidate.replica),
                    "gpu_blocks": candidate.gpu_blocks,
                    "host_blocks": candidate.host_blocks,
                    "network_blocks": candidate.network_blocks,
                    "predicted_ttft_s": candidate.predicted_ttft_s,
                    "queue_wait_s": candidate.prediction.queue_wait_s,
                    "compute_s": candidate.prediction.compute_s,
                    "memory_wait_s": candidate.prediction.memory_wait_s,
                    "slot_wait_s": candidate.prediction.slot_wait_s,
                    "delay_to_others_s": candidate.prediction.delay_to_others_s,
                    "eviction_s": candidate.prediction.eviction_s,
                    "policy_score": candidate.policy_score,
                    "excluded": candidate.excluded.map(Exclusion::as_str),
                })
            })
            .collect();
        json!({
            "policy": decision.policy,
            "rule": decision.rule,
            "prompt_tokens": prompt_tokens,
            "prompt_blocks": hashes.len(),
            "chosen": decision.chosen.map(endpoint),
            "candidates": candidates,
        })
    }

    /// Publishes index gauges (called when /metrics is scraped).
    pub fn publish_metrics(&self) {
        let stats = self.index.stats();
        metrics::record_index(stats.entries, stats.memory_bytes);
    }
}

impl IndexSink for Router {
    fn batch(&self, replica: ReplicaId, batch: &KvEventBatch) {
        let started = Instant::now();
        if let Err(error) = self.index.apply_batch(replica, batch) {
            tracing::warn!(replica, %error, "cannot apply an event batch");
        }
        metrics::record_event_ingest(batch.events.len(), started.elapsed());
        let (load, next, finished) = (&batch.load, batch.next_request_id, &batch.finished_request_ids);
        self.ledger().reported(replica, batch.epoch, load, next, finished, self.now());
    }

    fn forget(&self, replica: ReplicaId) {
        let _ = self.index.remove_replica(replica);
        self.ledger().forget(replica);
        if let Ok(mut policy) = self.policy.lock() {
            policy.forget_replica(replica);
        }
    }
}

/// The tracing target of the one debug line per routing decision (`RUST_LOG=kvroute::decision=debug`):
/// the policy, the rule that chose, and each candidate's matched blocks per tier, predicted TTFT, queue
/// wait and score. Written only when enabled.
pub const DECISION_LOG: &str = "kvroute::decision";

/// `replica:gpu/host/network blocks,ttft ms,queue ms,score[,excluded]` for each candidate, `;`-separated.
fn describe_candidates(candidates: &[CandidateScore]) -> String {
    candidates
        .iter()
        .map(|candidate| {
            let mut line = format!(
                "{}:{}/{}/{},{:.1},{:.1},{:.4}",
                candidate.replica,
                candidate.gpu_blocks,
                candidate.host_blocks,
                candidate.network_blocks,
                candidate.predicted_ttft_s * 1e3,
                candidate.prediction.queue_wait_s * 1e3,
                candidate.policy_score,
            );
            if let Some(excluded) = candidate.excluded {
                line.push_str(&format!(",{excluded:?}"));
            }
            line
        })
        .collect::<Vec<_>>()
        .join(";")
}
