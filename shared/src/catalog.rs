//! Catalog and FileIO from the config: SQLite (laptop default), Glue (AWS), REST.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_glue::GlueCatalogBuilder;
use iceberg_catalog_rest::RestCatalogBuilder;
use iceberg_catalog_sql::SqlCatalogBuilder;
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;

use crate::commit::Hooked;
use crate::config::{CatalogKind, Config, TableConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::glue::GlueHook;
use crate::schema;

/// Turns a relative or absolute local path into a `file://` URL; URLs pass through.
pub fn location_url(loc: &str) -> Result<String> {
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
pub fn storage_props(cfg: &Config) -> HashMap<String, String> {
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

/// The sqlx URI of the configured SQLite catalog (its directory is created if needed).
pub fn sqlite_uri(cfg: &Config) -> Result<String> {
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

/// Connects to the configured catalog.
pub async fn connect(cfg: &Config) -> Result<Arc<dyn Catalog>> {
    let c = &cfg.catalog;
    let warehouse = location_url(&c.warehouse)?;
    let mut props = storage_props(cfg);
    props.insert("warehouse".into(), warehouse.clone());
    props.extend(c.properties.clone());
    let factory = Arc::new(OpenDalResolvingStorageFactory::new());
    let err =
        |e: iceberg::Error| Error::iceberg(format!("connecting to the {:?} catalog", c.kind), e);
    Ok(match c.kind {
        CatalogKind::Sqlite => {
            let uri = sqlite_uri(cfg)?;
            if uri.contains(":memory:") {
                props
                    .entry("pool.max-connections".into())
                    .or_insert_with(|| "1".into());
            }
            props.insert("uri".into(), uri);
            props.insert("sql_bind_style".into(), "QMark".into());
            Arc::new(
                SqlCatalogBuilder::default()
                    .with_storage_factory(factory)
                    .load(&c.name, props)
                    .await
                    .map_err(err)?,
            )
        }
        CatalogKind::Glue => {
            if let Some(uri) = &c.uri {
                props.insert("uri".into(), uri.clone());
            }
            if let Some(r) = cfg
                .storage
                .region
                .clone()
                .or_else(|| std::env::var("AWS_REGION").ok())
            {
                props.insert("region_name".into(), r);
            }
            if let Some(k) = &cfg.storage.access_key_id {
                props.insert("aws_access_key_id".into(), k.clone());
            }
            if let Some(k) = &cfg.storage.secret_access_key {
                props.insert("aws_secret_access_key".into(), k.clone());
            }
            let glue: Arc<dyn Catalog> = Arc::new(
                GlueCatalogBuilder::default()
                    .with_storage_factory(factory)
                    .load(&c.name, props)
                    .await
                    .map_err(err)?,
            );
            Arc::new(Hooked::new(glue, GlueHook::new(cfg, warehouse).await))
        }
        CatalogKind::Rest => {
            props.insert("uri".into(), c.uri.clone().unwrap_or_default());
            Arc::new(
                RestCatalogBuilder::default()
                    .with_storage_factory(factory)
                    .load(&c.name, props)
                    .await
                    .map_err(err)?,
            )
        }
    })
}

/// The identifier of a configured table.
pub fn table_ident(cfg: &Config, table: &str) -> Result<TableIdent> {
    TableIdent::from_strs([cfg.catalog.namespace.as_str(), table])
        .map_err(|e| Error::iceberg(format!("table name `{table}`"), e))
}

/// Creates the namespace and every configured table that does not exist yet (safe to race).
pub async fn ensure_tables(catalog: &dyn Catalog, cfg: &Config) -> Result<()> {
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
    for t in &cfg.tables {
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
        ("floe.event-time-column".to_string(), t.event_time.clone()),
    ]);
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
pub async fn create_if_missing(
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
