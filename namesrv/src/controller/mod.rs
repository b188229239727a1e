//! The controller (issue 15, docs/replication.md "Automatic failover"): a Raft group on
//! `openraft`, run inside name server processes on threads of its own, that keeps per broker
//! group (cluster, broker name) the master, an epoch and the in-sync replicas (SyncStateSet),
//! and elects a new master from that set when the master stops heartbeating.
//!
//! - [`state`]: the replicated state and its rules (pure);
//! - [`store`]: the Raft log, vote and snapshots on disk;
//! - [`network`] and [`link`]: Raft RPCs between controllers as frames;
//! - this module: the listener (brokers, the CLI and the other controllers all connect to the
//!   controller address), broker heartbeats (liveness is the leader's, in memory; a follower
//!   forwards a heartbeat to the leader), and the election loop on the leader.
//!
//! Size: about 820 lines; the controller's Raft wiring (state machine, network, the broker
//! requests it serves) in one place, with storage apart in `store.rs` and the group state in
//! `state.rs`.

pub mod link;
pub mod network;
pub mod state;
pub mod store;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Raft};
use shardmq_schema::{
    build_frame, wire, FrameDecoder, FrameEncoder, FrameHeader, VerifiedFrame,
    MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use self::link::Link;
use self::state::{Command, CommandResult, Group, Replica};
use crate::access::Access;
use shardmq_acl::Credentials;

pub type NodeId = u64;

/// How long a new connection to the controller's port may take to show its first bytes and,
/// in TLS, to complete its handshake.
const CONTROLLER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

use std::io::Cursor;

openraft::declare_raft_types!(
    /// The controller's Raft types: commands in, results out.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
);

/// How the controller is run (name server flags `--controller-*`).
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub id: NodeId,
    pub listen: String,
    /// Every voter, this one included: id → controller address.
    pub peers: BTreeMap<NodeId, String>,
    pub data_dir: PathBuf,
    /// A broker silent this long is dead; a dead master is replaced.
    pub broker_timeout: Duration,
    /// Start without proposing a membership: this node waits to be added to a running group
    /// (`shardmq controller add-member`).
    pub join: bool,
    /// TLS on the controller's listener (the name server's settings, docs/tls.md); `None`:
    /// plain only.
    pub tls: Option<crate::tls::ListenerTls>,
    /// Access control on the controller address (the name server's accounts file; off by
    /// default): Raft, heartbeats and membership changes need an admin account, status a known
    /// one.
    pub access: Arc<Access>,
    /// This name server's own account, for its links to the other controllers when they
    /// enforce access control (`--access-key`/`--secret-key`).
    pub credentials: Option<Credentials>,
}

impl ControllerConfig {
    /// Parses `1=host:port,2=host:port,…`.
    pub fn parse_peers(text: &str) -> Result<BTreeMap<NodeId, String>, String> {
        let mut peers = BTreeMap::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (id, address) = part
                .split_once('=')
                .ok_or_else(|| format!("controller peer `{part}` is not id=host:port"))?;
            let id: NodeId = id
                .trim()
                .parse()
                .map_err(|e| format!("controller peer id `{id}`: {e}"))?;
            address
                .trim()
                .parse::<SocketAddr>()
                .map_err(|e| format!("controller peer address `{address}`: {e}"))?;
            if peers.insert(id, address.trim().to_owned()).is_some() {
                return Err(format!("controller peer id {id} appears twice"));
            }
        }
        if peers.is_empty() {
            return Err("--controller-peers names no controller".into());
        }
        Ok(peers)
    }

    pub fn validate(&self) -> Result<(), String> {
        match self.peers.get(&self.id) {
            None => Err(format!(
                "--controller-id {} is not among --controller-peers",
                self.id
            )),
            Some(address) if address != &self.listen => Err(format!(
                "--controller-peers gives {} for id {} but --controller-listen is {}",
                address, self.id, self.listen
            )),
            Some(_) => Ok(()),
        }
    }
}

/// A running controller.
pub struct Controller {
    config: ControllerConfig,
    raft: Raft<TypeConfig>,
    machine: store::StateMachine,
    /// (group key, broker id) → last heartbeat and the progress it carried, on this node
    /// (meaningful on the leader).
    alive: Mutex<HashMap<(String, i64), (Instant, Progress)>>,
    /// Since when this node has been leader (`None`: it is not).
    leader_since: Mutex<Option<Instant>>,
    /// A follower's link to the leader, for forwarded heartbeats.
    to_leader: tokio::sync::Mutex<Option<(String, Link)>>,
    /// Groups whose master is dead with no in-sync replica alive (logged once).
    stuck: Mutex<BTreeSet<String>>,
}

/// One connection to the controller address: who it is and what it proved.
struct ControllerSession {
    peer: SocketAddr,
    /// The challenge of the last handshake answer, until an `AuthRequest` answers it.
    auth_nonce: Option<shardmq_acl::Nonce>,
    /// The account the connection proved it holds; `None`: anonymous.
    account: Option<String>,
    /// Set after a refused `AuthRequest`: the answer is written, then the connection closes.
    is_closing: bool,
}

/// What a broker's heartbeat says of its log, which an election ranks members by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The newest master term the broker's log holds.
    pub last_epoch: u64,
    /// Where its log ends (summed over its storage shards).
    pub log_end: u64,
    /// The operator's preference among equals: lower is preferred.
    pub priority: u32,
}

impl Default for Progress {
    /// A broker never heard from: no term, an empty log, no preference.
    fn default() -> Progress {
        Progress {
            last_epoch: 0,
            log_end: 0,
            priority: u32::MAX,
        }
    }
}

/// The member to elect among `set` (the SyncStateSet, every member of which holds everything
/// acknowledged) but `excluded` (the master being replaced): alive, and first by progress, as
/// RocketMQ 5's election policy ranks them: the newest term, then the longest log (the fewest
/// bytes written but not yet acknowledged are cut from the others when they follow it), then
/// the lowest priority value, then the lowest id. A member never heard from ranks last.
pub fn pick_candidate(
    set: &BTreeSet<i64>,
    excluded: i64,
    alive: &BTreeSet<i64>,
    progress: &HashMap<i64, Progress>,
) -> Option<i64> {
    set.iter()
        .copied()
        .filter(|id| *id != excluded && alive.contains(id))
        .max_by_key(|id| {
            let p = progress.get(id).copied().unwrap_or_default();
            (
                p.last_epoch,
                p.log_end,
                std::cmp::Reverse(p.priority),
                std::cmp::Reverse(*id),
            )
        })
}

/// A broker's heartbeat, decoded.
#[derive(Debug, Clone)]
struct Heartbeat {
    cluster_name: String,
    broker_name: String,
    broker_id: i64,
    address: String,
    ha_address: String,
    epoch: u64,
    in_sync: BTreeSet<i64>,
    is_master: bool,
    /// A master's SyncStateSet (without itself) as it was last told it (see `AlterSyncStateSet`).
    judged_against: Option<BTreeSet<i64>>,
    /// The set epoch of `judged_against` (0: not sent).
    judged_against_set_epoch: u64,
    progress: Progress,
}

impl Heartbeat {
    fn from_wire(r: &wire::ControllerHeartbeatRequest<'_>) -> Heartbeat {
        let text = |s: Option<&str>| s.unwrap_or_default().to_owned();
        Heartbeat {
            cluster_name: text(r.cluster_name()),
            broker_name: text(r.broker_name()),
            broker_id: r.broker_id(),
            address: text(r.address()),
            ha_address: text(r.ha_address()),
            epoch: r.epoch(),
            in_sync: r.in_sync().iter().flat_map(|v| v.iter()).collect(),
            is_master: r.is_master(),
            judged_against: r.judged_against().map(|v| v.iter().collect()),
            judged_against_set_epoch: r.judged_against_set_epoch(),
            progress: Progress {
                last_epoch: r.last_epoch(),
                log_end: r.log_end(),
                priority: r.election_priority(),
            },
        }
    }

    fn key(&self) -> String {
        state::group_key(&self.cluster_name, &self.broker_name)
    }

    /// The first heartbeat of a broker that is starting: it asks what it is, acting as
    /// neither master nor slave of any epoch yet.
    fn is_starting(&self) -> bool {
        !self.is_master && self.epoch == 0
    }
}

impl Controller {
    /// Opens the storage, starts Raft and (when this node's log is empty) proposes the
    /// membership from `peers` (every controller does the same; openraft keeps one).
    pub async fn start(config: ControllerConfig) -> io::Result<Arc<Controller>> {
        config.validate().map_err(io::Error::other)?;
        let log = store::LogStore::open(&config.data_dir)?;
        let machine = store::StateMachine::open(&config.data_dir)?;
        let raft_config = openraft::Config {
            cluster_name: "shardmq-controller".into(),
            heartbeat_interval: 150,
            election_timeout_min: 600,
            election_timeout_max: 1200,
            ..openraft::Config::default()
        }
        .validate()
        .map_err(io::Error::other)?;
        let raft = Raft::new(
            config.id,
            Arc::new(raft_config),
            network::NetworkFactory::new(config.credentials.clone()),
            log,
            machine.clone(),
        )
        .await
        .map_err(io::Error::other)?;
        let members: BTreeMap<NodeId, BasicNode> = config
            .peers
            .iter()
            .map(|(id, address)| (*id, BasicNode::new(address)))
            .collect();
        if config.join {
            info!(
                id = config.id,
                listen = %config.listen,
                "controller started to join a running group: waiting to be added (shardmq controller add-member)"
            );
        } else {
            match raft.initialize(members).await {
                Ok(()) => info!(id = config.id, "controller cluster initialized"),
                Err(e) => debug!(error = %e, "controller cluster already initialized"),
            }
        }
        Ok(Arc::new(Controller {
            config,
            raft,
            machine,
            alive: Mutex::new(HashMap::new()),
            leader_since: Mutex::new(None),
            to_leader: tokio::sync::Mutex::new(None),
            stuck: Mutex::new(BTreeSet::new()),
        }))
    }

    fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    fn is_leader(&self) -> bool {
        self.leader() == Some(self.config.id)
    }

    /// Serves the controller address until `shutdown`, and runs the election loop.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let elections = tokio::spawn(self.clone().election_loop());
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let controller = self.clone();
                        tokio::spawn(async move {
                            let _ = stream.set_nodelay(true);
                            match controller.config.tls.clone() {
                                None => controller.serve_connection(stream, peer).await,
                                Some(tls) => {
                                    let refused = crate::tls::serve(stream, peer, &tls, CONTROLLER_HANDSHAKE_TIMEOUT, |stream| async {
                                        controller.serve_connection(stream, peer).await;
                                        crate::server::Closed::ByPeer
                                    })
                                    .await;
                                    debug!(%peer, "controller connection closed: {refused}");
                                }
                            }
                        });
                    }
                    Err(e) => {
                        warn!(error = %e, "controller accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        elections.abort();
        let _ = self.raft.shutdown().await;
    }

    async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
        self: Arc<Self>,
        mut stream: S,
        peer: SocketAddr,
    ) {
        let mut session = ControllerSession {
            peer,
            auth_nonce: None,
            account: None,
            is_closing: false,
        };
        let decoder = FrameDecoder::with_max_frame_bytes(link::MAX_LINK_FRAME_BYTES);
        let mut encoder = FrameEncoder::with_max_frame_bytes(link::MAX_LINK_FRAME_BYTES);
        let mut buffer = BytesMut::with_capacity(64 << 10);
        loop {
            let frame = match decoder.decode(&mut buffer) {
                Ok(Some(frame)) => frame,
                Ok(None) => match stream.read_buf(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                },
                Err(e) => {
                    debug!(error = %e, "bad frame on the controller port; closing");
                    return;
                }
            };
            let answer = self.handle(&frame, &mut encoder, &mut session).await;
            match answer {
                Ok(bytes) => {
                    if crate::server::write_flushed(&mut stream, &bytes)
                        .await
                        .is_err()
                        || session.is_closing
                    {
                        return;
                    }
                }
                Err(e) => {
                    debug!(error = %e, "cannot answer on the controller port; closing");
                    return;
                }
            }
        }
    }

    async fn handle(
        &self,
        frame: &VerifiedFrame,
        encoder: &mut FrameEncoder,
        session: &mut ControllerSession,
    ) -> Result<bytes::Bytes, shardmq_schema::FrameError> {
        let request = frame.frame();
        let id = request.request_id();
        let refuse = |encoder: &mut FrameEncoder, status: wire::Status, message: String| {
            encoder.encode(|b| {
                let header = FrameHeader::response(id, status).with_message(&message);
                build_frame(b, &header, wire::Body::NONE, None)
            })
        };
        if request.body_as_handshake_request().is_some() {
            session.auth_nonce = self.config.access.challenge();
            let auth_nonce = session.auth_nonce;
            return encoder.encode(|b| {
                let auth_nonce = auth_nonce.map(|nonce| b.create_vector(&nonce));
                let name = b.create_string("shardmq-controller");
                let version = b.create_string(env!("CARGO_PKG_VERSION"));
                let server = wire::ServerInfo::create(
                    b,
                    &wire::ServerInfoArgs {
                        name: Some(name),
                        version: Some(version),
                        cluster_name: None,
                        broker_name: None,
                        broker_id: -1,
                    },
                );
                let body = wire::HandshakeResponse::create(
                    b,
                    &wire::HandshakeResponseArgs {
                        protocol_version: PROTOCOL_VERSION,
                        min_protocol_version: MIN_PROTOCOL_VERSION,
                        max_protocol_version: PROTOCOL_VERSION,
                        server: Some(server),
                        max_frame_bytes: link::MAX_LINK_FRAME_BYTES as u32,
                        max_message_bytes: 0,
                        auth_nonce,
                    },
                );
                build_frame(
                    b,
                    &FrameHeader::response(id, wire::Status::OK),
                    wire::Body::HandshakeResponse,
                    Some(body.as_union_value()),
                )
            });
        }
        if let Some(r) = request.body_as_auth_request() {
            return self.authenticate(id, &r, encoder, session);
        }
        let kind = request.body_type().variant_name().unwrap_or("unknown");
        let required = crate::access::native_required(request.body_type());
        if let Err(refusal) = self.config.access.check(
            kind,
            session.account.as_deref(),
            session.peer.ip(),
            required,
        ) {
            debug!(peer = %session.peer, "controller refused: {refusal}");
            return refuse(encoder, wire::Status::ACCESS_DENIED, refusal);
        }
        if let Some(r) = request.body_as_controller_raft_request() {
            let payload = r.payload().map(|p| p.bytes()).unwrap_or_default();
            let answer = match r.rpc().unwrap_or_default() {
                "append" => match serde_json::from_slice(payload) {
                    Ok(rpc) => serde_json::to_vec(&self.raft.append_entries(rpc).await),
                    Err(e) => {
                        return refuse(encoder, wire::Status::INVALID_ARGUMENT, e.to_string())
                    }
                },
                "vote" => match serde_json::from_slice(payload) {
                    Ok(rpc) => serde_json::to_vec(&self.raft.vote(rpc).await),
                    Err(e) => {
                        return refuse(encoder, wire::Status::INVALID_ARGUMENT, e.to_string())
                    }
                },
                "snapshot" => match serde_json::from_slice(payload) {
                    Ok(rpc) => serde_json::to_vec(&self.raft.install_snapshot(rpc).await),
                    Err(e) => {
                        return refuse(encoder, wire::Status::INVALID_ARGUMENT, e.to_string())
                    }
                },
                other => {
                    return refuse(
                        encoder,
                        wire::Status::INVALID_ARGUMENT,
                        format!("unknown controller rpc {other:?}"),
                    )
                }
            };
            let Ok(answer) = answer else {
                return refuse(encoder, wire::Status::SYSTEM_ERROR, "cannot encode".into());
            };
            return encoder.encode(|b| {
                let payload = b.create_vector(&answer);
                let body = wire::ControllerRaftResponse::create(
                    b,
                    &wire::ControllerRaftResponseArgs {
                        payload: Some(payload),
                    },
                );
                build_frame(
                    b,
                    &FrameHeader::response(id, wire::Status::OK),
                    wire::Body::ControllerRaftResponse,
                    Some(body.as_union_value()),
                )
            });
        }
        if let Some(r) = request.body_as_controller_heartbeat_request() {
            let heartbeat = Heartbeat::from_wire(&r);
            if heartbeat.cluster_name.is_empty()
                || heartbeat.broker_name.is_empty()
                || heartbeat.broker_id <= 0
            {
                return refuse(
                    encoder,
                    wire::Status::INVALID_ARGUMENT,
                    "a heartbeat names its cluster, broker name and a broker id above 0".into(),
                );
            }
            return match self.heartbeat(heartbeat).await {
                Ok((group, alive)) => encoder.encode(|b| {
                    let group = encode_group(b, &group, &alive);
                    let body = wire::ControllerHeartbeatResponse::create(
                        b,
                        &wire::ControllerHeartbeatResponseArgs { group: Some(group) },
                    );
                    build_frame(
                        b,
                        &FrameHeader::response(id, wire::Status::OK),
                        wire::Body::ControllerHeartbeatResponse,
                        Some(body.as_union_value()),
                    )
                }),
                Err(why) => refuse(encoder, wire::Status::SERVICE_NOT_AVAILABLE, why),
            };
        }
        if request.body_as_controller_status_request().is_some() {
            let metrics = self.raft.metrics().borrow().clone();
            let groups = self.machine.groups();
            let (alive_from, alive) = self.leader_alive().await.unwrap_or_default();
            let members = member_list(&metrics);
            return encoder.encode(|b| {
                let groups: Vec<_> = groups
                    .groups
                    .values()
                    .map(|g| {
                        let alive = alive
                            .get(&state::group_key(&g.cluster_name, &g.broker_name))
                            .cloned()
                            .unwrap_or_default();
                        encode_group(b, g, &alive)
                    })
                    .collect();
                let groups = b.create_vector(&groups);
                let members: Vec<_> = members.iter().map(|m| b.create_string(m)).collect();
                let members = b.create_vector(&members);
                let body = wire::ControllerStatusResponse::create(
                    b,
                    &wire::ControllerStatusResponseArgs {
                        node_id: metrics.id,
                        leader_id: metrics.current_leader.unwrap_or(0),
                        members: Some(members),
                        term: metrics.current_term,
                        last_applied: metrics.last_applied.map_or(0, |l| l.index),
                        groups: Some(groups),
                        alive_from,
                    },
                );
                build_frame(
                    b,
                    &FrameHeader::response(id, wire::Status::OK),
                    wire::Body::ControllerStatusResponse,
                    Some(body.as_union_value()),
                )
            });
        }
        if let Some(r) = request.body_as_controller_membership_request() {
            let change = MemberChange {
                node_id: r.node_id(),
                address: r.address().unwrap_or_default().to_owned(),
                remove: r.remove(),
            };
            return match self.change_members(change).await {
                Ok(members) => encoder.encode(|b| {
                    let members: Vec<_> = members.iter().map(|m| b.create_string(m)).collect();
                    let members = b.create_vector(&members);
                    let body = wire::ControllerMembershipResponse::create(
                        b,
                        &wire::ControllerMembershipResponseArgs {
                            members: Some(members),
                        },
                    );
                    build_frame(
                        b,
                        &FrameHeader::response(id, wire::Status::OK),
                        wire::Body::ControllerMembershipResponse,
                        Some(body.as_union_value()),
                    )
                }),
                Err((status, why)) => refuse(encoder, status, why),
            };
        }
        refuse(
            encoder,
            wire::Status::INVALID_ARGUMENT,
            "a controller serves handshakes, heartbeats, status, membership changes and Raft requests only".into(),
        )
    }

    /// Answers an `AuthRequest` to the handshake's challenge: an `AuthResponse`, or
    /// `ACCESS_DENIED` and the connection closes.
    fn authenticate(
        &self,
        id: u64,
        request: &wire::AuthRequest<'_>,
        encoder: &mut FrameEncoder,
        session: &mut ControllerSession,
    ) -> Result<bytes::Bytes, shardmq_schema::FrameError> {
        let refuse = |encoder: &mut FrameEncoder, status: wire::Status, message: &str| {
            encoder.encode(|b| {
                let header = FrameHeader::response(id, status).with_message(message);
                build_frame(b, &header, wire::Body::NONE, None)
            })
        };
        if !self.config.access.is_on() {
            return refuse(
                encoder,
                wire::Status::INVALID_ARGUMENT,
                "this controller does not enforce access control: it sent no auth_nonce, so there is nothing to prove",
            );
        }
        let Some(nonce) = session.auth_nonce.take() else {
            session.is_closing = true;
            return refuse(
                encoder,
                wire::Status::ACCESS_DENIED,
                "an AuthRequest answers the handshake's auth_nonce, once per connection",
            );
        };
        match self
            .config
            .access
            .authenticate(&nonce, session.peer.ip(), request)
        {
            Ok((access_key, is_admin)) => {
                session.account = Some(access_key.clone());
                encoder.encode(|b| {
                    let access_key = b.create_string(&access_key);
                    let body = wire::AuthResponse::create(
                        b,
                        &wire::AuthResponseArgs {
                            access_key: Some(access_key),
                            admin: is_admin,
                        },
                    );
                    build_frame(
                        b,
                        &FrameHeader::response(id, wire::Status::OK),
                        wire::Body::AuthResponse,
                        Some(body.as_union_value()),
                    )
                })
            }
            Err(refusal) => {
                session.is_closing = true;
                refuse(encoder, wire::Status::ACCESS_DENIED, &refusal)
            }
        }
    }

    /// Adds a voter (as a learner first, waiting until it has caught up) or removes one, on
    /// the leader; a follower asks the leader. While no leader answers, or leadership moves
    /// during the change, it tries again for up to 10 s (each step may be repeated). Returns
    /// the members after the change.
    async fn change_members(
        &self,
        change: MemberChange,
    ) -> Result<Vec<String>, (wire::Status, String)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.change_members_once(&change).await {
                Err((wire::Status::SERVICE_NOT_AVAILABLE, why)) if Instant::now() < deadline => {
                    debug!(%why, "membership change: trying again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => return other,
            }
        }
    }

    async fn change_members_once(
        &self,
        change: &MemberChange,
    ) -> Result<Vec<String>, (wire::Status, String)> {
        let invalid = |why: String| (wire::Status::INVALID_ARGUMENT, why);
        let unavailable = |why: String| (wire::Status::SERVICE_NOT_AVAILABLE, why);
        if change.node_id == 0 {
            return Err(invalid("a controller node id is above 0".into()));
        }
        if !change.remove && change.address.parse::<SocketAddr>().is_err() {
            return Err(invalid(format!(
                "the new member's address {:?} is not host:port",
                change.address
            )));
        }
        if !self.is_leader() {
            let c = change.clone();
            let answer = self
                .ask_leader_any(Box::new(move |b, header| {
                    let address = b.create_string(&c.address);
                    let body = wire::ControllerMembershipRequest::create(
                        b,
                        &wire::ControllerMembershipRequestArgs {
                            node_id: c.node_id,
                            address: Some(address),
                            remove: c.remove,
                        },
                    );
                    build_frame(
                        b,
                        &header,
                        wire::Body::ControllerMembershipRequest,
                        Some(body.as_union_value()),
                    )
                }))
                .await
                .map_err(unavailable)?;
            let status = answer.frame().status();
            if status != wire::Status::OK {
                let why = answer.frame().message().unwrap_or("refused").to_owned();
                return Err((status, format!("the leader: {why}")));
            }
            return Ok(answer
                .frame()
                .body_as_controller_membership_response()
                .and_then(|r| r.members())
                .iter()
                .flat_map(|v| v.iter())
                .map(str::to_owned)
                .collect());
        }
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let known = membership
            .nodes()
            .find(|(id, _)| **id == change.node_id)
            .map(|(_, node)| node.addr.clone());
        let changed = if change.remove {
            if !voters.contains(&change.node_id) {
                return Err(invalid(format!(
                    "controller node {} is not a voter (voters {voters:?})",
                    change.node_id
                )));
            }
            if voters.len() == 1 {
                return Err(invalid(
                    "cannot remove the last voter of the controller group".into(),
                ));
            }
            self.raft
                .change_membership(
                    openraft::ChangeMembers::RemoveVoters(BTreeSet::from([change.node_id])),
                    false,
                )
                .await
        } else {
            if let Some(address) = known.filter(|a| a != &change.address) {
                return Err(invalid(format!(
                    "controller node {} is already a member at {address}; remove it first",
                    change.node_id
                )));
            }
            if voters.contains(&change.node_id) {
                return Ok(member_list(&self.raft.metrics().borrow()));
            }
            // The new node catches up as a learner before it counts in any majority.
            let added = tokio::time::timeout(
                Duration::from_secs(10),
                self.raft.add_learner(
                    change.node_id,
                    BasicNode::new(&change.address),
                    true,
                ),
            )
            .await
            .map_err(|_| {
                unavailable(format!(
                    "controller node {} at {} did not catch up within 10 s (is it running with --controller-join?); it stays a learner until removed",
                    change.node_id, change.address
                ))
            })?;
            if let Err(e) = added {
                return Err(unavailable(format!("cannot add the learner: {e}")));
            }
            self.raft
                .change_membership(
                    openraft::ChangeMembers::AddVoterIds(BTreeSet::from([change.node_id])),
                    false,
                )
                .await
        };
        match changed {
            Ok(_) => {
                info!(
                    node = change.node_id,
                    remove = change.remove,
                    "controller membership changed"
                );
                Ok(member_list(&self.raft.metrics().borrow()))
            }
            Err(e) => Err(unavailable(format!("the membership change failed: {e}"))),
        }
    }

    /// Alive broker ids per group key (the leader's view).
    fn alive_ids(&self) -> HashMap<String, BTreeSet<i64>> {
        let mut out: HashMap<String, BTreeSet<i64>> = HashMap::new();
        for ((key, id), (seen, _)) in self.alive.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if seen.elapsed() < self.config.broker_timeout {
                out.entry(key.clone()).or_default().insert(*id);
            }
        }
        out
    }

    /// The progress each broker of group `key` last reported to this node.
    fn progress_of(&self, key: &str) -> HashMap<i64, Progress> {
        self.alive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|((group, _), _)| group == key)
            .map(|((_, id), (_, progress))| (*id, *progress))
            .collect()
    }

    /// Proposes `command`; the applied result, or why it could not be (not the leader, no
    /// quorum).
    async fn write(&self, command: Command) -> Result<CommandResult, String> {
        match self.raft.client_write(command).await {
            Ok(response) => Ok(response.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(format!("not the leader (leader: {:?})", f.leader_id))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// A broker's heartbeat: on the leader, liveness and the commands it calls for; on a
    /// follower, forwarded to the leader.
    async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<(Group, BTreeSet<i64>), String> {
        if !self.is_leader() {
            return self.forward(heartbeat).await;
        }
        self.confirm_leadership().await?;
        let key = heartbeat.key();
        self.alive.lock().unwrap_or_else(|e| e.into_inner()).insert(
            (key.clone(), heartbeat.broker_id),
            (Instant::now(), heartbeat.progress),
        );
        let replica = Replica {
            address: heartbeat.address.clone(),
            ha_address: heartbeat.ha_address.clone(),
        };
        let groups = self.machine.groups();
        let mut group = groups
            .get(&heartbeat.cluster_name, &heartbeat.broker_name)
            .cloned();
        if group
            .as_ref()
            .and_then(|g| g.replicas.get(&heartbeat.broker_id))
            != Some(&replica)
        {
            group = self
                .write(Command::Register {
                    cluster_name: heartbeat.cluster_name.clone(),
                    broker_name: heartbeat.broker_name.clone(),
                    broker_id: heartbeat.broker_id,
                    replica,
                })
                .await?
                .group;
        }
        let mut group = group.ok_or("the group was not registered")?;
        if heartbeat.is_starting() && group.master == heartbeat.broker_id {
            group = self.replace_restarted_master(&heartbeat, group).await?;
        } else if heartbeat.is_starting()
            && group.master != 0
            && group.sync_state_set.contains(&heartbeat.broker_id)
        {
            // A slave of the set starting again may hold less than it acknowledged (a power
            // loss): it must not stay electable until its master finds it caught up.
            let result = self
                .write(Command::LeaveSyncStateSet {
                    cluster_name: heartbeat.cluster_name.clone(),
                    broker_name: heartbeat.broker_name.clone(),
                    broker_id: heartbeat.broker_id,
                    epoch: group.epoch,
                })
                .await?;
            if result.applied {
                info!(group = %key, broker = heartbeat.broker_id, set = ?result.group.as_ref().map(|g| &g.sync_state_set), "a slave of the SyncStateSet restarted: it leaves the set until it has caught up");
            }
            group = result.group.unwrap_or(group);
        }
        if group.master == 0 {
            let result = self
                .write(Command::Elect {
                    cluster_name: heartbeat.cluster_name.clone(),
                    broker_name: heartbeat.broker_name.clone(),
                    broker_id: heartbeat.broker_id,
                    expected_epoch: group.epoch,
                })
                .await?;
            if result.applied {
                info!(group = %key, master = heartbeat.broker_id, "first master of the group");
            }
            group = result.group.unwrap_or(group);
        }
        if heartbeat.is_master
            && group.master == heartbeat.broker_id
            && group.epoch == heartbeat.epoch
        {
            let mut set = heartbeat.in_sync.clone();
            set.insert(heartbeat.broker_id);
            if set != group.sync_state_set {
                let result = self
                    .write(Command::AlterSyncStateSet {
                        cluster_name: heartbeat.cluster_name.clone(),
                        broker_name: heartbeat.broker_name.clone(),
                        master: heartbeat.broker_id,
                        epoch: heartbeat.epoch,
                        sync_state_set: set,
                        expected: heartbeat.judged_against.clone(),
                        expected_set_epoch: (heartbeat.judged_against_set_epoch > 0)
                            .then_some(heartbeat.judged_against_set_epoch),
                    })
                    .await?;
                if result.applied {
                    info!(group = %key, set = ?result.group.as_ref().map(|g| &g.sync_state_set), "SyncStateSet changed");
                }
                group = result.group.unwrap_or(group);
            }
        }
        let alive = self.alive_ids().remove(&key).unwrap_or_default();
        Ok((group, alive))
    }

    /// The master of the group is starting again (a crash, a power loss, a restart): what it
    /// holds may end before what its SyncStateSet acknowledged (under async flush a power loss
    /// takes its unsynced tail), and a master that began a term there would make its slaves
    /// cut acknowledged messages. So while another member of the set is alive, that member is
    /// elected (it holds everything acknowledged) and the restarted broker returns as its
    /// slave, taking back what it lost. Alone, it stays master with what it has, and says so,
    /// in a new epoch when its log already holds a term of the current one (a term's identity
    /// is its epoch, which only the controller hands out).
    async fn replace_restarted_master(
        &self,
        heartbeat: &Heartbeat,
        group: Group,
    ) -> Result<Group, String> {
        let key = heartbeat.key();
        let alive = self.alive_ids().remove(&key).unwrap_or_default();
        let candidate = pick_candidate(
            &group.sync_state_set,
            heartbeat.broker_id,
            &alive,
            &self.progress_of(&key),
        );
        let Some(candidate) = candidate else {
            if heartbeat.progress.last_epoch < group.epoch {
                // Elected in this epoch and starting its first term in it (a slave that became
                // master starts again as one): the epoch is new already.
                return Ok(group);
            }
            if group.sync_state_set.len() > 1 {
                warn!(group = %key, master = heartbeat.broker_id, set = ?group.sync_state_set, "the master restarted and no other in-sync replica is alive: it stays master with what it holds (a tail it lost in a power loss is lost)");
            }
            // It stays master, but in a new epoch: every master start begins its term under an
            // epoch the controller gave it through Raft, so no two terms (this one and one a
            // later election makes) share an epoch, whatever their start.
            let result = self
                .write(Command::Elect {
                    cluster_name: heartbeat.cluster_name.clone(),
                    broker_name: heartbeat.broker_name.clone(),
                    broker_id: heartbeat.broker_id,
                    expected_epoch: group.epoch,
                })
                .await?;
            if result.applied {
                info!(group = %key, master = heartbeat.broker_id, epoch = group.epoch + 1, "the master restarted alone: it stays master in a new epoch");
            }
            return Ok(result.group.unwrap_or(group));
        };
        let result = self
            .write(Command::Elect {
                cluster_name: heartbeat.cluster_name.clone(),
                broker_name: heartbeat.broker_name.clone(),
                broker_id: candidate,
                expected_epoch: group.epoch,
            })
            .await?;
        if result.applied {
            info!(group = %key, old_master = heartbeat.broker_id, new_master = candidate, epoch = group.epoch + 1, "the master restarted: elected an in-sync replica in its place");
        }
        Ok(result.group.unwrap_or(group))
    }

    /// A linearizable read: confirms with a majority that this node still leads and waits until
    /// it has applied everything committed before answering from its own state. A leader cut
    /// off from its majority (paused, partitioned) still believes it leads until it hears
    /// otherwise; without this it would answer heartbeats with a group the majority has since
    /// changed.
    async fn confirm_leadership(&self) -> Result<(), String> {
        match tokio::time::timeout(Duration::from_secs(2), self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!(
                "this controller cannot confirm it leads a majority: {e}"
            )),
            Err(_) => Err("this controller cannot confirm it leads a majority: no majority answered within 2 s".into()),
        }
    }

    /// Sends a request built by `build` to the leader over this follower's link to it (kept
    /// between calls) and returns the answer, which must be OK.
    async fn ask_leader(&self, build: link::Build<'_>) -> Result<VerifiedFrame, String> {
        let answer = self.ask_leader_any(build).await?;
        if answer.frame().status() != wire::Status::OK {
            return Err(answer.frame().message().unwrap_or("refused").to_owned());
        }
        Ok(answer)
    }

    /// [`Controller::ask_leader`] that returns the leader's answer whatever its status.
    async fn ask_leader_any(&self, build: link::Build<'_>) -> Result<VerifiedFrame, String> {
        let leader = self.leader().ok_or("no controller leader is elected")?;
        let address = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .nodes()
            .find(|(id, _)| **id == leader)
            .map(|(_, node)| node.addr.clone())
            .ok_or("the leader is not a member")?;
        let mut slot = self.to_leader.lock().await;
        if slot.as_ref().is_none_or(|(a, _)| a != &address) {
            let link = Link::connect(
                &address,
                Duration::from_secs(2),
                self.config.credentials.as_ref(),
            )
            .await
            .map_err(|e| format!("cannot reach the leader at {address}: {e}"))?;
            *slot = Some((address.clone(), link));
        }
        let (_, link) = slot.as_mut().expect("connected above");
        let answer = match tokio::time::timeout(Duration::from_secs(3), link.request(build)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                *slot = None;
                return Err(format!("the leader at {address}: {e}"));
            }
            Err(_) => {
                *slot = None;
                return Err(format!("the leader at {address} did not answer"));
            }
        };
        Ok(answer)
    }

    /// A follower passes a heartbeat to the leader and relays its answer.
    async fn forward(&self, heartbeat: Heartbeat) -> Result<(Group, BTreeSet<i64>), String> {
        let hb = heartbeat.clone();
        let answer = self
            .ask_leader(Box::new(move |b, header| {
                let (cluster, broker) = (
                    b.create_string(&hb.cluster_name),
                    b.create_string(&hb.broker_name),
                );
                let (address, ha) = (
                    b.create_string(&hb.address),
                    b.create_string(&hb.ha_address),
                );
                let in_sync: Vec<i64> = hb.in_sync.iter().copied().collect();
                let in_sync = b.create_vector(&in_sync);
                let judged_against = hb.judged_against.as_ref().map(|set| {
                    let set: Vec<i64> = set.iter().copied().collect();
                    b.create_vector(&set)
                });
                let body = wire::ControllerHeartbeatRequest::create(
                    b,
                    &wire::ControllerHeartbeatRequestArgs {
                        cluster_name: Some(cluster),
                        broker_name: Some(broker),
                        broker_id: hb.broker_id,
                        address: Some(address),
                        ha_address: Some(ha),
                        epoch: hb.epoch,
                        in_sync: Some(in_sync),
                        is_master: hb.is_master,
                        judged_against,
                        last_epoch: hb.progress.last_epoch,
                        log_end: hb.progress.log_end,
                        election_priority: hb.progress.priority,
                        judged_against_set_epoch: hb.judged_against_set_epoch,
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::ControllerHeartbeatRequest,
                    Some(body.as_union_value()),
                )
            }))
            .await?;
        let group = answer
            .frame()
            .body_as_controller_heartbeat_response()
            .and_then(|r| r.group())
            .ok_or("a heartbeat answer without its group")?;
        Ok(decode_group(&group))
    }

    /// The alive broker ids per group as the leader sees them, and the leader's id: this
    /// node's own view when it leads, else asked of the leader (`None`: no leader answered).
    async fn leader_alive(&self) -> Option<(u64, HashMap<String, BTreeSet<i64>>)> {
        if self.is_leader() {
            return Some((self.raft.metrics().borrow().id, self.alive_ids()));
        }
        let answer = self
            .ask_leader(Box::new(|b, header| {
                let body =
                    wire::ControllerStatusRequest::create(b, &wire::ControllerStatusRequestArgs {});
                build_frame(
                    b,
                    &header,
                    wire::Body::ControllerStatusRequest,
                    Some(body.as_union_value()),
                )
            }))
            .await
            .ok()?;
        let r = answer.frame().body_as_controller_status_response()?;
        if r.alive_from() == 0 {
            return None;
        }
        let alive = r
            .groups()
            .iter()
            .flat_map(|v| v.iter())
            .map(|g| {
                (
                    state::group_key(
                        g.cluster_name().unwrap_or_default(),
                        g.broker_name().unwrap_or_default(),
                    ),
                    g.alive().iter().flat_map(|v| v.iter()).collect(),
                )
            })
            .collect();
        Some((r.alive_from(), alive))
    }

    /// On the leader: replaces every dead master by an alive member of its SyncStateSet.
    async fn election_loop(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(Duration::from_millis(200));
        loop {
            ticker.tick().await;
            let is_leader = self.is_leader();
            let since = {
                let mut since = self.leader_since.lock().unwrap_or_else(|e| e.into_inner());
                match (is_leader, *since) {
                    (true, None) => *since = Some(Instant::now()),
                    (false, Some(_)) => *since = None,
                    _ => {}
                }
                *since
            };
            // A new leader knows no heartbeat yet: it waits one broker timeout first.
            let Some(since) = since else { continue };
            if since.elapsed() < self.config.broker_timeout {
                continue;
            }
            let alive = self.alive_ids();
            for group in self.machine.groups().groups.into_values() {
                let key = state::group_key(&group.cluster_name, &group.broker_name);
                let alive = alive.get(&key).cloned().unwrap_or_default();
                if group.master == 0 || alive.contains(&group.master) {
                    self.stuck
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                    continue;
                }
                let candidate = pick_candidate(
                    &group.sync_state_set,
                    group.master,
                    &alive,
                    &self.progress_of(&key),
                );
                let Some(candidate) = candidate else {
                    if self
                        .stuck
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key.clone())
                    {
                        warn!(group = %key, master = group.master, set = ?group.sync_state_set, "the master is dead and no in-sync replica is alive: the group waits for one");
                    }
                    continue;
                };
                let started = Instant::now();
                match self
                    .write(Command::Elect {
                        cluster_name: group.cluster_name.clone(),
                        broker_name: group.broker_name.clone(),
                        broker_id: candidate,
                        expected_epoch: group.epoch,
                    })
                    .await
                {
                    Ok(result) if result.applied => info!(
                        group = %key,
                        old_master = group.master,
                        new_master = candidate,
                        epoch = group.epoch + 1,
                        took_ms = started.elapsed().as_millis() as u64,
                        "elected a new master"
                    ),
                    Ok(result) => {
                        debug!(group = %key, why = %result.why_not, "election not applied")
                    }
                    Err(e) => warn!(group = %key, error = %e, "election failed"),
                }
            }
        }
    }
}

/// One change of the controller group's voters.
#[derive(Debug, Clone)]
struct MemberChange {
    node_id: NodeId,
    address: String,
    remove: bool,
}

/// `id=address` of every member, learners marked.
fn member_list(metrics: &openraft::RaftMetrics<NodeId, BasicNode>) -> Vec<String> {
    let membership = &metrics.membership_config;
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| {
            if voters.contains(id) {
                format!("{id}={}", node.addr)
            } else {
                format!("{id}={} (learner)", node.addr)
            }
        })
        .collect()
}

fn encode_group<'b>(
    b: &mut flatbuffers::FlatBufferBuilder<'b>,
    group: &Group,
    alive: &BTreeSet<i64>,
) -> flatbuffers::WIPOffset<wire::ControllerGroup<'b>> {
    let cluster = b.create_string(&group.cluster_name);
    let broker = b.create_string(&group.broker_name);
    let master = group.master_replica().cloned().unwrap_or_default();
    let master_address = b.create_string(&master.address);
    let master_ha = b.create_string(&master.ha_address);
    let set: Vec<i64> = group.sync_state_set.iter().copied().collect();
    let set = b.create_vector(&set);
    let ids: Vec<i64> = group.replicas.keys().copied().collect();
    let ids = b.create_vector(&ids);
    let addresses: Vec<_> = group
        .replicas
        .values()
        .map(|r| b.create_string(&r.address))
        .collect();
    let addresses = b.create_vector(&addresses);
    let alive: Vec<i64> = alive.iter().copied().collect();
    let alive = b.create_vector(&alive);
    wire::ControllerGroup::create(
        b,
        &wire::ControllerGroupArgs {
            cluster_name: Some(cluster),
            broker_name: Some(broker),
            master_id: group.master,
            master_address: Some(master_address),
            master_ha_address: Some(master_ha),
            epoch: group.epoch,
            sync_state_set: Some(set),
            replica_ids: Some(ids),
            replica_addresses: Some(addresses),
            alive: Some(alive),
            sync_state_epoch: group.sync_state_epoch,
        },
    )
}

fn decode_group(g: &wire::ControllerGroup<'_>) -> (Group, BTreeSet<i64>) {
    let text = |s: Option<&str>| s.unwrap_or_default().to_owned();
    let ids: Vec<i64> = g.replica_ids().iter().flat_map(|v| v.iter()).collect();
    let addresses: Vec<String> = g
        .replica_addresses()
        .iter()
        .flat_map(|v| v.iter())
        .map(str::to_owned)
        .collect();
    let mut replicas: BTreeMap<i64, Replica> = ids
        .into_iter()
        .zip(addresses)
        .map(|(id, address)| {
            (
                id,
                Replica {
                    address,
                    ha_address: String::new(),
                },
            )
        })
        .collect();
    if let Some(master) = replicas.get_mut(&g.master_id()) {
        master.ha_address = text(g.master_ha_address());
    }
    (
        Group {
            cluster_name: text(g.cluster_name()),
            broker_name: text(g.broker_name()),
            master: g.master_id(),
            epoch: g.epoch(),
            sync_state_set: g.sync_state_set().iter().flat_map(|v| v.iter()).collect(),
            sync_state_epoch: g.sync_state_epoch(),
            replicas,
        },
        g.alive().iter().flat_map(|v| v.iter()).collect(),
    )
}

/// Runs a controller on threads of its own (a 2-thread tokio runtime) until `shutdown` turns
/// true. Returns once it listens, or with the reason it cannot start.
pub fn spawn(
    config: ControllerConfig,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> io::Result<std::thread::JoinHandle<()>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
    let handle = std::thread::Builder::new()
        .name("shardmq-controller".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("shardmq-controller")
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match TcpListener::bind(&config.listen).await {
                    Ok(listener) => listener,
                    Err(e) => {
                        let _ = ready_tx.send(Err(io::Error::new(
                            e.kind(),
                            format!("cannot listen on {}: {e}", config.listen),
                        )));
                        return;
                    }
                };
                let controller = match Controller::start(config.clone()).await {
                    Ok(controller) => controller,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                info!(
                    id = config.id,
                    listen = %config.listen,
                    peers = ?config.peers,
                    data_dir = %config.data_dir.display(),
                    "controller serving"
                );
                let _ = ready_tx.send(Ok(()));
                controller.serve(listener, shutdown).await;
            });
        })?;
    ready_rx
        .recv()
        .map_err(|_| io::Error::other("the controller thread ended before it started"))??;
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::{pick_candidate, Progress};
    use std::collections::{BTreeSet, HashMap};

    fn progress(last_epoch: u64, log_end: u64, priority: u32) -> Progress {
        Progress {
            last_epoch,
            log_end,
            priority,
        }
    }

    #[test]
    fn the_election_ranks_alive_members_by_term_then_log_then_priority_then_id() {
        let set: BTreeSet<i64> = [1, 2, 3, 4].into();
        let alive: BTreeSet<i64> = [2, 3, 4].into();
        // The newest term wins over a longer log.
        let p: HashMap<i64, Progress> = [
            (2, progress(3, 900, 0)),
            (3, progress(4, 100, u32::MAX)),
            (4, progress(3, 5_000, 0)),
        ]
        .into();
        assert_eq!(pick_candidate(&set, 1, &alive, &p), Some(3));
        // Same term: the longest log.
        let p: HashMap<i64, Progress> = [
            (2, progress(4, 900, 0)),
            (3, progress(4, 1_000, u32::MAX)),
            (4, progress(4, 999, 0)),
        ]
        .into();
        assert_eq!(pick_candidate(&set, 1, &alive, &p), Some(3));
        // Same term and log: the lowest priority value, then the lowest id.
        let p: HashMap<i64, Progress> = [
            (2, progress(4, 1_000, 7)),
            (3, progress(4, 1_000, 5)),
            (4, progress(4, 1_000, 5)),
        ]
        .into();
        assert_eq!(pick_candidate(&set, 1, &alive, &p), Some(3));
        // The replaced master, dead members and non-members are never picked; a member never
        // heard from ranks last but is still a candidate.
        let p: HashMap<i64, Progress> =
            [(1, progress(9, 9_999, 0)), (5, progress(9, 9_999, 0))].into();
        let alive_all: BTreeSet<i64> = [1, 2, 5].into();
        assert_eq!(pick_candidate(&set, 1, &alive_all, &p), Some(2));
        assert_eq!(pick_candidate(&set, 1, &[1, 5].into(), &p), None);
    }
}
