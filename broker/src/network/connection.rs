//! One client connection: read frames, run each request on its own task (pipelining: answers
//! go out as they complete, in any order), and write answers and pushed frames.
//!
//! Owns the connection's read buffer, its writer task and its limits: at most
//! `max_inflight_per_connection` requests run at once (reading pauses beyond that, which pushes
//! back on the client through TCP), and a frame over `max_frame_bytes` closes the connection
//! after an error answer. A malformed frame gets an error answer and the connection goes on,
//! up to [`MAX_MALFORMED_FRAMES_PER_CONNECTION`].
//!
//! Until the handshake succeeds a connection is on probation: frames are handled one at a time
//! in order, none may exceed [`PRE_HANDSHAKE_MAX_FRAME_BYTES`], and the handshake must arrive
//! within `handshake_timeout_ms`; a refused handshake (no common version) closes the connection
//! after its answer.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::unix::io::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use shardmq_schema::{grow_without_realloc, wire, FrameDecoder, FRAME_LENGTH_PREFIX_BYTES};
use tracing::{debug, warn};

use super::budget::Claim;
use super::produce::EarlyCheck;
use super::request::Connection;
use super::{dispatch, NetworkShard, Outbound};
use crate::mesh::TIMELINE;

/// How much is read from the socket at a time: from MIN to MAX, doubling after a read that
/// filled the whole chunk and halving after one that used less than a quarter of it, so a busy
/// connection reads in large pieces while an idle one holds only a small buffer (thousands of
/// idle connections must not cost 64 KiB each).
const MIN_READ_CHUNK_BYTES: usize = 4 << 10;
const MAX_READ_CHUNK_BYTES: usize = 64 << 10;

/// Largest single read into the room made for the rest of an admitted frame whose length is
/// known (a 1 MiB batch arrives in one or a few reads instead of seventeen): the room is
/// allocated already, and the frame's size was checked against `max_frame_bytes`. Offering a
/// read more room than the socket holds costs nothing: room is zeroed once, not per read
/// ([`ReadRoom`]).
const MAX_FRAME_READ_BYTES: usize = 4 << 20;

/// Largest frame accepted before the handshake: a `HandshakeRequest` is a few hundred bytes,
/// so a stranger cannot make the broker buffer `max_frame_bytes` before saying who it is.
pub const PRE_HANDSHAKE_MAX_FRAME_BYTES: usize = 64 << 10;

/// Malformed frames one connection may send (each answered) before it is closed.
pub const MAX_MALFORMED_FRAMES_PER_CONNECTION: u32 = 64;

/// Most slices one `sendmsg` carries (Linux's `IOV_MAX`).
const MAX_WRITE_SLICES: usize = 1024;

pub async fn serve(shard: Rc<NetworkShard>, stream: TcpStream) {
    let peer = match stream.peer_addr() {
        Ok(peer) => peer,
        Err(_) => return,
    };
    serve_from(shard, stream, peer).await
}

/// Serves `stream`, a connection from `peer`: an accepted TCP socket, or the local end of the
/// socket pair a TLS connection's pump decrypts into (`super::tls`), which has no address of
/// its own.
pub async fn serve_from(shard: Rc<NetworkShard>, mut stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let handshake_timeout = Duration::from_millis(shard.config.handshake_timeout_ms);
    let Some((is_remoting, first_bytes)) = tell_protocol(&mut stream, handshake_timeout).await
    else {
        debug!(%peer, "connection closed before its first bytes told its protocol");
        return;
    };
    if is_remoting {
        return super::remoting::serve(shard, stream, peer, first_bytes).await;
    }
    let socket = stream.as_raw_fd();
    let (reader, writer) = futures_lite::io::split(stream);
    serve_native(shard, reader, writer, Some(socket), peer, first_bytes).await
}

/// Serves a native connection, read through `reader` and written through `writer`, whose first
/// bytes, `first_bytes`, were read already. `socket`: the descriptor both halves belong to,
/// read and written straight (`recv` into reserved room, `sendmsg` of many slices); `None` for
/// halves without one of their own (a TLS session, whose bytes on the socket are records).
pub(super) async fn serve_native<R, W>(
    shard: Rc<NetworkShard>,
    mut reader: R,
    writer: W,
    socket: Option<RawFd>,
    peer: SocketAddr,
    first_bytes: BytesMut,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + 'static,
{
    let handshake_timeout = Duration::from_millis(shard.config.handshake_timeout_ms);
    let inflight_limit = shard.config.max_inflight_per_connection;
    let (out, out_rx) = local_channel::new_bounded::<Outbound>(inflight_limit * 2 + 16);
    let out = Rc::new(out);
    let connection_id = shard.register_connection(out.clone());
    let connection = Rc::new(Connection {
        id: connection_id,
        peer,
        is_handshaken: Cell::new(false),
        client_id: RefCell::new(None),
        account: RefCell::new(None),
        auth_nonce: Cell::new(None),
        is_closing: Cell::new(false),
        out,
    });
    debug!(%peer, connection_id, "connection opened");

    let writer_task = glommio::spawn_local(write_queued_to(socket, writer, out_rx)).detach();

    // Room for a frame is made here at its admission, not by the decoder (see below).
    let mut decoder =
        FrameDecoder::with_max_frame_bytes(PRE_HANDSHAKE_MAX_FRAME_BYTES).without_reserve_ahead();
    let handshake_deadline = Instant::now() + handshake_timeout;
    let mut malformed_frames = 0u32;
    let permits = Rc::new(Semaphore::new(inflight_limit as u64));
    let mut read_chunk_bytes = MIN_READ_CHUNK_BYTES;
    let mut buffer = first_bytes;
    let mut room = ReadRoom::default();
    // The shard's request byte budget: the frame at the front of `buffer` is charged
    // (`charged` bytes) once its length prefix is in; a decoded frame's charge moves to its
    // request and is given back when the request has been handled (budget.rs).
    let budget = shard.request_bytes.clone();
    let mut charged = 0usize;
    let frame_read_timeout = Duration::from_millis(shard.config.frame_read_timeout_ms);
    // When the first bytes of the frame being received arrived.
    let mut frame_started: Option<Instant> = None;
    // The run of records of the frame being received, checked as its bytes arrive.
    let mut early = EarlyCheck::default();
    'read: loop {
        if connection.is_handshaken.get() {
            if let Some(front) = decoder.pending_frame_bytes(&buffer) {
                if buffer.len() < front {
                    early.advance(
                        &shard,
                        &buffer[FRAME_LENGTH_PREFIX_BYTES..],
                        front - FRAME_LENGTH_PREFIX_BYTES,
                    );
                }
            }
        }
        loop {
            match decoder.decode(&mut buffer) {
                Ok(Some(frame)) => {
                    frame_started = None;
                    let early = early.take();
                    tracing::trace!(target: TIMELINE, stage = "frame_complete", connection = connection_id, bytes = frame.as_bytes().len());
                    let frame_bytes = frame.as_bytes().len() + FRAME_LENGTH_PREFIX_BYTES;
                    if frame_bytes > charged {
                        // Arrived whole in one read: charge it now (reading waits for room).
                        budget.acquire(frame_bytes - charged).await;
                        charged = frame_bytes;
                    }
                    let claim = Claim::new(budget.clone(), std::mem::take(&mut charged));
                    if frame.frame().kind() != wire::FrameKind::REQUEST
                        && frame.frame().kind() != wire::FrameKind::ONE_WAY
                    {
                        // An answer to a request the broker sent (a transaction check-back);
                        // one that no call waits for any more is dropped.
                        if frame.frame().kind() == wire::FrameKind::RESPONSE
                            && connection.is_handshaken.get()
                        {
                            shard.client_calls.complete(connection.id, frame);
                        }
                        continue;
                    }
                    if !connection.is_handshaken.get() {
                        // On probation: one frame at a time, so the handshake's outcome is known
                        // before the next frame is read.
                        if let Some(frames) =
                            dispatch::handle(&shard, &connection, frame, None).await
                        {
                            connection.send(frames).await;
                        }
                        drop(claim);
                        if connection.is_closing.get() {
                            debug!(%peer, "closing connection after a refused handshake");
                            break 'read;
                        }
                        if connection.is_handshaken.get() {
                            decoder =
                                FrameDecoder::with_max_frame_bytes(shard.config.max_frame_bytes)
                                    .without_reserve_ahead();
                        }
                        continue;
                    }
                    if shard.stopping.load(std::sync::atomic::Ordering::Relaxed) {
                        // Stopping (a shutdown or a role change): a request that arrives now
                        // is refused at once, so that the drain waits only for what was
                        // admitted before (a pull would otherwise park for its whole suspend
                        // time, a send wait out its replication), and the client turns to
                        // another broker or tries again once this one is back.
                        drop(claim);
                        if frame.frame().kind() == wire::FrameKind::REQUEST {
                            let refusal = shard.with_encoder(|e| {
                                e.encode_error_response(
                                    frame.frame().request_id(),
                                    wire::Status::SERVICE_NOT_AVAILABLE,
                                    "the broker is stopping; try another broker or again shortly",
                                )
                            });
                            if let Ok(refusal) = refusal {
                                connection.send(vec![refusal]).await;
                            }
                        }
                        continue;
                    }
                    let Ok(permit) = permits.acquire_static_permit(1).await else {
                        break 'read;
                    };
                    let shard = shard.clone();
                    let connection = connection.clone();
                    let kind = frame
                        .frame()
                        .body_type()
                        .variant_name()
                        .unwrap_or("unknown");
                    shard.request_started(kind);
                    glommio::spawn_local(async move {
                        let answer = dispatch::handle(&shard, &connection, frame, early).await;
                        drop(claim);
                        if let Some(frames) = answer {
                            connection.send(frames).await;
                        }
                        tracing::trace!(target: TIMELINE, stage = "answered", connection = connection.id);
                        shard.request_finished(kind);
                        drop(permit);
                    })
                    .detach();
                }
                Ok(None) => break,
                Err(error) => {
                    // A malformed frame has been consumed (a fatal error closes below).
                    early.take();
                    budget.release(std::mem::take(&mut charged));
                    frame_started = None;
                    malformed_frames += 1;
                    let is_over_limit = malformed_frames > MAX_MALFORMED_FRAMES_PER_CONNECTION;
                    let message = if is_over_limit {
                        format!(
                            "{error}; closing the connection after {MAX_MALFORMED_FRAMES_PER_CONNECTION} malformed frames"
                        )
                    } else {
                        error.to_string()
                    };
                    let answer = shard
                        .with_encoder(|e| e.encode_error_response(0, error.status(), &message));
                    if let Ok(frame) = answer {
                        connection.send(vec![frame]).await;
                    }
                    if error.is_connection_fatal() || is_over_limit {
                        warn!(%peer, %error, malformed_frames, "closing connection after a framing error");
                        break 'read;
                    }
                    debug!(%peer, %error, "malformed frame answered");
                }
            }
        }
        // Admission: the frame now at the front is charged in full before more of it is read;
        // while the budget is spent, this connection is not read (TCP pushes back).
        if let Some(front) = decoder.pending_frame_bytes(&buffer) {
            if front > charged {
                if frame_started.is_none() {
                    tracing::trace!(target: TIMELINE, stage = "frame_begins", connection = connection_id, bytes = front);
                }
                budget.acquire(front - charged).await;
                charged = front;
                // The time to arrive whole counts from admission, not from a wait for room.
                frame_started = Some(Instant::now());
                // Admitted: the rest of the frame arrives into room made once, not into a
                // buffer that grows (and is copied) step by step. The room holds a read chunk
                // more, so the reads that end the frame (and take the next one's first bytes)
                // need no more room; it is a new allocation, never a `realloc`, which would
                // copy the whole old block (`grow_without_realloc`).
                if front > buffer.len() {
                    let slack = if front > MAX_READ_CHUNK_BYTES {
                        MAX_READ_CHUNK_BYTES
                    } else {
                        read_chunk_bytes
                    };
                    grow_without_realloc(&mut buffer, front + slack);
                }
            }
        }
        if !buffer.is_empty() && frame_started.is_none() {
            tracing::trace!(target: TIMELINE, stage = "frame_begins", connection = connection_id);
            frame_started = Some(Instant::now());
        }
        if shard.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        // The rest of an admitted frame fits in the room made at its admission: asking for a
        // whole chunk more near its end would move the frame's bytes.
        let chunk = match decoder.pending_frame_bytes(&buffer) {
            Some(front) if front > buffer.len() => read_chunk_bytes.min(front - buffer.len()),
            _ => read_chunk_bytes,
        };
        buffer.reserve(chunk);
        let start = buffer.len();
        // Read into all the room there is when it was made for a known frame.
        let mut read_bytes = chunk.max((buffer.capacity() - start).min(MAX_FRAME_READ_BYTES));
        if let Some(socket) = socket.filter(|_| read_bytes > chunk) {
            // The rest of an admitted frame: what has arrived is taken straight into the room
            // reserved for it, which is not zeroed first (zeroing a batch's megabyte before
            // every read cost more than a tenth of receiving it); only when nothing has
            // arrived does the waiting read below run, offered one chunk.
            if connection.is_handshaken.get() {
                match receive_arrived(socket, &mut buffer, read_bytes) {
                    Ok(0) => break,
                    Ok(_) => continue,
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                        read_bytes = chunk;
                    }
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        }
        room.offer(&mut buffer, read_bytes);
        let deadline = if connection.is_handshaken.get() {
            frame_started.map(|started| started + frame_read_timeout)
        } else {
            Some(handshake_deadline)
        };
        let read = if let Some(deadline) = deadline {
            let remaining = deadline.saturating_duration_since(Instant::now());
            futures_lite::future::or(
                async { Some(reader.read(&mut buffer[start..]).await) },
                async {
                    glommio::timer::sleep(remaining).await;
                    None
                },
            )
            .await
        } else {
            Some(reader.read(&mut buffer[start..]).await)
        };
        let received = match read {
            Some(Ok(n)) => n,
            _ => 0,
        };
        room.received(&mut buffer, start, received);
        match read {
            None => {
                if connection.is_handshaken.get() {
                    warn!(%peer, buffered = buffer.len(), "closing connection: a frame did not arrive whole within {frame_read_timeout:?}");
                } else {
                    debug!(%peer, "closing connection: no handshake within {handshake_timeout:?}");
                }
                break;
            }
            Some(Ok(0)) | Some(Err(_)) => break,
            Some(Ok(n)) => {
                read_chunk_bytes = if n >= read_chunk_bytes {
                    (read_chunk_bytes * 2).min(MAX_READ_CHUNK_BYTES)
                } else if n < read_chunk_bytes / 4 {
                    (read_chunk_bytes / 2).max(MIN_READ_CHUNK_BYTES)
                } else {
                    read_chunk_bytes
                };
            }
        }
    }
    // The frame being received is freed before its charge goes back, so the next connection
    // admitted into the budget does not hold its memory while this one still does.
    drop(buffer);
    budget.release(charged);
    // The client leaves its groups now, so the other members rebalance at once; its requests
    // still running (a parked pull waits up to its suspend timeout) answer into the void.
    shard.unregister_connection(connection_id);
    // Let running requests answer, then close the writer.
    let _ = permits.acquire(inflight_limit as u64).await;
    drop(connection);
    writer_task.await;
    debug!(%peer, connection_id, "connection closed");
}

/// Receives what has already arrived on `socket`, at most `max` bytes, into `buffer`'s spare
/// capacity (which must hold `max`), without waiting: `WouldBlock` when nothing has arrived,
/// `Ok(0)` when the peer closed. The bytes are written by the kernel, so the room need not be
/// initialized first, and the buffer's length covers only what was received.
fn receive_arrived(socket: RawFd, buffer: &mut BytesMut, max: usize) -> io::Result<usize> {
    let spare = buffer.spare_capacity_mut();
    assert!(
        spare.len() >= max,
        "room is reserved before it is received into"
    );
    // SAFETY: `spare` is `max` or more writable bytes owned by `buffer`; recv writes at most
    // `max` of them and returns how many it wrote, and only those are added to the length.
    let received =
        unsafe { libc::recv(socket, spare.as_mut_ptr().cast(), max, libc::MSG_DONTWAIT) };
    if received < 0 {
        return Err(io::Error::last_os_error());
    }
    let received = received as usize;
    // SAFETY: the kernel initialized `received <= max` bytes after the current length.
    unsafe { buffer.set_len(buffer.len() + received) };
    Ok(received)
}

/// The room after a connection's received bytes that is already initialized, so a read is
/// offered room without zeroing it again: a socket read takes a `&mut [u8]`, which must be
/// initialized, and zeroing the whole room of a large frame before every read that fills only
/// part of it cost more of the network core than receiving the bytes.
///
/// The room known to be initialized is what the last read was offered and did not fill. It
/// stays valid while the end of the received bytes stays at the same address: taking frames
/// off the front (`split_to`) and reserving without moving keep it; reserving that moves the
/// bytes (a new allocation, or the bytes shifted to the front of the old one) moves the end,
/// and the room is then zeroed again.
#[derive(Debug, Default)]
pub(super) struct ReadRoom {
    /// Address of the end of the received bytes when `initialized` was recorded.
    data_end: usize,
    /// Bytes after `data_end` that were initialized (zeroed or written by a read).
    initialized: usize,
}

impl ReadRoom {
    /// Extends `buffer` by `room` initialized bytes to read into (zeroing only those not known
    /// to be initialized). The caller has reserved them: `buffer.capacity() >= len + room`.
    pub(super) fn offer(&mut self, buffer: &mut BytesMut, room: usize) {
        let start = buffer.len();
        assert!(
            buffer.capacity() - start >= room,
            "room is reserved before it is offered"
        );
        let end = buffer.as_ptr() as usize + start;
        let known = if end == self.data_end {
            self.initialized.min(room)
        } else {
            0
        };
        // SAFETY: `known <= room <= capacity - len`. The `known` bytes after the end of the
        // received bytes were initialized (zeroed by `resize` or written by a read through an
        // initialized slice) when `data_end` was recorded, and the end has not moved since, so
        // they are the same bytes of the same allocation: splitting frames off the front and
        // reserving in place leave them alone (see the type's comment).
        unsafe { buffer.set_len(start + known) };
        buffer.resize(start + room, 0);
    }

    /// After a read into the room offered at `start` (the buffer's length before `offer`)
    /// that received `received` bytes: keeps those and remembers the rest of the room.
    pub(super) fn received(&mut self, buffer: &mut BytesMut, start: usize, received: usize) {
        let room_end = buffer.len();
        debug_assert!(start + received <= room_end);
        buffer.truncate(start + received);
        self.data_end = buffer.as_ptr() as usize + buffer.len();
        self.initialized = room_end - buffer.len();
    }
}

/// A connection's writer: sends what is queued on `queued` until every sender is gone, then
/// closes the write half. Whatever is queued when a write starts leaves in the same system call.
pub(super) async fn write_queued<W: AsyncWrite + Unpin>(
    socket: RawFd,
    writer: W,
    queued: local_channel::LocalReceiver<Outbound>,
) {
    write_queued_to(Some(socket), writer, queued).await
}

/// [`write_queued`] for a writer with or without a descriptor of its own (`serve_native`).
async fn write_queued_to<W: AsyncWrite + Unpin>(
    socket: Option<RawFd>,
    mut writer: W,
    queued: local_channel::LocalReceiver<Outbound>,
) {
    let mut pending: VecDeque<Bytes> = VecDeque::new();
    while let Some(frames) = queued.recv().await {
        pending.extend(frames);
        while pending.len() < MAX_WRITE_SLICES {
            match futures_lite::future::poll_once(queued.recv()).await {
                Some(Some(more)) => pending.extend(more),
                _ => break,
            }
        }
        let written = match socket {
            Some(socket) => write_all_vectored(socket, &mut writer, &mut pending).await,
            None => write_all_through(&mut writer, &mut pending).await,
        };
        if written.is_err() {
            return;
        }
    }
    let _ = writer.close().await;
}

/// Reads a new connection's first bytes until they tell its protocol (at most
/// [`shardmq_remoting::SNIFF_BYTES`] are needed): `Some((true, bytes))` for RocketMQ's remoting
/// protocol, `Some((false, bytes))` for ShardMQ's own (and for bytes of neither, which the
/// native decoder then answers as the malformed frame they are), `None` when the peer closed or
/// said nothing within `timeout` (the handshake's).
pub(super) async fn tell_protocol<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
) -> Option<(bool, BytesMut)> {
    let deadline = Instant::now() + timeout;
    let mut first = BytesMut::with_capacity(MIN_READ_CHUNK_BYTES);
    loop {
        match shardmq_remoting::sniff(&first) {
            shardmq_remoting::Sniffed::Remoting => return Some((true, first)),
            shardmq_remoting::Sniffed::Native | shardmq_remoting::Sniffed::Neither => {
                return Some((false, first))
            }
            shardmq_remoting::Sniffed::NeedMore => {}
        }
        let start = first.len();
        first.resize(start + MIN_READ_CHUNK_BYTES, 0);
        let remaining = deadline.saturating_duration_since(Instant::now());
        let read = futures_lite::future::or(
            async { stream.read(&mut first[start..]).await.ok() },
            async {
                glommio::timer::sleep(remaining).await;
                None
            },
        )
        .await;
        match read {
            Some(received) if received > 0 => first.truncate(start + received),
            _ => return None,
        }
    }
}

/// Writes every byte of `pending` (frames, and the stored records a pull answer carries as
/// slices of the CommitLog's buffers) to the socket `socket`, in as few system calls as it
/// takes: one `sendmsg` gathers up to [`MAX_WRITE_SLICES`] slices, so a pull answer of a
/// thousand records leaves in one call instead of one `send` per record, and nothing is copied
/// into a contiguous buffer first. When the socket's send buffer is full, it waits for room
/// through `writer` (glommio's write of the first slice, which returns once some of it went).
///
/// `writer` must be the write half of the stream `socket` belongs to; it is the only writer.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    socket: RawFd,
    writer: &mut W,
    pending: &mut VecDeque<Bytes>,
) -> io::Result<()> {
    while !pending.is_empty() {
        let sent = {
            let slices: Vec<IoSlice<'_>> = pending
                .iter()
                .filter(|frame| !frame.is_empty())
                .take(MAX_WRITE_SLICES)
                .map(|frame| IoSlice::new(frame))
                .collect();
            if slices.is_empty() {
                pending.clear();
                break;
            }
            send_slices(socket, &slices)
        };
        let written = match sent {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let first = pending
                    .iter()
                    .find(|frame| !frame.is_empty())
                    .expect("a non-empty slice is pending");
                writer.write(first).await?
            }
            Err(e) => return Err(e),
        };
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the peer stopped taking bytes",
            ));
        }
        consume(pending, written);
    }
    Ok(())
}

/// Writes every byte of `pending` through `writer` (a TLS session, which encrypts the slices
/// of one vectored write into full records), then flushes it: a session may hold records back
/// when the socket is full.
async fn write_all_through<W: AsyncWrite + Unpin>(
    writer: &mut W,
    pending: &mut VecDeque<Bytes>,
) -> io::Result<()> {
    while !pending.is_empty() {
        let written = {
            let slices: Vec<IoSlice<'_>> = pending
                .iter()
                .filter(|frame| !frame.is_empty())
                .take(MAX_WRITE_SLICES)
                .map(|frame| IoSlice::new(frame))
                .collect();
            if slices.is_empty() {
                pending.clear();
                break;
            }
            writer.write_vectored(&slices).await?
        };
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the peer stopped taking bytes",
            ));
        }
        consume(pending, written);
    }
    writer.flush().await
}

/// One non-blocking `sendmsg` of `slices` (without SIGPIPE on a closed peer).
fn send_slices(socket: RawFd, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data); `IoSlice` is ABI-compatible
    // with `iovec` on Unix, and the slices outlive the call; `socket` is the open socket of the
    // connection, owned by the stream whose write half the caller holds.
    let sent = unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = slices.as_ptr() as *mut libc::iovec;
        message.msg_iovlen = slices.len() as _;
        libc::sendmsg(socket, &message, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

/// Drops the first `written` bytes of `pending`.
fn consume(pending: &mut VecDeque<Bytes>, mut written: usize) {
    while written > 0 {
        let front = pending.front_mut().expect("written bytes were pending");
        let take = written.min(front.len());
        front.advance(take);
        written -= take;
        if front.is_empty() {
            pending.pop_front();
        }
    }
    while pending.front().is_some_and(Bytes::is_empty) {
        pending.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fills `buffer[from..]` the way a socket read would.
    fn receive(buffer: &mut BytesMut, from: usize, byte: u8) {
        buffer[from..].fill(byte);
    }

    #[test]
    fn room_left_by_a_short_read_is_offered_again_without_zeroing() {
        let mut buffer = BytesMut::with_capacity(64);
        let mut room = ReadRoom::default();
        room.offer(&mut buffer, 64);
        assert_eq!(buffer.len(), 64);
        assert!(buffer.iter().all(|&b| b == 0), "fresh room is zeroed");
        // The "kernel" writes the whole room, but only 10 bytes count as received.
        receive(&mut buffer, 0, 7);
        room.received(&mut buffer, 0, 10);
        assert_eq!(&buffer[..], &[7u8; 10]);
        // A 4-byte frame is taken off the front: the end does not move.
        let frame = buffer.split_to(4);
        assert_eq!(&frame[..], &[7u8; 4]);
        let start = buffer.len();
        room.offer(&mut buffer, 40);
        assert_eq!(buffer.len(), start + 40);
        // Not zeroed again: the bytes the last read was offered are still there.
        assert!(buffer[start..].iter().all(|&b| b == 7));
        room.received(&mut buffer, start, 0);
        assert_eq!(&buffer[..], &[7u8; 6]);
    }

    #[test]
    fn room_beyond_what_was_initialized_is_zeroed() {
        let mut buffer = BytesMut::with_capacity(64);
        let mut room = ReadRoom::default();
        room.offer(&mut buffer, 16);
        receive(&mut buffer, 0, 9);
        room.received(&mut buffer, 0, 8);
        // 8 bytes of room known; 24 offered: the last 16 are zeroed.
        room.offer(&mut buffer, 24);
        assert!(buffer[8..16].iter().all(|&b| b == 9));
        assert!(buffer[16..32].iter().all(|&b| b == 0));
    }

    #[test]
    fn room_is_zeroed_again_after_the_bytes_move() {
        let mut buffer = BytesMut::with_capacity(16);
        let mut room = ReadRoom::default();
        room.offer(&mut buffer, 16);
        receive(&mut buffer, 0, 5);
        room.received(&mut buffer, 0, 4);
        // Held elsewhere, so growing cannot happen in place: a new allocation.
        let shared = buffer.split_to(2).freeze();
        buffer.reserve(1 << 20);
        let start = buffer.len();
        room.offer(&mut buffer, 1 << 20);
        assert!(buffer[start..].iter().all(|&b| b == 0));
        assert_eq!(&buffer[..start], &[5u8; 2]);
        drop(shared);
    }
}
