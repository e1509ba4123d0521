//! Chained pipelines: a sink is the source of another pipeline, whose runs its commit events
//! trigger (the `floe.commit` event ingest sends, through EventBridge), with cycles refused.

use std::time::{Duration, Instant};

use floe::config::Config;
use serde_json::Value;

use crate::harness::{orders, TestEnv};
use crate::joins::extended;
use crate::process::{bus_to_queue, drain};

const A: &str = "large_orders";
const B: &str = "large_revenue_per_region_minute";

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

/// A: orders → large orders (append); B: A's sink → revenue per region and minute (aggregate).
const CHAIN_TOML: &str = r#"
[[pipelines]]
name = "large_revenue_per_region_minute"
source = "large_orders"
sink = "large_revenue_per_region_minute"
mode = "aggregate"
window = "1m"
keys = ["window_start", "region"]
sql = """
SELECT window_start, region, count(*) AS orders, sum(amount) AS revenue
FROM source
GROUP BY window_start, region
"""

[[pipelines]]
name = "large_orders"
source = "orders"
sink = "large_orders"
mode = "append"
keys = ["order_id"]
sql = "SELECT order_id, region, amount, event_time FROM source WHERE amount >= 2500"
"#;

/// The commit events on the queue, by the table they name.
fn events_for<'a>(events: &'a [Value], table: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["detail-type"] == "floe.commit" && e["detail"]["table"] == table)
        .collect()
}

/// Revenue of the large orders among `lines`.
fn large_revenue(lines: &[&str]) -> f64 {
    lines
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["amount"].as_f64())
        .filter(|a| *a >= 2500.0)
        .sum()
}

#[tokio::test]
async fn a_sink_commit_event_runs_the_pipeline_reading_that_sink() {
    let sdk =
        floe::store::sdk_config(&crate::harness::storage(), Some(crate::harness::moto())).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let (bus, url) = bus_to_queue(&sdk, "floe.commit").await;
    let base = TestEnv::new("sqlite").await;
    let mut env = extended(&base, CHAIN_TOML);
    env.config.events.bus = Some(bus);
    env.config.events.endpoint = Some(crate::harness::moto().to_string());
    let ingestor = env.ingestor().await;
    let p = env.processor().await;

    let mut ingested: Vec<String> = Vec::new();
    for round in 0..2u64 {
        let key = format!("orders/r{round}.jsonl");
        let text = orders(300, 30 + round);
        env.put(&key, text.clone()).await;
        ingested.push(text);
        let payload = env.sqs_batch(&[&key]);
        let result = ingestor.handle_payload(&payload, soon()).await;
        assert!(result.errors.is_empty(), "{:?}", result.errors);

        // Ingest's commit event wakes A only (B reads A's sink, not orders).
        let events = drain(&sqs, &url).await;
        let ingest_events = events_for(&events, "orders");
        assert_eq!(ingest_events.len(), 1, "{events:?}");
        let (runs, errors) = p.handle_payload(ingest_events[0], soon()).await;
        assert!(errors.is_empty(), "{errors:?}");
        let names: Vec<&str> = runs.iter().map(|r| r.pipeline.as_str()).collect();
        assert_eq!(names, vec![A], "round {round}");
        let a_snapshot = runs[0].sink_snapshot.expect("A committed");

        // A's sink commit is announced like an ingest commit; that event runs B.
        let events = drain(&sqs, &url).await;
        let sink_events = events_for(&events, A);
        assert_eq!(sink_events.len(), 1, "{events:?}");
        let detail = &sink_events[0]["detail"];
        assert_eq!(detail["snapshot_id"], a_snapshot);
        assert_eq!(detail["pipeline"], A);
        assert_eq!(detail["source_table"], "orders");
        let (runs, errors) = p.handle_payload(sink_events[0], soon()).await;
        assert!(errors.is_empty(), "{errors:?}");
        let names: Vec<&str> = runs.iter().map(|r| r.pipeline.as_str()).collect();
        assert_eq!(names, vec![B], "round {round}");
        assert_eq!(
            runs[0].to_snapshot,
            Some(a_snapshot),
            "B read up to A's commit"
        );
        assert!(runs[0].sink_snapshot.is_some(), "B committed");

        // B's commit is announced too, and wakes nothing further.
        let events = drain(&sqs, &url).await;
        let b_events = events_for(&events, B);
        assert_eq!(b_events.len(), 1, "{events:?}");
        let (runs, errors) = p.handle_payload(b_events[0], soon()).await;
        assert!(runs.is_empty() && errors.is_empty(), "{runs:?} {errors:?}");

        // B equals the batch over A's sink, and its totals are the large orders' revenue.
        let r = p.reconcile(B).await.expect("reconcile B");
        assert!(
            r.matches() && r.batch_rows > 0,
            "round {round}: {} vs {}: {:?}",
            r.batch_rows,
            r.sink_rows,
            r.differences
        );
        let texts: Vec<&str> = ingested.iter().map(String::as_str).collect();
        let (_, _, sink_revenue) = r
            .totals
            .iter()
            .find(|(c, _, _)| c == "revenue")
            .expect("revenue total");
        assert!(
            (sink_revenue - large_revenue(&texts)).abs() < 1e-6 * large_revenue(&texts),
            "{sink_revenue} vs {}",
            large_revenue(&texts)
        );
        assert!(p.reconcile(A).await.unwrap().matches());
    }
}

#[test]
fn a_cycle_through_sinks_is_refused_naming_it() {
    let env_toml = floe::sample::ORDERS_TABLE_TOML;
    let text = format!(
        r#"
[catalog]
kind = "sqlite"
warehouse = "file:///tmp/floe-cycle"
{env_toml}
[[pipelines]]
name = "enrich"
source = "orders"
sink = "enriched"
mode = "append"
joins = ["scored"]
sql = "SELECT * FROM source"

[[pipelines]]
name = "score"
source = "enriched"
sink = "scored"
mode = "append"
sql = "SELECT * FROM source"
"#
    );
    let e = Config::parse(&text, "cycle.toml").unwrap_err().to_string();
    assert!(
        e.contains("cycle.toml")
            && e.contains("cycle: enriched → scored → enriched")
            && e.contains("`enrich`, `score`"),
        "{e}"
    );
    // A sink may not be an ingest table either.
    let e = Config::parse(
        &text
            .replace("joins = [\"scored\"]\n", "")
            .replace("sink = \"scored\"", "sink = \"orders\""),
        "f.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("pipelines[1].sink") && e.contains("ingest table"),
        "{e}"
    );
}
