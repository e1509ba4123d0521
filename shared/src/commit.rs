//! The commit path: every floe change to a table becomes a new table version here, through one loop.
//!
//! Each attempt loads the table, asks the caller's `plan` what to do *given that version* (this is
//! where exactly-once and liveness checks run), stages the change on that version
//! ([`crate::snapshot::stage`]) and installs it with a compare-and-swap of the catalog pointer
//! ([`crate::catalog::PointerSwap`]). A conflict means someone committed in between: back off and start again from
//! a fresh load, so the plan is re-validated against every snapshot that landed meanwhile.
//!
//! The swap is catalog-specific (one file per backend under [`crate::catalog`]): SQLite and Glue move the metadata pointer by
//! compare-and-swap; REST sends the same change as updates with an `assert-ref-snapshot-id`
//! requirement to the commit endpoint.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{Catalog, TableIdent};
use serde::{Deserialize, Serialize};

use crate::catalog::PointerSwap;
use crate::error::{Error, ErrorKind, Result};
use crate::requests::{Meter, Requests};
use crate::snapshot::{self, Change};

/// Lost races a commit may meet per allowed failed attempt ([`CommitLimits::max_attempts`]).
/// The loser of a steady race loses each attempt with probability 1 − e^(−rate × its window):
/// ~0.7 for the two ingest writers of one table at 10 objects/s, so 100 lost races in a row
/// (20 × 5) is out of reach while 20 was not.
pub const LOST_RACES_PER_ATTEMPT: u32 = 5;

/// Where an object's rows were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The snapshot that added them.
    pub snapshot_id: i64,
    /// The write attempt that committed them.
    pub writer_id: Option<String>,
}

/// A consumed source object's identity: bucket, key and the version that was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceObject {
    /// Bucket.
    pub bucket: String,
    /// Key.
    pub key: String,
    /// ETag of the version read (or the version id on versioned buckets).
    pub version: String,
    /// The object's LastModified (epoch ms): no commit of it can be older (bounds the search).
    #[serde(skip)]
    pub modified_ms: i64,
}

impl SourceObject {
    /// `s3://bucket/key#version`: the string recorded in snapshot summaries.
    pub fn id(&self) -> String {
        format!("s3://{}/{}#{}", self.bucket, self.key, self.version)
    }
}

/// `plan` with every change it applies metered by `meter`: the snapshot of the attempt that
/// lands records the usage up to its staging (failed attempts' work included).
pub fn metered<F>(meter: Meter, mut plan: F) -> impl FnMut(&Table) -> Result<Plan> + Send
where
    F: FnMut(&Table) -> Result<Plan> + Send,
{
    move |t: &Table| {
        let mut p = plan(t)?;
        if let Plan::Apply(change) = &mut p {
            change.meter = Some(meter.clone());
        }
        Ok(p)
    }
}

/// Bounds on one commit.
#[derive(Debug, Clone)]
pub struct CommitLimits {
    /// Most attempts that failed for another reason than a lost race; lost races (each another
    /// writer's commit landing) are bounded by [`LOST_RACES_PER_ATTEMPT`] times this.
    pub max_attempts: u32,
    /// Give up (retryable) after this instant.
    pub deadline: Instant,
    /// Clock skew tolerated when bounding the duplicate search.
    pub skew: Duration,
}

/// What the caller wants done on a given table version.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one short-lived value per commit attempt
pub enum Plan {
    /// Nothing to do (already done, or no longer applicable); the value says why.
    Skip(Skipped),
    /// Apply this change.
    Apply(Change),
}

/// Why a plan skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// The source object is already in the table.
    AlreadyCommitted(Found),
    /// The work no longer applies (e.g. files to compact were replaced meanwhile).
    Obsolete(String),
}

/// What a commit did.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// This call installed a new version.
    Committed {
        /// The new snapshot (if the change made one).
        snapshot_id: Option<i64>,
        /// Attempts needed (1 = no conflict).
        attempts: u32,
        /// The new metadata location.
        location: String,
        /// The version the change was applied on, when known ([`crate::catalog::Swapped`]):
        /// the planned-on base for a compare-and-swap; on REST the server's previous version,
        /// which another writer's commit may have replaced meanwhile; `None` for an earlier
        /// attempt whose answer was lost, found landed on REST.
        applied_on: Option<String>,
    },
    /// The plan said there was nothing to do.
    Skipped(Skipped),
}

/// Installs changes: the catalog, plus the pointer swap for hand-built versions.
#[derive(Debug, Clone)]
pub struct Committer {
    catalog: Arc<dyn Catalog>,
    swap: Arc<dyn PointerSwap>,
    /// Last known version per table: reused while the catalog pointer still names it, so a warm
    /// function does not re-read and re-parse metadata it wrote itself.
    cache: Arc<std::sync::Mutex<HashMap<TableIdent, Table>>>,
    /// The counters the catalog's FileIO counts on, when it was connected counting.
    requests: Option<Requests>,
    /// When another writer last committed to each table under this one's feet (a pointer found
    /// moved, a race lost): such a table's turn marker is read before each attempt.
    contended: Arc<std::sync::Mutex<HashMap<TableIdent, Instant>>>,
}

/// How long after another writer's commit was last seen a table's turn marker is still read.
const CONTENDED_FOR: Duration = Duration::from_secs(60);

impl Committer {
    /// A committer over `catalog`, installing versions with `swap`.
    pub fn new(catalog: Arc<dyn Catalog>, swap: Arc<dyn PointerSwap>) -> Self {
        Self {
            catalog,
            swap,
            cache: Arc::default(),
            requests: None,
            contended: Arc::default(),
        }
    }

    /// Names the counters `catalog` was connected with ([`crate::catalog::connect_counted`]):
    /// the usage of the work committed through this committer includes them.
    pub fn with_requests(mut self, requests: Requests) -> Self {
        self.requests = Some(requests);
        self
    }

    /// The request counters of this committer's catalog, if it counts.
    pub fn requests(&self) -> Option<&Requests> {
        self.requests.as_ref()
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// The table's current version: the cached one if the catalog pointer still names it (one
    /// cheap pointer read); else, when this process writes the metadata, the version the pointer
    /// names, read directly (no second catalog call); else a full load through the catalog.
    pub async fn load(&self, ident: &TableIdent) -> Result<Table> {
        if let Some(cached) = self.cached(ident) {
            if let Ok(Some(current)) = self.swap.current(ident).await {
                if cached.metadata_location() == Some(current.as_str()) {
                    return Ok(cached);
                }
                self.saw_another_writer(ident);
                if self.swap.writes_metadata() {
                    match read_version(&cached, &current).await {
                        Ok(table) => {
                            self.remember(&table);
                            return Ok(table);
                        }
                        Err(e) => {
                            tracing::debug!(table = %ident, error = %e, "reading the current version directly failed: loading it through the catalog")
                        }
                    }
                }
            }
        }
        let table = self
            .catalog
            .load_table(ident)
            .await
            .map_err(|e| Error::iceberg(format!("loading {ident}"), e).with_retryable(true))?;
        self.remember(&table);
        Ok(table)
    }

    /// The last version of `ident` this committer knew.
    fn cached(&self, ident: &TableIdent) -> Option<Table> {
        self.cache.lock().ok().and_then(|c| c.get(ident).cloned())
    }

    fn saw_another_writer(&self, ident: &TableIdent) {
        if let Ok(mut c) = self.contended.lock() {
            c.insert(ident.clone(), Instant::now());
        }
    }

    /// The cached version of `ident` when another writer committed to it lately.
    fn contended(&self, ident: &TableIdent) -> Option<Table> {
        if !self.swap.writes_metadata() {
            return None;
        }
        let recent = self
            .contended
            .lock()
            .ok()
            .and_then(|c| c.get(ident).copied())
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR);
        if !recent {
            return None;
        }
        self.cached(ident)
    }

    /// `base` (a version the caller loaded) or a fresh [`Committer::load`], for the commit `me`,
    /// first letting through another commit to a contended table that asked for its turn
    /// ([`crate::turn`]): the marker is read (beside the load, when there is one); when another
    /// commit asked, this one waits for the pointer to move (at most the ask's deadline) and
    /// loads again.
    async fn taking_turns(
        &self,
        ident: &TableIdent,
        base: Option<Table>,
        me: &str,
    ) -> Result<Table> {
        let Some(cached) = self.contended(ident) else {
            return match base {
                Some(t) => Ok(t),
                None => self.load(ident).await,
            };
        };
        let (asked, table) = match base {
            Some(t) => (crate::turn::asked_by_another(&t, me).await, t),
            None => {
                let (asked, table) =
                    tokio::join!(crate::turn::asked_by_another(&cached, me), self.load(ident));
                (asked, table?)
            }
        };
        match asked {
            None => Ok(table),
            Some((ask, left)) => self.let_through(ident, &table, &ask, left).await,
        }
    }

    /// Waits (at most `left`) for the commit that asked for its turn to move the pointer off
    /// `table`'s version, then loads the table.
    async fn let_through(
        &self,
        ident: &TableIdent,
        table: &Table,
        ask: &crate::turn::Ask,
        left: Duration,
    ) -> Result<Table> {
        let waited =
            crate::turn::wait_for_move(&*self.swap, table, table.metadata_location(), ask, left)
                .await;
        tracing::debug!(table = %ident, waited_ms = waited.as_millis() as u64, "let another writer's commit through");
        // The version waited on is still a sound base (the swap decides): a failed load after
        // the wait is no failed attempt.
        Ok(self.load(ident).await.unwrap_or_else(|_| table.clone()))
    }

    fn remember(&self, table: &Table) {
        if let Ok(mut c) = self.cache.lock() {
            c.insert(table.identifier().clone(), table.clone());
        }
    }

    fn remember_staged(&self, base: &Table, staged: &snapshot::Staged) {
        let built = iceberg::Runtime::try_current().and_then(|rt| {
            Table::builder()
                .metadata(staged.metadata.clone())
                .metadata_location(staged.location.clone())
                .identifier(base.identifier().clone())
                .file_io(base.file_io().clone())
                .runtime(rt)
                .build()
        });
        if let Ok(t) = built {
            self.remember(&t);
        }
    }

    /// Runs `plan` against fresh table versions until its change is installed, it skips, or the
    /// limits are reached.
    ///
    /// An attempt whose swap answer was not a clean success or a proven conflict (a timeout, a
    /// 5xx, a reset, a lost answer) is *in flight*: it may have taken effect. Every later attempt
    /// first looks for it in the version it loaded (the pointer, the metadata log, the snapshot
    /// id): found, the commit is done; the pointer moved past its base without it, it can never
    /// land and its staged files may go; otherwise it is still unknown. While an attempt is
    /// unknown the loop never reports `Skipped` or `Stale` (callers delete their files on those):
    /// it reports [`ErrorKind::CommitUnknown`] instead, and callers keep every file.
    pub async fn commit<F>(
        &self,
        ident: &TableIdent,
        limits: &CommitLimits,
        plan: F,
    ) -> Result<Outcome>
    where
        F: FnMut(&Table) -> Result<Plan> + Send,
    {
        self.commit_from(ident, None, limits, plan).await
    }

    /// Like [`Committer::commit`], with the first attempt based on `base` (a version the caller
    /// just loaded) instead of a fresh load.
    pub async fn commit_from<F>(
        &self,
        ident: &TableIdent,
        base: Option<Table>,
        limits: &CommitLimits,
        plan: F,
    ) -> Result<Outcome>
    where
        F: FnMut(&Table) -> Result<Plan> + Send,
    {
        // This commit's id in turn markers: concurrent commits of one process take turns too.
        let mut turn = Turn {
            me: uuid::Uuid::now_v7().to_string(),
            asks: 0,
            asked: None,
        };
        let outcome = self.attempts(ident, base, limits, plan, &mut turn).await;
        if let Some(table) = &turn.asked {
            crate::turn::release(table, &turn.me).await;
        }
        outcome
    }

    /// The attempts of [`Committer::commit_from`], as the commit `turn` ([`crate::turn`]).
    async fn attempts<F>(
        &self,
        ident: &TableIdent,
        mut base: Option<Table>,
        limits: &CommitLimits,
        mut plan: F,
        turn: &mut Turn,
    ) -> Result<Outcome>
    where
        F: FnMut(&Table) -> Result<Plan> + Send,
    {
        let mut attempt = 0u32;
        // Attempts that lost a race (the pointer moved) and those that failed otherwise: each
        // kind of failure has its own pause (see `pause_after`).
        let (mut lost, mut failed) = (0u32, 0u32);
        let mut in_flight: Vec<InFlight> = Vec::new();
        loop {
            attempt += 1;
            let error = match self
                .attempt(ident, base.take(), &mut in_flight, &mut plan, turn)
                .await
            {
                Ok(Step::Committed {
                    snapshot_id,
                    location,
                    applied_on,
                }) => {
                    return Ok(Outcome::Committed {
                        snapshot_id,
                        attempts: attempt,
                        location,
                        applied_on,
                    })
                }
                // A skip is safe to report unless an unknown attempt added a snapshot: callers
                // delete that snapshot's files on a skip. (An unknown expiry, say, adds none:
                // "already expired" is then its own or someone's effect, either way true.)
                Ok(Step::Skipped(why)) if in_flight.iter().all(|f| f.snapshot_id.is_none()) => {
                    return Ok(Outcome::Skipped(why))
                }
                Ok(Step::Skipped(why)) => {
                    return Err(unknown(ident, &in_flight).with_source(Error::new(
                        ErrorKind::Internal,
                        format!("the plan skipped ({why:?}) while an earlier attempt is unknown"),
                    )))
                }
                Err(e) if !e.is_retryable() => {
                    return Err(if in_flight.is_empty() {
                        e
                    } else {
                        unknown(ident, &in_flight).with_source(e)
                    })
                }
                Err(e) => e,
            };
            if error.kind() == ErrorKind::CommitConflict {
                lost += 1;
                self.saw_another_writer(ident);
            } else {
                failed += 1;
            }
            // A lost race is another writer's progress, not a fault: lost races have their own,
            // larger bound. Counted against `max_attempts`, two writers of one busy table starved
            // one of them (each of its attempts reloads the table, the winner's does not, so the
            // loser's window is the longer one and it lost again and again: 20 times at 10
            // objects/s in the freshness benchmark, and its batch went back to the queue). Still
            // bounded: a backend that answers "conflict" without the pointer moving, or a slow
            // writer (compaction) beside a steady stream of appends, must give up in the end.
            if failed >= limits.max_attempts
                || lost >= limits.max_attempts.saturating_mul(LOST_RACES_PER_ATTEMPT)
                || Instant::now() >= limits.deadline
            {
                // One last look: an earlier attempt may have landed after all.
                if !in_flight.is_empty() {
                    if let Ok(table) = self.load(ident).await {
                        let mut garbage = Vec::new();
                        let landed = self.settle(&table, &mut in_flight, &mut garbage);
                        discard(&table, garbage).await;
                        if let Some(landed) = landed {
                            return Ok(landed.committed(attempt, self.swap.writes_metadata()));
                        }
                    }
                }
                if !in_flight.is_empty() {
                    return Err(unknown(ident, &in_flight).with_source(error));
                }
                return Err(Error::new(
                    ErrorKind::DeadlineExceeded,
                    format!("commit to {ident} gave up after {attempt} attempts"),
                )
                .with_retryable(true)
                .with_source(error));
            }
            let pause = pause_after(error.kind(), lost, failed)
                .min(limits.deadline.saturating_duration_since(Instant::now()));
            tracing::info!(table = %ident, attempt, error = %error, in_flight = in_flight.len(), pause_ms = pause.as_millis() as u64, "commit not installed; re-validating");
            tokio::time::sleep(pause).await;
            // Asked right before the attempt it is for (an ask made before a long pause would
            // hold the others for a writer that sleeps).
            if error.kind() == ErrorKind::CommitConflict
                && lost >= crate::turn::ASK_AFTER_LOST
                && turn.asks < crate::turn::MAX_ASKS
                && self.swap.writes_metadata()
            {
                if let Some(table) = self.cached(ident) {
                    crate::turn::ask(&table, &turn.me).await;
                    turn.asks += 1;
                    turn.asked = Some(table);
                }
            }
        }
    }

    /// Looks for every in-flight attempt in `table` (the current version): returns the one that
    /// landed; forgets those that can no longer land, adding the files of the refused ones (which
    /// nothing references) to `garbage`.
    fn settle(
        &self,
        table: &Table,
        in_flight: &mut Vec<InFlight>,
        garbage: &mut Vec<String>,
    ) -> Option<InFlight> {
        let writes_metadata = self.swap.writes_metadata();
        let mut landed = None;
        let mut dead = Vec::new();
        in_flight.retain(|f| match f.fate(table, writes_metadata) {
            Fate::Landed => {
                landed = Some(f.clone());
                false
            }
            Fate::Dead => {
                dead.push(f.clone());
                false
            }
            Fate::Unknown => true,
        });
        if landed.is_some() {
            // Whatever else was in flight was built on a base the landed one replaced.
            in_flight.clear();
            return landed;
        }
        for f in dead.iter().filter(|f| f.refused) {
            // Refused, its base is gone and it is not in the table: nothing references these.
            // (Versions whose answer was lost are left to orphan cleanup: a short metadata log
            // could hide that they landed and were built upon.)
            garbage.extend(f.written.iter().cloned());
        }
        None
    }

    async fn attempt<F>(
        &self,
        ident: &TableIdent,
        base: Option<Table>,
        in_flight: &mut Vec<InFlight>,
        plan: &mut F,
        turn: &Turn,
    ) -> Result<Step>
    where
        F: FnMut(&Table) -> Result<Plan> + Send,
    {
        let t0 = Instant::now();
        let table = self.taking_turns(ident, base, &turn.me).await?;
        // Files of attempts that can no longer land are deleted after this attempt's swap, not
        // before it: the time between the load and the swap is the window another writer's
        // commit makes this attempt lose in, and the loser of a race is the one deleting.
        let mut garbage = Vec::new();
        if let Some(landed) = self.settle(&table, in_flight, &mut garbage) {
            tracing::info!(table = %ident, location = %landed.location, "an earlier attempt whose answer was lost did land");
            return Ok(Step::Committed {
                applied_on: landed.applied_on(self.swap.writes_metadata()),
                snapshot_id: landed.snapshot_id,
                location: landed.location,
            });
        }
        let load_ms = t0.elapsed().as_secs_f64() * 1e3;
        // A commit that asked for its turn renews the ask right before its swap, so the ask
        // holds the others through the swap however long the load and the staging took.
        let asking = turn.asked.is_some().then_some(turn.me.as_str());
        let step = self
            .apply(ident, &table, in_flight, plan, load_ms, asking)
            .await;
        discard(&table, garbage).await;
        step
    }

    /// The rest of an attempt on `table` (loaded in `load_ms`): plan, stage, swap.
    async fn apply<F>(
        &self,
        ident: &TableIdent,
        table: &Table,
        in_flight: &mut Vec<InFlight>,
        plan: &mut F,
        load_ms: f64,
        asking: Option<&str>,
    ) -> Result<Step>
    where
        F: FnMut(&Table) -> Result<Plan> + Send,
    {
        let change = match plan(table)? {
            Plan::Skip(why) => return Ok(Step::Skipped(why)),
            Plan::Apply(change) => change,
        };
        let swap = &self.swap;
        let t1 = Instant::now();
        let staged = snapshot::stage(table, &change, swap.writes_metadata()).await?;
        let stage_ms = t1.elapsed().as_secs_f64() * 1e3;
        if let Some(me) = asking {
            crate::turn::ask(table, me).await;
        }
        let t2 = Instant::now();
        let swapped = swap.swap(ident, &staged).await;
        tracing::debug!(table = %ident, load_ms, stage_ms, swap_ms = t2.elapsed().as_secs_f64() * 1e3, "commit attempt");
        let swapped = match swapped {
            Ok(swapped) => swapped,
            Err(e) => {
                // Even a "conflict" is only believed once the table is seen without this
                // version: an SDK-level retry of a swap that took effect answers with a
                // conflict too.
                in_flight.push(InFlight {
                    refused: e.kind() == ErrorKind::CommitConflict,
                    base_main: table.metadata().current_snapshot_id(),
                    base: staged.previous,
                    location: staged.location,
                    snapshot_id: staged.snapshot_id,
                    written: staged.written,
                });
                return Err(e);
            }
        };
        if swap.writes_metadata() {
            self.remember_staged(table, &staged);
        }
        let props = staged.metadata.properties();
        if props
            .get("write.metadata.delete-after-commit.enabled")
            .map(String::as_str)
            == Some("true")
        {
            for old in &staged.expired_metadata {
                if let Err(e) = table.file_io().delete(old).await {
                    tracing::warn!(file = %old, error = %e, "could not delete old metadata file");
                }
            }
        }
        Ok(Step::Committed {
            snapshot_id: staged.snapshot_id,
            location: swapped.location,
            applied_on: swapped.applied_on,
        })
    }
}

/// The version at `location` (the pointer just read) of the table `cached` is an older version
/// of: its metadata.json read with the table's own storage, as the catalog's load would, and
/// remembered for the metadata fast path (the next version staged on it serializes only what is
/// new; see [`crate::metadata_json`]). A compressed metadata.json is left to the catalog.
async fn read_version(cached: &Table, location: &str) -> Result<Table> {
    let t0 = Instant::now();
    let read = |e| Error::iceberg(format!("reading {location}"), e).with_retryable(true);
    let bytes = cached
        .file_io()
        .new_input(location)
        .map_err(read)?
        .read()
        .await
        .map_err(read)?;
    let get_ms = t0.elapsed().as_secs_f64() * 1e3;
    if bytes.starts_with(&[0x1F, 0x8B]) {
        return Err(Error::new(
            ErrorKind::Internal,
            format!("{location} is compressed"),
        ));
    }
    let whole = || -> Result<TableMetadata> {
        serde_json::from_slice(&bytes).map_err(|e| {
            Error::new(
                ErrorKind::Internal,
                format!("table metadata at {location}: {e}"),
            )
        })
    };
    // Usually the version another writer committed on the one cached: read on it.
    let on_cached = cached
        .metadata_location()
        .and_then(|prior| crate::metadata_json::read_on(cached.metadata(), prior, &bytes));
    let read_on_cached = on_cached.is_some();
    let metadata = match on_cached {
        Some(md) => md,
        None => whole()?,
    };
    // Debug builds (the tests) stop on any difference from the whole parse, which a returned
    // error would hide (the caller falls back to the catalog's load).
    #[cfg(debug_assertions)]
    if read_on_cached {
        let whole = whole();
        assert!(
            whole.as_ref().is_ok_and(|w| *w == metadata),
            "{location} read on the cached version differs from the whole file: {:?}",
            whole.err()
        );
    }
    crate::metadata_json::remember_loaded(location, &metadata, &bytes);
    tracing::debug!(
        get_ms,
        parse_ms = t0.elapsed().as_secs_f64() * 1e3 - get_ms,
        bytes = bytes.len(),
        read_on_cached,
        "read the current version"
    );
    let runtime = iceberg::Runtime::try_current().map_err(|e| Error::iceberg("runtime", e))?;
    Table::builder()
        .file_io(cached.file_io().clone())
        .identifier(cached.identifier().clone())
        .metadata_location(location.to_string())
        .metadata(metadata)
        .runtime(runtime)
        .build()
        .map_err(|e| Error::iceberg(format!("table at {location}"), e))
}

/// One commit's part in a table's turn-taking ([`crate::turn`]).
struct Turn {
    /// The commit's id in turn markers.
    me: String,
    /// Asks made so far (at most [`crate::turn::MAX_ASKS`]).
    asks: u32,
    /// The table it asked on, if it did: the ask is withdrawn when the commit is done.
    asked: Option<Table>,
}

/// What one attempt did (the loop turns it into an [`Outcome`]).
enum Step {
    Committed {
        snapshot_id: Option<i64>,
        location: String,
        applied_on: Option<String>,
    },
    Skipped(Skipped),
}

/// A staged version whose swap was sent without a clean answer: it may have landed.
#[derive(Debug, Clone)]
struct InFlight {
    /// The pointer it replaces; once the pointer has moved past it without this version, this
    /// version can never land (every swap is a compare-and-swap on its base).
    base: String,
    /// Main's snapshot in the base: all a REST server compares (`assert-ref-snapshot-id`), so on
    /// REST a version can land as long as main has not moved, whatever else changed.
    base_main: Option<i64>,
    location: String,
    snapshot_id: Option<i64>,
    written: Vec<String>,
    /// The catalog answered with a conflict (which an SDK-level retry can fake: still settled
    /// by looking before anything is deleted).
    refused: bool,
}

enum Fate {
    Landed,
    Dead,
    Unknown,
}

impl InFlight {
    fn fate(&self, table: &Table, writes_metadata: bool) -> Fate {
        let md = table.metadata();
        let current = table.metadata_location();
        let by_location = writes_metadata
            && (current == Some(self.location.as_str())
                || md
                    .metadata_log()
                    .iter()
                    .any(|l| l.metadata_file == self.location));
        let by_snapshot = self
            .snapshot_id
            .is_some_and(|id| md.snapshot_by_id(id).is_some());
        let moved_on = if writes_metadata {
            // A compare-and-swap on the exact metadata location.
            current != Some(self.base.as_str())
        } else {
            md.current_snapshot_id() != self.base_main
        };
        if by_location || by_snapshot {
            Fate::Landed
        } else if moved_on {
            Fate::Dead
        } else {
            Fate::Unknown
        }
    }

    fn committed(self, attempts: u32, writes_metadata: bool) -> Outcome {
        Outcome::Committed {
            applied_on: self.applied_on(writes_metadata),
            snapshot_id: self.snapshot_id,
            attempts,
            location: self.location,
        }
    }

    /// The version this attempt, found landed, was applied on: its base for a compare-and-swap;
    /// unknown on REST (the server's answer was lost).
    fn applied_on(&self, writes_metadata: bool) -> Option<String> {
        writes_metadata.then(|| self.base.clone())
    }
}

/// The error for a commit whose outcome could not be settled: nothing it wrote may be deleted.
fn unknown(ident: &TableIdent, in_flight: &[InFlight]) -> Error {
    let locations: Vec<&str> = in_flight.iter().map(|f| f.location.as_str()).collect();
    Error::new(
        ErrorKind::CommitUnknown,
        format!(
            "commit to {ident}: outcome unknown (the catalog did not confirm {locations:?} either way); \
             its files are kept and a retry re-validates against what landed"
        ),
    )
    .with_retryable(true)
}

/// Deletes files no table version references (best effort: orphan cleanup finds what is left).
async fn discard(table: &Table, paths: Vec<String>) {
    for path in paths {
        let _ = table.file_io().delete(&path).await;
    }
}

/// The pause before the next attempt, after `lost` attempts that lost a race and `failed` that
/// failed otherwise (`kind`: the last one's).
///
/// A lost race (`CommitConflict`) means another writer's version landed: the catalog is
/// working, and under steady contention (two ingest functions committing several times a second)
/// a pause that kept doubling would make the loser wait seconds while the winner's next commits
/// take every slot. So it stays short: a cap of 10 ms doubling to 160 ms for the first six lost
/// races, enough to spread a few writers' retries, and the next attempt starts from the version
/// that won; only a longer losing streak (a large herd) doubles on to 2 s. Other retryable
/// failures (a timeout, a 5xx, throttling) may mean an overloaded service: a cap of 25 ms
/// doubling to 2 s. The pause is drawn between half the cap and the cap.
fn pause_after(kind: ErrorKind, lost: u32, failed: u32) -> Duration {
    let cap = if kind == ErrorKind::CommitConflict {
        // 10–20 ms for the first ten lost races in a row: the writer that won has just
        // committed and is preparing its next commit, so the loser's best moment is now (longer
        // pauses only let the winner's next commit come first again: streaks of 13–19 lost races
        // and pauses up to 2 s made the 10 objects/s tail). Then doubling to 2 s (a herd of
        // writers too large for short pauses to spread keeps losing: it spreads over longer ones).
        match lost {
            0..=10 => 20,
            _ => 40u64.saturating_mul(1 << (lost - 10).min(6)).min(2000),
        }
    } else {
        25u64.saturating_mul(1 << failed.min(7)).min(2000)
    };
    let r = (uuid::Uuid::new_v4().as_u128() % 1000) as u64;
    Duration::from_millis(cap / 2 + cap * r / 2000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_race_pauses_briefly_however_often_other_failures_back_off_to_seconds() {
        for lost in 1..=6 {
            let p = pause_after(ErrorKind::CommitConflict, lost, 0);
            assert!(p <= Duration::from_millis(160), "lost {lost}: {p:?}");
        }
        // A long losing streak (a herd): longer pauses, at most 2 s.
        let herd = pause_after(ErrorKind::CommitConflict, 16, 0);
        assert!(herd >= Duration::from_millis(1000) && herd <= Duration::from_millis(2000));
        for lost in 1..=10 {
            let p = pause_after(ErrorKind::CommitConflict, lost, 0);
            assert!(p <= Duration::from_millis(20), "lost {lost}: {p:?}");
        }
        // Lost races before do not lengthen the pause after a timeout, nor the reverse.
        assert!(pause_after(ErrorKind::Catalog, 30, 1) <= Duration::from_millis(50));
        let long = pause_after(ErrorKind::Catalog, 0, 10);
        assert!(long >= Duration::from_millis(1000) && long <= Duration::from_millis(2000));
        assert!(pause_after(ErrorKind::CommitConflict, 1, 10) <= Duration::from_millis(20));
    }
}
