//! `[cost]`: the prices the cost baseline multiplies usage by, and the memory size a function is
//! metered with where it does not run in Lambda.
//!
//! Every default is a us-east-1 list price (checked against the AWS price pages, Nov 2026), for
//! arm64 Lambda as template.yaml deploys it; a deployment elsewhere, on x86_64 (set
//! `lambda_gb_second = 0.0000166667`) or with a discount sets its own.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Prices (USD) and local memory sizes.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostConfig {
    /// Lambda compute per GB-second (default 0.0000133334, arm64 as the template deploys;
    /// x86_64 is 0.0000166667).
    pub lambda_gb_second: f64,
    /// Lambda requests per million invocations (default 0.20).
    pub lambda_per_million_requests: f64,
    /// S3 PUT, COPY, POST and LIST requests per 1,000 (default 0.005).
    pub s3_put_per_1000: f64,
    /// S3 GET, SELECT and all other requests (HEAD) per 1,000 (default 0.0004). DELETE is free.
    pub s3_get_per_1000: f64,
    /// S3 Standard storage per GB-month (default 0.023; 1 GB = 2^30 bytes, 730 hours a month).
    pub s3_storage_gb_month: f64,
    /// The ingest function's memory (MB) where `AWS_LAMBDA_FUNCTION_MEMORY_SIZE` is not set
    /// (default 1024, as template.yaml).
    pub ingest_memory_mb: u64,
    /// The process function's memory (MB) outside Lambda (default 2048, as template.yaml).
    pub process_memory_mb: u64,
    /// The maintain function's memory (MB) outside Lambda (default 2048, as template.yaml).
    pub maintain_memory_mb: u64,
}

impl Default for CostConfig {
    fn default() -> Self {
        Self {
            lambda_gb_second: 0.000_013_333_4,
            lambda_per_million_requests: 0.20,
            s3_put_per_1000: 0.005,
            s3_get_per_1000: 0.0004,
            s3_storage_gb_month: 0.023,
            ingest_memory_mb: 1024,
            process_memory_mb: 2048,
            maintain_memory_mb: 2048,
        }
    }
}

impl CostConfig {
    /// The memory (MB) `function` runs with: Lambda's `AWS_LAMBDA_FUNCTION_MEMORY_SIZE` when
    /// set, else the configured size of that function.
    pub fn memory_mb(&self, function: &str) -> u64 {
        let env = std::env::var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE").ok();
        memory_from(env.as_deref(), self.configured_memory_mb(function))
    }

    /// The configured memory of `function` (ingest, process, maintain).
    pub fn configured_memory_mb(&self, function: &str) -> u64 {
        match function {
            "process" => self.process_memory_mb,
            "maintain" => self.maintain_memory_mb,
            _ => self.ingest_memory_mb,
        }
    }

    /// Prices are finite and not negative; memory sizes within Lambda's 128–10240 MB.
    pub(super) fn validate(&self, origin: &str) -> Result<()> {
        for (key, v) in [
            ("lambda_gb_second", self.lambda_gb_second),
            (
                "lambda_per_million_requests",
                self.lambda_per_million_requests,
            ),
            ("s3_put_per_1000", self.s3_put_per_1000),
            ("s3_get_per_1000", self.s3_get_per_1000),
            ("s3_storage_gb_month", self.s3_storage_gb_month),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(Error::config(
                    origin,
                    &format!("cost.{key}"),
                    format!("must be a price of at least 0, not {v}"),
                ));
            }
        }
        for (key, v) in [
            ("ingest_memory_mb", self.ingest_memory_mb),
            ("process_memory_mb", self.process_memory_mb),
            ("maintain_memory_mb", self.maintain_memory_mb),
        ] {
            if !(128..=10_240).contains(&v) {
                return Err(Error::config(
                    origin,
                    &format!("cost.{key}"),
                    format!("must be a Lambda memory size between 128 and 10240 MB, not {v}"),
                ));
            }
        }
        Ok(())
    }
}

/// Lambda's memory variable when it parses, else `configured`.
fn memory_from(env: Option<&str>, configured: u64) -> u64 {
    env.and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|v| *v > 0)
        .unwrap_or(configured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lambda_memory_wins_over_the_configured_size() {
        assert_eq!(memory_from(Some("3008"), 1024), 3008);
        assert_eq!(memory_from(Some("junk"), 1024), 1024);
        assert_eq!(memory_from(None, 2048), 2048);
        let c = CostConfig::default();
        assert_eq!(c.configured_memory_mb("ingest"), 1024);
        assert_eq!(c.configured_memory_mb("maintain"), 2048);
        // The template deploys arm64: its price is the default.
        assert_eq!(c.lambda_gb_second, 0.0000133334);
    }

    #[test]
    fn negative_prices_and_odd_memory_are_refused() {
        let c = CostConfig {
            s3_get_per_1000: -1.0,
            ..Default::default()
        };
        let e = c.validate("f.toml").unwrap_err().to_string();
        assert!(e.contains("cost.s3_get_per_1000"), "{e}");
        let c = CostConfig {
            process_memory_mb: 64,
            ..Default::default()
        };
        let e = c.validate("f.toml").unwrap_err().to_string();
        assert!(e.contains("cost.process_memory_mb"), "{e}");
        assert!(CostConfig::default().validate("f.toml").is_ok());
    }
}
