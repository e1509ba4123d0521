//! The ingest Lambda: S3 object landed (direct, via SQS, or via EventBridge) → exactly-once Iceberg commit.
//!
//! Thin by design: clients are built once per container, each event is handed to
//! [`floe::ingest::Ingestor::handle_payload`], and the result is mapped to the Lambda response
//! (partial batch failures for SQS).

use std::sync::Arc;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    floe::lambda::limit_allocator_retention();
    floe::lambda::init_tracing();
    let config = floe::config::Config::from_env().await?;
    let ingestor = Arc::new(floe::ingest::Ingestor::new(config).await?);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let ingestor = Arc::clone(&ingestor);
        async move {
            let deadline = floe::lambda::deadline_from_epoch_ms(event.context.deadline);
            let result = ingestor.handle_payload(&event.payload, deadline).await;
            floe::lambda::ingest_response(&result).map_err(Error::from)
        }
    }))
    .await
}
