//! Small table files kept in memory by path, for every storage one component's catalog builds.
//!
//! Every file an Iceberg table names (data and delete files, manifests, manifest lists,
//! metadata.json) is written once under a fresh name and never changed: a path read or written
//! once has those bytes for good, and a warm function may keep them. What it saves is requests
//! and their latency: the pipelines one process invocation runs side by side plan the same
//! delta (the same manifest list and manifests) and read the same new data files; an aggregate
//! reads back the sink file it wrote in its previous run; a Parquet file's footer and its
//! column chunks are separate ranged GETs, where a small file is one whole GET here.
//!
//! Bounded: files up to [`FileCache::max_entry`] bytes only, the total by
//! [`crate::config::StorageConfig::cache_bytes`] (least recently used first out). A file read
//! through a ranged reader is fetched whole when its first read ends within `max_entry` bytes
//! (the Parquet reader's first read is the footer, at the end: the file is that small); a
//! larger file's reads pass through untouched. Concurrent misses on one path make one request.
//! Nothing else is cached: `exists` and `metadata` ask the store, a delete forgets the path,
//! and a commit-turn marker (`crate::turn`), the one file floe rewrites in place, passes through.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use serde::{Deserialize, Serialize};

/// The name of the one file floe rewrites in place, the commit-turn marker (`crate::turn`): it
/// is never cached.
pub(crate) const REWRITTEN_IN_PLACE: &str = "floe-commit-turn.json";

/// Files up to this size are cached (larger ones pass through): small enough that fetching
/// one whole costs about what its footer and one column chunk would.
const MAX_ENTRY: u64 = 2 << 20;

/// The cache shared by the storages of one factory.
#[derive(Clone)]
pub(crate) struct FileCache {
    files: moka::future::Cache<String, Entry>,
    max_entry: u64,
}

/// A cached file: the whole of it, or (from a ranged read) its first bytes.
#[derive(Clone)]
struct Entry {
    bytes: Bytes,
    whole: bool,
}

impl std::fmt::Debug for FileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileCache")
            .field("entries", &self.files.entry_count())
            .field("bytes", &self.files.weighted_size())
            .finish()
    }
}

impl FileCache {
    /// A cache holding at most `budget` bytes of files of at most `max_entry` bytes each.
    pub(crate) fn new(budget: u64, max_entry: u64) -> Self {
        let files = moka::future::Cache::builder()
            .max_capacity(budget)
            .weigher(|k: &String, v: &Entry| {
                u32::try_from(k.len() + v.bytes.len()).unwrap_or(u32::MAX)
            })
            .build();
        Self {
            files,
            max_entry: max_entry.min(budget),
        }
    }

    /// Files this cache may hold are at most this large.
    pub(crate) fn max_entry(&self) -> u64 {
        self.max_entry
    }

    /// The cached bytes of `path` that cover `range`, if any.
    async fn covering(&self, path: &str, range: &Range<u64>) -> Option<Bytes> {
        let e = self.files.get(path).await?;
        slice(&e.bytes, range)
    }

    /// The whole of `path`: from the cache, else from `fetch` (one fetch for concurrent
    /// misses), kept if small enough. Never the start of it a ranged read kept.
    async fn whole<F>(&self, path: &str, fetch: F) -> iceberg::Result<Bytes>
    where
        F: std::future::Future<Output = iceberg::Result<Bytes>>,
    {
        let mut fetch = Some(fetch);
        let e = self.fetch_once(path, true, &mut fetch).await?;
        if e.whole {
            return Ok(e.bytes);
        }
        // A ranged read's start of the file was there (or landed meanwhile): read it whole,
        // and keep that instead.
        let bytes = match fetch.take() {
            Some(f) => f.await?,
            None => return Err(internal(path, "the fetch ran but gave a file's start")),
        };
        self.put(path, bytes.clone()).await;
        Ok(bytes)
    }

    /// The first `want` bytes of `path` (or more, when the cache holds more), fetched by
    /// `fetch` once for concurrent misses and kept if small enough; a kept start too short for
    /// `want` is fetched again and replaced.
    async fn start<F>(&self, path: &str, want: u64, fetch: F) -> iceberg::Result<Bytes>
    where
        F: std::future::Future<Output = iceberg::Result<Bytes>>,
    {
        let mut fetch = Some(fetch);
        let e = self.fetch_once(path, false, &mut fetch).await?;
        if e.bytes.len() as u64 >= want {
            return Ok(e.bytes);
        }
        let bytes = match fetch.take() {
            Some(f) => f.await?,
            None => return Err(internal(path, "a fetched start is shorter than asked")),
        };
        if !e.whole && bytes.len() as u64 <= self.max_entry {
            let entry = Entry {
                bytes: Bytes::copy_from_slice(&bytes),
                whole: false,
            };
            self.files.insert(path.to_string(), entry).await;
        }
        Ok(bytes)
    }

    /// The entry of `path`: the cached one, else what `fetch` gives (taken out of the option
    /// only if it runs; one fetch for concurrent misses), kept if small enough.
    async fn fetch_once<F>(
        &self,
        path: &str,
        whole: bool,
        fetch: &mut Option<F>,
    ) -> iceberg::Result<Entry>
    where
        F: std::future::Future<Output = iceberg::Result<Bytes>>,
    {
        let max = self.max_entry;
        // Fetched under the entry's lock so concurrent misses wait for one request; bytes too
        // many to keep are handed back through the error side and not inserted.
        let got = self
            .files
            .try_get_with(path.to_string(), async {
                let Some(f) = fetch.take() else {
                    return Err(Fetch::Failed(internal(path, "fetched twice")));
                };
                let bytes = f.await.map_err(Fetch::Failed)?;
                if bytes.len() as u64 > max {
                    return Err(Fetch::TooLarge(bytes));
                }
                // A copy: the response's buffer may be larger than its bytes (the budget
                // weighs what is kept).
                Ok(Entry {
                    bytes: Bytes::copy_from_slice(&bytes),
                    whole,
                })
            })
            .await;
        match got {
            Ok(e) => Ok(e),
            Err(e) => match e.as_ref() {
                Fetch::TooLarge(b) => Ok(Entry {
                    bytes: b.clone(),
                    whole,
                }),
                Fetch::Failed(err) => Err(copy_error(err)),
            },
        }
    }

    /// Keeps the whole of `path` (just written or read), if small enough.
    async fn put(&self, path: &str, bytes: Bytes) {
        if bytes.len() as u64 <= self.max_entry {
            let entry = Entry {
                bytes: Bytes::copy_from_slice(&bytes),
                whole: true,
            };
            self.files.insert(path.to_string(), entry).await;
        } else {
            self.forget(path).await;
        }
    }

    async fn forget(&self, path: &str) {
        self.files.invalidate(path).await;
    }
}

/// `range` of `bytes`, if they reach that far.
fn slice(bytes: &Bytes, range: &Range<u64>) -> Option<Bytes> {
    let start = usize::try_from(range.start).ok()?;
    let end = usize::try_from(range.end).ok()?;
    (start <= end && end <= bytes.len()).then(|| bytes.slice(start..end))
}

/// Why a fetch under the cache's lock did not give an entry.
enum Fetch {
    Failed(iceberg::Error),
    TooLarge(Bytes),
}

/// An error of the cache's own logic (never expected).
fn internal(path: &str, what: &str) -> iceberg::Error {
    iceberg::Error::new(
        iceberg::ErrorKind::Unexpected,
        format!("file cache, {path}: {what}"),
    )
}

/// An error shared by the waiters of one fetch, given to each of them.
/// The copy keeps whether a retry can help, which its source (an opendal error, not copied)
/// told ([`crate::error::transient_io`]).
fn copy_error(e: &iceberg::Error) -> iceberg::Error {
    iceberg::Error::new(e.kind(), e.message().to_string())
        .with_retryable(e.retryable() || crate::error::transient_io(e))
        .with_source(std::io::Error::other(format!("{e:#}")))
}

/// Wraps a storage factory: the storages it builds share one [`FileCache`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CachingStorageFactory {
    inner: Box<dyn StorageFactory>,
    #[serde(skip, default = "no_cache")]
    cache: FileCache,
}

/// A deserialized factory (or storage) caches nothing: it is another process's copy.
fn no_cache() -> FileCache {
    FileCache::new(0, 0)
}

impl CachingStorageFactory {
    /// `inner`'s storages, caching up to `budget` bytes of small files between them.
    pub(crate) fn new(inner: Box<dyn StorageFactory>, budget: u64) -> Self {
        Self::with_limits(inner, budget, MAX_ENTRY)
    }

    /// `inner`'s storages, caching files of at most `max_entry` bytes, `budget` in all.
    fn with_limits(inner: Box<dyn StorageFactory>, budget: u64, max_entry: u64) -> Self {
        Self {
            inner,
            cache: FileCache::new(budget, max_entry),
        }
    }
}

#[typetag::serde]
impl StorageFactory for CachingStorageFactory {
    fn build(&self, config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(CachingStorage {
            inner: self.inner.build(config)?,
            cache: self.cache.clone(),
        }))
    }
}

/// A storage answering reads of small files from the cache.
#[derive(Debug, Clone)]
struct CachingStorage {
    inner: Arc<dyn Storage>,
    cache: FileCache,
}

impl Serialize for CachingStorage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.inner.as_ref().serialize(s)
    }
}

impl<'de> Deserialize<'de> for CachingStorage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let inner: Box<dyn Storage> = Deserialize::deserialize(d)?;
        Ok(Self {
            inner: Arc::from(inner),
            cache: no_cache(),
        })
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for CachingStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        self.inner.exists(path).await
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        self.inner.metadata(path).await
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        if path.ends_with(REWRITTEN_IN_PLACE) {
            return self.inner.read(path).await;
        }
        self.cache.whole(path, self.inner.read(path)).await
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        Ok(Box::new(CachingRead {
            inner: self.inner.reader(path).await?,
            path: path.to_string(),
            cache: self.cache.clone(),
            large: AtomicBool::new(false),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        if path.ends_with(REWRITTEN_IN_PLACE) {
            return self.inner.write(path, bs).await;
        }
        // Forgotten first: whatever the write's outcome, an older copy is not served.
        self.cache.forget(path).await;
        self.inner.write(path, bs.clone()).await?;
        self.cache.put(path, bs).await;
        Ok(())
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        self.cache.forget(path).await;
        Ok(Box::new(CachingWrite {
            inner: self.inner.writer(path).await?,
            path: path.to_string(),
            cache: self.cache.clone(),
            written: Some(Vec::new()),
            len: 0,
        }))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        self.cache.forget(path).await;
        self.inner.delete(path).await
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        let prefix = path.to_string();
        let doomed: Vec<String> = self
            .cache
            .files
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, _)| k.as_ref().clone())
            .collect();
        for k in doomed {
            self.cache.forget(&k).await;
        }
        self.inner.delete_prefix(path).await
    }

    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        let cache = self.cache.clone();
        let forgetting = paths
            .then(move |p| {
                let cache = cache.clone();
                async move {
                    cache.forget(&p).await;
                    p
                }
            })
            .boxed();
        self.inner.delete_stream(forgetting).await
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// Ranged reads of one file: from the cache when it holds them; a first read that ends within
/// `max_entry` fetches the file from its start to there in one request (a Parquet reader's first
/// read is its footer, at the end: that is the whole file) and keeps it.
struct CachingRead {
    inner: Box<dyn FileRead>,
    path: String,
    cache: FileCache,
    /// A read reached past what the cache may hold: the rest pass through.
    large: AtomicBool,
}

#[async_trait]
impl FileRead for CachingRead {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        if let Some(b) = self.cache.covering(&self.path, &range).await {
            return Ok(b);
        }
        if self.large.load(Ordering::Relaxed) || range.end > self.cache.max_entry() {
            self.large.store(true, Ordering::Relaxed);
            return self.inner.read(range).await;
        }
        let want = range.end;
        let start = self
            .cache
            .start(&self.path, want, async {
                let b = self.inner.read(0..want).await?;
                if (b.len() as u64) < want {
                    return Err(iceberg::Error::new(
                        iceberg::ErrorKind::Unexpected,
                        format!(
                            "reading {}: asked for bytes 0..{want}, got {}",
                            self.path,
                            b.len()
                        ),
                    )
                    .with_retryable(true));
                }
                Ok(b)
            })
            .await?;
        match slice(&start, &range) {
            Some(b) => Ok(b),
            None => self.inner.read(range).await,
        }
    }
}

/// A streamed write, kept once closed if it stayed small.
struct CachingWrite {
    inner: Box<dyn FileWrite>,
    path: String,
    cache: FileCache,
    /// The bytes written so far (None once past `max_entry`).
    written: Option<Vec<Bytes>>,
    len: u64,
}

#[async_trait]
impl FileWrite for CachingWrite {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        let kept = bs.clone();
        let out = self.inner.write(bs).await;
        self.len += kept.len() as u64;
        match (&out, self.written.as_mut()) {
            (Ok(()), Some(w)) if self.len <= self.cache.max_entry() => w.push(kept),
            _ => self.written = None,
        }
        out
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        self.inner.close().await?;
        if let Some(parts) = self.written.take() {
            let mut whole = Vec::with_capacity(usize::try_from(self.len).unwrap_or(0));
            for p in parts {
                whole.extend_from_slice(&p);
            }
            self.cache.put(&self.path, Bytes::from(whole)).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_fetch_handed_to_its_waiters_stays_retryable_when_its_cause_was_transient() {
        // Before: the copy dropped the opendal source, so a 5xx on a cached read (metadata,
        // manifests) was never retried (review helper-30).
        let cause = opendal::Error::new(opendal::ErrorKind::Unexpected, "503").set_temporary();
        let e = iceberg::Error::new(iceberg::ErrorKind::Unexpected, "io").with_source(cause);
        assert!(copy_error(&e).retryable());
        let gone = opendal::Error::new(opendal::ErrorKind::NotFound, "404").set_persistent();
        let e = iceberg::Error::new(iceberg::ErrorKind::Unexpected, "io").with_source(gone);
        assert!(!copy_error(&e).retryable());
    }
    use crate::requests::{CountingStorageFactory, Requests};
    use crate::summary::S3Requests;

    /// A FileIO over a temporary directory: cached (files up to 16 bytes) over counted.
    fn io(max_entry: u64) -> (iceberg::io::FileIO, Requests, String) {
        let dir = std::env::temp_dir().join(format!("floe-cache-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let requests = Requests::new();
        let counted = CountingStorageFactory::new(
            Box::new(iceberg_storage_opendal::OpenDalResolvingStorageFactory::new()),
            requests.clone(),
        );
        let cached = CachingStorageFactory::with_limits(Box::new(counted), 1 << 20, max_entry);
        let io = iceberg::io::FileIOBuilder::new(Arc::new(cached)).build();
        (io, requests, format!("file://{}", dir.display()))
    }

    fn gets(r: &Requests) -> u64 {
        let S3Requests { get, .. } = r.snapshot();
        get
    }

    /// Writes `bytes` at `path` behind the cache's back (another writer's file).
    fn write_beside(path: &str, bytes: &[u8]) {
        std::fs::write(path.trim_start_matches("file://"), bytes).expect("write");
    }

    #[tokio::test]
    async fn a_missing_file_read_through_opendal_is_a_permanent_error() {
        // opendal's retry layer marks every error persistent; a missing file must still not be
        // retried as if transient (review helper-30).
        let (io, _, dir) = io(16);
        let e = io
            .new_input(format!("{dir}/missing.bin"))
            .unwrap()
            .read()
            .await
            .unwrap_err();
        assert!(!crate::error::Error::iceberg("read", e).is_retryable());
    }

    #[tokio::test]
    async fn a_file_written_or_read_once_is_served_from_memory() {
        let (io, requests, dir) = io(16);
        let written = format!("{dir}/written.bin");
        io.new_output(&written)
            .expect("output")
            .write(Bytes::from_static(b"0123456789"))
            .await
            .expect("write");
        let input = io.new_input(&written).expect("input");
        assert_eq!(input.read().await.expect("read"), "0123456789");
        let reader = input.reader().await.expect("reader");
        assert_eq!(reader.read(2..5).await.expect("range"), "234");
        assert_eq!(gets(&requests), 0, "what it wrote it has");

        // Another writer's file: the first read (a footer, at the end) fetches it whole.
        let other = format!("{dir}/other.bin");
        write_beside(&other, b"abcdefghij");
        let reader = io
            .new_input(&other)
            .expect("input")
            .reader()
            .await
            .expect("r");
        assert_eq!(reader.read(6..10).await.expect("footer"), "ghij");
        assert_eq!(reader.read(0..3).await.expect("chunk"), "abc");
        let again = io
            .new_input(&other)
            .expect("input")
            .reader()
            .await
            .expect("r");
        assert_eq!(again.read(3..6).await.expect("chunk"), "def");
        assert_eq!(gets(&requests), 1, "one GET for the whole small file");
    }

    #[tokio::test]
    async fn the_start_of_a_file_is_never_served_as_the_whole_of_it() {
        let (io, requests, dir) = io(16);
        let path = format!("{dir}/f.bin");
        write_beside(&path, b"0123456789");
        let input = io.new_input(&path).expect("input");
        let reader = input.reader().await.expect("reader");
        assert_eq!(reader.read(0..4).await.expect("start"), "0123");
        assert_eq!(input.read().await.expect("whole"), "0123456789");
        // A read past the kept start asks the store.
        let reader = input.reader().await.expect("reader");
        assert_eq!(reader.read(4..10).await.expect("rest"), "456789");
        assert_eq!(
            gets(&requests),
            2,
            "the start, then the whole; the rest from memory"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_start_kept_meanwhile_is_not_taken_for_the_whole_file() {
        let (io, _, dir) = io(16);
        for n in 0..50 {
            let path = format!("{dir}/race-{n}.bin");
            write_beside(&path, b"0123456789");
            let input = io.new_input(&path).expect("input");
            let reader = input.reader().await.expect("reader");
            let (start, whole) = tokio::join!(reader.read(0..4), input.read());
            assert_eq!(start.expect("start"), "0123");
            assert_eq!(whole.expect("whole"), "0123456789", "round {n}");
        }
    }

    #[tokio::test]
    async fn a_short_start_is_extended_when_more_is_asked() {
        let (io, requests, dir) = io(16);
        let path = format!("{dir}/f.bin");
        write_beside(&path, b"0123456789");
        let input = io.new_input(&path).expect("input");
        let reader = input.reader().await.expect("reader");
        assert_eq!(reader.read(0..2).await.expect("start"), "01");
        assert_eq!(reader.read(6..10).await.expect("more"), "6789");
        assert_eq!(reader.read(2..8).await.expect("inside"), "234567");
        assert_eq!(
            gets(&requests),
            2,
            "the short start, then the longer one kept"
        );
    }

    #[tokio::test]
    async fn large_files_pass_through_and_concurrent_misses_make_one_request() {
        let (io, requests, dir) = io(16);
        let big = format!("{dir}/big.bin");
        write_beside(&big, &[7u8; 64]);
        let input = io.new_input(&big).expect("input");
        for _ in 0..2 {
            assert_eq!(input.read().await.expect("read").len(), 64);
            let reader = input.reader().await.expect("reader");
            assert_eq!(reader.read(60..64).await.expect("footer").len(), 4);
            assert_eq!(reader.read(0..4).await.expect("start").len(), 4);
        }
        assert_eq!(gets(&requests), 6, "nothing of a large file is kept");

        let small = format!("{dir}/small.bin");
        write_beside(&small, b"0123456789");
        let (a, b) = (
            io.new_input(&small).expect("a"),
            io.new_input(&small).expect("b"),
        );
        let (ra, rb) = tokio::join!(a.read(), b.read());
        assert_eq!(
            (ra.expect("a"), rb.expect("b")),
            ("0123456789".into(), "0123456789".into())
        );
        assert_eq!(gets(&requests), 7, "two readers at once, one GET");
    }

    #[tokio::test]
    async fn a_deleted_or_missing_file_is_not_served() {
        let (io, _, dir) = io(16);
        let path = format!("{dir}/gone.bin");
        assert!(io.new_input(&path).expect("input").read().await.is_err());
        write_beside(&path, b"late");
        assert_eq!(
            io.new_input(&path)
                .expect("input")
                .read()
                .await
                .expect("read"),
            "late"
        );
        io.delete(&path).await.expect("delete");
        assert!(io.new_input(&path).expect("input").read().await.is_err());
        let kept = format!("{dir}/kept/a.bin");
        io.new_output(&kept)
            .expect("output")
            .write(Bytes::from_static(b"a"))
            .await
            .expect("write");
        io.delete_prefix(&format!("{dir}/kept/"))
            .await
            .expect("delete");
        assert!(io.new_input(&kept).expect("input").read().await.is_err());
    }

    #[test]
    fn the_budget_follows_the_function_memory() {
        use crate::config::StorageConfig;
        let _ = StorageConfig::default().cache_bytes();
        assert_eq!(crate::config::cache_bytes_for(None, None), 64 << 20);
        assert_eq!(crate::config::cache_bytes_for(None, Some(128)), 8 << 20);
        assert_eq!(crate::config::cache_bytes_for(None, Some(10240)), 64 << 20);
        assert_eq!(crate::config::cache_bytes_for(Some(0), Some(10240)), 0);
        assert_eq!(
            crate::config::cache_bytes_for(Some(200), Some(128)),
            200 << 20
        );
    }
}
