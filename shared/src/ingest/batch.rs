//! Micro-batching: the objects of one Lambda payload (an SQS batch, a Step Functions Distributed
//! Map batch, a direct invocation whose `Records` list several objects) that go to the same table commit together, in one snapshot
//! whose summary names every one.
//!
//! Each object is still routed, checked for duplicates, decoded, written and quarantined on its
//! own ([`Ingestor::prepare`]): its report, files and quarantine object are its own, and its
//! data files hold only its rows (so the `_source` bounds of a file name one object, as the
//! durable duplicate check needs). Only the commit is shared. Its plan walks the table's
//! history for every member, as the single-object plan does for one: members found committed
//! (another delivery won) are left out, the rest go in, and `floe.source-objects` lists exactly
//! those. An object whose input changes the table's schema commits alone, first.
//!
//! After the commit the landed snapshot's own summary says which members it holds (an earlier
//! attempt whose answer was lost may be the one that landed). A member is acknowledged only
//! when it is proven in the table: named by the landed snapshot, or found committed by the plan.
//! Files are deleted only for members proven outside the landed commit; on any unknown outcome
//! every file stays and the member's message is retried (its redelivery deduplicates).
//!
//! Objects are prepared one after another, so the payload's preparation must not eat the commit
//! window: an object is only started while its expected preparation plus a whole commit window
//! still fits before the Lambda's deadline; the others are left for retry. The commits of
//! different tables run side by side, so one window covers them all.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::TableIdent;

use super::dedup::{walk_all, Sought, Walk};
use super::report::{batch_summary, nothing_added};
use super::{Ingestor, ObjectReport, Prepared, Stage, Status};
use crate::commit::{metered, Found, Outcome, Plan, Skipped};
use crate::error::{Error, ErrorKind, Result};
use crate::event::ObjectRef;
use crate::snapshot::Change;
use crate::summary::{Usage, SOURCE_MODIFIED_MS, SOURCE_OBJECTS, WRITER_ID};

/// Most objects in one commit. Every snapshot's summary lists its objects and every later
/// metadata.json carries the summaries of the retained snapshots, so the list is kept short
/// (100 identities are ~20 KiB); a larger payload commits in chunks.
const MAX_OBJECTS_PER_COMMIT: usize = 100;

/// What the last evaluation of a batch plan decided for one member.
#[derive(Debug, Clone)]
enum Decision {
    /// In the change.
    Take,
    /// Already committed (by another delivery).
    Found(Found),
}

/// One member as the plan sees it.
struct Member {
    id: String,
    /// The object's LastModified (epoch ms).
    modified_ms: i64,
    not_before_ms: i64,
    proven: Option<i64>,
    files: Vec<iceberg::spec::DataFile>,
    /// The partition spec its files were written with.
    spec_id: i32,
    report: ObjectReport,
}

/// What the commit proved about one member.
enum Fate {
    /// Named by the snapshot that landed.
    Landed,
    /// Committed by another delivery (the plan found it); `proven_outside`: the landed snapshot
    /// was read and does not hold it, so its files are referenced by nothing.
    Found { found: Found, proven_outside: bool },
    /// Proven not committed (the landed snapshot was read and does not name it).
    Absent,
    /// Not provable either way (the landed snapshot's summary could not be read).
    Unknown,
}

impl Ingestor {
    /// Ingests the objects of one payload, committing those of the same table together. The
    /// results are in the order of `objs`, one per object, with the same meaning as
    /// [`Ingestor::ingest`]'s. With `[ingest] batch_commits = false` each object commits alone.
    pub async fn ingest_batch(
        &self,
        objs: &[ObjectRef],
        deadline: Instant,
    ) -> Vec<Result<ObjectReport>> {
        if !self.config.ingest.batch_commits || objs.len() < 2 {
            let mut out = Vec::with_capacity(objs.len());
            for obj in objs {
                out.push(self.ingest(obj, deadline).await);
            }
            return out;
        }
        let mut results: Vec<Option<Result<ObjectReport>>> = objs.iter().map(|_| None).collect();
        let mut groups: BTreeMap<String, Vec<(usize, Box<Prepared>)>> = BTreeMap::new();
        // The same version delivered twice in one payload: the copy follows the first. Known
        // from the event when it names the version, else from the identity read.
        let mut first_event: HashMap<(String, String, String), usize> = HashMap::new();
        let mut first_of: HashMap<String, usize> = HashMap::new();
        // (copy, first, the copy's own preparation time when it was prepared).
        let mut copies: Vec<(usize, usize, u64)> = Vec::new();
        let window = Duration::from_secs(self.config.ingest.commit_timeout_seconds);
        let mut slowest = Duration::ZERO;
        let mut out_of_time = false;
        for (i, obj) in objs.iter().enumerate() {
            if let Some(version) = obj.version_id.clone().or_else(|| obj.etag.clone()) {
                let key = (obj.bucket.clone(), obj.key.clone(), version);
                if let Some(&first) = first_event.get(&key) {
                    copies.push((i, first, 0));
                    continue;
                }
                first_event.insert(key, i);
            }
            // The commit window starts at the commit: start another object only while its
            // preparation (as long as the slowest so far) and then its table's commits still
            // fit before the deadline. The tables' commits run side by side, in one window, but
            // the chunks of one table run one after another, a window each: the object may
            // join the largest group. The first object always starts.
            if i > 0 {
                let largest = groups.values().map(Vec::len).max().unwrap_or(0);
                let windows = (largest + 1).div_ceil(MAX_OBJECTS_PER_COMMIT) as u32;
                out_of_time |= Instant::now() + slowest + window * windows > deadline;
            }
            if out_of_time {
                results[i] = Some(Err(left_for_retry(obj)));
                continue;
            }
            let t0 = Instant::now();
            // Boxed: the preparation's state (decode ‖ write, evolution, contracts) is large, and
            // a debug build's nested futures would otherwise overflow a 2 MiB thread stack.
            let prepared = Box::pin(self.prepare(obj)).await;
            slowest = slowest.max(t0.elapsed());
            let prepared = match prepared {
                Ok(Stage::Ready(p)) => p,
                Ok(Stage::Done(r)) => {
                    results[i] = Some(Ok(r));
                    continue;
                }
                // A schema that moved under a schema-changing object: the single path retries.
                Err(e) if e.kind() == ErrorKind::Stale => {
                    results[i] = Some(self.ingest(obj, deadline).await);
                    continue;
                }
                Err(e) => {
                    results[i] = Some(Err(e));
                    continue;
                }
            };
            let id = prepared.source.id();
            if let Some(&first) = first_of.get(&id) {
                crate::write::delete_uncommitted(&prepared.table, &prepared.written.files).await;
                copies.push((i, first, prepared.report.compute_ms));
                continue;
            }
            first_of.insert(id, i);
            if prepared.evolved.is_some() {
                // Its files carry the new field ids: it commits alone, with its schema change.
                let t0 = Instant::now();
                results[i] = Some(self.commit_alone(*prepared, deadline, None).await);
                slowest = slowest.max(t0.elapsed());
            } else {
                groups
                    .entry(prepared.ident.to_string())
                    .or_default()
                    .push((i, prepared));
            }
        }
        // One commit per table, the tables side by side (each in its own commit window).
        let commits = groups
            .into_values()
            .map(|members| self.commit_chunks(members, deadline));
        for (i, r) in futures::future::join_all(commits)
            .await
            .into_iter()
            .flatten()
        {
            results[i] = Some(r);
        }
        for (copy, first, prepared_ms) in copies {
            results[copy] = Some(match &results[first] {
                Some(Ok(r)) => {
                    let mut d = r.clone();
                    if d.status == Status::Committed {
                        d.status = Status::Duplicate;
                    }
                    // Its own time only: the first's is the first's.
                    d.compute_ms = prepared_ms;
                    Ok(nothing_added(d))
                }
                Some(Err(e)) => Err(copy_error(e)),
                None => Err(Error::new(ErrorKind::Internal, "batch member not settled")),
            });
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::new(ErrorKind::Internal, "not settled"))))
            .collect()
    }

    /// Commits one prepared object alone (from `base` when given); a `Stale` answer (the schema
    /// moved differently) starts the object over on the single path, which retries.
    async fn commit_alone(
        &self,
        p: Prepared,
        deadline: Instant,
        base: Option<Table>,
    ) -> Result<ObjectReport> {
        let obj = p.obj.clone();
        match Box::pin(self.commit_one(p, deadline, base)).await {
            Err(e) if e.kind() == ErrorKind::Stale => self.ingest(&obj, deadline).await,
            other => other,
        }
    }

    /// The prepared objects of one table in commits of at most [`MAX_OBJECTS_PER_COMMIT`]. A
    /// chunk after the first starts from the version the one before it left (the members were
    /// prepared on an older one: from there its first attempt could only conflict).
    async fn commit_chunks(
        &self,
        mut members: Vec<(usize, Box<Prepared>)>,
        deadline: Instant,
    ) -> Vec<(usize, Result<ObjectReport>)> {
        let mut out = Vec::with_capacity(members.len());
        let mut base = None;
        while !members.is_empty() {
            let rest = members.split_off(members.len().min(MAX_OBJECTS_PER_COMMIT));
            let ident = members[0].1.ident.clone();
            out.extend(Box::pin(self.commit_group(members, deadline, base)).await);
            members = rest;
            base = match members.is_empty() {
                true => None,
                // The committer's cached version while the catalog still names it.
                false => self.committer.load(&ident).await.ok(),
            };
        }
        out
    }

    /// One commit for the prepared objects of one table (from `base` when given, else from the
    /// newest version a member was prepared on); each member's result.
    async fn commit_group(
        &self,
        mut prepared: Vec<(usize, Box<Prepared>)>,
        deadline: Instant,
        base: Option<Table>,
    ) -> Vec<(usize, Result<ObjectReport>)> {
        if prepared.len() == 1 {
            let (i, p) = prepared.remove(0);
            // Its own preparation and its own commit, like a group's members.
            return vec![(i, self.commit_alone(*p, deadline, base).await)];
        }
        let limits = self.commit_limits(deadline);
        let skew_ms = limits.skew.as_millis() as i64;
        let ident: TableIdent = prepared[0].1.ident.clone();
        // The newest version known: the first attempt's base.
        let base = prepared
            .iter()
            .map(|(_, p)| &p.table)
            .chain(base.as_ref())
            .max_by_key(|t| t.metadata().last_sequence_number())
            .cloned();
        let members: Vec<Member> = prepared
            .iter()
            .map(|(_, p)| Member {
                id: p.source.id(),
                modified_ms: p.source.modified_ms,
                not_before_ms: p.source.modified_ms - skew_ms,
                proven: p.proven,
                files: p.written.files.clone(),
                spec_id: p.table.metadata().default_partition_spec_id(),
                report: p.report.clone(),
            })
            .collect();
        let writer_id = uuid::Uuid::now_v7().to_string();
        let decisions: Arc<Mutex<Vec<Decision>>> = Arc::default();
        // The members' preparations (one after another) plus this commit: the batch's work.
        let prepared_usage = prepared
            .iter()
            .fold(Usage::default(), |acc, (_, p)| acc.plus(&p.prepared));
        let meter = self.commit_meter(prepared_usage);
        let plan = metered(
            meter.clone(),
            batch_plan(members, writer_id.clone(), decisions.clone()),
        );
        let commit_started = Instant::now();
        let outcome = meter
            .run(self.committer.commit_from(&ident, base, &limits, plan))
            .await;
        let last: Vec<Decision> = decisions.lock().map(|d| d.clone()).unwrap_or_default();
        let found_in_last = |k: usize| match last.get(k) {
            Some(Decision::Found(f)) => Some(f.clone()),
            _ => None,
        };
        let mut out = Vec::with_capacity(prepared.len());
        match outcome {
            Ok(Outcome::Committed {
                snapshot_id,
                attempts,
                ..
            }) => {
                // Which members the landed snapshot holds: its own summary says (the landed
                // attempt may be an earlier one than the last plan evaluation).
                let held = match snapshot_id {
                    Some(id) => self.snapshot_objects(&ident, id).await,
                    None => None,
                };
                for (k, (i, p)) in prepared.into_iter().enumerate() {
                    let fate = match (&held, found_in_last(k)) {
                        (Some(ids), _) if ids.contains(&p.source.id()) => Fate::Landed,
                        (held, Some(found)) => Fate::Found {
                            found,
                            proven_outside: held.is_some(),
                        },
                        (Some(_), None) => Fate::Absent,
                        (None, None) => Fate::Unknown,
                    };
                    out.push((
                        i,
                        settle_member(*p, fate, snapshot_id, attempts, &ident).await,
                    ));
                }
                share_commit(&mut out, commit_started.elapsed());
            }
            Ok(Outcome::Skipped(_)) => {
                // Every member was found committed, and no attempt of ours that added a snapshot
                // is unknown (the commit loop reports a skip only then): our files are
                // referenced by nothing.
                for (k, (i, p)) in prepared.into_iter().enumerate() {
                    let fate = match found_in_last(k) {
                        Some(found) => Fate::Found {
                            found,
                            proven_outside: true,
                        },
                        None => Fate::Absent,
                    };
                    out.push((i, settle_member(*p, fate, None, 0, &ident).await));
                }
                share_commit(&mut out, commit_started.elapsed());
            }
            // Nothing was committed (the commit loop reports Stale only when no attempt is
            // unknown): these files can go, and each member starts over alone, where the early
            // check asks the rows once the summaries were expired. Each one is read, written and
            // committed again, so the deadline rule of the payload applies: a member starts only
            // while its ingest (as long as the slowest so far) and a whole commit window still
            // fit; the others are left for retry.
            Err(e) if e.kind() == ErrorKind::Stale => {
                tracing::info!(table = %ident, error = %e, "batch commit stale; committing its objects one by one");
                for (_, p) in &prepared {
                    crate::write::delete_uncommitted(&p.table, &p.written.files).await;
                }
                let window = Duration::from_secs(self.config.ingest.commit_timeout_seconds);
                let mut slowest = Duration::ZERO;
                for (i, p) in prepared {
                    if Instant::now() + slowest + window > deadline {
                        out.push((i, Err(left_for_retry(&p.obj))));
                        continue;
                    }
                    let t0 = Instant::now();
                    out.push((i, self.ingest(&p.obj, deadline).await));
                    slowest = slowest.max(t0.elapsed());
                }
            }
            // Possibly unknown: every file stays; every member's message is retried.
            Err(e) => {
                for (i, _) in prepared {
                    out.push((i, Err(copy_error(&e))));
                }
            }
        }
        out
    }

    /// The source objects a snapshot's summary names (None when it cannot be read).
    async fn snapshot_objects(
        &self,
        ident: &TableIdent,
        snapshot_id: i64,
    ) -> Option<HashSet<String>> {
        let table = match self.committer.load(ident).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(table = %ident, snapshot = snapshot_id, error = %e, "cannot read the batch commit that landed");
                return None;
            }
        };
        let snap = table.metadata().snapshot_by_id(snapshot_id)?;
        let list = snap.summary().additional_properties.get(SOURCE_OBJECTS)?;
        serde_json::from_str::<Vec<String>>(list)
            .ok()
            .map(|v| v.into_iter().collect())
    }
}

/// One member's report from what the commit proved about it. Acknowledged (Ok) only when it is
/// proven in the table; files deleted only when proven unreferenced.
async fn settle_member(
    p: Prepared,
    fate: Fate,
    snapshot_id: Option<i64>,
    attempts: u32,
    ident: &TableIdent,
) -> Result<ObjectReport> {
    let mut r = p.report;
    r.millis = p.started.elapsed().as_millis() as u64;
    match fate {
        Fate::Landed => {
            r.snapshot_id = snapshot_id;
            r.attempts = attempts;
            if let Some(hi) = p.written.et_max {
                r.freshness_seconds =
                    Some((chrono::Utc::now().timestamp_micros() - hi) as f64 / 1e6);
            }
            Ok(r)
        }
        Fate::Found {
            found,
            proven_outside,
        } => {
            // Another delivery won. Our files go only if no commit of ours can hold them.
            if proven_outside {
                crate::write::delete_uncommitted(&p.table, &p.written.files).await;
            }
            r.status = Status::Duplicate;
            r.snapshot_id = Some(found.snapshot_id);
            Ok(nothing_added(r))
        }
        Fate::Absent => {
            crate::write::delete_uncommitted(&p.table, &p.written.files).await;
            Err(Error::new(
                ErrorKind::CommitConflict,
                format!(
                    "{}: not in the batch commit to {ident} that landed; retried",
                    r.object
                ),
            )
            .with_retryable(true))
        }
        Fate::Unknown => Err(Error::new(
            ErrorKind::CommitUnknown,
            format!(
                "{}: the batch commit to {ident} landed but its summary could not be read; \
                 its files are kept and the redelivery checks again",
                r.object
            ),
        )
        .with_retryable(true)),
    }
}

/// Splits a batch commit's time (its attempts and settling its members) evenly over the members
/// it settled: each report's compute share is its own preparation plus its part of the commit.
fn share_commit(out: &mut [(usize, Result<ObjectReport>)], took: Duration) {
    let n = out.len().max(1) as u64;
    let ms = took.as_millis() as u64;
    for (k, (_, r)) in out.iter_mut().enumerate() {
        if let Ok(r) = r {
            r.compute_ms += ms / n + u64::from((k as u64) < ms % n);
        }
    }
}

/// The error of an object not started because the payload's time ran out.
fn left_for_retry(obj: &ObjectRef) -> Error {
    Error::new(
        ErrorKind::DeadlineExceeded,
        format!(
            "{}: left for retry; not enough time before the Lambda's deadline to ingest and commit it",
            obj.uri()
        ),
    )
    .with_retryable(true)
}

/// What the plan does with each member on `metadata`: one walk over main's ancestry for all of
/// them ([`walk_all`]); `Stale` when expired history leaves a member undecidable.
fn decide(metadata: &TableMetadata, members: &[Member], table: &str) -> Result<Vec<Decision>> {
    let sought: Vec<Sought<'_>> = members
        .iter()
        .map(|m| Sought {
            id: &m.id,
            not_before_ms: m.not_before_ms,
            proven: m.proven,
        })
        .collect();
    let mut decided = Vec::with_capacity(members.len());
    for (m, w) in members.iter().zip(walk_all(metadata, &sought)) {
        decided.push(match w {
            Walk::Found(found) => Decision::Found(found),
            Walk::Absent => Decision::Take,
            Walk::Unknown => {
                return Err(Error::new(
                    ErrorKind::Stale,
                    format!(
                    "history of {table} was expired while {} was being ingested; checking again",
                    m.id
                ),
                ))
            }
        });
    }
    Ok(decided)
}

/// The plan of a batch commit: on each table version, every member not committed yet goes in
/// (with the summary of those only); `Stale` when expired history leaves a member undecidable.
fn batch_plan(
    members: Vec<Member>,
    writer_id: String,
    decisions: Arc<Mutex<Vec<Decision>>>,
) -> impl FnMut(&Table) -> Result<Plan> + Send + 'static {
    move |table: &Table| {
        let decided = decide(table.metadata(), &members, &table.identifier().to_string())?;
        let taken: Vec<&Member> = members
            .iter()
            .zip(&decided)
            .filter(|(_, d)| matches!(d, Decision::Take))
            .map(|(m, _)| m)
            .collect();
        let first_found = decided.iter().find_map(|d| match d {
            Decision::Found(f) => Some(f.clone()),
            Decision::Take => None,
        });
        if let Ok(mut slot) = decisions.lock() {
            *slot = decided;
        }
        if taken.is_empty() {
            return Ok(match first_found {
                Some(f) => Plan::Skip(Skipped::AlreadyCommitted(f)),
                None => Plan::Skip(Skipped::Obsolete("empty batch".into())),
            });
        }
        let reports: Vec<&ObjectReport> = taken.iter().map(|m| &m.report).collect();
        let mut props = batch_summary(&reports);
        let ids: Vec<&str> = taken.iter().map(|m| m.id.as_str()).collect();
        props.insert(
            SOURCE_OBJECTS.into(),
            serde_json::to_string(&ids).unwrap_or_default(),
        );
        props.insert(WRITER_ID.into(), writer_id.clone());
        let modified: Vec<i64> = taken.iter().map(|m| m.modified_ms).collect();
        props.insert(
            SOURCE_MODIFIED_MS.into(),
            crate::summary::source_modified_value(&modified),
        );
        let files = taken.iter().flat_map(|m| m.files.iter().cloned()).collect();
        let mut change = Change::append(files, props);
        change.spec_ids = taken
            .iter()
            .flat_map(|m| {
                m.files
                    .iter()
                    .map(|f| (f.file_path().to_string(), m.spec_id))
            })
            .collect();
        Ok(Plan::Apply(change))
    }
}

/// The same error for another member of a failed batch (kind, retryable flag and message).
fn copy_error(e: &Error) -> Error {
    Error::new(e.kind(), e.to_string()).with_retryable(e.is_retryable())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table whose main has `snaps` snapshots, each naming `per` objects `o<snap>-<k>`.
    fn table(snaps: i64, per: usize) -> Table {
        let snapshots: Vec<serde_json::Value> = (1..=snaps)
            .map(|id| {
                let ids: Vec<String> = (0..per)
                    .map(|k| format!("s3://landing/orders/o{id}-{k}.jsonl#etag{id}{k}"))
                    .collect();
                let mut s = serde_json::json!({
                    "snapshot-id": id, "timestamp-ms": 1000 + id, "sequence-number": id,
                    "manifest-list": format!("s3://b/t/metadata/snap-{id}.avro"),
                    "summary": {"operation": "append",
                        SOURCE_OBJECTS: serde_json::to_string(&ids).unwrap()},
                    "schema-id": 0
                });
                if id > 1 {
                    s["parent-snapshot-id"] = serde_json::json!(id - 1);
                }
                s
            })
            .collect();
        let md: TableMetadata = serde_json::from_value(serde_json::json!({
            "format-version": 2, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
            "location": "s3://b/t", "last-sequence-number": snaps, "last-updated-ms": 1000 + snaps,
            "last-column-id": 1, "current-schema-id": 0,
            "schemas": [{"type": "struct", "schema-id": 0, "fields": [
                {"id": 1, "name": "x", "required": false, "type": "string"}]}],
            "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": []}],
            "last-partition-id": 999, "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}],
            "properties": {}, "current-snapshot-id": snaps, "snapshots": snapshots,
            "snapshot-log": [], "metadata-log": [],
            "refs": {"main": {"snapshot-id": snaps, "type": "branch"}}
        }))
        .unwrap();
        Table::builder()
            .metadata(md)
            .metadata_location("s3://b/t/metadata/00001-x.metadata.json".to_string())
            .identifier(TableIdent::from_strs(["floe", "orders"]).unwrap())
            .file_io(iceberg::io::FileIO::new_with_memory())
            .runtime(iceberg::Runtime::try_current().unwrap())
            .build()
            .unwrap()
    }

    fn member(k: usize) -> Member {
        let id = format!("s3://landing/orders/new{k}.jsonl#e{k}");
        Member {
            report: ObjectReport::new(id.clone(), "orders", Status::Committed),
            id,
            modified_ms: 1_000 + k as i64,
            not_before_ms: 0,
            proven: None,
            files: Vec::new(),
            spec_id: 0,
        }
    }

    /// The least time `f` takes over three runs.
    fn least(mut f: impl FnMut()) -> Duration {
        (0..3)
            .map(|_| {
                let t0 = Instant::now();
                f();
                t0.elapsed()
            })
            .min()
            .unwrap_or_default()
    }

    /// The plan of a batch of 100 walks the window's history once, not once per member: on a
    /// history of 300 snapshots of 100 objects each it costs a small multiple of one object's
    /// walk (every member walks back to the start: none is in the table).
    #[tokio::test]
    async fn a_batch_plan_walks_the_history_once_for_all_members() {
        let table = table(300, 100);
        let one = least(|| {
            let w = super::super::dedup::walk(table.metadata(), "s3://x/y#z", 0, None);
            assert_eq!(w, Walk::Absent);
        });
        let members: Vec<Member> = (0..MAX_OBJECTS_PER_COMMIT).map(member).collect();
        let mut plan = batch_plan(members, "w".into(), Arc::default());
        let all = least(|| match plan(&table) {
            Ok(Plan::Apply(c)) => {
                let ids: Vec<String> = serde_json::from_str(&c.properties[SOURCE_OBJECTS]).unwrap();
                assert_eq!(ids.len(), MAX_OBJECTS_PER_COMMIT);
                // Each member's LastModified, in the order of the identities.
                let modified: Vec<&str> = c.properties[SOURCE_MODIFIED_MS].split(',').collect();
                assert_eq!(modified.len(), MAX_OBJECTS_PER_COMMIT);
                assert_eq!((modified[0], modified[7]), ("1000", "1007"));
            }
            other => panic!("{other:?}"),
        });
        assert!(
            all < one * 10,
            "the plan of 100 members took {all:?}, one member's walk {one:?}"
        );
    }
}
