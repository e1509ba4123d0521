//! The process function: incremental SQL pipelines, exactly once, equal to the batch result.

use std::time::{Duration, Instant};

use floe::process::Processor;
use floe::snapshot::Change;
use floe::ErrorKind;
use iceberg::spec::Operation;
use serde_json::json;

use crate::faults::{faulty, Fault};
use crate::harness::{orders, TestEnv};

const APPEND: &str = "suspicious_orders";
const AGG: &str = "revenue_per_region_minute";
/// A decomposable aggregate beside the sample one: count(col), sum of ints, min, max, a WHERE.
const STATS: &str = "order_stats_minute";
/// A non-decomposable one: it keeps recomputing its windows.
const DISTINCT: &str = "customers_per_region_minute";
const MERGE_TOML: &str = r#"
[[pipelines]]
name = "order_stats_minute"
source = "orders"
sink = "order_stats_minute"
mode = "aggregate"
window = "1m"
keys = ["window_start", "region"]
sql = """
SELECT window_start, region, count(*) AS orders, count(amount) AS priced, sum(amount) AS revenue,
       sum(items) AS items, min(amount) AS low, max(payment_method) AS method
FROM source
WHERE status <> 'test'
GROUP BY window_start, region
"""

[[pipelines]]
name = "customers_per_region_minute"
source = "orders"
sink = "customers_per_region_minute"
mode = "aggregate"
window = "1m"
keys = ["window_start", "region"]
sql = """
SELECT window_start, region, count(DISTINCT customer_id) AS customers, avg(amount) AS mean
FROM source
GROUP BY window_start, region
HAVING count(*) > 0
"""
"#;

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

/// Runs both pipelines and asserts reconcile matches for each; returns the runs.
async fn run_and_reconcile(p: &Processor) -> Vec<floe::process::RunReport> {
    let mut out = Vec::new();
    for name in [APPEND, AGG] {
        out.push(p.run(name, soon()).await.expect("run"));
        assert_reconciled(p, name).await;
    }
    out
}

async fn assert_reconciled(p: &Processor, name: &str) {
    let r = p.reconcile(name).await.expect("reconcile");
    assert!(
        r.matches(),
        "{name}: batch {} rows, sink {} rows, {} differing: {:?}",
        r.batch_rows,
        r.sink_rows,
        r.differing,
        r.differences
    );
    assert!(r.batch_rows > 0, "{name}: the comparison must cover rows");
}

/// PyIceberg (an independent reader) sees each sink as floe does, checkpoint included.
async fn assert_pyiceberg_reads_sinks(env: &TestEnv, p: &Processor) {
    for name in [APPEND, AGG] {
        let r = p.reconcile(name).await.unwrap();
        let py = env.pyiceberg_table(name);
        assert_eq!(py["rows"], r.sink_rows, "{name}: {py}");
        let summary = py["summary"].as_object().unwrap();
        assert!(
            summary.keys().any(|k| k.starts_with("floe.checkpoint.")),
            "{name}: {py}"
        );
    }
    let agg = env.pyiceberg_table(AGG);
    assert_eq!(agg["operation"], "overwrite", "windows are replaced: {agg}");
}

async fn put_orders(env: &TestEnv, key: &str, n: usize, seed: u64) {
    env.put(key, orders(n, seed)).await;
}

#[tokio::test]
async fn pipelines_follow_appends_late_events_and_duplicate_triggers() {
    let env = TestEnv::with_pipelines("sqlite", "").await;
    let ingestor = env.ingestor().await;
    for i in 0..3 {
        put_orders(&env, &format!("orders/a{i}.jsonl"), 400, i).await;
        env.ingest(&ingestor, &format!("orders/a{i}.jsonl"))
            .await
            .unwrap();
    }
    let p = env.processor().await;
    let runs = run_and_reconcile(&p).await;
    assert_eq!(runs[0].source_snapshots, 3, "all three commits in one run");
    assert!(
        runs[0].rows_out > 0 && runs[0].rows_out < 1200,
        "the filter keeps some rows"
    );
    assert!(runs[1].windows >= 1);

    // Duplicate notifications: nothing new, no new sink snapshot.
    for _ in 0..2 {
        let again = p.run(APPEND, soon()).await.unwrap();
        assert_eq!((again.rows_in, again.sink_snapshot), (0, None));
    }

    // Late events: two hours old; the aggregate merges them into those windows (a
    // decomposable SQL: count and sum), reading no source row but the new ones.
    let late = floe::sample::late_orders_jsonl(300, 99, chrono::Utc::now(), 7200);
    env.put("orders/late.jsonl", late).await;
    env.ingest(&ingestor, "orders/late.jsonl").await.unwrap();
    put_orders(&env, "orders/b.jsonl", 200, 42).await;
    env.ingest(&ingestor, "orders/b.jsonl").await.unwrap();
    let runs = run_and_reconcile(&p).await;
    assert_eq!(runs[1].source_snapshots, 2);
    assert_pyiceberg_reads_sinks(&env, &p).await;
    assert!(
        runs[1].windows >= 2,
        "late and current windows: {}",
        runs[1].windows
    );
    assert!(
        runs[1].merged && runs[1].rows_recomputed == 0 && runs[1].recompute_files_read == 0,
        "{:?}",
        runs[1]
    );

    // A trigger for another table wakes nothing; the schedule wakes all.
    assert!(p
        .pipelines_for(&json!({"detail-type": "floe.commit", "detail": {"table": "other"}}))
        .is_empty());
    assert_eq!(
        p.pipelines_for(&json!({"detail-type": "Scheduled Event"}))
            .len(),
        2
    );
    let glue = json!({"detail-type": "Glue Data Catalog Table State Change", "source": "aws.glue",
        "detail": {"databaseName": env.namespace, "tableName": "orders", "typeOfChange": "UpdateTable"}});
    assert_eq!(p.pipelines_for(&glue).len(), 2);
    let other_db = json!({"detail-type": "Glue Data Catalog Table State Change",
        "detail": {"databaseName": "elsewhere", "tableName": "orders"}});
    assert!(p.pipelines_for(&other_db).is_empty());
    let s3 = json!({"Records": [{"eventSource": "aws:s3", "s3": {"object": {"key": format!("warehouse/{}/orders/metadata/00009-x.metadata.json", env.namespace)}}}]});
    assert_eq!(p.pipelines_for(&s3).len(), 2);
    // Commit events through a queue: a batch of them wakes each pipeline once.
    let commit =
        json!({"detail-type": "floe.commit", "source": "floe", "detail": {"table": "orders"}});
    let other =
        json!({"detail-type": "floe.commit", "source": "floe", "detail": {"table": "other"}});
    let records: Vec<serde_json::Value> = [&commit, &commit, &other]
        .iter()
        .map(|e| json!({"eventSource": "aws:sqs", "messageId": "m", "body": e.to_string()}))
        .collect();
    let batch = json!({ "Records": records });
    assert_eq!(p.pipelines_for(&batch).len(), 2);
    let strays = json!({"Records": [{"eventSource": "aws:sqs", "messageId": "m", "body": other.to_string()}]});
    assert!(p.pipelines_for(&strays).is_empty());

    // Reconcile does catch a difference: drop one sink file behind the pipeline's back.
    let sink = floe::catalog::table_ident(&env.config, APPEND).unwrap();
    let committer = p.committer().clone();
    let t = committer.load(&sink).await.unwrap();
    let victim = floe::scan::live_files(&t).await.unwrap()[0]
        .file
        .file_path()
        .to_string();
    let mut change = Change::append(Vec::new(), Default::default());
    change.operation = Operation::Delete;
    change.removed = vec![victim];
    committer
        .commit(&sink, &limits(), move |_| {
            Ok(floe::commit::Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
    let r = p.reconcile(APPEND).await.unwrap();
    assert!(
        !r.matches() && r.sink_rows < r.batch_rows && r.differing > 0,
        "{r:?}"
    );
    p.refresh(APPEND, soon()).await.unwrap();
    assert_reconciled(&p, APPEND).await;
    let (reports, errors) = p
        .handle_payload(
            &json!({"detail-type": "floe.commit", "source": "floe", "detail": {"table": "orders"}}),
            soon(),
        )
        .await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(reports.len(), 2);
    assert!(
        reports.iter().all(|r| r.sink_snapshot.is_none()),
        "nothing new"
    );
}

#[tokio::test]
async fn concurrent_runs_and_a_crash_before_commit_neither_duplicate_nor_lose() {
    let env = TestEnv::with_pipelines("sqlite", "").await;
    let ingestor = env.ingestor().await;
    for i in 0..4 {
        put_orders(&env, &format!("orders/c{i}.jsonl"), 500, 10 + i).await;
        env.ingest(&ingestor, &format!("orders/c{i}.jsonl"))
            .await
            .unwrap();
    }
    // A run that dies after writing its output files, before its commit lands.
    let crashing = env.processor_with(faulty(Fault::AfterMetadata)).await;
    for name in [APPEND, AGG] {
        let e = crashing.run(name, soon()).await.unwrap_err();
        assert!(e.to_string().contains("injected crash"), "{e}");
    }
    // Four processes race on the same delta.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let config = env.config.clone();
        tasks.push(tokio::spawn(async move {
            let p = Processor::new(config).await.unwrap();
            let a = p.run(APPEND, soon()).await?;
            let b = p.run(AGG, soon()).await?;
            Ok::<_, floe::Error>((a, b))
        }));
    }
    let mut committed = 0;
    for t in tasks {
        let (a, b) = t.await.unwrap().expect("run");
        committed += a.sink_snapshot.is_some() as u32 + b.sink_snapshot.is_some() as u32;
    }
    assert!(committed >= 2, "each pipeline committed its delta once");
    let p = env.processor().await;
    for name in [APPEND, AGG] {
        assert_reconciled(&p, name).await;
    }
    // The checkpoint is at the source's head: one more run has nothing to do.
    let again = p.run(APPEND, soon()).await.unwrap();
    assert_eq!(again.source_snapshots, 0);
}

/// Wraps the sink swaps of one processor. Covering: before each, the source gets a commit,
/// another processor runs the pipeline (its checkpoint then covers everything so far), and the
/// source gets one more commit — two invocations side by side on a source committing all the
/// time. Behind (the first swap only): another writer moves the sink's checkpoint to the
/// parent of the source's current snapshot, short of what this run planned.
struct Overtaken {
    inner: std::sync::Arc<dyn floe::catalog::PointerSwap>,
    sink: String,
    env: std::sync::Arc<TestEnv>,
    round: std::sync::atomic::AtomicU32,
    behind: bool,
}

impl Overtaken {
    /// A processor of `env` whose sink swaps are overtaken (covering, or `behind`).
    async fn processor(env: &std::sync::Arc<TestEnv>, behind: bool) -> Processor {
        let sink = floe::catalog::table_ident(&env.config, APPEND)
            .unwrap()
            .name()
            .to_string();
        let env2 = env.clone();
        env.processor_with(move |inner| {
            std::sync::Arc::new(Overtaken {
                inner,
                sink,
                env: env2,
                round: Default::default(),
                behind,
            })
        })
        .await
    }

    /// Commits a sink snapshot whose checkpoint is the parent of the source's current snapshot.
    async fn checkpoint_behind(&self, sink: &iceberg::TableIdent) -> floe::Result<()> {
        let committer = self.env.maintainer().await.committer().clone();
        let source = committer.load(&self.env.ident()).await?;
        let uuid = source.metadata().uuid().to_string();
        let parent = source
            .metadata()
            .current_snapshot()
            .and_then(|s| s.parent_snapshot_id())
            .expect("the source has two snapshots");
        let sink_table = committer.load(sink).await?;
        let transform = floe::summary::read_checkpoint(sink_table.metadata(), &uuid)
            .and_then(|c| c.transform)
            .expect("the sink has a checkpoint");
        let props = floe::summary::checkpoint_properties(&uuid, parent, &transform)
            .into_iter()
            .collect();
        let change = Change::append(Vec::new(), props);
        let limits = floe::commit::CommitLimits {
            max_attempts: 5,
            deadline: soon(),
            skew: Duration::ZERO,
        };
        committer
            .commit(sink, &limits, move |_t| {
                Ok(floe::commit::Plan::Apply(change.clone()))
            })
            .await?;
        Ok(())
    }
}

impl std::fmt::Debug for Overtaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overtaken")
            .field("sink", &self.sink)
            .finish()
    }
}

#[async_trait::async_trait]
impl floe::catalog::PointerSwap for Overtaken {
    async fn current(&self, ident: &iceberg::TableIdent) -> floe::Result<Option<String>> {
        self.inner.current(ident).await
    }

    fn writes_metadata(&self) -> bool {
        self.inner.writes_metadata()
    }

    async fn swap(
        &self,
        ident: &iceberg::TableIdent,
        staged: &floe::snapshot::Staged,
    ) -> floe::Result<floe::catalog::Swapped> {
        let n = self.round.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if ident.name() == self.sink && self.behind {
            if n == 0 {
                self.checkpoint_behind(ident).await?;
            }
        } else if ident.name() == self.sink {
            let ingestor = self.env.ingestor().await;
            for side in ["a", "b"] {
                let key = format!("orders/overtaken-{n}{side}.jsonl");
                put_orders(&self.env, &key, 20, 500 + u64::from(n)).await;
                self.env.ingest(&ingestor, &key).await?;
                if side == "a" {
                    let other = self.env.processor().await;
                    other.run(APPEND, soon()).await?;
                }
            }
        }
        self.inner.swap(ident, staged).await
    }
}

/// Two runs of one pipeline side by side while the source keeps committing (what two process
/// invocations on one queue meet at 10 commits/s): the run that loses to the other's commit is
/// done once that commit covers what it had planned, instead of re-planning onto each newer
/// delta and losing again until it gave up (`DeadlineExceeded`, its messages redelivered).
#[tokio::test]
async fn a_run_overtaken_by_another_that_covers_its_plan_is_done() {
    let env = std::sync::Arc::new(TestEnv::with_pipelines("sqlite", "").await);
    let ingestor = env.ingestor().await;
    put_orders(&env, "orders/first.jsonl", 50, 7).await;
    env.ingest(&ingestor, "orders/first.jsonl").await.unwrap();
    let overtaken = Overtaken::processor(&env, false).await;
    let r = overtaken
        .run(APPEND, soon())
        .await
        .expect("the overtaken run ends well");
    assert!(r.covered, "{r:?}");
    assert_eq!((r.sink_snapshot, r.replans), (None, 0), "{r:?}");
    // The source committed once more after the other run: the next run takes it.
    let p = env.processor().await;
    let next = p.run(APPEND, soon()).await.unwrap();
    assert_eq!(next.source_snapshots, 1, "{next:?}");
    assert_reconciled(&p, APPEND).await;
}

/// The other way round: another commit moves the sink's checkpoint, but short of what the run
/// planned (the parent of its target): the run is not covered, it re-plans the rest and commits.
#[tokio::test]
async fn a_run_overtaken_by_a_checkpoint_short_of_its_plan_replans() {
    let env = std::sync::Arc::new(TestEnv::with_pipelines("sqlite", "").await);
    let ingestor = env.ingestor().await;
    put_orders(&env, "orders/first.jsonl", 50, 8).await;
    env.ingest(&ingestor, "orders/first.jsonl").await.unwrap();
    env.processor().await.run(APPEND, soon()).await.unwrap();
    for i in 0..2 {
        let key = format!("orders/later{i}.jsonl");
        put_orders(&env, &key, 20, 80 + i).await;
        env.ingest(&ingestor, &key).await.unwrap();
    }
    let overtaken = Overtaken::processor(&env, true).await;
    let r = overtaken.run(APPEND, soon()).await.unwrap();
    assert!(!r.covered, "{r:?}");
    assert!(r.sink_snapshot.is_some(), "{r:?}");
    assert_eq!((r.replans, r.source_snapshots), (1, 1), "{r:?}");
}

#[tokio::test]
async fn replace_overwrite_expired_checkpoint_and_changed_transform() {
    let env = TestEnv::with_pipelines("sqlite", "").await;
    let ingestor = env.ingestor().await;
    for i in 0..3 {
        put_orders(&env, &format!("orders/r{i}.jsonl"), 100, 20 + i).await;
        env.ingest(&ingestor, &format!("orders/r{i}.jsonl"))
            .await
            .unwrap();
    }
    let p = env.processor().await;
    run_and_reconcile(&p).await;

    // Compaction (a replace snapshot) changes no data: skipped, nothing re-emitted.
    let m = env.maintainer().await;
    m.run("orders", &crate::maintain_opts(true, false, false))
        .await
        .unwrap();
    let r = p.run(APPEND, soon()).await.unwrap();
    assert_eq!((r.source_snapshots, r.rows_in), (0, 0));
    assert_reconciled(&p, APPEND).await;

    // An overwrite on the source fails loudly, naming the snapshot and the recovery.
    let committer = m.committer();
    let table = committer.load(&env.ident()).await.unwrap();
    let victim = floe::scan::live_files(&table).await.unwrap()[0]
        .file
        .file_path()
        .to_string();
    let mut change = Change::append(Vec::new(), Default::default());
    change.operation = Operation::Overwrite;
    change.removed = vec![victim];
    committer
        .commit(&env.ident(), &limits(), move |_| {
            Ok(floe::commit::Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
    let e = p.run(APPEND, soon()).await.unwrap_err();
    assert!(
        e.to_string().contains("overwrite") && e.to_string().contains("floe process refresh"),
        "{e}"
    );
    // Refresh recovers: the sink equals the batch result over the table as it now is.
    let r = p.refresh(APPEND, soon()).await.unwrap();
    assert!(r.refresh && r.sink_snapshot.is_some());
    assert_reconciled(&p, APPEND).await;

    // An expired checkpoint: the error names the recovery, nothing is processed silently.
    put_orders(&env, "orders/r9.jsonl", 100, 29).await;
    env.ingest(&ingestor, "orders/r9.jsonl").await.unwrap();
    let table = committer.load(&env.ident()).await.unwrap();
    let md = table.metadata();
    let current = md.current_snapshot_id().unwrap();
    let old: Vec<i64> = md
        .snapshots()
        .map(|s| s.snapshot_id())
        .filter(|id| *id != current)
        .collect();
    committer
        .commit(&env.ident(), &limits(), move |_| {
            Ok(floe::commit::Plan::Apply(Change::expire(old.clone())))
        })
        .await
        .unwrap();
    let e = p.run(AGG, soon()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Stale);
    assert!(
        e.to_string()
            .contains("floe process refresh --pipeline revenue_per_region_minute"),
        "{e}"
    );
    p.refresh(AGG, soon()).await.unwrap();
    assert_reconciled(&p, AGG).await;

    // A changed transform is never mixed with old output: the run stops until a refresh.
    let mut config = env.config.clone();
    config.pipelines[0].sql = config.pipelines[0].sql.replace(">= 4900", ">= 4800");
    let changed = Processor::new(config).await.unwrap();
    let e = changed.run(APPEND, soon()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transform);
    assert!(
        e.to_string().contains("transform changed") && e.to_string().contains("refresh"),
        "{e}"
    );
    changed.refresh(APPEND, soon()).await.unwrap();
    assert_reconciled(&changed, APPEND).await;
    changed.run(APPEND, soon()).await.unwrap();
}

fn limits() -> floe::commit::CommitLimits {
    floe::commit::CommitLimits {
        max_attempts: 10,
        deadline: soon(),
        skew: Duration::from_secs(900),
    }
}

#[tokio::test]
async fn schema_changes_additive_keeps_running_breaking_names_the_field() {
    let tail = r#"
[[pipelines]]
name = "coupons"
source = "orders"
sink = "coupon_orders"
mode = "append"
sql = "SELECT order_id, amount, discount_code FROM source WHERE amount > 100"

[[pipelines]]
name = "items"
source = "orders"
sink = "order_items"
mode = "append"
keys = ["order_id"]
sql = "SELECT order_id, items, coupon FROM source"

[[pipelines]]
name = "everything"
source = "orders"
sink = "all_orders"
mode = "append"
sql = "SELECT * FROM source"
"#;
    let env = TestEnv::with_pipelines("sqlite", tail).await;
    let ingestor = env.ingestor().await;
    put_orders(&env, "orders/s0.jsonl", 300, 30).await;
    env.ingest(&ingestor, "orders/s0.jsonl").await.unwrap();
    let p = env.processor().await;
    run_and_reconcile(&p).await;
    // An additive change: a new field arrives; old files read with it as null.
    let with_coupon: String = orders(200, 31)
        .lines()
        .map(|l| l.replacen('{', "{\"coupon\":\"SPRING\",", 1) + "\n")
        .collect();
    env.put("orders/s1.jsonl", with_coupon).await;
    let r = env.ingest(&ingestor, "orders/s1.jsonl").await.unwrap();
    assert!(
        r.schema_change.as_deref().unwrap_or("").contains("coupon"),
        "{r:?}"
    );
    run_and_reconcile(&p).await;
    let first = p.run("items", soon()).await.unwrap();
    assert_eq!(
        first.rows_out, 500,
        "old files read with the new column as null"
    );
    // A compatible change: `items` widens int → long at the source; the sink column follows.
    let big: String = orders(20, 33)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            l.replace(&format!("\"items\":{}", v["items"]), "\"items\":5000000000") + "\n"
        })
        .collect();
    env.put("orders/s2.jsonl", big).await;
    let r = env.ingest(&ingestor, "orders/s2.jsonl").await.unwrap();
    assert!(
        r.schema_change
            .as_deref()
            .unwrap_or("")
            .contains("widened items"),
        "{r:?}"
    );
    run_and_reconcile(&p).await;
    let items = p.run("items", soon()).await.unwrap();
    assert_eq!(items.rows_in, 20);
    assert_reconciled(&p, "items").await;
    p.run("everything", soon()).await.unwrap();
    assert_reconciled(&p, "everything").await;
    let sink = floe::catalog::table_ident(&env.config, "order_items").unwrap();
    let t = p.committer().load(&sink).await.unwrap();
    let ty = t
        .metadata()
        .current_schema()
        .field_by_name("items")
        .unwrap()
        .field_type
        .to_string();
    assert_eq!(ty, "long");
    // A SQL reading a field the source does not have stops with the field's name.
    let e = p.run("coupons", soon()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transform);
    assert!(e.to_string().contains("`discount_code`"), "{e}");

    // Another writer renames `region` (a breaking change for SQL that reads it): both pipelines
    // stop with a message naming the field instead of producing wrong output.
    let committer = env.maintainer().await.committer().clone();
    let table = committer.load(&env.ident()).await.unwrap();
    let md = table.metadata();
    let fields: Vec<_> = md
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| {
            let mut f = f.as_ref().clone();
            if f.name == "region" {
                f.name = "area".into();
            }
            std::sync::Arc::new(f)
        })
        .collect();
    let renamed = iceberg::spec::Schema::builder()
        .with_schema_id(md.current_schema_id() + 1)
        .with_fields(fields)
        .build()
        .unwrap();
    let builder = iceberg::spec::TableMetadataBuilder::new_from_metadata(
        md.clone(),
        table.metadata_location().map(str::to_string),
    )
    .add_current_schema(renamed)
    .unwrap();
    let staged = floe::snapshot::write_metadata(&table, builder, true)
        .await
        .unwrap();
    floe::catalog::pointer_swap(&env.config)
        .await
        .unwrap()
        .swap(&env.ident(), &staged)
        .await
        .unwrap();
    for name in [APPEND, AGG] {
        let e = p.run(name, soon()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transform, "{e}");
        assert!(e.to_string().contains("`region`"), "{name}: {e}");
    }
    // Review helper-51 #2: under `SELECT *` the SQL plans after the rename, and `area` was added
    // to the sink as another column beside `region` (null from then on): one column split in
    // two. Refused, naming both.
    let text = orders(10, 33).replace("\"region\":", "\"area\":");
    env.put("orders/s3.jsonl", text).await;
    let r = env.ingest(&ingestor, "orders/s3.jsonl").await.unwrap();
    assert_eq!(r.schema_change, None, "{r:?}");
    let e = p.run("everything", soon()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transform, "{e}");
    assert!(
        e.to_string().contains("`region`") && e.to_string().contains("`area`"),
        "{e}"
    );
}

/// An EventBridge bus whose rule sends `detail_type` events from floe to a new queue: (bus, queue url).
pub(crate) async fn bus_to_queue(
    sdk: &aws_config::SdkConfig,
    detail_type: &str,
) -> (String, String) {
    let (events, sqs) = (
        aws_sdk_eventbridge::Client::new(sdk),
        aws_sdk_sqs::Client::new(sdk),
    );
    let bus = crate::harness::unique("bus");
    let queue = crate::harness::unique("q");
    let url = sqs
        .create_queue()
        .queue_name(&queue)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    events.create_event_bus().name(&bus).send().await.unwrap();
    let pattern = serde_json::json!({"source": ["floe"], "detail-type": [detail_type]});
    events
        .put_rule()
        .name("to-queue")
        .event_bus_name(&bus)
        .event_pattern(pattern.to_string())
        .send()
        .await
        .unwrap();
    let target = aws_sdk_eventbridge::types::Target::builder()
        .id("q")
        .arn(format!("arn:aws:sqs:us-east-1:123456789012:{queue}"))
        .build()
        .unwrap();
    events
        .put_targets()
        .rule("to-queue")
        .event_bus_name(&bus)
        .targets(target)
        .send()
        .await
        .unwrap();
    (bus, url)
}

/// Receives and deletes every message of `url`; returns the bodies.
pub(crate) async fn drain(sqs: &aws_sdk_sqs::Client, url: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for _ in 0..30 {
        let got = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        let msgs = got.messages.unwrap_or_default();
        if msgs.is_empty() && !out.is_empty() {
            break;
        }
        for m in msgs {
            out.push(serde_json::from_str(m.body().unwrap()).unwrap());
            sqs.delete_message()
                .queue_url(url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
    out
}

#[tokio::test]
async fn alerts_reach_sqs_and_eventbridge_once_per_row_with_stable_ids() {
    let sdk =
        floe::store::sdk_config(&crate::harness::storage(), Some(crate::harness::moto())).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let direct = crate::harness::unique("alerts");
    let url = sqs
        .create_queue()
        .queue_name(&direct)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    // EventBridge alerts: bus → rule (detail-type floe.alert) → a queue the test reads.
    let (bus, bus_url) = bus_to_queue(&sdk, "floe.alert").await;
    let moto = crate::harness::moto();
    let tail = format!(
        r#"
[[pipelines]]
name = "big_orders"
source = "orders"
sink = "big_orders"
mode = "append"
sql = "SELECT order_id, region, amount FROM source WHERE amount >= 4000"
[pipelines.alert]
sqs_queue_url = "{url}"
endpoint = "{moto}"

[[pipelines]]
name = "big_orders_eb"
source = "orders"
sink = "big_orders_eb"
mode = "append"
sql = "SELECT order_id, region, amount FROM source WHERE amount >= 4000"
[pipelines.alert]
eventbridge_bus = "{bus}"
endpoint = "{moto}"
"#
    );
    let env = TestEnv::with_pipelines("sqlite", &tail).await;
    let ingestor = env.ingestor().await;
    put_orders(&env, "orders/x.jsonl", 500, 50).await;
    env.ingest(&ingestor, "orders/x.jsonl").await.unwrap();
    let p = env.processor().await;
    let r = p.run("big_orders", soon()).await.unwrap();
    assert!(r.rows_out > 0);
    assert_eq!(r.alerts as u64, r.rows_out);
    let got = drain(&sqs, &url).await;
    let ids: std::collections::HashSet<String> = got
        .iter()
        .map(|v| {
            assert!(v["row"]["amount"].as_f64().unwrap() >= 4000.0);
            v["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        ids.len() as u64,
        r.rows_out,
        "one alert per output row, distinct ids"
    );

    let r2 = p.run("big_orders_eb", soon()).await.unwrap();
    assert_eq!(r2.alerts as u64, r2.rows_out);
    let via: std::collections::HashSet<String> = drain(&sqs, &bus_url)
        .await
        .iter()
        .map(|e| {
            assert_eq!(e["detail-type"], "floe.alert");
            assert_eq!(e["detail"]["pipeline"], "big_orders_eb");
            e["detail"]["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(via.len() as u64, r2.rows_out);
}

#[tokio::test]
async fn pipelines_on_glue() {
    let env = TestEnv::with_pipelines("glue", "").await;
    let ingestor = env.ingestor().await;
    for i in 0..2 {
        put_orders(&env, &format!("orders/g{i}.jsonl"), 300, 60 + i).await;
        env.ingest(&ingestor, &format!("orders/g{i}.jsonl"))
            .await
            .unwrap();
    }
    let p = env.processor().await;
    run_and_reconcile(&p).await;
    put_orders(&env, "orders/g9.jsonl", 300, 69).await;
    env.ingest(&ingestor, "orders/g9.jsonl").await.unwrap();
    let runs = run_and_reconcile(&p).await;
    assert_eq!(runs[1].source_snapshots, 1);
    assert_pyiceberg_reads_sinks(&env, &p).await;
}

#[tokio::test]
async fn commit_events_reach_the_process_function_through_eventbridge() {
    let sdk =
        floe::store::sdk_config(&crate::harness::storage(), Some(crate::harness::moto())).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let (bus, url) = bus_to_queue(&sdk, "floe.commit").await;
    let mut env = TestEnv::with_pipelines("sqlite", "").await;
    env.config.events.bus = Some(bus);
    env.config.events.endpoint = Some(crate::harness::moto().to_string());
    let ingestor = env.ingestor().await;
    put_orders(&env, "orders/e.jsonl", 200, 70).await;
    let payload = json!({"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": env.bucket}, "object": {"key": "orders/e.jsonl"}}}]});
    let result = ingestor.handle_payload(&payload, soon()).await;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    let snapshot = result.reports[0].snapshot_id.unwrap();
    let got = sqs
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(5)
        .send()
        .await
        .unwrap();
    let msgs = got.messages.unwrap_or_default();
    assert_eq!(msgs.len(), 1, "one commit, one event");
    let event: serde_json::Value = serde_json::from_str(msgs[0].body().unwrap()).unwrap();
    assert_eq!(event["detail-type"], "floe.commit");
    assert_eq!(event["detail"]["table"], "orders");
    assert_eq!(event["detail"]["snapshot_id"], snapshot);
    assert_eq!(event["detail"]["records_committed"], 200);
    // The event wakes both pipelines of `orders`; they process the commit it announces.
    let p = env.processor().await;
    let (runs, errors) = p.handle_payload(&event, soon()).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(runs.len(), 2);
    assert!(runs
        .iter()
        .all(|r| r.to_snapshot == Some(snapshot) && r.sink_snapshot.is_some()));
}

#[tokio::test]
async fn maintaining_a_sink_keeps_its_checkpoint() {
    let env = TestEnv::with_pipelines("sqlite", "").await;
    let ingestor = env.ingestor().await;
    let p = env.processor().await;
    for i in 0..4 {
        put_orders(&env, &format!("orders/m{i}.jsonl"), 300, 80 + i).await;
        env.ingest(&ingestor, &format!("orders/m{i}.jsonl"))
            .await
            .unwrap();
        p.run(APPEND, soon()).await.unwrap();
    }
    // Compact the sink's small files (a replace without a checkpoint of its own), then expire
    // every older sink snapshot: the checkpoint must survive on the newest one.
    let m = env.maintainer().await;
    let opts = floe::maintain::Options {
        min_input_files: 2,
        expire_older_than: Some(Duration::ZERO),
        retain_last: Some(1),
        dedup_window: Duration::ZERO,
        now: chrono::Utc::now() + chrono::Duration::hours(1),
        ..crate::maintain_opts(true, true, false)
    };
    let report = m.run(APPEND, &opts).await.unwrap();
    assert!(
        report.groups_compacted >= 1 && report.snapshots_expired >= 3,
        "{report:?}"
    );
    let sink = floe::catalog::table_ident(&env.config, APPEND).unwrap();
    let t = p.committer().load(&sink).await.unwrap();
    assert_eq!(t.metadata().snapshots().count(), 1);
    let source = p.committer().load(&env.ident()).await.unwrap();
    let cp = floe::summary::read_checkpoint(t.metadata(), &source.metadata().uuid().to_string())
        .expect("checkpoint on the compacted sink");
    assert_eq!(
        Some(cp.snapshot_id),
        source.metadata().current_snapshot_id()
    );
    let again = p.run(APPEND, soon()).await.unwrap();
    assert_eq!(
        (again.source_snapshots, again.rows_out),
        (0, 0),
        "no re-processing from the start"
    );
    assert_reconciled(&p, APPEND).await;
}

/// Review finding: `start = "latest"` must commit its starting position on the first run, or
/// every later run starts over at the then-current snapshot and nothing is ever processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_starting_at_latest_processes_what_comes_next() {
    let tail = r#"
[[pipelines]]
name = "from_now_on"
source = "orders"
sink = "from_now_on"
mode = "append"
start = "latest"
keys = ["order_id"]
sql = "SELECT order_id, amount FROM source"
"#;
    let env = TestEnv::with_pipelines("sqlite", tail).await;
    let ingestor = env.ingestor().await;
    put_orders(&env, "orders/old.jsonl", 40, 3100).await;
    env.ingest(&ingestor, "orders/old.jsonl").await.unwrap();
    let p = env.processor().await;
    let first = p.run("from_now_on", soon()).await.unwrap();
    assert_eq!(first.rows_out, 0, "history before the start is not read");
    for i in 0..2 {
        put_orders(&env, &format!("orders/new{i}.jsonl"), 25, 3200 + i).await;
        env.ingest(&ingestor, &format!("orders/new{i}.jsonl"))
            .await
            .unwrap();
    }
    let next = p.run("from_now_on", soon()).await.unwrap();
    assert_eq!((next.rows_in, next.rows_out), (50, 50), "{next:?}");
    assert_eq!(env.pyiceberg_table("from_now_on")["rows"], 50);
}

/// Review finding: another engine's snapshot on top of a sink carries no checkpoint; expiring the
/// sink must keep the snapshot that does, or the pipeline would start over (an append sink would
/// get every row twice). A sink with rows and no checkpoint refuses to start over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_a_sink_under_another_engines_snapshot_keeps_the_pipeline_position() {
    let env = TestEnv::with_pipelines("sqlite", "").await;
    let ingestor = env.ingestor().await;
    put_orders(&env, "orders/a.jsonl", 400, 3300).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    let p = env.processor().await;
    p.run(APPEND, soon()).await.unwrap();
    // PyIceberg rewrites the sink with the same rows (an overwrite without floe's summary keys).
    env.pyiceberg_run(APPEND, "t.overwrite(t.scan().to_arrow())");
    let m = env.maintainer().await;
    let o = floe::maintain::Options {
        expire_older_than: Some(Duration::ZERO),
        dedup_window: Duration::ZERO,
        retain_last: Some(1),
        now: chrono::Utc::now() + chrono::Duration::days(6),
        ..crate::maintain_opts(false, true, false)
    };
    m.run(APPEND, &o).await.unwrap();
    put_orders(&env, "orders/b.jsonl", 300, 3301).await;
    env.ingest(&ingestor, "orders/b.jsonl").await.unwrap();
    p.run(APPEND, soon()).await.unwrap();
    assert_reconciled(&p, APPEND).await;
}

/// `n` order lines whose event times lie `from_s` to `from_s + span_s` seconds in the past.
fn orders_between(n: usize, seed: u64, from_s: i64, span_s: u64) -> String {
    let mut rng = floe::sample::Rng::new(seed);
    let now = chrono::Utc::now();
    let mut s = String::new();
    for _ in 0..n {
        let late = from_s + rng.below(span_s) as i64;
        floe::sample::order_line(&mut s, &mut rng, now, late);
    }
    s
}

/// The `[min, max]` (µs) of a data file's column `field`, from its manifest bounds.
fn bounds(f: &floe::scan::LiveFile, field: i32) -> (i64, i64) {
    let get = |d: Option<&iceberg::spec::Datum>| match d.map(|d| d.literal()) {
        Some(iceberg::spec::PrimitiveLiteral::Long(v)) => *v,
        other => panic!("no bound: {other:?}"),
    };
    (
        get(f.file.lower_bounds().get(&field)),
        get(f.file.upper_bounds().get(&field)),
    )
}

fn field_id(t: &iceberg::table::Table, name: &str) -> i32 {
    t.metadata()
        .current_schema()
        .field_by_name(name)
        .unwrap()
        .id
}

/// Source files kept out of storage for one run (a run that opens one fails), bytes kept.
type Hidden = Vec<(String, Vec<u8>)>;

/// Takes every live source file whose event times miss `[lo, hi)` out of storage.
async fn hide_source_files_outside(t: &iceberg::table::Table, lo: i64, hi: i64) -> Hidden {
    let field = field_id(t, "event_time");
    let mut hidden = Vec::new();
    for f in floe::scan::live_files(t).await.unwrap() {
        let (min, max) = bounds(&f, field);
        if max < lo || min >= hi {
            let path = f.file.file_path().to_string();
            let bytes = t.file_io().new_input(&path).unwrap().read().await.unwrap();
            t.file_io().delete(&path).await.unwrap();
            hidden.push((path, bytes.to_vec()));
        }
    }
    hidden
}

async fn put_back(t: &iceberg::table::Table, hidden: Hidden) {
    for (path, bytes) in hidden {
        let out = t.file_io().new_output(&path).unwrap();
        out.write(bytes.into()).await.unwrap();
    }
}

/// The data files the source's newest commit added, and the `[lo, hi)` (µs) of the minute
/// windows their event times fall in.
async fn newest_files(t: &iceberg::table::Table) -> (Vec<floe::process::NewFile>, i64, i64) {
    let parent = t
        .metadata()
        .current_snapshot()
        .unwrap()
        .parent_snapshot_id();
    let delta = floe::process::plan(t, parent, floe::process::RowChangePolicy::Fail, "test")
        .await
        .unwrap();
    let field = field_id(t, "event_time");
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for f in &delta.files {
        let live = floe::scan::LiveFile {
            file: f.file.clone(),
            spec_id: f.spec_id,
            deletes: Vec::new(),
        };
        let (min, max) = bounds(&live, field);
        lo = lo.min(min.div_euclid(60_000_000) * 60_000_000);
        hi = hi.max(max.div_euclid(60_000_000) * 60_000_000 + 60_000_000);
    }
    (delta.files, lo, hi)
}

/// Live sink files: path → `window_start` bounds (µs).
async fn sink_files(
    p: &Processor,
    ident: &iceberg::TableIdent,
) -> std::collections::BTreeMap<String, (i64, i64)> {
    let t = p.committer().load(ident).await.unwrap();
    let field = field_id(&t, "window_start");
    floe::scan::live_files(&t)
        .await
        .unwrap()
        .iter()
        .map(|f| (f.file.file_path().to_string(), bounds(f, field)))
        .collect()
}

/// Issue #14: an incremental aggregate run costs the delta, not the table — here a
/// non-decomposable one (`count(DISTINCT …)`, `avg`, HAVING), which recomputes its windows. It
/// reads only the time column of the new files to find the windows they touch, opens only the source files
/// whose time range meets those windows (every other one is taken out of storage during the
/// run: opening it would fail), and rewrites only the sink files of the touched days (the
/// sink is partitioned by day of `window_start`; the other days' files stay as they are). A
/// late object three days old recomputes its old windows the same way; the sink equals the
/// batch result after each run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_run_reads_and_rewrites_only_the_windows_it_touches() {
    let env = TestEnv::with_pipelines("sqlite", MERGE_TOML).await;
    let ingestor = env.ingestor().await;
    // Five days of history (two hours of each), a decoy three days and five hours back (the
    // same day as a late object below, but two hours away from it) and the last hour.
    let mut objects: Vec<(String, String)> = (1..=5)
        .map(|d| {
            let body = orders_between(400, 700 + d, d as i64 * 86_400, 2 * 3600);
            (format!("orders/day{d}.jsonl"), body)
        })
        .collect();
    objects.push((
        "orders/decoy.jsonl".into(),
        orders_between(200, 706, 3 * 86_400 + 4 * 3600, 3600),
    ));
    objects.push((
        "orders/recent.jsonl".into(),
        orders_between(300, 710, 0, 3600),
    ));
    for (key, body) in objects {
        env.put(&key, body).await;
        env.ingest(&ingestor, &key).await.unwrap();
    }
    let p = env.processor().await;
    p.run(DISTINCT, soon()).await.unwrap();
    assert_reconciled(&p, DISTINCT).await;
    let sink = floe::catalog::table_ident(&env.config, DISTINCT).unwrap();
    let before = sink_files(&p, &sink).await;
    assert!(before.len() >= 6, "one sink file per day: {before:?}");

    // One new object in the last hour.
    env.put("orders/new.jsonl", orders_between(20_000, 711, 0, 3600))
        .await;
    env.ingest(&ingestor, "orders/new.jsonl").await.unwrap();
    let source = p.committer().load(&env.ident()).await.unwrap();
    let (new, lo, hi) = newest_files(&source).await;
    let hidden = hide_source_files_outside(&source, lo, hi).await;
    assert!(
        hidden.len() >= 6,
        "the history is out of reach: {}",
        hidden.len()
    );
    let r = p.run(DISTINCT, soon()).await;
    put_back(&source, hidden).await;
    let r = r.expect("no source file outside the touched windows is opened");
    assert!(!r.merged, "count(DISTINCT …) recomputes: {r:?}");
    assert!(r.windows >= 50 && r.windows <= 62, "{r:?}");
    // The touched windows come from the time column alone.
    let new_bytes: u64 = new.iter().map(|f| f.file.file_size_in_bytes()).sum();
    assert!(
        r.delta_files_read >= 1 && r.delta_files_read <= new.len(),
        "{r:?}"
    );
    assert!(
        r.delta_bytes_read * 2 < new_bytes,
        "only the time column of the new files is read: {} of {new_bytes} bytes",
        r.delta_bytes_read
    );
    // The recompute: the new files and the last hour's older file.
    assert!(
        r.recompute_files_read >= new.len() && r.recompute_files_read <= new.len() + 2,
        "{r:?}"
    );
    // The sink: only the files holding touched windows are replaced; the other days' stay.
    let after = sink_files(&p, &sink).await;
    let replaced: Vec<&String> = before.keys().filter(|k| !after.contains_key(*k)).collect();
    assert_eq!(replaced.len(), r.files_replaced, "{r:?}");
    assert!(r.files_replaced >= 1 && r.files_replaced <= 2, "{r:?}");
    for path in &replaced {
        let (min, max) = before[*path];
        assert!(max >= lo && min < hi, "{path} holds no touched window");
    }
    let kept = before.len() - replaced.len();
    assert!(
        kept >= 5,
        "history sink files kept: {kept} of {}",
        before.len()
    );
    assert!(
        r.sink_bytes_replaced > 0 && r.rows_out < 1_000,
        "only the touched day is rewritten: {r:?}"
    );
    assert_reconciled(&p, DISTINCT).await;

    // A late object three days and an hour old: its windows are recomputed from the day-3
    // history file (not the decoy, two hours away; nor any other day's).
    env.put(
        "orders/late.jsonl",
        orders_between(60, 712, 3 * 86_400 + 3600, 600),
    )
    .await;
    env.ingest(&ingestor, "orders/late.jsonl").await.unwrap();
    let source = p.committer().load(&env.ident()).await.unwrap();
    let (new, lo, hi) = newest_files(&source).await;
    let before = sink_files(&p, &sink).await;
    let live = floe::scan::live_files(&source).await.unwrap().len();
    let hidden = hide_source_files_outside(&source, lo, hi).await;
    let decoy_hidden = hidden.len() >= live - new.len() - 2;
    let reachable = live - hidden.len();
    let r = p.run(DISTINCT, soon()).await;
    put_back(&source, hidden).await;
    let r = r.expect("no source file outside the late windows is opened");
    assert!(
        decoy_hidden,
        "the decoy and every other day are out of reach"
    );
    assert!(r.windows >= 5 && r.windows <= 12, "{r:?}");
    assert!(
        r.recompute_files_read > new.len() && r.recompute_files_read <= reachable,
        "the late files and the day-3 history file: {r:?}"
    );
    let after = sink_files(&p, &sink).await;
    let replaced: Vec<&String> = before.keys().filter(|k| !after.contains_key(*k)).collect();
    assert!(
        !replaced.is_empty() && replaced.len() <= 2,
        "the day-3 sink file only: {replaced:?} {r:?}"
    );
    for path in &replaced {
        let (min, max) = before[*path];
        assert!(max >= lo && min < hi, "{path} holds no touched window");
    }
    assert!(after.len() >= before.len() - 1);
    assert_reconciled(&p, DISTINCT).await;

    // Runs that replace the file the run before wrote leave a manifest of tombstones only: it
    // belongs to the snapshot that wrote it and is not carried into the next (Java's rule);
    // carried on, one would pile up per run, and every run would load them all.
    for i in 0..3 {
        let key = format!("orders/more{i}.jsonl");
        env.put(&key, orders_between(50, 720 + i, 0, 600)).await;
        env.ingest(&ingestor, &key).await.unwrap();
        p.run(DISTINCT, soon()).await.unwrap();
    }
    let t = p.committer().load(&sink).await.unwrap();
    let current = t.metadata().current_snapshot_id().unwrap();
    let manifests = floe::snapshot::current_manifests(&t).await.unwrap();
    assert!(
        manifests.iter().all(|m| m.has_added_files()
            || m.has_existing_files()
            || m.added_snapshot_id == current),
        "{manifests:#?}"
    );
    assert!(manifests.len() <= 6, "{} manifests", manifests.len());
    assert_reconciled(&p, DISTINCT).await;
}

/// `line` with the JSON field `field`'s value replaced by null.
fn null_field(line: &str, field: &str) -> String {
    let key = format!("\"{field}\":");
    let Some(start) = line.find(&key) else {
        return line.to_string();
    };
    let from = start + key.len();
    let end = from + line[from..].find(',').expect("not the last field");
    format!("{}null{}", &line[..from], &line[end..])
}

/// Order lines with nulls: every `every`-th amount and items, every `every + 2`-th region
/// (`every` = 1: all of them).
fn with_nulls(text: &str, every: usize) -> String {
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            let mut l = l.to_string();
            if i % every == 0 {
                l = null_field(&null_field(&l, "amount"), "items");
            }
            if i % (every + 2) == 0 || every == 1 {
                l = null_field(&l, "region");
            }
            l + "\n"
        })
        .collect()
}

/// Issue #14: decomposable aggregates (the sample one, and one with count(col), integer sums,
/// min, max and a WHERE) merge each run's partial aggregates into the sink rows of the windows
/// it touches, and equal the batch result after every run: over many runs, with late rows into
/// old windows, null amounts and regions, a group whose values are all null, and runs racing on
/// the same delta (each merge applied once). The non-decomposable one recomputes, and is equal
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decomposable_aggregates_merge_the_delta_over_many_runs_and_equal_the_batch() {
    let env = TestEnv::with_pipelines("sqlite", MERGE_TOML).await;
    let ingestor = env.ingestor().await;
    let p = env.processor().await;
    let pipelines = [AGG, STATS, DISTINCT];
    for round in 0..7u64 {
        let mut objects = vec![(
            format!("orders/r{round}.jsonl"),
            with_nulls(&orders_between(80, 800 + round, 0, 900), 3),
        )];
        if round == 4 {
            // The racing round (below): rows of a day the sink has no file of yet, so the
            // racing commits remove nothing and only the checkpoint keeps a second merge out.
            objects = vec![(
                "orders/new-day.jsonl".into(),
                orders_between(60, 860, 9 * 86_400, 600),
            )];
        }
        if round % 2 == 1 {
            // Late rows into old windows (three days back), already in the sink.
            objects.push((
                format!("orders/late{round}.jsonl"),
                orders_between(40, 850 + round, 3 * 86_400, 900),
            ));
        }
        if round == 2 || round == 5 {
            // Groups whose amounts are all null (null sums), then merged with more of them.
            objects.push((
                format!("orders/nulls{round}.jsonl"),
                with_nulls(&orders_between(20, 870 + round, 2 * 86_400, 120), 1),
            ));
        }
        if round == 6 {
            // Then values into those groups: a null sum plus a value is the value.
            objects.push((
                "orders/after-nulls.jsonl".into(),
                orders_between(20, 880, 2 * 86_400, 120)
                    .lines()
                    .map(|l| null_field(l, "region") + "\n")
                    .collect::<String>(),
            ));
        }
        for (key, body) in objects {
            env.put(&key, body).await;
            env.ingest(&ingestor, &key).await.unwrap();
        }
        for name in pipelines {
            let r = if round == 4 {
                // Three processes race on the same delta: one merge commits, the others
                // re-plan and find nothing left (a second application would double the
                // day's counts: reconcile below).
                let mut tasks = Vec::new();
                for _ in 0..3 {
                    let config = env.config.clone();
                    tasks.push(tokio::spawn(async move {
                        let p = Processor::new(config).await.unwrap();
                        p.run(name, soon()).await
                    }));
                }
                let mut reports = Vec::new();
                for t in tasks {
                    reports.push(t.await.unwrap().expect("run"));
                }
                let committed: Vec<_> = reports
                    .iter()
                    .filter(|r| r.sink_snapshot.is_some())
                    .collect();
                assert_eq!(
                    committed.len(),
                    1,
                    "{name}: one commit of the delta: {reports:?}"
                );
                committed[0].clone()
            } else {
                p.run(name, soon()).await.unwrap()
            };
            assert_eq!(r.merged, name != DISTINCT, "{name}: {r:?}");
            assert!(r.windows >= 1 && r.sink_snapshot.is_some(), "{name}: {r:?}");
            if r.merged {
                assert_eq!(
                    (r.rows_recomputed, r.recompute_files_read),
                    (0, 0),
                    "{name}: {r:?}"
                );
                assert_eq!(r.delta_files_read, r.files, "{name}: {r:?}");
            }
            assert_reconciled(&p, name).await;
        }
    }
    let py = env.pyiceberg_table(STATS);
    assert!(py["rows"].as_u64().is_some_and(|n| n > 0), "{py}");
}

/// Issue #14: a merged run reads the new files and the sink files of the touched windows'
/// period — no source file but the delta's (every other one is out of storage during the run),
/// however many source files the windows hold — while the recomputing pipeline opens them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merged_run_reads_the_delta_and_the_touched_sink_files_only() {
    let env = TestEnv::with_pipelines("sqlite", MERGE_TOML).await;
    let ingestor = env.ingestor().await;
    // 30 objects within the same five minutes: each window holds ~30 source files.
    for i in 0..30u64 {
        let key = format!("orders/many{i}.jsonl");
        env.put(&key, orders_between(20, 900 + i, 0, 240)).await;
        env.ingest(&ingestor, &key).await.unwrap();
    }
    let p = env.processor().await;
    for name in [AGG, DISTINCT] {
        p.run(name, soon()).await.unwrap();
    }
    env.put("orders/one-more.jsonl", orders_between(20, 990, 0, 240))
        .await;
    env.ingest(&ingestor, "orders/one-more.jsonl")
        .await
        .unwrap();
    let source = p.committer().load(&env.ident()).await.unwrap();
    let (new, _, _) = newest_files(&source).await;
    let new_paths: Vec<String> = new.iter().map(|f| f.file.file_path().to_string()).collect();
    let new_bytes: u64 = new.iter().map(|f| f.file.file_size_in_bytes()).sum();
    // Every source file but the new ones out of storage.
    let mut hidden: Hidden = Vec::new();
    for f in floe::scan::live_files(&source).await.unwrap() {
        let path = f.file.file_path().to_string();
        if new_paths.contains(&path) {
            continue;
        }
        let bytes = source
            .file_io()
            .new_input(&path)
            .unwrap()
            .read()
            .await
            .unwrap();
        source.file_io().delete(&path).await.unwrap();
        hidden.push((path, bytes.to_vec()));
    }
    assert!(hidden.len() >= 30, "{}", hidden.len());
    let sink = floe::catalog::table_ident(&env.config, AGG).unwrap();
    let before = sink_files(&p, &sink).await;
    let r = p.run(AGG, soon()).await;
    put_back(&source, hidden).await;
    let r = r.expect("a merge opens no source file but the delta's");
    assert!(r.merged, "{r:?}");
    assert_eq!(
        (
            r.delta_files_read,
            r.recompute_files_read,
            r.rows_recomputed
        ),
        (new.len(), 0, 0),
        "{r:?}"
    );
    assert!(r.delta_bytes_read <= 2 * new_bytes, "{r:?}");
    assert!(
        r.sink_files_read >= 1 && r.sink_files_read <= before.len() && r.sink_files_read <= 2,
        "the touched day's sink file: {r:?}"
    );
    assert_eq!(r.files_replaced, r.sink_files_read, "{r:?}");
    assert_reconciled(&p, AGG).await;
    // The same delta recomputed: every source file of the touched windows is opened.
    let d = p.run(DISTINCT, soon()).await.unwrap();
    assert!(!d.merged && d.recompute_files_read >= 30, "{d:?}");
    assert_reconciled(&p, DISTINCT).await;
    eprintln!(
        "merge: {} delta + {} sink files ({} + {} bytes); recompute: {} files ({} bytes)",
        r.delta_files_read,
        r.sink_files_read,
        r.delta_bytes_read,
        r.sink_bytes_read,
        d.delta_files_read + d.recompute_files_read,
        d.delta_bytes_read + d.recompute_bytes_read
    );
}

/// #14 review item 4: an SQS batch of commit events answers per message. Two commits of
/// `orders` coalesce into one run of each pipeline over it; the aggregate's run fails
/// retryably (its sink's loads are throttled), so both messages come back, and the append
/// pipeline's output is committed and not redone on redelivery. A commit of a table no pipeline
/// reads is settled at once.
#[tokio::test]
async fn sqs_batches_fail_only_the_messages_whose_pipelines_failed() {
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;
    let env = TestEnv::with_pipelines("sqlite", "").await;
    let ingestor = env.ingestor().await;
    for i in 0..2 {
        put_orders(&env, &format!("orders/q{i}.jsonl"), 300, 70 + i).await;
        env.ingest(&ingestor, &format!("orders/q{i}.jsonl"))
            .await
            .unwrap();
    }
    let commit = |table: &str| {
        json!({"detail-type": "floe.commit", "source": "floe", "detail": {"table": table}})
            .to_string()
    };
    let batch = json!({"Records": [
        {"messageId": "m1", "eventSource": "aws:sqs", "body": commit("orders")},
        {"messageId": "m2", "eventSource": "aws:sqs", "body": commit("orders")},
        {"messageId": "m3", "eventSource": "aws:sqs", "body": commit("other")},
    ]});
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let throttled: Arc<dyn iceberg::Catalog> = Arc::new(floe::catalog::Hooked::new(
        catalog,
        crate::faults::FailingLoads {
            table: AGG.into(),
            failures: AtomicU32::new(1000),
        },
    ));
    let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
    let p = Processor::with_parts(
        env.config.clone(),
        floe::commit::Committer::new(throttled, swap),
    );
    let r = p.handle_event(&batch, soon()).await;
    assert!(r.is_sqs);
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(r.errors[0].is_retryable(), "{}", r.errors[0]);
    assert_eq!(
        r.failed_message_ids,
        ["m1", "m2"],
        "coalesced: both share the run"
    );
    let append: Vec<_> = r.reports.iter().filter(|x| x.pipeline == APPEND).collect();
    assert_eq!(append.len(), 1, "one run for both commits");
    assert_eq!(append[0].source_snapshots, 2);
    assert!(append[0].sink_snapshot.is_some());
    let v = floe::lambda::process_response(&r).unwrap();
    assert_eq!(v["batchItemFailures"].as_array().unwrap().len(), 2, "{v}");

    // Redelivery of m1 and m2, the catalog healthy again: the aggregate catches up; the append
    // pipeline's work was committed and is not done again.
    let again = json!({"Records": [
        {"messageId": "m1", "eventSource": "aws:sqs", "body": commit("orders")},
        {"messageId": "m2", "eventSource": "aws:sqs", "body": commit("orders")},
    ]});
    let healthy = env.processor().await;
    let r = healthy.handle_event(&again, soon()).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(r.failed_message_ids.is_empty());
    let append = r.reports.iter().find(|x| x.pipeline == APPEND).unwrap();
    assert_eq!((append.rows_in, append.sink_snapshot), (0, None));
    let agg = r.reports.iter().find(|x| x.pipeline == AGG).unwrap();
    assert!(agg.sink_snapshot.is_some());
    for name in [APPEND, AGG] {
        assert_reconciled(&healthy, name).await;
    }
}

/// Review finding: a merge adds the delta to the sink's rows, so a pipeline starting at `latest`
/// (its sink lacks the rows before the start) recomputes: a late row into a window of the
/// history counts the whole window, as the batch does — a merge would count the late row alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_starting_at_latest_recomputes_a_window_of_the_history() {
    let tail = r#"
[[pipelines]]
name = "orders_per_minute_from_now"
source = "orders"
sink = "orders_per_minute_from_now"
mode = "aggregate"
window = "1m"
start = "latest"
keys = ["window_start"]
sql = "SELECT window_start, count(*) AS orders FROM source GROUP BY window_start"
"#;
    let name = "orders_per_minute_from_now";
    let env = TestEnv::with_pipelines("sqlite", tail).await;
    let ingestor = env.ingestor().await;
    // Every order within the minute before the current one (`order_line` goes up to 59.999 s
    // back from its base).
    let now = chrono::Utc::now();
    let minute = now
        - chrono::Duration::seconds(now.timestamp() % 60)
        - chrono::Duration::nanoseconds(now.timestamp_subsec_nanos() as i64);
    let base = minute - chrono::Duration::milliseconds(1);
    env.put(
        "orders/w.jsonl",
        floe::sample::orders_jsonl(100, 4100, base),
    )
    .await;
    env.ingest(&ingestor, "orders/w.jsonl").await.unwrap();
    let p = env.processor().await;
    let first = p.run(name, soon()).await.unwrap();
    assert_eq!(first.rows_out, 0, "history before the start is not read");
    env.put(
        "orders/late.jsonl",
        floe::sample::orders_jsonl(1, 4101, base),
    )
    .await;
    env.ingest(&ingestor, "orders/late.jsonl").await.unwrap();
    let r = p.run(name, soon()).await.unwrap();
    let py = env.pyiceberg_rows(name);
    let rows = py["data"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{py}");
    // Before the fix: merged, "1".
    assert_eq!(rows[0].as_array().unwrap()[1], "101", "{r:?}: {py}");
    assert!(
        !r.merged && r.windows == 1,
        "start = latest recomputes: {r:?}"
    );
}
