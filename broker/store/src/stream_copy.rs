//! A copy that bypasses the CPU caches (non-temporal stores), for bytes written once and not
//! read again soon: the journal's copy of the log (read back only after a crash).
//!
//! A plain copy into memory that is not in the cache first reads each destination line
//! (read-for-ownership), then evicts lines the storage shard still needs. Streaming stores
//! write whole lines without reading them. On a 2-core VM the journal's copy of a 1 MiB batch
//! was about 9 % of the broker's samples with a plain copy (`docs/performance.md`, fourth
//! round). Other targets than x86_64 use a plain copy.

/// Copies `src` into `dst` (same length) with streaming stores where the target has them.
pub fn stream_copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream_copy needs equal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        const LANE: usize = 16;
        // Small copies gain nothing: the lines are written whole by a plain copy too.
        if dst.len() < 4 * LANE {
            dst.copy_from_slice(src);
            return;
        }
        // Plain copy up to the first 16-byte aligned destination byte, streaming stores for
        // the aligned middle, plain copy of the rest.
        let head = dst.as_ptr().align_offset(LANE).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let middle = (dst.len() - head) / LANE * LANE;
        let (dst_mid, src_mid) = (&mut dst[head..head + middle], &src[head..head + middle]);
        for (d, s) in dst_mid
            .chunks_exact_mut(LANE)
            .zip(src_mid.chunks_exact(LANE))
        {
            // SAFETY: SSE2 is part of x86_64. `s` holds 16 readable bytes (an unaligned load);
            // `d` holds 16 writable bytes starting at a 16-byte aligned address (`head` aligned
            // the first, and every lane is 16 bytes), as `_mm_stream_si128` requires.
            unsafe {
                let value = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                _mm_stream_si128(d.as_mut_ptr().cast::<__m128i>(), value);
            }
        }
        // SAFETY: a store fence; it orders the streaming stores before any later store (the
        // journal's header), as plain stores are ordered.
        unsafe { _mm_sfence() };
        dst[head + middle..].copy_from_slice(&src[head + middle..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::stream_copy;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn copies_every_byte_at_any_alignment_and_length(
            src in proptest::collection::vec(any::<u8>(), 0..600),
            dst_shift in 0usize..64,
        ) {
            let mut room = vec![0xA5u8; src.len() + 128];
            stream_copy(&mut room[dst_shift..dst_shift + src.len()], &src);
            prop_assert_eq!(&room[dst_shift..dst_shift + src.len()], &src[..]);
            prop_assert!(room[..dst_shift].iter().all(|b| *b == 0xA5));
            prop_assert!(room[dst_shift + src.len()..].iter().all(|b| *b == 0xA5));
        }
    }
}
