//! Installing a staged table version: a compare-and-swap of the catalog's metadata pointer.
//!
//! SQLite: `UPDATE iceberg_tables SET metadata_location = new WHERE … AND metadata_location = base`.
//! Glue: `UpdateTable` with the `VersionId` read together with the base pointer.
//! Either way the swap succeeds only if nobody committed since the base was read.

use async_trait::async_trait;
use aws_sdk_glue::error::DisplayErrorContext;
use iceberg::TableIdent;
use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;

use crate::config::{CatalogKind, Config};
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::{conflict, Staged};

/// Installs staged versions atomically.
#[async_trait]
pub trait PointerSwap: std::fmt::Debug + Send + Sync {
    /// Moves the pointer of `ident` from `staged.previous` to `staged.location`; a
    /// `CommitConflict` error if the pointer is no longer `staged.previous`.
    async fn swap(&self, ident: &TableIdent, staged: &Staged) -> Result<()>;

    /// The current metadata location of `ident` (a cheap read: no metadata is parsed).
    async fn current(&self, ident: &TableIdent) -> Result<Option<String>>;

    /// Whether floe writes the new metadata.json itself (false for REST: the server does).
    fn writes_metadata(&self) -> bool {
        true
    }
}

/// Builds the swap for the configured catalog.
pub async fn from_config(cfg: &Config) -> Result<std::sync::Arc<dyn PointerSwap>> {
    Ok(match cfg.catalog.kind {
        CatalogKind::Sqlite => std::sync::Arc::new(SqliteSwap::connect(cfg).await?),
        CatalogKind::Glue => std::sync::Arc::new(GlueSwap::new(cfg).await),
        CatalogKind::Rest => std::sync::Arc::new(RestSwap::new(cfg)?),
    })
}

/// Compare-and-swap on the SQL catalog's `iceberg_tables` row.
#[derive(Debug)]
pub struct SqliteSwap {
    pool: AnyPool,
    catalog_name: String,
}

impl SqliteSwap {
    /// Connects to the same database as the SQLite catalog.
    pub async fn connect(cfg: &Config) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let uri = crate::catalog::sqlite_uri(cfg)?;
        let pool = AnyPoolOptions::new()
            .max_connections(2)
            .connect(&uri)
            .await
            .map_err(|e| Error::new(ErrorKind::Catalog, format!("opening {uri}")).with_source(e))?;
        Ok(Self {
            pool,
            catalog_name: cfg.catalog.name.clone(),
        })
    }
}

#[async_trait]
impl PointerSwap for SqliteSwap {
    async fn swap(&self, ident: &TableIdent, staged: &Staged) -> Result<()> {
        let ns = ident.namespace().join(".");
        let result = sqlx::query(
            "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? AND metadata_location = ?",
        )
        .bind(&staged.location)
        .bind(&staged.previous)
        .bind(&self.catalog_name)
        .bind(&ns)
        .bind(ident.name())
        .bind(&staged.previous)
        .execute(&self.pool)
        .await
        .map_err(|e| {
            // "database is locked" and pool timeouts are transient.
            Error::new(ErrorKind::Catalog, format!("swapping the pointer of {ident}")).with_retryable(true).with_source(e)
        })?;
        if result.rows_affected() == 0 {
            return Err(conflict(format!(
                "{ident} moved on since {}",
                staged.previous
            )));
        }
        Ok(())
    }

    async fn current(&self, ident: &TableIdent) -> Result<Option<String>> {
        use sqlx::Row;
        let row = sqlx::query(
            "SELECT metadata_location FROM iceberg_tables \
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?",
        )
        .bind(&self.catalog_name)
        .bind(ident.namespace().join("."))
        .bind(ident.name())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| {
            Error::new(
                ErrorKind::Catalog,
                format!("reading the pointer of {ident}"),
            )
            .with_retryable(true)
            .with_source(e)
        })?;
        Ok(row.and_then(|r| r.try_get::<String, _>(0).ok()))
    }
}

/// Compare-and-swap with Glue's `VersionId`.
#[derive(Debug)]
pub struct GlueSwap {
    client: aws_sdk_glue::Client,
}

impl GlueSwap {
    /// A Glue client from the config.
    pub async fn new(cfg: &Config) -> Self {
        Self {
            client: crate::glue::client(cfg).await,
        }
    }
}

impl GlueSwap {
    async fn get(
        &self,
        ident: &TableIdent,
    ) -> Result<aws_sdk_glue::operation::get_table::GetTableOutput> {
        self.client
            .get_table()
            .database_name(ident.namespace().join("."))
            .name(ident.name())
            .send()
            .await
            .map_err(|e| {
                Error::new(
                    ErrorKind::Catalog,
                    format!("Glue GetTable {ident}: {}", DisplayErrorContext(&e)),
                )
                .with_retryable(true)
            })
    }
}

#[async_trait]
impl PointerSwap for GlueSwap {
    async fn current(&self, ident: &TableIdent) -> Result<Option<String>> {
        let out = self.get(ident).await?;
        Ok(out
            .table()
            .and_then(|t| t.parameters())
            .and_then(|p| p.get("metadata_location"))
            .cloned())
    }

    async fn swap(&self, ident: &TableIdent, staged: &Staged) -> Result<()> {
        let db = ident.namespace().join(".");
        let out = self.get(ident).await?;
        let table = out.table();
        let current = table
            .and_then(|t| t.parameters())
            .and_then(|p| p.get("metadata_location"));
        if current.map(String::as_str) != Some(staged.previous.as_str()) {
            return Err(conflict(format!(
                "{ident} moved on since {}",
                staged.previous
            )));
        }
        let input = crate::glue::table_input(
            ident.name(),
            &staged.metadata,
            &staged.location,
            Some(staged.previous.clone()),
        )
        .map_err(|e| Error::iceberg("Glue table input", e))?;
        let mut req = self
            .client
            .update_table()
            .database_name(&db)
            .skip_archive(true)
            .table_input(input);
        if let Some(v) = table.and_then(|t| t.version_id()) {
            req = req.version_id(v);
        }
        // No SDK-level retries here: a retried UpdateTable whose first try took effect comes
        // back as ConcurrentModificationException, a "conflict" that is really our own success.
        // floe's commit loop retries instead, after looking at what landed.
        let no_retries = aws_sdk_glue::config::Builder::default()
            .retry_config(aws_smithy_types::retry::RetryConfig::disabled());
        match req.customize().config_override(no_retries).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let svc = e.as_service_error();
                if svc
                    .map(|s| s.is_concurrent_modification_exception())
                    .unwrap_or(false)
                {
                    Err(conflict(format!(
                        "Glue rejected a stale VersionId for {ident}"
                    )))
                } else {
                    // Throttling, 5xx and transport errors leave the outcome unknown: retry
                    // (the commit loop first looks at what actually landed). Only answers that
                    // say the request itself is wrong are permanent.
                    use aws_sdk_glue::error::ProvideErrorMetadata;
                    let retryable = !matches!(
                        svc.and_then(|s| s.code()),
                        Some(
                            "EntityNotFoundException"
                                | "InvalidInputException"
                                | "AccessDeniedException"
                                | "ValidationException"
                        )
                    );
                    Err(Error::new(
                        ErrorKind::Catalog,
                        format!("Glue UpdateTable {ident}: {}", DisplayErrorContext(&e)),
                    )
                    .with_retryable(retryable))
                }
            }
        }
    }
}

/// Commits through an Iceberg REST catalog's commit endpoint: the staged change as `updates`,
/// with `assert-table-uuid` and `assert-ref-snapshot-id` requirements (the server's CAS).
#[derive(Debug)]
pub struct RestSwap {
    http: reqwest::Client,
    base: String,
}

impl RestSwap {
    /// A client for the configured REST URI (`prefix` catalog property honoured).
    pub fn new(cfg: &Config) -> Result<Self> {
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

    async fn swap(&self, ident: &TableIdent, staged: &Staged) -> Result<()> {
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
            return Ok(());
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
