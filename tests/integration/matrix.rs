//! The standing fault matrix (#15): every site that commits or deletes × every pointer-swap fault
//! (crash before/after metadata, crash after the swap, lost answer, lost answer seen as a conflict,
//! timeout before the request, conflicts) × SQLite, Glue (VersionId enforced) and REST.
//!
//! Each cell runs the site once with the fault, repairs a crash the way production does (the
//! redelivery or the next scheduled run, healthy), then runs orphan cleanup as if days had passed
//! and checks the invariants: rows and an order-independent checksum equal the no-fault run;
//! every file any retained snapshot references exists; PyIceberg reads every table; the pipelines
//! reconcile; nothing valid was quarantined. The table in docs/ARCHITECTURE.md mirrors this file.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use floe::commit::Committer;
use floe::ingest::Status;
use floe::maintain::{Maintainer, Options};
use floe::process::Processor;

use crate::faults::{assert_referenced_files_exist, faulty, FailingLoads, Fault};
use crate::harness::{orders, TestEnv};

const APPEND: &str = "suspicious_orders";
const AGG: &str = "revenue_per_region_minute";
/// The refresh rows' chunk budget: below one object's rows.
const REFRESH_CHUNK_ROWS: u64 = 60;
const LATEST: &str = "customer_latest_order";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Site {
    Ingest,
    IngestSchemaChange,
    IngestParquet,
    /// One SQS batch of objects, one commit for all of them.
    IngestBatch,
    /// A DLQ redrive (`floe replay`): the commit, then the message delete, which may happen
    /// only once the object is proven in the table.
    Replay,
    ProcessAppend,
    ProcessAggregate,
    /// A latest-state run: the tombstone commit, then the sink commit (faults hit both).
    ProcessLatest,
    /// A latest-state run whose delta holds another writer's `delete` of a source file: the
    /// affected buckets' rebuilt tombstones (committed on the version read only), then the sink.
    ProcessLatestRetract,
    /// `floe process refresh` of the aggregate pipeline, in chunks of windows (a tiny budget:
    /// several chunk commits, each one a commit site with its position).
    Refresh,
    /// The same for the append pipeline, in chunks of source files (the first chunk's commit
    /// also removes the old sink content).
    RefreshAppend,
    /// A latest pipeline's refresh: the tombstones replaced, then the sink.
    RefreshLatest,
    Compaction,
    ManifestRewrite,
    Expiration,
    MetadataCleanup,
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

fn opts() -> Options {
    Options {
        compact: false,
        expire: false,
        orphans: false,
        rewrite_manifests: false,
        min_input_files: 2,
        target_file_bytes: Some(64 << 20),
        ..Options::default()
    }
}

/// Expire everything but the latest snapshot and what consumers pin.
pub(crate) fn expire_all() -> Options {
    Options {
        expire: true,
        expire_older_than: Some(Duration::ZERO),
        dedup_window: Duration::ZERO,
        retain_last: Some(1),
        ..opts()
    }
}

/// `orders` as Parquet (the same rows as the JSON lines).
pub(crate) fn parquet_of(jsonl: &str) -> Vec<u8> {
    use arrow::datatypes::{DataType, Field, Schema};
    let s = |n: &str| Field::new(n, DataType::Utf8, true);
    let schema = Arc::new(Schema::new(vec![
        s("order_id"),
        Field::new("customer_id", DataType::Int64, true),
        s("region"),
        Field::new("amount", DataType::Float64, true),
        s("currency"),
        Field::new("items", DataType::Int32, true),
        s("status"),
        s("payment_method"),
        s("event_time"),
    ]));
    let reader = arrow::json::ReaderBuilder::new(schema.clone())
        .build(std::io::Cursor::new(jsonl.as_bytes().to_vec()))
        .unwrap();
    let mut buf = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, schema, None).unwrap();
    for b in reader {
        w.write(&b.unwrap()).unwrap();
    }
    w.close().unwrap();
    buf
}

fn with_coupon(text: &str) -> String {
    text.lines()
        .map(|l| format!("{},\"coupon\":\"XMAS\"}}\n", l.trim_end_matches('}')))
        .collect()
}

/// The world of one cell: a fresh bucket/namespace, the sample pipelines, the expected rows.
struct Cell {
    env: TestEnv,
    site: Site,
    fault: Fault,
    expected_rows: usize,
    seed: u64,
}

impl Cell {
    async fn new(catalog: &'static str, site: Site) -> Self {
        let extra = match site {
            // Old metadata files are deleted after each commit: the cleanup path runs.
            Site::MetadataCleanup => {
                r#"properties = { "write.metadata.delete-after-commit.enabled" = "true", "write.metadata.previous-versions-max" = "2" }"#
            }
            // Manifests pile up (no merge on append), so the rewrite has work.
            Site::ManifestRewrite => {
                r#"properties = { "commit.manifest-merge.enabled" = "false" }"#
            }
            _ => "",
        };
        let mut env = if matches!(
            site,
            Site::ProcessLatest | Site::ProcessLatestRetract | Site::RefreshLatest
        ) {
            // 40 customers: versions of one key across objects and rounds, deletes among them.
            let latest = floe::sample::LATEST_PIPELINE_TOML.replace(
                "SELECT customer_id,",
                "SELECT customer_id % 40 AS customer_id,",
            );
            TestEnv::with_pipelines(catalog, &latest).await
        } else {
            TestEnv::with_pipelines_and_orders_toml(catalog, extra).await
        };
        if matches!(site, Site::Refresh | Site::RefreshAppend) {
            // Each refresh is several chunk commits (≥ 2 per round), the fault hits the first.
            env.config.process.refresh_chunk_rows = REFRESH_CHUNK_ROWS;
        }
        Self {
            env,
            site,
            fault: Fault::Conflicts,
            expected_rows: 0,
            seed: 10,
        }
    }

    /// A fresh seed: every object holds order ids no other object has.
    fn next_seed(&mut self) -> u64 {
        self.seed += 1;
        self.seed
    }

    fn what(&self) -> String {
        format!(
            "{} {:?} × {:?}",
            self.env.catalog_kind, self.site, self.fault
        )
    }

    async fn committer(&self, fault: Option<Fault>) -> Committer {
        let catalog = floe::catalog::connect(&self.env.config).await.unwrap();
        let swap = floe::catalog::pointer_swap(&self.env.config).await.unwrap();
        match fault {
            Some(f) => Committer::new(catalog, faulty(f)(swap)),
            None => Committer::new(catalog, swap),
        }
    }

    /// The current version of `orders`.
    async fn orders(&self) -> iceberg::table::Table {
        let m = self.maintainer(None).await;
        m.committer().load(&self.env.ident()).await.unwrap()
    }

    async fn maintainer(&self, fault: Option<Fault>) -> Maintainer {
        Maintainer::with_parts(self.env.config.clone(), self.committer(fault).await)
    }

    async fn processor(&self, fault: Option<Fault>) -> Processor {
        Processor::with_parts(self.env.config.clone(), self.committer(fault).await)
    }

    /// Ingests `key` healthy; counts its rows as expected.
    async fn load(&mut self, key: &str, body: Vec<u8>, rows: usize) {
        self.env.put(key, body).await;
        let ingestor = self.env.ingestor().await;
        let r = self.env.ingest(&ingestor, key).await.unwrap();
        assert_eq!(r.status, Status::Committed, "{}: {r:?}", self.what());
        self.expected_rows += rows;
    }

    async fn load_orders(&mut self, n: usize, objects: usize) {
        for _ in 0..objects {
            let seed = self.next_seed();
            let key = format!("orders/base-{seed}.jsonl");
            self.load(&key, orders(n, seed).into_bytes(), n).await;
        }
    }

    /// Another writer's copy-on-write `delete` of one live data file of `orders` (healthy).
    async fn delete_a_source_file(&mut self) {
        let ident = self.env.ident();
        let c = self.committer(None).await;
        let t = c.load(&ident).await.unwrap();
        let victim = floe::scan::live_files(&t).await.unwrap().remove(0);
        self.expected_rows -= victim.file.record_count() as usize;
        let mut change = floe::snapshot::Change::append(Vec::new(), Default::default());
        change.operation = iceberg::spec::Operation::Delete;
        change.removed = vec![victim.file.file_path().to_string()];
        let limits = floe::commit::CommitLimits {
            max_attempts: 5,
            deadline: soon(),
            skew: Duration::from_secs(60),
        };
        c.commit(&ident, &limits, move |_| {
            Ok(floe::commit::Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
    }

    /// The faulty run of the site; a crash is repaired by a healthy re-run (redelivery/next run).
    async fn run(&mut self) {
        let fault = self.fault;
        let what = self.what();
        match self.site {
            Site::Ingest
            | Site::IngestSchemaChange
            | Site::IngestParquet
            | Site::MetadataCleanup => {
                let objects = if self.site == Site::MetadataCleanup {
                    3
                } else {
                    1
                };
                for _ in 0..objects {
                    let seed = self.next_seed();
                    let text = orders(40, seed);
                    let (key, body) = match self.site {
                        Site::IngestSchemaChange => (
                            format!("orders/f{seed}.jsonl"),
                            with_coupon(&text).into_bytes(),
                        ),
                        Site::IngestParquet => {
                            (format!("parquet/f{seed}.parquet"), parquet_of(&text))
                        }
                        _ => (format!("orders/f{seed}.jsonl"), text.into_bytes()),
                    };
                    self.env.put(&key, body).await;
                    let faulty_ingestor = self.env.ingestor_with(faulty(fault)).await;
                    let first = self.env.ingest(&faulty_ingestor, &key).await;
                    let healthy = self.env.ingestor().await;
                    if fault.crashes() {
                        let e = first.unwrap_err();
                        assert!(e.to_string().contains("injected crash"), "{what}: {e}");
                        let again = self.env.ingest(&healthy, &key).await.unwrap();
                        let want = if fault == Fault::AfterCommit {
                            Status::Duplicate
                        } else {
                            Status::Committed
                        };
                        assert_eq!(again.status, want, "{what}: {again:?}");
                    } else {
                        let r = first.unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(
                            (r.status, r.records_committed),
                            (Status::Committed, 40),
                            "{what}: {r:?}"
                        );
                    }
                    let dup = self.env.ingest(&healthy, &key).await.unwrap();
                    assert_eq!(dup.status, Status::Duplicate, "{what}: {dup:?}");
                    self.expected_rows += 40;
                }
            }
            Site::IngestBatch => {
                // Three objects in one payload: one commit naming all three.
                let mut keys = Vec::new();
                for _ in 0..3 {
                    let seed = self.next_seed();
                    let key = format!("orders/batch-{seed}.jsonl");
                    self.env.put(&key, orders(40, seed)).await;
                    keys.push(key);
                }
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let payload = self.env.sqs_batch(&refs);
                let faulty_ingestor = self.env.ingestor_with(faulty(fault)).await;
                let first = faulty_ingestor.handle_payload(&payload, soon()).await;
                let healthy = self.env.ingestor().await;
                if fault.crashes() {
                    // The commit's outcome is unknown to the crashed run: every message retried.
                    assert_eq!(
                        first.failed_message_ids,
                        vec!["m0", "m1", "m2"],
                        "{what}: {:?}",
                        first.reports
                    );
                    assert!(
                        first.errors.iter().all(|e| e.contains("injected crash")),
                        "{what}: {:?}",
                        first.errors
                    );
                    let again = healthy.handle_payload(&payload, soon()).await;
                    assert!(
                        again.failed_message_ids.is_empty(),
                        "{what}: {:?}",
                        again.errors
                    );
                    let want = if fault == Fault::AfterCommit {
                        Status::Duplicate
                    } else {
                        Status::Committed
                    };
                    assert!(
                        again.reports.len() == 3 && again.reports.iter().all(|r| r.status == want),
                        "{what}: {:?}",
                        again.reports
                    );
                } else {
                    assert!(
                        first.failed_message_ids.is_empty(),
                        "{what}: {:?}",
                        first.errors
                    );
                    let snap = first.reports.first().and_then(|r| r.snapshot_id);
                    assert!(
                        first.reports.len() == 3
                            && first.reports.iter().all(|r| (
                                r.status,
                                r.records_committed,
                                r.snapshot_id
                            ) == (Status::Committed, 40, snap)),
                        "{what}: one commit for all: {:?}",
                        first.reports
                    );
                }
                let dup = healthy.handle_payload(&payload, soon()).await;
                assert!(
                    dup.failed_message_ids.is_empty()
                        && dup.reports.iter().all(|r| r.status == Status::Duplicate),
                    "{what}: {:?}",
                    dup.reports
                );
                self.expected_rows += 120;
            }
            Site::Replay => {
                use crate::replay::{depth, dlq, options, send, sqs, TestQueue};
                use floe::ingest::replay::Outcome;
                let seed = self.next_seed();
                let key = format!("orders/dlq-{seed}.jsonl");
                self.env.put(&key, orders(40, seed)).await;
                let sqs = sqs().await;
                let url = dlq(&sqs).await;
                send(&sqs, &url, &self.env.s3_notification(&key, None)).await;
                let queue = TestQueue::new(&sqs, &url);
                let faulty_ingestor = self.env.ingestor_with(faulty(fault)).await;
                let first = faulty_ingestor
                    .replay_queue(&queue, &options())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let o = &first.items[0].objects[0];
                let left = match fault {
                    // Nothing landed: the message stays for the next replay.
                    Fault::BeforeMetadata | Fault::AfterMetadata => {
                        assert_eq!(o.outcome, Outcome::Failed, "{what}: {first:?}");
                        true
                    }
                    // It landed and the crash hid it: the re-read finds it, then the delete.
                    Fault::AfterCommit => {
                        assert_eq!(o.outcome, Outcome::AlreadyCommitted, "{what}: {first:?}");
                        false
                    }
                    _ => {
                        assert_eq!(
                            (o.outcome, o.records_committed),
                            (Outcome::Replayed, 40),
                            "{what}: {first:?}"
                        );
                        false
                    }
                };
                assert_eq!(
                    (first.deleted, first.left),
                    if left { (0, 1) } else { (1, 0) },
                    "{what}: {first:?}"
                );
                // The next replay (the message visible again) settles what was left, once.
                queue.release_all().await;
                let healthy = self.env.ingestor().await;
                let again = healthy.replay_queue(&queue, &options()).await.unwrap();
                if left {
                    assert_eq!(
                        (again.messages, again.deleted, again.replayed),
                        (1, 1, 1),
                        "{what}: {again:?}"
                    );
                } else {
                    assert_eq!(again.messages, 0, "{what}: {again:?}");
                }
                assert_eq!(depth(&sqs, &url).await, (0, 0), "{what}: no message left");
                self.expected_rows += 40;
            }
            Site::ProcessAppend
            | Site::ProcessAggregate
            | Site::ProcessLatest
            | Site::ProcessLatestRetract
            | Site::Refresh
            | Site::RefreshAppend
            | Site::RefreshLatest => {
                // Its own (boxed) future: one frame for every site overflows a worker's stack.
                Box::pin(self.run_pipeline(fault, &what)).await;
            }
            Site::Compaction | Site::ManifestRewrite | Site::Expiration => {
                match self.site {
                    // Small files to compact, manifests to fold.
                    Site::Compaction => self.load_orders(30, 3).await,
                    Site::ManifestRewrite => self.load_orders(20, 3).await,
                    _ => {
                        // A consumer's checkpoint pins the snapshots after it.
                        self.load_orders(30, 1).await;
                        self.processor(None)
                            .await
                            .run(APPEND, soon())
                            .await
                            .unwrap();
                        self.load_orders(30, 2).await;
                    }
                }
                let o = match self.site {
                    Site::Compaction => Options {
                        compact: true,
                        ..opts()
                    },
                    Site::ManifestRewrite => Options {
                        rewrite_manifests: true,
                        manifest_threshold: 2,
                        ..opts()
                    },
                    _ => expire_all(),
                };
                let before = self.orders().await;
                let first = self.maintainer(Some(fault)).await.run("orders", &o).await;
                if fault.crashes() {
                    // A failed compaction is reported and the table's other operations run
                    // (the invocation fails once every table ran); the others stop the run.
                    let why = match first {
                        Err(e) => e.to_string(),
                        Ok(r) => r.compaction_failed.clone().unwrap_or_default(),
                    };
                    assert!(why.contains("injected crash"), "{what}: {why}");
                } else {
                    first.unwrap_or_else(|e| panic!("{what}: {e}"));
                }
                // The next scheduled run finishes the job.
                self.maintainer(None).await.run("orders", &o).await.unwrap();
                let after = self.orders().await;
                assert_ne!(
                    before.metadata_location(),
                    after.metadata_location(),
                    "{what}: the maintenance had work to do"
                );
            }
        }
    }

    /// [`Cell::run`] for the sites that run a pipeline or a refresh.
    async fn run_pipeline(&mut self, fault: Fault, what: &str) {
        let name = match self.site {
            Site::ProcessAppend | Site::RefreshAppend => APPEND,
            Site::ProcessLatest | Site::ProcessLatestRetract | Site::RefreshLatest => LATEST,
            _ => AGG,
        };
        let refresh = matches!(
            self.site,
            Site::Refresh | Site::RefreshAppend | Site::RefreshLatest
        );
        self.processor(None).await.run(name, soon()).await.unwrap();
        self.load_orders(if refresh { 100 } else { 60 }, 2).await;
        if self.site == Site::ProcessLatestRetract {
            self.delete_a_source_file().await;
        }
        let p = self.processor(Some(fault)).await;
        let first = if refresh {
            p.refresh(name, soon()).await
        } else {
            p.run(name, soon()).await
        };
        if fault.crashes() {
            let e = first.unwrap_err();
            assert!(e.to_string().contains("injected crash"), "{what}: {e}");
        } else {
            let r = first.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(r.sink_snapshot.is_some(), "{what}: {r:?}");
            if self.site == Site::ProcessLatestRetract {
                assert!(
                    r.row_changes == 1 && r.buckets_rebuilt > 0,
                    "{what}: the delete retracted: {r:?}"
                );
            }
            // The aggregate merges the delta into its windows (not idempotent: a second
            // application would double its counts, and reconcile below says).
            if self.site == Site::ProcessAggregate {
                assert!(r.merged, "{what}: {r:?}");
            }
            // A latest pipeline's refresh is one piece (tombstones, then the sink).
            if matches!(self.site, Site::Refresh | Site::RefreshAppend) {
                let g = r.refresh_progress.as_ref();
                assert!(
                    g.is_some_and(|g| g.done && g.chunks >= 2),
                    "{what}: a refresh in several chunks: {r:?}"
                );
            }
        }
        // The next trigger: nothing twice, nothing lost (a refresh the crash left in
        // progress is continued by it).
        Box::pin(self.processor(None).await.run(name, soon()))
            .await
            .unwrap();
        if self.site == Site::ProcessLatest {
            // The faulty run was a merge-on-read one: the later orders' customers had
            // rows in the sink, replaced by position deletes (the new commit path).
            // (Boxed: the cell's future is large already.)
            let deletes = Box::pin(async {
                let ident = floe::catalog::table_ident(&self.env.config, LATEST).unwrap();
                let p = self.processor(None).await;
                let sink = p.committer().load(&ident).await.unwrap();
                floe::scan::live_deletes(&sink).await.unwrap()
            })
            .await;
            assert!(!deletes.is_empty(), "{what}: the sink has position deletes");
        }
    }

    /// Whether the cell involves the pipelines' sinks (else only `orders` is checked).
    fn with_sinks(&self) -> bool {
        matches!(
            self.site,
            Site::ProcessAppend
                | Site::ProcessAggregate
                | Site::ProcessLatest
                | Site::ProcessLatestRetract
                | Site::Refresh
                | Site::RefreshAppend
                | Site::RefreshLatest
                | Site::Expiration
        )
    }

    /// The pipelines the cell runs and reconciles.
    fn pipelines(&self) -> Vec<&'static str> {
        match (self.with_sinks(), self.site) {
            (false, _) => Vec::new(),
            (true, Site::ProcessLatest | Site::RefreshLatest) => vec![APPEND, AGG, LATEST],
            // The append and aggregate pipelines stop at a source row change.
            (true, Site::ProcessLatestRetract) => vec![LATEST],
            (true, _) => vec![APPEND, AGG],
        }
    }

    /// The tables the cell checks: `orders`, the sinks, a latest sink's tombstones.
    fn tables(&self) -> Vec<String> {
        let mut t = vec!["orders".to_string()];
        for name in self.pipelines() {
            t.push(name.to_string());
            if let Some(tt) = self
                .env
                .config
                .pipeline(name)
                .and_then(|p| p.tombstone_table())
            {
                t.push(tt);
            }
        }
        t
    }

    /// Orphan cleanup as if a month had passed, then every invariant.
    async fn check(&self) {
        let what = self.what();
        let env = &self.env;
        let tables = self.tables();
        let p = self.processor(None).await;
        for name in self.pipelines() {
            p.run(name, soon())
                .await
                .unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
        }
        let healthy = self.maintainer(None).await;
        let month = Options {
            orphans: true,
            now: chrono::Utc::now() + chrono::Duration::days(30),
            ..opts()
        };
        for t in &tables {
            healthy
                .run(t, &month)
                .await
                .unwrap_or_else(|e| panic!("{what}: orphans of {t}: {e}"));
        }
        let catalog = healthy.committer().catalog().clone();
        let (rows, _, distinct) = env.checksum(catalog.as_ref()).await;
        assert_eq!(
            (rows, distinct),
            (self.expected_rows, self.expected_rows),
            "{what}: rows / distinct order ids"
        );
        for t in &tables {
            let ident = floe::catalog::table_ident(&env.config, t).unwrap();
            let table = catalog
                .load_table(&ident)
                .await
                .unwrap_or_else(|e| panic!("{what}: {t} must load: {e}"));
            assert_referenced_files_exist(&table, &format!("{what}: {t}")).await;
        }
        for name in self.pipelines() {
            let r = p.reconcile(name).await.unwrap();
            assert!(r.matches(), "{what}: {name} reconcile: {r:?}");
        }
        assert!(
            env.keys("quarantine/").await.is_empty(),
            "{what}: valid records quarantined"
        );
    }

    /// An independent reader (PyIceberg) reads every table the cell touched, with the rows floe
    /// counts (a file lost in any round stays lost, so once at the end suffices).
    fn check_readers(&self) {
        let py = self.env.pyiceberg();
        assert_eq!(
            py["rows"],
            self.expected_rows,
            "{}: PyIceberg: {py}",
            self.what()
        );
        {
            for name in self.pipelines() {
                let py = self.env.pyiceberg_table(name);
                assert!(
                    py["rows"].as_u64().is_some_and(|n| n > 0),
                    "{}: PyIceberg on {name}: {py}",
                    self.what()
                );
            }
        }
    }
}

/// One row of the matrix on one catalog: every fault in turn on the same tables (each round
/// brings its own new data), every invariant after each round, PyIceberg at the end.
async fn matrix(catalog: &'static str, site: Site) {
    let started = Instant::now();
    let mut cell = Cell::new(catalog, site).await;
    cell.load_orders(60, 2).await;
    for fault in Fault::ALL {
        let round = Instant::now();
        cell.fault = fault;
        // Boxed: the site's future (every site's branch) is too large for a worker's stack.
        Box::pin(cell.run()).await;
        Box::pin(cell.check()).await;
        eprintln!(
            "matrix: {} ok in {:.1}s",
            cell.what(),
            round.elapsed().as_secs_f64()
        );
    }
    cell.check_readers();
    eprintln!(
        "matrix: {catalog} {site:?}: {} faults in {:.1}s",
        Fault::ALL.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Runs `cell` on a two-worker runtime whose threads have 8 MiB stacks: a cell's futures (debug
/// builds keep every branch's temporaries in a frame) outgrow tokio's default 2 MiB.
fn on_large_stacks(cell: impl std::future::Future<Output = ()> + Send + 'static) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_stack_size(8 << 20)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move { tokio::spawn(cell).await.unwrap() });
}

macro_rules! cells {
    ($($name:ident: $catalog:literal, $site:expr;)*) => {
        $(
            #[test]
            fn $name() {
                on_large_stacks(matrix($catalog, $site));
            }
        )*
    };
}

cells! {
    sqlite_ingest: "sqlite", Site::Ingest;
    sqlite_ingest_schema_change: "sqlite", Site::IngestSchemaChange;
    sqlite_ingest_parquet: "sqlite", Site::IngestParquet;
    sqlite_ingest_batch: "sqlite", Site::IngestBatch;
    sqlite_replay: "sqlite", Site::Replay;
    sqlite_process_append: "sqlite", Site::ProcessAppend;
    sqlite_process_aggregate: "sqlite", Site::ProcessAggregate;
    sqlite_process_latest: "sqlite", Site::ProcessLatest;
    sqlite_process_latest_retract: "sqlite", Site::ProcessLatestRetract;
    sqlite_refresh: "sqlite", Site::Refresh;
    sqlite_refresh_append: "sqlite", Site::RefreshAppend;
    sqlite_refresh_latest: "sqlite", Site::RefreshLatest;
    sqlite_compaction: "sqlite", Site::Compaction;
    sqlite_manifest_rewrite: "sqlite", Site::ManifestRewrite;
    sqlite_expiration: "sqlite", Site::Expiration;
    sqlite_metadata_cleanup: "sqlite", Site::MetadataCleanup;
    glue_ingest: "glue", Site::Ingest;
    glue_ingest_schema_change: "glue", Site::IngestSchemaChange;
    glue_ingest_parquet: "glue", Site::IngestParquet;
    glue_ingest_batch: "glue", Site::IngestBatch;
    glue_replay: "glue", Site::Replay;
    glue_process_append: "glue", Site::ProcessAppend;
    glue_process_aggregate: "glue", Site::ProcessAggregate;
    glue_process_latest: "glue", Site::ProcessLatest;
    glue_process_latest_retract: "glue", Site::ProcessLatestRetract;
    glue_refresh: "glue", Site::Refresh;
    glue_refresh_append: "glue", Site::RefreshAppend;
    glue_refresh_latest: "glue", Site::RefreshLatest;
    glue_compaction: "glue", Site::Compaction;
    glue_manifest_rewrite: "glue", Site::ManifestRewrite;
    glue_expiration: "glue", Site::Expiration;
    glue_metadata_cleanup: "glue", Site::MetadataCleanup;
    rest_ingest: "rest", Site::Ingest;
    rest_ingest_schema_change: "rest", Site::IngestSchemaChange;
    rest_ingest_parquet: "rest", Site::IngestParquet;
    rest_ingest_batch: "rest", Site::IngestBatch;
    rest_replay: "rest", Site::Replay;
    rest_process_append: "rest", Site::ProcessAppend;
    rest_process_aggregate: "rest", Site::ProcessAggregate;
    rest_process_latest: "rest", Site::ProcessLatest;
    rest_process_latest_retract: "rest", Site::ProcessLatestRetract;
    rest_refresh: "rest", Site::Refresh;
    rest_refresh_append: "rest", Site::RefreshAppend;
    rest_refresh_latest: "rest", Site::RefreshLatest;
    rest_compaction: "rest", Site::Compaction;
    rest_manifest_rewrite: "rest", Site::ManifestRewrite;
    rest_expiration: "rest", Site::Expiration;
    rest_metadata_cleanup: "rest", Site::MetadataCleanup;
}

/// #15 item 7: a consumer whose checkpoint cannot be read (a throttled catalog) stops the
/// expiration; it never expires the snapshots that consumer still has to read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiration_stops_when_a_consumer_cannot_be_read() {
    let mut cell = Cell::new("sqlite", Site::Expiration).await;
    cell.load_orders(60, 2).await;
    cell.processor(None)
        .await
        .run(APPEND, soon())
        .await
        .unwrap();
    cell.load_orders(50, 2).await;
    let catalog = floe::catalog::connect(&cell.env.config).await.unwrap();
    let flaky: Arc<dyn iceberg::Catalog> = Arc::new(floe::catalog::Hooked::new(
        catalog,
        FailingLoads {
            table: APPEND.into(),
            failures: AtomicU32::new(1000),
        },
    ));
    let swap = floe::catalog::pointer_swap(&cell.env.config).await.unwrap();
    let m = Maintainer::with_parts(cell.env.config.clone(), Committer::new(flaky, swap));
    let o = expire_all();
    let before = cell.orders().await;
    let e = m.run("orders", &o).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains(APPEND), "{e}");
    let after = cell.orders().await;
    assert_eq!(
        before.metadata().snapshots().count(),
        after.metadata().snapshots().count(),
        "nothing expired"
    );
    // The pipeline still finds its checkpoint and everything after it.
    cell.check().await;
    cell.check_readers();
}

/// A Lambda cut off at its timeout: the run's future is dropped at an arbitrary point. Whatever
/// point that is, no partial commit is visible and the next run does the work exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_cut_off_at_any_point_leave_no_partial_commit() {
    let mut cell = Cell::new("sqlite", Site::ProcessAggregate).await;
    cell.load_orders(60, 4).await;
    let cut = |ms: u64| Duration::from_millis(ms);
    for (i, ms) in [0u64, 3, 10, 25, 60, 150, 400].into_iter().enumerate() {
        // Ingest, a pipeline run and a compaction, each cut off after `ms`.
        let key = format!("orders/cut-{i}.jsonl");
        let seed = cell.next_seed();
        cell.env.put(&key, orders(30, seed)).await;
        let ingestor = cell.env.ingestor().await;
        let _ = tokio::time::timeout(cut(ms), cell.env.ingest(&ingestor, &key)).await;
        let r = cell.env.ingest(&ingestor, &key).await.unwrap();
        assert!(
            matches!(r.status, Status::Committed | Status::Duplicate),
            "{ms} ms: {r:?}"
        );
        cell.expected_rows += 30;
        let p = cell.processor(None).await;
        for name in [APPEND, AGG] {
            let _ = tokio::time::timeout(cut(ms), p.run(name, soon())).await;
        }
        let m = cell.maintainer(None).await;
        let compact = Options {
            compact: true,
            ..opts()
        };
        let _ = tokio::time::timeout(cut(ms), m.run("orders", &compact)).await;
    }
    cell.check().await;
    cell.check_readers();
}
