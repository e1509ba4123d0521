//! Schema changes validated against their consumers, and deprecation as a process: schema-diff
//! names the pipeline (column, SQL position) a proposal breaks; ingest refuses an additive change
//! that would break a pipeline per `on_consumer_break`; deprecated columns are listed with owner
//! and readers; `drop-column` is refused before its date or while read, and done through the
//! commit loop (PyIceberg still reads the table, ingest does not re-add the column).

use floe::config::Config;
use floe::consumers::Verdict;
use floe::drop_column::{drop_column, DropRequest};
use floe::ingest::Status;

use crate::harness::{orders, TestEnv};

/// Appends `,"field":value` to every JSON line of `text`.
fn with_field(text: &str, field: &str, value: &str) -> String {
    text.lines()
        .map(|l| format!("{},\"{field}\":{value}}}\n", l.trim_end_matches('}')))
        .collect()
}

/// The test config with `orders_extra` in each table block and `tail` appended.
fn reconfigure(env: &mut TestEnv, orders_extra: &str, tail: &str) {
    let text = format!(
        "{}\n{tail}",
        env.toml.replace(
            "target_file_size_mb = 128\n",
            &format!("target_file_size_mb = 128\n{orders_extra}\n"),
        )
    );
    env.toml = text.clone();
    env.config = Config::parse(&text, "test floe.toml").expect("test config");
}

fn day(offset: i64) -> String {
    (chrono::Utc::now().date_naive() + chrono::Duration::days(offset)).to_string()
}

/// A pipeline whose `SELECT *` output gains whatever the source gains, plus an alias `net`.
const NET_PIPELINE: &str = r#"
[[pipelines]]
name = "orders_net"
source = "orders"
sink = "orders_net"
mode = "append"
sql = """
SELECT *,
       amount * 0.9 AS net
FROM source
"""
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_diff_names_the_consumer_a_removed_column_breaks() {
    let env = TestEnv::with_pipelines("sqlite", "").await;
    let ingestor = env.ingestor().await;
    env.put("orders/a.jsonl", orders(20, 1)).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();

    // Unchanged config: every consumer plans.
    let r = floe::schema_diff::schema_diff(&env.config, "orders", None)
        .await
        .unwrap();
    assert_eq!(r.consumers.len(), 2, "{r:?}");
    assert!(!r.consumers_break, "{r:?}");

    // The config drops payment_method, which suspicious_orders reads (lines 1 and 4 of its SQL).
    let mut cfg = env.config.clone();
    let t = cfg.tables.iter_mut().find(|t| t.name == "orders").unwrap();
    t.columns.retain(|c| c.name != "payment_method");
    let r = floe::schema_diff::schema_diff(&cfg, "orders", None)
        .await
        .unwrap();
    assert!(
        r.consumers_break,
        "the CLI exits 2 on a breaking consumer: {r:?}"
    );
    let sus = r
        .consumers
        .iter()
        .find(|c| c.pipeline == "suspicious_orders")
        .unwrap();
    match &sus.verdict {
        Verdict::Breaks {
            column, position, ..
        } => {
            assert_eq!(column.as_deref(), Some("payment_method"));
            // DataFusion's span (the WHERE clause is planned first: line 4, column 26) or the
            // first mention in the text (`SELECT … amount, payment_method,`: line 1, column 47).
            let position = position.as_deref().expect("a position");
            assert!(matches!(position, "4:26" | "1:47"), "{position}");
        }
        Verdict::Ok => panic!("suspicious_orders reads payment_method: {r:?}"),
    }
    assert!(!sus.already_broken);
    let rev = r
        .consumers
        .iter()
        .find(|c| c.pipeline == "revenue_per_region_minute")
        .unwrap();
    assert_eq!(rev.verdict, Verdict::Ok);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["consumers"][0]["status"], "breaks", "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_refuses_a_change_that_would_break_a_consumer_per_policy() {
    // Default policy: quarantine.
    let mut env = TestEnv::new("sqlite").await;
    reconfigure(&mut env, "", NET_PIPELINE);
    let ingestor = env.ingestor().await;
    env.put("orders/base.jsonl", orders(10, 1)).await;
    env.ingest(&ingestor, "orders/base.jsonl").await.unwrap();
    let schema_before = ingestor
        .catalog()
        .load_table(&env.ident())
        .await
        .unwrap()
        .metadata()
        .current_schema_id();

    // A new field `net` collides with the pipeline's alias under `SELECT *`: 4 records carry it.
    let mixed = format!(
        "{}{}",
        with_field(&orders(4, 2), "net", "1.5"),
        orders(6, 3)
    );
    env.put("orders/net.jsonl", mixed).await;
    let r = env.ingest(&ingestor, "orders/net.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    assert_eq!(r.schema_change, None, "{r:?}");
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (10, 6, 4)
    );
    assert!(r.unknown_fields.contains(&"net".to_string()), "{r:?}");
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(table.metadata().current_schema_id(), schema_before);
    assert!(table
        .metadata()
        .current_schema()
        .field_by_name("net")
        .is_none());
    let q = r.quarantine.clone().expect("a quarantine object");
    let key = q.split_once(&format!("{}/", env.bucket)).unwrap().1;
    let body = String::from_utf8(env.get(key).await.unwrap()).unwrap();
    assert_eq!(body.lines().count(), 4);
    for line in body.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.contains("orders_net") && reason.contains("`net`"),
            "{reason}"
        );
    }

    // A harmless additive change is still committed with its data.
    env.put(
        "orders/coupon.jsonl",
        with_field(&orders(5, 4), "coupon", "\"X\""),
    )
    .await;
    let r = env.ingest(&ingestor, "orders/coupon.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed);
    assert!(r.schema_change.is_some(), "{r:?}");
    assert_eq!(r.records_committed, 5);
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert!(table
        .metadata()
        .current_schema()
        .field_by_name("coupon")
        .is_some());

    // Policy stop: the object fails, not retryable, nothing committed.
    let mut env = TestEnv::new("sqlite").await;
    reconfigure(&mut env, "on_consumer_break = \"stop\"", NET_PIPELINE);
    let ingestor = env.ingestor().await;
    env.put("orders/base.jsonl", orders(10, 1)).await;
    env.ingest(&ingestor, "orders/base.jsonl").await.unwrap();
    let before = ingestor
        .catalog()
        .load_table(&env.ident())
        .await
        .unwrap()
        .metadata()
        .current_snapshot_id();
    env.put("orders/net.jsonl", with_field(&orders(4, 2), "net", "1.5"))
        .await;
    let e = env.ingest(&ingestor, "orders/net.jsonl").await.unwrap_err();
    assert!(!e.is_retryable(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("orders_net") && text.contains("`net`") && text.contains("stop"),
        "{text}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(table.metadata().current_snapshot_id(), before);
    assert!(table
        .metadata()
        .current_schema()
        .field_by_name("net")
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprecated_columns_are_listed_with_owner_dates_and_readers() {
    let mut env = TestEnv::with_pipelines("sqlite", "").await;
    let since = day(-30);
    let after = day(30);
    let text = env.toml.replace(
        "{ name = \"payment_method\", type = \"string\" }",
        &format!(
            "{{ name = \"payment_method\", type = \"string\", owner = \"payments-team@example.com\", deprecated_since = \"{since}\", remove_after = \"{after}\" }}"
        ),
    );
    env.config = Config::parse(&text, "test floe.toml").unwrap();
    let ingestor = env.ingestor().await;
    env.put("orders/a.jsonl", orders(20, 1)).await;
    let r = env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    assert_eq!(r.deprecated_produced, vec!["payment_method".to_string()]);

    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let planner = floe::consumers::Planner::default();
    let status = floe::consumers::deprecation_status(
        &planner,
        &env.config,
        "orders",
        Some(table.metadata()),
        chrono::Utc::now().date_naive(),
    )
    .await;
    let pm = status
        .iter()
        .find(|d| d.deprecation.column == "payment_method")
        .expect("payment_method listed");
    assert_eq!(
        pm.deprecation.owner.as_deref(),
        Some("payments-team@example.com")
    );
    assert_eq!(pm.deprecation.since.map(|d| d.to_string()), Some(since));
    assert_eq!(pm.deprecation.remove_after.to_string(), after);
    assert_eq!(pm.produced, Some(true));
    assert_eq!(pm.read_by, vec!["suspicious_orders".to_string()]);
    assert!(!pm.removable);
    assert!(pm.describe().contains("payments-team@example.com"));

    let diff = floe::schema_diff::schema_diff(&env.config, "orders", None)
        .await
        .unwrap();
    let d = diff
        .deprecations
        .iter()
        .find(|d| d.deprecation.column == "payment_method")
        .expect("schema-diff lists it");
    assert_eq!(d.read_by, vec!["suspicious_orders".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_column_is_refused_before_its_date_and_while_read_then_done() {
    let mut env = TestEnv::with_pipelines("sqlite", "").await;
    let deprecate = |toml: &str, col: &str, after: &str| {
        toml.replace(
            &format!("{{ name = \"{col}\", type = \"string\" }}"),
            &format!(
                "{{ name = \"{col}\", type = \"string\", owner = \"team-{col}\", remove_after = \"{after}\" }}"
            ),
        )
    };
    let base = env.toml.clone();
    env.config = Config::parse(&deprecate(&base, "payment_method", &day(10)), "t").unwrap();
    let ingestor = env.ingestor().await;
    env.put("orders/a.jsonl", orders(20, 1)).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    let committer = {
        let catalog = floe::catalog::connect(&env.config).await.unwrap();
        let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
        floe::commit::Committer::new(catalog, swap)
    };
    let req = |column: &str, force: bool, dry_run: bool| DropRequest {
        table: "orders".into(),
        column: column.into(),
        dry_run,
        force,
        today: chrono::Utc::now().date_naive(),
    };
    let snapshots = |t: &iceberg::table::Table| t.metadata().snapshots().count();
    let before = snapshots(&ingestor.catalog().load_table(&env.ident()).await.unwrap());

    // Before its date: refused, naming the date and the owner; nothing committed.
    let r = drop_column(&env.config, &committer, &req("payment_method", true, false))
        .await
        .unwrap();
    let why = r.refused.clone().expect("refused before remove_after");
    assert!(
        why.contains(&day(10)) && why.contains("team-payment_method"),
        "{why}"
    );

    // After its date, while suspicious_orders reads it: refused without --force (a dry run
    // says the same).
    env.config = Config::parse(&deprecate(&base, "payment_method", &day(-1)), "t").unwrap();
    let r = drop_column(
        &env.config,
        &committer,
        &req("payment_method", false, false),
    )
    .await
    .unwrap();
    let why = r.refused.clone().expect("refused while read");
    assert!(why.contains("suspicious_orders"), "{why}");
    assert_eq!(r.readers.len(), 1);
    let dry = drop_column(&env.config, &committer, &req("payment_method", true, true))
        .await
        .unwrap();
    assert!(
        dry.refused.is_none() && dry.snapshot_id.is_none(),
        "{dry:?}"
    );
    // A column that is not deprecated is refused too.
    let r = drop_column(&env.config, &committer, &req("status", false, false))
        .await
        .unwrap();
    assert!(r.refused.is_some());
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(snapshots(&table), before, "refusals commit nothing");

    // With --force: dropped in a snapshot of its own, through the commit loop.
    let r = drop_column(&env.config, &committer, &req("payment_method", true, false))
        .await
        .unwrap();
    assert!(r.refused.is_none(), "{r:?}");
    let id = r.snapshot_id.expect("a snapshot");
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let md = table.metadata();
    assert_eq!(md.current_snapshot_id(), Some(id));
    assert!(md
        .current_schema()
        .field_by_name("payment_method")
        .is_none());
    let summary = &md
        .current_snapshot()
        .unwrap()
        .summary()
        .additional_properties;
    assert_eq!(
        summary
            .get(floe::summary::SCHEMA_CHANGE)
            .map(String::as_str),
        Some("dropped payment_method")
    );
    // Again: already dropped, nothing committed.
    let again = drop_column(&env.config, &committer, &req("payment_method", true, false))
        .await
        .unwrap();
    assert!(again.already_dropped && again.snapshot_id.is_none());

    // No consumer reads `currency`: dropped once its date has come, no --force needed.
    let both = deprecate(
        &deprecate(&base, "payment_method", &day(-1)),
        "currency",
        &day(0),
    );
    env.config = Config::parse(&both, "t").unwrap();
    let r = drop_column(&env.config, &committer, &req("currency", false, false))
        .await
        .unwrap();
    assert!(r.refused.is_none() && r.readers.is_empty(), "{r:?}");
    assert!(r.snapshot_id.is_some());

    // Inputs still carrying the dropped columns: ingested, the columns not added back.
    let ingestor = env.ingestor().await;
    env.put("orders/b.jsonl", orders(7, 2)).await;
    let r = env.ingest(&ingestor, "orders/b.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    assert_eq!(r.records_committed, 7);
    assert_eq!(r.schema_change, None, "{r:?}");
    assert!(
        r.unknown_fields.contains(&"payment_method".to_string())
            && r.unknown_fields.contains(&"currency".to_string()),
        "{r:?}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let schema = table.metadata().current_schema();
    assert!(schema.field_by_name("payment_method").is_none());
    assert!(schema.field_by_name("currency").is_none());

    // An independent reader still reads every row, without the dropped columns.
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 27, "{py}");
    let cols: Vec<&str> = py["columns"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    assert!(
        !cols.contains(&"payment_method") && !cols.contains(&"currency"),
        "{cols:?}"
    );
    assert!(cols.contains(&"amount"));
}

/// The drop on Glue (floe's own UpdateTable with VersionId) and REST (the commit endpoint with
/// schema requirements): the schema without the column is installed and PyIceberg reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_column_commits_on_glue_and_rest() {
    for kind in ["glue", "rest"] {
        let mut env = TestEnv::new(kind).await;
        let text = env.toml.replace(
            "{ name = \"currency\", type = \"string\" }",
            &format!(
                "{{ name = \"currency\", type = \"string\", owner = \"fx\", remove_after = \"{}\" }}",
                day(-1)
            ),
        );
        env.config = Config::parse(&text, "t").unwrap();
        let ingestor = env.ingestor().await;
        env.put("orders/a.jsonl", orders(12, 1)).await;
        env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
        let committer = {
            let catalog = floe::catalog::connect(&env.config).await.unwrap();
            let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
            floe::commit::Committer::new(catalog, swap)
        };
        let req = DropRequest {
            table: "orders".into(),
            column: "currency".into(),
            dry_run: false,
            force: false,
            today: chrono::Utc::now().date_naive(),
        };
        let r = drop_column(&env.config, &committer, &req).await.unwrap();
        assert!(
            r.refused.is_none() && r.snapshot_id.is_some(),
            "{kind}: {r:?}"
        );
        let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
        assert!(
            table
                .metadata()
                .current_schema()
                .field_by_name("currency")
                .is_none(),
            "{kind}"
        );
        env.put("orders/b.jsonl", orders(3, 2)).await;
        let b = env.ingest(&ingestor, "orders/b.jsonl").await.unwrap();
        assert_eq!(b.status, Status::Committed, "{kind}: {b:?}");
        let py = env.pyiceberg();
        assert_eq!(py["rows"], 15, "{kind}: {py}");
        assert!(
            !py["columns"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c == "currency"),
            "{kind}: {py}"
        );
    }
}

/// The refusal note added to quarantined records counts against `max_quarantine_bytes`: an
/// object whose rejected records fit the limit as spooled, but not once each reason carries the
/// note, must not leave a quarantine object over the limit (the note used to be added by
/// rewriting the spool after the limit was checked, up to 512 bytes more per record, with a
/// second copy of the spool on local disk meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refusal_note_counts_against_max_quarantine_bytes() {
    let mut env = TestEnv::new("sqlite").await;
    reconfigure(&mut env, "", NET_PIPELINE);
    let ingestor = env.ingestor().await;
    env.put("orders/base.jsonl", orders(10, 1)).await;
    env.ingest(&ingestor, "orders/base.jsonl").await.unwrap();
    let net = with_field(&orders(20, 2), "net", "1.5");

    // Unlimited: measure the quarantine object with and without the notes.
    env.put("orders/net-a.jsonl", net.clone()).await;
    let r = env.ingest(&ingestor, "orders/net-a.jsonl").await.unwrap();
    assert_eq!(r.records_quarantined, 20, "{r:?}");
    let q = r.quarantine.clone().expect("a quarantine object");
    let key = q.split_once(&format!("{}/", env.bucket)).unwrap().1;
    let body = String::from_utf8(env.get(key).await.unwrap()).unwrap();
    let noted = body.len() as u64;
    let mut plain = 0u64;
    for line in body.lines() {
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        let reason = v["reason"].as_str().unwrap().to_string();
        let (before, _) = reason
            .split_once("; schema change refused")
            .expect("the note");
        v["reason"] = serde_json::Value::String(before.to_string());
        plain += serde_json::to_vec(&v).unwrap().len() as u64 + 1;
    }
    assert!(plain < noted, "{plain} {noted}");
    let limit = (plain + noted) / 2;

    // A limit between the two: never a quarantine object over it.
    env.config.ingest.max_quarantine_bytes = limit;
    let ingestor = env.ingestor().await;
    env.put("orders/net-b.jsonl", net).await;
    match env.ingest(&ingestor, "orders/net-b.jsonl").await {
        Ok(r) => {
            let q = r.quarantine.clone().expect("a quarantine object");
            let key = q.split_once(&format!("{}/", env.bucket)).unwrap().1;
            let size = env.get(key).await.unwrap().len() as u64;
            assert!(
                size <= limit,
                "quarantine object of {size} bytes over max_quarantine_bytes = {limit}: {r:?}"
            );
        }
        Err(e) => {
            assert!(!e.is_retryable(), "{e}");
            assert!(e.to_string().contains("max_quarantine_bytes"), "{e}");
        }
    }
}

/// A CSV object bringing a refused column: under `quarantine` the records carrying a value for
/// it are quarantined, never committed without it (the CSV and Parquet decoders used to drop a
/// column the table lacks even when unknown fields were not allowed, so the "strict" second pass
/// committed every record and silently lost the refused column's values). Records with the
/// field empty commit; counts reconcile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_csv_column_quarantines_its_records_instead_of_losing_its_values() {
    let mut env = TestEnv::new("sqlite").await;
    reconfigure(&mut env, "", NET_PIPELINE);
    let ingestor = env.ingestor().await;
    env.put("orders/base.jsonl", orders(10, 1)).await;
    env.ingest(&ingestor, "orders/base.jsonl").await.unwrap();

    let mut csv = String::from("event_time,order_id,customer_id,amount,net\n");
    for i in 0..4 {
        csv.push_str(&format!("2026-11-30T10:00:00Z,n{i},{i},{i}.5,{i}.25\n"));
    }
    for i in 0..3 {
        csv.push_str(&format!("2026-11-30T10:00:00Z,e{i},{i},{i}.5,\n"));
    }
    env.put("csv/net.csv", csv).await;
    let r = env.ingest(&ingestor, "csv/net.csv").await.unwrap();
    assert_eq!(r.schema_change, None, "{r:?}");
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (7, 3, 4),
        "the 4 records with a `net` value must not commit without it: {r:?}"
    );
    let q = r.quarantine.clone().expect("a quarantine object");
    let key = q.split_once(&format!("{}/", env.bucket)).unwrap().1;
    let body = String::from_utf8(env.get(key).await.unwrap()).unwrap();
    assert_eq!(body.lines().count(), 4, "{body}");
    for line in body.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.contains("`net`") && reason.contains("orders_net"),
            "{reason}"
        );
    }
}

/// After `drop-column`, inputs keep carrying the dropped column for a while and ingest ignores
/// it. The consumer gate's second pass (unknown fields not allowed) must ignore it too: only the
/// records needing the refused change are quarantined, not every record still carrying the
/// dropped column (they used to be quarantined for nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_change_does_not_quarantine_records_for_a_dropped_column() {
    let mut env = TestEnv::new("sqlite").await;
    let dep = format!(
        "{{ name = \"currency\", type = \"string\", owner = \"team\", remove_after = \"{}\" }}",
        day(-1)
    );
    env.toml = env
        .toml
        .replace("{ name = \"currency\", type = \"string\" }", &dep);
    reconfigure(&mut env, "", NET_PIPELINE);
    let ingestor = env.ingestor().await;
    env.put("orders/base.jsonl", orders(10, 1)).await;
    env.ingest(&ingestor, "orders/base.jsonl").await.unwrap();
    let committer = {
        let catalog = floe::catalog::connect(&env.config).await.unwrap();
        let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
        floe::commit::Committer::new(catalog, swap)
    };
    let req = DropRequest {
        table: "orders".into(),
        column: "currency".into(),
        dry_run: false,
        // `SELECT *` reads every column.
        force: true,
        today: chrono::Utc::now().date_naive(),
    };
    let p = env.processor().await;
    let soon = || std::time::Instant::now() + std::time::Duration::from_secs(120);
    let run = p.run("orders_net", soon()).await.unwrap();
    assert_eq!(run.rows_in, 10, "{run:?}");
    let before_drop = ingestor
        .catalog()
        .load_table(&env.ident())
        .await
        .unwrap()
        .metadata()
        .current_snapshot_id()
        .unwrap();
    let r = drop_column(&env.config, &committer, &req).await.unwrap();
    assert!(r.snapshot_id.is_some(), "{r:?}");
    // Time travel: the snapshot before the drop still reads the column's values (old files keep
    // them under its id; the snapshot names its own schema).
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let batches: Vec<arrow::array::RecordBatch> = futures::TryStreamExt::try_collect(
        table
            .scan()
            .snapshot_id(before_drop)
            .select_all()
            .build()
            .unwrap()
            .to_arrow()
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    let old_values: usize = batches
        .iter()
        .map(|b| {
            let c = b
                .column_by_name("currency")
                .expect("currency at the old snapshot");
            c.len() - c.null_count()
        })
        .sum();
    assert_eq!(
        old_values, 10,
        "the pre-drop snapshot reads every currency value"
    );

    // Every record still carries `currency`; 4 bring the refused `net`.
    let ingestor = env.ingestor().await;
    let mixed = format!(
        "{}{}",
        with_field(&orders(4, 2), "net", "1.5"),
        orders(6, 3)
    );
    assert!(mixed.lines().all(|l| l.contains("\"currency\"")));
    env.put("orders/net.jsonl", mixed).await;
    let r = env.ingest(&ingestor, "orders/net.jsonl").await.unwrap();
    assert_eq!(r.schema_change, None, "{r:?}");
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (10, 6, 4),
        "only the records with `net` are quarantined: {r:?}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let schema = table.metadata().current_schema();
    assert!(schema.field_by_name("currency").is_none());
    assert!(schema.field_by_name("net").is_none());

    // The process function skips the drop's `replace` snapshot and reads only the new rows
    // (its checkpoint carried over it), with the current schema.
    let p = env.processor().await;
    let run = p.run("orders_net", soon()).await.unwrap();
    assert_eq!(run.rows_in, 6, "{run:?}");
    let run = p.run("orders_net", soon()).await.unwrap();
    assert_eq!(run.rows_in, 0, "{run:?}");
}

/// Only what breaks a consumer is refused: an object bringing a breaking field (`net`) and a
/// harmless one (`coupon`) still adds `coupon` with its records; a field additive ingest ignores
/// anyway (nested value) does not quarantine its record. Only the records with `net` are
/// quarantined (they used to be all quarantined: the whole change was refused and the second pass
/// refused every unknown field).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_breaking_part_of_a_change_is_refused() {
    let mut env = TestEnv::new("sqlite").await;
    reconfigure(&mut env, "", NET_PIPELINE);
    let ingestor = env.ingestor().await;
    env.put("orders/base.jsonl", orders(10, 1)).await;
    env.ingest(&ingestor, "orders/base.jsonl").await.unwrap();

    let mixed = format!(
        "{}{}{}",
        with_field(&orders(4, 2), "net", "1.5"),
        with_field(&orders(5, 3), "coupon", "\"X\""),
        with_field(&orders(3, 4), "extra", "{\"a\":1}"),
    );
    env.put("orders/mixed.jsonl", mixed).await;
    let r = env.ingest(&ingestor, "orders/mixed.jsonl").await.unwrap();
    assert_eq!(r.status, Status::Committed, "{r:?}");
    assert_eq!(
        (r.records_in, r.records_committed, r.records_quarantined),
        (12, 8, 4),
        "{r:?}"
    );
    assert_eq!(
        r.schema_change.as_deref(),
        Some("added coupon (string)"),
        "{r:?}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let schema = table.metadata().current_schema();
    assert!(schema.field_by_name("coupon").is_some());
    assert!(schema.field_by_name("net").is_none());
    let q = r.quarantine.clone().expect("a quarantine object");
    let key = q.split_once(&format!("{}/", env.bucket)).unwrap().1;
    let body = String::from_utf8(env.get(key).await.unwrap()).unwrap();
    assert_eq!(body.lines().count(), 4, "{body}");
    for line in body.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.contains("added net") && !reason.contains("coupon"),
            "{reason}"
        );
    }
}

/// A column the table's sort order uses is refused like a partition source: the metadata
/// without it would not build (iceberg: "Cannot find source column for sort field"), and other
/// engines refuse to load such a table. It used to pass every check and then fail the commit
/// with an internal error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_column_refuses_a_sort_order_column() {
    let mut env = TestEnv::with_orders_toml("sqlite", "sort = [\"region\"]").await;
    let dep = format!(
        "{{ name = \"region\", type = \"string\", owner = \"team\", remove_after = \"{}\" }}",
        day(-1)
    );
    env.toml = env
        .toml
        .replace("{ name = \"region\", type = \"string\" }", &dep);
    env.config = Config::parse(&env.toml, "t").unwrap();
    let ingestor = env.ingestor().await;
    env.put("orders/a.jsonl", orders(5, 1)).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    let committer = {
        let catalog = floe::catalog::connect(&env.config).await.unwrap();
        let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
        floe::commit::Committer::new(catalog, swap)
    };
    let req = DropRequest {
        table: "orders".into(),
        column: "region".into(),
        dry_run: false,
        force: true,
        today: chrono::Utc::now().date_naive(),
    };
    let r = drop_column(&env.config, &committer, &req)
        .await
        .expect("a refusal, not an error");
    let why = r.refused.clone().expect("refused");
    assert!(why.contains("sort"), "{why}");
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert!(table
        .metadata()
        .current_schema()
        .field_by_name("region")
        .is_some());
}

/// A pipeline that already fails on the current schema (it reads a column the table does not
/// have yet) is reported as already broken, and does not make every schema-diff exit 2: only a
/// break the proposal causes does (as at ingest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_diff_does_not_blame_the_proposal_for_an_already_broken_consumer() {
    let mut env = TestEnv::new("sqlite").await;
    reconfigure(
        &mut env,
        "",
        r#"
[[pipelines]]
name = "coupons"
source = "orders"
sink = "coupons"
mode = "append"
sql = "SELECT order_id, coupon FROM source"
"#,
    );
    let ingestor = env.ingestor().await;
    env.put("orders/a.jsonl", orders(5, 1)).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    let r = floe::schema_diff::schema_diff(&env.config, "orders", None)
        .await
        .unwrap();
    assert_eq!(r.consumers.len(), 1, "{r:?}");
    assert!(
        r.consumers[0].verdict.breaks() && r.consumers[0].already_broken,
        "{r:?}"
    );
    assert!(
        !r.consumers_break,
        "the unchanged config breaks nothing new: {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_joining_a_table_is_one_of_its_consumers() {
    let base = TestEnv::new("sqlite").await;
    let extra = format!(
        r#"
[[tables]]
name = "customers"
event_time = "updated_at"
columns = [
  {{ name = "customer_id", type = "long", required = true }},
  {{ name = "segment", type = "string", owner = "team-crm", remove_after = "{}" }},
  {{ name = "tier", type = "string" }},
  {{ name = "updated_at", type = "timestamptz", required = true }},
]

[[routes]]
bucket = "{}"
prefix = "customers/"
table = "customers"
format = "jsonl"

[[pipelines]]
name = "enriched"
source = "orders"
sink = "enriched"
mode = "append"
joins = ["customers"]
sql = """
SELECT o.order_id, o.amount, c.segment, o.event_time
FROM source o JOIN customers c ON o.customer_id = c.customer_id
"""
"#,
        day(-1),
        base.bucket
    );
    let env = crate::joins::extended(&base, &extra);
    let ingestor = env.ingestor().await;
    env.put("orders/a.jsonl", orders(20, 1)).await;
    env.ingest(&ingestor, "orders/a.jsonl").await.unwrap();
    env.put(
        "customers/c.jsonl",
        "{\"customer_id\":1,\"segment\":\"gold\",\"tier\":\"a\",\"updated_at\":\"2026-11-30T10:00:00Z\"}\n",
    )
    .await;
    env.ingest(&ingestor, "customers/c.jsonl").await.unwrap();

    // schema-diff of the dimension without `segment`: the joining pipeline breaks.
    let mut cfg = env.config.clone();
    let t = cfg
        .tables
        .iter_mut()
        .find(|t| t.name == "customers")
        .unwrap();
    t.columns.retain(|c| c.name != "segment");
    let r = floe::schema_diff::schema_diff(&cfg, "customers", None)
        .await
        .unwrap();
    let enriched = r
        .consumers
        .iter()
        .find(|c| c.pipeline == "enriched")
        .unwrap_or_else(|| panic!("the joining pipeline is a consumer: {r:?}"));
    assert!(
        enriched.verdict.breaks() && !enriched.already_broken,
        "{r:?}"
    );
    assert!(r.consumers_break, "{r:?}");
    // Without `tier`, which it does not read: fine.
    let mut cfg = env.config.clone();
    let t = cfg
        .tables
        .iter_mut()
        .find(|t| t.name == "customers")
        .unwrap();
    t.columns.retain(|c| c.name != "tier");
    let r = floe::schema_diff::schema_diff(&cfg, "customers", None)
        .await
        .unwrap();
    assert!(!r.consumers_break, "{r:?}");

    // drop-column of the joined column: refused naming the pipeline, unless forced.
    let committer = {
        let catalog = floe::catalog::connect(&env.config).await.unwrap();
        let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
        floe::commit::Committer::new(catalog, swap)
    };
    let req = DropRequest {
        table: "customers".into(),
        column: "segment".into(),
        dry_run: false,
        force: false,
        today: chrono::Utc::now().date_naive(),
    };
    let r = drop_column(&env.config, &committer, &req).await.unwrap();
    let why = r.refused.clone().expect("refused while joined");
    assert!(why.contains("enriched"), "{why}");
    assert_eq!(r.readers.len(), 1, "{r:?}");
    assert!(r.snapshot_id.is_none());
}
