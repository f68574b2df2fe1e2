//! The one mapping from engine errors to gRPC status codes, shared by the gRPC service (`server.rs`) and
//! engine mode's Generate streams (`external/`).

use tonic::Status;

use crate::engine::GenerateError;

/// The gRPC status of a Generate call the engine refused or could not finish.
pub fn status_of(error: GenerateError) -> Status {
    match error {
        GenerateError::InvalidArgument(message) => Status::invalid_argument(message),
        GenerateError::Overloaded(message) => Status::resource_exhausted(message),
        GenerateError::Unavailable(message) => Status::unavailable(message),
    }
}
