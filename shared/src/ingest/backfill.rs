//! Backfill: objects that landed before floe ran (or that a replay names) through the same code
//! path as live data, exactly once, in batches.
//!
//! [`Ingestor::plan_backfill`] lists a prefix (ListObjectsV2, every page), keeps the routed
//! objects in the time range, and leaves out those already in their table. "Already in" is read
//! once per table, not once per object: the table's own rows carry their source identity in
//! `_source` (`s3://bucket/key#version`), durable beyond snapshot expiration, so one scan of that
//! one column gives every committed object version. An object whose key is committed under
//! another version (an overwrite, or a versioned bucket whose listing names no version) stays in
//! the plan: the ingest path's own duplicate check decides it, as for a redelivery.
//!
//! [`Ingestor::run_backfill`] hands the plan to [`Ingestor::ingest_batch`] in batches of one
//! table's objects (one commit per batch), several batches at a time. A run that is interrupted
//! is resumed by running it again: the plan leaves out what was committed, and a batch whose
//! commit landed with its answer lost is recognised by the ingest path's check.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use super::{Ingestor, ObjectReport, Status};
use crate::error::{Error, Result};
use crate::event::ObjectRef;
use crate::schema::SOURCE;

/// What a backfill covers and how it runs.
#[derive(Debug, Clone)]
pub struct BackfillOptions {
    /// Only objects last modified at or after this.
    pub since: Option<DateTime<Utc>>,
    /// Only objects last modified before this.
    pub until: Option<DateTime<Utc>>,
    /// Objects per batch (one commit each).
    pub batch_objects: usize,
    /// Batches in flight at once.
    pub concurrency: usize,
}

impl Default for BackfillOptions {
    fn default() -> Self {
        Self {
            since: None,
            until: None,
            batch_objects: 50,
            concurrency: 4,
        }
    }
}

/// One object to ingest.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The object (with the ETag the listing gave: exactly that version is read).
    pub object: ObjectRef,
    /// Its table.
    pub table: String,
    /// Its size.
    pub size: u64,
}

/// Per table: what the listing found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TablePlan {
    /// Routed objects listed in the range.
    pub listed: u64,
    /// Of those, already committed (left out).
    pub committed: u64,
    /// To ingest.
    pub pending: u64,
    /// Bytes to ingest.
    pub pending_bytes: u64,
}

/// The objects a backfill will ingest.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BackfillPlan {
    /// Per table.
    pub tables: BTreeMap<String, TablePlan>,
    /// Objects outside every route (never ingested).
    pub unrouted: u64,
    /// Objects outside the time range.
    pub out_of_range: u64,
    /// Listing pages read (1,000 keys each).
    pub list_pages: u64,
    /// What to ingest, by table then key.
    #[serde(skip)]
    pub candidates: Vec<Candidate>,
}

impl BackfillPlan {
    /// The candidates as the items of a Step Functions Distributed Map manifest (a JSON array an
    /// `s3:getObject` ItemReader reads), in the shape the `s3:listObjectsV2` reader gives and the
    /// ingest function's map-batch payload takes: `Bucket`, `Key`, `Size`, `Etag` (quoted, as S3
    /// lists it) and `VersionId` when known. Ordered by table then key, so that `ItemBatcher`'s
    /// consecutive batches mostly hold one table each (one commit per batch).
    pub fn map_items(&self) -> Vec<serde_json::Value> {
        let mut items: Vec<&Candidate> = self.candidates.iter().collect();
        items.sort_by(|a, b| (&a.table, &a.object.key).cmp(&(&b.table, &b.object.key)));
        items
            .into_iter()
            .map(|c| {
                let mut item = serde_json::json!({
                    "Bucket": c.object.bucket,
                    "Key": c.object.key,
                    "Size": c.size,
                });
                if let Some(etag) = &c.object.etag {
                    item["Etag"] = serde_json::json!(format!("\"{etag}\""));
                }
                if let Some(v) = &c.object.version_id {
                    item["VersionId"] = serde_json::json!(v);
                }
                item
            })
            .collect()
    }
}

/// One finished batch, for progress.
#[derive(Debug, Clone, Default)]
pub struct BatchProgress {
    /// Objects handled.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Records committed.
    pub records: u64,
}

/// The result of a backfill.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BackfillReport {
    /// Objects committed by this run.
    pub committed: u64,
    /// Objects found committed already (by another delivery, or an earlier run).
    pub duplicates: u64,
    /// Objects whose every record was quarantined, that were unreadable as a whole, or that a
    /// `fail` data-quality check refused.
    pub quarantined_objects: u64,
    /// Objects that failed (retry the backfill: they are still pending).
    pub failed: u64,
    /// Objects refused otherwise (gone, superseded, unrouted).
    pub skipped: u64,
    /// Records read, committed and quarantined.
    pub records_in: u64,
    /// Records committed.
    pub records_committed: u64,
    /// Records quarantined.
    pub records_quarantined: u64,
    /// Bytes of the objects handled.
    pub bytes: u64,
    /// New snapshots (commits).
    pub commits: u64,
    /// Commit attempts beyond the first, per commit.
    pub retry_rate: f64,
    /// Wall time.
    pub seconds: f64,
    /// The first failures (object: error).
    pub errors: Vec<String>,
}

/// The committed object versions of a table, by `s3://bucket/key`: one scan of `_source`.
async fn committed_versions(
    ingestor: &Ingestor,
    table: &str,
) -> Result<HashMap<String, HashSet<String>>> {
    let ident = crate::catalog::table_ident(&ingestor.config, table)?;
    let t = ingestor.committer.load(&ident).await?;
    let mut out: HashMap<String, HashSet<String>> = HashMap::new();
    if t.metadata().current_snapshot().is_none()
        || t.metadata()
            .current_schema()
            .field_by_name(SOURCE)
            .is_none()
    {
        return Ok(out);
    }
    let what = || format!("reading {SOURCE} of {ident}");
    let mut stream = t
        .scan()
        .select([SOURCE])
        .build()
        .map_err(|e| Error::iceberg(what(), e))?
        .to_arrow()
        .await
        .map_err(|e| Error::iceberg(what(), e).with_retryable(true))?;
    let mut last = String::new();
    while let Some(batch) = stream
        .try_next()
        .await
        .map_err(|e| Error::iceberg(what(), e).with_retryable(true))?
    {
        let Some(col) = batch.column_by_name(SOURCE) else {
            continue;
        };
        let Ok(strings) = arrow::compute::cast(col, &arrow_schema::DataType::Utf8) else {
            continue;
        };
        let Some(strings) = strings.as_any().downcast_ref::<arrow::array::StringArray>() else {
            continue;
        };
        // Rows of one object are adjacent: look each run up once.
        for id in strings.iter().flatten() {
            if id == last {
                continue;
            }
            last.clear();
            last.push_str(id);
            if let Some((object, version)) = id.rsplit_once('#') {
                out.entry(object.to_string())
                    .or_default()
                    .insert(version.to_string());
            }
        }
    }
    Ok(out)
}

impl Ingestor {
    /// Lists `s3://bucket/prefix` and plans the routed objects in the range that are not in
    /// their table yet.
    pub async fn plan_backfill(
        &self,
        bucket: &str,
        prefix: &str,
        options: &BackfillOptions,
    ) -> Result<BackfillPlan> {
        let listed = self.store.list(bucket, prefix).await?;
        let mut plan = BackfillPlan {
            list_pages: (listed.len() as u64).div_ceil(1000).max(1),
            ..Default::default()
        };
        let mut by_table: BTreeMap<String, Vec<crate::store::Listed>> = BTreeMap::new();
        for o in listed {
            if o.key.ends_with('/') {
                continue;
            }
            let in_range = options.since.is_none_or(|s| o.last_modified >= s)
                && options.until.is_none_or(|u| o.last_modified < u);
            if !in_range {
                plan.out_of_range += 1;
                continue;
            }
            match self.config.route(bucket, &o.key) {
                Some(route) => by_table.entry(route.table.clone()).or_default().push(o),
                None => plan.unrouted += 1,
            }
        }
        for (table, objects) in by_table {
            let committed = committed_versions(self, &table).await?;
            let tp = plan.tables.entry(table.clone()).or_default();
            for o in objects {
                tp.listed += 1;
                let uri = format!("s3://{bucket}/{}", o.key);
                if committed
                    .get(&uri)
                    .is_some_and(|versions| versions.contains(&o.etag))
                {
                    tp.committed += 1;
                    continue;
                }
                tp.pending += 1;
                tp.pending_bytes += o.size;
                let mut object = ObjectRef::new(bucket, o.key.as_str());
                object.size = Some(o.size as i64);
                object.etag = Some(o.etag).filter(|e| !e.is_empty());
                plan.candidates.push(Candidate {
                    object,
                    table: table.clone(),
                    size: o.size,
                });
            }
        }
        Ok(plan)
    }

    /// Ingests the plan's objects in batches of one table (one commit each), `concurrency`
    /// batches at a time; `progress` is called after each batch.
    pub async fn run_backfill(
        &self,
        plan: &BackfillPlan,
        options: &BackfillOptions,
        progress: &(dyn Fn(&BatchProgress) + Sync),
    ) -> BackfillReport {
        let started = Instant::now();
        let mut batches: Vec<Vec<&Candidate>> = Vec::new();
        let per = options.batch_objects.max(1);
        for c in &plan.candidates {
            match batches.last_mut() {
                Some(b) if b.len() < per && b[0].table == c.table => b.push(c),
                _ => batches.push(vec![c]),
            }
        }
        // Each batch gets the commit window a Lambda invocation would have.
        let window =
            Duration::from_secs(self.config.ingest.commit_timeout_seconds.saturating_mul(2) + 600);
        let results: Vec<(Vec<&Candidate>, Vec<Result<ObjectReport>>)> =
            futures::stream::iter(batches.into_iter().map(|batch| async move {
                let objs: Vec<ObjectRef> = batch.iter().map(|c| c.object.clone()).collect();
                let out = self.ingest_batch(&objs, Instant::now() + window).await;
                let p = BatchProgress {
                    objects: batch.len() as u64,
                    bytes: batch.iter().map(|c| c.size).sum(),
                    records: out.iter().flatten().map(|r| r.records_committed).sum(),
                };
                progress(&p);
                (batch, out)
            }))
            .buffer_unordered(options.concurrency.max(1))
            .collect()
            .await;
        let mut report = BackfillReport::default();
        let mut commits: HashMap<(String, i64), u32> = HashMap::new();
        for (batch, outcomes) in results {
            for (c, outcome) in batch.iter().zip(outcomes) {
                report.bytes += c.size;
                match outcome {
                    Ok(r) => {
                        report.records_in += r.records_in;
                        report.records_committed += r.records_committed;
                        report.records_quarantined += r.records_quarantined;
                        match r.status {
                            Status::Committed => {
                                report.committed += 1;
                                if let Some(s) = r.snapshot_id {
                                    let a = commits.entry((r.table.clone(), s)).or_default();
                                    *a = (*a).max(r.attempts);
                                }
                            }
                            Status::Duplicate => report.duplicates += 1,
                            Status::AllQuarantined
                            | Status::Unreadable
                            | Status::ContractFailed => report.quarantined_objects += 1,
                            Status::Unrouted | Status::Missing | Status::Superseded => {
                                report.skipped += 1
                            }
                        }
                    }
                    Err(e) => {
                        report.failed += 1;
                        if report.errors.len() < 20 {
                            report.errors.push(format!("{}: {e}", c.object.uri()));
                        }
                    }
                }
            }
        }
        report.commits = commits.len() as u64;
        let extra: u64 = commits
            .values()
            .map(|a| u64::from(a.saturating_sub(1)))
            .sum();
        report.retry_rate = if report.commits > 0 {
            extra as f64 / report.commits as f64
        } else {
            0.0
        };
        report.seconds = started.elapsed().as_secs_f64();
        report
    }
}
