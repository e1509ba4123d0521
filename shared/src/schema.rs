//! From the config's column list to an Iceberg schema and partition spec, and to the Arrow schemas
//! used while decoding.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_schema::{Field, Schema as ArrowSchema, SchemaRef as ArrowSchemaRef};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Transform, Type, UnboundPartitionSpec};

use crate::config::types::{parse_partition, parse_type};
use crate::config::TableConfig;
use crate::error::{Error, ErrorKind, Result};

/// Column holding the ingestion time of every row (timestamptz, required).
pub const INGESTED_AT: &str = "_ingested_at";
/// Column holding the source object of every row (string, required): its identity
/// `s3://bucket/key#version` (ETag or version id), as in snapshot summaries; rows written before
/// floe recorded versions hold `s3://bucket/key`.
pub const SOURCE: &str = "_source";
/// Column holding, per row, the names of the data-quality checks with action `flag` it failed
/// (comma-separated; null when none). Only tables whose contract flags have it (optional
/// string); an existing table gets it with the first object ingested under such a contract.
pub const QUALITY: &str = "_quality";
/// Column of a `cdc = "debezium"` table holding each row's change operation: the envelope's
/// `op` letter (`c` create, `u` update, `d` delete, `r` snapshot read; optional string).
pub const CDC_OP: &str = "_op";
/// Column of a `cdc = "debezium"` table holding each row's change time: the envelope's `ts_ms`
/// (optional timestamptz).
pub const CDC_TS: &str = "_cdc_ts";

/// The columns a `cdc = "debezium"` table has beyond its configured ones, ids from `first`.
fn cdc_fields(first: i32) -> [NestedField; 2] {
    [
        NestedField::optional(first, CDC_OP, Type::Primitive(PrimitiveType::String))
            .with_doc("the change operation: c create, u update, d delete, r snapshot read"),
        NestedField::optional(
            first + 1,
            CDC_TS,
            Type::Primitive(PrimitiveType::Timestamptz),
        )
        .with_doc("when the change was recorded (the envelope's ts_ms)"),
    ]
}

fn is_debezium(table: &TableConfig) -> bool {
    table.cdc == Some(crate::config::Cdc::Debezium)
}

/// The Iceberg schema for a table config: its columns plus `_ingested_at` and `_source` (and
/// `_quality` when its contract flags).
pub fn table_schema(table: &TableConfig) -> Result<Schema> {
    let mut fields = Vec::with_capacity(table.columns.len() + 2);
    let mut id = 0;
    for col in &table.columns {
        id += 1;
        let ty = parse_type(&col.type_name).map_err(|r| Error::new(ErrorKind::Config, r))?;
        let mut f = if col.required || col.name == table.event_time {
            NestedField::required(id, &col.name, Type::Primitive(ty))
        } else {
            NestedField::optional(id, &col.name, Type::Primitive(ty))
        };
        if let Some(doc) = &col.doc {
            f = f.with_doc(doc);
        }
        fields.push(Arc::new(f));
    }
    fields.push(Arc::new(
        NestedField::required(
            id + 1,
            INGESTED_AT,
            Type::Primitive(PrimitiveType::Timestamptz),
        )
        .with_doc("when floe ingested the row"),
    ));
    fields.push(Arc::new(
        NestedField::required(id + 2, SOURCE, Type::Primitive(PrimitiveType::String))
            .with_doc("the source object version, s3://bucket/key#version"),
    ));
    let mut next = id + 3;
    if table.has_flag_checks() {
        fields.push(Arc::new(quality_field(next)));
        next += 1;
    }
    if is_debezium(table) {
        fields.extend(cdc_fields(next).map(Arc::new));
    }
    Schema::builder()
        .with_fields(fields)
        .build()
        .map_err(|e| Error::iceberg(format!("schema of table `{}`", table.name), e))
}

/// The `_quality` column with field id `id`.
pub(crate) fn quality_field(id: i32) -> NestedField {
    NestedField::optional(id, QUALITY, Type::Primitive(PrimitiveType::String))
        .with_doc("the data-quality checks (action flag) the row failed, comma-separated")
}

/// `schema` with what the table's contract needs and the table lacks: the configured columns
/// its checks read (optional: a table declared a column after it was created) and `_quality`
/// when it flags, ids above `last_column_id` (and `_op`/`_cdc_ts` when its routes became
/// `cdc = "debezium"`); with the change described. None when nothing is missing. For an
/// existing table whose contract changed: the object's commit adds them.
pub(crate) fn with_contract_columns(
    schema: &Schema,
    last_column_id: i32,
    table: &TableConfig,
) -> Result<Option<(Schema, String)>> {
    let mut fields: Vec<_> = schema.as_struct().fields().to_vec();
    let mut id = last_column_id.max(schema.highest_field_id());
    let mut added = Vec::new();
    for col in table.check_columns() {
        if schema.field_by_name(&col.name).is_some() {
            continue;
        }
        let ty = parse_type(&col.type_name).map_err(|r| Error::new(ErrorKind::Config, r))?;
        id += 1;
        added.push(format!("{} ({ty})", col.name));
        let mut f = NestedField::optional(id, &col.name, Type::Primitive(ty));
        if let Some(doc) = &col.doc {
            f = f.with_doc(doc);
        }
        fields.push(Arc::new(f));
    }
    if table.has_flag_checks() && schema.field_by_name(QUALITY).is_none() {
        id += 1;
        added.push(format!("{QUALITY} (string)"));
        fields.push(Arc::new(quality_field(id)));
    }
    if is_debezium(table) {
        for f in cdc_fields(id + 1) {
            if schema.field_by_name(&f.name).is_none() {
                added.push(format!("{} ({})", f.name, f.field_type));
                fields.push(Arc::new(f));
            }
        }
    }
    if added.is_empty() {
        return Ok(None);
    }
    let evolved = Schema::builder()
        .with_schema_id(schema.schema_id() + 1)
        .with_identifier_field_ids(schema.identifier_field_ids())
        .with_fields(fields)
        .build()
        .map_err(|e| Error::iceberg("adding the columns of the table's contract", e))?;
    Ok(Some((evolved, format!("added {}", added.join(", ")))))
}

/// The unbound partition spec for a table config, resolved against `schema`.
pub(crate) fn partition_spec(table: &TableConfig, schema: &Schema) -> Result<UnboundPartitionSpec> {
    let names: HashSet<&str> = table.columns.iter().map(|c| c.name.as_str()).collect();
    let mut builder = UnboundPartitionSpec::builder().with_spec_id(0);
    for expr in &table.partition {
        let (transform, col) =
            parse_partition(expr, &names).map_err(|r| Error::new(ErrorKind::Config, r))?;
        let field = schema
            .field_by_name(&col)
            .ok_or_else(|| Error::new(ErrorKind::Config, format!("no column `{col}`")))?;
        let name = match transform {
            Transform::Identity => col.clone(),
            Transform::Year => format!("{col}_year"),
            Transform::Month => format!("{col}_month"),
            Transform::Day => format!("{col}_day"),
            Transform::Hour => format!("{col}_hour"),
            Transform::Bucket(_) => format!("{col}_bucket"),
            Transform::Truncate(_) => format!("{col}_trunc"),
            _ => format!("{col}_part"),
        };
        builder = builder
            .add_partition_field(field.id, name, transform)
            .map_err(|e| Error::iceberg(format!("partition `{expr}`"), e))?;
    }
    Ok(builder.build())
}

/// The table's sort order from `sort` keys (`col`, `col asc`, `col desc`), bound to `schema`.
pub(crate) fn sort_order(table: &TableConfig, schema: &Schema) -> Result<iceberg::spec::SortOrder> {
    use iceberg::spec::{NullOrder, SortDirection, SortField, SortOrder};
    if table.sort.is_empty() {
        return Ok(SortOrder::unsorted_order());
    }
    let mut builder = SortOrder::builder();
    builder.with_order_id(1);
    for key in &table.sort {
        let mut parts = key.split_whitespace();
        let col = parts.next().unwrap_or("");
        let desc = matches!(parts.next(), Some(d) if d.eq_ignore_ascii_case("desc"));
        let field = schema
            .field_by_name(col)
            .ok_or_else(|| Error::new(ErrorKind::Config, format!("sort: no column `{col}`")))?;
        builder.with_sort_field(
            SortField::builder()
                .source_id(field.id)
                .transform(Transform::Identity)
                .direction(if desc {
                    SortDirection::Descending
                } else {
                    SortDirection::Ascending
                })
                .null_order(if desc {
                    NullOrder::Last
                } else {
                    NullOrder::First
                })
                .build(),
        );
    }
    builder
        .build(schema)
        .map_err(|e| Error::iceberg(format!("sort order of `{}`", table.name), e))
}

/// The Arrow schema input is decoded into: the table's user columns (and the change-record
/// columns `_op`, `_cdc_ts`, which a Debezium route's decoder fills), all nullable and without
/// field-id metadata, so that missing required values are found by floe and reported per record.
pub fn decode_schema(table_arrow: &ArrowSchema) -> ArrowSchemaRef {
    let fields: Vec<Field> = table_arrow
        .fields()
        .iter()
        .filter(|f| !f.name().starts_with('_') || f.name() == CDC_OP || f.name() == CDC_TS)
        .map(|f| Field::new(f.name(), f.data_type().clone(), true))
        .collect();
    Arc::new(ArrowSchema::new(fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_partitions_parse() {
        assert_eq!(parse_type("LONG").unwrap(), PrimitiveType::Long);
        assert_eq!(
            parse_type("decimal(10, 2)").unwrap(),
            PrimitiveType::Decimal {
                precision: 10,
                scale: 2
            }
        );
        assert!(parse_type("decimal(2,5)").is_err());
        assert!(parse_type("money").unwrap_err().contains("money"));
        let cols: HashSet<&str> = ["t", "r"].into_iter().collect();
        assert_eq!(
            parse_partition("day(t)", &cols).unwrap(),
            (Transform::Day, "t".into())
        );
        assert_eq!(
            parse_partition("r", &cols).unwrap(),
            (Transform::Identity, "r".into())
        );
        assert_eq!(
            parse_partition("bucket(16, r)", &cols).unwrap(),
            (Transform::Bucket(16), "r".into())
        );
        assert!(parse_partition("day(x)", &cols).is_err());
        assert!(parse_partition("week(t)", &cols).is_err());
    }
}
