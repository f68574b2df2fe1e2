//! The engines' ZeroMQ message shapes around an event payload (vLLM's `ZmqEventPublisher`, which SGLang
//! copies).
//!
//! - Published on the PUB socket: `[topic, seq (8 bytes, big-endian), payload]`.
//! - Replay (a ROUTER socket on the engine; the agent's DEALER sends `[empty, start seq]`): the engine
//!   answers every buffered batch from `start seq` on, then an end marker whose seq is -1. vLLM 0.32
//!   answers `[empty, topic, seq, payload]` and ends with `[empty, empty, -1, empty]`; earlier versions
//!   (and SGLang) leave the topic out: `[empty, seq, payload]`, `[empty, -1, empty]`.

use thiserror::Error;

/// One published batch, borrowed from its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published<'a> {
    pub topic: &'a [u8],
    pub seq: u64,
    pub payload: &'a [u8],
}

/// One answer of the replay socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayReply<'a> {
    Batch(Published<'a>),
    /// Everything buffered from the requested seq on was sent.
    End,
}

/// A message that is not of these shapes.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("a published message has 3 frames (topic, seq, payload), got {0}")]
    PublishedFrames(usize),
    #[error("a replay answer has 3 or 4 frames starting with an empty one, got {0}")]
    ReplayFrames(usize),
    #[error("a sequence number has 8 bytes, got {0}")]
    SeqLength(usize),
}

/// The seq frame vLLM sends to end a replay: -1.
pub const END_SEQ: [u8; 8] = [0xff; 8];

/// Reads a message of the PUB socket.
pub fn published(message: &[Vec<u8>]) -> Result<Published<'_>, FrameError> {
    match message {
        [topic, seq, payload] => Ok(Published { topic, seq: seq_of(seq)?, payload }),
        _ => Err(FrameError::PublishedFrames(message.len())),
    }
}

/// The frames a DEALER sends to ask for every buffered batch from `start_seq` on.
pub fn replay_request(start_seq: u64) -> Vec<Vec<u8>> {
    vec![Vec::new(), start_seq.to_be_bytes().to_vec()]
}

/// Reads an answer of the replay socket (as a DEALER receives it: the empty delimiter first).
pub fn replay_reply(message: &[Vec<u8>]) -> Result<ReplayReply<'_>, FrameError> {
    let (topic, seq, payload) = match message {
        [empty, topic, seq, payload] if empty.is_empty() => (topic.as_slice(), seq, payload),
        [empty, seq, payload] if empty.is_empty() => (&[][..], seq, payload),
        _ => return Err(FrameError::ReplayFrames(message.len())),
    };
    if seq.as_slice() == END_SEQ {
        return Ok(ReplayReply::End);
    }
    Ok(ReplayReply::Batch(Published { topic, seq: seq_of(seq)?, payload }))
}

fn seq_of(frame: &[u8]) -> Result<u64, FrameError> {
    <[u8; 8]>::try_from(frame).map(u64::from_be_bytes).map_err(|_| FrameError::SeqLength(frame.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_messages() {
        let message = vec![b"kv".to_vec(), 7u64.to_be_bytes().to_vec(), vec![0x90]];
        assert_eq!(published(&message), Ok(Published { topic: b"kv", seq: 7, payload: &[0x90] }));
        assert_eq!(published(&message[..2]), Err(FrameError::PublishedFrames(2)));
        let short_seq = vec![Vec::new(), vec![1, 2], vec![]];
        assert_eq!(published(&short_seq), Err(FrameError::SeqLength(2)));
    }

    #[test]
    fn replay_answers_of_both_versions() {
        assert_eq!(replay_request(258), vec![Vec::new(), vec![0, 0, 0, 0, 0, 0, 1, 2]]);
        let seq = 9u64.to_be_bytes().to_vec();
        let with_topic = vec![Vec::new(), b"kv".to_vec(), seq.clone(), vec![1]];
        assert_eq!(
            replay_reply(&with_topic),
            Ok(ReplayReply::Batch(Published { topic: b"kv", seq: 9, payload: &[1] }))
        );
        let without_topic = vec![Vec::new(), seq, vec![1]];
        assert_eq!(
            replay_reply(&without_topic),
            Ok(ReplayReply::Batch(Published { topic: b"", seq: 9, payload: &[1] }))
        );
        assert_eq!(replay_reply(&[Vec::new(), Vec::new(), END_SEQ.to_vec(), Vec::new()]), Ok(ReplayReply::End));
        assert_eq!(replay_reply(&[Vec::new(), END_SEQ.to_vec(), Vec::new()]), Ok(ReplayReply::End));
        assert_eq!(replay_reply(&[vec![1], vec![0; 8], vec![]]), Err(FrameError::ReplayFrames(3)));
    }
}
