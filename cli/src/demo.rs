//! `floe demo`: the whole ingest path on a laptop with nothing but cargo.
//!
//! SQLite catalog + file-system warehouse + buckets as local directories. Sample objects (good,
//! bad records, late events, a corrupt file, an unrouted file, a duplicate delivery) are handed to
//! the same `Ingestor::handle_payload` the Lambda calls, wrapped in an SQS-delivered S3 event.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chrono::Utc;
use floe::config::Config;
use floe::ingest::Ingestor;
use floe::sample;
use serde_json::json;

pub fn demo_config(dir: &str) -> String {
    format!(
        r#"# floe demo configuration (written by `floe demo`)
[catalog]
kind = "sqlite"
uri = "{dir}/catalog.db"
warehouse = "{dir}/warehouse"
namespace = "demo"

[storage]
local_root = "{dir}/buckets"

[ingest]
quarantine_prefix = "quarantine/"
late_after_seconds = 3600

[[routes]]
bucket = "landing"
prefix = "orders/"
table = "orders"
format = "jsonl"

[[routes]]
bucket = "landing"
prefix = "orders-csv/"
table = "orders"
format = "csv"
{tables}{pipelines}{latest}"#,
        tables = sample::ORDERS_TABLE_TOML,
        pipelines = sample::PIPELINES_TOML,
        latest = sample::LATEST_PIPELINE_TOML
    )
}

fn s3_event_in_sqs(message_id: &str, bucket: &str, key: &str) -> serde_json::Value {
    let s3 = json!({"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "local",
        "eventTime": Utc::now().to_rfc3339(), "eventName": "ObjectCreated:Put",
        "userIdentity": {"principalId": "demo"}, "requestParameters": {"sourceIPAddress": "127.0.0.1"},
        "responseElements": {}, "s3": {"s3SchemaVersion": "1.0", "configurationId": "demo",
          "bucket": {"name": bucket, "ownerIdentity": {"principalId": "demo"}, "arn": format!("arn:aws:s3:::{bucket}")},
          "object": {"key": key.replace(' ', "+"), "size": 0, "eTag": "", "sequencer": "0"}}}]});
    json!({"eventSource": "aws:sqs", "messageId": message_id, "body": s3.to_string()})
}

pub async fn run(dir: String) -> Result<()> {
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {dir}"))?;
    let dir = std::fs::canonicalize(&dir)?.display().to_string();
    let config_path = format!("{dir}/floe.toml");
    std::fs::write(&config_path, demo_config(&dir))?;
    let config = Config::load(&config_path).await?;
    let ingestor = Ingestor::new(config.clone()).await?;
    let store = ingestor.store().clone();
    let now = Utc::now();

    // 1. a gzip object of good events
    let good = sample::orders_jsonl(5_000, 1, now);
    store
        .put(
            "landing",
            "orders/2026/11/batch-001.jsonl.gz",
            sample::gzip(good.as_bytes()),
        )
        .await?;
    // 2. plain JSON lines with bad records, late events and an unknown field
    let mut mixed = sample::orders_jsonl(1_000, 2, now);
    let mut rng = sample::Rng::new(3);
    let mut late = String::new();
    for _ in 0..200 {
        sample::order_line(&mut late, &mut rng, now, 3 * 3600);
    }
    mixed.push_str(&late);
    mixed.push_str("{\"order_id\": \"broken\n");
    mixed.push_str("{\"order_id\":\"x1\",\"customer_id\":7,\"amount\":\"a lot\",\"event_time\":\"2026-11-30T10:00:00Z\"}\n");
    mixed.push_str("{\"customer_id\":8,\"amount\":1.5,\"event_time\":\"2026-11-30T10:00:00Z\"}\n");
    mixed.push_str("{\"order_id\":\"x3\",\"customer_id\":9,\"amount\":2.5,\"coupon\":\"XMAS\",\"event_time\":\"2026-11-30T10:00:00Z\"}\n");
    store
        .put(
            "landing",
            "orders/2026/11/batch 002.jsonl",
            mixed.into_bytes(),
        )
        .await?;
    // 3. CSV with one bad row
    let mut csv = String::from(
        "order_id,customer_id,region,amount,currency,items,status,payment_method,event_time\n",
    );
    for i in 0..500 {
        csv.push_str(&format!(
            "c-{i},{i},eu-west,{}.5,EUR,2,paid,card,{}\n",
            i % 97,
            now.format("%Y-%m-%dT%H:%M:%SZ")
        ));
    }
    csv.push_str("c-bad,not-a-number,eu-west,1.0,EUR,1,paid,card,2026-11-30T10:00:00Z\n");
    store
        .put("landing", "orders-csv/batch-003.csv", csv.into_bytes())
        .await?;
    // 4. a corrupt gzip object
    let mut corrupt = sample::gzip(b"{\"order_id\":\"z\"}\n");
    corrupt.truncate(corrupt.len() / 2);
    corrupt.extend_from_slice(b"not gzip any more");
    store
        .put("landing", "orders/2026/11/broken.jsonl.gz", corrupt)
        .await?;
    // 5. an object outside every route
    store
        .put("landing", "elsewhere/x.json", b"{}\n".to_vec())
        .await?;

    let payload = json!({"Records": [
        s3_event_in_sqs("m1", "landing", "orders/2026/11/batch-001.jsonl.gz"),
        s3_event_in_sqs("m2", "landing", "orders/2026/11/batch 002.jsonl"),
        s3_event_in_sqs("m3", "landing", "orders-csv/batch-003.csv"),
        s3_event_in_sqs("m4", "landing", "orders/2026/11/broken.jsonl.gz"),
        s3_event_in_sqs("m5", "landing", "elsewhere/x.json"),
        // 6. a duplicate delivery of the first object
        s3_event_in_sqs("m6", "landing", "orders/2026/11/batch-001.jsonl.gz"),
    ]});
    println!("floe demo — warehouse {dir}/warehouse, catalog {dir}/catalog.db\n");
    let result = ingestor
        .handle_payload(&payload, Instant::now() + Duration::from_secs(300))
        .await;
    crate::ingest_cmd::print_reports(&result.reports);
    let response = floe::lambda::ingest_response(&result).map_err(anyhow::Error::msg)?;
    println!("\nLambda response (SQS partial batch): {response}");

    let reports = &result.reports;
    let sum = |f: fn(&floe::ingest::ObjectReport) -> u64| reports.iter().map(f).sum::<u64>();
    println!(
        "\nreconciliation: records in {} = committed {} + quarantined {} (duplicates add nothing)",
        sum(|r| if r.status == floe::ingest::Status::Duplicate {
            0
        } else {
            r.records_in
        }),
        sum(|r| if r.status == floe::ingest::Status::Duplicate {
            0
        } else {
            r.records_committed
        }),
        sum(|r| if r.status == floe::ingest::Status::Duplicate {
            0
        } else {
            r.records_quarantined
        }),
    );
    println!("quarantined records: {dir}/buckets/landing/quarantine/");
    if !result.errors.is_empty() {
        anyhow::bail!("demo saw errors: {}", result.errors.join("; "));
    }

    // The process function: the commit event wakes the pipelines (append, windowed aggregate,
    // latest order per customer).
    let processor = floe::process::Processor::new(config.clone()).await?;
    let commit_event = json!({"source": floe::event::EVENT_SOURCE, "detail-type": floe::event::COMMIT_DETAIL_TYPE, "detail": {"table": "orders"}});
    let deadline = Instant::now() + Duration::from_secs(300);
    let (mut runs, errors) = processor.handle_payload(&commit_event, deadline).await;
    if let Some(e) = errors.first() {
        anyhow::bail!("process: {e}");
    }
    // Late events arrive (20, 45 and 80 minutes old): merged into their windows, which are replaced.
    let late: String = [20, 45, 80]
        .iter()
        .enumerate()
        .map(|(i, m)| sample::late_orders_jsonl(100, 7 + i as u64, Utc::now(), m * 60))
        .collect();
    store
        .put(
            "landing",
            "orders/2026/11/late-004.jsonl",
            late.into_bytes(),
        )
        .await?;
    let late_payload =
        json!({"Records": [s3_event_in_sqs("m7", "landing", "orders/2026/11/late-004.jsonl")]});
    let late_result = ingestor.handle_payload(&late_payload, deadline).await;
    if !late_result.errors.is_empty() {
        anyhow::bail!("demo saw errors: {}", late_result.errors.join("; "));
    }
    let (more, errors) = processor.handle_payload(&commit_event, deadline).await;
    if let Some(e) = errors.first() {
        anyhow::bail!("process: {e}");
    }
    runs.extend(more);
    println!("\nprocess (incremental, from each sink's checkpoint; the second round carries 300 late events):");
    crate::process_cmd::print_runs(&runs);
    let mut recs = Vec::new();
    for p in &config.pipelines {
        recs.push(processor.reconcile(&p.name).await?);
    }
    println!(
        "\nreconcile (the same SQL over the whole table vs the incrementally maintained sink):"
    );
    crate::process_cmd::print_reconciliations(&recs);
    if !recs.iter().all(|r| r.matches()) {
        anyhow::bail!("reconcile found differences");
    }
    println!();
    let rows = crate::status::collect(&config).await?;
    crate::status::print(&rows);
    println!("\nnext: `cargo run --bin floe -- status --config {config_path}`");
    println!("      `cargo run --bin floe -- process reconcile --config {config_path}`");
    Ok(())
}
