//! The SQLite catalog (iceberg-catalog-sql): the laptop default, one file, and its pointer swap,
//! `UPDATE iceberg_tables SET metadata_location = new WHERE … AND metadata_location = base`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use iceberg::{Catalog, CatalogBuilder, TableIdent};
use iceberg_catalog_sql::SqlCatalogBuilder;
use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;

use super::{connect_error, PointerSwap, Swapped};
use crate::config::{CatalogKind, Config};
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::{conflict, Staged};

/// The sqlx URI of the configured SQLite catalog (its directory is created if needed).
pub(crate) fn sqlite_uri(cfg: &Config) -> Result<String> {
    let uri = cfg
        .catalog
        .uri
        .clone()
        .unwrap_or_else(|| "floe-catalog.db".into());
    if uri.starts_with("sqlite:") {
        return Ok(uri);
    }
    if let Some(dir) = Path::new(&uri).parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::new(
                    ErrorKind::Config,
                    format!("cannot create {}", dir.display()),
                )
                .with_source(e)
            })?;
        }
    }
    Ok(format!("sqlite://{uri}?mode=rwc"))
}

/// Connects iceberg's SQL catalog to the configured SQLite file.
pub(crate) async fn connect(
    cfg: &Config,
    mut props: HashMap<String, String>,
    factory: Arc<dyn iceberg::io::StorageFactory>,
) -> Result<Arc<dyn Catalog>> {
    let c = &cfg.catalog;
    let err = connect_error(CatalogKind::Sqlite);
    let uri = sqlite_uri(cfg)?;
    if uri.contains(":memory:") {
        props
            .entry("pool.max-connections".into())
            .or_insert_with(|| "1".into());
    }
    if !uri.contains(":memory:") {
        write_ahead_log(&uri).await;
    }
    props.insert("uri".into(), uri);
    props.insert("sql_bind_style".into(), "QMark".into());
    Ok(Arc::new(
        SqlCatalogBuilder::default()
            .with_storage_factory(factory)
            .load(&c.name, props)
            .await
            .map_err(err)?,
    ))
}

/// `PRAGMA synchronous = FULL`, set on every connection that commits a pointer swap. In WAL
/// mode `NORMAL` syncs the log only at checkpoints: a commit acknowledged just before a power
/// loss could vanish, and with it a snapshot that readers (and the checkpoints of pipelines)
/// already saw. `FULL` syncs the log on every commit. It is SQLite's compiled default, but a
/// per-connection setting any build or a `-DSQLITE_DEFAULT_WAL_SYNCHRONOUS` could change, so it
/// is stated rather than assumed.
const SYNCHRONOUS_FULL: &str = "PRAGMA synchronous = FULL";

/// Puts the database in write-ahead-log mode (a property of the file, kept by every later
/// connection). A commit then appends to the log and syncs it once, where the rollback journal
/// syncs the journal twice, the database and its directory (and creates and deletes the journal
/// file) on every pointer swap; with `synchronous = FULL` ([`SYNCHRONOUS_FULL`]) a commit is as
/// durable as before, and the swap stays one atomic `UPDATE … WHERE`. The log (`-wal`) and its
/// index (`-shm`) beside the file are part of the catalog: copy all three, on a local disk (WAL
/// needs shared memory, so not over NFS). Best effort: a database busy in another process's
/// transaction keeps its mode until a later start.
async fn write_ahead_log(uri: &str) {
    use sqlx::Connection;
    sqlx::any::install_default_drivers();
    let set = async {
        let mut c = sqlx::AnyConnection::connect(uri).await?;
        sqlx::query(SYNCHRONOUS_FULL).execute(&mut c).await?;
        sqlx::query("PRAGMA journal_mode = WAL")
            .fetch_optional(&mut c)
            .await?;
        c.close().await
    };
    if let Err(e) = set.await {
        tracing::debug!(uri, error = %e, "could not switch the SQLite catalog to WAL mode");
    }
}

/// Compare-and-swap on the SQL catalog's `iceberg_tables` row.
#[derive(Debug)]
pub(crate) struct SqliteSwap {
    pool: AnyPool,
    catalog_name: String,
}

impl SqliteSwap {
    /// Connects to the same database as the SQLite catalog.
    pub(super) async fn connect(cfg: &Config) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let uri = sqlite_uri(cfg)?;
        let pool = AnyPoolOptions::new()
            .max_connections(2)
            .after_connect(|c, _| {
                Box::pin(async move {
                    sqlx::query(SYNCHRONOUS_FULL).execute(c).await?;
                    Ok(())
                })
            })
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
    async fn swap(&self, ident: &TableIdent, staged: &Staged) -> Result<Swapped> {
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
        Ok(Swapped::as_staged(staged))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection the pointer swap commits through syncs the log on each commit
    /// (`synchronous` 2 = FULL), in WAL mode.
    #[tokio::test]
    async fn pointer_swaps_commit_with_synchronous_full_in_wal_mode() {
        use sqlx::Row;
        let dir = std::env::temp_dir().join(format!("floe-sync-{}", uuid::Uuid::now_v7()));
        let text = format!(
            "[catalog]\nkind = \"sqlite\"\nuri = \"{}\"\nwarehouse = \"file://{}\"\n",
            dir.join("catalog.db").display(),
            dir.join("wh").display()
        );
        let cfg = crate::config::Config::parse(&text, "f.toml").unwrap();
        let uri = sqlite_uri(&cfg).unwrap();
        write_ahead_log(&uri).await;
        let swap = SqliteSwap::connect(&cfg).await.unwrap();
        // Both pooled connections, held at once so the pool opens two.
        let mut a = swap.pool.acquire().await.unwrap();
        let mut b = swap.pool.acquire().await.unwrap();
        for c in [&mut a, &mut b] {
            let sync: i64 = sqlx::query("PRAGMA synchronous")
                .fetch_one(&mut **c)
                .await
                .unwrap()
                .try_get(0)
                .unwrap();
            assert_eq!(sync, 2, "synchronous = FULL");
            let mode: String = sqlx::query("PRAGMA journal_mode")
                .fetch_one(&mut **c)
                .await
                .unwrap()
                .try_get(0)
                .unwrap();
            assert_eq!(mode.to_lowercase(), "wal");
        }
        drop((a, b));
        swap.pool.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
