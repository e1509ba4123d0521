//! Decomposable aggregates (issue #14): whether an aggregate pipeline's SQL can be maintained by
//! merging the delta's partial aggregates into the sink rows of the windows it touches, and the
//! merge itself.
//!
//! A SQL is decomposable when DataFusion's logical plan of it is a GROUP BY over row-wise
//! operators on `source` alone (projections, filters: no join, subquery, window function, limit,
//! union, function that is not immutable — `now()` neither) whose output columns are all its group keys (`window_start` among
//! them) and aggregates among `count(*)`, `count(col)`, `sum`, `min`, `max`, each without
//! DISTINCT, FILTER or ORDER BY, and nothing above the GROUP BY but the projection (and an
//! ORDER BY): no HAVING, no expression over an aggregate, no DISTINCT. Every other aggregate
//! keeps recomputing its touched windows from the source (see `processor.rs`).
//!
//! Merging: a group's count and sum add, min and max take the min and max, with SQL's nulls (a
//! sum of only nulls stays null, a count counts no null). Integer sums and counts are added as
//! `DECIMAL(38,0)` and cast back checked: an overflow is an error naming the column, never a
//! wrap (the SQL's own `sum` over one delta is DataFusion's, which wraps, as in a recompute).
//! Decimal sums are added as `DECIMAL(76,s)` and cast back to their type checked the same way
//! (a `DECIMAL(38,s)` sum included). Floating-point sums are
//! added in another order than a recompute would, so they may differ from it in the last bits
//! (reconcile compares doubles with a relative tolerance, see `reconcile.rs`).

use std::sync::Arc;

use std::collections::BTreeSet;

use arrow::array::{Array, RecordBatch, TimestampMicrosecondArray};
use arrow::compute::{cast_with_options, CastOptions};
use arrow_schema::{DataType, SchemaRef, TimeUnit};
use datafusion::common::tree_node::TreeNode;
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};

use super::row_wise::node_name;
use super::transform::{self, Relation, WINDOW_START};
use crate::config::{PipelineConfig, RowChange, Start};
use crate::error::{Error, ErrorKind, Result};

/// What an output column is to the merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A group key: rows merge when all keys are equal (nulls equal, as GROUP BY).
    Key,
    /// `count(*)` / `count(col)`: added.
    Count,
    /// `sum(col)`: added, nulls ignored (all null: null).
    Sum,
    /// `min(col)`.
    Min,
    /// `max(col)`.
    Max,
}

/// How a decomposable aggregate merges: each output column's role, in output order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Merge {
    /// (output column, its role).
    pub(crate) columns: Vec<(String, Role)>,
}

/// Why `p`'s settings keep its windows recomputing whatever its SQL (`None`: they may merge).
///
/// A merge adds the delta to the sink's rows, so it is right only when those rows are the SQL
/// over every source row of their windows, as a recompute (which reads the whole source at the
/// run's snapshot) makes them:
/// - a `start` other than `earliest`: the sink lacks the rows before the start, so a window
///   straddling it, or a late row into an older window, would be the aggregate of the rows
///   after the start only;
/// - `on_row_change = "skip"`: a skipped overwrite or delete changed rows the sink still counts,
///   in windows the delta may not touch; a recompute heals a window at its next touch (and that
///   is all skip promises), a merge would carry the stale rows forever.
pub(crate) fn settings_forbid(p: &PipelineConfig) -> Option<String> {
    match p.start_strategy() {
        Ok(Start::Earliest) => {}
        Ok(_) => {
            return Some(format!(
                "start = \"{}\" (the sink lacks the rows before the start)",
                p.start.trim()
            ))
        }
        Err(e) => return Some(format!("start: {e}")),
    }
    if p.on_row_change == RowChange::Skip {
        return Some(
            "on_row_change = \"skip\" (a skipped overwrite or delete is healed only by a recompute)"
                .into(),
        );
    }
    None
}

/// Plans `sql` over an empty `source` of `schema` (with `joined` beside it) and says whether it
/// is decomposable: `Ok(Ok(merge))`, or `Ok(Err(why not))`. An error: the SQL does not plan.
pub(crate) async fn analyze(
    sql: &str,
    schema: SchemaRef,
    joined: &[Relation],
    context: &str,
) -> Result<std::result::Result<Merge, String>> {
    let (plan, output) = transform::logical_plan(sql, schema, joined, context).await?;
    Ok(decompose(&plan, &output))
}

fn decompose(plan: &LogicalPlan, output: &SchemaRef) -> std::result::Result<Merge, String> {
    let mut top = plan;
    // The output's order does not matter to a sink.
    while let LogicalPlan::Sort(s) = top {
        if s.fetch.is_some() {
            return Err("a LIMIT over the aggregate".into());
        }
        top = s.input.as_ref();
    }
    let (exprs, agg) = match top {
        LogicalPlan::Projection(p) => match p.input.as_ref() {
            LogicalPlan::Aggregate(a) => (p.expr.clone(), a),
            other
                if !other
                    .exists(|n| Ok(matches!(n, LogicalPlan::Aggregate(_))))
                    .unwrap_or(true) =>
            {
                return Err(format!("not a GROUP BY (`{}`)", node_name(other)))
            }
            other => {
                return Err(format!(
                    "the output is not the GROUP BY's own (`{}` in between: HAVING, a window function, …)",
                    node_name(other)
                ))
            }
        },
        LogicalPlan::Aggregate(a) => (
            a.schema.columns().into_iter().map(Expr::Column).collect(),
            a,
        ),
        other => return Err(format!("not a GROUP BY (`{}`)", node_name(other))),
    };
    if exprs.len() != output.fields().len() {
        return Err("the output's columns do not match the GROUP BY's".into());
    }
    if agg
        .group_expr
        .iter()
        .any(|e| matches!(e, Expr::GroupingSet(_)))
    {
        return Err("GROUPING SETS, ROLLUP or CUBE".into());
    }
    let n = agg.group_expr.len();
    let mut keys_out = vec![false; n];
    let mut columns = Vec::with_capacity(exprs.len());
    for (e, field) in exprs.iter().zip(output.fields()) {
        let Expr::Column(c) = strip_alias(e) else {
            return Err(format!(
                "output column `{}` is an expression over the aggregates",
                field.name()
            ));
        };
        let idx = agg
            .schema
            .index_of_column(c)
            .map_err(|_| format!("output column `{}` is not the GROUP BY's", field.name()))?;
        let role = if idx < n {
            keys_out[idx] = true;
            Role::Key
        } else {
            role_of(&agg.aggr_expr[idx - n], field.name())?
        };
        if field.name() == WINDOW_START && role != Role::Key {
            return Err(format!("`{WINDOW_START}` is not a group key"));
        }
        columns.push((field.name().clone(), role));
    }
    if !keys_out.iter().all(|k| *k) {
        return Err("a GROUP BY key is not an output column".into());
    }
    if !columns.iter().any(|(c, _)| c == WINDOW_START) {
        return Err(format!("no `{WINDOW_START}` key"));
    }
    for e in agg.group_expr.iter().chain(&agg.aggr_expr) {
        row_wise_expr(e)?;
    }
    row_wise(agg.input.as_ref())?;
    Ok(Merge { columns })
}

fn strip_alias(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => strip_alias(&a.expr),
        e => e,
    }
}

fn role_of(e: &Expr, name: &str) -> std::result::Result<Role, String> {
    let Expr::AggregateFunction(f) = strip_alias(e) else {
        return Err(format!("output column `{name}` is not a plain aggregate"));
    };
    let p = &f.params;
    if p.distinct {
        return Err(format!("`{name}`: DISTINCT inside the aggregate"));
    }
    if p.filter.is_some() {
        return Err(format!("`{name}`: FILTER inside the aggregate"));
    }
    if !p.order_by.is_empty() {
        return Err(format!("`{name}`: ORDER BY inside the aggregate"));
    }
    match (f.func.name(), p.args.len()) {
        ("count", 1) => Ok(Role::Count),
        ("sum", 1) => Ok(Role::Sum),
        ("min", 1) => Ok(Role::Min),
        ("max", 1) => Ok(Role::Max),
        (other, _) => Err(format!("`{name}`: {other}() does not merge")),
    }
}

/// An expression evaluated per row, the same whenever: no subquery, aggregate, window function
/// or function that is not immutable inside. A stable function (`now()`, `current_date()`) is
/// the same within one query only: a row merged in one run and a row merged in a later one
/// would have been filtered or grouped by different values of it, where a recompute reads them
/// all at one.
fn row_wise_expr(e: &Expr) -> std::result::Result<(), String> {
    let bad = e
        .exists(|e| {
            Ok(match e {
                Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_) => true,
                Expr::WindowFunction(_) => true,
                Expr::ScalarFunction(f) => f.func.signature().volatility != Volatility::Immutable,
                _ => false,
            })
        })
        .unwrap_or(true);
    if bad {
        return Err(format!(
            "`{}` is a subquery, a window or a function that is not immutable (volatile or stable, as now())",
            e.schema_name()
        ));
    }
    Ok(())
}

/// The GROUP BY's input: projections and filters over `source` alone.
fn row_wise(plan: &LogicalPlan) -> std::result::Result<(), String> {
    match plan {
        LogicalPlan::TableScan(t) if t.table_name.table() == "source" => Ok(()),
        LogicalPlan::TableScan(t) => Err(format!("reads `{}` beside `source`", t.table_name)),
        LogicalPlan::Projection(_) | LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {
            for e in plan.expressions() {
                if e.exists(|e| Ok(matches!(e, Expr::AggregateFunction(_))))
                    .unwrap_or(true)
                {
                    return Err("an aggregate below the GROUP BY".into());
                }
                row_wise_expr(&e)?;
            }
            plan.inputs().into_iter().try_for_each(row_wise)
        }
        other => Err(format!("`{}` below the GROUP BY", node_name(other))),
    }
}

/// The windows the delta's partial aggregates touch. Every partial row must have one: a
/// `window_start` that is null or not a timestamp would merge into no window (its row dropped,
/// or, a null group, added again by every run), so it is an error naming the pipeline and the
/// column (a recompute replaces the windows of the source's times and never reads it back).
pub(crate) fn partial_windows(partials: &[RecordBatch], context: &str) -> Result<BTreeSet<i64>> {
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let invalid = |why: String| {
        Error::new(
            ErrorKind::Transform,
            format!(
                "{context}: output column `{WINDOW_START}` {why}; a merged aggregate needs each \
                 row's window (e.g. `SELECT window_start, …`, as `source` gives it)"
            ),
        )
    };
    let mut touched = BTreeSet::new();
    for b in partials {
        let col = b
            .column_by_name(WINDOW_START)
            .ok_or_else(|| invalid("is missing".into()))?;
        let micros = cast_with_options(
            col,
            &DataType::Timestamp(TimeUnit::Microsecond, None),
            &options,
        )
        .map_err(|e| invalid(format!("is not a timestamp ({}): {e}", col.data_type())))?;
        let micros = micros
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .ok_or_else(|| invalid("is not a timestamp".into()))?;
        if micros.null_count() > 0 {
            return Err(invalid(format!(
                "is null in {} row(s)",
                micros.null_count()
            )));
        }
        touched.extend(micros.values().iter().copied());
    }
    Ok(touched)
}

/// The merge's column saying whether a decimal sum `name` has a value (see [`Merge::sql`]).
fn summed(name: &str) -> String {
    format!("{name}\u{1}summed")
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn integer(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
    )
}

impl Merge {
    /// The SQL that merges partial rows of `output` (registered as `source`) per group.
    fn sql(&self, output: &SchemaRef) -> Result<String> {
        let mut select = Vec::with_capacity(self.columns.len());
        let mut keys = Vec::new();
        for (name, role) in &self.columns {
            let q = quoted(name);
            let ty = output
                .field_with_name(name)
                .map_err(|e| Error::new(ErrorKind::Internal, format!("merge column: {e}")))?
                .data_type();
            select.push(match role {
                Role::Key => {
                    keys.push(q.clone());
                    q
                }
                Role::Count | Role::Sum if integer(ty) => {
                    format!("sum(CAST({q} AS DECIMAL(38,0))) AS {q}")
                }
                // In 256 bits: a `DECIMAL(38,s)` sum's own type holds no overflow (DataFusion
                // keeps it at 38 digits, wrapping). Back to 128 bits (null if it does not fit,
                // beside whether it was null before), then checked against the column's
                // precision in `cast_back`.
                Role::Sum => match ty {
                    DataType::Decimal128(_, scale) => format!(
                        "TRY_CAST(sum(CAST({q} AS DECIMAL(76,{scale}))) AS DECIMAL(38,{scale})) AS {q}, \
                         count({q}) > 0 AS {}",
                        quoted(&summed(name))
                    ),
                    _ => format!("sum({q}) AS {q}"),
                },
                Role::Count => format!("sum({q}) AS {q}"),
                Role::Min => format!("min({q}) AS {q}"),
                Role::Max => format!("max({q}) AS {q}"),
            });
        }
        Ok(format!(
            "SELECT {} FROM source GROUP BY {}",
            select.join(", "),
            keys.join(", ")
        ))
    }

    /// Merges `old` rows (the sink's, of the touched windows) with the delta's `partials` (both
    /// with `output`'s columns, by name): one row per group, in `output`'s schema.
    pub(crate) async fn merge(
        &self,
        output: &SchemaRef,
        old: Vec<RecordBatch>,
        partials: Vec<RecordBatch>,
        context: &str,
    ) -> Result<Vec<RecordBatch>> {
        let mut rows = Vec::with_capacity(old.len() + partials.len());
        for b in old.iter().chain(&partials) {
            if b.num_rows() > 0 {
                rows.push(transform::conform(b, output)?);
            }
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self.sql(output)?;
        let (_, merged) =
            transform::run_sql(&sql, output.clone(), rows, &format!("{context} (merge)")).await?;
        for b in &merged {
            self.check_decimal_sums(b, context)?;
        }
        merged
            .iter()
            .map(|b| cast_back(b, output, context))
            .collect()
    }

    /// A decimal sum that has values but is null after the merge did not fit 128 bits.
    fn check_decimal_sums(&self, b: &RecordBatch, context: &str) -> Result<()> {
        for (name, role) in &self.columns {
            let (Role::Sum, Some(v), Some(has)) = (
                role,
                b.column_by_name(name),
                b.column_by_name(&summed(name)),
            ) else {
                continue;
            };
            let has = has
                .as_any()
                .downcast_ref::<arrow::array::BooleanArray>()
                .ok_or_else(|| {
                    Error::new(ErrorKind::Internal, format!("{context}: merge of `{name}`"))
                })?;
            if (0..b.num_rows()).any(|i| v.is_null(i) && has.is_valid(i) && has.value(i)) {
                return Err(overflow(
                    context,
                    name,
                    v.data_type(),
                    "more than 38 digits",
                ));
            }
        }
        Ok(())
    }
}

fn overflow(context: &str, name: &str, ty: &DataType, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Transform,
        format!(
            "{context}: merging column `{name}` overflows its type {ty}: {e}; \
             widen it in the SQL (e.g. CAST(... AS DECIMAL(38,0)))"
        ),
    )
}

/// `batch` in `output`'s types, cast checked: a merged sum or count that no longer fits its
/// column is an error, never a wrapped or nulled value.
fn cast_back(batch: &RecordBatch, output: &SchemaRef, context: &str) -> Result<RecordBatch> {
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let mut cols = Vec::with_capacity(output.fields().len());
    for f in output.fields() {
        let c = batch.column_by_name(f.name()).ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                format!("{context}: merge lost column `{}`", f.name()),
            )
        })?;
        let c = if c.data_type() == f.data_type() {
            c.clone()
        } else {
            cast_with_options(c, f.data_type(), &options)
                .map_err(|e| overflow(context, f.name(), f.data_type(), e))?
        };
        // A decimal of the column's own type may still hold more digits than its precision.
        if let DataType::Decimal128(precision, _) = f.data_type() {
            if let Some(d) = c.as_any().downcast_ref::<arrow::array::Decimal128Array>() {
                d.validate_decimal_precision(*precision)
                    .map_err(|e| overflow(context, f.name(), f.data_type(), e))?;
            }
        }
        cols.push(c);
    }
    RecordBatch::try_new(Arc::clone(output), cols)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("{context}: merged rows: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Decimal128Array, Float64Array, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};

    fn source() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("region", DataType::Utf8, true),
            Field::new("customer_id", DataType::Int64, true),
            Field::new("amount", DataType::Float64, true),
            Field::new("price", DataType::Decimal128(10, 2), true),
            Field::new(
                "window_start",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                true,
            ),
        ]))
    }

    async fn verdict(sql: &str) -> std::result::Result<Merge, String> {
        analyze(sql, source(), &[], "test").await.unwrap()
    }

    #[tokio::test]
    async fn decomposable_aggregates_are_recognised() {
        let m = verdict(
            "SELECT window_start, region, count(*) AS orders, sum(amount) AS revenue FROM source \
             GROUP BY window_start, region",
        )
        .await
        .unwrap();
        assert_eq!(
            m.columns,
            vec![
                ("window_start".into(), Role::Key),
                ("region".into(), Role::Key),
                ("orders".into(), Role::Count),
                ("revenue".into(), Role::Sum),
            ]
        );
        let m = verdict(
            "SELECT upper(region) AS r, window_start, min(amount), max(price) AS top, \
             count(customer_id) AS n, sum(price) AS p FROM source WHERE amount > 1 \
             GROUP BY window_start, upper(region) ORDER BY r",
        )
        .await
        .unwrap();
        let roles: Vec<Role> = m.columns.iter().map(|c| c.1).collect();
        assert_eq!(
            roles,
            vec![
                Role::Key,
                Role::Key,
                Role::Min,
                Role::Max,
                Role::Count,
                Role::Sum
            ]
        );
    }

    #[tokio::test]
    async fn other_aggregates_recompute() {
        for (sql, why) in [
            (
                "SELECT window_start, count(DISTINCT customer_id) AS c FROM source GROUP BY window_start",
                "DISTINCT",
            ),
            (
                "SELECT window_start, avg(amount) AS a FROM source GROUP BY window_start",
                "avg",
            ),
            (
                "SELECT window_start, region, count(*) AS n FROM source GROUP BY window_start, region HAVING count(*) > 1",
                "in between",
            ),
            (
                "SELECT window_start, sum(amount) / count(*) AS a FROM source GROUP BY window_start",
                "expression over",
            ),
            (
                "SELECT window_start, count(*) FILTER (WHERE amount > 1) AS n FROM source GROUP BY window_start",
                "FILTER",
            ),
            (
                "SELECT window_start, sum(amount) AS s FROM source GROUP BY window_start, region",
                "not an output column",
            ),
            (
                "SELECT window_start, region, count(*) AS n FROM source GROUP BY window_start, region LIMIT 3",
                "Limit",
            ),
            (
                "SELECT window_start, sum(amount) AS s FROM (SELECT * FROM source LIMIT 10) t GROUP BY window_start",
                "Limit",
            ),
            (
                "SELECT window_start, sum(amount) AS s FROM source WHERE random() < 0.5 GROUP BY window_start",
                "volatile",
            ),
            (
                "SELECT window_start, sum(amount) AS s FROM source \
                 WHERE window_start > now() - INTERVAL '7 days' GROUP BY window_start",
                "not immutable",
            ),
            (
                "SELECT window_start, current_date() AS d, count(*) AS n FROM source \
                 GROUP BY window_start, current_date()",
                "not immutable",
            ),
            (
                "SELECT window_start, region, amount FROM source",
                "not a GROUP BY",
            ),
            (
                "SELECT window_start, region, sum(amount) OVER (PARTITION BY region) AS s FROM source",
                "not a GROUP BY",
            ),
            (
                "SELECT DISTINCT window_start, count(*) AS n FROM source GROUP BY window_start",
                "",
            ),
        ] {
            let e = verdict(sql).await.unwrap_err();
            assert!(e.contains(why), "{sql}: {e}");
        }
    }

    fn output() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(
                "window_start",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                true,
            ),
            Field::new("region", DataType::Utf8, true),
            Field::new("orders", DataType::Int64, true),
            Field::new("revenue", DataType::Float64, true),
            Field::new("low", DataType::Float64, true),
            Field::new("paid", DataType::Decimal128(20, 2), true),
        ]))
    }

    fn merge_of() -> Merge {
        Merge {
            columns: vec![
                ("window_start".into(), Role::Key),
                ("region".into(), Role::Key),
                ("orders".into(), Role::Count),
                ("revenue".into(), Role::Sum),
                ("low".into(), Role::Min),
                ("paid".into(), Role::Sum),
            ],
        }
    }

    #[allow(clippy::type_complexity)]
    fn rows(
        r: Vec<(
            i64,
            Option<&str>,
            i64,
            Option<f64>,
            Option<f64>,
            Option<i128>,
        )>,
    ) -> RecordBatch {
        RecordBatch::try_new(
            output(),
            vec![
                Arc::new(
                    TimestampMicrosecondArray::from(r.iter().map(|x| x.0).collect::<Vec<_>>())
                        .with_timezone("+00:00"),
                ),
                Arc::new(StringArray::from(r.iter().map(|x| x.1).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(r.iter().map(|x| x.2).collect::<Vec<_>>())),
                Arc::new(Float64Array::from(
                    r.iter().map(|x| x.3).collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(
                    r.iter().map(|x| x.4).collect::<Vec<_>>(),
                )),
                Arc::new(
                    Decimal128Array::from(r.iter().map(|x| x.5).collect::<Vec<_>>())
                        .with_precision_and_scale(20, 2)
                        .unwrap(),
                ),
            ],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn counts_and_sums_add_min_takes_the_least_nulls_as_sql() {
        let old = rows(vec![
            (0, Some("eu"), 2, Some(1.5), Some(0.5), Some(100)),
            (0, None, 1, None, None, None),
            (60, Some("us"), 1, Some(4.0), Some(4.0), Some(7)),
        ]);
        let delta = rows(vec![
            (0, Some("eu"), 3, Some(2.0), Some(0.25), None),
            (0, None, 2, None, None, None),
            (120, Some("us"), 1, Some(1.0), Some(1.0), Some(1)),
        ]);
        let out = merge_of()
            .merge(&output(), vec![old], vec![delta], "test")
            .await
            .unwrap();
        let cols: Vec<String> = output().fields().iter().map(|f| f.name().clone()).collect();
        let mut got = transform::canonical_rows(&out, &cols).unwrap();
        got.sort();
        let f = |v: f64| {
            transform::canonical_rows(
                &[RecordBatch::try_new(
                    Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, true)])),
                    vec![Arc::new(Float64Array::from(vec![v]))],
                )
                .unwrap()],
                &["x".to_string()],
            )
            .unwrap()[0][0]
                .clone()
        };
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(out[0].schema(), output());
        let eu = got.iter().find(|r| r[1] == "eu").unwrap();
        assert_eq!(
            eu[2..],
            ["5".to_string(), f(3.5), f(0.25), "1.00".to_string()]
        );
        // The null region is a group; a sum of nulls stays null, a count adds.
        let none = got.iter().find(|r| r[1] == "NULL").unwrap();
        assert_eq!(none[2..], ["3", "NULL", "NULL", "NULL"]);
        assert_eq!(got.iter().filter(|r| r[1] == "us").count(), 2);
    }

    #[tokio::test]
    async fn an_integer_sum_that_overflows_is_an_error() {
        let old = rows(vec![(0, Some("eu"), i64::MAX - 1, None, None, None)]);
        let delta = rows(vec![(0, Some("eu"), 2, None, None, None)]);
        let e = merge_of()
            .merge(&output(), vec![old], vec![delta], "pipeline p")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transform);
        assert!(e.to_string().contains("`orders` overflows"), "{e}");
        let near = rows(vec![(0, Some("eu"), i64::MAX - 2, None, None, None)]);
        let two = rows(vec![(0, Some("eu"), 2, None, None, None)]);
        let out = merge_of()
            .merge(&output(), vec![near], vec![two], "pipeline p")
            .await
            .unwrap();
        let n = out[0]
            .column_by_name("orders")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .value(0);
        assert_eq!(n, i64::MAX);
        // A decimal sum beyond its precision: an error too.
        let big = 10i128.pow(19);
        let old = rows(vec![(0, Some("eu"), 1, None, None, Some(9 * big))]);
        let delta = rows(vec![(0, Some("eu"), 1, None, None, Some(9 * big))]);
        let e = merge_of()
            .merge(&output(), vec![old], vec![delta], "pipeline p")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("`paid` overflows"), "{e}");
        assert!(out[0].column(0).null_count() == 0);
    }

    fn pipeline(extra: &str) -> PipelineConfig {
        toml::from_str(&format!(
            "name = \"p\"\nsource = \"orders\"\nsink = \"s\"\nmode = \"aggregate\"\n\
             window = \"1m\"\nsql = \"SELECT 1\"\n{extra}"
        ))
        .unwrap()
    }

    /// Review findings: a sink that lacks the rows before a `start` other than `earliest`, or
    /// keeps a skipped overwrite's rows, is not the base a merge adds to: such pipelines recompute.
    #[test]
    fn a_late_start_or_skipped_row_changes_recompute() {
        assert_eq!(settings_forbid(&pipeline("")), None);
        assert_eq!(settings_forbid(&pipeline("start = \"earliest\"")), None);
        for (extra, why) in [
            ("start = \"latest\"", "latest"),
            ("start = \"snapshot:42\"", "snapshot:42"),
            ("start = \"timestamp:2026-01-01T00:00:00Z\"", "timestamp:"),
            ("on_row_change = \"skip\"", "skip"),
        ] {
            let e = settings_forbid(&pipeline(extra)).unwrap_or_default();
            assert!(e.contains(why), "{extra}: {e:?}");
        }
    }

    /// Review finding: a partial row without a window merged into none (dropped, or a null
    /// group added again every run).
    #[test]
    fn a_partial_row_without_a_window_is_an_error_naming_the_column() {
        let ok = rows(vec![
            (0, Some("eu"), 1, None, None, None),
            (60, Some("eu"), 1, None, None, None),
        ]);
        assert_eq!(
            partial_windows(std::slice::from_ref(&ok), "pipeline `p`").unwrap(),
            BTreeSet::from([0, 60])
        );
        let null = RecordBatch::try_new(
            output(),
            std::iter::once(Arc::new(
                TimestampMicrosecondArray::from(vec![Some(0), None]).with_timezone("+00:00"),
            ) as arrow::array::ArrayRef)
            .chain(ok.columns()[1..].iter().cloned())
            .collect(),
        )
        .unwrap();
        let e = partial_windows(&[ok.clone(), null], "pipeline `p`").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transform);
        assert!(!e.is_retryable());
        assert!(
            e.to_string().contains("pipeline `p`")
                && e.to_string().contains("`window_start` is null"),
            "{e}"
        );
        let text = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                "window_start",
                DataType::Utf8,
                true,
            )])),
            vec![Arc::new(StringArray::from(vec![
                "2026-01-01T00:00:00Z",
                "eu",
            ]))],
        )
        .unwrap();
        let e = partial_windows(&[text], "pipeline `p`").unwrap_err();
        assert!(
            e.to_string().contains("`window_start` is not a timestamp"),
            "{e}"
        );
    }

    /// Review finding: a `DECIMAL(38,s)` sum's type is its column's, so the checked cast back
    /// was skipped and a merged sum beyond 38 digits was written.
    #[tokio::test]
    async fn a_decimal_38_sum_beyond_its_precision_is_an_error() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("window_start", DataType::Int64, true),
            Field::new("big", DataType::Decimal128(38, 2), true),
        ]));
        let m = Merge {
            columns: vec![
                ("window_start".into(), Role::Key),
                ("big".into(), Role::Sum),
            ],
        };
        let batch = |v: i128| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(vec![0])),
                    Arc::new(
                        Decimal128Array::from(vec![v])
                            .with_precision_and_scale(38, 2)
                            .unwrap(),
                    ),
                ],
            )
            .unwrap()
        };
        let six = 6 * 10i128.pow(37);
        let e = m
            .merge(&schema, vec![batch(six)], vec![batch(six)], "pipeline p")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("`big` overflows"), "{e}");
        // Beyond i128 too (a 128-bit sum would wrap to a valid negative value).
        let nine = 9 * 10i128.pow(37);
        let e = m
            .merge(&schema, vec![batch(nine)], vec![batch(nine)], "pipeline p")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("`big` overflows"), "{e}");
        let out = m
            .merge(
                &schema,
                vec![batch(six)],
                vec![batch(-six + 5)],
                "pipeline p",
            )
            .await
            .unwrap();
        assert_eq!(out[0].schema(), schema);
        let v = out[0]
            .column(1)
            .as_any()
            .downcast_ref::<Decimal128Array>()
            .unwrap()
            .value(0);
        assert_eq!(v, 5);
    }
}
