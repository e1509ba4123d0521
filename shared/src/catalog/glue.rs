//! Glue Data Catalog commits that floe controls: create and update with Glue's `VersionId`
//! compare-and-swap, and Glue column types for every Iceberg type floe writes.
//!
//! iceberg-catalog-glue 0.10.1 refuses any schema holding `timestamptz` ("Conversion from
//! Timestamptz is not supported") on both create and commit, and floe's tables always have one
//! (`_ingested_at`). Reads still go through iceberg's Glue catalog; `create_table` goes through
//! this hook and commits through [`GlueSwap`]: `UpdateTable` with the `VersionId` read together with
//! the base pointer.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_glue::error::DisplayErrorContext;
use aws_sdk_glue::types::{Column, StorageDescriptor, TableInput};
use iceberg::spec::{PrimitiveType, TableMetadata, TableMetadataBuilder, Type};
use iceberg::table::Table;
use iceberg::{
    Catalog, CatalogBuilder, MetadataLocation, NamespaceIdent, TableCreation, TableIdent,
};
use iceberg_catalog_glue::GlueCatalogBuilder;

use super::{connect_error, Hooked, PointerSwap, Swapped, UpdateHook};
use crate::config::{CatalogKind, Config};
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::{conflict, Staged};

/// Connects iceberg's Glue catalog (for reads), wrapped so that tables are created by floe.
pub(crate) async fn connect(
    cfg: &Config,
    mut props: HashMap<String, String>,
    factory: Arc<dyn iceberg::io::StorageFactory>,
    warehouse: String,
) -> Result<Arc<dyn Catalog>> {
    let c = &cfg.catalog;
    let err = connect_error(CatalogKind::Glue);
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
    // iceberg's Glue client has no timeout of its own (floe's has: `store::sdk_config`).
    Ok(Arc::new(
        Hooked::new(glue, GlueHook::new(cfg, warehouse).await)
            .with_timeout(super::call_timeout(cfg)),
    ))
}

/// The hook giving a Glue catalog floe's create and commit.
#[derive(Debug, Clone)]
pub(crate) struct GlueHook {
    client: aws_sdk_glue::Client,
    warehouse: String,
    file_io: iceberg::io::FileIO,
}

impl GlueHook {
    /// A Glue client honouring the config's endpoint override, region and static keys.
    pub(super) async fn new(cfg: &Config, warehouse: String) -> Self {
        let file_io = iceberg::io::FileIOBuilder::new(std::sync::Arc::new(
            iceberg_storage_opendal::OpenDalResolvingStorageFactory::new(),
        ))
        .with_props(super::storage_props(cfg))
        .build();
        Self {
            client: client(cfg).await,
            warehouse,
            file_io,
        }
    }
}

/// A Glue client honouring the config's endpoint override, region and static keys.
pub(crate) async fn client(cfg: &Config) -> aws_sdk_glue::Client {
    aws_sdk_glue::Client::new(
        &crate::store::sdk_config(&cfg.storage, cfg.catalog.uri.as_deref()).await,
    )
}

fn db(ns: &NamespaceIdent) -> iceberg::Result<String> {
    match ns.as_ref().as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(iceberg::Error::new(
            iceberg::ErrorKind::DataInvalid,
            format!("Glue needs a one-level namespace, got {ns:?}"),
        )),
    }
}

fn unexpected(what: String, e: impl std::fmt::Display) -> iceberg::Error {
    iceberg::Error::new(iceberg::ErrorKind::Unexpected, format!("{what}: {e}"))
}

/// Glue (Hive) type name of an Iceberg type.
pub(crate) fn glue_type(ty: &Type) -> String {
    match ty {
        Type::Primitive(p) => match p {
            PrimitiveType::Boolean => "boolean".into(),
            PrimitiveType::Int => "int".into(),
            PrimitiveType::Long => "bigint".into(),
            PrimitiveType::Float => "float".into(),
            PrimitiveType::Double => "double".into(),
            PrimitiveType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            PrimitiveType::Date => "date".into(),
            PrimitiveType::Time => "string".into(),
            PrimitiveType::Timestamp
            | PrimitiveType::Timestamptz
            | PrimitiveType::TimestampNs
            | PrimitiveType::TimestamptzNs => "timestamp".into(),
            PrimitiveType::String | PrimitiveType::Uuid => "string".into(),
            PrimitiveType::Fixed(_) | PrimitiveType::Binary => "binary".into(),
        },
        Type::Struct(s) => format!(
            "struct<{}>",
            s.fields()
                .iter()
                .map(|f| format!("{}:{}", f.name, glue_type(&f.field_type)))
                .collect::<Vec<_>>()
                .join(",")
        ),
        Type::List(l) => format!("array<{}>", glue_type(&l.element_field.field_type)),
        Type::Map(m) => format!(
            "map<{},{}>",
            glue_type(&m.key_field.field_type),
            glue_type(&m.value_field.field_type)
        ),
    }
}

/// The Glue `TableInput` pointing at an Iceberg metadata file.
///
/// UpdateTable replaces the whole table definition with its input, so a commit starts from the
/// table as Glue holds it (`existing`): the parameters another engine or an admin set are kept
/// (as Iceberg Java and PyIceberg keep them), and so are the description, owner, a column's
/// comment where the schema has no doc, and the storage descriptor's SerDe, formats and
/// parameters (Java and PyIceberg write a fresh descriptor; dropping what Athena or a Hive-side
/// reader set is not floe's to decide), additional locations included (Java derives them from
/// `write.data.path` and the like; floe never moves them, and a Lake Formation reader of a
/// table whose data lives elsewhere needs them). floe sets what an Iceberg commit owns: the
/// table type, the metadata pointers, the location and the current schema's columns. A
/// schema-registry reference is not carried (Glue refuses one beside explicit columns).
pub(crate) fn table_input(
    name: &str,
    md: &TableMetadata,
    location: &str,
    previous: Option<String>,
    existing: Option<&aws_sdk_glue::types::Table>,
) -> iceberg::Result<TableInput> {
    let sd = existing.and_then(|t| t.storage_descriptor());
    let comment_of = |name: &str| {
        sd.and_then(|d| d.columns().iter().find(|c| c.name() == name))
            .and_then(|c| c.comment().map(String::from))
    };
    let columns = md
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| {
            Column::builder()
                .name(&f.name)
                .r#type(glue_type(&f.field_type))
                .set_comment(f.doc.clone().or_else(|| comment_of(&f.name)))
                .parameters("iceberg.field.id", f.id.to_string())
                .parameters("iceberg.field.optional", (!f.required).to_string())
                .parameters("iceberg.field.current", "true")
                .build()
                .map_err(|e| unexpected("Glue column".into(), e))
        })
        .collect::<iceberg::Result<Vec<_>>>()?;
    let mut params: HashMap<String, String> = existing
        .and_then(|t| t.parameters())
        .cloned()
        .unwrap_or_default();
    params.insert("table_type".into(), "ICEBERG".into());
    params.insert("metadata_location".into(), location.into());
    match previous {
        Some(p) => params.insert("previous_metadata_location".into(), p),
        None => params.remove("previous_metadata_location"),
    };
    let storage = StorageDescriptor::builder()
        .location(md.location())
        .set_columns(Some(columns))
        .set_additional_locations(sd.map(|d| d.additional_locations().to_vec()))
        .set_input_format(sd.and_then(|d| d.input_format().map(String::from)))
        .set_output_format(sd.and_then(|d| d.output_format().map(String::from)))
        .set_compressed(sd.map(|d| d.compressed()))
        .set_number_of_buckets(sd.map(|d| d.number_of_buckets()))
        .set_serde_info(sd.and_then(|d| d.serde_info().cloned()))
        .set_bucket_columns(sd.map(|d| d.bucket_columns().to_vec()))
        .set_sort_columns(sd.map(|d| d.sort_columns().to_vec()))
        .set_parameters(sd.and_then(|d| d.parameters().cloned()))
        .set_skewed_info(sd.and_then(|d| d.skewed_info().cloned()))
        .set_stored_as_sub_directories(sd.map(|d| d.stored_as_sub_directories()))
        .build();
    TableInput::builder()
        .name(name)
        .table_type("EXTERNAL_TABLE")
        .set_description(existing.and_then(|t| t.description().map(String::from)))
        .set_owner(existing.and_then(|t| t.owner().map(String::from)))
        .set_retention(existing.map(|t| t.retention()))
        .set_parameters(Some(params))
        .storage_descriptor(storage)
        .build()
        .map_err(|e| unexpected("Glue table input".into(), e))
}

#[async_trait]
impl UpdateHook for GlueHook {
    async fn create_table(
        &self,
        inner: &dyn Catalog,
        ns: &NamespaceIdent,
        mut creation: TableCreation,
    ) -> iceberg::Result<Table> {
        let database = db(ns)?;
        let location = creation.location.clone().unwrap_or_else(|| {
            format!(
                "{}/{}/{}",
                self.warehouse.trim_end_matches('/'),
                database,
                creation.name
            )
        });
        creation.location = Some(location.clone());
        let name = creation.name.clone();
        let md = TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata;
        let meta_loc = MetadataLocation::new_with_metadata(&location, &md);
        let probe = inner
            .load_table(&TableIdent::new(ns.clone(), name.clone()))
            .await;
        if probe.is_ok() {
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::TableAlreadyExists,
                format!("{database}.{name} exists"),
            ));
        }
        md.write_to(&self.file_io, &meta_loc).await?;
        self.client
            .create_table()
            .database_name(&database)
            .table_input(table_input(&name, &md, &meta_loc.to_string(), None, None)?)
            .send()
            .await
            .map_err(|e| {
                unexpected(
                    format!("Glue CreateTable {database}.{name}"),
                    DisplayErrorContext(&e),
                )
            })?;
        inner.load_table(&TableIdent::new(ns.clone(), name)).await
    }
}

/// Compare-and-swap with Glue's `VersionId`.
#[derive(Debug)]
pub(crate) struct GlueSwap {
    client: aws_sdk_glue::Client,
}

impl GlueSwap {
    /// A Glue client from the config.
    pub(super) async fn new(cfg: &Config) -> Self {
        Self {
            client: client(cfg).await,
        }
    }
}

/// Whether a Glue error code says the request itself is wrong (the table is gone, the input
/// invalid, the role not allowed): retrying cannot help. Throttling, 5xx and transport errors
/// (no code, or another) are retried.
fn permanent(code: Option<&str>) -> bool {
    matches!(
        code,
        Some(
            "EntityNotFoundException"
                | "InvalidInputException"
                | "AccessDeniedException"
                | "ValidationException"
        )
    )
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
                // Retrying an answer that says the request itself is wrong (the table is gone,
                // the role may not read it) would only walk every message to the DLQ.
                use aws_sdk_glue::error::ProvideErrorMetadata;
                let code = e.as_service_error().and_then(|s| s.code());
                Error::new(
                    ErrorKind::Catalog,
                    format!("Glue GetTable {ident}: {}", DisplayErrorContext(&e)),
                )
                .with_retryable(!permanent(code))
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

    async fn swap(&self, ident: &TableIdent, staged: &Staged) -> Result<Swapped> {
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
        let input = table_input(
            ident.name(),
            &staged.metadata,
            &staged.location,
            Some(staged.previous.clone()),
            table,
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
            Ok(_) => Ok(Swapped::as_staged(staged)),
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
                    Err(Error::new(
                        ErrorKind::Catalog,
                        format!("Glue UpdateTable {ident}: {}", DisplayErrorContext(&e)),
                    )
                    .with_retryable(!permanent(svc.and_then(|s| s.code()))))
                }
            }
        }
    }
}
