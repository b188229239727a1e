//! Announcing the broker to its name servers: register at start, every
//! `register_interval_ms` (30 s) and right after a topic change; unregister on clean shutdown.
//!
//! Runs on network shard 0. Each round opens a short connection per name server (handshake,
//! one request), so a restarted or unreachable namesrv costs nothing but a logged warning.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use shardmq_schema::{build_frame, wire, FrameDecoder, FrameEncoder, FrameHeader, VerifiedFrame};
use tracing::{debug, info, warn};

use crate::network::NetworkShard;

const CALL_TIMEOUT: Duration = Duration::from_secs(3);

pub async fn run(shard: Rc<NetworkShard>) {
    let interval = Duration::from_millis(shard.config.register_interval_ms.max(10));
    let mut registered_version = u64::MAX;
    let mut last_round = Instant::now() - interval;
    loop {
        if shard.stopping.load(Ordering::Relaxed) {
            break;
        }
        let version = shard.topics().version;
        if version != registered_version || last_round.elapsed() >= interval {
            register_all(&shard).await;
            registered_version = version;
            last_round = Instant::now();
        }
        future::or(
            shard.changed.notified(),
            glommio::timer::sleep(Duration::from_millis(100)),
        )
        .await;
    }
    unregister_all(&shard).await;
}

async fn register_all(shard: &NetworkShard) {
    let frame = match encode_register(shard) {
        Ok(frame) => frame,
        Err(e) => {
            warn!(error = %e, "cannot encode the registration");
            return;
        }
    };
    for address in &shard.config.namesrv {
        match call(address, frame.clone()).await {
            Ok(answer) if answer.frame().status() == wire::Status::OK => {
                debug!(namesrv = %address, "registered");
                // A slave without ha_master learns its master's HA address here.
                let named = answer
                    .frame()
                    .body_as_register_broker_response()
                    .and_then(|r| r.ha_server_address())
                    .and_then(|a| a.parse().ok());
                if let Some(ha) = named {
                    if shard.config.role() == crate::config::BrokerRole::Slave
                        && shard.config.ha_master.is_empty()
                    {
                        crate::role::learn_master(ha);
                    }
                }
            }
            Ok(answer) => warn!(
                namesrv = %address,
                status = ?answer.frame().status(),
                message = answer.frame().message().unwrap_or(""),
                "namesrv refused the registration"
            ),
            Err(e) => warn!(namesrv = %address, error = %e, "cannot register with namesrv"),
        }
    }
}

async fn unregister_all(shard: &NetworkShard) {
    let config = &shard.config;
    let address = shard.store_host.get().to_string();
    let frame = FrameEncoder::new().encode(|b| {
        let cluster = b.create_string(&config.cluster_name);
        let broker = b.create_string(&config.broker_name);
        let address = b.create_string(&address);
        let body = wire::UnregisterBrokerRequest::create(
            b,
            &wire::UnregisterBrokerRequestArgs {
                cluster_name: Some(cluster),
                broker_name: Some(broker),
                broker_id: config.broker_id,
                broker_address: Some(address),
            },
        );
        build_frame(
            b,
            &FrameHeader::request(2),
            wire::Body::UnregisterBrokerRequest,
            Some(body.as_union_value()),
        )
    });
    let Ok(frame) = frame else { return };
    for namesrv in &config.namesrv {
        match call(namesrv, frame.clone()).await {
            Ok(_) => info!(namesrv = %namesrv, "unregistered"),
            Err(e) => warn!(namesrv = %namesrv, error = %e, "cannot unregister from namesrv"),
        }
    }
}

fn encode_register(shard: &NetworkShard) -> Result<Bytes, shardmq_schema::FrameError> {
    let config = &shard.config;
    let table = shard.topics();
    let address = shard.store_host.get().to_string();
    let ha_address = shard.ha_host.get().map(|a| a.to_string());
    FrameEncoder::with_max_frame_bytes(config.max_frame_bytes).encode(|b| {
        let ha_address = ha_address.as_deref().map(|a| b.create_string(a));
        let topics: Vec<_> = table.topics.values().map(|t| t.to_wire(b)).collect();
        let topics = b.create_vector(&topics);
        let cluster = b.create_string(&config.cluster_name);
        let broker = b.create_string(&config.broker_name);
        let address = b.create_string(&address);
        let body = wire::RegisterBrokerRequest::create(
            b,
            &wire::RegisterBrokerRequestArgs {
                cluster_name: Some(cluster),
                broker_name: Some(broker),
                broker_id: config.broker_id,
                broker_address: Some(address),
                ha_server_address: ha_address,
                topics: Some(topics),
                topic_config_version: table.version,
            },
        );
        build_frame(
            b,
            &FrameHeader::request(2),
            wire::Body::RegisterBrokerRequest,
            Some(body.as_union_value()),
        )
    })
}

/// Handshake, then one request; returns the answer to the request.
async fn call(address: &str, request: Bytes) -> Result<VerifiedFrame, String> {
    let address: SocketAddr = address.parse().map_err(|e| format!("bad address: {e}"))?;
    let work = async {
        let mut stream = TcpStream::connect_timeout(address, CALL_TIMEOUT)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let handshake = FrameEncoder::new()
            .encode(|b| {
                shardmq_schema::build_handshake_request(
                    b,
                    &FrameHeader::request(1),
                    "shardmq-broker",
                )
            })
            .map_err(|e| e.to_string())?;
        let decoder = FrameDecoder::new();
        let mut buffer = BytesMut::new();
        for frame in [handshake, request] {
            stream
                .write_all(&frame)
                .await
                .map_err(|e| format!("write: {e}"))?;
            let answer = read_frame(&mut stream, &decoder, &mut buffer).await?;
            if answer.frame().body_as_handshake_response().is_some()
                && answer.frame().status() != wire::Status::OK
            {
                return Err(format!("handshake refused: {:?}", answer.frame().status()));
            }
            if answer.frame().body_as_handshake_response().is_none() {
                return Ok(answer);
            }
        }
        Err("no answer to the request".to_string())
    };
    future::or(work, async {
        glommio::timer::sleep(CALL_TIMEOUT * 2).await;
        Err("timed out".to_string())
    })
    .await
}

async fn read_frame(
    stream: &mut TcpStream,
    decoder: &FrameDecoder,
    buffer: &mut BytesMut,
) -> Result<VerifiedFrame, String> {
    loop {
        if let Some(frame) = decoder.decode(buffer).map_err(|e| e.to_string())? {
            return Ok(frame);
        }
        let mut chunk = [0u8; 4096];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("connection closed".into());
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}
