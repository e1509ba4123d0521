//! `floe process refresh` in bounded chunks (#11): a table ten times the chunk budget refreshes
//! to exactly the one-shot result; a refresh cut off by its deadline is continued by the next
//! call or incremental run from the position in the sink's summary; a chunk whose commit landed
//! with its answer lost is neither re-applied nor skipped; a refresh whose target snapshot was
//! expired (or whose transform changed) starts over and says why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use floe::process::{Processor, RefreshProgress, RunReport};
use floe::snapshot::Change;
use floe::ErrorKind;
use iceberg::spec::Operation;

use crate::faults::{faulty, race_before_each_commit, race_before_swap, EachRace, Fault, Race};
use crate::harness::TestEnv;

const APPEND: &str = "suspicious_orders";
const AGG: &str = "revenue_per_region_minute";
/// Source rows one chunk may read in these tests: the tables hold ten times more.
const BUDGET: u64 = 100;

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

fn progress(r: &RunReport) -> &RefreshProgress {
    r.refresh_progress
        .as_ref()
        .unwrap_or_else(|| panic!("a refresh reports its progress: {r:?}"))
}

/// A test world whose refreshes read at most [`BUDGET`] source rows per chunk.
async fn env() -> TestEnv {
    let mut env = TestEnv::with_pipelines("sqlite", "").await;
    env.config.process.refresh_chunk_rows = BUDGET;
    env
}

/// `objects` objects of `rows` orders each, object `i` two minutes × `i` late: the table's rows
/// spread over ~2 × `objects` one-minute windows, one file per object.
async fn load(env: &TestEnv, objects: u64, rows: usize, tag: &str) -> usize {
    let ingestor = env.ingestor().await;
    let base = chrono::Utc::now();
    for i in 0..objects {
        let key = format!("orders/{tag}-{i}.jsonl");
        let text = floe::sample::late_orders_jsonl(rows, 1000 + i, base, i as i64 * 120);
        env.put(&key, text).await;
        env.ingest(&ingestor, &key).await.unwrap();
    }
    objects as usize * rows
}

/// A processor like `env`'s with another chunk budget.
async fn with_budget(env: &TestEnv, rows: u64) -> Processor {
    let mut config = env.config.clone();
    config.process.refresh_chunk_rows = rows;
    Processor::new(config).await.unwrap()
}

async fn sink(p: &Processor, env: &TestEnv, name: &str) -> iceberg::table::Table {
    let ident = floe::catalog::table_ident(&env.config, name).unwrap();
    p.committer().load(&ident).await.unwrap()
}

/// The sink's rows as sorted text (columns by name, floats to 6 places).
async fn sink_rows(p: &Processor, env: &TestEnv, name: &str) -> Vec<String> {
    use arrow::array::{Array, Float64Array};
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    use futures::TryStreamExt;
    let t = sink(p, env, name).await;
    if t.metadata().current_snapshot().is_none() {
        return Vec::new();
    }
    let batches: Vec<arrow::array::RecordBatch> = t
        .scan()
        .build()
        .unwrap()
        .to_arrow()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut rows = Vec::new();
    let opts = FormatOptions::default().with_null("NULL");
    for b in &batches {
        let schema = b.schema();
        let mut names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        names.sort();
        for i in 0..b.num_rows() {
            let cells: Vec<String> = names
                .iter()
                .map(|n| {
                    let c = b.column_by_name(n).unwrap();
                    match c.as_any().downcast_ref::<Float64Array>() {
                        Some(f) if f.is_valid(i) => format!("{:.6}", f.value(i)),
                        _ => ArrayFormatter::try_new(c.as_ref(), &opts)
                            .unwrap()
                            .value(i)
                            .to_string(),
                    }
                })
                .collect();
            rows.push(format!("{n}: {}", cells.join("|"), n = names.join(",")));
        }
    }
    rows.sort();
    rows
}

/// (rows, distinct order ids) of a sink.
async fn orders_in(p: &Processor, env: &TestEnv, name: &str) -> (usize, usize) {
    use arrow::array::StringArray;
    use futures::TryStreamExt;
    let t = sink(p, env, name).await;
    let batches: Vec<arrow::array::RecordBatch> = t
        .scan()
        .build()
        .unwrap()
        .to_arrow()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut ids = std::collections::HashSet::new();
    let mut rows = 0;
    for b in &batches {
        rows += b.num_rows();
        let o = b.column_by_name("order_id").unwrap();
        let o = o.as_any().downcast_ref::<StringArray>().unwrap();
        ids.extend(o.iter().flatten().map(str::to_string));
    }
    (rows, ids.len())
}

async fn assert_reconciled(p: &Processor, name: &str) {
    let r = p.reconcile(name).await.expect("reconcile");
    assert!(
        r.matches() && r.batch_rows > 0,
        "{name}: batch {} rows, sink {} rows, {} differing: {:?}",
        r.batch_rows,
        r.sink_rows,
        r.differing,
        r.differences
    );
}

/// Removes one source data file in an `overwrite` snapshot (as another engine's delete would):
/// the sink then holds windows and rows the source no longer has. Returns its record count.
async fn remove_a_source_file(env: &TestEnv, p: &Processor) -> usize {
    let committer = p.committer();
    let table = committer.load(&env.ident()).await.unwrap();
    let victim = floe::scan::live_files(&table).await.unwrap()[0]
        .file
        .clone();
    let mut change = Change::append(Vec::new(), Default::default());
    change.operation = Operation::Overwrite;
    change.removed = vec![victim.file_path().to_string()];
    committer
        .commit(&env.ident(), &limits(), move |_| {
            Ok(floe::commit::Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
    victim.record_count() as usize
}

fn limits() -> floe::commit::CommitLimits {
    floe::commit::CommitLimits {
        max_attempts: 10,
        deadline: soon(),
        skew: Duration::from_secs(900),
    }
}

/// The bounded-memory claim: with a chunk budget a tenth of the table, every chunk reads at
/// most about its budget (rows spread unevenly within a file's time range can exceed the
/// even-spread estimate a little), every source row is read exactly once over all chunks, and
/// the sink ends equal to the one-shot refresh — stale windows (rows the source no longer has)
/// removed — and to the batch result.
#[tokio::test]
async fn aggregate_refresh_in_chunks_of_a_tenth_of_the_table_equals_the_one_shot() {
    let env = env().await;
    let loaded = load(&env, 20, 60, "agg").await;
    let p = env.processor().await;
    p.run(AGG, soon()).await.unwrap();
    let removed = remove_a_source_file(&env, &p).await;
    let e = p.run(AGG, soon()).await.unwrap_err();
    assert!(e.to_string().contains("floe process refresh"), "{e}");
    let table_rows = (loaded - removed) as u64;
    assert!(table_rows >= 10 * BUDGET, "{table_rows} rows");

    let r = p.refresh(AGG, soon()).await.unwrap();
    let g = progress(&r);
    assert!(g.done && g.remaining == 0, "{g:?}");
    assert!(g.chunks >= 10 && g.chunks == g.chunks_done, "{g:?}");
    assert!(
        g.max_chunk_rows <= 2 * BUDGET && g.max_chunk_rows < table_rows / 5,
        "one chunk held {} rows of {table_rows}: {g:?}",
        g.max_chunk_rows
    );
    assert_eq!(r.rows_recomputed, table_rows, "each source row read once");
    let chunked = sink_rows(&p, &env, AGG).await;
    assert_reconciled(&p, AGG).await;
    let sink_now = sink(&p, &env, AGG).await;
    assert!(
        floe::summary::read_refresh(sink_now.metadata(), &source_uuid(&env, &p).await)
            .unwrap()
            .is_none(),
        "the last chunk cleared the position"
    );
    assert_eq!(
        floe::summary::read_checkpoint(sink_now.metadata(), &source_uuid(&env, &p).await)
            .map(|c| c.snapshot_id),
        r.to_snapshot
    );

    // The one-shot refresh (a budget above the table) gives exactly the same sink.
    let one = with_budget(&env, 1_000_000).await;
    let r = one.refresh(AGG, soon()).await.unwrap();
    assert_eq!(progress(&r).chunks, 1, "{r:?}");
    assert_eq!(r.rows_recomputed, table_rows);
    assert_eq!(sink_rows(&one, &env, AGG).await, chunked);
    // And the incremental path goes on from the refresh's checkpoint.
    load(&env, 1, 40, "after").await;
    let r = p.run(AGG, soon()).await.unwrap();
    assert!(!r.refresh && r.rows_in == 40, "{r:?}");
    assert_reconciled(&p, AGG).await;
}

async fn source_uuid(env: &TestEnv, p: &Processor) -> String {
    let t = p.committer().load(&env.ident()).await.unwrap();
    t.metadata().uuid().to_string()
}

/// A refresh cut off by its deadline leaves its position in the sink's summary; reconcile
/// refuses to compare a half-replaced sink; a compaction of the sink carries the position; the
/// next incremental run continues the refresh (it does not run incrementally over the
/// half-replaced sink) from where it stopped, and the run after it processes what came since.
#[tokio::test]
async fn append_refresh_cut_off_by_its_deadline_is_continued_by_the_next_run() {
    let env = env().await;
    load(&env, 20, 60, "app").await;
    let p = env.processor().await;
    p.run(APPEND, soon()).await.unwrap();
    let mut config = env.config.clone();
    config.pipelines[0].sql = config.pipelines[0].sql.replace(">= 4900", ">= 4500");
    let changed = Processor::new(config).await.unwrap();
    let e = changed.run(APPEND, soon()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transform, "{e}");

    // A deadline already past: the first chunk runs, then the refresh stops.
    let r = changed.refresh(APPEND, Instant::now()).await.unwrap();
    let g = progress(&r).clone();
    assert!(
        (g.chunks, g.chunks_done, g.done) == (1, 1, false) && g.remaining >= 9,
        "{g:?}"
    );
    assert!(g.max_chunk_rows <= BUDGET, "{g:?}");
    let uuid = source_uuid(&env, &p).await;
    let pos = floe::summary::read_refresh(sink(&p, &env, APPEND).await.metadata(), &uuid)
        .unwrap()
        .expect("the position is in the sink's summary");
    assert_eq!(
        (pos.id.as_str(), pos.chunks, pos.next),
        (g.id.as_str(), 1, 1)
    );
    assert_eq!(Some(pos.target), g.target_snapshot);
    let e = changed.reconcile(APPEND).await.unwrap_err();
    assert!(e.to_string().contains("in progress"), "{e}");

    // Chunk by chunk, then a compaction of the sink in between: the position is carried.
    for _ in 0..5 {
        let r = changed.refresh_chunk(APPEND, soon()).await.unwrap();
        assert_eq!(progress(&r).chunks, 1, "{r:?}");
    }
    let before = sink(&p, &env, APPEND).await;
    env.maintainer()
        .await
        .run(APPEND, &crate::maintain_opts(true, false, false))
        .await
        .unwrap();
    let after = sink(&p, &env, APPEND).await;
    assert_ne!(
        before.metadata().current_snapshot_id(),
        after.metadata().current_snapshot_id(),
        "the sink was compacted"
    );
    let pos = floe::summary::read_refresh(after.metadata(), &uuid)
        .unwrap()
        .expect("carried");
    assert_eq!((pos.chunks, pos.next), (6, 6));

    // New source data meanwhile; the next incremental run continues the refresh instead.
    load(&env, 1, 60, "late").await;
    let r = changed.run(APPEND, soon()).await.unwrap();
    let g = progress(&r);
    assert!(r.refresh && g.done && g.id == pos.id, "{r:?}");
    assert_eq!(
        g.chunks_done, 20,
        "one chunk per file (60 rows each, budget 100)"
    );
    assert_eq!(r.to_snapshot, Some(pos.target), "the refresh's own target");
    let r = changed.run(APPEND, soon()).await.unwrap();
    assert!(!r.refresh && r.rows_in == 60, "{r:?}");
    assert_reconciled(&changed, APPEND).await;
    // The same sink as one refresh of the whole table at once.
    let chunked = sink_rows(&changed, &env, APPEND).await;
    let mut config = changed_config(&env);
    config.process.refresh_chunk_rows = 1_000_000;
    let one = Processor::new(config).await.unwrap();
    one.refresh(APPEND, soon()).await.unwrap();
    assert_eq!(sink_rows(&one, &env, APPEND).await, chunked);
}

fn changed_config(env: &TestEnv) -> floe::config::Config {
    let mut config = env.config.clone();
    config.pipelines[0].sql = config.pipelines[0].sql.replace(">= 4900", ">= 4500");
    config
}

/// Exactly once per chunk: a chunk that lands and whose process then dies is found by the next
/// call in the sink's position (not re-applied); chunks whose answers are lost, or come back as
/// conflicts, are settled by the commit loop. No row is duplicated or missing.
#[tokio::test]
async fn a_chunk_whose_answer_was_lost_is_neither_reapplied_nor_skipped() {
    let env = env().await;
    load(&env, 12, 60, "lost").await;
    let p = env.processor().await;
    for name in [APPEND, AGG] {
        p.run(name, soon()).await.unwrap();
    }
    let uuid = source_uuid(&env, &p).await;
    p.refresh_chunk(APPEND, soon()).await.unwrap();
    let crashing = env.processor_with(faulty(Fault::AfterCommit)).await;
    let e = crashing.refresh_chunk(APPEND, soon()).await.unwrap_err();
    assert!(e.to_string().contains("injected crash"), "{e}");
    let pos = floe::summary::read_refresh(sink(&p, &env, APPEND).await.metadata(), &uuid)
        .unwrap()
        .expect("in progress");
    assert_eq!(pos.chunks, 2, "the crashed chunk landed: {pos:?}");
    let lossy = env.processor_with(faulty(Fault::LostAnswer)).await;
    let r = lossy.refresh(APPEND, soon()).await.unwrap();
    let g = progress(&r);
    assert!(g.done && g.chunks_done == 12 && g.chunks == 10, "{g:?}");
    // No order twice: every sink row is a distinct order, and the sink is the batch result.
    let (rows, distinct) = orders_in(&p, &env, APPEND).await;
    assert!(
        rows > 0 && distinct == rows,
        "{rows} rows, {distinct} orders"
    );
    assert_reconciled(&p, APPEND).await;

    // The aggregate, every answer coming back as a conflict.
    let conflicted = env
        .processor_with(faulty(Fault::LostAnswerAsConflict))
        .await;
    let r = conflicted.refresh(AGG, soon()).await.unwrap();
    assert!(progress(&r).done && progress(&r).chunks > 1, "{r:?}");
    assert_reconciled(&p, AGG).await;
}

/// A refresh's target snapshot is pinned against floe's expiration while it runs; expired
/// anyway (by another engine), the refresh starts over at the source's current snapshot and
/// says why; so does a refresh whose transform changed in between.
#[tokio::test]
async fn a_refresh_whose_target_expired_or_transform_changed_starts_over_and_says_why() {
    let env = env().await;
    load(&env, 12, 60, "exp").await;
    let p = env.processor().await;
    // A new sink without a checkpoint: only the refresh's position pins its target.
    let r = p.refresh(AGG, Instant::now()).await.unwrap();
    let first = progress(&r).clone();
    assert!(!first.done, "{first:?}");
    let target = first.target_snapshot.unwrap();
    load(&env, 1, 30, "exp-more").await;
    let m = env.maintainer().await;
    m.run("orders", &crate::matrix::expire_all()).await.unwrap();
    let orders = p.committer().load(&env.ident()).await.unwrap();
    assert!(
        orders.metadata().snapshot_by_id(target).is_some(),
        "expiration keeps a refresh's target"
    );
    // Another engine expires it anyway.
    let current = orders.metadata().current_snapshot_id().unwrap();
    p.committer()
        .commit(&env.ident(), &limits(), move |_| {
            Ok(floe::commit::Plan::Apply(Change::expire(vec![target])))
        })
        .await
        .unwrap();
    let r = p.refresh(AGG, soon()).await.unwrap();
    let g = progress(&r);
    let why = g.restarted.as_deref().unwrap_or_default();
    assert!(
        why.contains(&first.id) && why.contains("expired") && why.contains(&target.to_string()),
        "{g:?}"
    );
    assert!(g.done && g.id != first.id, "{g:?}");
    assert_eq!(g.target_snapshot, Some(current));
    assert_reconciled(&p, AGG).await;

    // A transform changed between two calls of a refresh: started over with the new one.
    p.refresh_chunk(AGG, soon()).await.unwrap();
    let mut config = env.config.clone();
    config.pipelines[1].sql = config.pipelines[1].sql.replace(
        "count(*) AS orders",
        "count(*) AS orders, max(amount) AS largest",
    );
    let changed = Processor::new(config).await.unwrap();
    let r = changed.refresh(AGG, soon()).await.unwrap();
    let g = progress(&r);
    assert!(
        g.done
            && g.restarted
                .as_deref()
                .is_some_and(|w| w.contains("transform changed")),
        "{g:?}"
    );
    assert_reconciled(&changed, AGG).await;
}

/// A transform change that adds an output column, refreshed in chunks whose bounds fall inside
/// a sink file (incremental runs wrote the day's windows into one file, so each chunk keeps
/// rows of it outside its span, in the old schema): every chunk lands, the sink gains the
/// column, and the result is the one-shot refresh's.
#[tokio::test]
async fn a_chunked_refresh_adding_an_output_column_finishes() {
    let env = env().await;
    load(&env, 12, 60, "col").await;
    let p = env.processor().await;
    p.run(AGG, soon()).await.unwrap();
    assert_eq!(
        floe::scan::live_files(&sink(&p, &env, AGG).await)
            .await
            .unwrap()
            .len(),
        1
    );
    let mut config = env.config.clone();
    config.pipelines[1].sql = config.pipelines[1].sql.replace(
        "count(*) AS orders",
        "count(*) AS orders, max(amount) AS largest",
    );
    let changed = Processor::new(config.clone()).await.unwrap();
    let r = changed.refresh(AGG, soon()).await.unwrap();
    let g = progress(&r);
    assert!(g.done && g.chunks > 2, "{g:?}");
    let t = sink(&changed, &env, AGG).await;
    assert!(
        t.metadata()
            .current_schema()
            .field_by_name("largest")
            .is_some(),
        "the sink gained the column"
    );
    let chunked = sink_rows(&changed, &env, AGG).await;
    assert!(
        chunked.iter().all(|r| !r.contains("NULL")),
        "every window recomputed with the new column: {chunked:?}"
    );
    assert_reconciled(&changed, AGG).await;
    config.process.refresh_chunk_rows = 1_000_000;
    let one = Processor::new(config).await.unwrap();
    one.refresh(AGG, soon()).await.unwrap();
    assert_eq!(sink_rows(&one, &env, AGG).await, chunked);
}

/// The ids of the refreshes recorded on the sink's snapshots, each once, oldest first.
async fn refresh_ids(p: &Processor, env: &TestEnv, name: &str) -> Vec<String> {
    let t = sink(p, env, name).await;
    let mut snapshots: Vec<_> = t.metadata().snapshots().collect();
    snapshots.sort_by_key(|s| s.sequence_number());
    let mut ids: Vec<String> = Vec::new();
    for s in snapshots {
        if let Some(id) = s.summary().additional_properties.get("floe.refresh.id") {
            if !ids.contains(id) {
                ids.push(id.clone());
            }
        }
    }
    ids
}

/// Chunk by chunk until one chunk of the refresh remains; returns its id.
async fn to_the_last_chunk(p: &Processor, name: &str) -> String {
    let mut r = p.refresh_chunk(name, soon()).await.unwrap();
    while progress(&r).remaining > 1 {
        r = p.continue_refresh_chunk(name, soon()).await.unwrap();
    }
    assert!(!progress(&r).done, "{r:?}");
    progress(&r).id.clone()
}

/// Two callers of one refresh: another caller's last chunk lands while this one builds its
/// own (the race runs just before this one's swap). This one's chunk is skipped, and it then
/// reports the refresh done instead of starting a new one — as `floe process refresh` and as
/// an incremental run continuing the refresh; so does a caller continuing a finished refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoever_loses_the_race_for_the_last_chunk_does_not_start_a_new_refresh() {
    let env = env().await;
    load(&env, 12, 60, "race").await;
    let p = env.processor().await;
    let winner = |run: bool| -> Race {
        let config = env.config.clone();
        Box::new(move || {
            Box::pin(async move {
                let other = Processor::new(config).await.unwrap();
                let r = if run {
                    other.run(AGG, soon()).await.unwrap()
                } else {
                    other.refresh(AGG, soon()).await.unwrap()
                };
                assert!(progress(&r).done && progress(&r).chunks >= 1, "{r:?}");
            })
        })
    };

    let id = to_the_last_chunk(&p, AGG).await;
    let loser = env.processor_with(race_before_swap(winner(false))).await;
    let r = loser.refresh(AGG, soon()).await.unwrap();
    let g = progress(&r);
    assert!(g.done && g.chunks == 0 && g.id == id, "{r:?}");
    assert!(r.replans >= 1, "{r:?}");
    assert_eq!(refresh_ids(&p, &env, AGG).await, std::slice::from_ref(&id));
    // Continuing a refresh that is over: done, nothing started.
    let r = p.continue_refresh_chunk(AGG, soon()).await.unwrap();
    assert!(progress(&r).done && progress(&r).chunks == 0, "{r:?}");
    assert_eq!(refresh_ids(&p, &env, AGG).await, std::slice::from_ref(&id));
    assert_reconciled(&p, AGG).await;

    // An incremental run continuing a refresh loses the race the same way.
    let second = to_the_last_chunk(&p, AGG).await;
    let loser = env.processor_with(race_before_swap(winner(true))).await;
    let r = loser.run(AGG, soon()).await.unwrap();
    let g = progress(&r);
    assert!(
        r.refresh && g.done && g.chunks == 0 && g.id == second,
        "{r:?}"
    );
    assert_eq!(refresh_ids(&p, &env, AGG).await, [id, second]);
    assert_reconciled(&p, AGG).await;
}

/// Files whose time bounds mislead the plan: each file's rows lie in the last 100 minutes of a
/// day but one row at its first minute, so the even-spread estimate puts every row in one or
/// two chunks. Each chunk counts its rows from the time column before reading them, and splits
/// to fit: no chunk holds more than twice the budget, every row is read once, and the sink is
/// the one-shot refresh's.
#[tokio::test]
async fn skewed_file_statistics_do_not_make_a_chunk_over_its_budget() {
    use chrono::{Duration as Days, TimeZone};
    let env = env().await;
    let ingestor = env.ingestor().await;
    let yesterday = (chrono::Utc::now() - Days::days(1)).date_naive();
    let day = chrono::Utc.from_utc_datetime(&yesterday.and_hms_opt(0, 0, 0).unwrap());
    let end = day + Days::days(1) - Days::seconds(1);
    let mut rng = floe::sample::Rng::new(77);
    let (objects, rows) = (20u64, 500u64);
    for i in 0..objects {
        let mut text = String::new();
        floe::sample::order_line(&mut text, &mut rng, day + Days::seconds(61), 0);
        for r in 0..rows {
            floe::sample::order_line(&mut text, &mut rng, end, ((r * 7 + i) % 100) as i64 * 60);
        }
        let key = format!("orders/skew-{i}.jsonl");
        env.put(&key, text).await;
        env.ingest(&ingestor, &key).await.unwrap();
    }
    let table_rows = objects * (rows + 1);
    let budget = 1000;
    let p = with_budget(&env, budget).await;
    let r = p.refresh(AGG, soon()).await.unwrap();
    let g = progress(&r);
    assert!(g.done, "{g:?}");
    assert!(
        g.max_chunk_rows <= 2 * budget,
        "one chunk held {} rows of {table_rows}: {g:?}",
        g.max_chunk_rows
    );
    assert_eq!(r.rows_recomputed, table_rows, "each source row read once");
    let chunked = sink_rows(&p, &env, AGG).await;
    assert_reconciled(&p, AGG).await;
    let one = with_budget(&env, 1_000_000).await;
    one.refresh(AGG, soon()).await.unwrap();
    assert_eq!(sink_rows(&one, &env, AGG).await, chunked);
}

/// Sink maintenance beside a refresh: before every chunk commit lands, the sink is compacted
/// and its manifests rewritten (`replace` snapshots: no row changed). A chunk planned before
/// them still applies (its position and removals are unchanged), so the refresh neither
/// rebuilds chunks nor runs out of attempts — at most the append refresh's first chunk, whose
/// removals the compaction took, is rebuilt — and the sink is the one-shot refresh's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_compactions_during_a_refresh_do_not_make_chunks_rebuild() {
    let env = env().await;
    for i in 0..3 {
        load(&env, 4, 60, &format!("maint-{i}")).await;
        let p = env.processor().await;
        p.run(APPEND, soon()).await.unwrap();
        p.run(AGG, soon()).await.unwrap();
    }
    for (name, rebuilt) in [(AGG, 0), (APPEND, 1)] {
        let config = env.config.clone();
        let sink_name = name.to_string();
        let race: EachRace = Arc::new(move || {
            let (config, sink_name) = (config.clone(), sink_name.clone());
            Box::pin(async move {
                let m = floe::maintain::Maintainer::new(config).await.unwrap();
                let opts = floe::maintain::Options {
                    rewrite_manifests: true,
                    manifest_threshold: 0,
                    min_input_files: 2,
                    ..crate::maintain_opts(true, false, false)
                };
                m.run(&sink_name, &opts).await.unwrap();
            })
        });
        let p = env.processor_with(race_before_each_commit(race)).await;
        let r = p.refresh(name, soon()).await.unwrap();
        let g = progress(&r);
        assert!(g.done && g.chunks > 2, "{name}: {r:?}");
        assert!(
            r.replans <= rebuilt,
            "{name}: {} chunks rebuilt: {r:?}",
            r.replans
        );
        let ops: Vec<String> = sink(&p, &env, name)
            .await
            .metadata()
            .snapshots()
            .filter_map(|s| {
                s.summary()
                    .additional_properties
                    .get("floe.operation")
                    .cloned()
            })
            .collect();
        assert!(
            ops.iter().any(|o| o == "rewrite-manifests"),
            "{name}: {ops:?}"
        );
        if name == APPEND {
            assert!(ops.iter().any(|o| o == "compaction"), "{name}: {ops:?}");
        }
        let chunked = sink_rows(&p, &env, name).await;
        assert_reconciled(&p, name).await;
        let one = with_budget(&env, 1_000_000).await;
        one.refresh(name, soon()).await.unwrap();
        assert_eq!(sink_rows(&one, &env, name).await, chunked, "{name}");
    }
}

/// A refresh position that cannot be read (a key present but unparsable, as a hand edit or
/// another tool might leave it) is neither "no refresh" nor "start at 0": runs, refreshes and
/// reconcile stop with an error naming the key and telling the operator to restart the
/// refresh; `--restart` rebuilds the sink whole.
#[tokio::test]
async fn a_malformed_refresh_position_stops_until_the_refresh_is_restarted() {
    let env = env().await;
    load(&env, 6, 60, "bad").await;
    let p = env.processor().await;
    let r = p.refresh_chunk(APPEND, soon()).await.unwrap();
    assert!(!progress(&r).done, "{r:?}");
    // A snapshot on top whose position's `next` is unreadable.
    let ident = floe::catalog::table_ident(&env.config, APPEND).unwrap();
    let uuid = source_uuid(&env, &p).await;
    let pos = floe::summary::read_refresh(sink(&p, &env, APPEND).await.metadata(), &uuid)
        .unwrap()
        .unwrap();
    let mut props: std::collections::HashMap<String, String> =
        pos.properties().into_iter().collect();
    props.insert("floe.refresh.next".into(), "-3".into());
    let change = Change::append(Vec::new(), props);
    p.committer()
        .commit(&ident, &limits(), move |_| {
            Ok(floe::commit::Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
    // `-3` parses, but is no file index: append mode refuses it too.
    for e in [
        p.run(APPEND, soon()).await.unwrap_err(),
        p.refresh(APPEND, soon()).await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Stale, "{e}");
        assert!(
            e.to_string().contains("--restart") && e.to_string().contains("-3"),
            "{e}"
        );
    }
    let mut props: std::collections::HashMap<String, String> =
        pos.properties().into_iter().collect();
    props.insert("floe.refresh.target".into(), "not-a-snapshot".into());
    let change = Change::append(Vec::new(), props);
    p.committer()
        .commit(&ident, &limits(), move |_| {
            Ok(floe::commit::Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
    for e in [
        p.run(APPEND, soon()).await.unwrap_err(),
        p.refresh(APPEND, soon()).await.unwrap_err(),
        p.reconcile(APPEND).await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Stale, "{e}");
        assert!(
            e.to_string().contains("floe.refresh.target") && e.to_string().contains("--restart"),
            "{e}"
        );
    }
    let r = p.restart_refresh_chunk(APPEND, soon()).await.unwrap();
    let g = progress(&r);
    assert!(
        g.id != pos.id
            && g.restarted
                .as_deref()
                .is_some_and(|w| w.contains("floe.refresh.target")),
        "{g:?}"
    );
    let mut r = r;
    while !progress(&r).done {
        r = p.continue_refresh_chunk(APPEND, soon()).await.unwrap();
    }
    let (rows, distinct) = orders_in(&p, &env, APPEND).await;
    assert!(
        rows > 0 && rows == distinct,
        "{rows} rows, {distinct} orders"
    );
    assert_reconciled(&p, APPEND).await;
}
