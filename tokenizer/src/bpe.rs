//! The byte-pair merge engine shared by every tokenizer source.
//!
//! A piece (one pre-token) starts as one symbol per byte. Each step merges the
//! adjacent pair with the lowest rank, the leftmost one among equal ranks,
//! until no adjacent pair has a rank. Both merge rules in use reduce to a table
//! keyed by the pair of token ids:
//!
//! - GPT-2 / Hugging Face merges: the rank of a pair is its line in the merge
//!   list; the result is the token spelled by the two parts together.
//! - tiktoken ranks: the rank of a pair is the rank (= id) of the token spelled
//!   by the concatenated bytes. Every split of a token into two tokens is an
//!   entry, so the table holds exactly the pairs tiktoken could merge.
//!
//! A byte without a single-byte token (real vocabularies lack a few control
//! bytes, e.g. SmolLM2 has no token for 0x04) cannot merge and is dropped from
//! the output, as Hugging Face's BPE does when no unknown token is set;
//! llama.cpp fails on such text instead.
//!
//! Short pieces use a quadratic scan over a small vector (fast for the usual
//! 1-20 byte pieces); long pieces use a heap over a linked list, O(n log n),
//! so a pathological input (a megabyte without spaces) cannot stall a request.
//! Both give the same result; a unit test checks that.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::hash::{FastMap, fast_map_with_capacity};

/// Pieces longer than this many bytes use the heap-based merge.
const SMALL_PIECE: usize = 64;

/// "No rank": the pair cannot merge.
const NO_RANK: u32 = u32::MAX;

/// A merge: its rank and the id of the token it produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Merge {
    pub rank: u32,
    pub id: u32,
}

const NO_MERGE: Merge = Merge { rank: NO_RANK, id: u32::MAX };

/// The merge table and the byte tokens that pieces start from.
#[derive(Clone)]
pub(crate) struct BpeModel {
    /// The token for each single byte; `u32::MAX` where the vocabulary has none.
    byte_tokens: [u32; 256],
    /// (left id, right id) packed in a u64 -> merge.
    merges: FastMap<u64, Merge>,
    /// Whole-piece shortcut: when present, a piece that is itself a token is
    /// that token (tiktoken's rule, and Hugging Face's `ignore_merges`).
    whole: Option<FastMap<Box<[u8]>, u32>>,
}

/// Reusable buffers for one encode call.
#[derive(Default)]
pub(crate) struct Scratch {
    symbols: Vec<u32>,
    ranks: Vec<Merge>,
    nodes: Vec<Node>,
    heap: BinaryHeap<Reverse<(u32, u32)>>,
}

#[derive(Clone, Copy)]
struct Node {
    id: u32,
    prev: u32,
    next: u32,
}

const NIL: u32 = u32::MAX;

#[inline]
fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

impl BpeModel {
    /// A model from explicit merges given in rank order as (left, right,
    /// result) ids. A pair listed twice keeps its first (lowest) rank.
    pub(crate) fn from_merges(byte_tokens: [u32; 256], merges: &[(u32, u32, u32)]) -> BpeModel {
        let mut table = fast_map_with_capacity(merges.len());
        for (rank, &(left, right, id)) in merges.iter().enumerate() {
            let rank = u32::try_from(rank).unwrap_or(NO_RANK - 1);
            table.entry(pair_key(left, right)).or_insert(Merge { rank, id });
        }
        BpeModel { byte_tokens, merges: table, whole: None }
    }

    /// A model with tiktoken's rule from the bytes of each rank (`ranks[r]` is
    /// the token with rank and id `r`; `None` for unassigned ranks).
    pub(crate) fn from_ranks(ranks: &[Option<&[u8]>]) -> BpeModel {
        let mut whole: FastMap<Box<[u8]>, u32> = fast_map_with_capacity(ranks.len());
        for (id, bytes) in ranks.iter().enumerate() {
            if let (Some(bytes), Ok(id)) = (bytes, u32::try_from(id)) {
                whole.entry(Box::from(*bytes)).or_insert(id);
            }
        }
        let mut byte_tokens = [u32::MAX; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            if let Some(&id) = whole.get([b as u8].as_slice()) {
                *slot = id;
            }
        }
        let mut merges = fast_map_with_capacity(ranks.len() * 4);
        for (bytes, &id) in &whole {
            for split in 1..bytes.len() {
                let (Some(&left), Some(&right)) = (whole.get(&bytes[..split]), whole.get(&bytes[split..])) else {
                    continue;
                };
                merges.insert(pair_key(left, right), Merge { rank: id, id });
            }
        }
        BpeModel { byte_tokens, merges, whole: Some(whole) }
    }

    /// Turns on the whole-piece shortcut with the given vocabulary.
    pub(crate) fn with_whole_piece_lookup(mut self, vocab: impl Iterator<Item = (Box<[u8]>, u32)>) -> BpeModel {
        let mut whole = fast_map_with_capacity(vocab.size_hint().0);
        for (bytes, id) in vocab {
            whole.entry(bytes).or_insert(id);
        }
        self.whole = Some(whole);
        self
    }

    /// Whether a piece that is itself a token is taken whole.
    pub(crate) fn has_whole_piece_lookup(&self) -> bool {
        self.whole.is_some()
    }

    #[inline]
    fn merge_of(&self, left: u32, right: u32) -> Merge {
        self.merges.get(&pair_key(left, right)).copied().unwrap_or(NO_MERGE)
    }

    /// Appends the tokens of one piece to `out`.
    pub(crate) fn encode_piece(&self, piece: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        match piece {
            [] => {}
            [b] => self.push_byte(*b, out),
            _ => {
                if let Some(&id) = self.whole.as_ref().and_then(|whole| whole.get(piece)) {
                    out.push(id);
                } else if piece.len() <= SMALL_PIECE {
                    self.merge_small(piece, scratch, out);
                } else {
                    self.merge_large(piece, scratch, out);
                }
            }
        }
    }

    #[inline]
    fn push_byte(&self, b: u8, out: &mut Vec<u32>) {
        let id = self.byte_tokens[usize::from(b)];
        if id != u32::MAX {
            out.push(id);
        }
    }

    fn merge_small(&self, piece: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        let symbols = &mut scratch.symbols;
        let ranks = &mut scratch.ranks;
        symbols.clear();
        ranks.clear();
        symbols.extend(piece.iter().map(|&b| self.byte_tokens[usize::from(b)]));
        ranks.extend(symbols.windows(2).map(|pair| self.merge_of(pair[0], pair[1])));
        loop {
            let mut best = NO_RANK;
            let mut at = 0;
            for (i, merge) in ranks.iter().enumerate() {
                if merge.rank < best {
                    best = merge.rank;
                    at = i;
                }
            }
            if best == NO_RANK {
                break;
            }
            symbols[at] = ranks[at].id;
            symbols.remove(at + 1);
            ranks.remove(at);
            if at + 1 < symbols.len() {
                ranks[at] = self.merge_of(symbols[at], symbols[at + 1]);
            }
            if at > 0 {
                ranks[at - 1] = self.merge_of(symbols[at - 1], symbols[at]);
            }
        }
        out.extend(symbols.iter().copied().filter(|&id| id != u32::MAX));
    }

    fn merge_large(&self, piece: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        let nodes = &mut scratch.nodes;
        let heap = &mut scratch.heap;
        nodes.clear();
        heap.clear();
        let len = piece.len() as u32;
        nodes.extend(piece.iter().enumerate().map(|(i, &b)| Node {
            id: self.byte_tokens[usize::from(b)],
            prev: if i == 0 { NIL } else { i as u32 - 1 },
            next: if i as u32 + 1 == len { NIL } else { i as u32 + 1 },
        }));
        // Heap entries are (rank, left node index); node indices grow left to
        // right, so ties pop leftmost first. Entries go stale when a neighbour
        // merges; a stale entry is recognised by re-checking the pair's merge.
        for i in 0..len.saturating_sub(1) {
            let merge = self.merge_of(nodes[i as usize].id, nodes[i as usize + 1].id);
            if merge.rank != NO_RANK {
                heap.push(Reverse((merge.rank, i)));
            }
        }
        while let Some(Reverse((rank, left))) = heap.pop() {
            let left_node = nodes[left as usize];
            if left_node.id == NIL || left_node.next == NIL {
                continue;
            }
            let right = left_node.next;
            let right_node = nodes[right as usize];
            let merge = self.merge_of(left_node.id, right_node.id);
            if merge.rank != rank {
                continue;
            }
            nodes[left as usize].id = merge.id;
            nodes[left as usize].next = right_node.next;
            nodes[right as usize].id = NIL;
            if right_node.next != NIL {
                nodes[right_node.next as usize].prev = left;
                let next = self.merge_of(merge.id, nodes[right_node.next as usize].id);
                if next.rank != NO_RANK {
                    heap.push(Reverse((next.rank, left)));
                }
            }
            if left_node.prev != NIL {
                let prev = self.merge_of(nodes[left_node.prev as usize].id, merge.id);
                if prev.rank != NO_RANK {
                    heap.push(Reverse((prev.rank, left_node.prev)));
                }
            }
        }
        let mut at = if nodes.is_empty() { NIL } else { 0 };
        while at != NIL {
            let node = nodes[at as usize];
            if node.id != u32::MAX {
                out.push(node.id);
            }
            at = node.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A toy vocabulary over the bytes a-d with overlapping merges.
    fn toy() -> BpeModel {
        let mut byte_tokens = [u32::MAX; 256];
        for (i, b) in (b'a'..=b'd').enumerate() {
            byte_tokens[usize::from(b)] = i as u32;
        }
        // 4 = ab, 5 = bc, 6 = abc (ab+c), 7 = aa, 8 = aaaa, 9 = cd, 10 = abcd (ab + cd)
        let merges = [(0, 1, 4), (1, 2, 5), (4, 2, 6), (0, 0, 7), (7, 7, 8), (2, 3, 9), (4, 9, 10)];
        BpeModel::from_merges(byte_tokens, &merges)
    }

    fn run(model: &BpeModel, piece: &[u8], large: bool) -> Vec<u32> {
        let mut scratch = Scratch::default();
        let mut out = Vec::new();
        if large {
            model.merge_large(piece, &mut scratch, &mut out);
        } else {
            model.merge_small(piece, &mut scratch, &mut out);
        }
        out
    }

    #[test]
    fn lowest_rank_leftmost_first() {
        let model = toy();
        assert_eq!(run(&model, b"abc", false), vec![6]);
        assert_eq!(run(&model, b"aaa", false), vec![7, 0]);
        assert_eq!(run(&model, b"aaaaa", false), vec![8, 0]);
        assert_eq!(run(&model, b"bcd", false), vec![5, 3]);
        assert_eq!(run(&model, b"abcd", false), vec![6, 3]);
        assert_eq!(run(&model, b"", false), Vec::<u32>::new());
        assert_eq!(run(&model, b"", true), Vec::<u32>::new());
    }

    #[test]
    fn tiktoken_rule_from_ranks() {
        let ranks: Vec<Option<&[u8]>> =
            vec![Some(b"a"), Some(b"b"), Some(b"c"), Some(b"bc"), Some(b"ab"), Some(b"abc")];
        let model = BpeModel::from_ranks(&ranks);
        let mut scratch = Scratch::default();
        let mut out = Vec::new();
        model.encode_piece(b"abcabc", &mut scratch, &mut out);
        // "bc" (rank 3) merges before "ab" (rank 4); then a+bc -> "abc" (rank 5).
        assert_eq!(out, vec![5, 5]);
    }

    proptest! {
        #[test]
        fn small_and_large_merges_agree(piece in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'c'), Just(b'd')], 0..200)) {
            let model = toy();
            prop_assert_eq!(run(&model, &piece, false), run(&model, &piece, true));
        }
    }
}
