//! The process Lambda: a floe commit event, a Glue table change, an S3 metadata event or a
//! scheduled poll wakes the pipelines reading the named table; each processes everything after
//! its checkpoint and commits output + checkpoint atomically to its sink.
//!
//! Thin by design: the processor is built once per container; each event goes to
//! [`floe::process::Processor::handle_event`]; an SQS batch is
//! answered with its failed messages (partial batch response).

use std::sync::Arc;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    floe::lambda::limit_allocator_retention();
    floe::lambda::init_tracing();
    let config = floe::config::Config::from_env().await?;
    let processor = Arc::new(floe::process::Processor::new(config).await?);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let processor = Arc::clone(&processor);
        async move {
            // Keep 30 s for the commit in flight when the deadline is reached.
            let deadline =
                floe::lambda::deadline_from_epoch_ms(event.context.deadline.saturating_sub(30_000));
            let result = processor.handle_event(&event.payload, deadline).await;
            floe::lambda::process_response(&result).map_err(Error::from)
        }
    }))
    .await
}
