//! Commit notifications: after each ingest commit, a `floe.commit` event on EventBridge wakes
//! the process function. Best effort by design: a lost notification only delays processing until
//! the next one or the scheduled poll, because the work is derived from checkpoints, not events.

use serde_json::{json, Value};

use crate::config::Config;
use crate::ingest::ObjectReport;

/// EventBridge `source` of floe's events.
pub const EVENT_SOURCE: &str = "floe";
/// EventBridge `detail-type` of a commit event.
pub const COMMIT_DETAIL_TYPE: &str = "floe.commit";

/// Publishes commit events to the configured bus.
#[derive(Debug, Clone)]
pub struct Notifier {
    client: aws_sdk_eventbridge::Client,
    bus: String,
}

impl Notifier {
    /// A notifier when `events.bus` is configured.
    pub async fn from_config(cfg: &Config) -> Option<Self> {
        let bus = cfg.events.bus.clone()?;
        let sdk = crate::store::sdk_config(&cfg.storage, cfg.events.endpoint.as_deref()).await;
        Some(Self {
            client: aws_sdk_eventbridge::Client::new(&sdk),
            bus,
        })
    }

    /// Publishes the commit `report` describes (logs and moves on when EventBridge fails).
    pub async fn commit(&self, report: &ObjectReport) {
        let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
            .event_bus_name(&self.bus)
            .source(EVENT_SOURCE)
            .detail_type(COMMIT_DETAIL_TYPE)
            .detail(commit_detail(report).to_string())
            .build();
        match self.client.put_events().entries(entry).send().await {
            Ok(out) if out.failed_entry_count() == 0 => {}
            Ok(out) => {
                tracing::warn!(bus = %self.bus, failed = out.failed_entry_count(), "commit event refused; the scheduled poll will pick the commit up")
            }
            Err(e) => {
                tracing::warn!(bus = %self.bus, error = %aws_sdk_eventbridge::error::DisplayErrorContext(e), "could not publish the commit event; the scheduled poll will pick the commit up")
            }
        }
    }
}

/// The `detail` of a commit event: table, snapshot, counts and event-time range.
pub fn commit_detail(r: &ObjectReport) -> Value {
    json!({
        "table": r.table,
        "snapshot_id": r.snapshot_id,
        "object": r.object,
        "records_committed": r.records_committed,
        "records_quarantined": r.records_quarantined,
        "event_time_min": r.event_time_range.as_ref().map(|t| &t.0),
        "event_time_max": r.event_time_range.as_ref().map(|t| &t.1),
        "late_records": r.late_records,
        "freshness_seconds": r.freshness_seconds,
    })
}
