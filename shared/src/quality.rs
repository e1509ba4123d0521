//! Data-quality contracts at ingest: a table's checks evaluated per decoded batch, vectorised
//! (Arrow compute kernels, a DataFusion physical expression for `sql`), never row by row on a
//! slow path. Decoding calls [`Contract::evaluate`] on every batch of valid rows (see
//! `decode::Ctx::emit_valid`); what fails is reported per row with the check's name:
//!
//! * `quarantine` — the row's reason (`quality check `x` failed: …`), the first failed check
//!   named and the others listed;
//! * `flag` — the failed checks' names, comma-separated, in the row's [`QUALITY`] column;
//! * `fail` — the first failing row, which refuses the whole object.
//!
//! Nulls pass every check except `not_null`. `unique` remembers the keys of kept rows across
//! the object's batches as 128-bit hashes, at most `max_unique_keys` of them.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray,
};
use arrow::buffer::BooleanBuffer;
use arrow::compute::kernels::cmp::{gt, lt};
use arrow::compute::kernels::length::length;
use arrow::compute::{cast, or};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion::physical_expr::expressions::{Column, InListExpr};
use datafusion::physical_expr::PhysicalExpr;

use crate::config::contract::{bound_array, compile_regex, max_chars, sql_predicate, values_array};
use crate::config::{Action, CheckConfig, CheckKind};

pub use crate::schema::QUALITY;

/// Why evaluation stopped (beside a `fail` check, which is a [`Checked::fail`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum QualityError {
    /// A configured bound was exceeded (the message names it): the object fails whole.
    #[error("{0}")]
    Limit(String),
    /// A check could not be evaluated on the batch.
    #[error("evaluating quality check `{check}`: {reason}")]
    Eval {
        /// The check.
        check: String,
        /// What went wrong.
        reason: String,
    },
}

/// One check ready to run on batches of one decode schema.
struct Compiled {
    name: String,
    action: Action,
    test: Test,
}

enum Test {
    NotNull(String),
    Range {
        column: String,
        min: Option<ArrayRef>,
        max: Option<ArrayRef>,
        shown: String,
    },
    Accepted {
        column: String,
        /// `column IN (values)`, a hash lookup per row.
        known: Arc<dyn PhysicalExpr>,
    },
    Regex {
        column: String,
        regex: regex::Regex,
    },
    MaxLength {
        column: String,
        max: usize,
    },
    Unique {
        columns: Vec<String>,
        seen: KeySet,
        /// How many of `seen` are the table's recent keys (not the object's).
        from_table: usize,
        within_hours: Option<f64>,
    },
    Sql {
        text: String,
        expr: Arc<dyn PhysicalExpr>,
    },
}

/// A table's checks compiled against the decode schema of one object, with the object's
/// running counts and `unique` keys.
pub(crate) struct Contract {
    checks: Vec<Compiled>,
    counts: Vec<u64>,
    flags: bool,
    max_unique_keys: usize,
    unique_keys: usize,
    /// Rows evaluated so far.
    evaluated: u64,
}

/// What a batch's evaluation found.
#[derive(Debug)]
pub(crate) struct Checked {
    /// The batch, with a [`QUALITY`] column appended when the contract flags.
    pub batch: RecordBatch,
    /// Per row, the quarantine reason (None: kept); None when no row is quarantined.
    pub reasons: Option<Vec<Option<String>>>,
    /// The first row failing a `fail` check, and why: the object is refused.
    pub fail: Option<(usize, String)>,
}

impl Contract {
    /// Compiles `checks` against `schema` (the object's decode schema). `ingested_us` is the
    /// ingestion time that `max_future_seconds` counts from.
    pub(crate) fn compile(
        checks: &[CheckConfig],
        schema: &SchemaRef,
        ingested_us: i64,
        max_unique_keys: usize,
    ) -> std::result::Result<Self, String> {
        let mut compiled = Vec::with_capacity(checks.len());
        for c in checks {
            let test = compile_one(c, schema, ingested_us)
                .map_err(|r| format!("quality check `{}`: {r}", c.name))?;
            compiled.push(Compiled {
                name: c.name.clone(),
                action: c.action,
                test,
            });
        }
        Ok(Self {
            counts: vec![0; compiled.len()],
            flags: compiled.iter().any(|c| c.action == Action::Flag),
            checks: compiled,
            max_unique_keys,
            unique_keys: 0,
            evaluated: 0,
        })
    }

    /// Whether the contract has no checks.
    pub(crate) fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }

    /// Every check's name, action and the rows that failed it so far.
    pub(crate) fn counts(&self) -> Vec<(String, Action, u64)> {
        self.checks
            .iter()
            .zip(&self.counts)
            .map(|(c, n)| (c.name.clone(), c.action, *n))
            .collect()
    }

    /// The `unique` checks that also hold against recent table data: (check, key columns, hours).
    pub(crate) fn recent_unique(&self) -> Vec<(usize, Vec<String>, f64)> {
        self.checks
            .iter()
            .enumerate()
            .filter_map(|(k, c)| match &c.test {
                Test::Unique {
                    columns,
                    within_hours: Some(h),
                    ..
                } => Some((k, columns.clone(), *h)),
                _ => None,
            })
            .collect()
    }

    /// Remembers the keys of table rows (`batch` holds the key columns of check `k`): a row of
    /// the object with one of them fails the check. They count against `max_unique_keys`.
    pub(crate) fn remember(
        &mut self,
        k: usize,
        batch: &RecordBatch,
    ) -> std::result::Result<(), QualityError> {
        let Some(check) = self.checks.get_mut(k) else {
            return Ok(());
        };
        let Test::Unique {
            columns,
            seen,
            from_table,
            ..
        } = &mut check.test
        else {
            return Ok(());
        };
        let name = &check.name;
        let eval = |reason: String| QualityError::Eval {
            check: name.clone(),
            reason,
        };
        let keys: Vec<ArrayRef> = columns
            .iter()
            .map(|c| col(batch, c).cloned())
            .collect::<std::result::Result<_, _>>()
            .map_err(eval)?;
        for hash in key_hashes(&keys).map_err(eval)?.into_iter().flatten() {
            if seen.insert(hash) {
                *from_table += 1;
                self.unique_keys += 1;
                if self.unique_keys > self.max_unique_keys {
                    return Err(QualityError::Limit(format!(
                        "the object and the table's recent rows have more than max_unique_keys = \
                         {} distinct keys for its `unique` checks",
                        self.max_unique_keys
                    )));
                }
            }
        }
        Ok(())
    }

    /// Runs every check on `batch`.
    pub(crate) fn evaluate(
        &mut self,
        batch: RecordBatch,
    ) -> std::result::Result<Checked, QualityError> {
        let n = batch.num_rows();
        self.evaluated += n as u64;
        let mut reasons: Option<Vec<Option<String>>> = None;
        let mut also: Vec<Vec<usize>> = Vec::new();
        let mut flagged: Option<Vec<Option<String>>> = None;
        let mut fail: Option<(usize, String)> = None;
        // `unique` runs last, over the rows the other checks keep: a quarantined row's key is
        // not in the table, so it does not make a later row a duplicate.
        let order: Vec<usize> = (0..self.checks.len())
            .filter(|&k| !matches!(self.checks[k].test, Test::Unique { .. }))
            .chain(
                (0..self.checks.len())
                    .filter(|&k| matches!(self.checks[k].test, Test::Unique { .. })),
            )
            .collect();
        // Rows a `sql` check could not be evaluated on, with the error (they fail it).
        let mut erred: Vec<(usize, String)> = Vec::new();
        // Per check, the rows failing it, for the `unique` checks (evaluated together).
        let mut unique: Vec<Option<BooleanBuffer>> = Vec::new();
        for k in order {
            erred.clear();
            if unique.is_empty() && matches!(self.checks[k].test, Test::Unique { .. }) {
                unique = self.unique_failures(&batch, reasons.as_ref())?;
            }
            let check = &mut self.checks[k];
            let failing = match &mut check.test {
                Test::Unique { .. } => unique
                    .get_mut(k)
                    .and_then(Option::take)
                    .unwrap_or_else(|| BooleanBuffer::new_unset(n)),
                Test::Sql { expr, .. } => {
                    sql_failures(expr, &batch, &mut erred).map_err(|reason| QualityError::Eval {
                        check: check.name.clone(),
                        reason,
                    })?
                }
                test => failures(test, &batch).map_err(|reason| QualityError::Eval {
                    check: check.name.clone(),
                    reason,
                })?,
            };
            let count = failing.count_set_bits();
            self.counts[k] += count as u64;
            if count == 0 {
                continue;
            }
            let check = &self.checks[k];
            match check.action {
                Action::Fail => {
                    if fail.is_none() {
                        if let Some(row) = failing.set_indices().next() {
                            fail = Some((
                                row,
                                format!(
                                    "quality check `{}` (action fail) failed: {}",
                                    check.name,
                                    describe_row(&check.test, &batch, row, &erred)
                                ),
                            ));
                        }
                    }
                }
                Action::Quarantine => {
                    let slots = reasons.get_or_insert_with(|| vec![None; n]);
                    if also.is_empty() {
                        also = vec![Vec::new(); n];
                    }
                    for row in failing.set_indices() {
                        match &slots[row] {
                            Some(_) => also[row].push(k),
                            None => {
                                slots[row] = Some(format!(
                                    "quality check `{}` failed: {}",
                                    check.name,
                                    describe_row(&check.test, &batch, row, &erred)
                                ))
                            }
                        }
                    }
                }
                Action::Flag => {
                    let slots = flagged.get_or_insert_with(|| vec![None; n]);
                    for row in failing.set_indices() {
                        match &mut slots[row] {
                            Some(names) => {
                                names.push(',');
                                names.push_str(&check.name);
                            }
                            slot => *slot = Some(check.name.clone()),
                        }
                    }
                }
            }
        }
        if let Some(slots) = reasons.as_mut() {
            for (slot, more) in slots.iter_mut().zip(&also) {
                if let (Some(reason), false) = (slot.as_mut(), more.is_empty()) {
                    let names: Vec<&str> =
                        more.iter().map(|&k| self.checks[k].name.as_str()).collect();
                    reason.push_str(&format!(" (also failed: {})", names.join(", ")));
                }
            }
        }
        let batch = if self.flags {
            let column: ArrayRef = match flagged {
                Some(names) => Arc::new(StringArray::from(names)),
                None => new_null_array(&DataType::Utf8, n),
            };
            with_quality(&batch, column).map_err(|reason| QualityError::Eval {
                check: QUALITY.into(),
                reason,
            })?
        } else {
            batch
        };
        Ok(Checked {
            batch,
            reasons,
            fail,
        })
    }
}

impl Contract {
    fn too_many_keys(&self) -> QualityError {
        QualityError::Limit(format!(
            "the object has more than max_unique_keys = {} distinct keys for its `unique` checks",
            self.max_unique_keys
        ))
    }

    /// Makes room in the `unique` checks' key sets for the keys of `rows` records in all (an
    /// estimate of the object's records): as many distinct keys as their share among the rows
    /// evaluated so far, at most `max_unique_keys`. One allocation instead of a rehash at every
    /// doubling, and no room for keys that repeat.
    pub(crate) fn expect_rows(&mut self, rows: u64) {
        if self.evaluated == 0 {
            return;
        }
        let evaluated = u128::from(self.evaluated);
        for c in &mut self.checks {
            if let Test::Unique {
                seen, from_table, ..
            } = &mut c.test
            {
                let own = seen.len().saturating_sub(*from_table) as u128;
                let distinct =
                    usize::try_from(u128::from(rows) * own / evaluated).unwrap_or(usize::MAX);
                let keys = from_table
                    .saturating_add(distinct)
                    .min(self.max_unique_keys);
                if seen.capacity() < keys {
                    seen.reserve(keys - seen.len());
                }
            }
        }
    }

    /// Per check (None but for `unique` ones), the rows of `batch` whose key was seen before
    /// in the object (in an earlier row kept, of this batch or an earlier one) or in the
    /// table's recent rows. Rows are taken in order across all `unique` checks: a row that a
    /// quarantine check drops (`dropped`, or a `unique` one with action quarantine) is not in
    /// the table, so none of its keys is remembered. Rows with a null key part pass. A
    /// collision of two keys' 128-bit hashes (which would fail a unique row) is a 2^-128 event
    /// per pair.
    fn unique_failures(
        &mut self,
        batch: &RecordBatch,
        dropped: Option<&Vec<Option<String>>>,
    ) -> std::result::Result<Vec<Option<BooleanBuffer>>, QualityError> {
        // (check, its action, per row the hash of its key)
        let mut keyed: Vec<(usize, Action, Vec<Option<u128>>)> = Vec::new();
        for (k, c) in self.checks.iter().enumerate() {
            let Test::Unique { columns, .. } = &c.test else {
                continue;
            };
            let eval = |reason: String| QualityError::Eval {
                check: c.name.clone(),
                reason,
            };
            let keys: Vec<ArrayRef> = columns
                .iter()
                .map(|name| col(batch, name).cloned())
                .collect::<std::result::Result<_, _>>()
                .map_err(eval)?;
            keyed.push((k, c.action, key_hashes(&keys).map_err(eval)?));
        }
        let n = batch.num_rows();
        if let [(k, _, hashes)] = keyed.as_slice() {
            // One `unique` check (the usual case): one probe per row. A duplicate is not
            // inserted, and a quarantined duplicate has no other check to keep out of.
            let Test::Unique { seen, .. } = &mut self.checks[*k].test else {
                return Ok(vec![None; self.checks.len()]);
            };
            let mut fresh = 0usize;
            let bits = BooleanBuffer::collect_bool(n, |row| {
                let kept = dropped.is_none_or(|d| d[row].is_none());
                match hashes[row] {
                    Some(h) if kept => {
                        let new = seen.insert(h);
                        fresh += usize::from(new);
                        !new
                    }
                    _ => false,
                }
            });
            self.unique_keys += fresh;
            if self.unique_keys > self.max_unique_keys {
                return Err(self.too_many_keys());
            }
            let mut failing: Vec<Option<BooleanBuffer>> = vec![None; self.checks.len()];
            failing[*k] = Some(bits);
            return Ok(failing);
        }
        let mut out: Vec<arrow::array::BooleanBufferBuilder> = keyed
            .iter()
            .map(|_| arrow::array::BooleanBufferBuilder::new(n))
            .collect();
        let mut dup = vec![false; keyed.len()];
        for row in 0..n {
            let kept = dropped.is_none_or(|d| d[row].is_none());
            let mut quarantined = false;
            for (u, (k, action, hashes)) in keyed.iter().enumerate() {
                dup[u] = kept
                    && hashes[row].is_some_and(|h| {
                        matches!(&self.checks[*k].test, Test::Unique { seen, .. } if seen.contains(&h))
                    });
                quarantined |= dup[u] && *action == Action::Quarantine;
            }
            if kept && !quarantined {
                for (k, _, hashes) in &keyed {
                    let (Some(h), Test::Unique { seen, .. }) =
                        (hashes[row], &mut self.checks[*k].test)
                    else {
                        continue;
                    };
                    if seen.insert(h) {
                        self.unique_keys += 1;
                        if self.unique_keys > self.max_unique_keys {
                            return Err(self.too_many_keys());
                        }
                    }
                }
            }
            for (b, d) in out.iter_mut().zip(&dup) {
                b.append(*d);
            }
        }
        let mut failing: Vec<Option<BooleanBuffer>> = vec![None; self.checks.len()];
        for ((k, _, _), mut b) in keyed.iter().zip(out) {
            failing[*k] = Some(b.finish());
        }
        Ok(failing)
    }
}

/// Appends the [`QUALITY`] column to `batch`.
fn with_quality(batch: &RecordBatch, column: ArrayRef) -> std::result::Result<RecordBatch, String> {
    let mut fields: Vec<Arc<Field>> = batch.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(QUALITY, DataType::Utf8, true)));
    let mut columns = batch.columns().to_vec();
    columns.push(column);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())
}

fn compile_one(
    c: &CheckConfig,
    schema: &SchemaRef,
    ingested_us: i64,
) -> std::result::Result<Test, String> {
    let column = || -> std::result::Result<(String, DataType), String> {
        let name = c.column.clone().ok_or("needs `column`")?;
        let ty = schema
            .field_with_name(&name)
            .map(|f| f.data_type().clone())
            .map_err(|_| format!("no column named `{name}`"))?;
        Ok((name, ty))
    };
    Ok(match c.kind {
        CheckKind::NotNull => Test::NotNull(column()?.0),
        CheckKind::Range => {
            let (name, ty) = column()?;
            let min = c.min.as_ref().map(|v| bound_array(v, &ty)).transpose()?;
            let mut max = c.max.as_ref().map(|v| bound_array(v, &ty)).transpose()?;
            let mut shown = format!(
                "[{}, {}]",
                c.min.as_ref().map_or("-∞".into(), show),
                c.max.as_ref().map_or("+∞".into(), show)
            );
            if let (Some(skew), DataType::Timestamp(_, tz)) = (c.max_future_seconds, &ty) {
                let limit_us = ingested_us.saturating_add((skew as i64).saturating_mul(1_000_000));
                let limit: ArrayRef = Arc::new(
                    arrow::array::TimestampMicrosecondArray::from(vec![limit_us])
                        .with_timezone_opt(tz.clone()),
                );
                let limit = cast(&limit, &ty).map_err(|e| e.to_string())?;
                max = Some(match max {
                    Some(m) if !gt(&m, &limit).map_err(|e| e.to_string())?.value(0) => m,
                    _ => limit,
                });
                shown.push_str(&format!(
                    " or later than ingestion time + {skew} s ({})",
                    chrono::DateTime::<chrono::Utc>::from_timestamp_micros(limit_us)
                        .map(|t| t.to_rfc3339())
                        .unwrap_or_default()
                ));
            }
            Test::Range {
                column: name,
                min,
                max,
                shown,
            }
        }
        CheckKind::Accepted => {
            let (name, ty) = column()?;
            let index = schema.index_of(&name).map_err(|e| e.to_string())?;
            let column: Arc<dyn PhysicalExpr> = Arc::new(Column::new(&name, index));
            let known =
                InListExpr::try_new_from_array(column, values_array(&c.values, &ty)?, false)
                    .map_err(|e| e.to_string())?;
            Test::Accepted {
                column: name,
                known: Arc::new(known),
            }
        }
        CheckKind::Regex => Test::Regex {
            column: column()?.0,
            regex: compile_regex(c.pattern.as_deref().unwrap_or(""))?,
        },
        CheckKind::MaxLength => Test::MaxLength {
            column: column()?.0,
            max: max_chars(c.max.as_ref())?,
        },
        CheckKind::Unique => {
            for col in &c.columns {
                schema
                    .field_with_name(col)
                    .map_err(|_| format!("no column named `{col}`"))?;
            }
            Test::Unique {
                columns: c.columns.clone(),
                seen: KeySet::default(),
                from_table: 0,
                within_hours: c.within_hours,
            }
        }
        CheckKind::Sql => {
            let text = c.expr.clone().unwrap_or_default();
            Test::Sql {
                expr: sql_predicate(&text, schema)?,
                text,
            }
        }
    })
}

fn show(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `mask` with nulls as false: a comparison on a null value passes.
fn definite(mask: &BooleanArray) -> BooleanBuffer {
    match mask.nulls() {
        Some(nulls) => mask.values() & nulls.inner(),
        None => mask.values().clone(),
    }
}

/// The rows of a floating-point `a` holding NaN (None for other types).
fn nan_rows(a: &ArrayRef) -> Option<BooleanBuffer> {
    use arrow::datatypes::{Float16Type, Float32Type, Float64Type};
    let nan = match a.data_type() {
        DataType::Float16 => {
            let v = a.as_primitive::<Float16Type>().values();
            BooleanBuffer::collect_bool(v.len(), |i| v[i].is_nan())
        }
        DataType::Float32 => {
            let v = a.as_primitive::<Float32Type>().values();
            BooleanBuffer::collect_bool(v.len(), |i| v[i].is_nan())
        }
        DataType::Float64 => {
            let v = a.as_primitive::<Float64Type>().values();
            BooleanBuffer::collect_bool(v.len(), |i| v[i].is_nan())
        }
        _ => return None,
    };
    Some(match a.logical_nulls() {
        Some(valid) => &nan & valid.inner(),
        None => nan,
    })
}

fn col<'b>(batch: &'b RecordBatch, name: &str) -> std::result::Result<&'b ArrayRef, String> {
    batch
        .column_by_name(name)
        .ok_or_else(|| format!("the batch has no column `{name}`"))
}

/// The rows failing `test` (not `unique`).
fn failures(test: &Test, batch: &RecordBatch) -> std::result::Result<BooleanBuffer, String> {
    let e = |e: arrow::error::ArrowError| e.to_string();
    Ok(match test {
        Test::NotNull(c) => match batch.column_by_name(c) {
            Some(a) => match a.logical_nulls() {
                Some(nulls) => !nulls.inner(),
                None => BooleanBuffer::new_unset(batch.num_rows()),
            },
            None => BooleanBuffer::new_set(batch.num_rows()),
        },
        Test::Range {
            column, min, max, ..
        } => {
            let a = col(batch, column)?;
            let below = min
                .as_ref()
                .map(|m| lt(a, &arrow::array::Scalar::new(m.clone())))
                .transpose()
                .map_err(e)?;
            let above = max
                .as_ref()
                .map(|m| gt(a, &arrow::array::Scalar::new(m.clone())))
                .transpose()
                .map_err(e)?;
            let outside = match (below, above) {
                (Some(b), Some(a)) => definite(&or(&b, &a).map_err(e)?),
                (Some(m), None) | (None, Some(m)) => definite(&m),
                (None, None) => return Ok(BooleanBuffer::new_unset(batch.num_rows())),
            };
            // Arrow orders NaN above +inf (and -NaN below -inf): NaN is in no range.
            match nan_rows(a) {
                Some(nan) => &outside | &nan,
                None => outside,
            }
        }
        Test::Accepted { column, known } => {
            let a = col(batch, column)?;
            let found = known
                .evaluate(batch)
                .and_then(|v| v.into_array(batch.num_rows()))
                .map_err(|e| e.to_string())?;
            let found = found
                .as_boolean_opt()
                .ok_or_else(|| format!("`IN` gave {}, not booleans", found.data_type()))?;
            // Fails: not found and not null.
            let valid = a
                .logical_nulls()
                .map(|n| n.inner().clone())
                .unwrap_or_else(|| BooleanBuffer::new_set(a.len()));
            &!&definite(found) & &valid
        }
        Test::Regex { column, regex } => {
            let a = cast(col(batch, column)?, &DataType::Utf8).map_err(e)?;
            let s = a.as_string::<i32>();
            // Nulls pass; a null slot's value is empty and its result masked off.
            let bad = BooleanBuffer::collect_bool(s.len(), |row| !regex.is_match(s.value(row)));
            match s.logical_nulls() {
                Some(valid) => &bad & valid.inner(),
                None => bad,
            }
        }
        Test::MaxLength { column, max } => {
            let a = cast(col(batch, column)?, &DataType::Utf8).map_err(e)?;
            // Bytes bound characters from above: count characters only where the bytes exceed.
            let bytes = length(&a).map_err(e)?;
            let limit = i32::try_from(*max).unwrap_or(i32::MAX);
            let over = definite(
                &gt(
                    &bytes,
                    &arrow::array::Scalar::new(arrow::array::Int32Array::from(vec![limit])),
                )
                .map_err(e)?,
            );
            if over.count_set_bits() == 0 {
                over
            } else {
                let s = a.as_string::<i32>();
                let mut out = arrow::array::BooleanBufferBuilder::new(s.len());
                for (row, is_over) in over.iter().enumerate() {
                    out.append(is_over && s.value(row).chars().count() > *max);
                }
                out.finish()
            }
        }
        Test::Sql { expr, .. } => sql_failures(expr, batch, &mut Vec::new())?,
        Test::Unique { .. } => BooleanBuffer::new_unset(batch.num_rows()),
    })
}

/// Keys remembered by a `unique` check: 128-bit hashes, hashed no further.
type KeySet = HashSet<u128, BuildHasherDefault<Prehashed>>;

/// The hasher of [`KeySet`]: its keys are hashes already, so their low bits are the hash.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

/// Per row, the 128-bit hash (XXH3) of its key, None when a key part is null: a single string
/// key hashes its bytes, anything else its row encoding (Arrow's row format, which tells
/// `("ab", "c")` from `("a", "bc")` and types apart).
fn key_hashes(keys: &[ArrayRef]) -> std::result::Result<Vec<Option<u128>>, String> {
    use twox_hash::XxHash3_128;
    if let [key] = keys {
        if let Some(s) = key.as_string_opt::<i32>() {
            return Ok(s
                .iter()
                .map(|v| v.map(|v| XxHash3_128::oneshot(v.as_bytes())))
                .collect());
        }
    }
    let fields = keys
        .iter()
        .map(|k| arrow::row::SortField::new(k.data_type().clone()))
        .collect();
    let converter = arrow::row::RowConverter::new(fields).map_err(|e| e.to_string())?;
    let rows = converter.convert_columns(keys).map_err(|e| e.to_string())?;
    let has_null: Option<BooleanBuffer> = keys
        .iter()
        .filter_map(|k| k.logical_nulls().map(|n| !n.inner()))
        .reduce(|a, b| &a | &b);
    Ok(rows
        .iter()
        .enumerate()
        .map(|(row, key)| {
            let null = has_null.as_ref().is_some_and(|n| n.value(row));
            (!null).then(|| XxHash3_128::oneshot(key.as_ref()))
        })
        .collect())
}

/// The rows of `batch` failing a `sql` check: where it is false, and where it cannot be
/// evaluated (e.g. an integer division by zero, a cast of a value that does not parse: such
/// rows are isolated by halving the batch, their errors pushed to `erred` by row). Only a
/// result that is not boolean fails the whole evaluation.
fn sql_failures(
    expr: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
    erred: &mut Vec<(usize, String)>,
) -> std::result::Result<BooleanBuffer, String> {
    let mut out = arrow::array::BooleanBufferBuilder::new(batch.num_rows());
    sql_isolating(expr, batch, 0, batch.num_rows(), &mut out, erred)?;
    Ok(out.finish())
}

fn sql_isolating(
    expr: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
    start: usize,
    len: usize,
    out: &mut arrow::array::BooleanBufferBuilder,
    erred: &mut Vec<(usize, String)>,
) -> std::result::Result<(), String> {
    if len == 0 {
        return Ok(());
    }
    let part = batch.slice(start, len);
    match expr
        .evaluate(&part)
        .and_then(|v| v.into_array(part.num_rows()))
    {
        Ok(value) => {
            let b = value.as_boolean_opt().ok_or_else(|| {
                format!("the expression gave {}, not booleans", value.data_type())
            })?;
            // Fails only where false: true and null (unknown) pass.
            let falses = !b.values();
            out.append_buffer(&match b.nulls() {
                Some(n) => &falses & n.inner(),
                None => falses,
            });
        }
        Err(e) if len == 1 => {
            out.append(true);
            erred.push((start, e.to_string()));
        }
        Err(_) => {
            let half = len / 2;
            sql_isolating(expr, batch, start, half, out, erred)?;
            sql_isolating(expr, batch, start + half, len - half, out, erred)?;
        }
    }
    Ok(())
}

/// [`describe`], or for a row a `sql` check could not be evaluated on, the error.
fn describe_row(test: &Test, batch: &RecordBatch, row: usize, erred: &[(usize, String)]) -> String {
    match (test, erred.binary_search_by_key(&row, |(r, _)| *r)) {
        (Test::Sql { text, .. }, Ok(i)) => format!("`{text}` cannot be evaluated: {}", erred[i].1),
        _ => describe(test, batch, row),
    }
}

/// What `row` holds that fails `test`, for its reason.
fn describe(test: &Test, batch: &RecordBatch, row: usize) -> String {
    let value = |column: &str| -> String {
        batch
            .column_by_name(column)
            .and_then(|a| {
                let f = ArrayFormatter::try_new(a.as_ref(), &FormatOptions::default()).ok()?;
                let mut text = f.value(row).to_string();
                if text.len() > 200 {
                    let cut = (0..=200)
                        .rev()
                        .find(|&i| text.is_char_boundary(i))
                        .unwrap_or(0);
                    text.truncate(cut);
                    text.push('…');
                }
                Some(text)
            })
            .unwrap_or_default()
    };
    match test {
        Test::NotNull(c) => format!("`{c}` is missing or null"),
        Test::Range { column, shown, .. } => {
            format!("{column} = {} outside {shown}", value(column))
        }
        Test::Accepted { column, .. } => {
            format!("{column} = {} is not an accepted value", value(column))
        }
        Test::Regex { column, regex } => format!(
            "{column} = {} does not match /{}/",
            value(column),
            regex.as_str()
        ),
        Test::MaxLength { column, max } => {
            format!("{column} is longer than {max} characters")
        }
        Test::Unique {
            columns,
            within_hours,
            ..
        } => format!(
            "duplicate key ({}) = ({}) within the object{}",
            columns.join(", "),
            columns
                .iter()
                .map(|c| value(c))
                .collect::<Vec<_>>()
                .join(", "),
            within_hours
                .map(|h| format!(" or in the table's rows of the last {h} h"))
                .unwrap_or_default()
        ),
        Test::Sql { text, .. } => format!("`{text}` is false"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, TimestampMicrosecondArray};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("amount", DataType::Float64, true),
            Field::new("items", DataType::Int64, true),
            Field::new("currency", DataType::Utf8, true),
            Field::new(
                "t",
                DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some("+00:00".into())),
                true,
            ),
        ]))
    }

    const NOW: i64 = 1_796_032_800_000_000; // 2026-11-30T10:00:00Z

    type Row<'a> = (
        Option<&'a str>,
        Option<f64>,
        Option<i64>,
        Option<&'a str>,
        Option<i64>,
    );

    fn batch(rows: &[Row<'_>]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.3).collect::<Vec<_>>(),
                )),
                Arc::new(
                    TimestampMicrosecondArray::from(rows.iter().map(|r| r.4).collect::<Vec<_>>())
                        .with_timezone("+00:00"),
                ),
            ],
        )
        .unwrap()
    }

    fn checks(toml_text: &str) -> Vec<CheckConfig> {
        #[derive(serde::Deserialize)]
        struct Doc {
            checks: Vec<CheckConfig>,
        }
        toml::from_str::<Doc>(toml_text).unwrap().checks
    }

    fn contract(toml_text: &str) -> Contract {
        let c = checks(toml_text);
        for check in &c {
            check.validate(&schema()).unwrap();
        }
        Contract::compile(&c, &schema(), NOW, 1000).unwrap()
    }

    /// The quarantine reasons per row ("" = kept).
    fn reasons(c: &Checked) -> Vec<String> {
        match &c.reasons {
            Some(r) => r.iter().map(|r| r.clone().unwrap_or_default()).collect(),
            None => vec![String::new(); c.batch.num_rows()],
        }
    }

    fn row(id: &str, amount: f64) -> Row<'_> {
        (Some(id), Some(amount), Some(1), Some("EUR"), Some(NOW))
    }

    #[test]
    fn not_null_fails_nulls_only() {
        let mut c = contract(
            "[[checks]]\nname = \"has_amount\"\nkind = \"not_null\"\ncolumn = \"amount\"\n",
        );
        let b = batch(&[row("a", 1.0), (Some("b"), None, None, None, Some(NOW))]);
        let out = c.evaluate(b).unwrap();
        let r = reasons(&out);
        assert_eq!(r[0], "");
        assert!(
            r[1].contains("`has_amount`") && r[1].contains("amount"),
            "{}",
            r[1]
        );
        assert_eq!(
            c.counts(),
            vec![("has_amount".into(), Action::Quarantine, 1)]
        );
    }

    #[test]
    fn range_names_value_and_bounds_and_nulls_pass() {
        let mut c = contract("[[checks]]\nname = \"amount_range\"\nkind = \"range\"\ncolumn = \"amount\"\nmin = 0\nmax = 100000\n");
        let b = batch(&[
            row("a", 0.0),
            row("b", -5.0),
            row("c", 100000.0),
            row("d", 100000.5),
            (Some("e"), None, None, None, Some(NOW)),
        ]);
        let r = reasons(&c.evaluate(b).unwrap());
        assert_eq!(r[0], "");
        assert_eq!(
            r[1],
            "quality check `amount_range` failed: amount = -5.0 outside [0, 100000]"
        );
        assert_eq!(r[2], "");
        assert!(r[3].contains("100000.5"), "{}", r[3]);
        assert_eq!(r[4], "", "a null passes every check but not_null");
    }

    #[test]
    fn nan_is_outside_every_range() {
        // Arrow orders NaN above +inf: with a `min` only, NaN passed as "above the minimum".
        for text in [
            "[[checks]]\nname = \"r\"\nkind = \"range\"\ncolumn = \"amount\"\nmin = 0\n",
            "[[checks]]\nname = \"r\"\nkind = \"range\"\ncolumn = \"amount\"\nmax = 10\n",
        ] {
            let mut c = contract(text);
            let b = batch(&[
                row("a", 1.0),
                row("b", f64::NAN),
                row("c", -f64::NAN),
                (Some("d"), None, None, None, Some(NOW)),
            ]);
            let r = reasons(&c.evaluate(b).unwrap());
            assert_eq!(r[0], "", "{text}");
            assert!(
                r[1].contains("`r`") && r[1].contains("NaN"),
                "{text}: {}",
                r[1]
            );
            assert!(
                r[2].contains("`r`") && r[2].contains("NaN"),
                "{text}: {}",
                r[2]
            );
            assert_eq!(r[3], "", "{text}: a null passes");
        }
    }

    #[test]
    fn sql_checks_are_deterministic_functions_of_the_row() {
        // A redelivered object must be checked the same way: no random(), no clock.
        for expr in [
            "random() < 0.5",
            "t <= now()",
            "uuid() <> id",
            "t < current_timestamp",
        ] {
            let c = checks(&format!(
                "[[checks]]\nname = \"s\"\nkind = \"sql\"\nexpr = \"{expr}\"\n"
            ));
            let e = c[0].validate(&schema()).unwrap_err();
            assert!(e.contains("deterministic"), "{expr}: {e}");
        }
        // Immutable functions stay allowed.
        let mut ok = contract(
            "[[checks]]\nname = \"s\"\nkind = \"sql\"\nexpr = \"length(upper(id)) < 3 AND abs(amount) < 10\"\n",
        );
        let r = reasons(
            &ok.evaluate(batch(&[row("a", 1.0), row("abcd", 1.0)]))
                .unwrap(),
        );
        assert_eq!(r[0], "");
        assert!(r[1].contains("`s`"), "{}", r[1]);
    }

    #[test]
    fn accepted_with_many_values_is_one_lookup_per_row() {
        // 10 000 values (the most allowed) against 8 192-row batches: one pass, not one per value.
        let values: Vec<String> = (0..10_000).map(|i| format!("\"C{i}\"")).collect();
        let mut c = contract(&format!(
            "[[checks]]\nname = \"known\"\nkind = \"accepted\"\ncolumn = \"currency\"\nvalues = [{}]\n",
            values.join(", ")
        ));
        let codes: Vec<String> = (0..8192).map(|i| format!("C{}", i * 3)).collect();
        let rows: Vec<Row<'_>> = codes
            .iter()
            .map(|code| (Some("x"), None, None, Some(code.as_str()), None))
            .collect();
        let started = std::time::Instant::now();
        let mut failed = 0;
        for _ in 0..4 {
            let out = c.evaluate(batch(&rows)).unwrap();
            failed = reasons(&out).iter().filter(|r| !r.is_empty()).count();
        }
        let took = started.elapsed();
        eprintln!("accepted, 10 000 values, 4 x 8192 rows: {took:?}");
        // C0, C3, …, C9999 are accepted: 3334 of the 8192 codes.
        assert_eq!(failed, 8192 - 3334);
        assert!(
            took < std::time::Duration::from_secs(2),
            "4 batches took {took:?}"
        );
    }

    #[test]
    fn a_sql_check_failing_on_some_rows_fails_those_rows_only() {
        // Integer division by zero (items = 1) and a cast that does not parse (id = "x") error
        // in DataFusion: one such record refused the whole object.
        let mut c = contract(
            "[[checks]]\nname = \"s\"\nkind = \"sql\"\nexpr = \"10 / (items - 1) > 0 AND CAST(id AS BIGINT) > 0\"\n",
        );
        let at = |id: &'static str, items: i64| (Some(id), Some(1.0), Some(items), None, Some(NOW));
        let b = batch(&[at("1", 2), at("2", 1), at("3", 3), at("x", 5), at("5", 0)]);
        let r = reasons(&c.evaluate(b).unwrap());
        assert_eq!(r[0], "");
        assert!(
            r[1].contains("`s`") && r[1].contains("cannot be evaluated") && r[1].contains("zero"),
            "{}",
            r[1]
        );
        assert_eq!(r[2], "");
        assert!(
            r[3].contains("`s`") && r[3].contains("cannot be evaluated"),
            "{}",
            r[3]
        );
        assert!(
            r[4].contains("`s`") && r[4].contains("is false"),
            "{}",
            r[4]
        );
        assert_eq!(c.counts()[0].2, 3);
        // Every row erring: each fails, the batch still evaluates.
        let all = c.evaluate(batch(&[at("1", 1), at("2", 1)])).unwrap();
        assert!(reasons(&all)
            .iter()
            .all(|r| r.contains("cannot be evaluated")));
    }

    #[test]
    fn accepted_on_numbers_and_timestamps_and_sliced_batches() {
        let mut c = contract(
            "[[checks]]\nname = \"few\"\nkind = \"accepted\"\ncolumn = \"items\"\nvalues = [1, 2]\n\n[[checks]]\nname = \"at\"\nkind = \"accepted\"\ncolumn = \"t\"\nvalues = [\"2026-11-30T10:00:00Z\"]\n",
        );
        let at = |items: Option<i64>, t: Option<i64>| (Some("x"), None, items, None, t);
        let b = batch(&[
            at(Some(9), Some(NOW)),
            at(Some(1), Some(NOW)),
            at(Some(3), Some(NOW + 1)),
            at(None, None),
            at(Some(2), Some(NOW)),
        ]);
        // A slice with an offset: rows 1.. of the batch.
        let r = reasons(&c.evaluate(b.slice(1, 4)).unwrap());
        assert_eq!(r[0], "");
        assert!(
            r[1].contains("`few`")
                && r[1].contains("items = 3")
                && r[1].contains("also failed: at"),
            "{}",
            r[1]
        );
        assert_eq!(&r[2..], &["", ""], "nulls pass; 2 at NOW is accepted");
    }

    #[test]
    fn a_row_quarantined_by_one_unique_check_makes_no_duplicate_for_another() {
        let mut c = contract(
            "[[checks]]\nname = \"one_per_id\"\nkind = \"unique\"\ncolumns = [\"id\"]\n\n[[checks]]\nname = \"one_per_currency\"\nkind = \"unique\"\ncolumns = [\"currency\"]\n",
        );
        let at = |id: &'static str, cur: &'static str| (Some(id), None, None, Some(cur), None);
        // b is quarantined for repeating EUR: it is not in the table, so the later b is not a
        // duplicate of it (and its USD is new).
        let r = reasons(
            &c.evaluate(batch(&[at("a", "EUR"), at("b", "EUR"), at("b", "USD")]))
                .unwrap(),
        );
        assert_eq!(r[0], "");
        assert!(r[1].contains("`one_per_currency`"), "{}", r[1]);
        assert_eq!(r[2], "", "{}", r[2]);
        // Across batches too: the quarantined row's id was not remembered.
        let r = reasons(
            &c.evaluate(batch(&[at("c", "USD"), at("c", "GBP")]))
                .unwrap(),
        );
        assert!(r[0].contains("`one_per_currency`"), "{}", r[0]);
        assert_eq!(r[1], "", "{}", r[1]);
        let counts: Vec<u64> = c.counts().into_iter().map(|(_, _, n)| n).collect();
        assert_eq!(counts, vec![0, 2]);
    }

    #[test]
    fn timestamps_from_the_future_beyond_the_skew_fail() {
        let mut c = contract(
            "[[checks]]\nname = \"not_future\"\nkind = \"range\"\ncolumn = \"t\"\nmin = \"2020-01-01T00:00:00Z\"\nmax_future_seconds = 300\n",
        );
        let at = |t: i64| (Some("x"), Some(1.0), Some(1), Some("EUR"), Some(t));
        let b = batch(&[
            at(NOW + 299_000_000),
            at(NOW + 301_000_000),
            at(1_500_000_000_000_000), // 2017: before min
            (Some("n"), None, None, None, None),
        ]);
        let r = reasons(&c.evaluate(b).unwrap());
        assert_eq!(r[0], "");
        assert!(
            r[1].contains("`not_future`") && r[1].contains("ingestion time + 300 s"),
            "{}",
            r[1]
        );
        assert!(r[2].contains("2017"), "{}", r[2]);
        assert_eq!(r[3], "");
    }

    #[test]
    fn accepted_regex_and_max_length() {
        let mut c = contract(
            r#"
[[checks]]
name = "currency_known"
kind = "accepted"
column = "currency"
values = ["EUR", "USD"]

[[checks]]
name = "id_format"
kind = "regex"
column = "id"
pattern = "^[a-z]+-[0-9]+$"

[[checks]]
name = "id_short"
kind = "max_length"
column = "id"
max = 6
"#,
        );
        let b = batch(&[
            (Some("ab-1"), None, None, Some("EUR"), Some(NOW)),
            (Some("ab-2"), None, None, Some("GBP"), Some(NOW)),
            (Some("AB_3"), None, None, Some("USD"), Some(NOW)),
            (Some("abcdef-4"), None, None, None, Some(NOW)),
            // six characters, twelve bytes: within max_length
            (Some("ééé-12"), None, None, Some("USD"), Some(NOW)),
        ]);
        let r = reasons(&c.evaluate(b).unwrap());
        assert_eq!(r[0], "");
        assert!(
            r[1].contains("`currency_known`") && r[1].contains("GBP"),
            "{}",
            r[1]
        );
        assert!(
            r[2].contains("`id_format`") && r[2].contains("AB_3"),
            "{}",
            r[2]
        );
        assert!(
            r[3].contains("`id_short`") && r[3].contains("6 characters"),
            "{}",
            r[3]
        );
        assert!(!r[3].contains("currency"), "null currency passes: {}", r[3]);
        assert!(
            r[4].contains("`id_format`") && !r[4].contains("id_short"),
            "{}",
            r[4]
        );
        let counts: Vec<u64> = c.counts().into_iter().map(|(_, _, n)| n).collect();
        assert_eq!(counts, vec![1, 2, 1]);
    }

    /// The capacity of check `k`'s key set.
    fn key_room(c: &Contract, k: usize) -> usize {
        match &c.checks[k].test {
            Test::Unique { seen, .. } => seen.capacity(),
            _ => 0,
        }
    }

    #[test]
    fn key_sets_are_sized_from_the_share_of_distinct_keys() {
        let text = "[[checks]]\nname = \"one_per_id\"\nkind = \"unique\"\ncolumns = [\"id\"]\n";
        let ids: Vec<String> = (0..64).map(|i| format!("id-{i}")).collect();
        // Distinct keys: room for the whole object's at once.
        let mut distinct = Contract::compile(&checks(text), &schema(), NOW, 1 << 20).unwrap();
        distinct
            .evaluate(batch(&ids.iter().map(|i| row(i, 1.0)).collect::<Vec<_>>()))
            .unwrap();
        distinct.expect_rows(100_000);
        assert!(
            key_room(&distinct, 0) >= 100_000,
            "{}",
            key_room(&distinct, 0)
        );
        // One key repeated: no room for keys that will not come.
        let mut repeated = Contract::compile(&checks(text), &schema(), NOW, 1 << 20).unwrap();
        repeated
            .evaluate(batch(&vec![row("same", 1.0); 64]))
            .unwrap();
        repeated.expect_rows(100_000);
        assert!(
            key_room(&repeated, 0) < 10_000,
            "{}",
            key_room(&repeated, 0)
        );
        // Capped at max_unique_keys.
        let mut capped = Contract::compile(&checks(text), &schema(), NOW, 1000).unwrap();
        capped
            .evaluate(batch(
                &ids[..8].iter().map(|i| row(i, 1.0)).collect::<Vec<_>>(),
            ))
            .unwrap();
        capped.expect_rows(u64::MAX);
        assert!(key_room(&capped, 0) < 4096, "{}", key_room(&capped, 0));
    }

    #[test]
    fn unique_within_the_object_across_batches_and_capped() {
        let text =
            "[[checks]]\nname = \"one_per_id\"\nkind = \"unique\"\ncolumns = [\"id\", \"items\"]\n";
        let mut c = contract(text);
        let first = c
            .evaluate(batch(&[row("a", 1.0), row("b", 1.0), row("a", 2.0)]))
            .unwrap();
        let r = reasons(&first);
        assert_eq!(&r[..2], &["", ""]);
        assert!(
            r[2].contains("duplicate key (id, items) = (a, 1)"),
            "{}",
            r[2]
        );
        // A later batch of the same object: `b` was seen; a null key part passes.
        let second = c
            .evaluate(batch(&[
                row("b", 3.0),
                row("c", 1.0),
                (Some("c"), None, None, None, None),
            ]))
            .unwrap();
        assert!(
            reasons(&second)[0].contains("duplicate key"),
            "b was seen in the first batch"
        );
        assert_eq!(&reasons(&second)[1..], &["", ""]);
        // The cap on distinct keys fails the object with the limit named.
        let mut capped = Contract::compile(&checks(text), &schema(), NOW, 2).unwrap();
        let e = capped
            .evaluate(batch(&[row("a", 1.0), row("b", 1.0), row("c", 1.0)]))
            .unwrap_err();
        assert!(
            matches!(&e, QualityError::Limit(m) if m.contains("max_unique_keys = 2")),
            "{e}"
        );
    }

    #[test]
    fn sql_predicate_fails_only_when_false() {
        let mut c = contract(
            "[[checks]]\nname = \"big_orders_have_items\"\nkind = \"sql\"\nexpr = \"amount < 1000 OR items > 1\"\n",
        );
        let b = batch(&[
            (Some("a"), Some(10.0), Some(1), None, Some(NOW)),
            (Some("b"), Some(5000.0), Some(1), None, Some(NOW)),
            (Some("c"), Some(5000.0), Some(3), None, Some(NOW)),
            (Some("d"), Some(5000.0), None, None, Some(NOW)),
        ]);
        let r = reasons(&c.evaluate(b).unwrap());
        assert_eq!(r[0], "");
        assert!(
            r[1].contains("`big_orders_have_items`") && r[1].contains("is false"),
            "{}",
            r[1]
        );
        assert_eq!(&r[2..], &["", ""], "null (unknown) passes");
    }

    #[test]
    fn flag_fills_quality_and_fail_names_the_row() {
        let mut c = contract(
            r#"
[[checks]]
name = "small"
kind = "range"
column = "amount"
max = 10
action = "flag"

[[checks]]
name = "euro"
kind = "accepted"
column = "currency"
values = ["EUR"]
action = "flag"

[[checks]]
name = "positive"
kind = "range"
column = "amount"
min = 0
"#,
        );
        let b = batch(&[
            row("a", 1.0),
            (Some("b"), Some(50.0), None, Some("USD"), Some(NOW)),
            (Some("c"), Some(-1.0), None, Some("EUR"), Some(NOW)),
        ]);
        let out = c.evaluate(b).unwrap();
        let q = out
            .batch
            .column_by_name(QUALITY)
            .unwrap()
            .as_string::<i32>()
            .clone();
        assert!(q.is_null(0));
        assert_eq!(q.value(1), "small,euro");
        assert!(reasons(&out)[2].contains("`positive`"));
        assert!(out.fail.is_none());

        let mut f = contract(
            "[[checks]]\nname = \"must_be_eur\"\nkind = \"accepted\"\ncolumn = \"currency\"\nvalues = [\"EUR\"]\naction = \"fail\"\n",
        );
        let out = f
            .evaluate(batch(&[
                row("a", 1.0),
                (Some("b"), None, None, Some("USD"), None),
            ]))
            .unwrap();
        let (at, reason) = out.fail.unwrap();
        assert_eq!(at, 1);
        assert!(
            reason.contains("`must_be_eur`") && reason.contains("USD"),
            "{reason}"
        );
        assert!(out.batch.column_by_name(QUALITY).is_none());
    }

    #[test]
    fn a_row_failing_several_quarantine_checks_names_them_all_once() {
        let mut c = contract(
            "[[checks]]\nname = \"a1\"\nkind = \"range\"\ncolumn = \"amount\"\nmin = 0\n\n[[checks]]\nname = \"a2\"\nkind = \"range\"\ncolumn = \"amount\"\nmin = 10\n",
        );
        let out = c.evaluate(batch(&[row("a", -1.0)])).unwrap();
        let r = reasons(&out);
        assert!(
            r[0].starts_with("quality check `a1` failed") && r[0].ends_with("(also failed: a2)"),
            "{}",
            r[0]
        );
        let counts: Vec<u64> = c.counts().into_iter().map(|(_, _, n)| n).collect();
        assert_eq!(counts, vec![1, 1], "per-check counts count each check");
    }

    #[test]
    fn validation_names_the_problem() {
        let bad = |text: &str, says: &str| {
            let c = checks(text);
            let e = c[0].validate(&schema()).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        };
        bad(
            "[[checks]]\nname = \"r\"\nkind = \"regex\"\ncolumn = \"id\"\npattern = \"([a-z\"\n",
            "bad `pattern`",
        );
        bad(
            "[[checks]]\nname = \"r\"\nkind = \"regex\"\ncolumn = \"amount\"\npattern = \"x\"\n",
            "string column",
        );
        bad(
            "[[checks]]\nname = \"n\"\nkind = \"not_null\"\ncolumn = \"nope\"\n",
            "no column named `nope`",
        );
        bad(
            "[[checks]]\nname = \"s\"\nkind = \"sql\"\nexpr = \"amount >\"\n",
            "bad `expr`",
        );
        bad(
            "[[checks]]\nname = \"s\"\nkind = \"sql\"\nexpr = \"nope > 1\"\n",
            "bad `expr`",
        );
        bad(
            "[[checks]]\nname = \"s\"\nkind = \"sql\"\nexpr = \"amount + 1\"\n",
            "not boolean",
        );
        bad(
            "[[checks]]\nname = \"r\"\nkind = \"range\"\ncolumn = \"currency\"\nmin = 1\n",
            "number, date or timestamp",
        );
        bad(
            "[[checks]]\nname = \"r\"\nkind = \"range\"\ncolumn = \"items\"\nmin = \"x\"\n",
            "not a value of type",
        );
        bad(
            "[[checks]]\nname = \"r\"\nkind = \"range\"\ncolumn = \"items\"\nmin = 5\nmax = 1\n",
            "above `max`",
        );
        bad("[[checks]]\nname = \"r\"\nkind = \"range\"\ncolumn = \"amount\"\nmax_future_seconds = 5\n", "timestamp columns");
        bad("[[checks]]\nname = \"r\"\nkind = \"range\"\ncolumn = \"amount\"\npattern = \"x\"\nmin = 1\n", "does not take `pattern`");
        bad(
            "[[checks]]\nname = \"a\"\nkind = \"accepted\"\ncolumn = \"items\"\nvalues = [\"x\"]\n",
            "not a value of type",
        );
        bad(
            "[[checks]]\nname = \"u\"\nkind = \"unique\"\ncolumn = \"id\"\n",
            "does not take `column`",
        );
        bad(
            "[[checks]]\nname = \"u\"\nkind = \"unique\"\ncolumns = [\"id\"]\nwithin_hours = 0\n",
            "`within_hours` = 0",
        );
        bad(
            "[[checks]]\nname = \"m\"\nkind = \"max_length\"\ncolumn = \"id\"\nmax = -1\n",
            "non-negative",
        );
    }
}
