//! The maintain Lambda (minimal until the maintain issue lands): accepts the EventBridge schedule
//! event and reports it; compaction, expiration and orphan cleanup come with the maintain issue.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    floe::lambda::init_tracing();
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| async move {
        let trigger = floe::lambda::classify_trigger(&event.payload);
        tracing::info!(
            ?trigger,
            "maintain woke; maintenance operations are not implemented yet"
        );
        Ok::<Value, Error>(serde_json::json!({ "trigger": format!("{trigger:?}"), "actions": [] }))
    }))
    .await
}
