//! `floe bench --freshness`: end-to-end freshness of the local stack (`floe local`: moto S3 →
//! SQS → ingest workers → commit event → EventBridge → SQS → process) under a steady load.
//!
//! For each `--rate`, on a fresh stack: objects of 200 order events are PUT at that rate for
//! `--seconds`; each object's time from its PUT until both sinks' checkpoints cover the commit
//! that holds it, and that time cut into legs by the timestamps each step leaves: the PUT (the
//! client's clock), the notification's SQS `SentTimestamp`, the moment its batch was handed to
//! the ingest handler, the ingest commit (snapshot timestamp), the commit event's arrival on the
//! process queue, the start of the first pipeline run covering the commit, and the later of the
//! two sinks' commits covering it (sink snapshot timestamps). p50/p95/p99/max per leg, the rates
//! side by side, and what was behind when the load stopped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use floe::config::Config;
use tokio::sync::watch;

use crate::local::{now_ms, Records, Shape, Stack, BUCKET};
use crate::progress;

/// Order events per object.
const EVENTS_PER_OBJECT: usize = 200;
/// How long the stack may take to catch up after the load before the run counts as behind.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// The benchmark's settings.
pub(crate) struct Options {
    pub(crate) rates: Vec<u32>,
    pub(crate) seconds: u64,
    pub(crate) shape: Shape,
    /// The aggregate with `merge = false` (windows recomputed, as before #14).
    pub(crate) recompute: bool,
    /// The process function uncached, one pipeline at a time (as before its rounds ran side by
    /// side).
    pub(crate) sequential: bool,
}

/// One object's timestamps (epoch ms), as far as it got.
#[derive(Debug, Default, Clone)]
struct Trace {
    put: i64,
    sent: Option<i64>,
    received: Option<i64>,
    invoked: Option<i64>,
    committed: Option<i64>,
    event: Option<i64>,
    process_start: Option<i64>,
    both_sinks: Option<i64>,
}

/// The legs, in order: name and the interval of a trace (ms).
type Leg = (&'static str, fn(&Trace) -> Option<i64>);

const LEGS: [Leg; 8] = [
    ("S3 → SQS (PUT → notification sent)", |t| {
        Some(t.sent? - t.put)
    }),
    ("SQS → ingest (poll + batching window)", |t| {
        Some(t.invoked? - t.sent?)
    }),
    ("… of which the batching window", |t| {
        Some(t.invoked? - t.received?)
    }),
    ("ingest (read, write, commit)", |t| {
        Some(t.committed? - t.invoked?)
    }),
    ("commit → process start", |t| {
        Some(t.process_start? - t.committed?)
    }),
    ("… of which commit → event on the process queue", |t| {
        Some(t.event? - t.committed?)
    }),
    ("process (start → both sinks committed)", |t| {
        Some(t.both_sinks? - t.process_start?)
    }),
    ("PUT → both sinks", |t| Some(t.both_sinks? - t.put)),
];

/// What one rate's run measured.
struct RateRun {
    rate: u32,
    traces: Vec<Trace>,
    /// When the last PUT was done.
    load_end: i64,
    /// Messages on the ingest queue then.
    queue_at_end: u64,
    commits: usize,
    invocations: usize,
    runs_with_output: usize,
    errors: Vec<String>,
    /// PUTs that failed three times (left out of the traces).
    failed_puts: Vec<String>,
}

impl RateRun {
    fn leg(&self, leg: &Leg) -> Vec<f64> {
        self.traces
            .iter()
            .filter_map(|t| (leg.1)(t))
            .map(|ms| ms as f64 / 1e3)
            .collect()
    }

    /// Objects not yet in both sinks when the load stopped.
    fn behind_at_end(&self) -> usize {
        self.traces
            .iter()
            .filter(|t| t.both_sinks.is_none_or(|b| b > self.load_end))
            .count()
    }

    /// From the end of the load until the last object was in both sinks (none: never).
    fn drain_secs(&self) -> Option<f64> {
        let last = self
            .traces
            .iter()
            .map(|t| t.both_sinks)
            .collect::<Option<Vec<i64>>>()?
            .into_iter()
            .max()?;
        Some(((last - self.load_end).max(0)) as f64 / 1e3)
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Runs every rate on a fresh stack under `dir` and prints the tables.
pub(crate) async fn run(dir: &std::path::Path, opts: Options) -> Result<()> {
    let mut done = Vec::new();
    for &rate in &opts.rates {
        let sub = dir.join(format!("rate-{rate}"));
        let _ = std::fs::remove_dir_all(&sub);
        // A rate the stack cannot run at all is reported, and the others still run.
        match run_rate(&sub, rate, &opts).await {
            Ok(r) => {
                if opts.rates.len() > 1 {
                    print(std::slice::from_ref(&r), &opts);
                }
                done.push(r);
            }
            Err(e) => println!("\n{rate} objects/s: the run failed: {e:#}"),
        }
    }
    print(&done, &opts);
    Ok(())
}

async fn run_rate(dir: &std::path::Path, rate: u32, opts: &Options) -> Result<RateRun> {
    let spinner = progress::spinner(format!("{rate} objects/s: starting the local stack"));
    let variant = crate::local::Variant {
        recompute: opts.recompute,
        sequential: opts.sequential,
        // Objects are traced to their commits from the tables' snapshots after the run, so
        // none may be expired meanwhile (a run is shorter than the 16-minute floor anyway).
        full_history: true,
    };
    let stack = Stack::start_with(0, &dir.display().to_string(), variant).await?;
    let rec: crate::local::Recorder = Arc::new(Mutex::new(Records::default()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let stack = Arc::new(stack);
    let workers = {
        let (stack, shape, rec) = (stack.clone(), opts.shape.clone(), rec.clone());
        tokio::spawn(async move { stack.run(&shape, Some(rec), stop_rx).await })
    };
    let puts: Arc<Mutex<HashMap<String, i64>>> = Arc::default();
    // Warm-up: one object through both pipelines (table and sinks created, workers warm).
    spinner.set_message(format!("{rate} objects/s: warm-up object"));
    put(&stack, "landing/orders/warmup.jsonl", 0, &Arc::default()).await?;
    let warm = format!("s3://{BUCKET}/landing/orders/warmup.jsonl");
    wait_until(
        &stack.config,
        &rec,
        Duration::from_secs(120),
        |traces| traces.get(&warm).is_some_and(|t| t.both_sinks.is_some()),
        &puts_with(&warm),
    )
    .await?;
    spinner.finish_and_clear();

    let total = rate as u64 * opts.seconds;
    let bar = progress::bar(total, format!("{rate} objects/s for {} s", opts.seconds));
    let period = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let t0 = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut failed_puts: Vec<String> = Vec::new();
    for i in 0..total {
        tokio::time::sleep_until(t0 + period * i as u32).await;
        let (stack, puts) = (stack.clone(), puts.clone());
        tasks.spawn(async move {
            let key = format!("landing/orders/o{i:07}.jsonl");
            put(&stack, &key, i + 1, &puts).await
        });
        bar.inc(1);
        while let Some(r) = tasks.try_join_next() {
            if let Err(e) = r.context("a PUT task panicked")? {
                failed_puts.push(format!("{e:#}"));
            }
        }
    }
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r.context("a PUT task panicked")? {
            failed_puts.push(format!("{e:#}"));
        }
    }
    let load_end = now_ms();
    bar.finish_and_clear();
    let queue_at_end = stack.ingest_backlog().await.unwrap_or(0);
    let spinner = progress::spinner(format!("{rate} objects/s: draining"));
    let all = puts.lock().map(|p| p.clone()).unwrap_or_default();
    let traces = wait_until(
        &stack.config,
        &rec,
        DRAIN_LIMIT,
        |traces| traces.values().all(|t| t.both_sinks.is_some()),
        &all,
    )
    .await?;
    spinner.finish_and_clear();
    let _ = stop_tx.send(true);
    workers.await.context("the stack panicked")??;
    let r = rec
        .lock()
        .map_err(|_| anyhow::anyhow!("recorder poisoned"))?;
    let mut snapshots: Vec<i64> = r.committed.iter().map(|(_, s)| *s).collect();
    snapshots.sort_unstable();
    snapshots.dedup();
    Ok(RateRun {
        rate,
        traces: traces.into_values().collect(),
        load_end,
        queue_at_end,
        commits: snapshots.len(),
        invocations: r.invocations.len(),
        runs_with_output: r.runs.iter().filter(|x| x.sink_snapshot.is_some()).count(),
        errors: r.errors.clone(),
        failed_puts,
    })
}

fn puts_with(uri: &str) -> HashMap<String, i64> {
    HashMap::from([(uri.to_string(), now_ms())])
}

/// PUTs one object of [`EVENTS_PER_OBJECT`] order events and records when the PUT started.
async fn put(
    stack: &Stack,
    key: &str,
    seed: u64,
    puts: &Arc<Mutex<HashMap<String, i64>>>,
) -> Result<()> {
    let body = floe::sample::orders_jsonl(EVENTS_PER_OBJECT, seed, chrono::Utc::now());
    let started = now_ms();
    // An emulator that falls behind times PUTs out: tried again (the object's time counts
    // from the first try), and an object that cannot be PUT is left out and counted.
    let mut tries = 0;
    loop {
        tries += 1;
        let sent = stack
            .s3
            .put_object()
            .bucket(BUCKET)
            .key(key)
            .body(body.clone().into_bytes().into())
            .send()
            .await;
        match sent {
            Ok(_) => break,
            Err(e) if tries >= 3 => {
                return Err(e).with_context(|| format!("PUT {key} ({tries} tries)"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    if let Ok(mut p) = puts.lock() {
        p.insert(format!("s3://{BUCKET}/{key}"), started);
    }
    Ok(())
}

/// Polls the tables every 250 ms until `done` holds for the traces of `puts` (or `limit`
/// passes); the traces.
async fn wait_until(
    config: &Config,
    rec: &crate::local::Recorder,
    limit: Duration,
    done: impl Fn(&HashMap<String, Trace>) -> bool,
    puts: &HashMap<String, i64>,
) -> Result<HashMap<String, Trace>> {
    let catalog = floe::catalog::connect(config).await?;
    let started = Instant::now();
    loop {
        let traces = traces(config, catalog.as_ref(), rec, puts).await?;
        if done(&traces) || started.elapsed() >= limit {
            return Ok(traces);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Each object's trace from the workers' records and the tables' snapshots: its commit
/// (timestamp, sequence number), and per pipeline the first sink commit whose checkpoint is at
/// or after it (main's history is linear: a checkpoint covers every commit up to its sequence
/// number).
async fn traces(
    config: &Config,
    catalog: &dyn iceberg::Catalog,
    rec: &crate::local::Recorder,
    puts: &HashMap<String, i64>,
) -> Result<HashMap<String, Trace>> {
    let load = |name: &str| -> Result<iceberg::TableIdent> {
        Ok(floe::catalog::table_ident(config, name)?)
    };
    let orders = load("orders")?;
    if !catalog.table_exists(&orders).await? {
        // Before the first ingest worker started: nothing is anywhere yet.
        return Ok(puts
            .iter()
            .map(|(uri, &put)| {
                let t = Trace {
                    put,
                    ..Trace::default()
                };
                (uri.clone(), t)
            })
            .collect());
    }
    let source = catalog.load_table(&orders).await?;
    let src = source.metadata();
    let mut sinks = Vec::new();
    for p in &config.pipelines {
        let ident = load(&p.sink)?;
        let md = match catalog.table_exists(&ident).await? {
            true => Some(catalog.load_table(&ident).await?.metadata().clone()),
            false => None,
        };
        sinks.push((p.name.clone(), md));
    }
    let r = rec
        .lock()
        .map_err(|_| anyhow::anyhow!("recorder poisoned"))?;
    let seq = |id: i64| src.snapshot_by_id(id).map(|s| s.sequence_number());
    // Per pipeline: (checkpoint sequence number, run start, sink commit time) of runs with output.
    let covering: Vec<Vec<(i64, i64, i64)>> = sinks
        .iter()
        .map(|(name, md)| {
            r.runs
                .iter()
                .filter(|run| &run.pipeline == name)
                .filter_map(|run| {
                    let sink_ts = md
                        .as_ref()?
                        .snapshot_by_id(run.sink_snapshot?)?
                        .timestamp_ms();
                    Some((seq(run.to_snapshot?)?, run.started_ms, sink_ts))
                })
                .collect()
        })
        .collect();
    let events: HashMap<i64, i64> = r.events.iter().map(|(s, at)| (*s, *at)).collect();
    let received: HashMap<&str, &crate::local::Received> =
        r.received.iter().map(|x| (x.uri.as_str(), x)).collect();
    let committed: HashMap<&str, i64> = r
        .committed
        .iter()
        .map(|(uri, s)| (uri.as_str(), *s))
        .collect();
    let mut out = HashMap::new();
    for (uri, &put) in puts {
        let mut t = Trace {
            put,
            ..Trace::default()
        };
        if let Some(x) = received.get(uri.as_str()) {
            t.sent = Some(x.sent_ms);
            t.received = Some(x.received_ms);
            t.invoked = Some(x.invoked_ms);
        }
        if let Some(snap) = committed.get(uri.as_str()) {
            t.committed = src.snapshot_by_id(*snap).map(|s| s.timestamp_ms());
            t.event = events.get(snap).copied();
            if let Some(c) = seq(*snap) {
                let firsts: Vec<Option<(i64, i64)>> = covering
                    .iter()
                    .map(|runs| {
                        runs.iter()
                            .filter(|(s, _, _)| *s >= c)
                            .map(|(_, start, ts)| (*ts, *start))
                            .min()
                    })
                    .collect();
                if let Some(all) = firsts.into_iter().collect::<Option<Vec<_>>>() {
                    t.process_start = all.iter().map(|(_, start)| *start).min();
                    t.both_sinks = all.iter().map(|(ts, _)| *ts).max();
                }
            }
        }
        out.insert(uri.clone(), t);
    }
    Ok(out)
}

fn print(runs: &[RateRun], opts: &Options) {
    let build = if cfg!(debug_assertions) {
        "debug build"
    } else {
        "release build"
    };
    let s = &opts.shape;
    println!(
        "\n## Freshness: objects of {EVENTS_PER_OBJECT} order events PUT for {} s, local stack (moto), {build}, {} core(s), aggregate {}{}\n",
        opts.seconds,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        if opts.recompute { "recomputed (merge = false)" } else { "merged" },
        if opts.sequential { ", process uncached and one pipeline at a time (--sequential)" } else { "" }
    );
    println!(
        "ingest: {} worker(s), batches of up to {} within {} ms; process: {} worker(s) taking the commit events waiting (up to 10), each pipeline they name once per round; legs in seconds\n",
        s.ingest_concurrency,
        s.batch_size,
        s.batch_window.as_millis(),
        s.process_concurrency
    );
    let heads: String = runs
        .iter()
        .map(|r| format!(" {0}/s p50 | {0}/s p95 | {0}/s p99 | {0}/s max |", r.rate))
        .collect();
    println!("| leg |{heads}");
    println!("|---|{}", "---:|".repeat(4 * runs.len()));
    for leg in &LEGS {
        let cells: String = runs
            .iter()
            .map(|r| {
                let v = r.leg(leg);
                format!(
                    " {:.2} | {:.2} | {:.2} | {:.2} |",
                    pct(&v, 0.5),
                    pct(&v, 0.95),
                    pct(&v, 0.99),
                    pct(&v, 1.0)
                )
            })
            .collect();
        println!("| {} |{cells}", leg.0);
    }
    println!();
    println!("| run | objects | in both sinks | ingest invocations | commits | objects/commit | pipeline runs with output | behind when the load stopped | ingest queue then | caught up after | errors | PUTs failed |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let covered = r.traces.iter().filter(|t| t.both_sinks.is_some()).count();
        println!(
            "| {}/s | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            r.rate,
            r.traces.len(),
            covered,
            r.invocations,
            r.commits,
            r.traces.len() as f64 / r.commits.max(1) as f64,
            r.runs_with_output,
            r.behind_at_end(),
            r.queue_at_end,
            r.drain_secs()
                .map_or("never (within 120 s)".to_string(), |d| format!("{d:.1} s")),
            r.errors.len(),
            r.failed_puts.len()
        );
    }
    println!();
    for r in runs {
        let total = r.leg(&LEGS[LEGS.len() - 1]);
        let (p50, p99) = (pct(&total, 0.5), pct(&total, 0.99));
        let caught_up = r.drain_secs().is_some_and(|d| d <= 2.0);
        let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
        if r.rate <= 10 {
            println!(
                "{}/s: PUT → both sinks p50 {p50:.2} s (target < 0.7 s: {}), p99 {p99:.2} s (target < 2 s: {}), caught up within 2 s of the load's end: {}",
                r.rate,
                verdict(p50 < 0.7),
                verdict(p99 < 2.0),
                verdict(caught_up)
            );
        } else {
            println!(
                "{}/s: PUT → both sinks p50 {p50:.2} s, p99 {p99:.2} s (target < 5 s: {}), caught up within 2 s of the load's end: {}",
                r.rate,
                verdict(p99 < 5.0),
                verdict(caught_up)
            );
        }
        for e in r.errors.iter().chain(&r.failed_puts).take(3) {
            println!("  error: {e}");
        }
    }
}
