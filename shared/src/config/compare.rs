//! `[[compare]]`: how `floe compare` lines a table up against the output of the system it
//! replaces (keys, time column, measures, window, tolerance, column renames). Every value can
//! also be given (or overridden) on the command line.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{parse_window, Config};
use crate::error::{Error, Result};

/// The comparison defaults of one table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareConfig {
    /// The floe table (one of `tables` or a pipeline sink).
    pub table: String,
    /// Columns that identify a record on both sides (joined in this order).
    #[serde(default)]
    pub keys: Vec<String>,
    /// The time column windows are cut on (default: the table's event-time column).
    #[serde(default)]
    pub time: Option<String>,
    /// Numeric columns whose per-window sums and per-record values are compared.
    #[serde(default)]
    pub measures: Vec<String>,
    /// Window size (`1d`, `1h`, `15m`; default `1d`).
    #[serde(default)]
    pub window: Option<String>,
    /// Relative tolerance on counts, sums and values (0 = exact, 0.001 = 0.1 %).
    #[serde(default)]
    pub tolerance: f64,
    /// Columns named differently by the other system: its name → floe's name.
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
}

impl CompareConfig {
    /// Checks one entry: a known table, a valid window and a tolerance in `[0, 1)`.
    pub(super) fn validate(&self, cfg: &Config, origin: &str, i: usize) -> Result<()> {
        let at = |k: &str| format!("compare[{i}].{k}");
        if !cfg.all_tables().iter().any(|t| t == &self.table) {
            return Err(Error::config(
                origin,
                &at("table"),
                format!("no table or pipeline sink named `{}`", self.table),
            ));
        }
        if let Some(w) = &self.window {
            parse_window(w).map_err(|e| Error::config(origin, &at("window"), e))?;
        }
        if !(0.0..1.0).contains(&self.tolerance) {
            return Err(Error::config(
                origin,
                &at("tolerance"),
                "must be at least 0 and below 1 (a relative tolerance)",
            ));
        }
        if let Some(col) = self
            .keys
            .iter()
            .chain(&self.measures)
            .find(|c| c.trim().is_empty())
        {
            return Err(Error::config(
                origin,
                &at("keys"),
                format!("empty column name `{col}`"),
            ));
        }
        Ok(())
    }
}

impl Config {
    /// The `[[compare]]` entry of `table`, if any.
    pub fn compare_defaults(&self, table: &str) -> Option<&CompareConfig> {
        self.compare.iter().find(|c| c.table == table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[catalog]
kind = "sqlite"
uri = "sqlite://target/x.db"
warehouse = "file:///tmp/wh"

[[tables]]
name = "orders"
event_time = "event_time"
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "amount", type = "double" },
  { name = "event_time", type = "timestamptz", required = true },
]
"#;

    #[test]
    fn compare_entries_are_checked() {
        let ok = format!(
            "{BASE}\n[[compare]]\ntable = \"orders\"\nkeys = [\"order_id\"]\nmeasures = [\"amount\"]\nwindow = \"1h\"\ntolerance = 0.001\nrename = {{ total = \"amount\" }}\n"
        );
        let c = Config::parse(&ok, "floe.toml").unwrap();
        let d = c.compare_defaults("orders").unwrap();
        assert_eq!(d.keys, vec!["order_id"]);
        assert_eq!(d.rename["total"], "amount");
        for (bad, says) in [
            ("table = \"nope\"", "no table or pipeline sink named `nope`"),
            (
                "table = \"orders\"\nwindow = \"1 fortnight\"",
                "compare[0].window",
            ),
            (
                "table = \"orders\"\ntolerance = 1.5",
                "compare[0].tolerance",
            ),
        ] {
            let text = format!("{BASE}\n[[compare]]\n{bad}\n");
            let err = Config::parse(&text, "floe.toml").unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
