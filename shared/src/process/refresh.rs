//! `refresh`, the batch speed's rebuild: recomputes a sink from the whole source (backfill, a
//! changed transform, an expired checkpoint, a row-changing source snapshot) — in chunks, with
//! bounded memory, across as many invocations as it takes.
//!
//! A refresh fixes a target source snapshot S (the source's current one when it starts) and
//! splits the work into chunks of at most `[process] refresh_chunk_rows` source rows, planned
//! from the manifests of S (record counts, time-column bounds) without reading data:
//!
//! * `aggregate`: chunks are spans of windows `[lo, hi)` covering the whole time axis (the
//!   first is open below and takes rows without a time, the last open above). The statistics
//!   only estimate a span's rows, so each chunk's rows are first counted from the time column
//!   alone and the chunk cut to the budget (`split`; a window is never split, so one window
//!   over the budget is a chunk of its own). A chunk reads
//!   only the source files whose time range meets its span (iceberg prunes by the bounds), runs
//!   the SQL and replaces exactly the sink windows of its span — sink windows of the span with
//!   no new output are removed, the sink's other windows are kept.
//! * `append`: chunks are groups of S's data files in path order (the SQL is per row); the
//!   first chunk's commit also removes the sink's old content.
//!
//! Each chunk is one sink commit through the commit loop, and carries the refresh's position
//! (`floe.refresh.*`: id, source, target, transform version, where the next chunk starts; see
//! [`crate::summary::RefreshPosition`]) in the same snapshot as its output, so the position can
//! never disagree with the sink: a chunk whose answer was lost is found by the loop (or, after
//! a crash, by the next call reading the position from the sink) and is neither re-applied nor
//! skipped. A chunk applies only on the sink version it was planned on. The last chunk writes
//! the checkpoint at S with the new transform version and clears the position. While a
//! position is recorded, incremental runs of the pipeline continue the refresh instead of
//! running (their commits refuse a sink with a refresh in progress), so the two never
//! interleave. A position whose target was expired, whose transform is no longer the
//! configured one, or whose source table was replaced is started over at the source's current
//! snapshot, and the report says why.
//!
//! A call commits chunks until the next one would likely run past its deadline (the slowest
//! chunk so far, plus a quarter, must still fit; the first chunk always runs) and reports what
//! remains; the next call (the process Lambda's next event, `floe process refresh` again)
//! continues from the position.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use iceberg::table::Table;
use serde::Serialize;

use super::joins::Joined;
use super::output::Output;
use super::processor::{Position, MAX_ROUNDS};
use super::windows::{self, Span};
use super::{input, transform, Processor, RunReport};
use crate::commit::{metered, Outcome, Plan, Skipped};
use crate::config::{PipelineConfig, PipelineMode};
use crate::error::{Error, ErrorKind, Result};
use crate::requests::Meter;
use crate::scan::LiveFile;
use crate::snapshot::Change;
use crate::summary::{self, RefreshPosition};

/// How far a refresh got: what one call did and what remains.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RefreshProgress {
    /// The refresh's id (the same on each of its chunk commits).
    pub id: String,
    /// The source snapshot the refresh recomputes the sink at.
    pub target_snapshot: Option<i64>,
    /// Chunks this call committed.
    pub chunks: u64,
    /// Chunks of the refresh committed so far, by every call.
    pub chunks_done: u64,
    /// Chunks left for later calls (0 when the refresh is finished).
    pub remaining: u64,
    /// The refresh finished: the sink holds the batch result at the target, checkpointed.
    pub done: bool,
    /// The most source rows one chunk of this call read (what it held in memory at once).
    pub max_chunk_rows: u64,
    /// Why a refresh in progress was started over (its target expired, the transform changed,
    /// the source table was replaced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarted: Option<String>,
}

/// The refresh a chunk belongs to, as the sink records it (or a new one).
#[derive(Debug, Clone)]
struct Refresh {
    id: String,
    /// None: the source has no snapshot (the refresh empties the sink).
    target: Option<i64>,
    /// Where the next chunk starts; None: nothing committed yet.
    next: Option<i64>,
    /// Chunks committed so far.
    chunks_done: u64,
}

/// The chunks of a refresh at its target, planned from the target's manifests.
#[derive(Debug, Clone)]
pub(super) enum ChunkPlan {
    /// Aggregate: window starts (µs, ascending) where one chunk ends and the next begins —
    /// estimated from the files' statistics, then refined chunk by chunk from the rows the
    /// time column counts ([`ChunkPlan::refine`]).
    Windows {
        bounds: Vec<i64>,
        /// Starts of chunks whose rows were counted and fit the budget (None: the first).
        fitted: BTreeSet<Option<i64>>,
    },
    /// Append: the target's data files in path order; a chunk is a run of them.
    Files { files: Vec<LiveFile>, budget: u64 },
    /// Nothing to read (the source has no snapshot): one chunk, the batch result as a whole.
    Whole,
}

/// One chunk to do.
#[derive(Debug, Clone)]
enum Chunk {
    /// Aggregate: the windows of a span.
    Span(Span),
    /// Append: a run of the target's files.
    Files(Vec<LiveFile>),
    /// The batch result as a whole.
    Whole,
}

impl ChunkPlan {
    /// An aggregate plan of chunks ending at `bounds`, none counted yet.
    fn windows(bounds: Vec<i64>) -> Self {
        ChunkPlan::Windows {
            bounds,
            fitted: BTreeSet::new(),
        }
    }

    /// Whether the chunk starting at `next` needs its rows counted before it is read: an
    /// aggregate chunk not yet counted (its size is the statistics' estimate).
    fn needs_count(&self, next: Option<i64>) -> bool {
        matches!(self, ChunkPlan::Windows { fitted, .. } if !fitted.contains(&next))
    }

    /// The chunk starting at `span.lo`, counted: it ends at `cuts` too (window starts inside
    /// it where the rows counted exceed the budget, see [`split`]), and it and its parts fit.
    fn refine(&mut self, span: Span, cuts: &[i64]) {
        if let ChunkPlan::Windows { bounds, fitted } = self {
            fitted.insert(span.lo);
            for &c in cuts {
                fitted.insert(Some(c));
            }
            bounds.extend_from_slice(cuts);
            bounds.sort_unstable();
            bounds.dedup();
        }
    }

    /// The chunk starting at `next` (None: the first), where the chunk after it starts (None:
    /// it is the last) and how many chunks follow it. A position that is no file index of the
    /// target's files (append mode) is an error: reading from index 0 without the first
    /// chunk's removal would duplicate what earlier chunks wrote.
    fn chunk_from(
        &self,
        next: Option<i64>,
    ) -> std::result::Result<(Chunk, Option<i64>, u64), String> {
        Ok(match self {
            ChunkPlan::Windows { bounds, .. } => {
                let after: Vec<i64> = bounds
                    .iter()
                    .copied()
                    .filter(|b| next.is_none_or(|lo| *b > lo))
                    .collect();
                let hi = after.first().copied();
                // The boundaries after `lo` split the rest into `after.len() + 1` chunks.
                (Chunk::Span(Span { lo: next, hi }), hi, after.len() as u64)
            }
            ChunkPlan::Files { files, budget } => {
                let start = match next {
                    None => 0,
                    Some(n) => match usize::try_from(n) {
                        Ok(i) if i < files.len() => i,
                        _ => {
                            return Err(format!(
                                "next file index {n} is not one of the target's {} files",
                                files.len()
                            ))
                        }
                    },
                };
                let end = group_end(files, start, *budget);
                let mut remaining = 0;
                let mut at = end;
                while at < files.len() {
                    at = group_end(files, at, *budget);
                    remaining += 1;
                }
                let next = (end < files.len()).then_some(end as i64);
                let group = files.get(start..end).unwrap_or_default().to_vec();
                (Chunk::Files(group), next, remaining)
            }
            ChunkPlan::Whole => (Chunk::Whole, None, 0),
        })
    }
}

/// The end (exclusive) of the run of `files` from `start` holding at most `budget` rows (one
/// file at least).
fn group_end(files: &[LiveFile], start: usize, budget: u64) -> usize {
    let mut rows = 0u64;
    let mut end = start;
    while end < files.len() {
        let n = files[end].file.record_count();
        if end > start && rows.saturating_add(n) > budget {
            break;
        }
        rows = rows.saturating_add(n);
        end += 1;
    }
    end
}

/// Where a chunk whose rows were counted per window (`counts`, by window start; None: rows
/// without a time, which come first) is cut into parts of at most `budget` rows: the window
/// starts where a part after the first begins. A window is never split, so a window holding
/// more than the budget is a part of its own (the one case a chunk exceeds its budget).
fn split(counts: &BTreeMap<Option<i64>, u64>, budget: u64) -> Vec<i64> {
    let mut cuts = Vec::new();
    let mut acc = 0u64;
    for (&w, &n) in counts {
        if acc > 0 && acc.saturating_add(n) > budget {
            if let Some(w) = w {
                cuts.push(w);
                acc = 0;
            }
        }
        acc = acc.saturating_add(n);
    }
    cuts
}

/// Where chunks of at most `budget` rows end, in window indices, given `spans` of windows
/// `(first, last, rows)` (inclusive; a data file's rows spread evenly over the windows between
/// its time bounds). A window is never split: one holding more than `budget` rows is a chunk
/// of its own. No boundary lies after the last window with rows.
fn boundaries(spans: &[(i64, i64, f64)], budget: u64) -> Vec<i64> {
    // The row density (rows per window) changes only where a span begins or ends.
    let mut changes: BTreeMap<i64, f64> = BTreeMap::new();
    let mut end = i64::MIN;
    for &(a, b, rows) in spans {
        if rows <= 0.0 || !rows.is_finite() {
            continue;
        }
        let (a, b) = (a.min(b), a.max(b));
        let windows = (i128::from(b) - i128::from(a) + 1) as f64;
        let d = rows / windows;
        *changes.entry(a).or_default() += d;
        *changes.entry(b.saturating_add(1)).or_default() -= d;
        end = end.max(b.saturating_add(1));
    }
    let budget = budget.max(1) as f64;
    let points: Vec<(i64, f64)> = changes.into_iter().collect();
    let mut bounds = Vec::new();
    let (mut acc, mut density) = (0.0f64, 0.0f64);
    for (i, &(a, change)) in points.iter().enumerate() {
        density += change;
        let Some(&(b, _)) = points.get(i + 1) else {
            break;
        };
        if density <= 1e-9 {
            continue;
        }
        let mut w = a;
        while w < b {
            let left = (i128::from(b) - i128::from(w)) as f64;
            let fit = ((budget - acc) / density).floor().max(0.0);
            if fit >= left {
                acc += density * left;
                w = b;
            } else {
                // The chunk is full: it ends after `fit` more windows (an empty chunk takes one).
                let take = if acc <= 0.0 { fit.max(1.0) } else { fit };
                w = w.saturating_add(take as i64);
                bounds.push(w);
                acc = 0.0;
            }
        }
    }
    bounds.dedup();
    bounds.retain(|b| *b < end);
    bounds
}

impl Processor {
    /// Batch / backfill: recomputes the sink from the whole source table, one bounded chunk at
    /// a time, and ends with the sink checkpointed at the refresh's target snapshot with the
    /// current transform version (the way out of a changed transform, an expired checkpoint or
    /// a row change). Continues a refresh in progress; stops when the next chunk would run past
    /// `deadline` (the report's `refresh_progress` says what remains: call again).
    pub async fn refresh(&self, name: &str, deadline: Instant) -> Result<RunReport> {
        let p = self.pipeline(name)?;
        if p.mode == PipelineMode::Latest {
            return self.refresh_latest_whole(p, deadline).await;
        }
        self.refresh_chunks(p, deadline, None, Start::Allowed, &self.meter())
            .await
    }

    /// A `latest` pipeline's refresh, in one piece: the batch's deletes replace the tombstones
    /// first, then its live rows replace the sink, checkpointed at the source's current snapshot
    /// (latest state is a reduction over every version of a key: it is not chunked by window
    /// or file).
    async fn refresh_latest_whole(
        &self,
        p: &PipelineConfig,
        deadline: Instant,
    ) -> Result<RunReport> {
        let name = p.name.as_str();
        let started = Instant::now();
        let meter = self.meter();
        let mut replans = 0;
        loop {
            let pos = self.position(p).await?;
            let to = pos.source.metadata().current_snapshot_id();
            let (_, batches) = if p.mode == PipelineMode::Latest {
                match self.refresh_latest(p, &pos, to, deadline).await? {
                    Some(live) => live,
                    None => {
                        replans += 1;
                        if replans >= MAX_ROUNDS || Instant::now() >= deadline {
                            return Err(Error::new(
                                ErrorKind::DeadlineExceeded,
                                format!("refresh of `{name}`: the tombstones kept changing; {replans} attempts"),
                            )
                            .with_retryable(true));
                        }
                        continue;
                    }
                }
            } else {
                self.batch_output(p, &pos.source, to, &Joined::default())
                    .await?
            };
            if p.mode == PipelineMode::Aggregate {
                windows::require_window_column(&batches, p)?;
            }
            let writer_id = format!("refresh-{}", uuid::Uuid::now_v7());
            let mut out = Output::new(&pos.sink, &writer_id)?;
            out.write(batches).await?;
            let (added, schema) = out.close().await?;
            let removed: Vec<String> = crate::scan::live_files(&pos.sink)
                .await?
                .into_iter()
                .map(|f| f.file.file_path().to_string())
                .collect();
            let mut props: HashMap<String, String> = HashMap::new();
            if let Some(to) = to {
                props.extend(summary::checkpoint_properties(
                    &pos.source_uuid,
                    to,
                    &pos.hash,
                ));
            }
            props.insert(summary::PIPELINE.into(), p.name.clone());
            props.insert(summary::OPERATION.into(), "refresh".into());
            let report = RunReport {
                pipeline: p.name.clone(),
                from_snapshot: pos.checkpoint.as_ref().map(|c| c.snapshot_id),
                to_snapshot: to,
                rows_out: added.iter().map(|f| f.record_count()).sum(),
                files_replaced: removed.len(),
                refresh: true,
                replans,
                ..Default::default()
            };
            let change = Change::overwrite(added.clone(), removed, props, schema)
                .written_with(pos.sink.metadata().default_partition_spec_id());
            let base_snapshot = pos.sink.metadata().current_snapshot_id();
            let ident = pos.sink.identifier().clone();
            let result = self
                .committer
                .commit_from(
                    &ident,
                    Some(pos.sink.clone()),
                    &self.limits(deadline),
                    crate::commit::metered(meter.clone(), move |t: &Table| {
                        Ok(if t.metadata().current_snapshot_id() != base_snapshot {
                            Plan::Skip(Skipped::Obsolete(
                                "the sink changed during the refresh".into(),
                            ))
                        } else {
                            Plan::Apply(change.clone())
                        })
                    }),
                )
                .await;
            match result {
                Ok(Outcome::Committed { snapshot_id, .. }) => {
                    return Ok(RunReport {
                        sink_snapshot: snapshot_id,
                        seconds: started.elapsed().as_secs_f64(),
                        usage: Some(meter.usage()),
                        ..report
                    })
                }
                Ok(Outcome::Skipped(_)) => {}
                Err(e) if e.kind() == ErrorKind::Stale => {}
                Err(e) => return Err(e),
            }
            crate::write::delete_uncommitted(&pos.sink, &added).await;
            replans += 1;
            if replans >= MAX_ROUNDS || Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::DeadlineExceeded,
                    format!("refresh of `{name}`: the sink kept changing; {replans} attempts"),
                )
                .with_retryable(true));
            }
        }
    }

    /// [`Processor::refresh`], one chunk only (starting a refresh if none is in progress): for
    /// callers that show progress chunk by chunk (the first call; then
    /// [`Processor::continue_refresh_chunk`]).
    pub async fn refresh_chunk(&self, name: &str, deadline: Instant) -> Result<RunReport> {
        let p = self.pipeline(name)?;
        if p.mode == PipelineMode::Latest {
            return self.refresh_latest_whole(p, deadline).await;
        }
        self.refresh_chunks(p, deadline, Some(1), Start::Allowed, &self.meter())
            .await
    }

    /// [`Processor::refresh_chunk`] starting a new refresh whatever the sink records — a
    /// refresh in progress, or a position that cannot be continued (an error names it): the
    /// new refresh's first chunk replaces what it covers (aggregate: the windows before its
    /// bound; append: the whole sink), so nothing of the old one survives its end. Continue
    /// with [`Processor::continue_refresh_chunk`].
    pub async fn restart_refresh_chunk(&self, name: &str, deadline: Instant) -> Result<RunReport> {
        let p = self.pipeline(name)?;
        self.refresh_chunks(p, deadline, Some(1), Start::Restart, &self.meter())
            .await
    }

    /// One chunk of the refresh in progress, never starting one: with none in progress (it
    /// finished, by this caller or another: a Lambda's run, a second `floe process refresh`)
    /// the report says done. What a caller that saw a refresh in progress calls next, so that
    /// a refresh another caller finished is not started over.
    pub async fn continue_refresh_chunk(&self, name: &str, deadline: Instant) -> Result<RunReport> {
        let p = self.pipeline(name)?;
        // A latest refresh is one piece: there is never one in progress to continue.
        if p.mode == PipelineMode::Latest {
            return Ok(RunReport {
                pipeline: p.name.clone(),
                refresh: true,
                ..Default::default()
            });
        }
        self.refresh_chunks(p, deadline, Some(1), Start::Never, &self.meter())
            .await
    }

    /// For an incremental run: when the sink records a refresh in progress, the run continues
    /// it instead (an incremental commit on a half-replaced sink would mix old and new output).
    pub(super) async fn continue_refresh(
        &self,
        p: &PipelineConfig,
        pos: &Position,
        deadline: Instant,
        meter: &Meter,
    ) -> Result<Option<RunReport>> {
        let Some(r) = read_position(p, pos)? else {
            return Ok(None);
        };
        tracing::info!(pipeline = %p.name, refresh = %r.id, chunks_done = r.chunks, "a refresh is in progress: continuing it instead of an incremental run");
        // A run only ever continues: a refresh that another caller finishes meanwhile ends it.
        self.refresh_chunks(p, deadline, None, Start::Never, meter)
            .await
            .map(Some)
    }

    /// Commits chunks of the refresh in progress (or a new one, when `start` allows) until it
    /// is finished, the next chunk would likely run past `deadline`, or `max_chunks` are done.
    ///
    /// A refresh another caller finishes while this one runs (it won the race for the last
    /// chunk) ends this call as done: once a refresh was seen in progress, or one finished on
    /// the sink since this call first read it, finding none in progress means it is over — not
    /// that a new one should start (that would recompute the whole sink again).
    async fn refresh_chunks(
        &self,
        p: &PipelineConfig,
        deadline: Instant,
        max_chunks: Option<u64>,
        mut start: Start,
        meter: &Meter,
    ) -> Result<RunReport> {
        let started = Instant::now();
        let budget = self.config.process.refresh_chunk_rows.max(1);
        // Each chunk commit records the usage since the previous one: the commits add up.
        let since_commit = self.meter();
        let mut progress = RefreshProgress::default();
        let mut report = RunReport {
            pipeline: p.name.clone(),
            refresh: true,
            ..Default::default()
        };
        let mut planned: Option<(Option<i64>, ChunkPlan)> = None;
        let mut slowest = Duration::ZERO;
        let mut replans = 0;
        // Re-plans of the chunk at hand: the limit is per chunk, not per call (a long call
        // meets the odd concurrent commit many times over and still progresses).
        let mut rounds = 0;
        // The sink's sequence number at this call's first read, and the refresh last seen in
        // progress (or started) by this call.
        let mut first_seq: Option<i64> = None;
        let mut seen: Option<String> = None;
        let mut warned_unpartitioned = false;
        loop {
            let pos = self.position(p).await?;
            let seq = pos
                .sink
                .metadata()
                .current_snapshot()
                .map_or(0, |s| s.sequence_number());
            let first_seq = *first_seq.get_or_insert_with(|| {
                report.from_snapshot = pos.checkpoint.as_ref().map(|c| c.snapshot_id);
                seq
            });
            let recorded = match (start, read_position(p, &pos)) {
                // By request: whatever the sink records (a malformed position too) gives way
                // to a new refresh, whose first chunk replaces what it covers.
                (Start::Restart, r) => {
                    let why = match r {
                        Ok(Some(r)) => Some(format!(
                            "refresh {} started over on request after {} chunks",
                            r.id, r.chunks
                        )),
                        Err(e) => Some(format!("started over on request: {}", e.message())),
                        Ok(None) => None,
                    };
                    if let Some(why) = why {
                        tracing::warn!(pipeline = %p.name, reason = %why, "refresh restarted");
                        progress.restarted = Some(why);
                    }
                    None
                }
                (_, r) => r?,
            };
            if let Some(r) = &recorded {
                seen = Some(r.id.clone());
            } else if let Some(finished) = finished_meanwhile(&pos, start, &seen, first_seq) {
                tracing::info!(pipeline = %p.name, refresh = %finished.0, chunks = progress.chunks, "the refresh finished (its last chunk was committed by another caller): nothing to start");
                progress.id = finished.0;
                progress.chunks_done = finished.1.max(progress.chunks_done);
                progress.target_snapshot = pos.checkpoint.as_ref().map(|c| c.snapshot_id);
                progress.done = true;
                progress.remaining = 0;
                report.to_snapshot = progress.target_snapshot;
                break;
            }
            let refresh = resume_or_start(p, &pos, recorded, &mut progress);
            progress.id = refresh.id.clone();
            progress.target_snapshot = refresh.target;
            progress.chunks_done = refresh.chunks_done;
            report.to_snapshot = refresh.target;
            if planned.as_ref().is_none_or(|(t, _)| *t != refresh.target) {
                let plan = match self.cached_plan(p, &pos.hash, refresh.target, budget) {
                    Some(plan) => plan,
                    None => self.plan_chunks(p, &pos, refresh.target, budget).await?,
                };
                planned = Some((refresh.target, plan));
            }
            let Some((_, plan)) = planned.as_mut() else {
                return Err(Error::new(ErrorKind::Internal, "refresh: no chunk plan"));
            };
            let (mut chunk, mut next, mut after) = plan
                .chunk_from(refresh.next)
                .map_err(|why| malformed_position(&p.name, &p.sink, &why))?;
            // The first chunk of a call always runs (else a short invocation never progresses).
            if progress.chunks > 0 {
                let capped = max_chunks.is_some_and(|m| progress.chunks >= m);
                let late = Instant::now() + slowest + slowest / 4 >= deadline;
                if capped || late {
                    progress.remaining = after + 1;
                    tracing::info!(pipeline = %p.name, refresh = %refresh.id, chunks = progress.chunks, remaining = progress.remaining, "refresh stops here; the next call continues from its position");
                    break;
                }
            }
            let t0 = Instant::now();
            // The statistics only estimate a chunk's rows (a file's rows may bunch anywhere
            // between its time bounds): count them from the time column and cut the chunk to
            // the budget before reading rows whole. Counted chunks are remembered (by this
            // processor, across calls), so each is counted once.
            if let (Chunk::Span(span), Some(target)) = (&chunk, refresh.target) {
                if plan.needs_count(span.lo) {
                    let window = p.window_micros().unwrap_or(60_000_000);
                    let time_column = p.time_column(&self.config);
                    let (counts, cost) =
                        windows::count_span(&pos.source, target, time_column, window, *span)
                            .await?;
                    report.recompute_bytes_read += cost.bytes;
                    let cuts = split(&counts, budget);
                    if !cuts.is_empty() {
                        let rows: u64 = counts.values().sum();
                        tracing::info!(pipeline = %p.name, refresh = %refresh.id, rows, budget, parts = cuts.len() + 1, "a refresh chunk holds more rows than its files' statistics suggest: cut to the budget");
                    }
                    plan.refine(*span, &cuts);
                    self.cache_plan(p, &pos.hash, refresh.target, budget, plan);
                    (chunk, next, after) = plan
                        .chunk_from(refresh.next)
                        .map_err(|why| malformed_position(&p.name, &p.sink, &why))?;
                }
            }
            let built = self
                .build_chunk(p, &pos, &refresh, &chunk, next, budget)
                .await?;
            let added = built.change.added.clone();
            let base = pos.sink.metadata().current_snapshot_id();
            let ident = pos.sink.identifier().clone();
            let change = built.change;
            let uuid = pos.source_uuid.clone();
            let planned_on = sink_state(pos.sink.metadata(), &uuid);
            let result = self
                .committer
                .commit_from(
                    &ident,
                    Some(pos.sink.clone()),
                    &self.limits(deadline),
                    metered(since_commit.clone(), move |t: &Table| {
                        // The version the chunk was planned on, or one that differs from it
                        // only by `replace` snapshots (compactions, manifest rewrites: no row
                        // changed) carrying the same position: its output and position are
                        // right only there. A chunk of this refresh that landed meanwhile or
                        // a concurrent run make it re-plan; a compaction that took a file it
                        // removes makes staging `Stale` (re-planned too).
                        let md = t.metadata();
                        Ok(
                            if md.current_snapshot_id() == base
                                || (only_replaced_since(md, base)
                                    && sink_state(md, &uuid) == planned_on)
                            {
                                Plan::Apply(change.clone())
                            } else {
                                Plan::Skip(Skipped::Obsolete(
                                    "the sink changed during the refresh".into(),
                                ))
                            },
                        )
                    }),
                )
                .await;
            match result {
                Ok(Outcome::Committed { snapshot_id, .. }) => {
                    seen = Some(refresh.id.clone());
                    rounds = 0;
                    // A restart is one: the rest of the call continues the new refresh.
                    if start == Start::Restart {
                        start = Start::Allowed;
                    }
                    since_commit.mark();
                    progress.chunks += 1;
                    progress.chunks_done = refresh.chunks_done + 1;
                    progress.max_chunk_rows = progress.max_chunk_rows.max(built.rows_read);
                    report.sink_snapshot = snapshot_id;
                    report.rows_out += built.rows_out;
                    report.rows_recomputed += built.rows_read;
                    report.files += built.files_read;
                    report.files_replaced += built.files_replaced;
                    report.recompute_bytes_read += built.bytes_read;
                    slowest = slowest.max(t0.elapsed());
                    if built.rewrote_unpartitioned && !warned_unpartitioned {
                        warned_unpartitioned = true;
                        tracing::warn!(pipeline = %p.name, sink = %p.sink, "the sink is unpartitioned (made before aggregate sinks were partitioned by window period): each refresh chunk rewrites every sink file holding windows outside its span, about the whole sink; drop the sink and refresh to get the partitioned layout");
                    }
                    tracing::info!(pipeline = %p.name, refresh = %refresh.id, chunk = refresh.chunks_done, rows = built.rows_read, remaining = after, "refresh chunk committed");
                    if next.is_none() {
                        progress.done = true;
                        progress.remaining = 0;
                        break;
                    }
                    continue;
                }
                Ok(Outcome::Skipped(_)) => {}
                Err(e) if e.kind() == ErrorKind::Stale => {}
                Err(e) => return Err(e),
            }
            crate::write::delete_uncommitted(&pos.sink, &added).await;
            replans += 1;
            rounds += 1;
            if rounds >= MAX_ROUNDS || Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::DeadlineExceeded,
                    format!(
                        "refresh of `{}`: the sink kept changing; {rounds} attempts at one chunk",
                        p.name
                    ),
                )
                .with_retryable(true));
            }
        }
        report.replans = replans;
        report.seconds = started.elapsed().as_secs_f64();
        report.usage = Some(meter.usage());
        report.refresh_progress = Some(progress);
        Ok(report)
    }

    /// The aggregate chunk plan this processor made (and refined) for `p` at `target` with
    /// `budget` under transform `hash`, if it has one: a later call of the same refresh (the
    /// CLI's chunk by chunk, a warm Lambda's next invocation) does not count chunks again.
    fn cached_plan(
        &self,
        p: &PipelineConfig,
        hash: &str,
        target: Option<i64>,
        budget: u64,
    ) -> Option<ChunkPlan> {
        let plans = self.refresh_plans.lock().ok()?;
        let c = plans.get(&p.name)?;
        (c.hash == hash && c.target == target && c.budget == budget).then(|| c.plan.clone())
    }

    /// Remembers an aggregate chunk plan (one per pipeline; append plans hold the target's
    /// file list and are not kept).
    fn cache_plan(
        &self,
        p: &PipelineConfig,
        hash: &str,
        target: Option<i64>,
        budget: u64,
        plan: &ChunkPlan,
    ) {
        if !matches!(plan, ChunkPlan::Windows { .. }) {
            return;
        }
        if let Ok(mut plans) = self.refresh_plans.lock() {
            plans.insert(
                p.name.clone(),
                CachedPlan {
                    hash: hash.to_string(),
                    target,
                    budget,
                    plan: plan.clone(),
                },
            );
        }
    }

    /// The chunks of a refresh at `target`, from the target's manifests alone.
    async fn plan_chunks(
        &self,
        p: &PipelineConfig,
        pos: &Position,
        target: Option<i64>,
        budget: u64,
    ) -> Result<ChunkPlan> {
        let Some(target) = target else {
            return Ok(ChunkPlan::Whole);
        };
        let mut files = crate::scan::live_files_at(&pos.source, target)
            .await?
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Stale,
                    format!(
                        "refresh of `{}`: source snapshot {target} was expired while planning",
                        p.name
                    ),
                )
                .with_retryable(true)
            })?;
        match p.mode {
            PipelineMode::Append => {
                files.sort_by(|a, b| a.file.file_path().cmp(b.file.file_path()));
                Ok(ChunkPlan::Files { files, budget })
            }
            // Not chunked: `refresh` takes it whole (`refresh_latest_whole`).
            PipelineMode::Latest => Ok(ChunkPlan::Whole),
            PipelineMode::Aggregate => {
                let window = p.window_micros().unwrap_or(60_000_000);
                let time_column = p.time_column(&self.config);
                let spans = window_spans(&pos.source, &files, time_column, window).await?;
                let bounds = boundaries(&spans, budget)
                    .into_iter()
                    .map(|w| w.saturating_mul(window))
                    .collect();
                Ok(ChunkPlan::windows(bounds))
            }
        }
    }

    /// Writes one chunk's output and builds its sink change, with the position after it (or,
    /// for the last chunk, the checkpoint at the target).
    async fn build_chunk(
        &self,
        p: &PipelineConfig,
        pos: &Position,
        refresh: &Refresh,
        chunk: &Chunk,
        next: Option<i64>,
        budget: u64,
    ) -> Result<Built> {
        let context = format!("pipeline `{}` over `{}` (refresh)", p.name, p.source);
        let writer_id = format!("refresh-{}", uuid::Uuid::now_v7());
        let mut out = Output::new(&pos.sink, &writer_id)?;
        let mut built = Built {
            change: Change::append(Vec::new(), HashMap::new()),
            rows_read: 0,
            rows_out: 0,
            files_read: 0,
            bytes_read: 0,
            files_replaced: 0,
            rewrote_unpartitioned: false,
        };
        // Every chunk of a refresh joins the same snapshots: the first reads the joined tables'
        // current ones and records them with its commit; the next ones read what the sink's
        // newest snapshot records (the previous chunk's, carried through a compaction).
        let joined = match pos.sink.metadata().current_snapshot_id() {
            Some(sink_snapshot) if refresh.next.is_some() => {
                self.joined_as_recorded(p, &pos.sink, sink_snapshot).await?
            }
            _ => self.joined(p, true).await?,
        };
        let removed: Vec<String> = match (chunk, refresh.target) {
            (Chunk::Span(span), Some(target)) => {
                let window = p.window_micros().unwrap_or(60_000_000);
                let time_column = p.time_column(&self.config);
                let (schema, rows, cost) =
                    windows::read_span(&pos.source, target, time_column, window, *span).await?;
                built.rows_read = rows.iter().map(|b| b.num_rows() as u64).sum();
                (built.files_read, built.bytes_read) = (cost.files, cost.bytes);
                if built.rows_read > budget.saturating_mul(2) {
                    tracing::warn!(pipeline = %p.name, rows = built.rows_read, budget, ?span, "a refresh chunk read more rows than twice its budget: one window holds more (a window is never split)");
                }
                let (output, batches) =
                    transform::run_sql_joined(&p.sql, schema, rows, &joined.relations, &context)
                        .await?;
                windows::require_window_column(&batches, p)?;
                let sink = windows::sink_rows_outside_span(&pos.sink, *span).await?;
                built.files_replaced = sink.paths.len();
                built.rewrote_unpartitioned = !sink.kept.is_empty()
                    && pos
                        .sink
                        .metadata()
                        .default_partition_spec()
                        .is_unpartitioned();
                // The SQL's columns first: the kept rows (old schema) must not fix the files'.
                out.settle(&output).await?;
                out.write(sink.kept).await?;
                out.write(batches).await?;
                sink.paths
            }
            (Chunk::Files(group), Some(_)) => {
                let (schema, rows, cost) = input::read_rows_costed(&pos.source, group).await?;
                built.rows_read = rows.iter().map(|b| b.num_rows() as u64).sum();
                (built.files_read, built.bytes_read) = (cost.files, cost.bytes);
                let (_, batches) =
                    transform::run_sql_joined(&p.sql, schema, rows, &joined.relations, &context)
                        .await?;
                out.write(batches).await?;
                self.first_chunk_removes(pos, refresh).await?
            }
            _ => {
                let (_, batches) = self
                    .batch_output(p, &pos.source, refresh.target, &joined)
                    .await?;
                if p.mode == PipelineMode::Aggregate {
                    windows::require_window_column(&batches, p)?;
                }
                out.write(batches).await?;
                self.first_chunk_removes(pos, refresh).await?
            }
        };
        if !matches!(chunk, Chunk::Span(_)) {
            built.files_replaced = removed.len();
        }
        let (added, schema) = out.close().await?;
        built.rows_out = added.iter().map(|f| f.record_count()).sum();
        let chunks = refresh.chunks_done + 1;
        let mut props: HashMap<String, String> = HashMap::new();
        match (next, refresh.target) {
            (Some(next), Some(target)) => props.extend(
                RefreshPosition {
                    id: refresh.id.clone(),
                    source: pos.source_uuid.clone(),
                    target,
                    transform: pos.hash.clone(),
                    next,
                    chunks,
                }
                .properties(),
            ),
            (_, target) => {
                if let Some(to) = target {
                    props.extend(summary::checkpoint_properties(
                        &pos.source_uuid,
                        to,
                        &pos.hash,
                    ));
                }
                props.extend(RefreshPosition::finished_properties(&refresh.id, chunks));
            }
        }
        props.extend(joined.properties());
        props.insert(summary::PIPELINE.into(), p.name.clone());
        props.insert(summary::OPERATION.into(), "refresh".into());
        props.insert(summary::ROWS_IN.into(), built.rows_read.to_string());
        built.change = if removed.is_empty() {
            Change {
                schema,
                ..Change::append(added, props)
            }
        } else {
            Change::overwrite(added, removed, props, schema)
        }
        .written_with(pos.sink.metadata().default_partition_spec_id());
        Ok(built)
    }

    /// The sink's old content, which a refresh's first chunk removes (later chunks remove
    /// nothing: append mode adds to what the first chunk left).
    async fn first_chunk_removes(&self, pos: &Position, refresh: &Refresh) -> Result<Vec<String>> {
        if refresh.next.is_some() {
            return Ok(Vec::new());
        }
        Ok(crate::scan::live_files(&pos.sink)
            .await?
            .into_iter()
            .map(|f| f.file.file_path().to_string())
            .collect())
    }
}

/// Reconcile compares a sink with the batch result at its checkpoint: meaningless while a
/// refresh is replacing the sink range by range (an error naming the refresh and its progress).
pub(super) fn refuse_during_refresh(p: &PipelineConfig, pos: &Position) -> Result<()> {
    match read_position(p, pos)? {
        None => Ok(()),
        Some(r) => Err(Error::new(
            ErrorKind::Stale,
            format!(
                "pipeline `{}`: refresh {} of sink `{}` is in progress ({} chunks committed, at source snapshot {}); \
                 finish it with `floe process refresh --pipeline {}`, then reconcile",
                p.name, r.id, p.sink, r.chunks, r.target, p.name
            ),
        )
        .with_retryable(true)),
    }
}

/// What a chunk's commit requires of the sink besides its version: the refresh position and
/// the checkpoint on the source recorded there.
type SinkState = (
    std::result::Result<Option<RefreshPosition>, String>,
    Option<i64>,
);

fn sink_state(md: &iceberg::spec::TableMetadata, source_uuid: &str) -> SinkState {
    (
        summary::read_refresh(md, source_uuid).map_err(|e| e.message().to_string()),
        summary::read_checkpoint(md, source_uuid).map(|c| c.snapshot_id),
    )
}

/// Whether every snapshot of the sink after `base` (the version a chunk was planned on) is a
/// `replace` — a compaction or manifest rewrite, which moves rows between files but changes
/// none. False when `base` is not an ancestor of the current snapshot.
fn only_replaced_since(md: &iceberg::spec::TableMetadata, base: Option<i64>) -> bool {
    let Some(base) = base else {
        return md.current_snapshot_id().is_none();
    };
    let mut cur = md.current_snapshot();
    while let Some(s) = cur {
        if s.snapshot_id() == base {
            return true;
        }
        if s.summary().operation != iceberg::spec::Operation::Replace {
            return false;
        }
        cur = s.parent_snapshot_id().and_then(|p| md.snapshot_by_id(p));
    }
    false
}

/// An aggregate chunk plan a processor keeps between calls of one refresh.
#[derive(Debug, Clone)]
pub(super) struct CachedPlan {
    hash: String,
    target: Option<i64>,
    budget: u64,
    plan: ChunkPlan,
}

/// Whether a call may start a refresh when the sink records none in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// `floe process refresh`'s first call: yes, unless one finished during this call.
    Allowed,
    /// An incremental run continuing a refresh, or a caller continuing one it saw: never (none
    /// in progress means it finished).
    Never,
    /// `floe process refresh --restart`: a new refresh whatever the sink records (until this
    /// call's first chunk lands; then it continues that one).
    Restart,
}

/// The refresh in progress on the sink of `p`, if any; a malformed position is an error
/// telling the operator to restart the refresh.
pub(super) fn read_position(p: &PipelineConfig, pos: &Position) -> Result<Option<RefreshPosition>> {
    summary::read_refresh(pos.sink.metadata(), &pos.source_uuid)
        .map_err(|e| malformed_position(&p.name, &p.sink, e.message()))
}

/// A refresh position that can be neither continued nor ignored: ignoring it would run
/// incrementally over a half-replaced sink, or start reading from the beginning without the
/// first chunk's removal of the old content.
pub(super) fn malformed_position(pipeline: &str, sink: &str, why: &str) -> Error {
    Error::new(
        ErrorKind::Stale,
        format!(
            "pipeline `{pipeline}`: the refresh position on sink `{sink}` cannot be continued ({why}); \
             restart the refresh: `floe process refresh --restart --pipeline {pipeline}`"
        ),
    )
    .with_retryable(false)
}

/// With no refresh in progress on the sink: the refresh (id, chunks) that finished during this
/// call, when this call must end as done rather than start one — it saw a refresh in
/// progress, or one finished since its first read (sequence number `first_seq`) and the sink
/// is checkpointed with the configured transform, or it may never start one. None: start.
fn finished_meanwhile(
    pos: &Position,
    start: Start,
    seen: &Option<String>,
    first_seq: i64,
) -> Option<(String, u64)> {
    let md = pos.sink.metadata();
    let current = pos
        .checkpoint
        .as_ref()
        .is_some_and(|c| c.transform.as_deref() == Some(pos.hash.as_str()));
    let since = summary::finished_refresh(md, first_seq);
    let over = match start {
        Start::Never => true,
        Start::Allowed => current && (seen.is_some() || since.is_some()),
        Start::Restart => false,
    };
    if !over {
        return None;
    }
    since
        .or_else(|| summary::finished_refresh(md, 0))
        .or_else(|| seen.clone().map(|id| (id, 0)))
        .or_else(|| Some((String::new(), 0)))
}

/// What building a chunk produced.
#[derive(Debug)]
struct Built {
    change: Change,
    rows_read: u64,
    rows_out: u64,
    files_read: usize,
    bytes_read: u64,
    files_replaced: usize,
    /// The sink is unpartitioned and the chunk rewrote rows outside its span.
    rewrote_unpartitioned: bool,
}

/// The refresh recorded on the sink, when it still applies; else a new one at the source's
/// current snapshot (the reason an old one was dropped goes to `progress.restarted`).
fn resume_or_start(
    p: &PipelineConfig,
    pos: &Position,
    recorded: Option<RefreshPosition>,
    progress: &mut RefreshProgress,
) -> Refresh {
    if let Some(r) = recorded {
        let why = if r.source != pos.source_uuid {
            Some(format!(
                "the source table was replaced (uuid {} → {})",
                r.source, pos.source_uuid
            ))
        } else if r.transform != pos.hash {
            Some(format!(
                "the transform changed (version {} → {})",
                r.transform, pos.hash
            ))
        } else if pos.source.metadata().snapshot_by_id(r.target).is_none() {
            Some(format!(
                "its target snapshot {} of `{}` was expired",
                r.target, p.source
            ))
        } else {
            None
        };
        match why {
            None => {
                return Refresh {
                    id: r.id,
                    target: Some(r.target),
                    next: Some(r.next),
                    chunks_done: r.chunks,
                }
            }
            Some(why) => {
                let why = format!(
                    "refresh {} started over after {} chunks: {why}",
                    r.id, r.chunks
                );
                tracing::warn!(pipeline = %p.name, reason = %why, "refresh restarted");
                progress.restarted = Some(why);
            }
        }
    }
    Refresh {
        id: uuid::Uuid::now_v7().to_string(),
        target: pos.source.metadata().current_snapshot_id(),
        next: None,
        chunks_done: 0,
    }
}

/// The windows each data file's rows fall in, as `(first, last, rows)` window indices: from the
/// manifests' time bounds and record counts; a file without bounds has its time column read
/// (a projected read, one bounded chunk of files at a time) and counted per window.
async fn window_spans(
    source: &Table,
    files: &[LiveFile],
    time_column: &str,
    window: i64,
) -> Result<Vec<(i64, i64, f64)>> {
    let field = source
        .metadata()
        .current_schema()
        .field_by_name(time_column)
        .map(|f| f.id);
    let mut spans = Vec::with_capacity(files.len());
    let mut unbounded = Vec::new();
    for f in files {
        let bounds = field.and_then(|id| {
            let lo = f.file.lower_bounds().get(&id).and_then(windows::micros)?;
            let hi = f.file.upper_bounds().get(&id).and_then(windows::micros)?;
            Some((lo.div_euclid(window), hi.div_euclid(window)))
        });
        match bounds {
            Some((lo, hi)) => spans.push((lo, hi, f.file.record_count() as f64)),
            None => unbounded.push(f.clone()),
        }
    }
    for chunk in input::chunks(&unbounded) {
        let (times, _) = input::read_column(source, chunk, time_column).await?;
        let mut counts: BTreeMap<i64, f64> = BTreeMap::new();
        for b in &times {
            let b = transform::with_window_start(b, time_column, window)?;
            for w in transform::window_starts(&b) {
                *counts.entry(w.div_euclid(window)).or_default() += 1.0;
            }
        }
        spans.extend(counts.into_iter().map(|(w, n)| (w, w, n)));
    }
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows per chunk under the even-spread estimate, for chunks ending at `bounds`.
    fn chunk_rows(spans: &[(i64, i64, f64)], bounds: &[i64]) -> Vec<f64> {
        let mut edges = vec![i64::MIN];
        edges.extend(bounds);
        edges.push(i64::MAX);
        edges
            .windows(2)
            .map(|e| {
                spans
                    .iter()
                    .map(|&(a, b, rows)| {
                        let lo = a.max(e[0]);
                        let hi = b.saturating_add(1).min(e[1]);
                        if hi <= lo {
                            0.0
                        } else {
                            rows * (hi - lo) as f64 / (b - a + 1) as f64
                        }
                    })
                    .sum()
            })
            .collect()
    }

    #[test]
    fn chunks_hold_at_most_the_budget_and_cover_every_window() {
        // Ten files of 100 rows, each over 2 windows, overlapping: 1000 rows in 11 windows.
        let spans: Vec<(i64, i64, f64)> = (0..10).map(|i| (i, i + 1, 100.0)).collect();
        let bounds = boundaries(&spans, 100);
        assert!(bounds.windows(2).all(|b| b[0] < b[1]), "{bounds:?}");
        let rows = chunk_rows(&spans, &bounds);
        assert!(rows.len() >= 10, "{} chunks: {bounds:?}", rows.len());
        assert!(rows.iter().all(|r| *r <= 100.0 + 1e-6), "{rows:?}");
        assert!((rows.iter().sum::<f64>() - 1000.0).abs() < 1e-6);
        // A budget above the table: one chunk, no boundary.
        assert!(boundaries(&spans, 10_000).is_empty());
        assert!(boundaries(&[], 10).is_empty());
    }

    #[test]
    fn a_window_over_the_budget_is_a_chunk_of_its_own() {
        let spans = [(5, 5, 500.0), (6, 9, 40.0)];
        let bounds = boundaries(&spans, 100);
        assert_eq!(bounds, vec![6], "{bounds:?}");
        // A long sparse file: chunks of many windows, none past its end.
        let bounds = boundaries(&[(0, 999_999, 1000.0)], 250);
        assert_eq!(bounds, vec![250_000, 500_000, 750_000]);
    }

    #[test]
    fn a_counted_chunk_is_cut_to_the_budget_and_remembered() {
        // Rows without a time, then windows of 60, 60, 500 (over the budget alone), 30, 30.
        let counts: BTreeMap<Option<i64>, u64> = [
            (None, 10),
            (Some(100), 50),
            (Some(200), 60),
            (Some(300), 500),
            (Some(400), 30),
            (Some(500), 30),
        ]
        .into_iter()
        .collect();
        assert_eq!(split(&counts, 100), vec![200, 300, 400]);
        assert!(split(&counts, 10_000).is_empty());
        assert!(split(&BTreeMap::new(), 1).is_empty());
        // Only rows without a time, over the budget: nothing to cut at.
        assert!(split(&[(None, 500)].into_iter().collect(), 100).is_empty());

        let mut plan = ChunkPlan::windows(vec![1000]);
        assert!(plan.needs_count(None));
        let (c, next, after) = plan.chunk_from(None).unwrap();
        let Chunk::Span(span) = c else {
            panic!("{c:?}")
        };
        assert_eq!((next, after), (Some(1000), 1));
        plan.refine(span, &split(&counts, 100));
        let (_, next, after) = plan.chunk_from(None).unwrap();
        assert_eq!((next, after), (Some(200), 4));
        for lo in [None, Some(200), Some(300), Some(400)] {
            assert!(!plan.needs_count(lo), "{lo:?}");
        }
        // The chunk after the counted span was not counted yet.
        assert!(plan.needs_count(Some(1000)));
    }

    fn file(path: &str, rows: u64) -> LiveFile {
        use iceberg::spec::{DataContentType, DataFileBuilder, DataFileFormat, Struct};
        LiveFile {
            file: DataFileBuilder::default()
                .content(DataContentType::Data)
                .file_path(path.to_string())
                .file_format(DataFileFormat::Parquet)
                .partition(Struct::empty())
                .record_count(rows)
                .file_size_in_bytes(10)
                .build()
                .unwrap(),
            spec_id: 0,
            deletes: Vec::new(),
        }
    }

    #[test]
    fn file_chunks_resume_from_the_position() {
        let files: Vec<LiveFile> = (0..7).map(|i| file(&format!("f{i}"), 40)).collect();
        let plan = ChunkPlan::Files { files, budget: 100 };
        let paths = |c: &Chunk| match c {
            Chunk::Files(g) => g.iter().map(|f| f.file.file_path().to_string()).collect(),
            _ => Vec::new(),
        };
        let (c, next, after) = plan.chunk_from(None).unwrap();
        assert_eq!(paths(&c), ["f0", "f1"]);
        assert_eq!((next, after), (Some(2), 3));
        let (c, next, after) = plan.chunk_from(Some(6)).unwrap();
        assert_eq!(paths(&c), ["f6"]);
        assert_eq!((next, after), (None, 0));
        // A position that is no file index: an error, not the first chunk without its removal.
        for bad in [-1, 7, i64::MIN] {
            let e = plan.chunk_from(Some(bad)).unwrap_err();
            assert!(e.contains(&bad.to_string()), "{e}");
        }
        let windows = ChunkPlan::windows(vec![10, 20, 30]);
        let (c, next, after) = windows.chunk_from(None).unwrap();
        assert!(
            matches!(
                c,
                Chunk::Span(Span {
                    lo: None,
                    hi: Some(10)
                })
            ),
            "{c:?}"
        );
        assert_eq!((next, after), (Some(10), 3));
        let (c, next, after) = windows.chunk_from(Some(20)).unwrap();
        assert!(
            matches!(
                c,
                Chunk::Span(Span {
                    lo: Some(20),
                    hi: Some(30)
                })
            ),
            "{c:?}"
        );
        assert_eq!((next, after), (Some(30), 1));
        let (c, next, after) = windows.chunk_from(Some(30)).unwrap();
        assert!(
            matches!(
                c,
                Chunk::Span(Span {
                    lo: Some(30),
                    hi: None
                })
            ),
            "{c:?}"
        );
        assert_eq!((next, after), (None, 0));
        // A position between boundaries (the budget changed between calls) still resumes.
        let (c, next, _) = windows.chunk_from(Some(15)).unwrap();
        assert!(
            matches!(
                c,
                Chunk::Span(Span {
                    lo: Some(15),
                    hi: Some(20)
                })
            ),
            "{c:?}"
        );
        assert_eq!(next, Some(20));
    }
}
