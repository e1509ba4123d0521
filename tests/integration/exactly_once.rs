//! Exactly once per object: duplicates, concurrent deliveries, crashes at every step, conflicts.

use std::sync::Arc;

use floe::ingest::Status;

use crate::faults::{faulty, Fault};
use crate::harness::{orders, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_and_concurrent_deliveries_of_one_object_commit_once() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = Arc::new(env.ingestor().await);
    env.put("orders/one.jsonl", orders(120, 11)).await;
    let first = env.ingest(&ingestor, "orders/one.jsonl").await.unwrap();
    assert_eq!(first.status, Status::Committed);
    let second = env.ingest(&ingestor, "orders/one.jsonl").await.unwrap();
    assert_eq!(second.status, Status::Duplicate);
    assert_eq!(second.snapshot_id, first.snapshot_id);

    // Four deliveries of another object at once (separate ingestors, like separate Lambdas).
    env.put("orders/two.jsonl", orders(80, 12)).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(env.spawn_ingest("orders/two.jsonl").await);
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().unwrap().status);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == Status::Committed).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == Status::Duplicate).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_ingests_of_different_objects_all_land() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let n = 8;
    for i in 0..n {
        env.put(
            &format!("orders/c{i}.jsonl"),
            orders(50 + i, 100 + i as u64),
        )
        .await;
    }
    let mut tasks = Vec::new();
    for i in 0..n {
        tasks.push(env.spawn_ingest(&format!("orders/c{i}.jsonl")).await);
    }
    let mut attempts = 0;
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        assert_eq!(r.status, Status::Committed, "{r:?}");
        attempts += r.attempts;
    }
    let expected: usize = (0..n).map(|i| 50 + i).sum();
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, expected);
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(table.metadata().snapshots().count(), n);
    assert!(attempts >= n as u32);
}

async fn crash_then_redeliver(fault: Fault) {
    let env = TestEnv::new("sqlite").await;
    env.put("orders/x.jsonl", orders(90, 21)).await;
    let crashing = env.ingestor_with(faulty(fault)).await;
    let first = env.ingest(&crashing, "orders/x.jsonl").await;
    let healthy = env.ingestor().await;
    match fault {
        Fault::LostAnswer => {
            // floe's retry re-validates, recognises its own commit, and adds nothing more.
            let r = first.unwrap();
            assert_eq!(r.status, Status::Committed, "{r:?}");
            assert_eq!(r.records_committed, 90);
        }
        Fault::Conflicts => {
            let r = first.unwrap();
            assert_eq!((r.status, r.attempts), (Status::Committed, 3), "{r:?}");
        }
        _ => {
            let e = first.unwrap_err();
            assert!(e.to_string().contains("injected crash"), "{e}");
            // The redelivery after the crash:
            let r = env.ingest(&healthy, "orders/x.jsonl").await.unwrap();
            let expected = if fault == Fault::AfterCommit {
                Status::Duplicate
            } else {
                Status::Committed
            };
            assert_eq!(r.status, expected, "{fault:?}: {r:?}");
        }
    }
    // And once more for good measure: never a second copy.
    let r = env.ingest(&healthy, "orders/x.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Duplicate);
    assert_eq!(
        env.count_rows(healthy.catalog().as_ref()).await,
        90,
        "{fault:?}"
    );
    let table = healthy.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(table.metadata().snapshots().count(), 1, "{fault:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_data_files_before_metadata() {
    crash_then_redeliver(Fault::BeforeMetadata).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_metadata_before_pointer_swap() {
    crash_then_redeliver(Fault::AfterMetadata).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_commit_before_acknowledgement() {
    crash_then_redeliver(Fault::AfterCommit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commit_answer_is_revalidated_not_reapplied() {
    crash_then_redeliver(Fault::LostAnswer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_are_retried_with_revalidation() {
    crash_then_redeliver(Fault::Conflicts).await;
}
