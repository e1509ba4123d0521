//! The one error type of the library: every failure carries a kind and whether retrying can help.

use std::fmt;

/// What went wrong, coarse enough for a caller to decide what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The configuration is invalid (file, key and reason in the message).
    Config,
    /// A Lambda payload could not be understood.
    Event,
    /// An object could not be read or decoded as a whole (corrupt compression, wrong format, empty).
    UnreadableObject,
    /// Object storage failed (S3 or the local file system).
    Storage,
    /// The object does not exist (deleted after its event was sent).
    NotFound,
    /// The catalog failed (SQLite, Glue, REST).
    Catalog,
    /// Another writer committed first; the commit must be re-validated and retried.
    CommitConflict,
    /// A commit's answer was lost (timeout, 5xx, reset) and the catalog could not confirm whether
    /// it landed: nothing it wrote may be deleted; a retry re-validates against what landed.
    CommitUnknown,
    /// The change no longer applies to the table (e.g. files to replace were replaced meanwhile).
    Stale,
    /// A pipeline's SQL failed or no longer fits its source (the message names the field).
    Transform,
    /// The commit could not finish inside its deadline.
    DeadlineExceeded,
    /// Anything else: a bug or an unexpected state.
    Internal,
    /// An object is no longer the version that was named or read (overwritten since: its ETag
    /// changed). Other content is never read in its place.
    Superseded,
}

/// The library's error: a kind, a message naming what failed, whether a retry can help, and the cause.
#[derive(Debug, thiserror::Error)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    retryable: bool,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind`; permanent unless marked with [`Error::retryable`].
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retryable: matches!(kind, ErrorKind::CommitConflict),
            source: None,
        }
    }

    /// Marks whether a retry of the same work can succeed.
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether a retry of the same work can succeed (throttling, 5xx, conflicts, timeouts).
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// A configuration error naming the file, the key and the reason.
    pub fn config(file: &str, key: &str, reason: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Config, format!("{file}: `{key}`: {reason}"))
    }

    /// Wraps an iceberg error, keeping its retryable flag; an object-store failure iceberg
    /// reports as permanent but that was transient where it happened (see [`transient_io`]) is
    /// retryable.
    pub fn iceberg(context: impl Into<String>, err: iceberg::Error) -> Self {
        let kind = match err.kind() {
            iceberg::ErrorKind::CatalogCommitConflicts => ErrorKind::CommitConflict,
            _ => ErrorKind::Catalog,
        };
        let retryable = err.retryable() || kind == ErrorKind::CommitConflict || transient_io(&err);
        Self::new(kind, context)
            .with_retryable(retryable)
            .with_source(err)
    }
}

/// Whether `err` wraps an object-store error that was transient at its origin. iceberg's
/// file layer turns every opendal error into a non-retryable `Unexpected`, dropping opendal's
/// status. A *temporary* one (a 5xx, a reset, a timeout) is worth a later retry. opendal's
/// retry layer marks every error leaving it *persistent*, retried or not, so a persistent one
/// counts only by its kind: `Unexpected` (what opendal makes of 5xx and transport failures) or
/// `RateLimited` — not `NotFound`, `PermissionDenied`, a bad config and the like.
pub(crate) fn transient_io(err: &iceberg::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = cause {
        if let Some(o) = e.downcast_ref::<opendal::Error>() {
            return o.is_temporary()
                || (o.is_persistent()
                    && matches!(
                        o.kind(),
                        opendal::ErrorKind::Unexpected | opendal::ErrorKind::RateLimited
                    ));
        }
        cause = e.source();
    }
    false
}

impl From<iceberg::Error> for Error {
    fn from(err: iceberg::Error) -> Self {
        Error::iceberg("iceberg", err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An opendal error as iceberg's file layer hands it on (`from_opendal_error`).
    fn through_iceberg(e: opendal::Error) -> iceberg::Error {
        iceberg::Error::new(
            iceberg::ErrorKind::Unexpected,
            "Failure in doing io operation",
        )
        .with_source(e)
    }

    #[test]
    fn an_object_store_failure_transient_where_it_happened_is_retryable_through_iceberg() {
        let failed = || opendal::Error::new(opendal::ErrorKind::Unexpected, "500 InternalError");
        assert!(Error::iceberg("put", through_iceberg(failed().set_temporary())).is_retryable());
        // opendal's retries ran out: still a transient cause.
        let exhausted = failed().set_temporary().set_persistent();
        assert!(Error::iceberg("put", through_iceberg(exhausted)).is_retryable());
        // Not found, denied: permanent, also as opendal's retry layer hands them on (it marks
        // every error persistent, retried or not: review helper-30).
        let missing = || opendal::Error::new(opendal::ErrorKind::NotFound, "404");
        assert!(!Error::iceberg("get", through_iceberg(missing())).is_retryable());
        let passed_retries = missing().set_persistent();
        assert!(!Error::iceberg("get", through_iceberg(passed_retries)).is_retryable());
        let denied = opendal::Error::new(opendal::ErrorKind::PermissionDenied, "403");
        assert!(!Error::iceberg("put", through_iceberg(denied.set_persistent())).is_retryable());
        assert!(!Error::iceberg("get", through_iceberg(failed())).is_retryable());
    }
}
