//! Source row changes into latest-state sinks (#12): another writer (PyIceberg, copy-on-write)
//! deletes or overwrites rows of the source; the next run rebuilds the key buckets those rows
//! were in, so keys fall back to their previous surviving version, corrected values replace
//! the old ones, and the sink equals the batch — exactly once under crashes and concurrent runs.

use floe::process::Processor;

use crate::faults::{faulty, faulty_on, race_before_swap, Fault, Race};
use crate::harness::TestEnv;
use crate::latest::{
    assert_reconciled, commit_row_deletes, ingest, ingest_random, pipeline, random_versions,
    rows_where, setup, sink_rows, soon, Model, RowDeletes, LATEST, TOMBSTONES,
};

type Version = (i64, &'static str, &'static str, i64);

/// The model of the versions that survive in the source.
fn model_of<'a>(versions: impl IntoIterator<Item = (i64, &'a str, &'a str, i64)>) -> Model {
    let mut m = Model::default();
    for (c, o, s, t) in versions {
        m.apply(c, o, s, t);
    }
    m
}

fn row(c: &str, o: &str, s: &str) -> Vec<String> {
    vec![c.to_string(), o.to_string(), s.to_string()]
}

/// Two objects of versions: first ones, then later ones (a correction takes some back).
const A: [Version; 4] = [
    (1, "o1", "placed", 10),
    (2, "o2", "placed", 10),
    (3, "o3", "placed", 10),
    (4, "o4", "placed", 5),
];
const B: [Version; 4] = [
    (1, "o1", "shipped", 20),
    (2, "o2", "cancelled", 20),
    (3, "o3", "paid", 30),
    (5, "o5", "placed", 1),
];

/// After a retraction: a run with nothing new commits nothing, and the later versions `c`
/// (recorded in `m`) then merge as usual.
async fn no_commit_then_later_versions_merge(
    env: &TestEnv,
    ingestor: &floe::ingest::Ingestor,
    p: &Processor,
    base: chrono::DateTime<chrono::Utc>,
    mut m: Model,
    c: &[Version],
) {
    let again = p.run(LATEST, soon()).await.unwrap();
    assert_eq!((again.row_changes, again.sink_snapshot), (0, None));
    ingest(env, ingestor, "orders/c.jsonl", base, &mut m, c).await;
    p.run(LATEST, soon()).await.unwrap();
    assert_eq!(sink_rows(env), m.live(), "after later versions");
    assert_reconciled(p, "after later versions").await;
}

#[tokio::test]
async fn a_source_delete_retracts_rows_and_keys_fall_back_to_their_previous_version() {
    let (env, ingestor, p, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    let (a, b) = (A, B);
    ingest(&env, &ingestor, "orders/a.jsonl", base, &mut m, &a).await;
    ingest(&env, &ingestor, "orders/b.jsonl", base, &mut m, &b).await;
    p.run(LATEST, soon()).await.unwrap();
    assert_eq!(sink_rows(&env), m.live(), "before the correction");
    assert_eq!(env.pyiceberg_rows(TOMBSTONES)["rows"], 1, "c2's tombstone");

    // Another writer corrects the source: c1's `shipped` and c2's `cancelled` versions were
    // wrong, c5 never existed. (PyIceberg: a `delete` of whole files and an `overwrite`
    // rewriting the partly matching ones.)
    env.pyiceberg_run(
        "orders",
        "t.delete(\"status = 'shipped' or status = 'cancelled' or customer_id = 5\")",
    );
    let gone = |v: &&Version| v.2 == "shipped" || v.2 == "cancelled" || v.0 == 5;
    let kept: Vec<Version> = a.iter().chain(&b).filter(|v| !gone(v)).copied().collect();
    let m = model_of(kept.iter().copied());
    let r = p.run(LATEST, soon()).await.unwrap();
    assert!(
        r.row_changes >= 1 && r.buckets_rebuilt >= 1 && r.sink_snapshot.is_some(),
        "{r:?}"
    );
    let rows = sink_rows(&env);
    assert_eq!(rows, m.live(), "after the correction");
    assert_eq!(
        rows,
        vec![
            row("1", "o1", "placed"),
            row("2", "o2", "placed"),
            row("3", "o3", "paid"),
            row("4", "o4", "placed"),
        ],
        "c1 and c2 back to their previous version, c5 gone"
    );
    assert_eq!(
        env.pyiceberg_rows(TOMBSTONES)["rows"],
        0,
        "c2's delete was taken back"
    );
    assert_reconciled(&p, "after the correction").await;

    // Nothing new: no commit. A late older version of a corrected key changes nothing; a newer
    // one wins as usual.
    let c: [Version; 2] = [(2, "o2", "placed", 5), (1, "o1", "paid", 50)];
    no_commit_then_later_versions_merge(&env, &ingestor, &p, base, m, &c).await;
}

/// A first run (no checkpoint) that committed its tombstones and crashed before its sink
/// commit leaves tombstones read at a source state the next run may no longer see: corrected
/// since, the next first run plans the source's current state (no row change in it) and
/// applied them anyway, hiding c2's surviving version behind a delete the source took back
/// (review helper-44). A first run finding tombstones now rebuilds every bucket from the
/// source, as a refresh does.
#[tokio::test]
async fn a_first_runs_orphaned_tombstones_do_not_outlive_a_correction() {
    let (env, ingestor, p, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    let (a, b) = (A, B);
    ingest(&env, &ingestor, "orders/a.jsonl", base, &mut m, &a).await;
    ingest(&env, &ingestor, "orders/b.jsonl", base, &mut m, &b).await;
    let crash = env
        .processor_with(faulty_on(LATEST, Fault::AfterMetadata))
        .await;
    let e = crash.run(LATEST, soon()).await.unwrap_err();
    assert!(e.to_string().contains("injected crash"), "{e}");
    assert_eq!(
        env.pyiceberg_rows(TOMBSTONES)["rows"],
        1,
        "c2's tombstone landed"
    );
    // The correction: c2's `cancelled` version never happened.
    env.pyiceberg_run("orders", "t.delete(\"status = 'cancelled'\")");
    let kept: Vec<Version> = a
        .iter()
        .chain(&b)
        .filter(|v| v.2 != "cancelled")
        .copied()
        .collect();
    let m = model_of(kept.iter().copied());
    let r = p.run(LATEST, soon()).await.unwrap();
    assert!(r.sink_snapshot.is_some(), "{r:?}");
    assert_eq!(
        r.delta_files_read, 0,
        "the rebuild read the source once, the delta not again: {r:?}"
    );
    assert!(r.recompute_files_read > 0, "{r:?}");
    let rows = sink_rows(&env);
    assert_eq!(rows, m.live(), "c2 back at its surviving version");
    assert!(rows.contains(&row("2", "o2", "placed")), "{rows:?}");
    assert_eq!(
        env.pyiceberg_rows(TOMBSTONES)["rows"],
        0,
        "the orphaned tombstone replaced by the batch's (none)"
    );
    assert_reconciled(&p, "after the correction").await;
    let c: [Version; 2] = [(2, "o2", "paid", 5), (1, "o1", "paid", 50)];
    no_commit_then_later_versions_merge(&env, &ingestor, &p, base, m, &c).await;
}

/// Two first runs overlap (review helper-45): one that read the source before a correction
/// commits its tombstones after the other read the (empty) tombstone table; the other's sink
/// commit then set the checkpoint over them, and no later run would ever rebuild. A first
/// run's tombstone commit is now guarded on the version it read: here another first run's
/// tombstones land (and its sink commit crashes) right before this run's tombstone swap, so
/// this run re-plans and, finding tombstones without a checkpoint, rebuilds every bucket.
#[tokio::test]
async fn a_first_runs_tombstone_commit_yields_to_tombstones_that_landed_meanwhile() {
    let (env, ingestor, _, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    ingest(&env, &ingestor, "orders/a.jsonl", base, &mut m, &A).await;
    ingest(&env, &ingestor, "orders/b.jsonl", base, &mut m, &B).await;
    let other = env
        .processor_with(faulty_on(LATEST, Fault::AfterMetadata))
        .await;
    let race: Race = Box::new(move || {
        Box::pin(async move {
            let e = other.run(LATEST, soon()).await.unwrap_err();
            assert!(e.to_string().contains("injected crash"), "{e}");
        })
    });
    let p = env.processor_with(race_before_swap(race)).await;
    let r = p.run(LATEST, soon()).await.unwrap();
    assert!(
        r.replans >= 1 && r.buckets_rebuilt > 0 && r.sink_snapshot.is_some(),
        "re-planned and rebuilt: {r:?}"
    );
    assert_eq!(sink_rows(&env), m.live());
    assert_eq!(env.pyiceberg_rows(TOMBSTONES)["rows"], 1, "c2's tombstone");
    assert_reconciled(&p, "after overlapping first runs").await;
}

/// The same race when the later first run has no output at all (review helper-46): its only
/// source row, c2's `cancelled` version, was deleted by a correction after the earlier run
/// read it. The later run made no tombstone commit (nothing to write), so the earlier run's
/// guarded commit found the version it read and landed c2's stale tombstone under the later
/// run's checkpoint. A first run now makes its guarded commit even with no output.
#[tokio::test]
async fn a_first_run_without_output_still_fences_an_earlier_first_runs_tombstones() {
    let (env, ingestor, _, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    ingest(
        &env,
        &ingestor,
        "orders/a.jsonl",
        base,
        &mut m,
        &[(2, "o2", "cancelled", 20)],
    )
    .await;
    // Right before the earlier run's tombstone swap: the correction, then a whole first run.
    let later = env.processor().await;
    let corrected = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = corrected.clone();
    let env_delete = env.pyiceberg_runner("orders", "t.delete(\"status = 'cancelled'\")");
    let race: Race = Box::new(move || {
        Box::pin(async move {
            env_delete();
            let r = later.run(LATEST, soon()).await.unwrap();
            *seen.lock().unwrap() = Some(r);
        })
    });
    let earlier = env.processor_with(race_before_swap(race)).await;
    let _ = earlier.run(LATEST, soon()).await.unwrap();
    let later_run = corrected.lock().unwrap().take().expect("the later run ran");
    assert!(later_run.sink_snapshot.is_some(), "{later_run:?}");
    assert_eq!(
        env.pyiceberg_rows(TOMBSTONES)["rows"],
        0,
        "no tombstone of a version the source took back"
    );
    // An older version of c2 arrives: nothing hides it.
    let mut m = Model::default();
    ingest(
        &env,
        &ingestor,
        "orders/b.jsonl",
        base,
        &mut m,
        &[(2, "o2", "placed", 10)],
    )
    .await;
    let p = env.processor().await;
    p.run(LATEST, soon()).await.unwrap();
    assert_eq!(
        sink_rows(&env),
        m.live(),
        "c2 at its only surviving version"
    );
    assert_reconciled(&p, "after the race").await;
}

#[tokio::test]
async fn a_source_overwrite_with_corrected_values_amid_appends_reaches_the_sink() {
    let (env, ingestor, p, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    let a: [Version; 4] = [
        (1, "o1", "placed", 10),
        (2, "o2", "cancelled", 10),
        (3, "o3", "placed", 10),
        (4, "o4", "placed", 5),
    ];
    ingest(&env, &ingestor, "orders/a.jsonl", base, &mut m, &a).await;
    p.run(LATEST, soon()).await.unwrap();
    assert_eq!(sink_rows(&env), m.live());

    // One delta: an append, an overwrite correcting c4's rows and taking back c2's delete
    // (status replaced), another append.
    let c: [Version; 2] = [(3, "o3", "paid", 30), (6, "o6", "placed", 3)];
    ingest(&env, &ingestor, "orders/c.jsonl", base, &mut m, &c).await;
    env.pyiceberg_run(
        "orders",
        r#"
import pyarrow as pa
df = t.scan(row_filter="customer_id = 4 or customer_id = 2").to_arrow()
i = df.schema.get_field_index("status")
f = df.schema.field(i)
df = df.set_column(i, f, pa.array(["corrected"] * df.num_rows, type=f.type))
t.overwrite(df, overwrite_filter="customer_id = 4 or customer_id = 2")
"#,
    );
    let d: [Version; 2] = [(7, "o7", "placed", 2), (1, "o1", "shipped", 40)];
    ingest(&env, &ingestor, "orders/d.jsonl", base, &mut m, &d).await;
    let corrected = a.iter().chain(&c).chain(&d).map(|&(cu, o, s, t)| match cu {
        2 | 4 => (cu, o, "corrected", t),
        _ => (cu, o, s, t),
    });
    let m = model_of(corrected);
    let r = p.run(LATEST, soon()).await.unwrap();
    assert!(r.row_changes >= 1 && r.buckets_rebuilt >= 1, "{r:?}");
    let rows = sink_rows(&env);
    assert_eq!(rows, m.live());
    assert!(rows.contains(&row("4", "o4", "corrected")), "{rows:?}");
    assert!(rows.contains(&row("2", "o2", "corrected")), "{rows:?}");
    assert!(rows.contains(&row("1", "o1", "shipped")), "{rows:?}");
    assert_reconciled(&p, "after the overwrite").await;
    let again = p.run(LATEST, soon()).await.unwrap();
    assert_eq!((again.source_snapshots, again.sink_snapshot), (0, None));
}

#[tokio::test]
async fn a_retraction_is_exactly_once_under_crashes_and_concurrent_runs() {
    let (env, ingestor, _, base, mut m) = setup("sqlite", &pipeline(), 3).await;
    let mut all = Vec::new();
    for i in 0..3 {
        let v = random_versions(150, 60, 300 + i);
        ingest_random(
            &env,
            &ingestor,
            &format!("orders/r{i}.jsonl"),
            base,
            &mut m,
            &v,
        )
        .await;
        all.extend(v);
    }
    let p = env.processor().await;
    p.run(LATEST, soon()).await.unwrap();
    assert_eq!(sink_rows(&env), m.live());

    // A correction (keys 0-9 gone, every delete taken back), then more appends.
    env.pyiceberg_run(
        "orders",
        "t.delete(\"customer_id < 10 or status = 'cancelled'\")",
    );
    all.retain(|(c, _, s, _)| !(*c < 10 || s == "cancelled"));
    // Versions ingested after the correction (keys 0-9 and deletes among them) stay.
    let v = random_versions(100, 60, 400);
    ingest_random(&env, &ingestor, "orders/s.jsonl", base, &mut m, &v).await;
    all.extend(v);
    let m = model_of(
        all.iter()
            .map(|(c, o, s, t)| (*c, o.as_str(), s.as_str(), *t)),
    );

    let ident = floe::catalog::table_ident(&env.config, LATEST).unwrap();
    let sink_before = p.committer().load(&ident).await.unwrap();
    // A crash before the tombstone commit lands; then one after the tombstones landed, before
    // the sink commit: the sink and its checkpoint are untouched.
    let crash = env.processor_with(faulty(Fault::AfterMetadata)).await;
    let e = crash.run(LATEST, soon()).await.unwrap_err();
    assert!(e.to_string().contains("injected crash"), "{e}");
    let crash = env
        .processor_with(faulty_on(LATEST, Fault::AfterMetadata))
        .await;
    let e = crash.run(LATEST, soon()).await.unwrap_err();
    assert!(e.to_string().contains("injected crash"), "{e}");
    let sink = p.committer().load(&ident).await.unwrap();
    assert_eq!(
        sink.metadata().current_snapshot_id(),
        sink_before.metadata().current_snapshot_id(),
        "no sink commit"
    );
    let tt = floe::catalog::table_ident(&env.config, TOMBSTONES).unwrap();
    let tt = p.committer().load(&tt).await.unwrap();
    let summary = &tt.metadata().current_snapshot().unwrap().summary();
    assert!(
        summary
            .additional_properties
            .contains_key(floe::summary::TOMBSTONES_REBUILT),
        "the rebuilt tombstones landed: {summary:?}"
    );

    // Four processes race on the re-planned delta: one commits, nothing twice.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let config = env.config.clone();
        tasks.push(tokio::spawn(async move {
            let p = Processor::new(config).await.unwrap();
            p.run(LATEST, soon()).await
        }));
    }
    let mut committed = 0;
    for t in tasks {
        let r = t.await.unwrap().expect("run");
        committed += r.sink_snapshot.is_some() as u32;
    }
    assert!(committed >= 1, "the delta committed");
    assert_eq!(sink_rows(&env), m.live(), "one row per surviving key");
    assert_reconciled(&p, "after the race").await;
    let again = p.run(LATEST, soon()).await.unwrap();
    assert_eq!((again.row_changes, again.sink_snapshot), (0, None));
}

/// Another engine's merge-on-read delete (Spark's `write.delete.mode = merge-on-read`): position
/// delete files naming the deleted rows. Only those rows' key buckets are rebuilt, whether the
/// delete files name their data file (`referenced_data_file`) or must be read to know it.
#[tokio::test]
async fn a_source_merge_on_read_delete_retracts_the_rows_it_deletes() {
    let (env, ingestor, p, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    let (a, b) = (A, B);
    ingest(&env, &ingestor, "orders/a.jsonl", base, &mut m, &a).await;
    ingest(&env, &ingestor, "orders/b.jsonl", base, &mut m, &b).await;
    p.run(LATEST, soon()).await.unwrap();
    assert_eq!(sink_rows(&env), m.live(), "before the delete");
    assert_eq!(env.pyiceberg_rows(TOMBSTONES)["rows"], 1, "c2's tombstone");

    // c1's `shipped` and c2's `cancelled` versions are deleted by position, their delete files
    // not naming the data file.
    let source = p.committer().load(&env.ident()).await.unwrap();
    let victims = rows_where(&source, |_, _, s| s == "shipped" || s == "cancelled").await;
    assert_eq!(victims.iter().map(|(_, v)| v.len()).sum::<usize>(), 2);
    commit_row_deletes(&env, &source, vec![RowDeletes::Positions(victims, false)]).await;
    let gone = |v: &&Version| v.2 == "shipped" || v.2 == "cancelled";
    let kept: Vec<Version> = a.iter().chain(&b).filter(|v| !gone(v)).copied().collect();
    let m = model_of(kept.iter().copied());
    let r = p.run(LATEST, soon()).await.unwrap();
    let deleted_buckets: std::collections::BTreeSet<i32> = [1, 2].map(bucket4).into();
    assert_eq!(
        (r.row_changes, r.buckets_rebuilt),
        (1, deleted_buckets.len()),
        "the deleted rows' buckets only: {r:?}"
    );
    assert!(r.sink_snapshot.is_some(), "{r:?}");
    assert_eq!(
        sink_rows(&env),
        vec![
            row("1", "o1", "placed"),
            row("2", "o2", "placed"),
            row("3", "o3", "paid"),
            row("4", "o4", "placed"),
            row("5", "o5", "placed"),
        ],
        "c1 and c2 back to their previous version"
    );
    assert_eq!(sink_rows(&env), m.live());
    assert_eq!(
        env.pyiceberg_rows(TOMBSTONES)["rows"],
        0,
        "c2's delete taken back"
    );
    assert_reconciled(&p, "after the position deletes").await;

    // c5 deleted by a delete file that names its data file; c3's `paid` too.
    let source = p.committer().load(&env.ident()).await.unwrap();
    let victims = rows_where(&source, |c, _, s| c == 5 || s == "paid").await;
    commit_row_deletes(&env, &source, vec![RowDeletes::Positions(victims, true)]).await;
    let kept: Vec<Version> = kept
        .into_iter()
        .filter(|v| v.0 != 5 && v.2 != "paid")
        .collect();
    let m = model_of(kept.iter().copied());
    let r = p.run(LATEST, soon()).await.unwrap();
    let deleted_buckets: std::collections::BTreeSet<i32> = [3, 5].map(bucket4).into();
    assert_eq!(
        (r.row_changes, r.buckets_rebuilt),
        (1, deleted_buckets.len()),
        "{r:?}"
    );
    assert_eq!(sink_rows(&env), m.live(), "c5 gone, c3 back to `placed`");
    assert_reconciled(&p, "after the second position deletes").await;

    // Nothing new: no commit. Later versions merge as usual over the deleted rows.
    let c: [Version; 2] = [(5, "o5", "paid", 40), (1, "o1", "paid", 50)];
    no_commit_then_later_versions_merge(&env, &ingestor, &p, base, m, &c).await;
}

/// Position deletes in a delta that also appended the file they delete from, two delete
/// snapshots naming the same file, and positions past the first batch a reader returns (8192
/// rows): the run equals the batch, and later runs stay equal.
#[tokio::test]
async fn position_deletes_on_a_file_of_the_same_delta_twice_and_past_the_first_batch() {
    let (env, ingestor, p, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    let first = random_versions(200, 50, 7);
    ingest_random(&env, &ingestor, "orders/r1.jsonl", base, &mut m, &first).await;
    p.run(LATEST, soon()).await.unwrap();
    assert_eq!(sink_rows(&env), m.live());

    // One delta: a large object appended, then two delete snapshots on its file(s).
    let big = crate::latest::later_versions(10_000, 50, 8, 1);
    ingest_random(&env, &ingestor, "orders/r2.jsonl", base, &mut m, &big).await;
    let source = p.committer().load(&env.ident()).await.unwrap();
    // In one key bucket only: the newest version of a key (its latest changes), and versions
    // far into the object (past the first 8192 rows). Only that bucket is rebuilt: a position
    // read wrong would name another key, most likely in another bucket.
    let b = bucket4(big[0].0);
    let newest = first
        .iter()
        .chain(&big)
        .filter(|v| v.0 == big[0].0)
        .max_by(|x, y| (x.3, &x.1, &x.2).cmp(&(y.3, &y.1, &y.2)))
        .unwrap()
        .1
        .clone();
    let far: Vec<String> = big[9000..]
        .iter()
        .filter(|v| bucket4(v.0) == b)
        .take(3)
        .map(|v| v.1.clone())
        .collect();
    assert_eq!(far.len(), 3);
    let doomed: std::collections::BTreeSet<String> =
        far.iter().cloned().chain([newest.clone()]).collect();
    let v1 = rows_where(&source, |_, o, _| o == newest || o == far[0]).await;
    commit_row_deletes(&env, &source, vec![RowDeletes::Positions(v1, false)]).await;
    let source = p.committer().load(&env.ident()).await.unwrap();
    let v2 = rows_where(&source, |_, o, _| far[1..].iter().any(|f| f == o)).await;
    assert!(
        v2.iter().flat_map(|(_, p)| p).any(|&p| p >= 8192),
        "a deleted row past the first batch: {v2:?}"
    );
    commit_row_deletes(&env, &source, vec![RowDeletes::Positions(v2, true)]).await;
    let kept = first
        .iter()
        .chain(&big)
        .filter(|v| !doomed.contains(&v.1))
        .map(|(c, o, s, t)| (*c, o.as_str(), s.as_str(), *t));
    let m = model_of(kept);
    let r = p.run(LATEST, soon()).await.unwrap();
    assert_eq!(
        (r.row_changes, r.buckets_rebuilt),
        (2, 1),
        "one bucket: {r:?}"
    );
    assert_eq!(sink_rows(&env), m.live(), "the deleted versions are gone");
    assert_reconciled(&p, "after deletes in the delta that appended the file").await;
    let again = p.run(LATEST, soon()).await.unwrap();
    assert_eq!((again.row_changes, again.sink_snapshot), (0, None));
}

/// Equality deletes (rows deleted by value) are not read: the run stops naming the fix.
#[tokio::test]
async fn a_source_equality_delete_stops_a_latest_run_naming_the_fix() {
    let (env, ingestor, p, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    let a: [Version; 2] = [(1, "o1", "placed", 10), (2, "o2", "placed", 10)];
    ingest(&env, &ingestor, "orders/a.jsonl", base, &mut m, &a).await;
    p.run(LATEST, soon()).await.unwrap();
    let source = p.committer().load(&env.ident()).await.unwrap();
    let victim = floe::scan::live_files(&source).await.unwrap().remove(0);
    commit_row_deletes(
        &env,
        &source,
        vec![RowDeletes::CustomerEquals(Box::new(victim), 1)],
    )
    .await;
    let e = p.run(LATEST, soon()).await.unwrap_err();
    assert_eq!(e.kind(), floe::ErrorKind::Stale, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("equality delete") && msg.contains("copy-on-write") && msg.contains("refresh"),
        "{msg}"
    );
    assert_eq!(sink_rows(&env), m.live(), "nothing applied");
}

#[tokio::test]
async fn a_run_behind_a_tombstone_rebuild_re_plans_instead_of_applying_them() {
    let (env, ingestor, p, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    let a: [Version; 2] = [(1, "o1", "placed", 10), (2, "o2", "cancelled", 10)];
    ingest(&env, &ingestor, "orders/a.jsonl", base, &mut m, &a).await;
    p.run(LATEST, soon()).await.unwrap();
    // The tombstones say they were rebuilt at a source sequence this source has not reached
    // (as a run that read a later source snapshot leaves them): a run at the current one must
    // not merge with them.
    let source = p.committer().load(&env.ident()).await.unwrap();
    let uuid = source.metadata().uuid().to_string();
    let ahead = source.metadata().last_sequence_number() + 2;
    let tt = floe::catalog::table_ident(&env.config, TOMBSTONES).unwrap();
    let props = std::collections::HashMap::from([
        (floe::summary::TOMBSTONES_SOURCE.to_string(), uuid),
        (
            floe::summary::TOMBSTONES_REBUILT.to_string(),
            ahead.to_string(),
        ),
    ]);
    let change = floe::snapshot::Change::append(Vec::new(), props);
    let limits = floe::commit::CommitLimits {
        max_attempts: 5,
        deadline: soon(),
        skew: std::time::Duration::from_secs(60),
    };
    p.committer()
        .commit(&tt, &limits, move |_| {
            Ok(floe::commit::Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
    let b: [Version; 1] = [(1, "o1", "paid", 20)];
    ingest(&env, &ingestor, "orders/b.jsonl", base, &mut m, &b).await;
    let e = p.run(LATEST, soon()).await.unwrap_err();
    assert!(
        e.is_retryable() && e.to_string().contains("re-plans"),
        "{e}"
    );
    // Once the source has reached that sequence, the run goes ahead.
    let c: [Version; 1] = [(3, "o3", "placed", 5)];
    ingest(&env, &ingestor, "orders/c.jsonl", base, &mut m, &c).await;
    p.run(LATEST, soon()).await.unwrap();
    assert_eq!(sink_rows(&env), m.live());
}

#[tokio::test]
async fn a_removed_file_already_gone_rebuilds_every_bucket() {
    let (env, ingestor, p, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    for i in 0..2 {
        let v = random_versions(80, 30, 500 + i);
        ingest_random(
            &env,
            &ingestor,
            &format!("orders/g{i}.jsonl"),
            base,
            &mut m,
            &v,
        )
        .await;
    }
    p.run(LATEST, soon()).await.unwrap();
    // Another writer deletes a whole file, and the file is gone from storage before the run
    // (an engine that deletes eagerly): the affected keys are unknown.
    let t = p.committer().load(&env.ident()).await.unwrap();
    let victim = floe::scan::live_files(&t).await.unwrap().remove(0);
    let path = victim.file.file_path().to_string();
    let mut change = floe::snapshot::Change::append(Vec::new(), Default::default());
    change.operation = iceberg::spec::Operation::Delete;
    change.removed = vec![path.clone()];
    let limits = floe::commit::CommitLimits {
        max_attempts: 5,
        deadline: soon(),
        skew: std::time::Duration::from_secs(60),
    };
    p.committer()
        .commit(&env.ident(), &limits, move |_| {
            Ok(floe::commit::Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
    t.file_io().delete(&path).await.unwrap();
    let r = p.run(LATEST, soon()).await.unwrap();
    assert_eq!(
        (r.row_changes, r.buckets_rebuilt),
        (1, 4),
        "every bucket: {r:?}"
    );
    assert_reconciled(&p, "after the rebuild of every bucket").await;
}

/// The key bucket of customer `c` (the sample pipeline's 4 buckets).
fn bucket4(c: i64) -> i32 {
    let f = iceberg::transform::create_transform_function(&iceberg::spec::Transform::Bucket(4))
        .unwrap();
    match f.transform_literal(&iceberg::spec::Datum::long(c)).unwrap() {
        Some(d) => match d.literal() {
            iceberg::spec::PrimitiveLiteral::Int(b) => *b,
            other => panic!("bucket {other:?}"),
        },
        None => panic!("no bucket"),
    }
}

fn limits() -> floe::commit::CommitLimits {
    floe::commit::CommitLimits {
        max_attempts: 5,
        deadline: soon(),
        skew: std::time::Duration::from_secs(60),
    }
}

/// The race of a rebuilding run A with a merging run B that read the source before another
/// writer's row change: B commits a tombstone (a delete the row change took back) after A read
/// the tombstones, in a bucket A rebuilds without any tombstone file change. B's tombstone
/// commit applies only if no rebuild landed since it read the tombstones (as
/// `commit_tombstones` checks); A's rebuild must leave that mark even when its tombstones do
/// not change, else B's false tombstone lands and the next merge of the bucket deletes the key.
#[tokio::test]
async fn a_rebuild_without_tombstone_changes_still_fences_an_older_runs_tombstones() {
    let (env, ingestor, p, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    let k = 1;
    let j = (2..200).find(|j| bucket4(*j) == bucket4(k)).unwrap();
    ingest(
        &env,
        &ingestor,
        "orders/a1.jsonl",
        base,
        &mut m,
        &[(k, "o1", "placed", 1)],
    )
    .await;
    p.run(LATEST, soon()).await.unwrap();
    // a2: a delete of k. Run B reads the source at a2 and lands its tombstone (k, seq(a2)):
    // captured here, then taken out again, to be landed after A read the tombstones.
    let mut m2 = Model::default();
    ingest(
        &env,
        &ingestor,
        "orders/a2.jsonl",
        base,
        &mut m2,
        &[(k, "o1", "cancelled", 2)],
    )
    .await;
    let b = env
        .processor_with(faulty_on(LATEST, Fault::AfterMetadata))
        .await;
    assert!(
        b.run(LATEST, soon()).await.is_err(),
        "B's sink commit is lost"
    );
    let tt = floe::catalog::table_ident(&env.config, TOMBSTONES).unwrap();
    let t = p.committer().load(&tt).await.unwrap();
    let mut b_files = floe::scan::live_files(&t).await.unwrap();
    assert_eq!(b_files.len(), 1, "B's tombstone");
    let b_file = b_files.remove(0).file;
    let mut undo = floe::snapshot::Change::append(Vec::new(), Default::default());
    undo.operation = iceberg::spec::Operation::Delete;
    undo.removed = vec![b_file.file_path().to_string()];
    p.committer()
        .commit(&tt, &limits(), move |_| {
            Ok(floe::commit::Plan::Apply(undo.clone()))
        })
        .await
        .unwrap();
    let read_by_b = p.committer().load(&tt).await.unwrap();
    let mark = |t: &iceberg::table::Table| {
        t.metadata().current_snapshot().and_then(|s| {
            s.summary()
                .additional_properties
                .get(floe::summary::TOMBSTONES_REBUILT)
                .cloned()
        })
    };
    let b_mark = mark(&read_by_b);
    // Another writer deletes a2's file (R); run A reads the source at R and rebuilds bucket X.
    env.pyiceberg_run("orders", "t.delete(\"status = 'cancelled'\")");
    let r = p.run(LATEST, soon()).await.unwrap();
    assert!(r.row_changes >= 1 && r.buckets_rebuilt >= 1, "{r:?}");
    assert_eq!(sink_rows(&env), m.live(), "k live");
    assert_eq!(env.pyiceberg_rows(TOMBSTONES)["rows"], 0);
    // B's tombstone commit, with B's guard: no rebuild since the version B read.
    let props = read_by_b
        .metadata()
        .current_snapshot()
        .unwrap()
        .summary()
        .additional_properties
        .clone();
    let land = floe::snapshot::Change::append(vec![b_file], props);
    p.committer()
        .commit(&tt, &limits(), move |t| {
            Ok(match mark(t) == b_mark {
                true => floe::commit::Plan::Apply(land.clone()),
                false => floe::commit::Plan::Skip(floe::commit::Skipped::Obsolete(
                    "rebuilt since B read".into(),
                )),
            })
        })
        .await
        .unwrap();
    // The next merge of bucket X keeps k.
    ingest(
        &env,
        &ingestor,
        "orders/j.jsonl",
        base,
        &mut m,
        &[(j, "oj", "placed", 3)],
    )
    .await;
    p.run(LATEST, soon()).await.unwrap();
    assert_eq!(sink_rows(&env), m.live(), "k still live");
    assert_reconciled(&p, "after B's tombstone").await;
}

/// Another writer's `delete` of one of the source's live files (a row change every later run
/// of the latest pipeline retracts).
async fn delete_a_source_file(env: &TestEnv, p: &Processor) {
    let t = p.committer().load(&env.ident()).await.unwrap();
    let victim = floe::scan::live_files(&t).await.unwrap().remove(0);
    let mut change = floe::snapshot::Change::append(Vec::new(), Default::default());
    change.operation = iceberg::spec::Operation::Delete;
    change.removed = vec![victim.file.file_path().to_string()];
    p.committer()
        .commit(&env.ident(), &limits(), move |_| {
            Ok(floe::commit::Plan::Apply(change.clone()))
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_rebuild_past_the_deadline_stops_with_a_retryable_error_naming_the_refresh() {
    let (env, ingestor, p, base, mut m) = setup("sqlite", &pipeline(), 2).await;
    for i in 0..4 {
        let v = random_versions(40, 20, 700 + i);
        let key = format!("orders/d{i}.jsonl");
        ingest_random(&env, &ingestor, &key, base, &mut m, &v).await;
    }
    p.run(LATEST, soon()).await.unwrap();
    delete_a_source_file(&env, &p).await;
    let tt = floe::catalog::table_ident(&env.config, TOMBSTONES).unwrap();
    let before = p.committer().load(&tt).await.unwrap();
    let e = p
        .run(
            LATEST,
            std::time::Instant::now() + std::time::Duration::from_millis(1),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), floe::ErrorKind::DeadlineExceeded, "{e}");
    assert!(e.is_retryable(), "{e}");
    assert!(
        e.to_string()
            .contains("floe process refresh --pipeline customer_latest_order"),
        "{e}"
    );
    let after = p.committer().load(&tt).await.unwrap();
    assert_eq!(
        after.metadata().current_snapshot_id(),
        before.metadata().current_snapshot_id(),
        "nothing committed"
    );
    // With time, the run rebuilds.
    let r = p.run(LATEST, soon()).await.unwrap();
    assert!(r.buckets_rebuilt >= 1, "{r:?}");
    assert_reconciled(&p, "after the rebuild").await;
}

#[tokio::test]
async fn a_failing_latest_pipeline_does_not_stop_the_other_pipelines_of_a_batch() {
    let append = r#"
[[pipelines]]
name = "order_ids"
source = "orders"
sink = "order_ids"
mode = "append"
keys = ["order_id"]
sql = "SELECT order_id, customer_id FROM source"
"#;
    let (env, ingestor, p, base, mut m) =
        setup("sqlite", &format!("{}{append}", pipeline()), 2).await;
    let a: [Version; 2] = [(1, "o1", "placed", 10), (2, "o2", "placed", 10)];
    ingest(&env, &ingestor, "orders/a.jsonl", base, &mut m, &a).await;
    let batch = serde_json::json!({"detail-type": "Scheduled Event"});
    let names = p.pipelines_for(&batch);
    assert_eq!(names[names.len() - 2..], [LATEST, "order_ids"], "{names:?}");
    let (reports, errors) = p.handle_payload(&batch, soon()).await;
    assert!(
        errors.is_empty() && reports.len() == names.len(),
        "{errors:?}"
    );
    // The latest pipeline fails (its sink's catalog loads fail); the append pipeline after it
    // in the batch still commits the new rows.
    let b: [Version; 1] = [(3, "o3", "placed", 20)];
    ingest(&env, &ingestor, "orders/b.jsonl", base, &mut m, &b).await;
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let failing: std::sync::Arc<dyn iceberg::Catalog> =
        std::sync::Arc::new(floe::catalog::Hooked::new(
            catalog,
            crate::faults::FailingLoads {
                table: LATEST.into(),
                failures: std::sync::atomic::AtomicU32::new(1000),
            },
        ));
    let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
    let p = Processor::with_parts(
        env.config.clone(),
        floe::commit::Committer::new(failing, swap),
    );
    let result = p.handle_event(&batch, soon()).await;
    assert!(floe::lambda::process_response(&result).is_err());
    let (reports, errors) = (result.reports, result.errors);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].to_string().contains(LATEST), "{}", errors[0]);
    assert_eq!(reports.len(), names.len() - 1, "{reports:?}");
    let after = reports.iter().find(|r| r.pipeline == "order_ids").unwrap();
    assert!(after.sink_snapshot.is_some(), "{after:?}");
}
