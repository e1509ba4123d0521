//! `floe baseline`: the measured baseline before a cutover (freshness, throughput, small files,
//! query planning, recovery, cost), from the tables' history ([`floe::baseline`]).

use std::fmt::Write as _;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use clap::Args;
use floe::baseline::{Baseline, Options, Percentiles, Recovery};
use floe::config::Config;

use crate::args::ConfigArg;

/// `floe baseline`.
#[derive(Debug, Args)]
pub struct BaselineArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Only the history committed at or after T: RFC 3339, or an age such as `24h`, `7d`, `90m`
    /// (default: every retained snapshot).
    #[arg(long, value_name = "T", value_parser = parse_since)]
    pub since: Option<DateTime<Utc>>,
    /// Print JSON (every figure, with its definition's inputs).
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,
    /// Print a Markdown report.
    #[arg(long)]
    pub markdown: bool,
    /// The representative query whose planning is timed (`{table}` stands for the table;
    /// default: count(*) and max(event time)).
    #[arg(long, value_name = "SQL")]
    pub query: Option<String>,
    /// Planning runs per table (the median is reported; 0: skip planning).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub planning_runs: usize,
}

/// `--since`: RFC 3339, or an age before now (`30s`, `90m`, `24h`, `7d`).
fn parse_since(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: i64 = n
        .parse()
        .map_err(|_| format!("`{s}`: expected RFC 3339 or an age like 24h, 7d"))?;
    let per = match unit.trim() {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => return Err(format!("`{s}`: unknown unit `{other}` (s, m, h, d)")),
    };
    // Checked all the way: an age beyond chrono's range is an error, not a panic.
    n.checked_mul(per)
        .and_then(chrono::TimeDelta::try_seconds)
        .and_then(|age| Utc::now().checked_sub_signed(age))
        .ok_or_else(|| format!("`{s}`: an age too far back to be a date"))
}

/// Measures the baseline of `config`'s tables.
pub async fn collect(config: &Config, a: &BaselineArgs) -> Result<Baseline> {
    let catalog = floe::catalog::connect(config).await?;
    let opts = Options {
        since: a.since,
        planning_runs: a.planning_runs,
        query: a.query.clone(),
        ..Default::default()
    };
    floe::baseline::collect(catalog.as_ref(), config, &opts)
        .await
        .context("measuring the baseline")
}

pub async fn run(config: &Config, a: &BaselineArgs) -> Result<()> {
    let b = collect(config, a).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&b)?);
    } else {
        print!("{}", render(&b, a.markdown));
    }
    Ok(())
}

fn secs(p: &Option<Percentiles>) -> String {
    match p {
        Some(p) => format!(
            "{:.1} / {:.1} / {:.1} s (n={})",
            p.p50, p.p95, p.p99, p.count
        ),
        None => "-".into(),
    }
}

fn recovery(r: &Recovery) -> String {
    if r.items == 0 {
        return "-".into();
    }
    match &r.longest {
        None => format!("never above {} s", r.objective_seconds),
        Some(l) => format!(
            "{} incident(s) above {} s; longest {:.0} s ({} item(s), peak delay {:.0} s{}); last {:.0} s",
            r.incidents,
            r.objective_seconds,
            l.seconds,
            l.items,
            l.peak_delay_seconds,
            if l.end.is_none() { ", still behind" } else { "" },
            r.last.as_ref().map(|i| i.seconds).unwrap_or(0.0),
        ),
    }
}

fn usd(v: f64) -> String {
    if v != 0.0 && v.abs() < 0.01 {
        format!("${v:.6}")
    } else {
        format!("${v:.2}")
    }
}

fn bytes(n: u64) -> String {
    let n = n as f64;
    if n >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", n / (1u64 << 30) as f64)
    } else if n >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", n / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", n / 1024.0)
    }
}

/// The report as text, or as Markdown (headings, one table per section).
pub fn render(b: &Baseline, markdown: bool) -> String {
    let mut o = String::new();
    let (h1, h2) = if markdown { ("# ", "## ") } else { ("", "== ") };
    let _ = writeln!(
        o,
        "{h1}floe baseline ({}{})\n",
        b.generated_at,
        b.since
            .as_ref()
            .map(|s| format!(", since {s}"))
            .unwrap_or_default()
    );
    for t in &b.tables {
        let _ = writeln!(o, "{h2}table {}", t.table);
        if !t.exists {
            let _ = writeln!(o, "not created yet\n");
            continue;
        }
        let f = &t.usage.by_function;
        let gbs: Vec<String> = f
            .iter()
            .map(|(k, v)| format!("{k} {:.3} GB-s / {} commit(s)", v.gb_seconds, v.commits))
            .collect();
        let total = t.usage.total();
        let mut lines: Vec<(&str, String)> = vec![
            (
                "window",
                format!(
                    "{:.0} s, {} snapshot(s) ({})",
                    t.window.seconds,
                    t.snapshots,
                    t.commits
                        .iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            (
                "freshness p50/p95/p99 (commit − LastModified)",
                secs(&t.freshness.object_to_commit),
            ),
            (
                "freshness p50/p95/p99 (commit − event time)",
                secs(&t.freshness.event_to_commit),
            ),
            (
                "throughput",
                match (t.throughput.rows_per_second, t.throughput.bytes_per_second) {
                    (Some(r), Some(by)) => format!(
                        "{:.1} rows/s, {}/s ({} rows in {} commit(s) over {:.1} s; peak hour {:.2} rows/s)",
                        r,
                        bytes(by as u64),
                        t.throughput.rows,
                        t.throughput.commits,
                        t.throughput.span_seconds,
                        t.throughput
                            .hourly
                            .iter()
                            .map(|h| h.rows_per_second)
                            .fold(0.0, f64::max)
                    ),
                    _ => format!(
                        "{} rows in {} commit(s)",
                        t.throughput.rows, t.throughput.commits
                    ),
                },
            ),
            (
                "small files",
                format!(
                    "{} of {} live files under {} ({})",
                    t.files.small_files,
                    t.files.live_files,
                    bytes(t.files.small_below_bytes),
                    t.files
                        .small_file_share
                        .map(|s| format!("{:.0} %", s * 100.0))
                        .unwrap_or_else(|| "-".into())
                ),
            ),
            (
                "planning",
                t.planning
                    .as_ref()
                    .map(|p| {
                        format!(
                            "{:.2} ms median of {} ({} file(s)): {}",
                            p.median_ms, p.runs, p.files_planned, p.query
                        )
                    })
                    .unwrap_or_else(|| "-".into()),
            ),
            ("recovery", recovery(&t.recovery)),
            (
                "storage",
                format!(
                    "{} live + {} retained by snapshots only",
                    bytes(t.storage.live_bytes),
                    bytes(t.storage.retained_only_bytes)
                ),
            ),
            (
                "compute",
                if gbs.is_empty() {
                    "-".into()
                } else {
                    gbs.join("; ")
                },
            ),
            (
                "S3 requests",
                total
                    .s3
                    .kinds()
                    .iter()
                    .map(|(k, n)| {
                        format!("{k} {n} ({:.1}/commit)", total.s3_per_commit[*k])
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        ];
        if let Some(m) = &t.usage.maintenance_runs {
            lines.push((
                "maintenance runs",
                format!(
                    "{} run(s): {:.3} GB-s and {} per run",
                    m.runs,
                    m.gb_seconds_per_run,
                    m.s3_per_run
                        .iter()
                        .filter(|(_, v)| **v > 0.0)
                        .map(|(k, v)| format!("{v:.1} {k}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        lines.push((
            "cost",
            format!(
                "{} in the window (Lambda {} + requests {}, S3 requests {}, storage {}); {} per day{}",
                usd(t.cost.total_usd),
                usd(t.cost.lambda_compute_usd),
                usd(t.cost.lambda_requests_usd),
                usd(t.cost.s3_requests_usd),
                usd(t.cost.storage_usd),
                usd(t.cost.per_day_usd),
                if t.daily.len() > 1 {
                    format!(
                        " (by day: {})",
                        t.daily
                            .iter()
                            .map(|d| format!("{} {}", d.day, usd(d.usd)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                } else {
                    String::new()
                }
            ),
        ));
        table(&mut o, &lines, markdown);
    }
    for p in &b.pipelines {
        let _ = writeln!(o, "{h2}pipeline {} ({} → {})", p.pipeline, p.source, p.sink);
        let u = p.usage.total();
        let lines = vec![
            ("runs", format!("{} ({} source rows)", p.runs, p.rows_in)),
            (
                "latency p50/p95/p99 (source commit → output)",
                secs(&p.commit_to_output),
            ),
            (
                "latency p50/p95/p99 (LastModified → output)",
                secs(&p.object_to_output),
            ),
            ("recovery", recovery(&p.recovery)),
            (
                "compute",
                format!("{:.3} GB-s ({} ms)", u.gb_seconds, u.compute_ms),
            ),
            (
                "cost",
                format!(
                    "{} in the window; {} per day",
                    usd(p.cost.total_usd),
                    usd(p.cost.per_day_usd)
                ),
            ),
        ];
        table(&mut o, &lines, markdown);
    }
    let _ = writeln!(
        o,
        "{h2}total: {} in the window, {} per day (prices: Lambda ${}/GB-s + ${}/1M requests, S3 ${}/1k PUT/LIST, ${}/1k GET, ${}/GB-month)",
        usd(b.total.total_usd),
        usd(b.total.per_day_usd),
        b.prices.lambda_gb_second,
        b.prices.lambda_per_million_requests,
        b.prices.s3_put_per_1000,
        b.prices.s3_get_per_1000,
        b.prices.s3_storage_gb_month
    );
    o
}

fn table(o: &mut String, lines: &[(&str, String)], markdown: bool) {
    if markdown {
        let _ = writeln!(o, "\n| figure | value |\n|---|---|");
        for (k, v) in lines {
            let _ = writeln!(o, "| {k} | {} |", v.replace('|', "\\|"));
        }
    } else {
        let w = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in lines {
            let _ = writeln!(o, "  {k:<w$}  {v}");
        }
    }
    let _ = writeln!(o);
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use floe::event::ObjectRef;

    #[test]
    fn since_takes_rfc3339_or_an_age() {
        let t = parse_since("2026-11-30T10:00:00Z").expect("rfc3339");
        assert_eq!(t.timestamp(), 1_796_032_800);
        let day = parse_since("1d").expect("age");
        let age = Utc::now() - day;
        assert!((age.num_seconds() - 86_400).abs() < 5, "{age}");
        assert!(parse_since("3 weeks").is_err());
        assert!(parse_since("12y").is_err());
    }

    #[test]
    fn since_out_of_range_is_an_error_not_a_panic() {
        for s in ["100000000d", "9223372036854775807s", "99999999999999999h"] {
            let e = parse_since(s).expect_err(s);
            assert!(e.contains(s), "{e}");
        }
    }

    /// A local world: SQLite catalog, file warehouse, a local landing "bucket", the sample
    /// pipelines, and `cost` as the `[cost]` block.
    fn config(dir: &std::path::Path, cost: &str) -> Config {
        let text = format!(
            "{}\n{}\n{cost}",
            crate::bench::bench_config(dir, &dir.join("inputs")),
            floe::sample::PIPELINES_TOML
        );
        Config::parse(&text, "baseline test").expect("config")
    }

    /// Ingests `n` objects (one commit each) and runs every pipeline after each.
    async fn history(cfg: &Config, dir: &std::path::Path, n: usize) {
        std::fs::create_dir_all(dir.join("inputs/input")).expect("inputs");
        let ingestor = floe::ingest::Ingestor::new(cfg.clone())
            .await
            .expect("ingestor");
        let processor = floe::process::Processor::new(cfg.clone())
            .await
            .expect("processor");
        let deadline = || Instant::now() + Duration::from_secs(300);
        for i in 0..n {
            let key = format!("{i:03}.jsonl");
            std::fs::write(
                dir.join("inputs/input").join(&key),
                floe::sample::orders_jsonl(50, i as u64 + 1, Utc::now()),
            )
            .expect("object");
            let r = ingestor
                .ingest(&ObjectRef::new("input", key), deadline())
                .await
                .expect("ingest");
            assert_eq!(r.records_committed, 50, "{r:?}");
            for p in &cfg.pipelines {
                processor.run(&p.name, deadline()).await.expect("pipeline");
            }
        }
    }

    fn args(cfg_path: &str) -> BaselineArgs {
        BaselineArgs {
            config: ConfigArg {
                path: cfg_path.into(),
                origin: crate::args::ConfigOrigin::Flag,
            },
            since: None,
            json: true,
            markdown: false,
            query: None,
            planning_runs: 3,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
    }

    /// `floe baseline --json` over a local history of three objects and the sample pipelines:
    /// every figure present, and each one consistent with the history it came from.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn baseline_figures_are_present_and_consistent() {
        let dir = std::env::temp_dir().join(format!("floe-baseline-{}", uuid_like()));
        let cfg = config(&dir, "");
        history(&cfg, &dir, 3).await;
        let b = collect(&cfg, &args("f")).await.expect("baseline");
        let json = serde_json::to_value(&b).expect("json");

        let orders = b
            .tables
            .iter()
            .find(|t| t.table == "orders")
            .expect("orders");
        assert!(orders.exists);
        // Freshness: one sample per object, commit after LastModified.
        let f = orders
            .freshness
            .object_to_commit
            .as_ref()
            .expect("freshness");
        assert_eq!(f.count, 3);
        assert!(f.p50 >= 0.0 && f.p50 <= f.p95 && f.p95 <= f.p99 && f.p99 <= f.max);
        assert_eq!(
            orders.freshness.event_to_commit.as_ref().map(|p| p.count),
            Some(3)
        );
        // Throughput = rows committed / span between the first and the last commit.
        let t = &orders.throughput;
        assert_eq!((t.commits, t.rows), (3, 150));
        let rps = t.rows_per_second.expect("rows/s");
        assert!(close(rps, 150.0 / t.span_seconds), "{rps} vs {t:?}");
        assert_eq!(t.hourly.iter().map(|h| h.rows).sum::<u64>(), 150);
        // Small files: three tiny files of a 128 MiB target.
        assert_eq!((orders.files.live_files, orders.files.small_files), (3, 3));
        assert_eq!(orders.files.small_file_share, Some(1.0));
        // Planning: DataFusion planned the query over the three files.
        let p = orders.planning.as_ref().expect("planning");
        assert_eq!((p.runs, p.files_planned), (3, 3));
        assert!(p.median_ms > 0.0 && p.median_ms <= p.max_ms);
        // Cost: GB-seconds = Σ durations × memory over the commits, from their summaries.
        let ingest = &orders.usage.by_function["ingest"];
        assert_eq!(ingest.commits, 3);
        assert!(ingest.gb_seconds > 0.0);
        assert!(close(
            ingest.gb_seconds,
            ingest.compute_ms as f64 / 1000.0 * 1024.0 / 1024.0
        ));
        // Requests counted on the way: the object read, data file + manifest + list + metadata written.
        assert!(
            ingest.s3.get >= 3 && ingest.s3.put >= 3 * 4,
            "{:?}",
            ingest.s3
        );
        let c = &orders.cost;
        let expect_lambda = ingest.gb_seconds * cfg.cost.lambda_gb_second;
        assert!(close(c.lambda_compute_usd, expect_lambda), "{c:?}");
        let s3 = &ingest.s3;
        let expect_s3 = (s3.put + s3.list) as f64 / 1000.0 * 0.005
            + (s3.get + s3.head) as f64 / 1000.0 * 0.0004;
        assert!(close(c.s3_requests_usd, expect_s3), "{c:?}");
        assert!(c.per_day_usd > 0.0 && c.total_usd > 0.0);
        assert_eq!(orders.storage.live_bytes, orders.throughput.bytes);

        // Each pipeline: three runs, its latency, GB-seconds at the process function's memory.
        assert_eq!(b.pipelines.len(), 2);
        for p in &b.pipelines {
            assert_eq!(p.runs, 3, "{p:?}");
            assert_eq!(p.rows_in, 150, "{p:?}");
            assert_eq!(p.commit_to_output.as_ref().map(|l| l.count), Some(3));
            assert_eq!(p.object_to_output.as_ref().map(|l| l.count), Some(3));
            let u = &p.usage.by_function["process"];
            assert!(close(
                u.gb_seconds,
                u.compute_ms as f64 / 1000.0 * 2048.0 / 1024.0
            ));
            assert!(p.cost.lambda_compute_usd > 0.0);
            let sink = b.tables.iter().find(|t| t.table == p.sink).expect("sink");
            assert!(sink.cost.lambda_compute_usd >= p.cost.lambda_compute_usd);
        }
        assert!(close(
            b.total.total_usd,
            b.tables.iter().map(|t| t.cost.total_usd).sum::<f64>()
        ));
        // The JSON carries the same figures.
        assert_eq!(json["tables"][0]["throughput"]["rows"], 150);
        assert!(
            json["tables"][0]["cost"]["per_day_usd"]
                .as_f64()
                .unwrap_or(0.0)
                > 0.0
        );
        assert!(render(&b, true).contains("| freshness p50/p95/p99 (commit − LastModified) |"));

        // Another price in `[cost]`, another figure from the same usage.
        let dearer = config(
            &dir,
            "[cost]\nlambda_gb_second = 0.001\ns3_put_per_1000 = 1.0\n",
        );
        let d = collect(&dearer, &args("f")).await.expect("baseline");
        let o2 = d
            .tables
            .iter()
            .find(|t| t.table == "orders")
            .expect("orders");
        let i2 = &o2.usage.by_function["ingest"];
        assert_eq!(i2.compute_ms, ingest.compute_ms);
        assert!(close(o2.cost.lambda_compute_usd, i2.gb_seconds * 0.001));
        assert!(o2.cost.s3_requests_usd > c.s3_requests_usd * 100.0);

        // `floe status` shows the same per-day cost.
        let status = crate::status::collect(&cfg).await.expect("status");
        let row = status
            .iter()
            .find(|r| r.table.ends_with(".orders"))
            .expect("orders row");
        let per_day = row.cost_per_day_usd.expect("cost per day");
        // A history shorter than a day: its cost so far plus a day of storage, not scaled up.
        assert!(
            close(per_day, c.per_day_usd),
            "{per_day} vs {}",
            c.per_day_usd
        );
        let requests = c.lambda_compute_usd + c.lambda_requests_usd + c.s3_requests_usd;
        assert!(
            close(c.per_day_usd, requests + c.storage_per_day_usd),
            "{c:?}"
        );
        // The day's cost: the same commits, the same figure.
        assert_eq!(
            orders.daily.iter().map(|d| d.commits).sum::<usize>(),
            orders.snapshots
        );
        let daily: f64 = orders.daily.iter().map(|d| d.usd).sum();
        assert!(
            orders.daily.len() > 1 || close(daily, c.per_day_usd),
            "{:?}",
            orders.daily
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A `--since` before the table's first snapshot covers the same history as none: the
    /// window (per-day rate, storage over it) starts at the first commit, not at `--since`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn since_before_the_first_commit_measures_the_same_window() {
        let dir = std::env::temp_dir().join(format!("floe-baseline-since-{}", uuid_like()));
        let cfg = config(&dir, "");
        history(&cfg, &dir, 2).await;
        let catalog = floe::catalog::connect(&cfg).await.expect("catalog");
        let now = Utc::now();
        let measure = |since: Option<DateTime<Utc>>| {
            let catalog = catalog.clone();
            let cfg = cfg.clone();
            async move {
                let opts = Options {
                    since,
                    now,
                    planning_runs: 0,
                    ..Default::default()
                };
                floe::baseline::collect(catalog.as_ref(), &cfg, &opts)
                    .await
                    .expect("baseline")
            }
        };
        let all = measure(None).await;
        let week = measure(Some(now - chrono::Duration::days(7))).await;
        for (a, w) in all.tables.iter().zip(&week.tables) {
            assert_eq!(a.table, w.table);
            assert_eq!(a.snapshots, w.snapshots, "{}", a.table);
            assert_eq!(a.window.start, w.window.start, "{}", a.table);
            assert!(close(a.window.seconds, w.window.seconds), "{}", a.table);
            assert!(
                close(a.cost.per_day_usd, w.cost.per_day_usd),
                "{}: {} vs {}",
                a.table,
                a.cost.per_day_usd,
                w.cost.per_day_usd
            );
            assert!(close(a.cost.storage_usd, w.cost.storage_usd), "{}", a.table);
        }
        let orders = week
            .tables
            .iter()
            .find(|t| t.table == "orders")
            .expect("orders");
        assert!(orders.cost.per_day_usd > 0.0 && orders.window.seconds < 86_400.0);
        for (a, w) in all.pipelines.iter().zip(&week.pipelines) {
            assert!(
                close(a.cost.per_day_usd, w.cost.per_day_usd),
                "{}",
                a.pipeline
            );
        }
        // A `--since` inside the history still starts the window there.
        let first = orders.window.start.clone().expect("start");
        let first = DateTime::parse_from_rfc3339(&first)
            .expect("rfc3339")
            .with_timezone(&Utc);
        let later = first + chrono::Duration::seconds(2);
        let inside = measure(Some(later)).await;
        let o = inside
            .tables
            .iter()
            .find(|t| t.table == "orders")
            .expect("orders");
        assert!(o.window.seconds < orders.window.seconds);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn uuid_like() -> String {
        format!(
            "{}-{}",
            std::process::id(),
            Utc::now().timestamp_nanos_opt().unwrap_or(0)
        )
    }
}
