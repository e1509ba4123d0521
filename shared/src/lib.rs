//! floe: one transactional Iceberg table on S3 as the system of record for batch and streaming.
//!
//! The library behind the three Lambda functions (ingest, process, maintain) and the `floe` CLI.
//! Modules follow the data's path: [`config`] → [`event`] → [`ingest`] (via [`decode`] and
//! [`commit`]); beside them [`catalog`], [`store`], [`schema`] and [`metrics`].
#![deny(missing_docs)]

pub mod catalog;
pub mod commit;
pub mod config;
pub mod decode;
pub mod dedup;
pub mod error;
pub mod event;
pub mod evolve;
pub mod glue;
pub mod ingest;
pub mod lambda;
pub mod maintain;
pub mod metrics;
pub mod notify;
pub mod pipeline;
pub mod process;
pub mod protect;
pub mod sample;
pub mod schema;
pub mod snapshot;
pub mod store;
pub mod swap;
pub mod transform;
pub mod write;

pub use error::{Error, ErrorKind, Result};
