//! Object-storage requests counted where floe makes them, and the meter that turns a unit of
//! work's time and requests into the [`Usage`] its snapshot records.
//!
//! Two paths reach S3: the landing store ([`crate::store`]: GetObject of an object, PutObject of
//! quarantine, ListObjectsV2 of a backfill) and iceberg's FileIO (data files, manifests,
//! manifest lists, metadata.json). The landing store counts in its own methods; FileIO is built
//! by the catalog from a storage factory, which [`CountingStorageFactory`] wraps so that every
//! storage it builds counts its calls. One [`Requests`] per component (ingestor, processor,
//! maintainer), so components running in one process (the CLI's local stack, tests) do not
//! count each other's requests.
//!
//! What a count is: a whole-object read or write is one request; a ranged read through a file
//! reader (Parquet footers and row groups) is one GET per range; a streamed write is one PUT
//! even when the SDK splits it into a multipart upload (then S3 counts parts + 2: a lower
//! bound for files larger than a part); `exists`/`metadata` are HEADs; a prefix delete is one
//! LIST plus one DELETE. Local directories count the same calls (what they would cost on S3).
//!
//! Work that runs beside other work of the same component (the commits of different tables of
//! one payload run side by side) is metered in a scope of its own ([`Meter::scoped_carrying`],
//! [`Meter::run`]): a task-local list of counters that every request made by the future run in
//! it is counted on too, so its usage holds its own requests, not those of the work beside it.
//! Tasks that future spawns do not inherit the scope: it suits work that spawns none (a commit).

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use serde::{Deserialize, Serialize};

use crate::summary::{S3Requests, Usage};

/// A kind of request, priced as S3 prices it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// GetObject.
    Get,
    /// PutObject.
    Put,
    /// ListObjectsV2 (one page).
    List,
    /// HeadObject.
    Head,
    /// DeleteObject.
    Delete,
}

#[derive(Debug, Default)]
struct Counters {
    get: AtomicU64,
    put: AtomicU64,
    list: AtomicU64,
    head: AtomicU64,
    delete: AtomicU64,
}

/// Request counters shared by everything one component builds (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct Requests(Arc<Counters>);

impl Requests {
    /// Fresh counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts `n` requests of `kind` (and on every scope the current future runs in).
    pub fn count(&self, kind: RequestKind, n: u64) {
        self.add(kind, n);
        let _ = SCOPES.try_with(|scopes| {
            for s in scopes.iter().filter(|s| !Arc::ptr_eq(&s.0, &self.0)) {
                s.add(kind, n);
            }
        });
    }

    fn add(&self, kind: RequestKind, n: u64) {
        let c = match kind {
            RequestKind::Get => &self.0.get,
            RequestKind::Put => &self.0.put,
            RequestKind::List => &self.0.list,
            RequestKind::Head => &self.0.head,
            RequestKind::Delete => &self.0.delete,
        };
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> S3Requests {
        S3Requests {
            get: self.0.get.load(Ordering::Relaxed),
            put: self.0.put.load(Ordering::Relaxed),
            list: self.0.list.load(Ordering::Relaxed),
            head: self.0.head.load(Ordering::Relaxed),
            delete: self.0.delete.load(Ordering::Relaxed),
        }
    }
}

tokio::task_local! {
    /// The scopes the current future runs in, outermost first ([`in_scope`]).
    static SCOPES: Vec<Requests>;
}

/// Runs `fut` with every request it makes also counted on `scope` (nested scopes each count).
async fn in_scope<F: Future>(scope: Requests, fut: F) -> F::Output {
    let mut scopes = SCOPES.try_with(Clone::clone).unwrap_or_default();
    scopes.push(scope);
    SCOPES.scope(scopes, fut).await
}

/// Counts a request on `requests` if there are counters.
pub(crate) fn count(requests: &Option<Requests>, kind: RequestKind) {
    if let Some(r) = requests {
        r.count(kind, 1);
    }
}

/// Meters one unit of work (an ingest commit's objects, a pipeline run, a maintenance run):
/// the time and requests since it started, or since the last commit that recorded them.
/// Cheap to clone: clones share the mark.
#[derive(Debug, Clone)]
pub struct Meter {
    function: &'static str,
    memory_mb: u64,
    requests: Option<Requests>,
    /// `requests` are the counters of a scope of this meter's own ([`Meter::run`]).
    scoped: bool,
    /// Since when (time, request counts), plus usage carried in (a batch's members).
    mark: Arc<Mutex<(Instant, S3Requests, Usage)>>,
}

impl Meter {
    /// Starts metering work of `function` in `memory_mb` of memory, counting on `requests`.
    pub fn start(function: &'static str, memory_mb: u64, requests: Option<&Requests>) -> Self {
        let at = requests.map(Requests::snapshot).unwrap_or_default();
        Self {
            function,
            memory_mb,
            requests: requests.cloned(),
            scoped: false,
            mark: Arc::new(Mutex::new((Instant::now(), at, Usage::default()))),
        }
    }

    /// A meter that starts now, adds `carried`, and counts only the requests of the work run
    /// through [`Meter::run`] (in a scope of its own): not those of work running beside it on
    /// the same counters. Without counters, time only.
    pub fn scoped_carrying(&self, carried: Usage) -> Self {
        let scope = self.requests.as_ref().map(|_| Requests::new());
        let mut m = Self::start(self.function, self.memory_mb, scope.as_ref()).carrying(carried);
        m.scoped = scope.is_some();
        m
    }

    /// Runs `fut`: in this meter's scope when it has one ([`Meter::scoped_carrying`]).
    pub async fn run<F: Future>(&self, fut: F) -> F::Output {
        match (&self.requests, self.scoped) {
            (Some(scope), true) => in_scope(scope.clone(), fut).await,
            _ => fut.await,
        }
    }

    /// A meter that starts now and adds `carried` (work done before, e.g. a batch's objects).
    pub fn carrying(&self, carried: Usage) -> Self {
        let m = Self::start(self.function, self.memory_mb, self.requests.as_ref());
        if let Ok(mut mark) = m.mark.lock() {
            mark.2 = carried;
        }
        m
    }

    /// Usage since the mark (what a commit made now records).
    pub fn usage(&self) -> Usage {
        let now = self.requests.as_ref().map(Requests::snapshot);
        let Ok(mark) = self.mark.lock() else {
            return Usage::default();
        };
        let own = Usage {
            function: self.function.to_string(),
            compute_ms: mark.0.elapsed().as_millis() as u64,
            memory_mb: self.memory_mb,
            s3: now.map(|n| n.minus(&mark.1)),
        };
        own.plus(&mark.2)
    }

    /// Moves the mark to now (after a commit recorded the usage so far): the next commit of the
    /// same work records only what came after.
    pub fn mark(&self) {
        let at = self
            .requests
            .as_ref()
            .map(Requests::snapshot)
            .unwrap_or_default();
        if let Ok(mut mark) = self.mark.lock() {
            *mark = (Instant::now(), at, Usage::default());
        }
    }
}

/// Wraps the storage factory the catalog builds FileIO from: every storage counts its calls.
#[derive(Debug, Serialize, Deserialize)]
pub struct CountingStorageFactory {
    inner: Box<dyn StorageFactory>,
    #[serde(skip)]
    requests: Requests,
}

impl CountingStorageFactory {
    /// `inner`, counting on `requests`.
    pub fn new(inner: Box<dyn StorageFactory>, requests: Requests) -> Self {
        Self { inner, requests }
    }
}

#[typetag::serde]
impl StorageFactory for CountingStorageFactory {
    fn build(&self, config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(CountingStorage {
            inner: self.inner.build(config)?,
            requests: self.requests.clone(),
        }))
    }
}

/// A storage that counts the requests of the one it wraps.
#[derive(Debug, Clone)]
struct CountingStorage {
    inner: Arc<dyn Storage>,
    requests: Requests,
}

impl Serialize for CountingStorage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        // The wrapped storage; a deserialized copy counts on fresh counters.
        self.inner.as_ref().serialize(s)
    }
}

impl<'de> Deserialize<'de> for CountingStorage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let inner: Box<dyn Storage> = Deserialize::deserialize(d)?;
        Ok(Self {
            inner: Arc::from(inner),
            requests: Requests::default(),
        })
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for CountingStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        self.requests.count(RequestKind::Head, 1);
        self.inner.exists(path).await
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        self.requests.count(RequestKind::Head, 1);
        self.inner.metadata(path).await
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        self.requests.count(RequestKind::Get, 1);
        self.inner.read(path).await
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        Ok(Box::new(CountingRead {
            inner: self.inner.reader(path).await?,
            requests: self.requests.clone(),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        self.requests.count(RequestKind::Put, 1);
        self.inner.write(path, bs).await
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        Ok(Box::new(CountingWrite {
            inner: self.inner.writer(path).await?,
            requests: self.requests.clone(),
        }))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        self.requests.count(RequestKind::Delete, 1);
        self.inner.delete(path).await
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        self.requests.count(RequestKind::List, 1);
        self.requests.count(RequestKind::Delete, 1);
        self.inner.delete_prefix(path).await
    }

    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        let requests = self.requests.clone();
        let counted = paths
            .inspect(move |_| requests.count(RequestKind::Delete, 1))
            .boxed();
        self.inner.delete_stream(counted).await
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// One GET per ranged read.
struct CountingRead {
    inner: Box<dyn FileRead>,
    requests: Requests,
}

#[async_trait]
impl FileRead for CountingRead {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        self.requests.count(RequestKind::Get, 1);
        self.inner.read(range).await
    }
}

/// One PUT per written file, counted when it is closed.
struct CountingWrite {
    inner: Box<dyn FileWrite>,
    requests: Requests,
}

#[async_trait]
impl FileWrite for CountingWrite {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        self.inner.write(bs).await
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        self.requests.count(RequestKind::Put, 1);
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meter_records_what_came_after_its_mark() {
        let r = Requests::new();
        r.count(RequestKind::Get, 5);
        let m = Meter::start("ingest", 1024, Some(&r));
        r.count(RequestKind::Get, 2);
        r.count(RequestKind::Put, 3);
        let u = m.usage();
        assert_eq!(u.function, "ingest");
        assert_eq!(u.memory_mb, 1024);
        assert_eq!(
            u.s3,
            Some(S3Requests {
                get: 2,
                put: 3,
                ..Default::default()
            })
        );
        m.mark();
        r.count(RequestKind::List, 1);
        assert_eq!(
            m.usage().s3,
            Some(S3Requests {
                list: 1,
                ..Default::default()
            })
        );
        // A batch's commit carries its members' usage.
        let carried = Usage {
            function: "ingest".into(),
            compute_ms: 700,
            memory_mb: 1024,
            s3: Some(S3Requests {
                get: 4,
                ..Default::default()
            }),
        };
        let c = m.carrying(carried);
        r.count(RequestKind::Put, 1);
        let u = c.usage();
        assert!(u.compute_ms >= 700);
        assert_eq!(u.s3.map(|s| (s.get, s.put)), Some((4, 1)));
        // Without counters: time only.
        assert_eq!(Meter::start("process", 2048, None).usage().s3, None);
    }

    /// Two scoped meters run side by side on one component's counters: each counts the requests
    /// of its own future only; the component counts them all, and an enclosing scope both.
    #[tokio::test]
    async fn scoped_meters_count_only_their_own_work() {
        let r = Requests::new();
        let component = Meter::start("ingest", 1024, Some(&r));
        let (a, b) = (
            component.scoped_carrying(Usage::default()),
            component.scoped_carrying(Usage::default()),
        );
        let work = |kind: RequestKind, n: u64| {
            let r = r.clone();
            async move {
                for _ in 0..n {
                    r.count(kind, 1);
                    tokio::task::yield_now().await;
                }
            }
        };
        let outer = component.scoped_carrying(Usage::default());
        outer
            .run(async {
                futures::future::join(
                    a.run(work(RequestKind::Get, 3)),
                    b.run(work(RequestKind::Put, 2)),
                )
                .await
            })
            .await;
        r.count(RequestKind::List, 1); // outside every scope
        let s3 = |m: &Meter| m.usage().s3.map(|s| (s.get, s.put, s.list));
        assert_eq!(s3(&a), Some((3, 0, 0)));
        assert_eq!(s3(&b), Some((0, 2, 0)));
        assert_eq!(s3(&outer), Some((3, 2, 0)));
        assert_eq!(s3(&component), Some((3, 2, 1)));
        // Without counters: time only, and the work still runs.
        let none = Meter::start("ingest", 1024, None).scoped_carrying(Usage::default());
        assert_eq!(none.run(async { 7 }).await, 7);
        assert_eq!(none.usage().s3, None);
    }

    #[tokio::test]
    async fn file_io_requests_are_counted_by_kind() {
        let dir = std::env::temp_dir().join(format!("floe-requests-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let requests = Requests::new();
        let factory = CountingStorageFactory::new(
            Box::new(iceberg_storage_opendal::OpenDalResolvingStorageFactory::new()),
            requests.clone(),
        );
        let io = iceberg::io::FileIOBuilder::new(Arc::new(factory)).build();
        let path = format!("file://{}/a.bin", dir.display());
        io.new_output(&path)
            .expect("output")
            .write(Bytes::from_static(b"0123456789"))
            .await
            .expect("write");
        let input = io.new_input(&path).expect("input");
        assert!(input.exists().await.expect("exists"));
        assert_eq!(input.read().await.expect("read").len(), 10);
        let reader = input.reader().await.expect("reader");
        reader.read(0..4).await.expect("range");
        reader.read(4..8).await.expect("range");
        io.delete(&path).await.expect("delete");
        let got = requests.snapshot();
        assert_eq!(
            got,
            S3Requests {
                get: 3,
                put: 1,
                list: 0,
                head: 1,
                delete: 1
            },
            "{got:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
