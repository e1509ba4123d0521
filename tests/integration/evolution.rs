//! Schema evolution at ingest, by policy: additive (default), strict, ignore.

use std::collections::HashSet;

use arrow::array::{Array, Int64Array, StringArray};
use floe::ingest::Status;
use iceberg::spec::{PrimitiveType, Type};

use crate::harness::{orders, TestEnv};

fn with_field(text: &str, field: &str, value: &str) -> String {
    text.lines()
        .map(|l| format!("{},\"{field}\":{value}}}\n", l.trim_end_matches('}')))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_objects_adding_the_same_field_make_one_column() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    env.put("orders/base.jsonl", orders(10, 1)).await;
    env.ingest(&ingestor, "orders/base.jsonl").await.unwrap();
    let before = ingestor
        .catalog()
        .load_table(&env.ident())
        .await
        .unwrap()
        .metadata()
        .schemas_iter()
        .count();
    for i in 0..4u64 {
        env.put(
            &format!("orders/c{i}.jsonl"),
            with_field(&orders(15, 10 + i), "coupon", "\"XMAS\""),
        )
        .await;
    }
    let mut tasks = Vec::new();
    for i in 0..4 {
        tasks.push(env.spawn_ingest(&format!("orders/c{i}.jsonl")).await);
    }
    let mut changes = 0;
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        assert_eq!(r.status, Status::Committed, "{r:?}");
        assert_eq!(r.records_committed, 15);
        changes += usize::from(r.schema_change.is_some());
    }
    assert!(changes >= 1);
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let md = table.metadata();
    assert_eq!(
        md.schemas_iter().count(),
        before + 1,
        "one schema change for four objects"
    );
    let coupon = md
        .current_schema()
        .field_by_name("coupon")
        .expect("coupon column");
    assert!(!coupon.required);
    assert_eq!(*coupon.field_type, Type::Primitive(PrimitiveType::String));
    let summaries: Vec<_> = md
        .snapshots()
        .filter_map(|s| {
            s.summary()
                .additional_properties
                .get("floe.schema-change")
                .cloned()
        })
        .collect();
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    // Old rows read the new column as null, new rows have it.
    let batches = env.scan_all(ingestor.catalog().as_ref()).await;
    let (mut nulls, mut xmas) = (0, 0);
    for b in &batches {
        let c = b
            .column_by_name("coupon")
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone();
        nulls += c.null_count();
        xmas += c.iter().flatten().filter(|v| *v == "XMAS").count();
    }
    assert_eq!((nulls, xmas), (10, 60));
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 70, "{py}");
    assert!(
        py["columns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "coupon"),
        "{py}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn widening_int_to_long_across_files_then_a_scan_reads_both() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    // `items` is an int column; the second object carries a value beyond 32 bits.
    env.put("orders/w1.jsonl", orders(10, 21)).await;
    assert_eq!(
        env.ingest(&ingestor, "orders/w1.jsonl")
            .await
            .unwrap()
            .records_committed,
        10
    );
    let big = orders(5, 22).replace("\"items\":", "\"items\":5000000000");
    let big: String = big
        .lines()
        .map(|l| {
            // keep JSON valid: "items":5000000000<digit> → one big number
            format!("{l}\n")
        })
        .collect();
    env.put("orders/w2.jsonl", big).await;
    let r = env.ingest(&ingestor, "orders/w2.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (5, 0),
        "{r:?}"
    );
    assert_items_widened(&r);
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let items = table
        .metadata()
        .current_schema()
        .field_by_name("items")
        .unwrap()
        .clone();
    assert_eq!(*items.field_type, Type::Primitive(PrimitiveType::Long));
    let batches = env.scan_all(ingestor.catalog().as_ref()).await;
    let mut small = 0;
    let mut huge = 0;
    for b in &batches {
        let c = b
            .column_by_name("items")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("read as long")
            .clone();
        for v in c.iter().flatten() {
            if v > i32::MAX as i64 {
                huge += 1
            } else {
                small += 1
            }
        }
    }
    assert_eq!((small, huge), (10, 5));
    assert_eq!(env.pyiceberg()["rows"], 15);
}

/// The object's report says it widened `items` from int to long.
pub(crate) fn assert_items_widened(r: &floe::ingest::ObjectReport) {
    assert!(
        r.schema_change
            .as_deref()
            .unwrap_or("")
            .contains("widened items int → long"),
        "{r:?}"
    );
}

/// CSV as JSON lines: an integer beyond 32 bits in an `int` column widens it (it was
/// quarantined as out of range).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_value_beyond_int_widens_the_column_as_in_json_lines() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let mut csv = String::from("event_time,order_id,customer_id,amount,items\n");
    for i in 0..6 {
        let items = if i % 2 == 0 { 4_000_000_000i64 + i } else { i };
        csv.push_str(&format!("2026-11-30T10:00:00Z,w{i},{i},{i}.5,{items}\n"));
    }
    csv.push_str("2026-11-30T10:00:00Z,wbad,7,1,99999999999999999999\n");
    env.put("csv/wide.csv", csv).await;
    let r = env.ingest(&ingestor, "csv/wide.csv").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (6, 1),
        "beyond a long stays out of range: {r:?}"
    );
    assert_items_widened(&r);
    let batches = env.scan_all(ingestor.catalog().as_ref()).await;
    let mut items: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("items")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("read as long")
                .iter()
                .flatten()
                .collect::<Vec<_>>()
        })
        .collect();
    items.sort();
    assert_eq!(
        items,
        [1, 3, 5, 4_000_000_000, 4_000_000_002, 4_000_000_004]
    );
}

/// A new field whose integers pass a long: a `decimal(20, 0)` column holding them exactly
/// (helper-29). Before, 9223372036854775808 made `ext` a long column and the record bringing
/// it was quarantined as out of range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_field_beyond_a_long_becomes_an_exact_decimal_column() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    env.put(
        "orders/big.jsonl",
        with_field(&orders(3, 5), "ext", "9223372036854775808"),
    )
    .await;
    let r = env.ingest(&ingestor, "orders/big.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (3, 0),
        "{r:?}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let ext = table
        .metadata()
        .current_schema()
        .field_by_name("ext")
        .expect("ext column")
        .clone();
    assert_eq!(
        *ext.field_type,
        Type::Primitive(PrimitiveType::Decimal {
            precision: 20,
            scale: 0
        })
    );
    let batches = env.scan_all(ingestor.catalog().as_ref()).await;
    let values: Vec<i128> = batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("ext")
                .unwrap()
                .as_any()
                .downcast_ref::<arrow::array::Decimal128Array>()
                .expect("read as decimal")
                .iter()
                .flatten()
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(values, vec![9_223_372_036_854_775_808i128; 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_quarantines_unknown_fields_ignore_drops_them_and_breaking_values_are_quarantined() {
    // strict
    let env = TestEnv::with_orders_toml("sqlite", r#"schema_policy = "strict""#).await;
    let ingestor = env.ingestor().await;
    let mut text = orders(8, 31);
    text.push_str(&with_field(&orders(2, 32), "coupon", "\"X\""));
    env.put("orders/s.jsonl", text).await;
    let r = env.ingest(&ingestor, "orders/s.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (8, 2),
        "{r:?}"
    );
    assert!(r.schema_change.is_none());
    let q = r.quarantine.clone().unwrap();
    let q = String::from_utf8(
        env.get(q.trim_start_matches(&format!("s3://{}/", env.bucket)))
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(q.lines().all(|l| l.contains("coupon")), "{q}");

    // ignore
    let env = TestEnv::with_orders_toml("sqlite", r#"schema_policy = "ignore""#).await;
    let ingestor = env.ingestor().await;
    env.put(
        "orders/i.jsonl",
        with_field(&orders(6, 33), "coupon", "\"X\""),
    )
    .await;
    let r = env.ingest(&ingestor, "orders/i.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.unknown_fields.clone()),
        (6, vec!["coupon".to_string()]),
        "{r:?}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert!(table
        .metadata()
        .current_schema()
        .field_by_name("coupon")
        .is_none());

    // breaking under additive: a known field with an incompatible type is quarantined, the rest land
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let mut text = orders(7, 34);
    text.push_str(&orders(3, 35).replace(
        "\"customer_id\":",
        "\"customer_id\":\"not a number\",\"x_\":",
    ));
    env.put("orders/b.jsonl", text).await;
    let r = env.ingest(&ingestor, "orders/b.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (7, 3),
        "{r:?}"
    );
    let ids: HashSet<String> = table_ids(&env, &ingestor).await;
    assert_eq!(ids.len(), 7);
    assert_eq!(env.pyiceberg()["rows"], 7);
}

async fn table_ids(env: &TestEnv, ingestor: &floe::ingest::Ingestor) -> HashSet<String> {
    let batches = env.scan_all(ingestor.catalog().as_ref()).await;
    batches
        .iter()
        .flat_map(|b| {
            let c = b
                .column_by_name("order_id")
                .unwrap()
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .clone();
            c.iter().flatten().map(str::to_string).collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_diff_classifies_config_and_object_changes() {
    use floe::evolve::Class;
    use floe::schema_diff::schema_diff;
    let env = TestEnv::new("sqlite").await;
    let _ingestor = env.ingestor().await;
    let class_of = |r: &floe::schema_diff::DiffReport, f: &str| {
        r.changes
            .iter()
            .filter(|c| c.field == f)
            .map(|c| c.class)
            .max()
    };

    // The config proposes: widen items, add coupon, drop status.
    let mut cfg = env.config.clone();
    let t = cfg.tables.iter_mut().find(|t| t.name == "orders").unwrap();
    t.columns
        .iter_mut()
        .find(|c| c.name == "items")
        .unwrap()
        .type_name = "long".into();
    t.columns.retain(|c| c.name != "status");
    t.columns.push(floe::config::ColumnConfig {
        name: "coupon".into(),
        type_name: "string".into(),
        required: false,
        doc: None,
        deprecated: None,
        sensitive: None,
        ..Default::default()
    });
    let r = schema_diff(&cfg, "orders", None).await.unwrap();
    assert_eq!(class_of(&r, "items"), Some(Class::Compatible), "{r:?}");
    assert_eq!(class_of(&r, "coupon"), Some(Class::Additive));
    assert_eq!(class_of(&r, "status"), Some(Class::Breaking));
    assert!(r.breaking);

    // Deprecated with a past removal date: removing it is compatible; the rollout may proceed.
    let mut cfg2 = env.config.clone();
    let t = cfg2.tables.iter_mut().find(|t| t.name == "orders").unwrap();
    t.columns
        .iter_mut()
        .find(|c| c.name == "payment_method")
        .unwrap()
        .deprecated = Some("2026-01-01".into());
    let still = schema_diff(&cfg2, "orders", None).await.unwrap();
    assert!(
        still.warnings.iter().any(|w| w.contains("payment_method")),
        "{still:?}"
    );
    let t = cfg2.tables.iter_mut().find(|t| t.name == "orders").unwrap();
    t.columns.retain(|c| c.name != "payment_method");
    t.deprecated
        .insert("payment_method".into(), "2026-01-01".into());
    let r = schema_diff(&cfg2, "orders", None).await.unwrap();
    assert_eq!(
        class_of(&r, "payment_method"),
        Some(Class::Compatible),
        "{r:?}"
    );
    assert!(!r.breaking);

    // An object: a new field is additive; values that do not fit are breaking.
    env.put(
        "orders/new-field.jsonl",
        with_field(&orders(5, 41), "coupon", "\"X\""),
    )
    .await;
    let uri = format!("s3://{}/orders/new-field.jsonl", env.bucket);
    let r = schema_diff(&env.config, "orders", Some(&uri))
        .await
        .unwrap();
    assert_eq!(class_of(&r, "coupon"), Some(Class::Additive), "{r:?}");
    assert!(!r.breaking);
    env.put(
        "orders/bad-type.jsonl",
        orders(3, 42).replace("\"customer_id\":", "\"customer_id\":\"x\",\"y_\":"),
    )
    .await;
    let uri = format!("s3://{}/orders/bad-type.jsonl", env.bucket);
    let r = schema_diff(&env.config, "orders", Some(&uri))
        .await
        .unwrap();
    assert!(r.breaking, "{r:?}");
    assert!(
        r.changes
            .iter()
            .any(|c| c.field == "(records)" && c.change.starts_with("3 record(s)")),
        "{r:?}"
    );
    // A field ingest would not make a column of is breaking (its records are quarantined).
    env.put("orders/no-name.jsonl", with_field(&orders(2, 43), "", "1"))
        .await;
    let uri = format!("s3://{}/orders/no-name.jsonl", env.bucket);
    let r = schema_diff(&env.config, "orders", Some(&uri))
        .await
        .unwrap();
    assert_eq!(class_of(&r, ""), Some(Class::Breaking), "{r:?}");
    assert!(r.breaking, "{r:?}");
}

/// Each line of `text` with `extra` (JSON members) added.
fn with_members(text: &str, extra: &[String]) -> String {
    text.lines()
        .zip(extra)
        .map(|(l, e)| format!("{},{e}}}\n", l.trim_end_matches('}')))
        .collect()
}

/// The quarantine records of report `r`: (line text, reason).
async fn quarantined(env: &TestEnv, r: &floe::ingest::ObjectReport) -> Vec<(String, String)> {
    let q = r.quarantine.clone().expect("a quarantine object");
    let q = env
        .get(q.trim_start_matches(&format!("s3://{}/", env.bucket)))
        .await
        .unwrap();
    String::from_utf8(q)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["raw"].as_str().unwrap_or_default().to_string(),
                v["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A new field equal to a column's name but for letter case (`Region` beside `region`), or to
/// another new field's (`Coupon`, `coupon`), is not added: Glue and Athena store names lower-cased
/// and Spark matches them case-insensitively, so a table with both columns breaks those readers.
/// Before: `Region` and `coupon` became columns beside `region` and `Coupon`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_field_differing_from_a_column_only_in_case_is_refused() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    env.put("orders/base.jsonl", orders(1, 1)).await;
    env.ingest(&ingestor, "orders/base.jsonl").await.unwrap();
    let text = with_members(
        &orders(4, 2),
        &[
            r#""Region":"EU""#.to_string(),
            r#""Coupon":"A""#.to_string(),
            r#""coupon":"B""#.to_string(),
            r#""note":"n""#.to_string(),
        ],
    );
    env.put("orders/cases.jsonl", text).await;
    let r = env.ingest(&ingestor, "orders/cases.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (2, 2),
        "{r:?}"
    );
    let q = quarantined(&env, &r).await;
    assert!(
        q[0].1.starts_with("field `Region` is not added as a column: it differs from column `region` only in letter case"),
        "{q:?}"
    );
    assert!(
        q[1].1.starts_with("field `coupon` is not added as a column: it differs from column `Coupon` only in letter case"),
        "{q:?}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let names: Vec<String> = table
        .metadata()
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.to_lowercase())
        .collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    assert!(names.contains(&"coupon".to_string()) && names.contains(&"note".to_string()));
}

/// Review helper-50 #1: field names over the column-name limit are kept bounded while decoding
/// (their first 256 bytes and `…`), and a record bringing a value for one is still quarantined
/// with the reason, its name shortened; the report and summary name it bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_with_over_long_field_names_are_quarantined_with_the_name_bounded() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    env.put("orders/base.jsonl", orders(1, 1)).await;
    env.ingest(&ingestor, "orders/base.jsonl").await.unwrap();
    let long = "n".repeat(200_000);
    let text = with_members(
        &orders(4, 2),
        &[
            format!("\"{long}a\":1"),
            format!("\"{}\":2", "m".repeat(300)),
            format!("\"{long}b\":null"),
            "\"ok\":3".to_string(),
        ],
    );
    env.put("orders/long-names.jsonl", text).await;
    let r = env
        .ingest(&ingestor, "orders/long-names.jsonl")
        .await
        .unwrap();
    // The two with a value for an over-long name are quarantined; a null one lands (no value
    // is lost), as does the one with a new, fine column.
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (2, 2),
        "{:?}",
        (r.records_committed, r.records_quarantined)
    );
    let q = quarantined(&env, &r).await;
    let bounded = format!("field \"{}…\" is not added as a column", "n".repeat(256));
    assert!(
        q[0].1.starts_with(&bounded),
        "{}",
        &q[0].1[..300.min(q[0].1.len())]
    );
    assert!(q[0].1.len() < 1_000);
    assert!(q[1].1.starts_with("field \"mmm"), "{}", q[1].1);
    assert!(
        r.unknown_fields.iter().all(|n| n.len() < 300),
        "unknown names kept whole"
    );
    let t = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let summary = t.metadata().current_snapshot().unwrap().summary();
    let listed = summary
        .additional_properties
        .get(floe::summary::UNKNOWN_FIELDS)
        .cloned()
        .unwrap_or_default();
    assert!(listed.len() < 2_000, "{}", listed.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_fields_no_column_may_be_made_of_quarantine_their_records_and_columns_are_bounded() {
    // Before: an empty or control-character key became a column, and an object of map-like
    // records (keys that are ids) added a column per key, without bound.
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.max_new_columns = 5;
    let ingestor = env.ingestor().await;
    let columns = |t: &iceberg::table::Table| -> Vec<String> {
        t.metadata()
            .current_schema()
            .as_struct()
            .fields()
            .iter()
            .map(|f| f.name.clone())
            .collect()
    };
    env.put("orders/base.jsonl", orders(1, 1)).await;
    env.ingest(&ingestor, "orders/base.jsonl").await.unwrap();
    let before = columns(&ingestor.catalog().load_table(&env.ident()).await.unwrap()).len();

    // Names no column takes.
    let text = with_members(
        &orders(4, 2),
        &[
            r#""":1"#.to_string(),
            r#""tab\there":1,"nul\u0000":null"#.to_string(),
            r#""a.b":2,"x y":"s","ключ":true"#.to_string(),
            r#""a.b":3,"_id":"x""#.to_string(),
        ],
    );
    env.put("orders/names.jsonl", text).await;
    let r = env.ingest(&ingestor, "orders/names.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (2, 2),
        "{r:?}"
    );
    // A reserved name is no column: its values are dropped, and the report says so.
    assert!(r.unknown_fields.contains(&"_id".to_string()), "{r:?}");
    let q = quarantined(&env, &r).await;
    assert!(q[0].1.starts_with("field \"\" is not added as a column: a column name must be 1 to 256 bytes without control characters"), "{q:?}");
    assert!(
        q[1].1
            .starts_with("field \"tab\\there\" is not added as a column"),
        "{q:?}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(columns(&table)[before..], ["a.b", "x y", "ключ"]);

    // At most `max_new_columns` new columns per object, by name order.
    let keys = |n: usize, p: &str| -> String {
        (0..n)
            .map(|k| format!("\"{p}{k}\":{k}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let text = with_members(
        &orders(3, 3),
        &[keys(10, "k"), keys(5, "k"), r#""k0":null"#.to_string()],
    );
    env.put("orders/many.jsonl", text).await;
    let r = env.ingest(&ingestor, "orders/many.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (2, 1),
        "{r:?}"
    );
    let q = quarantined(&env, &r).await;
    assert!(
        q[0].1.contains(
            "field `k5` would be new column 6 of this object: at most 5 ([ingest] max_new_columns)"
        ),
        "{q:?}"
    );
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(
        columns(&table)[before + 3..],
        ["k0", "k1", "k2", "k3", "k4"]
    );

    // At most `max_columns` in all.
    let total = before + 3 + 5;
    env.config.ingest.max_columns = total + 1;
    let ingestor = env.ingestor().await;
    let text = with_members(
        &orders(2, 4),
        &[r#""z1":1"#.to_string(), r#""z2":2"#.to_string()],
    );
    env.put("orders/more.jsonl", text).await;
    let r = env.ingest(&ingestor, "orders/more.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (1, 1),
        "{r:?}"
    );
    let q = quarantined(&env, &r).await;
    let want = format!(
        "field `z2` would be column {} of the table: at most {} ([ingest] max_columns)",
        total + 2,
        total + 1
    );
    assert!(q[0].1.contains(&want), "{q:?}");
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    assert_eq!(columns(&table).len(), total + 1);

    // Every other engine reads what landed: 1 + 2 + 2 + 1 rows.
    let py = env.pyiceberg();
    assert_eq!(py["rows"], 6, "{py}");
    let duck = env.duckdb_rows(table.metadata_location().unwrap(), "order_id");
    assert_eq!(duck["rows"], 6, "{duck}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_field_whose_later_records_are_null_is_still_added() {
    // Before: a chunk where the new field was only null took its type back, and the field was
    // neither added nor refused: the earlier chunks' values were dropped without a trace.
    let mut env = TestEnv::new("sqlite").await;
    env.config.ingest.chunk_records = 4;
    let ingestor = env.ingestor().await;
    let mut extra = vec![r#""y":1"#.to_string(); 4];
    extra.extend(vec![r#""y":null"#.to_string(); 4]);
    env.put("orders/nulls.jsonl", with_members(&orders(8, 5), &extra))
        .await;
    let r = env.ingest(&ingestor, "orders/nulls.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (8, 0),
        "{r:?}"
    );
    let batches = env.scan_all(ingestor.catalog().as_ref()).await;
    let ones: usize = batches
        .iter()
        .map(|b| {
            let y = b.column_by_name("y").expect("column y");
            let y = y.as_any().downcast_ref::<Int64Array>().unwrap();
            y.iter().flatten().filter(|v| *v == 1).count()
        })
        .sum();
    assert_eq!(ones, 4);
}

/// A column a partition holds by identity keeps its type: committed files carry its partition
/// values as ints, and a manifest written under a long column (a merge, compaction, a manifest
/// rewrite) could not hold them. Values needing the wider type are quarantined, and maintenance
/// keeps working (it failed on such a table: "value is not compatible with type").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_partitioned_by_identity_is_not_widened_and_maintenance_still_works() {
    let env = TestEnv::with_orders_partition("sqlite", r#"["day(event_time)", "items"]"#).await;
    let ingestor = env.ingestor().await;
    for i in 0..3u64 {
        let key = format!("orders/p{i}.jsonl");
        env.put(&key, orders(10, 30 + i)).await;
        let r = env.ingest(&ingestor, &key).await.unwrap();
        assert_eq!(r.records_committed, 10, "{r:?}");
    }
    let big = orders(5, 40).replace("\"items\":", "\"items\":5000000000");
    env.put("orders/big.jsonl", big).await;
    let r = env.ingest(&ingestor, "orders/big.jsonl").await.unwrap();
    assert_eq!(
        (r.records_committed, r.records_quarantined),
        (0, 5),
        "{r:?}"
    );
    for (_, reason) in quarantined(&env, &r).await {
        assert!(
            reason.contains("out of range for Int32")
                && reason.contains("cannot widen to long: partition field `items` (identity)"),
            "{reason}"
        );
    }
    let table = ingestor.catalog().load_table(&env.ident()).await.unwrap();
    let items = table
        .metadata()
        .current_schema()
        .field_by_name("items")
        .unwrap()
        .clone();
    assert_eq!(*items.field_type, Type::Primitive(PrimitiveType::Int));
    let maintainer = env.maintainer().await;
    let opts = floe::maintain::Options {
        compact: true,
        rewrite_manifests: true,
        manifest_threshold: 1,
        min_input_files: 2,
        target_file_bytes: Some(64 << 20),
        ..floe::maintain::Options::default()
    };
    let m = maintainer.run("orders", &opts).await.unwrap();
    assert!(m.manifests_after < m.manifests_before, "{m:?}");
    assert_eq!(env.count_rows(ingestor.catalog().as_ref()).await, 30);
    assert_eq!(env.pyiceberg()["rows"], 30);
}
