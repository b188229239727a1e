//! RocketMQ's remoting protocol on the real name server's port, spoken with the
//! `shardmq-remoting` codec over a plain socket: routes of a real broker's topics, the codes it
//! does not support, oneway requests, malformed frames, and native clients on the same port.
//! (The compatibility suite in `compat/` does the same through RocketMQ's own client.)

use shardmq_remoting::codes::{request, response};
use shardmq_remoting::{decode_route_body, RemotingCommand, SerializeType};
use shardmq_tests::{LocalCluster, RemotingClient};
use tempfile::TempDir;

fn route_request(topic: &str, opaque: i32) -> RemotingCommand {
    RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, opaque).with_ext("topic", topic)
}

#[test]
fn a_rocketmq_client_reads_routes_from_the_name_server_s_own_port() {
    let dir = TempDir::new().unwrap();
    let cluster = LocalCluster::start(dir.path());
    cluster.create_topic("Orders", 4);
    let namesrv = cluster.namesrv_addr();

    for serialize_type in [SerializeType::Json, SerializeType::RocketMq] {
        let mut client = RemotingClient::connect(&namesrv);
        let answer = client.call(route_request("Orders", 1).with_serialize_type(serialize_type));
        assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
        assert_eq!(answer.serialize_type, serialize_type);
        let route = decode_route_body(&answer.body).expect("a route body");
        assert_eq!(route.broker_datas.len(), 1);
        assert_eq!(
            route.broker_datas[0].broker_addrs.get(&0),
            Some(&cluster.broker_addr()),
            "the master's address is the broker's client port"
        );
        let queues = &route.queue_datas[0];
        assert_eq!(
            (queues.read_queue_nums, queues.write_queue_nums, queues.perm),
            (4, 4, 6)
        );

        // Unknown topic, unsupported code, then a oneway request: the connection goes on, and
        // the oneway request is not answered (the next answer is the next request's).
        let missing = client.call(route_request("Nowhere", 2).with_serialize_type(serialize_type));
        assert_eq!(missing.code, response::TOPIC_NOT_EXIST);
        let unsupported = client.call(
            RemotingCommand::request(request::REGISTER_BROKER, 3)
                .with_serialize_type(serialize_type),
        );
        assert_eq!(unsupported.code, response::REQUEST_CODE_NOT_SUPPORTED);
        assert!(unsupported.remark.unwrap_or_default().contains("103"));
        client.send(&route_request("Orders", 4).with_oneway());
        let after_oneway = client.call(route_request("Orders", 5));
        assert_eq!(after_oneway.code, response::SUCCESS);
    }

    // A native client on the same port is served as before.
    let mut native = cluster.namesrv.client();
    native
        .handshake()
        .expect("native handshake on the shared port");
}

#[test]
fn malformed_remoting_frames_close_the_connection_and_leave_the_name_server_serving() {
    let dir = TempDir::new().unwrap();
    let cluster = LocalCluster::start(dir.path());
    let namesrv = cluster.namesrv_addr();

    // A length over the frame limit: refused from the prefix, nothing buffered.
    let mut oversized = RemotingClient::connect(&namesrv);
    let mut frame = Vec::new();
    frame.extend_from_slice(&(1u32 << 30).to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 2]);
    frame.extend_from_slice(b"{}");
    oversized.send_bytes(&frame);
    assert!(oversized.receive().is_none(), "closed after a lying length");

    // A JSON header that is not JSON.
    let mut garbled = RemotingClient::connect(&namesrv);
    let header = b"not json at all";
    let mut frame = Vec::new();
    frame.extend_from_slice(&((4 + header.len()) as u32).to_be_bytes());
    frame.extend_from_slice(&(header.len() as u32).to_be_bytes());
    frame.extend_from_slice(header);
    garbled.send_bytes(&frame);
    assert!(
        garbled.receive().is_none(),
        "closed after an unreadable header"
    );

    // A header length past the frame's end.
    let mut lying = RemotingClient::connect(&namesrv);
    let mut frame = Vec::new();
    frame.extend_from_slice(&8u32.to_be_bytes());
    frame.extend_from_slice(&1000u32.to_be_bytes());
    frame.extend_from_slice(b"{}{}");
    lying.send_bytes(&frame);
    assert!(
        lying.receive().is_none(),
        "closed after a header length past the frame"
    );

    let mut healthy = RemotingClient::connect(&namesrv);
    let answer = healthy.call(RemotingCommand::request(
        request::GET_BROKER_CLUSTER_INFO,
        1,
    ));
    assert_eq!(answer.code, response::SUCCESS);
    let info: serde_json::Value = serde_json::from_slice(&answer.body).expect("cluster info");
    assert_eq!(
        info["brokerAddrTable"]["broker-a"]["brokerAddrs"]["0"],
        cluster.broker_addr()
    );
}
