//! What a request gets back from the engine: streamed outputs and errors.

use kvroute_proto::domain::FinishReason;
pub use kvroute_proto::domain::Usage;

/// One message to the requester: new tokens, and on the last one why it ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub tokens: Vec<u32>,
    pub finished: Option<(FinishReason, Usage)>,
    /// Prompt tokens served from a cache, on the first output only.
    pub cached_tokens: Option<u32>,
    /// The logits the token was sampled from, when the engine captures them.
    pub logits: Option<Vec<f32>>,
}

/// Where a request's outputs go. `send` returns false when the requester is
/// gone, and the engine then drops the request.
pub trait OutputSink: Send {
    fn send(&mut self, output: Output) -> bool;
    /// The engine accepted the request under `request_id`; called once, before any output.
    fn accepted(&mut self, _request_id: u64) {}
    /// The requester is gone: the engine drops the request at its next step.
    fn is_closed(&self) -> bool {
        false
    }
    /// Whether `send` can take one more output now; the engine holds back the request's next token until
    /// it can.
    fn has_room(&self) -> bool {
        true
    }
}

impl<F: FnMut(Output) -> bool + Send> OutputSink for F {
    fn send(&mut self, output: Output) -> bool {
        self(output)
    }
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    /// The request can never run as given (maps to INVALID_ARGUMENT).
    #[error("{0}")]
    InvalidArgument(String),
    /// The queue is full (maps to RESOURCE_EXHAUSTED).
    #[error("{0}")]
    Overloaded(String),
    /// The engine is shutting down or gone (maps to UNAVAILABLE).
    #[error("{0}")]
    Unavailable(String),
}

impl GenerateError {
    /// The `reason` label of the agent's rejection counter.
    pub fn reason_label(&self) -> &'static str {
        match self {
            GenerateError::InvalidArgument(_) => "invalid",
            GenerateError::Overloaded(_) => "overloaded",
            GenerateError::Unavailable(_) => "unavailable",
        }
    }
}
