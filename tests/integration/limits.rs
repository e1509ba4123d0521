//! Input limits (`[ingest] max_*`): over-long lines, fields and deep nesting are quarantined with
//! their reason while the rest commits; objects over a whole-object limit (decompressed size,
//! Parquet spool) fail without a partial commit and are not acknowledged as unreadable; messy
//! framing (a JSON key given twice, two values on a line) quarantines its record, and a CSV
//! quote that never closes makes the object unreadable rather than swallowing its records.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use floe::error::ErrorKind;
use floe::ingest::Status;
use serde_json::json;

use crate::harness::{orders, TestEnv};

const T: &str = "2026-11-30T10:00:00Z";

/// The quarantined records of `r`, as JSON values.
async fn quarantined(env: &TestEnv, r: &floe::ingest::ObjectReport) -> Vec<serde_json::Value> {
    let q = r.quarantine.clone().expect("a quarantine object");
    let key = q.trim_start_matches(&format!("s3://{}/", env.bucket));
    let body = String::from_utf8(env.get(key).await.expect("quarantine object")).unwrap();
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Nothing of the object reached the table: no snapshot, no data file, no quarantine.
async fn nothing_landed(env: &TestEnv, ingestor: &floe::ingest::Ingestor) {
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert!(table.metadata().current_snapshot().is_none());
    let files = env.keys("warehouse/").await;
    assert!(files.iter().all(|k| !k.ends_with(".parquet")), "{files:?}");
    assert!(env.keys("quarantine/").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlong_line_and_deep_nesting_are_quarantined_and_the_rest_commits() {
    // Default limits: max_line_bytes = 1 MiB, max_nesting_depth = 64. Before them, both lines
    // below were committed (the 5 MB one after being read whole into memory).
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let mut jsonl = orders(20, 1);
    jsonl.push_str(&format!(
        "{{\"order_id\":\"big\",\"customer_id\":1,\"event_time\":\"{T}\",\"status\":\"{}\"}}\n",
        "x".repeat(5_000_000)
    ));
    jsonl.push_str(&format!(
        "{{\"order_id\":\"deep\",\"customer_id\":2,\"event_time\":\"{T}\",\"status\":\"ok\",\"nest\":{}1{}}}\n",
        "[".repeat(100),
        "]".repeat(100)
    ));
    jsonl.push_str(&orders(10, 2));
    env.put("orders/hostile.jsonl", jsonl).await;
    let r = env.ingest(&ingestor, "orders/hostile.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (32, 30, 2),
        "{r:?}"
    );
    let q = quarantined(&env, &r).await;
    let mut by_line: Vec<(u64, String, usize)> = q
        .iter()
        .map(|l| {
            (
                l["record"].as_u64().unwrap(),
                l["reason"].as_str().unwrap().to_string(),
                l["raw"].as_str().unwrap().len(),
            )
        })
        .collect();
    by_line.sort();
    assert_eq!(by_line.len(), 2, "{q:?}");
    assert_eq!(by_line[0].0, 21);
    assert!(
        by_line[0].1.contains("max_line_bytes = 1048576"),
        "{}",
        by_line[0].1
    );
    assert!(by_line[0].2 <= 1100, "raw kept {} bytes", by_line[0].2);
    assert_eq!(by_line[1].0, 22);
    assert!(
        by_line[1].1.contains("max_nesting_depth = 64"),
        "{}",
        by_line[1].1
    );
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_overlong_field_is_quarantined_and_the_rest_commits() {
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.max_field_bytes = 200;
    let ingestor = env.ingestor().await;
    let mut csv = String::from("event_time,order_id,customer_id,status\n");
    for i in 0..10 {
        csv.push_str(&format!("{T},c{i},{i},ok\n"));
    }
    csv.push_str(&format!("{T},long,11,\"{}\"\n", "s,".repeat(150)));
    env.put("csv/long-field.csv", csv).await;
    let r = env.ingest(&ingestor, "csv/long-field.csv").await.unwrap();
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (11, 10, 1),
        "{r:?}"
    );
    let q = quarantined(&env, &r).await;
    assert_eq!(q[0]["record"], 12);
    let reason = q[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("`status`") && reason.contains("max_field_bytes = 200"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_bomb_over_the_cap_fails_without_a_partial_commit() {
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.max_decompressed_bytes = 256 << 10;
    env.config.ingest.chunk_records = 100; // batches reach the writer before the cap is hit
    let ingestor = env.ingestor().await;
    let plain = orders(5000, 3);
    assert!(plain.len() > 1 << 20);
    env.put("orders/bomb.jsonl.gz", floe::sample::gzip(plain.as_bytes()))
        .await;
    // Before the cap, the object was committed whole.
    let e = env
        .ingest(&ingestor, "orders/bomb.jsonl.gz")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnreadableObject, "{e}");
    assert!(!e.is_retryable(), "{e}");
    assert!(
        e.to_string().contains("max_decompressed_bytes = 262144"),
        "{e}"
    );
    nothing_landed(&env, &ingestor).await;
}

fn parquet_orders(rows: usize) -> Vec<u8> {
    let col = |f: &dyn Fn(usize) -> String| -> ArrayRef {
        Arc::new(StringArray::from((0..rows).map(f).collect::<Vec<_>>()))
    };
    let batch = RecordBatch::try_from_iter(vec![
        ("order_id", col(&|i| format!("p{i}"))),
        ("customer_id", col(&|i| i.to_string())),
        ("event_time", col(&|_| T.to_string())),
    ])
    .unwrap();
    let mut buf = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    buf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_over_the_spool_limit_is_a_failure_not_an_unreadable_object() {
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.max_spool_bytes = 4096;
    let ingestor = env.ingestor().await;
    let bytes = parquet_orders(2000);
    assert!(bytes.len() > 4096);
    env.put("parquet/big.parquet", bytes).await;
    let e = env
        .ingest(&ingestor, "parquet/big.parquet")
        .await
        .unwrap_err();
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains("max_spool_bytes = 4096"), "{e}");
    nothing_landed(&env, &ingestor).await;

    // Through SQS: the message is reported failed (retried, then the DLQ), not acknowledged.
    let body = json!({"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": env.bucket}, "object": {"key": "parquet/big.parquet"}}}]});
    let payload = json!({"Records": [{"messageId": "m-big", "receiptHandle": "r",
        "body": body.to_string(), "eventSource": "aws:sqs"}]});
    let result = ingestor
        .handle_payload(&payload, Instant::now() + Duration::from_secs(60))
        .await;
    assert_eq!(result.failed_message_ids, vec!["m-big".to_string()]);
    assert!(
        result
            .reports
            .iter()
            .all(|r| r.status != Status::Unreadable),
        "{:?}",
        result.reports
    );

    // Within the limit, the same object commits.
    env.config.ingest.max_spool_bytes = 8 << 20;
    let ingestor = env.ingestor().await;
    let r = env.ingest(&ingestor, "parquet/big.parquet").await.unwrap();
    assert_eq!((r.status, r.records_committed), (Status::Committed, 2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_records_over_the_quarantine_limit_fail_the_object_whole() {
    // Before the limit, the rejected records of any object were spooled to local disk without
    // bound and read into memory whole for the upload: a mostly invalid object of a few GB
    // filled /tmp or the Lambda's memory.
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.max_quarantine_bytes = 4096;
    env.config.ingest.chunk_records = 50;
    let ingestor = env.ingestor().await;
    let mut jsonl = orders(10, 1);
    for i in 0..200 {
        jsonl.push_str(&format!("not json at all, line {i}\n"));
    }
    env.put("orders/mostly-bad.jsonl", jsonl.clone()).await;
    let e = env
        .ingest(&ingestor, "orders/mostly-bad.jsonl")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnreadableObject, "{e}");
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains("max_quarantine_bytes = 4096"), "{e}");
    nothing_landed(&env, &ingestor).await;

    // Within the limit the same object commits its good rows and quarantines the rest,
    // uploaded from the spool file.
    env.config.ingest.max_quarantine_bytes = 1 << 20;
    let ingestor = env.ingestor().await;
    let r = env
        .ingest(&ingestor, "orders/mostly-bad.jsonl")
        .await
        .unwrap();
    assert_eq!(
        (
            r.status,
            r.records_in,
            r.records_committed,
            r.records_quarantined
        ),
        (Status::Committed, 210, 10, 200),
        "{r:?}"
    );
    let q = quarantined(&env, &r).await;
    assert_eq!(q.len(), 200);
    assert!(q
        .iter()
        .all(|l| l["raw"].as_str().unwrap().starts_with("not json at all")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_widening_object_is_not_failed_by_its_first_pass_rejections() {
    // Under the additive policy the first pass decodes with the old schema: rows needing a
    // wider type are rejected there, then written again on the widened schema. Those first-pass
    // rejections must not count against max_quarantine_bytes (the limit once failed such an
    // object whole, and every redelivery the same way).
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.max_quarantine_bytes = 4096;
    let ingestor = env.ingestor().await;
    env.put("orders/w1.jsonl", orders(10, 21)).await;
    env.ingest(&ingestor, "orders/w1.jsonl").await.unwrap();
    let wide = orders(100, 22).replace("\"items\":", "\"items\":5000000000");
    assert!(wide.len() > 3 * 4096);
    env.put("orders/w2.jsonl", wide).await;
    let r = env.ingest(&ingestor, "orders/w2.jsonl").await.unwrap();
    assert_eq!(
        (r.status, r.records_committed, r.records_quarantined),
        (Status::Committed, 100, 0),
        "{r:?}"
    );
    crate::evolution::assert_items_widened(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_key_given_twice_or_two_values_on_a_line_are_quarantined_through_ingest() {
    // Before: the repeated `status` landed as its last value ("void") and the line of two
    // objects balanced nothing here but landed whole in other chunks; both are records in
    // quarantine now, with their reasons, and the rest commits.
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let row = |id: &str, status: &str| {
        format!("{{\"order_id\":\"{id}\",\"customer_id\":1,\"event_time\":\"{T}\",\"status\":\"{status}\"")
    };
    let mut jsonl = orders(10, 1);
    jsonl.push_str(&format!("{},\"status\":\"void\"}}\n", row("dup", "ok")));
    jsonl.push_str(&format!(
        "{}}}{}}}\n",
        row("two-a", "ok"),
        row("two-b", "ok")
    ));
    jsonl.push_str(&orders(5, 2));
    env.put("orders/messy.jsonl", jsonl).await;
    let r = env.ingest(&ingestor, "orders/messy.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (17, 15, 2),
        "{r:?}"
    );
    let mut q: Vec<(u64, String)> = quarantined(&env, &r)
        .await
        .iter()
        .map(|l| {
            (
                l["record"].as_u64().unwrap(),
                l["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    q.sort();
    assert_eq!(q[0].0, 11);
    assert!(q[0].1.contains("the key `status` appears twice"), "{q:?}");
    assert_eq!(q[1].0, 12);
    assert!(q[1].1.contains("more than one JSON value"), "{q:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_quote_that_never_closes_fails_the_object_without_a_partial_commit() {
    // Before: the six records after the stray quote became one field of one record and were
    // quarantined as one (or landed as a row of garbage): "records in 7" for 12.
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let mut csv = String::from("event_time,order_id,customer_id,status\n");
    for i in 0..5 {
        csv.push_str(&format!("{T},c{i},{i},ok\n"));
    }
    csv.push_str(&format!("{T},\"oops,6,ok\n"));
    for i in 7..13 {
        csv.push_str(&format!("{T},c{i},{i},ok\n"));
    }
    env.put("csv/stray-quote.csv", csv).await;
    // Unreadable (acknowledged, its reason beside it in quarantine), nothing committed.
    let r = env.ingest(&ingestor, "csv/stray-quote.csv").await.unwrap();
    assert_eq!(r.status, Status::Unreadable, "{r:?}");
    assert_eq!((r.records_committed, r.data_files), (0, 0), "{r:?}");
    let reason = r.reason.clone().unwrap_or_default();
    assert!(reason.contains("opened on line 7 never closes"), "{r:?}");
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert!(table.metadata().current_snapshot().is_none());
    let files = env.keys("warehouse/").await;
    assert!(files.iter().all(|k| !k.ends_with(".parquet")), "{files:?}");
}
