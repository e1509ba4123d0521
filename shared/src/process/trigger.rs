//! Which pipelines a trigger concerns: floe commit events, Glue table changes and S3 metadata
//! notifications name their tables; schedules and manual calls wake every pipeline.

use serde_json::Value;

use super::Processor;
use crate::event::{classify_trigger, metadata_key_table, Trigger};

impl Processor {
    /// The pipelines a trigger concerns: those reading the tables it names; all for a schedule
    /// or a manual call. Notifications only wake pipelines: the work comes from the checkpoints.
    pub fn pipelines_for(&self, payload: &Value) -> Vec<String> {
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
