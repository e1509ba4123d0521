//! The REST catalog path: floe's changes sent to the commit endpoint as updates + requirements.

use floe::ingest::Status;

use crate::harness::{orders, TestEnv};
use crate::maintain_opts;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_catalog_exactly_once_compaction_and_expiration() {
    let env = TestEnv::new("rest").await;
    let ingestor = env.ingestor().await;
    let n = 6;
    for i in 0..n {
        env.put(&format!("orders/r{i}.jsonl"), orders(25, 1200 + i as u64))
            .await;
    }
    // Every object delivered twice, all at once.
    let mut tasks = Vec::new();
    for i in 0..2 * n {
        tasks.push(env.spawn_ingest(&format!("orders/r{}.jsonl", i % n)).await);
    }
    let mut committed = 0;
    for t in tasks {
        match t.await.unwrap().unwrap().status {
            Status::Committed => committed += 1,
            Status::Duplicate => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(committed, n);
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 25 * n);

    let maintainer = env.maintainer().await;
    let r = maintainer
        .run("orders", &maintain_opts(true, false, false))
        .await
        .unwrap();
    assert_eq!(r.groups_compacted, 1, "{r:?}");
    let opts = floe::maintain::Options {
        expire_older_than: Some(std::time::Duration::ZERO),
        dedup_window: std::time::Duration::ZERO,
        retain_last: Some(1),
        ..maintain_opts(false, true, false)
    };
    let r = maintainer.run("orders", &opts).await.unwrap();
    assert_eq!(r.snapshots_expired, n, "{r:?}");
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 25 * n, "{py}");
    assert_eq!(py["distinct_order_ids"], 25 * n, "{py}");
    assert_eq!(py["snapshots"], 1, "{py}");
    assert_eq!(py["operation"], "replace");

    // PyIceberg, behind this REST catalog, clears the parent id of the snapshot an expiration
    // keeps. That snapshot is not the table's first commit, so redeliveries of objects
    // committed before the expiration (one alone, then two in one SQS batch) must be found in
    // the rows and not committed again.
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let kept = t.metadata().current_snapshot().unwrap();
    assert!(kept.sequence_number() > 1, "{kept:?}");
    let r = env.ingest(&ingestor, "orders/r0.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Duplicate, "{r:?}");
    let batch = ingestor
        .handle_payload(
            &env.sqs_batch(&["orders/r1.jsonl", "orders/r2.jsonl"]),
            std::time::Instant::now() + std::time::Duration::from_secs(120),
        )
        .await;
    assert!(batch.errors.is_empty(), "{:?}", batch.errors);
    assert_eq!(batch.reports.len(), 2, "{:?}", batch.reports);
    for r in &batch.reports {
        assert_eq!(r.status, Status::Duplicate, "{r:?}");
    }
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 25 * n);
}
