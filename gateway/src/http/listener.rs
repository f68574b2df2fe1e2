//! The HTTP accept loop: HTTP/1.1 on hyper, over TLS when configured, with
//! TCP_NODELAY, a deadline for a client to finish its TLS handshake and send
//! its request headers (a slow-drip client is cut off instead of holding a
//! connection forever), and graceful shutdown: on the stop signal no
//! connection is accepted, idle ones close, and requests in flight (streams
//! included) run to their end.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::{TlsAcceptor, rustls};

/// Serves `app` on `listener` (HTTPS when `tls` is set) until `stop` resolves, then waits for
/// the connections still serving a request to finish (the caller bounds the wait).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    header_read_timeout: Duration,
    stop: impl Future,
) {
    let tls = tls.map(TlsAcceptor::from);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    tracing::warn!(%error, "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        match &tls {
            None => {
                let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, "HTTP connection ended with an error");
                    }
                });
            }
            Some(acceptor) => {
                // The handshake runs in the connection's task, bounded like the headers that follow it.
                let (acceptor, builder, watcher) = (acceptor.clone(), builder.clone(), graceful.watcher());
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(header_read_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(error)) => return tracing::debug!(%error, "TLS handshake failed"),
                        Err(_) => return tracing::debug!("TLS handshake timed out"),
                    };
                    let connection = watcher.watch(builder.serve_connection(TokioIo::new(stream), service));
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, "HTTPS connection ended with an error");
                    }
                });
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
}
