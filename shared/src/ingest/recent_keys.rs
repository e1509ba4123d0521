//! `unique` checks with `within_hours`: the keys of the table's recent rows (event time in the
//! last `within_hours` hours), read once per object before its rows are checked, so a record
//! repeating a key committed recently fails the check like a duplicate within the object.
//!
//! One Iceberg scan per such check, of the key columns and the event time only, filtered on the
//! event time (files pruned by their bounds; rows filtered exactly here). Keys are remembered as
//! hashes and count against `max_unique_keys`. Objects ingested concurrently do not see each
//! other's keys: the check is as of the table version the object started from.

use arrow::array::{ArrayRef, Scalar, TimestampMicrosecondArray};
use arrow::compute::{cast, filter_record_batch};
use arrow_schema::DataType;
use futures::TryStreamExt;
use iceberg::expr::Reference;
use iceberg::spec::{Datum, PrimitiveType, Type};
use iceberg::table::Table;

use crate::error::{Error, ErrorKind, Result};
use crate::quality::{Contract, QualityError};

/// Feeds `contract`'s `unique … within_hours` checks the keys of `table`'s rows whose
/// `event_time` is at most that many hours before `now_us`.
pub(super) async fn remember_recent_keys(
    table: &Table,
    event_time: &str,
    contract: &mut Contract,
    now_us: i64,
) -> Result<()> {
    let checks = contract.recent_unique();
    if checks.is_empty() || table.metadata().current_snapshot().is_none() {
        return Ok(());
    }
    let schema = table.metadata().current_schema().clone();
    let tz = matches!(
        schema
            .field_by_name(event_time)
            .map(|f| f.field_type.as_ref()),
        Some(Type::Primitive(PrimitiveType::Timestamptz))
    );
    for (k, columns, hours) in checks {
        let since = now_us.saturating_sub((hours * 3_600_000_000.0) as i64);
        let what = || {
            format!(
                "reading the keys ({}) of {}'s last {hours} h",
                columns.join(", "),
                table.identifier()
            )
        };
        if columns.iter().any(|c| schema.field_by_name(c).is_none()) {
            continue; // a key column the table does not have yet: no row can repeat its key
        }
        let mut select = columns.clone();
        if !select.iter().any(|c| c == event_time) {
            select.push(event_time.to_string());
        }
        let datum = if tz {
            Datum::timestamptz_micros(since)
        } else {
            Datum::timestamp_micros(since)
        };
        let scan = table
            .scan()
            .select(select)
            .with_filter(Reference::new(event_time).greater_than_or_equal_to(datum))
            .build()
            .map_err(|e| Error::iceberg(what(), e).with_retryable(true))?;
        let mut batches = scan
            .to_arrow()
            .await
            .map_err(|e| Error::iceberg(what(), e).with_retryable(true))?;
        while let Some(batch) = batches
            .try_next()
            .await
            .map_err(|e| Error::iceberg(what(), e).with_retryable(true))?
        {
            let internal = |e: arrow::error::ArrowError| {
                Error::new(ErrorKind::Internal, what()).with_source(e)
            };
            let Some(et) = batch.column_by_name(event_time) else {
                continue;
            };
            let tz_of = match et.data_type() {
                DataType::Timestamp(_, tz) => tz.clone(),
                _ => None,
            };
            let bound: ArrayRef = std::sync::Arc::new(
                TimestampMicrosecondArray::from(vec![since]).with_timezone_opt(tz_of),
            );
            let bound = cast(&bound, et.data_type()).map_err(internal)?;
            let keep =
                arrow::compute::kernels::cmp::gt_eq(et, &Scalar::new(bound)).map_err(internal)?;
            let recent = filter_record_batch(&batch, &keep).map_err(internal)?;
            contract.remember(k, &recent).map_err(|e| match e {
                QualityError::Limit(m) => Error::new(
                    ErrorKind::UnreadableObject,
                    format!("{}: {m}; nothing committed", table.identifier()),
                )
                .with_retryable(false),
                other => Error::new(ErrorKind::Internal, other.to_string()),
            })?;
        }
    }
    Ok(())
}
