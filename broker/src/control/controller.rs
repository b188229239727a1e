//! A broker's side of the controller (`broker_role = "auto"`, docs/replication.md "Automatic
//! failover"): it asks the controller for its role before each start (blocking, on the main
//! thread) and, while it runs, heartbeats the controller from network shard 0; a master also
//! reports which slaves are in sync and learns the SyncStateSet its sends wait for. When the
//! controller's answer no longer matches the role this run has, the broker restarts in its
//! process with the new role. A controller that enforces access control is answered with the
//! broker's account right after each handshake (`shardmq_services::peer_auth`).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;
use shardmq_schema::{build_frame, wire, FrameDecoder, FrameEncoder, FrameHeader, VerifiedFrame};

use std::rc::Rc;
use std::sync::atomic::Ordering;

use tracing::{debug, info, warn};

use shardmq_services::peer_auth;

use crate::config::BrokerConfig;
use crate::mesh::StorageRequest;
use crate::network::NetworkShard;

/// A broker group as the controller has it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupView {
    pub master_id: i64,
    pub master_address: String,
    pub master_ha_address: String,
    pub epoch: u64,
    pub sync_state_set: BTreeSet<i64>,
    /// Bumped by every change of the set: a lower one than the broker holds is an older set.
    pub sync_state_epoch: u64,
}

/// A master's SyncStateSet (without itself) as the controller last told it, with its set
/// epoch: what its next change is judged against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToldSet {
    pub members: BTreeSet<i64>,
    /// 0 until the first answer (a master starts with the set it was made master with, whose
    /// set epoch its start did not carry: the controller then compares by members only).
    pub set_epoch: u64,
}

impl ToldSet {
    /// Takes the set of an answer unless it is older than the one held (a delayed answer, or
    /// one a lagging controller gave): returns whether it did.
    pub fn adopt(&mut self, group: &GroupView, self_id: i64) -> bool {
        if group.sync_state_epoch < self.set_epoch {
            return false;
        }
        self.members = group.sync_state_set.clone();
        self.members.remove(&self_id);
        self.set_epoch = group.sync_state_epoch;
        true
    }
}

/// What one heartbeat says.
#[derive(Debug, Clone, Default)]
pub struct Beat {
    pub address: String,
    pub ha_address: String,
    pub epoch: u64,
    pub in_sync: BTreeSet<i64>,
    pub is_master: bool,
    /// A master: the SyncStateSet without itself as the controller last told it, which
    /// `in_sync` was judged against (the controller compares it with the set before changing it).
    pub judged_against: Option<BTreeSet<i64>>,
    /// The set epoch of `judged_against` (0: unknown).
    pub judged_against_set_epoch: u64,
    /// The newest master term the broker's log holds (the largest over its storage shards) and
    /// its log's end (the sum over them): what the controller ranks members by in an election.
    pub last_epoch: u64,
    pub log_end: u64,
}

/// A master's slaves joining its SyncStateSet, in two phases (the set's rule: every member
/// holds every acknowledged message). A slave not in the set that is alive and within
/// `in_sync_max_lag_bytes` on every storage shard is first *waited for*: from then on the
/// master's sends wait for it as for a member. At the next heartbeat the log ends of that
/// moment become its target (every send acknowledged since was waited for on it, and every one
/// before lies below them); it is reported in sync once it has acknowledged its target on
/// every shard. A joiner that falls behind or goes silent starts again. (Asking a joiner to
/// hold everything at one instant, as before, could not be met under a steady load: its
/// acknowledgement trails the master's end by the bytes in flight.)
#[derive(Debug, Default)]
pub struct Joins {
    /// Joiner → its target per storage shard (`None`: waited for since the last heartbeat).
    targets: std::collections::BTreeMap<i64, Option<Vec<u64>>>,
}

impl Joins {
    /// The joiners the master's sends wait for.
    pub fn waited(&self) -> BTreeSet<i64> {
        self.targets.keys().copied().collect()
    }

    /// The controller's set now holds these: they are members, no longer joiners.
    pub fn joined(&mut self, set: &BTreeSet<i64>) {
        self.targets.retain(|id, _| !set.contains(id));
    }

    /// The slaves to report in sync, from every storage shard's view (`views`, one per shard of
    /// `shards`; fewer: a shard did not answer, nobody is vouched for and the joins start
    /// again): the `members` alive and within `max_lag_bytes` on every shard, and the joiners
    /// that reached their target.
    pub fn judge(
        &mut self,
        views: &[crate::replication::SyncView],
        shards: usize,
        members: &BTreeSet<i64>,
        max_lag_bytes: u64,
    ) -> BTreeSet<i64> {
        if views.len() < shards || views.is_empty() {
            self.targets.clear();
            return BTreeSet::new();
        }
        let acknowledged = |slaves: &[(i64, u64, bool)], id: i64| {
            slaves
                .iter()
                .find(|(i, _, alive)| *i == id && *alive)
                .map(|(_, acknowledged, _)| *acknowledged)
        };
        let near = |id: i64| {
            views.iter().all(|(end, slaves)| {
                acknowledged(slaves, id).is_some_and(|a| end.saturating_sub(a) <= max_lag_bytes)
            })
        };
        let seen: BTreeSet<i64> = views
            .iter()
            .flat_map(|(_, slaves)| slaves.iter().map(|(id, _, _)| *id))
            .collect();
        self.targets.retain(|id, _| seen.contains(id));
        let mut in_sync = BTreeSet::new();
        for id in seen {
            if members.contains(&id) {
                if near(id) {
                    in_sync.insert(id);
                }
                continue;
            }
            if !near(id) {
                self.targets.remove(&id);
                continue;
            }
            match self.targets.get_mut(&id) {
                None => {
                    self.targets.insert(id, None);
                }
                Some(target @ None) => {
                    *target = Some(views.iter().map(|(end, _)| *end).collect());
                }
                Some(Some(target)) => {
                    let reached = views
                        .iter()
                        .zip(target.iter())
                        .all(|((_, slaves), t)| acknowledged(slaves, id).is_some_and(|a| a >= *t));
                    if reached {
                        in_sync.insert(id);
                    }
                }
            }
        }
        in_sync
    }
}

/// Builds a `ControllerHeartbeatRequest` frame body.
pub fn encode_heartbeat<'b>(
    b: &mut flatbuffers::FlatBufferBuilder<'b>,
    header: &FrameHeader<'_>,
    config: &BrokerConfig,
    beat: &Beat,
) -> flatbuffers::WIPOffset<wire::Frame<'b>> {
    let cluster = b.create_string(&config.cluster_name);
    let broker = b.create_string(&config.broker_name);
    let address = b.create_string(&beat.address);
    let ha = b.create_string(&beat.ha_address);
    let in_sync: Vec<i64> = beat.in_sync.iter().copied().collect();
    let in_sync = b.create_vector(&in_sync);
    let judged_against = beat.judged_against.as_ref().map(|set| {
        let set: Vec<i64> = set.iter().copied().collect();
        b.create_vector(&set)
    });
    let self_id = if config.controller_self_id > 0 {
        config.controller_self_id
    } else {
        config.broker_id
    };
    let body = wire::ControllerHeartbeatRequest::create(
        b,
        &wire::ControllerHeartbeatRequestArgs {
            cluster_name: Some(cluster),
            broker_name: Some(broker),
            broker_id: self_id,
            address: Some(address),
            ha_address: Some(ha),
            epoch: beat.epoch,
            in_sync: Some(in_sync),
            is_master: beat.is_master,
            judged_against,
            last_epoch: beat.last_epoch,
            log_end: beat.log_end,
            election_priority: config.election_priority,
            judged_against_set_epoch: beat.judged_against_set_epoch,
        },
    );
    build_frame(
        b,
        header,
        wire::Body::ControllerHeartbeatRequest,
        Some(body.as_union_value()),
    )
}

/// The group from a controller's answer to a heartbeat.
pub fn decode_answer(answer: &VerifiedFrame) -> Result<GroupView, String> {
    let frame = answer.frame();
    if frame.status() != wire::Status::OK {
        return Err(format!(
            "the controller answered {:?}: {}",
            frame.status(),
            frame.message().unwrap_or_default()
        ));
    }
    let group = frame
        .body_as_controller_heartbeat_response()
        .and_then(|r| r.group())
        .ok_or("a heartbeat answer without its group")?;
    Ok(GroupView {
        master_id: group.master_id(),
        master_address: group.master_address().unwrap_or_default().to_owned(),
        master_ha_address: group.master_ha_address().unwrap_or_default().to_owned(),
        epoch: group.epoch(),
        sync_state_set: group
            .sync_state_set()
            .iter()
            .flat_map(|v| v.iter())
            .collect(),
        sync_state_epoch: group.sync_state_epoch(),
    })
}

/// A blocking stream to a controller.
trait ControllerStream: Read + Write {}
impl<S: Read + Write> ControllerStream for S {}

/// `socket` as is, or in TLS when the broker connects out in TLS (`--tls-ca`): the handshake
/// runs on the first write.
fn with_tls(socket: TcpStream, address: &str) -> Result<Box<dyn ControllerStream>, String> {
    let Some(tls) = shardmq_services::tls_link::client_tls() else {
        return Ok(Box::new(socket));
    };
    let name = tls.server_name_for(address).map_err(|e| e.to_string())?;
    let session = shardmq_tls::rustls::ClientConnection::new(tls.config(), name)
        .map_err(|e| format!("{address}: TLS: {e}"))?;
    Ok(Box::new(shardmq_tls::rustls::StreamOwned::new(
        session, socket,
    )))
}

fn blocking_call(
    address: &str,
    config: &BrokerConfig,
    beat: &Beat,
    timeout: Duration,
) -> Result<GroupView, String> {
    let addr: SocketAddr = address.parse().map_err(|e| format!("{address}: {e}"))?;
    let socket =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{address}: {e}"))?;
    socket
        .set_read_timeout(Some(timeout))
        .and_then(|()| socket.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let mut stream = with_tls(socket, address)?;
    let mut encoder = FrameEncoder::new();
    let handshake = encoder
        .encode(|b| {
            shardmq_schema::build_handshake_request(
                b,
                &FrameHeader::request(1),
                &config.broker_name,
            )
        })
        .map_err(|e| e.to_string())?;
    let heartbeat = encoder
        .encode(|b| encode_heartbeat(b, &FrameHeader::request(2), config, beat))
        .map_err(|e| e.to_string())?;
    let decoder = FrameDecoder::new();
    let mut buffer = BytesMut::new();
    let mut exchange = |stream: &mut Box<dyn ControllerStream>, request: &[u8], id: u64| {
        // Under TLS, written bytes may wait in the session until flushed.
        stream
            .write_all(request)
            .and_then(|()| stream.flush())
            .map_err(|e| format!("{address}: {e}"))?;
        blocking_read(stream, &decoder, &mut buffer, id, address)
    };
    let answer = exchange(&mut stream, &handshake, 1)?;
    let server = format!("the controller at {address}");
    let credentials = peer_auth::credentials(config);
    if let Some(auth) = peer_auth::answer(credentials.as_ref(), &answer.frame(), &server)? {
        let request = encoder
            .encode(|b| auth.build(b, &FrameHeader::request(3)))
            .map_err(|e| e.to_string())?;
        let answer = exchange(&mut stream, &request, 3)?;
        peer_auth::accepted(&answer.frame(), &server, auth.access_key())?;
    }
    decode_answer(&exchange(&mut stream, &heartbeat, 2)?)
}

/// Reads frames from `stream` until the answer to request `id`.
fn blocking_read(
    stream: &mut Box<dyn ControllerStream>,
    decoder: &FrameDecoder,
    buffer: &mut BytesMut,
    id: u64,
    address: &str,
) -> Result<VerifiedFrame, String> {
    loop {
        if let Some(frame) = decoder.decode(buffer).map_err(|e| e.to_string())? {
            if frame.frame().request_id() == id {
                return Ok(frame);
            }
            continue;
        }
        let mut chunk = [0u8; 8192];
        let n = stream
            .read(&mut chunk)
            .map_err(|e| format!("{address}: {e}"))?;
        if n == 0 {
            return Err(format!("{address} closed the connection"));
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// The newest master term recorded by any of this broker's storage shards (0 for a new data
/// directory; an epoch log that cannot be read counts as 0 here, and the shard's start
/// reports it).
fn last_epoch_on_disk(config: &BrokerConfig) -> u64 {
    (0..config.storage_cores.len())
        .filter_map(|shard| {
            crate::store::epochs::EpochLog::load(&config.store_config(shard).shard_dir).ok()
        })
        .map(|log| log.last().epoch)
        .max()
        .unwrap_or(0)
}

/// Asks the controllers (each in turn, until one answers with a master elected) what this
/// broker is, and returns the configuration to run with: as master `sync-master` with broker
/// id 0, else `slave` of the elected master. Retries every second while no controller answers
/// or the master's HA address is not known yet, until `stopping`.
pub fn resolve(
    config: &BrokerConfig,
    stopping: &std::sync::atomic::AtomicBool,
) -> Result<BrokerConfig, String> {
    let own_id = config.broker_id;
    let ha_address = config
        .ha_listen_addr()
        .ok()
        .flatten()
        .filter(|a| a.port() != 0)
        .and_then(|a| config.ha_advertised_addr(a).ok())
        .map(|a| a.to_string())
        .unwrap_or_default();
    // The newest term this broker's log holds tells the controller whether a master starting
    // again already began a term in the group's epoch (then it needs a new one).
    let beat = Beat {
        address: config.listen.clone(),
        ha_address,
        last_epoch: last_epoch_on_disk(config),
        ..Beat::default()
    };
    let mut said = String::new();
    loop {
        if stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("stopped while waiting for the controller".into());
        }
        let mut errors = Vec::new();
        for address in &config.controller {
            match blocking_call(address, config, &beat, Duration::from_secs(2)) {
                Ok(group) if group.master_id == own_id => {
                    let mut effective = config.clone();
                    effective.broker_role = "sync-master".into();
                    effective.broker_id = 0;
                    effective.controller_self_id = own_id;
                    effective.controller_epoch = group.epoch;
                    let mut wait_for = group.sync_state_set.clone();
                    wait_for.remove(&own_id);
                    crate::role::set_sync_wait_set(Some(wait_for));
                    tracing::info!(epoch = group.epoch, in_sync = ?group.sync_state_set, "the controller makes this broker the master");
                    return Ok(effective);
                }
                Ok(group) if group.master_id > 0 && is_usable(&group.master_ha_address) => {
                    let mut effective = config.clone();
                    effective.broker_role = "slave".into();
                    effective.ha_master = group.master_ha_address.clone();
                    effective.controller_self_id = own_id;
                    effective.controller_epoch = group.epoch;
                    crate::role::set_sync_wait_set(None);
                    tracing::info!(epoch = group.epoch, master = group.master_id, master_ha = %group.master_ha_address, "the controller makes this broker a slave");
                    return Ok(effective);
                }
                Ok(group) => errors.push(format!(
                    "{address}: master {} has no HA address yet",
                    group.master_id
                )),
                Err(e) => errors.push(e),
            }
        }
        let now = errors.join("; ");
        if now != said {
            tracing::warn!(errors = %now, "waiting for the controller to name a master");
            said = now;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn is_usable(address: &str) -> bool {
    address.parse::<SocketAddr>().is_ok_and(|a| a.port() != 0)
}

/// Controller mode: heartbeats the controller every
/// `controller_heartbeat_ms`; as master, reports the slaves in sync and keeps the set its
/// sends wait for; restarts the broker when the controller names another master or epoch.
pub async fn run(shard: Rc<NetworkShard>) {
    let config = shard.config.clone();
    let self_id = config.controller_self_id;
    let is_master = config.role() != crate::config::BrokerRole::Slave;
    let interval = Duration::from_millis(config.controller_heartbeat_ms.max(50));
    let client_id = format!("{}-{}-controller", config.broker_name, self_id);
    let credentials = peer_auth::credentials(&config);
    let mut link: Option<crate::replication::MasterLink> = None;
    let mut next = 0usize;
    let mut said_unreachable = false;
    // A master: the SyncStateSet (without itself) as the controller last told it; it starts as
    // the set it was made master with (what its sends wait for before any heartbeat).
    let mut told = ToldSet {
        members: crate::role::sync_wait_set()
            .map(|set| (*set).clone())
            .unwrap_or_default(),
        set_epoch: 0,
    };
    let mut joins = Joins::default();
    while !shard.stopping.load(Ordering::Relaxed) {
        let mut in_sync = std::collections::BTreeSet::new();
        if is_master {
            let current = crate::role::sync_wait_set().unwrap_or_default();
            let mut views = Vec::with_capacity(shard.storage_shards());
            for storage in 0..shard.storage_shards() {
                // A shard that cannot answer vouches for no slave (see in_sync_slaves).
                let Ok(view) = shard
                    .ask(storage, |reply| StorageRequest::ReplicaSyncView { reply })
                    .await
                else {
                    break;
                };
                views.push(view);
            }
            let members: BTreeSet<i64> = current.difference(&joins.waited()).copied().collect();
            in_sync = joins.judge(
                &views,
                shard.storage_shards(),
                &members,
                config.in_sync_max_lag_bytes,
            );
            // Joining slaves are waited for from now on, before the controller agrees:
            // a send acknowledged meanwhile is then on them too.
            let mut wait_for: BTreeSet<i64> = members
                .union(&in_sync)
                .copied()
                .chain(joins.waited())
                .collect();
            wait_for.remove(&self_id);
            crate::role::set_sync_wait_set(Some(wait_for));
        }
        let (mut last_epoch, mut log_end) = (0, 0);
        for storage in 0..shard.storage_shards() {
            if let Ok((epoch, end)) = shard
                .ask(storage, |reply| StorageRequest::ReplicaProgress { reply })
                .await
            {
                last_epoch = last_epoch.max(epoch);
                log_end += end;
            }
        }
        let beat = Beat {
            address: shard.store_host.get().to_string(),
            ha_address: shard
                .ha_host
                .get()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            epoch: config.controller_epoch,
            in_sync,
            is_master,
            judged_against: is_master.then(|| told.members.clone()),
            judged_against_set_epoch: if is_master { told.set_epoch } else { 0 },
            last_epoch,
            log_end,
        };
        let mut answer = None;
        for _ in 0..config.controller.len() {
            if link.is_none() {
                let address = &config.controller[next % config.controller.len()];
                link = match address.parse() {
                    Ok(addr) => crate::replication::MasterLink::connect(
                        addr,
                        &client_id,
                        credentials.as_ref(),
                    )
                    .await
                    .ok(),
                    Err(_) => None,
                };
            }
            if let Some(connected) = link.as_mut() {
                let sent = futures_lite::future::or(
                    async {
                        Some(
                            connected
                                .request(|b, header| encode_heartbeat(b, &header, &config, &beat))
                                .await,
                        )
                    },
                    async {
                        glommio::timer::sleep(Duration::from_secs(3)).await;
                        None
                    },
                )
                .await;
                match sent.map(|r| r.map_err(|e| e.to_string()).and_then(|f| decode_answer(&f))) {
                    Some(Ok(group)) => {
                        answer = Some(group);
                        break;
                    }
                    Some(Err(error)) => {
                        tracing::debug!(%error, "controller heartbeat failed; trying the next");
                    }
                    None => tracing::debug!("controller heartbeat timed out; trying the next"),
                }
            }
            link = None;
            next += 1;
        }
        match answer {
            None => {
                // A lost majority stops elections, not this broker: it keeps its role.
                if !said_unreachable {
                    warn!("no controller answers; keeping the current role");
                    said_unreachable = true;
                }
            }
            Some(group) => {
                said_unreachable = false;
                let still = if is_master {
                    group.master_id == self_id && group.epoch == config.controller_epoch
                } else {
                    group.master_id != self_id
                        && group.epoch == config.controller_epoch
                        && group.master_ha_address == config.ha_master
                };
                if !still {
                    info!(
                        master = group.master_id,
                        epoch = group.epoch,
                        our_epoch = config.controller_epoch,
                        "the controller changed this group's master: restarting in the new role"
                    );
                    crate::role::request_restart();
                    return;
                }
                if is_master {
                    if told.adopt(&group, self_id) {
                        joins.joined(&told.members);
                        let mut wait_for = told.members.clone();
                        wait_for.extend(joins.waited());
                        crate::role::set_sync_wait_set(Some(wait_for));
                    } else {
                        debug!(
                            held = told.set_epoch,
                            answered = group.sync_state_epoch,
                            "ignoring an older SyncStateSet than the one held"
                        );
                    }
                }
            }
        }
        glommio::timer::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_master_keeps_the_newest_set_it_was_told_and_ignores_an_older_one() {
        let view = |set: &[i64], set_epoch: u64| GroupView {
            master_id: 1,
            epoch: 3,
            sync_state_set: set.iter().copied().collect(),
            sync_state_epoch: set_epoch,
            ..GroupView::default()
        };
        let mut told = ToldSet {
            members: BTreeSet::from([2]),
            set_epoch: 0,
        };
        assert!(told.adopt(&view(&[1, 2, 3], 5), 1));
        assert_eq!(told.members, BTreeSet::from([2, 3]), "itself left out");
        assert_eq!(told.set_epoch, 5);
        // A delayed answer with the set before 3 joined: ignored.
        assert!(!told.adopt(&view(&[1, 2], 4), 1));
        assert_eq!(
            (told.members.clone(), told.set_epoch),
            (BTreeSet::from([2, 3]), 5)
        );
        // The same set epoch again, or a newer one: taken.
        assert!(told.adopt(&view(&[1, 2, 3], 5), 1));
        assert!(told.adopt(&view(&[1], 6), 1));
        assert!(told.members.is_empty());
    }

    #[test]
    fn a_member_is_in_sync_on_every_shard_or_not_at_all() {
        let members = BTreeSet::from([2]);
        let mut joins = Joins::default();
        // Slave 2 a little behind on shard 0 and caught up on shard 1: in sync.
        let views = vec![(1000, vec![(2, 990, true)]), (500, vec![(2, 500, true)])];
        assert_eq!(joins.judge(&views, 2, &members, 64), BTreeSet::from([2]));
        // Past the lag bound, or silent, a member drops out.
        let views = vec![(1000, vec![(2, 900, true)]), (500, vec![(2, 500, false)])];
        assert!(joins.judge(&views, 2, &members, 64).is_empty());
        // A shard that did not answer vouches for nobody.
        let views = vec![(1000, vec![(2, 1000, true)])];
        assert!(joins.judge(&views, 2, &members, 64).is_empty());
    }

    #[test]
    fn a_joiner_is_waited_for_then_in_sync_once_it_reaches_where_the_log_was_then() {
        let members = BTreeSet::new();
        let mut joins = Joins::default();
        // Far behind: not waited for.
        let views = vec![(1000, vec![(3, 100, true)])];
        assert!(joins.judge(&views, 1, &members, 64).is_empty());
        assert!(joins.waited().is_empty());
        // Near (under a load its acknowledgement always trails the end): waited for first.
        let views = vec![(1000, vec![(3, 990, true)])];
        assert!(joins.judge(&views, 1, &members, 64).is_empty());
        assert_eq!(joins.waited(), BTreeSet::from([3]));
        // Next heartbeat: the log's end now (1200) becomes its target.
        let views = vec![(1200, vec![(3, 1190, true)])];
        assert!(joins.judge(&views, 1, &members, 64).is_empty());
        // Still trailing the end, but past the target: in sync, and still waited for.
        let views = vec![(1400, vec![(3, 1200, true)])];
        assert!(joins.judge(&views, 1, &members, 256).contains(&3));
        assert_eq!(joins.waited(), BTreeSet::from([3]));
        // The controller made it a member: no longer a joiner.
        joins.joined(&BTreeSet::from([3]));
        assert!(joins.waited().is_empty());
        // A joiner that falls behind starts again.
        let views = vec![(2000, vec![(4, 1995, true)])];
        joins.judge(&views, 1, &members, 64);
        let views = vec![(3000, vec![(4, 1000, true)])];
        joins.judge(&views, 1, &members, 64);
        assert!(joins.waited().is_empty());
    }
}
