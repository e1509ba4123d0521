//! The process Lambda (minimal until the process issue lands): accepts floe commit events, Glue
//! table-change events, S3 metadata events and scheduled polls, and reports which trigger woke it.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    floe::lambda::init_tracing();
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| async move {
        let trigger = floe::lambda::classify_trigger(&event.payload);
        tracing::info!(
            ?trigger,
            "process woke; incremental processing is not implemented yet"
        );
        Ok::<Value, Error>(serde_json::json!({ "trigger": format!("{trigger:?}"), "processed": 0 }))
    }))
    .await
}
