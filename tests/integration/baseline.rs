//! The baseline and cost (`floe baseline`, [`floe::baseline`]) over a history made through the
//! S3 protocol: what every commit records (compute, memory, S3 requests counted on the way,
//! the objects' LastModified) and the figures computed from it.

use std::time::{Duration, Instant};

use floe::baseline::{self, Options};
use floe::summary::{self, Usage};
use iceberg::spec::{Operation, Snapshot};

use crate::harness::TestEnv;

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

/// `n` orders of one day: event times a minute before a base inside today (UTC), so every
/// object writes one file into the same `day(event_time)` partition whenever the test runs.
fn orders(n: usize, seed: u64) -> String {
    let now = chrono::Utc::now();
    let midnight = now
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .map(|t| t.and_utc())
        .unwrap_or(now);
    let base = (now - chrono::Duration::hours(1)).max(midnight + chrono::Duration::seconds(61));
    floe::sample::orders_jsonl(n, seed, base)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

fn count(s: &Snapshot, key: &str) -> u64 {
    s.summary()
        .additional_properties
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Five objects (a batch of three in one commit, two alone), both sample pipelines after each
/// ingest, a compaction: every commit records its usage, and the baseline's figures follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_commit_records_its_usage_and_the_baseline_adds_it_up() {
    let env = TestEnv::with_pipelines(
        "sqlite",
        "[cost]\ningest_memory_mb = 512\nprocess_memory_mb = 3008\n",
    )
    .await;
    let ingestor = env.ingestor().await;
    let processor = env.processor().await;
    let keys = ["orders/b0.jsonl", "orders/b1.jsonl", "orders/b2.jsonl"];
    for (i, k) in keys.iter().enumerate() {
        env.put(k, orders(40, i as u64 + 1)).await;
    }
    let r = ingestor.handle_payload(&env.sqs_batch(&keys), soon()).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    for name in ["suspicious_orders", "revenue_per_region_minute"] {
        processor.run(name, soon()).await.expect("run");
    }
    for (i, k) in ["orders/s0.jsonl", "orders/s1.jsonl"].iter().enumerate() {
        env.put(k, orders(30, 10 + i as u64)).await;
        let r = env.ingest(&ingestor, k).await.expect("ingest");
        assert_eq!(r.records_committed, 30);
        for name in ["suspicious_orders", "revenue_per_region_minute"] {
            processor.run(name, soon()).await.expect("run");
        }
    }
    let maintainer = env.maintainer().await;
    let m = maintainer
        .run(
            "orders",
            &floe::maintain::Options {
                min_input_files: 2,
                ..crate::maintain_opts(true, false, false)
            },
        )
        .await
        .expect("maintain");
    assert_eq!(m.groups_compacted, 1, "{m:?}");
    let run_usage = m.usage.clone().expect("the run's usage");
    assert!(run_usage.s3.expect("counted").get >= 3, "{run_usage:?}");

    // What each commit of `orders` recorded.
    let catalog = floe::catalog::connect(&env.config).await.expect("catalog");
    let table = catalog.load_table(&env.ident()).await.expect("load");
    let md = table.metadata();
    let mut snaps: Vec<_> = md.snapshots().collect();
    snaps.sort_by_key(|s| s.sequence_number());
    assert_eq!(snaps.len(), 4, "batch, two singles, compaction");
    for s in &snaps[..3] {
        let u = Usage::read(s.summary()).expect("usage");
        assert_eq!((u.function.as_str(), u.memory_mb), ("ingest", 512));
        assert!(u.compute_ms > 0, "{u:?}");
        let s3 = u.s3.expect("counted");
        let objects = summary::source_modified(s.summary()).len() as u64;
        // Each object read once; its data files, the manifest, the list and metadata.json written.
        assert!(s3.get >= objects, "{s3:?}");
        assert!(
            s3.put >= count(s, "added-data-files") + 3,
            "{s3:?} for {:?}",
            s.summary()
        );
        // Every object's LastModified, before the commit.
        assert!(objects >= 1);
        for m in summary::source_modified(s.summary()) {
            assert!(m <= s.timestamp_ms(), "{m} > {}", s.timestamp_ms());
        }
    }
    assert_eq!(
        summary::source_modified(snaps[0].summary()).len(),
        3,
        "the batch"
    );
    let compaction = snaps[3];
    assert_eq!(compaction.summary().operation, Operation::Replace);
    let cu = Usage::read(compaction.summary()).expect("compaction usage");
    assert_eq!((cu.function.as_str(), cu.memory_mb), ("maintain", 2048));
    // It read the three files it rewrote and wrote one, plus its manifests and metadata.
    let cs3 = cu.s3.expect("counted");
    assert!(cs3.get >= 3 && cs3.put >= 4, "{cs3:?}");
    assert!(summary::run_id(compaction.summary()).is_some());

    // The baseline of the same history.
    let opts = Options {
        planning_runs: 3,
        ..Default::default()
    };
    let b = baseline::collect(catalog.as_ref(), &env.config, &opts)
        .await
        .expect("baseline");
    let t = b
        .tables
        .iter()
        .find(|t| t.table == "orders")
        .expect("orders");
    assert_eq!(t.snapshots, 4);
    assert_eq!(t.commits.get("ingest"), Some(&3));
    assert_eq!(t.commits.get("maintain"), Some(&1));
    let fresh = t.freshness.object_to_commit.as_ref().expect("freshness");
    assert_eq!(fresh.count, 5, "one sample per object");
    assert!(fresh.p50 >= 0.0 && fresh.p99 >= fresh.p50);
    assert_eq!(
        t.freshness.event_to_commit.as_ref().map(|p| p.count),
        Some(3)
    );
    assert_eq!(t.recovery.items, 5);
    // Throughput: the ingest commits' rows over their span.
    assert_eq!((t.throughput.commits, t.throughput.rows), (3, 180));
    let span = (snaps[2].timestamp_ms() - snaps[0].timestamp_ms()) as f64 / 1000.0;
    assert!(close(t.throughput.span_seconds, span));
    assert!(close(
        t.throughput.rows_per_second.expect("rows/s"),
        180.0 / span
    ));
    // After compaction: one live file; the three it replaced held by snapshots only.
    assert_eq!(t.files.live_files, 1);
    assert!(t.storage.retained_only_bytes > 0 && t.storage.live_bytes > 0);
    assert_eq!(
        t.storage.retained_only_bytes,
        count(compaction, "removed-files-size")
    );
    // Planning through DataFusion over the one live file.
    assert_eq!(t.planning.as_ref().map(|p| p.files_planned), Some(1));
    // GB-seconds = Σ duration × memory, per function, from the summaries.
    let sum = |f: &str| -> (u64, f64) {
        snaps
            .iter()
            .filter_map(|s| Usage::read(s.summary()))
            .filter(|u| u.function == f)
            .fold((0, 0.0), |(ms, gbs), u| {
                (ms + u.compute_ms, gbs + u.gb_seconds())
            })
    };
    let ingest = &t.usage.by_function["ingest"];
    assert_eq!((ingest.compute_ms, ingest.commits), (sum("ingest").0, 3));
    assert!(close(
        ingest.gb_seconds,
        ingest.compute_ms as f64 / 1000.0 * 0.5
    ));
    let maintain = &t.usage.by_function["maintain"];
    assert!(close(maintain.gb_seconds, sum("maintain").1));
    let runs = t.usage.maintenance_runs.as_ref().expect("maintenance runs");
    assert_eq!(runs.runs, 1);
    assert_eq!(runs.s3_per_run["get"], cs3.get as f64);
    // Dollars: the configured prices × that usage.
    let total = t.usage.total();
    let p = &env.config.cost;
    assert!(close(
        t.cost.lambda_compute_usd,
        total.gb_seconds * p.lambda_gb_second
    ));
    assert!(close(
        t.cost.s3_requests_usd,
        (total.s3.put + total.s3.list) as f64 / 1000.0 * p.s3_put_per_1000
            + (total.s3.get + total.s3.head) as f64 / 1000.0 * p.s3_get_per_1000
    ));
    assert!(close(t.cost.lambda_requests_usd, 4.0 * 0.20 / 1e6));

    // Pipelines: three runs each (one per ingest commit), at the process function's memory.
    // Both read the same new data files: the second to run finds them in the function's file
    // cache (no GET), so the reads are counted once, by whichever ran first.
    let pipeline_gets: u64 = b
        .pipelines
        .iter()
        .map(|pb| pb.usage.by_function["process"].s3.get)
        .sum();
    assert!(pipeline_gets > 0, "{:?}", b.pipelines);
    for pb in &b.pipelines {
        assert_eq!(pb.runs, 3, "{pb:?}");
        assert_eq!(pb.rows_in, 180, "{pb:?}");
        assert_eq!(pb.commit_to_output.as_ref().map(|l| l.count), Some(3));
        assert_eq!(pb.object_to_output.as_ref().map(|l| l.count), Some(5));
        assert_eq!(pb.recovery.incidents, 0, "{pb:?}");
        let u = &pb.usage.by_function["process"];
        assert!(close(
            u.gb_seconds,
            u.compute_ms as f64 / 1000.0 * 3008.0 / 1024.0
        ));
        assert!(u.s3.put > 0, "{u:?}");
    }

    // Only the history after `--since`: nothing.
    let later = Options {
        since: Some(chrono::Utc::now() + chrono::Duration::seconds(5)),
        planning_runs: 0,
        ..Default::default()
    };
    let b = baseline::collect(catalog.as_ref(), &env.config, &later)
        .await
        .expect("baseline");
    let t = b
        .tables
        .iter()
        .find(|t| t.table == "orders")
        .expect("orders");
    assert_eq!((t.snapshots, t.throughput.rows), (0, 0));
    assert!(t.usage.by_function.is_empty());
    assert_eq!(t.cost.lambda_compute_usd, 0.0);
}

/// The snapshots of `table`, oldest first.
async fn history_of(env: &TestEnv, table: &str) -> Vec<Snapshot> {
    let catalog = floe::catalog::connect(&env.config).await.expect("catalog");
    let ident = floe::catalog::table_ident(&env.config, table).expect("ident");
    let t = catalog.load_table(&ident).await.expect("load");
    let mut snaps: Vec<Snapshot> = t
        .metadata()
        .snapshots()
        .map(|s| s.as_ref().clone())
        .collect();
    snaps.sort_by_key(|s| s.sequence_number());
    snaps
}

fn requests(s: &Snapshot) -> summary::S3Requests {
    Usage::read(s.summary())
        .and_then(|u| u.s3)
        .unwrap_or_else(|| panic!("no request counts in {:?}", s.summary()))
}

/// What a commit of its own objects writes: their data files (measured in their preparation),
/// the manifest, the manifest list and metadata.json (measured in the commit).
fn assert_only_its_own_writes(s: &Snapshot, what: &str) {
    let put = requests(s).put;
    assert_eq!(
        put,
        count(s, "added-data-files") + 3,
        "{what}: {:?}",
        s.summary()
    );
}

/// 101 objects of one table: a commit of 100 and a lone commit of the remainder. The lone one
/// records its own object's preparation and its own commit: not the other objects'
/// preparations, nor the first chunk's commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_chunk_records_only_its_own_work() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let keys: Vec<String> = (0..101).map(|i| format!("orders/c{i:03}.jsonl")).collect();
    for (i, k) in keys.iter().enumerate() {
        env.put(k, orders(2, 1000 + i as u64)).await;
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let r = ingestor
        .handle_payload(
            &env.sqs_batch(&refs),
            Instant::now() + Duration::from_secs(600),
        )
        .await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let snaps = history_of(&env, "orders").await;
    let sizes: Vec<usize> = snaps
        .iter()
        .map(|s| summary::source_modified(s.summary()).len())
        .collect();
    assert_eq!(sizes, vec![100, 1], "a chunk of 100, then the remainder");
    let lone = &snaps[1];
    assert_only_its_own_writes(lone, "the lone chunk");
    // Its object read only: the first chunk's manifest list (carried into its own) was written
    // by this function and is served from its file cache; the table itself was loaded before,
    // by the first object, and is reused while current.
    assert_eq!(requests(lone).get, 1, "{:?}", lone.summary());
    // And no attempt of it was wasted on a base older than the first chunk's commit.
    assert_eq!(r.reports.last().map(|r| r.attempts), Some(1));
    assert_only_its_own_writes(&snaps[0], "the chunk of 100");
}

/// [B/x, A/1, A/2, A/3]: B alone in its table, A's three in one commit; the two commits run side
/// by side. B's snapshot records exactly what B alone records in a payload of its own (its
/// preparation, its commit), none of A's requests; A's records its three objects and its commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_commit_beside_a_batch_records_none_of_the_batch() {
    let keys = [
        "consumer/x.jsonl",
        "orders/a1.jsonl",
        "orders/a2.jsonl",
        "orders/a3.jsonl",
    ];
    // B alone, in a world of its own: what its snapshot records.
    let alone = TestEnv::new("sqlite").await;
    alone.put(keys[0], orders(20, 7)).await;
    let r = alone
        .ingestor()
        .await
        .handle_payload(&alone.sqs_batch(&keys[..1]), soon())
        .await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let reference = history_of(&alone, "orders_consumer").await;
    assert_eq!(reference.len(), 1);
    assert_only_its_own_writes(&reference[0], "B alone");
    let expected = requests(&reference[0]);

    let env = TestEnv::new("sqlite").await;
    env.put(keys[0], orders(20, 7)).await;
    for (i, k) in keys[1..].iter().enumerate() {
        env.put(k, orders(30, 20 + i as u64)).await;
    }
    let r = env
        .ingestor()
        .await
        .handle_payload(&env.sqs_batch(&keys), soon())
        .await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let b = history_of(&env, "orders_consumer").await;
    assert_eq!(b.len(), 1);
    assert_eq!(summary::source_modified(b[0].summary()).len(), 1);
    assert_eq!(
        requests(&b[0]),
        expected,
        "B's snapshot: {:?}",
        b[0].summary()
    );
    let a = history_of(&env, "orders").await;
    assert_eq!(a.len(), 1);
    assert_eq!(summary::source_modified(a[0].summary()).len(), 3);
    assert_only_its_own_writes(&a[0], "A's batch");
    // A's three objects read, and A's table loaded once (as B's was).
    assert_eq!(
        requests(&a[0]).get,
        3 + (expected.get - 1),
        "{:?}",
        a[0].summary()
    );
}
