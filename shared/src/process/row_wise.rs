//! Whether a pipeline's SQL is row-wise over `source`, as `append` and `latest` pipelines
//! require: each output row comes from one source row alone (filtered, projected, enriched by
//! joined tables), so the SQL over the source split into deltas, run by run, gives what it gives
//! over the whole source at once, which is what `reconcile` and a refresh compute.
//!
//! A `GROUP BY` over a delta is the aggregate of that delta only (a `latest` sink then keeps the
//! last delta's count per key); so are `DISTINCT`, window functions and `LIMIT`. A join of
//! `source` with itself pairs rows only within a delta; an outer join that keeps the joined
//! table's unmatched rows, or a `UNION` branch without `source`, emits them again every run; a
//! function that is not immutable (`now()`) gives each run its own value.

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::JoinType;
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};

/// `Ok` when `plan` (DataFusion's unoptimised plan of the SQL, `source` the delta) is row-wise
/// over `source`; else what is not, in words.
pub(crate) fn check(plan: &LogicalPlan) -> std::result::Result<(), String> {
    if !reads_source(plan) {
        return Err("the SQL does not read `source`".into());
    }
    over_source(plan)?;
    stable_everywhere(plan)
}

/// No function that is not immutable anywhere in `plan`, joined tables and subqueries included:
/// `now()` in a subquery or a one-row derived table filters or enriches each run's rows by that
/// run's clock just the same.
fn stable_everywhere(plan: &LogicalPlan) -> std::result::Result<(), String> {
    let mut bad: Option<String> = None;
    let walked = plan.apply_with_subqueries(|node| {
        for e in node.expressions() {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    if f.func.signature().volatility != Volatility::Immutable {
                        bad = Some(format!(
                            "`{}`: a function that is not immutable (volatile or stable, as now())",
                            e.schema_name()
                        ));
                        return Ok(TreeNodeRecursion::Stop);
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
            if bad.is_some() {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    match (bad, walked) {
        (Some(why), _) => Err(why),
        (None, Err(e)) => Err(format!("the plan could not be checked: {e}")),
        (None, Ok(_)) => Ok(()),
    }
}

/// Whether `plan`, its subqueries included, reads `source`.
fn reads_source(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let visited = plan.apply_with_subqueries(|node| {
        if matches!(node, LogicalPlan::TableScan(t) if t.table_name.table() == "source") {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    // A plan that cannot be walked is taken to read it (and then judged node by node).
    found || visited.is_err()
}

/// `plan`, which reads `source`: row-wise node by node down to the scan of `source`. A subtree
/// without `source` (a joined table, a subquery over one) may be anything: it is read whole at
/// one snapshot by every run.
fn over_source(plan: &LogicalPlan) -> std::result::Result<(), String> {
    match plan {
        LogicalPlan::TableScan(t) if t.table_name.table() == "source" => Ok(()),
        LogicalPlan::Projection(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Unnest(_) => {
            plan.expressions().iter().try_for_each(per_row)?;
            plan.inputs().into_iter().try_for_each(over_source)
        }
        // The output's order does not matter to a sink; a LIMIT keeps some rows of each delta.
        LogicalPlan::Sort(s) if s.fetch.is_none() => over_source(&s.input),
        LogicalPlan::Join(j) => {
            let (left, right) = (reads_source(&j.left), reads_source(&j.right));
            if left && right {
                return Err("`source` is joined with itself (rows pair up only within a run's delta)".into());
            }
            let keeps_source_rows_only = if left {
                matches!(
                    j.join_type,
                    JoinType::Inner
                        | JoinType::Left
                        | JoinType::LeftSemi
                        | JoinType::LeftAnti
                        | JoinType::LeftMark
                )
            } else {
                matches!(
                    j.join_type,
                    JoinType::Inner
                        | JoinType::Right
                        | JoinType::RightSemi
                        | JoinType::RightAnti
                        | JoinType::RightMark
                )
            };
            if !keeps_source_rows_only {
                return Err(format!(
                    "a {} join keeps the joined table's unmatched rows (emitted again by every run)",
                    j.join_type
                ));
            }
            plan.expressions().iter().try_for_each(per_row)?;
            over_source(if left { &j.left } else { &j.right })
        }
        LogicalPlan::Union(u) => {
            for input in &u.inputs {
                if !reads_source(input) {
                    return Err("a UNION branch does not read `source` (its rows would be emitted by every run)".into());
                }
                over_source(input)?;
            }
            Ok(())
        }
        other => Err(format!(
            "`{}` over `source` (an aggregate, DISTINCT, window or LIMIT sees one run's delta only)",
            node_name(other)
        )),
    }
}

/// An expression over a source row: no aggregate or window function and no subquery that reads
/// `source` (functions that are not immutable are refused anywhere: [`stable_everywhere`]).
fn per_row(expr: &Expr) -> std::result::Result<(), String> {
    let mut bad: Option<String> = None;
    let walked = expr.apply(|e| {
        let why = match e {
            Expr::AggregateFunction(_) => Some("an aggregate function"),
            Expr::WindowFunction(_) => Some("a window function"),
            Expr::ScalarSubquery(s) if reads_source(&s.subquery) => {
                Some("a subquery over `source`")
            }
            Expr::Exists(x) if reads_source(&x.subquery.subquery) => {
                Some("a subquery over `source`")
            }
            Expr::InSubquery(x) if reads_source(&x.subquery.subquery) => {
                Some("a subquery over `source`")
            }
            _ => None,
        };
        match why {
            Some(why) => {
                bad = Some(format!("`{}`: {why}", e.schema_name()));
                Ok(TreeNodeRecursion::Stop)
            }
            None => Ok(TreeNodeRecursion::Continue),
        }
    });
    match (bad, walked) {
        (Some(why), _) => Err(why),
        (None, Err(e)) => Err(format!(
            "`{}` could not be checked: {e}",
            expr.schema_name()
        )),
        (None, Ok(_)) => Ok(()),
    }
}

/// A plan node's name (`Aggregate`, `Window`, …) for messages.
pub(super) fn node_name(p: &LogicalPlan) -> String {
    p.display()
        .to_string()
        .split(':')
        .next()
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field, Schema, TimeUnit};

    use super::*;
    use crate::process::transform::{logical_plan, Relation};

    async fn verdict(sql: &str) -> std::result::Result<(), String> {
        let source = Arc::new(Schema::new(vec![
            Field::new("customer_id", DataType::Int64, true),
            Field::new("amount", DataType::Float64, true),
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                true,
            ),
        ]));
        let customers = Relation {
            name: "customers".into(),
            schema: Arc::new(Schema::new(vec![
                Field::new("customer_id", DataType::Int64, true),
                Field::new("segment", DataType::Utf8, true),
            ])),
            batches: Vec::new(),
        };
        let (plan, _) = logical_plan(sql, source, &[customers], "test")
            .await
            .unwrap();
        check(&plan)
    }

    #[tokio::test]
    async fn filters_projections_and_enrichment_are_row_wise() {
        for sql in [
            "SELECT * FROM source",
            "SELECT customer_id, amount * 2 AS doubled, event_time FROM source WHERE amount > 10 ORDER BY event_time",
            "SELECT s.customer_id, c.segment FROM source s JOIN customers c ON s.customer_id = c.customer_id",
            "SELECT s.customer_id, c.segment FROM source s LEFT JOIN customers c ON s.customer_id = c.customer_id",
            "SELECT s.customer_id, c.segment FROM customers c RIGHT JOIN source s ON s.customer_id = c.customer_id",
            // A dimension deduplicated in a subquery: anything goes over a joined table.
            "SELECT s.customer_id, c.segment FROM source s JOIN (SELECT customer_id, max(segment) AS segment FROM customers GROUP BY customer_id) c ON s.customer_id = c.customer_id",
            "SELECT * FROM source WHERE customer_id IN (SELECT customer_id FROM customers WHERE segment = 'vip')",
            "SELECT customer_id FROM source WHERE amount > 1 UNION ALL SELECT customer_id FROM source WHERE amount < 0",
            "SELECT * FROM (SELECT customer_id, amount FROM source) t WHERE amount > 0",
        ] {
            assert_eq!(verdict(sql).await, Ok(()), "{sql}");
        }
    }

    #[tokio::test]
    async fn what_sees_a_whole_delta_is_not_row_wise() {
        for (sql, says) in [
            ("SELECT customer_id, max(event_time) AS event_time, count(*) AS orders FROM source GROUP BY customer_id", "Aggregate"),
            ("SELECT DISTINCT customer_id FROM source", "Distinct"),
            ("SELECT customer_id, row_number() OVER (PARTITION BY customer_id ORDER BY event_time) AS n FROM source", "Window"),
            ("SELECT * FROM source LIMIT 10", "Limit"),
            ("SELECT * FROM source WHERE event_time > now() - INTERVAL '30 days'", "not immutable"),
            ("SELECT * FROM source WHERE event_time > (SELECT now() - INTERVAL '30 days')", "not immutable"),
            ("SELECT s.*, n.t FROM source s CROSS JOIN (SELECT now() AS t) n", "not immutable"),
            ("SELECT s.customer_id, c.segment FROM source s JOIN (SELECT * FROM customers WHERE random() < 0.5) c ON s.customer_id = c.customer_id", "not immutable"),
            ("SELECT a.customer_id FROM source a JOIN source b ON a.customer_id = b.customer_id", "itself"),
            ("SELECT s.customer_id, c.segment FROM source s FULL JOIN customers c ON s.customer_id = c.customer_id", "unmatched"),
            ("SELECT c.segment FROM customers c LEFT JOIN source s ON s.customer_id = c.customer_id", "unmatched"),
            ("SELECT customer_id FROM source UNION ALL SELECT customer_id FROM customers", "UNION"),
            ("SELECT * FROM source WHERE amount > (SELECT avg(amount) FROM source)", "subquery over `source`"),
            ("SELECT segment FROM customers", "does not read"),
        ] {
            let why = verdict(sql).await.expect_err(sql);
            assert!(why.contains(says), "{sql}: {why}");
        }
    }
}
