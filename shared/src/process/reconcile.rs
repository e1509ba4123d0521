//! The batch speed over the same SQL: `refresh` recomputes a sink from the whole source (backfill,
//! a changed transform), `reconcile` compares that batch result with the incrementally maintained
//! sink.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow_schema::SchemaRef;
use iceberg::table::Table;
use serde::Serialize;

use super::latest::Latest;
use super::output::Output;
use super::processor::MAX_ROUNDS;
use super::{input, transform, windows, Processor, RunReport};
use crate::commit::{Outcome, Plan, Skipped};
use crate::config::{PipelineConfig, PipelineMode};
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::Change;
use crate::summary;

/// The result of comparing a batch run with the incrementally maintained sink.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Reconciliation {
    /// Pipeline name.
    pub pipeline: String,
    /// The source snapshot both sides stand at (the sink's checkpoint).
    pub at_snapshot: Option<i64>,
    /// Rows the batch run produces.
    pub batch_rows: usize,
    /// Rows in the sink.
    pub sink_rows: usize,
    /// Keys compared.
    pub keys: usize,
    /// Keys whose rows differ, are missing from the sink, or are only in the sink (examples).
    pub differences: Vec<String>,
    /// Number of differing keys.
    pub differing: usize,
    /// Per numeric column: (column, batch total, sink total).
    pub totals: Vec<(String, f64, f64)>,
}

impl Reconciliation {
    /// True when the sink equals the batch result.
    pub fn matches(&self) -> bool {
        self.differing == 0 && self.batch_rows == self.sink_rows
    }
}

impl Processor {
    /// Rows of the whole source (at `snapshot`, default current) as the SQL sees them.
    /// `empty`: only the schema.
    pub(super) async fn batch_input(
        &self,
        p: &PipelineConfig,
        source: &Table,
        snapshot: Option<i64>,
        empty: bool,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let schema = transform::table_schema(source)?;
        let mut rows = Vec::new();
        if !empty && source.metadata().current_snapshot_id().is_some() {
            rows = input::scan_rows(source, snapshot, None, &schema).await?.0;
        }
        if p.mode != PipelineMode::Aggregate {
            return Ok((schema, rows));
        }
        let window = p.window_micros().unwrap_or(60_000_000);
        let time_column = p.time_column(&self.config);
        let empty_batch = RecordBatch::new_empty(schema.clone());
        let with_w = transform::with_window_start(&empty_batch, time_column, window)?;
        let mut out = Vec::with_capacity(rows.len());
        for b in rows {
            out.push(transform::with_window_start(&b, time_column, window)?);
        }
        Ok((with_w.schema(), out))
    }

    /// The batch result: the pipeline's SQL over the whole source at `snapshot`.
    async fn batch_output(
        &self,
        p: &PipelineConfig,
        source: &Table,
        snapshot: Option<i64>,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let context = format!("pipeline `{}` over `{}` (batch)", p.name, p.source);
        if snapshot.is_none() && source.metadata().current_snapshot_id().is_none() {
            let (schema, _) = self.batch_input(p, source, None, true).await?;
            return transform::run_sql(&p.sql, schema, Vec::new(), &context).await;
        }
        let (schema, rows) = self.batch_input(p, source, snapshot, false).await?;
        let (schema, out) = transform::run_sql(&p.sql, schema, rows, &context).await?;
        if p.mode != PipelineMode::Latest {
            return Ok((schema, out));
        }
        // Latest state: the greatest version per key over the whole source, deletes left out.
        let (live, _) = self.latest_batch(p, &schema, &out)?;
        Ok((schema, vec![live]))
    }

    /// The latest version per key of a batch's output, split into live rows and deletes.
    fn latest_batch(
        &self,
        p: &PipelineConfig,
        schema: &SchemaRef,
        out: &[RecordBatch],
    ) -> Result<(RecordBatch, RecordBatch)> {
        let latest = Latest::new(p, schema)?;
        latest.split_deletes(&latest.reduce(out)?)
    }

    /// Batch / backfill: runs the SQL over the whole source table and replaces the sink's content
    /// with the result, checkpointed at the source's current snapshot with the current transform
    /// version (the way out of a changed transform, an expired checkpoint or a row change).
    pub async fn refresh(&self, name: &str, deadline: Instant) -> Result<RunReport> {
        let p = self.pipeline(name)?;
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
                self.batch_output(p, &pos.source, to).await?
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
            let change = Change::overwrite(added.clone(), removed, props, schema);
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

    /// A `latest` refresh's batch: the live rows (returned, for the sink), its deletes committed
    /// as the new tombstones first. None: the tombstones changed meanwhile, or a table's
    /// partition spec was just moved to the configured key buckets (the refresh reloads both).
    async fn refresh_latest(
        &self,
        p: &PipelineConfig,
        pos: &super::processor::Position,
        to: Option<i64>,
        deadline: Instant,
    ) -> Result<Option<(SchemaRef, Vec<RecordBatch>)>> {
        // The configured key-bucket layout first (a changed `key_buckets` or key): both
        // tables' default spec, then a reload, so every file below is written with it.
        let mut moved = false;
        for t in pos.tombstones.iter().chain(std::iter::once(&pos.sink)) {
            moved |= self.set_layout(p, t, deadline).await?;
        }
        if moved {
            return Ok(None);
        }
        let context = format!("pipeline `{}` over `{}` (batch)", p.name, p.source);
        let empty = to.is_none();
        let (schema, rows) = self.batch_input(p, &pos.source, to, empty).await?;
        let (schema, out) = transform::run_sql(&p.sql, schema, rows, &context).await?;
        let latest = Latest::new(p, &schema)?;
        let (live, deletes) = latest.split_deletes(&latest.reduce(&out)?)?;
        if let Some(t) = &pos.tombstones {
            let seq = to
                .and_then(|id| pos.source.metadata().snapshot_by_id(id))
                .map(|s| s.sequence_number())
                .unwrap_or_default();
            if !self
                .refresh_tombstones(p, t, &pos.source_uuid, &latest, deletes, seq, deadline)
                .await?
            {
                return Ok(None);
            }
        }
        Ok(Some((schema, vec![live])))
    }

    /// Runs the batch result at the sink's checkpoint and compares it with the sink: row counts,
    /// rows per key (`keys`, else whole rows) and per-column totals.
    pub async fn reconcile(&self, name: &str) -> Result<Reconciliation> {
        let p = self.pipeline(name)?;
        let pos = self.position(p).await?;
        let at = pos.checkpoint.as_ref().map(|c| c.snapshot_id);
        let (schema, batch) = match at {
            Some(id) => self.batch_output(p, &pos.source, Some(id)).await?,
            None => {
                let (s, _) = self.batch_input(p, &pos.source, None, true).await?;
                let context = format!("pipeline `{}`", p.name);
                transform::run_sql(&p.sql, s, Vec::new(), &context).await?
            }
        };
        let sink_rows = input::scan_table(&pos.sink).await?;
        let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let key_idx: Vec<usize> = if p.keys.is_empty() {
            (0..columns.len()).collect()
        } else {
            p.keys
                .iter()
                .map(|k| {
                    columns.iter().position(|c| c == k).ok_or_else(|| {
                        Error::new(
                            ErrorKind::Config,
                            format!(
                                "pipeline `{}`: key `{k}` is not an output column ({})",
                                p.name,
                                columns.join(", ")
                            ),
                        )
                    })
                })
                .collect::<Result<_>>()?
        };
        let left = transform::canonical_rows(&batch, &columns)?;
        let right = transform::canonical_rows(&sink_rows, &columns)?;
        let group = |rows: &[Vec<String>]| {
            let mut m: BTreeMap<Vec<String>, Vec<Vec<String>>> = BTreeMap::new();
            for r in rows {
                let key = key_idx.iter().map(|&i| r[i].clone()).collect();
                m.entry(key).or_default().push(r.clone());
            }
            for v in m.values_mut() {
                v.sort();
            }
            m
        };
        let (lm, rm) = (group(&left), group(&right));
        let mut rec = Reconciliation {
            pipeline: p.name.clone(),
            at_snapshot: at,
            batch_rows: left.len(),
            sink_rows: right.len(),
            ..Default::default()
        };
        let keys: BTreeSet<&Vec<String>> = lm.keys().chain(rm.keys()).collect();
        rec.keys = keys.len();
        for k in keys {
            let (a, b) = (lm.get(k), rm.get(k));
            if a != b {
                rec.differing += 1;
                if rec.differences.len() < 20 {
                    let show = |v: Option<&Vec<Vec<String>>>| match v {
                        None => "missing".to_string(),
                        Some(rows) => rows
                            .iter()
                            .map(|r| r.join("|"))
                            .collect::<Vec<_>>()
                            .join("; "),
                    };
                    rec.differences.push(format!(
                        "key {}: batch {} · sink {}",
                        k.join("|"),
                        show(a),
                        show(b)
                    ));
                }
            }
        }
        for (i, f) in schema.fields().iter().enumerate() {
            if f.data_type().is_numeric() {
                let total = |rows: &[Vec<String>]| {
                    rows.iter()
                        .filter_map(|r| r[i].parse::<f64>().ok())
                        .sum::<f64>()
                };
                rec.totals
                    .push((f.name().clone(), total(&left), total(&right)));
            }
        }
        Ok(rec)
    }
}
