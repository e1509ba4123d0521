//! Enrichment joins: the tables a pipeline's SQL reads by name beside `source` (`joins`,
//! dimension or reference tables: configured tables or other pipelines' sinks).
//!
//! A run reads each joined table whole, at its current snapshot when the run starts, into
//! memory (at most `max_join_bytes` of Arrow data for all of them together), registers it under
//! its table name, and records the snapshot ids in the sink commit
//! (`floe.join.<table>.snapshot-id`, carried forward with the checkpoint). Reconcile reads the
//! joined tables at the snapshots the sink's checkpoint snapshot records, so a dimension that
//! changed after the run does not make the sink look wrong. A later change of a joined table
//! never rewrites rows already emitted: append mode enriches each new source row with the
//! dimension as it is when the row is processed; aggregate mode recomputes a touched window
//! against the dimension's current snapshot (windows not touched keep the older enrichment);
//! `floe process refresh` recomputes everything against the current snapshots.

use std::collections::HashMap;

use iceberg::table::Table;

use super::transform::{self, Relation};
use super::{input, Processor};
use crate::catalog;
use crate::config::PipelineConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::summary;

/// A pipeline's joined tables for one run (or only their schemas, to plan), and the snapshot
/// each was read at.
#[derive(Debug, Clone, Default)]
pub(super) struct Joined {
    /// The relations registered beside `source`.
    pub(super) relations: Vec<Relation>,
    /// (table, snapshot read; None: the table had no snapshot).
    pub(super) snapshots: Vec<(String, Option<i64>)>,
}

impl Joined {
    /// The sink-summary properties recording the snapshots read (none without joins).
    pub(super) fn properties(&self) -> Vec<(String, String)> {
        summary::join_properties(&self.snapshots)
    }
}

/// Which snapshot of a joined table to read.
enum At {
    /// The table's current snapshot.
    Current,
    /// The snapshot a sink commit recorded (None: the table had none then).
    Recorded(Option<i64>),
}

impl Processor {
    /// The joined tables of `p` at their current snapshots, rows read (`rows`) or only their
    /// schemas.
    pub(super) async fn joined(&self, p: &PipelineConfig, rows: bool) -> Result<Joined> {
        self.load_joined(p, rows, |_| At::Current).await
    }

    /// The joined tables of `p` at the snapshots recorded by the sink snapshot `sink_snapshot`
    /// of `sink` (the one holding the checkpoint): what that run joined with. A table the
    /// summary does not name (joined since) is read at its current snapshot.
    pub(super) async fn joined_as_recorded(
        &self,
        p: &PipelineConfig,
        sink: &Table,
        sink_snapshot: i64,
    ) -> Result<Joined> {
        let recorded: HashMap<String, Option<i64>> = sink
            .metadata()
            .snapshot_by_id(sink_snapshot)
            .map(|s| summary::read_joins(s.summary()))
            .unwrap_or_default();
        self.load_joined(p, true, |name| match recorded.get(name) {
            Some(at) => At::Recorded(*at),
            None => {
                tracing::warn!(pipeline = %p.name, table = name, "the sink records no snapshot of this joined table: reading its current one");
                At::Current
            }
        })
        .await
    }

    async fn load_joined(
        &self,
        p: &PipelineConfig,
        rows: bool,
        at: impl Fn(&str) -> At,
    ) -> Result<Joined> {
        let mut out = Joined::default();
        let mut held = 0u64;
        for name in &p.joins {
            let table = self.joined_table(p, name).await?;
            let schema = transform::table_schema(&table)?;
            let snapshot = match at(name) {
                At::Current => table.metadata().current_snapshot_id(),
                At::Recorded(None) => None,
                At::Recorded(Some(id)) => {
                    if table.metadata().snapshot_by_id(id).is_none() {
                        return Err(Error::new(
                            ErrorKind::Stale,
                            format!(
                                "pipeline `{}`: snapshot {id} of joined table `{name}`, which the sink's \
                                 last run read, is no longer in the table (expired); that run cannot be \
                                 reproduced: `floe process refresh --pipeline {}` rebuilds the sink \
                                 against the current snapshots",
                                p.name, p.name
                            ),
                        ));
                    }
                    Some(id)
                }
            };
            let batches = match snapshot {
                Some(id) if rows => {
                    let limit = p.max_join_bytes;
                    let (batches, total) =
                        input::scan_bounded(&table, id, &schema, held, limit, |total| {
                            Error::new(
                                ErrorKind::Transform,
                                format!(
                                    "pipeline `{}`: joined table `{name}` (snapshot {id}) does not fit in \
                                     memory: the joined tables hold more than {total} bytes so far, over \
                                     max_join_bytes = {limit}; raise the limit (and the function's memory) \
                                     or join a smaller table",
                                    p.name
                                ),
                            )
                        })
                        .await?;
                    held = total;
                    batches
                }
                _ => Vec::new(),
            };
            out.snapshots.push((name.clone(), snapshot));
            out.relations.push(Relation {
                name: name.clone(),
                schema,
                batches,
            });
        }
        Ok(out)
    }

    /// Loads joined table `name` of `p`; one that does not exist yet is a retryable error (the
    /// poll skips such a pipeline, see `handle_payload`).
    async fn joined_table(&self, p: &PipelineConfig, name: &str) -> Result<Table> {
        let ident = catalog::table_ident(&self.config, name)?;
        let exists = self
            .committer
            .catalog()
            .table_exists(&ident)
            .await
            .map_err(|e| {
                Error::iceberg(format!("checking joined table {ident}"), e).with_retryable(true)
            })?;
        if !exists {
            return Err(Error::new(
                ErrorKind::Transform,
                format!(
                    "pipeline `{}` joins `{name}`, which does not exist yet",
                    p.name
                ),
            )
            .with_retryable(true));
        }
        self.committer.load(&ident).await
    }
}
