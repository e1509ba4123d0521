//! The consumer gate: before an additive schema change (new columns, widenings) is committed with
//! an object's data, every pipeline reading the table is planned against the evolved schema and
//! checked against its sink ([`crate::consumers`]). A change that would break a pipeline the
//! current schema does not break follows the table's `on_consumer_break`:
//!
//! * `quarantine` (default): the object is ingested without the breaking part of the change:
//!   each new field and widening is checked alone, and those no consumer minds are kept (if they
//!   still break none together); records with a value for a refused field, or needing a refused
//!   widening, are quarantined, their reason naming the refused change, the pipeline and the
//!   column; every other record commits as it would have (dropped and untyped fields ignored);
//! * `stop`: the object fails (nothing committed; marked not retryable, but SQS redelivers it
//!   until `maxReceiveCount` and then moves the event to the DLQ; the reason is logged).
//!
//! Plans are cached per (pipeline, evolved source relation) in the ingestor, so a warm container
//! plans once per distinct change; tables nobody reads cost nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use iceberg::spec::{PrimitiveType, Schema};
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
    /// The sinks' schemas it was checked against (reused to split the change).
    sinks: HashMap<String, Schema>,
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

/// What an object written without the refused part of its change returns: the rows, and the
/// part of the change kept (if any).
pub(super) type Unchanged = (
    std::result::Result<Written, WriteFailure>,
    Option<(Schema, String)>,
);

/// An object's proposed change: new fields (with their type) and widenings.
pub(super) struct Proposed {
    pub(super) unknown: BTreeMap<String, Option<PrimitiveType>>,
    pub(super) widen: BTreeMap<String, PrimitiveType>,
}

impl Ingestor {
    /// The current schemas of the sinks of `tctx`'s consumers (loaded once per check; a sink
    /// that cannot be read is skipped with a warning: its SQL is still planned).
    async fn consumer_sinks(&self, tctx: &TableCtx) -> HashMap<String, Schema> {
        let mut sinks = HashMap::new();
        let consumers = consumers::consumers_of(&self.config, &tctx.cfg.name);
        self.planner
            .load_relations(
                &self.config,
                self.catalog().as_ref(),
                &tctx.cfg.name,
                &consumers,
            )
            .await;
        for p in consumers {
            match consumers::sink_schema(&self.config, self.catalog().as_ref(), p).await {
                Ok(Some(s)) => {
                    sinks.insert(p.name.clone(), s);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(pipeline = %p.name, sink = %p.sink, error = %e, "cannot read the sink to check a schema change against it")
                }
            }
        }
        sinks
    }

    /// The consumers `evolved` would break that the table's current schema does not.
    async fn breaks(
        &self,
        tctx: &TableCtx,
        table: &Table,
        evolved: &Schema,
        sinks: &HashMap<String, Schema>,
    ) -> Vec<ConsumerReport> {
        let current = table.metadata().current_schema();
        consumers::check(
            &self.planner,
            &self.config,
            &tctx.cfg.name,
            Some(current.as_ref()),
            evolved,
            sinks,
        )
        .await
        .into_iter()
        .filter(|r| r.verdict.breaks() && !r.already_broken)
        .collect()
    }

    /// The consumers `evolved` (the schema `table` would evolve to, by `what`) would break that
    /// the table's current schema does not; None when the change may be committed.
    pub(super) async fn consumer_refusal(
        &self,
        tctx: &TableCtx,
        table: &Table,
        evolved: &Schema,
        what: &str,
    ) -> Result<Option<Refusal>> {
        if consumers::consumers_of(&self.config, &tctx.cfg.name).is_empty() {
            return Ok(None);
        }
        let sinks = self.consumer_sinks(tctx).await;
        let breaks = self.breaks(tctx, table, evolved, &sinks).await;
        if breaks.is_empty() {
            return Ok(None);
        }
        Ok(Some(Refusal {
            what: what.to_string(),
            breaks,
            sinks,
        }))
    }

    /// Splits a refused change into the part no consumer minds (each field checked alone, then
    /// all of them together) and the refused rest: (the schema of the part kept, if any; the
    /// refused new fields; what the refused part is).
    async fn split_change(
        &self,
        tctx: &TableCtx,
        table: &Table,
        proposed: &Proposed,
        refusal: &Refusal,
    ) -> Result<(Option<(Schema, String)>, BTreeSet<String>, String)> {
        let md = table.metadata();
        let evolve = |u: &BTreeMap<String, Option<PrimitiveType>>,
                      w: &BTreeMap<String, PrimitiveType>| {
            crate::evolve::evolve_ingest_schema(md, u, w)
                .map_err(|e| Error::iceberg(format!("evolving the schema of {}", tctx.ident), e))
        };
        let sinks = &refusal.sinks;
        let (mut keep_u, mut keep_w) = (BTreeMap::new(), BTreeMap::new());
        let (mut refused_u, mut refused_w) = (BTreeMap::new(), BTreeMap::new());
        for (name, ty) in &proposed.unknown {
            let one = BTreeMap::from([(name.clone(), ty.clone())]);
            // None: the field changes nothing (no type, dropped, reserved): ignored as ever.
            if let Some((s, _)) = evolve(&one, &BTreeMap::new())? {
                if self.breaks(tctx, table, &s, sinks).await.is_empty() {
                    keep_u.extend(one);
                } else {
                    refused_u.extend(one);
                }
            }
        }
        for (name, ty) in &proposed.widen {
            let one = BTreeMap::from([(name.clone(), ty.clone())]);
            if let Some((s, _)) = evolve(&BTreeMap::new(), &one)? {
                if self.breaks(tctx, table, &s, sinks).await.is_empty() {
                    keep_w.extend(one);
                } else {
                    refused_w.extend(one);
                }
            }
        }
        let mut kept = evolve(&keep_u, &keep_w)?;
        let together_break = match &kept {
            Some((s, _)) => !self.breaks(tctx, table, s, sinks).await.is_empty(),
            None => false,
        };
        if together_break || (refused_u.is_empty() && refused_w.is_empty()) {
            // Not separable: the whole change is refused.
            refused_u.extend(keep_u);
            refused_w.extend(keep_w);
            kept = None;
        }
        let what = evolve(&refused_u, &refused_w)?
            .map(|(_, w)| w)
            .unwrap_or_else(|| refusal.what.clone());
        Ok((kept, refused_u.into_keys().collect(), what))
    }

    /// The object under a refused change, per `on_consumer_break`: `stop` fails it (not
    /// retryable); `quarantine` writes it again with only the part of the change no consumer
    /// minds (pinned to the version read first): records with a value for a refused field (or
    /// one needing a refused widening) are quarantined with the refusal in their reason (added
    /// as they are spooled, so within `max_quarantine_bytes`); the rest commits as usual.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn without_change(
        &self,
        obj: &ObjectRef,
        table: &Table,
        tctx: &TableCtx,
        route: &RouteConfig,
        read: &Version,
        params: &WriteParams<'_>,
        mut refusal: Refusal,
        proposed: &Proposed,
        mut refused_already: BTreeMap<String, String>,
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
        let (kept, refused, what) = self.split_change(tctx, table, proposed, &refusal).await?;
        refusal.what = what;
        tracing::warn!(object = %uri, table = %tctx.ident, reason = %why, refused = %refusal.what, kept = ?kept.as_ref().map(|k| &k.1), "schema change would break a consumer; ingesting without its breaking part");
        let target = match &kept {
            Some((s, _)) => crate::write::with_schema(table, s.clone())?,
            None => table.clone(),
        };
        let reopened = self.reopen_pinned(obj, read).await?;
        // The note is part of each quarantined line as it is spooled: within max_quarantine_bytes.
        let note = refusal.note();
        // Fields refused before the gate (`evolve::refuse_new_columns`) keep their own reason.
        for name in refused {
            refused_already.entry(name.clone()).or_insert_with(|| {
                format!("field `{name}` needs a schema change that was refused")
            });
        }
        let second = WriteParams {
            defer_quarantine_limit: false,
            reason_note: Some(&note),
            refused: Some(&refused_already),
            ..*params
        };
        let written = write_object(&target, tctx, route, reopened.body, &second).await;
        Ok((written, kept))
    }
}
