//! A `latest` run's side effects, merge-on-read: the delta reduced to its latest version per
//! key; for each touched bucket the key and order columns of its live sink files (their
//! position deletes applied) and its tombstones of the delta's keys read, merged
//! ([`merge_bucket_on_read`]), the rows no longer live position-deleted and the new ones
//! appended; the tombstone table committed before the sink (the sink commit carries the
//! checkpoint, as in every mode).
//!
//! Why two commits stay exactly once: a tombstone is a fact of the source (a delete that is
//! the latest version of its key among rows the run read), and merging is a maximum, so a
//! tombstone committed by a run whose sink commit then lost (or never happened) changes
//! nothing once the sink catches up; it carries the source sequence number of its run, and a
//! run at an earlier source snapshot ignores it ([`latest::SEQ`]). The tombstone commit appends
//! the new tombstones and position-deletes only tombstones the merge no longer needs (dominated
//! by a greater one known at or before it, past the horizon, or below a committed sink row), so
//! it removes no fact a later run could need; a concurrent run's tombstones appended meanwhile
//! are duplicates the merge deduplicates. Position deletes name rows as the run read them, so
//! both commits record the snapshot they planned on ([`Change::planned_on`]): if the table moved
//! since by anything but appends (a compaction rewrote the files, another run or engine wrote
//! deletes), the commit is `Stale` and the run re-plans and re-reads both tables. The sink
//! commit is the usual checkpoint-guarded one.
//!
//! A delta with source row changes (another writer's `overwrite`/`delete`) also rebuilds the
//! buckets they affect from the source (`retract.rs`): those buckets leave the merge, their
//! files are replaced by the batch's, and the argument above holds with two additions made
//! there — a tombstone commit that rebuilds applies only on the tombstone version read, and it
//! records its source sequence, behind which a run re-plans ([`retract::behind_a_rebuild`]).
//!
//! Why a rebuilding run (and a refresh) always makes that commit, even one that changes no
//! file: a rebuild is not a maximum, so a tombstone a run B merged from a source snapshot before
//! a row change (a delete the change took back) is false after it. If B's tombstone commit
//! lands before the rebuild's, the rebuild's (guarded on the version it read) refuses and the
//! run re-plans: the re-read sees B's tombstone and the rebuild replaces the bucket's files,
//! dropping it — so a rebuild never keeps, in a rebuilt bucket, a tombstone committed after the
//! version it read. If the rebuild's lands first, B's (which lands only while the rebuild mark
//! is the one it read) refuses and B re-plans at the new source snapshot. Without a commit of
//! its own, a rebuild whose buckets' tombstones did not change would leave no mark, B's false
//! tombstone would land after it, and the next merge of its bucket would delete the key. The
//! sink commits need no more: both start from the same checkpoint, and the loser re-plans.
//!
//! A first run (no checkpoint yet) makes that commit too, guarded on the tombstone version it
//! read: two first runs may overlap, one having read the source before a correction; were its
//! tombstones to land beside the other's commit, the other's sink commit would set the
//! checkpoint over facts the source took back, and no later run would rebuild their buckets.
//! Refused, the run re-plans and, finding tombstones without a checkpoint, rebuilds every
//! bucket.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow_schema::SchemaRef;
use futures::{StreamExt, TryStreamExt};
use iceberg::spec::DataFile;
use iceberg::table::Table;

use super::latest::{self, Bucket, Latest};
use super::output::Output;
use super::processor::{Position, RunReport};
use super::retract::{self, Retraction};
use super::{input, transform, Processor};
use crate::commit::{Outcome, Plan, Skipped};
use crate::config::PipelineConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::scan::LiveFile;
use crate::snapshot::Change;
use crate::summary;

/// Reduce the accumulated delta again past this many reduced chunks (memory: distinct keys).
const REDUCE_EVERY: usize = 8;

/// Position delete files a run writes at once.
const DELETE_WRITES: usize = 8;

/// The files a `latest` run commits to the sink (the tombstones are committed already).
pub(super) struct SinkFiles {
    pub(super) added: Vec<DataFile>,
    pub(super) removed: Vec<String>,
    /// Position delete files (one per touched bucket with rows no longer live).
    pub(super) added_deletes: Vec<DataFile>,
    /// The partition spec each delete file was written with (its data file's), by path.
    pub(super) delete_specs: HashMap<String, i32>,
    pub(super) schema: Option<iceberg::spec::Schema>,
}

impl Processor {
    /// The SQL's output schema over the source's current schema, and the pipeline's `latest`
    /// terms checked against it.
    pub(super) async fn latest_terms(
        &self,
        p: &PipelineConfig,
        source: &Table,
    ) -> Result<(SchemaRef, Latest)> {
        let (schema, _) = self.batch_input(p, source, None, true).await?;
        let context = format!("pipeline `{}` over `{}`", p.name, p.source);
        let (out, _) = transform::run_sql(&p.sql, schema, Vec::new(), &context).await?;
        let latest = Latest::new(p, &out)?;
        Ok((out, latest))
    }

    /// `latest` mode: the delta's latest version per key merged into the buckets it touches,
    /// and the buckets the delta's source row changes affect rebuilt (`retract.rs`).
    /// `None`: the tombstone table changed underneath (the run re-plans).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn upsert_latest(
        &self,
        p: &PipelineConfig,
        pos: &Position,
        files: &[LiveFile],
        mut retraction: Retraction,
        to: i64,
        report: &mut RunReport,
        deadline: Instant,
    ) -> Result<Option<SinkFiles>> {
        let layout = latest::Layout::of(p)?;
        for t in std::iter::once(&pos.sink).chain(pos.tombstones.as_ref()) {
            layout.check(t)?;
            refuse_delete_files(p, t).await?;
        }
        // A first run (no checkpoint yet) with a tombstone table: its tombstone commit is
        // guarded on the version it read (below), and tombstones it finds are a first run's
        // that stopped before its sink commit. They were read at a source state this run may
        // not see (corrected since, with no row change in a first run's plan of the current
        // state), so the batch decides every bucket instead of trusting them.
        let first = pos.checkpoint.is_none() && pos.tombstones.is_some();
        if let Some(t) = pos.tombstones.as_ref().filter(|_| first) {
            refuse_foreign_tombstones(p, t, &pos.source_uuid)?;
            if holds_tombstones(t) {
                retraction.rebuild_all(
                    "tombstones without a checkpoint: a first run's that stopped before its sink commit",
                );
            }
        }
        let mut took = Took::default();
        let t0 = Instant::now();
        let (_, latest) = self.latest_terms(p, &pos.source).await?;
        took.terms += t0.elapsed();
        let to_snapshot = pos.source.metadata().snapshot_by_id(to);
        let seq = to_snapshot.map(|s| s.sequence_number()).unwrap_or_default();
        // Retraction hook (retract.rs): tombstones rebuilt at a later source snapshot than
        // this run's are not facts of it (re-plan); the buckets row changes affect, rebuilt.
        if let Some(t) = &pos.tombstones {
            if retract::behind_a_rebuild(t, &pos.source_uuid, seq) {
                tracing::info!(pipeline = %p.name, "tombstones rebuilt at a later source snapshot; re-planning");
                return Ok(None);
            }
        }
        // Boxed: a rebuild's state would otherwise sit in every run's future (worker stacks).
        let rebuilt = Box::pin(self.rebuild_buckets(p, pos, &latest, &retraction, report)).await?;
        let context = format!("pipeline `{}` over `{}`", p.name, p.source);
        let t0 = Instant::now();
        let mut reduced: Vec<RecordBatch> = Vec::new();
        // A rebuild of every bucket is the batch over the whole source: the delta's rows would
        // all be left to it (a first run's delta is the whole source again).
        let delta_files = match &rebuilt {
            Some(r) if r.covers_all() => &[][..],
            _ => files,
        };
        for chunk in input::chunks(delta_files) {
            let t1 = Instant::now();
            let (schema, rows, cost) = input::read_rows_costed(&pos.source, chunk).await?;
            report.delta_files_read += cost.files;
            report.delta_bytes_read += cost.bytes;
            took.delta_read += t1.elapsed();
            let t1 = Instant::now();
            let (_, out) = transform::run_sql(&p.sql, schema, rows, &context).await?;
            took.delta_sql += t1.elapsed();
            if !out.is_empty() {
                reduced.push(latest.reduce(&out)?);
            }
            if reduced.len() >= REDUCE_EVERY {
                reduced = vec![latest.reduce(&reduced)?];
            }
        }
        let mut done = SinkFiles {
            added: Vec::new(),
            removed: Vec::new(),
            added_deletes: Vec::new(),
            delete_specs: HashMap::new(),
            schema: None,
        };
        // A first run makes its guarded tombstone commit even with no output (below).
        if reduced.is_empty() && rebuilt.is_none() && !first {
            return Ok(Some(done));
        }
        let delta = match reduced.is_empty() {
            true => RecordBatch::new_empty(latest.schema().clone()),
            false => latest.reduce(&reduced)?,
        };
        drop(reduced);
        took.delta += t0.elapsed();
        report.keys_touched = delta.num_rows() as u64;
        // The newest order value that moves the horizon: the source commit time plus a skew
        // (the run's clock if the snapshot is unknown).
        let committed_ms = to_snapshot
            .map(|s| s.timestamp_ms())
            .unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
        let latest_micros = committed_ms
            .saturating_mul(1000)
            .saturating_add(latest::CLOCK_SKEW_MICROS);
        let horizon = latest.horizon(&delta, latest_micros);
        let mut touched = latest.by_bucket(&delta)?;
        drop(delta);
        if let Some(r) = &rebuilt {
            touched.retain(|b, _| !r.covers(b));
        }
        report.buckets = touched.len();
        let t0 = Instant::now();
        let mut sink_files = by_bucket(&pos.sink).await?;
        let mut tomb_files = match &pos.tombstones {
            Some(t) => by_bucket(t).await?,
            None => BTreeMap::new(),
        };
        let writer_id = format!("process-{}", uuid::Uuid::now_v7());
        let mut sink_out = Output::new(&pos.sink, &writer_id)?.refusing_renames_of(&pos.source);
        let mut tomb_out = match &pos.tombstones {
            Some(t) => Some(Output::new(t, &writer_id)?),
            None => None,
        };
        let mut tomb_deletes: Vec<DataFile> = Vec::new();
        let mut tomb_specs: HashMap<String, i32> = HashMap::new();
        // The position delete files to write: (of the tombstone table, its rows).
        let mut delete_files: Vec<(bool, PartitionDeletes)> = Vec::new();
        took.list += t0.elapsed();
        for (bucket, d) in touched {
            let sf = sink_files.remove(&bucket).unwrap_or_default();
            let tf = tomb_files.remove(&bucket).unwrap_or_default();
            // Boxed: the bucket's reads are deep futures, kept off the run's stack.
            let change = Box::pin(merge_bucket_on_read(
                &latest,
                &pos.sink,
                pos.tombstones.as_ref(),
                &sf,
                &tf,
                d,
                seq,
                horizon,
                report,
                &mut took,
            ))
            .await?;
            let t0 = Instant::now();
            if let Some(d) = change.sink_deletes {
                report.rows_deleted += d.2.len() as u64;
                delete_files.push((false, d));
            }
            if change.added_live.num_rows() > 0 {
                sink_out.write(vec![change.added_live]).await?;
            }
            if let (Some(_), Some(d)) = (&pos.tombstones, change.tomb_deletes) {
                delete_files.push((true, d));
            }
            if let Some(out) = tomb_out.as_mut() {
                if change.added_tombstones.num_rows() > 0 {
                    report.tombstones += change.added_tombstones.num_rows() as u64;
                    out.write(vec![change.added_tombstones]).await?;
                }
            }
            took.write += t0.elapsed();
        }
        // Several at once: each is one small object (a PUT on S3), one or two per bucket.
        let t0 = Instant::now();
        let sink = &pos.sink;
        let tombstones = pos.tombstones.as_ref();
        let writer = writer_id.as_str();
        let written: Vec<(bool, i32, DataFile)> =
            futures::stream::iter(delete_files.into_iter().map(
                |(of_tombstones, (part, spec, rows))| async move {
                    let table = match (of_tombstones, tombstones) {
                        (true, Some(t)) => t,
                        _ => sink,
                    };
                    let f = crate::write::write_position_deletes(table, part, spec, rows, writer)
                        .await?;
                    Ok::<_, Error>((of_tombstones, spec, f))
                },
            ))
            .buffered(DELETE_WRITES)
            .try_collect()
            .await?;
        for (of_tombstones, spec, f) in written {
            report.bytes_written += f.file_size_in_bytes();
            report.delete_files += 1;
            if of_tombstones {
                report.tombstone_delete_files += 1;
                tomb_specs.insert(f.file_path().to_string(), spec);
                tomb_deletes.push(f);
            } else {
                done.delete_specs.insert(f.file_path().to_string(), spec);
                done.added_deletes.push(f);
            }
        }
        took.deletes += t0.elapsed();
        let t0 = Instant::now();
        let (added, schema) = sink_out.close().await?;
        report.bytes_written += added.iter().map(|f| f.file_size_in_bytes()).sum::<u64>();
        done.added = added;
        done.schema = schema;
        let (mut tomb_added, mut tomb_schema) = match tomb_out {
            Some(out) => out.close().await?,
            None => (Vec::new(), None),
        };
        report.bytes_written += tomb_added
            .iter()
            .map(|f| f.file_size_in_bytes())
            .sum::<u64>();
        took.write += t0.elapsed();
        tracing::debug!(pipeline = %p.name, terms_ms = ms(took.terms), delta_ms = ms(took.delta),
            list_ms = ms(took.list), probe_sink_ms = ms(took.probe_sink),
            probe_tombstones_ms = ms(took.probe_tombstones), merge_ms = ms(took.merge),
            write_ms = ms(took.write), delta_read_ms = ms(took.delta_read),
            delta_sql_ms = ms(took.delta_sql), probe_read_ms = ms(took.probe_read),
            deletes_ms = ms(took.deletes), "latest run phases");
        let mut tomb_removed: Vec<String> = Vec::new();
        // A rebuilding run's tombstone commit is base-guarded and marked even when it changes no
        // file (the module doc: it fences the merges of runs that read the tombstones before).
        let rebuilding = rebuilt.is_some();
        if let Some(r) = rebuilt {
            let w = Box::pin(self.write_rebuilt(
                pos,
                &latest,
                r,
                &mut sink_files,
                &mut tomb_files,
                seq,
                &writer_id,
                report,
            ))
            .await?;
            report.buckets += report.buckets_rebuilt;
            done.added.extend(w.sink_added);
            done.removed.extend(w.sink_removed);
            done.schema = done.schema.or(w.sink_schema);
            tomb_added.extend(w.tomb_added);
            tomb_removed.extend(w.tomb_removed);
            tomb_schema = tomb_schema.or(w.tomb_schema);
        }
        // A first run's too, guarded on the tombstone version it read: another first run may
        // have read the source before a correction and committed its tombstones after this run
        // read the (empty) table. Landing beside them would set the checkpoint over facts the
        // source took back; refused, this run re-plans and, finding tombstones without a
        // checkpoint, rebuilds every bucket from the source.
        if let Some(t) = &pos.tombstones {
            if rebuilding
                || first
                || !(tomb_added.is_empty() && tomb_removed.is_empty() && tomb_deletes.is_empty())
            {
                let mut change = tombstone_change(
                    p,
                    &pos.source_uuid,
                    tomb_added.clone(),
                    tomb_removed,
                    tomb_schema,
                );
                if !tomb_deletes.is_empty() {
                    change.operation =
                        crate::snapshot::row_delta_operation(&change.added, &change.removed);
                }
                change.added_deletes = tomb_deletes.clone();
                change.spec_ids = tomb_specs.clone();
                change.planned_on = Some(t.metadata().current_snapshot_id());
                let change = change.written_with(t.metadata().default_partition_spec_id());
                let committed = if rebuilding {
                    Box::pin(self.commit_rebuilt_tombstones(p, t, change, seq, deadline)).await?
                } else if first {
                    let base = t.metadata().current_snapshot_id();
                    self.commit_tombstones_unless(p, t, change, deadline, move |t: &Table| {
                        (t.metadata().current_snapshot_id() != base)
                            .then_some("tombstones landed since this first run read them")
                    })
                    .await?
                } else {
                    self.commit_tombstones(p, t, change, deadline).await?
                };
                if !committed {
                    crate::write::delete_uncommitted(t, &tomb_added).await;
                    crate::write::delete_uncommitted(t, &tomb_deletes).await;
                    crate::write::delete_uncommitted(&pos.sink, &done.added).await;
                    crate::write::delete_uncommitted(&pos.sink, &done.added_deletes).await;
                    return Ok(None);
                }
            }
        }
        Ok(Some(done))
    }

    /// Commits the tombstone table's change; false when the rows its delete files name moved
    /// or were deleted meanwhile (another run, a compaction: `Stale` from
    /// [`Change::planned_on`], and the run re-plans on the new state), or, for a refresh, when
    /// the files it replaces changed.
    async fn commit_tombstones(
        &self,
        p: &PipelineConfig,
        table: &Table,
        change: Change,
        deadline: Instant,
    ) -> Result<bool> {
        // A rebuild since `table` was read (retract.rs) may have taken back tombstones this
        // change's merge relied on, in buckets it adds to: re-plan.
        let mark = retract::rebuild_mark(table);
        self.commit_tombstones_unless(p, table, change, deadline, move |t: &Table| {
            (retract::rebuild_mark(t) != mark).then_some("the tombstones were rebuilt meanwhile")
        })
        .await
    }

    /// Commits a tombstone change unless `refuse` names a reason against the version it would
    /// land on; false when refused or `Stale` (the run re-plans).
    pub(super) async fn commit_tombstones_unless(
        &self,
        p: &PipelineConfig,
        table: &Table,
        change: Change,
        deadline: Instant,
        refuse: impl Fn(&Table) -> Option<&'static str> + Send,
    ) -> Result<bool> {
        let result = self
            .committer
            .commit_from(
                table.identifier(),
                Some(table.clone()),
                &self.limits(deadline),
                move |t: &Table| {
                    Ok(match refuse(t) {
                        Some(why) => Plan::Skip(Skipped::Obsolete(why.into())),
                        None => Plan::Apply(change.clone()),
                    })
                },
            )
            .await;
        match result {
            Ok(Outcome::Committed { .. }) => Ok(true),
            Ok(Outcome::Skipped(why)) => {
                tracing::info!(pipeline = %p.name, ?why, "tombstones skipped; re-planning");
                Ok(false)
            }
            Err(e) if e.kind() == ErrorKind::Stale => {
                tracing::info!(pipeline = %p.name, error = %e, "tombstones changed underneath; re-planning");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Gives `table` (the sink or the tombstone table) the pipeline's key-bucket layout as its
    /// default partition spec, a metadata-only commit (its live files keep their spec; the
    /// refresh then replaces them all). True when the table's spec changed (by this call or by
    /// a concurrent refresh): the caller reloads it.
    pub(super) async fn set_layout(
        &self,
        p: &PipelineConfig,
        table: &Table,
        deadline: Instant,
    ) -> Result<bool> {
        let layout = latest::Layout::of(p)?;
        let Some(was) = layout.mismatch(table) else {
            return Ok(false);
        };
        let result = self
            .committer
            .commit_from(
                table.identifier(),
                Some(table.clone()),
                &self.limits(deadline),
                |t: &Table| {
                    Ok(match layout.mismatch(t) {
                        None => Plan::Skip(Skipped::Obsolete("the layout is in place".into())),
                        Some(_) => Plan::Apply(Change::set_partition_spec(layout.spec(t)?)),
                    })
                },
            )
            .await?;
        tracing::info!(pipeline = %p.name, table = %table.identifier(), was = %was,
            buckets = p.key_buckets(), committed = matches!(result, Outcome::Committed { .. }),
            "partition spec moved to the key-bucket layout");
        Ok(true)
    }

    /// A refresh of a `latest` pipeline's tombstones: all of them replaced by `deletes` (the
    /// batch's latest versions that are deletes), at source sequence `seq`. False when the
    /// table changed since `table` was loaded.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn refresh_tombstones(
        &self,
        p: &PipelineConfig,
        table: &Table,
        source_uuid: &str,
        latest: &Latest,
        deletes: RecordBatch,
        seq: i64,
        deadline: Instant,
    ) -> Result<bool> {
        let rows = tombstone_rows(latest, &deletes, seq)?;
        let writer_id = format!("refresh-{}", uuid::Uuid::now_v7());
        let mut out = Output::new(table, &writer_id)?;
        out.write(vec![rows]).await?;
        let (added, schema) = out.close().await?;
        let removed: Vec<String> = crate::scan::live_files(table)
            .await?
            .into_iter()
            .map(|f| f.file.file_path().to_string())
            .collect();
        // Committed even when nothing changes, on `table`'s version only, marked (every
        // tombstone rewritten at `seq`): a run's merge that read the tombstones before cannot
        // land after it, nor it after one (the module doc); runs at earlier source snapshots
        // re-plan.
        let change = tombstone_change(p, source_uuid, added.clone(), removed, schema)
            .written_with(table.metadata().default_partition_spec_id());
        let ok = Box::pin(self.commit_rebuilt_tombstones(p, table, change, seq, deadline)).await?;
        if !ok {
            crate::write::delete_uncommitted(table, &added).await;
        }
        Ok(ok)
    }
}

/// `deletes` (output schema) as tombstone rows of a run or refresh at source sequence `seq`.
pub(super) fn tombstone_rows(
    latest: &Latest,
    deletes: &RecordBatch,
    seq: i64,
) -> Result<RecordBatch> {
    let schema = latest.tombstone_schema();
    let mut cols = transform::conform(deletes, latest.schema())?
        .columns()
        .to_vec();
    cols.push(std::sync::Arc::new(arrow::array::Int64Array::from(vec![
        seq;
        deletes.num_rows()
    ])));
    RecordBatch::try_new(schema, cols)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("tombstones: {e}")))
}

fn tombstone_change(
    p: &PipelineConfig,
    source_uuid: &str,
    added: Vec<DataFile>,
    removed: Vec<String>,
    schema: Option<iceberg::spec::Schema>,
) -> Change {
    let props: HashMap<String, String> = HashMap::from([
        (summary::PIPELINE.to_string(), p.name.clone()),
        (summary::OPERATION.to_string(), "tombstones".to_string()),
        (
            summary::TOMBSTONES_SOURCE.to_string(),
            source_uuid.to_string(),
        ),
    ]);
    if removed.is_empty() {
        Change {
            schema,
            ..Change::append(added, props)
        }
    } else {
        Change::overwrite(added, removed, props, schema)
    }
}

/// `Stale` when `table` (the sink or the tombstone table) has live equality delete files
/// (another engine's row-level deletes by value): a run finds a key's committed row by position
/// and cannot tell whether such a delete applies to it. Position deletes (floe's own, or another
/// engine's) are applied as every read applies them.
async fn refuse_delete_files(p: &PipelineConfig, table: &Table) -> Result<()> {
    crate::scan::refuse_equality_deletes(
        table,
        &format!(
            "pipeline `{}` (`floe process refresh --pipeline {}` rebuilds the sink and its \
             tombstones from the source, without them)",
            p.name, p.name
        ),
    )
    .await
}

/// Whether the tombstone table holds any tombstone.
fn holds_tombstones(table: &Table) -> bool {
    summary::total(table.metadata(), "total-records") > 0
}

/// For a sink without a checkpoint on the source: `Stale` when the tombstone table holds
/// tombstones not read from this source (the source was re-created: their sequence numbers and
/// deletes belong to another table). Tombstones of this source (a first run that committed its
/// tombstones, then crashed before the sink commit) pass: the run rebuilds every bucket from
/// the source, since a correction since then shows in no row change.
fn refuse_foreign_tombstones(p: &PipelineConfig, table: &Table, source_uuid: &str) -> Result<()> {
    if !holds_tombstones(table) {
        return Ok(());
    }
    let md = table.metadata();
    let of = md.current_snapshot().and_then(|s| {
        s.summary()
            .additional_properties
            .get(summary::TOMBSTONES_SOURCE)
    });
    if of.map(String::as_str) == Some(source_uuid) {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Stale,
        format!(
            "pipeline `{}`: sink `{}` has no checkpoint on `{}` (uuid {source_uuid}), but `{}` \
             holds tombstones read from {}; applying them could hide this source's rows, so \
             nothing was processed. Rebuild both from this source with \
             `floe process refresh --pipeline {}`",
            p.name,
            p.sink,
            p.source,
            table.identifier(),
            of.map(|u| format!("source uuid {u}"))
                .unwrap_or_else(|| "an unrecorded source".into()),
            p.name
        ),
    ))
}

/// The rows a merge compares for `probed` (rows of `files` of `table`): `stand_ins` of the
/// rows not `tied`, then the tied rows read whole; and where each one is (index in `files`,
/// position).
async fn whole_where_tied(
    table: &Table,
    files: &[LiveFile],
    probed: &Probed,
    stand_ins: RecordBatch,
    tied: &[bool],
    report: &mut RunReport,
) -> Result<(Vec<RecordBatch>, Vec<(usize, i64)>)> {
    let untied: Vec<u32> = (0..tied.len())
        .filter(|&i| !tied[i])
        .map(|i| i as u32)
        .collect();
    let mut at: Vec<(usize, i64)> = untied.iter().map(|&i| probed.at[i as usize]).collect();
    let mut pool = vec![arrow::compute::take_record_batch(
        &stand_ins,
        &arrow::array::UInt32Array::from(untied),
    )
    .map_err(|e| Error::new(ErrorKind::Internal, format!("stand-ins: {e}")))?];
    let mut by_file: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    for i in (0..tied.len()).filter(|&i| tied[i]) {
        let (fi, pos) = probed.at[i];
        by_file.entry(fi).or_default().push(pos);
    }
    if by_file.is_empty() {
        return Ok((pool, at));
    }
    let read: Vec<LiveFile> = by_file.keys().map(|&fi| files[fi].clone()).collect();
    let schema = transform::table_schema(table)?;
    let (per_file, cost) = input::read_positioned(table, &read, None, &schema).await?;
    report.sink_files_read += cost.files;
    report.sink_bytes_read += cost.bytes;
    for ((fi, positions), batches) in by_file.into_iter().zip(per_file) {
        let whole = arrow::compute::concat_batches(&schema, &batches)
            .map_err(|e| Error::new(ErrorKind::Internal, format!("tied rows: {e}")))?;
        let idx = arrow::array::UInt32Array::from_iter_values(positions.iter().map(|&p| p as u32));
        pool.push(
            arrow::compute::take_record_batch(&whole, &idx)
                .map_err(|e| Error::new(ErrorKind::Internal, format!("tied rows: {e}")))?,
        );
        at.extend(positions.into_iter().map(|p| (fi, p)));
    }
    Ok((pool, at))
}

/// Where a `latest` run's time went (logged at debug level).
#[derive(Default)]
struct Took {
    terms: std::time::Duration,
    delta: std::time::Duration,
    list: std::time::Duration,
    probe_sink: std::time::Duration,
    probe_tombstones: std::time::Duration,
    merge: std::time::Duration,
    write: std::time::Duration,
    delta_read: std::time::Duration,
    delta_sql: std::time::Duration,
    probe_read: std::time::Duration,
    deletes: std::time::Duration,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `table`'s live files by key bucket.
async fn by_bucket(table: &Table) -> Result<BTreeMap<Bucket, Vec<LiveFile>>> {
    let spec = table.metadata().default_partition_spec_id();
    let name = table.identifier().to_string();
    let mut out: BTreeMap<Bucket, Vec<LiveFile>> = BTreeMap::new();
    for f in crate::scan::live_files(table).await? {
        let b = latest::file_bucket(&f, spec, &name)?;
        out.entry(b).or_default().push(f);
    }
    Ok(out)
}

/// The rows of one partition to delete by position: (partition, spec id, (data file, position)).
type PartitionDeletes = (iceberg::spec::Struct, i32, Vec<(String, i64)>);

/// What merging one bucket on read changes: the sink rows no longer live (their positions) and
/// the new live rows; the tombstones no longer kept and the new ones.
struct BucketChange {
    /// The sink rows to delete.
    sink_deletes: Option<PartitionDeletes>,
    added_live: RecordBatch,
    tomb_deletes: Option<PartitionDeletes>,
    added_tombstones: RecordBatch,
}

/// Committed rows of one bucket whose key the delta has, and where each is.
struct Probed {
    /// The rows (in `schema`).
    rows: RecordBatch,
    /// (index in the bucket's files, position) of each row.
    at: Vec<(usize, i64)>,
    /// The delta row of each one's key.
    delta_rows: Vec<usize>,
    /// How long reading the files took (the rest is matching keys).
    read: std::time::Duration,
}

/// Reads `columns` (None: all) of `files` with their positions, drops the rows their position
/// deletes delete, and keeps those whose key the delta (`index`) has.
async fn probe_files(
    latest: &Latest,
    index: &latest::KeyIndex,
    table: &Table,
    files: &[LiveFile],
    columns: Option<&[String]>,
    schema: &SchemaRef,
    report: &mut RunReport,
) -> Result<Probed> {
    let mut rows = Vec::new();
    let (mut at, mut delta_rows) = (Vec::new(), Vec::new());
    if files.is_empty() {
        return Ok(Probed {
            rows: RecordBatch::new_empty(schema.clone()),
            at,
            delta_rows,
            read: std::time::Duration::ZERO,
        });
    }
    let t0 = Instant::now();
    let deletes: Vec<_> = files
        .iter()
        .flat_map(|f| f.deletes.iter().cloned())
        .collect();
    let deleted = crate::write::read_position_deletes(table, &deletes).await?;
    report.sink_files_read += deletes.len();
    report.sink_bytes_read += deletes.iter().map(|d| d.file_size_in_bytes).sum::<u64>();
    let (per_file, cost) = input::read_positioned(table, files, columns, schema).await?;
    report.sink_files_read += cost.files;
    report.sink_bytes_read += cost.bytes;
    let read = t0.elapsed();
    for (fi, batches) in per_file.into_iter().enumerate() {
        let gone = deleted.get(files[fi].file.file_path());
        let mut base = 0i64;
        for b in batches {
            let hits = latest.probe(index, &b)?;
            let mut take = Vec::new();
            for (r, hit) in hits.into_iter().enumerate() {
                let pos = base + r as i64;
                if let Some(d) = hit {
                    if gone.is_none_or(|g| !g.contains(&pos)) {
                        take.push(r as u32);
                        at.push((fi, pos));
                        delta_rows.push(d);
                    }
                }
            }
            base += b.num_rows() as i64;
            if !take.is_empty() {
                let idx = arrow::array::UInt32Array::from(take);
                rows.push(
                    arrow::compute::take_record_batch(&b, &idx)
                        .map_err(|e| Error::new(ErrorKind::Internal, format!("probe: {e}")))?,
                );
            }
        }
    }
    let rows = arrow::compute::concat_batches(schema, &rows)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("probe: {e}")))?;
    Ok(Probed {
        rows,
        at,
        delta_rows,
        read,
    })
}

/// Merges one bucket on read (merge-on-read): the delta's winners `d` of the bucket against
/// the bucket's committed rows of the same keys only. Of the sink's files it reads the key and
/// order columns (and the whole row only of a committed row whose order value ties with the
/// delta's or a tombstone's of its key, for the whole-row tie-break); of the tombstone table's,
/// the tombstones of the delta's keys. The rows the merge ([`Latest::merge_bucket`]) no longer
/// keeps get position deletes, the new ones are appended: a run's work is bounded by the keys
/// it touches (and the key columns of their buckets), not by the sink's size.
#[allow(clippy::too_many_arguments)]
async fn merge_bucket_on_read(
    latest: &Latest,
    sink: &Table,
    tombstones: Option<&Table>,
    sink_files: &[LiveFile],
    tomb_files: &[LiveFile],
    d: RecordBatch,
    seq: i64,
    horizon: Option<i64>,
    report: &mut RunReport,
    took: &mut Took,
) -> Result<BucketChange> {
    let t0 = Instant::now();
    let index = latest.key_index(&d)?;
    let probe_schema = latest.probe_schema();
    let names: Vec<String> = probe_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let probed = probe_files(
        latest,
        &index,
        sink,
        sink_files,
        Some(&names),
        &probe_schema,
        report,
    )
    .await?;
    took.probe_read += probed.read;
    let sink_rows = probed.rows.clone();
    took.probe_sink += t0.elapsed();
    let t0 = Instant::now();
    let tomb_schema = latest.tombstone_probe_schema();
    let tomb_names: Vec<String> = tomb_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let tomb = match tombstones {
        Some(t) if !tomb_files.is_empty() => Some(
            probe_files(
                latest,
                &index,
                t,
                tomb_files,
                Some(&tomb_names),
                &tomb_schema,
                report,
            )
            .await?,
        ),
        _ => None,
    };
    took.probe_read += tomb.as_ref().map(|t| t.read).unwrap_or_default();
    let tomb_probe: Vec<RecordBatch> = tomb.iter().map(|t| t.rows.clone()).collect();
    // The tombstone pool: stand-ins of untied tombstones, then the tied ones read whole.
    let (tomb_rows, tomb_at) = match (tombstones, &tomb) {
        (Some(t), Some(probed)) => {
            let ties = latest.ties(
                &d,
                &probed.rows,
                &probed.delta_rows,
                std::slice::from_ref(&sink_rows),
            )?;
            let stand_ins = latest.tombstone_stand_ins(&d, &probed.rows, &probed.delta_rows)?;
            whole_where_tied(t, tomb_files, probed, stand_ins, &ties, report).await?
        }
        _ => (Vec::new(), Vec::new()),
    };
    took.probe_tombstones += t0.elapsed();
    let t0 = Instant::now();
    let ties = latest.ties(&d, &sink_rows, &probed.delta_rows, &tomb_probe)?;
    let stand_ins = latest.stand_ins(&d, &sink_rows, &probed.delta_rows)?;
    // The sink pool: stand-ins of untied rows, then the tied rows read whole.
    let (pool, at) = whole_where_tied(sink, sink_files, &probed, stand_ins, &ties, report).await?;
    let merged = latest.merge_bucket(pool, tomb_rows, &d, seq, horizon)?;
    let deletes_of = |files: &[LiveFile], at: &[(usize, i64)], dropped: &[usize]| {
        let first = dropped.first()?;
        let f = &files[at[*first].0];
        let rows = dropped
            .iter()
            .map(|&i| (files[at[i].0].file.file_path().to_string(), at[i].1))
            .collect();
        Some((f.file.partition().clone(), f.spec_id, rows))
    };
    took.merge += t0.elapsed();
    let sink_deletes = deletes_of(sink_files, &at, &merged.sink_dropped);
    let tomb_deletes = deletes_of(tomb_files, &tomb_at, &merged.tombstones_dropped);
    Ok(BucketChange {
        sink_deletes,
        added_live: merged.added_live,
        tomb_deletes,
        added_tombstones: merged.added_tombstones,
    })
}
