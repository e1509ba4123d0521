//! The Glue catalog path, on moto with Glue's VersionId compare-and-swap enforced.

use std::sync::Arc;

use floe::ingest::Status;

use crate::harness::{orders, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn glue_catalog_concurrent_ingests_land_once_and_pyiceberg_reads() {
    let env = TestEnv::new("glue").await;
    let ingestor = Arc::new(env.ingestor().await);
    let n = 6;
    for i in 0..n {
        env.put(&format!("orders/g{i}.jsonl"), orders(40, 300 + i as u64))
            .await;
    }
    // Every object delivered twice, all at once.
    let mut tasks = Vec::new();
    for i in 0..2 * n {
        tasks.push(env.spawn_ingest(&format!("orders/g{}.jsonl", i % n)).await);
    }
    let mut committed = Vec::new();
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        match r.status {
            Status::Committed => committed.push((r.object.clone(), r.snapshot_id, r.attempts)),
            Status::Duplicate => {}
            other => panic!("unexpected {other:?}: {r:?}"),
        }
    }
    committed.sort();
    assert_eq!(committed.len(), n, "{committed:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 40 * n);
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 40 * n, "{py}");
    assert_eq!(py["distinct_order_ids"], 40 * n, "{py}");
    assert_eq!(py["snapshots"], n, "{py}");
}

/// Review helper-34 #3: every Glue GetTable error was retryable, so a table dropped meanwhile
/// (or a role that may not read it) sent each message through its retries to the dead-letter
/// queue instead of failing for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_glue_table_that_is_gone_is_a_permanent_error_not_a_retry() {
    let env = TestEnv::new("glue").await;
    let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
    let gone = floe::catalog::table_ident(&env.config, "orders").unwrap();
    let gone = iceberg::TableIdent::new(gone.namespace().clone(), "no_such_table".into());
    let e = swap.current(&gone).await.unwrap_err();
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains("EntityNotFound"), "{e}");
}
