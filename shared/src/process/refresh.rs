//! `refresh`, the batch speed's rebuild: recomputes a sink from the whole source (backfill, a
//! changed transform, an expired checkpoint, a row-changing source snapshot).

use std::collections::HashMap;
use std::time::Instant;

use iceberg::table::Table;

use super::output::Output;
use super::processor::MAX_ROUNDS;
use super::{windows, Processor, RunReport};
use crate::commit::{Outcome, Plan, Skipped};
use crate::config::PipelineMode;
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::Change;
use crate::summary;

impl Processor {
    /// Batch / backfill: runs the SQL over the whole source table and replaces the sink's content
    /// with the result, checkpointed at the source's current snapshot with the current transform
    /// version (the way out of a changed transform, an expired checkpoint or a row change).
    pub async fn refresh(&self, name: &str, deadline: Instant) -> Result<RunReport> {
        let p = self.pipeline(name)?;
        let started = Instant::now();
        let meter = self.meter();
        let mut replans = 0;
        loop {
            let pos = self.position(p).await?;
            let to = pos.source.metadata().current_snapshot_id();
            let (_, batches) = self.batch_output(p, &pos.source, to).await?;
            if p.mode == PipelineMode::Aggregate {
                windows::require_window_column(&batches, p)?;
            }
            let writer_id = format!("refresh-{}", uuid::Uuid::now_v7());
            let mut out = Output::new(&pos.sink, &writer_id)?;
            out.write(batches).await?;
            let (added, schema) = out.close().await?;
            let removed: Vec<String> = crate::scan::live_files(&pos.sink)
                .await?
                .into_iter()
                .map(|f| f.file.file_path().to_string())
                .collect();
            let mut props: HashMap<String, String> = HashMap::new();
            if let Some(to) = to {
                props.extend(summary::checkpoint_properties(
                    &pos.source_uuid,
                    to,
                    &pos.hash,
                ));
            }
            props.insert(summary::PIPELINE.into(), p.name.clone());
            props.insert(summary::OPERATION.into(), "refresh".into());
            let report = RunReport {
                pipeline: p.name.clone(),
                from_snapshot: pos.checkpoint.as_ref().map(|c| c.snapshot_id),
                to_snapshot: to,
                rows_out: added.iter().map(|f| f.record_count()).sum(),
                files_replaced: removed.len(),
                refresh: true,
                replans,
                ..Default::default()
            };
            let change = Change::overwrite(added.clone(), removed, props, schema);
            let base_snapshot = pos.sink.metadata().current_snapshot_id();
            let ident = pos.sink.identifier().clone();
            let result = self
                .committer
                .commit_from(
                    &ident,
                    Some(pos.sink.clone()),
                    &self.limits(deadline),
                    crate::commit::metered(meter.clone(), move |t: &Table| {
                        Ok(if t.metadata().current_snapshot_id() != base_snapshot {
                            Plan::Skip(Skipped::Obsolete(
                                "the sink changed during the refresh".into(),
                            ))
                        } else {
                            Plan::Apply(change.clone())
                        })
                    }),
                )
                .await;
            match result {
                Ok(Outcome::Committed { snapshot_id, .. }) => {
                    return Ok(RunReport {
                        sink_snapshot: snapshot_id,
                        seconds: started.elapsed().as_secs_f64(),
                        usage: Some(meter.usage()),
                        ..report
                    })
                }
                Ok(Outcome::Skipped(_)) => {}
                Err(e) if e.kind() == ErrorKind::Stale => {}
                Err(e) => return Err(e),
            }
            crate::write::delete_uncommitted(&pos.sink, &added).await;
            replans += 1;
            if replans >= MAX_ROUNDS || Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::DeadlineExceeded,
                    format!("refresh of `{name}`: the sink kept changing; {replans} attempts"),
                )
                .with_retryable(true));
            }
        }
    }
}
