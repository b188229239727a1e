//! The connections of one client: at most one per server address, made on first use and made
//! again after a failure.
//!
//! Owns: the address → connection map, connecting (one connect at a time per address, so a
//! burst of requests to a fresh broker makes one connection), and the client identity every
//! connection announces in its handshake. Never: choosing which server to ask (the callers
//! do), nor retrying a failed request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flatbuffers::FlatBufferBuilder;
use shardmq_schema::VerifiedFrame;
use tokio::sync::mpsc;

use crate::connection::{Body, Connection, Notice, RequestHandler};
use crate::error::{Error, Result};

type Slot = Arc<tokio::sync::Mutex<Option<Arc<Connection>>>>;

/// Connections by address.
pub(crate) struct ConnectionPool {
    client_id: String,
    connect_timeout: Duration,
    notices: Option<mpsc::Sender<Notice>>,
    /// Every connection's TLS (`None`: plain).
    tls: Option<shardmq_tls::ClientTls>,
    slots: Mutex<HashMap<String, Slot>>,
    is_shut_down: AtomicBool,
    /// Serves the servers' requests on every connection made after it is set.
    requests: std::sync::OnceLock<RequestHandler>,
    /// What every connection authenticates as (access control); `None`: anonymous.
    credentials: Option<shardmq_acl::Credentials>,
}

impl ConnectionPool {
    pub(crate) fn new(
        client_id: String,
        connect_timeout: Duration,
        notices: Option<mpsc::Sender<Notice>>,
        tls: Option<shardmq_tls::ClientTls>,
    ) -> Self {
        Self {
            client_id,
            connect_timeout,
            notices,
            tls,
            slots: Mutex::new(HashMap::new()),
            is_shut_down: AtomicBool::new(false),
            requests: std::sync::OnceLock::new(),
            credentials: None,
        }
    }

    /// Connections made by this pool authenticate as `credentials` with servers that ask.
    pub(crate) fn with_credentials(
        mut self,
        credentials: Option<shardmq_acl::Credentials>,
    ) -> Self {
        self.credentials = credentials;
        self
    }

    /// Serves the servers' requests (transaction check-backs) with `handler` on every
    /// connection made from now on; set it before the first connection. Only the first call
    /// has an effect.
    pub(crate) fn serve_requests(&self, handler: RequestHandler) {
        let _ = self.requests.set(handler);
    }

    pub(crate) fn client_id(&self) -> &str {
        &self.client_id
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The live connection to `address`, connecting (and shaking hands) when there is none or
    /// the last one failed.
    pub(crate) async fn get(&self, address: &str) -> Result<Arc<Connection>> {
        if self.is_shut_down.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        let slot = Arc::clone(self.slots().entry(address.to_owned()).or_default());
        let mut current = slot.lock().await;
        if let Some(connection) = current.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(connection));
        }
        let connection = Connection::connect_serving(
            address,
            &self.client_id,
            self.connect_timeout,
            self.notices.clone(),
            self.requests.get().cloned(),
            self.tls.as_ref(),
            self.credentials.as_ref(),
        )
        .await?;
        *current = Some(Arc::clone(&connection));
        if let Some(notices) = &self.notices {
            let _ = notices.try_send(Notice::Connected {
                address: address.to_owned(),
            });
        }
        Ok(connection)
    }

    /// Sends a request to `address` and waits for its response (any status).
    pub(crate) async fn request<F>(
        &self,
        address: &str,
        operation: &'static str,
        timeout: Duration,
        build: F,
    ) -> Result<VerifiedFrame>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> Body,
    {
        let connection = self.get(address).await?;
        connection.request(operation, timeout, build).await
    }

    /// Closes every connection and refuses new ones; requests in flight fail.
    pub(crate) fn shut_down(&self) {
        self.is_shut_down.store(true, Ordering::Release);
        let slots: Vec<Slot> = self.slots().drain().map(|(_, slot)| slot).collect();
        for slot in slots {
            if let Ok(mut connection) = slot.try_lock() {
                connection.take();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::testing::handshake_response;
    use bytes::BytesMut;
    use shardmq_schema::{wire, FrameDecoder, FrameEncoder};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn route_request(builder: &mut FlatBufferBuilder<'static>) -> Body {
        let topic = builder.create_string("t");
        let request = wire::GetRouteRequest::create(
            builder,
            &wire::GetRouteRequestArgs { topic: Some(topic) },
        );
        (wire::Body::GetRouteRequest, request.as_union_value())
    }

    /// A server whose first connection dies after the handshake and whose later connections
    /// answer every request `SYSTEM_BUSY`.
    async fn flaky_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            for connection_index in 0.. {
                let (mut socket, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let decoder = FrameDecoder::new();
                    let mut encoder = FrameEncoder::new();
                    let mut buffer = BytesMut::new();
                    loop {
                        while let Ok(Some(frame)) = decoder.decode(&mut buffer) {
                            let header = frame.frame();
                            let id = header.request_id();
                            if header.body_as_handshake_request().is_some() {
                                let answer = handshake_response(&mut encoder, id);
                                socket.write_all(&answer).await.unwrap();
                                if connection_index == 0 {
                                    return;
                                }
                            } else {
                                let answer = encoder
                                    .encode_error_response(id, wire::Status::SYSTEM_BUSY, "busy")
                                    .unwrap();
                                socket.write_all(&answer).await.unwrap();
                            }
                        }
                        if socket.read_buf(&mut buffer).await.unwrap_or(0) == 0 {
                            return;
                        }
                    }
                });
            }
        });
        address
    }

    #[tokio::test]
    async fn a_failed_connection_is_replaced_on_the_next_request() {
        let address = flaky_server().await;
        let (notices, mut received) = mpsc::channel(16);
        let pool = ConnectionPool::new("c".to_owned(), Duration::from_secs(5), Some(notices), None);
        let first = pool.get(&address).await.unwrap();
        assert_eq!(first.server().unwrap().broker_name, "fake-broker");
        // The server drops the first connection right after the handshake.
        while !first.is_closed() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let answer = pool
            .request(&address, "route", Duration::from_secs(5), route_request)
            .await
            .expect("a new connection answers");
        assert_eq!(answer.frame().status(), wire::Status::SYSTEM_BUSY);
        let second = pool.get(&address).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        // Each new connection is announced, so consumers can heartbeat there again.
        for _ in 0..2 {
            assert_eq!(
                received.recv().await,
                Some(Notice::Connected {
                    address: address.clone()
                })
            );
        }
        pool.shut_down();
        assert!(matches!(pool.get(&address).await, Err(Error::ShutDown)));
    }
}
