//! floe's integration tests: real S3 protocol (moto_server on 127.0.0.1), real catalogs (SQLite
//! file, Glue through moto with VersionId enforced), PyIceberg as an independent reader.
//!
//! Run through `bash infra/test.sh` (the README's test command), which installs moto and PyIceberg
//! into `target/venv` and starts the server; run alone, the harness starts a server itself.

mod backfill;
mod baseline;
mod batch;
mod cdc;
mod chain;
mod chaos;
mod compare;
mod consumers;
mod evolution;
mod exactly_once;
mod faults;
mod glue;
mod harness;
mod ingest_faults;
mod ingest_flow;
mod joins;
mod latest;
mod limits;
mod maintain;
mod matrix;
mod planning;
mod process;
mod quality;
mod refresh;
mod replay;
mod rest;
mod retract;
mod second_pipeline;
mod template;

pub use maintain::only as maintain_opts;
