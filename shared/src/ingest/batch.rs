//! Micro-batching: the objects of one Lambda payload (an SQS batch, a Distributed Map batch)
//! that go to the same table commit together, in one snapshot whose summary names every one.
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
//! attempt whose answer was lost may be the one that landed). Files are deleted only for members
//! proven to be in no commit of ours; on any unknown outcome every file stays.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use iceberg::table::Table;
use iceberg::TableIdent;

use super::dedup::{walk, Walk};
use super::report::batch_summary;
use super::{Ingestor, ObjectReport, Prepared, Stage, Status};
use crate::commit::{Found, Outcome, Plan, Skipped};
use crate::error::{Error, ErrorKind, Result};
use crate::event::ObjectRef;
use crate::snapshot::Change;
use crate::summary::{SOURCE_OBJECTS, WRITER_ID};

/// What the last evaluation of a batch plan decided for one member.
#[derive(Debug, Clone)]
enum Decision {
    /// In the change.
    Take,
    /// Already committed (by another delivery, or by an attempt of ours whose answer was lost).
    Found(Found),
}

/// One member as the plan sees it.
struct Member {
    id: String,
    not_before_ms: i64,
    proven: Option<i64>,
    files: Vec<iceberg::spec::DataFile>,
    report: ObjectReport,
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
        // The same version delivered twice in one payload: the copy follows the first.
        let mut first_of: HashMap<String, usize> = HashMap::new();
        let mut copies: Vec<(usize, usize)> = Vec::new();
        for (i, obj) in objs.iter().enumerate() {
            let prepared = match self.prepare(obj, deadline).await {
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
                copies.push((i, first));
                continue;
            }
            first_of.insert(id, i);
            if prepared.evolved.is_some() {
                // Its files carry the new field ids: it commits alone, with its schema change.
                results[i] = Some(self.commit_alone(*prepared, deadline).await);
            } else {
                groups
                    .entry(prepared.ident.to_string())
                    .or_default()
                    .push((i, prepared));
            }
        }
        for (_, members) in groups {
            for (i, r) in self.commit_group(members, deadline).await {
                results[i] = Some(r);
            }
        }
        for (copy, first) in copies {
            results[copy] = Some(match &results[first] {
                Some(Ok(r)) => {
                    let mut d = r.clone();
                    d.status = if r.status == Status::Committed {
                        Status::Duplicate
                    } else {
                        r.status
                    };
                    d.records_committed = 0;
                    d.records_quarantined = 0;
                    d.data_files = 0;
                    d.data_bytes = 0;
                    d.quarantine = None;
                    Ok(d)
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

    /// Commits one prepared object alone; a `Stale` answer (the schema moved differently)
    /// starts the object over on the single path, which retries.
    async fn commit_alone(&self, p: Prepared, deadline: Instant) -> Result<ObjectReport> {
        let obj = p.obj.clone();
        match self.commit_one(p, deadline).await {
            Err(e) if e.kind() == ErrorKind::Stale => self.ingest(&obj, deadline).await,
            other => other,
        }
    }

    /// One commit for the prepared objects of one table; each member's result.
    async fn commit_group(
        &self,
        mut prepared: Vec<(usize, Box<Prepared>)>,
        deadline: Instant,
    ) -> Vec<(usize, Result<ObjectReport>)> {
        if prepared.len() == 1 {
            let (i, p) = prepared.remove(0);
            return vec![(i, self.commit_alone(*p, deadline).await)];
        }
        let limits = self.commit_limits(deadline);
        let skew_ms = limits.skew.as_millis() as i64;
        let ident: TableIdent = prepared[0].1.ident.clone();
        // The newest version any member loaded: the first attempt's base.
        let base = prepared
            .iter()
            .map(|(_, p)| &p.table)
            .max_by_key(|t| t.metadata().last_sequence_number())
            .cloned();
        let members: Vec<Member> = prepared
            .iter()
            .map(|(_, p)| Member {
                id: p.source.id(),
                not_before_ms: p.source.modified_ms - skew_ms,
                proven: p.proven,
                files: p.written.files.clone(),
                report: p.report.clone(),
            })
            .collect();
        let writer_id = uuid::Uuid::now_v7().to_string();
        let decisions: Arc<Mutex<Vec<Decision>>> = Arc::default();
        let plan = batch_plan(members, writer_id.clone(), decisions.clone());
        let outcome = self
            .committer
            .commit_from(&ident, base, &limits, plan)
            .await;
        let last: Vec<Decision> = decisions.lock().map(|d| d.clone()).unwrap_or_default();
        let n = prepared.len();
        let mut out = Vec::with_capacity(n);
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
                    let id = p.source.id();
                    let taken = match &held {
                        Some(ids) => ids.contains(&id),
                        None => matches!(last.get(k), Some(Decision::Take)),
                    };
                    let mut r = p.report;
                    if taken {
                        r.snapshot_id = snapshot_id;
                        r.attempts = attempts;
                        if let Some(hi) = p.written.et_max {
                            r.freshness_seconds =
                                Some((chrono::Utc::now().timestamp_micros() - hi) as f64 / 1e6);
                        }
                    } else {
                        r.status = Status::Duplicate;
                        if let Some(Decision::Found(f)) = last.get(k) {
                            r.snapshot_id = Some(f.snapshot_id);
                        }
                        // Proven outside the landed commit (its summary was read): nothing of
                        // ours references these files. Unproven: left to orphan cleanup.
                        if held.is_some() {
                            crate::write::delete_uncommitted(&p.table, &p.written.files).await;
                        }
                    }
                    r.millis = p.started.elapsed().as_millis() as u64;
                    out.push((i, Ok(r)));
                }
            }
            Ok(Outcome::Skipped(_)) => {
                // Every member was found committed; by an attempt of ours, or by others.
                for (k, (i, p)) in prepared.into_iter().enumerate() {
                    let mut r = p.report;
                    match last.get(k) {
                        Some(Decision::Found(f))
                            if f.writer_id.as_deref() == Some(writer_id.as_str()) =>
                        {
                            r.snapshot_id = Some(f.snapshot_id);
                        }
                        found => {
                            r.status = Status::Duplicate;
                            if let Some(Decision::Found(f)) = found {
                                r.snapshot_id = Some(f.snapshot_id);
                            }
                            crate::write::delete_uncommitted(&p.table, &p.written.files).await;
                        }
                    }
                    r.millis = p.started.elapsed().as_millis() as u64;
                    out.push((i, Ok(r)));
                }
            }
            // Nothing was committed (the commit loop reports Stale only when no attempt is
            // unknown): these files can go, and each member starts over alone.
            Err(e) if e.kind() == ErrorKind::Stale => {
                tracing::info!(table = %ident, error = %e, "batch commit stale; committing its objects one by one");
                for (i, p) in prepared {
                    crate::write::delete_uncommitted(&p.table, &p.written.files).await;
                    out.push((i, self.ingest(&p.obj, deadline).await));
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
    async fn snapshot_objects(&self, ident: &TableIdent, snapshot_id: i64) -> Option<HashSet<String>> {
        let table = self.committer.load(ident).await.ok()?;
        let snap = table.metadata().snapshot_by_id(snapshot_id)?;
        let list = snap.summary().additional_properties.get(SOURCE_OBJECTS)?;
        serde_json::from_str::<Vec<String>>(list)
            .ok()
            .map(|v| v.into_iter().collect())
    }
}

/// The plan of a batch commit: on each table version, every member not committed yet goes in
/// (with the summary of those only); `Stale` when expired history leaves a member undecidable.
fn batch_plan(
    members: Vec<Member>,
    writer_id: String,
    decisions: Arc<Mutex<Vec<Decision>>>,
) -> impl FnMut(&Table) -> Result<Plan> + Send + 'static {
    move |table: &Table| {
        let mut decided = Vec::with_capacity(members.len());
        for m in &members {
            decided.push(
                match walk(table.metadata(), &m.id, m.not_before_ms, m.proven) {
                    Walk::Found(found) => Decision::Found(found),
                    Walk::Absent => Decision::Take,
                    Walk::Unknown => {
                        return Err(Error::new(
                            ErrorKind::Stale,
                            format!(
                                "history of {} was expired while {} was being ingested; checking again",
                                table.identifier(),
                                m.id
                            ),
                        ))
                    }
                },
            );
        }
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
        let files = taken.iter().flat_map(|m| m.files.iter().cloned()).collect();
        Ok(Plan::Apply(Change::append(files, props)))
    }
}

/// The same error for another member of a failed batch (kind, retryable flag and message).
fn copy_error(e: &Error) -> Error {
    Error::new(e.kind(), e.to_string()).with_retryable(e.is_retryable())
}
