//! Sensitive fields: columns declared `sensitive = "hash"` are replaced at ingest by a keyed
//! HMAC-SHA256 (hex), so they still join and group but cannot be reversed without the key;
//! `sensitive = "drop"` columns are never stored (written as null).
//!
//! The key comes from SSM Parameter Store (`ingest.hash_key_parameter`, a SecureString) or, for
//! laptops and tests, the `FLOE_HASH_KEY` environment variable. It is loaded once per container.

use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, RecordBatch, StringArray};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::{Config, Sensitive, TableConfig};
use crate::error::{Error, ErrorKind, Result};

/// The key for `sensitive = "hash"` columns, when any table has one (else None).
pub(crate) async fn load_key(cfg: &Config) -> Result<Option<Vec<u8>>> {
    let needed = cfg
        .tables
        .iter()
        .flat_map(|t| &t.columns)
        .any(|c| c.sensitive == Some(Sensitive::Hash));
    if !needed {
        return Ok(None);
    }
    if let Some(name) = &cfg.ingest.hash_key_parameter {
        let sdk = crate::store::sdk_config(&cfg.storage, cfg.ingest.ssm_endpoint.as_deref()).await;
        let out = aws_sdk_ssm::Client::new(&sdk)
            .get_parameter()
            .name(name)
            .with_decryption(true)
            .send()
            .await
            .map_err(|e| {
                Error::new(
                    ErrorKind::Config,
                    format!(
                        "reading the hash key from SSM parameter `{name}`: {}",
                        aws_sdk_ssm::error::DisplayErrorContext(e)
                    ),
                )
                .with_retryable(true)
            })?;
        let value = out
            .parameter()
            .and_then(|p| p.value())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Config,
                    format!("SSM parameter `{name}` is empty"),
                )
            })?;
        return Ok(Some(value.as_bytes().to_vec()));
    }
    match std::env::var("FLOE_HASH_KEY") {
        Ok(k) if !k.is_empty() => Ok(Some(k.into_bytes())),
        _ => Err(Error::new(
            ErrorKind::Config,
            "a column is `sensitive = \"hash\"` but no key is configured: set `ingest.hash_key_parameter` \
             (an SSM SecureString) or FLOE_HASH_KEY",
        )),
    }
}

/// HMAC-SHA256 of `value` under `key`, lowercase hex.
pub fn hmac_hex(key: &[u8], value: &str) -> String {
    // HMAC accepts keys of any length: `new_from_slice` cannot fail for it.
    match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(value.as_bytes());
            hex::encode(mac.finalize().into_bytes())
        }
        Err(_) => String::new(),
    }
}

/// Applies the table's sensitive-column rules to a decoded batch.
pub fn protect(
    batch: &RecordBatch,
    table: &TableConfig,
    key: Option<&[u8]>,
) -> Result<RecordBatch> {
    let rules: Vec<(&str, Sensitive)> = table
        .columns
        .iter()
        .filter_map(|c| c.sensitive.map(|s| (c.name.as_str(), s)))
        .collect();
    if rules.is_empty() {
        return Ok(batch.clone());
    }
    let schema = batch.schema();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    for (name, rule) in rules {
        let Ok(i) = schema.index_of(name) else {
            continue;
        };
        let col = &columns[i];
        columns[i] = match rule {
            Sensitive::Drop => new_null_array(col.data_type(), col.len()),
            Sensitive::Hash => {
                let key = key.ok_or_else(|| {
                    Error::new(
                        ErrorKind::Config,
                        format!("column `{name}` is hashed but no key is loaded"),
                    )
                })?;
                let strings = col.as_any().downcast_ref::<StringArray>().ok_or_else(|| {
                    Error::new(
                        ErrorKind::Config,
                        format!(
                            "column `{name}` is hashed: it must be a string column, it is {}",
                            col.data_type()
                        ),
                    )
                })?;
                let hashed: StringArray = strings
                    .iter()
                    .map(|v| v.map(|v| hmac_hex(key, v)))
                    .collect();
                Arc::new(hashed) as ArrayRef
            }
        };
    }
    RecordBatch::try_new(schema, columns).map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("protecting sensitive columns: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_keyed_and_stable_drop_is_null() {
        let table: TableConfig = toml::from_str(
            r#"
name = "t"
event_time = "ts"
columns = [
  { name = "email", type = "string", sensitive = "hash" },
  { name = "card", type = "string", sensitive = "drop" },
  { name = "ts", type = "timestamptz" },
]"#,
        )
        .unwrap();
        let schema = Arc::new(arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("email", arrow_schema::DataType::Utf8, true),
            arrow_schema::Field::new("card", arrow_schema::DataType::Utf8, true),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![Some("a@x.org"), None])),
                Arc::new(StringArray::from(vec![Some("4111"), Some("5500")])),
            ],
        )
        .unwrap();
        let out = protect(&b, &table, Some(b"k1")).unwrap();
        let email = out
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(email.value(0), hmac_hex(b"k1", "a@x.org"));
        assert_eq!(email.value(0).len(), 64);
        assert!(email.is_null(1));
        assert_ne!(hmac_hex(b"k2", "a@x.org"), email.value(0));
        assert_eq!(out.column(1).null_count(), 2);
        assert!(protect(&b, &table, None).is_err());
    }
}
