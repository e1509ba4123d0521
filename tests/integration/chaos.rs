//! Faults below floe's code (#15): `infra/fault_proxy.py` between floe and moto injects refused
//! connections, throttling, 5xx, resets in the middle of a body and, above all, **lost answers**:
//! the request takes effect upstream (a Glue `UpdateTable` moves the pointer, an S3 PUT stores the
//! object) and the answer never arrives (dropped connection or 500). The AWS SDK, opendal and
//! floe's own retries all react to these faults as they would on AWS.
//!
//! Each round puts objects straight into moto, delivers every object twice (8 deliveries at a
//! time, each on its own `Ingestor` like separate Lambdas; a failed delivery is received again,
//! like SQS, up to `RECEIVES` times) while the pipelines and maintenance (compaction, expiration,
//! manifest rewrite) run beside them, all through the proxy. Then, with the proxy off, it checks:
//! no row lost or duplicated (rows and an order-independent checksum against what was put), every
//! table loads and every file any snapshot references exists, PyIceberg reads every table, each
//! pipeline reconciles with its batch result, and nothing valid was quarantined.
//!
//! Short by default (3 rounds, < 3 min); `FLOE_CHAOS_ROUNDS=50` for a long run,
//! `FLOE_CHAOS_SEED` to vary the faults, `FLOE_CHAOS_OBJECTS` objects per round.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floe::config::Config;
use floe::event::ObjectRef;
use floe::ingest::{Ingestor, ObjectReport, Status};
use floe::maintain::{Maintainer, Options};
use floe::process::Processor;
use iceberg::table::Table;
use serde_json::{json, Value};

use crate::harness::{moto, orders, python, repo_root, TestEnv};

const APPEND: &str = "suspicious_orders";
const AGG: &str = "revenue_per_region_minute";
/// Deliveries of each object per round (S3 and SQS deliver at least once).
const DELIVERIES: usize = 2;
/// Deliveries in flight at once.
const CONCURRENCY: usize = 8;
/// Receives of one delivery before it goes to the dead-letter queue (SQS maxReceiveCount).
const RECEIVES: u32 = 8;
const ROWS: usize = 40;

/// `infra/fault_proxy.py` in front of `upstream`, for one test; it exits with the test process.
pub(crate) struct FaultProxy {
    pub url: String,
    addr: String,
}

impl FaultProxy {
    // The proxy watches our pid and exits with the test process; a thread reaps it meanwhile.
    #[allow(clippy::zombie_processes)]
    pub fn start(upstream: &str, dir: &std::path::Path) -> Self {
        let port_file = dir.join("fault_proxy.port");
        let log = std::fs::File::create(dir.join("fault_proxy.log")).expect("proxy log");
        let mut child = Command::new(python())
            .arg(repo_root().join("infra/fault_proxy.py"))
            .args(["--upstream", upstream, "--port", "0", "--port-file"])
            .arg(&port_file)
            .args(["--parent-pid", &std::process::id().to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start infra/fault_proxy.py");
        let start = Instant::now();
        loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                if !p.is_empty() {
                    std::thread::spawn(move || child.wait());
                    let addr = format!("127.0.0.1:{}", p.trim());
                    return Self {
                        url: format!("http://{addr}"),
                        addr,
                    };
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "fault proxy did not start: see {}/fault_proxy.log",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET /__faults` (no body) or `POST /__faults` (a config): the config and the counts.
    fn admin(&self, body: Option<&Value>) -> Value {
        let mut s = std::net::TcpStream::connect(&self.addr).expect("connect to the proxy");
        let req = match body {
            Some(b) => {
                let b = b.to_string();
                format!(
                    "POST /__faults HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                    b.len()
                )
            }
            None => "GET /__faults HTTP/1.0\r\n\r\n".to_string(),
        };
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").expect("HTTP answer");
        assert!(
            head.starts_with("HTTP/1.") && head.contains(" 200 "),
            "{out}"
        );
        serde_json::from_str(body).expect("proxy JSON")
    }

    pub fn configure(&self, cfg: Value) -> Value {
        self.admin(Some(&cfg))
    }

    pub fn counts(&self) -> Value {
        self.admin(None)
    }

    pub fn set_enabled(&self, on: bool) {
        self.configure(json!({ "enabled": on }));
    }
}

/// The faults of the default run. Lost answers hit the commit points (Glue `UpdateTable` and
/// `CreateTable`) hardest; every S3 and Glue request kind gets some of everything else.
fn faults(seed: u64) -> Value {
    json!({
        "enabled": true,
        "seed": seed,
        "reset_counts": true,
        "faults": {
            "refuse":      {"rate": 0.01, "kinds": ["*"]},
            "throttle":    {"rate": 0.02, "kinds": ["*"]},
            "error500":    {"rate": 0.01, "kinds": ["*"]},
            "reset_body":  {"rate": 0.03, "kinds": ["s3:GET"]},
            "lost_answer": {"rates": {"glue:UpdateTable": 0.6, "glue:CreateTable": 0.5,
                                      "s3:PUT": 0.02}, "mode": "mixed"}
        }
    })
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn short(e: impl std::fmt::Display) -> String {
    let s = e.to_string().replace('\n', " ");
    if s.chars().count() > 220 {
        format!("{}…", s.chars().take(220).collect::<String>())
    } else {
        s
    }
}

/// What happened around floe (errors are expected under faults; counted, a few kept as examples).
#[derive(Debug, Default)]
struct Tally {
    deliveries: usize,
    receives: usize,
    committed: usize,
    duplicate: usize,
    other_status: Vec<String>,
    dead_lettered: usize,
    redriven: usize,
    records_quarantined: u64,
    snapshot_mismatch: usize,
    errors: BTreeMap<&'static str, usize>,
    examples: BTreeMap<String, usize>,
    process_runs: usize,
    maintain_runs: usize,
}

impl Tally {
    fn error(&mut self, site: &'static str, e: impl std::fmt::Display) {
        *self.errors.entry(site).or_default() += 1;
        let text = format!("{site}: {}", short(e));
        let key: String = text.chars().take(90).collect();
        if let Some((_, n)) = self.examples.iter_mut().find(|(k, _)| k.starts_with(&key)) {
            *n += 1;
        } else if self.examples.len() < 40 {
            self.examples.insert(text, 1);
        }
    }
}

type Shared = Arc<Mutex<Tally>>;

/// One delivery of one object: received again after each failure, up to `RECEIVES` times.
async fn deliver(config: Config, obj: ObjectRef, tally: Shared) -> Option<ObjectReport> {
    let mut ingestor: Option<Ingestor> = None;
    for receive in 0..RECEIVES {
        if receive > 0 {
            // The visibility timeout, shortened.
            tokio::time::sleep(Duration::from_millis(100 * receive as u64)).await;
        }
        tally.lock().unwrap().receives += 1;
        if ingestor.is_none() {
            match Ingestor::new(config.clone()).await {
                Ok(i) => ingestor = Some(i),
                Err(e) => {
                    tally.lock().unwrap().error("ingestor start", e);
                    continue;
                }
            }
        }
        let i = ingestor.as_ref().unwrap();
        match i
            .ingest(&obj, Instant::now() + Duration::from_secs(90))
            .await
        {
            Ok(r) => return Some(r),
            Err(e) => tally.lock().unwrap().error("ingest", e),
        }
    }
    None
}

/// The pause between two runs of a side loop: longer after a failure (the next trigger).
async fn pause(failed: bool, millis: u64) {
    let millis = if failed { millis * 4 } else { millis };
    tokio::time::sleep(Duration::from_millis(millis)).await;
}

/// The pipelines, again and again until `stop` (like commit events waking the process Lambda).
async fn process_loop(config: Config, stop: Arc<AtomicBool>, tally: Shared) {
    let mut processor = None;
    while !stop.load(Ordering::SeqCst) {
        if processor.is_none() {
            match Processor::new(config.clone()).await {
                Ok(p) => processor = Some(p),
                Err(e) => tally.lock().unwrap().error("processor start", e),
            }
        }
        let mut failed = processor.is_none();
        if let Some(p) = &processor {
            for name in [APPEND, AGG] {
                let r = p.run(name, Instant::now() + Duration::from_secs(60)).await;
                let mut t = tally.lock().unwrap();
                t.process_runs += 1;
                if let Err(e) = r {
                    failed = true;
                    t.error("process", e);
                }
            }
        }
        pause(failed, 150).await;
    }
}

/// Compaction, expiration (of earlier rounds' snapshots) and manifest rewrite until `stop`.
async fn maintain_loop(config: Config, stop: Arc<AtomicBool>, round_start: Instant, tally: Shared) {
    let mut maintainer = None;
    while !stop.load(Ordering::SeqCst) {
        let mut failed = false;
        if maintainer.is_none() {
            match Maintainer::new(config.clone()).await {
                Ok(m) => maintainer = Some(m),
                Err(e) => {
                    failed = true;
                    tally.lock().unwrap().error("maintainer start", e)
                }
            }
        }
        if let Some(m) = &maintainer {
            // Snapshots of this round stay (redeliveries of its objects must find them); older
            // ones may go, except what the pipelines' checkpoints need.
            let keep = round_start.elapsed() + Duration::from_secs(5);
            let opts = Options {
                compact: true,
                expire: true,
                orphans: false,
                rewrite_manifests: true,
                target_file_bytes: Some(64 << 20),
                min_input_files: 3,
                manifest_threshold: 4,
                expire_older_than: Some(keep),
                dedup_window: keep,
                retain_last: Some(2),
                deadline: Instant::now() + Duration::from_secs(60),
                ..Options::default()
            };
            for table in ["orders", APPEND] {
                let r = m.run(table, &opts).await;
                let mut t = tally.lock().unwrap();
                t.maintain_runs += 1;
                if let Err(e) = r {
                    failed = true;
                    t.error("maintain", e);
                }
            }
        }
        pause(failed, 300).await;
    }
}

/// The invariants after a round, checked without the proxy.
#[derive(Debug, Default)]
struct Check {
    rows_expected: usize,
    rows_found: usize,
    lost: usize,
    duplicates: usize,
    sum_ok: bool,
    unreadable: Vec<String>,
    missing_files: Vec<String>,
    pyiceberg: Vec<String>,
    reconcile: Vec<String>,
    stuck: Vec<String>,
    quarantine_objects: usize,
}

impl Check {
    fn violations(&self, records_quarantined: u64) -> Vec<String> {
        let mut v = Vec::new();
        if self.lost > 0 {
            v.push(format!("{} rows lost", self.lost));
        }
        if self.duplicates > 0 {
            v.push(format!("{} duplicate rows", self.duplicates));
        }
        if self.rows_found != self.rows_expected || !self.sum_ok {
            v.push(format!(
                "rows {} (expected {}), checksum {}",
                self.rows_found,
                self.rows_expected,
                if self.sum_ok { "equal" } else { "differs" }
            ));
        }
        for (what, list) in [
            ("unreadable table", &self.unreadable),
            ("missing file", &self.missing_files),
            ("PyIceberg", &self.pyiceberg),
            ("reconcile", &self.reconcile),
            ("healthy run failed", &self.stuck),
        ] {
            v.extend(list.iter().map(|m| format!("{what}: {m}")));
        }
        if self.quarantine_objects > 0 || records_quarantined > 0 {
            v.push(format!(
                "valid records quarantined: {records_quarantined} records, {} objects",
                self.quarantine_objects
            ));
        }
        v
    }
}

/// Every file a snapshot of `table` references (manifest lists, manifests, live data files) that
/// does not exist or cannot be read.
async fn missing_files(table: &Table) -> Vec<String> {
    let io = table.file_io();
    let mut seen = HashSet::new();
    let mut missing = Vec::new();
    for s in table.metadata().snapshots() {
        if !seen.insert(s.manifest_list().to_string()) {
            continue;
        }
        let Ok(list) = table.manifest_list_reader(s).load().await else {
            missing.push(format!("manifest list {}", s.manifest_list()));
            continue;
        };
        for mf in list.entries() {
            if !seen.insert(mf.manifest_path.clone()) {
                continue;
            }
            let Ok(m) = mf.load_manifest(io).await else {
                missing.push(format!("manifest {}", mf.manifest_path));
                continue;
            };
            for e in m.entries().iter().filter(|e| e.is_alive()) {
                let p = e.data_file().file_path().to_string();
                if seen.insert(p.clone()) && !io.exists(&p).await.unwrap_or(false) {
                    missing.push(format!("data file {p}"));
                }
            }
        }
    }
    missing
}

/// (rows, customer_id sum, order ids) of `orders` by a full scan; an error if it cannot be read.
async fn scan_orders(table: &Table) -> Result<(usize, i64, Vec<String>), String> {
    use arrow::array::{Array, Int64Array, StringArray};
    use futures::TryStreamExt;
    if table.metadata().current_snapshot().is_none() {
        return Ok((0, 0, Vec::new()));
    }
    let batches: Vec<_> = table
        .scan()
        .build()
        .map_err(short)?
        .to_arrow()
        .await
        .map_err(short)?
        .try_collect()
        .await
        .map_err(short)?;
    let (mut rows, mut sum, mut ids) = (0, 0i64, Vec::new());
    for b in &batches {
        rows += b.num_rows();
        let c = b.column_by_name("customer_id").unwrap();
        sum += c
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .iter()
            .flatten()
            .sum::<i64>();
        let o = b.column_by_name("order_id").unwrap();
        let o = o.as_any().downcast_ref::<StringArray>().unwrap();
        ids.extend(o.iter().flatten().map(str::to_string));
    }
    Ok((rows, sum, ids))
}

/// PyIceberg's report on a table (Glue on moto, no proxy), or why it could not read it.
fn pyiceberg(env: &TestEnv, table: &str) -> Result<Value, String> {
    let mut cmd = Command::new(python());
    cmd.arg(repo_root().join("infra/pyiceberg_check.py"))
        .args([
            "--catalog",
            if env.catalog_kind == "glue" {
                "glue"
            } else {
                "sqlite"
            },
        ])
        .arg("--table")
        .arg(format!("{}.{table}", env.namespace))
        .args(["--endpoint", moto()]);
    if env.catalog_kind != "glue" {
        cmd.args([
            "--uri",
            &format!("sqlite:///{}/catalog.db", env.dir.display()),
            "--warehouse",
            &format!("s3://{}/warehouse", env.bucket),
        ]);
    }
    let out = cmd.output().map_err(short)?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(short(last));
    }
    serde_json::from_slice(&out.stdout).map_err(short)
}

struct Expected {
    rows: usize,
    sum: i64,
    ids: HashSet<String>,
}

async fn check(env: &TestEnv, expected: &Expected) -> Check {
    let mut c = Check {
        rows_expected: expected.rows,
        ..Check::default()
    };
    // Healthy runs (no proxy): the pipelines catch up; a table floe broke shows up here too.
    match Processor::new(env.config.clone()).await {
        Ok(p) => {
            for name in [APPEND, AGG] {
                if let Err(e) = p.run(name, Instant::now() + Duration::from_secs(60)).await {
                    c.stuck.push(format!("{name}: {}", short(e)));
                }
                match p.reconcile(name).await {
                    Ok(r) if r.matches() => {}
                    Ok(r) => c.reconcile.push(format!(
                        "{name}: batch {} rows, sink {} rows, {} keys differ {:?}",
                        r.batch_rows,
                        r.sink_rows,
                        r.differing,
                        r.differences.iter().take(3).collect::<Vec<_>>()
                    )),
                    Err(e) => c.reconcile.push(format!("{name}: {}", short(e))),
                }
            }
        }
        Err(e) => c.stuck.push(format!("processor: {}", short(e))),
    }
    let catalog = floe::catalog::connect(&env.config).await.expect("catalog");
    for name in ["orders", "orders_consumer", APPEND, AGG] {
        let ident = floe::catalog::table_ident(&env.config, name).unwrap();
        let table = match catalog.load_table(&ident).await {
            Ok(t) => t,
            Err(e) => {
                c.unreadable.push(format!("{name}: {}", short(e)));
                continue;
            }
        };
        c.missing_files.extend(
            missing_files(&table)
                .await
                .into_iter()
                .map(|m| format!("{name}: {m}")),
        );
        if name == "orders" {
            match scan_orders(&table).await {
                Ok((rows, sum, ids)) => {
                    let distinct: HashSet<&String> = ids.iter().collect();
                    c.rows_found = rows;
                    c.duplicates = rows - distinct.len();
                    c.lost = expected
                        .ids
                        .iter()
                        .filter(|id| !distinct.contains(id))
                        .count();
                    c.sum_ok = sum == expected.sum;
                }
                Err(e) => c.unreadable.push(format!("{name} (scan): {e}")),
            }
        }
        match pyiceberg(env, name) {
            Ok(py) if name == "orders" && py["rows"] != json!(expected.rows) => {
                c.pyiceberg.push(format!(
                    "orders: {} rows, {} distinct",
                    py["rows"], py["distinct_order_ids"]
                ))
            }
            Ok(_) => {}
            Err(e) => c.pyiceberg.push(format!("{name}: {e}")),
        }
    }
    c.quarantine_objects = env.keys("quarantine/").await.len();
    c
}

/// The round's lines of the report.
fn print_report(rounds: &[(usize, Check, u64)], tally: &Tally, counts: &Value, secs: f64) {
    let injected = &counts["injected"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let lost_effective = |kind: &str| n(&counts["effective"][kind]);
    eprintln!("\n=== chaos: faults below floe ({secs:.0} s) ===");
    eprintln!(
        "requests through the proxy: {} ({})",
        n(&counts["requests_total"]),
        counts["requests"]
            .as_object()
            .map(|m| {
                let mut v: Vec<_> = m.iter().map(|(k, c)| (n(c), k.clone())).collect();
                v.sort_by(|a, b| b.cmp(a));
                v.iter()
                    .map(|(c, k)| format!("{k} {c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    );
    eprintln!("{:<28} {:>8}  by kind", "fault", "injected");
    for f in [
        "refuse",
        "throttle",
        "error500",
        "reset_body",
        "lost_answer",
    ] {
        let by_kind = injected[f]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, c)| format!("{k} {c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        eprintln!("{f:<28} {:>8}  {by_kind}", n(&counts["injected_totals"][f]));
    }
    eprintln!(
        "{:<28} {:>8}",
        "lost UpdateTable (landed)",
        lost_effective("glue:UpdateTable")
    );
    eprintln!(
        "{:<28} {:>8}",
        "lost CreateTable (landed)",
        lost_effective("glue:CreateTable")
    );
    eprintln!(
        "{:<28} {:>8}",
        "lost S3 PUT (landed)",
        lost_effective("s3:PUT")
    );
    eprintln!(
        "deliveries {} (receives {}): committed {}, duplicate {}, dead-lettered {} (redriven {}), \
         other {:?}; snapshot ids differing between deliveries of one object: {}",
        tally.deliveries,
        tally.receives,
        tally.committed,
        tally.duplicate,
        tally.dead_lettered,
        tally.redriven,
        tally.other_status,
        tally.snapshot_mismatch
    );
    eprintln!(
        "pipeline runs {}, maintenance runs {}; errors retried: {:?}",
        tally.process_runs, tally.maintain_runs, tally.errors
    );
    for (e, c) in tally.examples.iter().take(25) {
        eprintln!("  {c:>3}× {e}");
    }
    eprintln!(
        "{:>5} {:>9} {:>9} {:>6} {:>10} {:>10} {:>8} {:>9} {:>9} {:>11}",
        "round",
        "expected",
        "found",
        "lost",
        "duplicates",
        "unreadable",
        "missing",
        "pyiceberg",
        "reconcile",
        "quarantined"
    );
    for (r, c, q) in rounds {
        eprintln!(
            "{:>5} {:>9} {:>9} {:>6} {:>10} {:>10} {:>8} {:>9} {:>9} {:>11}",
            r,
            c.rows_expected,
            c.rows_found,
            c.lost,
            c.duplicates,
            c.unreadable.len(),
            c.missing_files.len(),
            c.pyiceberg.len(),
            c.reconcile.len() + c.stuck.len(),
            q
        );
        for v in c.violations(*q) {
            eprintln!("      ✗ {v}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_faults_below_floe_lose_and_duplicate_nothing() {
    chaos("glue").await;
}

/// The same rounds on the SQLite catalog: faults below floe on the object store only (the
/// catalog is a local file), at every site that reads, writes or deletes objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_object_store_faults_on_the_sqlite_catalog() {
    chaos("sqlite").await;
}

async fn chaos(kind: &'static str) {
    let rounds = env_num("FLOE_CHAOS_ROUNDS", 3) as usize;
    let per_round = env_num("FLOE_CHAOS_OBJECTS", 8) as usize;
    let seed = env_num("FLOE_CHAOS_SEED", 15);
    let started = Instant::now();
    let env = TestEnv::with_pipelines(kind, "").await;
    let proxy = FaultProxy::start(moto(), &env.dir);
    // floe talks to S3 (and Glue) through the proxy; the test puts and checks directly on moto.
    let mut config = env.config.clone();
    if kind == "glue" {
        config.catalog.uri = Some(proxy.url.clone());
    }
    config.storage.endpoint = Some(proxy.url.clone());
    proxy.configure(faults(seed));

    let tally: Shared = Arc::default();
    let mut expected = Expected {
        rows: 0,
        sum: 0,
        ids: HashSet::new(),
    };
    let mut rng = floe::sample::Rng::new(seed);
    let mut results: Vec<(usize, Check, u64)> = Vec::new();
    let mut failed = false;
    for round in 1..=rounds {
        let round_start = Instant::now();
        let mut keys = Vec::new();
        for i in 0..per_round {
            let key = format!("orders/chaos-{round}-{i}.jsonl");
            let text = orders(ROWS, 10_000 * seed + 100 * round as u64 + i as u64);
            for l in text.lines() {
                let v: Value = serde_json::from_str(l).unwrap();
                expected.rows += 1;
                expected.sum += v["customer_id"].as_i64().unwrap();
                expected
                    .ids
                    .insert(v["order_id"].as_str().unwrap().to_string());
            }
            env.put(&key, text).await;
            keys.push(key);
        }
        proxy.set_enabled(true);
        let stop = Arc::new(AtomicBool::new(false));
        let side = [
            tokio::spawn(process_loop(config.clone(), stop.clone(), tally.clone())),
            tokio::spawn(maintain_loop(
                config.clone(),
                stop.clone(),
                round_start,
                tally.clone(),
            )),
        ];
        // Every object twice, in a shuffled order, 8 deliveries in flight.
        let mut order: Vec<&String> = keys.iter().cycle().take(keys.len() * DELIVERIES).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let sem = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
        let mut tasks = Vec::new();
        for key in order {
            let permit = sem.clone().acquire_owned().await.unwrap();
            let (config, obj, tally) = (config.clone(), env.object(key), tally.clone());
            tasks.push(tokio::spawn(async move {
                let r = deliver(config, obj.clone(), tally).await;
                drop(permit);
                (obj, r)
            }));
        }
        let mut done: BTreeMap<String, Vec<ObjectReport>> = BTreeMap::new();
        let mut dead = Vec::new();
        for t in tasks {
            let (obj, r) = t.await.expect("delivery task");
            let mut tl = tally.lock().unwrap();
            tl.deliveries += 1;
            match r {
                Some(r) => {
                    match r.status {
                        Status::Committed => tl.committed += 1,
                        Status::Duplicate => tl.duplicate += 1,
                        other => tl.other_status.push(format!("{}: {other:?}", r.object)),
                    }
                    tl.records_quarantined += r.records_quarantined;
                    done.entry(obj.key.clone()).or_default().push(r);
                }
                None => {
                    tl.dead_lettered += 1;
                    dead.push(obj);
                }
            }
        }
        stop.store(true, Ordering::SeqCst);
        for s in side {
            s.await.expect("side task");
        }
        proxy.set_enabled(false);
        // The dead-letter queue is redriven once the weather is fine, for objects no delivery
        // got in.
        for obj in dead {
            if done.contains_key(&obj.key) {
                continue;
            }
            tally.lock().unwrap().redriven += 1;
            match deliver(env.config.clone(), obj.clone(), tally.clone()).await {
                Some(r) => done.entry(obj.key.clone()).or_default().push(r),
                None => tally.lock().unwrap().error("redrive", "gave up"),
            }
        }
        {
            let mut tl = tally.lock().unwrap();
            for reports in done.values() {
                let ids: HashSet<_> = reports.iter().map(|r| r.snapshot_id).collect();
                if ids.len() > 1 {
                    tl.snapshot_mismatch += 1;
                }
            }
        }
        let c = check(&env, &expected).await;
        let q = tally.lock().unwrap().records_quarantined;
        let bad = !c.violations(q).is_empty();
        eprintln!(
            "round {round}/{rounds}: {} rows expected, {} found, {:.1} s{}",
            c.rows_expected,
            c.rows_found,
            round_start.elapsed().as_secs_f64(),
            if bad { " — INVARIANTS BROKEN" } else { "" }
        );
        results.push((round, c, q));
        if bad {
            failed = true;
            break;
        }
    }
    let counts = proxy.counts();
    let tally = tally.lock().unwrap();
    print_report(&results, &tally, &counts, started.elapsed().as_secs_f64());
    let (_, last, q) = results.last().unwrap();
    assert!(
        !failed,
        "invariants broken under faults: {:?}",
        last.violations(*q)
    );
    if kind == "glue" {
        let lost_commits = counts["effective"]["glue:UpdateTable"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            lost_commits >= 10,
            "too few lost commit answers injected to mean anything: {lost_commits}"
        );
    } else {
        let lost_puts = counts["effective"]["s3:PUT"].as_u64().unwrap_or(0);
        assert!(
            lost_puts >= 1,
            "no lost S3 PUT answer was injected: {counts}"
        );
    }
}

/// A server that takes a request and then goes silent: Glue's `GetTable` (a read, through
/// iceberg's own Glue client) and `UpdateTable` (the commit, which takes effect) each get no
/// answer for ten minutes. floe gives up on each after `request_timeout_seconds` (the catalog
/// read after four times that), reads back what landed, and the object is in the table once;
/// before, the ingest waited for the silence to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_catalog_times_out_and_the_commit_is_read_back() {
    let env = TestEnv::new("glue").await;
    let proxy = FaultProxy::start(moto(), &env.dir);
    let mut config = env.config.clone();
    config.catalog.uri = Some(proxy.url.clone());
    config.storage.endpoint = Some(proxy.url.clone());
    config.storage.request_timeout_seconds = Some(2);
    let key = "orders/silent.jsonl";
    env.put(key, orders(20, 77)).await;
    let ingestor = Ingestor::new(config).await.unwrap();
    proxy.configure(json!({
        "enabled": true,
        "reset_counts": true,
        "faults": {"stall": {"rates": {"glue:GetTable": 1.0, "glue:UpdateTable": 1.0},
                             "max": 2, "seconds": 600}}
    }));
    let started = Instant::now();
    // Each delivery bounded: a hang is the failure this test is about. A delivery failing
    // retryably (the silent read) is received again, as SQS would.
    let mut outcome = None;
    for _ in 0..3 {
        let delivery = tokio::time::timeout(
            Duration::from_secs(120),
            ingestor.ingest(&env.object(key), Instant::now() + Duration::from_secs(90)),
        )
        .await
        .expect("an ingest still waiting on a silent server after 120 s");
        match delivery {
            Ok(r) => {
                outcome = Some(r);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "a silent server is transient: {e}"),
        }
    }
    let r = outcome.expect("committed within three deliveries");
    assert!(
        matches!(r.status, Status::Committed | Status::Duplicate),
        "{r:?}"
    );
    let counts = proxy.counts();
    assert_eq!(
        counts["injected_totals"]["stall"], 2,
        "both silences happened: {counts}"
    );
    proxy.set_enabled(false);
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let (rows, _, distinct) = env.checksum(catalog.as_ref()).await;
    assert_eq!((rows, distinct), (20, 20), "once, whole");
    eprintln!(
        "silent catalog: settled in {:.1}s",
        started.elapsed().as_secs_f64()
    );
}
