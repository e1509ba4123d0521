//! Replay: the ingest dead-letter queue (or a list of objects) through the ingest path, safely.
//!
//! The ingest queue's redrive target (`IngestDLQ` in template.yaml) holds the original message
//! bodies: S3 notifications, SNS envelopes, EventBridge events ([`event::parse_message`] takes
//! every shape the ingest function takes, and a whole Lambda payload parked as one message).
//! [`Ingestor::replay_queue`] receives them ten at a time and hands each round to the function's
//! own path ([`Ingestor::ingest_deliveries`]: route, pinned read, the durable duplicate check,
//! decode ‖ write, quarantine, one commit per table with every member exactly once), so an
//! object already committed — by the function, a backfill or an earlier replay — is found and
//! skipped, never committed twice.
//!
//! A message is deleted only once the outcome of every object it names is known and durable:
//! committed, already committed, or quarantined (whole, or every record). Anything else leaves
//! it where it is, reported with its reason: a failure (transient: it becomes visible again after
//! the visibility timeout; permanent, e.g. over an input limit: it stays for a fix), a message
//! that cannot be understood, one that names no object, an object that is no longer there or that
//! no route covers. A message is handled at most once per run (one seen again, after its
//! visibility ran out, is not looped over).
//!
//! An object whose ingest failed may still have been committed (a lost commit answer:
//! `CommitUnknown`, or a crash after the swap). Its message is deleted only if a re-read of the
//! table — the ingest path's own duplicate check — finds the object committed; if the re-read
//! fails or finds nothing, the message stays and the next replay decides.
//!
//! [`Ingestor::replay_objects`] does the same for `s3://bucket/key[#version]` lines (what the
//! table's `_source` column records), without messages to delete. With `dry_run` nothing is
//! ingested or deleted: each object is looked up (committed already, or would be replayed) and
//! the received messages are made visible again.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;

use super::{dedup, source_object, DeliveryOutcome, Ingestor, ObjectReport, Status};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::event::{self, Delivery, ObjectRef};
use crate::store::Version;

/// One received message.
#[derive(Debug, Clone)]
pub struct QueuedMessage {
    /// The queue's message id (the same on every receive of the message).
    pub id: String,
    /// The handle of this receive (deletes and visibility changes name it).
    pub receipt: String,
    /// The body.
    pub body: String,
}

/// The queue a replay drains: receive, delete, make visible again.
#[async_trait]
pub trait MessageQueue: Send + Sync {
    /// Up to `max` (at most 10) messages, hidden from other readers for `visibility`; waits up
    /// to `wait` for the first one (long polling).
    async fn receive(
        &self,
        max: usize,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Vec<QueuedMessage>>;
    /// Deletes a received message.
    async fn delete(&self, message: &QueuedMessage) -> Result<()>;
    /// Makes a received message visible again at once.
    async fn release(&self, message: &QueuedMessage) -> Result<()>;
}

/// An SQS queue.
#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl SqsQueue {
    /// The queue at `url`, through an SQS client with the config's region and keys whose
    /// endpoint is the URL's origin (`https://sqs.<region>.amazonaws.com`, or an emulator's).
    pub async fn connect(config: &Config, url: &str) -> Result<Self> {
        let endpoint = queue_endpoint(url)?;
        let sdk = crate::store::sdk_config(&config.storage, Some(&endpoint)).await;
        Ok(Self::new(aws_sdk_sqs::Client::new(&sdk), url))
    }

    /// Wraps a client.
    pub fn new(client: aws_sdk_sqs::Client, url: &str) -> Self {
        Self {
            client,
            url: url.to_string(),
        }
    }
}

/// The scheme, host and port of a queue URL.
fn queue_endpoint(url: &str) -> Result<String> {
    let parsed = url::Url::parse(url).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            format!(
                "`{url}` is not a queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>)"
            ),
        )
        .with_source(e)
    })?;
    match (parsed.scheme(), parsed.host_str()) {
        ("http" | "https", Some(host)) if parsed.path().len() > 1 => Ok(match parsed.port() {
            Some(port) => format!("{}://{host}:{port}", parsed.scheme()),
            None => format!("{}://{host}", parsed.scheme()),
        }),
        _ => Err(Error::new(
            ErrorKind::Config,
            format!(
                "`{url}` is not a queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>)"
            ),
        )),
    }
}

fn sqs_error<E, R>(what: String, err: aws_sdk_sqs::error::SdkError<E, R>) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    // A service error (no such queue, access denied) does not go away by retrying; transport
    // failures and timeouts may.
    let retryable = !matches!(err, aws_sdk_sqs::error::SdkError::ServiceError(_));
    Error::new(
        ErrorKind::Storage,
        format!("{what}: {}", aws_sdk_sqs::error::DisplayErrorContext(&err)),
    )
    .with_retryable(retryable)
}

#[async_trait]
impl MessageQueue for SqsQueue {
    async fn receive(
        &self,
        max: usize,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Vec<QueuedMessage>> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .visibility_timeout(visibility.as_secs().clamp(1, 43_200) as i32)
            .wait_time_seconds(wait.as_secs().min(20) as i32)
            .send()
            .await
            .map_err(|e| sqs_error(format!("receiving from {}", self.url), e))?;
        Ok(out
            .messages()
            .iter()
            .filter_map(|m| {
                Some(QueuedMessage {
                    id: m.message_id()?.to_string(),
                    receipt: m.receipt_handle()?.to_string(),
                    body: m.body().unwrap_or_default().to_string(),
                })
            })
            .collect())
    }

    async fn delete(&self, message: &QueuedMessage) -> Result<()> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(&message.receipt)
            .send()
            .await
            .map_err(|e| sqs_error(format!("deleting message {}", message.id), e))?;
        Ok(())
    }

    async fn release(&self, message: &QueuedMessage) -> Result<()> {
        self.client
            .change_message_visibility()
            .queue_url(&self.url)
            .receipt_handle(&message.receipt)
            .visibility_timeout(0)
            .send()
            .await
            .map_err(|e| sqs_error(format!("releasing message {}", message.id), e))?;
        Ok(())
    }
}

/// How a replay runs.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// At most this many messages (queue) or lines (objects).
    pub max: Option<usize>,
    /// Look up and report only: nothing ingested, nothing deleted.
    pub dry_run: bool,
    /// How long a received message stays hidden: longer than a round takes; a message left
    /// (failed) becomes visible again after it.
    pub visibility_timeout: Duration,
    /// Long polling: how long a receive waits for a message (SQS samples servers without it,
    /// and an empty answer ends the run).
    pub wait: Duration,
    /// Objects per round for object lists (one commit per table each).
    pub batch: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            max: None,
            dry_run: false,
            visibility_timeout: Duration::from_secs(1800),
            wait: Duration::from_secs(2),
            batch: 50,
        }
    }
}

/// What became of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Committed by this replay.
    Replayed,
    /// In the table already (an earlier delivery, backfill or replay; or this replay's own
    /// commit whose answer was lost, found by the re-read).
    AlreadyCommitted,
    /// Quarantined: unreadable or refused by a `fail` check (whole), or every record bad.
    Quarantined,
    /// Not ingested and never will be as things are: no route covers it, it is gone, or it was
    /// overwritten since (its message stays).
    Skipped,
    /// Failed; `retryable` says whether trying again can help (its message stays).
    Failed,
    /// Dry run: not in the table, would be ingested.
    WouldReplay,
}

impl Outcome {
    /// Settled for good: the message may go.
    fn durable(self) -> bool {
        matches!(
            self,
            Outcome::Replayed | Outcome::AlreadyCommitted | Outcome::Quarantined
        )
    }
}

/// One object of a replay.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayedObject {
    /// `s3://bucket/key`.
    pub object: String,
    /// The version id or ETag the message or line named.
    pub version: Option<String>,
    /// Its table (empty when no route covers it).
    pub table: String,
    /// What became of it.
    pub outcome: Outcome,
    /// The ingest path's status, when it reported one.
    pub status: Option<Status>,
    /// The snapshot holding its rows.
    pub snapshot_id: Option<i64>,
    /// Records committed by this replay.
    pub records_committed: u64,
    /// Records quarantined by this replay.
    pub records_quarantined: u64,
    /// The quarantine object.
    pub quarantine: Option<String>,
    /// Why (quarantined, skipped, failed, or found committed after a failure).
    pub reason: Option<String>,
    /// For failures: whether a retry can help.
    pub retryable: Option<bool>,
}

impl ReplayedObject {
    fn new(obj: &ObjectRef, table: &str, outcome: Outcome) -> Self {
        Self {
            object: obj.uri(),
            version: obj.version_id.clone().or_else(|| obj.etag.clone()),
            table: table.to_string(),
            outcome,
            status: None,
            snapshot_id: None,
            records_committed: 0,
            records_quarantined: 0,
            quarantine: None,
            reason: None,
            retryable: None,
        }
    }

    fn from_report(obj: &ObjectRef, r: ObjectReport) -> Self {
        let outcome = match r.status {
            Status::Committed => Outcome::Replayed,
            Status::Duplicate => Outcome::AlreadyCommitted,
            Status::AllQuarantined | Status::Unreadable | Status::ContractFailed => {
                Outcome::Quarantined
            }
            Status::Unrouted | Status::Missing | Status::Superseded => Outcome::Skipped,
        };
        let mut o = Self::new(obj, &r.table, outcome);
        o.status = Some(r.status);
        o.snapshot_id = r.snapshot_id;
        o.records_committed = r.records_committed;
        o.records_quarantined = r.records_quarantined;
        o.quarantine = r.quarantine;
        o.reason = r.reason;
        o
    }

    fn failed(obj: &ObjectRef, reason: String, retryable: bool) -> Self {
        let mut o = Self::new(obj, "", Outcome::Failed);
        o.reason = Some(reason);
        o.retryable = Some(retryable);
        o
    }
}

/// What the replay did with a message (or a line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Every object settled: the message was deleted.
    Deleted,
    /// The message stays in the queue (`reason` says why).
    Left,
    /// Nothing to delete: a dry run (the message was made visible again), or a line of an
    /// object list.
    Kept,
}

/// One message, or one line of an object list.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayItem {
    /// The message id (queue replays).
    pub message_id: Option<String>,
    /// The line number (object lists).
    pub line: Option<usize>,
    /// Its objects.
    pub objects: Vec<ReplayedObject>,
    /// What was done with the message.
    pub action: Action,
    /// Why the message stays, or why it could not be understood.
    pub reason: Option<String>,
    /// The message (or line) could not be understood: it names no object.
    pub unparsed: bool,
}

/// The result of a replay. Objects: `objects` = `replayed` + `already_committed` +
/// `quarantined` + `skipped` + `failed` + `would_replay`; messages: `messages` = `deleted` +
/// `left` (+ the messages of a dry run, all kept).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    /// A dry run (nothing ingested or deleted).
    pub dry_run: bool,
    /// Messages handled (queue replays), or lines (object lists).
    pub messages: u64,
    /// Messages deleted.
    pub deleted: u64,
    /// Messages left in the queue.
    pub left: u64,
    /// Messages or lines that could not be understood (left).
    pub unparsed: u64,
    /// Objects named.
    pub objects: u64,
    /// Objects committed by this run.
    pub replayed: u64,
    /// Objects in the table already.
    pub already_committed: u64,
    /// Objects quarantined.
    pub quarantined: u64,
    /// Objects not ingested (unrouted, gone, superseded).
    pub skipped: u64,
    /// Objects that failed.
    pub failed: u64,
    /// Dry run: objects that would be ingested.
    pub would_replay: u64,
    /// Records committed.
    pub records_committed: u64,
    /// Records quarantined.
    pub records_quarantined: u64,
    /// New snapshots.
    pub commits: u64,
    /// Wall time.
    pub seconds: f64,
    /// Per message or line.
    pub items: Vec<ReplayItem>,
    /// Errors of the run itself (a receive that failed midway ends the run).
    pub errors: Vec<String>,
}

impl ReplayReport {
    fn add(&mut self, item: ReplayItem, commits: &mut HashSet<(String, i64)>) {
        self.messages += 1;
        self.unparsed += u64::from(item.unparsed);
        match item.action {
            Action::Deleted => self.deleted += 1,
            Action::Left => self.left += 1,
            Action::Kept => {}
        }
        for o in &item.objects {
            self.objects += 1;
            self.records_committed += o.records_committed;
            self.records_quarantined += o.records_quarantined;
            match o.outcome {
                Outcome::Replayed => {
                    self.replayed += 1;
                    if let Some(s) = o.snapshot_id {
                        commits.insert((o.table.clone(), s));
                    }
                }
                Outcome::AlreadyCommitted => self.already_committed += 1,
                Outcome::Quarantined => self.quarantined += 1,
                Outcome::Skipped => self.skipped += 1,
                Outcome::Failed => self.failed += 1,
                Outcome::WouldReplay => self.would_replay += 1,
            }
        }
        self.items.push(item);
    }

    /// Whether everything named was settled (nothing failed, skipped, left or unparsed).
    pub fn settled(&self) -> bool {
        self.left == 0 && self.failed == 0 && self.skipped == 0 && self.unparsed == 0
    }
}

/// What the table says about one object, without ingesting it.
enum Lookup {
    /// Committed to `table`, in `snapshot`.
    Committed { table: String, snapshot: i64 },
    /// Not in its table.
    Absent(String),
    /// Unrouted, gone or superseded: the report says which.
    Refused(Box<ObjectReport>),
}

/// Why an item's message cannot go, if it cannot.
fn unsettled(item: &ReplayItem) -> Option<String> {
    if let Some(reason) = &item.reason {
        return Some(reason.clone());
    }
    if item.objects.is_empty() {
        return Some(
            "the message names no object to ingest (a test event, or no ObjectCreated record)"
                .into(),
        );
    }
    item.objects
        .iter()
        .find(|o| !o.outcome.durable())
        .map(|o| match o.outcome {
            Outcome::Failed => format!(
                "{} failed ({}): {}",
                o.object,
                if o.retryable == Some(true) {
                    "transient"
                } else {
                    "permanent"
                },
                o.reason.as_deref().unwrap_or("")
            ),
            _ => format!(
                "{} not ingested: {}",
                o.object,
                o.reason.as_deref().unwrap_or("")
            ),
        })
}

/// An object and the version (id or ETag) a line names, if any.
pub type NamedObject = (ObjectRef, Option<String>);

/// One line of an object list: `s3://bucket/key[#version]`, where the version is what the
/// table's `_source` records (the version id on a versioned bucket, else the ETag). The last
/// `#` separates the version, so a key holding `#` is written with its version, or with a
/// trailing `#` for the current content.
pub fn parse_object_line(line: &str) -> Result<NamedObject> {
    let bad = || {
        Error::new(
            ErrorKind::Event,
            format!("`{line}`: expected s3://bucket/key[#version]"),
        )
    };
    let rest = line.trim().strip_prefix("s3://").ok_or_else(bad)?;
    let (bucket, named) = rest.split_once('/').ok_or_else(bad)?;
    let (key, version) = match named.rsplit_once('#') {
        Some((key, version)) => (key, Some(version).filter(|v| !v.is_empty())),
        None => (named, None),
    };
    if bucket.is_empty() || key.is_empty() {
        return Err(bad());
    }
    Ok((ObjectRef::new(bucket, key), version.map(str::to_string)))
}

impl Ingestor {
    /// Replays the messages of `queue` (the ingest DLQ) through the ingest path: every object
    /// exactly once, a message deleted only when every object it names is settled for good.
    /// Fails only when the first receive fails.
    pub async fn replay_queue(
        &self,
        queue: &dyn MessageQueue,
        options: &ReplayOptions,
    ) -> Result<ReplayReport> {
        let started = Instant::now();
        let mut report = ReplayReport {
            dry_run: options.dry_run,
            ..Default::default()
        };
        let mut commits = HashSet::new();
        let mut seen = HashSet::new();
        let mut held = Vec::new();
        let max = options.max.unwrap_or(usize::MAX);
        while seen.len() < max {
            let want = (max - seen.len()).min(10);
            let received = match queue
                .receive(want, options.visibility_timeout, options.wait)
                .await
            {
                Ok(r) => r,
                Err(e) if seen.is_empty() => return Err(e),
                Err(e) => {
                    report
                        .errors
                        .push(format!("receiving stopped the run: {e}"));
                    break;
                }
            };
            // A message seen again (its visibility ran out during the run) is not looped over.
            let fresh: Vec<QueuedMessage> = received
                .into_iter()
                .filter(|m| seen.insert(m.id.clone()))
                .collect();
            if fresh.is_empty() {
                break;
            }
            let deliveries: Vec<Delivery> = fresh
                .iter()
                .map(|m| Delivery {
                    message_id: Some(m.id.clone()),
                    objects: event::parse_message(&m.body),
                })
                .collect();
            let items = Box::pin(self.replay_round(deliveries, options.dry_run)).await;
            for (m, mut item) in fresh.into_iter().zip(items) {
                if options.dry_run {
                    item.action = Action::Kept;
                    held.push(m);
                } else if let Some(reason) = unsettled(&item) {
                    item.action = Action::Left;
                    item.reason = Some(reason);
                } else {
                    match queue.delete(&m).await {
                        Ok(()) => item.action = Action::Deleted,
                        Err(e) => {
                            // Settled all the same: the message comes back and is found
                            // committed (or quarantined again, at the same key).
                            item.action = Action::Left;
                            item.reason = Some(format!(
                                "settled, but deleting the message failed (a later replay finds it settled): {e}"
                            ));
                        }
                    }
                }
                if item.action == Action::Left {
                    tracing::info!(message = ?item.message_id, reason = ?item.reason, "message left in the queue");
                }
                report.add(item, &mut commits);
            }
        }
        for m in &held {
            if let Err(e) = queue.release(m).await {
                report.errors.push(e.to_string());
            }
        }
        report.commits = commits.len() as u64;
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Replays the objects named by `lines` (`s3://bucket/key[#version]` each; blank lines and
    /// lines starting with `#` are ignored) in rounds of `options.batch`.
    pub async fn replay_objects(&self, lines: &str, options: &ReplayOptions) -> ReplayReport {
        let started = Instant::now();
        let mut report = ReplayReport {
            dry_run: options.dry_run,
            ..Default::default()
        };
        let mut commits = HashSet::new();
        let named: Vec<(usize, Result<NamedObject>)> = lines
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .take(options.max.unwrap_or(usize::MAX))
            .map(|(i, l)| (i + 1, parse_object_line(l)))
            .collect();
        for round in named.chunks(options.batch.max(1)) {
            // A line whose version could not be told (the read failed) fails on its own; the
            // others go through the round.
            let mut deliveries = Vec::with_capacity(round.len());
            let mut failed = Vec::with_capacity(round.len());
            for (_, line) in round {
                let objects = match line {
                    Ok((obj, version)) => match self.resolve(obj.clone(), version.clone()).await {
                        Ok(o) => Ok(vec![o]),
                        Err(e) => {
                            failed.push(Some(ReplayItem {
                                message_id: None,
                                line: None,
                                objects: vec![ReplayedObject::failed(
                                    obj,
                                    format!("telling which version the line names: {e}"),
                                    e.is_retryable(),
                                )],
                                action: Action::Kept,
                                reason: None,
                                unparsed: false,
                            }));
                            continue;
                        }
                    },
                    Err(e) => Err(Error::new(e.kind(), e.message())),
                };
                failed.push(None);
                deliveries.push(Delivery {
                    message_id: None,
                    objects,
                });
            }
            let mut items = Box::pin(self.replay_round(deliveries, options.dry_run))
                .await
                .into_iter();
            for ((line, _), failed) in round.iter().zip(failed) {
                let Some(mut item) = failed.or_else(|| items.next()) else {
                    break;
                };
                item.line = Some(*line);
                item.action = Action::Kept;
                report.add(item, &mut commits);
            }
        }
        report.commits = commits.len() as u64;
        report.seconds = started.elapsed().as_secs_f64();
        report
    }

    /// One round: the deliveries' objects ingested together (or, in a dry run, looked up), each
    /// settled. One item per delivery, in order.
    async fn replay_round(&self, deliveries: Vec<Delivery>, dry_run: bool) -> Vec<ReplayItem> {
        if dry_run {
            let mut items = Vec::with_capacity(deliveries.len());
            for d in deliveries {
                let mut item = ReplayItem {
                    message_id: d.message_id,
                    line: None,
                    objects: Vec::new(),
                    action: Action::Kept,
                    reason: None,
                    unparsed: false,
                };
                match d.objects {
                    Err(e) => {
                        item.reason = Some(format!("cannot be understood: {e}"));
                        item.unparsed = true;
                    }
                    Ok(objs) => {
                        for obj in &objs {
                            item.objects.push(self.dry_run_object(obj).await);
                        }
                    }
                }
                items.push(item);
            }
            return items;
        }
        // The window a Lambda invocation's commit would have (as a backfill batch gets).
        let window =
            Duration::from_secs(self.config.ingest.commit_timeout_seconds.saturating_mul(2) + 600);
        let outcomes: Vec<DeliveryOutcome> =
            Box::pin(self.ingest_deliveries(deliveries, Instant::now() + window)).await;
        let mut items = Vec::with_capacity(outcomes.len());
        for d in outcomes {
            let mut item = ReplayItem {
                message_id: d.message_id,
                line: None,
                objects: Vec::with_capacity(d.objects.len()),
                action: Action::Left,
                unparsed: d.unparsed.is_some(),
                reason: d.unparsed.map(|e| format!("cannot be understood: {e}")),
            };
            for (obj, outcome) in d.objects {
                item.objects.push(match outcome {
                    Ok(r) => ReplayedObject::from_report(&obj, r),
                    Err(e) => self.after_failure(&obj, e).await,
                });
            }
            items.push(item);
        }
        items
    }

    /// An object whose ingest failed: its commit may have landed all the same (a lost answer,
    /// a crash after the swap). Only a re-read that finds it committed settles it.
    async fn after_failure(&self, obj: &ObjectRef, e: Error) -> ReplayedObject {
        tracing::warn!(object = %obj.uri(), error = %e, retryable = e.is_retryable(), "replay: ingest failed; re-reading the table");
        match self.lookup(obj).await {
            Ok(Lookup::Committed { table, snapshot }) => {
                let mut o = ReplayedObject::new(obj, &table, Outcome::AlreadyCommitted);
                o.snapshot_id = Some(snapshot);
                o.reason = Some(format!(
                    "the ingest failed ({e}), but the table holds the object (snapshot {snapshot})"
                ));
                o
            }
            Ok(_) => ReplayedObject::failed(obj, e.to_string(), e.is_retryable()),
            Err(again) => ReplayedObject::failed(
                obj,
                format!("{e}; re-reading the table to settle it failed too: {again}"),
                true,
            ),
        }
    }

    /// A dry run's answer for one object.
    async fn dry_run_object(&self, obj: &ObjectRef) -> ReplayedObject {
        match self.lookup(obj).await {
            Ok(Lookup::Committed { table, snapshot }) => {
                let mut o = ReplayedObject::new(obj, &table, Outcome::AlreadyCommitted);
                o.snapshot_id = Some(snapshot);
                o
            }
            Ok(Lookup::Absent(table)) => ReplayedObject::new(obj, &table, Outcome::WouldReplay),
            Ok(Lookup::Refused(r)) => ReplayedObject::from_report(obj, *r),
            Err(e) => ReplayedObject::failed(obj, e.to_string(), e.is_retryable()),
        }
    }

    /// Whether `obj` (the version it names) is in its table, by the ingest path's own
    /// duplicate check: route, open the named version (for its identity and age), then the
    /// bounded summary walk, or the rows' `_source` beyond expired history.
    async fn lookup(&self, obj: &ObjectRef) -> Result<Lookup> {
        let (route, tctx) = match self.route(obj)? {
            Ok(routed) => routed,
            Err(refused) => return Ok(Lookup::Refused(Box::new(refused))),
        };
        let opened = match self.open_named(obj, &route).await? {
            Ok(opened) => opened,
            Err(gone) => return Ok(Lookup::Refused(Box::new(gone))),
        };
        let source = source_object(obj, &opened.meta);
        drop(opened);
        let table = self.committer.load(&tctx.ident).await?;
        let skew_ms = (self.config.ingest.dedup_skew_seconds * 1000) as i64;
        Ok(match dedup::check(&table, &source, skew_ms).await? {
            Ok(found) => Lookup::Committed {
                table: route.table,
                snapshot: found.snapshot_id,
            },
            Err(_) => Lookup::Absent(route.table),
        })
    }

    /// The object a line names: `version` is a version id or an ETag (whichever `_source`
    /// recorded); which one is read from the object. Anything it cannot tell (the object is
    /// gone, or it was overwritten on an unversioned bucket) is left to the ingest path, which
    /// reports it. A read that failed otherwise (a timeout, a 5xx) tells nothing: the line fails
    /// with that error (retryable as it is) instead of being guessed into an ETag, which made a
    /// version id read as a changed ETag and the object reported superseded.
    async fn resolve(&self, mut obj: ObjectRef, version: Option<String>) -> Result<ObjectRef> {
        let Some(v) = version else {
            return Ok(obj);
        };
        match self
            .store
            .open(&obj.bucket, &obj.key, &Version::latest())
            .await
        {
            Ok(o) if o.meta.version_id.as_deref() == Some(v.as_str()) => obj.version_id = Some(v),
            Ok(o) if o.meta.etag == v => obj.etag = Some(v),
            // A versioned bucket: an older version.
            Ok(o) if o.meta.version_id.is_some() => obj.version_id = Some(v),
            Ok(_) => obj.etag = Some(v),
            Err(e) if e.kind() == ErrorKind::NotFound => obj.etag = Some(v),
            Err(e) => return Err(e),
        }
        Ok(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_lines_name_bucket_key_and_version() {
        let (o, v) = parse_object_line("s3://data/landing/a b.jsonl").unwrap();
        assert_eq!(
            (o.bucket.as_str(), o.key.as_str(), v),
            ("data", "landing/a b.jsonl", None)
        );
        let (o, v) =
            parse_object_line("  s3://data/k.jsonl#9b2cf535f27731c974343645a3985328 ").unwrap();
        assert_eq!(o.key, "k.jsonl");
        assert_eq!(v.as_deref(), Some("9b2cf535f27731c974343645a3985328"));
        // The last `#` separates the version; a trailing `#` means the current content.
        let (o, v) = parse_object_line("s3://data/a#b.jsonl#v1").unwrap();
        assert_eq!((o.key.as_str(), v.as_deref()), ("a#b.jsonl", Some("v1")));
        let (o, v) = parse_object_line("s3://data/a#b.jsonl#").unwrap();
        assert_eq!((o.key.as_str(), v), ("a#b.jsonl", None));
        for bad in [
            "data/k",
            "s3://data",
            "s3://data/",
            "s3:///k",
            "s3://data/#v",
        ] {
            let e = parse_object_line(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Event, "{bad}");
        }
    }

    #[test]
    fn the_endpoint_is_the_queue_urls_origin() {
        assert_eq!(
            queue_endpoint("https://sqs.eu-west-1.amazonaws.com/123456789012/floe-IngestDLQ-x")
                .unwrap(),
            "https://sqs.eu-west-1.amazonaws.com"
        );
        assert_eq!(
            queue_endpoint("http://127.0.0.1:5000/123456789012/dlq").unwrap(),
            "http://127.0.0.1:5000"
        );
        for bad in [
            "dlq",
            "arn:aws:sqs:us-east-1:1:dlq",
            "https://sqs.amazonaws.com",
        ] {
            assert!(queue_endpoint(bad).is_err(), "{bad}");
        }
    }

    fn object(outcome: Outcome, retryable: Option<bool>) -> ReplayedObject {
        let mut o = ReplayedObject::new(&ObjectRef::new("b", "k"), "orders", outcome);
        o.retryable = retryable;
        o.reason = Some("why".into());
        o
    }

    fn item(objects: Vec<ReplayedObject>, reason: Option<&str>) -> ReplayItem {
        ReplayItem {
            message_id: Some("m".into()),
            line: None,
            objects,
            action: Action::Left,
            reason: reason.map(str::to_string),
            unparsed: false,
        }
    }

    #[test]
    fn a_message_goes_only_when_every_object_is_settled_for_good() {
        use Outcome::*;
        assert_eq!(unsettled(&item(vec![object(Replayed, None)], None)), None);
        assert_eq!(
            unsettled(&item(
                vec![object(AlreadyCommitted, None), object(Quarantined, None)],
                None
            )),
            None
        );
        let e = unsettled(&item(
            vec![object(Replayed, None), object(Failed, Some(true))],
            None,
        ))
        .unwrap();
        assert!(e.contains("transient"), "{e}");
        let e = unsettled(&item(vec![object(Failed, Some(false))], None)).unwrap();
        assert!(e.contains("permanent"), "{e}");
        assert!(unsettled(&item(vec![object(Skipped, None)], None)).is_some());
        assert!(unsettled(&item(vec![object(WouldReplay, None)], None)).is_some());
        assert!(unsettled(&item(vec![], None))
            .unwrap()
            .contains("names no object"));
        assert!(unsettled(&item(vec![], Some("cannot be understood"))).is_some());
    }
}
