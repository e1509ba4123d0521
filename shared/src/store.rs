//! Object storage for landing objects and quarantine output: S3 (or any S3-protocol server), or a
//! local directory standing in for buckets on a laptop.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use async_trait::async_trait;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_s3::primitives::ByteStream;
use chrono::{DateTime, Utc};
use tokio::io::{AsyncRead, ReadBuf};

use crate::config::StorageConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::requests::{count, RequestKind, Requests};

/// What floe needs to know about an object before reading it.
#[derive(Debug, Clone)]
pub struct ObjectMeta {
    /// Size in bytes.
    pub size: u64,
    /// ETag (or a content fingerprint for local files), without quotes.
    pub etag: String,
    /// Version id on versioned buckets.
    pub version_id: Option<String>,
    /// When the object was last written.
    pub last_modified: DateTime<Utc>,
}

/// Which version of an object a read must return.
///
/// A version id names immutable content (versioned buckets); an ETag alone is a precondition
/// (S3 `If-Match`): when the object was overwritten since, the read fails with
/// [`ErrorKind::Superseded`] rather than returning other content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Version {
    /// Read exactly this version.
    pub version_id: Option<String>,
    /// Read only while the object's ETag is this one (ignored when `version_id` is set).
    pub etag: Option<String>,
}

impl Version {
    /// Whatever the object holds now.
    pub fn latest() -> Self {
        Self::default()
    }

    /// The version an event names: its version id, else its ETag, else the latest.
    pub(crate) fn named_by(obj: &crate::event::ObjectRef) -> Self {
        Self {
            version_id: obj
                .version_id
                .clone()
                .filter(|v| !v.is_empty() && v != "null"),
            etag: obj
                .etag
                .as_deref()
                .map(clean_etag)
                .filter(|e| !e.is_empty()),
        }
    }

    /// Exactly the content `meta` describes (a second read of what was read once).
    pub fn of(meta: &ObjectMeta) -> Self {
        Self {
            version_id: meta.version_id.clone(),
            etag: Some(meta.etag.clone()).filter(|e| !e.is_empty()),
        }
    }
}

/// An ETag without quotes or a weak-validator prefix.
fn clean_etag(etag: &str) -> String {
    etag.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

/// The error of a read whose precondition (the ETag) no longer holds.
fn superseded(what: String) -> Error {
    Error::new(ErrorKind::Superseded, what).with_retryable(true)
}

/// An object opened for streaming.
pub struct OpenedObject {
    /// Its metadata.
    pub meta: ObjectMeta,
    /// Its bytes. Read errors caused by the transport are marked [`TransientIo`].
    pub body: Pin<Box<dyn AsyncRead + Send>>,
}

/// Marks an I/O error that came from the transport (a retry may succeed), as opposed to bad content.
#[derive(Debug, thiserror::Error)]
#[error("transient read error: {0}")]
pub struct TransientIo(#[source] pub std::io::Error);

/// Whether an I/O error is a [`TransientIo`].
pub(crate) fn is_transient_io(err: &std::io::Error) -> bool {
    err.get_ref()
        .map(|e| e.is::<TransientIo>())
        .unwrap_or(false)
        || matches!(
            err.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::TimedOut
                | std::io::ErrorKind::Interrupted
        )
}

/// Object storage as floe uses it.
#[async_trait]
pub trait ObjectStore: Send + Sync {
    /// Opens `version` of an object for streaming. A missing object (or version) is an error of
    /// kind `NotFound`; an object whose ETag is no longer `version.etag`, of kind `Superseded`.
    async fn open(&self, bucket: &str, key: &str, version: &Version) -> Result<OpenedObject>;
    /// Writes a whole object (quarantine files, demo inputs).
    async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) -> Result<()>;
    /// Writes a whole object from a local file, streamed (never held in memory).
    async fn put_file(&self, bucket: &str, key: &str, path: &std::path::Path) -> Result<()>;
    /// Every object under `prefix` (keys in lexicographic order), all pages of the listing.
    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<Listed>> {
        Err(Error::new(
            ErrorKind::Storage,
            format!("this store cannot list s3://{bucket}/{prefix}"),
        ))
    }
}

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its ETag (quotes removed), as [`ObjectMeta::etag`].
    pub etag: String,
    /// When it was last written.
    pub last_modified: DateTime<Utc>,
}

/// Builds the store the config asks for: a local directory when `storage.local_root` is set, else S3.
pub async fn from_config(cfg: &StorageConfig) -> std::sync::Arc<dyn ObjectStore> {
    from_config_counted(cfg, None).await
}

/// Like [`from_config`], counting every request on `requests`.
pub async fn from_config_counted(
    cfg: &StorageConfig,
    requests: Option<&Requests>,
) -> std::sync::Arc<dyn ObjectStore> {
    let requests = requests.cloned();
    match &cfg.local_root {
        Some(root) => std::sync::Arc::new(LocalStore {
            requests,
            ..LocalStore::new(root)
        }),
        None => std::sync::Arc::new(S3Store {
            requests,
            ..S3Store::new(s3_client(cfg).await)
        }),
    }
}

/// AWS SDK settings from the config: region and static keys, plus an endpoint override
/// (emulators) for the service the client is built for.
pub async fn sdk_config(cfg: &StorageConfig, endpoint: Option<&str>) -> aws_config::SdkConfig {
    // A request whose answer never starts (a server that took it and went silent) must not
    // hold the function until Lambda's own timeout: the SDK fails it as a timeout, which it
    // retries (and floe treats as an unknown outcome where it may have taken effect). The
    // default configuration sets only a connect timeout. A stalled body is the SDK's stalled
    // stream protection's (on by default).
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(std::time::Duration::from_millis(3100))
        .read_timeout(cfg.request_timeout())
        .build();
    let mut loader =
        aws_config::defaults(aws_config::BehaviorVersion::latest()).timeout_config(timeouts);
    if let Some(region) = &cfg.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let (Some(k), Some(s)) = (&cfg.access_key_id, &cfg.secret_access_key) {
        loader = loader.credentials_provider(aws_sdk_s3::config::Credentials::new(
            k.clone(),
            s.clone(),
            None,
            None,
            "floe-config",
        ));
    }
    if let Some(endpoint) = endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    loader.load().await
}

/// An S3 client honouring the config's endpoint, region, path style and static keys.
pub async fn s3_client(cfg: &StorageConfig) -> aws_sdk_s3::Client {
    let sdk = sdk_config(cfg, cfg.endpoint.as_deref()).await;
    let mut b = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(cfg.path_style);
    if cfg.endpoint.is_some() {
        // S3-protocol servers other than AWS do not all take `aws-chunked` bodies with trailing
        // checksums, which the SDK sends for streamed uploads by default: checksums only where
        // an operation requires them.
        b = b.request_checksum_calculation(
            aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
        );
    }
    aws_sdk_s3::Client::from_conf(b.build())
}

/// S3 through the AWS SDK.
#[derive(Clone, Debug)]
pub struct S3Store {
    client: aws_sdk_s3::Client,
    requests: Option<Requests>,
}

/// The slowest upload a PutObject is given time for: the read timeout counts from the request's
/// start to the answer's first byte, so the body's upload is inside it.
const UPLOAD_FLOOR_BYTES_PER_SECOND: u64 = 1 << 20;

impl S3Store {
    /// The client's read timeout plus the time to upload `bytes` at
    /// [`UPLOAD_FLOOR_BYTES_PER_SECOND`] (a 1 GiB quarantine spool: 17 minutes more, beyond any
    /// Lambda's run): a big body slower than the timeout alone is not cut and re-sent forever.
    fn upload_allowance(&self, bytes: u64) -> aws_sdk_s3::config::Builder {
        let base = self
            .client
            .config()
            .timeout_config()
            .and_then(|t| t.read_timeout());
        let mut b = aws_sdk_s3::config::Builder::default();
        if let Some(base) = base {
            let upload = std::time::Duration::from_secs(bytes / UPLOAD_FLOOR_BYTES_PER_SECOND);
            b = b.timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .read_timeout(base.saturating_add(upload))
                    .build(),
            );
        }
        b
    }

    /// Wraps a client.
    pub fn new(client: aws_sdk_s3::Client) -> Self {
        Self {
            client,
            requests: None,
        }
    }
}

fn s3_error<E, R>(what: String, err: aws_sdk_s3::error::SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    use aws_sdk_s3::error::SdkError;
    let retryable = match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(se) => {
            let code = se.err().code().unwrap_or("");
            matches!(
                code,
                "SlowDown"
                    | "InternalError"
                    | "ServiceUnavailable"
                    | "RequestTimeout"
                    | "Throttling"
                    | "ThrottlingException"
            ) || code.is_empty()
        }
        _ => false,
    };
    let missing = matches!(&err, SdkError::ServiceError(se) if matches!(se.err().code(), Some("NoSuchKey" | "NoSuchVersion" | "NotFound")));
    let precondition = matches!(&err, SdkError::ServiceError(se)
        if se.err().code() == Some("PreconditionFailed"));
    let msg = format!("{what}: {}", DisplayErrorContext(&err));
    if precondition {
        return superseded(msg);
    }
    let kind = if missing {
        ErrorKind::NotFound
    } else {
        ErrorKind::Storage
    };
    Error::new(kind, msg).with_retryable(retryable && !missing)
}

#[async_trait]
impl ObjectStore for S3Store {
    async fn open(&self, bucket: &str, key: &str, version: &Version) -> Result<OpenedObject> {
        let mut get = self.client.get_object().bucket(bucket).key(key);
        let mut what = format!("GetObject s3://{bucket}/{key}");
        if let Some(v) = &version.version_id {
            get = get.version_id(v);
            what.push_str(&format!(" version {v}"));
        } else if let Some(etag) = &version.etag {
            get = get.if_match(format!("\"{etag}\""));
            what.push_str(&format!(" if ETag {etag}"));
        }
        count(&self.requests, RequestKind::Get);
        let out = get.send().await.map_err(|e| s3_error(what, e))?;
        let last_modified = out
            .last_modified()
            .and_then(|t| DateTime::<Utc>::from_timestamp(t.secs(), t.subsec_nanos()))
            .unwrap_or_else(Utc::now);
        let meta = ObjectMeta {
            size: out.content_length().unwrap_or(0).max(0) as u64,
            etag: out.e_tag().unwrap_or("").trim_matches('"').to_string(),
            version_id: out.version_id().map(str::to_string).filter(|v| v != "null"),
            last_modified,
        };
        let body = TransientReader(out.body.into_async_read());
        Ok(OpenedObject {
            meta,
            body: Box::pin(body),
        })
    }

    async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) -> Result<()> {
        count(&self.requests, RequestKind::Put);
        let allowed = self.upload_allowance(body.len() as u64);
        self.client
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(ByteStream::from(body))
            .customize()
            .config_override(allowed)
            .send()
            .await
            .map_err(|e| s3_error(format!("PutObject s3://{bucket}/{key}"), e))?;
        Ok(())
    }

    async fn put_file(&self, bucket: &str, key: &str, path: &std::path::Path) -> Result<()> {
        let body = ByteStream::from_path(path).await.map_err(|e| {
            Error::new(ErrorKind::Storage, format!("reading {}", path.display())).with_source(e)
        })?;
        count(&self.requests, RequestKind::Put);
        // The length `from_path` read from the file's metadata (no second stat).
        let size = body.size_hint().1.unwrap_or(u64::MAX);
        self.client
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(body)
            .customize()
            .config_override(self.upload_allowance(size))
            .send()
            .await
            .map_err(|e| s3_error(format!("PutObject s3://{bucket}/{key}"), e))?;
        Ok(())
    }

    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<Listed>> {
        let mut out = Vec::new();
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            count(&self.requests, RequestKind::List);
            let page =
                page.map_err(|e| s3_error(format!("ListObjectsV2 s3://{bucket}/{prefix}"), e))?;
            for o in page.contents() {
                let Some(key) = o.key() else { continue };
                out.push(Listed {
                    key: key.to_string(),
                    size: o.size().unwrap_or(0).max(0) as u64,
                    etag: clean_etag(o.e_tag().unwrap_or("")),
                    last_modified: o
                        .last_modified()
                        .and_then(|t| DateTime::<Utc>::from_timestamp(t.secs(), t.subsec_nanos()))
                        .unwrap_or_else(Utc::now),
                });
            }
        }
        Ok(out)
    }
}

/// Marks every error of the inner reader as transient (network, not content).
struct TransientReader<R>(R);

impl<R: AsyncRead + Unpin> AsyncRead for TransientReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.0).poll_read(cx, buf) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(std::io::Error::other(TransientIo(e)))),
            other => other,
        }
    }
}

/// Buckets as directories: `<root>/<bucket>/<key>`.
#[derive(Clone, Debug)]
pub struct LocalStore {
    root: PathBuf,
    /// Counted as the S3 requests the same calls would make.
    requests: Option<Requests>,
}

impl LocalStore {
    /// A store rooted at `root`.
    pub fn new(root: impl AsRef<Path>) -> Self {
        Self {
            root: root.as_ref().to_path_buf(),
            requests: None,
        }
    }

    fn path(&self, bucket: &str, key: &str) -> Result<PathBuf> {
        if bucket.contains("..") || key.split('/').any(|p| p == "..") {
            return Err(Error::new(
                ErrorKind::Storage,
                format!("refusing path with `..`: {bucket}/{key}"),
            ));
        }
        Ok(self.root.join(bucket).join(key))
    }
}

/// A local file's ETag: its size and modification time.
fn local_etag(len: u64, modified: DateTime<Utc>) -> String {
    format!("{len:x}-{:x}", modified.timestamp_nanos_opt().unwrap_or(0))
}

fn io_error(what: String, err: std::io::Error) -> Error {
    let retryable = is_transient_io(&err);
    let kind = if err.kind() == std::io::ErrorKind::NotFound {
        ErrorKind::NotFound
    } else {
        ErrorKind::Storage
    };
    Error::new(kind, what)
        .with_retryable(retryable)
        .with_source(err)
}

#[async_trait]
impl ObjectStore for LocalStore {
    /// Local files have no versions: `version.version_id` is not checked; the ETag (a size and
    /// modification-time fingerprint) is.
    async fn open(&self, bucket: &str, key: &str, version: &Version) -> Result<OpenedObject> {
        let path = self.path(bucket, key)?;
        count(&self.requests, RequestKind::Get);
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| io_error(format!("open {}", path.display()), e))?;
        let md = file
            .metadata()
            .await
            .map_err(|e| io_error(format!("stat {}", path.display()), e))?;
        let modified: DateTime<Utc> = md
            .modified()
            .map(DateTime::<Utc>::from)
            .unwrap_or_else(|_| Utc::now());
        let meta = ObjectMeta {
            size: md.len(),
            etag: local_etag(md.len(), modified),
            version_id: None,
            last_modified: modified,
        };
        if let Some(etag) = version.etag.as_deref().filter(|e| *e != meta.etag) {
            return Err(superseded(format!(
                "{} is no longer the version with ETag {etag} (now {})",
                path.display(),
                meta.etag
            )));
        }
        Ok(OpenedObject {
            meta,
            body: Box::pin(file),
        })
    }

    async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) -> Result<()> {
        let path = self.path(bucket, key)?;
        count(&self.requests, RequestKind::Put);
        if let Some(dir) = path.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| io_error(format!("mkdir {}", dir.display()), e))?;
        }
        // Write then rename, so a reader never sees half an object.
        let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4()));
        tokio::fs::write(&tmp, body)
            .await
            .map_err(|e| io_error(format!("write {}", tmp.display()), e))?;
        tokio::fs::rename(&tmp, &path)
            .await
            .map_err(|e| io_error(format!("rename to {}", path.display()), e))
    }

    async fn put_file(&self, bucket: &str, key: &str, from: &std::path::Path) -> Result<()> {
        let path = self.path(bucket, key)?;
        count(&self.requests, RequestKind::Put);
        if let Some(dir) = path.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| io_error(format!("mkdir {}", dir.display()), e))?;
        }
        let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4()));
        tokio::fs::copy(from, &tmp)
            .await
            .map_err(|e| io_error(format!("copy {} to {}", from.display(), tmp.display()), e))?;
        tokio::fs::rename(&tmp, &path)
            .await
            .map_err(|e| io_error(format!("rename to {}", path.display()), e))
    }

    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<Listed>> {
        let root = self.path(bucket, "")?;
        let mut out = Vec::new();
        // One page per 1,000 keys, as ListObjectsV2 would return them (counted at the end).
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            let mut entries = match tokio::fs::read_dir(&dir).await {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(format!("list {}", dir.display()), e)),
            };
            while let Some(entry) = entries
                .next_entry()
                .await
                .map_err(|e| io_error(format!("list {}", dir.display()), e))?
            {
                let path = entry.path();
                let md = entry
                    .metadata()
                    .await
                    .map_err(|e| io_error(format!("stat {}", path.display()), e))?;
                if md.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let Ok(rel) = path.strip_prefix(&root) else {
                    continue;
                };
                let key = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                // Half-written objects (`put` writes a temporary file, then renames it).
                if !key.starts_with(prefix) || key.contains(".tmp-") {
                    continue;
                }
                let modified = md
                    .modified()
                    .map(DateTime::<Utc>::from)
                    .unwrap_or_else(|_| Utc::now());
                out.push(Listed {
                    key,
                    size: md.len(),
                    etag: local_etag(md.len(), modified),
                    last_modified: modified,
                });
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        if let Some(r) = &self.requests {
            r.count(RequestKind::List, (out.len() as u64).div_ceil(1000).max(1));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_is_given_its_body_s_time_beyond_the_read_timeout() {
        // The read timeout runs until the answer's first byte, the upload included: a 1 GiB
        // quarantine spool at 35 MB/s would have timed out on every attempt (review helper-30).
        let conf = aws_sdk_s3::Config::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .read_timeout(std::time::Duration::from_secs(30))
                    .build(),
            )
            .build();
        let store = S3Store::new(aws_sdk_s3::Client::from_conf(conf));
        let timeout = |bytes: u64| {
            store
                .upload_allowance(bytes)
                .build()
                .timeout_config()
                .and_then(|t| t.read_timeout())
        };
        assert_eq!(timeout(1000), Some(std::time::Duration::from_secs(30)));
        assert_eq!(
            timeout(100 << 20),
            Some(std::time::Duration::from_secs(130))
        );
    }
}
