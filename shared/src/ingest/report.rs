//! What ingest says about one object: its status and counts (as the Lambda's report, EMF metrics
//! and the commit event), and the snapshot summary of its commit.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::json;

use super::rows::{micros_to_rfc3339, Written};
use super::TableCtx;
use crate::config::RouteConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::{self, Metric};
use crate::summary;

/// What happened to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Rows committed in a new snapshot.
    Committed,
    /// Already committed earlier (duplicate or concurrent delivery); nothing added.
    Duplicate,
    /// Every record was bad: all went to quarantine, nothing to commit.
    AllQuarantined,
    /// The object could not be read at all and was quarantined whole.
    Unreadable,
    /// No route covers the object: refused.
    Unrouted,
    /// The object no longer exists.
    Missing,
    /// The event named an ETag the object no longer has (overwritten since, on an unversioned
    /// bucket): that content is gone, the newer content comes with its own event. Nothing added.
    Superseded,
    /// A record failed a data-quality check whose action is `fail`: the object was refused
    /// whole (nothing committed) and quarantined whole with the reason.
    ContractFailed,
}

/// The records of one object that failed one data-quality check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QualityCount {
    /// The check's name.
    pub check: String,
    /// Its action: `quarantine`, `flag` or `fail`.
    pub action: String,
    /// Records that failed it (a record failing several checks counts in each).
    pub violations: u64,
}

/// The per-check counts of a contract's evaluation.
pub(super) fn quality_counts(counts: &[(String, crate::config::Action, u64)]) -> Vec<QualityCount> {
    counts
        .iter()
        .map(|(check, action, n)| QualityCount {
            check: check.clone(),
            action: action.as_str().to_string(),
            violations: *n,
        })
        .collect()
}

/// The report of one object's ingestion.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectReport {
    /// `s3://bucket/key`.
    pub object: String,
    /// Target table (empty when unrouted).
    pub table: String,
    /// Outcome.
    pub status: Status,
    /// Records seen.
    pub records_in: u64,
    /// Records in the table from this object.
    pub records_committed: u64,
    /// Records sent to quarantine.
    pub records_quarantined: u64,
    /// Input fields not in the table (ignored, or quarantined under the strict policy).
    pub unknown_fields: Vec<String>,
    /// The schema change this object brought (additive policy), e.g. `added coupon (string)`.
    pub schema_change: Option<String>,
    /// Data files added.
    pub data_files: usize,
    /// Bytes of data files added.
    pub data_bytes: u64,
    /// The snapshot holding the rows (new or earlier).
    pub snapshot_id: Option<i64>,
    /// Commit attempts.
    pub attempts: u32,
    /// Quarantine object written, if any.
    pub quarantine: Option<String>,
    /// Earliest and latest event time among committed rows (RFC 3339).
    pub event_time_range: Option<(String, String)>,
    /// Rows whose ingestion − event time exceeded the late threshold.
    pub late_records: u64,
    /// Largest ingestion − event time, seconds.
    pub max_lateness_seconds: f64,
    /// Commit time − latest event time, seconds (freshness lag).
    pub freshness_seconds: Option<f64>,
    /// Per data-quality check of the table's contract: the records that failed it.
    pub quality: Vec<QualityCount>,
    /// The version of the table's data-quality contract the object was checked against.
    pub contract_version: Option<String>,
    /// Why, for unreadable/unrouted objects and failed contracts.
    pub reason: Option<String>,
    /// Wall time spent, milliseconds.
    pub millis: u64,
}

impl ObjectReport {
    pub(super) fn new(object: String, table: &str, status: Status) -> Self {
        Self {
            object,
            table: table.into(),
            status,
            records_in: 0,
            records_committed: 0,
            records_quarantined: 0,
            unknown_fields: Vec::new(),
            schema_change: None,
            data_files: 0,
            data_bytes: 0,
            snapshot_id: None,
            attempts: 0,
            quarantine: None,
            event_time_range: None,
            late_records: 0,
            max_lateness_seconds: 0.0,
            freshness_seconds: None,
            quality: Vec::new(),
            contract_version: None,
            reason: None,
            millis: 0,
        }
    }

    /// The `detail` of the commit event ([`crate::notify`]): table, snapshot, counts and
    /// event-time range.
    pub(crate) fn commit_detail(&self) -> serde_json::Value {
        json!({
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "object": self.object,
            "records_committed": self.records_committed,
            "records_quarantined": self.records_quarantined,
            "event_time_min": self.event_time_range.as_ref().map(|t| &t.0),
            "event_time_max": self.event_time_range.as_ref().map(|t| &t.1),
            "late_records": self.late_records,
            "freshness_seconds": self.freshness_seconds,
        })
    }

    /// Emits this report as EMF metrics and a structured log line.
    pub fn emit(&self) {
        let status = format!("{:?}", self.status);
        let mut m = vec![
            Metric::count("RecordsIn", self.records_in as f64),
            Metric::count("RecordsCommitted", self.records_committed as f64),
            Metric::count("RecordsQuarantined", self.records_quarantined as f64),
            Metric::count("LateRecords", self.late_records as f64),
            Metric::seconds("MaxLatenessSeconds", self.max_lateness_seconds),
            Metric {
                name: "IngestMillis",
                value: self.millis as f64,
                unit: "Milliseconds",
            },
            Metric::count("CommitAttempts", self.attempts),
        ];
        if let Some(f) = self.freshness_seconds {
            m.push(Metric::seconds("FreshnessLagSeconds", f));
        }
        match self.status {
            Status::Unrouted => m = vec![Metric::count("UnroutedObjects", 1.0)],
            Status::Unreadable => m.push(Metric::count("UnreadableObjects", 1.0)),
            Status::Duplicate => m.push(Metric::count("DuplicateDeliveries", 1.0)),
            Status::ContractFailed => m.push(Metric::count("ContractFailures", 1.0)),
            _ => {}
        }
        let table = if self.table.is_empty() {
            "-"
        } else {
            self.table.as_str()
        };
        metrics::emit(&[("Table", table)], &m);
        // One line per check: violations by table, check and action.
        for q in &self.quality {
            metrics::emit(
                &[("Table", table), ("Check", &q.check), ("Action", &q.action)],
                &[Metric::count("QualityViolations", q.violations as f64)],
            );
        }
        tracing::info!(object = %self.object, table, status, records_in = self.records_in,
            committed = self.records_committed, quarantined = self.records_quarantined,
            snapshot = ?self.snapshot_id, millis = self.millis, "ingested object");
    }
}

/// The report of a written object before its commit; fails unless its counts reconcile
/// (records in = committed + quarantined).
pub(super) fn report_written(
    uri: &str,
    route: &RouteConfig,
    tctx: &TableCtx,
    written: &Written,
    evolved: Option<&(iceberg::spec::Schema, String)>,
) -> Result<ObjectReport> {
    let mut r = ObjectReport::new(uri.to_string(), &route.table, Status::Committed);
    r.records_in = written.records_in;
    r.records_committed = written.rows;
    r.records_quarantined = written.quarantined;
    r.quality = quality_counts(&written.quality);
    r.contract_version = Some(tctx.cfg.contract_version());
    r.unknown_fields = match evolved {
        // Everything the first pass saw is in the evolved schema unless it had no type.
        Some(_) => written
            .unknown
            .iter()
            .filter(|(_, t)| t.is_none())
            .map(|(k, _)| k.clone())
            .collect(),
        None => written.unknown.keys().cloned().collect(),
    };
    r.schema_change = evolved.map(|(_, what)| what.clone());
    let deprecated = crate::evolve::deprecated_in_use(
        written.deprecated_seen.iter().map(String::as_str),
        &tctx.cfg.deprecations(),
    );
    for (field, date) in &deprecated {
        tracing::warn!(object = %uri, field, removal = %date, "input still produces a deprecated field");
    }
    r.data_files = written.files.len();
    r.data_bytes = written.files.iter().map(|f| f.file_size_in_bytes()).sum();
    r.late_records = written.late;
    r.max_lateness_seconds = written.max_lateness_us as f64 / 1e6;
    if let (Some(lo), Some(hi)) = (written.et_min, written.et_max) {
        r.event_time_range = Some((micros_to_rfc3339(lo), micros_to_rfc3339(hi)));
    }
    if r.records_in != r.records_committed + r.records_quarantined {
        return Err(Error::new(
            ErrorKind::Internal,
            format!(
                "{uri}: counts do not reconcile: in {} != committed {} + quarantined {}",
                r.records_in, r.records_committed, r.records_quarantined
            ),
        ));
    }
    if !r.unknown_fields.is_empty() {
        tracing::warn!(object = %uri, fields = ?r.unknown_fields, "input has fields the table lacks; ignored");
    }
    Ok(r)
}

/// The snapshot summary of an object's commit: its counts, lateness, event-time range, ignored
/// fields, quarantine and schema change.
pub(super) fn commit_summary(
    r: &ObjectReport,
    evolved: Option<&(iceberg::spec::Schema, String)>,
    uri: &str,
) -> HashMap<String, String> {
    let mut props = HashMap::from([
        (summary::RECORDS_IN.to_string(), r.records_in.to_string()),
        (
            summary::RECORDS_COMMITTED.to_string(),
            r.records_committed.to_string(),
        ),
        (
            summary::RECORDS_QUARANTINED.to_string(),
            r.records_quarantined.to_string(),
        ),
        (
            summary::LATE_RECORDS.to_string(),
            r.late_records.to_string(),
        ),
        (
            summary::MAX_LATENESS_SECONDS.to_string(),
            format!("{:.3}", r.max_lateness_seconds),
        ),
    ]);
    if let Some(v) = &r.contract_version {
        props.insert(summary::CONTRACT_VERSION.into(), v.clone());
    }
    for q in &r.quality {
        props.insert(
            summary::quality_key(&q.check, &q.action),
            q.violations.to_string(),
        );
    }
    if let Some((lo, hi)) = &r.event_time_range {
        props.insert(summary::EVENT_TIME_MIN.into(), lo.clone());
        props.insert(summary::EVENT_TIME_MAX.into(), hi.clone());
    }
    if !r.unknown_fields.is_empty() {
        props.insert(summary::UNKNOWN_FIELDS.into(), r.unknown_fields.join(","));
    }
    if let Some(q) = &r.quarantine {
        props.insert(summary::QUARANTINE.into(), q.clone());
    }
    if let Some((schema, what)) = evolved {
        props.insert(
            summary::SCHEMA_CHANGE.into(),
            format!("{what} (schema {}, by ingest of {uri})", schema.schema_id()),
        );
    }
    props
}
