//! Which pipelines a trigger concerns: floe commit events, Glue table changes and S3 metadata
//! notifications name their tables; schedules and manual calls wake every pipeline. And the
//! other side: a sink commit is announced with the same `floe.commit` event ingest sends, so a
//! pipeline whose source is that sink (a chain) is woken like one over an ingest table.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::{Processor, RunReport};
use crate::config::PipelineConfig;
use crate::event::{sqs_messages, trigger_tables};

/// The `detail` of the commit event of a sink snapshot: the sink as `table` (what
/// [`Processor::pipelines_for`] routes by), the snapshot, and what the run read and wrote.
pub(super) fn sink_commit_detail(p: &PipelineConfig, report: &RunReport) -> Value {
    json!({
        "table": p.sink,
        "snapshot_id": report.sink_snapshot,
        "pipeline": p.name,
        "source_table": p.source,
        "source_snapshot_id": report.to_snapshot,
        "rows_in": report.rows_in,
        "rows_out": report.rows_out,
        "refresh": report.refresh,
    })
}

impl Processor {
    /// Announces a run's sink commit on the bus (best effort, as ingest does: a lost event only
    /// delays the downstream pipelines until the next event or the poll). Nothing for a run
    /// that committed nothing, or without `events.bus`.
    pub(super) async fn announce(&self, p: &PipelineConfig, report: &RunReport) {
        if let (Some(n), Some(_)) = (&self.notifier, report.sink_snapshot) {
            n.commit(&sink_commit_detail(p, report)).await;
        }
    }

    /// The pipelines a trigger concerns: those reading the tables it names; all for a schedule
    /// or a manual call. Notifications only wake pipelines: the work comes from the checkpoints.
    ///
    /// An SQS batch (commit events and Glue table changes routed through a queue, so one
    /// invocation takes every event waiting) names the union of its messages' pipelines, each
    /// once: one run covers every commit since its checkpoint, however many events named it.
    pub fn pipelines_for(&self, payload: &Value) -> Vec<String> {
        match self.messages_for(payload) {
            Some(messages) => union(&messages),
            None => self.event_pipelines(payload),
        }
    }

    /// For an SQS batch payload, each message's id with the pipelines it wakes; `None` for any
    /// other payload.
    pub fn messages_for(&self, payload: &Value) -> Option<Vec<Woken>> {
        let messages = sqs_messages(payload)?;
        Some(
            messages
                .into_iter()
                .map(|m| Woken {
                    pipelines: self.event_pipelines(&m.body),
                    message_id: m.id,
                })
                .collect(),
        )
    }

    /// The pipelines one event (not a batch) wakes.
    fn event_pipelines(&self, event: &Value) -> Vec<String> {
        let pipelines = &self.config.pipelines;
        match trigger_tables(event, &self.config.catalog.namespace) {
            None => pipelines.iter().map(|p| p.name.clone()).collect(),
            Some(tables) => pipelines
                .iter()
                .filter(|p| tables.iter().any(|t| t == &p.source))
                .map(|p| p.name.clone())
                .collect(),
        }
    }
}

/// One message of an SQS batch and the pipelines it wakes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Woken {
    /// The SQS message id.
    pub message_id: String,
    /// The pipelines it wakes (none: a commit of a table no pipeline reads).
    pub pipelines: Vec<String>,
}

/// Every pipeline the messages wake, each once, in order of first mention.
pub(crate) fn union(messages: &[Woken]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in messages.iter().flat_map(|m| &m.pipelines) {
        if !out.contains(name) {
            out.push(name.clone());
        }
    }
    out
}

/// The messages to receive again: those that woke a pipeline whose run failed retryably
/// (`failed`). Messages coalesced into one run share its outcome, so every message naming a
/// failed pipeline is reported, and a message whose pipelines all settled is not.
pub fn failed_messages(messages: &[Woken], failed: &BTreeSet<String>) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m.pipelines.iter().any(|p| failed.contains(p)))
        .map(|m| m.message_id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn woken(id: &str, pipelines: &[&str]) -> Woken {
        Woken {
            message_id: id.into(),
            pipelines: pipelines.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn a_message_fails_when_any_pipeline_it_woke_failed_and_coalesced_ones_share_it() {
        // m1 and m2 are commits of `orders` (two pipelines read it, coalesced into one run
        // each); m3 a commit of `clicks`; m4 names no pipeline.
        let m = [
            woken("m1", &["a", "b"]),
            woken("m2", &["a", "b"]),
            woken("m3", &["c"]),
            woken("m4", &[]),
        ];
        assert_eq!(union(&m), ["a", "b", "c"]);
        let failed =
            |names: &[&str]| -> BTreeSet<String> { names.iter().map(|n| n.to_string()).collect() };
        assert!(failed_messages(&m, &failed(&[])).is_empty());
        assert_eq!(failed_messages(&m, &failed(&["b"])), ["m1", "m2"]);
        assert_eq!(failed_messages(&m, &failed(&["c"])), ["m3"]);
        assert_eq!(
            failed_messages(&m, &failed(&["a", "c"])),
            ["m1", "m2", "m3"]
        );
    }
}
