//! Glue between the Lambda runtime and the library: deadlines, responses, logging set-up.

use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse};
use serde_json::{json, Value};

use crate::ingest::PayloadResult;

/// Safety margin kept between our own deadline and the Lambda's hard timeout.
pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// Converts the Lambda context deadline (epoch milliseconds) to an `Instant`, minus the margin.
pub fn deadline_from_epoch_ms(deadline_ms: u64) -> Instant {
    let now_ms = chrono::Utc::now().timestamp_millis().max(0) as u64;
    let left = Duration::from_millis(deadline_ms.saturating_sub(now_ms));
    Instant::now() + left.saturating_sub(DEADLINE_MARGIN)
}

/// The ingest function's answer: SQS batches get `batchItemFailures` so that only the failed
/// messages are retried; other payloads fail as a whole when anything failed (so Lambda retries).
pub fn ingest_response(result: &PayloadResult) -> Result<Value, String> {
    if result.is_sqs {
        return batch_response(&result.failed_message_ids);
    }
    if !result.errors.is_empty() {
        // A Step Functions batch fails whole: its Retry runs it again (committed objects come
        // back as duplicates), and after the last attempt the batch counts against the map's
        // ToleratedFailurePercentage with this message in its result.
        return Err(result.errors.join("; "));
    }
    if result.reports.len() > 10 {
        // Step Functions states carry at most 256 KiB: a batch answers with its totals.
        return Ok(batch_totals(result));
    }
    Ok(json!({ "reports": result.reports }))
}

/// A large batch's answer: objects by status, records, and the snapshots committed.
fn batch_totals(result: &PayloadResult) -> Value {
    let mut by_status = std::collections::BTreeMap::<String, u64>::new();
    let mut snapshots = std::collections::BTreeSet::new();
    let (mut records_in, mut committed, mut quarantined) = (0, 0, 0);
    for r in &result.reports {
        *by_status.entry(format!("{:?}", r.status)).or_default() += 1;
        records_in += r.records_in;
        committed += r.records_committed;
        quarantined += r.records_quarantined;
        if let Some(s) = r.snapshot_id {
            snapshots.insert(format!("{}@{s}", r.table));
        }
    }
    json!({
        "objects": result.reports.len(),
        "by_status": by_status,
        "records_in": records_in,
        "records_committed": committed,
        "records_quarantined": quarantined,
        "snapshots": snapshots,
    })
}

/// The process function's answer. An SQS batch gets `batchItemFailures` naming the messages
/// that woke a pipeline whose run failed retryably, so only those come back (the others'
/// work is done, or cannot be done by trying again); other payloads (the poll) fail as a
/// whole when a pipeline failed, so Lambda retries the invocation and counts the error.
pub fn process_response(result: &crate::process::ProcessResult) -> Result<Value, String> {
    if result.is_sqs {
        return batch_response(&result.failed_message_ids);
    }
    if !result.errors.is_empty() {
        return Err(result
            .errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; "));
    }
    Ok(json!({ "runs": result.reports }))
}

/// An SQS event source's partial batch response: the messages to receive again.
fn batch_response(failed: &[String]) -> Result<Value, String> {
    let mut resp = SqsBatchResponse::default();
    resp.batch_item_failures = failed
        .iter()
        .map(|id| {
            let mut f = BatchItemFailure::default();
            f.item_identifier = id.clone();
            f
        })
        .collect();
    serde_json::to_value(resp).map_err(|e| e.to_string())
}

/// Allocations from this size up are mapped and unmapped on their own (glibc's `mmap_threshold`).
const MMAP_THRESHOLD: i32 = 256 << 10;

/// Bounds the memory glibc's allocator keeps after it is freed. By default glibc raises its mmap
/// threshold each time a large block is freed (up to 32 MiB), so Parquet's row-group buffers
/// (megabytes each, one per flush) end up on the heap and their pages stay with the process: a
/// 1 GiB object peaked at ~110 MiB RSS for ~40 MiB of live heap. A fixed threshold of 256 KiB
/// returns them on free (`floe bench --huge-mb 1024`: README "Benchmark"). Call once, first
/// thing in `main`; a no-op off glibc.
pub fn limit_allocator_retention() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it takes no pointers.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Initialises `tracing`: JSON lines for CloudWatch in Lambda, human-readable text elsewhere.
/// `RUST_LOG` filters (default `info`).
pub fn init_tracing() {
    init_tracing_with("info");
}

/// Like [`init_tracing`] with another default level (the CLI's demo uses `warn`).
pub fn init_tracing_with(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let in_lambda = std::env::var("AWS_LAMBDA_FUNCTION_NAME").is_ok();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if in_lambda {
        builder
            .json()
            .with_current_span(false)
            .without_time()
            .try_init()
    } else {
        builder.compact().try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqs_partial_failures() {
        let r = PayloadResult {
            is_sqs: true,
            failed_message_ids: vec!["m2".into()],
            ..Default::default()
        };
        let v = ingest_response(&r).unwrap();
        assert_eq!(v["batchItemFailures"][0]["itemIdentifier"], "m2");
        let r = PayloadResult {
            errors: vec!["boom".into()],
            ..Default::default()
        };
        assert!(ingest_response(&r).unwrap_err().contains("boom"));
    }

    #[test]
    fn process_batches_answer_with_their_failed_messages_not_an_error() {
        use crate::error::{Error, ErrorKind};
        use crate::process::ProcessResult;
        let failed = || Error::new(ErrorKind::Catalog, "throttled").with_retryable(true);
        let r = ProcessResult {
            is_sqs: true,
            errors: vec![failed()],
            failed_message_ids: vec!["m1".into(), "m3".into()],
            ..Default::default()
        };
        let v = process_response(&r).unwrap();
        let ids: Vec<&str> = v["batchItemFailures"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["itemIdentifier"].as_str())
            .collect();
        assert_eq!(ids, ["m1", "m3"]);
        // A batch whose runs all settled: an empty list (nothing comes back).
        let ok = ProcessResult {
            is_sqs: true,
            ..Default::default()
        };
        assert_eq!(
            process_response(&ok).unwrap()["batchItemFailures"],
            json!([])
        );
        // The poll: a failed pipeline fails the invocation.
        let poll = ProcessResult {
            errors: vec![failed()],
            ..Default::default()
        };
        assert!(process_response(&poll).unwrap_err().contains("throttled"));
    }
}
