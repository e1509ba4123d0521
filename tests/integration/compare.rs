//! `floe compare` against a deliberately drifted "legacy" output: one rule changed (eu-west
//! amounts +10 % on one day), one key renamed, the last day missing, a column under another name,
//! the output split over a Parquet object, a gzip JSON-lines object and a `_SUCCESS` marker. Each
//! difference must be named, and nothing else.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Float64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use chrono::{DateTime, TimeZone, Utc};
use floe::compare::{compare, Against, CompareSpec};

use crate::harness::TestEnv;

/// One row of the floe table, as the legacy system would have produced it.
#[derive(Clone)]
struct Row {
    order_id: String,
    amount: f64,
    region: String,
    event_time: i64,
}

fn day_of(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .unwrap()
        .format("%Y-%m-%d")
        .to_string()
}

async fn floe_rows(env: &TestEnv) -> Vec<Row> {
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let mut out = Vec::new();
    for b in env.scan_all(catalog.as_ref()).await {
        let s = |n: &str| {
            b.column_by_name(n)
                .unwrap()
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .clone()
        };
        let (ids, regions) = (s("order_id"), s("region"));
        let amounts = b.column_by_name("amount").unwrap();
        let amounts = amounts.as_any().downcast_ref::<Float64Array>().unwrap();
        let times = b.column_by_name("event_time").unwrap();
        let times = times
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .unwrap();
        for i in 0..b.num_rows() {
            out.push(Row {
                order_id: ids.value(i).to_string(),
                amount: amounts.value(i),
                region: regions.value(i).to_string(),
                event_time: times.value(i),
            });
        }
    }
    out.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    out
}

fn parquet_of(rows: &[Row]) -> Vec<u8> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Utf8, false),
        Field::new("total", DataType::Float64, true),
        Field::new("region", DataType::Utf8, true),
        Field::new(
            "event_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.order_id.clone()),
        )),
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|r| r.amount),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.region.clone()),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.event_time))
                .with_timezone("UTC"),
        ),
    ];
    let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
    let mut buf = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    buf
}

fn jsonl_of(rows: &[Row]) -> String {
    rows.iter()
        .map(|r| {
            serde_json::json!({
                "order_id": r.order_id,
                "total": r.amount,
                "region": r.region,
                "event_time": DateTime::<Utc>::from_timestamp_micros(r.event_time).unwrap().to_rfc3339(),
                "legacy_only": "ignored",
            })
            .to_string()
                + "\n"
        })
        .collect()
}

fn spec(env: &TestEnv) -> CompareSpec {
    let mut spec = CompareSpec::from_config(&env.config, "orders");
    spec.keys = vec!["order_id".into()];
    spec.measures = vec!["amount".into()];
    spec.rename = BTreeMap::from([("total".to_string(), "amount".to_string())]);
    spec.sample = 1000;
    spec
}

#[tokio::test]
async fn a_drifted_legacy_output_is_named_difference_by_difference() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    // Three days around noon UTC, 150 orders each.
    let base = Utc.with_ymd_and_hms(2026, 11, 20, 12, 0, 0).unwrap();
    for (i, late_days) in [2i64, 1, 0].iter().enumerate() {
        let key = format!("orders/day-{i}.jsonl");
        env.put(
            &key,
            floe::sample::late_orders_jsonl(150, 40 + i as u64, base, late_days * 86_400),
        )
        .await;
        env.ingest(&ingestor, &key).await.expect("ingest");
    }
    let rows = floe_rows(&env).await;
    assert_eq!(rows.len(), 450);
    let (d1, d2, d3) = ("2026-11-18", "2026-11-19", "2026-11-20");

    // A faithful export first: everything matches.
    let faithful: Vec<Row> = rows.clone();
    env.put("faithful/part-0.parquet", parquet_of(&faithful))
        .await;
    let against = Against::Objects {
        uri: format!("s3://{}/faithful/", env.bucket),
        format: None,
    };
    let report = compare(&env.config, "orders", &against, &spec(&env))
        .await
        .unwrap();
    assert!(report.matches, "{report:#?}");
    assert_eq!(report.rows.floe, 450);
    assert_eq!(report.rows.against, 450);
    assert_eq!(report.windows.len(), 3);

    // The drifted legacy output.
    let renamed = rows
        .iter()
        .find(|r| day_of(r.event_time) == d1)
        .unwrap()
        .order_id
        .clone();
    let mut legacy: Vec<Row> = Vec::new();
    let mut rule_changed = 0;
    for r in &rows {
        let day = day_of(r.event_time);
        if day == d3 {
            continue; // the late day never arrived
        }
        let mut l = r.clone();
        if l.order_id == renamed {
            l.order_id = format!("{renamed}-legacy");
        }
        if day == d2 && l.region == "eu-west" {
            l.amount = (l.amount * 1.1 * 100.0).round() / 100.0;
            if l.amount != r.amount {
                rule_changed += 1;
            }
        }
        legacy.push(l);
    }
    assert!(rule_changed > 0);
    let (first, second): (Vec<Row>, Vec<Row>) =
        legacy.into_iter().partition(|r| day_of(r.event_time) == d1);
    env.put("legacy/day1.parquet", parquet_of(&first)).await;
    env.put(
        "legacy/day2.jsonl.gz",
        floe::sample::gzip(jsonl_of(&second).as_bytes()),
    )
    .await;
    env.put("legacy/_SUCCESS", "").await;
    let against = Against::Objects {
        uri: format!("s3://{}/legacy/", env.bucket),
        format: None,
    };
    let report = compare(&env.config, "orders", &against, &spec(&env))
        .await
        .unwrap();
    assert!(!report.matches);
    assert_eq!(report.objects_read, 2, "the marker is not data");
    let by_day: BTreeMap<String, &floe::compare::WindowReport> = report
        .windows
        .iter()
        .map(|w| (w.window_start.clone().unwrap(), w))
        .collect();
    // Day 1: same counts and sums (a renamed key moves no totals)...
    assert!(by_day[d1].differences.is_empty(), "{:?}", by_day[d1]);
    // ...day 2: only the changed rule's sum...
    let w2 = by_day[d2];
    assert_eq!(w2.rows.floe, w2.rows.against);
    assert_eq!(w2.differences.len(), 1, "{:?}", w2.differences);
    assert!(
        w2.differences[0].starts_with("sum(amount)"),
        "{:?}",
        w2.differences
    );
    // ...day 3: missing on the legacy side.
    let w3 = by_day[d3];
    assert_eq!((w3.rows.floe, w3.rows.against), (150, 0));
    assert!(w3
        .differences
        .iter()
        .any(|d| d.starts_with("rows 150 vs 0")));
    // Keys: the renamed one on both sides, the missing day's on the legacy side.
    assert_eq!(report.missing_in_floe.count, 1);
    assert_eq!(
        report.missing_in_floe.keys,
        vec![format!("{renamed}-legacy")]
    );
    assert_eq!(report.missing_in_against.count, 151);
    assert!(report.missing_in_against.keys.contains(&renamed));
    // Records: exactly the changed rule's, in `amount`.
    assert_eq!(report.differing.count, rule_changed);
    assert_eq!(
        report.differing.by_column,
        BTreeMap::from([("amount".to_string(), rule_changed)])
    );
    assert!(report.differing.rows.iter().all(|d| d.column == "amount"));
    assert!(report.unreadable_against.is_empty());
    assert_eq!(report.duplicate_keys_against.count, 0);

    // A time range narrows both sides: day 1 alone matches except the renamed key.
    let mut narrow = spec(&env);
    narrow.since = Some(Utc.with_ymd_and_hms(2026, 11, 18, 0, 0, 0).unwrap());
    narrow.until = Some(Utc.with_ymd_and_hms(2026, 11, 19, 0, 0, 0).unwrap());
    let report = compare(&env.config, "orders", &against, &narrow)
        .await
        .unwrap();
    assert_eq!(report.windows.len(), 1);
    assert_eq!(
        (
            report.missing_in_floe.count,
            report.missing_in_against.count
        ),
        (1, 1)
    );
    assert_eq!(report.differing.count, 0);
}

#[tokio::test]
async fn another_iceberg_table_is_a_source_and_duplicates_are_named() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let base = Utc.with_ymd_and_hms(2026, 11, 20, 12, 0, 0).unwrap();
    let text = floe::sample::late_orders_jsonl(120, 7, base, 0);
    env.put("orders/a.jsonl", text.clone()).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    // The other table holds the same records, one of them twice.
    let dup = text.lines().next().unwrap().to_string();
    env.put("consumer/a.jsonl", text.clone()).await;
    env.put("consumer/b.jsonl", format!("{dup}\n")).await;
    env.ingest(&ingestor, "consumer/a.jsonl").await.unwrap();
    env.ingest(&ingestor, "consumer/b.jsonl").await.unwrap();
    let mut s = spec(&env);
    s.rename.clear();
    let against = Against::Table {
        config: Box::new(env.config.clone()),
        table: "orders_consumer".into(),
    };
    let report = compare(&env.config, "orders", &against, &s).await.unwrap();
    assert!(!report.matches);
    assert_eq!(report.rows.against, 121);
    assert_eq!(report.duplicate_keys_against.count, 1);
    assert_eq!(report.duplicate_keys_floe.count, 0);
    assert_eq!(
        report.missing_in_floe.count + report.missing_in_against.count,
        0
    );
    assert_eq!(report.differing.count, 0);
    let w = &report.windows[0];
    assert_eq!((w.rows.floe, w.rows.against), (120, 121));
    assert_eq!((w.distinct_keys.floe, w.distinct_keys.against), (120, 120));
    // And the table against itself matches.
    let same = Against::Table {
        config: Box::new(env.config.clone()),
        table: "orders".into(),
    };
    assert!(
        compare(&env.config, "orders", &same, &s)
            .await
            .unwrap()
            .matches
    );
}
