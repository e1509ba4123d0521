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
    /// Deprecated columns this object still carries values for.
    pub deprecated_produced: Vec<String>,
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
    /// This object's share of the invocation's compute (ms): its own preparation, plus its
    /// share of its commit (a batch commit's time split evenly over its members). The shares
    /// of a payload's objects do not overlap (`millis` do: a batch member's runs until the
    /// batch settles): the per-table usage metrics add these up.
    #[serde(skip)]
    pub(crate) compute_ms: u64,
}

/// Unknown field names a snapshot summary lists: every later metadata.json carries the summary
/// until the snapshot expires, so it holds the first names and a count of the rest (the
/// object's report and its log line name them all).
const UNKNOWN_FIELDS_LISTED: usize = 100;

/// `names` joined by commas, at most `most` of them, then `…+N more`.
fn listed(names: &[String], most: usize) -> String {
    let mut text = names
        .iter()
        .take(most)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(",");
    if names.len() > most {
        text.push_str(&format!(",…+{} more", names.len() - most));
    }
    text
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
            deprecated_produced: Vec::new(),
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
            compute_ms: 0,
        }
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
        // Everything the first pass saw is in the evolved schema unless it had no type or a
        // reserved name (`_id`: its values are dropped, said here and in the summary).
        Some(_) => written
            .unknown
            .iter()
            .filter(|(k, t)| t.is_none() || k.starts_with('_'))
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
    r.deprecated_produced = deprecated.into_iter().map(|(f, _)| f).collect();
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
    ]);
    // The late-record count only when some were (none is the common case, and every retained
    // snapshot's summary is read and written again by each commit of a hot table); the largest
    // lateness is measured over every record, late or not, so it stays.
    if r.late_records > 0 {
        props.insert(
            summary::LATE_RECORDS.to_string(),
            r.late_records.to_string(),
        );
    }
    props.insert(
        summary::MAX_LATENESS_SECONDS.to_string(),
        format!("{:.3}", r.max_lateness_seconds),
    );
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
        props.insert(
            summary::UNKNOWN_FIELDS.into(),
            listed(&r.unknown_fields, UNKNOWN_FIELDS_LISTED),
        );
    }
    if let Some(q) = &r.quarantine {
        props.insert(summary::QUARANTINE.into(), q.clone());
    }
    if !r.deprecated_produced.is_empty() {
        props.insert(
            summary::DEPRECATED_PRODUCED.into(),
            r.deprecated_produced.join(","),
        );
    }
    if let Some((schema, what)) = evolved {
        props.insert(
            summary::SCHEMA_CHANGE.into(),
            format!("{what} (schema {}, by ingest of {uri})", schema.schema_id()),
        );
    }
    props
}

/// A report that added nothing (a duplicate): no rows, files or quarantine of its own, so that
/// in = committed + quarantined holds and nothing is counted twice.
pub(super) fn nothing_added(mut r: ObjectReport) -> ObjectReport {
    r.records_in = 0;
    r.records_committed = 0;
    r.records_quarantined = 0;
    r.late_records = 0;
    r.data_files = 0;
    r.data_bytes = 0;
    r.quarantine = None;
    r.attempts = 0;
    r.freshness_seconds = None;
    r
}

/// The members of one commit as one report: counts summed, the largest lateness, the widest
/// event-time range, every ignored field and every quarantine object.
fn combined(reports: &[&ObjectReport]) -> ObjectReport {
    let mut all = ObjectReport::new(String::new(), "", Status::Committed);
    let mut unknown = std::collections::BTreeSet::new();
    let mut deprecated = std::collections::BTreeSet::new();
    let mut quarantine = Vec::new();
    for r in reports {
        all.records_in += r.records_in;
        all.records_committed += r.records_committed;
        all.records_quarantined += r.records_quarantined;
        all.late_records += r.late_records;
        all.max_lateness_seconds = all.max_lateness_seconds.max(r.max_lateness_seconds);
        // RFC 3339 in UTC with a fixed format: the text order is the time order.
        if let Some((lo, hi)) = &r.event_time_range {
            all.event_time_range = Some(match all.event_time_range.take() {
                None => (lo.clone(), hi.clone()),
                Some((a, b)) => (a.min(lo.clone()), b.max(hi.clone())),
            });
        }
        unknown.extend(r.unknown_fields.iter().cloned());
        quarantine.extend(r.quarantine.iter().cloned());
        deprecated.extend(r.deprecated_produced.iter().cloned());
        // Members of one table share its contract: its version, and every check's counts summed.
        if all.contract_version.is_none() {
            all.contract_version = r.contract_version.clone();
        }
        for q in &r.quality {
            match all
                .quality
                .iter_mut()
                .find(|a| a.check == q.check && a.action == q.action)
            {
                Some(a) => a.violations += q.violations,
                None => all.quality.push(q.clone()),
            }
        }
    }
    all.unknown_fields = unknown.into_iter().collect();
    all.deprecated_produced = deprecated.into_iter().collect();
    if !quarantine.is_empty() {
        all.quarantine = Some(quarantine.join(","));
    }
    all
}

/// The snapshot summary of a batch commit: its members [`combined`].
pub(super) fn batch_summary(reports: &[&ObjectReport]) -> HashMap<String, String> {
    commit_summary(&combined(reports), None, "")
}

/// The `detail` of the commit event ([`crate::notify`]) of one snapshot, from the reports of the
/// objects it holds (one, or the members of a batch commit): table, snapshot, the objects, the
/// summed counts and the widest event-time range.
pub(super) fn commit_detail(reports: &[&ObjectReport]) -> serde_json::Value {
    let all = combined(reports);
    let objects: Vec<&str> = reports.iter().map(|r| r.object.as_str()).collect();
    let freshness = reports
        .iter()
        .filter_map(|r| r.freshness_seconds)
        .reduce(f64::min);
    json!({
        "table": reports.first().map(|r| r.table.as_str()),
        "snapshot_id": reports.first().and_then(|r| r.snapshot_id),
        "object": objects.first(),
        "objects": objects,
        "records_in": all.records_in,
        "records_committed": all.records_committed,
        "records_quarantined": all.records_quarantined,
        "event_time_min": all.event_time_range.as_ref().map(|t| &t.0),
        "event_time_max": all.event_time_range.as_ref().map(|t| &t.1),
        "late_records": all.late_records,
        "freshness_seconds": freshness,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_leaves_out_the_late_count_when_nothing_was_late_and_keeps_the_max_lateness() {
        // The largest lateness is over every record (review helper-40: it was left out with
        // the count, though records 30 minutes behind with an hour allowed are none late).
        let r = report(
            3,
            0,
            ("2026-11-30T09:00:00Z", "2026-11-30T09:01:00Z"),
            1800.0,
            None,
        );
        let s = commit_summary(&r, None, "s3://b/k");
        assert!(!s.contains_key(summary::LATE_RECORDS), "{s:?}");
        assert_eq!(s[summary::MAX_LATENESS_SECONDS], "1800.000");
        assert_eq!(
            batch_summary(&[&r])[summary::MAX_LATENESS_SECONDS],
            "1800.000"
        );
        assert_eq!(s[summary::RECORDS_QUARANTINED], "0");
    }

    #[test]
    fn a_summary_lists_the_first_unknown_fields_and_counts_the_rest() {
        let names: Vec<String> = (0..3).map(|i| format!("f{i}")).collect();
        assert_eq!(listed(&names, 5), "f0,f1,f2");
        assert_eq!(listed(&names, 2), "f0,f1,…+1 more");
        let mut r = ObjectReport::new("s3://b/k".into(), "t", Status::Committed);
        r.unknown_fields = (0..250).map(|i| format!("f{i}")).collect();
        let props = commit_summary(&r, None, "s3://b/k");
        let text = &props[summary::UNKNOWN_FIELDS];
        assert!(text.ends_with(",…+150 more"), "{text}");
        assert_eq!(text.split(',').count(), 101);
    }

    fn report(
        n: u64,
        q: u64,
        range: (&str, &str),
        late: f64,
        quarantine: Option<&str>,
    ) -> ObjectReport {
        let mut r = ObjectReport::new("s3://b/k".into(), "t", Status::Committed);
        r.records_in = n + q;
        r.records_committed = n;
        r.records_quarantined = q;
        r.late_records = q;
        r.max_lateness_seconds = late;
        r.event_time_range = Some((range.0.into(), range.1.into()));
        r.quarantine = quarantine.map(String::from);
        r.unknown_fields = vec![format!("f{n}")];
        r
    }

    #[test]
    fn a_batch_summary_adds_up_its_members() {
        let a = report(
            10,
            2,
            ("2026-11-30T10:00:00.000000Z", "2026-11-30T10:05:00.000000Z"),
            3.5,
            Some("s3://q/a"),
        );
        let b = report(
            5,
            0,
            ("2026-11-30T09:00:00.000000Z", "2026-11-30T10:01:00.000000Z"),
            9.25,
            None,
        );
        let s = batch_summary(&[&a, &b]);
        assert_eq!(s[summary::RECORDS_IN], "17");
        assert_eq!(s[summary::RECORDS_COMMITTED], "15");
        assert_eq!(s[summary::RECORDS_QUARANTINED], "2");
        assert_eq!(s[summary::LATE_RECORDS], "2");
        assert_eq!(s[summary::MAX_LATENESS_SECONDS], "9.250");
        assert_eq!(s[summary::EVENT_TIME_MIN], "2026-11-30T09:00:00.000000Z");
        assert_eq!(s[summary::EVENT_TIME_MAX], "2026-11-30T10:05:00.000000Z");
        assert_eq!(s[summary::UNKNOWN_FIELDS], "f10,f5");
        assert_eq!(s[summary::QUARANTINE], "s3://q/a");
    }

    #[test]
    fn a_batch_summary_sums_quality_counts_and_keeps_the_contract_version() {
        let q = |check: &str, action: &str, violations| QualityCount {
            check: check.into(),
            action: action.into(),
            violations,
        };
        let range = ("2026-11-30T10:00:00.000000Z", "2026-11-30T10:05:00.000000Z");
        let mut a = report(10, 2, range, 0.0, None);
        a.contract_version = Some("c0ffee".into());
        a.quality = vec![q("amount_range", "quarantine", 2), q("euro", "flag", 1)];
        a.deprecated_produced = vec!["legacy".into()];
        let mut b = report(5, 1, range, 0.0, None);
        b.contract_version = Some("c0ffee".into());
        b.quality = vec![q("amount_range", "quarantine", 1), q("euro", "flag", 0)];
        let s = batch_summary(&[&a, &b]);
        assert_eq!(s[summary::CONTRACT_VERSION], "c0ffee");
        assert_eq!(s[&summary::quality_key("amount_range", "quarantine")], "3");
        assert_eq!(s[&summary::quality_key("euro", "flag")], "1");
        assert_eq!(s[summary::DEPRECATED_PRODUCED], "legacy");
    }
}
