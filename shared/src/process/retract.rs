//! A `latest` run's retraction of source row changes: another writer's `overwrite`/`delete`
//! snapshots in the run's delta, copy-on-write (data files removed, corrected ones added) or
//! merge-on-read (position delete files added, naming the deleted rows by file and position).
//!
//! A latest run merges by a maximum, which can add versions but never take one back. So the
//! key buckets a row change may have changed — the buckets of the keys in the data files it
//! removed, and of the rows its position deletes delete (the SQL run over those files, or over
//! those rows of their files, which are still in storage while the snapshots before the change
//! are kept; an unreadable one, or a change whose removed files its manifests do not all list,
//! means every bucket) — are **rebuilt from the source** at the
//! run's target snapshot: the SQL over every live source file, only the output rows of those
//! buckets kept, reduced to the latest version per key ([`Latest::reduce`], the batch), split
//! into live rows (the buckets' new sink files) and deletes (their new tombstones, at the run's
//! source sequence). The other buckets the delta touches merge as usual; the files the change
//! added are in the delta like an append's. The whole source is read once per run that meets
//! a row change, whatever the number of affected buckets.
//!
//! Exactly once: the rebuilt buckets' tombstones and sink files go into the run's two commits
//! (tombstones first, then the sink with the checkpoint), replacing exactly those buckets'
//! files. A rebuild can remove tombstones (a delete the correction took back) and rewrites the
//! kept ones at the run's sequence, so it is not a maximum over the old state: its tombstone
//! commit applies only on the tombstone table version the run read (anything committed
//! meanwhile: the run re-plans), and it records its source sequence
//! ([`summary::TOMBSTONES_REBUILT`], carried on by later commits); a run that reads tombstones
//! after such a commit while standing at an earlier source snapshot re-plans (a reload sees the
//! row change, since the rebuild committed only after reading it); and a merging tombstone
//! commit of a run that read the tombstones before a rebuild refuses to land after it (it could
//! add, in a rebuilt bucket, a tombstone the correction took back). A rebuild whose sink commit
//! is lost or never happens leaves the checkpoint where it was, so the next run meets the same
//! row change and rebuilds the same buckets again, replacing the orphaned rebuild's tombstones.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use arrow::array::RecordBatch;
use iceberg::spec::DataFile;
use iceberg::table::Table;

use super::latest::{Bucket, Latest};
use super::output::Output;
use super::plan::Delta;
use super::processor::{Position, RunReport};
use super::{input, transform, Processor};
use crate::config::PipelineConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::scan::LiveFile;
use crate::snapshot::Change;
use crate::summary;

/// Reduce the accumulated rebuild again past this many reduced chunks.
const REDUCE_EVERY: usize = 8;

/// The source row changes of a latest run's delta.
pub(super) struct Retraction {
    snapshots: usize,
    removed: Vec<LiveFile>,
    /// Files another engine's position deletes deleted rows from, with those rows' positions.
    deleted: Vec<(LiveFile, Vec<i64>)>,
    unknown: bool,
    /// Why every bucket is rebuilt whatever the row changes (see [`Retraction::rebuild_all`]).
    all_because: Option<&'static str>,
    /// When the rebuild must have read the source (checked between chunks).
    by: Instant,
}

impl Retraction {
    /// The row changes of `delta`, whose rebuild must be read by `by`.
    pub(super) fn of(delta: &Delta, by: Instant) -> Self {
        Self {
            by,
            snapshots: delta.row_changes.len(),
            removed: delta
                .removed
                .iter()
                .map(|f| LiveFile {
                    file: f.file.clone(),
                    spec_id: f.spec_id,
                    // Read whole: every key they held may have changed.
                    deletes: Vec::new(),
                })
                .collect(),
            deleted: delta
                .deleted
                .iter()
                .map(|(f, positions)| (LiveFile::new(f.file.clone(), f.spec_id), positions.clone()))
                .collect(),
            unknown: delta.removed_unknown,
            all_because: None,
        }
    }

    /// Every bucket rebuilt from the source, as a refresh does, whatever the delta's row
    /// changes, for `why`.
    pub(super) fn rebuild_all(&mut self, why: &'static str) {
        self.all_because = Some(why);
    }
}

/// The buckets a row change may have changed.
enum Affected {
    All,
    Some(BTreeSet<Bucket>),
}

/// The affected buckets as the batch at the run's source snapshot has them.
pub(super) struct Rebuilt {
    affected: Affected,
    /// Per bucket: its live rows, its deletes (either may be missing: none).
    buckets: BTreeMap<Bucket, (Option<RecordBatch>, Option<RecordBatch>)>,
}

impl Rebuilt {
    /// Whether every bucket is rebuilt (the delta need not be read).
    pub(super) fn covers_all(&self) -> bool {
        matches!(self.affected, Affected::All)
    }

    /// Whether `bucket` is rebuilt (the delta's merge leaves it alone).
    pub(super) fn covers(&self, bucket: &Bucket) -> bool {
        match &self.affected {
            Affected::All => true,
            Affected::Some(s) => s.contains(bucket),
        }
    }
}

/// What replacing the rebuilt buckets wrote and removes, in the sink and the tombstone table.
#[derive(Default)]
pub(super) struct Replaced {
    pub(super) sink_added: Vec<DataFile>,
    pub(super) sink_removed: Vec<String>,
    pub(super) sink_schema: Option<iceberg::spec::Schema>,
    pub(super) tomb_added: Vec<DataFile>,
    pub(super) tomb_removed: Vec<String>,
    pub(super) tomb_schema: Option<iceberg::spec::Schema>,
}

/// Whether the tombstone table `t` was rebuilt from this source at a later source sequence
/// than `seq` (the run's): its tombstones are not facts of the run's source snapshot, which
/// must re-plan.
pub(super) fn behind_a_rebuild(t: &Table, source_uuid: &str, seq: i64) -> bool {
    let Some(s) = t.metadata().current_snapshot() else {
        return false;
    };
    let props = &s.summary().additional_properties;
    let ours = props.get(summary::TOMBSTONES_SOURCE).map(String::as_str) == Some(source_uuid);
    let at = props
        .get(summary::TOMBSTONES_REBUILT)
        .and_then(|v| v.parse::<i64>().ok());
    ours && at.is_some_and(|at| at > seq)
}

/// The rebuild mark of the tombstone table's current version (a commit that merges into
/// tombstones refuses to land after a rebuild it did not read).
pub(super) fn rebuild_mark(t: &Table) -> Option<String> {
    t.metadata().current_snapshot().and_then(|s| {
        s.summary()
            .additional_properties
            .get(summary::TOMBSTONES_REBUILT)
            .cloned()
    })
}

/// Records on a tombstone `change` that it rebuilt tombstones at source sequence `seq`.
pub(super) fn mark_rebuilt(change: &mut Change, seq: i64) {
    change
        .properties
        .insert(summary::TOMBSTONES_REBUILT.to_string(), seq.to_string());
}

impl Processor {
    /// The buckets the row changes of the delta affect, rebuilt from the source at its current
    /// snapshot (the run's target); None without row changes, or when they removed no row
    /// the SQL outputs.
    pub(super) async fn rebuild_buckets(
        &self,
        p: &PipelineConfig,
        pos: &Position,
        latest: &Latest,
        r: &Retraction,
        report: &mut RunReport,
    ) -> Result<Option<Rebuilt>> {
        if r.snapshots == 0 && r.all_because.is_none() {
            return Ok(None);
        }
        // Position deletes are applied by every floe read; equality deletes are not read.
        crate::scan::refuse_equality_deletes(
            &pos.source,
            &format!("pipeline `{}`'s retraction", p.name),
        )
        .await?;
        let context = format!("pipeline `{}` over `{}` (retraction)", p.name, p.source);
        in_time(p, r.by)?;
        let affected = affected(p, pos, latest, r, &context, report).await?;
        if matches!(&affected, Affected::Some(s) if s.is_empty()) {
            return Ok(None);
        }
        let keep = |b: &Bucket| match &affected {
            Affected::All => true,
            Affected::Some(s) => s.contains(b),
        };
        let files = crate::scan::live_files(&pos.source).await?;
        let mut reduced: Vec<RecordBatch> = Vec::new();
        for chunk in input::chunks(&files) {
            in_time(p, r.by)?;
            let (schema, rows, cost) = input::read_rows_costed(&pos.source, chunk).await?;
            report.recompute_files_read += cost.files;
            report.recompute_bytes_read += cost.bytes;
            report.rows_recomputed += rows.iter().map(|b| b.num_rows() as u64).sum::<u64>();
            let (_, out) = transform::run_sql(&p.sql, schema, rows, &context).await?;
            let mut kept = Vec::new();
            for b in &out {
                kept.extend(
                    latest
                        .by_bucket(b)?
                        .into_iter()
                        .filter(|(bucket, _)| keep(bucket))
                        .map(|(_, rows)| rows),
                );
            }
            if !kept.is_empty() {
                reduced.push(latest.reduce(&kept)?);
            }
            if reduced.len() >= REDUCE_EVERY {
                reduced = vec![latest.reduce(&reduced)?];
            }
        }
        let mut buckets: BTreeMap<Bucket, (Option<RecordBatch>, Option<RecordBatch>)> =
            BTreeMap::new();
        if !reduced.is_empty() {
            let (live, deletes) = latest.split_deletes(&latest.reduce(&reduced)?)?;
            drop(reduced);
            for (b, rows) in latest.by_bucket(&live)? {
                buckets.entry(b).or_default().0 = Some(rows);
            }
            for (b, rows) in latest.by_bucket(&deletes)? {
                buckets.entry(b).or_default().1 = Some(rows);
            }
        }
        tracing::info!(pipeline = %p.name, row_changes = r.snapshots,
            all = matches!(affected, Affected::All), buckets = buckets.len(),
            "rebuilding the buckets a source row change affects");
        Ok(Some(Rebuilt { affected, buckets }))
    }

    /// Replaces the rebuilt buckets of the sink (`sink_files`, by bucket) and of the tombstone
    /// table (`tomb_files`): their files removed, the batch's live rows and deletes (at source
    /// sequence `seq`) written. The buckets' entries are taken out of both maps.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn write_rebuilt(
        &self,
        pos: &Position,
        latest: &Latest,
        mut rebuilt: Rebuilt,
        sink_files: &mut BTreeMap<Bucket, Vec<LiveFile>>,
        tomb_files: &mut BTreeMap<Bucket, Vec<LiveFile>>,
        seq: i64,
        writer_id: &str,
        report: &mut RunReport,
    ) -> Result<Replaced> {
        let buckets: BTreeSet<Bucket> = match &rebuilt.affected {
            Affected::Some(s) => s.clone(),
            Affected::All => sink_files
                .keys()
                .chain(tomb_files.keys())
                .chain(rebuilt.buckets.keys())
                .copied()
                .collect(),
        };
        report.buckets_rebuilt = buckets.len();
        let mut done = Replaced::default();
        for b in buckets {
            let sf = sink_files.remove(&b).unwrap_or_default();
            let tf = tomb_files.remove(&b).unwrap_or_default();
            let (live, deletes) = rebuilt.buckets.remove(&b).unwrap_or_default();
            if let Some(live) = live.filter(|l| l.num_rows() > 0) {
                let mut out = Output::new(&pos.sink, writer_id)?;
                out.write(vec![live]).await?;
                let (added, schema) = out.close().await?;
                report.bytes_written += added.iter().map(|f| f.file_size_in_bytes()).sum::<u64>();
                done.sink_added.extend(added);
                done.sink_schema = done.sink_schema.take().or(schema);
            }
            report.files_replaced += sf.len();
            report.sink_bytes_replaced +=
                sf.iter().map(|f| f.file.file_size_in_bytes()).sum::<u64>();
            done.sink_removed
                .extend(sf.iter().map(|f| f.file.file_path().to_string()));
            let Some(t) = &pos.tombstones else {
                continue;
            };
            if let Some(deletes) = deletes.filter(|d| d.num_rows() > 0) {
                report.tombstones += deletes.num_rows() as u64;
                let rows = super::upsert::tombstone_rows(latest, &deletes, seq)?;
                let mut out = Output::new(t, writer_id)?;
                out.write(vec![rows]).await?;
                let (added, schema) = out.close().await?;
                report.bytes_written += added.iter().map(|f| f.file_size_in_bytes()).sum::<u64>();
                done.tomb_added.extend(added);
                done.tomb_schema = done.tomb_schema.take().or(schema);
            }
            done.tomb_removed
                .extend(tf.iter().map(|f| f.file.file_path().to_string()));
        }
        Ok(done)
    }

    /// Commits a tombstone change that rebuilt buckets (a run's, or a refresh's of all of them),
    /// marked with its source sequence `seq`, on the tombstone table version `table` only
    /// (false: it changed meanwhile; the run re-plans). `change` may add and remove nothing: the
    /// commit still fences (upsert.rs).
    pub(super) async fn commit_rebuilt_tombstones(
        &self,
        p: &PipelineConfig,
        table: &Table,
        mut change: Change,
        seq: i64,
        deadline: Instant,
    ) -> Result<bool> {
        mark_rebuilt(&mut change, seq);
        let base = table.metadata().current_snapshot_id();
        self.commit_tombstones_unless(p, table, change, deadline, move |t: &Table| {
            (t.metadata().current_snapshot_id() != base)
                .then_some("the tombstones changed since the run read them")
        })
        .await
    }
}

/// A retryable `DeadlineExceeded` once `by` has passed: a rebuild reads the whole source, which
/// may not fit in a run (the function's time limit); it stops before committing anything, so
/// the pipelines after it in a batch still run, and names the way out.
fn in_time(p: &PipelineConfig, by: Instant) -> Result<()> {
    if Instant::now() < by {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::DeadlineExceeded,
        format!(
            "pipeline `{}`: rebuilding the key buckets another writer's row change affects reads \
             the whole source and did not finish in the time the run had; nothing was committed \
             and the next run starts it over. If it keeps running out of time, rebuild the sink \
             from the CLI (no function time limit): `floe process refresh --pipeline {}`",
            p.name, p.name
        ),
    )
    .with_retryable(true))
}

/// The buckets of the SQL's output over the removed files (all: one cannot be read).
async fn affected(
    p: &PipelineConfig,
    pos: &Position,
    latest: &Latest,
    r: &Retraction,
    context: &str,
    report: &mut RunReport,
) -> Result<Affected> {
    if let Some(why) = r.all_because {
        tracing::warn!(pipeline = %p.name, source = %pos.source.identifier(), why,
            "rebuilding every bucket from the source");
        return Ok(Affected::All);
    }
    if r.unknown {
        tracing::warn!(source = %pos.source.identifier(),
            "a row change's removed files are not all in its manifests: rebuilding every bucket");
        return Ok(Affected::All);
    }
    for f in r.removed.iter().chain(r.deleted.iter().map(|(f, _)| f)) {
        let path = f.file.file_path();
        let exists = pos.source.file_io().exists(path).await.map_err(|e| {
            Error::iceberg(format!("checking removed file {path}"), e).with_retryable(true)
        })?;
        if !exists {
            tracing::warn!(source = %pos.source.identifier(), path,
                "a file a row change removed is gone: rebuilding every bucket");
            return Ok(Affected::All);
        }
    }
    let mut set = BTreeSet::new();
    for chunk in input::chunks(&r.removed) {
        in_time(p, r.by)?;
        let (schema, rows, cost) = input::read_rows_costed(&pos.source, chunk).await?;
        report.delta_files_read += cost.files;
        report.delta_bytes_read += cost.bytes;
        let (_, out) = transform::run_sql(&p.sql, schema, rows, context).await?;
        for b in &out {
            set.extend(latest.by_bucket(b)?.into_keys());
        }
    }
    // Rows deleted by position: only those rows' keys (each file read in order, the rows at
    // the deleted positions kept).
    let files: Vec<LiveFile> = r.deleted.iter().map(|(f, _)| f.clone()).collect();
    let schema = transform::table_schema(&pos.source)?;
    let mut at = 0;
    for chunk in input::chunks(&files) {
        in_time(p, r.by)?;
        let (read, cost) = input::read_positioned(&pos.source, chunk, None, &schema).await?;
        report.delta_files_read += cost.files;
        report.delta_bytes_read += cost.bytes;
        let mut rows = Vec::new();
        for batches in &read {
            rows.extend(rows_at(batches, &r.deleted[at].1)?);
            at += 1;
        }
        if rows.is_empty() {
            continue;
        }
        let (_, out) = transform::run_sql(&p.sql, schema.clone(), rows, context).await?;
        for b in &out {
            set.extend(latest.by_bucket(b)?.into_keys());
        }
    }
    Ok(Affected::Some(set))
}

/// The rows at `positions` (ascending) of one file read in order as `batches`.
fn rows_at(batches: &[RecordBatch], positions: &[i64]) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    let (mut start, mut next) = (0i64, 0usize);
    for b in batches {
        let n = b.num_rows() as i64;
        let mut mask = vec![false; b.num_rows()];
        let mut any = false;
        while next < positions.len() && positions[next] < start + n {
            if let Some(m) = usize::try_from(positions[next] - start)
                .ok()
                .and_then(|i| mask.get_mut(i))
            {
                *m = true;
                any = true;
            }
            next += 1;
        }
        if any {
            let kept =
                arrow::compute::filter_record_batch(b, &arrow::array::BooleanArray::from(mask))
                    .map_err(|e| Error::new(ErrorKind::Internal, format!("deleted rows: {e}")))?;
            out.push(kept);
        }
        start += n;
    }
    Ok(out)
}
