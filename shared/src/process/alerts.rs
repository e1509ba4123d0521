//! Alerts: a pipeline's output rows sent to EventBridge or SQS before the sink commit (at least
//! once; every message carries a deterministic id so consumers can drop repeats).

use std::collections::HashMap;

use arrow::array::RecordBatch;
use iceberg::spec::DataFile;
use iceberg::table::Table;
use serde_json::Value;

use super::{input, Processor};
use crate::config::PipelineConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::scan::LiveFile;

/// Sends alert messages (at least once; each carries a deterministic id for dedup).
#[derive(Debug, Clone, Default)]
pub(super) struct Alerts {
    pub(super) eventbridge: Option<aws_sdk_eventbridge::Client>,
    pub(super) sqs: Option<aws_sdk_sqs::Client>,
}

impl Processor {
    /// Sends the alert messages of the rows in `files` (the run's output); the count sent.
    pub(super) async fn send_alerts(
        &self,
        p: &PipelineConfig,
        alert: &crate::config::AlertConfig,
        sink: &Table,
        files: &[DataFile],
    ) -> Result<usize> {
        let live: Vec<LiveFile> = files
            .iter()
            .map(|f| LiveFile {
                file: f.clone(),
                spec_id: sink.metadata().default_partition_spec_id(),
                deletes: Vec::new(),
            })
            .collect();
        let (_, batches) = input::read_rows(sink, &live).await?;
        let messages = alert_messages(&p.name, &batches)?;
        let n = messages.len();
        if let Some(bus) = &alert.eventbridge_bus {
            let client = self
                .alerts
                .eventbridge
                .as_ref()
                .ok_or_else(|| no_client(p))?;
            for chunk in messages.chunks(10) {
                let entries: Vec<_> = chunk
                    .iter()
                    .map(|(_, body)| {
                        aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                            .event_bus_name(bus)
                            .source(crate::event::EVENT_SOURCE)
                            .detail_type(crate::event::ALERT_DETAIL_TYPE)
                            .detail(body.to_string())
                            .build()
                    })
                    .collect();
                let out = client
                    .put_events()
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(|e| {
                        alert_error(p, aws_sdk_eventbridge::error::DisplayErrorContext(e))
                    })?;
                if out.failed_entry_count() > 0 {
                    return Err(alert_error(
                        p,
                        format!("{} alerts refused", out.failed_entry_count()),
                    ));
                }
            }
        }
        if let Some(url) = &alert.sqs_queue_url {
            let client = self.alerts.sqs.as_ref().ok_or_else(|| no_client(p))?;
            let fifo = url.ends_with(".fifo");
            for chunk in messages.chunks(10) {
                let entries: Vec<_> = chunk
                    .iter()
                    .enumerate()
                    .map(|(i, (id, body))| {
                        let mut b = aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                            .id(format!("m{i}"))
                            .message_body(body.to_string())
                            .message_attributes(
                                "floe-alert-id",
                                aws_sdk_sqs::types::MessageAttributeValue::builder()
                                    .data_type("String")
                                    .string_value(id)
                                    .build()
                                    .map_err(|e| alert_error(p, e))?,
                            );
                        if fifo {
                            b = b.message_deduplication_id(id).message_group_id(&p.name);
                        }
                        b.build().map_err(|e| alert_error(p, e))
                    })
                    .collect::<Result<_>>()?;
                let out = client
                    .send_message_batch()
                    .queue_url(url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(|e| alert_error(p, aws_sdk_sqs::error::DisplayErrorContext(e)))?;
                if !out.failed().is_empty() {
                    return Err(alert_error(
                        p,
                        format!("{} alerts refused", out.failed().len()),
                    ));
                }
            }
        }
        Ok(n)
    }
}

fn no_client(p: &PipelineConfig) -> Error {
    Error::new(
        ErrorKind::Config,
        format!(
            "pipeline `{}` has alerts but the processor was built without alert clients",
            p.name
        ),
    )
}

fn alert_error(p: &PipelineConfig, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Storage,
        format!(
            "pipeline `{}`: sending alerts: {e} (nothing committed; the run is retried)",
            p.name
        ),
    )
    .with_retryable(true)
}

/// Alert messages for output rows: `(id, body)`. The id is a hash of the pipeline and the row
/// (plus its occurrence number among identical rows), so a re-sent alert has the same id.
pub(crate) fn alert_messages(
    pipeline: &str,
    batches: &[RecordBatch],
) -> Result<Vec<(String, Value)>> {
    use sha2::{Digest, Sha256};
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for b in batches {
        let mut buf = Vec::new();
        {
            let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
            w.write(b)
                .and_then(|_| w.finish())
                .map_err(|e| Error::new(ErrorKind::Internal, format!("alert rows as JSON: {e}")))?;
        }
        for line in buf.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            let row: Value = serde_json::from_slice(line)
                .map_err(|e| Error::new(ErrorKind::Internal, format!("alert row: {e}")))?;
            let text = String::from_utf8_lossy(line).to_string();
            let n = seen.entry(text.clone()).or_default();
            *n += 1;
            let mut h = Sha256::new();
            h.update(pipeline.as_bytes());
            h.update([0]);
            h.update(text.as_bytes());
            h.update(n.to_le_bytes());
            let id = hex::encode(&h.finalize()[..16]);
            out.push((
                id.clone(),
                serde_json::json!({ "id": id, "pipeline": pipeline, "row": row }),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn alert_ids_are_deterministic_and_distinct() {
        use arrow::array::StringArray;
        let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "order_id",
            arrow_schema::DataType::Utf8,
            true,
        )]));
        let b = RecordBatch::try_new(
            schema,
            vec![Arc::new(StringArray::from(vec!["a", "b", "a"]))],
        )
        .unwrap();
        let one = alert_messages("p", std::slice::from_ref(&b)).unwrap();
        let two = alert_messages("p", &[b]).unwrap();
        assert_eq!(one.len(), 3);
        assert_eq!(
            one.iter().map(|m| &m.0).collect::<Vec<_>>(),
            two.iter().map(|m| &m.0).collect::<Vec<_>>()
        );
        let ids: BTreeSet<&String> = one.iter().map(|m| &m.0).collect();
        assert_eq!(
            ids.len(),
            3,
            "identical rows get distinct ids by occurrence"
        );
        assert_eq!(one[0].1["row"]["order_id"], "a");
    }
}
