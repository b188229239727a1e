//! Sequential scanning of CommitLog bytes: where does the valid data end, and why.
//!
//! Owns the rules that recovery and `verify` share for walking a segment: a record is accepted
//! only when it decodes and both CRCs match; a blank filler ends the segment; a zero total size
//! and zero magic mark the clean end of written data (the zero padding of the last DMA block);
//! anything else is a torn or corrupt record at a known offset. Pure: it reads a byte window the
//! caller supplies and never does I/O.

use super::record::{
    decode_message, RecordError, RecordView, BLANK_MAGIC_CODE, BLANK_MIN_BYTES, MESSAGE_MAGIC_CODE,
};

/// Why a scan of a window stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanStop {
    /// The entry starting at this segment position is not wholly in the window; read from here.
    NeedMore { position: u64 },
    /// A blank filler at this position ends the segment.
    SegmentEnd { position: u64 },
    /// Written data ends cleanly at this position.
    DataEnd { position: u64 },
    /// The entry at this position is torn or corrupt.
    Invalid { position: u64, error: RecordError },
}

/// Walks the entries of `window`, whose first byte is at `window_position` of the segment
/// starting at physical offset `segment_base`, `segment_bytes` long. `is_file_end` says the window reaches the end of the file, so a record that
/// runs past it is torn rather than unread. Calls `on_record(position, view)` for each valid
/// message in order.
pub fn scan_window(
    window: &[u8],
    segment_base: u64,
    window_position: u64,
    segment_bytes: u64,
    is_file_end: bool,
    on_record: &mut dyn FnMut(u64, &RecordView<'_>),
) -> ScanStop {
    let mut at = 0usize;
    loop {
        let position = window_position + at as u64;
        let rest = &window[at..];
        if position >= segment_bytes {
            return ScanStop::SegmentEnd { position };
        }
        if rest.len() < BLANK_MIN_BYTES {
            if is_file_end {
                return if rest.iter().all(|&b| b == 0) {
                    ScanStop::DataEnd { position }
                } else {
                    ScanStop::Invalid {
                        position,
                        error: RecordError::Truncated {
                            available: rest.len(),
                            needed: BLANK_MIN_BYTES,
                        },
                    }
                };
            }
            return ScanStop::NeedMore { position };
        }
        let total_size = u32::from_be_bytes(rest[0..4].try_into().expect("4 bytes")) as u64;
        let magic = u32::from_be_bytes(rest[4..8].try_into().expect("4 bytes"));
        if total_size == 0 && magic == 0 {
            return ScanStop::DataEnd { position };
        }
        if magic == BLANK_MAGIC_CODE {
            // The filler's zero body need not be in the window: its size alone must fit exactly.
            return if total_size as usize >= BLANK_MIN_BYTES
                && position + total_size == segment_bytes
            {
                ScanStop::SegmentEnd { position }
            } else {
                ScanStop::Invalid {
                    position,
                    error: RecordError::BadTotalSize {
                        total_size: total_size as u32,
                        available: (segment_bytes - position) as usize,
                    },
                }
            };
        }
        let is_plausible =
            total_size as usize >= BLANK_MIN_BYTES && position + total_size <= segment_bytes;
        if magic == MESSAGE_MAGIC_CODE
            && is_plausible
            && total_size as usize > rest.len()
            && !is_file_end
        {
            return ScanStop::NeedMore { position };
        }
        match decode_message(rest) {
            Ok(view) if view.physical_offset() != segment_base + position => {
                return ScanStop::Invalid {
                    position,
                    error: RecordError::WrongPhysicalOffset {
                        stored: view.physical_offset(),
                        expected: segment_base + position,
                    },
                };
            }
            Ok(view) => {
                on_record(position, &view);
                at += view.total_size() as usize;
            }
            Err(error) => return ScanStop::Invalid { position, error },
        }
    }
}
