//! The command line as the user types it: the parsed arguments ([`Cli`], one enum or struct
//! per command and its options, read by clap), and the [`Settings`] every command shares.
//!
//! Owns: the names, defaults and help texts of commands and options. Never: what a command
//! does (`commands.rs`, `dlq.rs`).

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// ShardMQ command line: manage topics, send and consume messages, inspect groups.
#[derive(Parser, Debug)]
#[command(name = "shardmq", version, propagate_version = true)]
pub struct Cli {
    /// Name server address(es), `host:port`, comma separated.
    #[arg(
        long,
        global = true,
        value_name = "ADDR",
        default_value = "127.0.0.1:9876"
    )]
    pub namesrv: String,

    /// Print JSON instead of text (one object per line for send and consume).
    #[arg(long, global = true)]
    pub json: bool,

    /// How long one request to a server may take, in ms.
    #[arg(long, global = true, value_name = "MS", default_value_t = 3000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_ms: u64,

    /// Connect in TLS, trusting the CAs of this PEM file (docs/tls.md). [env: SHARDMQ_TLS_CA]
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,

    /// PEM client certificate for mutual TLS (with --tls-key). [env: SHARDMQ_TLS_CERT]
    #[arg(long, global = true, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,

    /// PEM private key of --tls-cert. [env: SHARDMQ_TLS_KEY]
    #[arg(long, global = true, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Access key of the account to authenticate as, with servers that enforce access control
    /// (docs/acl.md). Also from SHARDMQ_ACCESS_KEY, or --credentials-file.
    #[arg(long, global = true, value_name = "KEY", requires = "secret_key")]
    pub access_key: Option<String>,

    /// Secret key of that account (with --access-key). Also from SHARDMQ_SECRET_KEY.
    #[arg(long, global = true, value_name = "SECRET", requires = "access_key")]
    pub secret_key: Option<String>,

    /// A TOML file with `access_key = "…"` and `secret_key = "…"`.
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        conflicts_with = "access_key"
    )]
    pub credentials_file: Option<std::path::PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create, update, delete and inspect topics.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Send messages to a topic.
    Send(SendArgs),
    /// Consume messages of a topic as a consumer group, committing its offsets.
    Consume(ConsumeArgs),
    /// Inspect consumer groups: members and progress (lag).
    #[command(subcommand)]
    Group(GroupCommand),
    /// Find stored messages by key or id.
    #[command(subcommand)]
    Message(MessageCommand),
    /// Inspect one broker.
    #[command(subcommand)]
    Broker(BrokerCommand),
    /// Inspect the clusters the name server knows.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Inspect the controller of automatic failover (docs/replication.md).
    #[command(subcommand)]
    Controller(ControllerCommand),
    /// Dead letters of a consumer group (`%DLQ%<group>`): list them, send them back to their
    /// original topic.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Accounts of an access-control file (acl.toml; docs/acl.md): list, add, update, remove.
    /// Brokers and name servers reload the file within 500 ms of a change.
    #[command(subcommand)]
    Acl(AclCommand),
    /// The web console: an HTTP server of pages over this command line's operations
    /// (docs/console.md).
    Console(ConsoleArgs),
}

#[derive(Args, Debug)]
pub struct ConsoleArgs {
    /// Address to serve on, `host:port` (port 0: any free port; the address is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// Controller addresses, comma separated, whose status the cluster page shows (leader,
    /// term, per broker group its master, epoch and in-sync replicas); none by default.
    #[arg(long, value_name = "ADDR", value_delimiter = ',')]
    pub controller: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum AclCommand {
    /// Every account (secrets are not shown) and the global trusted addresses.
    List {
        /// The accounts file.
        #[arg(long)]
        file: std::path::PathBuf,
    },
    /// Adds an account (the file is made when it does not exist).
    Add {
        #[arg(long)]
        file: std::path::PathBuf,
        #[command(flatten)]
        account: AccountArgs,
    },
    /// Changes what is given of an account; the rest stays.
    Update {
        #[arg(long)]
        file: std::path::PathBuf,
        #[command(flatten)]
        account: AccountArgs,
    },
    /// Removes an account.
    Remove {
        #[arg(long)]
        file: std::path::PathBuf,
        #[arg(long)]
        access_key: String,
    },
}

/// One account's settings, as `acl add` and `acl update` take them.
#[derive(Args, Debug)]
pub struct AccountArgs {
    /// The account's access key (7 to 256 characters).
    #[arg(long)]
    pub access_key: String,
    /// Its secret key (7 to 256 characters); required by `add`.
    #[arg(long)]
    pub secret_key: Option<String>,
    /// Whether it may make admin calls (create and delete topics, replication).
    #[arg(long, value_name = "true|false")]
    pub admin: Option<bool>,
    /// DENY, PUB, SUB or PUB|SUB on topics it has no entry for.
    #[arg(long, value_name = "PERM")]
    pub default_topic_perm: Option<String>,
    /// DENY, PUB, SUB or PUB|SUB on groups it has no entry for.
    #[arg(long, value_name = "PERM")]
    pub default_group_perm: Option<String>,
    /// A topic's permission, NAME=PERM (NAME=none removes the entry); repeatable.
    #[arg(long, value_name = "NAME=PERM")]
    pub topic_perm: Vec<String>,
    /// A group's permission, NAME=PERM (NAME=none removes the entry); repeatable.
    #[arg(long, value_name = "NAME=PERM")]
    pub group_perm: Vec<String>,
    /// An address pattern it passes from without checks; repeatable; replaces the list ("" clears it).
    #[arg(long, value_name = "PATTERN")]
    pub trusted_address: Vec<String>,
    /// An address pattern it may connect from (others are refused); repeatable; replaces the list ("" clears it).
    #[arg(long, value_name = "PATTERN")]
    pub allowed_address: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum DlqCommand {
    /// Every message in the group's dead-letter topic, with its original topic, first id and
    /// how often it was redelivered.
    List {
        #[arg(long)]
        group: String,
        /// Most messages to print.
        #[arg(long, default_value_t = 1000)]
        max: u64,
    },
    /// Sends dead letters again to the topic they were first sent to, under their first id
    /// (the dead letters stay where they are; resending twice sends twice).
    #[command(group(clap::ArgGroup::new("which").required(true).args(["id", "all"])))]
    Resend {
        #[arg(long)]
        group: String,
        /// The message to resend: its msg id (as `dlq list` prints it) or its first id.
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// Resend every dead letter of the group.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Every cluster with its broker names and their live instances.
    List,
}

#[derive(Subcommand, Debug)]
pub enum TopicCommand {
    /// Create a topic (an error where it exists) on --broker, or else on every master broker
    /// of --cluster (default: of every cluster the name server knows).
    Create(TopicConfigArgs),
    /// Create or update a topic's queue counts and permission (same targets as create).
    Update(TopicConfigArgs),
    /// Delete a topic, on --broker or on every master broker hosting it.
    Delete {
        topic: String,
        /// Broker address `host:port`; default: every master broker in the topic's route.
        #[arg(long, value_name = "ADDR")]
        broker: Option<String>,
        /// Delete a group's %RETRY%/%DLQ% topic (the group must have no live member; what
        /// waits there is lost). Other system topics are never deleted.
        #[arg(long)]
        force: bool,
    },
    /// List the topics the name server routes (without the broker's own: retry, dead-letter,
    /// schedule and transaction topics, unless --system).
    List {
        /// Include the system topics.
        #[arg(long)]
        system: bool,
    },
    /// Show a topic's route: broker names, their addresses and queue counts.
    Route { topic: String },
    /// Show each queue's min/max offset and last store time.
    Status { topic: String },
}

#[derive(Args, Debug)]
pub struct TopicConfigArgs {
    pub topic: String,
    /// Read and write queues on each broker.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub queues: u32,
    /// Read queues, when different from --queues.
    #[arg(long, value_name = "N")]
    pub read_queues: Option<u32>,
    /// Write queues, when different from --queues.
    #[arg(long, value_name = "N")]
    pub write_queues: Option<u32>,
    /// Permission bits: read 4, write 2 (6 = read and write).
    #[arg(long, default_value_t = 6)]
    pub perm: u32,
    /// Mark the topic as ordered.
    #[arg(long)]
    pub ordered: bool,
    /// Broker address `host:port`: only this broker.
    #[arg(long, value_name = "ADDR", conflicts_with = "cluster")]
    pub broker: Option<String>,
    /// Cluster name: every master broker of this cluster (default: of every cluster).
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
}

#[derive(Args, Debug)]
pub struct SendArgs {
    pub topic: String,
    /// Message body (UTF-8 text).
    #[arg(
        long,
        required_unless_present = "body_file",
        conflicts_with = "body_file"
    )]
    pub body: Option<String>,
    /// Read the body from this file, as bytes (`-`: standard input); for bodies too large or
    /// too binary for an argument. At most 16 MiB is read (the broker's own limit,
    /// `max_message_bytes`, is 4 MiB by default).
    #[arg(long, value_name = "PATH")]
    pub body_file: Option<std::path::PathBuf>,
    /// The message's tag.
    #[arg(long)]
    pub tags: Option<String>,
    /// Keys, space separated.
    #[arg(long)]
    pub keys: Option<String>,
    /// A user property `name=value`; may be repeated.
    #[arg(long = "property", value_name = "NAME=VALUE")]
    pub properties: Vec<String>,
    /// How many messages to send (each with the same body and its own id).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub count: u32,
    /// Send in key order: every message of this key goes to one queue.
    #[arg(long, value_name = "KEY")]
    pub order_key: Option<String>,
    /// Producer group.
    #[arg(long, default_value = shardmq_client::DEFAULT_PRODUCER_GROUP)]
    pub group: String,
    /// Deliver after the broker's delay level L (1-based; RocketMQ's `1s 5s 10s 30s 1m … 2h`
    /// unless the broker is configured otherwise).
    #[arg(long, value_name = "L", conflicts_with_all = ["delay_ms", "deliver_at"],
          value_parser = clap::value_parser!(u32).range(1..))]
    pub delay_level: Option<u32>,
    /// Deliver this many ms after the broker stores the message (up to its horizon, 3 days by
    /// default).
    #[arg(long, value_name = "MS", conflicts_with = "deliver_at",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub delay_ms: Option<u64>,
    /// Deliver at this time, RFC 3339 (`2030-01-02T03:04:05Z`, `…+02:00`, fractions allowed).
    #[arg(long, value_name = "TIME")]
    pub deliver_at: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StartFrom {
    /// The oldest stored message.
    First,
    /// After the newest message: only what arrives from now on.
    Last,
}

#[derive(Args, Debug)]
pub struct ConsumeArgs {
    pub topic: String,
    /// Consumer group; its committed offsets say where to start and are moved past what is
    /// printed.
    #[arg(long)]
    pub group: String,
    /// Where to start in queues the group has no committed offset for.
    #[arg(long, value_enum, default_value_t = StartFrom::First)]
    pub from: StartFrom,
    /// Stop after this many messages.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many ms in all.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    pub timeout_ms: u64,
    /// Tag expression: `*` or `TagA || TagB`.
    #[arg(long, default_value = "*", conflicts_with = "sql")]
    pub tags: String,
    /// A SQL92 expression over message properties instead of tags, e.g.
    /// "region = 'eu' AND price > 10" (the broker must run with enable_property_filter;
    /// docs/sql-filter.md).
    #[arg(long)]
    pub sql: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum GroupCommand {
    /// The group's live members (client ids), as a broker of the topic knows them.
    Members {
        group: String,
        #[arg(long)]
        topic: String,
    },
    /// The group's committed offset, the queue's end and the lag of every queue of a topic
    /// (default: of every topic the group subscribes to or has offsets for), and the total
    /// lag ("diff total").
    Progress {
        group: String,
        #[arg(long)]
        topic: Option<String>,
    },
    /// Every consumer group the brokers know: live members, topics and total lag.
    List,
    /// Move the group's committed offsets of a topic to the first or last message or to a
    /// time. Stop the group's consumers first (refused while it has live members unless
    /// --force): a running consumer commits its own position over the reset.
    ResetOffset {
        group: String,
        /// The topic (or give it with --topic).
        #[arg(value_name = "TOPIC", required_unless_present = "topic")]
        topic_arg: Option<String>,
        #[arg(long, conflicts_with = "topic_arg")]
        topic: Option<String>,
        /// `first`, `last`, a store time in ms since the epoch, or an RFC 3339 time
        /// (2026-12-02T10:00:00Z).
        #[arg(long, value_name = "WHERE", visible_alias = "to-time")]
        to: String,
        /// Reset even while the group has live members.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum MessageCommand {
    /// Send messages to a topic (the same as the top-level `send`).
    Send(SendArgs),
    /// Consume messages of a topic as a consumer group (the same as the top-level `consume`).
    Consume(ConsumeArgs),
    /// Messages of a topic with a key, with full metadata.
    #[command(visible_alias = "query-key")]
    Key {
        topic: String,
        key: String,
        /// Most messages per broker.
        #[arg(long, default_value_t = 32)]
        max: u32,
        #[command(flatten)]
        range: TimeRange,
    },
    /// The message(s) with an id, with full metadata: a unique id (the msg id `send` prints;
    /// its copies in retry and dead-letter topics are listed too) or an offset id (the
    /// offset id `send` prints, which names the broker).
    #[command(visible_alias = "query-id")]
    Id {
        msg_id: String,
        /// Only copies stored in this topic.
        #[arg(long)]
        topic: Option<String>,
        #[command(flatten)]
        range: TimeRange,
    },
}

/// Store-time range of a query.
#[derive(Args, Debug, Clone, Default)]
pub struct TimeRange {
    /// Stored at or after this time: ms since the epoch or RFC 3339. Default: the beginning.
    #[arg(long, value_name = "TIME")]
    pub begin: Option<String>,
    /// Stored at or before this time: ms since the epoch or RFC 3339. Default: now.
    #[arg(long, value_name = "TIME")]
    pub end: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum ControllerCommand {
    /// The controller group's leader and members, and per broker group its master, epoch and
    /// in-sync replicas (SyncStateSet).
    Status {
        /// Controller addresses, comma separated; the first that answers is shown.
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:9878")]
        controller: Vec<String>,
    },
    /// Adds a controller node to the group: start it first with `shardmq-namesrv --controller
    /// --controller-join --controller-id ID --controller-listen ADDR`; it catches up as a
    /// learner, then becomes a voter.
    AddMember {
        /// The new node's id (unused in the group).
        #[arg(long)]
        id: u64,
        /// The new node's controller address.
        #[arg(long)]
        address: String,
        /// Controller addresses, comma separated; the first that answers makes the change.
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:9878")]
        controller: Vec<String>,
    },
    /// Takes a voter out of the controller group (stop its process afterwards).
    RemoveMember {
        /// The id of the node to remove.
        #[arg(long)]
        id: u64,
        /// Controller addresses, comma separated; the first that answers makes the change.
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:9878")]
        controller: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum BrokerCommand {
    /// Runtime status of one broker: shard placement, in/out TPS over --interval-ms,
    /// connections, parked pulls, disk use.
    Status {
        /// Broker address `host:port`.
        broker: String,
        /// Sample twice this far apart to compute rates; 0 reports totals only.
        #[arg(long, value_name = "MS", default_value_t = 1000)]
        interval_ms: u64,
    },
    /// Topics one broker hosts, with their configs.
    Topics {
        /// Broker address `host:port`.
        broker: String,
        /// Include system topics (retry, DLQ, schedule, transaction).
        #[arg(long)]
        system: bool,
    },
}

/// Common settings of every command.
pub struct Settings {
    pub namesrv: String,
    pub is_json: bool,
    pub request_timeout: Duration,
    /// The account to authenticate as (options, then the file, then the environment).
    pub credentials: Option<shardmq_client::Credentials>,
}

/// `.credentials_of(settings)` on every client builder: the settings' account, if any.
pub trait CredentialsOf: Sized {
    fn credentials_of(self, settings: &Settings) -> Self;
}

macro_rules! credentials_of {
    ($($builder:ty),*) => {$(
        impl CredentialsOf for $builder {
            fn credentials_of(self, settings: &Settings) -> Self {
                match &settings.credentials {
                    Some(credentials) => self.credentials(credentials.clone()),
                    None => self,
                }
            }
        }
    )*};
}

credentials_of!(
    shardmq_client::AdminBuilder,
    shardmq_client::ProducerBuilder,
    shardmq_client::PullConsumerBuilder
);
