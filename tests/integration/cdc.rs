//! Change-record routes: `cdc = "debezium"` objects (JSON lines of Debezium envelopes) land as
//! rows of the table with `_op` and `_cdc_ts`; malformed envelopes are quarantined with a named
//! reason; `cdc = "flat"` records must carry their op/ts columns.

use std::collections::BTreeMap;

use arrow::array::{Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use floe::ingest::Status;
use futures::TryStreamExt;

use crate::harness::TestEnv;
use crate::joins::extended;

fn cdc_toml(bucket: &str) -> String {
    format!(
        r#"
[[tables]]
name = "customers"
event_time = "updated_at"
columns = [
  {{ name = "customer_id", type = "long", required = true }},
  {{ name = "name", type = "string" }},
  {{ name = "segment", type = "string" }},
  {{ name = "updated_at", type = "timestamptz", required = true }},
]

[[routes]]
bucket = "{bucket}"
prefix = "cdc/customers/"
table = "customers"
format = "jsonl"
cdc = "debezium"

[[tables]]
name = "customer_changes"
event_time = "ts"
columns = [
  {{ name = "customer_id", type = "long", required = true }},
  {{ name = "segment", type = "string" }},
  {{ name = "op", type = "string" }},
  {{ name = "ts", type = "timestamptz", required = true }},
]

[[routes]]
bucket = "{bucket}"
prefix = "cdc/flat/"
table = "customer_changes"
format = "jsonl"
cdc = "flat"
"#
    )
}

/// A Debezium row image.
fn image(id: i64, name: &str, segment: &str, at: &str) -> String {
    format!(r#"{{"customer_id":{id},"name":"{name}","segment":"{segment}","updated_at":"{at}"}}"#)
}

fn envelope(op: &str, before: Option<String>, after: Option<String>, ts_ms: i64) -> String {
    let or_null = |v: Option<String>| v.unwrap_or_else(|| "null".into());
    format!(
        r#"{{"before":{},"after":{},"source":{{"version":"2.7.0.Final","connector":"postgresql","db":"shop","table":"customers","ts_ms":{}}},"op":"{op}","ts_ms":{ts_ms}}}"#,
        or_null(before),
        or_null(after),
        ts_ms - 5
    )
}

/// The sample object: snapshot reads, an insert, updates, a delete, one envelope wrapped as
/// the JSON converter writes it with schemas on, and the malformed ones.
fn sample() -> (Vec<String>, usize) {
    let t = "2026-11-30T10:00:00Z";
    let a1 = image(1, "Ada", "silver", t);
    let a2 = image(1, "Ada", "gold", "2026-11-30T10:05:00Z");
    let b1 = image(2, "Bob", "bronze", t);
    let c1 = image(3, "Cy", "silver", "2026-11-30T10:01:00Z");
    let c2 = image(3, "Cy", "gold", "2026-11-30T10:06:00Z");
    let good = vec![
        envelope("r", None, Some(a1.clone()), 1_764_496_800_000),
        envelope("r", None, Some(b1.clone()), 1_764_496_800_001),
        envelope("c", None, Some(c1.clone()), 1_764_496_860_000),
        envelope("u", Some(a1), Some(a2), 1_764_497_100_000),
        format!(
            r#"{{"schema":{{"type":"struct","name":"shop.customers.Envelope"}},"payload":{}}}"#,
            envelope("u", Some(c1), Some(c2.clone()), 1_764_497_160_000)
        ),
        envelope("d", Some(b1), None, 1_764_497_200_000),
    ];
    let mut lines = good.clone();
    lines.extend([
        // no `op`
        r#"{"before":null,"after":{"customer_id":9},"ts_ms":1}"#.to_string(),
        // a tombstone (Kafka's delete marker after a `d`)
        "null".to_string(),
        // a truncate carries no row
        r#"{"op":"t","ts_ms":1764497300000,"source":{}}"#.to_string(),
        // a delete without its before-image
        envelope("d", None, None, 1_764_497_300_000),
        // not JSON
        r#"{"after": {"customer_id": 4"#.to_string(),
        // over max_line_bytes (set to 4096 below): the limit still applies
        envelope(
            "c",
            None,
            Some(image(5, &"x".repeat(5000), "gold", t)),
            1_764_497_300_000,
        ),
    ]);
    (lines, good.len())
}

async fn rows(env: &TestEnv, table: &str) -> Vec<RecordBatch> {
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let ident = floe::catalog::table_ident(&env.config, table).unwrap();
    let t = catalog.load_table(&ident).await.unwrap();
    t.scan()
        .build()
        .unwrap()
        .to_arrow()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

async fn quarantined(env: &TestEnv, r: &floe::ingest::ObjectReport) -> Vec<serde_json::Value> {
    let q = r.quarantine.clone().expect("a quarantine object");
    let key = q.trim_start_matches(&format!("s3://{}/", env.bucket));
    let body = String::from_utf8(env.get(key).await.expect("quarantine object")).unwrap();
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_envelopes_land_as_rows_with_op_and_change_time() {
    let base = TestEnv::new("sqlite").await;
    let mut env = extended(&base, &cdc_toml(&base.bucket));
    env.config.ingest.max_line_bytes = 4096;
    let ingestor = env.ingestor().await;
    let (lines, good) = sample();
    env.put("cdc/customers/0001.jsonl", lines.join("\n")).await;
    let r = env
        .ingest(&ingestor, "cdc/customers/0001.jsonl")
        .await
        .unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (lines.len() as u64, good as u64, (lines.len() - good) as u64),
        "{r:?}"
    );
    assert!(
        r.schema_change.is_none(),
        "envelope keys are not columns: {r:?}"
    );

    // Each change is one row: the row image, its op and its change time.
    let batches = rows(&env, "customers").await;
    let mut got: BTreeMap<(String, i64), (i64, String)> = BTreeMap::new();
    for b in &batches {
        let col = |n: &str| b.column_by_name(n).unwrap_or_else(|| panic!("column {n}"));
        let op = col("_op");
        let op = op.as_any().downcast_ref::<StringArray>().unwrap();
        let ts = col("_cdc_ts");
        let ts = ts
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .unwrap();
        let id = col("customer_id");
        let id = id.as_any().downcast_ref::<Int64Array>().unwrap();
        let seg = col("segment");
        let seg = seg.as_any().downcast_ref::<StringArray>().unwrap();
        for i in 0..b.num_rows() {
            got.insert(
                (op.value(i).to_string(), ts.value(i)),
                (id.value(i), seg.value(i).to_string()),
            );
        }
    }
    let ops: Vec<(&str, i64)> = got
        .iter()
        .map(|((o, _), (id, _))| (o.as_str(), *id))
        .collect();
    assert_eq!(
        ops,
        [("c", 3), ("d", 2), ("r", 1), ("r", 2), ("u", 1), ("u", 3)],
        "{got:?}"
    );
    // The delete carries its before-image; updates their after-image; ts_ms in µs.
    assert_eq!(got[&("d".to_string(), 1_764_497_200_000_000)].1, "bronze");
    assert_eq!(got[&("u".to_string(), 1_764_497_100_000_000)].1, "gold");
    assert_eq!(
        got[&("u".to_string(), 1_764_497_160_000_000)].1,
        "gold",
        "the schema/payload wrapper"
    );

    // Every malformed envelope is quarantined, named, with the envelope as it came.
    let q = quarantined(&env, &r).await;
    let mut reasons: Vec<(u64, String, String)> = q
        .iter()
        .map(|l| {
            (
                l["record"].as_u64().unwrap(),
                l["reason"].as_str().unwrap().to_string(),
                l["raw"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    reasons.sort();
    let expect = [
        "no `op`",
        "tombstone",
        "not c, u, d or r",
        "needs its row in `before`",
        "not one JSON value",
        "max_line_bytes = 4096",
    ];
    assert_eq!(reasons.len(), expect.len(), "{reasons:?}");
    for ((line, reason, raw), says) in reasons.iter().zip(expect) {
        assert!(reason.contains(says), "line {line}: {reason}");
        if !says.starts_with("max_line") {
            assert!(reason.contains("malformed Debezium envelope"), "{reason}");
            assert_eq!(raw, &lines[*line as usize - 1], "line {line}");
        }
    }

    // An independent reader sees the same rows and columns.
    let py = env.pyiceberg_table("customers");
    assert_eq!(py["rows"], good, "{py}");
}

#[tokio::test]
async fn flat_change_records_need_their_op_and_time_columns() {
    let base = TestEnv::new("sqlite").await;
    let env = extended(&base, &cdc_toml(&base.bucket));
    let ingestor = env.ingestor().await;
    let body = [
        r#"{"customer_id":1,"segment":"gold","op":"c","ts":"2026-11-30T10:00:00Z"}"#,
        r#"{"customer_id":1,"segment":"silver","op":"u","ts":"2026-11-30T10:01:00Z"}"#,
        r#"{"customer_id":1,"segment":"silver","ts":"2026-11-30T10:02:00Z"}"#,
    ]
    .join("\n");
    env.put("cdc/flat/0001.jsonl", body).await;
    let r = env.ingest(&ingestor, "cdc/flat/0001.jsonl").await.unwrap();
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (3, 2, 1),
        "{r:?}"
    );
    let q = quarantined(&env, &r).await;
    assert!(q[0]["reason"].as_str().unwrap().contains("`op`"), "{q:?}");
    let batches = rows(&env, "customer_changes").await;
    assert!(
        batches.iter().all(|b| b.column_by_name("_op").is_none()),
        "flat records are not transformed"
    );
}

#[tokio::test]
async fn a_table_whose_route_becomes_debezium_gains_op_and_change_time() {
    let base = TestEnv::new("sqlite").await;
    let toml = cdc_toml(&base.bucket);
    let before = extended(&base, &toml.replacen("cdc = \"debezium\"\n", "", 1));
    let plain = before.ingestor().await;
    before
        .put(
            "cdc/customers/plain.jsonl",
            image(7, "Eve", "gold", "2026-11-30T10:00:00Z"),
        )
        .await;
    before
        .ingest(&plain, "cdc/customers/plain.jsonl")
        .await
        .unwrap();
    let env = extended(&base, &toml);
    let ingestor = env.ingestor().await;
    let (lines, good) = sample();
    env.put("cdc/customers/0001.jsonl", lines[..good].join("\n"))
        .await;
    let r = env
        .ingest(&ingestor, "cdc/customers/0001.jsonl")
        .await
        .unwrap();
    assert_eq!(r.records_committed, good as u64, "{r:?}");
    let change = r.schema_change.clone().unwrap_or_default();
    assert!(
        change.contains("_op") && change.contains("_cdc_ts"),
        "{r:?}"
    );
    let batches = rows(&env, "customers").await;
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(total, good + 1);
    let nulls: usize = batches
        .iter()
        .map(|b| b.column_by_name("_op").unwrap().null_count())
        .sum();
    assert_eq!(nulls, 1, "the row from before the change has no op");
}

#[tokio::test]
async fn debezium_rows_keep_numbers_exactly_as_a_plain_route_does() {
    let base = TestEnv::new("sqlite").await;
    let table = |name: &str, cdc: &str| {
        format!(
            r#"
[[tables]]
name = "{name}"
event_time = "at"
columns = [
  {{ name = "id", type = "string", required = true }},
  {{ name = "amount", type = "decimal(38,18)" }},
  {{ name = "big", type = "decimal(38,0)" }},
  {{ name = "at", type = "timestamptz", required = true }},
]

[[routes]]
bucket = "{bucket}"
prefix = "{name}/"
table = "{name}"
format = "jsonl"
{cdc}
"#,
            bucket = base.bucket
        )
    };
    let toml = format!(
        "{}{}",
        table("payments_plain", ""),
        table("payments_cdc", "cdc = \"debezium\"")
    );
    let env = extended(&base, &toml);
    let ingestor = env.ingestor().await;
    let row = r#"{"id":"p1","amount":1.123456789012345678,"big":12345678901234567890123,"at":"2026-11-30T10:00:00Z"}"#;
    env.put("payments_plain/0001.jsonl", row).await;
    env.put(
        "payments_cdc/0001.jsonl",
        format!(r#"{{"op":"c","ts_ms":1,"before":null,"after":{row}}}"#),
    )
    .await;
    for key in ["payments_plain/0001.jsonl", "payments_cdc/0001.jsonl"] {
        let r = env.ingest(&ingestor, key).await.unwrap();
        assert_eq!(r.records_committed, 1, "{key}: {r:?}");
    }
    let values = |batches: Vec<RecordBatch>| {
        let b = &batches[0];
        let text = |n: &str| {
            let c = b.column_by_name(n).unwrap();
            arrow::util::display::array_value_to_string(c, 0).unwrap()
        };
        (text("amount"), text("big"))
    };
    let plain = values(rows(&env, "payments_plain").await);
    let cdc = values(rows(&env, "payments_cdc").await);
    assert_eq!(
        plain,
        (
            "1.123456789012345678".to_string(),
            "12345678901234567890123".to_string()
        )
    );
    assert_eq!(cdc, plain, "a Debezium row is the row as it came");
}
