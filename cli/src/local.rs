//! `floe local`: the deployed topology on moto_server (127.0.0.1), for trying floe by hand.
//!
//! Landing bucket → S3 notification → SQS queue → the ingest handler (the Lambda's code path, with
//! SQS partial-batch semantics: failed messages stay on the queue and come back); a timer → the
//! maintain handler (the schedule); ingest commit events → EventBridge bus → rule → SQS → the
//! process handler (plus a 60 s poll, the deployed `rate()` fallback); the process handler's
//! sink commits go to the same bus, so a pipeline whose source is another's sink runs next.
//! Drop files with any S3 client and watch `floe status`.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use floe::config::Config;
use floe::ingest::Ingestor;
use floe::maintain::Maintainer;
use serde_json::json;

const BUCKET: &str = "floe-local";
const QUEUE: &str = "floe-ingest";
const PROCESS_QUEUE: &str = "floe-process";
const BUS: &str = "floe-local";

fn config_text(endpoint: &str, dir: &str) -> String {
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
{tables}{pipelines}"#,
        tables = floe::sample::ORDERS_TABLE_TOML,
        pipelines = floe::sample::PIPELINES_TOML
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

pub async fn run(
    port: u16,
    dir: String,
    maintain_every: Duration,
    exit_after: Option<Duration>,
) -> Result<()> {
    std::fs::create_dir_all(&dir)?;
    let dir = std::fs::canonicalize(&dir)?.display().to_string();
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
    let _moto = Moto(Some(child));
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
    std::fs::write(&config_path, config_text(&endpoint, &dir))?;
    let config = Config::load(&config_path).await?;

    // Bucket, queue, notification: what template.yaml deploys.
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

    // Commit events: bus → rule → queue → the process handler (EventBridge → Lambda when deployed).
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

    let ingestor = Ingestor::new(config.clone()).await?;
    let processor = floe::process::Processor::new(config.clone()).await?;
    let maintainer = Maintainer::new(config.clone()).await?;
    println!("floe local stack on {endpoint}");
    println!("  config:   {config_path}");
    println!("  drop:     aws --endpoint-url {endpoint} s3 cp orders.jsonl s3://{BUCKET}/landing/orders/");
    println!("  status:   cargo run --bin floe -- status --config {config_path}");
    println!("  (AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 for the aws cli)");
    println!("  pipelines: floe.commit events → process (+ a poll every 60 s); `floe process reconcile --config {config_path}`");
    let started = Instant::now();
    let mut last_maintain = Instant::now();
    let mut last_poll = Instant::now();
    loop {
        if exit_after.map(|d| started.elapsed() >= d).unwrap_or(false) {
            return Ok(());
        }
        let out = sqs
            .receive_message()
            .queue_url(&queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(2)
            .send()
            .await?;
        let messages = out.messages();
        if !messages.is_empty() {
            let records: Vec<_> = messages
                .iter()
                .map(|m| json!({"messageId": m.message_id(), "receiptHandle": m.receipt_handle(), "body": m.body(), "eventSource": "aws:sqs"}))
                .collect();
            let result = ingestor
                .handle_payload(
                    &json!({ "Records": records }),
                    Instant::now() + Duration::from_secs(300),
                )
                .await;
            if !result.reports.is_empty() {
                crate::ingest_cmd::print_reports(&result.reports);
            }
            // Like Lambda with ReportBatchItemFailures: delete what succeeded, leave failures.
            for m in messages {
                let failed = m
                    .message_id()
                    .map(|id| result.failed_message_ids.iter().any(|f| f == id))
                    .unwrap_or(false);
                if !failed {
                    if let Some(h) = m.receipt_handle() {
                        sqs.delete_message()
                            .queue_url(&queue_url)
                            .receipt_handle(h)
                            .send()
                            .await?;
                    }
                }
            }
            for e in &result.errors {
                eprintln!("error (message stays on the queue): {e}");
            }
        }
        // The process leg: each commit event (an ingest commit, or a sink commit of a run in an
        // earlier round) wakes the pipelines of its table; the poll is the deployed `rate()`
        // fallback.
        let out = sqs
            .receive_message()
            .queue_url(&process_queue_url)
            .max_number_of_messages(10)
            .send()
            .await?;
        let mut wake: Vec<serde_json::Value> = out
            .messages()
            .iter()
            .filter_map(|m| serde_json::from_str(m.body().unwrap_or("")).ok())
            .collect();
        for m in out.messages() {
            if let Some(h) = m.receipt_handle() {
                sqs.delete_message()
                    .queue_url(&process_queue_url)
                    .receipt_handle(h)
                    .send()
                    .await?;
            }
        }
        if last_poll.elapsed() >= Duration::from_secs(60) {
            last_poll = Instant::now();
            wake.push(json!({"detail-type": "Scheduled Event"}));
        }
        // Several notifications for one table need one run: the work comes from the checkpoint.
        wake.dedup_by(|a, b| a["detail"]["table"] == b["detail"]["table"]);
        for event in wake {
            let (runs, errors) = processor
                .handle_payload(&event, Instant::now() + Duration::from_secs(300))
                .await;
            let runs: Vec<_> = runs
                .into_iter()
                .filter(|r| r.sink_snapshot.is_some())
                .collect();
            if !runs.is_empty() {
                crate::process_cmd::print_runs(&runs);
            }
            for e in &errors {
                eprintln!("process error: {e}");
            }
        }
        if last_maintain.elapsed() >= maintain_every {
            last_maintain = Instant::now();
            let reports = maintainer
                .handle_payload(
                    &json!({"detail-type": "Scheduled Event"}),
                    Instant::now() + Duration::from_secs(120),
                )
                .await?;
            crate::maintain_cmd::print_maintenance(&reports);
        }
    }
}
