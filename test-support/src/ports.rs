//! Loopback ports for test servers that no other test of the run can be handed.
//!
//! The kernel hands out ports for `bind(0)` and for outgoing connections from its ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 by default), so a port found by binding port 0
//! and releasing it can be given to someone else before the server binds it, and a server restarted on its
//! old port can find it taken. The ports here come from below that range, where the kernel never allocates
//! by itself (10000-19999, so that a Redis Cluster node's bus port, 10000 above its own, is below it too),
//! one after another from a start derived from the process id, each checked free by binding it:
//! within a test process no port is handed out twice, and a server restarted on its port gets it back.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out.
const LOWEST: u32 = 10_000;
/// Ports are handed out below this: a Redis Cluster node on port P also listens on P + 10,000 (its bus),
/// and those ports must be neither handed out nor ephemeral.
const HIGHEST: u32 = 20_000;

/// A loopback port nobody listens on, not handed out before by this process.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (low, high) = range();
    let span = high.saturating_sub(low);
    if span >= 1_000 {
        let start = std::process::id().wrapping_mul(2_654_435_761) % span;
        for _ in 0..span {
            let port = low + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            if let Ok(port) = u16::try_from(port)
                && TcpListener::bind(("127.0.0.1", port)).is_ok()
            {
                return port;
            }
        }
    }
    // No room below the ephemeral range: fall back to a port the kernel picks.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

/// Ports below the kernel's ephemeral range whose cluster-bus twins are below it too, `[low, high)`.
fn range() -> (u32, u32) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    (LOWEST, HIGHEST.min(ephemeral_low.saturating_sub(10_000)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_below_the_ephemeral_range() {
        let (_, high) = range();
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        assert!(ports.iter().all(|&port| u32::from(port) >= LOWEST && u32::from(port) < high), "{ports:?}");
    }
}
