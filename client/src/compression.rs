//! Body compression: the producer zlib-compresses bodies above a threshold (RocketMQ's
//! `compressMsgBodyOverHowmuch`, 4 KiB) and flags them; consumers inflate flagged bodies when
//! they decode records, so applications always see the body they sent.
//!
//! Inflating is bounded ([`MAX_INFLATED_BODY_BYTES`]) so a hostile record cannot make a
//! consumer allocate without limit.

use std::borrow::Cow;
use std::io::{Read, Write};

use bytes::Bytes;
use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;
use flate2::Compression;

use crate::message::Message;

/// Bodies longer than this are compressed by default (RocketMQ's default, 4 KiB).
pub const DEFAULT_COMPRESS_OVER_BYTES: usize = 4 * 1024;

/// Largest body a compressed record may inflate to.
pub const MAX_INFLATED_BODY_BYTES: usize = 64 << 20;

/// `messages` with every body over `over_bytes` compressed, where that makes it smaller.
/// Borrowed unchanged when nothing qualifies. `over_bytes` 0 disables compression.
pub(crate) fn compress_bodies(messages: &[Message], over_bytes: usize) -> Cow<'_, [Message]> {
    if over_bytes == 0
        || !messages
            .iter()
            .any(|m| !m.is_body_compressed() && m.body().len() > over_bytes)
    {
        return Cow::Borrowed(messages);
    }
    Cow::Owned(
        messages
            .iter()
            .map(|message| {
                if message.is_body_compressed() || message.body().len() <= over_bytes {
                    return message.clone();
                }
                match compressed_body(message.body(), over_bytes) {
                    Some(smaller) => message.clone().with_compressed_body(smaller),
                    None => message.clone(),
                }
            })
            .collect(),
    )
}

/// The zlib form of `body` when it is over `over_bytes` (0: never) and compressing makes it
/// smaller; `None` to send it as it is. The one allocation a producer makes per message, and
/// only for a large body.
pub(crate) fn compressed_body(body: &[u8], over_bytes: usize) -> Option<Bytes> {
    if over_bytes == 0 || body.len() <= over_bytes {
        return None;
    }
    deflate(body).filter(|smaller| smaller.len() < body.len())
}

fn deflate(body: &[u8]) -> Option<Bytes> {
    let mut encoder = ZlibEncoder::new(Vec::with_capacity(body.len() / 2), Compression::new(5));
    encoder.write_all(body).ok()?;
    encoder.finish().ok().map(Bytes::from)
}

/// The inflated form of a zlib body, or why it cannot be had.
pub(crate) fn inflate(body: &[u8]) -> Result<Bytes, String> {
    let mut inflated = Vec::with_capacity(body.len() * 4);
    let limit = MAX_INFLATED_BODY_BYTES as u64 + 1;
    ZlibDecoder::new(body)
        .take(limit)
        .read_to_end(&mut inflated)
        .map_err(|e| format!("the compressed body cannot be inflated: {e}"))?;
    if inflated.len() > MAX_INFLATED_BODY_BYTES {
        return Err(format!(
            "the compressed body inflates past {MAX_INFLATED_BODY_BYTES} bytes"
        ));
    }
    Ok(Bytes::from(inflated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_bodies_compress_and_inflate_back_small_ones_stay() {
        let large = Message::new("t", "abc".repeat(4000));
        let small = Message::new("t", "tiny");
        let messages = [large.clone(), small.clone()];
        let sent = compress_bodies(&messages, DEFAULT_COMPRESS_OVER_BYTES);
        assert!(sent[0].is_body_compressed());
        assert!(sent[0].body().len() < large.body().len());
        assert_eq!(inflate(sent[0].body()).unwrap(), large.body().clone());
        assert!(!sent[1].is_body_compressed());
        assert_eq!(sent[1].body(), small.body());
        assert!(matches!(compress_bodies(&[small], 4096), Cow::Borrowed(_)));
        assert!(matches!(compress_bodies(&messages, 0), Cow::Borrowed(_)));
    }

    #[test]
    fn incompressible_bodies_are_sent_as_they_are() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let noise: Vec<u8> = (0..8192)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let messages = [Message::new("t", noise)];
        assert!(!compress_bodies(&messages, 4096)[0].is_body_compressed());
    }

    #[test]
    fn garbage_is_refused_not_panicked_on() {
        assert!(inflate(b"not zlib at all").is_err());
    }
}
