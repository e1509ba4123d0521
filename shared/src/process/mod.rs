//! The process function's engine: a pipeline's new source rows → its SQL → its sink table,
//! exactly once.
//!
//! A run reads the sink's checkpoint (the last source snapshot consumed, in the sink's snapshot
//! summary), plans the source's delta after it ([`plan`]), runs the SQL
//! ([`transform`]) and commits the output **together with the new checkpoint** in one sink
//! snapshot. The commit re-reads the checkpoint on the version it commits onto: if another run
//! advanced it meanwhile, this run's output is dropped and the run re-plans from there. So
//! duplicate, late or concurrent triggers cannot duplicate or lose output, and a crash before the
//! commit leaves only orphan files (removed by orphan cleanup); the next run redoes the work.
//!
//! * `append` mode appends the SQL's rows over the new source rows (processed in bounded chunks
//!   of files: the SQL must be row-wise — filter, project, enrich).
//! * `aggregate` mode finds the event-time windows the new rows touch (late rows included),
//!   and replaces them in the sink with an `overwrite` snapshot, so the sink always equals the
//!   same SQL over the whole table. A decomposable SQL (`merge`: group keys plus count / sum /
//!   min / max) merges the delta's partial aggregates into the sink rows of those windows; any
//!   other recomputes the windows from the whole source table.
//!
//! [`Processor::refresh`] runs the same SQL over the whole table (batch / backfill) and replaces
//! the sink; [`Processor::reconcile`] compares that batch result with the incrementally
//! maintained sink.

//!
//! One file per concern: `processor` (a run, start to commit), [`plan`] (the delta after a
//! checkpoint), [`transform`] (the SQL), `input` (reading source rows in bounded chunks),
//! `windows` (aggregate windows), `merge` (decomposable aggregates), `output` (sink files), `alerts`, `reconcile` (the batch result
//! and reconcile), `refresh` (rebuilding a sink from the batch result), `trigger` (which
//! pipelines an event concerns, and which messages of an SQS batch to receive again), `joins`
//! (the tables the SQL joins by name, at recorded snapshots), `latest`/`upsert` (latest-state
//! pipelines) and `retract` (a latest run's retraction of source row changes: the buckets they
//! affect rebuilt from the source).

mod alerts;
mod input;
mod joins;
mod latest;
mod merge;
mod output;
pub mod plan;
mod processor;
mod reconcile;
mod refresh;
mod retract;
mod row_wise;
pub(crate) mod transform;
mod trigger;
mod upsert;
mod windows;

pub use plan::{plan, start_after, Delta, NewFile, RowChangePolicy};
pub use processor::{ProcessResult, Processor, RunReport};
pub use reconcile::Reconciliation;
pub use refresh::RefreshProgress;
pub use trigger::{failed_messages, Woken};
