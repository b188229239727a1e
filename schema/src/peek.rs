//! A look at the head of a frame that has not arrived whole: whether it is a request carrying a
//! run of records at its very end (`SendRecordsRequest` with the records as the frame's
//! trailing vector, as `FrameEncoder::encode_head_with_trailing_bytes` writes it), and where
//! that run lies. A receiver can then check the run's records as they arrive instead of after
//! the last byte.
//!
//! Nothing here is trusted: every offset is read bounds-checked from the bytes that have
//! arrived, and the frame is verified as a whole once it is complete. A receiver that uses a
//! peek compares it with the verified frame (the run's position, length, topic and count)
//! before relying on anything it checked early.

use crate::wire;

/// What the arrived head of a frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadPeek<'a> {
    /// The head has not arrived yet: look again when more bytes are in.
    NeedMore,
    /// Not a request whose run of records is the frame's trailing bytes (or not a well-formed
    /// head): the frame is handled once it is whole, as every other.
    NotARun,
    /// A `SendRecordsRequest` whose `records` end the frame.
    Run(RunHead<'a>),
}

/// Where the run of records of a `SendRecordsRequest` lies, with what its check needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunHead<'a> {
    pub topic: &'a str,
    pub count: u32,
    /// Offset of the run's first byte in the flatbuffer (after the length prefix).
    pub run_at: usize,
    pub run_len: usize,
}

/// Looks at `arrived`, the first bytes of a frame's flatbuffer (after its length prefix) whose
/// whole length is `frame_len` bytes.
#[must_use]
pub fn peek_run_head(arrived: &[u8], frame_len: usize) -> HeadPeek<'_> {
    let arrived = &arrived[..arrived.len().min(frame_len)];
    match peek(arrived, frame_len) {
        Ok(head) => HeadPeek::Run(head),
        Err(Miss::NeedMore) if arrived.len() < frame_len => HeadPeek::NeedMore,
        Err(_) => HeadPeek::NotARun,
    }
}

enum Miss {
    NeedMore,
    NotARun,
}

/// The bytes at `at..at + len`, or why not: beyond what arrived (wait) or beyond the frame.
fn bytes_at(arrived: &[u8], frame_len: usize, at: usize, len: usize) -> Result<&[u8], Miss> {
    let end = at.checked_add(len).ok_or(Miss::NotARun)?;
    if end > frame_len {
        return Err(Miss::NotARun);
    }
    arrived.get(at..end).ok_or(Miss::NeedMore)
}

fn u32_at(arrived: &[u8], frame_len: usize, at: usize) -> Result<u32, Miss> {
    let bytes = bytes_at(arrived, frame_len, at, 4)?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

fn u16_at(arrived: &[u8], frame_len: usize, at: usize) -> Result<u16, Miss> {
    let bytes = bytes_at(arrived, frame_len, at, 2)?;
    Ok(u16::from_le_bytes(bytes.try_into().expect("2 bytes")))
}

/// A table's field positions: where the table starts and its vtable.
struct Table {
    at: usize,
    vtable: usize,
    vtable_len: usize,
}

impl Table {
    fn at(arrived: &[u8], frame_len: usize, at: usize) -> Result<Self, Miss> {
        let soffset = u32_at(arrived, frame_len, at)? as i32;
        let vtable = (at as i64) - i64::from(soffset);
        let vtable = usize::try_from(vtable).map_err(|_| Miss::NotARun)?;
        let vtable_len = usize::from(u16_at(arrived, frame_len, vtable)?);
        Ok(Self {
            at,
            vtable,
            vtable_len,
        })
    }

    /// Where field `slot` (a generated `VT_*` constant) is, or `None` when it is absent.
    fn field(&self, arrived: &[u8], frame_len: usize, slot: u16) -> Result<Option<usize>, Miss> {
        let slot = usize::from(slot);
        if slot + 2 > self.vtable_len {
            return Ok(None);
        }
        let offset = u16_at(arrived, frame_len, self.vtable + slot)?;
        Ok((offset != 0).then(|| self.at + usize::from(offset)))
    }

    /// The target of the offset field `slot`.
    fn follow(&self, arrived: &[u8], frame_len: usize, slot: u16) -> Result<Option<usize>, Miss> {
        match self.field(arrived, frame_len, slot)? {
            Some(at) => {
                let offset = u32_at(arrived, frame_len, at)? as usize;
                Ok(Some(at.checked_add(offset).ok_or(Miss::NotARun)?))
            }
            None => Ok(None),
        }
    }
}

fn peek(arrived: &[u8], frame_len: usize) -> Result<RunHead<'_>, Miss> {
    let identifier = bytes_at(arrived, frame_len, 4, 4)?;
    if identifier != wire::FRAME_IDENTIFIER.as_bytes() {
        return Err(Miss::NotARun);
    }
    let root = u32_at(arrived, frame_len, 0)? as usize;
    let frame = Table::at(arrived, frame_len, root)?;
    let kind = match frame.field(arrived, frame_len, wire::Frame::VT_KIND)? {
        Some(at) => bytes_at(arrived, frame_len, at, 1)?[0],
        None => wire::FrameKind::REQUEST.0,
    };
    let body_type = match frame.field(arrived, frame_len, wire::Frame::VT_BODY_TYPE)? {
        Some(at) => bytes_at(arrived, frame_len, at, 1)?[0],
        None => wire::Body::NONE.0,
    };
    if kind != wire::FrameKind::REQUEST.0 || body_type != wire::Body::SendRecordsRequest.0 {
        return Err(Miss::NotARun);
    }
    let body = frame
        .follow(arrived, frame_len, wire::Frame::VT_BODY)?
        .ok_or(Miss::NotARun)?;
    let request = Table::at(arrived, frame_len, body)?;
    let topic = request
        .follow(arrived, frame_len, wire::SendRecordsRequest::VT_TOPIC)?
        .ok_or(Miss::NotARun)?;
    let topic_len = u32_at(arrived, frame_len, topic)? as usize;
    let topic = bytes_at(arrived, frame_len, topic + 4, topic_len)?;
    let topic = std::str::from_utf8(topic).map_err(|_| Miss::NotARun)?;
    let count = match request.field(arrived, frame_len, wire::SendRecordsRequest::VT_COUNT)? {
        Some(at) => u32_at(arrived, frame_len, at)?,
        None => 0,
    };
    let records = request
        .follow(arrived, frame_len, wire::SendRecordsRequest::VT_RECORDS)?
        .ok_or(Miss::NotARun)?;
    let run_len = u32_at(arrived, frame_len, records)? as usize;
    let run_at = records + 4;
    // Only a run that ends the frame: its bytes are the last to arrive.
    if run_at.checked_add(run_len) != Some(frame_len) {
        return Err(Miss::NotARun);
    }
    Ok(RunHead {
        topic,
        count,
        run_at,
        run_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_frame, FrameEncoder, FrameHeader, FRAME_LENGTH_PREFIX_BYTES};
    use bytes::BytesMut;
    use proptest::prelude::*;

    /// A `SendRecordsRequest` frame (without its length prefix) carrying `run` as trailing bytes.
    fn run_frame(run: &[u8], count: u32) -> Vec<u8> {
        let mut head = BytesMut::new();
        FrameEncoder::new()
            .encode_head_with_trailing_bytes(&mut head, run.len(), |b, records| {
                let topic = b.create_string("Orders");
                let group = b.create_string("g");
                let request = wire::SendRecordsRequest::create(
                    b,
                    &wire::SendRecordsRequestArgs {
                        topic: Some(topic),
                        queue_id: 3,
                        producer_group: Some(group),
                        records: Some(records),
                        count,
                    },
                );
                build_frame(
                    b,
                    &FrameHeader::request(9),
                    wire::Body::SendRecordsRequest,
                    Some(request.as_union_value()),
                )
            })
            .unwrap();
        let mut frame = head[FRAME_LENGTH_PREFIX_BYTES..].to_vec();
        frame.extend_from_slice(run);
        frame
    }

    #[test]
    fn the_run_of_a_send_is_found_once_its_head_has_arrived() {
        let run: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let frame = run_frame(&run, 7);
        let head_len = frame.len() - run.len();
        for arrived in 0..head_len {
            assert_eq!(
                peek_run_head(&frame[..arrived], frame.len()),
                HeadPeek::NeedMore,
                "{arrived} bytes"
            );
        }
        let expected = HeadPeek::Run(RunHead {
            topic: "Orders",
            count: 7,
            run_at: head_len,
            run_len: run.len(),
        });
        for arrived in [head_len, head_len + 1, frame.len()] {
            assert_eq!(peek_run_head(&frame[..arrived], frame.len()), expected);
        }
        let verified = crate::FrameDecoder::new()
            .verify(bytes::Bytes::from(frame.clone()))
            .unwrap();
        let records = verified
            .frame()
            .body_as_send_records_request()
            .unwrap()
            .records()
            .unwrap();
        assert_eq!(records.bytes(), &run[..]);
    }

    #[test]
    fn other_frames_are_not_runs() {
        let mut encoder = FrameEncoder::new();
        let error = encoder
            .encode_error_response(3, wire::Status::SYSTEM_BUSY, "busy")
            .unwrap();
        let frame = &error[FRAME_LENGTH_PREFIX_BYTES..];
        assert_eq!(peek_run_head(frame, frame.len()), HeadPeek::NotARun);
        // A run that does not end the frame (a frame longer than its head and run say).
        let run_frame = run_frame(b"abcdef", 1);
        assert_eq!(
            peek_run_head(&run_frame, run_frame.len() + 10),
            HeadPeek::NotARun
        );
    }

    proptest! {
        /// Garbage and damaged heads never panic, and whatever they are taken for lies within
        /// the frame.
        #[test]
        fn damaged_heads_never_reach_outside_the_frame(
            flip in any::<proptest::sample::Index>(),
            byte in any::<u8>(),
            arrived in any::<proptest::sample::Index>(),
            garbage in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut frame = run_frame(&[7u8; 300], 2);
            let at = flip.index(frame.len() - 300);
            frame[at] = byte;
            let arrived = arrived.index(frame.len() + 1);
            if let HeadPeek::Run(head) = peek_run_head(&frame[..arrived], frame.len()) {
                prop_assert_eq!(head.run_at + head.run_len, frame.len());
            }
            let _ = peek_run_head(&garbage, garbage.len());
            let _ = peek_run_head(&garbage, garbage.len() + 1000);
        }
    }
}
