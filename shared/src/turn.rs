//! Taking turns on a busy table: a writer that keeps losing its commit races asks the table's
//! other writers to let it through.
//!
//! Two writers of one busy table do not lose races alike. The one that just won stages its next
//! commit on the version it wrote (cached: no load), while the loser must first read the version
//! that beat it, so the loser's window between its pointer read and its swap is the longer one,
//! and the winner's next commit lands inside it again and again: in the freshness benchmark
//! (10 objects/s, two ingest writers), a writer that had lost twice lost its next attempt ~85 %
//! of the time, and streaks of 10–19 lost races made the tail of the ingest leg.
//!
//! So after [`ASK_AFTER_LOST`] lost races in a row a writer writes a small marker beside the
//! table's metadata (`metadata/floe-commit-turn.json`: the id of its commit call and a deadline
//! [`TURN`] ahead), at most [`MAX_ASKS`] times per commit, right before its next attempt, and
//! renews it right before that attempt's swap (the deadline then covers the swap however long
//! the load and the staging took). A
//! writer that has lately seen others commit to the table reads the marker before each attempt
//! (beside its pointer read): when another commit has asked and the deadline has not passed, it
//! waits until the pointer moves (that commit landed), the ask is withdrawn or replaced, or the
//! deadline passes, then goes on. The one that asked withdraws its ask when its commit is done,
//! whatever the outcome. Catalogs whose commits floe does not write (REST) do not take turns:
//! there a pointer read is a whole table load.
//!
//! The marker is advice, never a lock: every commit is still a compare-and-swap of the catalog
//! pointer and validated on the version it lands on. A lost or failed marker write, read or
//! delete changes who waits, never what lands; a writer that crashes leaves a marker that lapses
//! at its deadline (and which orphan cleanup removes once old). The marker is the one file floe
//! rewrites in place, so the file cache passes it through.

use std::time::{Duration, Instant};

use iceberg::table::Table;
use serde::{Deserialize, Serialize};

use crate::catalog::PointerSwap;

/// Lost races in a row after which a writer asks for its turn.
pub(crate) const ASK_AFTER_LOST: u32 = 2;

/// Asks one commit makes at most: a writer still losing after that is losing to writers that
/// do not take turns (another engine, a writer that has not seen it commit), and holding the
/// others back would only slow them.
pub(crate) const MAX_ASKS: u32 = 3;

/// How long an ask holds the other writers at most (a few of the loser's windows).
pub(crate) const TURN: Duration = Duration::from_millis(1000);

/// Clock skew between writers tolerated in an ask's deadline; an ask further ahead is ignored.
const SKEW: Duration = Duration::from_secs(5);

/// How often a waiting writer reads the pointer and the marker.
const POLL: Duration = Duration::from_millis(25);

const NAME: &str = crate::file_cache::REWRITTEN_IN_PLACE;

fn marker(table: &Table) -> String {
    format!(
        "{}/metadata/{NAME}",
        table.metadata().location().trim_end_matches('/')
    )
}

/// An ask: the commit that asked (one id per commit call) and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ask {
    writer: String,
    until_ms: i64,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn read(table: &Table) -> Option<Ask> {
    let input = table.file_io().new_input(marker(table)).ok()?;
    let bytes = input.read().await.ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Asks the other writers of `table` to let the commit `writer` through, for [`TURN`].
pub(crate) async fn ask(table: &Table, writer: &str) {
    let ask = Ask {
        writer: writer.to_string(),
        until_ms: now_ms().saturating_add(TURN.as_millis() as i64),
    };
    let Ok(bytes) = serde_json::to_vec(&ask) else {
        return;
    };
    let written = match table.file_io().new_output(marker(table)) {
        Ok(out) => out.write(bytes.into()).await,
        Err(e) => Err(e),
    };
    match written {
        Ok(()) => tracing::debug!(table = %table.identifier(), writer, "asked for a turn"),
        Err(e) => {
            tracing::debug!(table = %table.identifier(), error = %e, "could not ask for a turn")
        }
    }
}

/// Withdraws `writer`'s ask on `table`, if the marker is still its own (another writer's later
/// ask stays).
pub(crate) async fn release(table: &Table, writer: &str) {
    if read(table).await.is_some_and(|a| a.writer != writer) {
        return;
    }
    if let Err(e) = table.file_io().delete(marker(table)).await {
        tracing::debug!(table = %table.identifier(), writer, error = %e, "could not withdraw an ask");
    }
}

/// Another commit's ask than `writer`'s on `table` that has not lapsed, and how long it may
/// still hold this one (never more than [`TURN`]; an ask dated further ahead than the clock
/// skew allows is ignored).
pub(crate) async fn asked_by_another(table: &Table, writer: &str) -> Option<(Ask, Duration)> {
    let ask = read(table).await?;
    let left = holds(&ask, writer, now_ms())?;
    Some((ask, left))
}

/// How long `ask` may hold the commit `writer` at `now_ms`: never its own, never past its
/// deadline, never more than [`TURN`]; an ask dated further ahead than the skew allows (a
/// clock far off, a marker not written by floe) holds no one.
fn holds(ask: &Ask, writer: &str, now_ms: i64) -> Option<Duration> {
    let left = ask.until_ms.saturating_sub(now_ms);
    let sane = left > 0 && left <= (TURN + SKEW).as_millis() as i64;
    (ask.writer != writer && sane).then(|| Duration::from_millis(left as u64).min(TURN))
}

/// Waits, at most `left`, while the pointer of `table` still names `location` and `ask` is
/// still the table's ask (withdrawn or replaced, it no longer holds this writer). Returns how
/// long it waited.
pub(crate) async fn wait_for_move(
    swap: &dyn PointerSwap,
    table: &Table,
    location: Option<&str>,
    ask: &Ask,
    left: Duration,
) -> Duration {
    let t0 = Instant::now();
    while t0.elapsed() < left {
        tokio::time::sleep(POLL).await;
        let (current, marker) = tokio::join!(swap.current(table.identifier()), read(table));
        let moved = !matches!(current, Ok(c) if c.as_deref() == location);
        if moved || marker.as_ref() != Some(ask) {
            break;
        }
    }
    t0.elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(writer: &str, until_ms: i64) -> Ask {
        Ask {
            writer: writer.into(),
            until_ms,
        }
    }

    #[test]
    fn an_ask_holds_other_writers_until_its_deadline_and_never_longer_than_a_turn() {
        let now = 1_800_000_000_000;
        assert_eq!(
            holds(&ask("a", now + 400), "b", now),
            Some(Duration::from_millis(400))
        );
        assert_eq!(holds(&ask("a", now + 400), "a", now), None, "its own");
        assert_eq!(holds(&ask("a", now), "b", now), None, "lapsed");
        // A clock a few seconds ahead still counts, for one turn at most.
        assert_eq!(holds(&ask("a", now + 3_000), "b", now), Some(TURN));
        // Review helper-41: a deadline far off or out of range held every writer (or panicked
        // on the subtraction in debug builds).
        assert_eq!(holds(&ask("a", now + 60_000), "b", now), None);
        assert_eq!(holds(&ask("a", i64::MAX), "b", now), None);
        assert_eq!(holds(&ask("a", i64::MIN), "b", i64::MAX), None);
        assert_eq!(holds(&ask("a", i64::MAX), "b", i64::MIN), None);
    }
}
