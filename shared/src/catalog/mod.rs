//! The catalog layer: connecting to the configured catalog (SQLite on a laptop, Glue on AWS, or
//! any Iceberg REST catalog), creating the configured tables, and the compare-and-swap of a table's
//! metadata pointer that every floe commit ends with ([`PointerSwap`]).
//!
//! One file per backend, each with its connect and its swap: `sqlite`, `glue`, `rest`.
//! Reads go through iceberg-rust's catalogs; commits go through floe's swap, because
//! iceberg-rust cannot stage the changes floe makes (see [`crate::snapshot`]).

mod glue;
mod rest;
mod sqlite;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use iceberg::io::StorageFactory;
use iceberg::table::Table;
use iceberg::{Catalog, Namespace, NamespaceIdent, TableCommit, TableCreation, TableIdent};
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;

use crate::config::{CatalogKind, Config, TableConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::file_cache::CachingStorageFactory;
use crate::requests::{CountingStorageFactory, Requests};
use crate::schema;
use crate::snapshot::Staged;
use crate::summary;

/// Turns a relative or absolute local path into a `file://` URL; URLs pass through.
pub(crate) fn location_url(loc: &str) -> Result<String> {
    if loc.contains("://") {
        return Ok(loc.trim_end_matches('/').to_string());
    }
    let p = Path::new(loc);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| Error::new(ErrorKind::Config, "current directory").with_source(e))?
            .join(p)
    };
    std::fs::create_dir_all(&abs).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            format!("cannot create warehouse {}", abs.display()),
        )
        .with_source(e)
    })?;
    Ok(format!("file://{}", abs.display())
        .trim_end_matches('/')
        .to_string())
}

/// FileIO properties (`s3.*`) from the storage config.
pub(crate) fn storage_props(cfg: &Config) -> HashMap<String, String> {
    let s = &cfg.storage;
    let mut p = HashMap::new();
    if let Some(e) = &s.endpoint {
        p.insert("s3.endpoint".into(), e.clone());
    }
    if let Some(r) = s
        .region
        .clone()
        .or_else(|| std::env::var("AWS_REGION").ok())
    {
        p.insert("s3.region".into(), r);
    }
    if let Some(k) = &s.access_key_id {
        p.insert("s3.access-key-id".into(), k.clone());
    }
    if let Some(k) = &s.secret_access_key {
        p.insert("s3.secret-access-key".into(), k.clone());
    }
    if s.path_style {
        p.insert("s3.path-style-access".into(), "true".into());
    }
    p
}

/// Connects to the configured catalog.
pub async fn connect(cfg: &Config) -> Result<Arc<dyn Catalog>> {
    connect_counted(cfg, None).await
}

/// Like [`connect`]; with `requests`, every table file read or written through the tables it
/// loads is counted there ([`crate::requests`]).
pub async fn connect_counted(
    cfg: &Config,
    requests: Option<&Requests>,
) -> Result<Arc<dyn Catalog>> {
    let c = &cfg.catalog;
    let warehouse = location_url(&c.warehouse)?;
    let mut props = storage_props(cfg);
    props.insert("warehouse".into(), warehouse.clone());
    props.extend(c.properties.clone());
    let factory: Box<dyn StorageFactory> = match requests {
        Some(r) => Box::new(CountingStorageFactory::new(
            Box::new(OpenDalResolvingStorageFactory::new()),
            r.clone(),
        )),
        None => Box::new(OpenDalResolvingStorageFactory::new()),
    };
    // Small table files served from memory once read or written (they never change).
    let budget = cfg.storage.cache_bytes();
    let factory: Arc<dyn StorageFactory> = if budget > 0 {
        Arc::new(CachingStorageFactory::new(factory, budget))
    } else {
        Arc::from(factory)
    };
    match c.kind {
        CatalogKind::Sqlite => sqlite::connect(cfg, props, factory).await,
        CatalogKind::Glue => glue::connect(cfg, props, factory, warehouse).await,
        CatalogKind::Rest => rest::connect(cfg, props, factory).await,
    }
}

/// The longest a catalog call may take (a load makes several requests: the catalog's, then the
/// metadata.json's through FileIO): four times `[storage] request_timeout_seconds`.
fn call_timeout(cfg: &Config) -> Duration {
    cfg.storage.request_timeout().saturating_mul(4)
}

/// The error for a failed catalog connection.
fn connect_error(kind: CatalogKind) -> impl Fn(iceberg::Error) -> Error {
    move |e| Error::iceberg(format!("connecting to the {kind:?} catalog"), e)
}

/// What a swap installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swapped {
    /// The new version's metadata location.
    pub location: String,
    /// The version the change was applied on, when known. A compare-and-swap applies it on
    /// exactly `staged.previous`; a REST server applies the updates on whatever version is
    /// current when the requirements hold (another writer's commit may have come between the
    /// base and this one), and its metadata log names that version.
    pub applied_on: Option<String>,
}

impl Swapped {
    /// `staged` installed by a compare-and-swap on its base.
    pub fn as_staged(staged: &Staged) -> Self {
        Self {
            location: staged.location.clone(),
            applied_on: Some(staged.previous.clone()),
        }
    }
}

/// Installs staged versions atomically.
#[async_trait]
pub trait PointerSwap: std::fmt::Debug + Send + Sync {
    /// Moves the pointer of `ident` from `staged.previous` to `staged.location`; a
    /// `CommitConflict` error if the pointer is no longer `staged.previous`.
    async fn swap(&self, ident: &TableIdent, staged: &Staged) -> Result<Swapped>;

    /// The current metadata location of `ident` (a cheap read: no metadata is parsed).
    async fn current(&self, ident: &TableIdent) -> Result<Option<String>>;

    /// Whether floe writes the new metadata.json itself (false for REST: the server does).
    fn writes_metadata(&self) -> bool {
        true
    }
}

/// The pointer swap of the configured catalog.
pub async fn pointer_swap(cfg: &Config) -> Result<Arc<dyn PointerSwap>> {
    Ok(match cfg.catalog.kind {
        CatalogKind::Sqlite => Arc::new(sqlite::SqliteSwap::connect(cfg).await?),
        CatalogKind::Glue => Arc::new(glue::GlueSwap::new(cfg).await),
        CatalogKind::Rest => Arc::new(rest::RestSwap::new(cfg)?),
    })
}

/// The identifier of a configured table.
pub fn table_ident(cfg: &Config, table: &str) -> Result<TableIdent> {
    TableIdent::from_strs([cfg.catalog.namespace.as_str(), table])
        .map_err(|e| Error::iceberg(format!("table name `{table}`"), e))
}

/// Creates the namespace and every configured table that does not exist yet and that `owns`
/// (safe to race). Each function creates only the tables its role may write: ingest its routed
/// tables, process its sinks.
pub async fn ensure_tables(
    catalog: &dyn Catalog,
    cfg: &Config,
    owns: impl Fn(&TableConfig) -> bool,
) -> Result<()> {
    let ns = NamespaceIdent::new(cfg.catalog.namespace.clone());
    let exists = catalog
        .namespace_exists(&ns)
        .await
        .map_err(|e| Error::iceberg(format!("checking namespace {}", cfg.catalog.namespace), e))?;
    if !exists {
        if let Err(e) = catalog.create_namespace(&ns, HashMap::new()).await {
            // Another process may have created it meanwhile.
            if !catalog.namespace_exists(&ns).await.unwrap_or(false) {
                return Err(Error::iceberg(
                    format!("creating namespace {}", cfg.catalog.namespace),
                    e,
                ));
            }
        }
    }
    for t in cfg.tables.iter().filter(|t| owns(t)) {
        ensure_table(catalog, cfg, t).await?;
    }
    Ok(())
}

async fn ensure_table(catalog: &dyn Catalog, cfg: &Config, t: &TableConfig) -> Result<()> {
    let ident = table_ident(cfg, &t.name)?;
    if catalog
        .table_exists(&ident)
        .await
        .map_err(|e| Error::iceberg(format!("checking table {ident}"), e))?
    {
        return Ok(());
    }
    let schema = schema::table_schema(t)?;
    let spec = schema::partition_spec(t, &schema)?;
    let sort = schema::sort_order(t, &schema)?;
    let mut props: HashMap<String, String> = HashMap::from([
        (
            "write.parquet.compression-codec".to_string(),
            "zstd".to_string(),
        ),
        (
            "write.target-file-size-bytes".to_string(),
            (t.target_file_size_mb << 20).to_string(),
        ),
        (summary::EVENT_TIME_COLUMN.to_string(), t.event_time.clone()),
    ]);
    props.extend(crate::config::retention_properties(
        t.expire_older_than_hours,
        t.retain_last,
    ));
    props.extend(t.properties.clone());
    let creation = TableCreation::builder()
        .name(t.name.clone())
        .schema(schema)
        .partition_spec(spec)
        .sort_order(sort)
        .properties(props)
        .build();
    create_if_missing(catalog, &ident, creation).await
}

/// Creates a table unless it exists; losing a creation race to another process is fine.
pub(crate) async fn create_if_missing(
    catalog: &dyn Catalog,
    ident: &TableIdent,
    creation: TableCreation,
) -> Result<()> {
    match catalog.create_table(ident.namespace(), creation).await {
        Ok(_) => {
            tracing::info!(table = %ident, "created table");
            Ok(())
        }
        Err(e) => {
            if catalog.table_exists(ident).await.unwrap_or(false) {
                Ok(())
            } else {
                Err(Error::iceberg(format!("creating table {ident}"), e))
            }
        }
    }
}

/// Intercepts table creation, loads and commits of a wrapped catalog; everything else passes
/// through. floe uses it to create Glue tables itself (the Glue backend's hook).
#[async_trait]
pub trait UpdateHook: std::fmt::Debug + Send + Sync {
    /// Called instead of `inner.update_table(commit)`; passes through by default.
    async fn update_table(
        &self,
        inner: &dyn Catalog,
        commit: TableCommit,
    ) -> iceberg::Result<Table> {
        inner.update_table(commit).await
    }

    /// Called instead of `inner.load_table(ident)`; passes through by default.
    async fn load_table(&self, inner: &dyn Catalog, ident: &TableIdent) -> iceberg::Result<Table> {
        inner.load_table(ident).await
    }

    /// Called instead of `inner.create_table(ns, creation)`; passes through by default.
    async fn create_table(
        &self,
        inner: &dyn Catalog,
        ns: &NamespaceIdent,
        creation: TableCreation,
    ) -> iceberg::Result<Table> {
        inner.create_table(ns, creation).await
    }
}

/// A catalog whose `update_table` goes through a hook, each call bounded in time if asked.
#[derive(Debug)]
pub struct Hooked<H> {
    inner: Arc<dyn Catalog>,
    /// The hook.
    pub hook: H,
    timeout: Option<Duration>,
}

/// The hook that changes nothing (a catalog wrapped for [`Hooked::with_timeout`] only).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHook;

impl UpdateHook for NoHook {}

impl<H: UpdateHook> Hooked<H> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Catalog>, hook: H) -> Self {
        Self {
            inner,
            hook,
            timeout: None,
        }
    }

    /// Fails a call that has no answer within `limit` (a catalog server that took a request and
    /// went silent would otherwise hold the function until Lambda's timeout) with a retryable
    /// error: whoever retries a call that may have taken effect reads back what landed first.
    pub fn with_timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    async fn timed<T>(
        &self,
        call: &str,
        fut: impl std::future::Future<Output = iceberg::Result<T>> + Send,
    ) -> iceberg::Result<T> {
        let Some(limit) = self.timeout else {
            return fut.await;
        };
        match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                format!(
                    "catalog {call}: no answer within {} s (its outcome is unknown)",
                    limit.as_secs_f64()
                ),
            )
            .with_retryable(true)),
        }
    }
}

#[async_trait]
impl<H: UpdateHook> Catalog for Hooked<H> {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> iceberg::Result<Vec<NamespaceIdent>> {
        self.timed("list_namespaces", self.inner.list_namespaces(parent))
            .await
    }
    async fn create_namespace(
        &self,
        ns: &NamespaceIdent,
        props: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        self.timed("create_namespace", self.inner.create_namespace(ns, props))
            .await
    }
    async fn get_namespace(&self, ns: &NamespaceIdent) -> iceberg::Result<Namespace> {
        self.timed("get_namespace", self.inner.get_namespace(ns))
            .await
    }
    async fn namespace_exists(&self, ns: &NamespaceIdent) -> iceberg::Result<bool> {
        self.timed("namespace_exists", self.inner.namespace_exists(ns))
            .await
    }
    async fn update_namespace(
        &self,
        ns: &NamespaceIdent,
        props: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        self.timed("update_namespace", self.inner.update_namespace(ns, props))
            .await
    }
    async fn drop_namespace(&self, ns: &NamespaceIdent) -> iceberg::Result<()> {
        self.timed("drop_namespace", self.inner.drop_namespace(ns))
            .await
    }
    async fn list_tables(&self, ns: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        self.timed("list_tables", self.inner.list_tables(ns)).await
    }
    async fn create_table(
        &self,
        ns: &NamespaceIdent,
        creation: TableCreation,
    ) -> iceberg::Result<Table> {
        self.timed(
            "create_table",
            self.hook.create_table(self.inner.as_ref(), ns, creation),
        )
        .await
    }
    async fn load_table(&self, t: &TableIdent) -> iceberg::Result<Table> {
        self.timed("load_table", self.hook.load_table(self.inner.as_ref(), t))
            .await
    }
    async fn drop_table(&self, t: &TableIdent) -> iceberg::Result<()> {
        self.timed("drop_table", self.inner.drop_table(t)).await
    }
    async fn purge_table(&self, t: &TableIdent) -> iceberg::Result<()> {
        self.timed("purge_table", self.inner.purge_table(t)).await
    }
    async fn table_exists(&self, t: &TableIdent) -> iceberg::Result<bool> {
        self.timed("table_exists", self.inner.table_exists(t)).await
    }
    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
        self.timed("rename_table", self.inner.rename_table(src, dest))
            .await
    }
    async fn register_table(&self, t: &TableIdent, loc: String) -> iceberg::Result<Table> {
        self.timed("register_table", self.inner.register_table(t, loc))
            .await
    }
    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        self.timed(
            "update_table",
            self.hook.update_table(self.inner.as_ref(), commit),
        )
        .await
    }
}
