//! Glue Data Catalog commits that floe controls: create and update with Glue's `VersionId`
//! compare-and-swap, and Glue column types for every Iceberg type floe writes.
//!
//! iceberg-catalog-glue 0.10.1 refuses any schema holding `timestamptz` ("Conversion from
//! Timestamptz is not supported") on both create and commit, and floe's tables always have one
//! (`_ingested_at`). Reads still go through iceberg's Glue catalog; `create_table` goes through
//! this hook and commits through [`crate::swap::GlueSwap`].

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_glue::error::DisplayErrorContext;
use aws_sdk_glue::types::{Column, StorageDescriptor, TableInput};
use iceberg::spec::{PrimitiveType, TableMetadata, TableMetadataBuilder, Type};
use iceberg::table::Table;
use iceberg::{Catalog, MetadataLocation, NamespaceIdent, TableCreation, TableIdent};

use crate::commit::UpdateHook;
use crate::config::Config;

/// The hook giving a Glue catalog floe's create and commit.
#[derive(Debug, Clone)]
pub struct GlueHook {
    client: aws_sdk_glue::Client,
    warehouse: String,
    file_io: iceberg::io::FileIO,
}

impl GlueHook {
    /// A Glue client honouring the config's endpoint override, region and static keys.
    pub async fn new(cfg: &Config, warehouse: String) -> Self {
        let file_io = iceberg::io::FileIOBuilder::new(std::sync::Arc::new(
            iceberg_storage_opendal::OpenDalResolvingStorageFactory::new(),
        ))
        .with_props(crate::catalog::storage_props(cfg))
        .build();
        Self {
            client: client(cfg).await,
            warehouse,
            file_io,
        }
    }
}

/// A Glue client honouring the config's endpoint override, region and static keys.
pub async fn client(cfg: &Config) -> aws_sdk_glue::Client {
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
pub fn glue_type(ty: &Type) -> String {
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
pub fn table_input(
    name: &str,
    md: &TableMetadata,
    location: &str,
    previous: Option<String>,
) -> iceberg::Result<TableInput> {
    let columns = md
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| {
            Column::builder()
                .name(&f.name)
                .r#type(glue_type(&f.field_type))
                .set_comment(f.doc.clone())
                .parameters("iceberg.field.id", f.id.to_string())
                .parameters("iceberg.field.optional", (!f.required).to_string())
                .parameters("iceberg.field.current", "true")
                .build()
                .map_err(|e| unexpected("Glue column".into(), e))
        })
        .collect::<iceberg::Result<Vec<_>>>()?;
    let mut params = HashMap::from([
        ("table_type".to_string(), "ICEBERG".to_string()),
        ("metadata_location".to_string(), location.to_string()),
    ]);
    if let Some(p) = previous {
        params.insert("previous_metadata_location".into(), p);
    }
    TableInput::builder()
        .name(name)
        .table_type("EXTERNAL_TABLE")
        .set_parameters(Some(params))
        .storage_descriptor(
            StorageDescriptor::builder()
                .location(md.location())
                .set_columns(Some(columns))
                .build(),
        )
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
            .table_input(table_input(&name, &md, &meta_loc.to_string(), None)?)
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
