//! Incremental planning: only the files added since a consumer's checkpoint.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use floe::commit::{CommitLimits, Plan};
use floe::config::Start;
use floe::process::{self, RowChangePolicy};
use floe::snapshot::Change;
use iceberg::spec::Operation;

use crate::harness::{orders, TestEnv};
use crate::maintain_opts;

fn limits() -> CommitLimits {
    CommitLimits {
        max_attempts: 5,
        deadline: Instant::now() + Duration::from_secs(30),
        skew: Duration::ZERO,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_holds_only_new_appends_and_handles_replace_overwrite_and_expiry() {
    // Merge manifests early, so later snapshots fold earlier files into EXISTING entries.
    let env = TestEnv::with_orders_toml(
        "sqlite",
        r#"properties = { "commit.manifest.min-count-to-merge" = "2" }"#,
    )
    .await;
    let ingestor = env.ingestor().await;
    let mut snaps = Vec::new();
    for (i, n) in [10usize, 20, 30, 40].iter().enumerate() {
        env.put(&format!("orders/p{i}.jsonl"), orders(*n, 1300 + i as u64))
            .await;
        snaps.push(
            env.ingest(&ingestor, &format!("orders/p{i}.jsonl"))
                .await
                .unwrap()
                .snapshot_id
                .unwrap(),
        );
    }
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let all = process::plan(&table, None, RowChangePolicy::Fail, "t")
        .await
        .unwrap();
    assert_eq!((all.files.len(), all.records()), (4, 100));
    let delta = process::plan(&table, Some(snaps[1]), RowChangePolicy::Fail, "t")
        .await
        .unwrap();
    assert_eq!(
        (delta.appends.clone(), delta.records()),
        (vec![snaps[2], snaps[3]], 70)
    );
    assert!(delta
        .files
        .iter()
        .all(|f| f.snapshot_id == snaps[2] || f.snapshot_id == snaps[3]));
    let none = process::plan(&table, Some(snaps[3]), RowChangePolicy::Fail, "t")
        .await
        .unwrap();
    assert!(none.files.is_empty() && none.to == Some(snaps[3]));

    // Starting strategies.
    let md = table.metadata();
    assert_eq!(process::start_after(md, Start::Earliest).unwrap(), None);
    assert_eq!(
        process::start_after(md, Start::Latest).unwrap(),
        Some(snaps[3])
    );
    let ts = md.snapshot_by_id(snaps[1]).unwrap().timestamp_ms();
    assert_eq!(
        process::start_after(md, Start::AfterTimestamp(ts)).unwrap(),
        Some(snaps[1])
    );
    assert!(process::start_after(md, Start::AfterSnapshot(42)).is_err());

    // A compaction (replace) adds no rows to the delta.
    let maintainer = env.maintainer().await;
    let r = maintainer
        .run(
            "orders",
            &floe::maintain::Options {
                min_input_files: 2,
                ..maintain_opts(true, false, false)
            },
        )
        .await
        .unwrap();
    assert_eq!(r.groups_compacted, 1);
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let delta = process::plan(&table, Some(snaps[3]), RowChangePolicy::Fail, "t")
        .await
        .unwrap();
    assert_eq!((delta.files.len(), delta.replaces_skipped), (0, 1));
    let after_compaction = table.metadata().current_snapshot_id().unwrap();

    // An overwrite fails loudly by default, is skipped on request.
    let victim = floe::scan::live_files(&table).await.unwrap()[0]
        .file
        .file_path()
        .to_string();
    let mut change = Change::replace(Vec::new(), vec![victim], HashMap::new());
    change.operation = Operation::Overwrite;
    maintainer
        .committer()
        .commit(&env.ident(), &limits(), move |_t| {
            Ok(Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let e = process::plan(
        &table,
        Some(after_compaction),
        RowChangePolicy::Fail,
        "suspicious-orders",
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("overwrite") && e.to_string().contains("refresh"),
        "{e}"
    );
    let skipped = process::plan(&table, Some(after_compaction), RowChangePolicy::Skip, "t")
        .await
        .unwrap();
    assert_eq!(skipped.row_changes_skipped.len(), 1);

    // An expired checkpoint is an error naming the recovery, never a silent gap.
    let opts = floe::maintain::Options {
        expire_older_than: Some(Duration::ZERO),
        dedup_window: Duration::ZERO,
        retain_last: Some(1),
        ..maintain_opts(false, true, false)
    };
    maintainer.run("orders", &opts).await.unwrap();
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let e = process::plan(&table, Some(snaps[0]), RowChangePolicy::Fail, "revenue")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), floe::ErrorKind::Stale);
    assert!(
        e.to_string()
            .contains("floe process refresh --pipeline revenue"),
        "{e}"
    );

    // A consumer starting from the beginning after expiration reads the table's whole current
    // state, not just what the retained snapshots appended (#15: `earliest` after expiration).
    env.put("orders/p9.jsonl", orders(25, 1309)).await;
    env.ingest(&ingestor, "orders/p9.jsonl").await.unwrap();
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let live: u64 = floe::scan::live_files(&table)
        .await
        .unwrap()
        .iter()
        .map(|f| f.file.record_count())
        .sum();
    assert_eq!(live, 25, "the overwrite removed every earlier row");
    let all = process::plan(&table, None, RowChangePolicy::Fail, "late-starter")
        .await
        .unwrap();
    assert_eq!(all.records(), live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_round_trip_through_the_sink_summary() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    env.put("orders/c.jsonl", orders(5, 1400)).await;
    let snap = env
        .ingest(&ingestor, "orders/c.jsonl")
        .await
        .unwrap()
        .snapshot_id
        .unwrap();
    let source = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let uuid = source.metadata().uuid().to_string();
    let sink = floe::catalog::table_ident(&env.config, "orders_consumer").unwrap();
    let props: HashMap<String, String> =
        floe::summary::checkpoint_properties(&uuid, snap, "sha256:abc")
            .into_iter()
            .collect();
    let change = Change::append(Vec::new(), props);
    let committer = env.maintainer().await.committer().clone();
    committer
        .commit(&sink, &limits(), move |_t| Ok(Plan::Apply(change.clone())))
        .await
        .unwrap();
    let sink_table = ingestor.catalog().load_table(&sink).await.unwrap();
    let cp = floe::summary::read_checkpoint(sink_table.metadata(), &uuid).unwrap();
    assert_eq!(
        (cp.snapshot_id, cp.transform.as_deref()),
        (snap, Some("sha256:abc"))
    );
    assert!(floe::summary::read_checkpoint(sink_table.metadata(), "another-table").is_none());
}
