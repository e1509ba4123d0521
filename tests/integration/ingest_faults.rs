//! Data-loss faults at ingest: object versions, overwrites between reads, slow writes under
//! contention, column ids after a drop, and duplicates older than the retained history.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arrow::array::{Array, StringArray};
use floe::commit::Committer;
use floe::event::ObjectRef;
use floe::ingest::{Ingestor, Status};
use floe::store::{ObjectStore, OpenedObject, Version};
use iceberg::Catalog;
use tokio::io::{AsyncRead, ReadBuf};

use crate::faults::{faulty, Fault};
use crate::harness::{orders, TestEnv};

fn with_field(text: &str, field: &str, value: &str) -> String {
    text.lines()
        .map(|l| format!("{},\"{field}\":{value}}}\n", l.trim_end_matches('}')))
        .collect()
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

/// Every source-object identity recorded in the table's snapshot summaries.
async fn identities(catalog: &dyn Catalog, env: &TestEnv) -> Vec<String> {
    let table = catalog.load_table(&env.ident()).await.unwrap();
    let mut ids = Vec::new();
    for s in table.metadata().snapshots() {
        if let Some(list) = s
            .summary()
            .additional_properties
            .get(floe::summary::SOURCE_OBJECTS)
        {
            ids.extend(serde_json::from_str::<Vec<String>>(list).unwrap());
        }
    }
    ids
}

/// An ingestor over `store` (and the swap wrapped by `wrap`).
async fn ingestor_over(
    env: &TestEnv,
    config: floe::config::Config,
    store: Arc<dyn ObjectStore>,
    wrap: impl FnOnce(Arc<dyn floe::catalog::PointerSwap>) -> Arc<dyn floe::catalog::PointerSwap>,
) -> Ingestor {
    let _ = env;
    let catalog = floe::catalog::connect(&config).await.unwrap();
    let swap = floe::catalog::pointer_swap(&config).await.unwrap();
    Ingestor::with_parts(config, Committer::new(catalog, wrap(swap)), store)
        .await
        .unwrap()
}

async fn s3_store() -> Arc<dyn ObjectStore> {
    Arc::new(floe::store::S3Store::new(crate::harness::s3().await))
}

// ---------------------------------------------------------------------------------------------
// #15.4: versioned buckets

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_event_ingests_exactly_that_version() {
    let env = TestEnv::new("sqlite").await;
    env.s3
        .put_bucket_versioning()
        .bucket(&env.bucket)
        .versioning_configuration(
            aws_sdk_s3::types::VersioningConfiguration::builder()
                .status(aws_sdk_s3::types::BucketVersioningStatus::Enabled)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let key = "orders/versioned.jsonl";
    let mut versions = Vec::new();
    for (n, seed) in [(50, 1u64), (30, 2)] {
        let out = env.put_version(key, orders(n, seed)).await;
        versions.push(out.version_id().unwrap().to_string());
    }
    // A delete marker on top: the key has no current version, its versions still exist.
    env.s3
        .delete_object()
        .bucket(&env.bucket)
        .key(key)
        .send()
        .await
        .unwrap();
    let ingestor = env.ingestor().await;
    let event = |v: &str| ObjectRef {
        version_id: Some(v.to_string()),
        ..env.object(key)
    };
    // The newer version's event first, then the older one's.
    let second = ingestor.ingest(&event(&versions[1]), deadline()).await;
    let second = second.unwrap();
    assert_eq!(
        (second.status, second.records_committed),
        (Status::Committed, 30),
        "{second:?}"
    );
    let first = ingestor
        .ingest(&event(&versions[0]), deadline())
        .await
        .unwrap();
    assert_eq!(
        (first.status, first.records_committed),
        (Status::Committed, 50),
        "{first:?}"
    );
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 80);
    let ids = identities(ingestor.catalog().as_ref(), &env).await;
    for v in &versions {
        let id = format!("s3://{}/{key}#{v}", env.bucket);
        assert_eq!(
            ids.iter().filter(|i| **i == id).count(),
            1,
            "{id} in {ids:?}"
        );
    }
    for v in &versions {
        let again = ingestor.ingest(&event(v), deadline()).await.unwrap();
        assert_eq!(again.status, Status::Duplicate, "{again:?}");
    }
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 80);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_whose_etag_was_overwritten_is_superseded_not_ingested_as_the_new_content() {
    let env = TestEnv::new("sqlite").await;
    let key = "orders/overwritten.jsonl";
    let mut etags = Vec::new();
    for (n, seed) in [(20, 3u64), (25, 4)] {
        let out = env.put_version(key, orders(n, seed)).await;
        etags.push(out.e_tag().unwrap().trim_matches('"').to_string());
    }
    let ingestor = env.ingestor().await;
    let event = |etag: &str| ObjectRef {
        etag: Some(etag.to_string()),
        ..env.object(key)
    };
    // A's event arrives after B overwrote A: A is gone, B has its own event.
    let a = ingestor
        .ingest(&event(&etags[0]), deadline())
        .await
        .unwrap();
    assert_eq!(a.status, Status::Superseded, "{a:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 0);
    let b = ingestor
        .ingest(&event(&etags[1]), deadline())
        .await
        .unwrap();
    assert_eq!(
        (b.status, b.records_committed),
        (Status::Committed, 25),
        "{b:?}"
    );
    let ids = identities(ingestor.catalog().as_ref(), &env).await;
    assert_eq!(ids, vec![format!("s3://{}/{key}#{}", env.bucket, etags[1])]);
}

// ---------------------------------------------------------------------------------------------
// #15.5: the schema-evolution re-read

/// Overwrites the object with `replacement` just before the second open (the re-read).
struct OverwriteOnReread {
    inner: Arc<dyn ObjectStore>,
    opens: AtomicU32,
    replacement: Vec<u8>,
}

#[async_trait::async_trait]
impl ObjectStore for OverwriteOnReread {
    async fn open(&self, bucket: &str, key: &str, version: &Version) -> floe::Result<OpenedObject> {
        if self.opens.fetch_add(1, Ordering::SeqCst) == 1 {
            self.inner
                .put(bucket, key, self.replacement.clone())
                .await?;
        }
        self.inner.open(bucket, key, version).await
    }

    async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) -> floe::Result<()> {
        self.inner.put(bucket, key, body).await
    }

    async fn put_file(&self, bucket: &str, key: &str, path: &std::path::Path) -> floe::Result<()> {
        self.inner.put_file(bucket, key, path).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overwrite_between_the_two_reads_of_an_evolving_object_commits_nothing() {
    let env = TestEnv::new("sqlite").await;
    let key = "orders/evolving.jsonl";
    // A brings a new field (so it is read twice); B replaces it between the reads.
    env.put(key, with_field(&orders(12, 5), "coupon", "\"XMAS\""))
        .await;
    let a_etag = env
        .s3
        .head_object()
        .bucket(&env.bucket)
        .key(key)
        .send()
        .await
        .unwrap()
        .e_tag()
        .unwrap()
        .trim_matches('"')
        .to_string();
    let b_text = with_field(&orders(7, 6), "coupon", "\"EASTER\"");
    let store = Arc::new(OverwriteOnReread {
        inner: s3_store().await,
        opens: AtomicU32::new(0),
        replacement: b_text.clone().into_bytes(),
    });
    let racing = ingestor_over(&env, env.config.clone(), store, |s| s).await;
    let result = env.ingest(&racing, key).await;
    let a_id = format!("s3://{}/{key}#{a_etag}", env.bucket);
    let ids = identities(racing.catalog().as_ref(), &env).await;
    assert!(!ids.contains(&a_id), "B's rows committed as A: {ids:?}");
    let e = result.expect_err("the re-read saw another object: must not commit");
    assert!(e.is_retryable(), "{e}");
    assert_eq!(e.kind(), floe::ErrorKind::Superseded, "{e}");
    assert_eq!(env.count_rows(racing.catalog().as_ref()).await, 0);
    // The redelivery starts over and ingests B under B's identity.
    let healthy = env.ingestor().await;
    let r = env.ingest(&healthy, key).await.unwrap();
    assert_eq!(
        (r.status, r.records_committed),
        (Status::Committed, 7),
        "{r:?}"
    );
    let ids = identities(healthy.catalog().as_ref(), &env).await;
    assert_eq!(ids.len(), 1);
    assert!(!ids.contains(&a_id), "{ids:?}");
    let batches = env.scan_all(healthy.catalog().as_ref()).await;
    let coupons: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name("coupon").unwrap();
            let c = c.as_any().downcast_ref::<StringArray>().unwrap();
            c.iter().flatten().map(str::to_string).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(coupons, vec!["EASTER".to_string(); 7]);
}

// ---------------------------------------------------------------------------------------------
// #15.8: the commit window starts when the commit starts

/// Delays the first read of every body (a slow download of a large object).
struct SlowBody {
    inner: Arc<dyn ObjectStore>,
    delay: Duration,
}

struct Delayed {
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    inner: Pin<Box<dyn AsyncRead + Send>>,
}

impl AsyncRead for Delayed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(s) = self.sleep.as_mut() {
            if s.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        self.inner.as_mut().poll_read(cx, buf)
    }
}

#[async_trait::async_trait]
impl ObjectStore for SlowBody {
    async fn open(&self, bucket: &str, key: &str, version: &Version) -> floe::Result<OpenedObject> {
        let o = self.inner.open(bucket, key, version).await?;
        Ok(OpenedObject {
            meta: o.meta,
            body: Box::pin(Delayed {
                sleep: Some(Box::pin(tokio::time::sleep(self.delay))),
                inner: o.body,
            }),
        })
    }

    async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) -> floe::Result<()> {
        self.inner.put(bucket, key, body).await
    }

    async fn put_file(&self, bucket: &str, key: &str, path: &std::path::Path) -> floe::Result<()> {
        self.inner.put_file(bucket, key, path).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_write_still_gets_its_whole_commit_window() {
    let env = TestEnv::new("sqlite").await;
    let mut config = env.config.clone();
    config.ingest.commit_timeout_seconds = 1;
    let store = Arc::new(SlowBody {
        inner: s3_store().await,
        delay: Duration::from_millis(2500),
    });
    // Writing takes longer than the commit window, then the first two commits meet conflicts.
    let ingestor = ingestor_over(&env, config, store, faulty(Fault::Conflicts)).await;
    env.put("orders/large.jsonl", orders(40, 7)).await;
    let r = env.ingest(&ingestor, "orders/large.jsonl").await;
    let r = r.expect("a slow write must not use up the commit window");
    assert_eq!((r.status, r.attempts), (Status::Committed, 3), "{r:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 40);
}

// ---------------------------------------------------------------------------------------------
// #15.9: new column ids above last-column-id

/// Drops `column` from the table with PyIceberg (another engine).
fn drop_column_with_pyiceberg(env: &TestEnv, column: &str) {
    env.pyiceberg_run(
        "orders",
        &format!("with t.update_schema() as u:\n    u.delete_column(\"{column}\")"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_column_never_reuses_the_id_of_a_dropped_one() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    env.put(
        "orders/coupon.jsonl",
        with_field(&orders(10, 8), "coupon", "\"XMAS\""),
    )
    .await;
    let r = env.ingest(&ingestor, "orders/coupon.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    drop_column_with_pyiceberg(&env, "coupon");
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let last = table.metadata().last_column_id();
    assert!(table
        .metadata()
        .current_schema()
        .field_by_name("coupon")
        .is_none());
    assert!(table.metadata().current_schema().highest_field_id() < last);

    env.put(
        "orders/promo.jsonl",
        with_field(&orders(5, 9), "promo", "\"SPRING\""),
    )
    .await;
    let fresh = env.ingestor().await;
    let r = env.ingest(&fresh, "orders/promo.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    let table = fresh.catalog().load_table(&env.ident()).await.unwrap();
    let promo = table
        .metadata()
        .current_schema()
        .field_by_name("promo")
        .unwrap()
        .id;
    assert!(
        promo > last,
        "promo got id {promo}, last-column-id was {last}"
    );
    let mut values = Vec::new();
    for b in env.scan_all(fresh.catalog().as_ref()).await {
        let c = b.column_by_name("promo").unwrap();
        let c = c.as_any().downcast_ref::<StringArray>().unwrap();
        values.extend(c.iter().map(|v| v.map(str::to_string)));
    }
    assert_eq!(values.len(), 15);
    assert_eq!(
        values
            .iter()
            .filter(|v| v.as_deref() == Some("XMAS"))
            .count(),
        0,
        "the dropped column's values reappeared under the new name"
    );
    assert_eq!(
        values
            .iter()
            .filter(|v| v.as_deref() == Some("SPRING"))
            .count(),
        5
    );
}

// ---------------------------------------------------------------------------------------------
// #15.11: duplicates older than the retained history

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_its_snapshot_expired_is_still_a_duplicate() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    env.put("orders/old.jsonl", orders(33, 10)).await;
    env.put("orders/newer.jsonl", orders(11, 11)).await;
    for key in ["orders/old.jsonl", "orders/newer.jsonl"] {
        let r = env.ingest(&ingestor, key).await.unwrap();
        assert_eq!(r.status, Status::Committed, "{r:?}");
    }
    let expire_all = floe::maintain::Options {
        expire_older_than: Some(Duration::ZERO),
        dedup_window: Duration::ZERO,
        retain_last: Some(1),
        ..crate::maintain_opts(false, true, false)
    };
    let m = env.maintainer().await.run("orders", &expire_all).await;
    assert!(m.unwrap().snapshots_expired >= 1);
    let ids = identities(ingestor.catalog().as_ref(), &env).await;
    assert!(
        !ids.iter().any(|i| i.contains("orders/old.jsonl")),
        "the summary naming old.jsonl must be gone: {ids:?}"
    );
    // Every ingest file carries exact `_source` bounds (the durable check prunes by them).
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let source_id = table
        .metadata()
        .current_schema()
        .field_by_name("_source")
        .unwrap()
        .id;
    let mut bounded = 0;
    for mf in floe::snapshot::current_manifests(&table).await.unwrap() {
        for e in mf.load_manifest(table.file_io()).await.unwrap().entries() {
            let lo = e.data_file().lower_bounds().get(&source_id).cloned();
            let hi = e.data_file().upper_bounds().get(&source_id).cloned();
            assert!(lo.is_some() && lo == hi, "{lo:?} {hi:?}");
            bounded += 1;
        }
    }
    assert_eq!(bounded, 2);
    // The DLQ redrive, days later.
    let fresh = env.ingestor().await;
    let r = env.ingest(&fresh, "orders/old.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Duplicate, "{r:?}");
    assert_eq!(env.count_rows(fresh.catalog().as_ref()).await, 44);
    // Still one commit per object for a new object.
    env.put("orders/third.jsonl", orders(4, 12)).await;
    let r = env.ingest(&fresh, "orders/third.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    assert_eq!(env.count_rows(fresh.catalog().as_ref()).await, 48);
}

// ---------------------------------------------------------------------------------------------
// Replay of a key list: the read that tells a version id from an ETag

/// Fails the first `open` with a retryable storage error (a timeout's kind), then passes through.
struct FirstOpenFails {
    inner: Arc<dyn ObjectStore>,
    opens: AtomicU32,
}

#[async_trait::async_trait]
impl ObjectStore for FirstOpenFails {
    async fn open(&self, bucket: &str, key: &str, version: &Version) -> floe::Result<OpenedObject> {
        if self.opens.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(floe::Error::new(
                floe::ErrorKind::Storage,
                format!("GetObject s3://{bucket}/{key}: operation timed out"),
            )
            .with_retryable(true));
        }
        self.inner.open(bucket, key, version).await
    }

    async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) -> floe::Result<()> {
        self.inner.put(bucket, key, body).await
    }

    async fn put_file(&self, bucket: &str, key: &str, path: &std::path::Path) -> floe::Result<()> {
        self.inner.put_file(bucket, key, path).await
    }
}

/// Review helper-27 #3: a replay line naming an older version of a versioned object, whose
/// first read fails transiently, was guessed to name an ETag; the ingest then asked for that
/// "ETag", S3 refused it, and the object was reported superseded (skipped for good) although
/// the version exists. It must fail retryably instead, and a later replay commits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_version_whose_first_read_fails_is_retried_not_called_superseded() {
    use floe::ingest::replay::{Outcome, ReplayOptions};
    let env = TestEnv::new("sqlite").await;
    env.s3
        .put_bucket_versioning()
        .bucket(&env.bucket)
        .versioning_configuration(
            aws_sdk_s3::types::VersioningConfiguration::builder()
                .status(aws_sdk_s3::types::BucketVersioningStatus::Enabled)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let key = "orders/replayed.jsonl";
    let old = env.put_version(key, orders(20, 1)).await;
    let old = old.version_id().unwrap().to_string();
    env.put_version(key, orders(10, 2)).await;
    let line = format!("s3://{}/{key}#{old}\n", env.bucket);
    let options = ReplayOptions {
        wait: Duration::ZERO,
        ..Default::default()
    };
    let flaky = Arc::new(FirstOpenFails {
        inner: s3_store().await,
        opens: AtomicU32::new(0),
    });
    let ingestor = ingestor_over(&env, env.config.clone(), flaky, |s| s).await;
    let r = ingestor.replay_objects(&line, &options).await;
    let outcomes: Vec<(Outcome, Option<bool>)> = r
        .items
        .iter()
        .flat_map(|i| i.objects.iter().map(|o| (o.outcome, o.retryable)))
        .collect();
    assert_eq!(outcomes, [(Outcome::Failed, Some(true))], "{r:#?}");
    assert_eq!((r.replayed, r.skipped, r.failed), (0, 0, 1), "{r:#?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 0);
    // Run again (the store answers now): the named version lands, once.
    let again = ingestor.replay_objects(&line, &options).await;
    assert_eq!((again.replayed, again.failed), (1, 0), "{again:#?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 20);
    let ids = identities(ingestor.catalog().as_ref(), &env).await;
    assert_eq!(ids, vec![format!("s3://{}/{key}#{old}", env.bucket)]);
}
