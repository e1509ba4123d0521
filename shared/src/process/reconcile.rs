//! The batch speed over the same SQL: the batch result over the whole source (which `refresh`
//! in `refresh.rs` writes), and `reconcile`, which compares it with the incrementally maintained
//! sink.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow_schema::SchemaRef;
use iceberg::table::Table;
use serde::Serialize;

use super::joins::Joined;
use super::latest::Latest;
use super::{input, transform, Processor};
use crate::config::{PipelineConfig, PipelineMode};
use crate::error::{Error, ErrorKind, Result};

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

/// Relative tolerance of floating-point values: a merged sum adds the same terms in another
/// order than the batch does, so it may differ from it in the last bits (integers and decimals
/// compare exactly).
pub(crate) const FLOAT_TOLERANCE: f64 = 1e-9;

/// Whether two canonical floats are equal within [`FLOAT_TOLERANCE`] × their magnitude (NULLs,
/// NaNs and infinities only equal themselves).
fn same_float(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) if x.is_finite() && y.is_finite() => {
            (x - y).abs() <= FLOAT_TOLERANCE * x.abs().max(y.abs())
        }
        _ => false,
    }
}

/// Whether a key's rows on both sides are equal (floating-point columns within the tolerance).
fn same_rows(a: Option<&Vec<Vec<String>>>, b: Option<&Vec<Vec<String>>>, floats: &[bool]) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            a.len() == b.len()
                && a.iter().zip(b).all(|(x, y)| {
                    x.len() == y.len()
                        && x.iter().zip(y).enumerate().all(|(i, (u, v))| {
                            u == v || (floats.get(i).copied().unwrap_or(false) && same_float(u, v))
                        })
                })
        }
        (None, None) => true,
        _ => false,
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

    /// The batch result: the pipeline's SQL over the whole source at `snapshot`, with the
    /// `joined` tables.
    pub(super) async fn batch_output(
        &self,
        p: &PipelineConfig,
        source: &Table,
        snapshot: Option<i64>,
        joined: &Joined,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let context = format!("pipeline `{}` over `{}` (batch)", p.name, p.source);
        let joined = &joined.relations;
        if snapshot.is_none() && source.metadata().current_snapshot_id().is_none() {
            let (schema, _) = self.batch_input(p, source, None, true).await?;
            return transform::run_sql_joined(&p.sql, schema, Vec::new(), joined, &context).await;
        }
        let (schema, rows) = self.batch_input(p, source, snapshot, false).await?;
        let (schema, out) =
            transform::run_sql_joined(&p.sql, schema, rows, joined, &context).await?;
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

    /// A `latest` refresh's batch: the live rows (returned, for the sink), its deletes committed
    /// as the new tombstones first. None: the tombstones changed meanwhile, or a table's
    /// partition spec was just moved to the configured key buckets (the refresh reloads both).
    pub(super) async fn refresh_latest(
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
        super::refresh::refuse_during_refresh(p, &pos)?;
        let at = pos.checkpoint.as_ref().map(|c| c.snapshot_id);
        let (schema, batch) = match &pos.checkpoint {
            Some(cp) => {
                // The joined tables as the run that made the checkpoint read them.
                let joined = self
                    .joined_as_recorded(p, &pos.sink, cp.sink_snapshot_id)
                    .await?;
                self.batch_output(p, &pos.source, Some(cp.snapshot_id), &joined)
                    .await?
            }
            None => {
                let (s, _) = self.batch_input(p, &pos.source, None, true).await?;
                let joined = self.joined(p, false).await?;
                let context = format!("pipeline `{}`", p.name);
                transform::run_sql_joined(&p.sql, s, Vec::new(), &joined.relations, &context)
                    .await?
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
        let floats: Vec<bool> = schema
            .fields()
            .iter()
            .map(|f| f.data_type().is_floating())
            .collect();
        for k in keys {
            let (a, b) = (lm.get(k), rm.get(k));
            if !same_rows(a, b, &floats) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_compare_within_a_relative_tolerance_other_values_exactly() {
        let row = |v: &[&str]| vec![v.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
        let floats = [false, true];
        let (a, b) = (row(&["7", "1.0000000000000002e3"]), row(&["7", "1e3"]));
        assert!(same_rows(Some(&a), Some(&b), &floats));
        let c = row(&["7", "1.00001e3"]);
        assert!(!same_rows(Some(&a), Some(&c), &floats));
        // Integers (and decimals, keys) exactly.
        let d = row(&["8", "1e3"]);
        assert!(!same_rows(Some(&b), Some(&d), &floats));
        assert!(!same_rows(Some(&b), None, &floats));
        assert!(same_float("NULL", "NULL") && !same_float("NULL", "0e0"));
        assert!(!same_float("NaN", "1e0") && same_float("0e0", "0e0"));
    }
}
