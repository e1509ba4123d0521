//! `[process]`: settings of the process function: how many pipelines run at once, and the
//! batch speed's chunks (`floe process refresh`).

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
    /// Pipelines one process invocation runs at once: the pipelines a batch of commit events
    /// wakes run side by side (a pipeline reading another's sink after it), so a round takes
    /// as long as its slowest pipeline rather than their sum. Each run holds its own bounded
    /// buffers, so the default follows the function's memory: one per 512 MB on Lambda, at
    /// most 4 (4 elsewhere).
    pub concurrent_pipelines: usize,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        Self {
            refresh_chunk_rows: 1_000_000,
            concurrent_pipelines: pipelines_for_memory(super::lambda_memory_mb()),
        }
    }
}

/// One pipeline at once per 512 MB of function memory, at most 4 (4 off Lambda).
fn pipelines_for_memory(memory_mb: Option<u64>) -> usize {
    memory_mb.map_or(4, |mb| (mb / 512).clamp(1, 4) as usize)
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
        if self.concurrent_pipelines == 0 {
            return Err(Error::config(
                origin,
                "process.concurrent_pipelines",
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
            ..Default::default()
        }
        .validate("f.toml")
        .unwrap_err()
        .to_string();
        assert!(e.contains("process.refresh_chunk_rows"), "{e}");
    }

    #[test]
    fn pipelines_run_by_memory_unless_told_and_at_least_one() {
        assert_eq!(pipelines_for_memory(None), 4);
        assert_eq!(pipelines_for_memory(Some(128)), 1);
        assert_eq!(pipelines_for_memory(Some(1024)), 2);
        assert_eq!(pipelines_for_memory(Some(10240)), 4);
        let c: ProcessConfig = toml::from_str("concurrent_pipelines = 1").unwrap();
        assert_eq!(c.concurrent_pipelines, 1);
        let e = ProcessConfig {
            concurrent_pipelines: 0,
            ..Default::default()
        }
        .validate("f.toml")
        .unwrap_err()
        .to_string();
        assert!(e.contains("process.concurrent_pipelines"), "{e}");
    }
}
