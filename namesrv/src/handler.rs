//! Request handling: one verified frame in, at most one response frame out
//! (docs/protocol.md, "Version handshake" and "Name server").
//!
//! Owns: the handshake state of a connection ([`Session`]), the mapping from wire tables to
//! [`RouteTable`] calls and back, and the status every failure answers with. Never: sockets,
//! reading or buffering bytes (the server does that), or holding the route table's lock for
//! longer than one call into it.
//!
//! Data enters as a [`VerifiedFrame`] (or a [`FrameError`] from the decoder) and leaves as
//! response bytes appended to the connection's write buffer, with an [`AfterFrame`] telling the
//! server whether the connection goes on.
//!
//! Size: about 650 lines of code and 190 of unit tests: one function per name-server request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use bytes::BytesMut;
use shardmq_schema::wire;
use shardmq_schema::{
    build_frame, negotiate_protocol_version, FrameEncoder, FrameError, FrameHeader, VerifiedFrame,
    MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use tracing::{debug, error, info, warn};

use crate::access::Access;
use crate::registry::{
    validate_topic_name, BrokerRegistration, ClusterSummary, RegisterOutcome, RegistryError,
    RouteBroker, RouteTable, TopicQueues, TopicRoute,
};

/// The program name a namesrv announces in `HandshakeResponse.server.name`.
pub const SERVER_NAME: &str = "shardmq-namesrv";

/// `ServerInfo.broker_id` of a namesrv.
pub const NAMESRV_BROKER_ID: i64 = -1;

/// Malformed frames one connection may send (each answered `MALFORMED_FRAME`) before it is
/// closed: a peer that keeps sending garbage is broken, and each costs a log line.
pub const MAX_MALFORMED_FRAMES_PER_CONNECTION: u32 = 64;

/// What the server does with the connection after a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFrame {
    KeepOpen,
    /// Write what was appended, then close: the stream has lost its frame boundaries, or the
    /// handshake found no common version.
    Close,
}

/// One connection's protocol state.
#[derive(Debug, Clone)]
pub struct Session {
    peer: SocketAddr,
    /// Set by a successful handshake.
    protocol_version: Option<u32>,
    /// Frames the decoder refused so far.
    malformed_frames: u32,
    /// Names this connection among the server's connections.
    connection_id: u64,
    /// The broker instances (broker name, broker id) registered on this connection: each is
    /// dropped from the routes when the connection closes, unless it registered since on
    /// another connection. At most [`MAX_REGISTRATIONS_PER_CONNECTION`].
    registered: Vec<(String, i64)>,
    /// The challenge the handshake answer carried, until an `AuthRequest` answers it (access
    /// control on).
    auth_nonce: Option<shardmq_acl::Nonce>,
    /// The account the connection proved it holds; `None`: anonymous.
    account: Option<String>,
}

/// Broker instances one connection may register (a broker registers one; more is a misuse).
pub const MAX_REGISTRATIONS_PER_CONNECTION: usize = 16;

static NEXT_CONNECTION_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Session {
    /// A connection from `peer` that has not shaken hands yet.
    #[must_use]
    pub fn new(peer: SocketAddr) -> Self {
        Self {
            peer,
            protocol_version: None,
            malformed_frames: 0,
            connection_id: NEXT_CONNECTION_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            registered: Vec::new(),
            auth_nonce: None,
            account: None,
        }
    }

    /// Whether the handshake has completed, so requests other than a handshake are served.
    #[must_use]
    pub fn is_handshaken(&self) -> bool {
        self.protocol_version.is_some()
    }

    /// The peer's address, for logs.
    #[must_use]
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The account the connection authenticated as, if any.
    #[must_use]
    pub fn account(&self) -> Option<&str> {
        self.account.as_deref()
    }
}

/// The outcome of one request before it is encoded.
enum Reply {
    /// A `HandshakeResponse` with this status (`UNSUPPORTED_VERSION` closes the connection).
    Handshake {
        status: wire::Status,
        protocol_version: u32,
        message: Option<String>,
        /// The access-control challenge, when access control is on.
        auth_nonce: Option<shardmq_acl::Nonce>,
    },
    /// An `AuthResponse`: the connection speaks as this account from now on.
    Authenticated { access_key: String, is_admin: bool },
    /// A refused `AuthRequest`: `ACCESS_DENIED`, then the connection closes.
    AuthRefused(String),
    /// A `RegisterBrokerResponse`.
    Registered(RegisterOutcome),
    /// `OK` with no body.
    Unregistered,
    /// A `RouteResponse`.
    Route(TopicRoute),
    /// A `TopicListResponse`.
    TopicList(Vec<String>),
    /// A `ClusterInfoResponse`.
    Clusters(Vec<ClusterSummary>),
    /// A failure: status and message, no body.
    Error(wire::Status, String),
}

/// Answers requests against the shared route table. One per server, shared by every
/// connection.
#[derive(Debug)]
pub struct RequestHandler {
    registry: Arc<Mutex<RouteTable>>,
    /// Announced in `HandshakeResponse.max_frame_bytes`; the server's decoder enforces it.
    max_frame_bytes: usize,
    /// Access control (off unless [`RequestHandler::with_access`]).
    access: Arc<Access>,
}

impl RequestHandler {
    /// A handler over `registry` that announces `max_frame_bytes` to its peers.
    #[must_use]
    pub fn new(registry: Arc<Mutex<RouteTable>>, max_frame_bytes: usize) -> Self {
        Self {
            registry,
            max_frame_bytes,
            access: Access::off(),
        }
    }

    /// The same handler deciding every request with `access`.
    #[must_use]
    pub fn with_access(mut self, access: Arc<Access>) -> Self {
        self.access = access;
        self
    }

    /// Handles one frame of `session`, appending the response (if the frame wants one) to
    /// `out`. ONE_WAY requests are served without a response; RESPONSE frames are ignored,
    /// since a namesrv sends no requests they could answer.
    pub fn handle_frame(
        &self,
        session: &mut Session,
        frame: &VerifiedFrame,
        encoder: &mut FrameEncoder,
        out: &mut BytesMut,
    ) -> AfterFrame {
        let frame = frame.frame();
        let kind = frame.kind();
        if kind == wire::FrameKind::RESPONSE {
            debug!(peer = %session.peer, request_id = frame.request_id(), "ignoring a response frame: the namesrv sends no requests");
            return AfterFrame::KeepOpen;
        }
        let request_id = frame.request_id();
        let reply = if kind == wire::FrameKind::REQUEST || kind == wire::FrameKind::ONE_WAY {
            self.answer(session, &frame)
        } else {
            Reply::Error(
                wire::Status::UNKNOWN_REQUEST,
                format!("frame kind {} is unknown", kind.0),
            )
        };
        let after = match &reply {
            Reply::Handshake { status, .. } if *status != wire::Status::OK => AfterFrame::Close,
            Reply::AuthRefused(_) => AfterFrame::Close,
            _ => AfterFrame::KeepOpen,
        };
        if kind == wire::FrameKind::ONE_WAY {
            return after;
        }
        crate::metrics::namesrv().answered(match &reply {
            Reply::Error(status, _) => *status,
            Reply::Handshake { status, .. } => *status,
            Reply::AuthRefused(_) => wire::Status::ACCESS_DENIED,
            _ => wire::Status::OK,
        });
        if self.encode_reply(request_id, &reply, encoder, out).is_err() {
            return AfterFrame::Close;
        }
        after
    }

    /// Answers a frame the decoder refused: `MALFORMED_FRAME` or `FRAME_TOO_LARGE` with
    /// request id 0 (the frame's own id cannot be trusted), closing when the stream has lost
    /// its frame boundaries or the connection has sent more than
    /// [`MAX_MALFORMED_FRAMES_PER_CONNECTION`] malformed frames.
    pub fn handle_decode_error(
        &self,
        session: &mut Session,
        decode_error: &FrameError,
        encoder: &mut FrameEncoder,
        out: &mut BytesMut,
    ) -> AfterFrame {
        session.malformed_frames += 1;
        let is_over_limit = session.malformed_frames > MAX_MALFORMED_FRAMES_PER_CONNECTION;
        let is_fatal = decode_error.is_connection_fatal() || is_over_limit;
        // One warning per connection is enough to find a broken peer; the rest would only
        // let it flood the log.
        if session.malformed_frames == 1 || is_over_limit {
            warn!(peer = %session.peer, is_fatal, malformed_frames = session.malformed_frames, "refusing a frame: {decode_error}");
        } else {
            debug!(peer = %session.peer, is_fatal, malformed_frames = session.malformed_frames, "refusing a frame: {decode_error}");
        }
        let message = if is_over_limit {
            format!(
                "{decode_error}; closing after {} malformed frames, over {MAX_MALFORMED_FRAMES_PER_CONNECTION}",
                session.malformed_frames
            )
        } else {
            decode_error.to_string()
        };
        let encoded = encoder.encode_error_response_into(out, 0, decode_error.status(), &message);
        if is_fatal || encoded.is_err() {
            AfterFrame::Close
        } else {
            AfterFrame::KeepOpen
        }
    }

    fn answer(&self, session: &mut Session, frame: &wire::Frame<'_>) -> Reply {
        let body_type = frame.body_type();
        if body_type == wire::Body::HandshakeRequest {
            return match frame.body_as_handshake_request() {
                Some(request) => handshake(session, &request, &self.access),
                None => missing_body(body_type),
            };
        }
        if !session.is_handshaken() {
            return Reply::Error(
                wire::Status::HANDSHAKE_REQUIRED,
                format!("{body_type:?} before the handshake; send a HandshakeRequest first"),
            );
        }
        if body_type == wire::Body::AuthRequest {
            return match frame.body_as_auth_request() {
                Some(request) => self.authenticate(session, &request),
                None => missing_body(body_type),
            };
        }
        let kind = body_type.variant_name().unwrap_or("unknown");
        let required = crate::access::native_required(body_type);
        if let Err(refusal) = self.access.check(
            kind,
            session.account.as_deref(),
            session.peer.ip(),
            required,
        ) {
            debug!(peer = %session.peer, "refused: {refusal}");
            return Reply::Error(wire::Status::ACCESS_DENIED, refusal);
        }
        match body_type {
            wire::Body::RegisterBrokerRequest => {
                frame.body_as_register_broker_request().map_or_else(
                    || missing_body(body_type),
                    |request| self.register(session, &request),
                )
            }
            wire::Body::UnregisterBrokerRequest => {
                frame.body_as_unregister_broker_request().map_or_else(
                    || missing_body(body_type),
                    |request| self.unregister(session, &request),
                )
            }
            wire::Body::GetRouteRequest => frame
                .body_as_get_route_request()
                .map_or_else(|| missing_body(body_type), |request| self.route(&request)),
            wire::Body::TopicListRequest => frame.body_as_topic_list_request().map_or_else(
                || missing_body(body_type),
                |request| self.topic_list(&request),
            ),
            wire::Body::ClusterInfoRequest => Reply::Clusters(self.lock_registry().clusters()),
            wire::Body::NONE => Reply::Error(
                wire::Status::INVALID_ARGUMENT,
                "request has no body".to_owned(),
            ),
            other => Reply::Error(
                wire::Status::UNKNOWN_REQUEST,
                format!("{other:?} is not served by {SERVER_NAME}"),
            ),
        }
    }

    /// Answers an `AuthRequest`: once per connection, to the handshake's challenge.
    fn authenticate(&self, session: &mut Session, request: &wire::AuthRequest<'_>) -> Reply {
        if !self.access.is_on() {
            return Reply::Error(
                wire::Status::INVALID_ARGUMENT,
                format!("{SERVER_NAME} does not enforce access control: it sent no auth_nonce, so there is nothing to prove"),
            );
        }
        let Some(nonce) = session.auth_nonce.take() else {
            return Reply::AuthRefused(
                "an AuthRequest answers the handshake's auth_nonce, once per connection".to_owned(),
            );
        };
        match self.access.authenticate(&nonce, session.peer.ip(), request) {
            Ok((access_key, is_admin)) => {
                debug!(peer = %session.peer, access_key, is_admin, "authenticated");
                session.account = Some(access_key.clone());
                Reply::Authenticated {
                    access_key,
                    is_admin,
                }
            }
            Err(refusal) => Reply::AuthRefused(refusal),
        }
    }

    /// The connection of `session` has ended: every broker instance whose latest registration
    /// came on it leaves the routes now, so clients stop being sent to a broker that died
    /// (its kernel closed the connection) without waiting for the broker timeout.
    pub fn connection_closed(&self, session: &Session) {
        if session.registered.is_empty() {
            return;
        }
        let mut registry = self.lock_registry();
        for (broker_name, broker_id) in &session.registered {
            if let Some(broker) =
                registry.connection_closed(broker_name, *broker_id, session.connection_id)
            {
                crate::metrics::namesrv().brokers_expired.inc();
                info!(
                    peer = %session.peer,
                    "broker {}/{} id {} at {} dropped: its connection closed",
                    broker.cluster_name, broker.broker_name, broker.broker_id, broker.broker_address
                );
            }
        }
    }

    fn register(&self, session: &mut Session, request: &wire::RegisterBrokerRequest<'_>) -> Reply {
        let registration = match registration_from_wire(request) {
            Ok(registration) => registration,
            Err(refusal) => return registry_error(&refusal),
        };
        let key = (registration.broker_name.clone(), registration.broker_id);
        let is_known = session.registered.contains(&key);
        if !is_known && session.registered.len() >= MAX_REGISTRATIONS_PER_CONNECTION {
            return Reply::Error(
                wire::Status::INVALID_ARGUMENT,
                format!("this connection registered {MAX_REGISTRATIONS_PER_CONNECTION} broker instances already; register each broker on its own connection"),
            );
        }
        let identity = format!(
            "{}/{} id {} at {}",
            registration.cluster_name,
            registration.broker_name,
            registration.broker_id,
            registration.broker_address
        );
        let topic_count = registration.topics.len();
        let topic_config_version = registration.topic_config_version;
        let result = self.lock_registry().register_on(
            registration,
            Instant::now(),
            Some(session.connection_id),
        );
        match result {
            Ok(outcome) => {
                if !is_known {
                    session.registered.push(key);
                }
                if let Some(replaced) = &outcome.replaced {
                    warn!(peer = %session.peer, "broker {identity} replaces {}/{} id {} at the same address", replaced.cluster_name, replaced.broker_name, replaced.broker_id);
                }
                if outcome.is_new_instance {
                    info!(peer = %session.peer, topic_count, topic_config_version, "broker {identity} registered");
                } else if outcome.is_topic_config_changed {
                    info!(peer = %session.peer, topic_count, topic_config_version, "broker {identity} changed its topics");
                } else {
                    debug!(peer = %session.peer, "broker {identity} heartbeat");
                }
                crate::metrics::namesrv().registrations.inc();
                Reply::Registered(outcome)
            }
            Err(refusal) => {
                warn!(peer = %session.peer, "refusing registration of {identity}: {refusal}");
                registry_error(&refusal)
            }
        }
    }

    fn unregister(&self, session: &Session, request: &wire::UnregisterBrokerRequest<'_>) -> Reply {
        let broker_name = request.broker_name().unwrap_or_default();
        let broker_address = request.broker_address().unwrap_or_default();
        if broker_name.is_empty() {
            return Reply::Error(
                wire::Status::INVALID_ARGUMENT,
                "invalid broker_name: missing or empty".to_owned(),
            );
        }
        let removed =
            self.lock_registry()
                .unregister(broker_name, request.broker_id(), broker_address);
        match removed {
            Some(broker) => info!(
                peer = %session.peer,
                "broker {}/{} id {} at {} unregistered",
                broker.cluster_name, broker.broker_name, broker.broker_id, broker.broker_address
            ),
            None => debug!(
                peer = %session.peer,
                "unregistration of unknown broker {broker_name} id {} at {broker_address}",
                request.broker_id()
            ),
        }
        Reply::Unregistered
    }

    fn route(&self, request: &wire::GetRouteRequest<'_>) -> Reply {
        let topic = request.topic().unwrap_or_default();
        if let Err(refusal) = validate_topic_name(topic) {
            return registry_error(&refusal);
        }
        let route = self.lock_registry().route(topic);
        crate::metrics::namesrv().route_served(route.is_some());
        match route {
            Some(route) => Reply::Route(route),
            None => Reply::Error(
                wire::Status::TOPIC_NOT_FOUND,
                format!("no live broker hosts topic {topic}"),
            ),
        }
    }

    fn topic_list(&self, request: &wire::TopicListRequest<'_>) -> Reply {
        Reply::TopicList(self.lock_registry().topic_names(request.cluster_name()))
    }

    /// The table, even if a panic elsewhere poisoned the lock: every table method leaves it
    /// consistent before it could panic (mutations happen after all checks).
    fn lock_registry(&self) -> MutexGuard<'_, RouteTable> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends the response for `reply`. A response too large for a frame is answered with
    /// `SYSTEM_ERROR` instead; `Err` only when even that cannot be written.
    fn encode_reply(
        &self,
        request_id: u64,
        reply: &Reply,
        encoder: &mut FrameEncoder,
        out: &mut BytesMut,
    ) -> Result<(), FrameError> {
        let encoded = match reply {
            Reply::Handshake {
                status,
                protocol_version,
                message,
                auth_nonce,
            } => encoder.encode_into(out, |builder| {
                let auth_nonce = auth_nonce.map(|nonce| builder.create_vector(&nonce));
                let name = builder.create_string(SERVER_NAME);
                let version = builder.create_string(env!("CARGO_PKG_VERSION"));
                let server = wire::ServerInfo::create(
                    builder,
                    &wire::ServerInfoArgs {
                        name: Some(name),
                        version: Some(version),
                        cluster_name: None,
                        broker_name: None,
                        broker_id: NAMESRV_BROKER_ID,
                    },
                );
                let response = wire::HandshakeResponse::create(
                    builder,
                    &wire::HandshakeResponseArgs {
                        protocol_version: *protocol_version,
                        min_protocol_version: MIN_PROTOCOL_VERSION,
                        max_protocol_version: PROTOCOL_VERSION,
                        server: Some(server),
                        max_frame_bytes: u32::try_from(self.max_frame_bytes).unwrap_or(u32::MAX),
                        // A namesrv takes no messages.
                        max_message_bytes: 0,
                        auth_nonce,
                    },
                );
                let mut header = FrameHeader::response(request_id, *status);
                if let Some(message) = message {
                    header = header.with_message(message);
                }
                build_frame(
                    builder,
                    &header,
                    wire::Body::HandshakeResponse,
                    Some(response.as_union_value()),
                )
            }),
            Reply::Registered(outcome) => encoder.encode_into(out, |builder| {
                let master_address = outcome
                    .master_address
                    .as_deref()
                    .map(|address| builder.create_string(address));
                let ha_server_address = outcome
                    .master_ha_server_address
                    .as_deref()
                    .map(|address| builder.create_string(address));
                let response = wire::RegisterBrokerResponse::create(
                    builder,
                    &wire::RegisterBrokerResponseArgs {
                        master_address,
                        ha_server_address,
                    },
                );
                build_frame(
                    builder,
                    &FrameHeader::response(request_id, wire::Status::OK),
                    wire::Body::RegisterBrokerResponse,
                    Some(response.as_union_value()),
                )
            }),
            Reply::Unregistered => encoder.encode_into(out, |builder| {
                build_frame(
                    builder,
                    &FrameHeader::response(request_id, wire::Status::OK),
                    wire::Body::NONE,
                    None,
                )
            }),
            Reply::Route(route) => encoder.encode_into(out, |builder| {
                let response = build_route_response(builder, route);
                build_frame(
                    builder,
                    &FrameHeader::response(request_id, wire::Status::OK),
                    wire::Body::RouteResponse,
                    Some(response.as_union_value()),
                )
            }),
            Reply::TopicList(topics) => encoder.encode_into(out, |builder| {
                let names: Vec<_> = topics
                    .iter()
                    .map(|topic| builder.create_string(topic))
                    .collect();
                let names = builder.create_vector(&names);
                let response = wire::TopicListResponse::create(
                    builder,
                    &wire::TopicListResponseArgs {
                        topics: Some(names),
                    },
                );
                build_frame(
                    builder,
                    &FrameHeader::response(request_id, wire::Status::OK),
                    wire::Body::TopicListResponse,
                    Some(response.as_union_value()),
                )
            }),
            Reply::Clusters(clusters) => encoder.encode_into(out, |builder| {
                let clusters: Vec<_> = clusters
                    .iter()
                    .map(|cluster| {
                        let brokers = build_broker_datas(builder, &cluster.brokers);
                        let brokers = builder.create_vector(&brokers);
                        let name = builder.create_string(&cluster.cluster_name);
                        wire::ClusterData::create(
                            builder,
                            &wire::ClusterDataArgs {
                                cluster_name: Some(name),
                                brokers: Some(brokers),
                            },
                        )
                    })
                    .collect();
                let clusters = builder.create_vector(&clusters);
                let response = wire::ClusterInfoResponse::create(
                    builder,
                    &wire::ClusterInfoResponseArgs {
                        clusters: Some(clusters),
                    },
                );
                build_frame(
                    builder,
                    &FrameHeader::response(request_id, wire::Status::OK),
                    wire::Body::ClusterInfoResponse,
                    Some(response.as_union_value()),
                )
            }),
            Reply::Authenticated {
                access_key,
                is_admin,
            } => encoder.encode_into(out, |builder| {
                let access_key = builder.create_string(access_key);
                let response = wire::AuthResponse::create(
                    builder,
                    &wire::AuthResponseArgs {
                        access_key: Some(access_key),
                        admin: *is_admin,
                    },
                );
                build_frame(
                    builder,
                    &FrameHeader::response(request_id, wire::Status::OK),
                    wire::Body::AuthResponse,
                    Some(response.as_union_value()),
                )
            }),
            Reply::AuthRefused(message) => encoder.encode_error_response_into(
                out,
                request_id,
                wire::Status::ACCESS_DENIED,
                message,
            ),
            Reply::Error(status, message) => {
                encoder.encode_error_response_into(out, request_id, *status, message)
            }
        };
        match encoded {
            Ok(_) => Ok(()),
            Err(encode_error) => {
                error!("cannot encode the response to request {request_id}: {encode_error}");
                encoder
                    .encode_error_response_into(
                        out,
                        request_id,
                        wire::Status::SYSTEM_ERROR,
                        &format!("response not sent: {encode_error}"),
                    )
                    .map(|_| ())
            }
        }
    }
}

fn handshake(
    session: &mut Session,
    request: &wire::HandshakeRequest<'_>,
    access: &Access,
) -> Reply {
    let client_id = request.client_id().unwrap_or_default();
    let client_version = request.client_version().unwrap_or_default();
    let offered = (request.min_protocol_version(), request.protocol_version());
    match negotiate_protocol_version(request.protocol_version(), request.min_protocol_version()) {
        Some(protocol_version) => {
            session.protocol_version = Some(protocol_version);
            debug!(peer = %session.peer, client_id, client_version, protocol_version, "handshake");
            // A new challenge per handshake; an earlier one can no longer be answered.
            session.auth_nonce = access.challenge();
            Reply::Handshake {
                status: wire::Status::OK,
                protocol_version,
                message: None,
                auth_nonce: session.auth_nonce,
            }
        }
        None => {
            let message = format!(
                "client speaks protocol versions {}..={}, {SERVER_NAME} speaks {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}",
                offered.0, offered.1
            );
            warn!(peer = %session.peer, client_id, client_version, "handshake refused: {message}");
            Reply::Handshake {
                status: wire::Status::UNSUPPORTED_VERSION,
                protocol_version: 0,
                message: Some(message),
                auth_nonce: None,
            }
        }
    }
}

fn missing_body(body_type: wire::Body) -> Reply {
    Reply::Error(
        wire::Status::INVALID_ARGUMENT,
        format!("body type says {body_type:?} but the body is missing"),
    )
}

fn registry_error(refusal: &RegistryError) -> Reply {
    let status = match refusal {
        RegistryError::InvalidArgument { .. } => wire::Status::INVALID_ARGUMENT,
        RegistryError::TooManyBrokers { .. } | RegistryError::TooManyTopicEntries { .. } => {
            wire::Status::SYSTEM_BUSY
        }
        RegistryError::StaleMaster { .. } => wire::Status::SERVICE_NOT_AVAILABLE,
    };
    Reply::Error(status, refusal.to_string())
}

/// The registration a request carries. Field rules are checked by the table; here only what
/// the wire form adds: a topic without a name, or one listed twice.
fn registration_from_wire(
    request: &wire::RegisterBrokerRequest<'_>,
) -> Result<BrokerRegistration, RegistryError> {
    let mut topics = BTreeMap::new();
    for topic in request.topics().iter().flatten() {
        let name = topic.name().unwrap_or_default();
        let queues = TopicQueues {
            read_queues: topic.read_queues(),
            write_queues: topic.write_queues(),
            perm: topic.perm(),
            is_ordered: topic.is_ordered(),
        };
        if topics.insert(name.to_owned(), queues).is_some() {
            return Err(RegistryError::InvalidArgument {
                field: "topics.name",
                reason: format!("topic {name:?} is listed twice"),
            });
        }
    }
    Ok(BrokerRegistration {
        cluster_name: request.cluster_name().unwrap_or_default().to_owned(),
        broker_name: request.broker_name().unwrap_or_default().to_owned(),
        broker_id: request.broker_id(),
        broker_address: request.broker_address().unwrap_or_default().to_owned(),
        ha_server_address: request
            .ha_server_address()
            .filter(|address| !address.is_empty())
            .map(str::to_owned),
        topics,
        topic_config_version: request.topic_config_version(),
        state_version: request.state_version(),
    })
}

fn build_broker_datas<'b>(
    builder: &mut flatbuffers::FlatBufferBuilder<'b>,
    brokers: &[RouteBroker],
) -> Vec<flatbuffers::WIPOffset<wire::BrokerData<'b>>> {
    brokers
        .iter()
        .map(|broker| {
            let addresses: Vec<_> = broker
                .addresses
                .iter()
                .map(|address| {
                    let text = builder.create_string(&address.address);
                    wire::BrokerAddress::create(
                        builder,
                        &wire::BrokerAddressArgs {
                            broker_id: address.broker_id,
                            address: Some(text),
                        },
                    )
                })
                .collect();
            let addresses = builder.create_vector(&addresses);
            let cluster_name = builder.create_string(&broker.cluster_name);
            let broker_name = builder.create_string(&broker.broker_name);
            wire::BrokerData::create(
                builder,
                &wire::BrokerDataArgs {
                    cluster_name: Some(cluster_name),
                    broker_name: Some(broker_name),
                    addresses: Some(addresses),
                },
            )
        })
        .collect()
}

fn build_route_response<'b>(
    builder: &mut flatbuffers::FlatBufferBuilder<'b>,
    route: &TopicRoute,
) -> flatbuffers::WIPOffset<wire::RouteResponse<'b>> {
    let brokers = build_broker_datas(builder, &route.brokers);
    let brokers = builder.create_vector(&brokers);
    let queues: Vec<_> = route
        .queues
        .iter()
        .map(|queues| {
            let broker_name = builder.create_string(&queues.broker_name);
            wire::QueueData::create(
                builder,
                &wire::QueueDataArgs {
                    broker_name: Some(broker_name),
                    read_queues: queues.read_queues,
                    write_queues: queues.write_queues,
                    perm: queues.perm,
                },
            )
        })
        .collect();
    let queues = builder.create_vector(&queues);
    let topic = builder.create_string(&route.topic);
    wire::RouteResponse::create(
        builder,
        &wire::RouteResponseArgs {
            topic: Some(topic),
            brokers: Some(brokers),
            queues: Some(queues),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardmq_schema::FrameDecoder;

    struct Harness {
        handler: RequestHandler,
        session: Session,
        encoder: FrameEncoder,
        decoder: FrameDecoder,
    }

    impl Harness {
        fn new() -> Self {
            let registry = Arc::new(Mutex::new(RouteTable::default()));
            Self {
                handler: RequestHandler::new(registry, 1024 * 1024),
                session: Session::new(SocketAddr::from(([127, 0, 0, 1], 4000))),
                encoder: FrameEncoder::new(),
                decoder: FrameDecoder::new(),
            }
        }

        /// Sends the frame `build` writes; returns what the handler said and its answers.
        fn send(
            &mut self,
            header: FrameHeader<'_>,
            build: impl FnOnce(
                &mut flatbuffers::FlatBufferBuilder<'static>,
            ) -> Option<(
                wire::Body,
                flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>,
            )>,
        ) -> (AfterFrame, Vec<VerifiedFrame>) {
            let bytes = self
                .encoder
                .encode(|builder| {
                    let (body_type, body) = match build(builder) {
                        Some((body_type, body)) => (body_type, Some(body)),
                        None => (wire::Body::NONE, None),
                    };
                    build_frame(builder, &header, body_type, body)
                })
                .unwrap();
            let mut input = BytesMut::from(&bytes[..]);
            let frame = self.decoder.decode(&mut input).unwrap().unwrap();
            let mut out = BytesMut::new();
            let after =
                self.handler
                    .handle_frame(&mut self.session, &frame, &mut self.encoder, &mut out);
            let mut answers = Vec::new();
            while let Some(answer) = self.decoder.decode(&mut out).unwrap() {
                answers.push(answer);
            }
            (after, answers)
        }

        fn handshake(
            &mut self,
            header: FrameHeader<'_>,
            max: u32,
            min: u32,
        ) -> (AfterFrame, Vec<VerifiedFrame>) {
            self.send(header, |builder| {
                let request = wire::HandshakeRequest::create(
                    builder,
                    &wire::HandshakeRequestArgs {
                        protocol_version: max,
                        min_protocol_version: min,
                        ..Default::default()
                    },
                );
                Some((wire::Body::HandshakeRequest, request.as_union_value()))
            })
        }

        fn topic_list(&mut self, header: FrameHeader<'_>) -> (AfterFrame, Vec<VerifiedFrame>) {
            self.send(header, |builder| {
                let request = wire::TopicListRequest::create(builder, &Default::default());
                Some((wire::Body::TopicListRequest, request.as_union_value()))
            })
        }
    }

    fn status(frames: &[VerifiedFrame]) -> Vec<(u64, wire::Status)> {
        frames
            .iter()
            .map(|frame| (frame.frame().request_id(), frame.frame().status()))
            .collect()
    }

    #[test]
    fn requests_wait_for_the_handshake() {
        let mut harness = Harness::new();
        let (after, answers) = harness.topic_list(FrameHeader::request(1));
        assert_eq!(after, AfterFrame::KeepOpen);
        assert_eq!(status(&answers), [(1, wire::Status::HANDSHAKE_REQUIRED)]);

        let (after, answers) = harness.handshake(FrameHeader::request(2), PROTOCOL_VERSION, 0);
        assert_eq!(after, AfterFrame::KeepOpen);
        assert_eq!(status(&answers), [(2, wire::Status::OK)]);
        assert!(harness.session.is_handshaken());
        let response = answers[0].frame().body_as_handshake_response().unwrap();
        assert_eq!(response.max_frame_bytes(), 1024 * 1024);
        assert_eq!(response.server().unwrap().name(), Some(SERVER_NAME));

        let (_, answers) = harness.topic_list(FrameHeader::request(3));
        assert_eq!(status(&answers), [(3, wire::Status::OK)]);
    }

    #[test]
    fn unsupported_version_closes() {
        let mut harness = Harness::new();
        let (after, answers) = harness.handshake(FrameHeader::request(1), 9, 5);
        assert_eq!(after, AfterFrame::Close);
        assert_eq!(status(&answers), [(1, wire::Status::UNSUPPORTED_VERSION)]);
        assert!(!harness.session.is_handshaken());
    }

    #[test]
    fn one_way_requests_get_no_answer_and_responses_are_ignored() {
        let mut harness = Harness::new();
        let (after, answers) = harness.handshake(FrameHeader::one_way(), PROTOCOL_VERSION, 0);
        assert_eq!(after, AfterFrame::KeepOpen);
        assert!(answers.is_empty());
        assert!(
            harness.session.is_handshaken(),
            "a one-way handshake still counts"
        );

        let (after, answers) = harness.topic_list(FrameHeader::response(5, wire::Status::OK));
        assert_eq!(after, AfterFrame::KeepOpen);
        assert!(answers.is_empty());
    }

    #[test]
    fn unknown_and_empty_bodies() {
        let mut harness = Harness::new();
        harness.handshake(FrameHeader::request(1), PROTOCOL_VERSION, 0);
        let (_, answers) = harness.send(FrameHeader::request(2), |builder| {
            let table = wire::TopicListRequest::create(builder, &Default::default());
            Some((wire::Body(250), table.as_union_value()))
        });
        assert_eq!(status(&answers), [(2, wire::Status::UNKNOWN_REQUEST)]);
        let (_, answers) = harness.send(FrameHeader::request(3), |_| None);
        assert_eq!(status(&answers), [(3, wire::Status::INVALID_ARGUMENT)]);
    }

    #[test]
    fn decode_errors_answer_with_id_zero() {
        let mut harness = Harness::new();
        let mut encoder = FrameEncoder::new();
        let mut out = BytesMut::new();
        let fatal = FrameError::TooLarge {
            length_bytes: 10,
            max_frame_bytes: 5,
        };
        let after = harness.handler.handle_decode_error(
            &mut harness.session,
            &fatal,
            &mut encoder,
            &mut out,
        );
        assert_eq!(after, AfterFrame::Close);
        let answer = harness.decoder.decode(&mut out).unwrap().unwrap();
        assert_eq!(status(&[answer]), [(0, wire::Status::FRAME_TOO_LARGE)]);
    }

    #[test]
    fn too_many_malformed_frames_close_the_connection() {
        let mut harness = Harness::new();
        let mut encoder = FrameEncoder::new();
        let malformed = FrameError::from(shardmq_schema::MalformedFrame::MissingFileIdentifier);
        let mut refuse = |harness: &mut Harness| {
            let mut out = BytesMut::new();
            let after = harness.handler.handle_decode_error(
                &mut harness.session,
                &malformed,
                &mut encoder,
                &mut out,
            );
            let answer = harness.decoder.decode(&mut out).unwrap().unwrap();
            assert_eq!(status(&[answer]), [(0, wire::Status::MALFORMED_FRAME)]);
            after
        };
        for _ in 0..MAX_MALFORMED_FRAMES_PER_CONNECTION {
            assert_eq!(refuse(&mut harness), AfterFrame::KeepOpen);
        }
        assert_eq!(refuse(&mut harness), AfterFrame::Close);
    }

    #[test]
    fn with_access_control_the_handshake_challenges_and_requests_wait_for_an_account() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acl.toml");
        std::fs::write(
            &path,
            "[[accounts]]\naccess_key = \"reader-account\"\nsecret_key = \"reader-secret\"\n",
        )
        .unwrap();
        let access = Access::with_store(shardmq_acl::AclStore::open(&path).unwrap());
        let mut harness = Harness::new();
        harness.handler = RequestHandler::new(Arc::new(Mutex::new(RouteTable::default())), 1 << 20)
            .with_access(access);
        let (_, answers) = harness.handshake(FrameHeader::request(1), PROTOCOL_VERSION, 0);
        let nonce = answers[0]
            .frame()
            .body_as_handshake_response()
            .and_then(|r| r.auth_nonce())
            .map(|nonce| nonce.bytes().to_vec())
            .expect("an auth_nonce");
        let (_, answers) = harness.topic_list(FrameHeader::request(2));
        assert_eq!(status(&answers), [(2, wire::Status::ACCESS_DENIED)]);
        let credentials = shardmq_acl::Credentials::new("reader-account", "reader-secret").unwrap();
        let authenticate = |harness: &mut Harness, id: u64| {
            let (client_nonce, proof) = credentials.answer(&nonce).unwrap();
            harness.send(FrameHeader::request(id), |builder| {
                let access_key = builder.create_string("reader-account");
                let client_nonce = builder.create_vector(&client_nonce);
                let proof = builder.create_vector(&proof);
                let body = wire::AuthRequest::create(
                    builder,
                    &wire::AuthRequestArgs {
                        access_key: Some(access_key),
                        client_nonce: Some(client_nonce),
                        proof: Some(proof),
                    },
                );
                Some((wire::Body::AuthRequest, body.as_union_value()))
            })
        };
        let (after, answers) = authenticate(&mut harness, 3);
        assert_eq!(after, AfterFrame::KeepOpen);
        assert_eq!(status(&answers), [(3, wire::Status::OK)]);
        assert_eq!(harness.session.account(), Some("reader-account"));
        let (_, answers) = harness.topic_list(FrameHeader::request(4));
        assert_eq!(status(&answers), [(4, wire::Status::OK)]);
        // The challenge is answered once: a second answer is refused and closes.
        let (after, answers) = authenticate(&mut harness, 5);
        assert_eq!(after, AfterFrame::Close);
        assert_eq!(status(&answers), [(5, wire::Status::ACCESS_DENIED)]);
    }
}
