//! The arithmetic of the baseline: percentiles, hourly throughput and the incidents of a lag
//! above its objective. Pure functions over numbers taken from the history.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// A distribution in seconds (nearest-rank percentiles).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

/// The percentiles of `samples` (None when there is none).
pub fn percentiles(mut samples: Vec<f64>) -> Option<Percentiles> {
    samples.retain(|v| v.is_finite());
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    // Nearest rank: the smallest sample with at least p % of the samples at or below it.
    let rank = |p: f64| samples[((p / 100.0 * n as f64).ceil() as usize).clamp(1, n) - 1];
    Some(Percentiles {
        count: n,
        p50: rank(50.0),
        p95: rank(95.0),
        p99: rank(99.0),
        max: samples[n - 1],
    })
}

/// Rows and bytes committed over time.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Throughput {
    /// Commits that added rows.
    pub commits: usize,
    /// Rows they added.
    pub rows: u64,
    /// Bytes of data files they added.
    pub bytes: u64,
    /// From the first to the last of them (s).
    pub span_seconds: f64,
    /// rows / span (None with fewer than two commits).
    pub rows_per_second: Option<f64>,
    /// bytes / span.
    pub bytes_per_second: Option<f64>,
    /// Per hour of commit time (UTC).
    pub hourly: Vec<Hour>,
}

/// One hour's commits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hour {
    /// The hour's start, RFC 3339.
    pub hour: String,
    /// Commits in it.
    pub commits: usize,
    /// Rows they added.
    pub rows: u64,
    /// Bytes they added.
    pub bytes: u64,
    /// rows / 3600.
    pub rows_per_second: f64,
    /// bytes / 3600.
    pub bytes_per_second: f64,
}

/// Throughput of commits given as (commit time ms, rows, bytes).
pub fn throughput(commits: &[(i64, u64, u64)]) -> Throughput {
    let mut t = Throughput {
        commits: commits.len(),
        rows: commits.iter().map(|c| c.1).sum(),
        bytes: commits.iter().map(|c| c.2).sum(),
        ..Default::default()
    };
    let first = commits.iter().map(|c| c.0).min();
    let last = commits.iter().map(|c| c.0).max();
    if let (Some(a), Some(b)) = (first, last) {
        t.span_seconds = (b - a) as f64 / 1000.0;
        if b > a {
            t.rows_per_second = Some(t.rows as f64 / t.span_seconds);
            t.bytes_per_second = Some(t.bytes as f64 / t.span_seconds);
        }
    }
    let mut hours: BTreeMap<i64, (usize, u64, u64)> = BTreeMap::new();
    for (ts, rows, bytes) in commits {
        let h = hours.entry(ts.div_euclid(3_600_000)).or_default();
        h.0 += 1;
        h.1 += rows;
        h.2 += bytes;
    }
    t.hourly = hours
        .into_iter()
        .map(|(h, (commits, rows, bytes))| Hour {
            hour: rfc3339(h * 3_600_000),
            commits,
            rows,
            bytes,
            rows_per_second: rows as f64 / 3600.0,
            bytes_per_second: bytes as f64 / 3600.0,
        })
        .collect();
    t
}

/// Epoch ms as RFC 3339 (UTC, seconds).
pub(crate) fn rfc3339(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// One piece of work with a deadline: it arrived (an object landed, a source snapshot was
/// committed) and was done (committed, processed) or is still pending.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Item {
    /// Arrival, epoch ms.
    pub arrived_ms: i64,
    /// Done, epoch ms (None: still pending).
    pub done_ms: Option<i64>,
}

/// A stretch of time in which the lag was above the objective.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Incident {
    /// When the lag first exceeded the objective (the oldest late item's arrival + objective).
    pub start: String,
    /// When the last late item was done: caught up (None: still behind).
    pub end: Option<String>,
    /// end − start (up to now while still behind): the time to recover.
    pub seconds: f64,
    /// Items that were late.
    pub items: usize,
    /// The largest delay (done − arrival) among them (s).
    pub peak_delay_seconds: f64,
}

/// How the work recovered from backlogs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Recovery {
    /// The objective (s): the table's freshness objective, or the pipeline's lag objective.
    pub objective_seconds: u64,
    /// Items seen (objects, source snapshots).
    pub items: usize,
    /// Stretches above the objective.
    pub incidents: usize,
    /// Their total length (s).
    pub seconds_above_objective: f64,
    /// The longest one.
    pub longest: Option<Incident>,
    /// The most recent one (the last incident or drill).
    pub last: Option<Incident>,
}

/// The incidents of `items` against `objective_ms`, as of `now_ms`.
///
/// The lag is above the objective at time t when some item arrived before t − objective and was
/// not done by t: item i is late over [arrival + objective, done). An incident is a connected
/// stretch of the union of those intervals: it starts when the lag first exceeds the objective
/// and ends when the backlog is worked off (the lag is back at or under the objective); its
/// length is the recovery time.
pub fn recovery(items: &[Item], objective_ms: i64, now_ms: i64) -> Recovery {
    let mut late: Vec<(i64, i64, bool, i64)> = items
        .iter()
        .filter_map(|i| {
            let done = i.done_ms.unwrap_or(now_ms);
            let start = i.arrived_ms + objective_ms;
            (done > start).then_some((start, done, i.done_ms.is_none(), done - i.arrived_ms))
        })
        .collect();
    late.sort_by_key(|l| l.0);
    let mut merged: Vec<(i64, i64, bool, usize, i64)> = Vec::new();
    for (start, end, pending, delay) in late {
        match merged.last_mut() {
            Some(m) if start <= m.1 => {
                m.1 = m.1.max(end);
                m.2 |= pending;
                m.3 += 1;
                m.4 = m.4.max(delay);
            }
            _ => merged.push((start, end, pending, 1, delay)),
        }
    }
    let incidents: Vec<Incident> = merged
        .iter()
        .map(|&(start, end, pending, n, delay)| Incident {
            start: rfc3339(start),
            end: (!pending).then(|| rfc3339(end)),
            seconds: (end - start) as f64 / 1000.0,
            items: n,
            peak_delay_seconds: delay as f64 / 1000.0,
        })
        .collect();
    Recovery {
        objective_seconds: (objective_ms / 1000).max(0) as u64,
        items: items.len(),
        incidents: incidents.len(),
        seconds_above_objective: incidents.iter().map(|i| i.seconds).sum(),
        longest: incidents
            .iter()
            .max_by(|a, b| a.seconds.total_cmp(&b.seconds))
            .cloned(),
        last: incidents.last().cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let p = percentiles((1..=100).map(f64::from).collect()).expect("samples");
        assert_eq!(
            (p.count, p.p50, p.p95, p.p99, p.max),
            (100, 50.0, 95.0, 99.0, 100.0)
        );
        let p = percentiles(vec![3.0, 1.0, 2.0]).expect("samples");
        assert_eq!((p.p50, p.p95, p.max), (2.0, 3.0, 3.0));
        assert_eq!(percentiles(vec![]), None);
        assert_eq!(percentiles(vec![f64::NAN]), None);
    }

    #[test]
    fn throughput_is_rows_over_the_span_and_per_hour() {
        let h = 3_600_000;
        let t = throughput(&[
            (10 * h, 100, 1000),
            (10 * h + 50_000, 300, 3000),
            (11 * h, 600, 6000),
        ]);
        assert_eq!((t.commits, t.rows, t.bytes), (3, 1000, 10_000));
        assert_eq!(t.span_seconds, 3600.0);
        assert_eq!(t.rows_per_second, Some(1000.0 / 3600.0));
        assert_eq!(t.hourly.len(), 2);
        assert_eq!((t.hourly[0].commits, t.hourly[0].rows), (2, 400));
        assert_eq!(t.hourly[1].bytes_per_second, 6000.0 / 3600.0);
        assert!(
            t.hourly[0].hour.ends_with("T10:00:00Z"),
            "{}",
            t.hourly[0].hour
        );
        // One commit has no span.
        assert_eq!(throughput(&[(h, 5, 5)]).rows_per_second, None);
    }

    #[test]
    fn an_incident_runs_from_the_objective_breach_to_the_last_late_item_done() {
        let s = 1000;
        let item = |a: i64, d: Option<i64>| Item {
            arrived_ms: a * s,
            done_ms: d.map(|d| d * s),
        };
        let items = [
            item(0, Some(5)),     // on time (objective 10 s)
            item(100, Some(150)), // late from 110 to 150
            item(120, Some(160)), // late from 130 to 160: the same incident
            item(200, Some(205)), // on time
            item(300, Some(330)), // late from 310 to 330: a second incident
        ];
        let r = recovery(&items, 10 * s, 1000 * s);
        assert_eq!((r.items, r.incidents, r.objective_seconds), (5, 2, 10));
        let longest = r.longest.expect("longest");
        assert_eq!((longest.seconds, longest.items), (50.0, 2));
        assert_eq!(longest.peak_delay_seconds, 50.0);
        let last = r.last.expect("last");
        assert_eq!(last.seconds, 20.0);
        assert!(last.end.is_some());
        assert_eq!(r.seconds_above_objective, 70.0);
        // Still behind: the incident is open and lasts until now.
        let r = recovery(&[item(0, None)], 10 * s, 100 * s);
        let open = r.last.expect("open");
        assert_eq!((open.end, open.seconds), (None, 90.0));
        assert_eq!(recovery(&[item(0, Some(1))], 10 * s, 100 * s).incidents, 0);
    }
}
