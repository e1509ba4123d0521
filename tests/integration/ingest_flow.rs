//! The ingest path end to end: S3 → SQS notification → handler → commit; formats; bad input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use floe::ingest::Status;
use serde_json::json;

use crate::harness::{orders, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_notification_through_sqs_commits_once_and_pyiceberg_reads_it() {
    let env = TestEnv::new("sqlite").await;
    let cfg =
        floe::store::sdk_config(&crate::harness::storage(), Some(crate::harness::moto())).await;
    let sqs = aws_sdk_sqs::Client::new(&cfg);
    let queue = sqs
        .create_queue()
        .queue_name(&env.bucket)
        .send()
        .await
        .unwrap();
    let queue_url = queue.queue_url().unwrap().to_string();
    let arn = format!("arn:aws:sqs:us-east-1:123456789012:{}", env.bucket);
    use aws_sdk_s3::types::{
        Event, FilterRule, FilterRuleName, NotificationConfiguration,
        NotificationConfigurationFilter, QueueConfiguration, S3KeyFilter,
    };
    env.s3
        .put_bucket_notification_configuration()
        .bucket(&env.bucket)
        .notification_configuration(
            NotificationConfiguration::builder()
                .queue_configurations(
                    QueueConfiguration::builder()
                        .queue_arn(arn)
                        .events(Event::S3ObjectCreated)
                        .filter(
                            NotificationConfigurationFilter::builder()
                                .key(
                                    S3KeyFilter::builder()
                                        .filter_rules(
                                            FilterRule::builder()
                                                .name(FilterRuleName::Prefix)
                                                .value("orders/")
                                                .build(),
                                        )
                                        .build(),
                                )
                                .build(),
                        )
                        .build()
                        .unwrap(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();

    let ingestor = env.ingestor().await;
    env.put(
        "orders/day one/a.jsonl.gz",
        floe::sample::gzip(orders(300, 1).as_bytes()),
    )
    .await;
    env.put("orders/b.jsonl", orders(200, 2)).await;

    // Collect what S3 delivered (a test event, the two objects, maybe duplicates) into one Lambda batch.
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let out = sqs
            .receive_message()
            .queue_url(&queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        for m in out.messages() {
            records.push(json!({"messageId": m.message_id(), "receiptHandle": m.receipt_handle(), "body": m.body(), "eventSource": "aws:sqs"}));
        }
        let objects = records
            .iter()
            .filter(|r| r["body"].as_str().unwrap_or("").contains("ObjectCreated"))
            .count();
        if objects >= 2 {
            break;
        }
    }
    assert!(
        records.len() >= 2,
        "S3 notifications reached SQS: {records:?}"
    );
    // A message that can never be understood fails alone (partial batch response); the rest land.
    let mut with_poison = records.clone();
    with_poison.push(json!({"messageId": "poison", "receiptHandle": "r", "body": "{not json", "eventSource": "aws:sqs"}));
    let result = ingestor
        .handle_payload(
            &json!({ "Records": with_poison }),
            Instant::now() + Duration::from_secs(120),
        )
        .await;
    assert_eq!(result.errors.len(), 1, "{:?}", result.errors);
    let response = floe::lambda::ingest_response(&result).unwrap();
    assert_eq!(
        response["batchItemFailures"],
        json!([{"itemIdentifier": "poison"}]),
        "{response}"
    );
    let payload = json!({ "Records": records });
    let committed: Vec<_> = result
        .reports
        .iter()
        .filter(|r| r.status == Status::Committed)
        .collect();
    assert_eq!(committed.len(), 2, "{:?}", result.reports);
    assert!(
        committed
            .iter()
            .any(|r| r.object.ends_with("orders/day one/a.jsonl.gz")),
        "key decoded: {:?}",
        result.reports
    );

    // Redeliver the batch: nothing is added.
    let again = ingestor
        .handle_payload(&payload, Instant::now() + Duration::from_secs(120))
        .await;
    assert!(
        again.reports.iter().all(|r| r.status == Status::Duplicate),
        "{:?}",
        again.reports
    );
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 500);

    let py = env.pyiceberg();
    assert_eq!(py["rows"], 500, "{py}");
    assert_eq!(py["distinct_order_ids"], 500, "{py}");
    // Both objects came in one SQS batch: one commit naming both ([ingest] batch_commits).
    assert_eq!(py["snapshots"], 1, "{py}");
    assert_eq!(py["operation"], "append");
    let cols: Vec<&str> = py["columns"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    assert!(
        cols.contains(&"_ingested_at") && cols.contains(&"_source") && cols.contains(&"event_time"),
        "{cols:?}"
    );
    assert!(py["required"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c == "order_id"));
    assert_eq!(py["partition_fields"][0], "event_time_day");
    let summary = &py["summary"];
    assert_eq!(summary["records-in"], summary["records-committed"]);
    assert_eq!(summary["records-quarantined"], "0");
    assert!(summary["floe.source-objects"]
        .as_str()
        .unwrap()
        .contains(&env.bucket));
}

fn parquet_bytes() -> Vec<u8> {
    // customer_id as int32 (widened to long), amount as text with one unconvertible value.
    let cols: Vec<(&str, ArrayRef)> = vec![
        (
            "order_id",
            Arc::new(StringArray::from(vec![
                Some("p1"),
                Some("p2"),
                None,
                Some("p4"),
            ])),
        ),
        ("customer_id", Arc::new(Int32Array::from(vec![1, 2, 3, 4]))),
        (
            "amount",
            Arc::new(StringArray::from(vec!["1.5", "abc", "3", "4.25"])),
        ),
        (
            "event_time",
            Arc::new(StringArray::from(vec!["2026-11-30T10:00:00Z"; 4])),
        ),
        ("surplus", Arc::new(StringArray::from(vec!["x"; 4]))),
    ];
    let batch = RecordBatch::try_from_iter(cols).unwrap();
    let mut buf = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    buf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn formats_bad_records_and_quarantine_reconcile() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;

    let mut jsonl = orders(50, 3);
    jsonl.push_str("{\"order_id\": \"cut off\n");
    jsonl.push_str(
        "{\"order_id\":\"t1\",\"customer_id\":\"seven\",\"event_time\":\"2026-11-30T10:00:00Z\"}\n",
    );
    jsonl.push_str("{\"customer_id\":8,\"event_time\":\"2026-11-30T10:00:00Z\"}\n");
    jsonl.push_str("{\"order_id\":\"t3\",\"customer_id\":9,\"coupon\":\"X\",\"event_time\":\"2026-11-30T10:00:00Z\"}\n");
    jsonl.push_str(&orders(20, 4));
    env.put("orders/mixed.jsonl", jsonl).await;
    let r = env.ingest(&ingestor, "orders/mixed.jsonl").await.unwrap();
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (74, 71, 3),
        "{r:?}"
    );
    // Additive policy (the default): the new field became an optional column in this commit.
    assert!(r.unknown_fields.is_empty(), "{r:?}");
    assert_eq!(r.schema_change.as_deref(), Some("added coupon (string)"));
    let qkey = r.quarantine.clone().unwrap();
    let qkey = qkey.trim_start_matches(&format!("s3://{}/", env.bucket));
    let q = String::from_utf8(env.get(qkey).await.unwrap()).unwrap();
    let lines: Vec<serde_json::Value> = q
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let records: Vec<u64> = lines
        .iter()
        .map(|l| l["record"].as_u64().unwrap())
        .collect();
    assert_eq!(records, vec![51, 52, 53]);
    assert!(lines.iter().all(|l| l["source"]
        .as_str()
        .unwrap()
        .ends_with("orders/mixed.jsonl")));
    assert_eq!(lines[0]["raw"], "{\"order_id\": \"cut off");
    assert!(
        lines[2]["reason"].as_str().unwrap().contains("order_id"),
        "{}",
        lines[2]
    );

    // zstd JSON lines, detected by magic bytes (no suffix)
    let zst = zstd::encode_all(orders(40, 5).as_bytes(), 3).unwrap();
    env.put("orders/batch-zstd", zst).await;
    let r = env.ingest(&ingestor, "orders/batch-zstd").await.unwrap();
    assert_eq!((r.records_in, r.records_committed), (40, 40), "{r:?}");

    // CSV with a header, one bad row
    let mut csv = String::from("event_time,order_id,customer_id,amount\n");
    for i in 0..30 {
        csv.push_str(&format!("2026-11-30T10:00:00Z,c{i},{i},{i}.5\n"));
    }
    csv.push_str("2026-11-30T10:00:00Z,cbad,NaN-ish,1\n");
    env.put("csv/a.csv", csv).await;
    let r = env.ingest(&ingestor, "csv/a.csv").await.unwrap();
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (31, 30, 1),
        "{r:?}"
    );

    // Parquet: cast int32→long, text→double with one unconvertible value, a null required field
    env.put("parquet/p.parquet", parquet_bytes()).await;
    let r = env.ingest(&ingestor, "parquet/p.parquet").await.unwrap();
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (4, 2, 2),
        "{r:?}"
    );
    assert_eq!(r.schema_change.as_deref(), Some("added surplus (string)"));

    let total = 71 + 40 + 30 + 2;
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, total);
    let py = env.pyiceberg();
    assert_eq!(py["rows"], total, "{py}");
    assert_eq!(py["summary"]["records-in"], "4");
    assert_eq!(py["summary"]["records-quarantined"], "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_objects_are_quarantined_whole_and_unrouted_refused() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let mut corrupt = floe::sample::gzip(orders(100, 6).as_bytes());
    let n = corrupt.len();
    corrupt[n / 2..]
        .iter_mut()
        .for_each(|b| *b = b.wrapping_add(7));
    env.put("orders/corrupt.jsonl.gz", corrupt).await;
    env.put("orders/empty.jsonl", Vec::new()).await;
    env.put("parquet/not.parquet", b"this is not parquet".to_vec())
        .await;
    for key in [
        "orders/corrupt.jsonl.gz",
        "orders/empty.jsonl",
        "parquet/not.parquet",
    ] {
        let r = env.ingest(&ingestor, key).await.unwrap();
        assert_eq!(r.status, Status::Unreadable, "{key}: {r:?}");
        let q = r.quarantine.clone().unwrap();
        let qkey = q
            .trim_start_matches(&format!("s3://{}/", env.bucket))
            .to_string();
        let doc: serde_json::Value =
            serde_json::from_slice(&env.get(&qkey).await.unwrap()).unwrap();
        assert!(doc["source"].as_str().unwrap().ends_with(key));
        assert!(!doc["error"].as_str().unwrap().is_empty());
        // Delivered again: quarantined again at the same key, still not an error (no retry loop).
        let again = env.ingest(&ingestor, key).await.unwrap();
        assert_eq!(again.quarantine, r.quarantine);
    }
    env.put("elsewhere/x.jsonl", orders(3, 7)).await;
    let r = env.ingest(&ingestor, "elsewhere/x.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Unrouted);
    assert!(r.reason.unwrap().contains("elsewhere/x.jsonl"));
    // Nothing reached the table and no data file was left behind.
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert!(table.metadata().current_snapshot().is_none());
    assert!(
        env.keys("warehouse/")
            .await
            .iter()
            .all(|k| !k.ends_with(".parquet")),
        "{:?}",
        env.keys("warehouse/").await
    );
    // A deleted object is reported missing, not retried forever.
    let r = env
        .ingest(&ingestor, "orders/never-existed.jsonl")
        .await
        .unwrap();
    assert_eq!(r.status, Status::Missing);
}

#[tokio::test]
async fn sensitive_fields_are_hashed_with_a_key_from_ssm_or_dropped() {
    use arrow::array::{Array, StringArray};
    let mut env = TestEnv::new("sqlite").await;
    let sdk =
        floe::store::sdk_config(&crate::harness::storage(), Some(crate::harness::moto())).await;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let name = format!("/floe/{}", crate::harness::unique("hash-key"));
    ssm.put_parameter()
        .name(&name)
        .value("s3cr3t")
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .unwrap();
    env.config.ingest.hash_key_parameter = Some(name);
    env.config.ingest.ssm_endpoint = Some(crate::harness::moto().to_string());
    let t = env
        .config
        .tables
        .iter_mut()
        .find(|t| t.name == "orders")
        .unwrap();
    for c in t.columns.iter_mut() {
        match c.name.as_str() {
            "payment_method" => c.sensitive = Some(floe::config::Sensitive::Hash),
            "currency" => c.sensitive = Some(floe::config::Sensitive::Drop),
            _ => {}
        }
    }
    let text = orders(50, 5);
    let by_id: std::collections::HashMap<String, String> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["order_id"].as_str().unwrap().to_string(),
                v["payment_method"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    env.put("orders/pii.jsonl", text).await;
    let ingestor = env.ingestor().await;
    let r = env.ingest(&ingestor, "orders/pii.jsonl").await.unwrap();
    assert_eq!(r.records_committed, 50);
    let mut seen = 0;
    for b in env.scan_all(ingestor.catalog().as_ref()).await {
        let ids = b
            .column_by_name("order_id")
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone();
        let pm = b
            .column_by_name("payment_method")
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone();
        assert_eq!(
            b.column_by_name("currency").unwrap().null_count(),
            b.num_rows(),
            "dropped"
        );
        for i in 0..b.num_rows() {
            let original = &by_id[ids.value(i)];
            assert_eq!(pm.value(i), floe::protect::hmac_hex(b"s3cr3t", original));
            assert_ne!(pm.value(i), original);
            seen += 1;
        }
    }
    assert_eq!(seen, 50);
}

/// A table another engine created in Iceberg format 1 (review helper-28): floe writes format-2
/// manifests and manifest lists, so its commit is refused before anything is written, naming
/// the version, and the table stays as it was. Before, an ingest committed v2 manifests into
/// the v1 table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_table_is_refused_not_written_with_format_2_manifests() {
    let env = TestEnv::new("sqlite").await;
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let table = env.config.table("orders").unwrap();
    let creation = iceberg::TableCreation::builder()
        .name("orders".to_string())
        .schema(floe::schema::table_schema(table).unwrap())
        .format_version(iceberg::spec::FormatVersion::V1)
        .build();
    catalog
        .create_namespace(env.ident().namespace(), Default::default())
        .await
        .unwrap();
    catalog
        .create_table(env.ident().namespace(), creation)
        .await
        .unwrap();
    let created = catalog.load_table(&env.ident()).await.unwrap();
    assert_eq!(
        created.metadata().format_version(),
        iceberg::spec::FormatVersion::V1
    );
    let ingestor = env.ingestor().await;
    env.put("orders/v1.jsonl", orders(5, 3)).await;
    let e = env
        .ingest(&ingestor, "orders/v1.jsonl")
        .await
        .expect_err("a format 1 table must be refused");
    assert!(!e.is_retryable(), "{e}");
    assert!(
        e.to_string().contains("format 1") || e.to_string().contains("format v1"),
        "{e}"
    );
    let t = catalog.load_table(&env.ident()).await.unwrap();
    assert!(
        t.metadata().current_snapshot().is_none(),
        "nothing committed"
    );
}
