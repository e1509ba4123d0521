//! Which pipelines a trigger concerns: floe commit events, Glue table changes and S3 metadata
//! notifications name their tables; schedules and manual calls wake every pipeline. And the
//! other side: a sink commit is announced with the same `floe.commit` event ingest sends, so a
//! pipeline whose source is that sink (a chain) is woken like one over an ingest table.

use serde_json::{json, Value};

use super::{Processor, RunReport};
use crate::config::PipelineConfig;
use crate::event::{classify_trigger, metadata_key_table, Trigger};

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
    /// An SQS batch (commit events routed through a queue, so one invocation takes every
    /// event waiting) names the union of its messages' pipelines, each once: one run covers
    /// every commit since its checkpoint, however many events named it.
    pub fn pipelines_for(&self, payload: &Value) -> Vec<String> {
        if let Some(records) = sqs_records(payload) {
            let mut out: Vec<String> = Vec::new();
            for body in records {
                let body = body
                    .as_str()
                    .and_then(|b| serde_json::from_str::<Value>(b).ok())
                    .unwrap_or(Value::Null);
                for name in self.pipelines_for(&body) {
                    if !out.contains(&name) {
                        out.push(name);
                    }
                }
            }
            return out;
        }
        let all = || {
            self.config
                .pipelines
                .iter()
                .map(|p| p.name.clone())
                .collect()
        };
        let tables: Vec<String> = match classify_trigger(payload) {
            Trigger::FloeCommit => payload["detail"]["table"]
                .as_str()
                .map(|t| vec![t.to_string()])
                .unwrap_or_default(),
            Trigger::GlueTableChange => {
                let db = payload["detail"]["databaseName"].as_str().unwrap_or("");
                if db != self.config.catalog.namespace {
                    return Vec::new();
                }
                // Table State Change names one table; Database State Change lists several.
                let mut names: Vec<String> = payload["detail"]["changedTables"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|t| t.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                names.extend(payload["detail"]["tableName"].as_str().map(String::from));
                names
            }
            Trigger::S3 => {
                let mut keys: Vec<String> = Vec::new();
                if let Some(records) = payload["Records"].as_array() {
                    for r in records {
                        if let Some(k) = r["s3"]["object"]["key"].as_str() {
                            keys.push(k.to_string());
                        }
                    }
                }
                if let Some(k) = payload["detail"]["object"]["key"].as_str() {
                    keys.push(k.to_string());
                }
                keys.iter().filter_map(|k| metadata_key_table(k)).collect()
            }
            Trigger::Schedule | Trigger::Other => return all(),
        };
        self.config
            .pipelines
            .iter()
            .filter(|p| tables.iter().any(|t| t == &p.source))
            .map(|p| p.name.clone())
            .collect()
    }
}

/// The bodies of an SQS batch payload (`Records` whose `eventSource` is `aws:sqs`), or `None`.
fn sqs_records(payload: &Value) -> Option<Vec<&Value>> {
    let records = payload.get("Records")?.as_array()?;
    let sqs = !records.is_empty()
        && records
            .iter()
            .all(|r| r.get("eventSource").and_then(Value::as_str) == Some("aws:sqs"));
    sqs.then(|| records.iter().map(|r| &r["body"]).collect())
}
