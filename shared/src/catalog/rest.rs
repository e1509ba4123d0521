//! Any Iceberg REST catalog (iceberg-catalog-rest), and its pointer swap: the commit endpoint with
//! the staged change as `updates` and the base as `requirements`; the server writes the metadata.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use iceberg::{Catalog, CatalogBuilder, TableIdent};
use iceberg_catalog_rest::RestCatalogBuilder;

use super::{connect_error, PointerSwap, Swapped};
use crate::config::{CatalogKind, Config};
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::{conflict, Staged};

/// Connects iceberg's REST catalog to the configured URI.
pub(crate) async fn connect(
    cfg: &Config,
    mut props: HashMap<String, String>,
    factory: Arc<dyn iceberg::io::StorageFactory>,
) -> Result<Arc<dyn Catalog>> {
    let c = &cfg.catalog;
    let err = connect_error(CatalogKind::Rest);
    props.insert("uri".into(), c.uri.clone().unwrap_or_default());
    let rest: Arc<dyn Catalog> = Arc::new(
        RestCatalogBuilder::default()
            .with_storage_factory(factory)
            .load(&c.name, props)
            .await
            .map_err(err)?,
    );
    // iceberg's REST client sets no timeout: a silent server would hold a load forever.
    Ok(Arc::new(
        super::Hooked::new(rest, super::NoHook).with_timeout(super::call_timeout(cfg)),
    ))
}

/// Commits through an Iceberg REST catalog's commit endpoint: the staged change as `updates`,
/// with `assert-table-uuid` and `assert-ref-snapshot-id` requirements (the server's CAS).
#[derive(Debug)]
pub(crate) struct RestSwap {
    http: reqwest::Client,
    base: String,
}

impl RestSwap {
    /// A client for the configured REST URI (`prefix` catalog property honoured).
    pub(super) fn new(cfg: &Config) -> Result<Self> {
        let uri = cfg.catalog.uri.clone().ok_or_else(|| {
            Error::config("floe.toml", "catalog.uri", "a REST catalog needs its URI")
        })?;
        let mut base = format!("{}/v1", uri.trim_end_matches('/'));
        if let Some(prefix) = cfg.catalog.properties.get("prefix") {
            base = format!("{base}/{prefix}");
        }
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| Error::new(ErrorKind::Config, "HTTP client").with_source(e))?;
        Ok(Self { http, base })
    }

    fn table_url(&self, ident: &TableIdent) -> String {
        let ns: Vec<String> = ident
            .namespace()
            .iter()
            .map(|p| {
                percent_encoding::utf8_percent_encode(p, percent_encoding::NON_ALPHANUMERIC)
                    .to_string()
            })
            .collect();
        let name =
            percent_encoding::utf8_percent_encode(ident.name(), percent_encoding::NON_ALPHANUMERIC);
        format!("{}/namespaces/{}/tables/{name}", self.base, ns.join("%1F"))
    }
}

/// The parts of a commit's answer (`CommitTableResponse`) floe reads: the rest of the metadata
/// is skipped, not built.
#[derive(Debug, serde::Deserialize)]
struct CommitAnswer {
    #[serde(rename = "metadata-location")]
    location: Option<String>,
    metadata: Option<AnswerMetadata>,
}

#[derive(Debug, serde::Deserialize)]
struct AnswerMetadata {
    #[serde(rename = "metadata-log", default)]
    log: Vec<AnswerLogEntry>,
}

#[derive(Debug, serde::Deserialize)]
struct AnswerLogEntry {
    #[serde(rename = "metadata-file")]
    file: String,
}

/// What a commit the server accepted installed, from its answer: the new metadata location, and
/// the version it was applied on (the last metadata-log entry).
fn landed(staged: &Staged, answer: Option<CommitAnswer>) -> Swapped {
    let Some(CommitAnswer {
        location: Some(location),
        metadata,
    }) = answer
    else {
        return Swapped {
            location: staged.location.clone(),
            applied_on: None,
        };
    };
    Swapped {
        location,
        applied_on: metadata.and_then(|m| m.log.into_iter().next_back().map(|e| e.file)),
    }
}

fn rest_error(what: String, e: reqwest::Error) -> Error {
    // A transport failure leaves the outcome unknown: retry, re-validating what landed.
    Error::new(ErrorKind::Catalog, what)
        .with_retryable(true)
        .with_source(e)
}

#[async_trait]
impl PointerSwap for RestSwap {
    fn writes_metadata(&self) -> bool {
        false
    }

    async fn current(&self, ident: &TableIdent) -> Result<Option<String>> {
        let resp = self
            .http
            .get(self.table_url(ident))
            .send()
            .await
            .map_err(|e| rest_error(format!("REST load {ident}"), e))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let body: serde_json::Value = resp
            .json()
            .await
            .map_err(|e| rest_error(format!("REST load {ident}"), e))?;
        Ok(body
            .get("metadata-location")
            .and_then(|v| v.as_str())
            .map(str::to_string))
    }

    async fn swap(&self, ident: &TableIdent, staged: &Staged) -> Result<Swapped> {
        let body = serde_json::json!({
            "identifier": { "namespace": ident.namespace().iter().collect::<Vec<_>>(), "name": ident.name() },
            "requirements": staged.requirements,
            "updates": staged.changes,
        });
        let resp = self
            .http
            .post(self.table_url(ident))
            .json(&body)
            .send()
            .await
            .map_err(|e| rest_error(format!("REST commit {ident}"), e))?;
        let status = resp.status();
        if status.is_success() {
            // Landed. What on, the server's answer says (its metadata log's last entry); an
            // answer that cannot be read leaves that unknown, not the commit.
            let answer: Option<CommitAnswer> = resp.json().await.ok();
            return Ok(landed(staged, answer));
        }
        let text = resp.text().await.unwrap_or_default();
        if status == reqwest::StatusCode::CONFLICT {
            return Err(conflict(format!(
                "REST commit of {ident} conflicted: {text}"
            )));
        }
        let retryable =
            status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
        Err(Error::new(
            ErrorKind::Catalog,
            format!("REST commit of {ident} failed with {status}: {text}"),
        )
        .with_retryable(retryable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_answer_names_the_version_it_was_applied_on_by_its_last_log_entry() {
        let answer: CommitAnswer = serde_json::from_str(
            r#"{"metadata-location": "s3://b/t/3.json", "metadata": {"format-version": 2,
                "metadata-log": [{"metadata-file": "s3://b/t/1.json", "timestamp-ms": 1},
                                 {"metadata-file": "s3://b/t/2.json", "timestamp-ms": 2}],
                "snapshots": [{"snapshot-id": 1}]}}"#,
        )
        .unwrap();
        let log = answer.metadata.unwrap().log;
        assert_eq!(log.last().unwrap().file, "s3://b/t/2.json");
        assert_eq!(answer.location.as_deref(), Some("s3://b/t/3.json"));
        // No log (`write.metadata.previous-versions-max` = 0): what it was applied on is unknown.
        let answer: CommitAnswer =
            serde_json::from_str(r#"{"metadata-location": "x", "metadata": {}}"#).unwrap();
        assert!(answer.metadata.unwrap().log.is_empty());
    }
}
