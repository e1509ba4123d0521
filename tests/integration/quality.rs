//! Data-quality contracts at ingest (`[[tables.checks]]`): objects violating each check kind,
//! the three actions (quarantine with the check named, flag into `_quality`, fail the object
//! whole), the counts in the snapshot summary, and a changed contract applying from the next
//! object.

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray};
use floe::config::{CheckConfig, Config};
use floe::ingest::{ObjectReport, Status};
use serde_json::json;

use crate::harness::TestEnv;

/// A sample order line; `f` adjusts its fields.
fn order(id: &str, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> String {
    let now = chrono::Utc::now() - chrono::Duration::seconds(30);
    let mut m = json!({
        "order_id": id,
        "customer_id": 7,
        "region": "eu-west",
        "amount": 12.5,
        "currency": "EUR",
        "items": 2,
        "status": "paid",
        "payment_method": "card",
        "event_time": now.to_rfc3339(),
    })
    .as_object()
    .cloned()
    .unwrap_or_default();
    f(&mut m);
    format!("{}\n", serde_json::Value::Object(m))
}

fn good(n: usize) -> String {
    (0..n)
        .map(|i| order(&format!("ok-{i:03}"), |_| {}))
        .collect()
}

/// The test config with `checks` (inline TOML tables, one per line) on `orders`.
async fn env_with(checks: &[&str]) -> TestEnv {
    let extra = if checks.is_empty() {
        String::new()
    } else {
        format!("checks = [\n  {},\n]", checks.join(",\n  "))
    };
    TestEnv::with_orders_toml("sqlite", &extra).await
}

/// `checks` (inline TOML tables) parsed as a table's contract.
fn parse_checks(checks: &[&str]) -> Vec<CheckConfig> {
    let text = format!(
        "[catalog]\nkind = \"sqlite\"\nwarehouse = \"file:///tmp/wh\"\n{}",
        floe::sample::ORDERS_TABLE_TOML.replace(
            "target_file_size_mb = 128",
            &format!(
                "target_file_size_mb = 128\nchecks = [\n  {},\n]",
                checks.join(",\n  ")
            ),
        )
    );
    Config::parse(&text, "test")
        .expect("config")
        .tables
        .remove(0)
        .checks
}

/// The quarantined records of `r`.
async fn quarantined(env: &TestEnv, r: &ObjectReport) -> Vec<serde_json::Value> {
    let q = r.quarantine.clone().expect("a quarantine object");
    let key = q.trim_start_matches(&format!("s3://{}/", env.bucket));
    let body = String::from_utf8(env.get(key).await.expect("quarantine object")).unwrap();
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The current snapshot's summary.
async fn summary(env: &TestEnv, ingestor: &floe::ingest::Ingestor) -> BTreeMap<String, String> {
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let snap = table.metadata().current_snapshot().expect("a snapshot");
    snap.summary()
        .additional_properties
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

const EVERY_KIND: &[&str] = &[
    r#"{ name = "has_region", kind = "not_null", column = "region" }"#,
    r#"{ name = "amount_range", kind = "range", column = "amount", min = 0, max = 100000 }"#,
    r#"{ name = "not_future", kind = "range", column = "event_time", max_future_seconds = 300 }"#,
    r#"{ name = "known_currency", kind = "accepted", column = "currency", values = ["EUR", "USD", "GBP", "JPY"] }"#,
    r#"{ name = "id_format", kind = "regex", column = "order_id", pattern = "^[a-z]+-[0-9]+$" }"#,
    r#"{ name = "short_status", kind = "max_length", column = "status", max = 10 }"#,
    r#"{ name = "one_per_order", kind = "unique", columns = ["order_id"] }"#,
    r#"{ name = "items_for_big", kind = "sql", expr = "amount < 1000 OR items > 1" }"#,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_check_kind_quarantines_its_violations_with_the_check_named() {
    let env = env_with(EVERY_KIND).await;
    let ingestor = env.ingestor().await;
    let future = (chrono::Utc::now() + chrono::Duration::hours(2)).to_rfc3339();
    let mut body = good(10);
    // One record violating each check, in EVERY_KIND's order.
    let bad = [
        order("bad-1", |m| {
            m.remove("region");
        }),
        order("bad-2", |m| {
            m.insert("amount".into(), json!(-5));
        }),
        order("bad-3", |m| {
            m.insert("event_time".into(), json!(future));
        }),
        order("bad-4", |m| {
            m.insert("currency".into(), json!("XXX"));
        }),
        order("BAD_5", |_| {}),
        order("bad-6", |m| {
            m.insert("status".into(), json!("much-too-long-status"));
        }),
        order("ok-003", |_| {}),
        order("bad-8", |m| {
            m.insert("amount".into(), json!(5000));
            m.insert("items".into(), json!(1));
        }),
    ];
    for b in &bad {
        body.push_str(b);
    }
    // Nulls pass every check but not_null: no currency, status or items.
    body.push_str(&order("ok-100", |m| {
        m.remove("currency");
        m.remove("status");
        m.remove("items");
    }));
    env.put("orders/every-kind.jsonl", body).await;
    let r = env
        .ingest(&ingestor, "orders/every-kind.jsonl")
        .await
        .unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (19, 11, 8),
        "{r:?}"
    );
    let mut q = quarantined(&env, &r).await;
    q.sort_by_key(|l| l["record"].as_u64());
    let names = [
        "has_region",
        "amount_range",
        "not_future",
        "known_currency",
        "id_format",
        "short_status",
        "one_per_order",
        "items_for_big",
    ];
    assert_eq!(q.len(), names.len(), "{q:?}");
    for (line, name) in q.iter().zip(names) {
        let reason = line["reason"].as_str().unwrap();
        assert!(
            reason.starts_with(&format!("quality check `{name}` failed")),
            "{name}: {reason}"
        );
    }
    assert_eq!(
        q[1]["reason"],
        "quality check `amount_range` failed: amount = -5.0 outside [0, 100000]"
    );
    assert_eq!(
        q[6]["record"], 17,
        "the duplicate, not its first occurrence"
    );
    assert!(q[4]["raw"].as_str().unwrap().contains("BAD_5"));

    let s = summary(&env, &ingestor).await;
    for name in names {
        assert_eq!(
            s.get(&format!("floe.quality.{name}.quarantine"))
                .map(String::as_str),
            Some("1"),
            "{name}: {s:?}"
        );
    }
    assert_eq!(s["records-in"], "19");
    assert_eq!(s["records-committed"], "11");
    assert_eq!(s["records-quarantined"], "8");
    assert_eq!(
        s["floe.contract-version"],
        env.config.tables[0].contract_version()
    );
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 11);
    assert_eq!(r.quality.len(), names.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flag_checks_fill_quality_on_an_existing_table_and_pyiceberg_reads_it() {
    // The table is created (and written) without a contract: no `_quality` column.
    let mut env = env_with(&[]).await;
    let ingestor = env.ingestor().await;
    env.put("orders/before.jsonl", good(5)).await;
    let r = env.ingest(&ingestor, "orders/before.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed);
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert!(table
        .metadata()
        .current_schema()
        .field_by_name("_quality")
        .is_none());

    // The contract gains two flag checks and a quarantine check.
    env.config.tables[0].checks = parse_checks(&[
        r#"{ name = "small", kind = "range", column = "amount", max = 100, action = "flag" }"#,
        r#"{ name = "euro", kind = "accepted", column = "currency", values = ["EUR"], action = "flag" }"#,
        r#"{ name = "positive", kind = "range", column = "amount", min = 0 }"#,
    ]);
    let ingestor = env.ingestor().await;
    let mut body = good(3).replace("ok-", "new-");
    // A new field too: `_quality` and `coupon` are added in the same commit.
    body.push_str(&order("big-1", |m| {
        m.insert("amount".into(), json!(500));
        m.insert("coupon".into(), json!("XMAS"));
    }));
    body.push_str(&order("big-usd-2", |m| {
        m.insert("amount".into(), json!(500));
        m.insert("currency".into(), json!("USD"));
    }));
    body.push_str(&order("neg-3", |m| {
        m.insert("amount".into(), json!(-1));
    }));
    env.put("orders/flagged.jsonl", body).await;
    let r = env.ingest(&ingestor, "orders/flagged.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (6, 5, 1)
    );
    assert_eq!(
        r.schema_change.as_deref(),
        Some("added _quality (string); added coupon (string)")
    );
    let s = summary(&env, &ingestor).await;
    assert_eq!(s["floe.quality.small.flag"], "2");
    assert_eq!(s["floe.quality.euro.flag"], "1");
    assert_eq!(s["floe.quality.positive.quarantine"], "1");

    // Read back through the table: old rows null, flagged rows name their checks.
    let mut flags: BTreeMap<String, Option<String>> = BTreeMap::new();
    for b in env.scan_all(ingestor.catalog().as_ref()).await {
        let ids = b
            .column_by_name("order_id")
            .unwrap()
            .as_string::<i32>()
            .clone();
        let q = b
            .column_by_name("_quality")
            .unwrap()
            .as_string::<i32>()
            .clone();
        for i in 0..b.num_rows() {
            flags.insert(
                ids.value(i).to_string(),
                (!q.is_null(i)).then(|| q.value(i).to_string()),
            );
        }
    }
    assert_eq!(flags.len(), 10);
    assert_eq!(flags["big-1"].as_deref(), Some("small"));
    assert_eq!(flags["big-usd-2"].as_deref(), Some("small,euro"));
    assert_eq!(flags.values().filter(|v| v.is_none()).count(), 8);
    // An independent reader sees the same.
    env.pyiceberg_run(
        "orders",
        r#"
a = t.scan().to_arrow()
got = sorted(v for v in a.column("_quality").to_pylist() if v is not None)
assert got == ["small", "small,euro"], got
assert a.num_rows == 10, a.num_rows
assert [c for c in a.column("coupon").to_pylist() if c] == ["XMAS"]
"#,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_check_refuses_the_object_whole_and_commits_nothing() {
    let env = env_with(&[
        r#"{ name = "positive", kind = "range", column = "amount", min = 0, action = "flag" }"#,
        r#"{ name = "must_be_eur", kind = "accepted", column = "currency", values = ["EUR"], action = "fail" }"#,
    ])
    .await;
    let ingestor = env.ingestor().await;
    let mut body = good(1500); // more than one chunk (1000) written before the bad record
    body.push_str(&order("usd-1", |m| {
        m.insert("currency".into(), json!("USD"));
    }));
    env.put("orders/refused.jsonl", body).await;
    for delivery in 0..2 {
        let r = env.ingest(&ingestor, "orders/refused.jsonl").await.unwrap();
        assert_eq!(
            r.status,
            Status::ContractFailed,
            "delivery {delivery}: {r:?}"
        );
        let reason = r.reason.clone().unwrap_or_default();
        assert!(
            reason.contains("`must_be_eur`")
                && reason.contains("record 1501")
                && reason.contains("USD"),
            "{reason}"
        );
        let q = r.quarantine.clone().expect("quarantined whole");
        assert!(q.ends_with(".error.json"), "{q}");
        let key = q.trim_start_matches(&format!("s3://{}/", env.bucket));
        let doc: serde_json::Value =
            serde_json::from_slice(&env.get(key).await.expect("error.json")).unwrap();
        assert!(
            doc["error"].as_str().unwrap().contains("must_be_eur"),
            "{doc}"
        );
    }
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert!(
        table.metadata().current_snapshot().is_none(),
        "nothing committed"
    );
    let files = env.keys("warehouse/").await;
    assert!(files.iter().all(|k| !k.ends_with(".parquet")), "{files:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_contract_applies_from_the_next_object() {
    let mut env =
        env_with(&[r#"{ name = "amount_cap", kind = "range", column = "amount", max = 1000 }"#])
            .await;
    let ingestor = env.ingestor().await;
    let body = |tag: &str| {
        let mut b = good(4).replace("ok-", &format!("{tag}-"));
        b.push_str(&order(&format!("{tag}-mid"), |m| {
            m.insert("amount".into(), json!(500));
        }));
        b
    };
    env.put("orders/one.jsonl", body("one")).await;
    let first = env.ingest(&ingestor, "orders/one.jsonl").await.unwrap();
    assert_eq!((first.records_committed, first.records_quarantined), (5, 0));
    let v1 = summary(&env, &ingestor).await["floe.contract-version"].clone();
    assert_eq!(v1, env.config.tables[0].contract_version());

    env.config.tables[0].checks =
        parse_checks(&[r#"{ name = "amount_cap", kind = "range", column = "amount", max = 100 }"#]);
    let ingestor = env.ingestor().await;
    env.put("orders/two.jsonl", body("two")).await;
    let second = env.ingest(&ingestor, "orders/two.jsonl").await.unwrap();
    assert_eq!(
        (second.records_committed, second.records_quarantined),
        (4, 1)
    );
    let s = summary(&env, &ingestor).await;
    assert_ne!(s["floe.contract-version"], v1, "{s:?}");
    assert_eq!(s["floe.quality.amount_cap.quarantine"], "1");
    // The first object's rows stay as they were committed.
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_within_hours_also_holds_against_the_tables_recent_rows() {
    let env = env_with(&[
        r#"{ name = "one_per_order", kind = "unique", columns = ["order_id"], within_hours = 24 }"#,
    ])
    .await;
    let ingestor = env.ingestor().await;
    let old = (chrono::Utc::now() - chrono::Duration::days(3)).to_rfc3339();
    let mut first = good(3);
    first.push_str(&order("old-1", |m| {
        m.insert("event_time".into(), json!(old));
    }));
    env.put("orders/first.jsonl", first).await;
    let r = env.ingest(&ingestor, "orders/first.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (4, 0),
        "{r:?}"
    );

    // ok-001 was committed within the window; old-1 three days ago (outside it); new-1 is new.
    let second = [
        order("ok-001", |_| {}),
        order("old-1", |_| {}),
        order("new-1", |_| {}),
    ]
    .concat();
    env.put("orders/second.jsonl", second).await;
    let r = env.ingest(&ingestor, "orders/second.jsonl").await.unwrap();
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (3, 2, 1),
        "{r:?}"
    );
    let q = quarantined(&env, &r).await;
    assert_eq!(q[0]["record"], 1);
    let reason = q[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("`one_per_order`")
            && reason.contains("ok-001")
            && reason.contains("last 24 h"),
        "{reason}"
    );
    assert_eq!(
        summary(&env, &ingestor).await["floe.quality.one_per_order.quarantine"],
        "1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_on_a_configured_column_the_table_lacks_adds_it_in_the_commit() {
    // The table is created without `coupon`; the config then declares it with a check on it.
    let mut env = env_with(&[]).await;
    let ingestor = env.ingestor().await;
    env.put("orders/before.jsonl", good(2)).await;
    let r = env.ingest(&ingestor, "orders/before.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed);
    let text = format!(
        "[catalog]\nkind = \"sqlite\"\nwarehouse = \"file:///tmp/wh\"\n{}",
        floe::sample::ORDERS_TABLE_TOML
            .replace(
                "  { name = \"event_time\"",
                "  { name = \"coupon\", type = \"string\" },\n  { name = \"event_time\"",
            )
            .replace(
                "target_file_size_mb = 128",
                "target_file_size_mb = 128\nchecks = [\n  { name = \"coupon_format\", kind = \"regex\", column = \"coupon\", pattern = \"^[A-Z]+$\" },\n  { name = \"coupon_short\", kind = \"sql\", expr = \"length(coupon) < 6\", action = \"flag\" },\n]",
            )
    );
    let declared = Config::parse(&text, "test")
        .expect("config")
        .tables
        .remove(0);
    env.config.tables[0].columns = declared.columns;
    env.config.tables[0].checks = declared.checks;
    let ingestor = env.ingestor().await;
    let mut body = good(2).replace("ok-", "new-");
    body.push_str(&order("c-1", |m| {
        m.insert("coupon".into(), json!("XMAS"));
    }));
    body.push_str(&order("c-2", |m| {
        m.insert("coupon".into(), json!("bad-1"));
    }));
    body.push_str(&order("c-3", |m| {
        m.insert("coupon".into(), json!("WINTERSALE"));
    }));
    env.put("orders/coupons.jsonl", body).await;
    let r = env
        .ingest(&ingestor, "orders/coupons.jsonl")
        .await
        .expect("a check on a declared column the table lacks must not fail every object");
    assert_eq!(r.status, Status::Committed, "{r:?}");
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (5, 4, 1),
        "{r:?}"
    );
    let q = quarantined(&env, &r).await;
    assert!(
        q[0]["reason"].as_str().unwrap().contains("`coupon_format`"),
        "{q:?}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let schema = table.metadata().current_schema();
    assert!(schema.field_by_name("coupon").is_some());
    assert!(schema.field_by_name("_quality").is_some());
    let s = summary(&env, &ingestor).await;
    assert_eq!(s["floe.quality.coupon_format.quarantine"], "1", "{s:?}");
    assert_eq!(s["floe.quality.coupon_short.flag"], "1", "{s:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 6);
}
