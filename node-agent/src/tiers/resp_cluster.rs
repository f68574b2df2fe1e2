//! A Redis Cluster through the RESP client ([`RespPool`], one per node): each command goes to the node that
//! serves its key's slot (CRC16 of the key, or of its `{hash tag}`, modulo 16384). The slot map is learned
//! from the cluster's own redirections: a command sent to the wrong node is answered `-MOVED slot
//! host:port`, which records the slot's node and resends the command there; `-ASK slot host:port` (a slot
//! being migrated) resends it there once, after `ASKING`, without changing the map. Slots not learned yet
//! go to the first seed node. A pipeline is split by node and the parts run at once.

use std::sync::{Arc, Mutex};

use super::resp::{Op, Reply};
use super::resp_client::{ClientError, RespPool, refused};

/// Hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// Redirections followed for one command before giving up.
const MAX_REDIRECTS: usize = 4;

/// The slot of `key` (the cluster specification's `HASH_SLOT`).
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16-CCITT (XModem), as Redis Cluster uses it.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// Where a server error reply sends a command.
#[derive(Debug, PartialEq, Eq)]
pub enum Redirect {
    Moved { slot: u16, host: String, port: u16 },
    Ask { host: String, port: u16 },
}

/// `MOVED 3999 127.0.0.1:6381` or `ASK 3999 127.0.0.1:6381`; `None` for any other error.
pub fn redirect_of(error: &str) -> Option<Redirect> {
    let mut words = error.split_whitespace();
    let kind = words.next()?;
    let slot: u16 = words.next()?.parse().ok()?;
    let (host, port) = words.next()?.rsplit_once(':')?;
    let (host, port) = (host.trim_start_matches('[').trim_end_matches(']').to_string(), port.parse().ok()?);
    match kind {
        "MOVED" if slot < SLOTS => Some(Redirect::Moved { slot, host, port }),
        "ASK" => Some(Redirect::Ask { host, port }),
        _ => None,
    }
}

/// One node's share of a pipeline: the node, its pool, its commands, and which of the caller's commands
/// each reply answers (`None`: an `ASKING`'s).
type Part = (usize, Arc<RespPool>, Vec<Op>, Vec<Option<usize>>);

struct Node {
    host: String,
    port: u16,
    pool: Arc<RespPool>,
}

struct SlotMap {
    nodes: Vec<Node>,
    /// Index into `nodes` per slot.
    slot_node: Vec<usize>,
}

/// Pooled connections to every node of a cluster, with the slot map learned so far.
pub struct ClusterPool {
    template: RespPool,
    map: Mutex<SlotMap>,
}

impl ClusterPool {
    /// A pool for a cluster with the seed nodes `urls` (`redis://[user:password@]host:port`); connects lazily.
    pub fn from_urls(urls: &[String], max_bulk: usize) -> Result<ClusterPool, ClientError> {
        let Some(first) = urls.first() else { return Err(ClientError::Url("no cluster node given".into())) };
        let template = RespPool::from_url(first, max_bulk)?;
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            let pool = RespPool::from_url(url, max_bulk)?;
            let (host, port) = pool.address();
            nodes.push(Node { host: host.to_string(), port, pool: Arc::new(pool) });
        }
        let map = SlotMap { nodes, slot_node: vec![0; usize::from(SLOTS)] };
        Ok(ClusterPool { template, map: Mutex::new(map) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotMap> {
        self.map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The index of the node at `host:port`, added when new.
    fn node_at(&self, map: &mut SlotMap, host: &str, port: u16) -> usize {
        if let Some(index) = map.nodes.iter().position(|node| node.host == host && node.port == port) {
            return index;
        }
        map.nodes.push(Node { host: host.to_string(), port, pool: Arc::new(self.template.at(host, port)) });
        map.nodes.len() - 1
    }

    /// Runs commands on keys of any slot; replies in order. A server error reply to any command (other than
    /// a redirection followed) is [`ClientError::Refused`].
    pub async fn run(&self, ops: &[Op]) -> Result<Vec<Reply>, ClientError> {
        let mut replies: Vec<Option<Reply>> = vec![None; ops.len()];
        // (command, node asked to take it after -ASK)
        let mut pending: Vec<(usize, Option<usize>)> = (0..ops.len()).map(|i| (i, None)).collect();
        for _ in 0..=MAX_REDIRECTS {
            if pending.is_empty() {
                break;
            }
            let mut parts: Vec<Part> = Vec::new();
            {
                let map = self.lock();
                for &(i, asked) in &pending {
                    let node = asked.unwrap_or_else(|| map.slot_node[usize::from(slot_of(&ops[i]))]);
                    let part = match parts.iter().position(|part| part.0 == node) {
                        Some(index) => index,
                        None => {
                            parts.push((node, map.nodes[node].pool.clone(), Vec::new(), Vec::new()));
                            parts.len() - 1
                        }
                    };
                    let (_, _, commands, answers) = &mut parts[part];
                    if asked.is_some() {
                        commands.push(Op::Asking);
                        answers.push(None);
                    }
                    commands.push(ops[i].clone());
                    answers.push(Some(i));
                }
            }
            let results = futures::future::join_all(
                parts.iter().map(|(_, pool, commands, _)| async move { pool.run_replies(commands).await }),
            )
            .await;
            pending.clear();
            let mut map = self.lock();
            for ((_, _, _, answers), result) in parts.iter().zip(results) {
                for (answer, reply) in answers.iter().zip(result?) {
                    let Some(i) = *answer else { continue };
                    match &reply {
                        Reply::Error(text) => match redirect_of(text) {
                            Some(Redirect::Moved { slot, host, port }) => {
                                let node = self.node_at(&mut map, &host, port);
                                map.slot_node[usize::from(slot)] = node;
                                pending.push((i, None));
                            }
                            Some(Redirect::Ask { host, port }) => {
                                pending.push((i, Some(self.node_at(&mut map, &host, port))))
                            }
                            None => replies[i] = Some(reply),
                        },
                        _ => replies[i] = Some(reply),
                    }
                }
            }
        }
        if !pending.is_empty() {
            return Err(ClientError::Refused(format!("more than {MAX_REDIRECTS} redirections")));
        }
        refused(replies.into_iter().map(|reply| reply.unwrap_or(Reply::Bulk(None))).collect())
    }
}

/// The slot a command goes to (keyless commands: slot 0's node).
fn slot_of(op: &Op) -> u16 {
    match op {
        Op::Get(key) | Op::GetSplit { key, .. } | Op::Set { key, .. } | Op::Del(key) => key_slot(key.as_bytes()),
        Op::Ping | Op::Auth { .. } | Op::Select(_) | Op::Asking => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_the_cluster_specification() {
        // The specification's check value of CRC16-CCITT (XModem), and slots `CLUSTER KEYSLOT` gives.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        // Hash tags: only the part between the first { and the next }, when not empty.
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"{user1000}.followers"), key_slot(b"{user1000}.following"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS, "an empty first tag: the whole key");
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn redirections_are_parsed_and_other_errors_are_not() {
        assert_eq!(
            redirect_of("MOVED 3999 127.0.0.1:6381"),
            Some(Redirect::Moved { slot: 3999, host: "127.0.0.1".into(), port: 6381 })
        );
        assert_eq!(redirect_of("ASK 3999 10.0.0.2:7000"), Some(Redirect::Ask { host: "10.0.0.2".into(), port: 7000 }));
        assert_eq!(
            redirect_of("MOVED 1 [::1]:7001"),
            Some(Redirect::Moved { slot: 1, host: "::1".into(), port: 7001 })
        );
        assert_eq!(redirect_of("MOVED 16384 127.0.0.1:6381"), None, "no such slot");
        assert_eq!(redirect_of("ERR wrong number of arguments"), None);
        assert_eq!(redirect_of("MOVED x 127.0.0.1:6381"), None);
        assert_eq!(redirect_of("CLUSTERDOWN The cluster is down"), None);
    }
}
