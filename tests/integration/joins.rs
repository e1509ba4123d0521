//! Enrichment joins: a pipeline's SQL joins `source` with another Iceberg table by name, read
//! at its current snapshot, the snapshot recorded in the sink commit and reused by reconcile.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use floe::config::Config;
use floe::process::Processor;

use crate::harness::{orders, TestEnv};

const ENRICHED: &str = "enriched_orders";
const BY_SEGMENT: &str = "revenue_per_segment_minute";

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

/// A `customers` dimension (its own route) and two pipelines over `orders` joining it.
fn joins_toml(bucket: &str) -> String {
    format!(
        r#"
[[tables]]
name = "customers"
event_time = "updated_at"
columns = [
  {{ name = "customer_id", type = "long", required = true }},
  {{ name = "segment", type = "string" }},
  {{ name = "updated_at", type = "timestamptz", required = true }},
]

[[routes]]
bucket = "{bucket}"
prefix = "customers/"
table = "customers"
format = "jsonl"

[[pipelines]]
name = "{ENRICHED}"
source = "orders"
sink = "{ENRICHED}"
mode = "append"
joins = ["customers"]
keys = ["order_id"]
sql = """
SELECT o.order_id, o.customer_id, o.amount, c.segment, o.event_time
FROM source o JOIN customers c ON o.customer_id = c.customer_id
"""

[[pipelines]]
name = "{BY_SEGMENT}"
source = "orders"
sink = "{BY_SEGMENT}"
mode = "aggregate"
window = "1m"
joins = ["customers"]
keys = ["window_start", "segment"]
sql = """
SELECT o.window_start, c.segment, count(*) AS orders, sum(o.amount) AS revenue
FROM source o JOIN customers c ON o.customer_id = c.customer_id
GROUP BY o.window_start, c.segment
"""
"#
    )
}

/// The test's world with `extra` TOML appended to its config.
pub(crate) fn extended(env: &TestEnv, extra: &str) -> TestEnv {
    let text = format!("{}\n{extra}", env.toml);
    let config = Config::parse(&text, "extended floe.toml").expect("the extended config");
    TestEnv {
        config,
        toml: text,
        bucket: env.bucket.clone(),
        namespace: env.namespace.clone(),
        dir: env.dir.clone(),
        s3: env.s3.clone(),
        catalog_kind: env.catalog_kind,
    }
}

/// The distinct customer ids of some order lines.
fn customer_ids(lines: &str) -> Vec<i64> {
    let ids: BTreeSet<i64> = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["customer_id"].as_i64())
        .collect();
    ids.into_iter().collect()
}

fn customers(ids: &[i64]) -> String {
    ids.iter()
        .map(|id| {
            let segment = ["gold", "silver", "bronze"][(*id % 3) as usize];
            format!(
                "{{\"customer_id\":{id},\"segment\":\"{segment}\",\"updated_at\":\"{}\"}}\n",
                chrono::Utc::now().to_rfc3339()
            )
        })
        .collect()
}

async fn current_snapshot(env: &TestEnv, table: &str) -> Option<i64> {
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let ident = floe::catalog::table_ident(&env.config, table).unwrap();
    catalog
        .load_table(&ident)
        .await
        .unwrap()
        .metadata()
        .current_snapshot_id()
}

/// The `floe.join.customers.snapshot-id` of the sink's current snapshot.
async fn recorded_join(env: &TestEnv, sink: &str) -> Option<String> {
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let ident = floe::catalog::table_ident(&env.config, sink).unwrap();
    let t = catalog.load_table(&ident).await.unwrap();
    let s = t.metadata().current_snapshot()?;
    s.summary()
        .additional_properties
        .get("floe.join.customers.snapshot-id")
        .cloned()
}

async fn assert_matches(p: &Processor, name: &str) -> floe::process::Reconciliation {
    let r = p.reconcile(name).await.expect("reconcile");
    assert!(
        r.matches() && r.batch_rows > 0,
        "{name}: batch {} vs sink {}: {:?}",
        r.batch_rows,
        r.sink_rows,
        r.differences
    );
    r
}

#[tokio::test]
async fn joins_read_the_dimension_at_a_recorded_snapshot_and_reconcile_uses_it() {
    let base = TestEnv::new("sqlite").await;
    let env = extended(&base, &joins_toml(&base.bucket));
    let ingestor = env.ingestor().await;
    let first = orders(400, 5);
    env.put("orders/a.jsonl", first.clone()).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    let second = orders(200, 6);
    // Every customer once: the even ids of the first orders now, the rest later.
    let ids = customer_ids(&first);
    let (known, mut later): (Vec<i64>, Vec<i64>) = ids.iter().partition(|id| *id % 2 == 0);
    later.extend(
        customer_ids(&second)
            .into_iter()
            .filter(|id| !ids.contains(id)),
    );
    assert!(!known.is_empty() && !later.is_empty());
    env.put("customers/c0.jsonl", customers(&known)).await;
    env.ingest(&ingestor, "customers/c0.jsonl").await.unwrap();
    let c0 = current_snapshot(&env, "customers").await.unwrap();

    let p = env.processor().await;
    let run = p.run(ENRICHED, soon()).await.expect("the join runs");
    let expected = first
        .lines()
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["customer_id"].as_i64().is_some_and(|id| id % 2 == 0)
        })
        .count() as u64;
    assert_eq!(
        run.rows_out, expected,
        "each order joined with its customer"
    );
    p.run(BY_SEGMENT, soon())
        .await
        .expect("the aggregate join runs");
    for sink in [ENRICHED, BY_SEGMENT] {
        assert_eq!(
            recorded_join(&env, sink).await,
            Some(c0.to_string()),
            "{sink} records the dimension snapshot it read"
        );
    }

    // The dimension changes after the runs: reconcile joins it as the runs did, so it matches.
    env.put("customers/c1.jsonl", customers(&later)).await;
    env.ingest(&ingestor, "customers/c1.jsonl").await.unwrap();
    let c1 = current_snapshot(&env, "customers").await.unwrap();
    assert_ne!(c0, c1);
    let r = assert_matches(&p, ENRICHED).await;
    assert_eq!(r.sink_rows as u64, expected);
    assert_matches(&p, BY_SEGMENT).await;

    // New orders are joined with the dimension as it is now; rows already emitted are not
    // rewritten (reconcile at the new snapshot shows them), until a refresh.
    env.put("orders/b.jsonl", second.clone()).await;
    env.ingest(&ingestor, "orders/b.jsonl").await.unwrap();
    let run = p.run(ENRICHED, soon()).await.unwrap();
    assert_eq!(run.rows_out, 200, "every new order finds its customer");
    assert_eq!(recorded_join(&env, ENRICHED).await, Some(c1.to_string()));
    let r = p.reconcile(ENRICHED).await.unwrap();
    assert!(
        !r.matches() && r.batch_rows > r.sink_rows,
        "orders emitted before their customer arrived stay unenriched: {r:?}"
    );
    // A compaction of the sink carries the recorded snapshot with the checkpoint.
    let m = env.maintainer().await;
    let opts = floe::maintain::Options {
        min_input_files: 2,
        ..crate::maintain_opts(true, false, false)
    };
    let report = m.run(ENRICHED, &opts).await.expect("maintain the sink");
    assert!(report.groups_compacted >= 1, "{report:?}");
    assert_eq!(recorded_join(&env, ENRICHED).await, Some(c1.to_string()));
    let refreshed = p.refresh(ENRICHED, soon()).await.unwrap();
    assert_eq!(recorded_join(&env, ENRICHED).await, Some(c1.to_string()));
    let r = assert_matches(&p, ENRICHED).await;
    assert_eq!(r.sink_rows as u64, refreshed.rows_out);
    assert_eq!(
        r.sink_rows,
        first.lines().count() + run.rows_out as usize,
        "after the refresh every first order has its customer"
    );

    // The dimension moves on and is expired down to its newest snapshot: the one the sinks
    // recorded is kept (reconcile reads it), like a checkpoint; the older one goes.
    p.refresh(BY_SEGMENT, soon()).await.unwrap();
    assert_eq!(recorded_join(&env, BY_SEGMENT).await, Some(c1.to_string()));
    env.put("customers/c2.jsonl", customers(&[1, 2, 3])).await;
    env.ingest(&ingestor, "customers/c2.jsonl").await.unwrap();
    let opts = floe::maintain::Options {
        expire_older_than: Some(Duration::ZERO),
        retain_last: Some(1),
        dedup_window: Duration::ZERO,
        now: chrono::Utc::now() + chrono::Duration::hours(1),
        ..crate::maintain_opts(false, true, false)
    };
    let report = m.run("customers", &opts).await.expect("expire customers");
    assert!(report.snapshots_expired >= 1, "{report:?}");
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let dim = catalog
        .load_table(&floe::catalog::table_ident(&env.config, "customers").unwrap())
        .await
        .unwrap();
    assert!(dim.metadata().snapshot_by_id(c0).is_none(), "c0 expired");
    assert!(
        dim.metadata().snapshot_by_id(c1).is_some(),
        "c1 pinned by the sink"
    );
    assert_matches(&p, ENRICHED).await;
    assert_matches(&p, BY_SEGMENT).await;
}

#[tokio::test]
async fn expiration_keeps_the_recorded_dimension_snapshot_not_its_descendants() {
    // A quiet source and a busy dimension: the sinks recorded c0; every later dimension
    // snapshot is of no use to reconcile and expires (before, each was kept as a "descendant"
    // of the recorded snapshot, forever).
    let base = TestEnv::new("sqlite").await;
    let env = extended(&base, &joins_toml(&base.bucket));
    let ingestor = env.ingestor().await;
    let first = orders(200, 5);
    env.put("orders/a.jsonl", first.clone()).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    let ids = customer_ids(&first);
    env.put("customers/c0.jsonl", customers(&ids)).await;
    env.ingest(&ingestor, "customers/c0.jsonl").await.unwrap();
    let c0 = current_snapshot(&env, "customers").await.unwrap();
    let p = env.processor().await;
    p.run(ENRICHED, soon()).await.unwrap();
    p.run(BY_SEGMENT, soon()).await.unwrap();
    for i in 1..=5 {
        let key = format!("customers/c{i}.jsonl");
        env.put(&key, customers(&ids[..i.min(ids.len())])).await;
        env.ingest(&ingestor, &key).await.unwrap();
    }
    let last = current_snapshot(&env, "customers").await.unwrap();
    let m = env.maintainer().await;
    let opts = floe::maintain::Options {
        expire_older_than: Some(Duration::ZERO),
        retain_last: Some(1),
        dedup_window: Duration::ZERO,
        now: chrono::Utc::now() + chrono::Duration::hours(1),
        ..crate::maintain_opts(false, true, false)
    };
    let report = m.run("customers", &opts).await.expect("expire customers");
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let dim = catalog
        .load_table(&floe::catalog::table_ident(&env.config, "customers").unwrap())
        .await
        .unwrap();
    let left: BTreeSet<i64> = dim
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    assert_eq!(
        left,
        BTreeSet::from([c0, last]),
        "only the recorded snapshot and the current one stay: {report:?}"
    );
    assert_eq!(report.snapshots_expired, 4, "{report:?}");
    assert_matches(&p, ENRICHED).await;
    assert_matches(&p, BY_SEGMENT).await;

    // Once no pipeline joins the table, what the sinks recorded pins nothing.
    let toml = joins_toml(&base.bucket).replace("joins = [\"customers\"]", "joins = []");
    let unjoined = extended(&base, &toml);
    let m = unjoined.maintainer().await;
    let report = m.run("customers", &opts).await.expect("expire customers");
    assert_eq!(report.snapshots_expired, 1, "{report:?}");
    assert_eq!(current_snapshot(&env, "customers").await, Some(last));
}

#[tokio::test]
async fn a_dimension_over_max_join_bytes_fails_the_run_naming_the_limit() {
    let base = TestEnv::new("sqlite").await;
    let mut env = extended(&base, &joins_toml(&base.bucket));
    let ingestor = env.ingestor().await;
    let first = orders(100, 8);
    env.put("orders/a.jsonl", first.clone()).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    env.put("customers/c.jsonl", customers(&customer_ids(&first)))
        .await;
    env.ingest(&ingestor, "customers/c.jsonl").await.unwrap();
    for p in env.config.pipelines.iter_mut() {
        p.max_join_bytes = 1024;
    }
    let p = env.processor().await;
    let e = p.run(ENRICHED, soon()).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("max_join_bytes = 1024") && text.contains("`customers`"),
        "{text}"
    );
    assert!(!e.is_retryable());
    assert_eq!(
        current_snapshot(&env, ENRICHED).await,
        None,
        "nothing committed"
    );
    // A dimension still empty joins as an empty relation, and the sink records that.
    let fresh = TestEnv::new("sqlite").await;
    let fresh = extended(&fresh, &joins_toml(&fresh.bucket));
    let ingestor = fresh.ingestor().await;
    fresh.put("orders/a.jsonl", orders(10, 1)).await;
    fresh.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    let p = fresh.processor().await;
    let run = p.run(ENRICHED, soon()).await.unwrap();
    assert_eq!((run.rows_in, run.rows_out), (10, 0));
    assert_eq!(
        recorded_join(&fresh, ENRICHED).await.as_deref(),
        Some("none")
    );
}
