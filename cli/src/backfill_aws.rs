//! `floe backfill --on-aws`: the plan handed to the stack's backfill state machine (a Step
//! Functions Distributed Map over a manifest of the pending objects), then followed to its end.
//!
//! The plan is made here, as for a local backfill (listing, time range, objects already
//! committed left out), and written as a JSON manifest that the map's `s3:getObject` ItemReader
//! reads; `ItemBatcher` hands the ingest function batches of it, each one commit. The execution
//! is named after the manifest's content, so starting the same plan twice (a lost answer to
//! StartExecution, or the command run again) follows the one execution instead of starting a
//! second: Step Functions returns the running execution for the same name and input, and
//! `ExecutionAlreadyExists` for a finished one, which is then reported, not re-run. Ingest is
//! idempotent besides: an object committed meanwhile comes back as a duplicate.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use aws_sdk_sfn::types::ExecutionStatus;
use floe::config::Config;
use floe::ingest::backfill::BackfillPlan;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::progress;

/// Where and how to start the execution.
pub(crate) struct OnAws<'a> {
    /// The stack's `BackfillStateMachineArn` output.
    pub(crate) state_machine_arn: &'a str,
    /// The landing bucket (the manifest goes beside the listed objects, under `prefix`).
    pub(crate) bucket: &'a str,
    /// The listed prefix (recorded in the execution's input).
    pub(crate) listed_prefix: &'a str,
    /// Key prefix of manifests in `bucket` (the state machine may read `<prefix>*` only).
    pub(crate) manifest_prefix: &'a str,
    /// Step Functions endpoint override (emulators); else the SDK's (AWS_ENDPOINT_URL_SFN …).
    pub(crate) endpoint: Option<&'a str>,
    /// Seconds between progress polls.
    pub(crate) poll: Duration,
}

/// An execution started (or found running) for a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Started {
    pub(crate) execution_arn: String,
    pub(crate) manifest_key: String,
    /// False when the execution existed already (same plan started before).
    pub(crate) new: bool,
}

/// The execution's end as the follower saw it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outcome {
    pub(crate) status: String,
    pub(crate) total: i64,
    pub(crate) succeeded: i64,
    pub(crate) failed: i64,
    pub(crate) cause: Option<String>,
}

async fn sfn_client(config: &Config, endpoint: Option<&str>) -> aws_sdk_sfn::Client {
    let sdk = floe::store::sdk_config(&config.storage, endpoint).await;
    aws_sdk_sfn::Client::new(&sdk)
}

/// The execution name of a manifest: its content's hash (≤ 80 characters, as Step Functions
/// allows).
fn execution_name(manifest: &[u8]) -> String {
    let digest = Sha256::digest(manifest);
    format!("floe-backfill-{}", &hex::encode(digest)[..32])
}

/// The ARN of execution `name` of state machine `sm_arn`.
fn execution_arn(sm_arn: &str, name: &str) -> Result<String> {
    // arn:aws:states:<region>:<account>:stateMachine:<name> → …:execution:<name>:<execution>
    let (head, sm_name) = sm_arn
        .rsplit_once(":stateMachine:")
        .with_context(|| format!("{sm_arn} is not a state machine ARN"))?;
    Ok(format!("{head}:execution:{sm_name}:{name}"))
}

/// Writes the manifest and starts (or finds) its execution.
pub(crate) async fn start(config: &Config, plan: &BackfillPlan, on: &OnAws<'_>) -> Result<Started> {
    let items = plan.map_items();
    let body = serde_json::to_vec(&items)?;
    let name = execution_name(&body);
    let manifest_key = format!("{}{name}.json", on.manifest_prefix);
    // The same key always holds the same bytes: a retried or repeated put changes nothing.
    floe::store::s3_client(&config.storage)
        .await
        .put_object()
        .bucket(on.bucket)
        .key(&manifest_key)
        .content_type("application/json")
        .body(body.into())
        .send()
        .await
        .with_context(|| format!("writing the manifest s3://{}/{manifest_key}", on.bucket))?;
    let input = json!({
        "Bucket": on.bucket,
        "Prefix": on.listed_prefix,
        "Manifest": {"Bucket": on.bucket, "Key": manifest_key},
    });
    let sfn = sfn_client(config, on.endpoint).await;
    let started = sfn
        .start_execution()
        .state_machine_arn(on.state_machine_arn)
        .name(&name)
        .input(input.to_string())
        .send()
        .await;
    match started {
        Ok(out) => Ok(Started {
            execution_arn: out.execution_arn().to_string(),
            manifest_key,
            new: true,
        }),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_execution_already_exists()) =>
        {
            Ok(Started {
                execution_arn: execution_arn(on.state_machine_arn, &name)?,
                manifest_key,
                new: false,
            })
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!(
            "starting {name} on {} (the manifest is written; run the command again: the \
             same plan finds the same execution)",
            on.state_machine_arn
        ))),
    }
}

/// Polls the execution (and its map run's item counts) until it ends, with a progress bar.
pub(crate) async fn follow(
    config: &Config,
    execution_arn: &str,
    on: &OnAws<'_>,
) -> Result<Outcome> {
    let sfn = sfn_client(config, on.endpoint).await;
    let bar = progress::bar(0, "backfill on Step Functions (objects)");
    let mut failures = 0u32;
    loop {
        let described = match sfn
            .describe_execution()
            .execution_arn(execution_arn)
            .send()
            .await
        {
            Ok(d) => d,
            // A poll that failed says nothing about the execution: poll again, a few times.
            Err(e) if failures < 5 => {
                failures += 1;
                bar.println(format!(
                    "describing {execution_arn} failed ({e}); polling again"
                ));
                tokio::time::sleep(on.poll).await;
                continue;
            }
            Err(e) => {
                bar.finish_and_clear();
                return Err(anyhow::Error::new(e).context(format!("describing {execution_arn}")));
            }
        };
        failures = 0;
        let mut out = Outcome {
            status: described.status().as_str().to_string(),
            cause: described.cause().map(str::to_string),
            ..Default::default()
        };
        if let Some(counts) = map_run_counts(&sfn, execution_arn).await {
            (out.total, out.succeeded, out.failed) = counts;
            bar.set_length(out.total.max(0) as u64);
            bar.set_position((out.succeeded + out.failed).max(0) as u64);
            bar.set_message(format!("{} failed", out.failed));
        }
        if *described.status() != ExecutionStatus::Running {
            bar.finish_and_clear();
            return Ok(out);
        }
        tokio::time::sleep(on.poll).await;
    }
}

/// Items of the execution's map run: total, succeeded, failed (incl. timed out and aborted).
async fn map_run_counts(sfn: &aws_sdk_sfn::Client, execution_arn: &str) -> Option<(i64, i64, i64)> {
    let runs = sfn
        .list_map_runs()
        .execution_arn(execution_arn)
        .send()
        .await
        .ok()?;
    let run = runs.map_runs().first()?;
    let described = sfn
        .describe_map_run()
        .map_run_arn(run.map_run_arn())
        .send()
        .await
        .ok()?;
    let c = described.item_counts()?;
    Some((
        c.total(),
        c.succeeded(),
        c.failed() + c.timed_out() + c.aborted(),
    ))
}

/// `floe backfill --on-aws`: start, then (unless `wait` is false) follow; true when every
/// object was ingested.
pub(crate) async fn run(
    config: &Config,
    plan: &BackfillPlan,
    on: &OnAws<'_>,
    wait: bool,
) -> Result<bool> {
    if plan.candidates.is_empty() {
        println!("nothing to backfill: every listed object is committed already");
        return Ok(true);
    }
    let started = start(config, plan, on).await?;
    println!(
        "{} {} ({} objects; manifest s3://{}/{})",
        if started.new {
            "started"
        } else {
            "following the execution already started for this plan:"
        },
        started.execution_arn,
        plan.candidates.len(),
        on.bucket,
        started.manifest_key
    );
    if !wait {
        return Ok(true);
    }
    let out = follow(config, &started.execution_arn, on).await?;
    println!(
        "{}: {} of {} objects' batches succeeded, {} failed; batch results under s3://{}/backfill-results/",
        out.status, out.succeeded, out.total, out.failed, on.bucket
    );
    if let Some(cause) = &out.cause {
        println!("cause: {cause}");
    }
    match out.status.as_str() {
        "SUCCEEDED" => Ok(out.failed == 0),
        "RUNNING" => bail!("{} still running", started.execution_arn),
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floe::event::ObjectRef;
    use floe::ingest::backfill::Candidate;

    #[test]
    fn execution_arns_follow_the_state_machine() {
        assert_eq!(
            execution_arn(
                "arn:aws:states:eu-west-1:123:stateMachine:floe-backfill-s",
                "n"
            )
            .unwrap(),
            "arn:aws:states:eu-west-1:123:execution:floe-backfill-s:n"
        );
        assert!(execution_arn("arn:aws:lambda:x", "n").is_err());
        let name = execution_name(b"[]");
        assert!(name.len() <= 80 && name.starts_with("floe-backfill-"));
        assert_ne!(name, execution_name(b"[1]"));
    }

    fn plan(keys: &[&str]) -> BackfillPlan {
        BackfillPlan {
            candidates: keys
                .iter()
                .map(|k| Candidate {
                    object: ObjectRef {
                        bucket: "landing".into(),
                        key: k.to_string(),
                        size: Some(10),
                        etag: Some("abc".into()),
                        version_id: None,
                        event_time: None,
                    },
                    table: "orders".into(),
                    size: 10,
                })
                .collect(),
            ..Default::default()
        }
    }

    /// On moto (FLOE_TEST_MOTO, set by infra/test.sh): the manifest holds the plan's objects in
    /// the map-item shape, the input names it, the same plan started twice is one execution,
    /// and the follower reports the execution's end.
    #[tokio::test]
    async fn a_plan_starts_one_execution_over_its_manifest() {
        let Ok(moto) = std::env::var("FLOE_TEST_MOTO") else {
            panic!("FLOE_TEST_MOTO is unset: run the tests through infra/test.sh");
        };
        let toml = format!(
            r#"
[catalog]
kind = "sqlite"
uri = "sqlite::memory:"
warehouse = "/tmp/floe-backfill-aws"
[storage]
endpoint = "{moto}"
region = "us-east-1"
access_key_id = "test"
secret_access_key = "test"
path_style = true
"#
        );
        let config = Config::parse(&toml, "test.toml").unwrap();
        let bucket = format!("bf-{}", std::process::id());
        let s3 = floe::store::s3_client(&config.storage).await;
        s3.create_bucket().bucket(&bucket).send().await.unwrap();
        let sdk = floe::store::sdk_config(&config.storage, Some(&moto)).await;
        let sfn = aws_sdk_sfn::Client::new(&sdk);
        let sm = sfn
            .create_state_machine()
            .name(format!("floe-backfill-{bucket}"))
            .role_arn("arn:aws:iam::123456789012:role/sfn")
            .definition(r#"{"StartAt":"A","States":{"A":{"Type":"Pass","End":true}}}"#)
            .send()
            .await
            .unwrap();
        let on = OnAws {
            state_machine_arn: sm.state_machine_arn(),
            bucket: &bucket,
            listed_prefix: "landing/orders/",
            manifest_prefix: "backfill-manifests/",
            endpoint: Some(&moto),
            poll: Duration::from_millis(100),
        };
        let p = plan(&["landing/orders/b.jsonl", "landing/orders/a.jsonl"]);
        let first = start(&config, &p, &on).await.unwrap();
        assert!(first.new);
        let manifest = s3
            .get_object()
            .bucket(&bucket)
            .key(&first.manifest_key)
            .send()
            .await
            .unwrap()
            .body
            .collect()
            .await
            .unwrap()
            .into_bytes();
        let items: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
        // By key (not the plan's order), each as the map's items and the ingest batch take them.
        assert_eq!(
            items,
            json!([
                {"Bucket": "landing", "Key": "landing/orders/a.jsonl", "Size": 10, "Etag": "\"abc\""},
                {"Bucket": "landing", "Key": "landing/orders/b.jsonl", "Size": 10, "Etag": "\"abc\""},
            ])
        );
        let described = sfn
            .describe_execution()
            .execution_arn(&first.execution_arn)
            .send()
            .await
            .unwrap();
        let input: serde_json::Value = serde_json::from_str(described.input().unwrap()).unwrap();
        assert_eq!(input["Manifest"]["Key"], json!(first.manifest_key));
        assert_eq!(input["Manifest"]["Bucket"], json!(bucket));
        assert_eq!(input["Prefix"], json!("landing/orders/"));
        // The same plan again (a lost answer, or the command re-run): the same execution.
        let second = start(&config, &p, &on).await.unwrap();
        assert_eq!(second.execution_arn, first.execution_arn);
        let listed = sfn
            .list_executions()
            .state_machine_arn(sm.state_machine_arn())
            .send()
            .await
            .unwrap();
        assert_eq!(listed.executions().len(), 1, "one execution for one plan");
        // A different plan is a different execution.
        let other = start(&config, &plan(&["landing/orders/c.jsonl"]), &on)
            .await
            .unwrap();
        assert_ne!(other.execution_arn, first.execution_arn);
        // The follower returns when the execution ends (stopped here), with its status.
        let arn = first.execution_arn.clone();
        let stopper = sfn.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = stopper.stop_execution().execution_arn(arn).send().await;
        });
        let out = follow(&config, &first.execution_arn, &on).await.unwrap();
        assert_eq!(out.status, "ABORTED");
        assert!(
            !run(&config, &p, &on, true).await.unwrap(),
            "an aborted backfill fails"
        );
    }
}
