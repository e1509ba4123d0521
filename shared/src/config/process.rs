//! `[process]`: settings of the process function's batch speed (`floe process refresh`).

use serde::Deserialize;

use crate::error::{Error, Result};

/// How a refresh bounds its memory and its invocations.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessConfig {
    /// Most source rows one refresh chunk reads (default 1,000,000): a refresh recomputes the
    /// sink one chunk at a time — ranges of windows (aggregate mode) or groups of source data
    /// files (append mode) chosen from the manifests' record counts and time bounds — each
    /// chunk one sink commit, so memory is bounded by a chunk, not by the table. A single
    /// window (aggregate) or a single data file (append) is never split.
    pub refresh_chunk_rows: u64,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        Self {
            refresh_chunk_rows: 1_000_000,
        }
    }
}

impl ProcessConfig {
    /// A chunk holds at least one row.
    pub(super) fn validate(&self, origin: &str) -> Result<()> {
        if self.refresh_chunk_rows == 0 {
            return Err(Error::config(
                origin,
                "process.refresh_chunk_rows",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chunk_budget_defaults_parses_and_is_at_least_one_row() {
        assert_eq!(ProcessConfig::default().refresh_chunk_rows, 1_000_000);
        let c: ProcessConfig = toml::from_str("refresh_chunk_rows = 5000").unwrap();
        assert_eq!(c.refresh_chunk_rows, 5000);
        assert!(toml::from_str::<ProcessConfig>("chunk_rows = 1").is_err());
        let e = ProcessConfig {
            refresh_chunk_rows: 0,
        }
        .validate("f.toml")
        .unwrap_err()
        .to_string();
        assert!(e.contains("process.refresh_chunk_rows"), "{e}");
    }
}
