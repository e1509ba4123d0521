//! Backfill: history through the ingest code path in batches, exactly once, resumable, with
//! what is already in the table left out by one read of `_source` (not a history walk per
//! object).

use floe::ingest::backfill::{BackfillOptions, BatchProgress};
use floe::ingest::Ingestor;

use crate::harness::{orders, TestEnv};

async fn snapshot_count(env: &TestEnv, ingestor: &Ingestor) -> usize {
    ingestor
        .catalog()
        .load_table(&env.ident())
        .await
        .unwrap()
        .metadata()
        .snapshots()
        .count()
}

fn options(batch: usize) -> BackfillOptions {
    BackfillOptions {
        batch_objects: batch,
        concurrency: 3,
        ..Default::default()
    }
}

#[tokio::test]
async fn history_is_ingested_once_in_batches_and_a_rerun_resumes() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    // 30 objects of history (20 orders each), one of them ingested live already, an object
    // outside every route, and an empty marker key.
    for i in 0..30 {
        env.put(&format!("orders/hist/{i:03}.jsonl"), orders(20, 500 + i))
            .await;
    }
    env.put("misc/notes.txt", "not routed").await;
    env.ingest(&ingestor, "orders/hist/007.jsonl")
        .await
        .unwrap();
    assert_eq!(snapshot_count(&env, &ingestor).await, 1);

    let plan = ingestor
        .plan_backfill(&env.bucket, "", &options(8))
        .await
        .unwrap();
    let t = &plan.tables["orders"];
    assert_eq!((t.listed, t.committed, t.pending), (30, 1, 29));
    // misc/notes.txt, and the table's own files under warehouse/.
    assert!(plan.unrouted >= 1);
    assert_eq!(plan.candidates.len(), 29);
    assert!(t.pending_bytes > 0);

    // An interrupted run: only the first 10 objects were handled.
    let mut partial = plan.clone();
    partial.candidates.truncate(10);
    let calls = std::sync::atomic::AtomicU64::new(0);
    let report = ingestor
        .run_backfill(&partial, &options(8), &|p: &BatchProgress| {
            calls.fetch_add(p.objects, std::sync::atomic::Ordering::Relaxed);
        })
        .await;
    assert_eq!((report.committed, report.failed), (10, 0), "{report:?}");
    assert_eq!(report.commits, 2, "10 objects in batches of 8");
    assert_eq!(calls.into_inner(), 10, "progress saw every object");
    assert_eq!(snapshot_count(&env, &ingestor).await, 3);

    // Run again: the plan leaves out all 11 committed objects.
    let plan = ingestor
        .plan_backfill(&env.bucket, "orders/", &options(8))
        .await
        .unwrap();
    let t = &plan.tables["orders"];
    assert_eq!((t.listed, t.committed, t.pending), (30, 11, 19));
    let report = ingestor.run_backfill(&plan, &options(8), &|_| {}).await;
    assert_eq!(
        (report.committed, report.duplicates, report.failed),
        (19, 0, 0)
    );
    assert_eq!(report.commits, 3, "19 objects in batches of 8");
    assert_eq!(report.records_in, 19 * 20);
    assert_eq!(
        report.records_in,
        report.records_committed + report.records_quarantined
    );
    assert_eq!(snapshot_count(&env, &ingestor).await, 6);
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let (rows, _, ids) = env.checksum(catalog.as_ref()).await;
    assert_eq!((rows, ids), (600, 600), "every order exactly once");

    // Nothing left: a third run commits nothing.
    let plan = ingestor
        .plan_backfill(&env.bucket, "orders/", &options(8))
        .await
        .unwrap();
    assert_eq!(plan.tables["orders"].pending, 0);
    assert!(plan.candidates.is_empty());

    // An object overwritten since (new content, new ETag) is pending again, and only it.
    env.put("orders/hist/003.jsonl", orders(5, 9_999)).await;
    let plan = ingestor
        .plan_backfill(&env.bucket, "orders/", &options(8))
        .await
        .unwrap();
    assert_eq!(plan.tables["orders"].pending, 1);
    let report = ingestor.run_backfill(&plan, &options(8), &|_| {}).await;
    assert_eq!(report.committed, 1);
    assert_eq!(env.count_rows(catalog.as_ref()).await, 605);

    // The time range applies to LastModified.
    let mut future = options(8);
    future.since = Some(chrono::Utc::now() + chrono::Duration::hours(1));
    let plan = ingestor
        .plan_backfill(&env.bucket, "orders/", &future)
        .await
        .unwrap();
    assert!(plan.tables.is_empty());
    assert_eq!(plan.out_of_range, 30);
}

#[tokio::test]
async fn a_backfill_racing_live_ingest_commits_each_object_once() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    for i in 0..12 {
        env.put(&format!("orders/race/{i:02}.jsonl"), orders(10, 900 + i))
            .await;
    }
    let plan = ingestor
        .plan_backfill(&env.bucket, "orders/race/", &options(4))
        .await
        .unwrap();
    assert_eq!(plan.candidates.len(), 12);
    // Live deliveries of half the objects land after the plan was made.
    let live = env.ingestor().await;
    for i in (0..12).step_by(2) {
        env.ingest(&live, &format!("orders/race/{i:02}.jsonl"))
            .await
            .unwrap();
    }
    let report = ingestor.run_backfill(&plan, &options(4), &|_| {}).await;
    assert_eq!(
        (report.committed, report.duplicates, report.failed),
        (6, 6, 0),
        "{report:?}"
    );
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let (rows, _, ids) = env.checksum(catalog.as_ref()).await;
    assert_eq!((rows, ids), (120, 120));
}

/// What a Distributed Map child execution hands the ingest function: the listed items (as
/// `s3:listObjectsV2` gives them: quoted ETag, no bucket) and the bucket in `BatchInput`.
async fn map_batch(env: &TestEnv, prefix: &str) -> serde_json::Value {
    let listed = env
        .s3
        .list_objects_v2()
        .bucket(&env.bucket)
        .prefix(prefix)
        .send()
        .await
        .unwrap();
    let items: Vec<serde_json::Value> = listed
        .contents()
        .iter()
        .map(|o| {
            serde_json::json!({
                "Etag": o.e_tag().unwrap(),
                "Key": o.key().unwrap(),
                "LastModified": o.last_modified().unwrap().secs(),
                "Size": o.size().unwrap(),
                "StorageClass": "STANDARD",
            })
        })
        .collect();
    serde_json::json!({"Items": items, "BatchInput": {"Bucket": env.bucket}})
}

/// A map batch run again (the map's Retry) finds every object committed, and the table holds
/// `rows` rows with as many distinct ids.
async fn retry_adds_nothing(
    env: &TestEnv,
    ingestor: &Ingestor,
    payload: &serde_json::Value,
    rows: usize,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let again = ingestor.handle_payload(payload, deadline).await;
    assert!(again.errors.is_empty());
    assert!(again
        .reports
        .iter()
        .all(|r| r.status == floe::ingest::Status::Duplicate));
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let (n, _, ids) = env.checksum(catalog.as_ref()).await;
    assert_eq!((n, ids), (rows, rows));
}

#[tokio::test]
async fn a_distributed_map_batch_is_one_commit_and_its_retry_is_idempotent() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    for i in 0..12 {
        env.put(
            &format!("orders/map/{i:02} part.jsonl"),
            orders(10, 700 + i),
        )
        .await;
    }
    let payload = map_batch(&env, "orders/map/").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let result = ingestor.handle_payload(&payload, deadline).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    assert!(!result.is_sqs);
    assert_eq!(result.reports.len(), 12);
    assert_eq!(
        snapshot_count(&env, &ingestor).await,
        1,
        "one commit for the batch"
    );
    // The answer Step Functions records is the batch's totals (states carry at most 256 KiB).
    let answer = floe::lambda::ingest_response(&result).unwrap();
    assert_eq!(answer["objects"], 12);
    assert_eq!(answer["by_status"]["Committed"], 12);
    assert_eq!(answer["records_committed"], 120);
    // The map's Retry runs the same batch again: nothing is added.
    retry_adds_nothing(&env, &ingestor, &payload, 120).await;
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    // An item deleted since it was listed is reported gone (not retried forever); the rest of
    // the batch is unchanged.
    let mut gone = map_batch(&env, "orders/map/").await;
    gone["Items"][0]["Key"] = serde_json::json!("orders/map/gone.jsonl");
    let result = ingestor.handle_payload(&gone, deadline).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    let statuses: Vec<_> = result.reports.iter().map(|r| r.status).collect();
    assert_eq!(statuses[0], floe::ingest::Status::Missing);
    assert!(statuses[1..]
        .iter()
        .all(|s| *s == floe::ingest::Status::Duplicate));
    assert_eq!(env.count_rows(catalog.as_ref()).await, 120);
}

/// `floe backfill --on-aws` hands the state machine the plan as a manifest: the map reads its
/// items and `ItemBatcher` passes consecutive runs of them to the ingest function. Those batches
/// commit every pending object once, one commit per batch, and a retried batch adds nothing.
#[tokio::test]
async fn a_plan_manifest_in_map_batches_commits_each_pending_object_once() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    for i in 0..10 {
        env.put(&format!("orders/mf/{i:02}.jsonl"), orders(20, 900 + i))
            .await;
    }
    env.ingest(&ingestor, "orders/mf/03.jsonl").await.unwrap();
    let plan = ingestor
        .plan_backfill(&env.bucket, "orders/mf/", &options(4))
        .await
        .unwrap();
    let items = plan.map_items();
    assert_eq!(items.len(), 9, "the committed object is left out");
    let keys: Vec<&str> = items.iter().map(|i| i["Key"].as_str().unwrap()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "ordered by key within the table");
    assert!(!keys.contains(&"orders/mf/03.jsonl"));
    assert!(items
        .iter()
        .all(|i| i["Bucket"] == serde_json::json!(env.bucket)
            && i["Etag"].as_str().is_some_and(|e| e.starts_with('"'))));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let batches: Vec<serde_json::Value> = items
        .chunks(4)
        .map(|c| serde_json::json!({"Items": c, "BatchInput": {"Bucket": env.bucket}}))
        .collect();
    for b in &batches {
        let result = ingestor.handle_payload(b, deadline).await;
        assert!(result.errors.is_empty(), "{:?}", result.errors);
        assert!(result
            .reports
            .iter()
            .all(|r| r.status == floe::ingest::Status::Committed));
    }
    assert_eq!(
        snapshot_count(&env, &ingestor).await,
        1 + 3,
        "one commit per batch"
    );
    retry_adds_nothing(&env, &ingestor, &batches[1], 200).await;
}
