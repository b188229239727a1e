//! One client connection: read frames, run each request on its own task (pipelining: answers
//! go out as they complete, in any order), and write answers and pushed frames.
//!
//! Owns the connection's read buffer, its writer task and its limits: at most
//! `max_inflight_per_connection` requests run at once (reading pauses beyond that, which pushes
//! back on the client through TCP), and a frame over `max_frame_bytes` closes the connection
//! after an error answer. A malformed frame gets an error answer and the connection goes on.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use bytes::BytesMut;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use shardmq_schema::{wire, FrameDecoder};
use tracing::{debug, warn};

use super::{handlers, NetworkShard, Outbound};

/// How much is read from the socket at a time.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Per-connection state shared by its request tasks.
pub struct Connection {
    pub id: u64,
    pub peer: std::net::SocketAddr,
    pub is_handshaken: Cell<bool>,
    pub client_id: RefCell<Option<String>>,
    out: Rc<local_channel::LocalSender<Outbound>>,
}

impl Connection {
    /// Queues frames for the writer (waits when the client reads slower than we answer).
    pub async fn send(&self, frames: Outbound) {
        let _ = self.out.send(frames).await;
    }
}

pub async fn serve(shard: Rc<NetworkShard>, stream: TcpStream) {
    let peer = match stream.peer_addr() {
        Ok(peer) => peer,
        Err(_) => return,
    };
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = futures_lite::io::split(stream);
    let inflight_limit = shard.config.max_inflight_per_connection;
    let (out, out_rx) = local_channel::new_bounded::<Outbound>(inflight_limit * 2 + 16);
    let out = Rc::new(out);
    let connection_id = shard.register_connection(out.clone());
    let connection = Rc::new(Connection {
        id: connection_id,
        peer,
        is_handshaken: Cell::new(false),
        client_id: RefCell::new(None),
        out,
    });
    debug!(%peer, connection_id, "connection opened");

    let writer_task = glommio::spawn_local(async move {
        while let Some(frames) = out_rx.recv().await {
            for frame in frames {
                if writer.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
        let _ = writer.close().await;
    })
    .detach();

    let decoder = FrameDecoder::with_max_frame_bytes(shard.config.max_frame_bytes);
    let permits = Rc::new(Semaphore::new(inflight_limit as u64));
    let mut buffer = BytesMut::with_capacity(READ_CHUNK_BYTES);
    'read: loop {
        loop {
            match decoder.decode(&mut buffer) {
                Ok(Some(frame)) => {
                    if frame.frame().kind() != wire::FrameKind::REQUEST
                        && frame.frame().kind() != wire::FrameKind::ONE_WAY
                    {
                        // Answers to broker-initiated requests; none are outstanding in this
                        // version, so they are dropped.
                        continue;
                    }
                    let Ok(permit) = permits.acquire_static_permit(1).await else {
                        break 'read;
                    };
                    let shard = shard.clone();
                    let connection = connection.clone();
                    shard.request_started();
                    glommio::spawn_local(async move {
                        let answer = handlers::handle(&shard, &connection, frame).await;
                        if let Some(frames) = answer {
                            connection.send(frames).await;
                        }
                        shard.request_finished();
                        drop(permit);
                    })
                    .detach();
                }
                Ok(None) => break,
                Err(error) => {
                    let answer = shard.with_encoder(|e| {
                        e.encode_error_response(0, error.status(), &error.to_string())
                    });
                    if let Ok(frame) = answer {
                        connection.send(vec![frame]).await;
                    }
                    if error.is_connection_fatal() {
                        warn!(%peer, %error, "closing connection after a fatal framing error");
                        break 'read;
                    }
                    debug!(%peer, %error, "malformed frame answered");
                }
            }
        }
        if shard.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        buffer.reserve(READ_CHUNK_BYTES);
        let start = buffer.len();
        buffer.resize(start + READ_CHUNK_BYTES, 0);
        match reader.read(&mut buffer[start..]).await {
            Ok(0) | Err(_) => {
                buffer.truncate(start);
                break;
            }
            Ok(n) => buffer.truncate(start + n),
        }
    }
    // Let running requests answer, then close the writer.
    let _ = permits.acquire(inflight_limit as u64).await;
    shard.unregister_connection(connection_id);
    drop(connection);
    writer_task.await;
    debug!(%peer, connection_id, "connection closed");
}
