//! Micro-batched commits: the objects of one SQS batch commit together (one snapshot per table,
//! naming every object), each still exactly once, with its own report and its own message.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use floe::commit::Committer;
use floe::ingest::{Ingestor, ObjectReport, PayloadResult, Status};
use iceberg::spec::Snapshot;
use serde_json::json;

use crate::faults::{assert_referenced_files_exist, race_before_swap, race_before_swaps, Race};
use crate::harness::{orders, TestEnv};

const APPEND: &str = "suspicious_orders";
const AGG: &str = "revenue_per_region_minute";

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

/// `orders/b<i>.jsonl` with `n` orders of seed `seed` (distinct order ids per seed).
async fn put(env: &TestEnv, key: &str, n: usize, seed: u64) {
    env.put(key, orders(n, seed)).await;
}

async fn handle(ingestor: &Ingestor, payload: &serde_json::Value) -> PayloadResult {
    ingestor.handle_payload(payload, soon()).await
}

/// The snapshots of `table`, oldest first.
async fn snapshots(env: &TestEnv, ingestor: &Ingestor, table: &str) -> Vec<Snapshot> {
    let ident = floe::catalog::table_ident(&env.config, table).unwrap();
    let t = ingestor.catalog().load_table(&ident).await.unwrap();
    let mut s: Vec<Snapshot> = t
        .metadata()
        .snapshots()
        .map(|s| s.as_ref().clone())
        .collect();
    s.sort_by_key(|s| s.sequence_number());
    s
}

fn prop<'a>(s: &'a Snapshot, key: &str) -> &'a str {
    s.summary()
        .additional_properties
        .get(key)
        .map(String::as_str)
        .unwrap_or("")
}

fn source_objects(s: &Snapshot) -> Vec<String> {
    serde_json::from_str(prop(s, "floe.source-objects")).unwrap_or_default()
}

fn report<'a>(result: &'a PayloadResult, key: &str) -> &'a ObjectReport {
    result
        .reports
        .iter()
        .find(|r| r.object.ends_with(&format!("/{key}")))
        .unwrap_or_else(|| panic!("no report for {key}: {:?}", result.reports))
}

fn reconciles(r: &ObjectReport) {
    assert_eq!(
        r.records_in,
        r.records_committed + r.records_quarantined,
        "in = committed + quarantined: {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_objects_of_one_payload_commit_in_one_snapshot_naming_all() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let mut keys = Vec::new();
    let mut expected = HashMap::new();
    for i in 0..8u64 {
        let key = format!("orders/b{i}.jsonl");
        let n = 20 + 7 * i as usize;
        let mut text = orders(n, 300 + i);
        if i == 3 {
            // Two bad records: quarantined, counted in the object's report and the summary.
            text.push_str("{not json\n{\"order_id\": null}\n");
        }
        env.put(&key, text).await;
        expected.insert(key.clone(), n);
        keys.push(key);
    }
    let before = snapshots(&env, &ingestor, "orders").await.len();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let result = handle(&ingestor, &env.sqs_batch(&refs)).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    assert!(result.failed_message_ids.is_empty());
    let snaps = snapshots(&env, &ingestor, "orders").await;
    assert_eq!(snaps.len(), before + 1, "exactly one new snapshot");
    let snap = snaps.last().unwrap();
    let mut named = source_objects(snap);
    named.sort();
    assert_eq!(named.len(), 8, "{named:?}");
    for key in &keys {
        assert!(
            named
                .iter()
                .any(|id| id.starts_with(&format!("s3://{}/{key}#", env.bucket))),
            "{key} in {named:?}"
        );
        let r = report(&result, key.trim_start_matches("orders/"));
        assert_eq!(r.status, Status::Committed, "{r:?}");
        assert_eq!(r.snapshot_id, Some(snap.snapshot_id()));
        assert_eq!(r.records_committed as usize, expected[key], "{r:?}");
        reconciles(r);
    }
    let r3 = report(&result, "b3.jsonl");
    assert_eq!(r3.records_quarantined, 2, "{r3:?}");
    let total: usize = expected.values().sum();
    let sum = |f: fn(&ObjectReport) -> u64| result.reports.iter().map(f).sum::<u64>().to_string();
    assert_eq!(prop(snap, "records-in"), sum(|r| r.records_in));
    assert_eq!(prop(snap, "records-committed"), total.to_string());
    assert_eq!(prop(snap, "records-quarantined"), "2");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, total);
    // One object per data file: the `_source` bounds of each file name one object.
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let files = floe::scan::live_files(&table).await.unwrap();
    assert!(files.len() >= 8);
    let source = table
        .metadata()
        .current_schema()
        .field_by_name("_source")
        .unwrap()
        .id;
    for f in &files {
        let (lo, hi) = (f.file.lower_bounds(), f.file.upper_bounds());
        assert!(
            lo.get(&source).is_some() && lo.get(&source) == hi.get(&source),
            "one object per file: {:?} .. {:?}",
            lo.get(&source),
            hi.get(&source)
        );
    }
    assert_referenced_files_exist(&table, "batch").await;
    let py = env.pyiceberg();
    assert_eq!(py["rows"], total, "{py}");
    assert_eq!(py["distinct_order_ids"], total, "{py}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_of_two_tables_make_one_commit_per_table() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let keys = [
        "orders/t0.jsonl",
        "consumer/t1.jsonl",
        "orders/t2.jsonl",
        "consumer/t3.jsonl",
        "orders/t4.jsonl",
    ];
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 30 + i, 400 + i as u64).await;
    }
    let result = handle(&ingestor, &env.sqs_batch(&keys)).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    for (table, n, rows) in [("orders", 3, 30 + 32 + 34), ("orders_consumer", 2, 31 + 33)] {
        let snaps = snapshots(&env, &ingestor, table).await;
        assert_eq!(snaps.len(), 1, "{table}: one commit");
        assert_eq!(source_objects(&snaps[0]).len(), n, "{table}");
        assert_eq!(prop(&snaps[0], "records-committed"), rows.to_string());
        let ids: Vec<_> = result
            .reports
            .iter()
            .filter(|r| r.table == table)
            .map(|r| (r.status, r.snapshot_id))
            .collect();
        assert_eq!(ids.len(), n);
        assert!(
            ids.iter()
                .all(|s| *s == (Status::Committed, Some(snaps[0].snapshot_id()))),
            "{table}: {ids:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_version_twice_in_one_payload_commits_once() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    put(&env, "orders/d0.jsonl", 50, 500).await;
    put(&env, "orders/d1.jsonl", 40, 501).await;
    let etag = env
        .put_version("orders/d2.jsonl", orders(30, 502))
        .await
        .e_tag()
        .unwrap()
        .to_string();
    // d0 twice without a version in the event (told apart after reading), d2 twice with its
    // ETag (told apart from the event).
    let payload = json!({"Records": [
        env.sqs_message("a", "orders/d0.jsonl", None),
        env.sqs_message("b", "orders/d1.jsonl", None),
        env.sqs_message("c", "orders/d0.jsonl", None),
        env.sqs_message("d", "orders/d2.jsonl", Some(&etag)),
        env.sqs_message("e", "orders/d2.jsonl", Some(&etag)),
    ]});
    let result = handle(&ingestor, &payload).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    assert!(result.failed_message_ids.is_empty());
    let statuses: Vec<Status> = result.reports.iter().map(|r| r.status).collect();
    use Status::{Committed as C, Duplicate as D};
    assert_eq!(statuses, vec![C, C, D, C, D], "{:?}", result.reports);
    for r in &result.reports {
        reconciles(r);
        if r.status == D {
            assert_eq!((r.records_in, r.data_files), (0, 0), "{r:?}");
        }
    }
    let snaps = snapshots(&env, &ingestor, "orders").await;
    assert_eq!(snaps.len(), 1);
    assert_eq!(source_objects(&snaps[0]).len(), 3);
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 120);
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(
        floe::scan::live_files(&table).await.unwrap().len(),
        3,
        "the copies' files are not in the table"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_payload_adds_nothing_and_a_partly_committed_one_adds_the_rest() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let keys = ["orders/r0.jsonl", "orders/r1.jsonl", "orders/r2.jsonl"];
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 25, 600 + i as u64).await;
    }
    let payload = env.sqs_batch(&keys);
    let first = handle(&ingestor, &payload).await;
    assert!(first.errors.is_empty(), "{:?}", first.errors);
    let snap = first.reports[0].snapshot_id;
    // The whole payload again (the Lambda's answer was lost): all Duplicate, nothing new.
    let again = handle(&ingestor, &payload).await;
    assert!(again.failed_message_ids.is_empty());
    for r in &again.reports {
        assert_eq!(
            (r.status, r.snapshot_id),
            (Status::Duplicate, snap),
            "{r:?}"
        );
        reconciles(r);
    }
    assert_eq!(snapshots(&env, &ingestor, "orders").await.len(), 1);
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 75);

    // Four new objects; two were committed earlier (alone), the payload holds all four.
    let more = [
        "orders/r3.jsonl",
        "orders/r4.jsonl",
        "orders/r5.jsonl",
        "orders/r6.jsonl",
    ];
    for (i, k) in more.iter().enumerate() {
        put(&env, k, 10 + i, 610 + i as u64).await;
    }
    for k in ["orders/r3.jsonl", "orders/r5.jsonl"] {
        let r = env.ingest(&ingestor, k).await.unwrap();
        assert_eq!(r.status, Status::Committed);
    }
    let result = handle(&ingestor, &env.sqs_batch(&more)).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    let statuses: Vec<Status> = result.reports.iter().map(|r| r.status).collect();
    use Status::{Committed as C, Duplicate as D};
    assert_eq!(statuses, vec![D, C, D, C]);
    let snaps = snapshots(&env, &ingestor, "orders").await;
    assert_eq!(snaps.len(), 4);
    let named = source_objects(snaps.last().unwrap());
    assert_eq!(named.len(), 2, "{named:?}");
    assert!(named
        .iter()
        .all(|id| id.contains("r4.jsonl") || id.contains("r6.jsonl")));
    assert_eq!(
        env.count_rows(ingestor.catalog().as_ref()).await,
        75 + 10 + 11 + 12 + 13
    );
}

/// Ingests `key` through a new ingestor of `env` whose swaps `races` precede, one each.
async fn ingest_racing(env: &TestEnv, races: Vec<Race>, key: &str) -> (Ingestor, ObjectReport) {
    let ingestor = env.ingestor_with(race_before_swaps(races)).await;
    let r = ingestor.ingest(&env.object(key), soon()).await.unwrap();
    (ingestor, r)
}

/// Another writer of the table commits just before each of our first six swaps: more lost races
/// than `max_commit_attempts` (3). A lost race is that writer's progress, not a fault, so the
/// commit goes on (each attempt re-validated on the new version) until it lands; giving up made
/// the loser of a steady two-writer race hand its batch back to the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_losing_more_races_than_max_attempts_still_lands() {
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.max_commit_attempts = 3;
    let keys: Vec<String> = (0..7).map(|i| format!("orders/s{i}.jsonl")).collect();
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 20, 900 + i as u64).await;
    }
    let other = Arc::new(env.ingestor().await);
    let races: Vec<Race> = keys[1..]
        .iter()
        .map(|k| {
            let (other, obj) = (other.clone(), env.object(k));
            let race: Race = Box::new(move || {
                Box::pin(async move {
                    let r = other.ingest(&obj, soon()).await.unwrap();
                    assert_eq!(r.status, Status::Committed);
                })
            });
            race
        })
        .collect();
    let (ingestor, r) = ingest_racing(&env, races, &keys[0]).await;
    assert_eq!((r.status, r.attempts), (Status::Committed, 7), "{r:?}");
    assert_eq!(snapshots(&env, &ingestor, "orders").await.len(), 7);
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 140);
}

/// Two writers of one table, the other one committing just before our swaps: after our second
/// lost race we ask for our turn, and the other writer, which has seen our commits, waits for
/// ours to land before committing again. Before, its commit started in our window landed first
/// and we lost a third time (and on, while it had objects to commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_keeps_losing_races_is_let_through_by_the_other() {
    let env = TestEnv::new("sqlite").await;
    let keys: Vec<String> = (0..6).map(|i| format!("orders/t{i}.jsonl")).collect();
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 20, 950 + i as u64).await;
    }
    let other = Arc::new(env.ingestor().await);
    let plain = env.ingestor().await;
    // Each has seen the other commit: the other writer's table is a contended one.
    for (writer, k) in [(&*other, &keys[1]), (&plain, &keys[2])] {
        let r = writer.ingest(&env.object(k), soon()).await.unwrap();
        assert_eq!(r.status, Status::Committed);
    }
    let late: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<Status>>>> = Arc::default();
    let races: Vec<Race> = keys[3..]
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let (other, obj, late) = (other.clone(), env.object(k), late.clone());
            let race: Race = Box::new(move || {
                Box::pin(async move {
                    let mut run =
                        tokio::spawn(
                            async move { other.ingest(&obj, soon()).await.unwrap().status },
                        );
                    if i < 2 {
                        // The first two: the other writer commits first.
                        assert_eq!(run.await.unwrap(), Status::Committed);
                        return;
                    }
                    // The third, after our ask: it waits for our commit instead.
                    match tokio::time::timeout(Duration::from_millis(500), &mut run).await {
                        Ok(status) => panic!(
                            "the other writer committed in our window: {:?}",
                            status.unwrap()
                        ),
                        Err(_) => late.lock().unwrap().push(run),
                    }
                })
            });
            race
        })
        .collect();
    let (ingestor, r) = ingest_racing(&env, races, &keys[0]).await;
    assert_eq!((r.status, r.attempts), (Status::Committed, 3), "{r:?}");
    let waiting = late.lock().unwrap().pop().expect("the other writer waited");
    assert_eq!(waiting.await.unwrap(), Status::Committed);
    // Ours landed before the one the other writer held back.
    let snaps = snapshots(&env, &ingestor, "orders").await;
    assert_eq!(snaps.len(), 6);
    let order: Vec<String> = snaps.iter().flat_map(source_objects).collect();
    let at = |k: &str| order.iter().position(|id| id.contains(k)).unwrap();
    assert!(at("t0.jsonl") < at("t5.jsonl"), "{order:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 120);
    // The ask was withdrawn once our commit was done.
    assert!(
        !env.keys("warehouse/")
            .await
            .iter()
            .any(|k| k.ends_with("floe-commit-turn.json")),
        "turn marker left behind"
    );
}

/// Another delivery of a member commits while the batch commit is in flight: the batch's swap
/// meets the conflict, its plan finds that member committed and leaves it (and its files) out;
/// the rest land once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_committed_meanwhile_by_another_delivery_is_left_out() {
    let env = TestEnv::new("sqlite").await;
    let keys = ["orders/w0.jsonl", "orders/w1.jsonl", "orders/w2.jsonl"];
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 40, 700 + i as u64).await;
    }
    let other = env.ingestor().await;
    let obj = env.object("orders/w1.jsonl");
    let race: crate::faults::Race = Box::new(move || {
        Box::pin(async move {
            let r = other.ingest(&obj, soon()).await.unwrap();
            assert_eq!(r.status, Status::Committed);
        })
    });
    let ingestor = env.ingestor_with(race_before_swap(race)).await;
    let result = handle(&ingestor, &env.sqs_batch(&keys)).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    let statuses: Vec<(Status, u32)> = result
        .reports
        .iter()
        .map(|r| (r.status, r.attempts))
        .collect();
    assert_eq!(
        statuses,
        vec![
            (Status::Committed, 2),
            (Status::Duplicate, 0),
            (Status::Committed, 2)
        ],
        "{:?}",
        result.reports
    );
    let snaps = snapshots(&env, &ingestor, "orders").await;
    assert_eq!(snaps.len(), 2);
    assert_eq!(
        report(&result, "w1.jsonl").snapshot_id,
        Some(snaps[0].snapshot_id())
    );
    let named = source_objects(&snaps[1]);
    assert_eq!(named.len(), 2, "{named:?}");
    assert!(!named.iter().any(|id| id.contains("w1.jsonl")));
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 120);
    let (_, _, distinct) = env.checksum(ingestor.catalog().as_ref()).await;
    assert_eq!(distinct, 120);
    // The batch's copy of w1 was deleted: only the winner's files are under data/.
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let live = floe::scan::live_files(&table).await.unwrap().len();
    let written = env
        .keys("warehouse/")
        .await
        .into_iter()
        .filter(|k| k.ends_with(".parquet"))
        .count();
    assert_eq!(written, live, "no unreferenced data file left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_member_fails_only_its_message() {
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.max_spool_bytes = 4096;
    let ingestor = env.ingestor().await;
    put(&env, "orders/g0.jsonl", 30, 800).await;
    put(&env, "orders/g1.jsonl", 31, 801).await;
    put(&env, "orders/g2.jsonl", 32, 802).await;
    env.put("orders/bad.jsonl.gz", b"\x1f\x8bnot gzip at all".to_vec())
        .await;
    let big = crate::matrix::parquet_of(&orders(3000, 803));
    assert!(big.len() > 4096);
    env.put("parquet/big.parquet", big).await;
    let payload = json!({"Records": [
        env.sqs_message("good0", "orders/g0.jsonl", None),
        env.sqs_message("unreadable", "orders/bad.jsonl.gz", None),
        env.sqs_message("good1", "orders/g1.jsonl", None),
        env.sqs_message("missing", "orders/never-written.jsonl", None),
        env.sqs_message("over-limit", "parquet/big.parquet", None),
        env.sqs_message("good2", "orders/g2.jsonl", None),
    ]});
    let result = handle(&ingestor, &payload).await;
    assert_eq!(result.failed_message_ids, vec!["over-limit".to_string()]);
    assert_eq!(result.errors.len(), 1, "{:?}", result.errors);
    assert!(
        result.errors[0].contains("max_spool_bytes"),
        "{:?}",
        result.errors
    );
    assert_eq!(report(&result, "bad.jsonl.gz").status, Status::Unreadable);
    assert_eq!(
        report(&result, "never-written.jsonl").status,
        Status::Missing
    );
    let snaps = snapshots(&env, &ingestor, "orders").await;
    assert_eq!(snaps.len(), 1);
    for k in ["g0.jsonl", "g1.jsonl", "g2.jsonl"] {
        let r = report(&result, k);
        assert_eq!(
            (r.status, r.snapshot_id),
            (Status::Committed, Some(snaps[0].snapshot_id()))
        );
    }
    assert_eq!(source_objects(&snaps[0]).len(), 3);
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 93);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_evolves_the_schema_commits_and_its_rows_read_back() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    put(&env, "orders/s0.jsonl", 20, 900).await;
    let coupon: String = orders(15, 901)
        .lines()
        .map(|l| format!("{},\"coupon\":\"XMAS\"}}\n", l.trim_end_matches('}')))
        .collect();
    env.put("orders/s1.jsonl", coupon).await;
    put(&env, "orders/s2.jsonl", 25, 902).await;
    let keys = ["orders/s0.jsonl", "orders/s1.jsonl", "orders/s2.jsonl"];
    let result = handle(&ingestor, &env.sqs_batch(&keys)).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    assert!(result.reports.iter().all(|r| r.status == Status::Committed));
    let evolved = report(&result, "s1.jsonl");
    assert!(evolved.schema_change.is_some(), "{evolved:?}");
    assert_eq!(evolved.records_committed, 15);
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert!(table
        .metadata()
        .current_schema()
        .field_by_name("coupon")
        .is_some());
    // Every object committed exactly once, in at most one commit per object.
    let snaps = snapshots(&env, &ingestor, "orders").await;
    let mut named: Vec<String> = snaps.iter().flat_map(source_objects).collect();
    named.sort();
    named.dedup();
    assert_eq!(named.len(), 3);
    assert_eq!(
        snaps.iter().map(|s| source_objects(s).len()).sum::<usize>(),
        3
    );
    let batches = env.scan_all(ingestor.catalog().as_ref()).await;
    let mut coupons = 0;
    let mut rows = 0;
    for b in &batches {
        rows += b.num_rows();
        let c = b.column_by_name("coupon").unwrap();
        coupons += c.len() - c.null_count();
    }
    assert_eq!((rows, coupons), (60, 15));
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 60, "{py}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_commits_off_is_one_snapshot_per_object() {
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.batch_commits = false;
    let ingestor = env.ingestor().await;
    let keys = [
        "orders/o0.jsonl",
        "orders/o1.jsonl",
        "orders/o2.jsonl",
        "orders/o3.jsonl",
    ];
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 10, 950 + i as u64).await;
    }
    let result = handle(&ingestor, &env.sqs_batch(&keys)).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    let snaps = snapshots(&env, &ingestor, "orders").await;
    assert_eq!(snaps.len(), 4);
    assert!(snaps.iter().all(|s| source_objects(s).len() == 1));
    let mut ids: Vec<_> = result.reports.iter().map(|r| r.snapshot_id).collect();
    ids.dedup();
    assert_eq!(ids.len(), 4);
}

/// The objects of a payload are prepared one after another; the commit must still get its
/// whole window, so objects that no longer fit before the deadline are left for retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_that_no_longer_fit_before_the_deadline_are_left_for_retry() {
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.commit_timeout_seconds = 30;
    let ingestor = env.ingestor().await;
    let keys = [
        "orders/l0.jsonl",
        "orders/l1.jsonl",
        "orders/l2.jsonl",
        "orders/l3.jsonl",
    ];
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 20, 980 + i as u64).await;
    }
    let payload = env.sqs_batch(&keys);
    // Exactly one commit window left: the first object, then no more.
    let tight = Instant::now() + Duration::from_secs(30);
    let result = ingestor.handle_payload(&payload, tight).await;
    assert_eq!(
        result.failed_message_ids,
        vec!["m1", "m2", "m3"],
        "{:?}",
        result.errors
    );
    assert!(
        result.errors.iter().all(|e| e.contains("left for retry")),
        "{:?}",
        result.errors
    );
    assert_eq!(result.reports.len(), 1);
    assert_eq!(result.reports[0].status, Status::Committed);
    // The retried messages commit; the first is a duplicate.
    let again = handle(&ingestor, &payload).await;
    assert!(again.failed_message_ids.is_empty(), "{:?}", again.errors);
    let statuses: Vec<Status> = again.reports.iter().map(|r| r.status).collect();
    use Status::{Committed as C, Duplicate as D};
    assert_eq!(statuses, vec![D, C, C, C]);
    assert_eq!(snapshots(&env, &ingestor, "orders").await.len(), 2);
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 80);
}

/// One `floe.commit` event per batch commit, with the commit's totals; the process run it
/// triggers covers the batch and the commits that arrived meanwhile in one run (coalesced),
/// and reconcile matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_commit_event_per_batch_and_process_coalesces_what_arrived_meanwhile() {
    let sdk =
        floe::store::sdk_config(&crate::harness::storage(), Some(crate::harness::moto())).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let (bus, url) = crate::process::bus_to_queue(&sdk, "floe.commit").await;
    let mut env = TestEnv::with_pipelines("sqlite", "").await;
    env.config.events.bus = Some(bus);
    env.config.events.endpoint = Some(crate::harness::moto().to_string());
    let ingestor = env.ingestor().await;
    let p = env.processor().await;
    // A first commit and run: the pipelines have a checkpoint.
    put(&env, "orders/p.jsonl", 200, 1000).await;
    env.ingest(&ingestor, "orders/p.jsonl").await.unwrap();
    for name in [APPEND, AGG] {
        p.run(name, soon()).await.unwrap();
    }
    crate::process::drain(&sqs, &url).await;

    let keys = [
        "orders/p0.jsonl",
        "orders/p1.jsonl",
        "orders/p2.jsonl",
        "orders/p3.jsonl",
    ];
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 100 + 10 * i, 1001 + i as u64).await;
    }
    let result = handle(&ingestor, &env.sqs_batch(&keys)).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    let snapshot = result.reports[0].snapshot_id.unwrap();
    let events = crate::process::drain(&sqs, &url).await;
    assert_eq!(events.len(), 1, "one commit, one event: {events:?}");
    let detail = &events[0]["detail"];
    assert_eq!(detail["table"], "orders");
    assert_eq!(detail["snapshot_id"], snapshot);
    assert_eq!(
        detail["records_committed"],
        100 + 110 + 120 + 130,
        "{detail}"
    );
    assert_eq!(
        detail["objects"].as_array().map(Vec::len),
        Some(4),
        "{detail}"
    );
    // Two more commits land before the process function runs.
    for (i, k) in ["orders/p4.jsonl", "orders/p5.jsonl"].iter().enumerate() {
        put(&env, k, 50, 1010 + i as u64).await;
        env.ingest(&ingestor, k).await.unwrap();
    }
    let (runs, errors) = p.handle_payload(&events[0], soon()).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(runs.len(), 2);
    for r in &runs {
        assert_eq!(
            r.source_snapshots, 3,
            "one run for all three commits: {r:?}"
        );
        assert_eq!(r.rows_in, 460 + 100, "{r:?}");
        let again = p.run(&r.pipeline, soon()).await.unwrap();
        assert_eq!(again.source_snapshots, 0);
    }
    for name in [APPEND, AGG] {
        let rec = p.reconcile(name).await.unwrap();
        assert!(rec.matches(), "{name}: {rec:?}");
        assert!(rec.batch_rows > 0);
    }
}

/// History expired while the batch was being prepared: the batch plan cannot decide its members
/// from the summaries (Stale); they start over one by one, where the early check asks the rows,
/// and each lands once. A redelivery after the next expiration is answered by the rows too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_expired_during_the_batch_sends_members_through_the_durable_check() {
    let env = TestEnv::new("sqlite").await;
    put(&env, "orders/h.jsonl", 30, 1100).await;
    let setup = env.ingestor().await;
    env.ingest(&setup, "orders/h.jsonl").await.unwrap();
    let keys = ["orders/h0.jsonl", "orders/h1.jsonl", "orders/h2.jsonl"];
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 20 + i, 1101 + i as u64).await;
    }
    for (i, k) in ["orders/z0.jsonl", "orders/z1.jsonl"].iter().enumerate() {
        put(&env, k, 10, 1110 + i as u64).await;
    }
    // Meanwhile: two more commits, then an expiration keeping only the latest snapshot, so the
    // version the members were checked on is gone and so is the way back to it.
    let (other, maintainer) = (env.ingestor().await, env.maintainer().await);
    let (z0, z1) = (env.object("orders/z0.jsonl"), env.object("orders/z1.jsonl"));
    let race: crate::faults::Race = Box::new(move || {
        Box::pin(async move {
            for z in [z0, z1] {
                other.ingest(&z, soon()).await.unwrap();
            }
            maintainer
                .run("orders", &crate::matrix::expire_all())
                .await
                .unwrap();
        })
    });
    let ingestor = env.ingestor_with(race_before_swap(race)).await;
    let result = handle(&ingestor, &env.sqs_batch(&keys)).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    for r in &result.reports {
        assert_eq!(r.status, Status::Committed, "{r:?}");
        reconciles(r);
    }
    let snaps = snapshots(&env, &ingestor, "orders").await;
    let named: Vec<String> = snaps.iter().flat_map(source_objects).collect();
    for k in keys {
        assert_eq!(
            named.iter().filter(|id| id.contains(k)).count(),
            1,
            "{k}: {named:?}"
        );
    }
    let expected = 30 + 20 + 21 + 22 + 20;
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, expected);
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_referenced_files_exist(&table, "stale batch").await;
    let live = floe::scan::live_files(&table).await.unwrap().len();
    let written = env
        .keys("warehouse/")
        .await
        .into_iter()
        .filter(|k| k.ends_with(".parquet"))
        .count();
    assert_eq!(written, live, "the stale batch's files were deleted");

    // Everything expired again: a redelivery is answered by the rows' `_source`.
    env.maintainer()
        .await
        .run("orders", &crate::matrix::expire_all())
        .await
        .unwrap();
    let again = handle(&env.ingestor().await, &env.sqs_batch(&keys)).await;
    assert!(again.errors.is_empty(), "{:?}", again.errors);
    assert!(
        again.reports.iter().all(|r| r.status == Status::Duplicate),
        "{:?}",
        again.reports
    );
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, expected);
}

/// The batch commit landed (its answer lost) but its summary cannot be read afterwards: no
/// member is acknowledged on a guess and no file is deleted; every message is retried and the
/// redelivery finds every member committed, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_batch_whose_summary_cannot_be_read_acknowledges_nothing() {
    use crate::faults::{lost_answer_then_dark, Blackout, BlackoutLoads};
    let env = TestEnv::new("sqlite").await;
    let keys = ["orders/u0.jsonl", "orders/u1.jsonl", "orders/u2.jsonl"];
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 30, 1200 + i as u64).await;
    }
    let blackout = Arc::new(Blackout::default());
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let dark: Arc<dyn iceberg::Catalog> = Arc::new(floe::catalog::Hooked::new(
        catalog,
        BlackoutLoads(blackout.clone()),
    ));
    let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
    let swap = lost_answer_then_dark(blackout, 1)(swap);
    let store = floe::store::from_config(&env.config.storage).await;
    let ingestor = Ingestor::with_parts(env.config.clone(), Committer::new(dark, swap), store)
        .await
        .unwrap();
    let payload = env.sqs_batch(&keys);
    let result = handle(&ingestor, &payload).await;
    assert_eq!(
        result.failed_message_ids,
        vec!["m0", "m1", "m2"],
        "{:?}",
        result.reports
    );
    assert!(result.reports.is_empty(), "{:?}", result.reports);
    assert!(
        result.errors.iter().all(|e| e.contains("CommitUnknown")),
        "{:?}",
        result.errors
    );
    // It did land, and every file it references is still there.
    let healthy = env.ingestor().await;
    let table = healthy.catalog().load_table(&env.ident()).await.unwrap();
    assert_referenced_files_exist(&table, "unreadable summary").await;
    let again = handle(&healthy, &payload).await;
    assert!(again.failed_message_ids.is_empty(), "{:?}", again.errors);
    assert!(again.reports.iter().all(|r| r.status == Status::Duplicate));
    assert_eq!(snapshots(&env, &healthy, "orders").await.len(), 1);
    assert_eq!(env.count_rows(healthy.catalog().as_ref()).await, 90);
}

/// A member that commits alone (here: an object delivered twice in one payload, so its table's
/// group holds one member) and loses to another delivery reports, like a batch member or a copy
/// that lost, that it added nothing: the winner's report counted the rows, so the reports of
/// both deliveries add up to the table's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_committing_alone_that_another_delivery_beat_reports_nothing_added() {
    let env = TestEnv::new("sqlite").await;
    put(&env, "orders/s0.jsonl", 25, 1300).await;
    let other = env.ingestor().await;
    let obj = env.object("orders/s0.jsonl");
    let won = Arc::new(std::sync::Mutex::new(Vec::new()));
    let won_by_other = won.clone();
    let race: crate::faults::Race = Box::new(move || {
        Box::pin(async move {
            let r = other.ingest(&obj, soon()).await.unwrap();
            assert_eq!(r.status, Status::Committed, "{r:?}");
            won_by_other.lock().unwrap().push(r);
        })
    });
    let ingestor = env.ingestor_with(race_before_swap(race)).await;
    let payload = json!({"Records": [
        env.sqs_message("a", "orders/s0.jsonl", None),
        env.sqs_message("b", "orders/s0.jsonl", None),
    ]});
    let result = handle(&ingestor, &payload).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    assert_eq!(result.reports.len(), 2);
    for r in &result.reports {
        assert_eq!(r.status, Status::Duplicate, "{r:?}");
        assert_eq!(
            (
                r.records_in,
                r.records_committed,
                r.data_files,
                r.quarantine.clone()
            ),
            (0, 0, 0, None),
            "a lost race adds nothing: {r:?}"
        );
    }
    let won = won.lock().unwrap().clone();
    let reported: u64 = result
        .reports
        .iter()
        .chain(won.iter())
        .map(|r| r.records_committed)
        .sum();
    let snaps = snapshots(&env, &ingestor, "orders").await;
    assert_eq!(snaps.len(), 1, "only the winner's commit");
    assert_eq!(prop(&snaps[0], "total-records"), "25");
    assert_eq!(reported, 25, "the reports add up to the rows committed");
}

/// A stale batch commit (history expired meanwhile) starts its members over one by one, each
/// read, written and committed again: under the payload's deadline rule, so a member whose
/// ingest and commit window no longer fit before the Lambda's deadline is left for retry
/// instead of running into the timeout (which would lose the whole payload's answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_batch_restarts_its_members_only_while_they_fit_before_the_deadline() {
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.commit_timeout_seconds = 6;
    put(&env, "orders/g.jsonl", 30, 1400).await;
    let setup = env.ingestor().await;
    env.ingest(&setup, "orders/g.jsonl").await.unwrap();
    let keys = ["orders/g0.jsonl", "orders/g1.jsonl", "orders/g2.jsonl"];
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 20 + i, 1401 + i as u64).await;
    }
    for (i, k) in ["orders/y0.jsonl", "orders/y1.jsonl"].iter().enumerate() {
        put(&env, k, 10, 1410 + i as u64).await;
    }
    let start = Instant::now();
    // The deadline leaves room for the payload's preparation and one commit window.
    let deadline = start + Duration::from_secs(8);
    let (other, maintainer) = (env.ingestor().await, env.maintainer().await);
    let (y0, y1) = (env.object("orders/y0.jsonl"), env.object("orders/y1.jsonl"));
    // Meanwhile: two commits and an expiration keeping only the latest, so the way back to the
    // version the members were checked on is gone. It ends inside the batch's commit window
    // but with less than a window left before the deadline.
    let race: crate::faults::Race = Box::new(move || {
        Box::pin(async move {
            for y in [y0, y1] {
                other.ingest(&y, soon()).await.unwrap();
            }
            maintainer
                .run("orders", &crate::matrix::expire_all())
                .await
                .unwrap();
            tokio::time::sleep_until((start + Duration::from_millis(5500)).into()).await;
        })
    });
    let ingestor = env.ingestor_with(race_before_swap(race)).await;
    let payload = env.sqs_batch(&keys);
    let result = ingestor.handle_payload(&payload, deadline).await;
    assert_eq!(
        result.failed_message_ids,
        vec!["m0", "m1", "m2"],
        "{:?} {:?}",
        result.errors,
        result.reports
    );
    assert!(
        result.errors.iter().all(|e| e.contains("left for retry")),
        "{:?}",
        result.errors
    );
    assert!(Instant::now() < deadline, "answered before the deadline");
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let live = floe::scan::live_files(&table).await.unwrap().len();
    let written = env
        .keys("warehouse/")
        .await
        .into_iter()
        .filter(|k| k.ends_with(".parquet"))
        .count();
    assert_eq!(written, live, "the stale batch's files were deleted");
    // The redelivery commits each member once.
    let again = handle(&env.ingestor().await, &payload).await;
    assert!(again.failed_message_ids.is_empty(), "{:?}", again.errors);
    let snaps = snapshots(&env, &ingestor, "orders").await;
    let named: Vec<String> = snaps.iter().flat_map(source_objects).collect();
    for k in keys {
        assert_eq!(named.iter().filter(|id| id.contains(k)).count(), 1, "{k}");
    }
    assert_eq!(
        env.count_rows(ingestor.catalog().as_ref()).await,
        30 + 20 + 20 + 21 + 22
    );
}

/// More objects of one table than one commit holds commit in chunks, one after another, each
/// in its own commit window: an object that would open a chunk whose window no longer fits
/// before the deadline is left for retry, like any object that no longer fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_opening_a_chunk_whose_commit_window_does_not_fit_is_left_for_retry() {
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.commit_timeout_seconds = 30;
    let ingestor = env.ingestor().await;
    let keys: Vec<String> = (0..101).map(|i| format!("orders/c{i}.jsonl")).collect();
    for (i, k) in keys.iter().enumerate() {
        put(&env, k, 1, 1500 + i as u64).await;
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let payload = env.sqs_batch(&refs);
    // Room for the preparation and one commit window, not two: the first chunk (100 objects)
    // fits, a second one would not.
    let deadline = Instant::now() + Duration::from_secs(45);
    let result = ingestor.handle_payload(&payload, deadline).await;
    assert_eq!(
        result.failed_message_ids,
        vec!["m100"],
        "{:?}",
        result.errors
    );
    assert!(
        result.errors.iter().all(|e| e.contains("left for retry")),
        "{:?}",
        result.errors
    );
    assert_eq!(result.reports.len(), 100);
    assert!(result.reports.iter().all(|r| r.status == Status::Committed));
    let snaps = snapshots(&env, &ingestor, "orders").await;
    assert_eq!(snaps.len(), 1);
    assert_eq!(source_objects(&snaps[0]).len(), 100);
    let again = handle(&ingestor, &payload).await;
    assert!(again.failed_message_ids.is_empty(), "{:?}", again.errors);
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 101);
}
