//! Maintenance beside live writers and consumers, on moto S3 with SQLite and with Glue.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use floe::commit::{CommitLimits, Plan};
use floe::ingest::Status;
use floe::maintain::Options;
use floe::snapshot::Change;
use floe::summary::CHECKPOINT_PREFIX;

use crate::harness::{orders, TestEnv};

pub fn only(compact: bool, expire: bool, orphans: bool) -> Options {
    Options {
        compact,
        expire,
        orphans,
        rewrite_manifests: false,
        target_file_bytes: Some(64 << 20),
        ..Options::default()
    }
}

/// Lands `n` objects of `rows` orders each (`orders/<prefix><i>.jsonl`, seeds from `seed`), one
/// commit each.
async fn ingest_objects(
    env: &TestEnv,
    ingestor: &floe::ingest::Ingestor,
    prefix: &str,
    n: u64,
    rows: usize,
    seed: u64,
) {
    for i in 0..n {
        let key = format!("orders/{prefix}{i}.jsonl");
        env.put(&key, orders(rows, seed + i)).await;
        env.ingest(ingestor, &key).await.unwrap();
    }
}

/// Orphan cleanup alone, as of `days` from now.
fn orphans_in(days: i64) -> Options {
    Options {
        now: chrono::Utc::now() + chrono::Duration::days(days),
        ..only(false, false, true)
    }
}

/// Another engine re-registers `file` as `path` (`size` bytes, the rest of its entry kept): one
/// commit replacing the entry.
async fn reregister(
    env: &TestEnv,
    committer: &floe::commit::Committer,
    file: &floe::scan::LiveFile,
    path: &str,
    size: u64,
) {
    let f = &file.file;
    let entry = iceberg::spec::DataFileBuilder::default()
        .content(f.content_type())
        .file_path(path.to_string())
        .file_format(f.file_format())
        .partition(f.partition().clone())
        .partition_spec_id(file.spec_id)
        .record_count(f.record_count())
        .file_size_in_bytes(size)
        .build()
        .unwrap();
    let change = Change::replace(vec![entry], vec![f.file_path().to_string()], HashMap::new());
    let limits = CommitLimits {
        max_attempts: 5,
        deadline: Instant::now() + Duration::from_secs(60),
        skew: Duration::ZERO,
    };
    committer
        .commit(&env.ident(), &limits, move |_| {
            Ok(Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
}

/// Expiration alone, of every snapshot but the current one (no age, no dedup window).
fn expire_all_but_the_current() -> Options {
    Options {
        expire_older_than: Some(Duration::ZERO),
        dedup_window: Duration::ZERO,
        retain_last: Some(1),
        ..only(false, true, false)
    }
}

/// Compaction alone, of groups of two files or more.
fn compact_groups_of_two() -> Options {
    Options {
        min_input_files: 2,
        ..only(true, false, false)
    }
}

/// A maintainer over `env`'s catalog whose first pointer swap lets `race` run just before it.
async fn racing_maintainer(env: &TestEnv, race: crate::faults::Race) -> floe::maintain::Maintainer {
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
    floe::maintain::Maintainer::with_parts(
        env.config.clone(),
        floe::commit::Committer::new(catalog, crate::faults::race_before_swap(race)(swap)),
    )
}

/// customer_id sum of generated objects: the expected checksum.
fn expected_sum(texts: &[String]) -> i64 {
    texts
        .iter()
        .flat_map(|t| t.lines())
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["customer_id"]
                .as_i64()
                .unwrap()
        })
        .sum()
}

async fn compaction_beside_ingest(kind: &'static str) {
    let env = TestEnv::new(kind).await;
    let ingestor = env.ingestor().await;
    let mut texts = Vec::new();
    for i in 0..14u64 {
        let t = orders(50, 500 + i);
        env.put(&format!("orders/m{i}.jsonl"), t.clone()).await;
        texts.push(t);
    }
    for i in 0..10 {
        assert_eq!(
            env.ingest(&ingestor, &format!("orders/m{i}.jsonl"))
                .await
                .unwrap()
                .status,
            Status::Committed
        );
    }
    let before = env.checksum(ingestor.catalog().as_ref()).await;
    assert_eq!(before.0, 500);

    // Compaction runs while four more objects are ingested.
    let mut tasks = Vec::new();
    for i in 10..14 {
        tasks.push(env.spawn_ingest(&format!("orders/m{i}.jsonl")).await);
    }
    let maintainer = env.maintainer().await;
    let report = maintainer
        .run("orders", &only(true, false, false))
        .await
        .unwrap();
    for t in tasks {
        assert_eq!(
            t.await.unwrap().unwrap().status,
            Status::Committed,
            "an append was lost"
        );
    }
    assert!(report.groups_compacted >= 1, "{report:?}");
    let (rows, sum, distinct) = env.checksum(ingestor.catalog().as_ref()).await;
    assert_eq!((rows, distinct), (700, 700), "{report:?}");
    assert_eq!(sum, expected_sum(&texts));
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let files = floe::scan::live_files(&table).await.unwrap().len();
    assert!(
        files <= 14 - 5 + 1,
        "compaction reduced the file count: {files} files, {report:?}"
    );
    assert!(table
        .metadata()
        .snapshots()
        .any(|s| s.summary().operation == iceberg::spec::Operation::Replace));
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 700, "{py}");
    assert_eq!(py["distinct_order_ids"], 700, "{py}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_beside_concurrent_ingest_sqlite() {
    compaction_beside_ingest("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_beside_concurrent_ingest_glue() {
    compaction_beside_ingest("glue").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiration_keeps_a_lagging_consumers_checkpoint_and_deletes_only_unreachable_files() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let mut snaps = Vec::new();
    for i in 0..6u64 {
        env.put(&format!("orders/e{i}.jsonl"), orders(40, 700 + i))
            .await;
        snaps.push(
            env.ingest(&ingestor, &format!("orders/e{i}.jsonl"))
                .await
                .unwrap()
                .snapshot_id
                .unwrap(),
        );
    }
    let maintainer = env.maintainer().await;
    let committer = maintainer.committer().clone();
    let source = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let consumer = floe::catalog::table_ident(&env.config, "orders_consumer").unwrap();
    let set_checkpoint = |snap: i64| {
        let props = HashMap::from([(
            format!("{CHECKPOINT_PREFIX}{}", source.metadata().uuid()),
            snap.to_string(),
        )]);
        let change = Change::append(Vec::new(), props);
        let committer = committer.clone();
        let consumer = consumer.clone();
        async move {
            let limits = CommitLimits {
                max_attempts: 5,
                deadline: Instant::now() + Duration::from_secs(30),
                skew: Duration::ZERO,
            };
            committer
                .commit(&consumer, &limits, move |_t| {
                    Ok(Plan::Apply(change.clone()))
                })
                .await
                .unwrap();
        }
    };
    // The consumer has processed up to the 2nd snapshot.
    set_checkpoint(snaps[1]).await;
    let expire_all = expire_all_but_the_current();
    let r = maintainer.run("orders", &expire_all).await.unwrap();
    assert_eq!(r.snapshots_expired, 1, "{r:?}");
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let left: Vec<i64> = t.metadata().snapshots().map(|s| s.snapshot_id()).collect();
    assert!(
        left.contains(&snaps[1]) && !left.contains(&snaps[0]),
        "{left:?}"
    );
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 240);

    // Compact, then let the consumer catch up: everything before the current snapshot can go,
    // and the compacted-away data files with it.
    let r = maintainer
        .run("orders", &compact_groups_of_two())
        .await
        .unwrap();
    assert_eq!(r.groups_compacted, 1, "{r:?}");
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    set_checkpoint(t.metadata().current_snapshot_id().unwrap()).await;
    let parquet_before = env
        .keys("warehouse/")
        .await
        .iter()
        .filter(|k| k.ends_with(".parquet"))
        .count();
    let r = maintainer.run("orders", &expire_all).await.unwrap();
    assert!(r.snapshots_expired >= 5, "{r:?}");
    assert!(
        r.expired_files_deleted >= 6 + 5,
        "data files and manifest lists of expired snapshots: {r:?}"
    );
    let parquet_after = env
        .keys("warehouse/")
        .await
        .iter()
        .filter(|k| k.ends_with(".parquet"))
        .count();
    assert_eq!(
        parquet_before - parquet_after,
        6,
        "the six compacted-away files are gone"
    );
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(t.metadata().snapshots().count(), 1);
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 240);
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 240, "{py}");
    assert_eq!(py["snapshots"], 1, "{py}");
}

/// Review helper-32 #2: while expiration plans, another engine rolls main back to a snapshot it
/// is about to expire (whose data files the compacted current snapshot no longer references) and
/// appends on top of it. The expiry commits on that newer version, which references those files
/// again; the files to delete were decided from the planned-on version, so they were deleted and
/// the table lost rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiration_deletes_nothing_the_version_it_landed_on_references() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    ingest_objects(&env, &ingestor, "r", 3, 40, 800).await;
    let r = env
        .maintainer()
        .await
        .run("orders", &compact_groups_of_two())
        .await
        .unwrap();
    assert_eq!(r.groups_compacted, 1, "{r:?}");
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let last_append = t
        .metadata()
        .current_snapshot()
        .unwrap()
        .parent_snapshot_id()
        .unwrap();
    env.put("orders/r3.jsonl", orders(40, 803)).await;
    let rollback = env.pyiceberg_runner(
        "orders",
        &format!("t.manage_snapshots().set_current_snapshot({last_append}).commit()"),
    );
    let (other, obj) = (env.ingestor().await, env.object("orders/r3.jsonl"));
    let race: crate::faults::Race = Box::new(move || {
        Box::pin(async move {
            rollback();
            let r = other
                .ingest(&obj, Instant::now() + Duration::from_secs(60))
                .await
                .unwrap();
            assert_eq!(r.status, Status::Committed);
        })
    });
    let maintainer = racing_maintainer(&env, race).await;
    let r = maintainer
        .run("orders", &expire_all_but_the_current())
        .await
        .unwrap();
    assert_eq!(r.snapshots_expired, 3, "{r:?}");
    let after = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    crate::faults::assert_referenced_files_exist(&after, "after the expiry").await;
    // Main holds the three rolled-back-to objects and the one appended on them.
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 160);
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 160, "{py}");
}

/// Review helper-43 #2: a REST server applies an expiry's removal on whatever version is current
/// while main's snapshot matches, and drops every ref naming a removed snapshot with it. Another
/// engine tagged a snapshot being expired between the expiration's plan and its commit: the tag
/// went with the snapshot, and floe then deleted the tagged snapshot's files. The tag is the
/// server's to lose; the files are now kept (left to orphan cleanup) unless the removal was
/// applied on the version it was planned on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_expiration_deletes_nothing_when_a_commit_came_between_plan_and_removal() {
    let env = TestEnv::new("rest").await;
    let ingestor = env.ingestor().await;
    ingest_objects(&env, &ingestor, "t", 3, 30, 1300).await;
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let first = t
        .metadata()
        .snapshots()
        .min_by_key(|s| s.sequence_number())
        .unwrap()
        .snapshot_id();
    let appended: Vec<String> = floe::scan::live_files(&t)
        .await
        .unwrap()
        .iter()
        .map(|f| f.file.file_path().to_string())
        .collect();
    assert_eq!(appended.len(), 3);
    let r = env
        .maintainer()
        .await
        .run("orders", &compact_groups_of_two())
        .await
        .unwrap();
    assert_eq!(r.groups_compacted, 1, "{r:?}");
    let tag = env.pyiceberg_runner(
        "orders",
        &format!("t.manage_snapshots().create_tag({first}, 'audit').commit()"),
    );
    let race: crate::faults::Race = Box::new(move || {
        Box::pin(async move {
            tag();
        })
    });
    let maintainer = racing_maintainer(&env, race).await;
    let r = maintainer
        .run("orders", &expire_all_but_the_current())
        .await
        .unwrap();
    assert_eq!(r.snapshots_expired, 3, "{r:?}");
    assert_eq!(r.expired_files_deleted, 0, "{r:?}");
    // The server dropped the tag with its snapshot: the report says so.
    assert_eq!(r.refs_dropped, vec!["audit".to_string()], "{r:?}");
    // The appended files are referenced by the expired snapshots only (the compaction replaced
    // them), the tagged one among them: still there.
    for path in &appended {
        let (bucket, key) = path.trim_start_matches("s3://").split_once('/').unwrap();
        let head = crate::harness::s3()
            .await
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await;
        assert!(head.is_ok(), "{path} was deleted");
    }
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 90, "{py}");
}

/// Review helper-52 #4: an expiry that finds its snapshots already gone (another run's, or an
/// earlier attempt of its own whose answer was lost, which on REST may have dropped a ref with
/// them) does not know what went with them: the same run's orphan cleanup is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_cleanup_waits_when_the_expiry_found_its_snapshots_gone() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    ingest_objects(&env, &ingestor, "g", 3, 20, 1600).await;
    let orphan = format!("warehouse/{}/orders/data/orphan-g.parquet", env.namespace);
    env.put(&orphan, b"not referenced".to_vec()).await;
    let other = env.maintainer().await;
    let race: crate::faults::Race = Box::new(move || {
        Box::pin(async move {
            let r = other
                .run("orders", &expire_all_but_the_current())
                .await
                .unwrap();
            assert_eq!(r.snapshots_expired, 2, "{r:?}");
        })
    });
    let maintainer = racing_maintainer(&env, race).await;
    let opts = Options {
        orphans: true,
        ..Options {
            now: chrono::Utc::now() + chrono::Duration::days(30),
            ..expire_all_but_the_current()
        }
    };
    let r = maintainer.run("orders", &opts).await.unwrap();
    assert!(r.orphans_found.is_empty(), "{r:?}");
    assert!(env.get(&orphan).await.is_some(), "deleted in the same run");
    // The next run, with nothing left to expire, cleans up.
    let r = env.maintainer().await.run("orders", &opts).await.unwrap();
    assert_eq!(r.orphans_found.len(), 1, "{r:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 60);
}

/// Review helper-55 #2: a compaction group that fails (here a file another engine registered
/// that is no Parquet) stopped the table's whole maintenance, and the tables after it in the
/// payload: expiration and orphan cleanup never ran again. The failure is now reported (and
/// counted as a metric) and the other operations run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_compaction_leaves_the_other_operations_running() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    // Five files: a group under the configured `min_input_files` too (the payload below).
    ingest_objects(&env, &ingestor, "x", 5, 20, 1700).await;
    let maintainer = env.maintainer().await;
    let committer = maintainer.committer().clone();
    let table = committer.load(&env.ident()).await.unwrap();
    let live = floe::scan::live_files(&table).await.unwrap();
    let key = format!(
        "warehouse/{}/orders/data/from-another-engine.orc",
        env.namespace
    );
    env.put(&key, b"ORC not parquet".to_vec()).await;
    let path = format!("s3://{}/{key}", env.bucket);
    reregister(&env, &committer, &live[0], &path, 15).await;
    let opts = Options {
        compact: true,
        min_input_files: 2,
        ..expire_all_but_the_current()
    };
    let r = maintainer.run("orders", &opts).await.unwrap();
    assert!(r.compaction_failed.is_some(), "{r:?}");
    assert_eq!(r.groups_compacted, 0, "{r:?}");
    assert!(r.snapshots_expired >= 3, "expiration did not run: {r:?}");
    // The function's invocation still fails (its error alarm sees it), after every table ran.
    let e = maintainer
        .handle_payload(
            &serde_json::json!({"tables": ["orders"], "operations": ["compact"]}),
            Instant::now() + Duration::from_secs(60),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("compaction of"), "{e}");
}

/// Review helper-32 #1: another engine commits an equality delete while a compaction runs,
/// after the run checked for them: the next group, loaded after it, was rewritten without
/// applying it, and its new files (numbered after the delete) brought the deleted rows back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_equality_delete_committed_during_compaction_stops_the_groups_after_it() {
    use crate::latest::{commit_row_deletes, RowDeletes};
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    // Two day partitions of three small files each; the older day's group goes first.
    let two_days_ago = chrono::Utc::now() - chrono::Duration::days(2);
    for i in 0..3u64 {
        env.put(
            &format!("orders/old{i}.jsonl"),
            floe::sample::orders_jsonl(20, 900 + i, two_days_ago),
        )
        .await;
        env.ingest(&ingestor, &format!("orders/old{i}.jsonl"))
            .await
            .unwrap();
        env.put(&format!("orders/new{i}.jsonl"), orders(20, 910 + i))
            .await;
        env.ingest(&ingestor, &format!("orders/new{i}.jsonl"))
            .await
            .unwrap();
    }
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let live = floe::scan::live_files(&t).await.unwrap();
    let newest = live
        .iter()
        .max_by_key(|f| format!("{:?}", f.file.partition()))
        .unwrap()
        .clone();
    let before: Vec<String> = live
        .iter()
        .map(|f| f.file.file_path().to_string())
        .collect();
    let racing_env = env.clone();
    let race: crate::faults::Race = Box::new(move || {
        Box::pin(async move {
            let t = racing_env.ingestor().await;
            let t = t.catalog().load_table(&racing_env.ident()).await.unwrap();
            commit_row_deletes(
                &racing_env,
                &t,
                vec![RowDeletes::CustomerEquals(Box::new(newest), 1)],
            )
            .await;
        })
    });
    let maintainer = racing_maintainer(&env, race).await;
    let r = maintainer
        .run("orders", &compact_groups_of_two())
        .await
        .unwrap();
    // The first group met the delete at its swap (stale); the second saw it when loaded, and
    // the run says why it stopped.
    assert_eq!((r.groups_compacted, r.groups_obsolete), (0, 1), "{r:?}");
    assert!(
        r.compaction_skipped
            .as_deref()
            .is_some_and(|why| why.contains("equality delete")),
        "{r:?}"
    );
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let mut after: Vec<String> = floe::scan::live_files(&t)
        .await
        .unwrap()
        .iter()
        .map(|f| f.file.file_path().to_string())
        .collect();
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(
        after, before,
        "no data file rewritten past the equality delete"
    );
}

/// Review helper-32 #3: a partition change lands while a compaction commits (here day → month
/// of the event time). The retry staged the files, written with the day spec, into a manifest of
/// the new month spec: their day numbers were read as month numbers and a reader filtering on
/// the event time pruned them (0 rows). Files keep the spec they were written with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_written_before_a_partition_change_keep_their_spec_when_committed_after_it() {
    use iceberg::spec::{Transform, UnboundPartitionSpec};
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    ingest_objects(&env, &ingestor, "p", 3, 20, 950).await;
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(
        t.metadata().default_partition_spec().fields()[0].transform,
        Transform::Day
    );
    let source_id = t
        .metadata()
        .current_schema()
        .field_by_name("event_time")
        .unwrap()
        .id;
    let racing_env = env.clone();
    let race: crate::faults::Race = Box::new(move || {
        Box::pin(async move {
            let committer = racing_env.maintainer().await.committer().clone();
            let spec = UnboundPartitionSpec::builder()
                .add_partition_field(source_id, "event_time_month", Transform::Month)
                .unwrap()
                .build();
            let limits = CommitLimits {
                max_attempts: 3,
                deadline: Instant::now() + Duration::from_secs(30),
                skew: Duration::ZERO,
            };
            committer
                .commit(&racing_env.ident(), &limits, move |_t| {
                    Ok(Plan::Apply(Change::set_partition_spec(spec.clone())))
                })
                .await
                .unwrap();
        })
    });
    let maintainer = racing_maintainer(&env, race).await;
    let r = maintainer
        .run("orders", &compact_groups_of_two())
        .await
        .unwrap();
    assert_eq!(r.groups_compacted, 1, "{r:?}");
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(
        t.metadata().default_partition_spec().fields()[0].transform,
        Transform::Month
    );
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 60);
    // Another reader, pruning by partition on a filter over the days around now.
    let at = |days: i64| {
        (chrono::Utc::now() + chrono::Duration::days(days)).format("%Y-%m-%dT%H:%M:%S+00:00")
    };
    let (since, until) = (at(-2), at(2));
    env.pyiceberg_run(
        "orders",
        &format!(
            "n = len(t.scan(row_filter=\"event_time >= '{since}' and event_time <= '{until}'\").to_arrow())\n\
             assert n == 60, f'{{n}} rows of 60 through a filter on event_time'"
        ),
    );
}

/// Review helper-34 #2: another engine's statistics (a Puffin file per snapshot, as Spark's or
/// Trino's ANALYZE writes) outlived the snapshot they describe: expiration removed the snapshot
/// and left its statistics entry naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiration_removes_the_statistics_of_the_snapshots_it_removes() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    ingest_objects(&env, &ingestor, "s", 3, 20, 970).await;
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let (first, current) = (
        t.metadata()
            .snapshots()
            .map(|s| s.snapshot_id())
            .min_by_key(|id| t.metadata().snapshot_by_id(*id).unwrap().sequence_number()),
        t.metadata().current_snapshot_id(),
    );
    let (first, current) = (first.unwrap(), current.unwrap());
    let stats = |id: i64| {
        format!(
            "StatisticsFile(snapshot_id={id}, statistics_path='{}/metadata/stats-{id}.puffin', \
             file_size_in_bytes=1, file_footer_size_in_bytes=1, blob_metadata=[])",
            t.metadata().location()
        )
    };
    env.pyiceberg_run(
        "orders",
        &format!(
            "from pyiceberg.table.statistics import StatisticsFile\n\
             with t.update_statistics() as u:\n    u.set_statistics({})\n    u.set_statistics({})",
            stats(first),
            stats(current)
        ),
    );
    let r = env
        .maintainer()
        .await
        .run("orders", &expire_all_but_the_current())
        .await
        .unwrap();
    assert_eq!(r.snapshots_expired, 2, "{r:?}");
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let described: Vec<i64> = t
        .metadata()
        .statistics_iter()
        .map(|s| s.snapshot_id)
        .collect();
    assert_eq!(
        described,
        vec![current],
        "statistics of expired snapshots are gone"
    );
}

/// Review helper-48 #1: iceberg's location generator wrote partition values into paths raw. A
/// value ending in `/` gave `region=eu//f.parquet`, stored by the storage layer as
/// `region=eu/f.parquet`: orphan cleanup compared the listed key with the recorded path, took
/// the live file for an orphan and deleted it; PyIceberg, reading the recorded path, found no
/// such key. Values are now URL-encoded as Iceberg Java writes them, and paths compare with
/// empty segments dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_values_with_slashes_neither_break_readers_nor_become_orphans() {
    let env = TestEnv::with_orders_partition("sqlite", r#"["identity(region)"]"#).await;
    let ingestor = env.ingestor().await;
    let regions = ["eu/", "a//b c", "x=y%z", "plain"];
    let text: Vec<String> = orders(40, 1500)
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["region"] = serde_json::json!(regions[i % regions.len()]);
            v.to_string()
        })
        .collect();
    env.put("orders/slash.jsonl", text.join("\n").into_bytes())
        .await;
    let r = env.ingest(&ingestor, "orders/slash.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed);
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let files = floe::scan::live_files(&t).await.unwrap();
    assert_eq!(files.len(), regions.len());
    for f in &files {
        let path = f.file.file_path();
        assert!(!path.split_once("://").unwrap().1.contains("//"), "{path}");
    }
    let r = env
        .maintainer()
        .await
        .run("orders", &orphans_in(30))
        .await
        .unwrap();
    assert!(
        r.orphans_found.is_empty(),
        "live files taken for orphans: {r:?}"
    );
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 40);
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 40, "{py}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_cleanup_honours_the_window_and_dry_run() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    for i in 0..2u64 {
        env.put(&format!("orders/o{i}.jsonl"), orders(50, 800 + i))
            .await;
        env.ingest(&ingestor, &format!("orders/o{i}.jsonl"))
            .await
            .unwrap();
    }
    let orphan = format!(
        "warehouse/{}/orders/data/orphan-from-a-crash.parquet",
        env.namespace
    );
    env.put(&orphan, b"not referenced".to_vec()).await;
    let maintainer = env.maintainer().await;

    // Today the orphan is younger than the 3-day window: it could be an in-flight write.
    let r = maintainer
        .run("orders", &only(false, false, true))
        .await
        .unwrap();
    assert!(r.orphans_found.is_empty(), "{r:?}");
    // A window under one hour is refused.
    let too_short = Options {
        orphan_older_than: Duration::from_secs(600),
        ..only(false, false, true)
    };
    assert!(maintainer.run("orders", &too_short).await.is_err());

    // Four days later: found. A dry run deletes nothing.
    let dry = Options {
        dry_run: true,
        ..orphans_in(4)
    };
    let r = maintainer.run("orders", &dry).await.unwrap();
    assert_eq!(r.orphans_found.len(), 1, "{r:?}");
    assert!(r.orphans_found[0].ends_with("orphan-from-a-crash.parquet"));
    assert!(env.get(&orphan).await.is_some(), "dry run deleted");
    let r = maintainer.run("orders", &orphans_in(4)).await.unwrap();
    assert_eq!(r.orphans_deleted, 1);
    assert!(env.get(&orphan).await.is_none());
    // Everything the table references is still there.
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 100);
    assert_eq!(env.pyiceberg()["rows"], 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_rewrite_and_old_metadata_cleanup() {
    let props = r#"properties = { "commit.manifest-merge.enabled" = "false", "write.metadata.delete-after-commit.enabled" = "true", "write.metadata.previous-versions-max" = "2" }"#;
    let env = TestEnv::with_orders_toml("sqlite", props).await;
    let ingestor = env.ingestor().await;
    for i in 0..6u64 {
        env.put(&format!("orders/r{i}.jsonl"), orders(30, 900 + i))
            .await;
        env.ingest(&ingestor, &format!("orders/r{i}.jsonl"))
            .await
            .unwrap();
    }
    let metadata_files = env
        .keys("warehouse/")
        .await
        .iter()
        .filter(|k| k.contains("/orders/metadata/") && k.ends_with(".metadata.json"))
        .count();
    assert!(
        metadata_files <= 3,
        "previous-versions-max = 2 keeps current + 2: {metadata_files}"
    );
    let maintainer = env.maintainer().await;
    let opts = Options {
        manifest_threshold: 3,
        rewrite_manifests: true,
        ..only(false, false, false)
    };
    let r = maintainer.run("orders", &opts).await.unwrap();
    assert_eq!((r.manifests_before, r.manifests_after), (6, 1), "{r:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 180);
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 180, "{py}");
    assert_eq!(py["operation"], "replace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_stops_at_the_deadline_and_continues_next_run() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    for i in 0..6u64 {
        env.put(&format!("orders/d{i}.jsonl"), orders(20, 950 + i))
            .await;
        env.ingest(&ingestor, &format!("orders/d{i}.jsonl"))
            .await
            .unwrap();
    }
    let maintainer = env.maintainer().await;
    let out_of_time = Options {
        deadline: Instant::now(),
        ..only(true, false, false)
    };
    let r = maintainer.run("orders", &out_of_time).await.unwrap();
    assert_eq!((r.groups_compacted, r.groups_deferred), (0, 1), "{r:?}");
    assert_eq!(r.files_after, 6);
    let r = maintainer
        .run("orders", &only(true, false, false))
        .await
        .unwrap();
    assert_eq!((r.groups_compacted, r.files_after), (1, 1), "{r:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_follows_the_sort_order_and_the_schedule_payload_drives_it() {
    use arrow::array::{Array, Int64Array};
    let env = TestEnv::with_orders_toml("sqlite", r#"sort = ["customer_id"]"#).await;
    let ingestor = env.ingestor().await;
    for i in 0..5u64 {
        env.put(&format!("orders/s{i}.jsonl"), orders(40, 990 + i))
            .await;
        env.ingest(&ingestor, &format!("orders/s{i}.jsonl"))
            .await
            .unwrap();
    }
    let maintainer = env.maintainer().await;
    // What the EventBridge schedule sends: a dry run changes nothing, a real run compacts.
    let deadline = Instant::now() + Duration::from_secs(120);
    let dry = maintainer
        .handle_payload(
            &serde_json::json!({"tables": ["orders"], "dry_run": true}),
            deadline,
        )
        .await
        .unwrap();
    assert_eq!((dry[0].files_after, dry[0].dry_run), (5, true), "{dry:?}");
    let payload =
        serde_json::json!({"detail-type": "Scheduled Event", "detail": {"tables": ["orders"]}});
    let reports = maintainer.handle_payload(&payload, deadline).await.unwrap();
    assert_eq!(
        (reports[0].groups_compacted, reports[0].files_after),
        (1, 1),
        "{reports:?}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert!(!table.metadata().default_sort_order().is_unsorted());
    let batches = env.scan_all(ingestor.catalog().as_ref()).await;
    let ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let c = b
                .column_by_name("customer_id")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .clone();
            c.iter().flatten().collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(ids.len(), 200);
    assert!(
        ids.windows(2).all(|w| w[0] <= w[1]),
        "compacted file is sorted by customer_id"
    );
    assert!(maintainer
        .handle_payload(&serde_json::json!({"tables": ["nope"]}), deadline)
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_skips_sinks_not_created_yet_and_maintains_the_rest() {
    // Before: the scheduled run stopped at the first pipeline sink that no run had created yet
    // (TableNotFound), so no table was maintained until every pipeline had run once.
    let env = TestEnv::with_pipelines_and_orders_toml("sqlite", "").await;
    let ingestor = env.ingestor().await;
    for i in 0..3u64 {
        env.put(&format!("orders/m{i}.jsonl"), orders(20, 700 + i))
            .await;
        env.ingest(&ingestor, &format!("orders/m{i}.jsonl"))
            .await
            .unwrap();
    }
    let maintainer = env.maintainer().await;
    let all = env.config.all_tables();
    assert!(all.len() > 1, "{all:?}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let reports = maintainer
        .handle_payload(
            &serde_json::json!({"detail-type": "Scheduled Event"}),
            deadline,
        )
        .await
        .unwrap();
    // Every ingest table (created at start-up) is maintained; no sink (no run created one).
    let mut maintained: Vec<String> = reports
        .iter()
        .map(|r| r.table.rsplit('.').next().unwrap_or("").to_string())
        .collect();
    maintained.sort();
    let mut ingest_tables: Vec<String> = env.config.tables.iter().map(|t| t.name.clone()).collect();
    ingest_tables.sort();
    assert!(!env.config.pipelines.is_empty());
    assert_eq!(maintained, ingest_tables, "{reports:?}");
    let orders = reports
        .iter()
        .find(|r| r.table.ends_with(".orders"))
        .unwrap();
    assert_eq!(orders.files_before, 3, "{reports:?}");
}

/// #15 item 10: a sorted compaction holds at most `sort_memory_bytes` of rows; a larger group is
/// written as several sorted runs (every output file sorted, every row kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorted_compaction_memory_is_bounded_by_writing_sorted_runs() {
    use arrow::array::{Array, Int64Array};
    use futures::TryStreamExt;
    let env = TestEnv::with_orders_toml("sqlite", r#"sort = ["customer_id"]"#).await;
    let ingestor = env.ingestor().await;
    for i in 0..5u64 {
        env.put(&format!("orders/r{i}.jsonl"), orders(40, 1990 + i))
            .await;
        env.ingest(&ingestor, &format!("orders/r{i}.jsonl"))
            .await
            .unwrap();
    }
    let opts = floe::maintain::Options {
        min_input_files: 2,
        sort_memory_bytes: 1,
        ..only(true, false, false)
    };
    let r = env.maintainer().await.run("orders", &opts).await.unwrap();
    assert_eq!(r.groups_compacted, 1, "{r:?}");
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let files = floe::scan::live_files(&table).await.unwrap();
    assert!(
        files.len() > 1,
        "one sorted run per budget: {}",
        files.len()
    );
    let mut rows = 0;
    for f in &files {
        let tasks = floe::scan::scan_tasks(&table, std::slice::from_ref(f));
        let batches: Vec<_> = table
            .reader_builder()
            .build()
            .read(Box::pin(futures::stream::iter(tasks.into_iter().map(Ok))))
            .unwrap()
            .stream()
            .try_collect()
            .await
            .unwrap();
        let ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let c = b.column_by_name("customer_id").unwrap();
                let c = c.as_any().downcast_ref::<Int64Array>().unwrap().clone();
                c.iter().flatten().collect::<Vec<_>>()
            })
            .collect();
        assert!(ids.windows(2).all(|w| w[0] <= w[1]), "each file is sorted");
        rows += ids.len();
    }
    assert_eq!(rows, 200);
}

/// #15 item 11: files another engine references as `s3a://` are the same objects the listing
/// names `s3://`; orphan cleanup must not take them for orphans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_cleanup_treats_s3a_and_s3_as_the_same_object() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    env.put("orders/a.jsonl", orders(30, 2100)).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    let maintainer = env.maintainer().await;
    let committer = maintainer.committer().clone();
    let table = committer.load(&env.ident()).await.unwrap();
    let live = floe::scan::live_files(&table).await.unwrap();
    let f = &live[0].file;
    assert!(f.file_path().starts_with("s3://"));
    // Another engine (Hadoop's S3A) re-registers the same file under its own spelling.
    let alias = f.file_path().replacen("s3://", "s3a://", 1);
    reregister(&env, &committer, &live[0], &alias, f.file_size_in_bytes()).await;
    // Expire the snapshot that named it `s3://`, then look for orphans a month later.
    let month = Options {
        now: chrono::Utc::now() + chrono::Duration::days(30),
        expire_older_than: Some(Duration::ZERO),
        dedup_window: Duration::ZERO,
        retain_last: Some(1),
        ..only(false, true, true)
    };
    let r = maintainer.run("orders", &month).await.unwrap();
    assert_eq!(r.snapshots_expired, 1, "{r:?}");
    let key = f
        .file_path()
        .trim_start_matches(&format!("s3://{}/", env.bucket))
        .to_string();
    assert!(
        env.get(&key).await.is_some(),
        "the s3a-referenced file was deleted as an orphan: {:?}",
        r.orphans_found
    );
    assert!(
        !r.orphans_found.iter().any(|o| o.ends_with(&key)),
        "{:?}",
        r.orphans_found
    );
}

/// Review finding: files another engine added without field ids (PyIceberg/Spark `add_files`,
/// a migration) are read through the table's name mapping by compaction, not by position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_reads_files_without_field_ids_through_the_name_mapping() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    for i in 0..2u64 {
        env.put(&format!("orders/n{i}.jsonl"), orders(20, 2200 + i))
            .await;
        env.ingest(&ingestor, &format!("orders/n{i}.jsonl"))
            .await
            .unwrap();
    }
    // A Parquet file with the table's columns in reverse order and no field ids, added by
    // PyIceberg (which also sets `schema.name-mapping.default`).
    env.pyiceberg_run(
        "orders",
        r#"
import datetime as dt
import pyarrow as pa, pyarrow.parquet as pq
from pyiceberg.io.pyarrow import schema_to_pyarrow
s = schema_to_pyarrow(t.schema())
fields = [pa.field(f.name, f.type, f.nullable) for f in reversed(list(s))]
now = dt.datetime.now(dt.timezone.utc)
n = 10
cols = {
    "order_id": [f"nm-{i}" for i in range(n)], "customer_id": [7000 + i for i in range(n)],
    "region": ["eu-west"] * n, "amount": [float(i) for i in range(n)], "currency": ["EUR"] * n,
    "items": [i for i in range(n)], "status": ["paid"] * n, "payment_method": ["card"] * n,
    "event_time": [now] * n, "_ingested_at": [now] * n, "_source": ["s3://elsewhere/nm#1"] * n,
}
table = pa.table({f.name: pa.array(cols[f.name], f.type) for f in fields}, schema=pa.schema(fields))
path = t.location() + "/data/added-by-another-engine.parquet"
with t.io.new_output(path).create() as out:
    pq.write_table(table, out)
t.add_files([path])
"#,
    );
    let catalog = ingestor.catalog();
    let before = env.checksum(catalog.as_ref()).await;
    assert_eq!(before.0, 50);
    let opts = floe::maintain::Options {
        min_input_files: 2,
        ..only(true, false, false)
    };
    let r = env.maintainer().await.run("orders", &opts).await.unwrap();
    assert_eq!(r.groups_compacted, 1, "{r:?}");
    assert_eq!(env.checksum(catalog.as_ref()).await, before);
    let py = env.pyiceberg();
    assert_eq!(
        (py["rows"].clone(), py["distinct_order_ids"].clone()),
        (50.into(), 50.into())
    );
}

// ---------------------------------------------------------------------------------------------
// #14: hot tables keep a short snapshot history, expired on their own schedule

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_history_expires_a_hot_table_yet_keeps_consumers_and_duplicates_right() {
    // `orders` and the append sink keep 16 minutes (the floor); the aggregate sink keeps the
    // default history.
    let env = TestEnv::with_pipelines(
        "sqlite",
        "[maintain]\nhistory_minutes = { orders = 16, suspicious_orders = 16 }\n",
    )
    .await;
    let ingestor = env.ingestor().await;
    let texts: Vec<String> = (0..6).map(|i| orders(40, 700 + i)).collect();
    for (i, t) in texts.iter().enumerate() {
        env.put(&format!("orders/h{i}.jsonl"), t.clone()).await;
    }
    let p = env.processor().await;
    for i in 0..5 {
        let r = env
            .ingest(&ingestor, &format!("orders/h{i}.jsonl"))
            .await
            .unwrap();
        assert_eq!(r.status, Status::Committed, "{r:?}");
        for name in ["suspicious_orders", "revenue_per_region_minute"] {
            p.run(name, Instant::now() + Duration::from_secs(120))
                .await
                .unwrap();
        }
    }
    // A sixth commit the pipelines have not read yet: their checkpoints pin the 5th snapshot
    // and everything after it.
    let r = env.ingest(&ingestor, "orders/h5.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    let before: Vec<i64> = {
        let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
        let mut v = Vec::new();
        let mut cur = t.metadata().current_snapshot().cloned();
        while let Some(s) = cur {
            v.push(s.snapshot_id());
            cur = s
                .parent_snapshot_id()
                .and_then(|p| t.metadata().snapshot_by_id(p).cloned());
        }
        v
    };
    assert_eq!(before.len(), 6);

    // Only the expire operation runs when the payload names it: six small files, no compaction.
    let m = env.maintainer().await;
    let reports = m
        .handle_payload(
            &serde_json::json!({"tables": ["orders"], "operations": ["expire"]}),
            Instant::now() + Duration::from_secs(120),
        )
        .await
        .unwrap();
    assert_eq!(
        (reports[0].groups_compacted, reports[0].snapshots_expired),
        (0, 0),
        "expiration alone, and nothing is 16 minutes old yet: {:?}",
        reports[0]
    );
    let bad = m
        .handle_payload(
            &serde_json::json!({"operations": ["expire", "vacuum"]}),
            Instant::now() + Duration::from_secs(120),
        )
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("operations"), "{bad}");

    // Half an hour later: the 4-day dedup window and 5-day retention would keep everything;
    // the short history expires what no consumer needs.
    let later = Options {
        now: chrono::Utc::now() + chrono::Duration::minutes(30),
        ..Options::from_config(&env.config, Instant::now() + Duration::from_secs(120))
    };
    let later = Options {
        compact: false,
        orphans: false,
        rewrite_manifests: false,
        ..later
    };
    let r = m.run("orders", &later).await.unwrap();
    assert_eq!(
        r.snapshots_expired, 4,
        "all but the pinned 5th and the 6th: {r:?}"
    );
    assert!(r.expired_files_deleted >= 4, "their manifest lists: {r:?}");
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let left: Vec<i64> = t.metadata().snapshots().map(|s| s.snapshot_id()).collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&before[0]) && left.contains(&before[1]));
    // A sink with the default history keeps its five runs' snapshots; the short one keeps
    // only its newest, which holds its position.
    let sink_snapshots = |name: &'static str| {
        let catalog = ingestor.catalog().clone();
        let ident = floe::catalog::table_ident(&env.config, name).unwrap();
        async move {
            let t = catalog.load_table(&ident).await.unwrap();
            t.metadata().snapshots().count()
        }
    };
    assert_eq!(sink_snapshots("revenue_per_region_minute").await, 5);
    let r = m.run("revenue_per_region_minute", &later).await.unwrap();
    assert_eq!(r.snapshots_expired, 0, "{r:?}");
    assert_eq!(sink_snapshots("suspicious_orders").await, 5);
    let r = m.run("suspicious_orders", &later).await.unwrap();
    assert_eq!(r.snapshots_expired, 4, "{r:?}");
    assert_eq!(sink_snapshots("suspicious_orders").await, 1);

    // A redelivery of an object whose commit expired is still a duplicate (from the rows);
    // the pipelines read on from their kept checkpoint: all 240 rows, reconciled.
    let r = env.ingest(&ingestor, "orders/h0.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Duplicate, "{r:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 240);
    for name in ["suspicious_orders", "revenue_per_region_minute"] {
        let run = p
            .run(name, Instant::now() + Duration::from_secs(120))
            .await
            .unwrap();
        assert_eq!(run.source_snapshots, 1, "{name}: the 6th commit");
        let rec = p.reconcile(name).await.unwrap();
        assert!(rec.matches(), "{name}: {rec:?}");
    }
}

/// Review helper-36 #1: every floe commit moved main with a fresh ref, wiping the retention
/// settings a user or another engine had set on it (Java keeps them), so another engine's
/// expiration then removed the snapshots they pinned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_keeps_the_retention_settings_of_main() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    env.put("orders/r0.jsonl", orders(10, 1)).await;
    env.ingest(&ingestor, "orders/r0.jsonl").await.unwrap();
    env.pyiceberg_run(
        "orders",
        "t.manage_snapshots().create_branch(t.current_snapshot().snapshot_id, 'main', \
         max_snapshot_age_ms=3600000, min_snapshots_to_keep=5).commit()",
    );
    env.put("orders/r1.jsonl", orders(10, 2)).await;
    let r = env.ingest(&ingestor, "orders/r1.jsonl").await.unwrap();
    assert_eq!(r.status, floe::ingest::Status::Committed, "{r:?}");
    env.pyiceberg_run(
        "orders",
        "m = t.metadata.refs['main']\n\
         assert m.snapshot_id == t.current_snapshot().snapshot_id, m\n\
         assert len(t.snapshots()) == 2, t.snapshots()\n\
         assert (m.min_snapshots_to_keep, m.max_snapshot_age_ms) == (5, 3600000), m",
    );
}

/// A SQLite table of five appends (10 rows each), then `python` run on it by PyIceberg (`t`).
async fn five_snapshots_then(python: &str) -> (TestEnv, floe::ingest::Ingestor) {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    ingest_objects(&env, &ingestor, "b", 5, 10, 1).await;
    env.pyiceberg_run("orders", python);
    (env, ingestor)
}

/// Review helper-36 #1 (the expiration side): main's own `min-snapshots-to-keep` and
/// `max-snapshot-age-ms`, which Iceberg Java's expiration honours, were ignored: floe kept only
/// what its options and the table properties asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiration_keeps_what_main_s_own_retention_asks() {
    let (env, ingestor) = five_snapshots_then(
        "t.manage_snapshots().create_branch(t.current_snapshot().snapshot_id, 'main', \
         min_snapshots_to_keep=3).commit()",
    )
    .await;
    let maintainer = env.maintainer().await;
    let r = maintainer
        .run("orders", &expire_all_but_the_current())
        .await
        .unwrap();
    assert_eq!(r.snapshots_expired, 2, "{r:?}");
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(t.metadata().snapshots().count(), 3);
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 50);
}

/// Review helper-37 #5: a branch without its own `min-snapshots-to-keep` kept only its head,
/// where Java keeps the table's default number of its latest snapshots for every branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiration_keeps_the_default_number_of_snapshots_of_every_branch() {
    // `audit` at main's 2nd snapshot: its line is the 2nd and the 1st.
    let (env, _ingestor) = five_snapshots_then(
        "ids = [s.snapshot_id for s in sorted(t.snapshots(), key=lambda s: s.sequence_number)]\n\
         t.manage_snapshots().create_branch(ids[1], 'audit').commit()",
    )
    .await;
    let keep_two = Options {
        retain_last: Some(2),
        ..expire_all_but_the_current()
    };
    let r = env
        .maintainer()
        .await
        .run("orders", &keep_two)
        .await
        .unwrap();
    // main keeps its 5th and 4th, audit its 2nd and 1st: only the 3rd goes.
    assert_eq!(r.snapshots_expired, 1, "{r:?}");
    env.pyiceberg_run(
        "orders",
        "seqs = sorted(s.sequence_number for s in t.snapshots())\n\
         assert seqs == [1, 2, 4, 5], seqs",
    );
}
