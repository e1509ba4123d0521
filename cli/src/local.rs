//! `floe local`: the deployed topology on moto_server (127.0.0.1), for trying floe by hand, and
//! the stack `floe bench --freshness` drives.
//!
//! Landing bucket → S3 notification → SQS queue → ingest workers (each its own `Ingestor`, like
//! the Lambda's concurrent containers; the function's code path, with SQS partial-batch
//! semantics: failed messages stay on the queue and come back; a batch is what one long poll
//! returns plus what arrives within the batching window, as Lambda's SQS poller does); ingest
//! commit events → EventBridge bus → rule → SQS → the process worker, which takes the events
//! waiting (up to a batch) and hands them to the process function's handler as an SQS batch:
//! each pipeline they name runs once (one run covers every commit since its checkpoint), and
//! the messages are deleted once the runs settled, except those whose pipeline failed
//! retryably (partial batch responses); plus a 60 s poll (the deployed `rate()` fallback); the process
//! handler's sink commits go to the same bus, so a pipeline whose source is another's sink runs
//! next; a timer → the maintain handler (the schedule). Drop files with any S3 client and watch `floe status`.

use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName};
use floe::config::Config;
use floe::ingest::Ingestor;
use floe::maintain::Maintainer;
use floe::process::Processor;
use serde_json::json;
use tokio::sync::watch;

pub(crate) const BUCKET: &str = "floe-local";
const QUEUE: &str = "floe-ingest";
const PROCESS_QUEUE: &str = "floe-process";
const BUS: &str = "floe-local";
/// Commit events per process invocation (template.yaml's FloeCommit `BatchSize`).
const PROCESS_BATCH: usize = 10;

/// The sample pipelines; `recompute`: the aggregate with `merge = false` (bench, before/after).
pub(crate) fn sample_pipelines(recompute: bool) -> String {
    let p = floe::sample::PIPELINES_TOML.to_string();
    if recompute {
        p.replace(
            "mode = \"aggregate\"",
            "mode = \"aggregate\"\nmerge = false",
        )
    } else {
        p
    }
}

/// How the stack's config departs from the sample, for before/after benchmarks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Variant {
    /// The aggregate with `merge = false` (windows recomputed, as before #14's merge).
    pub(crate) recompute: bool,
    /// The process function as before its rounds ran side by side: no file cache
    /// (`cache_mb = 0`) and one pipeline at a time (`concurrent_pipelines = 1`).
    pub(crate) sequential: bool,
    /// No short snapshot history (the benchmark, which traces objects through the tables'
    /// snapshots after the run).
    pub(crate) full_history: bool,
}

/// The local stack's hot tables keep 16 minutes of snapshots, as infra/floe.toml's (README
/// "Maintenance": at 10 objects/s each takes several commits a second, and every commit
/// re-reads and re-writes a metadata.json that grows by a snapshot entry each).
const SHORT_HISTORY: &str = "
[maintain]
history_minutes = { orders = 16, suspicious_orders = 16, revenue_per_region_minute = 16 }
";

fn config_text(endpoint: &str, dir: &str, variant: Variant) -> String {
    let (cache, process) = if variant.sequential {
        ("cache_mb = 0\n", "\n[process]\nconcurrent_pipelines = 1\n")
    } else {
        ("", "")
    };
    let history = if variant.full_history {
        ""
    } else {
        SHORT_HISTORY
    };
    format!(
        r#"# floe local stack (written by `floe local`)
[catalog]
kind = "sqlite"
uri = "{dir}/catalog.db"
warehouse = "s3://{BUCKET}/warehouse"
namespace = "local"

[storage]
endpoint = "{endpoint}"
region = "us-east-1"
path_style = true
access_key_id = "test"
secret_access_key = "test"
{cache}
[events]
bus = "{BUS}"
endpoint = "{endpoint}"

[[routes]]
bucket = "{BUCKET}"
prefix = "landing/orders/"
table = "orders"
format = "jsonl"

[[routes]]
bucket = "{BUCKET}"
prefix = "landing/orders-csv/"
table = "orders"
format = "csv"
{process}{history}{tables}{pipelines}"#,
        tables = floe::sample::ORDERS_TABLE_TOML,
        pipelines = sample_pipelines(variant.recompute)
    )
}

struct Moto(Option<Child>);

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How the stack's workers receive and batch, as template.yaml configures the functions.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    /// Ingest invocations at once (each worker is one container with its own `Ingestor`).
    pub(crate) ingest_concurrency: usize,
    /// Process invocations at once on the commit-event queue (each worker one container with
    /// its own `Processor`; the first also runs the poll).
    pub(crate) process_concurrency: usize,
    /// Most messages per ingest invocation (the SQS event source's `BatchSize`, ≤ 10 here).
    pub(crate) batch_size: i32,
    /// How long a batch may wait to fill once its first message is in
    /// (`MaximumBatchingWindowInSeconds`; zero: what one receive returned).
    pub(crate) batch_window: Duration,
    /// The poll fallback: every pipeline runs this often whatever the events say.
    pub(crate) poll_every: Duration,
    /// Maintenance every so often (none: never).
    pub(crate) maintain_every: Option<Duration>,
    /// Print each invocation's reports (`floe local`), or stay quiet (the benchmark).
    pub(crate) verbose: bool,
}

impl Default for Shape {
    /// template.yaml's settings (see README "Deployed shape").
    fn default() -> Self {
        Self {
            ingest_concurrency: 2,
            process_concurrency: 1,
            batch_size: 10,
            batch_window: Duration::ZERO,
            poll_every: Duration::from_secs(60),
            maintain_every: Some(Duration::from_secs(600)),
            verbose: true,
        }
    }
}

/// Wall-clock milliseconds since the epoch (the clock S3, SQS and snapshots are stamped with).
pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// One landing object as an ingest worker saw it.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    /// `s3://bucket/key`.
    pub(crate) uri: String,
    /// SQS `SentTimestamp`: when the notification was queued (epoch ms).
    pub(crate) sent_ms: i64,
    /// When the receive that returned it came back.
    pub(crate) received_ms: i64,
    /// When its batch was handed to the ingest handler (after the batching window).
    pub(crate) invoked_ms: i64,
}

/// One pipeline run of the process worker.
#[derive(Debug, Clone)]
pub(crate) struct ProcessRun {
    pub(crate) pipeline: String,
    pub(crate) started_ms: i64,
    /// The source snapshot the run's checkpoint moved to.
    pub(crate) to_snapshot: Option<i64>,
    /// The sink snapshot it committed (none: nothing new).
    pub(crate) sink_snapshot: Option<i64>,
}

/// What the workers saw, for `floe bench --freshness` (timestamps the tables do not keep).
#[derive(Debug, Default)]
pub(crate) struct Records {
    pub(crate) received: Vec<Received>,
    /// (`s3://bucket/key`, the snapshot that committed it).
    pub(crate) committed: Vec<(String, i64)>,
    pub(crate) runs: Vec<ProcessRun>,
    /// (source snapshot, when its commit event reached the process queue: `SentTimestamp`).
    pub(crate) events: Vec<(i64, i64)>,
    /// Ingest invocations and the objects they held.
    pub(crate) invocations: Vec<usize>,
    /// Errors the workers met (the message stays on its queue).
    pub(crate) errors: Vec<String>,
}

pub(crate) type Recorder = Arc<Mutex<Records>>;

fn record(rec: &Option<Recorder>, f: impl FnOnce(&mut Records)) {
    if let Some(r) = rec {
        if let Ok(mut g) = r.lock() {
            f(&mut g);
        }
    }
}

/// The resources of the local stack, on a moto_server of its own (stopped when dropped).
pub(crate) struct Stack {
    pub(crate) endpoint: String,
    pub(crate) config_path: String,
    pub(crate) config: Config,
    pub(crate) s3: aws_sdk_s3::Client,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    process_queue_url: String,
    _moto: Moto,
}

impl Stack {
    /// Starts moto_server and creates bucket, queues, notification, bus and rule: what
    /// template.yaml deploys. `dir` holds floe.toml, the SQLite catalog and moto.log.
    pub(crate) async fn start(port: u16, dir: &str) -> Result<Self> {
        Self::start_with(port, dir, Variant::default()).await
    }

    /// [`Stack::start`], its config departing from the sample as `variant` says.
    pub(crate) async fn start_with(port: u16, dir: &str, variant: Variant) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let dir = std::fs::canonicalize(dir)?.display().to_string();
        let py = String::from_utf8(
            Command::new("bash")
                .arg("infra/venv.sh")
                .output()
                .context("infra/venv.sh")?
                .stdout,
        )?;
        let port_file = format!("{dir}/moto.port");
        let _ = std::fs::remove_file(&port_file);
        let child = Command::new(py.trim())
            .args([
                "infra/moto_server.py",
                "--port",
                &port.to_string(),
                "--port-file",
                &port_file,
            ])
            .args(["--parent-pid", &std::process::id().to_string()])
            .stderr(std::fs::File::create(format!("{dir}/moto.log"))?)
            .spawn()
            .context("starting moto_server")?;
        let moto = Moto(Some(child));
        let start = Instant::now();
        let port = loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                if !p.is_empty() {
                    break p.trim().to_string();
                }
            }
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(60),
                "moto_server did not start; see {dir}/moto.log"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let endpoint = format!("http://127.0.0.1:{port}");
        let config_path = format!("{dir}/floe.toml");
        std::fs::write(&config_path, config_text(&endpoint, &dir, variant))?;
        let config = Config::load(&config_path).await?;

        let s3 = floe::store::s3_client(&config.storage).await;
        s3.create_bucket()
            .bucket(BUCKET)
            .send()
            .await
            .context("creating the bucket")?;
        let sdk = floe::store::sdk_config(&config.storage, Some(&endpoint)).await;
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let queue_url = sqs
            .create_queue()
            .queue_name(QUEUE)
            .send()
            .await?
            .queue_url()
            .unwrap_or_default()
            .to_string();
        use aws_sdk_s3::types::{
            Event, FilterRule, FilterRuleName, NotificationConfiguration,
            NotificationConfigurationFilter, QueueConfiguration, S3KeyFilter,
        };
        let filter = NotificationConfigurationFilter::builder()
            .key(
                S3KeyFilter::builder()
                    .filter_rules(
                        FilterRule::builder()
                            .name(FilterRuleName::Prefix)
                            .value("landing/")
                            .build(),
                    )
                    .build(),
            )
            .build();
        let queue = QueueConfiguration::builder()
            .queue_arn(format!("arn:aws:sqs:us-east-1:123456789012:{QUEUE}"))
            .events(Event::S3ObjectCreated)
            .filter(filter)
            .build()?;
        s3.put_bucket_notification_configuration()
            .bucket(BUCKET)
            .notification_configuration(
                NotificationConfiguration::builder()
                    .queue_configurations(queue)
                    .build(),
            )
            .send()
            .await?;

        // Commit events: bus → rule → queue → the process worker (→ the function when deployed).
        let process_queue_url = sqs
            .create_queue()
            .queue_name(PROCESS_QUEUE)
            .send()
            .await?
            .queue_url()
            .unwrap_or_default()
            .to_string();
        let events = aws_sdk_eventbridge::Client::new(&sdk);
        events.create_event_bus().name(BUS).send().await?;
        events
            .put_rule()
            .name("floe-commits")
            .event_bus_name(BUS)
            .event_pattern(r#"{"source":["floe"],"detail-type":["floe.commit"]}"#)
            .send()
            .await?;
        events
            .put_targets()
            .rule("floe-commits")
            .event_bus_name(BUS)
            .targets(
                aws_sdk_eventbridge::types::Target::builder()
                    .id("process")
                    .arn(format!(
                        "arn:aws:sqs:us-east-1:123456789012:{PROCESS_QUEUE}"
                    ))
                    .build()?,
            )
            .send()
            .await?;
        Ok(Self {
            endpoint,
            config_path,
            config,
            s3,
            sqs,
            queue_url,
            process_queue_url,
            _moto: moto,
        })
    }

    /// Messages waiting on the ingest queue and in flight (SQS's approximate counts).
    pub(crate) async fn ingest_backlog(&self) -> Result<u64> {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let out = self
            .sqs
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await?;
        let attrs = out.attributes();
        let n = |a: A| {
            attrs
                .and_then(|m| m.get(&a))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok(n(A::ApproximateNumberOfMessages) + n(A::ApproximateNumberOfMessagesNotVisible))
    }

    /// Runs the workers until `stop` turns true (or one fails).
    pub(crate) async fn run(
        &self,
        shape: &Shape,
        rec: Option<Recorder>,
        stop: watch::Receiver<bool>,
    ) -> Result<()> {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..shape.ingest_concurrency.max(1) {
            let worker = IngestWorker {
                sqs: self.sqs.clone(),
                queue_url: self.queue_url.clone(),
                ingestor: Ingestor::new(self.config.clone()).await?,
                shape: shape.clone(),
                rec: rec.clone(),
            };
            tasks.spawn(worker.run(stop.clone()));
        }
        for n in 0..shape.process_concurrency.max(1) {
            let worker = ProcessWorker {
                sqs: self.sqs.clone(),
                queue_url: self.process_queue_url.clone(),
                processor: Processor::new(self.config.clone()).await?,
                shape: shape.clone(),
                rec: rec.clone(),
                polls: n == 0,
            };
            tasks.spawn(worker.run(stop.clone()));
        }
        if let Some(every) = shape.maintain_every {
            let maintainer = Maintainer::new(self.config.clone()).await?;
            tasks.spawn(on_schedule(
                maintainer,
                json!({"detail-type": "Scheduled Event"}),
                every,
                Duration::from_secs(120),
                stop.clone(),
                |reports| {
                    crate::maintain_cmd::print_maintenance(&reports?);
                    Ok(())
                },
            ));
        }
        if let Some(payload) = floe::maintain::short_history_payload(&self.config) {
            // template.yaml's ExpireShortHistory schedule (every minute, EventBridge's shortest
            // rate): expiration alone, of the hot tables alone. A failed pass is logged and the
            // next one tries again, as the next scheduled invocation would.
            let maintainer = Maintainer::new(self.config.clone()).await?;
            let verbose = shape.verbose;
            tasks.spawn(on_schedule(
                maintainer,
                payload,
                Duration::from_secs(60),
                Duration::from_secs(60),
                stop.clone(),
                move |reports| {
                    match reports {
                        Ok(reports) if verbose => crate::maintain_cmd::print_maintenance(&reports),
                        Ok(_) => {}
                        Err(e) => eprintln!(
                            "short-history expiration failed (the next pass tries again): {e}"
                        ),
                    }
                    Ok(())
                },
            ));
        }
        while let Some(done) = tasks.join_next().await {
            done.context("a stack worker panicked")??;
        }
        Ok(())
    }
}

/// A maintain schedule: `payload` through `maintainer` every `every` (each invocation within
/// `budget`) until `stop`; `settle` gets each invocation's reports, and its error stops the stack.
async fn on_schedule(
    maintainer: Maintainer,
    payload: serde_json::Value,
    every: Duration,
    budget: Duration,
    stop: watch::Receiver<bool>,
    settle: impl Fn(floe::Result<Vec<floe::maintain::Report>>) -> Result<()>,
) -> Result<()> {
    let mut last = Instant::now();
    while !*stop.borrow() {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if last.elapsed() >= every {
            last = Instant::now();
            settle(
                maintainer
                    .handle_payload(&payload, Instant::now() + budget)
                    .await,
            )?;
        }
    }
    Ok(())
}

/// One ingest "container": long-polls the queue, fills a batch within the window, hands it to
/// the handler, deletes what succeeded (failures stay on the queue, as with
/// ReportBatchItemFailures).
struct IngestWorker {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    ingestor: Ingestor,
    shape: Shape,
    rec: Option<Recorder>,
}

impl IngestWorker {
    async fn receive(&self, max: i32, wait_seconds: i32) -> Result<Vec<Message>> {
        let out = self
            .sqs
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(max.clamp(1, 10))
            .wait_time_seconds(wait_seconds)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .send()
            .await?;
        Ok(out.messages().to_vec())
    }

    async fn run(self, stop: watch::Receiver<bool>) -> Result<()> {
        let size = self.shape.batch_size.clamp(1, 10);
        while !*stop.borrow() {
            let first = self.receive(size, 1).await?;
            if first.is_empty() {
                continue;
            }
            let opened = Instant::now();
            let mut batch: Vec<(Message, i64)> = first.into_iter().map(|m| (m, now_ms())).collect();
            // The batching window: wait for more until the batch is full or the window closes.
            while (batch.len() as i32) < size && opened.elapsed() < self.shape.batch_window {
                let more = self.receive(size - batch.len() as i32, 0).await?;
                if more.is_empty() {
                    let left = self.shape.batch_window.saturating_sub(opened.elapsed());
                    tokio::time::sleep(left.min(Duration::from_millis(20))).await;
                }
                batch.extend(more.into_iter().map(|m| (m, now_ms())));
            }
            self.handle(batch).await?;
        }
        Ok(())
    }

    async fn handle(&self, batch: Vec<(Message, i64)>) -> Result<()> {
        let invoked_ms = now_ms();
        let records: Vec<_> = batch
            .iter()
            .map(|(m, _)| json!({"messageId": m.message_id(), "receiptHandle": m.receipt_handle(), "body": m.body(), "eventSource": "aws:sqs"}))
            .collect();
        record(&self.rec, |r| {
            r.invocations.push(batch.len());
            for (m, received_ms) in &batch {
                let sent_ms = m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(*received_ms);
                for obj in floe::event::parse_message(m.body().unwrap_or("")).unwrap_or_default() {
                    r.received.push(Received {
                        uri: obj.uri(),
                        sent_ms,
                        received_ms: *received_ms,
                        invoked_ms,
                    });
                }
            }
        });
        let result = self
            .ingestor
            .handle_payload(
                &json!({ "Records": records }),
                Instant::now() + Duration::from_secs(300),
            )
            .await;
        record(&self.rec, |r| {
            for rep in &result.reports {
                if let (floe::ingest::Status::Committed, Some(s)) = (rep.status, rep.snapshot_id) {
                    r.committed.push((rep.object.clone(), s));
                }
            }
            r.errors.extend(result.errors.iter().cloned());
        });
        if self.shape.verbose {
            if !result.reports.is_empty() {
                crate::ingest_cmd::print_reports(&result.reports);
            }
            for e in &result.errors {
                eprintln!("error (message stays on the queue): {e}");
            }
        }
        // Like Lambda with ReportBatchItemFailures: delete what succeeded, leave failures.
        let done = settled(batch.iter().map(|(m, _)| m), &result.failed_message_ids);
        if !done.is_empty() {
            self.sqs
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(done))
                .send()
                .await?;
        }
        Ok(())
    }
}

/// The process function: takes every commit event waiting, runs each pipeline they wake once
/// (the work comes from the checkpoint, so one run covers all their commits and whatever
/// committed meanwhile) through the Lambda's handler, deletes the messages once their runs
/// settled (those whose pipeline failed retryably stay and come back), and runs every pipeline
/// on the poll.
struct ProcessWorker {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    processor: Processor,
    shape: Shape,
    rec: Option<Recorder>,
    /// Whether this worker also runs the poll (the schedule's invocations: one stream of them).
    polls: bool,
}

impl ProcessWorker {
    async fn run(self, stop: watch::Receiver<bool>) -> Result<()> {
        let mut last_poll = Instant::now();
        while !*stop.borrow() {
            // The poll: an invocation of its own, as the deployed schedule's.
            if self.polls && last_poll.elapsed() >= self.shape.poll_every {
                last_poll = Instant::now();
                self.invoke(&json!({"detail-type": "Scheduled Event"}))
                    .await;
            }
            let batch = self.receive_batch().await?;
            if batch.is_empty() {
                continue;
            }
            let records: Vec<_> = batch
                .iter()
                .map(|m| json!({"messageId": m.message_id(), "receiptHandle": m.receipt_handle(), "body": m.body(), "eventSource": "aws:sqs"}))
                .collect();
            let result = self.invoke(&json!({ "Records": records })).await;
            // Like Lambda with ReportBatchItemFailures: the messages are deleted only once the
            // runs they woke settled (a crash mid-run leaves them for redelivery), and only
            // those whose pipelines did not fail retryably.
            let done = settled(batch.iter(), &result.failed_message_ids);
            if !done.is_empty() {
                self.sqs
                    .delete_message_batch()
                    .queue_url(&self.queue_url)
                    .set_entries(Some(done))
                    .send()
                    .await?;
            }
        }
        Ok(())
    }

    /// The events waiting, up to a batch (the event source's BatchSize): the first receive
    /// long-polls, the rest only drain. Nothing is deleted here.
    async fn receive_batch(&self) -> Result<Vec<Message>> {
        let mut batch: Vec<Message> = Vec::new();
        let mut wait = 1;
        while batch.len() < PROCESS_BATCH {
            let out = self
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages((PROCESS_BATCH - batch.len()).clamp(1, 10) as i32)
                .wait_time_seconds(wait)
                .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
                .send()
                .await?;
            let messages = out.messages();
            if messages.is_empty() {
                break;
            }
            record(&self.rec, |r| {
                for m in messages {
                    let body: serde_json::Value =
                        serde_json::from_str(m.body().unwrap_or("")).unwrap_or_default();
                    let sent = m
                        .attributes()
                        .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
                        .and_then(|v| v.parse().ok());
                    if let (Some(s), Some(sent)) = (body["detail"]["snapshot_id"].as_i64(), sent) {
                        r.events.push((s, sent));
                    }
                }
            });
            batch.extend(messages.iter().cloned());
            wait = 0;
        }
        Ok(batch)
    }

    /// One process-function invocation: the handler the Lambda calls (each pipeline the
    /// payload wakes runs once), its runs recorded.
    async fn invoke(&self, payload: &serde_json::Value) -> floe::process::ProcessResult {
        // Boxed: the run's future is deep, and a spawned worker must prove it `Send`.
        let run: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send + '_>> = Box::pin(
            self.processor
                .handle_event(payload, Instant::now() + Duration::from_secs(300)),
        );
        let result = run.await;
        let finished_ms = now_ms();
        record(&self.rec, |rec| {
            for r in &result.reports {
                rec.runs.push(ProcessRun {
                    pipeline: r.pipeline.clone(),
                    started_ms: finished_ms - (r.seconds * 1e3) as i64,
                    to_snapshot: r.to_snapshot,
                    sink_snapshot: r.sink_snapshot,
                });
            }
            rec.errors
                .extend(result.errors.iter().map(|e| format!("process: {e}")));
        });
        if self.shape.verbose {
            let with_output: Vec<_> = result
                .reports
                .iter()
                .filter(|r| r.sink_snapshot.is_some())
                .cloned()
                .collect();
            if !with_output.is_empty() {
                crate::process_cmd::print_runs(&with_output);
            }
            for e in &result.errors {
                eprintln!("process error: {e}");
            }
        }
        result
    }
}

/// The delete entries of the messages of a batch that settled: all but `failed` (what the
/// handler reported as batch item failures, which stay on the queue and come back).
fn settled<'a>(
    batch: impl Iterator<Item = &'a Message>,
    failed: &[String],
) -> Vec<DeleteMessageBatchRequestEntry> {
    batch
        .filter(|m| {
            !m.message_id()
                .map(|id| failed.iter().any(|f| f == id))
                .unwrap_or(false)
        })
        .enumerate()
        .filter_map(|(i, m)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(m.receipt_handle()?)
                .build()
                .ok()
        })
        .collect()
}

/// `floe local`: the stack with template.yaml's shape, printing what each function does.
pub async fn run(
    port: u16,
    dir: String,
    maintain_every: Duration,
    exit_after: Option<Duration>,
) -> Result<()> {
    let stack = Stack::start(port, &dir).await?;
    let (endpoint, config_path) = (&stack.endpoint, &stack.config_path);
    println!("floe local stack on {endpoint}");
    println!("  config:   {config_path}");
    println!("  drop:     aws --endpoint-url {endpoint} s3 cp orders.jsonl s3://{BUCKET}/landing/orders/");
    println!("  status:   cargo run --bin floe -- status --config {config_path}");
    println!("  (AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 for the aws cli)");
    println!("  pipelines: floe.commit events → process (+ a poll every 60 s); `floe process reconcile --config {config_path}`");
    let shape = Shape {
        maintain_every: Some(maintain_every),
        ..Shape::default()
    };
    let (_stop, rx) = watch::channel(false);
    match exit_after {
        // The workers are cancelled where they are, as an interrupt would.
        Some(after) => tokio::time::timeout(after, stack.run(&shape, None, rx))
            .await
            .unwrap_or(Ok(())),
        None => stack.run(&shape, None, rx).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_settled_messages_are_deleted() {
        let m = |id: &str| {
            Message::builder()
                .message_id(id)
                .receipt_handle(format!("rh-{id}"))
                .body("{}")
                .build()
        };
        let batch = [m("a"), m("b"), m("c")];
        let handles = |e: Vec<DeleteMessageBatchRequestEntry>| -> Vec<String> {
            e.iter().map(|e| e.receipt_handle().to_string()).collect()
        };
        assert_eq!(
            handles(settled(batch.iter(), &["b".to_string()])),
            ["rh-a", "rh-c"]
        );
        assert_eq!(handles(settled(batch.iter(), &[])).len(), 3);
        let all: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        assert!(settled(batch.iter(), &all).is_empty());
    }
}
