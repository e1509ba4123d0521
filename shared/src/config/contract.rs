//! Data-quality contracts: a table's declarative checks (`[[tables.checks]]`), what each kind
//! takes, and their terms parsed against a schema (bounds and value lists as Arrow values of
//! the column's type, `sql` compiled to a DataFusion physical expression), so config validation
//! and ingest's evaluation ([`crate::quality`]) read a check the same way.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Float64Array, Int64Array, StringArray};
use arrow::compute::{cast_with_options, CastOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::TableConfig;
use crate::error::{Error, Result};

/// Most values an `accepted` check may list, and most characters of a `regex` pattern or a
/// `sql` expression: a contract is configuration, not data.
pub(crate) const MAX_ACCEPTED_VALUES: usize = 10_000;
/// See [`MAX_ACCEPTED_VALUES`].
pub(crate) const MAX_EXPRESSION_CHARS: usize = 10_000;
/// Longest window a `unique` check may read back from the table (31 days): each object reads
/// the keys of that window, so it must stay bounded (and `max_unique_keys` bounds the keys).
pub(crate) const MAX_WITHIN_HOURS: f64 = 744.0;

/// One declarative check of a table's rows.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckConfig {
    /// Unique per table; named in quarantine reasons, `_quality` flags, summaries and metrics.
    pub name: String,
    /// What the check tests.
    pub kind: CheckKind,
    /// The column tested (`not_null`, `range`, `accepted`, `regex`, `max_length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
    /// The key columns (`unique`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<String>,
    /// Smallest allowed value (`range`: a number, or an RFC 3339 / `YYYY-MM-DD` string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<toml::Value>,
    /// Largest allowed value (`range`), or the longest allowed string in characters
    /// (`max_length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<toml::Value>,
    /// `range` on a timestamp column: no value later than ingestion time + this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_future_seconds: Option<u64>,
    /// The allowed values (`accepted`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<toml::Value>,
    /// A regular expression (Rust `regex` syntax) the value must match somewhere; anchor it with
    /// `^…$` to match the whole value (`regex`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// `unique`: also against the table's rows whose event time lies in the last this many hours
    /// (read once per object, before its rows are checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within_hours: Option<f64>,
    /// A DataFusion SQL boolean expression over the row's columns; the record passes unless it
    /// is false (`sql`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expr: Option<String>,
    /// What a failing record does (default `quarantine`).
    #[serde(default)]
    pub action: Action,
}

/// What a check tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    /// The column is present and not null (the only check nulls fail).
    NotNull,
    /// The value lies in `[min, max]` (either may be left out); timestamps also not after
    /// ingestion time + `max_future_seconds`.
    Range,
    /// The value is one of `values`.
    Accepted,
    /// The string value matches `pattern`.
    Regex,
    /// The string value has at most `max` characters.
    MaxLength,
    /// The key `columns` occur at most once within the object (and, with `within_hours`, not in
    /// the table's recent rows).
    Unique,
    /// The SQL expression `expr` over the row is not false.
    Sql,
}

impl CheckKind {
    /// The name used in `floe.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckKind::NotNull => "not_null",
            CheckKind::Range => "range",
            CheckKind::Accepted => "accepted",
            CheckKind::Regex => "regex",
            CheckKind::MaxLength => "max_length",
            CheckKind::Unique => "unique",
            CheckKind::Sql => "sql",
        }
    }
}

/// What happens to a record that fails a check.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// The record goes to quarantine with the check's name in its reason.
    #[default]
    Quarantine,
    /// The record is kept; the failed checks' names go into its `_quality` column.
    Flag,
    /// The object is refused whole: nothing committed, quarantined whole, an alarm.
    Fail,
}

impl Action {
    /// The name used in `floe.toml`, summaries and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Quarantine => "quarantine",
            Action::Flag => "flag",
            Action::Fail => "fail",
        }
    }
}

impl TableConfig {
    /// Whether any check flags (the table then has a `_quality` column).
    pub fn has_flag_checks(&self) -> bool {
        self.checks.iter().any(|c| c.action == Action::Flag)
    }

    /// The configured columns the checks read (`column`, `columns`, and the columns a `sql`
    /// expression names), in config order.
    pub(crate) fn check_columns(&self) -> Vec<&super::ColumnConfig> {
        let mut named: HashSet<String> = HashSet::new();
        let schema = self.config_arrow_schema().ok();
        for c in &self.checks {
            named.extend(c.column.iter().cloned());
            named.extend(c.columns.iter().cloned());
            if let (CheckKind::Sql, Some(expr), Some(schema)) = (c.kind, &c.expr, &schema) {
                named.extend(sql_columns(expr, schema));
            }
        }
        self.columns
            .iter()
            .filter(|c| named.contains(&c.name))
            .collect()
    }

    /// A stable hash of the table's checks (16 hex digits; `none` without checks), recorded in
    /// every ingest summary: a changed contract shows as a changed version from the next object.
    pub fn contract_version(&self) -> String {
        if self.checks.is_empty() {
            return "none".into();
        }
        let text = serde_json::to_string(&self.checks).unwrap_or_default();
        let digest = Sha256::digest(text.as_bytes());
        hex::encode(&digest[..8])
    }

    /// The Arrow schema of the configured columns (all nullable), as decoding types them: what
    /// checks are compiled against at config load.
    pub(crate) fn config_arrow_schema(&self) -> std::result::Result<SchemaRef, String> {
        let fields = self
            .columns
            .iter()
            .map(|c| {
                let ty = super::types::parse_type(&c.type_name)?;
                let arrow = iceberg::arrow::type_to_arrow_type(&iceberg::spec::Type::Primitive(ty))
                    .map_err(|e| format!("column `{}`: {e}", c.name))?;
                Ok(Field::new(&c.name, arrow, true))
            })
            .collect::<std::result::Result<Vec<_>, String>>()?;
        Ok(Arc::new(Schema::new(fields)))
    }

    /// Every check: unique names, the fields its kind takes, known columns of a fitting type,
    /// bounds and values of the column's type, a compiling regex and SQL expression.
    pub(super) fn validate_checks(&self, origin: &str, i: usize) -> Result<()> {
        if self.checks.is_empty() {
            return Ok(());
        }
        let schema = self
            .config_arrow_schema()
            .map_err(|r| Error::config(origin, &format!("tables[{i}].columns"), r))?;
        let mut names = HashSet::new();
        for (j, check) in self.checks.iter().enumerate() {
            let fail = |reason: String| {
                Error::config(
                    origin,
                    &format!("tables[{i}].checks[{j}]"),
                    format!(
                        "table `{}`, check `{}`: {reason}",
                        self.name,
                        if check.name.is_empty() {
                            "?"
                        } else {
                            &check.name
                        }
                    ),
                )
            };
            if !valid_name(&check.name) {
                return Err(fail(
                    "`name` must be 1-64 characters of letters, digits, `_` and `-`".into(),
                ));
            }
            if !names.insert(check.name.as_str()) {
                return Err(fail("duplicate check name".into()));
            }
            check.validate(&schema).map_err(fail)?;
            // The table holds a `hash`ed key as its HMAC and a `drop`ped one as null: the
            // object's raw keys never equal them, so the window would silently catch nothing.
            if check.within_hours.is_some() {
                if let Some(c) = self
                    .columns
                    .iter()
                    .find(|c| c.sensitive.is_some() && check.columns.contains(&c.name))
                {
                    return Err(fail(format!(
                        "`within_hours` cannot compare key column `{}`: it is sensitive, so the \
                         table does not hold its values",
                        c.name
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A check name: safe in summary keys, metric dimensions and the comma-separated `_quality`.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl CheckConfig {
    /// The check against `schema` (the table's columns as decoding types them).
    pub(crate) fn validate(&self, schema: &SchemaRef) -> std::result::Result<(), String> {
        self.fields_fit_kind()?;
        let column = |name: &str| -> std::result::Result<DataType, String> {
            schema
                .field_with_name(name)
                .map(|f| f.data_type().clone())
                .map_err(|_| format!("no column named `{name}`"))
        };
        let one = || {
            self.column
                .as_deref()
                .ok_or_else(|| format!("a `{}` check needs `column`", self.kind.as_str()))
        };
        match self.kind {
            CheckKind::NotNull => {
                column(one()?)?;
            }
            CheckKind::Range => {
                let name = one()?;
                let ty = column(name)?;
                if !orderable(&ty) {
                    return Err(format!(
                        "`range` needs a number, date or timestamp column; `{name}` is {ty}"
                    ));
                }
                if self.min.is_none() && self.max.is_none() && self.max_future_seconds.is_none() {
                    return Err("`range` needs `min`, `max` or `max_future_seconds`".into());
                }
                if self.max_future_seconds.is_some() && !matches!(ty, DataType::Timestamp(..)) {
                    return Err(format!(
                        "`max_future_seconds` applies to timestamp columns; `{name}` is {ty}"
                    ));
                }
                let lo = self.min.as_ref().map(|v| bound_array(v, &ty)).transpose()?;
                let hi = self.max.as_ref().map(|v| bound_array(v, &ty)).transpose()?;
                if let (Some(lo), Some(hi)) = (lo, hi) {
                    let above =
                        arrow::compute::kernels::cmp::gt(&lo, &hi).map_err(|e| e.to_string())?;
                    if above.value(0) {
                        return Err("`min` is above `max`".into());
                    }
                }
            }
            CheckKind::Accepted => {
                let name = one()?;
                let ty = column(name)?;
                if self.values.is_empty() {
                    return Err("`accepted` needs a non-empty `values` list".into());
                }
                if self.values.len() > MAX_ACCEPTED_VALUES {
                    return Err(format!(
                        "`values` lists {} values; at most {MAX_ACCEPTED_VALUES}",
                        self.values.len()
                    ));
                }
                values_array(&self.values, &ty)?;
            }
            CheckKind::Regex => {
                let name = one()?;
                string_column(name, &column(name)?, "regex")?;
                compile_regex(self.pattern.as_deref().unwrap_or(""))?;
            }
            CheckKind::MaxLength => {
                let name = one()?;
                string_column(name, &column(name)?, "max_length")?;
                max_chars(self.max.as_ref())?;
            }
            CheckKind::Unique => {
                if self.columns.is_empty() {
                    return Err("`unique` needs `columns` (the key)".into());
                }
                if let Some(h) = self.within_hours {
                    if !(h.is_finite() && h > 0.0 && h <= MAX_WITHIN_HOURS) {
                        return Err(format!(
                            "`within_hours` = {h}: must be above 0 and at most {MAX_WITHIN_HOURS}"
                        ));
                    }
                }
                let mut seen = HashSet::new();
                for c in &self.columns {
                    column(c)?;
                    if !seen.insert(c) {
                        return Err(format!("`columns` names `{c}` twice"));
                    }
                }
            }
            CheckKind::Sql => {
                sql_predicate(self.expr.as_deref().unwrap_or(""), schema)?;
            }
        }
        Ok(())
    }

    /// Refuses fields the check's kind does not take (a `pattern` on a `range` check is a
    /// mistake, not something to ignore), and missing ones it needs.
    fn fields_fit_kind(&self) -> std::result::Result<(), String> {
        let given = [
            ("column", self.column.is_some()),
            ("columns", !self.columns.is_empty()),
            ("min", self.min.is_some()),
            ("max", self.max.is_some()),
            ("max_future_seconds", self.max_future_seconds.is_some()),
            ("values", !self.values.is_empty()),
            ("pattern", self.pattern.is_some()),
            ("expr", self.expr.is_some()),
            ("within_hours", self.within_hours.is_some()),
        ];
        let takes: &[&str] = match self.kind {
            CheckKind::NotNull => &["column"],
            CheckKind::Range => &["column", "min", "max", "max_future_seconds"],
            CheckKind::Accepted => &["column", "values"],
            CheckKind::Regex => &["column", "pattern"],
            CheckKind::MaxLength => &["column", "max"],
            CheckKind::Unique => &["columns", "within_hours"],
            CheckKind::Sql => &["expr"],
        };
        if let Some((field, _)) = given.iter().find(|(f, set)| *set && !takes.contains(f)) {
            return Err(format!(
                "a `{}` check does not take `{field}` (it takes {})",
                self.kind.as_str(),
                takes.join(", ")
            ));
        }
        for (field, needed) in [("pattern", CheckKind::Regex), ("expr", CheckKind::Sql)] {
            if self.kind == needed && !given.iter().any(|(f, set)| *f == field && *set) {
                return Err(format!("a `{}` check needs `{field}`", self.kind.as_str()));
            }
        }
        if self.kind == CheckKind::MaxLength && self.max.is_none() {
            return Err("a `max_length` check needs `max`".into());
        }
        Ok(())
    }
}

fn orderable(ty: &DataType) -> bool {
    ty.is_numeric() || matches!(ty, DataType::Date32 | DataType::Timestamp(..))
}

fn string_column(name: &str, ty: &DataType, kind: &str) -> std::result::Result<(), String> {
    if matches!(
        ty,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    ) {
        Ok(())
    } else {
        Err(format!("`{kind}` needs a string column; `{name}` is {ty}"))
    }
}

/// The longest string a `max_length` check allows.
pub(crate) fn max_chars(max: Option<&toml::Value>) -> std::result::Result<usize, String> {
    match max {
        Some(toml::Value::Integer(n)) if *n >= 0 => {
            usize::try_from(*n).map_err(|_| format!("`max` = {n} is too large"))
        }
        Some(v) => Err(format!("`max` must be a non-negative integer, not {v}")),
        None => Err("a `max_length` check needs `max`".into()),
    }
}

/// Compiles a `regex` check's pattern (bounded in size: a pattern is configuration).
pub(crate) fn compile_regex(pattern: &str) -> std::result::Result<regex::Regex, String> {
    if pattern.len() > MAX_EXPRESSION_CHARS {
        return Err(format!(
            "`pattern` is {} characters; at most {MAX_EXPRESSION_CHARS}",
            pattern.len()
        ));
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("bad `pattern`: {e}"))
}

/// One TOML value as a one-element Arrow array of type `to` (numbers converted exactly, strings
/// parsed as the type: `2026-01-01T00:00:00Z` for a timestamp, `2026-01-01` for a date).
pub(crate) fn bound_array(
    value: &toml::Value,
    to: &DataType,
) -> std::result::Result<ArrayRef, String> {
    let from: ArrayRef = match value {
        toml::Value::Integer(n) => Arc::new(Int64Array::from(vec![*n])),
        toml::Value::Float(x) => {
            if !(to.is_floating()
                || matches!(to, DataType::Decimal128(..) | DataType::Decimal256(..)))
            {
                return Err(format!("{x} is not a value of type {to}"));
            }
            Arc::new(Float64Array::from(vec![*x]))
        }
        toml::Value::String(s) => Arc::new(StringArray::from(vec![s.as_str()])),
        toml::Value::Datetime(d) => Arc::new(StringArray::from(vec![d.to_string()])),
        other => return Err(format!("{other} is not a value of type {to}")),
    };
    let opts = CastOptions {
        safe: false,
        ..Default::default()
    };
    let cast = cast_with_options(&from, to, &opts)
        .map_err(|e| format!("{value} is not a value of type {to}: {e}"))?;
    if cast.null_count() > 0 {
        return Err(format!("{value} is not a value of type {to}"));
    }
    Ok(cast)
}

/// An `accepted` check's values as one Arrow array of type `to`.
pub(crate) fn values_array(
    values: &[toml::Value],
    to: &DataType,
) -> std::result::Result<ArrayRef, String> {
    let parts: Vec<ArrayRef> = values
        .iter()
        .map(|v| bound_array(v, to))
        .collect::<std::result::Result<_, _>>()?;
    let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
    arrow::compute::concat(&refs).map_err(|e| e.to_string())
}

/// A `sql` check's expression compiled against `schema`: it must be a boolean expression over
/// the row's columns (DataFusion dialect; unquoted names are lower-cased).
pub(crate) fn sql_predicate(
    expr: &str,
    schema: &SchemaRef,
) -> std::result::Result<Arc<dyn PhysicalExpr>, String> {
    if expr.trim().is_empty() {
        return Err("`expr` must not be empty".into());
    }
    if expr.len() > MAX_EXPRESSION_CHARS {
        return Err(format!(
            "`expr` is {} characters; at most {MAX_EXPRESSION_CHARS}",
            expr.len()
        ));
    }
    let df_schema = DFSchema::try_from(schema.as_ref().clone()).map_err(|e| e.to_string())?;
    let ctx = SessionContext::new();
    let logical = ctx
        .parse_sql_expr(expr, &df_schema)
        .map_err(|e| format!("bad `expr` `{expr}`: {e}"))?;
    deterministic(&logical).map_err(|f| {
        format!(
            "bad `expr` `{expr}`: `{f}` is not a deterministic function of the row (a check must \
             give the same answer when an object is delivered again)"
        )
    })?;
    let physical = ctx
        .create_physical_expr(logical, &df_schema)
        .map_err(|e| format!("bad `expr` `{expr}`: {e}"))?;
    let ty = physical
        .data_type(schema)
        .map_err(|e| format!("bad `expr` `{expr}`: {e}"))?;
    if ty != DataType::Boolean {
        return Err(format!("`expr` `{expr}` is of type {ty}, not boolean"));
    }
    Ok(physical)
}

/// The columns `expr` names (none when it does not parse against `schema`).
fn sql_columns(expr: &str, schema: &SchemaRef) -> Vec<String> {
    let Ok(df_schema) = DFSchema::try_from(schema.as_ref().clone()) else {
        return Vec::new();
    };
    match SessionContext::new().parse_sql_expr(expr, &df_schema) {
        Ok(logical) => logical
            .column_refs()
            .into_iter()
            .map(|c| c.name.clone())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Refuses functions that are not immutable (`random()`, `uuid()`, `now()`, …): the name of
/// the first one.
fn deterministic(expr: &datafusion::logical_expr::Expr) -> std::result::Result<(), String> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::{Expr, Volatility};
    let mut found = None;
    let _ = expr.apply(|e| {
        if let Expr::ScalarFunction(f) = e {
            if f.func.signature().volatility != Volatility::Immutable {
                found = Some(f.func.name().to_string());
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn with_checks(checks: &str) -> String {
        format!(
            r#"
[catalog]
kind = "sqlite"
warehouse = "file:///tmp/wh"

[[tables]]
name = "orders"
event_time = "event_time"
columns = [
  {{ name = "order_id", type = "string", required = true }},
  {{ name = "amount", type = "double" }},
  {{ name = "day", type = "date" }},
  {{ name = "event_time", type = "timestamptz", required = true }},
]
{checks}
"#
        )
    }

    #[test]
    fn checks_load_and_version_changes_with_them() {
        let text = with_checks(
            r#"
[[tables.checks]]
name = "amount_range"
kind = "range"
column = "amount"
min = 0
max = 100000.5

[[tables.checks]]
name = "recent_day"
kind = "range"
column = "day"
min = "2020-01-01"

[[tables.checks]]
name = "ok"
kind = "sql"
expr = "amount IS NULL OR amount > 0"
action = "flag"
"#,
        );
        let c = Config::parse(&text, "f.toml").unwrap();
        let t = &c.tables[0];
        assert_eq!(t.checks.len(), 3);
        assert_eq!(
            t.checks[0].action,
            super::Action::Quarantine,
            "the default action"
        );
        assert!(t.has_flag_checks());
        let v1 = t.contract_version();
        assert_eq!(v1.len(), 16);
        assert_eq!(
            v1,
            Config::parse(&text, "f.toml").unwrap().tables[0].contract_version()
        );
        let changed = Config::parse(&text.replace("max = 100000.5", "max = 99"), "f.toml").unwrap();
        assert_ne!(changed.tables[0].contract_version(), v1);
        assert_eq!(
            Config::parse(&with_checks(""), "f.toml").unwrap().tables[0].contract_version(),
            "none"
        );
    }

    #[test]
    fn unique_within_hours_refuses_sensitive_key_columns() {
        let text = with_checks(
            "[[tables.checks]]\nname = \"u\"\nkind = \"unique\"\ncolumns = [\"order_id\"]\nwithin_hours = 24\n",
        );
        Config::parse(&text, "f.toml").unwrap();
        for how in ["hash", "drop"] {
            let sensitive = text.replace(
                "type = \"string\", required = true",
                &format!("type = \"string\", sensitive = \"{how}\""),
            );
            let e = Config::parse(&sensitive, "f.toml").unwrap_err().to_string();
            assert!(
                e.contains("check `u`") && e.contains("sensitive") && e.contains("order_id"),
                "{how}: {e}"
            );
            // Within the object the raw keys are compared: allowed.
            let within_object = sensitive.replace("within_hours = 24\n", "");
            Config::parse(&within_object, "f.toml").unwrap();
        }
    }

    #[test]
    fn problems_name_table_check_and_reason() {
        for (checks, says) in [
            (
                "[[tables.checks]]\nname = \"a\"\nkind = \"not_null\"\ncolumn = \"amount\"\n[[tables.checks]]\nname = \"a\"\nkind = \"not_null\"\ncolumn = \"day\"\n",
                "checks[1]",
            ),
            ("[[tables.checks]]\nname = \"bad.name\"\nkind = \"not_null\"\ncolumn = \"amount\"\n", "`name`"),
            ("[[tables.checks]]\nname = \"re\"\nkind = \"regex\"\ncolumn = \"order_id\"\npattern = \"(\"\n", "bad `pattern`"),
            ("[[tables.checks]]\nname = \"q\"\nkind = \"sql\"\nexpr = \"amount >>> 1\"\n", "bad `expr`"),
            ("[[tables.checks]]\nname = \"t\"\nkind = \"range\"\ncolumn = \"event_time\"\nmin = \"yesterday\"\n", "not a value of type"),
            ("[[tables.checks]]\nname = \"x\"\nkind = \"nonsense\"\ncolumn = \"amount\"\n", "nonsense"),
        ] {
            let e = Config::parse(&with_checks(checks), "f.toml").unwrap_err().to_string();
            assert!(e.contains("f.toml") && e.contains(says), "{checks}: {e}");
            if !checks.contains("nonsense") {
                assert!(e.contains("table `orders`") && e.contains("tables[0].checks["), "{e}");
            }
        }
        let e = Config::parse(&with_checks("[[tables.checks]]\nname = \"re\"\nkind = \"regex\"\ncolumn = \"order_id\"\npattern = \"(\"\n"), "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("check `re`"), "{e}");
    }
}
