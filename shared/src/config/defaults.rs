//! The `[defaults]` block: table-creation standards every table and sink gets unless it sets
//! its own value, and `${NAME}` references to the environment in the file's text.
//!
//! A table key present in the table's own section always wins; a key it leaves out takes the
//! `[defaults]` value, else the built-in default. `{event_time}` in a default `partition` or
//! `sort` entry names each table's own event-time column, so one block fits every table.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Config, SchemaPolicy};
use crate::error::{Error, Result};

/// Standards for new tables and sinks (`[defaults]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultsConfig {
    /// Partition fields of tables that declare none, e.g. `["day({event_time})"]`.
    #[serde(default)]
    pub partition: Option<Vec<String>>,
    /// Sort order of tables that declare none, e.g. `["{event_time}"]`.
    #[serde(default)]
    pub sort: Option<Vec<String>>,
    /// Target data file size in MiB (tables and sinks).
    #[serde(default)]
    pub target_file_size_mb: Option<u64>,
    /// Schema policy of tables that declare none.
    #[serde(default)]
    pub schema_policy: Option<SchemaPolicy>,
    /// `on_consumer_break` of tables that declare none.
    #[serde(default)]
    pub on_consumer_break: Option<super::ConsumerBreak>,
    /// Snapshot retention written as `history.expire.max-snapshot-age-ms` at creation.
    #[serde(default)]
    pub expire_older_than_hours: Option<f64>,
    /// Snapshots always kept, written as `history.expire.min-snapshots-to-keep` at creation.
    #[serde(default)]
    pub retain_last: Option<u32>,
    /// Freshness objective of every table (its alarm threshold), seconds.
    #[serde(default)]
    pub freshness_objective_seconds: Option<u64>,
    /// A table with no ingested record for this long alarms as stalled, seconds.
    #[serde(default)]
    pub stall_after_seconds: Option<u64>,
    /// Pipeline lag objective (the per-pipeline lag alarm), seconds.
    #[serde(default)]
    pub lag_objective_seconds: Option<u64>,
    /// Table properties every table and sink is created with (a table's own win).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// Built-in freshness objective (seconds) when neither the table nor `[defaults]` sets one.
pub(crate) const FRESHNESS_OBJECTIVE_SECONDS: u64 = 120;
/// Built-in stall window (seconds).
pub(crate) const STALL_AFTER_SECONDS: u64 = 3600;
/// Built-in pipeline lag objective (seconds).
pub(crate) const LAG_OBJECTIVE_SECONDS: u64 = 600;

impl Config {
    /// Fills every table and pipeline key its own section leaves out from `[defaults]`; `raw`
    /// is the same text parsed as plain TOML (it tells which keys a section really set).
    pub(super) fn apply_defaults(&mut self, raw: &toml::Table) {
        let d = self.defaults.clone();
        let sections = |key: &str| -> Vec<toml::Table> {
            raw.get(key)
                .and_then(|v| v.as_array())
                .map(|a| a.iter().filter_map(|t| t.as_table().cloned()).collect())
                .unwrap_or_default()
        };
        let tables = sections("tables");
        for (i, t) in self.tables.iter_mut().enumerate() {
            let set = |k: &str| tables.get(i).is_some_and(|s| s.contains_key(k));
            let at_event_time = |v: &Vec<String>| {
                v.iter()
                    .map(|s| s.replace("{event_time}", &t.event_time))
                    .collect::<Vec<_>>()
            };
            if let (false, Some(p)) = (set("partition"), &d.partition) {
                t.partition = at_event_time(p);
            }
            if let (false, Some(s)) = (set("sort"), &d.sort) {
                t.sort = at_event_time(s);
            }
            if let (false, Some(mb)) = (set("target_file_size_mb"), d.target_file_size_mb) {
                t.target_file_size_mb = mb;
            }
            if let (false, Some(p)) = (set("schema_policy"), d.schema_policy) {
                t.schema_policy = p;
            }
            if let (false, Some(b)) = (set("on_consumer_break"), d.on_consumer_break) {
                t.on_consumer_break = b;
            }
            if !set("expire_older_than_hours") {
                t.expire_older_than_hours = d.expire_older_than_hours;
            }
            if !set("retain_last") {
                t.retain_last = d.retain_last;
            }
            if !set("freshness_objective_seconds") {
                t.freshness_objective_seconds = d
                    .freshness_objective_seconds
                    .unwrap_or(FRESHNESS_OBJECTIVE_SECONDS);
            }
            if !set("stall_after_seconds") {
                t.stall_after_seconds = d.stall_after_seconds.unwrap_or(STALL_AFTER_SECONDS);
            }
            for (k, v) in &d.properties {
                t.properties.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let pipelines = sections("pipelines");
        for (i, p) in self.pipelines.iter_mut().enumerate() {
            let set = pipelines
                .get(i)
                .is_some_and(|s| s.contains_key("lag_objective_seconds"));
            if !set {
                p.lag_objective_seconds = d.lag_objective_seconds.unwrap_or(LAG_OBJECTIVE_SECONDS);
            }
        }
    }

    /// The properties a pipeline's sink is created with: `[defaults]` properties, target file
    /// size and retention (a sink has no section of its own).
    pub fn sink_properties(&self) -> BTreeMap<String, String> {
        let d = &self.defaults;
        let mut props = d.properties.clone();
        if let Some(mb) = d.target_file_size_mb {
            props.insert(
                "write.target-file-size-bytes".into(),
                (mb << 20).to_string(),
            );
        }
        props.extend(retention_properties(
            d.expire_older_than_hours,
            d.retain_last,
        ));
        props
    }
}

/// `history.expire.*` table properties for a retention (none for what is unset).
pub(crate) fn retention_properties(
    older_than_hours: Option<f64>,
    retain_last: Option<u32>,
) -> BTreeMap<String, String> {
    let mut props = BTreeMap::new();
    if let Some(h) = older_than_hours {
        props.insert(
            "history.expire.max-snapshot-age-ms".into(),
            ((h * 3_600_000.0).round() as u64).to_string(),
        );
    }
    if let Some(n) = retain_last {
        props.insert("history.expire.min-snapshots-to-keep".into(), n.to_string());
    }
    props
}

/// Replaces `${NAME}` with `lookup(NAME)` (`$${` stands for a literal `${`). A reference that
/// is unset or malformed is a `Config` error naming the line.
pub(crate) fn expand_vars(
    text: &str,
    origin: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String> {
    if !text.contains("${") {
        return Ok(text.to_string());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        let escaped = at > 0 && rest.as_bytes()[at - 1] == b'$';
        if escaped {
            out.push_str(&rest[..at - 1]);
            out.push_str("${");
            rest = &rest[at + 2..];
            continue;
        }
        out.push_str(&rest[..at]);
        let line = text[..text.len() - rest.len() + at].lines().count().max(1);
        let key = format!("line {line}");
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err(Error::config(origin, &key, "`${` without a closing `}`"));
        };
        let name = &after[..end];
        let valid = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(Error::config(
                origin,
                &key,
                format!("`${{{name}}}`: expected ${{NAME}} with letters, digits and `_`"),
            ));
        }
        let Some(value) = lookup(name) else {
            return Err(Error::config(
                origin,
                &key,
                format!("`${{{name}}}` is not set in the environment"),
            ));
        };
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Checks `[defaults]`: sizes and durations positive, `{event_time}` the only placeholder.
pub(super) fn validate(d: &DefaultsConfig, origin: &str) -> Result<()> {
    let at = |k: &str| format!("defaults.{k}");
    if d.target_file_size_mb == Some(0) {
        return Err(Error::config(
            origin,
            &at("target_file_size_mb"),
            "must be at least 1",
        ));
    }
    if let Some(h) = d.expire_older_than_hours {
        if !(h.is_finite() && h > 0.0) {
            return Err(Error::config(
                origin,
                &at("expire_older_than_hours"),
                "must be positive",
            ));
        }
    }
    for (key, v) in [
        ("freshness_objective_seconds", d.freshness_objective_seconds),
        ("stall_after_seconds", d.stall_after_seconds),
        ("lag_objective_seconds", d.lag_objective_seconds),
    ] {
        if v == Some(0) {
            return Err(Error::config(origin, &at(key), "must be at least 1"));
        }
    }
    for (key, list) in [("partition", &d.partition), ("sort", &d.sort)] {
        for (j, s) in list.iter().flatten().enumerate() {
            let stripped = s.replace("{event_time}", "");
            if stripped.contains('{') || stripped.contains('}') {
                return Err(Error::config(
                    origin,
                    &at(&format!("{key}[{j}]")),
                    format!("`{s}`: the only placeholder is {{event_time}}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        (name == "BUCKET").then(|| "data-1".to_string())
    }

    #[test]
    fn expands_set_variables_and_refuses_unset_ones() {
        let out = expand_vars("a = \"s3://${BUCKET}/w\"\nb = \"$${BUCKET}\"", "f", &vars).unwrap();
        assert_eq!(out, "a = \"s3://data-1/w\"\nb = \"${BUCKET}\"");
        let e = expand_vars("x = 1\ny = \"${NOPE}\"", "f", &vars).unwrap_err();
        assert!(
            e.to_string().contains("line 2") && e.to_string().contains("NOPE"),
            "{e}"
        );
        let e = expand_vars("y = \"${bad-name}\"", "f", &vars).unwrap_err();
        assert!(e.to_string().contains("bad-name"), "{e}");
        let e = expand_vars("y = \"${OPEN", "f", &vars).unwrap_err();
        assert!(e.to_string().contains("closing"), "{e}");
    }

    const BASE: &str = r#"
[catalog]
kind = "sqlite"
uri = "sqlite://target/x.db"
warehouse = "file:///tmp/wh"

[[tables]]
name = "orders"
event_time = "ts"
columns = [{ name = "id", type = "string" }, { name = "ts", type = "timestamptz" }]

[[tables]]
name = "clicks"
event_time = "at"
partition = []
sort = ["id"]
target_file_size_mb = 64
freshness_objective_seconds = 30
properties = { "write.metadata.previous-versions-max" = "5" }
columns = [{ name = "id", type = "string" }, { name = "at", type = "timestamptz" }]

[[pipelines]]
name = "p"
source = "orders"
sink = "orders_copy"
mode = "append"
sql = "SELECT * FROM source"
"#;

    #[test]
    fn defaults_fill_what_a_table_leaves_out_and_nothing_else() {
        let plain = Config::parse(BASE, "f").unwrap();
        let orders = plain.table("orders").unwrap();
        assert!(orders.partition.is_empty() && orders.sort.is_empty());
        assert_eq!(orders.target_file_size_mb, 128);
        assert_eq!(
            orders.freshness_objective_seconds,
            FRESHNESS_OBJECTIVE_SECONDS
        );
        assert_eq!(orders.stall_after_seconds, STALL_AFTER_SECONDS);
        assert_eq!(
            plain.pipelines[0].lag_objective_seconds,
            LAG_OBJECTIVE_SECONDS
        );
        assert!(plain.sink_properties().is_empty());

        let text = format!(
            "{BASE}\n[defaults]\npartition = [\"day({{event_time}})\"]\nsort = [\"{{event_time}} desc\"]\n\
             target_file_size_mb = 256\nexpire_older_than_hours = 24\nretain_last = 3\n\
             freshness_objective_seconds = 60\nstall_after_seconds = 900\nlag_objective_seconds = 120\n\
             properties = {{ \"write.metadata.previous-versions-max\" = \"50\", \"owner\" = \"data\" }}\n"
        );
        let c = Config::parse(&text, "f").unwrap();
        let orders = c.table("orders").unwrap();
        assert_eq!(orders.partition, vec!["day(ts)"]);
        assert_eq!(orders.sort, vec!["ts desc"]);
        assert_eq!(orders.target_file_size_mb, 256);
        assert_eq!(orders.expire_older_than_hours, Some(24.0));
        assert_eq!(orders.retain_last, Some(3));
        assert_eq!(orders.freshness_objective_seconds, 60);
        assert_eq!(orders.stall_after_seconds, 900);
        assert_eq!(orders.properties["owner"], "data");
        // The table that sets its own values keeps them, an explicit empty partition included.
        let clicks = c.table("clicks").unwrap();
        assert!(clicks.partition.is_empty());
        assert_eq!(clicks.sort, vec!["id"]);
        assert_eq!(clicks.target_file_size_mb, 64);
        assert_eq!(clicks.freshness_objective_seconds, 30);
        assert_eq!(clicks.stall_after_seconds, 900);
        assert_eq!(
            clicks.properties["write.metadata.previous-versions-max"],
            "5"
        );
        assert_eq!(c.pipelines[0].lag_objective_seconds, 120);
        let sink = c.sink_properties();
        assert_eq!(
            sink["write.target-file-size-bytes"],
            (256u64 << 20).to_string()
        );
        assert_eq!(sink["history.expire.min-snapshots-to-keep"], "3");
        assert_eq!(sink["owner"], "data");
    }

    #[test]
    fn bad_defaults_are_config_errors() {
        for (extra, key) in [
            (
                "[defaults]\ntarget_file_size_mb = 0",
                "defaults.target_file_size_mb",
            ),
            (
                "[defaults]\npartition = [\"day({ts})\"]",
                "defaults.partition[0]",
            ),
            (
                "[defaults]\nlag_objective_seconds = 0",
                "defaults.lag_objective_seconds",
            ),
            ("[defaults]\nsort = [\"nope\"]", "tables[0].sort[0]"),
        ] {
            let e = Config::parse(&format!("{BASE}\n{extra}\n"), "f").unwrap_err();
            assert!(e.to_string().contains(key), "{extra}: {e}");
        }
    }

    #[test]
    fn retention_becomes_expire_properties() {
        let p = retention_properties(Some(48.0), Some(7));
        assert_eq!(p["history.expire.max-snapshot-age-ms"], "172800000");
        assert_eq!(p["history.expire.min-snapshots-to-keep"], "7");
        assert!(retention_properties(None, None).is_empty());
    }
}
