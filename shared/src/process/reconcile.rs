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
/// order than the batch does (and DataFusion's partitions change the order of a batch's too), so
/// it may differ from it in the last bits (integers and decimals compare exactly).
pub(crate) const FLOAT_TOLERANCE: f64 = 1e-9;

/// The magnitude below which a float is compared absolutely, as a fraction of its column's
/// largest magnitude (both sides): a sum's rounding error is bounded by the magnitude of its
/// terms, not of its result, so a sum of `+x, -x` may be `1e-17` on one side and `0` on the
/// other. The terms are unknown here; the column's largest value stands for their scale, and
/// `1e-3` of it keeps `FLOAT_TOLERANCE × 1e-3 = 1e-12` of the scale as the absolute floor: room
/// for the rounding of thousands of such terms (each at most 2⁻⁵³ ≈ 1.1e-16 of the scale), while
/// a missing or extra row hides only if its value is twelve orders of magnitude below the
/// column's largest.
const FLOAT_FLOOR: f64 = 1e-3;

/// Whether two canonical floats are equal within [`FLOAT_TOLERANCE`] × their magnitude, or of
/// `floor` when both are smaller (NULLs, NaNs and infinities only equal themselves).
fn same_float(a: &str, b: &str, floor: f64) -> bool {
    if a == b {
        return true;
    }
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) if x.is_finite() && y.is_finite() => {
            (x - y).abs() <= FLOAT_TOLERANCE * x.abs().max(y.abs()).max(floor)
        }
        _ => false,
    }
}

/// Per column: `Some(floor)` for a floating-point column (see [`same_float`]: [`FLOAT_FLOOR`] ×
/// its largest finite magnitude in `rows`), `None` for one compared exactly.
fn float_floors(is_float: &[bool], rows: &[&[Vec<String>]]) -> Vec<Option<f64>> {
    is_float
        .iter()
        .enumerate()
        .map(|(i, f)| {
            f.then(|| {
                let scale = rows
                    .iter()
                    .flat_map(|r| r.iter())
                    .filter_map(|r| r.get(i).and_then(|v| v.parse::<f64>().ok()))
                    .filter(|v| v.is_finite())
                    .fold(0.0, |m: f64, v| m.max(v.abs()));
                FLOAT_FLOOR * scale
            })
        })
        .collect()
}

/// The columns rows are matched by: the pipeline's `keys`, else every column but the
/// floating-point ones (whose values may differ in the last bits: they are compared within
/// the tolerance among the rows of a key).
fn key_columns(p: &PipelineConfig, columns: &[String], is_float: &[bool]) -> Result<Vec<usize>> {
    if p.keys.is_empty() {
        return Ok((0..columns.len())
            .filter(|&i| !is_float.get(i).copied().unwrap_or(false))
            .collect());
    }
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
        .collect()
}

/// Rows by their key (`key_idx`'s values), each key's rows sorted.
fn by_key(rows: &[Vec<String>], key_idx: &[usize]) -> BTreeMap<Vec<String>, Vec<Vec<String>>> {
    let mut m: BTreeMap<Vec<String>, Vec<Vec<String>>> = BTreeMap::new();
    for r in rows {
        let key = key_idx.iter().map(|&i| r[i].clone()).collect();
        m.entry(key).or_default().push(r.clone());
    }
    // Numbers in their order (floats that differ in the last bits stay paired), then text.
    let cmp = |u: &String, v: &String| match (u.parse::<f64>(), v.parse::<f64>()) {
        (Ok(a), Ok(b)) => a.total_cmp(&b),
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(_), Err(_)) => u.cmp(v),
    };
    for v in m.values_mut() {
        v.sort_by(|x, y| {
            x.iter()
                .zip(y)
                .map(|(u, v)| cmp(u, v))
                .find(|o| o.is_ne())
                .unwrap_or_else(|| x.len().cmp(&y.len()))
        });
    }
    m
}

/// Whether a key's rows on both sides are equal (floating-point columns within the tolerance).
fn same_rows(
    a: Option<&Vec<Vec<String>>>,
    b: Option<&Vec<Vec<String>>>,
    floats: &[Option<f64>],
) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            a.len() == b.len()
                && a.iter().zip(b).all(|(x, y)| {
                    x.len() == y.len()
                        && x.iter().zip(y).enumerate().all(|(i, (u, v))| {
                            u == v
                                || floats
                                    .get(i)
                                    .copied()
                                    .flatten()
                                    .is_some_and(|floor| same_float(u, v, floor))
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
        let is_float: Vec<bool> = schema
            .fields()
            .iter()
            .map(|f| f.data_type().is_floating())
            .collect();
        let key_idx = key_columns(p, &columns, &is_float)?;
        let left = transform::canonical_rows(&batch, &columns)?;
        let right = transform::canonical_rows(&sink_rows, &columns)?;
        let floats = float_floors(&is_float, &[&left, &right]);
        let (lm, rm) = (by_key(&left, &key_idx), by_key(&right, &key_idx));
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
        let floats = [None, Some(0.0)];
        let (a, b) = (row(&["7", "1.0000000000000002e3"]), row(&["7", "1e3"]));
        assert!(same_rows(Some(&a), Some(&b), &floats));
        let c = row(&["7", "1.00001e3"]);
        assert!(!same_rows(Some(&a), Some(&c), &floats));
        // Integers (and decimals, keys) exactly.
        let d = row(&["8", "1e3"]);
        assert!(!same_rows(Some(&b), Some(&d), &floats));
        assert!(!same_rows(Some(&b), None, &floats));
        assert!(same_float("NULL", "NULL", 0.0) && !same_float("NULL", "0e0", 0.0));
        assert!(!same_float("NaN", "1e0", 0.0) && same_float("0e0", "0e0", 0.0));
    }

    fn keyless() -> PipelineConfig {
        let toml = r#"
name = "p"
source = "orders"
sink = "s"
mode = "aggregate"
window = "1m"
sql = "SELECT 1"
"#;
        toml::from_str(toml).unwrap()
    }

    /// Review finding: a keyless pipeline matched rows by every column, float sums included, so
    /// a sum that differs in the last bits was a missing row on both sides; and a sum of
    /// `+x, -x` (`1e-17` against `0`) was a difference, the tolerance being relative to it.
    #[test]
    fn keyless_rows_match_floats_within_the_tolerance_with_an_absolute_floor() {
        let columns: Vec<String> = ["window_start", "region", "revenue", "orders"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let is_float = [false, false, true, false];
        let key_idx = key_columns(&keyless(), &columns, &is_float).unwrap();
        assert_eq!(key_idx, vec![0, 1, 3]);
        let rows = |v: &[[&str; 4]]| -> Vec<Vec<String>> {
            v.iter()
                .map(|r| r.iter().map(|s| s.to_string()).collect())
                .collect()
        };
        let batch = rows(&[
            ["0", "eu", "1.0000000000000002e3", "3"],
            ["0", "us", "1e-17", "2"],
            ["60", "eu", "2.5e0", "1"],
            ["60", "eu", "7e2", "1"],
        ]);
        let sink = rows(&[
            ["0", "eu", "1e3", "3"],
            ["0", "us", "0e0", "2"],
            ["60", "eu", "6.999999999999999e2", "1"],
            ["60", "eu", "2.5e0", "1"],
        ]);
        let floats = float_floors(&is_float, &[&batch, &sink]);
        let (l, r) = (by_key(&batch, &key_idx), by_key(&sink, &key_idx));
        assert_eq!(l.len(), 3);
        for (k, v) in &l {
            assert!(
                same_rows(Some(v), r.get(k), &floats),
                "{k:?}: {v:?} · {:?}",
                r.get(k)
            );
        }
        // A real difference still is one: a missing order of 0.01 in a column up to 1000.
        let off = rows(&[["60", "eu", "2.51e0", "1"], ["60", "eu", "7e2", "1"]]);
        let k = vec!["60".to_string(), "eu".to_string(), "1".to_string()];
        assert!(!same_rows(
            by_key(&off, &key_idx).get(&k),
            r.get(&k),
            &floats
        ));
        assert!(!same_float("1e-17", "0e0", 0.0), "no floor: relative only");
    }
}
