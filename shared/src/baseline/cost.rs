//! Usage summed from snapshot summaries, and its price at the configured `[cost]` prices.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::config::CostConfig;
use crate::summary::{S3Requests, Usage};

/// Bytes in a GB as S3 bills storage (2^30).
const GB: f64 = (1u64 << 30) as f64;
/// Hours in a month as AWS prorates storage.
const HOURS_PER_MONTH: f64 = 730.0;

/// One function's work in a window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FunctionUsage {
    /// Commits that recorded usage.
    pub commits: usize,
    /// Their compute time (ms).
    pub compute_ms: u64,
    /// Their GB-seconds (Σ duration × memory).
    pub gb_seconds: f64,
    /// Their S3 requests by kind.
    pub s3: S3Requests,
    /// Requests by kind per commit (mean).
    pub s3_per_commit: BTreeMap<String, f64>,
}

/// Usage of a table or pipeline in the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsageSummary {
    /// Per function (`ingest`, `process`, `maintain`).
    pub by_function: BTreeMap<String, FunctionUsage>,
    /// Commits in the window that recorded no usage (another engine's, or older floe's).
    pub unmeasured_commits: usize,
    /// Maintenance runs that committed a snapshot, with their means.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance_runs: Option<MaintenanceRuns>,
}

/// The maintenance runs seen in the history (a run's snapshots share its run id).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MaintenanceRuns {
    /// Runs.
    pub runs: usize,
    /// GB-seconds per run (mean).
    pub gb_seconds_per_run: f64,
    /// S3 requests by kind per run (mean).
    pub s3_per_run: BTreeMap<String, f64>,
}

impl UsageSummary {
    /// Sums the usage of commits: (usage, maintenance run id).
    pub fn of<'a>(commits: impl IntoIterator<Item = (Option<Usage>, Option<&'a str>)>) -> Self {
        let mut out = UsageSummary::default();
        let mut runs = BTreeSet::new();
        let mut maintain = FunctionUsage::default();
        for (usage, run) in commits {
            let Some(u) = usage else {
                out.unmeasured_commits += 1;
                continue;
            };
            let f = out.by_function.entry(u.function.clone()).or_default();
            f.commits += 1;
            f.compute_ms += u.compute_ms;
            f.gb_seconds += u.gb_seconds();
            f.s3 = f.s3.plus(&u.s3.unwrap_or_default());
            if let Some(run) = run {
                runs.insert(run.to_string());
                maintain.gb_seconds += u.gb_seconds();
                maintain.s3 = maintain.s3.plus(&u.s3.unwrap_or_default());
            }
        }
        for f in out.by_function.values_mut() {
            f.s3_per_commit = per(&f.s3, f.commits);
        }
        if !runs.is_empty() {
            out.maintenance_runs = Some(MaintenanceRuns {
                runs: runs.len(),
                gb_seconds_per_run: maintain.gb_seconds / runs.len() as f64,
                s3_per_run: per(&maintain.s3, runs.len()),
            });
        }
        out
    }

    /// Everything summed over the functions.
    pub fn total(&self) -> FunctionUsage {
        let mut t = FunctionUsage::default();
        for f in self.by_function.values() {
            t.commits += f.commits;
            t.compute_ms += f.compute_ms;
            t.gb_seconds += f.gb_seconds;
            t.s3 = t.s3.plus(&f.s3);
        }
        t.s3_per_commit = per(&t.s3, t.commits);
        t
    }
}

/// Requests by kind divided by `n`.
fn per(s3: &S3Requests, n: usize) -> BTreeMap<String, f64> {
    s3.kinds()
        .iter()
        .map(|(k, v)| (k.to_string(), *v as f64 / n.max(1) as f64))
        .collect()
}

/// Dollars (at the configured prices) of a window's usage and of the storage held.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Cost {
    /// Lambda compute: GB-seconds × price.
    pub lambda_compute_usd: f64,
    /// Lambda requests: one invocation per measured commit × price (invocations that commit
    /// nothing are not in the history).
    pub lambda_requests_usd: f64,
    /// S3 requests: (PUT + LIST) × PUT price + (GET + HEAD) × GET price; DELETE is free.
    pub s3_requests_usd: f64,
    /// Storage over the window at its current size (live + retained by snapshots only).
    pub storage_usd: f64,
    /// All of the above.
    pub total_usd: f64,
    /// Storage per day at its current size.
    pub storage_per_day_usd: f64,
    /// Per day: (compute + requests) over the window divided by its length in days — at least
    /// one: a history shorter than a day is not scaled up — plus storage per day.
    pub per_day_usd: f64,
}

impl Cost {
    /// The price of `usage` over a window of `window_seconds` with `stored_bytes` held.
    pub fn of(
        usage: &FunctionUsage,
        stored_bytes: u64,
        window_seconds: f64,
        prices: &CostConfig,
    ) -> Self {
        let lambda_compute_usd = usage.gb_seconds * prices.lambda_gb_second;
        let lambda_requests_usd =
            usage.commits as f64 * prices.lambda_per_million_requests / 1_000_000.0;
        let s3 = &usage.s3;
        let s3_requests_usd = (s3.put + s3.list) as f64 / 1000.0 * prices.s3_put_per_1000
            + (s3.get + s3.head) as f64 / 1000.0 * prices.s3_get_per_1000;
        let storage_per_day_usd =
            stored_bytes as f64 / GB * prices.s3_storage_gb_month * 24.0 / HOURS_PER_MONTH;
        let days = window_seconds.max(0.0) / 86_400.0;
        let storage_usd = storage_per_day_usd * days;
        let requests = lambda_compute_usd + lambda_requests_usd + s3_requests_usd;
        let per_day_usd = requests / days.max(1.0) + storage_per_day_usd;
        Self {
            lambda_compute_usd,
            lambda_requests_usd,
            s3_requests_usd,
            storage_usd,
            total_usd: requests + storage_usd,
            storage_per_day_usd,
            per_day_usd,
        }
    }

    /// Kind-wise sum (totals over tables).
    pub fn plus(&self, o: &Cost) -> Cost {
        Cost {
            lambda_compute_usd: self.lambda_compute_usd + o.lambda_compute_usd,
            lambda_requests_usd: self.lambda_requests_usd + o.lambda_requests_usd,
            s3_requests_usd: self.s3_requests_usd + o.s3_requests_usd,
            storage_usd: self.storage_usd + o.storage_usd,
            total_usd: self.total_usd + o.total_usd,
            storage_per_day_usd: self.storage_per_day_usd + o.storage_per_day_usd,
            per_day_usd: self.per_day_usd + o.per_day_usd,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(function: &str, ms: u64, mb: u64, get: u64, put: u64) -> Option<Usage> {
        Some(Usage {
            function: function.into(),
            compute_ms: ms,
            memory_mb: mb,
            s3: Some(S3Requests {
                get,
                put,
                ..Default::default()
            }),
        })
    }

    #[test]
    fn usage_sums_per_function_and_per_maintenance_run() {
        let u = UsageSummary::of([
            (usage("ingest", 2000, 1024, 3, 5), None),
            (usage("ingest", 1000, 1024, 1, 5), None),
            (usage("maintain", 4000, 2048, 10, 2), Some("r1")),
            (usage("maintain", 2000, 2048, 10, 2), Some("r1")),
            (usage("maintain", 1000, 2048, 0, 0), Some("r2")),
            (None, None),
        ]);
        let ingest = &u.by_function["ingest"];
        assert_eq!((ingest.commits, ingest.compute_ms), (2, 3000));
        assert_eq!(ingest.gb_seconds, 3.0);
        assert_eq!(ingest.s3_per_commit["put"], 5.0);
        assert_eq!(u.by_function["maintain"].gb_seconds, 14.0);
        assert_eq!(u.unmeasured_commits, 1);
        let runs = u.maintenance_runs.clone().expect("runs");
        assert_eq!((runs.runs, runs.gb_seconds_per_run), (2, 7.0));
        assert_eq!(runs.s3_per_run["get"], 10.0);
        assert_eq!(u.total().gb_seconds, 17.0);
    }

    #[test]
    fn dollars_are_usage_times_prices() {
        let f = FunctionUsage {
            commits: 1_000_000,
            gb_seconds: 1000.0,
            s3: S3Requests {
                get: 2000,
                put: 1000,
                list: 1000,
                head: 500,
                delete: 99,
            },
            ..Default::default()
        };
        let prices = CostConfig::default();
        let c = Cost::of(&f, 1 << 30, 86_400.0, &prices);
        assert!((c.lambda_compute_usd - 0.0133334).abs() < 1e-9);
        assert!((c.lambda_requests_usd - 0.20).abs() < 1e-12);
        assert!((c.s3_requests_usd - (2.0 * 0.005 + 2.5 * 0.0004)).abs() < 1e-12);
        assert!((c.storage_per_day_usd - 0.023 * 24.0 / 730.0).abs() < 1e-12);
        assert!((c.storage_usd - c.storage_per_day_usd).abs() < 1e-12);
        assert!(
            (c.per_day_usd - c.total_usd).abs() < 1e-12,
            "a one-day window"
        );
        // Another price, another figure.
        let dearer = CostConfig {
            lambda_gb_second: 0.0001,
            ..prices
        };
        let d = Cost::of(&f, 1 << 30, 86_400.0, &dearer);
        assert!((d.lambda_compute_usd - 0.1).abs() < 1e-12);
        // Two days: half the requests per day, storage per day unchanged.
        let two = Cost::of(&f, 1 << 30, 2.0 * 86_400.0, &CostConfig::default());
        let requests = two.lambda_compute_usd + two.lambda_requests_usd + two.s3_requests_usd;
        assert!((two.per_day_usd - (requests / 2.0 + two.storage_per_day_usd)).abs() < 1e-12);
        assert!((two.storage_usd - 2.0 * two.storage_per_day_usd).abs() < 1e-12);
        // Half a day is not scaled up to a day.
        let h = Cost::of(&f, 1 << 30, 43_200.0, &CostConfig::default());
        let requests = h.lambda_compute_usd + h.lambda_requests_usd + h.s3_requests_usd;
        assert!((h.per_day_usd - (requests + h.storage_per_day_usd)).abs() < 1e-12);
    }
}
