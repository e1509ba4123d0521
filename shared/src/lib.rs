//! floe: one transactional Iceberg table on S3 as the system of record for batch and streaming.
//!
//! The library behind the three Lambda functions (ingest, process, maintain) and the `floe` CLI.
//! Modules are layered; a module imports only from its own layer or the ones above it in this
//! list (checked by `infra/check_layers.py`, see docs/ARCHITECTURE.md):
//!
//! 1. foundation: [`error`], [`summary`] (every `floe.*` key, checkpoints), [`metrics`], [`sample`]
//! 2. config: [`config`]
//! 3. schema: [`schema`], [`evolve`]
//! 4. io: [`store`], [`requests`] (S3 requests counted, usage metered), [`event`], [`notify`],
//!    [`decode`], [`quality`] (data-quality contracts), [`protect`]
//! 5. table: [`snapshot`], [`catalog`] (one file per backend), [`commit`], [`scan`], [`write`]
//! 6. operations: [`ingest`], [`process`], [`maintain`], [`consumers`], [`schema_diff`],
//!    [`drop_column`], [`compare`], [`baseline`] (freshness, throughput, recovery and cost)
//! 7. edge: [`lambda`]
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod error;
pub(crate) mod metrics;
pub mod sample;
pub mod summary;

pub mod config;

pub mod evolve;
pub mod schema;

pub(crate) mod decode;
pub mod event;
pub(crate) mod notify;
pub mod protect;
pub mod quality;
pub mod requests;
pub mod store;

pub mod catalog;
pub mod commit;
pub(crate) mod file_cache;
pub(crate) mod metadata_json;
pub mod scan;
pub mod snapshot;
pub(crate) mod turn;
pub(crate) mod write;

pub mod baseline;
pub mod compare;
pub mod consumers;
pub mod drop_column;
pub mod ingest;
pub mod maintain;
pub mod process;
pub mod schema_diff;

pub mod lambda;

pub use error::{Error, ErrorKind, Result};
