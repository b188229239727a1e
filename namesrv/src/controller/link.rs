//! A frame connection to another controller (tokio): handshake, then one request at a time.
//! Used for Raft RPCs between controllers and for a follower forwarding a broker's heartbeat
//! to the leader. When the other controller challenges in its handshake answer (access control
//! on) and this name server has an account, the link authenticates right after the handshake.

use std::io;
use std::time::Duration;

use bytes::BytesMut;
use shardmq_acl::Credentials;
use shardmq_schema::{wire, FrameDecoder, FrameEncoder, FrameHeader, VerifiedFrame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::tls::LinkStream;

/// Largest answer a controller accepts from another (snapshots travel in chunks).
pub const MAX_LINK_FRAME_BYTES: usize = 64 << 20;

pub struct Link {
    stream: LinkStream,
    decoder: FrameDecoder,
    encoder: FrameEncoder,
    buffer: BytesMut,
    next_request_id: u64,
}

pub type Build<'a> = Box<
    dyn FnOnce(
            &mut flatbuffers::FlatBufferBuilder<'static>,
            FrameHeader<'static>,
        ) -> flatbuffers::WIPOffset<wire::Frame<'static>>
        + Send
        + 'a,
>;

impl Link {
    /// Connects to `address`, shakes hands and, when challenged and given `credentials`,
    /// authenticates, all within `timeout`. A refused account is an error naming the
    /// controller and the account.
    pub async fn connect(
        address: &str,
        timeout: Duration,
        credentials: Option<&Credentials>,
    ) -> io::Result<Link> {
        let work = async {
            let stream = crate::tls::connect_link(address).await?;
            let mut link = Link {
                stream,
                decoder: FrameDecoder::with_max_frame_bytes(MAX_LINK_FRAME_BYTES),
                encoder: FrameEncoder::with_max_frame_bytes(MAX_LINK_FRAME_BYTES),
                buffer: BytesMut::with_capacity(64 << 10),
                next_request_id: 1,
            };
            let answer = link
                .request(Box::new(|b, header| {
                    shardmq_schema::build_handshake_request(b, &header, "shardmq-controller")
                }))
                .await?;
            if answer.frame().status() != wire::Status::OK {
                return Err(io::Error::other(format!(
                    "{address} refused the handshake: {:?}",
                    answer.frame().status()
                )));
            }
            let nonce = answer
                .frame()
                .body_as_handshake_response()
                .and_then(|r| r.auth_nonce())
                .map(|nonce| nonce.bytes().to_vec());
            if let (Some(nonce), Some(credentials)) = (nonce, credentials) {
                link.authenticate(address, &nonce, credentials).await?;
            }
            Ok(link)
        };
        tokio::time::timeout(timeout, work).await.map_err(|_| {
            io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {address}"))
        })?
    }

    /// Answers the handshake's challenge with `credentials`; the answer must be OK.
    async fn authenticate(
        &mut self,
        address: &str,
        nonce: &[u8],
        credentials: &Credentials,
    ) -> io::Result<()> {
        let access_key = credentials.access_key().to_owned();
        let (client_nonce, proof) = credentials.answer(nonce).map_err(io::Error::other)?;
        let answer = self
            .request(Box::new(move |b, header| {
                shardmq_schema::build_auth_request(b, &header, &access_key, &client_nonce, &proof)
            }))
            .await?;
        let frame = answer.frame();
        if frame.status() != wire::Status::OK || frame.body_as_auth_response().is_none() {
            let refusal = format!(
                "the controller at {address} refused account {:?} ({:?}): {}",
                credentials.access_key(),
                frame.status(),
                frame.message().unwrap_or_default()
            );
            tracing::warn!("{refusal}");
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, refusal));
        }
        Ok(())
    }

    /// Sends one request and reads its answer.
    pub async fn request(&mut self, build: Build<'_>) -> io::Result<VerifiedFrame> {
        let id = self.next_request_id;
        self.next_request_id += 1;
        let frame = self
            .encoder
            .encode(|b| build(b, FrameHeader::request(id)))
            .map_err(io::Error::other)?;
        self.stream.write_all(&frame).await?;
        // Under TLS, written bytes may wait in the session until flushed.
        self.stream.flush().await?;
        loop {
            if let Some(frame) = self
                .decoder
                .decode(&mut self.buffer)
                .map_err(io::Error::other)?
            {
                if frame.frame().request_id() == id {
                    return Ok(frame);
                }
                continue;
            }
            let read = self.stream.read_buf(&mut self.buffer).await?;
            if read == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                ));
            }
        }
    }
}
