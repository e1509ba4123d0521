//! The consumer gate: before an additive schema change (new columns, widenings) is committed with
//! an object's data, every pipeline reading the table is planned against the evolved schema and
//! checked against its sink ([`crate::consumers`]). A change that would break a pipeline the
//! current schema does not break follows the table's `on_consumer_break`:
//!
//! * `quarantine` (default): the object is ingested without the change, as under the `strict`
//!   policy: records that need it (unknown fields, values that need the widening) are
//!   quarantined, their reason naming the change, the pipeline and the column;
//! * `stop`: the object fails (nothing committed, not retryable: it lands in the DLQ with the
//!   reason).
//!
//! Plans are cached per (pipeline, evolved source relation) in the ingestor, so a warm container
//! plans once per distinct change; tables nobody reads cost nothing.

use iceberg::spec::Schema;
use iceberg::table::Table;

use super::rows::{write_object, WriteFailure, WriteParams, Written};
use super::{Ingestor, TableCtx};
use crate::config::{ConsumerBreak, RouteConfig};
use crate::consumers::{self, ConsumerReport};
use crate::error::{Error, ErrorKind, Result};
use crate::event::ObjectRef;
use crate::store::Version;

/// An evolved schema refused because it would break consumers.
pub(super) struct Refusal {
    /// What the change was (`added coupon (string)`).
    what: String,
    /// The pipelines it would break (and the current schema does not).
    breaks: Vec<ConsumerReport>,
}

/// Most characters of the note added to each quarantined record's reason.
const NOTE_MAX_CHARS: usize = 512;

impl Refusal {
    /// The whole story: the change, and each pipeline with column, position and reason.
    fn describe(&self) -> String {
        let who: Vec<String> = self.breaks.iter().map(|b| b.describe()).collect();
        format!(
            "schema change refused ({}): it would break {}",
            self.what,
            who.join("; ")
        )
    }

    /// The note for each quarantined record: pipelines, columns and positions without
    /// DataFusion's text (which lists every field), at most [`NOTE_MAX_CHARS`], so that the
    /// quarantine object stays near its `max_quarantine_bytes` budget.
    fn note(&self) -> String {
        let who: Vec<String> = self
            .breaks
            .iter()
            .map(|b| match &b.verdict {
                consumers::Verdict::Breaks {
                    column, position, ..
                } => format!(
                    "pipeline `{}`{}{}",
                    b.pipeline,
                    column
                        .as_deref()
                        .map(|c| format!(" on column `{c}`"))
                        .unwrap_or_default(),
                    position
                        .as_deref()
                        .map(|p| format!(" (SQL {p})"))
                        .unwrap_or_default()
                ),
                consumers::Verdict::Ok => format!("pipeline `{}`", b.pipeline),
            })
            .collect();
        let note = format!(
            "schema change refused ({}): it would break {}",
            self.what,
            who.join("; ")
        );
        note.chars().take(NOTE_MAX_CHARS).collect()
    }
}

/// What an object written without its schema change returns: the rows, and no evolution.
pub(super) type Unchanged = (
    std::result::Result<Written, WriteFailure>,
    Option<(Schema, String)>,
);

impl Ingestor {
    /// The consumers `evolved` (the schema `table` would evolve to, by `what`) would break that
    /// the table's current schema does not; None when the change may be committed.
    pub(super) async fn consumer_refusal(
        &self,
        tctx: &TableCtx,
        table: &Table,
        evolved: &Schema,
        what: &str,
    ) -> Result<Option<Refusal>> {
        let pipelines = consumers::consumers_of(&self.config, &tctx.cfg.name);
        if pipelines.is_empty() {
            return Ok(None);
        }
        let mut sinks = std::collections::HashMap::new();
        for p in pipelines {
            match consumers::sink_schema(&self.config, self.catalog().as_ref(), p).await {
                Ok(Some(s)) => {
                    sinks.insert(p.name.clone(), s);
                }
                Ok(None) => {}
                // The SQL is still planned; only the comparison with this sink is skipped.
                Err(e) => {
                    tracing::warn!(pipeline = %p.name, sink = %p.sink, error = %e, "cannot read the sink to check a schema change against it")
                }
            }
        }
        let current = table.metadata().current_schema();
        let reports = consumers::check(
            &self.planner,
            &self.config,
            &tctx.cfg.name,
            Some(current.as_ref()),
            evolved,
            &sinks,
        )
        .await;
        let breaks: Vec<ConsumerReport> = reports
            .into_iter()
            .filter(|r| r.verdict.breaks() && !r.already_broken)
            .collect();
        if breaks.is_empty() {
            return Ok(None);
        }
        Ok(Some(Refusal {
            what: what.to_string(),
            breaks,
        }))
    }

    /// The object under a refused change, per `on_consumer_break`: `stop` fails it (not
    /// retryable); `quarantine` writes it again on the current schema as the strict policy
    /// would (pinned to the version read first), records needing the change quarantined with
    /// the refusal in their reason (added as they are spooled, so within `max_quarantine_bytes`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn without_change(
        &self,
        obj: &ObjectRef,
        table: &Table,
        tctx: &TableCtx,
        route: &RouteConfig,
        read: &Version,
        params: &WriteParams<'_>,
        refusal: Refusal,
    ) -> Result<Unchanged> {
        let uri = params.uri;
        let why = refusal.describe();
        if tctx.cfg.on_consumer_break == ConsumerBreak::Stop {
            tracing::error!(object = %uri, table = %tctx.ident, reason = %why, "schema change would break a consumer; object stopped");
            return Err(Error::new(
                ErrorKind::Transform,
                format!("{uri}: {why}; nothing committed (on_consumer_break = \"stop\")"),
            )
            .with_retryable(false));
        }
        tracing::warn!(object = %uri, table = %tctx.ident, reason = %why, "schema change would break a consumer; ingesting without it");
        let reopened = self
            .store
            .open(&obj.bucket, &obj.key, read)
            .await
            .map_err(|e| {
                if e.kind() == ErrorKind::Superseded {
                    Error::new(
                        ErrorKind::Superseded,
                        format!("{uri} changed between its two reads; not committed"),
                    )
                    .with_retryable(true)
                    .with_source(e)
                } else {
                    e
                }
            })?;
        // The note is part of each quarantined line as it is spooled: within max_quarantine_bytes.
        let note = refusal.note();
        let strict = WriteParams {
            allow_unknown: false,
            defer_quarantine_limit: false,
            reason_note: Some(&note),
            ..*params
        };
        let written = write_object(table, tctx, route, reopened.body, &strict).await;
        Ok((written, None))
    }
}
