//! What each `shardmq` command does, through the client library.
//!
//! Owns: turning parsed arguments into library calls and results into output lines. Never:
//! protocol details (the library has them) or output formats (see `output.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::json;
use shardmq_client::{
    Admin, BrokerFailure, Credentials, Message, MessageQueue, Partial, Producer, PullConsumer,
    PullOptions, PullStatus, QueueProgress, ResetTarget, TagExpression, TopicConfig,
};
use tokio::time::Instant;

use crate::cli::{
    BrokerCommand, Cli, ClusterCommand, Command, ConsumeArgs, ControllerCommand, CredentialsOf,
    GroupCommand, MessageCommand, SendArgs, Settings, StartFrom, TimeRange, TopicCommand,
    TopicConfigArgs,
};
use crate::output::{self, print_json};

/// How long `consume` pauses when a round over every queue found nothing.
const CONSUME_IDLE_PAUSE: Duration = Duration::from_millis(100);

/// Most messages `consume` asks one queue for at once.
const CONSUME_PULL_BATCH: u32 = 32;

/// Some brokers of a cluster-wide command did not answer: the output came from the others.
/// `main` exits with status 3 for it.
#[derive(Debug)]
pub struct PartialAnswer {
    pub failed: usize,
}

impl std::fmt::Display for PartialAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} broker(s) did not answer; the output is from the brokers that did",
            self.failed
        )
    }
}

impl std::error::Error for PartialAnswer {}

/// Prints each broker that failed (after the answers of the others) and turns failures into a
/// [`PartialAnswer`].
fn finish_partial(failures: &[BrokerFailure]) -> Result<()> {
    for failure in failures {
        eprintln!(
            "shardmq: broker {} did not answer: {}",
            failure.address, failure.error
        );
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(PartialAnswer {
            failed: failures.len(),
        }
        .into())
    }
}

/// The settings every command shares, from the global options, and the command to run.
pub fn settings(cli: Cli) -> Result<(Settings, Command)> {
    let credentials = match (&cli.access_key, &cli.secret_key, &cli.credentials_file) {
        (Some(access_key), Some(secret_key), _) => {
            Some(Credentials::new(access_key.as_str(), secret_key.as_str())?)
        }
        (_, _, Some(file)) => Some(Credentials::from_file(file)?),
        _ => Credentials::from_env()?,
    };
    let context = Settings {
        namesrv: cli.namesrv,
        is_json: cli.json,
        request_timeout: Duration::from_millis(cli.request_timeout_ms),
        credentials,
    };
    Ok((context, cli.command))
}

/// Runs every command but `console` (which `main` runs, as it is built on these).
pub async fn run(context: Settings, command: Command) -> Result<()> {
    match command {
        Command::Topic(command) => topic(&context, command).await,
        Command::Send(args) => send(&context, args).await,
        Command::Consume(args) => consume(&context, args).await,
        Command::Group(command) => group(&context, command).await,
        Command::Message(command) => message(&context, command).await,
        Command::Broker(command) => broker(&context, command).await,
        Command::Cluster(ClusterCommand::List) => cluster_list(&context).await,
        Command::Controller(ControllerCommand::Status { controller }) => {
            controller_status(&context, &controller).await
        }
        Command::Controller(ControllerCommand::AddMember {
            id,
            address,
            controller,
        }) => {
            let change = shardmq_client::MemberChange::Add { id, address };
            controller_membership(&context, &controller, &change).await
        }
        Command::Controller(ControllerCommand::RemoveMember { id, controller }) => {
            let change = shardmq_client::MemberChange::Remove { id };
            controller_membership(&context, &controller, &change).await
        }
        Command::Dlq(command) => crate::dlq::run(&context, command).await,
        Command::Acl(command) => crate::acl::run(&context, command),
        Command::Console(_) => bail!("the console is started by main, not as a command"),
    }
}

pub(crate) async fn admin(context: &Settings) -> Result<Admin> {
    Ok(Admin::builder()
        .namesrv(&context.namesrv)
        .request_timeout(context.request_timeout)
        .credentials_of(context)
        .build()
        .await?)
}

fn topic_config(args: &TopicConfigArgs) -> TopicConfig {
    TopicConfig {
        name: args.topic.clone(),
        read_queues: args.read_queues.unwrap_or(args.queues),
        write_queues: args.write_queues.unwrap_or(args.queues),
        perm: args.perm,
        is_ordered: args.ordered,
    }
}

async fn topic(context: &Settings, command: TopicCommand) -> Result<()> {
    let admin = admin(context).await?;
    match command {
        TopicCommand::Create(args) => upsert_topic(context, &admin, &args, true).await,
        TopicCommand::Update(args) => upsert_topic(context, &admin, &args, false).await,
        TopicCommand::Delete {
            topic,
            broker,
            force,
        } => {
            let brokers = delete_topic_on(&admin, &topic, broker.as_deref(), force).await?;
            if context.is_json {
                print_json(&json!({ "topic": topic, "deleted_on": brokers }));
            } else {
                println!("deleted topic {topic} on {}", brokers.join(", "));
            }
            Ok(())
        }
        TopicCommand::List { system } => {
            let mut topics = admin.topic_list().await?;
            if !system {
                topics.retain(|topic| !shardmq_client::system_topics::is_system_topic(topic));
            }
            if context.is_json {
                print_json(&json!({ "topics": topics }));
            } else {
                for topic in topics {
                    println!("{topic}");
                }
            }
            Ok(())
        }
        TopicCommand::Route { topic } => {
            let route = admin.route(&topic).await?;
            if context.is_json {
                print_json(&output::route_json(&route));
            } else {
                println!("{}", output::route_text(&route));
            }
            Ok(())
        }
        TopicCommand::Status { topic } => {
            let stats = admin.topic_stats(&topic).await?;
            if context.is_json {
                print_json(&output::stats_json(&topic, &stats));
            } else {
                println!("{}", output::stats_text(&stats));
            }
            Ok(())
        }
    }
}

/// Deletes `topic` on `broker`, or on every master broker hosting it; `force` for a group's
/// retry or dead-letter topic. Returns the brokers it was deleted on. (The CLI and the console.)
pub(crate) async fn delete_topic_on(
    admin: &Admin,
    topic: &str,
    broker: Option<&str>,
    force: bool,
) -> Result<Vec<String>> {
    Ok(match broker {
        _ if force => admin.delete_group_topic(broker, topic).await?,
        Some(address) => {
            admin.delete_topic(address, topic).await?;
            vec![address.to_owned()]
        }
        None => match admin.delete_topic_everywhere(topic).await {
            Err(shardmq_client::Error::TopicNotFound { .. }) => {
                bail!("topic {topic} does not exist: no name server routes it")
            }
            other => other?,
        },
    })
}

/// Creates (`is_create`) or updates the topic on `broker`, or else on every master broker of
/// `cluster` (of every cluster when `None`). (The CLI and the console.)
pub(crate) async fn upsert_topic_on(
    admin: &Admin,
    config: &TopicConfig,
    broker: Option<&str>,
    cluster: Option<&str>,
    is_create: bool,
) -> Result<Partial<Vec<String>>> {
    let brokers = match broker {
        Some(address) if is_create => {
            admin.create_topic(address, config).await?;
            vec![address.to_owned()]
        }
        Some(address) => {
            admin.update_topic(address, config).await?;
            vec![address.to_owned()]
        }
        None => {
            return Ok(admin
                .upsert_topic_in_cluster(cluster, config, is_create)
                .await?)
        }
    };
    Ok(Partial {
        value: brokers,
        failures: Vec::new(),
    })
}

async fn upsert_topic(
    context: &Settings,
    admin: &Admin,
    args: &TopicConfigArgs,
    is_create: bool,
) -> Result<()> {
    let config = topic_config(args);
    let done = upsert_topic_on(
        admin,
        &config,
        args.broker.as_deref(),
        args.cluster.as_deref(),
        is_create,
    )
    .await?;
    let (brokers, failures) = (done.value, done.failures);
    if context.is_json {
        print_json(&json!({
            "topic": output::topic_config_json(&config),
            "brokers": brokers,
        }));
    } else {
        println!(
            "{} topic {} on {}",
            if is_create { "created" } else { "updated" },
            output::topic_config_text(&config),
            brokers.join(", ")
        );
    }
    finish_partial(&failures)
}

/// Most bytes `--body-file` reads: the largest frame a broker accepts by default; a larger file
/// is refused before anything is sent.
const MAX_BODY_FILE_BYTES: u64 = 16 << 20;

/// The body of a `send`: `--body`, or the bytes of `--body-file` (`-`: standard input).
fn body_of(args: &SendArgs) -> Result<bytes::Bytes> {
    use std::io::Read;
    let Some(path) = &args.body_file else {
        return Ok(bytes::Bytes::from(args.body.clone().unwrap_or_default()));
    };
    let mut body = Vec::new();
    let source = if path.as_os_str() == "-" {
        "standard input".to_owned()
    } else {
        path.display().to_string()
    };
    let read = if path.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(MAX_BODY_FILE_BYTES + 1)
            .read_to_end(&mut body)
    } else {
        std::fs::File::open(path)
            .and_then(|file| file.take(MAX_BODY_FILE_BYTES + 1).read_to_end(&mut body))
    };
    read.with_context(|| format!("cannot read the body from {source}"))?;
    if body.len() as u64 > MAX_BODY_FILE_BYTES {
        bail!("the body in {source} is over {MAX_BODY_FILE_BYTES} bytes");
    }
    Ok(bytes::Bytes::from(body))
}

async fn send(context: &Settings, args: SendArgs) -> Result<()> {
    let body = body_of(&args)?;
    let producer = Producer::builder()
        .namesrv(&context.namesrv)
        .request_timeout(context.request_timeout)
        .credentials_of(context)
        .group(&args.group)
        .build()
        .await?;
    let mut properties = Vec::new();
    for property in &args.properties {
        let (name, value) = property
            .split_once('=')
            .with_context(|| format!("property `{property}` is not NAME=VALUE"))?;
        properties.push((name.to_owned(), value.to_owned()));
    }
    let deliver_at_ms = match &args.deliver_at {
        Some(text) => Some(output::parse_rfc3339_ms(text).with_context(|| {
            format!("--deliver-at `{text}` is not an RFC 3339 time like 2030-01-02T03:04:05Z")
        })?),
        None => None,
    };
    let outcome = send_all(context, &producer, &args, &body, &properties, deliver_at_ms).await;
    producer.shutdown().await;
    outcome
}

async fn send_all(
    context: &Settings,
    producer: &Producer,
    args: &SendArgs,
    body: &bytes::Bytes,
    properties: &[(String, String)],
    deliver_at_ms: Option<i64>,
) -> Result<()> {
    for _ in 0..args.count {
        let mut message = Message::new(&args.topic, body.clone());
        if let Some(tags) = &args.tags {
            message = message.with_tags(tags);
        }
        if let Some(keys) = &args.keys {
            message = message.with_keys_text(keys);
        }
        for (name, value) in properties {
            message = message.with_property(name, value);
        }
        if let Some(level) = args.delay_level {
            message = message.with_delay_level(level);
        }
        if let Some(delay_ms) = args.delay_ms {
            message = message.with_delay(Duration::from_millis(delay_ms));
        }
        if let Some(at_ms) = deliver_at_ms {
            message = message.with_deliver_at_ms(at_ms);
        }
        let result = match &args.order_key {
            Some(key) => producer.send_ordered(message, key).await?,
            None => producer.send(message).await?,
        };
        if context.is_json {
            print_json(&output::send_result_json(&result));
        } else {
            println!("{}", output::send_result_text(&result));
        }
    }
    Ok(())
}

async fn consume(context: &Settings, args: ConsumeArgs) -> Result<()> {
    let tags = match &args.sql {
        Some(sql) => TagExpression::sql(sql)?,
        None => TagExpression::parse(&args.tags)?,
    };
    let consumer = PullConsumer::builder()
        .namesrv(&context.namesrv)
        .request_timeout(context.request_timeout)
        .credentials_of(context)
        .group(&args.group)
        .build()
        .await?;
    let outcome = consume_until_done(context, &consumer, &args, tags).await;
    consumer.shutdown().await;
    let consumed = outcome?;
    if !context.is_json {
        eprintln!("consumed {consumed} message(s)");
    }
    Ok(())
}

/// Pulls every queue in turn until `count` messages are printed or the time is up; commits
/// the group's offset of each queue past what was printed. Returns how many were printed.
async fn consume_until_done(
    context: &Settings,
    consumer: &PullConsumer,
    args: &ConsumeArgs,
    tags: TagExpression,
) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_millis(args.timeout_ms);
    let queues = consumer.queues(&args.topic).await?;
    let mut positions: BTreeMap<MessageQueue, i64> = BTreeMap::new();
    for queue in &queues {
        let start = match consumer.committed_offset(queue).await? {
            Some(offset) => offset,
            None => {
                let (min, max) = consumer.queue_offsets(queue).await?;
                match args.from {
                    StartFrom::First => min,
                    StartFrom::Last => max,
                }
            }
        };
        positions.insert(queue.clone(), start);
    }
    let mut committed = positions.clone();
    let mut printed: u64 = 0;
    let wanted = args.count.unwrap_or(u64::MAX);
    while printed < wanted && Instant::now() < deadline {
        let mut found_any = false;
        for queue in &queues {
            if printed >= wanted || Instant::now() >= deadline {
                break;
            }
            let offset = positions[queue];
            let left = wanted - printed;
            let options = PullOptions {
                max_messages: u32::try_from(left)
                    .unwrap_or(u32::MAX)
                    .min(CONSUME_PULL_BATCH),
                max_bytes: 0,
                tags: tags.clone(),
                wait: Duration::ZERO,
            };
            let result = consumer.pull_with(queue, offset, &options).await?;
            let mut next = result.next_begin_offset;
            if result.status == PullStatus::Found {
                for message in &result.messages {
                    if printed >= wanted {
                        next = message.queue_offset;
                        break;
                    }
                    if context.is_json {
                        print_json(&output::message_json(message));
                    } else {
                        println!("{}", output::message_text(message));
                    }
                    printed += 1;
                    found_any = true;
                }
            }
            positions.insert(queue.clone(), next);
        }
        commit_moved(consumer, &positions, &mut committed).await?;
        if !found_any && printed < wanted {
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(left.min(CONSUME_IDLE_PAUSE)).await;
        }
    }
    commit_moved(consumer, &positions, &mut committed).await?;
    Ok(printed)
}

async fn commit_moved(
    consumer: &PullConsumer,
    positions: &BTreeMap<MessageQueue, i64>,
    committed: &mut BTreeMap<MessageQueue, i64>,
) -> Result<()> {
    for (queue, offset) in positions {
        if committed.get(queue) != Some(offset) {
            consumer
                .commit_offset(queue, *offset)
                .await
                .with_context(|| format!("committing offset {offset} of {queue}"))?;
            committed.insert(queue.clone(), *offset);
        }
    }
    Ok(())
}

async fn group(context: &Settings, command: GroupCommand) -> Result<()> {
    let admin = admin(context).await?;
    let mut failures = Vec::new();
    match command {
        GroupCommand::Members { group, topic } => {
            let members = admin.consumer_list(&group, &topic).await?;
            if context.is_json {
                print_json(&json!({ "group": group, "members": members }));
            } else {
                for member in members {
                    println!("{member}");
                }
            }
        }
        GroupCommand::Progress { group, topic } => {
            let (progress, failed) = match group_progress_of(&admin, &group, topic).await {
                Ok(done) => (done.value, done.failures),
                Err(error) => match error.downcast::<UnknownGroup>() {
                    Ok(unknown) => {
                        finish_partial(&unknown.failures)?;
                        return Err(unknown.into());
                    }
                    Err(error) => return Err(error),
                },
            };
            failures = failed;
            if context.is_json {
                print_json(&output::progress_json(&group, &progress));
            } else {
                println!("{}", output::progress_text(&progress));
            }
        }
        GroupCommand::List => {
            let partial = admin.group_list().await?;
            failures = partial.failures;
            let groups = partial.value;
            if context.is_json {
                print_json(&output::groups_json(&groups));
            } else {
                println!("{}", output::groups_text(&groups));
            }
        }
        GroupCommand::ResetOffset {
            group,
            topic_arg,
            topic,
            to,
            force,
        } => {
            let topic = topic_arg
                .or(topic)
                .context("name the topic: `group reset-offset GROUP TOPIC --to WHERE`")?;
            let target = parse_reset_target(&to)?;
            let resets = admin.reset_offset(&group, &topic, target, force).await?;
            if context.is_json {
                print_json(&output::resets_json(&group, &resets));
            } else {
                println!("{}", output::resets_text(&resets));
            }
        }
    }
    finish_partial(&failures)
}

/// No broker knows the group (when its topics were to be found from the brokers).
#[derive(Debug)]
pub(crate) struct UnknownGroup {
    pub group: String,
    /// Brokers that did not answer (one of them may know it).
    pub failures: Vec<BrokerFailure>,
}

impl std::fmt::Display for UnknownGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no broker knows group {}: no live members and no committed offsets",
            self.group
        )
    }
}

impl std::error::Error for UnknownGroup {}

/// `group`'s progress on every queue of `topic`, or (when `None`) of every topic the brokers
/// say it subscribes to or has offsets for ([`UnknownGroup`] when none knows it); brokers that
/// failed are listed once each. (The CLI and the console.)
pub(crate) async fn group_progress_of(
    admin: &Admin,
    group: &str,
    topic: Option<String>,
) -> Result<Partial<Vec<QueueProgress>>> {
    let mut failures = Vec::new();
    let topics = match topic {
        Some(topic) => vec![topic],
        None => {
            let groups = admin.group_list().await?;
            let known = groups
                .value
                .into_iter()
                .find(|summary| summary.group == group)
                .map(|summary| summary.topics);
            failures.extend(groups.failures);
            match known {
                Some(topics) => topics,
                None => {
                    return Err(UnknownGroup {
                        group: group.to_owned(),
                        failures,
                    }
                    .into())
                }
            }
        }
    };
    let mut progress = Vec::new();
    for topic in topics.iter().filter(|t| !t.starts_with("%RETRY%")) {
        let part = admin.group_progress(group, topic).await?;
        progress.extend(part.value);
        failures.extend(part.failures);
    }
    // One line per broker that failed, however many topics it failed for.
    let mut seen = std::collections::BTreeSet::new();
    failures.retain(|failure| seen.insert(failure.address.clone()));
    Ok(Partial {
        value: progress,
        failures,
    })
}

/// `first`, `last`, ms since the epoch, or an RFC 3339 time.
pub(crate) fn parse_reset_target(text: &str) -> Result<ResetTarget> {
    match text {
        "first" => Ok(ResetTarget::First),
        "last" => Ok(ResetTarget::Last),
        _ => match text.parse::<i64>() {
            Ok(ms) => Ok(ResetTarget::Timestamp(ms)),
            Err(_) => output::parse_rfc3339_ms(text)
                .map(ResetTarget::Timestamp)
                .with_context(|| {
                    format!(
                        "--to {text:?} is not first, last, ms since the epoch or an RFC 3339 time"
                    )
                }),
        },
    }
}

async fn message(context: &Settings, command: MessageCommand) -> Result<()> {
    let failures;
    let messages = match command {
        MessageCommand::Send(args) => return send(context, args).await,
        MessageCommand::Consume(args) => return consume(context, args).await,
        MessageCommand::Key {
            topic,
            key,
            max,
            range,
        } => {
            let (begin_ms, end_ms) = time_range(&range)?;
            let found = admin(context)
                .await?
                .query_by_key(&topic, &key, begin_ms, end_ms, max)
                .await?;
            failures = found.failures;
            found.value
        }
        MessageCommand::Id {
            msg_id,
            topic,
            range,
        } => {
            let (begin_ms, end_ms) = time_range(&range)?;
            let answer = admin(context)
                .await?
                .query_by_any_id(&msg_id, begin_ms, end_ms)
                .await?;
            failures = answer.failures;
            let found: Vec<_> = answer
                .value
                .into_iter()
                .filter(|m| topic.as_ref().is_none_or(|t| m.topic() == t))
                .collect();
            if found.is_empty() {
                finish_partial(&failures)?;
                match topic {
                    Some(topic) => bail!("no message of topic {topic} has id {msg_id}"),
                    None => bail!("no broker holds a message with id {msg_id}"),
                }
            }
            found
        }
    };
    for message in &messages {
        if context.is_json {
            print_json(&output::message_json(message));
        } else {
            println!("{}", output::message_text(message));
        }
    }
    finish_partial(&failures)
}

/// (begin, end) ms of a query's time range; 0 means "from the beginning" and "now".
pub(crate) fn time_range(range: &TimeRange) -> Result<(i64, i64)> {
    let parse = |text: &Option<String>, flag: &str| -> Result<i64> {
        match text {
            None => Ok(0),
            Some(text) => text
                .parse::<i64>()
                .ok()
                .or_else(|| output::parse_rfc3339_ms(text))
                .with_context(|| {
                    format!("--{flag} {text:?} is neither ms since the epoch nor an RFC 3339 time")
                }),
        }
    };
    Ok((parse(&range.begin, "begin")?, parse(&range.end, "end")?))
}

async fn broker(context: &Settings, command: BrokerCommand) -> Result<()> {
    let admin = admin(context).await?;
    match command {
        BrokerCommand::Status {
            broker,
            interval_ms,
        } => {
            let first = admin.broker_status(&broker).await?;
            let rates = if interval_ms > 0 {
                tokio::time::sleep(Duration::from_millis(interval_ms)).await;
                let second = admin.broker_status(&broker).await?;
                Some(output::StatusRates::between(&first, &second))
            } else {
                None
            };
            if context.is_json {
                print_json(&output::broker_status_json(&first, rates.as_ref()));
            } else {
                println!("{}", output::broker_status_text(&first, rates.as_ref()));
            }
        }
        BrokerCommand::Topics { broker, system } => {
            let topics = admin.broker_topics(&broker, system).await?;
            if context.is_json {
                let topics: Vec<_> = topics.iter().map(output::topic_config_json).collect();
                print_json(&json!({ "broker": broker, "topics": topics }));
            } else {
                for topic in &topics {
                    println!("{}", output::topic_config_text(topic));
                }
            }
        }
    }
    Ok(())
}

async fn controller_status(context: &Settings, addresses: &[String]) -> Result<()> {
    let admin = admin(context).await?;
    let mut last_error = None;
    for address in addresses {
        match admin.controller_status(address).await {
            Ok(status) => {
                if context.is_json {
                    print_json(&output::controller_status_json(&status));
                } else {
                    println!("{}", output::controller_status_text(&status));
                }
                return Ok(());
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error
        .map(anyhow::Error::from)
        .unwrap_or_else(|| anyhow::anyhow!("no controller address given")))
}

async fn controller_membership(
    context: &Settings,
    addresses: &[String],
    change: &shardmq_client::MemberChange,
) -> Result<()> {
    let admin = admin(context).await?;
    let mut last_error = None;
    for address in addresses {
        match admin.controller_membership(address, change).await {
            Ok(members) => {
                if context.is_json {
                    print_json(&serde_json::json!({ "members": members }));
                } else {
                    println!("members     {}", members.join(", "));
                }
                return Ok(());
            }
            // A refusal (a bad id, the last voter) is the answer; only an unreachable
            // controller is worth trying the next address for.
            Err(e @ shardmq_client::Error::InvalidArgument(_)) => return Err(e.into()),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error
        .map(anyhow::Error::from)
        .unwrap_or_else(|| anyhow::anyhow!("no controller address given")))
}

async fn cluster_list(context: &Settings) -> Result<()> {
    let clusters = admin(context).await?.cluster_info().await?;
    if context.is_json {
        print_json(&output::clusters_json(&clusters));
    } else {
        println!("{}", output::clusters_text(&clusters));
    }
    Ok(())
}
