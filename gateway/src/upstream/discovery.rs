//! Finding replicas: a static list (`--agents`), DNS re-resolution of a name such as a Kubernetes headless
//! service (`--agents-dns name:port`), and a file of `host:port` lines re-read periodically (`--agents-file`,
//! for fleets whose membership another system writes down). The two watched sources share one
//! reconciliation: new endpoints are added, vanished ones removed, static ones left alone.

use std::collections::BTreeSet;
use std::path::PathBuf;
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

/// Where a watched source's endpoints come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// `name:port`, resolved through the system resolver.
    Dns(String),
    /// A file with one `host:port` per line; blank lines and `#` comments are skipped.
    File(PathBuf),
}

impl Source {
    /// The endpoints the source names now.
    async fn endpoints(&self) -> Result<BTreeSet<String>, String> {
        match self {
            Source::Dns(target) => tokio::net::lookup_host(target.as_str())
                .await
                .map(|addresses| addresses.map(|address| address.to_string()).collect())
                .map_err(|error| format!("DNS lookup of {target} failed: {error}")),
            Source::File(path) => {
                let file = path.clone();
                let read = tokio::task::spawn_blocking(move || std::fs::read_to_string(file)).await;
                let text = read.map_err(|error| error.to_string())?;
                text.map(|text| parse_endpoints(&text)).map_err(|error| format!("reading {}: {error}", path.display()))
            }
        }
    }
}

/// The endpoints of an agents file: one `host:port` per line, `#` starting a comment.
pub fn parse_endpoints(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect()
}

/// Re-reads `source` every `interval`; adds new endpoints and removes vanished ones (static endpoints are
/// left alone). A failed read keeps the last answer. Runs until aborted.
pub async fn watch(pool: Arc<Pool>, source: Source, interval: Duration, static_endpoints: Vec<String>) {
    let mut known: BTreeSet<String> = BTreeSet::new();
    loop {
        match source.endpoints().await {
            Ok(found) => {
                reconcile(&pool, &known, &found, &static_endpoints).await;
                known = found;
            }
            Err(error) => tracing::warn!(error, "agent discovery failed; keeping the last answer"),
        }
        tokio::time::sleep(interval).await;
    }
}

/// Adds what `found` has and `known` had not; removes what `known` had and `found` has not.
async fn reconcile(pool: &Arc<Pool>, known: &BTreeSet<String>, found: &BTreeSet<String>, static_endpoints: &[String]) {
    for endpoint in known.difference(found) {
        if !static_endpoints.contains(endpoint) {
            tracing::info!(%endpoint, "agent no longer discovered; removing it");
            pool.remove(endpoint).await;
        }
    }
    for endpoint in found.difference(known) {
        match pool.add(endpoint) {
            Ok(_) => tracing::info!(%endpoint, "discovered agent"),
            Err(error) => tracing::warn!(%endpoint, error, "cannot add a discovered agent"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_file_lists_endpoints_skipping_blanks_and_comments() {
        let text = "# fleet\n10.0.0.1:50061\n\n  10.0.0.2:50061  # rack b\n10.0.0.1:50061\n";
        let expected: BTreeSet<String> = ["10.0.0.1:50061", "10.0.0.2:50061"].map(String::from).into();
        assert_eq!(parse_endpoints(text), expected);
    }
}
