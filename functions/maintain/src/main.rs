//! The maintain Lambda: an EventBridge schedule → compaction, snapshot expiration, orphan cleanup
//! and manifest rewrite on the configured tables, bounded by the function's remaining time.
//!
//! Thin by design: the maintainer is built once per container; each event goes to
//! [`floe::maintain::Maintainer::handle_payload`].

use std::sync::Arc;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    floe::lambda::limit_allocator_retention();
    floe::lambda::init_tracing();
    let config = floe::config::Config::from_env().await?;
    let maintainer = Arc::new(floe::maintain::Maintainer::new(config).await?);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let maintainer = Arc::clone(&maintainer);
        async move {
            // Keep a minute for the commit in flight when the deadline is reached.
            let deadline =
                floe::lambda::deadline_from_epoch_ms(event.context.deadline.saturating_sub(60_000));
            let reports = maintainer.handle_payload(&event.payload, deadline).await?;
            Ok::<Value, Error>(serde_json::json!({ "reports": reports }))
        }
    }))
    .await
}
