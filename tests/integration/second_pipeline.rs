//! A second source table, its route and pipeline, and another pipeline over the first table are
//! added by configuration alone; they run end to end beside the first ones, which stay untouched.

use std::time::{Duration, Instant};

use floe::config::Config;
use iceberg::Catalog;
use serde_json::json;

use crate::harness::{orders, TestEnv};

/// What a platform team appends to floe.toml: a new source with its own route and schema, a
/// pipeline over it, a pipeline over `orders`, and table standards for new tables.
fn second_pipeline_toml(bucket: &str) -> String {
    format!(
        r#"
[defaults]
partition = ["day({{event_time}})"]
retain_last = 7
lag_objective_seconds = 300

[[tables]]
name = "payments"
event_time = "paid_at"
columns = [
  {{ name = "payment_id", type = "string", required = true }},
  {{ name = "order_id", type = "string" }},
  {{ name = "method", type = "string" }},
  {{ name = "amount", type = "double" }},
  {{ name = "paid_at", type = "timestamptz", required = true }},
]

[[routes]]
bucket = "{bucket}"
prefix = "payments/"
table = "payments"
format = "jsonl"

[[pipelines]]
name = "large_payments"
source = "payments"
sink = "large_payments"
mode = "append"
keys = ["payment_id"]
sql = "SELECT payment_id, order_id, amount, paid_at FROM source WHERE amount >= 500"

[[pipelines]]
name = "cancelled_orders"
source = "orders"
sink = "cancelled_orders"
mode = "append"
keys = ["order_id"]
sql = "SELECT order_id, customer_id, amount, event_time FROM source WHERE status = 'cancelled'"
"#
    )
}

fn payments(n: usize, seed: u64) -> String {
    (0..n)
        .map(|i| {
            let amount = ((i as u64 * 7919 + seed * 104_729) % 1000) as f64;
            format!(
                "{{\"payment_id\":\"p-{seed}-{i}\",\"order_id\":\"o-{i}\",\"method\":\"card\",\"amount\":{amount},\"paid_at\":\"2026-11-30T10:{:02}:00Z\"}}\n",
                i % 60
            )
        })
        .collect()
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

async fn current_snapshot(catalog: &dyn Catalog, config: &Config, table: &str) -> Option<i64> {
    let ident = floe::catalog::table_ident(config, table).unwrap();
    catalog
        .load_table(&ident)
        .await
        .unwrap()
        .metadata()
        .current_snapshot_id()
}

#[tokio::test]
async fn a_second_source_and_two_pipelines_are_config_only() {
    let env = TestEnv::with_pipelines("sqlite", "").await;
    let first = ["suspicious_orders", "revenue_per_region_minute"];
    let ingestor = env.ingestor().await;
    for i in 0..2 {
        env.put(&format!("orders/a{i}.jsonl"), orders(300, 40 + i))
            .await;
        env.ingest(&ingestor, &format!("orders/a{i}.jsonl"))
            .await
            .unwrap();
    }
    let p = env.processor().await;
    for name in first {
        p.run(name, soon()).await.expect("first pipelines run");
    }
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let mut before = Vec::new();
    for t in ["orders", first[0], first[1]] {
        before.push(current_snapshot(catalog.as_ref(), &env.config, t).await);
    }
    let orders_before = catalog.load_table(&env.ident()).await.unwrap();

    // The change: config only. Same code, a new config (as after uploading floe.toml).
    let text = format!("{}\n{}", env.toml, second_pipeline_toml(&env.bucket));
    let config = Config::parse(&text, "second floe.toml").expect("the extended config is valid");

    // A poll before the new source exists skips its pipeline instead of failing (the process
    // role cannot create source tables), and leaves the first pipelines as they were.
    let p2 = floe::process::Processor::new(config.clone()).await.unwrap();
    let (reports, errors) = p2.handle_payload(&json!({}), soon()).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert!(
        reports.iter().all(|r| r.pipeline != "large_payments"),
        "the source does not exist yet"
    );
    for (t, b) in ["orders", first[0], first[1]].iter().zip(&before) {
        assert_eq!(
            current_snapshot(catalog.as_ref(), &config, t).await,
            *b,
            "{t} changed by a config that only adds things"
        );
    }

    let ingestor2 = floe::ingest::Ingestor::new(config.clone()).await.unwrap();
    let env2 = TestEnv {
        config: config.clone(),
        toml: text.clone(),
        bucket: env.bucket.clone(),
        namespace: env.namespace.clone(),
        dir: env.dir.clone(),
        s3: env.s3.clone(),
        catalog_kind: env.catalog_kind,
    };
    env.put("payments/p0.jsonl", payments(200, 1)).await;
    let r = env2.ingest(&ingestor2, "payments/p0.jsonl").await.unwrap();
    assert_eq!(r.records_committed, 200, "{r:?}");
    env.put("orders/b0.jsonl", orders(300, 77)).await;
    env2.ingest(&ingestor2, "orders/b0.jsonl").await.unwrap();

    let (reports, errors) = p2.handle_payload(&json!({}), soon()).await;
    assert!(errors.is_empty(), "{errors:?}");
    let ran: Vec<&str> = reports.iter().map(|r| r.pipeline.as_str()).collect();
    for name in [
        "suspicious_orders",
        "revenue_per_region_minute",
        "large_payments",
        "cancelled_orders",
    ] {
        assert!(ran.contains(&name), "{name} did not run: {ran:?}");
        let rec = p2.reconcile(name).await.expect("reconcile");
        assert!(
            rec.matches() && rec.batch_rows > 0,
            "{name}: batch {} vs sink {}: {:?}",
            rec.batch_rows,
            rec.sink_rows,
            rec.differences
        );
    }
    let large = p2.reconcile("large_payments").await.unwrap();
    let expected = payments(200, 1)
        .lines()
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["amount"].as_f64().unwrap() >= 500.0
        })
        .count();
    assert_eq!(large.sink_rows, expected);

    // The new table got the [defaults] standards; the existing table kept its own definition.
    let pay = catalog
        .load_table(&floe::catalog::table_ident(&config, "payments").unwrap())
        .await
        .unwrap();
    let spec = pay.metadata().default_partition_spec();
    assert_eq!(spec.fields().len(), 1, "{spec:?}");
    assert_eq!(spec.fields()[0].name, "paid_at_day");
    assert_eq!(
        pay.metadata()
            .properties()
            .get("history.expire.min-snapshots-to-keep")
            .map(String::as_str),
        Some("7")
    );
    let sink = catalog
        .load_table(&floe::catalog::table_ident(&config, "large_payments").unwrap())
        .await
        .unwrap();
    assert_eq!(
        sink.metadata()
            .properties()
            .get("history.expire.min-snapshots-to-keep")
            .map(String::as_str),
        Some("7"),
        "sinks are created with the defaults too"
    );
    let orders_after = catalog.load_table(&env.ident()).await.unwrap();
    assert_eq!(
        orders_after.metadata().current_schema(),
        orders_before.metadata().current_schema()
    );
    assert_eq!(
        orders_after.metadata().properties(),
        orders_before.metadata().properties(),
        "defaults apply to new tables only"
    );
    assert_eq!(config.pipelines[0].lag_objective_seconds, 300);
}
