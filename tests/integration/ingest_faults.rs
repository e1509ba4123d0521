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
            .get(floe::commit::SUMMARY_SOURCE_OBJECTS)
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
    wrap: impl FnOnce(Arc<dyn floe::swap::PointerSwap>) -> Arc<dyn floe::swap::PointerSwap>,
) -> Ingestor {
    let _ = env;
    let catalog = floe::catalog::connect(&config).await.unwrap();
    let swap = floe::swap::from_config(&config).await.unwrap();
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
        let out = env
            .s3
            .put_object()
            .bucket(&env.bucket)
            .key(key)
            .body(orders(n, seed).into_bytes().into())
            .send()
            .await
            .unwrap();
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
        let out = env
            .s3
            .put_object()
            .bucket(&env.bucket)
            .key(key)
            .body(orders(n, seed).into_bytes().into())
            .send()
            .await
            .unwrap();
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

