//! Commit notifications: after each ingest commit and each pipeline's sink commit, a
//! `floe.commit` event on EventBridge wakes the process function (the pipelines reading that
//! table). Best effort by design: a lost notification only delays processing until
//! the next one or the scheduled poll, because the work is derived from checkpoints, not events.

use serde_json::Value;

use crate::config::Config;

use crate::event::{COMMIT_DETAIL_TYPE, EVENT_SOURCE};

/// Publishes commit events to the configured bus.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    client: aws_sdk_eventbridge::Client,
    bus: String,
}

impl Notifier {
    /// A notifier when `events.bus` is configured.
    pub(crate) async fn from_config(cfg: &Config) -> Option<Self> {
        let bus = cfg.events.bus.clone()?;
        let sdk = crate::store::sdk_config(&cfg.storage, cfg.events.endpoint.as_deref()).await;
        Some(Self {
            client: aws_sdk_eventbridge::Client::new(&sdk),
            bus,
        })
    }

    /// Publishes a commit event with `detail` (logs and moves on when EventBridge fails).
    pub(crate) async fn commit(&self, detail: &Value) {
        let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
            .event_bus_name(&self.bus)
            .source(EVENT_SOURCE)
            .detail_type(COMMIT_DETAIL_TYPE)
            .detail(detail.to_string())
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
