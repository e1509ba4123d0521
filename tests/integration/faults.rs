//! The one fault-injection layer every test uses: the catalog pointer swap (crashes around the
//! swap, lost answers, answers that come back as conflicts, N conflicts) and catalog loads.
//! Network-level faults (throttling, 5xx, resets, lost S3/Glue answers) are injected below floe
//! by `infra/fault_proxy.py` (see the chaos test).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use floe::catalog::PointerSwap;
use floe::snapshot::Staged;
use floe::{Error, ErrorKind};
use iceberg::table::Table;
use iceberg::{Catalog, TableIdent};

/// Where the injected failure happens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fault {
    /// Data files and manifests are written; the process dies before table metadata is written.
    BeforeMetadata,
    /// The new metadata.json is written; the process dies before swapping the catalog pointer.
    AfterMetadata,
    /// The commit lands; the process dies before the event is acknowledged (non-retryable error).
    AfterCommit,
    /// The commit lands but the answer is lost (a retryable error): floe's own retry re-validates.
    LostAnswer,
    /// The commit lands and the answer is a conflict: what an SDK-level retry of a swap that took
    /// effect sees (Glue: ConcurrentModificationException on the retried UpdateTable).
    LostAnswerAsConflict,
    /// The request times out before it reaches the catalog (retryable, nothing landed).
    TimeoutBefore,
    /// The first two commits meet a conflict.
    Conflicts,
}

impl Fault {
    /// Every fault, for the matrix.
    pub(crate) const ALL: [Fault; 7] = [
        Fault::BeforeMetadata,
        Fault::AfterMetadata,
        Fault::AfterCommit,
        Fault::LostAnswer,
        Fault::LostAnswerAsConflict,
        Fault::TimeoutBefore,
        Fault::Conflicts,
    ];

    /// Whether the faulty run ends in an error (a crash) that a redelivery/re-run must repair.
    pub(crate) fn crashes(self) -> bool {
        matches!(
            self,
            Fault::BeforeMetadata | Fault::AfterMetadata | Fault::AfterCommit
        )
    }
}

#[derive(Debug)]
struct Inject {
    fault: Fault,
    calls: AtomicU32,
    inner: Arc<dyn PointerSwap>,
    /// Only commits to this table meet the fault (None: every table's).
    only: Option<String>,
}

fn crash() -> Error {
    Error::new(ErrorKind::Internal, "injected crash")
}

#[async_trait::async_trait]
impl PointerSwap for Inject {
    async fn current(&self, ident: &TableIdent) -> floe::Result<Option<String>> {
        self.inner.current(ident).await
    }

    fn writes_metadata(&self) -> bool {
        self.inner.writes_metadata()
    }

    async fn swap(
        &self,
        ident: &TableIdent,
        staged: &Staged,
    ) -> floe::Result<floe::catalog::Swapped> {
        if self.only.as_deref().is_some_and(|t| t != ident.name()) {
            return self.inner.swap(ident, staged).await;
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        match self.fault {
            Fault::BeforeMetadata => {
                // As if the process died before writing metadata.json (REST never writes one).
                if let Some((bucket, key)) =
                    staged.location.trim_start_matches("s3://").split_once('/')
                {
                    let _ = crate::harness::s3()
                        .await
                        .delete_object()
                        .bucket(bucket)
                        .key(key)
                        .send()
                        .await;
                }
                Err(crash())
            }
            Fault::AfterMetadata => Err(crash()),
            Fault::AfterCommit => {
                self.inner.swap(ident, staged).await?;
                Err(crash())
            }
            Fault::LostAnswer => {
                self.inner.swap(ident, staged).await?;
                Err(Error::new(ErrorKind::Catalog, "injected: response lost").with_retryable(true))
            }
            Fault::LostAnswerAsConflict => {
                self.inner.swap(ident, staged).await?;
                Err(floe::snapshot::conflict(
                    "injected: the retried swap found its own version",
                ))
            }
            Fault::TimeoutBefore if n < 2 => {
                Err(Error::new(ErrorKind::Catalog, "injected: timeout").with_retryable(true))
            }
            Fault::Conflicts if n < 2 => Err(floe::snapshot::conflict("injected conflict")),
            Fault::TimeoutBefore | Fault::Conflicts => self.inner.swap(ident, staged).await,
        }
    }
}

/// Wraps a pointer swap with `fault`.
pub(crate) fn faulty(fault: Fault) -> impl FnOnce(Arc<dyn PointerSwap>) -> Arc<dyn PointerSwap> {
    move |inner| {
        Arc::new(Inject {
            fault,
            calls: AtomicU32::new(0),
            inner,
            only: None,
        })
    }
}

/// Like [`faulty`], for the commits of one table only (e.g. a latest pipeline's sink, whose
/// tombstone commit before it then lands).
pub(crate) fn faulty_on(
    table: &str,
    fault: Fault,
) -> impl FnOnce(Arc<dyn PointerSwap>) -> Arc<dyn PointerSwap> {
    let table = table.to_string();
    move |inner| {
        Arc::new(Inject {
            fault,
            calls: AtomicU32::new(0),
            inner,
            only: Some(table),
        })
    }
}

/// Catalog loads of one table fail (as a throttled or unreachable catalog answers) until
/// `failures` loads have failed.
#[derive(Debug)]
pub(crate) struct FailingLoads {
    pub(crate) table: String,
    pub(crate) failures: AtomicU32,
}

#[async_trait::async_trait]
impl floe::catalog::UpdateHook for FailingLoads {
    async fn load_table(&self, inner: &dyn Catalog, ident: &TableIdent) -> iceberg::Result<Table> {
        if ident.name() == self.table
            && self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "injected: ThrottlingException: Rate exceeded",
            ));
        }
        inner.load_table(ident).await
    }
}

/// Every file that any retained snapshot references exists: manifest lists, manifests and live
/// data files. Returns how many files were checked.
pub(crate) async fn assert_referenced_files_exist(table: &Table, context: &str) -> usize {
    let md = table.metadata();
    let io = table.file_io();
    let mut seen = std::collections::HashSet::new();
    let mut missing = Vec::new();
    for s in md.snapshots() {
        if seen.insert(s.manifest_list().to_string())
            && !io.exists(s.manifest_list()).await.unwrap_or(false)
        {
            missing.push(s.manifest_list().to_string());
            continue;
        }
        let Ok(list) = table.manifest_list_reader(s).load().await else {
            missing.push(format!("(unreadable) {}", s.manifest_list()));
            continue;
        };
        for mf in list.entries() {
            if !seen.insert(mf.manifest_path.clone()) {
                continue;
            }
            let Ok(m) = mf.load_manifest(io).await else {
                missing.push(mf.manifest_path.clone());
                continue;
            };
            for e in m.entries().iter().filter(|e| e.is_alive()) {
                let p = e.data_file().file_path().to_string();
                if seen.insert(p.clone()) && !io.exists(&p).await.unwrap_or(false) {
                    missing.push(p);
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{context}: referenced files missing: {missing:?}"
    );
    seen.len()
}

/// Something another writer does while a commit is in flight (e.g. another delivery of one of
/// its objects committing): run once, just before the first swap, which then meets the real
/// conflict the catalog's compare-and-swap reports.
pub(crate) type Race = Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send>;

struct RaceBeforeSwap {
    races: std::sync::Mutex<std::collections::VecDeque<Race>>,
    inner: Arc<dyn PointerSwap>,
}

impl std::fmt::Debug for RaceBeforeSwap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RaceBeforeSwap")
    }
}

#[async_trait::async_trait]
impl PointerSwap for RaceBeforeSwap {
    async fn current(&self, ident: &TableIdent) -> floe::Result<Option<String>> {
        self.inner.current(ident).await
    }

    fn writes_metadata(&self) -> bool {
        self.inner.writes_metadata()
    }

    async fn swap(
        &self,
        ident: &TableIdent,
        staged: &Staged,
    ) -> floe::Result<floe::catalog::Swapped> {
        let race = self.races.lock().ok().and_then(|mut r| r.pop_front());
        if let Some(race) = race {
            race().await;
        }
        self.inner.swap(ident, staged).await
    }
}

/// Wraps a pointer swap so that `race` runs just before the first swap.
pub(crate) fn race_before_swap(
    race: Race,
) -> impl FnOnce(Arc<dyn PointerSwap>) -> Arc<dyn PointerSwap> {
    race_before_swaps(vec![race])
}

/// Wraps a pointer swap so that the `n`th of `races` runs just before the `n`th swap.
pub(crate) fn race_before_swaps(
    races: Vec<Race>,
) -> impl FnOnce(Arc<dyn PointerSwap>) -> Arc<dyn PointerSwap> {
    move |inner| {
        Arc::new(RaceBeforeSwap {
            races: std::sync::Mutex::new(races.into()),
            inner,
        })
    }
}

/// The catalog goes dark right after a commit lands with its answer lost: pointer reads fail
/// and only `loads_left` more table loads succeed (enough for the commit loop to see that its
/// commit landed, not for anything after).
#[derive(Debug, Default)]
pub(crate) struct Blackout {
    armed: std::sync::atomic::AtomicBool,
    loads_left: AtomicU32,
}

#[derive(Debug)]
struct LostThenDark {
    blackout: Arc<Blackout>,
    loads: u32,
    inner: Arc<dyn PointerSwap>,
}

#[async_trait::async_trait]
impl PointerSwap for LostThenDark {
    async fn current(&self, ident: &TableIdent) -> floe::Result<Option<String>> {
        if self.blackout.armed.load(Ordering::SeqCst) {
            return Err(
                Error::new(ErrorKind::Catalog, "injected: catalog unreachable")
                    .with_retryable(true),
            );
        }
        self.inner.current(ident).await
    }

    fn writes_metadata(&self) -> bool {
        self.inner.writes_metadata()
    }

    async fn swap(
        &self,
        ident: &TableIdent,
        staged: &Staged,
    ) -> floe::Result<floe::catalog::Swapped> {
        self.inner.swap(ident, staged).await?;
        self.blackout.loads_left.store(self.loads, Ordering::SeqCst);
        self.blackout.armed.store(true, Ordering::SeqCst);
        Err(Error::new(ErrorKind::Catalog, "injected: response lost").with_retryable(true))
    }
}

/// Wraps a pointer swap: its first swap lands, the answer is lost, then `blackout` darkens the
/// catalog after `loads` more loads (pair with [`BlackoutLoads`] on the catalog).
pub(crate) fn lost_answer_then_dark(
    blackout: Arc<Blackout>,
    loads: u32,
) -> impl FnOnce(Arc<dyn PointerSwap>) -> Arc<dyn PointerSwap> {
    move |inner| {
        Arc::new(LostThenDark {
            blackout,
            loads,
            inner,
        })
    }
}

/// The catalog side of a [`Blackout`]: table loads fail once it is armed and spent.
#[derive(Debug)]
pub(crate) struct BlackoutLoads(pub(crate) Arc<Blackout>);

#[async_trait::async_trait]
impl floe::catalog::UpdateHook for BlackoutLoads {
    async fn load_table(&self, inner: &dyn Catalog, ident: &TableIdent) -> iceberg::Result<Table> {
        let b = &self.0;
        if b.armed.load(Ordering::SeqCst)
            && b.loads_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_err()
        {
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "injected: catalog unreachable",
            ));
        }
        inner.load_table(ident).await
    }
}

/// Something another writer does before the first swap of each commit (a swap that follows a
/// successful one): it lands once per commit, so the commit's first attempt meets a real
/// conflict and its retry none.
pub(crate) type EachRace = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

struct RaceBeforeEachCommit {
    race: EachRace,
    armed: std::sync::atomic::AtomicBool,
    inner: Arc<dyn PointerSwap>,
}

impl std::fmt::Debug for RaceBeforeEachCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RaceBeforeEachCommit")
    }
}

#[async_trait::async_trait]
impl PointerSwap for RaceBeforeEachCommit {
    async fn current(&self, ident: &TableIdent) -> floe::Result<Option<String>> {
        self.inner.current(ident).await
    }

    fn writes_metadata(&self) -> bool {
        self.inner.writes_metadata()
    }

    async fn swap(
        &self,
        ident: &TableIdent,
        staged: &Staged,
    ) -> floe::Result<floe::catalog::Swapped> {
        if self.armed.swap(false, Ordering::SeqCst) {
            (self.race)().await;
        }
        let result = self.inner.swap(ident, staged).await;
        if result.is_ok() {
            self.armed.store(true, Ordering::SeqCst);
        }
        result
    }
}

/// Wraps a pointer swap so that `race` runs before the first swap of every commit.
pub(crate) fn race_before_each_commit(
    race: EachRace,
) -> impl FnOnce(Arc<dyn PointerSwap>) -> Arc<dyn PointerSwap> {
    move |inner| {
        Arc::new(RaceBeforeEachCommit {
            race,
            armed: std::sync::atomic::AtomicBool::new(true),
            inner,
        })
    }
}
