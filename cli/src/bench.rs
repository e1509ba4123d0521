//! `floe bench`: ingest benchmark, floe vs PyIceberg vs a plain arrow-rs conversion, in one run.
//!
//! Each contender runs in its own child process so that peak RSS (VmHWM / ru_maxrss) is its own.
//! Prints a table of wall time, rows/s, peak RSS and the ratios.

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use chrono::Utc;
use floe::config::Config;
use floe::sample;
use serde_json::{json, Value};

use crate::args::BenchArgs;
use crate::progress;

pub(crate) fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// CPU seconds (user + system, every thread) this process has used so far, from
/// `/proc/self/stat` (fields 14 and 15, in USER_HZ = 100 ticks per second on Linux); 0 elsewhere.
pub(crate) fn cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // The command name (field 2) may hold spaces: count fields after its closing paren.
            let rest = &s[s.rfind(')')? + 1..];
            let mut fields = rest.split_whitespace().skip(11);
            let utime: f64 = fields.next()?.parse().ok()?;
            let stime: f64 = fields.next()?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(0.0)
}

/// Writes ~`mb` MiB of order JSON lines, gzip-compressed, streaming (bounded memory).
pub(crate) fn generate_big(path: &Path, mb: usize) -> Result<u64> {
    let bar = progress::bar(mb as u64, "generating big object (MiB)");
    let file = std::fs::File::create(path)?;
    let mut gz =
        flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::fast());
    let mut rng = sample::Rng::new(42);
    let now = Utc::now();
    let mut written = 0usize;
    let mut rows = 0u64;
    let mut buf = String::with_capacity(1 << 20);
    while written < mb << 20 {
        buf.clear();
        while buf.len() < 1 << 20 {
            // ~2% late events (one to six hours late)
            let late = if rng.below(50) == 0 {
                3600 * (1 + rng.below(6) as i64)
            } else {
                0
            };
            sample::order_line(&mut buf, &mut rng, now, late);
            rows += 1;
        }
        gz.write_all(buf.as_bytes())?;
        written += buf.len();
        bar.set_position((written >> 20) as u64);
    }
    gz.finish()?.flush()?;
    bar.finish_and_clear();
    Ok(rows)
}

/// The benchmarks' floe.toml: SQLite catalog and file warehouse under `work`, buckets under `inputs`.
pub(crate) fn bench_config(work: &Path, inputs: &Path) -> String {
    bench_config_with(work, inputs, "")
}

/// [`bench_config`] with `orders_extra` (TOML keys, e.g. `checks = [...]`) in the table.
pub(crate) fn bench_config_with(work: &Path, inputs: &Path, orders_extra: &str) -> String {
    let chunk = std::env::var("FLOE_BENCH_CHUNK").unwrap_or_else(|_| "4096".into());
    format!(
        "[catalog]\nkind = \"sqlite\"\nuri = \"{w}/catalog.db\"\nwarehouse = \"{w}/warehouse\"\nnamespace = \"bench\"\n\n[storage]\nlocal_root = \"{i}\"\n\n[ingest]\nchunk_records = {chunk}\n\n[[routes]]\nbucket = \"input\"\nprefix = \"\"\ntable = \"orders\"\nformat = \"jsonl\"\n{t}",
        w = work.display(),
        i = inputs.display(),
        t = sample::ORDERS_TABLE_TOML.replace(
            "target_file_size_mb = 128",
            &format!("target_file_size_mb = 128\n{orders_extra}")
        )
    )
}

/// Child: floe ingest of one or many objects from a local "bucket".
async fn child_floe(
    inputs: &Path,
    work: &Path,
    keys: Vec<String>,
    orders_extra: &str,
) -> Result<Value> {
    std::fs::create_dir_all(work)?;
    let config = Config::parse(&bench_config_with(work, inputs, orders_extra), "bench")?;
    let ingestor = floe::ingest::Ingestor::new(config).await?;
    let mut lat = Vec::new();
    let mut rows = 0;
    let t0 = Instant::now();
    for key in keys {
        let obj = floe::event::ObjectRef::new("input", key);
        let s = Instant::now();
        let r = ingestor
            .ingest(&obj, Instant::now() + Duration::from_secs(3600))
            .await?;
        lat.push(s.elapsed().as_secs_f64() * 1000.0);
        rows += r.records_committed;
    }
    Ok(
        json!({"secs": t0.elapsed().as_secs_f64(), "rows": rows, "latencies_ms": lat, "rss_mb": peak_rss_mb()}),
    )
}

/// Child: plain arrow-rs gzip JSON → Parquet, no Iceberg, single-threaded.
fn child_plain(input: &Path, out: &Path) -> Result<Value> {
    let t0 = Instant::now();
    let config = Config::parse(&bench_config(out, out), "bench")?;
    let table = config.table("orders").context("orders table")?;
    let schema = floe::schema::table_schema(table)?;
    let arrow = iceberg::arrow::schema_to_arrow_schema(&schema)?;
    let decode = floe::schema::decode_schema(&arrow);
    let reader = BufReader::with_capacity(
        1 << 20,
        flate2::read::MultiGzDecoder::new(std::fs::File::open(input)?),
    );
    let json = arrow::json::ReaderBuilder::new(decode.clone())
        .with_batch_size(16_384)
        .build(reader)?;
    std::fs::create_dir_all(out)?;
    let file = std::fs::File::create(out.join("plain.parquet"))?;
    let mut w = parquet::arrow::ArrowWriter::try_new(
        file,
        decode,
        Some(floe::ingest::writer_properties()),
    )?;
    let mut rows = 0;
    for b in json {
        let b = b?;
        rows += b.num_rows();
        w.write(&b)?;
    }
    w.close()?;
    Ok(json!({"secs": t0.elapsed().as_secs_f64(), "rows": rows, "rss_mb": peak_rss_mb()}))
}

#[derive(Clone)]
pub(crate) struct Run {
    pub(crate) name: String,
    pub(crate) wall: f64,
    pub(crate) out: Value,
}

/// The side-by-side table of child runs: work time, process wall time, rows/s, peak RSS.
pub(crate) fn print_runs(runs: &[Run]) {
    print_runs_with(runs, &[]);
}

/// A column of [`print_runs_with`] after the standard ones: its header and its cell.
pub(crate) type Column<'a> = (&'a str, &'a dyn Fn(&Run) -> String);

/// [`print_runs`] with `extra` columns.
pub(crate) fn print_runs_with(runs: &[Run], extra: &[Column<'_>]) {
    let heads: String = extra.iter().map(|(h, _)| format!(" {h} |")).collect();
    println!("| contender | work time (s) | process wall (s) | rows/s | peak RSS (MiB) |{heads}");
    println!("|---|---:|---:|---:|---:|{}", "---:|".repeat(extra.len()));
    for r in runs {
        let secs = f(&r.out, "secs");
        let cells: String = extra
            .iter()
            .map(|(_, cell)| format!(" {} |", cell(r)))
            .collect();
        println!(
            "| {} | {:.2} | {:.2} | {:.0} | {:.0} |{cells}",
            r.name,
            secs,
            r.wall,
            f(&r.out, "rows") / secs.max(1e-9),
            f(&r.out, "rss_mb")
        );
    }
}

/// Runs one contender in its own process (a spinner meanwhile) and reads its result line.
pub(crate) fn run_child(name: &str, cmd: &mut Command) -> Result<Run> {
    let spinner = progress::spinner(format!("running {name}"));
    let t0 = Instant::now();
    let output = cmd.output().with_context(|| format!("starting {name}"));
    let wall = t0.elapsed().as_secs_f64();
    spinner.finish_and_clear();
    let output = output?;
    if !output.status.success() {
        bail!("{name} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let line = String::from_utf8_lossy(&output.stdout)
        .lines()
        .rev()
        .find(|l| l.starts_with('{') && l.contains("\"secs\""))
        .map(str::to_string)
        .with_context(|| format!("{name} printed no result"))?;
    Ok(Run {
        name: name.into(),
        wall,
        out: serde_json::from_str(&line)?,
    })
}

pub(crate) fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

/// The median of `v` (the upper one of an even count; 0 when empty).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One [`Run`] of the medians of `runs` (each figure separately).
pub(crate) fn median_run(name: String, runs: &[Run]) -> Run {
    let mut out = serde_json::Map::new();
    if let Some(Value::Object(first)) = runs.first().map(|r| &r.out) {
        for k in first.keys() {
            out.insert(
                k.clone(),
                json!(median(runs.iter().map(|r| f(&r.out, k)).collect())),
            );
        }
    }
    Run {
        name,
        wall: median(runs.iter().map(|r| r.wall).collect()),
        out: Value::Object(out),
    }
}

/// This binary as a benchmark child: `floe bench --child <mode> --input <input> --work <work>`,
/// metrics off and only warnings logged (the parent measures it as a whole).
pub(crate) fn child_command(exe: &Path, mode: &str, input: &Path, work: &Path) -> Command {
    let mut c = Command::new(exe);
    c.args(["bench", "--child", mode, "--input"])
        .arg(input)
        .arg("--work")
        .arg(work);
    c.env("FLOE_METRICS", "off").env("RUST_LOG", "warn");
    c
}

/// `dir`, emptied (deleted and created again), as an absolute path.
pub(crate) fn fresh_dir(dir: &Path) -> Result<PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    Ok(std::fs::canonicalize(dir)?)
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// `floe bench`: a child mode (internal), one of the mode flags, or the ingest benchmark.
pub async fn run(args: BenchArgs) -> Result<()> {
    // Child modes (internal).
    if let Some(mode) = &args.child {
        let input = args.input.clone().context("--input")?;
        let work = args.work.clone().context("--work")?;
        let out = match mode.as_str() {
            "plain" => child_plain(&input, &work)?,
            "floe-big" | "floe-big-checks" => {
                let key = input
                    .file_name()
                    .context("file name")?
                    .to_string_lossy()
                    .to_string();
                let dir = input
                    .parent()
                    .context("parent")?
                    .parent()
                    .context("bucket root")?
                    .to_path_buf();
                let checks = if mode == "floe-big-checks" {
                    crate::bench_checks::TEN_CHECKS
                } else {
                    ""
                };
                child_floe(&dir, &work, vec![key], checks).await?
            }
            m if m.starts_with("backfill:") => {
                crate::bench_backfill::child(m, &input, &work).await?
            }
            "floe-small" => {
                let mut keys: Vec<String> = std::fs::read_dir(&input)?
                    .filter_map(|e| e.ok())
                    .map(|e| format!("small/{}", e.file_name().to_string_lossy()))
                    .collect();
                keys.sort();
                let root = input
                    .parent()
                    .and_then(Path::parent)
                    .context("bucket root")?
                    .to_path_buf();
                child_floe(&root, &work, keys, "").await?
            }
            "delta-setup" => {
                let rows = args.child_rows.context("--child-rows")?;
                crate::bench_delta::child_setup(&work, rows).await?
            }
            "delta-run" => crate::bench_delta::child_run(&work).await?,
            "latest-setup" => {
                let keys = args.child_rows.context("--child-rows")?;
                let buckets = args.child_buckets.context("--child-buckets")?;
                crate::bench_latest::child_setup(&work, keys, buckets).await?
            }
            m @ ("latest-run" | "latest-rebuild") => {
                let keys = args.child_rows.context("--child-rows")?;
                crate::bench_latest::child_round(&work, keys, m == "latest-rebuild").await?
            }
            other => bail!("unknown child mode {other}"),
        };
        let mut out = out;
        if let Value::Object(m) = &mut out {
            m.insert("cpu_secs".into(), json!(cpu_secs()));
        }
        println!("{out}");
        return Ok(());
    }

    if args.freshness {
        let dir = args.dir_or("target/floe-bench-freshness");
        let defaults = crate::local::Shape::default();
        let shape = crate::local::Shape {
            ingest_concurrency: args
                .ingest_concurrency
                .map_or(defaults.ingest_concurrency, |n| n.get()),
            process_concurrency: args
                .process_concurrency
                .map_or(defaults.process_concurrency, |n| n.get()),
            batch_window: args
                .batch_window_ms
                .map_or(defaults.batch_window, Duration::from_millis),
            maintain_every: None,
            verbose: false,
            ..defaults
        };
        let opts = crate::bench_freshness::Options {
            rates: args.rate.iter().map(|r| r.get()).collect(),
            seconds: args.seconds,
            shape,
            recompute: args.recompute,
            sequential: args.sequential,
        };
        return crate::bench_freshness::run(&dir, opts).await;
    }
    if args.backfill {
        let dir = args.dir_or("target/floe-bench-backfill");
        return crate::bench_backfill::run(&dir, args.backfill_small, args.backfill_big_mb);
    }
    if args.checks {
        let dir = args.dir_or("target/floe-bench-checks");
        return crate::bench_checks::run(&dir, args.big_mb, args.repeat.get());
    }
    if args.delta {
        let dir = args.dir_or("target/floe-bench-delta");
        return crate::bench_delta::run(&dir, args.delta_rows, args.recompute);
    }
    if args.latest {
        let dir = args.dir_or("target/floe-bench-latest");
        return crate::bench_latest::run(&dir, args.latest_keys, args.latest_buckets);
    }
    if args.planning {
        return crate::bench_plan::run(&args.dir_or("target/floe-bench-plan")).await;
    }
    if args.latency {
        let dir = args.dir_or("target/floe-bench-latency");
        return crate::bench_latency::run(&dir, args.commits.get(), args.rows).await;
    }
    if args.maintenance {
        let dir = args.dir_or("target/floe-bench-maintain");
        return crate::bench_maintain::run(args.appends, args.every.get(), &dir).await;
    }
    let (big_mb, small, huge_mb) = (args.big_mb, args.small, args.huge_mb);
    let skip_py = args.skip_pyiceberg;
    let dir = args.dir_or("target/floe-bench");
    let python = match args.python {
        Some(p) => p,
        None if skip_py => String::new(),
        None => {
            let out = Command::new("bash")
                .arg("infra/venv.sh")
                .output()
                .context("infra/venv.sh")?;
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    let inputs = dir.join("inputs");
    let bucket = inputs.join("input");
    std::fs::create_dir_all(bucket.join("small"))?;
    let dir = std::fs::canonicalize(&dir)?;
    let bucket = std::fs::canonicalize(&bucket)?;

    progress::note(format!(
        "generating {big_mb} MiB of JSON lines (gzip) and {small} objects of 500 lines…"
    ));
    let big = bucket.join("big.jsonl.gz");
    let big_rows = generate_big(&big, big_mb)?;
    let now = Utc::now();
    let bar = progress::bar(small as u64, "generating small objects");
    for i in 0..small {
        std::fs::write(
            bucket.join(format!("small/{i:05}.jsonl")),
            sample::orders_jsonl(500, 1000 + i as u64, now),
        )?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let exe = std::env::current_exe()?;
    let child =
        |mode: &str, input: &Path, work: &str| child_command(&exe, mode, input, &dir.join(work));
    let py = |mode: &str, input: &Path, work: &str| {
        let mut c = Command::new(&python);
        c.arg("infra/bench_pyiceberg.py")
            .arg(mode)
            .arg(input)
            .arg(dir.join(work));
        c
    };

    // The plain conversion and floe alternate, each round in fresh directories: the machine's
    // load moves both alike within a round, so each round's ratio is steadier than one run's.
    let rounds = args.rounds.get();
    let (mut plains, mut floes) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let (plain_dir, floe_dir) = (format!("plain-{round}"), format!("floe-big-{round}"));
        let plain = run_child(
            "arrow-rs plain (no Iceberg)",
            &mut child("plain", &big, &plain_dir),
        );
        let _ = std::fs::remove_dir_all(dir.join(&plain_dir));
        plains.push(plain?);
        let floe = run_child("floe", &mut child("floe-big", &big, &floe_dir));
        let _ = std::fs::remove_dir_all(dir.join(&floe_dir));
        floes.push(floe?);
    }
    let cpu_ratios: Vec<f64> = plains
        .iter()
        .zip(&floes)
        .map(|(p, fl)| f(&fl.out, "cpu_secs") / f(&p.out, "cpu_secs").max(1e-9))
        .collect();
    let time_ratios: Vec<f64> = plains
        .iter()
        .zip(&floes)
        .map(|(p, fl)| f(&fl.out, "secs") / f(&p.out, "secs").max(1e-9))
        .collect();
    let of = |name: &str, runs: &[Run]| median_run(name.to_string(), runs);
    let mut big_runs = vec![
        of("arrow-rs plain (no Iceberg)", &plains),
        of("floe", &floes),
    ];
    if !skip_py {
        big_runs.push(run_child("PyIceberg", &mut py("big", &big, "py-big"))?);
    }
    let big_gz = std::fs::metadata(&big)?.len() as f64 / 1048576.0;
    let build = if cfg!(debug_assertions) {
        "debug build"
    } else {
        "release build"
    };
    // What the children may run on (`taskset -c 0` makes it one): their CPU time is the figure
    // a one-vCPU Lambda is billed for, their wall time depends on the cores.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let medians = if rounds > 1 {
        format!(", medians of {rounds} alternating rounds")
    } else {
        String::new()
    };
    println!(
        "\n## Big object: {big_mb} MiB JSON lines ({big_gz:.0} MiB gzip, {big_rows} rows), {build}, {cores} core(s){medians}\n"
    );
    let cpu: Column<'_> = ("CPU (s)", &|r: &Run| {
        format!("{:.2}", f(&r.out, "cpu_secs"))
    });
    print_runs_with(&big_runs, &[cpu]);
    let floe_secs = f(&big_runs[1].out, "secs");
    if rounds > 1 {
        let each: Vec<String> = plains
            .iter()
            .zip(&floes)
            .zip(&cpu_ratios)
            .map(|((p, fl), r)| {
                format!(
                    "{:.2} / {:.2} s ({r:.2}×)",
                    f(&p.out, "cpu_secs"),
                    f(&fl.out, "cpu_secs")
                )
            })
            .collect();
        println!("\nCPU per round, plain / floe: {}", each.join(", "));
    }
    println!(
        "\nfloe / plain arrow-rs (median of the rounds' ratios): work time {:.2}× (target ≤ 1.25×), CPU {:.2}× (target ≤ 1.2×)",
        median(time_ratios),
        median(cpu_ratios)
    );
    if let Some(py) = big_runs.get(2) {
        println!(
            "PyIceberg / floe time: {:.2}× work, {:.2}× process (target ≥ 1.5×); RSS floe {:.0} MiB vs PyIceberg {:.0} MiB",
            f(&py.out, "secs") / floe_secs,
            py.wall / big_runs[1].wall,
            f(&big_runs[1].out, "rss_mb"),
            f(&py.out, "rss_mb")
        );
    }

    if huge_mb > 0 {
        let huge = bucket.join("huge.jsonl.gz");
        progress::note(format!("generating {huge_mb} MiB for the memory check…"));
        generate_big(&huge, huge_mb)?;
        let r = run_child("floe (huge)", &mut child("floe-big", &huge, "floe-huge"))?;
        std::fs::remove_file(&huge)?;
        println!(
            "\nfloe on {huge_mb} MiB: {:.2} s, {:.2} CPU s, {:.0} rows/s, peak RSS {:.0} MiB (vs {:.0} MiB on {big_mb} MiB; target ≤ 90 MiB)",
            f(&r.out, "secs"),
            f(&r.out, "cpu_secs"),
            f(&r.out, "rows") / f(&r.out, "secs").max(1e-9),
            f(&r.out, "rss_mb"),
            f(&big_runs[1].out, "rss_mb")
        );
    }

    let small_dir = bucket.join("small");
    let mut small_runs = Vec::new();
    for round in 1..=rounds {
        let work = format!("floe-small-{round}");
        let run = run_child("floe", &mut child("floe-small", &small_dir, &work));
        let _ = std::fs::remove_dir_all(dir.join(&work));
        let mut run = run?;
        if rounds > 1 {
            run.name = format!("floe, round {round}");
        }
        small_runs.push(run);
    }
    if !skip_py {
        small_runs.push(run_child(
            "PyIceberg",
            &mut py("small", &small_dir, "py-small"),
        )?);
    }
    println!(
        "\n## {small} small objects of 500 lines, one commit each, {build}, {cores} core(s)\n"
    );
    println!("| contender | total (s) | p50 (ms) | p99 (ms) | first 30 median (ms) | last 30 median (ms) | last/first | peak RSS (MiB) | CPU per object (ms) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    // (p50, last/first) of each floe round.
    let mut floe_small: Vec<(f64, f64)> = Vec::new();
    for (i, r) in small_runs.iter().enumerate() {
        let lat: Vec<f64> = r.out["latencies_ms"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        let first = percentile(lat[..lat.len().min(30)].to_vec(), 0.5);
        let last = percentile(lat[lat.len().saturating_sub(30)..].to_vec(), 0.5);
        let p50 = percentile(lat.clone(), 0.5);
        if i < rounds {
            floe_small.push((p50, last / first.max(1e-9)));
        }
        println!(
            "| {} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}× | {:.0} | {:.1} |",
            r.name,
            f(&r.out, "secs"),
            p50,
            percentile(lat.clone(), 0.99),
            first,
            last,
            last / first.max(1e-9),
            f(&r.out, "rss_mb"),
            f(&r.out, "cpu_secs") * 1e3 / lat.len().max(1) as f64
        );
    }
    if rounds > 1 {
        println!(
            "\nfloe, median of the {rounds} rounds: p50 {:.1} ms, last/first {:.2}×",
            median(floe_small.iter().map(|r| r.0).collect()),
            median(floe_small.iter().map(|r| r.1).collect())
        );
    }
    println!("\ntargets (floe): p50 ≤ 10 ms, last 30 / first 30 ≤ 1.5×");
    Ok(())
}
