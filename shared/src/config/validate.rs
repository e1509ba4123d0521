//! Validation of a parsed `floe.toml`: every problem is reported with the file, the key and the
//! reason, before any event is handled.

use std::collections::{BTreeMap, HashSet};

use super::*;
use crate::error::{Error, Result};

impl Config {
    /// Checks the whole configuration: catalog, tables, routes, pipelines and limits.
    pub(super) fn validate(&self, origin: &str) -> Result<()> {
        self.validate_catalog(origin)?;
        let mut names = HashSet::new();
        for (i, table) in self.tables.iter().enumerate() {
            let at = |k: &str| format!("tables[{i}].{k}");
            if !names.insert(table.name.as_str()) {
                return Err(Error::config(
                    origin,
                    &at("name"),
                    format!("duplicate table `{}`", table.name),
                ));
            }
            table.validate(origin, i)?;
        }
        for (i, route) in self.routes.iter().enumerate() {
            if !names.contains(route.table.as_str()) {
                return Err(Error::config(
                    origin,
                    &format!("routes[{i}].table"),
                    format!("no table named `{}`", route.table),
                ));
            }
            if route.bucket.is_empty() {
                return Err(Error::config(
                    origin,
                    &format!("routes[{i}].bucket"),
                    "must not be empty",
                ));
            }
            self.validate_cdc_route(origin, i, route)?;
        }
        let sinks: HashSet<&str> = self.pipelines.iter().map(|p| p.sink.as_str()).collect();
        for (i, p) in self.pipelines.iter().enumerate() {
            p.validate(self, origin, i, &names, &sinks)?;
            p.validate_joins(origin, i, &names, &sinks)?;
            if self.pipelines[..i]
                .iter()
                .any(|q| q.name == p.name || q.sink == p.sink)
            {
                return Err(Error::config(
                    origin,
                    &format!("pipelines[{i}]"),
                    format!(
                        "pipeline `{}` or its sink `{}` is declared twice",
                        p.name, p.sink
                    ),
                ));
            }
        }
        self.validate_pipeline_graph(origin)?;
        // `!(x >= min)` also refuses NaN; infinity is refused because a Duration cannot hold it.
        let m = &self.maintain;
        for (key, hours, min, why) in [
            (
                "maintain.orphan_older_than_hours",
                Some(m.orphan_older_than_hours),
                1.0,
                "must be at least 1 and finite (younger files may belong to writes in flight)",
            ),
            (
                "maintain.dedup_window_hours",
                Some(m.dedup_window_hours),
                1.0,
                "must be at least 1 and finite (snapshots this young back the ingest duplicate \
                 check of redelivered messages: keep it at least the queue's retention)",
            ),
            (
                "maintain.expire_older_than_hours",
                m.expire_older_than_hours,
                f64::MIN_POSITIVE,
                "must be positive and finite",
            ),
        ] {
            if hours.is_some_and(|h| !(h >= min && h.is_finite())) {
                return Err(Error::config(origin, key, why));
            }
        }
        self.validate_history(origin)?;
        if self.ingest.chunk_records == 0 {
            return Err(Error::config(
                origin,
                "ingest.chunk_records",
                "must be at least 1",
            ));
        }
        self.ingest.validate_limits(origin)?;
        for (i, c) in self.compare.iter().enumerate() {
            c.validate(self, origin, i)?;
        }
        self.cost.validate(origin)?;
        self.process.validate(origin)?;
        Ok(())
    }

    /// `[maintain] history_minutes`: configured tables only, and no shorter than any work that
    /// holds one of the table's snapshots needs it: [`MIN_HISTORY_MINUTES`] (Lambda's limit),
    /// the commit loop's window, and for a table routes ingest into the duplicate check's clock
    /// skew (the summary walk proves an object absent only by reaching a snapshot older than the
    /// object's landing time minus the skew, so a shorter history would send every object's
    /// check to the table's rows).
    fn validate_history(&self, origin: &str) -> Result<()> {
        let tables = self.all_tables();
        let plus_a_minute = |seconds: u64| (seconds + 60) as f64 / 60.0;
        for (table, minutes) in &self.maintain.history_minutes {
            let key = format!("maintain.history_minutes.{table}");
            if !tables.contains(table) {
                return Err(Error::config(
                    origin,
                    &key,
                    format!("no table or pipeline sink named `{table}`"),
                ));
            }
            let routed = self.routes.iter().any(|r| &r.table == table);
            let (commit, skew) = (
                self.ingest.commit_timeout_seconds,
                self.ingest.dedup_skew_seconds,
            );
            let floors = [
                (
                    MIN_HISTORY_MINUTES,
                    "a function holds a snapshot it read until it commits for up to Lambda's 15 \
                     minutes (a compaction group, a slow object, a pipeline's first run, a lost \
                     commit answer being settled), and expiring it meanwhile would fail or \
                     misjudge that work"
                        .to_string(),
                ),
                // The commit loop settles an attempt whose answer was lost by finding its
                // snapshot: for as long as the loop may run, that evidence must not be expired
                // under it (outside Lambda too, where no 15-minute limit bounds the caller).
                (
                    plus_a_minute(commit),
                    format!(
                        "`[ingest] commit_timeout_seconds` ({commit}) plus a minute, or a commit \
                         whose answer was lost could have its snapshot expired before the retry \
                         loop finds it"
                    ),
                ),
                (
                    if routed { plus_a_minute(skew) } else { 0.0 },
                    format!(
                        "for a table routes ingest into, `[ingest] dedup_skew_seconds` ({skew}) \
                         plus a minute, or every object's duplicate check reads the table's rows \
                         (lower the skew to shorten the history)"
                    ),
                ),
            ];
            // `!(x >= floor)` also refuses NaN; infinity is refused because a Duration cannot
            // hold it.
            if let Some((floor, why)) = floors
                .iter()
                .find(|(floor, _)| !(*minutes >= *floor && minutes.is_finite()))
            {
                return Err(Error::config(
                    origin,
                    &key,
                    format!("must be at least {floor} and finite: {why}"),
                ));
            }
        }
        Ok(())
    }

    /// Pipelines read tables (their source and joins) and write their sink; following these
    /// edges from a sink must never lead back to it (a sink's commits would feed themselves).
    /// The first cycle found is named, table by table, with the pipelines on it.
    fn validate_pipeline_graph(&self, origin: &str) -> Result<()> {
        // table → the pipelines reading it (by index).
        let mut readers: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, p) in self.pipelines.iter().enumerate() {
            for input in std::iter::once(&p.source).chain(&p.joins) {
                readers.entry(input.as_str()).or_default().push(i);
            }
        }
        // Depth-first from every pipeline: the path is the pipelines followed so far.
        fn visit(
            cfg: &Config,
            readers: &BTreeMap<&str, Vec<usize>>,
            i: usize,
            path: &mut Vec<usize>,
            done: &mut HashSet<usize>,
        ) -> Option<Vec<usize>> {
            if let Some(at) = path.iter().position(|&j| j == i) {
                return Some(path[at..].to_vec());
            }
            if done.contains(&i) {
                return None;
            }
            path.push(i);
            for &next in readers
                .get(cfg.pipelines[i].sink.as_str())
                .into_iter()
                .flatten()
            {
                if let Some(cycle) = visit(cfg, readers, next, path, done) {
                    return Some(cycle);
                }
            }
            path.pop();
            done.insert(i);
            None
        }
        let mut done = HashSet::new();
        for i in 0..self.pipelines.len() {
            let Some(cycle) = visit(self, &readers, i, &mut Vec::new(), &mut done) else {
                continue;
            };
            let first = cycle[0];
            let pipelines: Vec<String> = cycle
                .iter()
                .map(|&j| format!("`{}`", self.pipelines[j].name))
                .collect();
            // Each pipeline writes the table the next one reads.
            let mut tables: Vec<&str> = cycle
                .iter()
                .map(|&j| self.pipelines[j].sink.as_str())
                .collect();
            tables.push(self.pipelines[first].sink.as_str());
            return Err(Error::config(
                origin,
                &format!("pipelines[{first}]"),
                format!(
                    "pipelines form a cycle: {} (pipelines {}); a sink's commits would feed \
                     themselves",
                    tables.join(" → "),
                    pipelines.join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// A change-record route: `debezium` reads JSON lines; `flat` names columns the table has;
    /// every route into a table agrees on `cdc` (it shapes the table's columns).
    fn validate_cdc_route(&self, origin: &str, i: usize, route: &RouteConfig) -> Result<()> {
        let at = |k: &str| format!("routes[{i}].{k}");
        if route.cdc != Some(Cdc::Flat) {
            for (key, v) in [
                ("op_column", &route.op_column),
                ("ts_column", &route.ts_column),
            ] {
                if v.is_some() {
                    return Err(Error::config(
                        origin,
                        &at(key),
                        "only a `cdc = \"flat\"` route names its operation and time columns",
                    ));
                }
            }
        }
        match route.cdc {
            Some(Cdc::Debezium) if route.format != Format::Jsonl => {
                return Err(Error::config(
                    origin,
                    &at("cdc"),
                    "Debezium envelopes are read from JSON lines (`format = \"jsonl\"`)",
                ))
            }
            Some(Cdc::Flat) => {
                let table = self.table(&route.table);
                for (key, col) in ["op_column", "ts_column"].iter().zip(route.cdc_columns()) {
                    if !table.is_some_and(|t| t.columns.iter().any(|c| c.name == col)) {
                        return Err(Error::config(
                            origin,
                            &at(key),
                            format!(
                                "table `{}` has no column `{col}` (a flat change record carries \
                                 its operation and time as columns)",
                                route.table
                            ),
                        ));
                    }
                }
            }
            _ => {}
        }
        if let Some(other) = self
            .routes
            .iter()
            .find(|r| r.table == route.table && r.cdc != route.cdc)
        {
            let show = |c: Option<Cdc>| match c {
                None => "no cdc".to_string(),
                Some(Cdc::Debezium) => "cdc = \"debezium\"".to_string(),
                Some(Cdc::Flat) => "cdc = \"flat\"".to_string(),
            };
            return Err(Error::config(
                origin,
                &at("cdc"),
                format!(
                    "routes into `{}` disagree: {} here, {} for prefix `{}`; one table holds one \
                     kind of record",
                    route.table,
                    show(route.cdc),
                    show(other.cdc),
                    other.prefix
                ),
            ));
        }
        Ok(())
    }

    /// The catalog needs a warehouse (and a URI when it is a REST catalog).
    fn validate_catalog(&self, origin: &str) -> Result<()> {
        if self.catalog.warehouse.trim().is_empty() {
            return Err(Error::config(
                origin,
                "catalog.warehouse",
                "must not be empty",
            ));
        }
        if self.catalog.kind == CatalogKind::Rest && self.catalog.uri.is_none() {
            return Err(Error::config(
                origin,
                "catalog.uri",
                "a REST catalog needs its URI",
            ));
        }
        Ok(())
    }
}

impl TableConfig {
    /// One table: its columns, event time, partition spec, deprecations, sort order and sizes.
    fn validate(&self, origin: &str, i: usize) -> Result<()> {
        let table = self;
        let at = |k: &str| format!("tables[{i}].{k}");
        let cols = table.validate_columns(origin, i)?;
        let Some(et) = table.columns.iter().find(|c| c.name == table.event_time) else {
            return Err(Error::config(
                origin,
                &at("event_time"),
                format!("no column named `{}`", table.event_time),
            ));
        };
        if !matches!(et.type_name.as_str(), "timestamptz" | "timestamp") {
            return Err(Error::config(
                origin,
                &at("event_time"),
                format!(
                    "column `{}` must be timestamptz or timestamp, not {}",
                    et.name, et.type_name
                ),
            ));
        }
        for (j, p) in table.partition.iter().enumerate() {
            super::types::parse_partition(p, &cols)
                .map_err(|reason| Error::config(origin, &at(&format!("partition[{j}]")), reason))?;
        }
        for (field, d) in &table.deprecated {
            chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d").map_err(|_| {
                Error::config(
                    origin,
                    &at(&format!("deprecated.{field}")),
                    format!("`{d}`: expected a date YYYY-MM-DD"),
                )
            })?;
        }
        for (j, key) in table.sort.iter().enumerate() {
            let col = key.split_whitespace().next().unwrap_or("");
            if !cols.contains(col) {
                return Err(Error::config(
                    origin,
                    &at(&format!("sort[{j}]")),
                    format!("no column named `{col}`"),
                ));
            }
        }
        if table.target_file_size_mb == 0 {
            return Err(Error::config(
                origin,
                &at("target_file_size_mb"),
                "must be at least 1",
            ));
        }
        for (key, v) in [
            (
                "freshness_objective_seconds",
                table.freshness_objective_seconds,
            ),
            ("stall_after_seconds", table.stall_after_seconds),
        ] {
            if v == 0 {
                return Err(Error::config(origin, &at(key), "must be at least 1"));
            }
        }
        table.validate_checks(origin, i)?;
        if let Some(h) = table.expire_older_than_hours {
            if !(h.is_finite() && h > 0.0) {
                return Err(Error::config(
                    origin,
                    &at("expire_older_than_hours"),
                    "must be positive",
                ));
            }
        }
        Ok(())
    }

    /// Column names (unique, not reserved), types, deprecation dates and sensitivity; returns
    /// the column names.
    fn validate_columns(&self, origin: &str, i: usize) -> Result<HashSet<&str>> {
        let table = self;
        let at = |k: &str| format!("tables[{i}].{k}");
        if table.columns.is_empty() {
            return Err(Error::config(
                origin,
                &at("columns"),
                "at least one column is needed",
            ));
        }
        let mut cols = HashSet::new();
        for (j, col) in table.columns.iter().enumerate() {
            if col.name.starts_with('_') {
                return Err(Error::config(
                    origin,
                    &at(&format!("columns[{j}].name")),
                    "names starting with `_` are reserved for floe's columns",
                ));
            }
            if !cols.insert(col.name.as_str()) {
                return Err(Error::config(
                    origin,
                    &at(&format!("columns[{j}].name")),
                    format!("duplicate column `{}`", col.name),
                ));
            }
            col.validate_deprecation(origin, &at(&format!("columns[{j}]")))?;
            match col.sensitive {
                Some(Sensitive::Hash) if col.type_name != "string" => {
                    return Err(Error::config(
                        origin,
                        &at(&format!("columns[{j}].sensitive")),
                        "only string columns can be hashed",
                    ))
                }
                Some(_) if col.required || col.name == table.event_time => {
                    return Err(Error::config(
                        origin,
                        &at(&format!("columns[{j}].sensitive")),
                        "a sensitive column cannot be required or the event time",
                    ))
                }
                _ => {}
            }
            super::types::parse_type(&col.type_name).map_err(|reason| {
                Error::config(origin, &at(&format!("columns[{j}].type")), reason)
            })?;
        }
        Ok(cols)
    }
}

impl super::ColumnConfig {
    /// Deprecation keys: dates parse, `deprecated` and `remove_after` agree, since ≤ remove
    /// after, `deprecated_since` needs `remove_after`, and the new-style keys need an `owner`
    /// (the older `deprecated = "date"` alone stays valid without one).
    fn validate_deprecation(&self, origin: &str, at: &str) -> Result<()> {
        let day = |key: &str, v: &Option<String>| -> Result<Option<chrono::NaiveDate>> {
            v.as_deref()
                .map(|d| {
                    chrono::NaiveDate::parse_from_str(d.trim(), "%Y-%m-%d").map_err(|_| {
                        Error::config(
                            origin,
                            &format!("{at}.{key}"),
                            format!("`{d}`: expected a date YYYY-MM-DD"),
                        )
                    })
                })
                .transpose()
        };
        let legacy = day("deprecated", &self.deprecated)?;
        let since = day("deprecated_since", &self.deprecated_since)?;
        let remove = day("remove_after", &self.remove_after)?;
        if let (Some(a), Some(b)) = (legacy, remove) {
            if a != b {
                return Err(Error::config(
                    origin,
                    &format!("{at}.remove_after"),
                    format!(
                        "{b} differs from `deprecated = \"{a}\"` (its older spelling); keep one"
                    ),
                ));
            }
        }
        if since.is_some() && remove.or(legacy).is_none() {
            return Err(Error::config(
                origin,
                &format!("{at}.deprecated_since"),
                "a deprecated column needs `remove_after` (the first day it may be removed)",
            ));
        }
        if let (Some(s), Some(r)) = (since, remove.or(legacy)) {
            if s > r {
                return Err(Error::config(
                    origin,
                    &format!("{at}.deprecated_since"),
                    format!("{s} is after remove_after {r}"),
                ));
            }
        }
        let new_style = since.is_some() || remove.is_some();
        let owner = self.owner.as_deref().map(str::trim).unwrap_or("");
        if new_style && owner.is_empty() {
            return Err(Error::config(
                origin,
                &format!("{at}.owner"),
                "a deprecated column needs an `owner` (who to ask before it is removed)",
            ));
        }
        Ok(())
    }
}

impl PipelineConfig {
    pub(super) fn validate(
        &self,
        cfg: &Config,
        origin: &str,
        i: usize,
        tables: &HashSet<&str>,
        sinks: &HashSet<&str>,
    ) -> Result<()> {
        let at = |k: &str| format!("pipelines[{i}].{k}");
        if self.lag_objective_seconds == 0 {
            return Err(Error::config(
                origin,
                &at("lag_objective_seconds"),
                "must be at least 1",
            ));
        }
        // A source is a configured table, or another pipeline's sink (a chained pipeline: the
        // upstream's sink commits trigger it like ingest commits do).
        if !tables.contains(self.source.as_str()) && !sinks.contains(self.source.as_str()) {
            return Err(Error::config(
                origin,
                &at("source"),
                format!("no table or pipeline sink named `{}`", self.source),
            ));
        }
        if let Some(up) = cfg.sink_of(&self.source).filter(|u| u.name != self.name) {
            // Only appends can be followed; a sink whose runs replace rows would stop this
            // pipeline at its first overwrite (on_row_change), or lose the replacements.
            if up.mode != PipelineMode::Append {
                return Err(Error::config(
                    origin,
                    &at("source"),
                    format!(
                        "`{}` is the sink of pipeline `{}`, whose runs replace rows; a pipeline \
                         follows appends only: read it through `joins`, or source `{}` as `{}` does",
                        self.source, up.name, up.source, up.name
                    ),
                ));
            }
        }
        if tables.contains(self.sink.as_str()) || self.sink == self.source {
            return Err(Error::config(
                origin,
                &at("sink"),
                format!(
                    "`{}` is an ingest table; a sink must be its own table",
                    self.sink
                ),
            ));
        }
        if self.sql.trim().is_empty() {
            return Err(Error::config(origin, &at("sql"), "must not be empty"));
        }
        self.start_strategy()
            .map_err(|r| Error::config(origin, &at("start"), r))?;
        match self.mode {
            PipelineMode::Aggregate => {
                let Some(w) = &self.window else {
                    return Err(Error::config(
                        origin,
                        &at("window"),
                        "an aggregate pipeline needs a window, e.g. `1m`",
                    ));
                };
                parse_window(w).map_err(|r| Error::config(origin, &at("window"), r))?;
                if self.alert.is_some() {
                    return Err(Error::config(
                        origin,
                        &at("alert"),
                        "alerts are for append pipelines (aggregate rows are replaced, not final)",
                    ));
                }
            }
            PipelineMode::Append | PipelineMode::Latest => {
                if self.window.is_some() {
                    return Err(Error::config(
                        origin,
                        &at("window"),
                        "only aggregate pipelines have a window",
                    ));
                }
            }
        }
        self.validate_latest(cfg, origin, i, tables)?;
        if let Some(col) = &self.time_column {
            // An upstream sink's columns come from its SQL: known only when it runs.
            let known = cfg
                .table(&self.source)
                .map(|t| t.columns.iter().any(|c| &c.name == col))
                .unwrap_or(sinks.contains(self.source.as_str()));
            if !known {
                return Err(Error::config(
                    origin,
                    &at("time_column"),
                    format!("`{}` has no column `{col}`", self.source),
                ));
            }
        }
        if let Some(a) = &self.alert {
            if a.eventbridge_bus.is_some() == a.sqs_queue_url.is_some() {
                return Err(Error::config(
                    origin,
                    &at("alert"),
                    "set exactly one of `eventbridge_bus` and `sqs_queue_url`",
                ));
            }
        }
        Ok(())
    }
}

impl PipelineConfig {
    /// `joins`: each a configured table or another pipeline's sink, named once, neither the
    /// source nor this pipeline's own sink, and not `source` (the relation of the new rows).
    fn validate_joins(
        &self,
        origin: &str,
        i: usize,
        tables: &HashSet<&str>,
        sinks: &HashSet<&str>,
    ) -> Result<()> {
        let at = |k: &str| format!("pipelines[{i}].{k}");
        for (j, name) in self.joins.iter().enumerate() {
            let key = at(&format!("joins[{j}]"));
            let reason = if name.trim().is_empty() || name == "source" {
                Some(format!(
                    "`{name}` cannot be joined by name (`source` is the source's relation)"
                ))
            } else if *name == self.source {
                Some(format!(
                    "`{name}` is the pipeline's source (the SQL reads it as `source`)"
                ))
            } else if *name == self.sink {
                Some(format!("`{name}` is the pipeline's own sink"))
            } else if !tables.contains(name.as_str()) && !sinks.contains(name.as_str()) {
                Some(format!("no table or pipeline sink named `{name}`"))
            } else if self.joins[..j].contains(name) {
                Some(format!("`{name}` is joined twice"))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(Error::config(origin, &key, reason));
            }
        }
        if self.max_join_bytes == 0 {
            return Err(Error::config(
                origin,
                &at("max_join_bytes"),
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The `latest` mode's keys: keys and `order_by` required, the others only in this mode,
    /// the tombstone table free. (That the columns are in the SQL's output is checked when the
    /// SQL is planned.)
    fn validate_latest(
        &self,
        cfg: &Config,
        origin: &str,
        i: usize,
        tables: &HashSet<&str>,
    ) -> Result<()> {
        let at = |k: &str| format!("pipelines[{i}].{k}");
        if self.mode != PipelineMode::Latest {
            for (key, set) in [
                ("order_by", self.order_by.is_some()),
                ("delete_when", self.delete_when.is_some()),
                ("key_buckets", self.key_buckets.is_some()),
                ("tombstone_retention", self.tombstone_retention.is_some()),
            ] {
                if set {
                    return Err(Error::config(
                        origin,
                        &at(key),
                        "only `latest` pipelines have this key",
                    ));
                }
            }
            return Ok(());
        }
        if self.keys.is_empty() {
            return Err(Error::config(
                origin,
                &at("keys"),
                "a latest pipeline needs its key columns, e.g. `keys = [\"customer_id\"]`",
            ));
        }
        let mut seen = HashSet::new();
        for k in &self.keys {
            if k.trim().is_empty() || !seen.insert(k.as_str()) {
                return Err(Error::config(
                    origin,
                    &at("keys"),
                    format!("`{k}` is empty or listed twice"),
                ));
            }
        }
        match self.order_by.as_deref().map(str::trim) {
            None | Some("") => {
                return Err(Error::config(
                    origin,
                    &at("order_by"),
                    "a latest pipeline needs the output column that orders versions, e.g. `order_by = \"event_time\"`",
                ))
            }
            Some(o) if self.keys.iter().any(|k| k == o) => {
                return Err(Error::config(
                    origin,
                    &at("order_by"),
                    format!("`{o}` is a key column; order versions by another column"),
                ))
            }
            Some(_) => {}
        }
        if let Some(d) = &self.delete_when {
            if d.trim().is_empty() {
                return Err(Error::config(
                    origin,
                    &at("delete_when"),
                    "must not be empty (leave it out for no deletes)",
                ));
            }
        }
        let n = self.key_buckets();
        if n == 0 || n > MAX_KEY_BUCKETS {
            return Err(Error::config(
                origin,
                &at("key_buckets"),
                format!("is {n}; must be 1 to {MAX_KEY_BUCKETS}"),
            ));
        }
        if let Some(r) = &self.tombstone_retention {
            let r = r.trim();
            if r != "none" && r != "forever" {
                parse_window(r).map_err(|e| {
                    Error::config(
                        origin,
                        &at("tombstone_retention"),
                        format!("{e}; or `none` to keep tombstones forever"),
                    )
                })?;
            }
        }
        if self.alert.is_some() {
            return Err(Error::config(
                origin,
                &at("alert"),
                "alerts are for append pipelines (latest rows are replaced, not final)",
            ));
        }
        if !self.joins.is_empty() {
            return Err(Error::config(
                origin,
                &at("joins"),
                "latest pipelines do not join other tables yet (join in an append pipeline \
                 upstream, or enrich the latest sink's readers' queries)",
            ));
        }
        if let Some(tt) = self.tombstone_table() {
            if tables.contains(tt.as_str())
                || cfg.pipelines.iter().any(|q| q.sink == tt || q.source == tt)
            {
                return Err(Error::config(
                    origin,
                    &at("sink"),
                    format!("the tombstone table `{tt}` of this sink is already a table or sink"),
                ));
            }
        }
        Ok(())
    }
}

impl IngestConfig {
    /// Checks the input limits (`max_*`).
    pub(super) fn validate_limits(&self, origin: &str) -> Result<()> {
        let at_least = |key: &str, value: u64, min: u64| {
            if value < min {
                Err(Error::config(
                    origin,
                    &format!("ingest.{key}"),
                    format!("is {value}; must be at least {min}"),
                ))
            } else {
                Ok(())
            }
        };
        at_least("max_line_bytes", self.max_line_bytes, 1024)?;
        at_least("max_field_bytes", self.max_field_bytes, 1)?;
        at_least("max_decompressed_bytes", self.max_decompressed_bytes, 1)?;
        at_least("max_spool_bytes", self.max_spool_bytes, 1)?;
        at_least("max_page_bytes", self.max_page_bytes, 1 << 20)?;
        at_least("max_unique_keys", self.max_unique_keys as u64, 1)?;
        at_least("max_columns", self.max_columns as u64, 1)?;
        // Room for a few maximal records (a rejected line is kept whole, JSON-escaped), and no
        // more than one S3 PutObject can take (the quarantine object is one PUT).
        at_least(
            "max_quarantine_bytes",
            self.max_quarantine_bytes,
            self.max_line_bytes.saturating_mul(8),
        )?;
        if self.max_quarantine_bytes > 5 << 30 {
            return Err(Error::config(
                origin,
                "ingest.max_quarantine_bytes",
                format!(
                    "is {}; at most 5 GiB (5368709120), the largest single S3 PutObject",
                    self.max_quarantine_bytes
                ),
            ));
        }
        if self.max_field_bytes > self.max_line_bytes {
            return Err(Error::config(
                origin,
                "ingest.max_field_bytes",
                format!(
                    "is {}, above max_line_bytes ({}): a field lives inside its record",
                    self.max_field_bytes, self.max_line_bytes
                ),
            ));
        }
        if !(1..=MAX_NESTING_DEPTH_CAP).contains(&self.max_nesting_depth) {
            return Err(Error::config(
                origin,
                "ingest.max_nesting_depth",
                format!(
                    "is {}; must be between 1 and {MAX_NESTING_DEPTH_CAP}",
                    self.max_nesting_depth
                ),
            ));
        }
        Ok(())
    }
}
