//! `floe schema drop-column`: the explicit end of a deprecation. A column is removed only when
//! the config deprecates it and its `remove_after` date has come, and — unless forced — no
//! pipeline still reads it (each consumer is planned against the schema without it, see
//! [`crate::consumers`]). The removal is a new table version through the one commit loop
//! ([`crate::commit`]): a `replace` snapshot without files whose schema lacks the column, with a
//! `floe.schema-change` summary. Old data files keep their values under the column's id (never
//! reused); ingest treats the name as a dropped column from then on and does not add it again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::NaiveDate;
use serde::Serialize;

use crate::commit::{CommitLimits, Committer, Outcome, Plan, Skipped};
use crate::config::{Config, Deprecation};
use crate::consumers::{self, ConsumerReport, Planner};
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::Change;
use crate::summary;

/// What to do.
#[derive(Debug, Clone)]
pub struct DropRequest {
    /// The table.
    pub table: String,
    /// The column.
    pub column: String,
    /// Check and report only; commit nothing.
    pub dry_run: bool,
    /// Drop although pipelines still read the column (never before its date).
    pub force: bool,
    /// Today (UTC), against `remove_after`.
    pub today: NaiveDate,
}

/// What `drop-column` decided and did.
#[derive(Debug, Clone, Serialize)]
pub struct DropReport {
    /// The table.
    pub table: String,
    /// The column.
    pub column: String,
    /// Its deprecation (owner, since, remove after), when the config has one.
    pub deprecation: Option<Deprecation>,
    /// The pipelines that still read it.
    pub readers: Vec<ConsumerReport>,
    /// Why the drop was refused (nothing committed); None when allowed.
    pub refused: Option<String>,
    /// The snapshot that dropped it (None on a dry run or a refusal).
    pub snapshot_id: Option<i64>,
    /// The column was already gone (a concurrent drop): nothing committed.
    pub already_dropped: bool,
    /// A dry run.
    pub dry_run: bool,
}

impl DropReport {
    fn refuse(mut self, why: String) -> Self {
        self.refused = Some(why);
        self
    }
}

/// Checks and (unless refused or a dry run) drops `req.column` from `req.table`.
pub async fn drop_column(
    config: &Config,
    committer: &Committer,
    req: &DropRequest,
) -> Result<DropReport> {
    let tcfg = config.table(&req.table).ok_or_else(|| {
        Error::new(
            ErrorKind::Config,
            format!("no configured table `{}`", req.table),
        )
    })?;
    let column = req.column.as_str();
    let deprecation = tcfg
        .deprecation_list()
        .into_iter()
        .find(|d| d.column == column);
    let mut report = DropReport {
        table: req.table.clone(),
        column: column.to_string(),
        deprecation: deprecation.clone(),
        readers: Vec::new(),
        refused: None,
        snapshot_id: None,
        already_dropped: false,
        dry_run: req.dry_run,
    };
    let Some(dep) = deprecation else {
        return Ok(report.refuse(format!(
            "`{column}` is not deprecated in the config: give it an owner and a remove_after date \
             first, so its consumers are warned"
        )));
    };
    if req.today < dep.remove_after {
        return Ok(report.refuse(format!(
            "`{column}` may be removed from {} on (remove_after); today is {}{}",
            dep.remove_after,
            req.today,
            dep.owner
                .as_deref()
                .map(|o| format!("; owner: {o}"))
                .unwrap_or_default()
        )));
    }
    if column == tcfg.event_time || column.starts_with('_') {
        return Ok(report.refuse(format!(
            "`{column}` is the table's event time or a floe column; it cannot be dropped"
        )));
    }
    let ident = crate::catalog::table_ident(config, &req.table)?;
    let table = committer.load(&ident).await?;
    let md = table.metadata();
    let schema = md.current_schema();
    let Some(field) = schema.field_by_name(column) else {
        report.already_dropped = true;
        return Ok(report);
    };
    let id = field.id;
    if schema.identifier_field_ids().any(|i| i == id)
        || md
            .partition_specs_iter()
            .any(|s| s.fields().iter().any(|f| f.source_id == id))
    {
        return Ok(report.refuse(format!(
            "`{column}` is an identifier field or a partition source; it cannot be dropped"
        )));
    }
    // Every sort order (other engines bind them all to the current schema on load; the default
    // one must bind for the metadata to build at all).
    if md
        .sort_orders_iter()
        .any(|o| o.fields.iter().any(|f| f.source_id == id))
    {
        return Ok(report.refuse(format!(
            "`{column}` is in a sort order of the table (`sort`); it cannot be dropped while the table sorts by it"
        )));
    }
    let planner = Planner::default();
    planner
        .load_relations(
            config,
            committer.catalog().as_ref(),
            &req.table,
            &consumers::consumers_of(config, &req.table),
        )
        .await;
    report.readers = consumers::readers_of(&planner, config, &req.table, schema, column).await;
    if !report.readers.is_empty() && !req.force {
        let who: Vec<String> = report.readers.iter().map(|r| r.describe()).collect();
        return Ok(report.refuse(format!(
            "pipelines still read `{column}`: {}; change them first, or pass --force",
            who.join("; ")
        )));
    }
    if req.dry_run {
        return Ok(report);
    }
    let limits = CommitLimits {
        max_attempts: config.ingest.max_commit_attempts,
        deadline: Instant::now() + Duration::from_secs(config.ingest.commit_timeout_seconds),
        skew: Duration::from_secs(config.ingest.dedup_skew_seconds),
    };
    let what = format!("dropped {column}");
    let outcome = committer
        .commit_from(&ident, Some(table.clone()), &limits, |t| {
            let current = t.metadata().current_schema();
            if current.field_by_name(column).is_none() {
                return Ok(Plan::Skip(Skipped::Obsolete(format!(
                    "`{column}` is already dropped"
                ))));
            }
            let without = consumers::without_column(current, column)
                .map_err(|e| Error::iceberg(format!("the schema without `{column}`"), e))?;
            let props = HashMap::from([
                (summary::SCHEMA_CHANGE.to_string(), what.clone()),
                (summary::OPERATION.to_string(), "drop-column".to_string()),
            ]);
            Ok(Plan::Apply(Change::drop_columns(
                without,
                current.schema_id(),
                props,
            )))
        })
        .await?;
    match outcome {
        Outcome::Committed { snapshot_id, .. } => report.snapshot_id = snapshot_id,
        Outcome::Skipped(_) => report.already_dropped = true,
    }
    Ok(report)
}
