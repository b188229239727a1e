//! RocketMQ's remoting protocol on the name server's own port, for RocketMQ clients and admin
//! tools (docs/protocol.md, "RocketMQ remoting").
//!
//! Owns: a remoting connection's loop (frames in, answers out, its limits) and the mapping from
//! the remoting requests a RocketMQ client sends a name server to [`RouteTable`] reads:
//! GET_ROUTEINFO_BY_TOPIC (105), GET_BROKER_CLUSTER_INFO (106),
//! GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206) and GET_TOPICS_BY_CLUSTER (224), and the one write
//! admin tools make of it, DELETE_TOPIC_IN_NAMESRV (216). Every other request
//! is answered REQUEST_CODE_NOT_SUPPORTED with a remark naming the code; a oneway request is
//! never answered. Never: the bytes of the protocol (the `shardmq-remoting` crate) or how routes
//! are built (the registry). Brokers register only over the native protocol, so the routes a
//! RocketMQ client reads are those of ShardMQ brokers.
//!
//! Data enters as the bytes the server read while telling the protocols apart, then from the
//! socket; it leaves as answer frames, written together for all the requests one read brought.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Bytes, BytesMut};
use serde::Serialize;
use shardmq_remoting::codes::{request, response};
use shardmq_remoting::{
    encode_frame, encode_route_body, BrokerData, FrameDecoder, FrameLimits, QueueData,
    RemotingCommand, TopicRouteData,
};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio::time::timeout;
use tracing::{debug, warn};

use crate::access::Access;
use crate::registry::{validate_topic_name, RouteBroker, RouteTable, TopicRoute};
use crate::server::{
    write_flushed, Closed, ServerConfig, MAX_PENDING_WRITE_BYTES, READ_CHUNK_BYTES,
};

/// Answers remoting requests from the route table.
#[derive(Debug)]
pub struct RemotingHandler {
    registry: Arc<Mutex<RouteTable>>,
    /// Access control (off unless [`RemotingHandler::with_access`]).
    access: Arc<Access>,
}

impl RemotingHandler {
    #[must_use]
    pub fn new(registry: Arc<Mutex<RouteTable>>) -> Self {
        Self {
            registry,
            access: Access::off(),
        }
    }

    /// The same handler deciding every request with `access`.
    #[must_use]
    pub fn with_access(mut self, access: Arc<Access>) -> Self {
        self.access = access;
        self
    }

    /// The answer to `command` from `peer`, or `None` when it gets none (a oneway request, or a
    /// response, which a name server never asked for). With access control on, the request's
    /// RocketMQ signature and its account's permission are checked first; a refusal is
    /// `NO_PERMISSION` with the reason as remark.
    #[must_use]
    pub fn handle(&self, peer: IpAddr, command: &RemotingCommand) -> Option<RemotingCommand> {
        if command.is_response() || command.is_oneway() {
            return None;
        }
        if let Err(refusal) = self.access.check_remoting(command, peer) {
            debug!(%peer, code = command.code, "refused: {refusal}");
            return Some(refused(command, response::NO_PERMISSION, refusal));
        }
        Some(self.answer(command))
    }

    /// The answer to a request access control let through.
    fn answer(&self, command: &RemotingCommand) -> RemotingCommand {
        match command.code {
            request::GET_ROUTEINFO_BY_TOPIC => self.route(command),
            request::GET_BROKER_CLUSTER_INFO => self.cluster_info(command),
            request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER => self.topic_list(command, None),
            request::GET_TOPICS_BY_CLUSTER => match command.ext_str("cluster") {
                Ok(cluster) => self.topic_list(command, Some(cluster)),
                Err(missing) => refused(command, response::SYSTEM_ERROR, missing.to_string()),
            },
            request::DELETE_TOPIC_IN_NAMESRV => self.delete_topic(command),
            code => refused(
                command,
                response::REQUEST_CODE_NOT_SUPPORTED,
                format!("request code {code} is not supported by ShardMQ's name server"),
            ),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, RouteTable> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn route(&self, command: &RemotingCommand) -> RemotingCommand {
        let topic = match command.ext_str("topic") {
            Ok(topic) => topic,
            Err(missing) => return refused(command, response::SYSTEM_ERROR, missing.to_string()),
        };
        if let Err(invalid) = validate_topic_name(topic) {
            return refused(command, response::SYSTEM_ERROR, invalid.to_string());
        }
        let Some(route) = self.registry().route(topic) else {
            return refused(
                command,
                response::TOPIC_NOT_EXIST,
                format!("no topic route info in name server for the topic: {topic}"),
            );
        };
        match encode_route_body(&route_data(&route)) {
            Ok(body) => RemotingCommand::response_to(command, response::SUCCESS).with_body(body),
            Err(too_large) => refused(command, response::SYSTEM_ERROR, too_large.to_string()),
        }
    }

    /// DELETE_TOPIC_IN_NAMESRV (`topic`, optional `clusterName`): the topic's routes go
    /// ([`RouteTable::delete_topic`]). SUCCESS whether or not a broker still registered it, as
    /// RocketMQ answers: `mqadmin deleteTopic` sends it after deleting the topic on the brokers.
    fn delete_topic(&self, command: &RemotingCommand) -> RemotingCommand {
        let topic = match command.ext_str("topic") {
            Ok(topic) => topic,
            Err(missing) => return refused(command, response::SYSTEM_ERROR, missing.to_string()),
        };
        if let Err(invalid) = validate_topic_name(topic) {
            return refused(command, response::SYSTEM_ERROR, invalid.to_string());
        }
        let cluster = command
            .ext("clusterName")
            .filter(|cluster| !cluster.is_empty());
        let removed = self.registry().delete_topic(topic, cluster);
        debug!(
            topic,
            ?cluster,
            removed,
            "a remoting client deleted a topic's routes"
        );
        RemotingCommand::response_to(command, response::SUCCESS)
    }

    fn cluster_info(&self, command: &RemotingCommand) -> RemotingCommand {
        let clusters = self.registry().clusters();
        let mut info = ClusterInfo::default();
        for cluster in &clusters {
            let names = info
                .cluster_addr_table
                .entry(cluster.cluster_name.clone())
                .or_default();
            for broker in &cluster.brokers {
                names.push(broker.broker_name.clone());
                info.broker_addr_table
                    .insert(broker.broker_name.clone(), broker_data(broker));
            }
        }
        json_answer(command, &info)
    }

    fn topic_list(&self, command: &RemotingCommand, cluster: Option<&str>) -> RemotingCommand {
        let topic_list = self.registry().topic_names(cluster);
        json_answer(command, &TopicList { topic_list })
    }
}

/// RocketMQ's `ClusterInfo` body.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterInfo {
    broker_addr_table: BTreeMap<String, BrokerData>,
    cluster_addr_table: BTreeMap<String, Vec<String>>,
}

/// RocketMQ's `TopicList` body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct TopicList {
    topic_list: Vec<String>,
}

fn route_data(route: &TopicRoute) -> TopicRouteData {
    TopicRouteData {
        queue_datas: route
            .queues
            .iter()
            .map(|queues| QueueData {
                broker_name: queues.broker_name.clone(),
                read_queue_nums: saturating_i32(queues.read_queues),
                write_queue_nums: saturating_i32(queues.write_queues),
                perm: saturating_i32(queues.perm),
                topic_sys_flag: 0,
            })
            .collect(),
        broker_datas: route.brokers.iter().map(broker_data).collect(),
        ..TopicRouteData::default()
    }
}

fn broker_data(broker: &RouteBroker) -> BrokerData {
    BrokerData {
        cluster: broker.cluster_name.clone(),
        broker_name: broker.broker_name.clone(),
        broker_addrs: broker
            .addresses
            .iter()
            .map(|address| (address.broker_id, address.address.clone()))
            .collect(),
        enable_acting_master: false,
        zone_name: None,
    }
}

/// Queue counts and permission bits are bounded far below `i32::MAX` by the registry.
fn saturating_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

fn json_answer(command: &RemotingCommand, body: &impl Serialize) -> RemotingCommand {
    match serde_json::to_vec(body) {
        Ok(body) => {
            RemotingCommand::response_to(command, response::SUCCESS).with_body(Bytes::from(body))
        }
        Err(error) => refused(command, response::SYSTEM_ERROR, error.to_string()),
    }
}

fn refused(command: &RemotingCommand, code: i32, remark: String) -> RemotingCommand {
    RemotingCommand::response_to(command, code).with_remark(remark)
}

/// Serves one remoting connection until it ends. `read_buffer` holds what was read while the
/// server told the protocols apart.
pub(crate) async fn serve_remoting_connection<
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
>(
    mut stream: S,
    peer: SocketAddr,
    mut read_buffer: BytesMut,
    handler: &RemotingHandler,
    config: &ServerConfig,
    mut stop: watch::Receiver<bool>,
) -> Closed {
    let decoder = FrameDecoder::new(FrameLimits::default().with_max_frame_bytes(
        // The native limit counts the frame after its 4-byte prefix; remoting's counts it whole.
        config.max_frame_bytes.saturating_add(4),
    ));
    let mut write_buffer = BytesMut::new();
    loop {
        if *stop.borrow_and_update() {
            return Closed::Shutdown;
        }
        let mut answered = 0;
        let mut failure = None;
        let mut is_batch_full = false;
        loop {
            if answered >= config.max_in_flight_per_connection
                || write_buffer.len() >= MAX_PENDING_WRITE_BYTES
            {
                is_batch_full = true;
                break;
            }
            match decoder.decode(&mut read_buffer) {
                Ok(Some(command)) => {
                    answered += 1;
                    let Some(answer) = handler.handle(peer.ip(), &command) else {
                        continue;
                    };
                    if let Err(error) =
                        encode_frame(&answer, decoder.limits().max_frame_bytes, &mut write_buffer)
                    {
                        warn!(code = command.code, %error, "cannot encode a remoting answer");
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    // RocketMQ closes a connection whose frame cannot be decoded; a request
                    // whose header is unreadable has no opaque to answer to either.
                    failure = Some(error);
                    break;
                }
            }
        }
        if !write_buffer.is_empty() {
            match timeout(
                config.idle_timeout,
                write_flushed(&mut stream, &write_buffer),
            )
            .await
            {
                Ok(Ok(())) => write_buffer.clear(),
                Ok(Err(io_error)) => return Closed::Io(io_error),
                Err(_) => return Closed::Idle,
            }
        }
        if let Some(error) = failure {
            debug!(%error, "closing a remoting connection after a frame it could not decode");
            return Closed::Malformed(error.to_string());
        }
        if is_batch_full {
            // More whole frames may be buffered already: answer them before reading more, but
            // let the other connections run first.
            tokio::task::yield_now().await;
            continue;
        }
        read_buffer.reserve(READ_CHUNK_BYTES);
        tokio::select! {
            changed = stop.changed() => {
                let _ = changed;
                return Closed::Shutdown;
            }
            read = timeout(config.idle_timeout, stream.read_buf(&mut read_buffer)) => match read {
                Ok(Ok(0)) => return Closed::ByPeer,
                Ok(Ok(_)) => {}
                Ok(Err(io_error)) => return Closed::Io(io_error),
                Err(_) => return Closed::Idle,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use shardmq_remoting::{decode_route_body, SerializeType, FLAG_ONEWAY};

    use super::*;
    use crate::registry::{BrokerRegistration, TopicQueues};

    const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    /// A broker instance: name, id, address and its topics with their queue counts.
    type Instance<'a> = (&'a str, i64, &'a str, &'a [(&'a str, u32)]);

    fn handler_with(brokers: &[Instance<'_>]) -> RemotingHandler {
        let mut table = RouteTable::default();
        for (broker_name, broker_id, address, topics) in brokers {
            let registration = BrokerRegistration {
                cluster_name: "DefaultCluster".to_owned(),
                broker_name: (*broker_name).to_owned(),
                broker_id: *broker_id,
                broker_address: (*address).to_owned(),
                ha_server_address: None,
                topics: topics
                    .iter()
                    .map(|(name, queues)| {
                        (
                            (*name).to_owned(),
                            TopicQueues::read_write(*queues, *queues),
                        )
                    })
                    .collect(),
                topic_config_version: 1,
                state_version: 0,
            };
            table
                .register(registration, Instant::now())
                .expect("registers");
        }
        RemotingHandler::new(Arc::new(Mutex::new(table)))
    }

    fn route_request(topic: &str) -> RemotingCommand {
        RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 7).with_ext("topic", topic)
    }

    #[test]
    fn a_route_answer_names_the_master_and_slaves_and_their_queues() {
        let handler = handler_with(&[
            ("broker-a", 0, "127.0.0.1:10911", &[("orders", 4)]),
            ("broker-a", 1, "127.0.0.1:10921", &[("orders", 4)]),
        ]);
        for serialize_type in [SerializeType::Json, SerializeType::RocketMq] {
            let request = route_request("orders").with_serialize_type(serialize_type);
            let answer = handler.handle(LOOPBACK, &request).expect("answered");
            assert_eq!(answer.code, response::SUCCESS);
            assert_eq!(answer.opaque, 7);
            assert!(answer.is_response());
            assert_eq!(answer.serialize_type, serialize_type);
            let route = decode_route_body(&answer.body).expect("route body");
            assert_eq!(route.queue_datas.len(), 1);
            let queues = &route.queue_datas[0];
            assert_eq!(
                (
                    queues.broker_name.as_str(),
                    queues.read_queue_nums,
                    queues.write_queue_nums,
                    queues.perm
                ),
                ("broker-a", 4, 4, 6)
            );
            let broker = &route.broker_datas[0];
            assert_eq!(broker.cluster, "DefaultCluster");
            assert_eq!(
                broker.broker_addrs.get(&0).map(String::as_str),
                Some("127.0.0.1:10911")
            );
            assert_eq!(
                broker.broker_addrs.get(&1).map(String::as_str),
                Some("127.0.0.1:10921")
            );
        }
        let json = String::from_utf8(
            handler
                .handle(LOOPBACK, &route_request("orders"))
                .expect("answered")
                .body
                .to_vec(),
        )
        .expect("utf-8");
        assert!(json.contains(r#""brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.1:10921"}"#));
        assert!(json.contains(r#""enableActingMaster":false"#));
        assert!(json.contains(r#""filterServerTable":{}"#));
    }

    #[test]
    fn a_topic_without_a_route_is_topic_not_exist_and_a_bad_request_says_what_is_wrong() {
        let handler = handler_with(&[("broker-a", 0, "127.0.0.1:10911", &[("orders", 4)])]);
        let answer = handler
            .handle(LOOPBACK, &route_request("payments"))
            .expect("answered");
        assert_eq!(answer.code, response::TOPIC_NOT_EXIST);
        assert!(answer.remark.as_deref().unwrap_or("").contains("payments"));

        let without_topic = RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 8);
        let answer = handler.handle(LOOPBACK, &without_topic).expect("answered");
        assert_eq!(answer.code, response::SYSTEM_ERROR);
        assert!(answer.remark.as_deref().unwrap_or("").contains("topic"));

        let answer = handler
            .handle(LOOPBACK, &route_request(&"t".repeat(200)))
            .expect("answered");
        assert_eq!(answer.code, response::SYSTEM_ERROR);
    }

    #[test]
    fn other_codes_are_not_supported_and_oneway_requests_and_responses_get_no_answer() {
        let handler = handler_with(&[]);
        let register = RemotingCommand::request(request::REGISTER_BROKER, 9);
        let answer = handler.handle(LOOPBACK, &register).expect("answered");
        assert_eq!(answer.code, response::REQUEST_CODE_NOT_SUPPORTED);
        assert!(answer.remark.as_deref().unwrap_or("").contains("103"));

        let oneway = RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 10)
            .with_ext("topic", "orders")
            .with_oneway();
        assert_eq!(oneway.flag & FLAG_ONEWAY, FLAG_ONEWAY);
        assert!(handler.handle(LOOPBACK, &oneway).is_none());

        let stray = RemotingCommand::response_to(&route_request("orders"), response::SUCCESS);
        assert!(handler.handle(LOOPBACK, &stray).is_none());
    }

    #[test]
    fn cluster_info_and_topic_lists_come_from_the_table() {
        let handler = handler_with(&[
            (
                "broker-a",
                0,
                "127.0.0.1:10911",
                &[("orders", 4), ("audit", 1)],
            ),
            ("broker-b", 0, "127.0.0.1:10912", &[("orders", 2)]),
        ]);
        let info = handler
            .handle(
                LOOPBACK,
                &RemotingCommand::request(request::GET_BROKER_CLUSTER_INFO, 1),
            )
            .expect("answered");
        let info: serde_json::Value = serde_json::from_slice(&info.body).expect("json");
        assert_eq!(
            info["clusterAddrTable"]["DefaultCluster"],
            serde_json::json!(["broker-a", "broker-b"])
        );
        assert_eq!(
            info["brokerAddrTable"]["broker-b"]["brokerAddrs"]["0"],
            "127.0.0.1:10912"
        );

        let all = handler
            .handle(
                LOOPBACK,
                &RemotingCommand::request(request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER, 2),
            )
            .expect("answered");
        let all: serde_json::Value = serde_json::from_slice(&all.body).expect("json");
        assert_eq!(all["topicList"], serde_json::json!(["audit", "orders"]));

        let by_cluster = handler
            .handle(
                LOOPBACK,
                &RemotingCommand::request(request::GET_TOPICS_BY_CLUSTER, 3)
                    .with_ext("cluster", "OtherCluster"),
            )
            .expect("answered");
        let by_cluster: serde_json::Value = serde_json::from_slice(&by_cluster.body).expect("json");
        assert_eq!(by_cluster["topicList"], serde_json::json!([]));
    }

    #[test]
    fn delete_topic_drops_its_routes_and_names_a_missing_field() {
        let handler = handler_with(&[
            (
                "broker-a",
                0,
                "127.0.0.1:10911",
                &[("orders", 4), ("audit", 1)],
            ),
            ("broker-b", 0, "127.0.0.1:10912", &[("orders", 2)]),
        ]);
        let delete = RemotingCommand::request(request::DELETE_TOPIC_IN_NAMESRV, 4)
            .with_ext("topic", "orders")
            .with_ext("clusterName", "DefaultCluster");
        let answer = handler.handle(LOOPBACK, &delete).expect("answered");
        assert_eq!(answer.code, response::SUCCESS);
        let route = handler
            .handle(LOOPBACK, &route_request("orders"))
            .expect("answered");
        assert_eq!(route.code, response::TOPIC_NOT_EXIST);
        let route = handler
            .handle(LOOPBACK, &route_request("audit"))
            .expect("answered");
        assert_eq!(route.code, response::SUCCESS);
        // Already gone: still SUCCESS, as RocketMQ answers.
        let again = handler.handle(LOOPBACK, &delete).expect("answered");
        assert_eq!(again.code, response::SUCCESS);

        let without_topic = RemotingCommand::request(request::DELETE_TOPIC_IN_NAMESRV, 5);
        let answer = handler.handle(LOOPBACK, &without_topic).expect("answered");
        assert_eq!(answer.code, response::SYSTEM_ERROR);
        assert!(answer.remark.as_deref().unwrap_or("").contains("topic"));
        let bad_name = RemotingCommand::request(request::DELETE_TOPIC_IN_NAMESRV, 6)
            .with_ext("topic", "t".repeat(200));
        let answer = handler.handle(LOOPBACK, &bad_name).expect("answered");
        assert_eq!(answer.code, response::SYSTEM_ERROR);
    }

    #[test]
    fn with_access_control_a_request_is_signed_and_its_account_permitted_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acl.toml");
        std::fs::write(
            &path,
            r#"
            [[accounts]]
            access_key = "reader-account"
            secret_key = "reader-secret"
            "#,
        )
        .unwrap();
        let access = Access::with_store(shardmq_acl::AclStore::open(&path).unwrap());
        let handler = handler_with(&[("broker-a", 0, "127.0.0.1:10911", &[("orders", 4)])])
            .with_access(access);
        let signed = |mut command: RemotingCommand| {
            command
                .ext_fields
                .insert("AccessKey".into(), "reader-account".into());
            let signature = shardmq_acl::rocketmq_signature(
                "reader-secret",
                &command.ext_fields,
                &command.body,
            );
            command.ext_fields.insert("Signature".into(), signature);
            command
        };
        let anonymous = handler
            .handle(LOOPBACK, &route_request("orders"))
            .expect("answered");
        assert_eq!(anonymous.code, response::NO_PERMISSION);
        assert!(anonymous
            .remark
            .unwrap_or_default()
            .contains("GET_ROUTEINFO_BY_TOPIC needs a known account"));
        let answer = handler
            .handle(LOOPBACK, &signed(route_request("orders")))
            .expect("answered");
        assert_eq!(answer.code, response::SUCCESS);
        let delete = RemotingCommand::request(request::DELETE_TOPIC_IN_NAMESRV, 4)
            .with_ext("topic", "orders");
        let refused = handler.handle(LOOPBACK, &signed(delete)).expect("answered");
        assert_eq!(refused.code, response::NO_PERMISSION);
        assert!(refused.remark.unwrap_or_default().contains("not an admin"));
        let still = handler
            .handle(LOOPBACK, &signed(route_request("orders")))
            .expect("answered");
        assert_eq!(
            still.code,
            response::SUCCESS,
            "the refused deletion did nothing"
        );
    }
}
