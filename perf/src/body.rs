//! The body of a benchmark message: a fixed header that says who sent it, in which order and
//! when, then filler up to `--size` bytes.
//!
//! Owns the header's byte layout and nothing else. The header is what lets a consumer check
//! delivery (every acknowledged `(producer, sequence)` exactly once, see `tracker.rs`) and
//! measure end-to-end latency without any side channel. Data enters as the fields of a
//! [`Header`] and leaves as bytes (and back).
//!
//! | bytes  | field                                                                   |
//! |--------|-------------------------------------------------------------------------|
//! | 0..4   | magic `SMQP`                                                            |
//! | 4..8   | run id (u32 LE): random per `shardmq-perf` run, so other runs' messages in the same topic are told apart |
//! | 8..12  | producer index (u32 LE) within the run                                  |
//! | 12..16 | zero (reserved)                                                         |
//! | 16..24 | sequence (u64 LE): per producer, from 0, one per message                |
//! | 24..32 | intended send time (u64 LE, ns since the Unix epoch): the schedule's time under `--rate`, else the same as the born time |
//! | 32..40 | born time (u64 LE, ns since the Unix epoch): just before the send call  |
//!
//! Times are wall-clock (`SystemTime`), so a consumer in another process on the same machine
//! can compute latencies too; the filler is printable ASCII so the messages are readable in
//! `shardmq consume`.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{BufMut, BytesMut};

/// Bytes of the header; `--size` must be at least this.
pub const HEADER_BYTES: usize = 40;

const MAGIC: &[u8; 4] = b"SMQP";

/// The fields a benchmark message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub run_id: u32,
    pub producer: u32,
    pub sequence: u64,
    pub intended_ns: u64,
    pub born_ns: u64,
}

impl Header {
    /// A body of `HEADER_BYTES + filler.len()` bytes: this header, then `filler` (see
    /// [`filler`]; made once per producer so that building a body is two copies).
    #[cfg(test)]
    pub fn body(&self, filler: &[u8]) -> bytes::Bytes {
        let mut body = BytesMut::with_capacity(HEADER_BYTES + filler.len());
        self.write_body(filler, &mut body);
        body.freeze()
    }

    /// Appends the body ([`body`](Self::body)'s bytes) to `out`: the bodies of a call are
    /// written into one buffer and handed out as slices of it, one allocation per call.
    pub fn write_body(&self, filler: &[u8], out: &mut BytesMut) {
        let start = out.len();
        out.put_slice(MAGIC);
        out.put_u32_le(self.run_id);
        out.put_u32_le(self.producer);
        out.put_u32_le(0);
        out.put_u64_le(self.sequence);
        out.put_u64_le(self.intended_ns);
        out.put_u64_le(self.born_ns);
        debug_assert_eq!(out.len() - start, HEADER_BYTES);
        out.put_slice(filler);
    }

    /// The header at the start of `body`, or `None` when the body is not a benchmark message.
    pub fn parse(body: &[u8]) -> Option<Header> {
        if body.len() < HEADER_BYTES || &body[..4] != MAGIC {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        Some(Header {
            run_id: u32_at(4),
            producer: u32_at(8),
            sequence: u64_at(16),
            intended_ns: u64_at(24),
            born_ns: u64_at(32),
        })
    }
}

/// The filler that makes a body `size` bytes long (`size` at least [`HEADER_BYTES`]):
/// printable, and not one repeated byte.
pub fn filler(size: usize) -> Vec<u8> {
    debug_assert!(
        size >= HEADER_BYTES,
        "body of {size} bytes has no room for the header"
    );
    (0..size.saturating_sub(HEADER_BYTES))
        .map(|index| b'a' + (index % 26) as u8)
        .collect()
}

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
pub fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A run id: different for runs started at different moments or by different processes.
pub fn new_run_id() -> u32 {
    let nanos = wall_clock_ns();
    let mixed = (nanos ^ (nanos >> 32) ^ u64::from(std::process::id()).rotate_left(17))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_fills_to_size() {
        let header = Header {
            run_id: 7,
            producer: 3,
            sequence: 1 << 40,
            intended_ns: 1_700_000_000_000_000_000,
            born_ns: 1_700_000_000_000_000_123,
        };
        let body = header.body(&filler(1024));
        assert_eq!(body.len(), 1024);
        assert_eq!(Header::parse(&body), Some(header));
        assert!(body[HEADER_BYTES..].iter().all(u8::is_ascii_lowercase));
        assert_eq!(header.body(&filler(HEADER_BYTES)).len(), HEADER_BYTES);
    }

    #[test]
    fn other_bodies_are_not_benchmark_messages() {
        assert_eq!(Header::parse(b"hello"), None);
        assert_eq!(Header::parse(&[0u8; 64]), None);
    }
}
