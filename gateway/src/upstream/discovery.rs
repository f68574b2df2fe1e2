//! Finding replicas: a static list (`--agents`) and DNS re-resolution of a
//! name such as a Kubernetes headless service (`--agents-dns name:port`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::Pool;

/// Adds every static endpoint.
pub fn add_static(pool: &Arc<Pool>, endpoints: &[String]) -> Result<(), String> {
    for endpoint in endpoints {
        pool.add(endpoint)?;
    }
    Ok(())
}

/// Re-resolves `name:port` every `interval`; adds new addresses and removes
/// vanished ones (static endpoints are left alone). Runs until aborted.
pub async fn watch_dns(pool: Arc<Pool>, target: String, interval: Duration, static_endpoints: Vec<String>) {
    let mut known: BTreeSet<String> = BTreeSet::new();
    loop {
        match tokio::net::lookup_host(target.as_str()).await {
            Ok(addresses) => {
                let found: BTreeSet<String> = addresses.map(|address| address.to_string()).collect();
                for endpoint in found.difference(&known) {
                    if let Err(error) = pool.add(endpoint) {
                        tracing::warn!(%endpoint, error, "cannot add a discovered agent");
                    } else {
                        tracing::info!(%endpoint, "discovered agent");
                    }
                }
                for endpoint in known.difference(&found) {
                    if !static_endpoints.contains(endpoint) {
                        tracing::info!(%endpoint, "agent no longer resolves; removing it");
                        pool.remove(endpoint);
                    }
                }
                known = found;
            }
            Err(error) => tracing::warn!(%target, %error, "agent DNS lookup failed; keeping the last answer"),
        }
        tokio::time::sleep(interval).await;
    }
}
