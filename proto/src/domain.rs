//! Validated domain types and their conversions from and to the wire.
//!
//! Receiving code converts a `pb` message with `TryFrom`; a message that does
//! not validate gives a [`WireError`] naming the field and the reason, never a
//! panic. Sending code converts with `From`, which cannot fail.

use std::fmt;
use std::str::FromStr;

use crate::block_hash::BlockHash;
use crate::pb;

/// A wire message that does not describe a valid value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct WireError {
    pub field: &'static str,
    pub reason: String,
}

impl WireError {
    pub fn new(field: &'static str, reason: impl Into<String>) -> WireError {
        WireError { field, reason: reason.into() }
    }
}

/// Where a KV block lives, from fastest to slowest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// G1: the engine's block pool.
    Gpu,
    /// G2: host RAM of the same replica.
    Host,
    /// G3: the shared network tier.
    Network,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Gpu, Tier::Host, Tier::Network];

    /// The label used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Gpu => "gpu",
            Tier::Host => "host",
            Tier::Network => "network",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<i32> for Tier {
    type Error = WireError;
    fn try_from(value: i32) -> Result<Self, Self::Error> {
        match pb::Tier::try_from(value) {
            Ok(pb::Tier::Gpu) => Ok(Tier::Gpu),
            Ok(pb::Tier::Host) => Ok(Tier::Host),
            Ok(pb::Tier::Network) => Ok(Tier::Network),
            Ok(pb::Tier::Unspecified) => Err(WireError::new("tier", "unspecified")),
            Err(_) => Err(WireError::new("tier", format!("unknown value {value}"))),
        }
    }
}

impl From<Tier> for pb::Tier {
    fn from(tier: Tier) -> Self {
        match tier {
            Tier::Gpu => pb::Tier::Gpu,
            Tier::Host => pb::Tier::Host,
            Tier::Network => pb::Tier::Network,
        }
    }
}

/// Element type of stored K and V values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    Bf16,
    /// fp8 e4m3 with a fixed per-layer scale.
    Fp8E4m3,
}

impl KvDtype {
    pub fn bytes_per_element(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 => 2,
            KvDtype::Fp8E4m3 => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8E4m3 => "fp8",
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KvDtype {
    type Err = WireError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "f32" => Ok(KvDtype::F32),
            "bf16" => Ok(KvDtype::Bf16),
            "fp8" | "fp8_e4m3" | "e4m3" => Ok(KvDtype::Fp8E4m3),
            other => Err(WireError::new("kv dtype", format!("unknown dtype {other:?} (expected f32, bf16 or fp8)"))),
        }
    }
}

impl TryFrom<i32> for KvDtype {
    type Error = WireError;
    fn try_from(value: i32) -> Result<Self, Self::Error> {
        match pb::KvDtype::try_from(value) {
            Ok(pb::KvDtype::F32) => Ok(KvDtype::F32),
            Ok(pb::KvDtype::Bf16) => Ok(KvDtype::Bf16),
            Ok(pb::KvDtype::Fp8E4m3) => Ok(KvDtype::Fp8E4m3),
            Ok(pb::KvDtype::Unspecified) => Err(WireError::new("kv dtype", "unspecified")),
            Err(_) => Err(WireError::new("kv dtype", format!("unknown value {value}"))),
        }
    }
}

impl From<KvDtype> for pb::KvDtype {
    fn from(dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::F32 => pb::KvDtype::F32,
            KvDtype::Bf16 => pb::KvDtype::Bf16,
            KvDtype::Fp8E4m3 => pb::KvDtype::Fp8E4m3,
        }
    }
}

/// Shape and type of a model's KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvGeometry {
    pub num_layers: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub dtype: KvDtype,
}

impl KvGeometry {
    /// Bytes of K and V for one token across all layers.
    pub fn bytes_per_token(&self) -> u64 {
        2 * u64::from(self.num_layers)
            * u64::from(self.num_kv_heads)
            * u64::from(self.head_dim)
            * self.dtype.bytes_per_element() as u64
    }

    pub fn bytes_per_block(&self, block_size: u32) -> u64 {
        self.bytes_per_token() * u64::from(block_size)
    }
}

impl TryFrom<pb::KvGeometry> for KvGeometry {
    type Error = WireError;
    fn try_from(wire: pb::KvGeometry) -> Result<Self, Self::Error> {
        let positive = |field, value: u32| {
            if value == 0 { Err(WireError::new(field, "must be positive")) } else { Ok(value) }
        };
        Ok(KvGeometry {
            num_layers: positive("kv_geometry.num_layers", wire.num_layers)?,
            num_kv_heads: positive("kv_geometry.num_kv_heads", wire.num_kv_heads)?,
            head_dim: positive("kv_geometry.head_dim", wire.head_dim)?,
            dtype: KvDtype::try_from(wire.dtype)?,
        })
    }
}

impl From<KvGeometry> for pb::KvGeometry {
    fn from(geometry: KvGeometry) -> Self {
        pb::KvGeometry {
            num_layers: geometry.num_layers,
            num_kv_heads: geometry.num_kv_heads,
            head_dim: geometry.head_dim,
            dtype: pb::KvDtype::from(geometry.dtype) as i32,
        }
    }
}

/// A change to the set of blocks an agent holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Blocks became available in a tier, in prefix-chain order.
    Stored { tier: Tier, hashes: Vec<BlockHash> },
    /// Blocks left a tier.
    Removed { tier: Tier, hashes: Vec<BlockHash> },
    /// Every block of the tier is gone.
    Cleared { tier: Tier },
}

fn hashes_from_wire(field: &'static str, raw: Vec<Vec<u8>>) -> Result<Vec<BlockHash>, WireError> {
    raw.iter()
        .map(|bytes| {
            BlockHash::from_slice(bytes)
                .ok_or_else(|| WireError::new(field, format!("a block hash has 16 bytes, got {}", bytes.len())))
        })
        .collect()
}

fn hashes_to_wire(hashes: Vec<BlockHash>) -> Vec<Vec<u8>> {
    hashes.into_iter().map(|hash| hash.0.to_vec()).collect()
}

impl TryFrom<pb::KvEvent> for KvEvent {
    type Error = WireError;
    fn try_from(wire: pb::KvEvent) -> Result<Self, Self::Error> {
        use pb::kv_event::Kind;
        match wire.kind {
            Some(Kind::Stored(stored)) => Ok(KvEvent::Stored {
                tier: Tier::try_from(stored.tier)?,
                hashes: hashes_from_wire("stored.block_hashes", stored.block_hashes)?,
            }),
            Some(Kind::Removed(removed)) => Ok(KvEvent::Removed {
                tier: Tier::try_from(removed.tier)?,
                hashes: hashes_from_wire("removed.block_hashes", removed.block_hashes)?,
            }),
            Some(Kind::Cleared(cleared)) => Ok(KvEvent::Cleared { tier: Tier::try_from(cleared.tier)? }),
            None => Err(WireError::new("event", "no kind set")),
        }
    }
}

impl From<KvEvent> for pb::KvEvent {
    fn from(event: KvEvent) -> Self {
        use pb::kv_event::Kind;
        let kind = match event {
            KvEvent::Stored { tier, hashes } => Kind::Stored(pb::BlocksStored {
                tier: pb::Tier::from(tier) as i32,
                block_hashes: hashes_to_wire(hashes),
            }),
            KvEvent::Removed { tier, hashes } => Kind::Removed(pb::BlocksRemoved {
                tier: pb::Tier::from(tier) as i32,
                block_hashes: hashes_to_wire(hashes),
            }),
            KvEvent::Cleared { tier } => Kind::Cleared(pb::TierCleared { tier: pb::Tier::from(tier) as i32 }),
        };
        pb::KvEvent { kind: Some(kind) }
    }
}

/// A replica's load, as reported with every event batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadStats {
    pub waiting_requests: u32,
    pub running_requests: u32,
    pub queued_prefill_tokens: u64,
    pub kv_blocks_used: u64,
    pub kv_blocks_total: u64,
    pub prefill_tokens_per_second: f64,
    pub decode_step_seconds: f64,
    pub host_bytes_per_second: f64,
    pub network_bytes_per_second: f64,
    pub network_tier_up: bool,
    pub draining: bool,
    /// Requests the agent queues at most (those waiting included); 0 when unknown.
    pub queue_capacity: u32,
    /// The engine was inside a step when the batch was sent, which had run for `step_seconds`.
    pub step_in_progress: bool,
    pub step_seconds: f64,
    /// Sequences the engine runs at once at most (a request beyond them waits for one to finish); 0 when
    /// unknown.
    pub max_running_requests: u32,
}

impl LoadStats {
    /// Fraction of KV blocks in use, 0 when the total is unknown.
    pub fn kv_usage(&self) -> f64 {
        if self.kv_blocks_total == 0 { 0.0 } else { self.kv_blocks_used as f64 / self.kv_blocks_total as f64 }
    }
}

fn rate(field: &'static str, value: f64) -> Result<f64, WireError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(WireError::new(field, format!("must be finite and not negative, got {value}")))
    }
}

impl TryFrom<pb::LoadStats> for LoadStats {
    type Error = WireError;
    fn try_from(wire: pb::LoadStats) -> Result<Self, Self::Error> {
        if wire.kv_blocks_used > wire.kv_blocks_total {
            return Err(WireError::new("load.kv_blocks_used", "exceeds kv_blocks_total"));
        }
        Ok(LoadStats {
            waiting_requests: wire.waiting_requests,
            running_requests: wire.running_requests,
            queued_prefill_tokens: wire.queued_prefill_tokens,
            kv_blocks_used: wire.kv_blocks_used,
            kv_blocks_total: wire.kv_blocks_total,
            prefill_tokens_per_second: rate("load.prefill_tokens_per_second", wire.prefill_tokens_per_second)?,
            decode_step_seconds: rate("load.decode_step_seconds", wire.decode_step_seconds)?,
            host_bytes_per_second: rate("load.host_bytes_per_second", wire.host_bytes_per_second)?,
            network_bytes_per_second: rate("load.network_bytes_per_second", wire.network_bytes_per_second)?,
            network_tier_up: wire.network_tier_up,
            draining: wire.draining,
            queue_capacity: wire.queue_capacity,
            step_in_progress: wire.step_in_progress,
            step_seconds: rate("load.step_seconds", wire.step_seconds)?,
            max_running_requests: wire.max_running_requests,
        })
    }
}

impl From<LoadStats> for pb::LoadStats {
    fn from(load: LoadStats) -> Self {
        pb::LoadStats {
            waiting_requests: load.waiting_requests,
            running_requests: load.running_requests,
            queued_prefill_tokens: load.queued_prefill_tokens,
            kv_blocks_used: load.kv_blocks_used,
            kv_blocks_total: load.kv_blocks_total,
            prefill_tokens_per_second: load.prefill_tokens_per_second,
            decode_step_seconds: load.decode_step_seconds,
            host_bytes_per_second: load.host_bytes_per_second,
            network_bytes_per_second: load.network_bytes_per_second,
            network_tier_up: load.network_tier_up,
            draining: load.draining,
            queue_capacity: load.queue_capacity,
            step_in_progress: load.step_in_progress,
            step_seconds: load.step_seconds,
            max_running_requests: load.max_running_requests,
        }
    }
}

/// One message of an agent's event stream.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventBatch {
    pub agent_id: String,
    pub epoch: u64,
    pub seq: u64,
    pub snapshot: bool,
    pub events: Vec<KvEvent>,
    pub load: LoadStats,
    /// Sender's wall clock at sending, microseconds since the Unix epoch (0: unknown).
    pub sent_unix_micros: u64,
    /// Engine request ids finished (or failed, or cancelled) since the previous batch of the stream.
    pub finished_request_ids: Vec<u64>,
    /// The engine's next request id: `load` counts the unfinished requests below it, none at or above it.
    pub next_request_id: u64,
}

impl KvEventBatch {
    /// Microseconds since the Unix epoch now, for [`KvEventBatch::sent_unix_micros`].
    pub fn now_unix_micros() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
    }
}

impl TryFrom<pb::KvEventBatch> for KvEventBatch {
    type Error = WireError;
    fn try_from(wire: pb::KvEventBatch) -> Result<Self, Self::Error> {
        if wire.agent_id.is_empty() {
            return Err(WireError::new("agent_id", "must not be empty"));
        }
        let load = wire.load.ok_or_else(|| WireError::new("load", "missing"))?;
        Ok(KvEventBatch {
            agent_id: wire.agent_id,
            epoch: wire.epoch,
            seq: wire.seq,
            snapshot: wire.snapshot,
            events: wire.events.into_iter().map(KvEvent::try_from).collect::<Result<_, _>>()?,
            load: LoadStats::try_from(load)?,
            sent_unix_micros: wire.sent_unix_micros,
            finished_request_ids: wire.finished_request_ids,
            next_request_id: wire.next_request_id,
        })
    }
}

impl From<KvEventBatch> for pb::KvEventBatch {
    fn from(batch: KvEventBatch) -> Self {
        pb::KvEventBatch {
            agent_id: batch.agent_id,
            epoch: batch.epoch,
            seq: batch.seq,
            snapshot: batch.snapshot,
            events: batch.events.into_iter().map(pb::KvEvent::from).collect(),
            load: Some(batch.load.into()),
            sent_unix_micros: batch.sent_unix_micros,
            finished_request_ids: batch.finished_request_ids,
            next_request_id: batch.next_request_id,
        }
    }
}

/// Sampling settings; temperature 0 is greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    pub seed: Option<u64>,
}

impl SamplingParams {
    pub const GREEDY: SamplingParams = SamplingParams { temperature: 0.0, top_p: 1.0, seed: None };

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Validates raw values; `top_p` 0 means 1 (the proto3 default).
    pub fn new(temperature: f32, top_p: f32, seed: Option<u64>) -> Result<SamplingParams, WireError> {
        if !temperature.is_finite() || !(0.0..=2.0).contains(&temperature) {
            return Err(WireError::new("sampling.temperature", format!("must be between 0 and 2, got {temperature}")));
        }
        let top_p = if top_p == 0.0 { 1.0 } else { top_p };
        if !(top_p.is_finite() && top_p > 0.0 && top_p <= 1.0) {
            return Err(WireError::new("sampling.top_p", format!("must be in (0, 1], got {top_p}")));
        }
        Ok(SamplingParams { temperature, top_p, seed })
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams::GREEDY
    }
}

impl TryFrom<Option<pb::SamplingParams>> for SamplingParams {
    type Error = WireError;
    fn try_from(wire: Option<pb::SamplingParams>) -> Result<Self, Self::Error> {
        match wire {
            None => Ok(SamplingParams::GREEDY),
            Some(wire) => SamplingParams::new(wire.temperature, wire.top_p, wire.seed),
        }
    }
}

impl From<SamplingParams> for pb::SamplingParams {
    fn from(params: SamplingParams) -> Self {
        pb::SamplingParams { temperature: params.temperature, top_p: params.top_p, seed: params.seed }
    }
}

/// Whether a request may reuse and leave cached blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheMode {
    #[default]
    Shared,
    Disabled,
}

/// A generation request as the agent runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentGenerateRequest {
    pub request_id: String,
    /// Not empty; ids are checked against the vocabulary by the agent.
    pub prompt: Vec<u32>,
    pub cache_scope: Vec<u8>,
    pub cache_mode: CacheMode,
    pub sampling: SamplingParams,
    /// At least 1.
    pub max_tokens: u32,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
}

/// Longest accepted cache scope, in bytes.
pub const MAX_SCOPE_BYTES: usize = 1024;

impl TryFrom<pb::AgentGenerateRequest> for AgentGenerateRequest {
    type Error = WireError;
    fn try_from(wire: pb::AgentGenerateRequest) -> Result<Self, Self::Error> {
        if wire.prompt_token_ids.is_empty() {
            return Err(WireError::new("prompt_token_ids", "the prompt is empty"));
        }
        if wire.max_tokens == 0 {
            return Err(WireError::new("max_tokens", "must be at least 1"));
        }
        if wire.cache_scope.len() > MAX_SCOPE_BYTES {
            return Err(WireError::new("cache_scope", format!("longer than {MAX_SCOPE_BYTES} bytes")));
        }
        let cache_mode = match pb::CacheMode::try_from(wire.cache_mode) {
            Ok(pb::CacheMode::Shared) => CacheMode::Shared,
            Ok(pb::CacheMode::Disabled) => CacheMode::Disabled,
            Err(_) => return Err(WireError::new("cache_mode", format!("unknown value {}", wire.cache_mode))),
        };
        Ok(AgentGenerateRequest {
            request_id: wire.request_id,
            prompt: wire.prompt_token_ids,
            cache_scope: wire.cache_scope,
            cache_mode,
            sampling: SamplingParams::try_from(wire.sampling)?,
            max_tokens: wire.max_tokens,
            stop_token_ids: wire.stop_token_ids,
            ignore_eos: wire.ignore_eos,
        })
    }
}

impl From<AgentGenerateRequest> for pb::AgentGenerateRequest {
    fn from(request: AgentGenerateRequest) -> Self {
        pb::AgentGenerateRequest {
            request_id: request.request_id,
            prompt_token_ids: request.prompt,
            cache_scope: request.cache_scope,
            cache_mode: match request.cache_mode {
                CacheMode::Shared => pb::CacheMode::Shared as i32,
                CacheMode::Disabled => pb::CacheMode::Disabled as i32,
            },
            sampling: Some(request.sampling.into()),
            max_tokens: request.max_tokens,
            stop_token_ids: request.stop_token_ids,
            ignore_eos: request.ignore_eos,
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Context,
}

impl FinishReason {
    /// The OpenAI name of the reason.
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length | FinishReason::Context => "length",
        }
    }
}

impl TryFrom<i32> for FinishReason {
    type Error = WireError;
    fn try_from(value: i32) -> Result<Self, Self::Error> {
        match pb::FinishReason::try_from(value) {
            Ok(pb::FinishReason::Stop) => Ok(FinishReason::Stop),
            Ok(pb::FinishReason::Length) => Ok(FinishReason::Length),
            Ok(pb::FinishReason::Context) => Ok(FinishReason::Context),
            Ok(pb::FinishReason::Unspecified) => Err(WireError::new("finish_reason", "unspecified")),
            Err(_) => Err(WireError::new("finish_reason", format!("unknown value {value}"))),
        }
    }
}

impl From<FinishReason> for pb::FinishReason {
    fn from(reason: FinishReason) -> Self {
        match reason {
            FinishReason::Stop => pb::FinishReason::Stop,
            FinishReason::Length => pb::FinishReason::Length,
            FinishReason::Context => pb::FinishReason::Context,
        }
    }
}

/// Token accounting of one finished request, as the agent reports it and the gateway returns it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens whose K/V came from a cache instead of being computed.
    pub cached_tokens: u32,
}

impl From<Usage> for pb::Usage {
    fn from(usage: Usage) -> Self {
        pb::Usage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            cached_tokens: usage.cached_tokens,
        }
    }
}

/// Static facts about an agent.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentInfo {
    pub agent_id: String,
    pub epoch: u64,
    pub model_id: String,
    pub block_size: u32,
    pub kv_geometry: KvGeometry,
    pub vocab_size: u32,
    pub max_context_tokens: u32,
    pub tiers: Vec<TierInfo>,
    pub tokenizer_fingerprint: String,
    pub kv_blocks_total: u64,
    pub eos_token_ids: Vec<u32>,
    /// Tokens per block of the engine's own prefix cache (a multiple of `block_size`): it caches a prompt in
    /// whole blocks of these only.
    pub engine_block_size: u32,
}

impl AgentInfo {
    /// Blocks (of `block_size` tokens) per block of the engine's own cache.
    pub fn blocks_per_engine_block(&self) -> u32 {
        (self.engine_block_size / self.block_size.max(1)).max(1)
    }

    /// The leading `blocks` (of `block_size` tokens) of a prompt the engine can cache: whole engine blocks.
    pub fn cacheable_blocks(&self, blocks: usize) -> usize {
        blocks - blocks % self.blocks_per_engine_block() as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierInfo {
    pub tier: Tier,
    pub enabled: bool,
    pub capacity_bytes: u64,
}

impl TryFrom<pb::InfoResponse> for AgentInfo {
    type Error = WireError;
    fn try_from(wire: pb::InfoResponse) -> Result<Self, Self::Error> {
        if wire.agent_id.is_empty() {
            return Err(WireError::new("agent_id", "must not be empty"));
        }
        if wire.model_id.is_empty() {
            return Err(WireError::new("model_id", "must not be empty"));
        }
        if wire.block_size == 0 {
            return Err(WireError::new("block_size", "must be positive"));
        }
        if wire.vocab_size == 0 {
            return Err(WireError::new("vocab_size", "must be positive"));
        }
        let engine_block_size = match wire.engine_block_size {
            0 => wire.block_size,
            size if size.is_multiple_of(wire.block_size) => size,
            _ => return Err(WireError::new("engine_block_size", "must be a multiple of block_size")),
        };
        let geometry = wire.kv_geometry.ok_or_else(|| WireError::new("kv_geometry", "missing"))?;
        let tiers = wire
            .tiers
            .into_iter()
            .map(|tier| {
                Ok(TierInfo {
                    tier: Tier::try_from(tier.tier)?,
                    enabled: tier.enabled,
                    capacity_bytes: tier.capacity_bytes,
                })
            })
            .collect::<Result<_, WireError>>()?;
        Ok(AgentInfo {
            agent_id: wire.agent_id,
            epoch: wire.epoch,
            model_id: wire.model_id,
            block_size: wire.block_size,
            kv_geometry: KvGeometry::try_from(geometry)?,
            vocab_size: wire.vocab_size,
            max_context_tokens: wire.max_context_tokens,
            tiers,
            tokenizer_fingerprint: wire.tokenizer_fingerprint,
            kv_blocks_total: wire.kv_blocks_total,
            eos_token_ids: wire.eos_token_ids,
            engine_block_size,
        })
    }
}

impl From<AgentInfo> for pb::InfoResponse {
    fn from(info: AgentInfo) -> Self {
        pb::InfoResponse {
            agent_id: info.agent_id,
            epoch: info.epoch,
            model_id: info.model_id,
            block_size: info.block_size,
            kv_geometry: Some(info.kv_geometry.into()),
            vocab_size: info.vocab_size,
            max_context_tokens: info.max_context_tokens,
            tiers: info
                .tiers
                .into_iter()
                .map(|tier| pb::TierInfo {
                    tier: pb::Tier::from(tier.tier) as i32,
                    enabled: tier.enabled,
                    capacity_bytes: tier.capacity_bytes,
                })
                .collect(),
            tokenizer_fingerprint: info.tokenizer_fingerprint,
            kv_blocks_total: info.kv_blocks_total,
            eos_token_ids: info.eos_token_ids,
            engine_block_size: info.engine_block_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire_info(engine_block_size: u32) -> pb::InfoResponse {
        pb::InfoResponse {
            agent_id: "a".into(),
            model_id: "m".into(),
            block_size: 16,
            vocab_size: 10,
            kv_geometry: Some(pb::KvGeometry {
                num_layers: 1,
                num_kv_heads: 1,
                head_dim: 8,
                dtype: pb::KvDtype::Bf16 as i32,
            }),
            engine_block_size,
            ..Default::default()
        }
    }

    #[test]
    fn an_engine_caches_whole_blocks_of_its_own_size_and_that_size_must_be_a_multiple_of_ours() {
        let unsaid = AgentInfo::try_from(wire_info(0)).unwrap();
        assert_eq!(unsaid.engine_block_size, 16, "0 means kvroute's own block size");
        assert_eq!(unsaid.cacheable_blocks(21), 21);
        let vllm_cpu = AgentInfo::try_from(wire_info(128)).unwrap();
        assert_eq!((vllm_cpu.cacheable_blocks(21), vllm_cpu.cacheable_blocks(7)), (16, 0));
        let round_trip = AgentInfo::try_from(pb::InfoResponse::from(vllm_cpu.clone())).unwrap();
        assert_eq!(round_trip, vllm_cpu);
        let error = AgentInfo::try_from(wire_info(40)).unwrap_err();
        assert!(error.to_string().contains("engine_block_size"), "{error}");
    }

    #[test]
    fn event_batch_round_trips() {
        let hash = crate::block_hashes(16, "m", b"", &[1; 16])[0];
        let batch = KvEventBatch {
            agent_id: "a".into(),
            epoch: 7,
            seq: 3,
            snapshot: true,
            events: vec![
                KvEvent::Stored { tier: Tier::Gpu, hashes: vec![hash] },
                KvEvent::Removed { tier: Tier::Host, hashes: vec![hash] },
                KvEvent::Cleared { tier: Tier::Network },
            ],
            load: LoadStats {
                kv_blocks_used: 1,
                kv_blocks_total: 2,
                prefill_tokens_per_second: 10.0,
                step_in_progress: true,
                step_seconds: 2.5,
                ..Default::default()
            },
            sent_unix_micros: 1_700_000_000_000_000,
            finished_request_ids: vec![4, 9],
            next_request_id: 12,
        };
        let wire = pb::KvEventBatch::from(batch.clone());
        assert_eq!(KvEventBatch::try_from(wire).unwrap(), batch);
    }

    #[test]
    fn short_hash_is_rejected_with_its_field() {
        let wire = pb::KvEvent {
            kind: Some(pb::kv_event::Kind::Stored(pb::BlocksStored { tier: 1, block_hashes: vec![vec![0; 15]] })),
        };
        let error = KvEvent::try_from(wire).unwrap_err();
        assert_eq!(error.field, "stored.block_hashes");
        assert!(error.to_string().contains("16 bytes"));
    }

    #[test]
    fn invalid_requests_are_rejected() {
        let valid = pb::AgentGenerateRequest { prompt_token_ids: vec![1, 2], max_tokens: 4, ..Default::default() };
        assert!(AgentGenerateRequest::try_from(valid.clone()).is_ok());
        let cases = [
            (pb::AgentGenerateRequest { prompt_token_ids: vec![], ..valid.clone() }, "prompt_token_ids"),
            (pb::AgentGenerateRequest { max_tokens: 0, ..valid.clone() }, "max_tokens"),
            (pb::AgentGenerateRequest { cache_mode: 9, ..valid.clone() }, "cache_mode"),
            (
                pb::AgentGenerateRequest {
                    sampling: Some(pb::SamplingParams { temperature: f32::NAN, ..Default::default() }),
                    ..valid.clone()
                },
                "sampling.temperature",
            ),
            (
                pb::AgentGenerateRequest {
                    sampling: Some(pb::SamplingParams { top_p: 1.5, ..Default::default() }),
                    ..valid.clone()
                },
                "sampling.top_p",
            ),
            (pb::AgentGenerateRequest { cache_scope: vec![0; 2000], ..valid }, "cache_scope"),
        ];
        for (wire, field) in cases {
            assert_eq!(AgentGenerateRequest::try_from(wire).unwrap_err().field, field);
        }
    }

    #[test]
    fn load_with_more_used_than_total_is_rejected() {
        let wire = pb::LoadStats { kv_blocks_used: 3, kv_blocks_total: 2, ..Default::default() };
        assert!(LoadStats::try_from(wire).is_err());
        let wire = pb::LoadStats { prefill_tokens_per_second: -1.0, ..Default::default() };
        assert!(LoadStats::try_from(wire).is_err());
    }

    #[test]
    fn usage_goes_on_the_wire_field_by_field() {
        let usage = Usage { prompt_tokens: 3, completion_tokens: 5, cached_tokens: 2 };
        assert_eq!(pb::Usage::from(usage), pb::Usage { prompt_tokens: 3, completion_tokens: 5, cached_tokens: 2 });
    }

    #[test]
    fn geometry_bytes() {
        let geometry = KvGeometry { num_layers: 32, num_kv_heads: 8, head_dim: 128, dtype: KvDtype::Bf16 };
        assert_eq!(geometry.bytes_per_token(), 128 * 1024);
        assert_eq!(geometry.bytes_per_block(16), 2 * 1024 * 1024);
    }
}
