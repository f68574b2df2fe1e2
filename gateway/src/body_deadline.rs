//! A deadline on receiving a gRPC request body: a client that trickles its
//! request message is answered DEADLINE_EXCEEDED when the deadline passes,
//! instead of holding a stream open forever. Only reading the request is
//! bounded; the response stream runs as long as generation takes.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Bytes, Service, http};

/// Wraps every request body of a service in a [`DeadlineBody`].
#[derive(Clone, Debug)]
pub struct BodyDeadlineLayer {
    limit: Duration,
}

impl BodyDeadlineLayer {
    pub fn new(limit: Duration) -> BodyDeadlineLayer {
        BodyDeadlineLayer { limit }
    }
}

impl<S> tower::Layer<S> for BodyDeadlineLayer {
    type Service = BodyDeadline<S>;

    fn layer(&self, inner: S) -> BodyDeadline<S> {
        BodyDeadline { inner, limit: self.limit }
    }
}

#[derive(Clone, Debug)]
pub struct BodyDeadline<S> {
    inner: S,
    limit: Duration,
}

impl<S> Service<http::Request<Body>> for BodyDeadline<S>
where
    S: Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let limit = self.limit;
        self.inner.call(request.map(|body| Body::new(DeadlineBody::new(body, limit))))
    }
}

/// A body that fails with DEADLINE_EXCEEDED if it has not ended within its limit.
#[derive(Debug)]
pub struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl DeadlineBody {
    pub fn new(inner: Body, limit: Duration) -> DeadlineBody {
        DeadlineBody { inner, deadline: Box::pin(tokio::time::sleep(limit)), limit }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                "the request message did not arrive within {} ms",
                this.limit.as_millis()
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
