//! `floe bench --checks`: the cost of a data-quality contract. The same big JSON-lines object is
//! ingested with no checks and with ten (every kind, one of them `flag`), each in its own child
//! process, side by side in one run: seconds, CPU seconds, rows/s, the ratios and peak RSS. The
//! two contenders alternate `repeat` times (so a burst of load on the machine hits both) and the
//! ratio is of the medians.

use std::path::Path;

use anyhow::Result;

use crate::bench::{f, generate_big, median_run, print_runs_with, run_child, Run};
use crate::progress;

/// Ten checks over the sample orders (every kind; `customer_id` flags): all pass on the
/// generated data, so both runs commit the same rows and the difference is evaluation alone.
pub(crate) const TEN_CHECKS: &str = r#"checks = [
  { name = "has_region", kind = "not_null", column = "region" },
  { name = "amount_range", kind = "range", column = "amount", min = 0, max = 100000 },
  { name = "not_future", kind = "range", column = "event_time", min = "2020-01-01T00:00:00Z", max_future_seconds = 300 },
  { name = "known_currency", kind = "accepted", column = "currency", values = ["EUR", "USD", "GBP", "JPY"] },
  { name = "known_status", kind = "accepted", column = "status", values = ["placed", "paid", "shipped", "cancelled"] },
  { name = "order_id_uuid", kind = "regex", column = "order_id", pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$" },
  { name = "short_payment", kind = "max_length", column = "payment_method", max = 32 },
  { name = "one_per_order", kind = "unique", columns = ["order_id"] },
  { name = "sane_items", kind = "sql", expr = "items BETWEEN 1 AND 100" },
  { name = "known_customer", kind = "range", column = "customer_id", min = 0, action = "flag" },
]"#;

/// Runs the benchmark in `dir` (deleted first) on a `big_mb` MiB object, each contender
/// `repeat` times.
pub(crate) fn run(dir: &Path, big_mb: usize, repeat: usize) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    let bucket = dir.join("inputs").join("input");
    std::fs::create_dir_all(&bucket)?;
    let dir = std::fs::canonicalize(dir)?;
    let bucket = std::fs::canonicalize(&bucket)?;
    progress::note(format!("generating {big_mb} MiB of JSON lines (gzip)…"));
    let big = bucket.join("big.jsonl.gz");
    let rows = generate_big(&big, big_mb)?;
    let exe = std::env::current_exe()?;
    // A fresh warehouse per run: a second run into the same one would find the object committed.
    let child = |mode: &str, work: &str| {
        let _ = std::fs::remove_dir_all(dir.join(work));
        crate::bench::child_command(&exe, mode, &big, &dir.join(work))
    };
    let (mut plain, mut checked) = (Vec::new(), Vec::new());
    for i in 1..=repeat {
        plain.push(run_child(
            &format!("floe, no checks #{i}"),
            &mut child("floe-big", "plain"),
        )?);
        checked.push(run_child(
            &format!("floe, 10 checks #{i}"),
            &mut child("floe-big-checks", "checks"),
        )?);
    }
    let build = if cfg!(debug_assertions) {
        "debug build"
    } else {
        "release build"
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "\n## Data-quality checks: {big_mb} MiB JSON lines ({rows} rows), {build}, {cores} core(s)\n"
    );
    let cpu: crate::bench::Column<'_> = ("CPU (s)", &|r: &Run| {
        format!("{:.2}", f(&r.out, "cpu_secs"))
    });
    let runs: Vec<Run> = plain
        .iter()
        .zip(&checked)
        .flat_map(|(a, b)| [a, b])
        .cloned()
        .collect();
    print_runs_with(&runs, &[cpu]);
    let medians = [
        median_run(format!("floe, no checks (median of {repeat})"), &plain),
        median_run(format!("floe, 10 checks (median of {repeat})"), &checked),
    ];
    println!();
    print_runs_with(&medians, &[cpu]);
    let ratio = |k: &str| f(&medians[1].out, k) / f(&medians[0].out, k).max(1e-9);
    println!(
        "\n10 checks / no checks, medians: work time {:.2}×, CPU {:.2}× (target ≤ 1.15×); \
         rows committed {} vs {}",
        ratio("secs"),
        ratio("cpu_secs"),
        f(&medians[0].out, "rows"),
        f(&medians[1].out, "rows")
    );
    Ok(())
}
