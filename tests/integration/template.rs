//! template.yaml follows floe's security and structure rules (infra/check_template.py), and the
//! rules really catch violations.

use std::process::Command;

use crate::harness::{python, repo_root};

fn check(template: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(crate::harness::unique("tpl"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("template.yaml");
    std::fs::write(&path, template).unwrap();
    let out = Command::new(python())
        .arg(repo_root().join("infra/check_template.py"))
        .arg(&path)
        .arg(repo_root())
        .arg(repo_root().join("infra/floe.toml"))
        .output()
        .expect("run check_template.py");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

#[test]
fn template_passes_and_each_violation_is_caught() {
    let template = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let (ok, out) = check(&template);
    assert!(ok, "{out}");
    for (what, from, to, expect) in [
        (
            "wildcard action",
            "[s3:GetObject, s3:PutObject, s3:DeleteObject]",
            "[\"s3:*\"]",
            "allows s3:*",
        ),
        (
            "no bucket key",
            "BucketKeyEnabled: true",
            "BucketKeyEnabled: false",
            "BucketKeyEnabled",
        ),
        (
            "unknown package",
            "CodeUri: functions/ingest",
            "CodeUri: functions/nope",
            "not a package",
        ),
        (
            "versioning off",
            "VersioningConfiguration: { Status: Enabled }",
            "VersioningConfiguration: { Status: Suspended }",
            "versioning",
        ),
        (
            "old versions kept for ever",
            "Status: Enabled\n            NoncurrentVersionExpiration:",
            "Status: Disabled\n            NoncurrentVersionExpiration:",
            "NoncurrentVersionExpiration",
        ),
        (
            "abandoned uploads kept",
            "AbortIncompleteMultipartUpload:\n              DaysAfterInitiation: 2",
            "NoncurrentVersionTransitions: []",
            "AbortIncompleteMultipartUpload",
        ),
        (
            "wildcard resource",
            "Resource: !GetAtt DataKey.Arn",
            "Resource: \"*\"",
            "Resource *",
        ),
        (
            "a role over the whole warehouse",
            "data/warehouse/floe/orders/*",
            "data/warehouse/*",
            "covers the whole warehouse",
        ),
        (
            "listing the whole warehouse",
            "- \"warehouse/floe/orders/*\"",
            "- \"warehouse/*\"",
            "lists the whole warehouse",
        ),
        (
            "every Glue table",
            ":table/floe/orders",
            ":table/floe/*",
            "not a configured table",
        ),
        (
            "an unconfigured Glue table",
            ":table/floe/suspicious_orders",
            ":table/floe/payroll",
            "floe/payroll, not a configured table",
        ),
        (
            "a backfill map without batches",
            "              MaxItemsPerBatchPath: $.Settings.BatchObjects\n",
            "",
            "ItemBatcher with MaxItemsPerBatch",
        ),
        (
            "a backfill map inline",
            "Mode: DISTRIBUTED",
            "Mode: INLINE",
            "no Distributed Map",
        ),
        (
            "a backfill batch never retried",
            "                  Retry:",
            "                  NoRetry:",
            "needs a Retry",
        ),
        (
            "backfill results kept nowhere",
            "Resource: arn:aws:states:::s3:putObject",
            "Resource: arn:aws:states:::s3:nothing",
            "ResultWriter to S3",
        ),
        (
            "a wildcard in the state machine's role",
            "Action: [states:DescribeMapRun, states:ListMapRuns, states:UpdateMapRun]",
            "Action: [\"states:*\"]",
            "allows states:*",
        ),
        (
            "a freshness alarm off its table's objective",
            "ExtendedStatistic: p99\n      Period: 300\n      EvaluationPeriods: 2\n      Threshold: 120",
            "ExtendedStatistic: p99\n      Period: 300\n      EvaluationPeriods: 2\n      Threshold: 900",
            "not its freshness objective",
        ),
        (
            "an ingest batching window as long as the objective",
            "MaximumBatchingWindowInSeconds: 0\n            ScalingConfig:\n              MaximumConcurrency: !Ref IngestMaxConcurrency",
            "MaximumBatchingWindowInSeconds: 120\n            ScalingConfig:\n              MaximumConcurrency: !Ref IngestMaxConcurrency",
            "tightest freshness objective",
        ),
        (
            "an ingest concurrency fixed in the template",
            "MaximumConcurrency: !Ref IngestMaxConcurrency",
            "MaximumConcurrency: 2",
            "must be a template parameter",
        ),
        (
            "the ingest queue's default retention",
            "      MessageRetentionPeriod: 1209600\n      KmsMasterKeyId: !Ref DataKey",
            "      KmsMasterKeyId: !Ref DataKey",
            "IngestQueue: MessageRetentionPeriod None",
        ),
        (
            "a day's retention on the process queue",
            "      # message dropped unprocessed is an outage nobody sees).\n      MessageRetentionPeriod: 1209600",
            "      # message dropped unprocessed is an outage nobody sees).\n      MessageRetentionPeriod: 86400",
            "ProcessQueue: MessageRetentionPeriod",
        ),
        (
            "no age alarm on the ingest queue",
            "Value: !GetAtt IngestQueue.QueueName }]\n      Statistic: Maximum\n      Period: 60",
            "Value: !GetAtt IngestDLQ.QueueName }]\n      Statistic: Maximum\n      Period: 60",
            "IngestQueue: no ApproximateAgeOfOldestMessage alarm",
        ),
        (
            "a process-queue age alarm off the lag objective",
            "      Threshold: 2100\n      ComparisonOperator: GreaterThanThreshold\n      TreatMissingData: notBreaching\n  # floe:generated alarms end",
            "      Threshold: 3600\n      ComparisonOperator: GreaterThanThreshold\n      TreatMissingData: notBreaching\n  # floe:generated alarms end",
            "one redelivery",
        ),
        (
            "process batches failing whole",
            "              MaximumConcurrency: 2\n            FunctionResponseTypes: [ReportBatchItemFailures]\n        Poll:",
            "              MaximumConcurrency: 2\n        Poll:",
            "FloeCommit needs FunctionResponseTypes",
        ),
        (
            "Glue table changes invoking the process function directly",
            "        Poll:\n          Type: Schedule",
            "        GlueTableChange:\n          Type: EventBridgeRule\n          Properties:\n            Pattern:\n              source: [aws.glue]\n        Poll:\n          Type: Schedule",
            "invokes floe-process directly",
        ),
        (
            "Glue table changes going nowhere",
            "        - Id: process-queue\n          Arn: !GetAtt ProcessQueue.Arn\n\n  ProcessQueuePolicy:",
            "        - Id: process-queue\n          Arn: !GetAtt ProcessDLQ.Arn\n\n  ProcessQueuePolicy:",
            "Glue table changes (source aws.glue) to the process queue",
        ),
        (
            "plain HTTP allowed",
            "aws:SecureTransport: \"false\"",
            "aws:SecureTransport: \"true\"",
            "SecureTransport",
        ),
    ] {
        assert!(
            template.contains(from),
            "{what}: the template changed; update the test"
        );
        let (ok, out) = check(&template.replacen(from, to, 1));
        assert!(!ok && out.contains(expect), "{what} not caught: {out}");
    }
}

#[test]
fn sample_events_for_sam_local_invoke_parse() {
    let read = |f: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(repo_root().join("events").join(f)).unwrap())
            .unwrap()
    };
    let d = floe::event::parse_payload(&read("ingest-sqs-s3.json")).unwrap();
    let objs = d[0].objects.as_ref().unwrap();
    assert_eq!(objs[0].key, "landing/orders/2026/11/30/batch 001.jsonl.gz");
    assert!(d[0].message_id.is_some());
    let d = floe::event::parse_payload(&read("ingest-eventbridge-object-created.json")).unwrap();
    assert_eq!(
        d[0].objects.as_ref().unwrap()[0].key,
        "landing/orders/2026/11/30/batch-002.jsonl"
    );
    assert_eq!(
        floe::event::classify_trigger(&read("process-glue-table-change.json")),
        floe::event::Trigger::GlueTableChange
    );
    assert_eq!(
        floe::event::classify_trigger(&read("process-floe-commit.json")),
        floe::event::Trigger::FloeCommit
    );
    assert_eq!(
        read("process-floe-commit.json")["detail"]["table"],
        "orders"
    );
    // What the process queue delivers: a commit event and a Glue table change, each the
    // EventBridge event untouched in its message's body.
    let batch = read("process-sqs-batch.json");
    let bodies: Vec<serde_json::Value> = batch["Records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| serde_json::from_str(r["body"].as_str().unwrap()).unwrap())
        .collect();
    assert_eq!(
        floe::event::classify_trigger(&bodies[0]),
        floe::event::Trigger::FloeCommit
    );
    assert_eq!(bodies[1], read("process-glue-table-change.json"));
    assert_eq!(read("maintain-schedule.json")["tables"][0], "orders");
    let d = floe::event::parse_payload(&read("ingest-distributed-map-batch.json")).unwrap();
    let objs = d[0].objects.as_ref().unwrap();
    assert_eq!(objs.len(), 3);
    assert!(objs
        .iter()
        .all(|o| o.bucket == "floe-123456789012-us-east-1-data"));
    assert_eq!(objs[2].key, "landing/orders/2026/06/01/part 3.jsonl.gz");
}
