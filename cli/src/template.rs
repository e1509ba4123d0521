//! `floe template`: the per-table parts of template.yaml generated from floe.toml.
//!
//! Each function's data-plane permissions name exactly the tables it needs (ingest: its routed
//! tables, their landing prefixes and quarantine; process: its sources read-only and its sinks;
//! maintain: every table it maintains), and every table and pipeline gets its own alarms and
//! dashboard widgets. Adding a table or a pipeline is a config change followed by
//! `floe template`, never a hand-edited policy.
//!
//! The generated text replaces what lies between `# floe:generated NAME begin` and
//! `# floe:generated NAME end` marker lines in the template, at the begin marker's indentation;
//! everything outside the markers is left as written. In floe.toml, `${FLOE_DATA_BUCKET}` stands
//! for the stack's data bucket: the functions get it from their environment, and here it
//! becomes `floe-${AWS::AccountId}-${AWS::Region}-data` inside `!Sub`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use floe::config::{CatalogKind, Config};

/// The variable that names the stack's data bucket in floe.toml.
pub(crate) const DATA_BUCKET_VAR: &str = "FLOE_DATA_BUCKET";
/// What `${FLOE_DATA_BUCKET}` becomes in the template (inside `!Sub`).
const DATA_BUCKET_SUB: &str = "floe-${AWS::AccountId}-${AWS::Region}-data";

/// `floe template --config F [--template T] [--check]`: rewrites T's generated blocks from F, or
/// with `check` reports whether T is current. Returns false when `check` finds it stale.
pub(crate) fn run(config_path: &str, template_path: &str, check: bool) -> Result<bool> {
    let text = std::fs::read_to_string(config_path)
        .with_context(|| format!("reading config {config_path}"))?;
    let config = parse_config(&text, config_path)?;
    let template = std::fs::read_to_string(template_path)
        .with_context(|| format!("reading template {template_path}"))?;
    let rendered = render(&config, &template)?;
    if check {
        if rendered != template {
            eprintln!(
                "{template_path} is not what `floe template --config {config_path}` generates; run it and commit the result"
            );
            return Ok(false);
        }
        println!("{template_path} matches {config_path}");
        return Ok(true);
    }
    if rendered != template {
        std::fs::write(template_path, &rendered)
            .with_context(|| format!("writing {template_path}"))?;
    }
    println!(
        "{template_path}: generated from {config_path} ({} tables, {} pipelines)",
        config.tables.len(),
        config.pipelines.len()
    );
    Ok(true)
}

/// Parses floe.toml with `${FLOE_DATA_BUCKET}` standing for the stack's bucket (other `${…}`
/// come from the environment).
pub(crate) fn parse_config(text: &str, origin: &str) -> Result<Config> {
    let vars = |name: &str| {
        if name == DATA_BUCKET_VAR {
            Some(DATA_BUCKET_SUB.to_string())
        } else {
            std::env::var(name).ok()
        }
    };
    let config = Config::parse_with_vars(text, origin, &vars)?;
    if config.catalog.kind != CatalogKind::Glue {
        bail!("{origin}: the SAM template deploys a Glue catalog; catalog.kind must be \"glue\"");
    }
    Ok(config)
}

/// The template with every generated block rewritten from `config`.
pub(crate) fn render(config: &Config, template: &str) -> Result<String> {
    let blocks = blocks(config)?;
    let mut out = String::with_capacity(template.len());
    let mut lines = template.split_inclusive('\n');
    let mut seen = BTreeSet::new();
    while let Some(line) = lines.next() {
        out.push_str(line);
        let Some(name) = marker(line, "begin") else {
            continue;
        };
        let body = blocks
            .get(name)
            .with_context(|| format!("template: unknown generated block `{name}`"))?;
        if !seen.insert(name.to_string()) {
            bail!("template: generated block `{name}` appears twice");
        }
        let indent = &line[..line.len() - line.trim_start().len()];
        for l in body.lines() {
            if l.is_empty() {
                out.push('\n');
            } else {
                let _ = writeln!(out, "{indent}{l}");
            }
        }
        let end = loop {
            match lines.next() {
                Some(l) if marker(l, "end") == Some(name) => break l,
                Some(_) => {}
                None => bail!("template: generated block `{name}` has no end marker"),
            }
        };
        out.push_str(end);
    }
    for name in blocks.keys() {
        if !seen.contains(*name) {
            bail!("template: no `# floe:generated {name} begin` marker");
        }
    }
    Ok(out)
}

/// The block name of a `# floe:generated NAME begin|end` line.
fn marker<'a>(line: &'a str, which: &str) -> Option<&'a str> {
    let rest = line.trim().strip_prefix("# floe:generated ")?;
    let mut words = rest.split_whitespace();
    let name = words.next()?;
    (words.next() == Some(which)).then_some(name)
}

/// Where a table's files live: bucket and key prefix (Glue tables are created at
/// `<warehouse>/<database>/<table>`).
struct Places<'a> {
    config: &'a Config,
    bucket: String,
    warehouse_prefix: String,
}

impl<'a> Places<'a> {
    fn new(config: &'a Config) -> Result<Self> {
        let Some(rest) = config.catalog.warehouse.strip_prefix("s3://") else {
            bail!(
                "catalog.warehouse must be s3://… for a deployment, not {}",
                config.catalog.warehouse
            );
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        Ok(Self {
            config,
            bucket: bucket.to_string(),
            warehouse_prefix: prefix.trim_matches('/').to_string(),
        })
    }

    /// `warehouse/<db>/<table>/` — the table's key prefix.
    fn table_prefix(&self, table: &str) -> String {
        let db = &self.config.catalog.namespace;
        if self.warehouse_prefix.is_empty() {
            format!("{db}/{table}/")
        } else {
            format!("{}/{db}/{table}/", self.warehouse_prefix)
        }
    }

    fn table_objects(&self, table: &str) -> String {
        s3_objects(&self.bucket, &self.table_prefix(table))
    }

    fn glue_table(&self, table: &str) -> String {
        format!(
            "!Sub arn:aws:glue:${{AWS::Region}}:${{AWS::AccountId}}:table/{}/{table}",
            self.config.catalog.namespace
        )
    }

    fn glue_catalog_and_database(&self) -> [String; 2] {
        [
            "!Sub arn:aws:glue:${AWS::Region}:${AWS::AccountId}:catalog".to_string(),
            format!(
                "!Sub arn:aws:glue:${{AWS::Region}}:${{AWS::AccountId}}:database/{}",
                self.config.catalog.namespace
            ),
        ]
    }

    /// ListBucket on the warehouse bucket, limited to the tables' prefixes.
    fn list_statement(&self, sid: &str, prefixes: &[String]) -> String {
        let mut s = format!(
            "- Sid: {sid}\n  Effect: Allow\n  Action: s3:ListBucket\n  Resource: {}\n  Condition:\n    StringLike:\n      s3:prefix:\n",
            sub_arn(&format!("arn:aws:s3:::{}", self.bucket))
        );
        for p in prefixes {
            let _ = writeln!(s, "        - \"{p}*\"");
        }
        s
    }
}

fn sub_arn(arn: &str) -> String {
    if arn.contains("${") {
        format!("!Sub {arn}")
    } else {
        arn.to_string()
    }
}

fn s3_objects(bucket: &str, prefix: &str) -> String {
    sub_arn(&format!("arn:aws:s3:::{bucket}/{prefix}*"))
}

/// One Allow statement.
fn statement(sid: &str, actions: &[&str], resources: &[String]) -> String {
    let mut s = format!(
        "- Sid: {sid}\n  Effect: Allow\n  Action: [{}]\n  Resource:\n",
        actions.join(", ")
    );
    for r in resources {
        let _ = writeln!(s, "    - {r}");
    }
    s
}

/// Every generated block by name.
fn blocks(config: &Config) -> Result<BTreeMap<&'static str, String>> {
    let places = Places::new(config)?;
    let mut b = BTreeMap::new();
    b.insert("glue-database", glue_database(config));
    b.insert("ingest-data", ingest_data(&places));
    b.insert("process-data", process_data(&places));
    b.insert("maintain-data", maintain_data(&places));
    b.insert("maintain-short-history", maintain_short_history(config));
    b.insert("alarms", alarms(config)?);
    b.insert("dashboard", dashboard(config));
    Ok(b)
}

/// The `GlueDatabase` parameter, pinned to the config's namespace.
fn glue_database(config: &Config) -> String {
    let ns = &config.catalog.namespace;
    format!(
        "GlueDatabase:\n  Type: String\n  Default: {ns}\n  AllowedValues: [{ns}]\n  Description: Glue database (the Iceberg namespace) = catalog.namespace in floe.toml.\n"
    )
}

/// Ingest: read its routes' landing prefixes, write its routed tables and quarantine, read the
/// schemas the consumer gate checks a change against.
fn ingest_data(p: &Places) -> String {
    let c = p.config;
    let routed: BTreeSet<&str> = c.routes.iter().map(|r| r.table.as_str()).collect();
    let landing: BTreeSet<String> = c
        .routes
        .iter()
        .map(|r| s3_objects(&r.bucket, &r.prefix))
        .collect();
    let quarantine: BTreeSet<String> = c
        .routes
        .iter()
        .map(|r| {
            let bucket = c.ingest.quarantine_bucket.as_deref().unwrap_or(&r.bucket);
            s3_objects(bucket, &c.ingest.quarantine_prefix)
        })
        .collect();
    let mut writes: Vec<String> = routed.iter().map(|t| p.table_objects(t)).collect();
    writes.extend(quarantine);
    let mut list: Vec<String> = routed.iter().map(|t| p.table_prefix(t)).collect();
    list.push(c.ingest.quarantine_prefix.clone());
    let mut glue: Vec<String> = p.glue_catalog_and_database().to_vec();
    glue.extend(routed.iter().map(|t| p.glue_table(t)));
    // The consumer gate plans the pipelines reading a routed table (as their source, or
    // joining it) with their other relations (joined tables, a joiner's source) and checks
    // them against their sinks: the current schemas only (Glue GetTable + metadata files),
    // read-only.
    let consumer_tables: BTreeSet<&str> = c
        .pipelines
        .iter()
        .filter(|q| {
            routed.contains(q.source.as_str())
                || q.joins.iter().any(|j| routed.contains(j.as_str()))
        })
        .flat_map(|q| {
            [q.sink.as_str(), q.source.as_str()]
                .into_iter()
                .chain(q.joins.iter().map(String::as_str))
        })
        .filter(|t| !routed.contains(t))
        .collect();
    let consumer_schemas = if consumer_tables.is_empty() {
        String::new()
    } else {
        let metadata: Vec<String> = consumer_tables
            .iter()
            .map(|t| s3_objects(&p.bucket, &format!("{}metadata/", p.table_prefix(t))))
            .collect();
        let tables: Vec<String> = consumer_tables.iter().map(|t| p.glue_table(t)).collect();
        [
            statement("ReadConsumerSchemas", &["s3:GetObject"], &metadata),
            statement("GlueConsumerTables", &["glue:GetTable"], &tables),
        ]
        .concat()
    };
    [
        statement(
            "ReadLanding",
            &["s3:GetObject", "s3:GetObjectVersion"],
            &landing.into_iter().collect::<Vec<_>>(),
        ),
        statement(
            "WriteRoutedTablesAndQuarantine",
            &["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
            &writes,
        ),
        p.list_statement("ListRoutedTables", &list),
        statement(
            "GlueRoutedTables",
            &[
                "glue:GetDatabase",
                "glue:GetTable",
                "glue:CreateTable",
                "glue:UpdateTable",
            ],
            &glue,
        ),
        consumer_schemas,
    ]
    .concat()
}

/// Process: read its sources and joined tables, write its sinks (and the tombstone tables of
/// latest sinks). A source or joined table that is another pipeline's sink (a chain) is covered
/// by the sinks' statements, which include reading them.
fn process_data(p: &Places) -> String {
    let c = p.config;
    let tombstones: Vec<String> = c
        .pipelines
        .iter()
        .filter_map(|q| q.tombstone_table())
        .collect();
    let sinks: BTreeSet<&str> = c
        .pipelines
        .iter()
        .map(|q| q.sink.as_str())
        .chain(tombstones.iter().map(String::as_str))
        .collect();
    let sources: BTreeSet<&str> = c
        .pipelines
        .iter()
        .flat_map(|q| std::iter::once(&q.source).chain(&q.joins))
        .map(String::as_str)
        .filter(|s| !sinks.contains(s))
        .collect();
    if sinks.is_empty() {
        return "# no pipelines: process touches no table\n".into();
    }
    let mut glue_read: Vec<String> = p.glue_catalog_and_database().to_vec();
    glue_read.extend(sources.iter().map(|t| p.glue_table(t)));
    let mut out = String::new();
    if !sources.is_empty() {
        out += &statement(
            "ReadSources",
            &["s3:GetObject"],
            &sources
                .iter()
                .map(|t| p.table_objects(t))
                .collect::<Vec<_>>(),
        );
    }
    out += &statement(
        "WriteSinks",
        &["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
        &sinks.iter().map(|t| p.table_objects(t)).collect::<Vec<_>>(),
    );
    out += &statement(
        "GlueSources",
        &["glue:GetDatabase", "glue:GetTable"],
        &glue_read,
    );
    out += &statement(
        "GlueSinks",
        &["glue:GetTable", "glue:CreateTable", "glue:UpdateTable"],
        &sinks.iter().map(|t| p.glue_table(t)).collect::<Vec<_>>(),
    );
    out
}

/// Maintain's second schedule: every minute, expiration alone of the tables `[maintain]
/// history_minutes` keeps short (nothing when there are none).
fn maintain_short_history(config: &Config) -> String {
    floe::maintain::short_history_payload(config).map_or_else(String::new, |payload| {
        format!(
            "ExpireShortHistory:\n  Type: ScheduleV2\n  Properties:\n    ScheduleExpression: rate(1 minute)\n    Input: '{payload}'\n"
        )
    })
}

/// Maintain: every table floe writes (ingest tables and sinks).
fn maintain_data(p: &Places) -> String {
    let tables: BTreeSet<String> = p.config.all_tables().into_iter().collect();
    let mut glue: Vec<String> = p.glue_catalog_and_database().to_vec();
    glue.extend(tables.iter().map(|t| p.glue_table(t)));
    [
        statement(
            "RewriteTables",
            &["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
            &tables
                .iter()
                .map(|t| p.table_objects(t))
                .collect::<Vec<_>>(),
        ),
        p.list_statement(
            "ListTables",
            &tables.iter().map(|t| p.table_prefix(t)).collect::<Vec<_>>(),
        ),
        statement(
            "GlueTables",
            &["glue:GetDatabase", "glue:GetTable", "glue:UpdateTable"],
            &glue,
        ),
    ]
    .concat()
}

/// `orders_v2` → `OrdersV2`: a CloudFormation logical-id part.
fn camel(name: &str) -> String {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut cs = w.chars();
            cs.next()
                .map(|f| f.to_ascii_uppercase().to_string() + cs.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// A CloudWatch alarm period: a multiple of 60 s, at most a day.
fn period(seconds: u64) -> u64 {
    seconds.div_ceil(60).clamp(1, 1440) * 60
}

/// Per table: freshness over the objective, and a stall (no record for `stall_after_seconds`,
/// missing data breaching); per pipeline: lag over its objective (missing data breaching: the
/// poll runs every pipeline, so silence means the process function is not running).
fn alarms(config: &Config) -> Result<String> {
    let mut out = String::new();
    let mut ids = BTreeSet::new();
    let mut id = |prefix: &str, name: &str| -> Result<String> {
        let id = format!("{prefix}{}", camel(name));
        if !ids.insert(id.clone()) {
            bail!("two tables or pipelines map to the same alarm name {id}; rename one");
        }
        Ok(id)
    };
    for t in &config.tables {
        let n = &t.name;
        let _ = write!(
            out,
            "{}:\n  Type: AWS::CloudWatch::Alarm\n  Properties:\n    AlarmDescription: \"{n}: p99 freshness lag (commit − newest event time) above its objective of {obj} s\"\n    Namespace: floe\n    MetricName: FreshnessLagSeconds\n    Dimensions: [{{ Name: Table, Value: {n} }}]\n    ExtendedStatistic: p99\n    Period: 300\n    EvaluationPeriods: 2\n    Threshold: {obj}\n    ComparisonOperator: GreaterThanThreshold\n    TreatMissingData: notBreaching\n\n",
            id("Freshness", n)?,
            obj = t.freshness_objective_seconds,
        );
        let _ = write!(
            out,
            "{}:\n  Type: AWS::CloudWatch::Alarm\n  Properties:\n    AlarmDescription: \"{n}: no record ingested for {s} s (a stalled source or a broken ingest path; no data counts as breaching)\"\n    Namespace: floe\n    MetricName: RecordsIn\n    Dimensions: [{{ Name: Table, Value: {n} }}]\n    Statistic: Sum\n    Period: {s}\n    EvaluationPeriods: 1\n    Threshold: 1\n    ComparisonOperator: LessThanThreshold\n    TreatMissingData: breaching\n\n",
            id("Stalled", n)?,
            s = period(t.stall_after_seconds),
        );
        if t.checks
            .iter()
            .any(|c| c.action == floe::config::Action::Fail)
        {
            let _ = write!(
                out,
                "{}:\n  Type: AWS::CloudWatch::Alarm\n  Properties:\n    AlarmDescription: \"{n}: an object was refused by a data-quality check with action fail (nothing committed; the object is quarantined whole with the check named)\"\n    Namespace: floe\n    MetricName: ContractFailures\n    Dimensions: [{{ Name: Table, Value: {n} }}]\n    Statistic: Sum\n    Period: 300\n    EvaluationPeriods: 1\n    Threshold: 1\n    ComparisonOperator: GreaterThanOrEqualToThreshold\n    TreatMissingData: notBreaching\n\n",
                id("Contract", n)?,
            );
        }
    }
    for q in &config.pipelines {
        let n = &q.name;
        let _ = write!(
            out,
            "{}:\n  Type: AWS::CloudWatch::Alarm\n  Properties:\n    AlarmDescription: \"pipeline {n}: lag behind {src} above its objective of {obj} s, or no run reported (the process function is not running)\"\n    Namespace: floe\n    MetricName: ProcessorLagSeconds\n    Dimensions: [{{ Name: Pipeline, Value: {n} }}]\n    Statistic: Maximum\n    Period: 900\n    EvaluationPeriods: 1\n    Threshold: {obj}\n    ComparisonOperator: GreaterThanThreshold\n    TreatMissingData: breaching\n\n",
            id("Lag", n)?,
            src = q.source,
            obj = q.lag_objective_seconds,
        );
    }
    out.push_str(&queue_age_alarms(config));
    Ok(out.trim_end().to_string() + "\n")
}

/// How long a process message whose run failed retryably takes to be received again and run:
/// `ProcessQueue`'s `VisibilityTimeout` (1800 s: ≥ 6× the function timeout, as Lambda
/// recommends for SQS event sources, so a throttled batch is retried) plus `ProcessFunction`'s
/// `Timeout` (300 s), both in template.yaml (`check_template.py` derives the threshold from
/// them).
const PROCESS_REDELIVERY_SECONDS: u64 = 1800 + 300;

/// The oldest message of each queue against the tightest objective it serves: an ingest
/// notification older than the tightest freshness objective is an object that is late before
/// ingest even reads it; a process message older than the tightest lag objective is a commit
/// no run has covered in time — but one a run failed on comes back only after the visibility
/// timeout (the poll runs the pipelines meanwhile; their lag has its own alarm), so the process
/// threshold is at least one redelivery: above it, a message failed more than once, or the
/// function fell behind.
fn queue_age_alarms(config: &Config) -> String {
    let mut out = String::new();
    let fresh = config
        .tables
        .iter()
        .map(|t| t.freshness_objective_seconds)
        .min();
    let lag = config
        .pipelines
        .iter()
        .map(|p| p.lag_objective_seconds)
        .min()
        .map(|l| l.max(PROCESS_REDELIVERY_SECONDS));
    for (id, queue, objective, what) in [
        (
            "IngestQueueAge",
            "IngestQueue",
            fresh,
            "landing notification waits longer than the tightest freshness objective",
        ),
        (
            "ProcessQueueAge",
            "ProcessQueue",
            lag,
            "commit or table-change event waits longer than the tightest pipeline lag objective or, if later, one redelivery (visibility timeout + function timeout)",
        ),
    ] {
        let Some(obj) = objective else { continue };
        let _ = write!(
            out,
            "{id}:\n  Type: AWS::CloudWatch::Alarm\n  Properties:\n    AlarmDescription: \"the oldest {what} ({obj} s): failing and redelivered, or the function falls behind\"\n    Namespace: AWS/SQS\n    MetricName: ApproximateAgeOfOldestMessage\n    Dimensions: [{{ Name: QueueName, Value: !GetAtt {queue}.QueueName }}]\n    Statistic: Maximum\n    Period: 60\n    EvaluationPeriods: 1\n    Threshold: {obj}\n    ComparisonOperator: GreaterThanThreshold\n    TreatMissingData: notBreaching\n\n",
        );
    }
    out
}

/// The dashboard: ingest counts, one freshness widget per table (with its objective), pipeline
/// lag, maintenance work, cost, function errors, queue depth.
fn dashboard(config: &Config) -> String {
    let mut widgets = vec![
        r#"{"type": "metric", "width": 12, "height": 6, "properties": {"title": "Ingest records", "region": "${AWS::Region}", "stat": "Sum", "period": 300,
  "metrics": [[{"expression": "SEARCH('{floe,Table} MetricName=\"RecordsIn\"', 'Sum', 300)", "id": "rin", "label": "in"}],
              [{"expression": "SEARCH('{floe,Table} MetricName=\"RecordsCommitted\"', 'Sum', 300)", "id": "rc", "label": "committed"}],
              [{"expression": "SEARCH('{floe,Table} MetricName=\"RecordsQuarantined\"', 'Sum', 300)", "id": "rq", "label": "quarantined"}]]}}"#
            .to_string(),
    ];
    for t in &config.tables {
        widgets.push(format!(
            r#"{{"type": "metric", "width": 12, "height": 6, "properties": {{"title": "{n}: freshness lag (s), objective {obj} s", "region": "${{AWS::Region}}", "period": 300,
  "metrics": [["floe", "FreshnessLagSeconds", "Table", "{n}", {{"stat": "p50"}}], ["...", {{"stat": "p99"}}]],
  "annotations": {{"horizontal": [{{"label": "objective", "value": {obj}}}]}}}}}}"#,
            n = t.name,
            obj = t.freshness_objective_seconds
        ));
    }
    if !config.pipelines.is_empty() {
        let lines: Vec<String> = config
            .pipelines
            .iter()
            .map(|q| format!(r#"["floe", "ProcessorLagSeconds", "Pipeline", "{}"]"#, q.name))
            .chain(std::iter::once(
                r#"[{"expression": "SEARCH('{floe,Pipeline} MetricName=\"CommitToOutputSeconds\"', 'p99', 300)", "id": "lat", "label": "commit → output p99"}]"#
                    .to_string(),
            ))
            .collect();
        widgets.push(format!(
            r#"{{"type": "metric", "width": 12, "height": 6, "properties": {{"title": "Pipeline lag and commit → output latency (s)", "region": "${{AWS::Region}}", "stat": "Maximum", "period": 300,
  "metrics": [{}]}}}}"#,
            lines.join(", ")
        ));
    }
    widgets.push(
        r#"{"type": "metric", "width": 12, "height": 6, "properties": {"title": "Maintenance work", "region": "${AWS::Region}", "stat": "Sum", "period": 3600,
  "metrics": [[{"expression": "SEARCH('{floe,Table} MetricName=\"CompactionGroups\"', 'Sum', 3600)", "id": "gc"}],
              [{"expression": "SEARCH('{floe,Table} MetricName=\"SnapshotsExpired\"', 'Sum', 3600)", "id": "se"}],
              [{"expression": "SEARCH('{floe,Table} MetricName=\"FilesDeleted\"', 'Sum', 3600)", "id": "od"}]]}}"#
            .to_string(),
    );
    // Cost: what the functions report (EMF `GBSeconds` and S3 requests by kind, per function),
    // and the dollars per hour at the config's `[cost]` prices, priced as `Cost::of` prices
    // them (PUT and LIST at the PUT price, GET and HEAD at the GET price, DELETE free).
    let c = &config.cost;
    widgets.push(format!(
        r#"{{"type": "metric", "width": 12, "height": 6, "properties": {{"title": "Cost: Lambda GB-seconds and S3 requests per function, USD per hour at the [cost] prices", "region": "${{AWS::Region}}", "stat": "Sum", "period": 3600,
  "metrics": [[{{"expression": "SEARCH('{{floe,Function}} MetricName=\"GBSeconds\"', 'Sum', 3600)", "id": "gbs", "label": "GB-s"}}],
              [{{"expression": "SEARCH('{{floe,Function}} MetricName=\"S3PutRequests\"', 'Sum', 3600)", "id": "put", "label": "PUT", "yAxis": "right"}}],
              [{{"expression": "SEARCH('{{floe,Function}} MetricName=\"S3GetRequests\"', 'Sum', 3600)", "id": "get", "label": "GET", "yAxis": "right"}}],
              [{{"expression": "SEARCH('{{floe,Function}} MetricName=\"S3ListRequests\"', 'Sum', 3600)", "id": "lst", "visible": false}}],
              [{{"expression": "SEARCH('{{floe,Function}} MetricName=\"S3HeadRequests\"', 'Sum', 3600)", "id": "hd", "visible": false}}],
              [{{"expression": "SUM(gbs)*{gbs} + (SUM(put)+SUM(lst))*{put}/1000 + (SUM(get)+SUM(hd))*{get}/1000", "id": "usd", "label": "USD per hour"}}]]}}}}"#,
        gbs = c.lambda_gb_second,
        put = c.s3_put_per_1000,
        get = c.s3_get_per_1000,
    ));
    widgets.push(
        r#"{"type": "metric", "width": 12, "height": 6, "properties": {"title": "Function errors", "region": "${AWS::Region}", "stat": "Sum", "period": 300,
  "metrics": [["AWS/Lambda", "Errors", "FunctionName", "${IngestFunction}"], ["...", "${ProcessFunction}"], ["...", "${MaintainFunction}"]]}}"#
            .to_string(),
    );
    widgets.push(
        r#"{"type": "metric", "width": 12, "height": 6, "properties": {"title": "Ingest and process queues and the ingest DLQ", "region": "${AWS::Region}", "stat": "Maximum", "period": 60,
  "metrics": [["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", "${IngestQueue.QueueName}"], ["...", "${ProcessQueue.QueueName}"], ["...", "${IngestDLQ.QueueName}"]]}}"#
            .to_string(),
    );
    let mut out = String::from(
        "Dashboard:\n  Type: AWS::CloudWatch::Dashboard\n  Properties:\n    DashboardName: !Sub floe-${AWS::StackName}\n    DashboardBody: !Sub |\n      {\"widgets\": [\n",
    );
    let n = widgets.len();
    for (i, w) in widgets.iter().enumerate() {
        let (x, y) = ((i % 2) * 12, (i / 2) * 6);
        let w = w.replacen(
            "\"width\": 12",
            &format!("\"x\": {x}, \"y\": {y}, \"width\": 12"),
            1,
        );
        for (j, l) in w.lines().enumerate() {
            let sep = if j + 1 == w.lines().count() && i + 1 < n {
                ","
            } else {
                ""
            };
            let _ = writeln!(out, "        {l}{sep}");
        }
    }
    out.push_str("      ]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_file(rel: &str) -> String {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    fn deploy_config() -> Config {
        parse_config(&repo_file("infra/floe.toml"), "infra/floe.toml").expect("infra/floe.toml")
    }

    #[test]
    fn committed_template_is_generated_from_the_deploy_config() {
        let template = repo_file("template.yaml");
        let rendered = render(&deploy_config(), &template).expect("render");
        assert!(
            rendered == template,
            "template.yaml is stale: run `cargo run --bin floe -- template --config infra/floe.toml`"
        );
    }

    #[test]
    fn the_dashboard_prices_the_functions_usage_at_the_config_prices() {
        // The deploy config sets no [cost]: the defaults, Lambda at the arm64 price the
        // template deploys, and HEAD requests at the GET price (as `Cost::of` prices them).
        let d = dashboard(&deploy_config());
        assert!(d.contains(r#"MetricName=\"GBSeconds\"'"#), "{d}");
        assert!(d.contains("SUM(gbs)*0.0000133334 "), "{d}");
        assert!(d.contains(r#"MetricName=\"S3HeadRequests\"'"#), "{d}");
        assert!(d.contains("(SUM(get)+SUM(hd))*0.0004/1000"), "{d}");
        assert!(repo_file("template.yaml").contains("SUM(gbs)*0.0000133334 "));
        let dearer = format!(
            "{}\n[cost]\nlambda_gb_second = 0.5\ns3_get_per_1000 = 0.25\n",
            repo_file("infra/floe.toml")
        );
        let d = dashboard(&parse_config(&dearer, "dearer").expect("config"));
        assert!(d.contains("SUM(gbs)*0.5 "), "{d}");
        assert!(d.contains("(SUM(get)+SUM(hd))*0.25/1000"), "{d}");
    }

    #[test]
    fn queue_age_alarms_follow_the_tightest_objectives() {
        let base = repo_file("infra/floe.toml");
        let a = alarms(&deploy_config()).unwrap();
        let ingest = a
            .split("IngestQueueAge:")
            .nth(1)
            .expect("ingest queue age alarm");
        let ingest = ingest.split("\n\n").next().unwrap();
        assert!(
            ingest.contains("MetricName: ApproximateAgeOfOldestMessage"),
            "{ingest}"
        );
        assert!(ingest.contains("!GetAtt IngestQueue.QueueName"), "{ingest}");
        assert!(ingest.contains("Threshold: 120\n"), "{ingest}");
        let process = a
            .split("ProcessQueueAge:")
            .nth(1)
            .expect("process queue age alarm");
        assert!(
            process.contains("!GetAtt ProcessQueue.QueueName"),
            "{process}"
        );
        // The lag objective (600 s) is below one redelivery (1800 s + 300 s).
        assert!(process.contains("Threshold: 2100\n"), "{process}");
        // A tighter table and pipeline tighten the alarms.
        let extra = r#"
[[tables]]
name = "clicks"
event_time = "at"
freshness_objective_seconds = 30
columns = [{ name = "at", type = "timestamptz" }]

[[pipelines]]
name = "fast"
source = "clicks"
sink = "fast_out"
mode = "append"
lag_objective_seconds = 45
sql = "SELECT at FROM source"
"#;
        let c = parse_config(&format!("{base}\n{extra}"), "f").unwrap();
        let a = alarms(&c).unwrap();
        let age = |id: &str| {
            a.split(&format!("{id}:"))
                .nth(1)
                .unwrap()
                .split("\n\n")
                .next()
                .unwrap()
                .to_string()
        };
        assert!(age("IngestQueueAge").contains("Threshold: 30\n"));
        assert!(age("ProcessQueueAge").contains("Threshold: 2100\n"));
        // A looser objective than one redelivery is the threshold.
        let slow = base.replace(
            "[[pipelines]]",
            "[[pipelines]]\nlag_objective_seconds = 7200",
        );
        let a = alarms(&parse_config(&slow, "s").unwrap()).unwrap();
        let process = a.split("ProcessQueueAge:").nth(1).unwrap();
        assert!(process.contains("Threshold: 7200\n"), "{process}");
    }

    #[test]
    fn a_new_table_and_pipeline_get_their_own_scope_and_alarms() {
        let base = repo_file("infra/floe.toml");
        let extra = r#"
[[tables]]
name = "shipments"
event_time = "shipped_at"
columns = [{ name = "id", type = "string" }, { name = "shipped_at", type = "timestamptz" }]
checks = [{ name = "has_id", kind = "not_null", column = "id", action = "fail" }]

[[routes]]
bucket = "${FLOE_DATA_BUCKET}"
prefix = "landing/shipments/"
table = "shipments"
format = "jsonl"

[[pipelines]]
name = "late_shipments"
source = "shipments"
sink = "late_shipments"
mode = "append"
lag_objective_seconds = 42
sql = "SELECT id, shipped_at FROM source"
"#;
        let template = repo_file("template.yaml");
        let before = render(&deploy_config(), &template).unwrap();
        let config = parse_config(&format!("{base}\n{extra}"), "f").unwrap();
        let after = render(&config, &template).unwrap();
        let db = &config.catalog.namespace;
        for needle in [
            format!("table/{db}/shipments"),
            format!("table/{db}/late_shipments"),
            "data/landing/shipments/*".to_string(),
            format!("warehouse/{db}/shipments/*"),
            "FreshnessShipments:".to_string(),
            "StalledShipments:".to_string(),
            "ContractShipments:".to_string(),
            "MetricName: ContractFailures".to_string(),
            "LagLateShipments:".to_string(),
            "Threshold: 42".to_string(),
            "\"Table\", \"shipments\"".to_string(),
        ] {
            assert!(
                !before.contains(&needle),
                "{needle} already in the template"
            );
            assert!(
                after.contains(&needle),
                "{needle} missing after adding the table"
            );
        }
        // Ingest gains the new table; process reads it, never writes it.
        let ingest = block(&after, "ingest-data");
        assert!(ingest.contains(&format!("warehouse/{db}/shipments/*")));
        // ... and may read the new sink's schema (the consumer gate), nothing more of it.
        let (writes, reads) = ingest.split_once("- Sid: ReadConsumerSchemas").unwrap();
        assert!(!writes.contains("late_shipments"), "{writes}");
        assert!(reads.contains(&format!("warehouse/{db}/late_shipments/metadata/*")));
        assert!(reads.contains(&format!("table/{db}/late_shipments")));
        assert!(!reads.contains("PutObject") && !reads.contains("UpdateTable"));
        let process = block(&after, "process-data");
        let read = process.split("- Sid: WriteSinks").next().unwrap();
        assert!(read.contains(&format!("warehouse/{db}/shipments/*")));
        let write = process.split("- Sid: WriteSinks").nth(1).unwrap();
        let write = write.split("- Sid:").next().unwrap();
        assert!(
            !write.contains(&format!("warehouse/{db}/shipments/*")),
            "{write}"
        );
        assert!(write.contains(&format!("warehouse/{db}/late_shipments/*")));
    }

    #[test]
    fn a_chained_pipeline_reads_its_upstream_sink_and_joined_tables_are_read_only() {
        let base = repo_file("infra/floe.toml");
        let extra = r#"
[[tables]]
name = "customers"
event_time = "updated_at"
columns = [{ name = "customer_id", type = "long" }, { name = "updated_at", type = "timestamptz" }]

[[pipelines]]
name = "big_suspicious"
source = "suspicious_orders"
sink = "big_suspicious"
mode = "append"
joins = ["customers"]
sql = "SELECT s.order_id FROM source s JOIN customers c ON s.customer_id = c.customer_id"
"#;
        let config = parse_config(
            &format!(
                "{base}
{extra}"
            ),
            "f",
        )
        .unwrap();
        let after = render(&config, &repo_file("template.yaml")).unwrap();
        let db = &config.catalog.namespace;
        let process = block(&after, "process-data");
        let (read, rest) = process.split_once("- Sid: WriteSinks").unwrap();
        let (write, glue) = rest.split_once("- Sid: GlueSources").unwrap();
        // The joined table: read (objects, Glue GetTable), never written.
        assert!(
            read.contains(&format!("warehouse/{db}/customers/*")),
            "{read}"
        );
        assert!(!write.contains("customers"), "{write}");
        let (glue_read, glue_write) = glue.split_once("- Sid: GlueSinks").unwrap();
        assert!(glue_read.contains(&format!("table/{db}/customers")));
        assert!(!glue_write.contains("customers"));
        // The upstream sink the chained pipeline reads: the process role's own sink (GetObject
        // and GetTable included), and the new sink beside it.
        for sink in ["suspicious_orders", "big_suspicious"] {
            assert!(
                write.contains(&format!("warehouse/{db}/{sink}/*")),
                "{write}"
            );
            assert!(write.contains("s3:GetObject"));
            assert!(glue_write.contains(&format!("table/{db}/{sink}")));
        }
        assert!(glue_write.contains("glue:GetTable"));
    }

    #[test]
    fn ingest_reads_the_schemas_the_consumer_gate_plans_joiners_with() {
        // `orders` (routed) is joined with `customers` by one pipeline; `customers` (routed
        // too) is joined by a pipeline over another pipeline's sink: the gate on either table
        // plans its joiners with their other relations and checks their sinks.
        let base = repo_file("infra/floe.toml");
        let extra = r#"
[[tables]]
name = "customers"
event_time = "updated_at"
columns = [{ name = "customer_id", type = "long" }, { name = "updated_at", type = "timestamptz" }]

[[tables]]
name = "regions"
event_time = "updated_at"
columns = [{ name = "region", type = "string" }, { name = "updated_at", type = "timestamptz" }]

[[routes]]
bucket = "${FLOE_DATA_BUCKET}"
prefix = "landing/customers/"
table = "customers"
format = "jsonl"

[[pipelines]]
name = "orders_by_region"
source = "orders"
sink = "orders_by_region"
mode = "append"
joins = ["regions"]
sql = "SELECT o.order_id FROM source o JOIN regions r ON o.region = r.region"

[[pipelines]]
name = "big_suspicious"
source = "suspicious_orders"
sink = "big_suspicious"
mode = "append"
joins = ["customers"]
sql = "SELECT s.order_id FROM source s JOIN customers c ON s.customer_id = c.customer_id"
"#;
        let config = parse_config(&format!("{base}\n{extra}"), "f").unwrap();
        let after = render(&config, &repo_file("template.yaml")).unwrap();
        let db = &config.catalog.namespace;
        let ingest = block(&after, "ingest-data");
        let (writes, reads) = ingest.split_once("- Sid: ReadConsumerSchemas").unwrap();
        for table in [
            "regions",
            "big_suspicious",
            "suspicious_orders",
            "orders_by_region",
        ] {
            assert!(
                reads.contains(&format!("warehouse/{db}/{table}/metadata/*")),
                "{table}: {reads}"
            );
            assert!(reads.contains(&format!("table/{db}/{table}")), "{table}");
            assert!(!writes.contains(&format!("/{table}")), "{table}: {writes}");
        }
        assert!(!reads.contains("PutObject") && !reads.contains("UpdateTable"));
    }

    fn block<'a>(t: &'a str, name: &str) -> &'a str {
        let begin = format!("# floe:generated {name} begin");
        let end = format!("# floe:generated {name} end");
        let from = t.find(&begin).unwrap();
        let to = t[from..].find(&end).unwrap();
        &t[from..from + to]
    }

    #[test]
    fn markers_are_checked() {
        let c = deploy_config();
        let e = render(
            &c,
            "# floe:generated nope begin\n# floe:generated nope end\n",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("unknown generated block `nope`"),
            "{e}"
        );
        let e = render(&c, "# floe:generated alarms begin\n").unwrap_err();
        assert!(e.to_string().contains("no end marker"), "{e}");
        let e = render(&c, "Resources: {}\n").unwrap_err();
        assert!(e.to_string().contains("no `# floe:generated"), "{e}");
    }

    #[test]
    fn logical_ids_and_periods() {
        assert_eq!(camel("revenue_per_region_minute"), "RevenuePerRegionMinute");
        assert_eq!(camel("orders-v2"), "OrdersV2");
        assert_eq!(period(1), 60);
        assert_eq!(period(3600), 3600);
        assert_eq!(period(90), 120);
        assert_eq!(period(10 * 86_400), 86_400);
    }

    #[test]
    fn sqlite_configs_are_refused() {
        let e = parse_config(
            "[catalog]\nkind = \"sqlite\"\nwarehouse = \"file:///tmp/w\"\n",
            "f",
        )
        .unwrap_err();
        assert!(e.to_string().contains("glue"), "{e}");
    }
}
