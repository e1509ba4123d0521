#!/usr/bin/env python3
"""Policy and structure rules for template.yaml that cfn-lint does not know.

Security (floe's contract for a deployment):
  * every function has its own role: inline `Policies`, no shared `Role`;
  * no `*` action or `service:*` action, and no `Resource: "*"`, in any function policy;
  * the data bucket: KMS encryption with a bucket key, versioning on with a whole-bucket lifecycle
    rule expiring noncurrent versions and one aborting incomplete multipart uploads, public
    access fully blocked, and a bucket policy denying requests without TLS.
Per-table identities (with the deploy config, infra/floe.toml, as the third argument):
  * no function may read, write or list the warehouse as a whole: every data-plane resource
    under the warehouse names one table's prefix;
  * every Glue table ARN names a configured table (an ingest table or a pipeline sink), never `*`.
Freshness (with the deploy config):
  * every configured table has a FreshnessLagSeconds alarm (dimension Table) whose Threshold is
    the table's freshness_objective_seconds (its own, else [defaults], else floe's 120 s);
  * the ingest function's SQS batching window (MaximumBatchingWindowInSeconds) is below the
    smallest objective: waiting for a batch must not use up the objective by itself.
Queues (every SQS queue feeding a function through an SQS event):
  * MessageRetentionPeriod is SQS's maximum, 14 days (1209600): an outage must not drop
    notifications;
  * the event source reports partial batch failures (FunctionResponseTypes
    [ReportBatchItemFailures]): one failed message must not send its whole batch back;
  * an AWS/SQS ApproximateAgeOfOldestMessage alarm on the queue; with the deploy config its
    threshold is the tightest freshness objective for the queue of floe-ingest and, for the
    queue of floe-process, the tightest pipeline lag objective or, if later, one redelivery (the
    queue's VisibilityTimeout + the function's Timeout: a failed message is received again only
    after its visibility timeout, so a lower threshold fires on every retryable failure);
  * the ingest function's ScalingConfig.MaximumConcurrency is a template parameter (it caps
    every table's ingest together), not a literal.
Process triggers: floe-process has no EventBridgeRule event (direct invocations race each other
  from one checkpoint): floe.commit and Glue table-change events reach it through its queue, so
  an AWS::Events::Rule matching aws.glue must target that queue.
Backfill (every AWS::Serverless::StateMachine):
  * a Distributed Map whose ItemReader lists S3 (s3:listObjectsV2) or reads a manifest, with an
    ItemBatcher passing the bucket in BatchInput, MaxConcurrency and ToleratedFailurePercentage
    set (or their *Path), a ResultWriter to S3, and a Task invoking the ingest function with the
    batch as its payload and a Retry (the batch is idempotent);
  * its policies follow the same no-wildcard rules as the functions'.
Structure:
  * every function is `rust-cargolambda` on provided.al2023/arm64 with `Handler: bootstrap`, and
    its `CodeUri` is a package of this workspace whose name matches `BuildProperties.Binary`;
  * every event type is one the function's binary handles.

Exit status 1 with one line per violation; 0 and a summary when clean.
Usage: check_template.py [template.yaml] [workspace root] [floe.toml]
"""
import os
import sys
import tomllib

from cfnlint.decode import decode

HANDLED_EVENTS = {
    "floe-ingest": {"SQS", "S3", "EventBridgeRule"},
    "floe-process": {"EventBridgeRule", "Schedule", "ScheduleV2", "S3", "SQS"},
    "floe-maintain": {"Schedule", "ScheduleV2", "EventBridgeRule"},
}


def statements(policy):
    if isinstance(policy, dict):
        for st in policy.get("Statement", []):
            yield st


def as_list(v):
    return v if isinstance(v, list) else [v]


def deploy_scope(config_path):
    """(warehouse key prefix, Glue database, configured table names) of the deploy config."""
    with open(config_path, "rb") as f:
        cfg = tomllib.load(f)
    warehouse = cfg["catalog"]["warehouse"]
    prefix = warehouse.split("://", 1)[1].split("/", 1)[1].strip("/") if warehouse.count("/") > 2 else ""
    db = cfg["catalog"].get("namespace", "floe")
    tables = {t["name"] for t in cfg.get("tables", [])} | {p["sink"] for p in cfg.get("pipelines", [])}
    return prefix, db, tables


# floe's default freshness objective (FRESHNESS_OBJECTIVE_SECONDS in shared/src/config/defaults.rs).
DEFAULT_FRESHNESS_OBJECTIVE = 120


def freshness_objectives(config_path):
    """{table: freshness objective in seconds} of the deploy config."""
    with open(config_path, "rb") as f:
        cfg = tomllib.load(f)
    default = (cfg.get("defaults") or {}).get("freshness_objective_seconds", DEFAULT_FRESHNESS_OBJECTIVE)
    return {t["name"]: t.get("freshness_objective_seconds", default) for t in cfg.get("tables", [])}


def freshness_errors(resources, functions, objectives):
    errors = []
    alarms = [r.get("Properties", {}) for r in resources.values() if r.get("Type") == "AWS::CloudWatch::Alarm"]
    for table, objective in sorted(objectives.items()):
        mine = [a for a in alarms if a.get("MetricName") == "FreshnessLagSeconds"
                and {"Name": "Table", "Value": table} in as_list(a.get("Dimensions") or [])]
        if not mine:
            errors.append(f"table {table}: no FreshnessLagSeconds alarm (run `floe template`)")
        for a in mine:
            if float(a.get("Threshold", -1)) != float(objective):
                errors.append(f"table {table}: freshness alarm threshold {a.get('Threshold')} is not its "
                              f"freshness objective of {objective} s (run `floe template`)")
    if objectives:
        tightest = min(objectives.values())
        for name, fn in functions.items():
            if (fn.get("Metadata", {}).get("BuildProperties") or {}).get("Binary") != "floe-ingest":
                continue
            for ev_name, ev in ((fn.get("Properties") or {}).get("Events") or {}).items():
                if ev.get("Type") != "SQS":
                    continue
                window = (ev.get("Properties") or {}).get("MaximumBatchingWindowInSeconds", 0)
                if isinstance(window, (int, float)) and window >= tightest:
                    errors.append(f"{name}: event {ev_name} waits up to {window} s for a batch, not below "
                                  f"the tightest freshness objective ({tightest} s)")
    return errors


# SQS's longest retention (14 days).
MAX_RETENTION = 1209600
# floe's default pipeline lag objective (LAG_OBJECTIVE_SECONDS in shared/src/config/defaults.rs).
DEFAULT_LAG_OBJECTIVE = 600


def lag_objectives(config_path):
    """{pipeline: lag objective in seconds} of the deploy config."""
    with open(config_path, "rb") as f:
        cfg = tomllib.load(f)
    default = (cfg.get("defaults") or {}).get("lag_objective_seconds", DEFAULT_LAG_OBJECTIVE)
    return {p["name"]: p.get("lag_objective_seconds", default) for p in cfg.get("pipelines", [])}


def ref_name(v, attr):
    """The logical id of `!GetAtt X.<attr>` (either decoded form), else None."""
    if not isinstance(v, dict) or "Fn::GetAtt" not in v:
        return None
    g = v["Fn::GetAtt"]
    parts = g.split(".", 1) if isinstance(g, str) else list(g)
    return parts[0] if len(parts) == 2 and parts[1] == attr else None


def binary_of(fn):
    return (fn.get("Metadata", {}).get("BuildProperties") or {}).get("Binary")


def queue_errors(template, resources, functions, objectives, lags):
    """The queue rules of the module docstring; objectives/lags are None without a deploy config."""
    errors = []
    params = template.get("Parameters", {})
    alarms = [r.get("Properties", {}) for r in resources.values() if r.get("Type") == "AWS::CloudWatch::Alarm"]
    fed = {}  # queue logical id -> binaries it feeds
    timeouts = {}  # queue logical id -> the Timeout of the functions it feeds (literal seconds)
    for name, fn in functions.items():
        binary = binary_of(fn)
        events = (fn.get("Properties") or {}).get("Events") or {}
        for ev_name, ev in events.items():
            props = ev.get("Properties") or {}
            if binary == "floe-process" and ev.get("Type") == "EventBridgeRule":
                errors.append(f"{name}: event {ev_name} invokes floe-process directly from EventBridge; "
                              "route it into the process queue (an AWS::Events::Rule targeting it)")
            if ev.get("Type") != "SQS":
                continue
            queue = ref_name(props.get("Queue"), "Arn")
            if queue is None:
                errors.append(f"{name}: event {ev_name} names its queue other than !GetAtt <queue>.Arn")
                continue
            fed.setdefault(queue, set()).add(binary)
            timeout = (fn.get("Properties") or {}).get("Timeout")
            if isinstance(timeout, (int, float)):
                timeouts[queue] = max(timeouts.get(queue, 0), timeout)
            if "ReportBatchItemFailures" not in as_list(props.get("FunctionResponseTypes") or []):
                errors.append(f"{name}: event {ev_name} needs FunctionResponseTypes [ReportBatchItemFailures] "
                              "(one failed message must not send its whole batch back)")
            if binary == "floe-ingest":
                cap = (props.get("ScalingConfig") or {}).get("MaximumConcurrency")
                ref = cap.get("Ref") if isinstance(cap, dict) else None
                if ref is None or ref not in params:
                    errors.append(f"{name}: event {ev_name} ScalingConfig.MaximumConcurrency must be a template "
                                  f"parameter (!Ref), not {cap!r}: it caps every table's ingest together")
    for queue, binaries in sorted(fed.items()):
        q = resources.get(queue) or {}
        if q.get("Type") != "AWS::SQS::Queue":
            errors.append(f"queue {queue} fed to {sorted(binaries)} is not an AWS::SQS::Queue of the template")
            continue
        retention = (q.get("Properties") or {}).get("MessageRetentionPeriod")
        if retention != MAX_RETENTION:
            errors.append(f"{queue}: MessageRetentionPeriod {retention} is not {MAX_RETENTION} (14 days; "
                          "the default, 4 days, drops messages over a long outage)")
        mine = [a for a in alarms if a.get("Namespace") == "AWS/SQS"
                and a.get("MetricName") == "ApproximateAgeOfOldestMessage"
                and any(d.get("Name") == "QueueName" and ref_name(d.get("Value"), "QueueName") == queue
                        for d in as_list(a.get("Dimensions") or []) if isinstance(d, dict))]
        if not mine:
            errors.append(f"{queue}: no ApproximateAgeOfOldestMessage alarm (run `floe template`)")
        want = []
        if "floe-ingest" in binaries and objectives:
            want.append(("freshness", min(objectives.values())))
        if "floe-process" in binaries and lags:
            # A failed run's message comes back after the visibility timeout and is done within
            # the function timeout: below that the alarm would fire on every retryable failure.
            visibility = (q.get("Properties") or {}).get("VisibilityTimeout", 30)
            redelivery = int(visibility) + int(timeouts.get(queue, 0))
            want.append(("pipeline lag (or, if later, one redelivery: visibility timeout + "
                         "function timeout)", max(min(lags.values()), redelivery)))
        for a in mine:
            for what, objective in want:
                if float(a.get("Threshold", -1)) != float(objective):
                    errors.append(f"{queue}: queue-age alarm threshold {a.get('Threshold')} is not the tightest "
                                  f"{what} objective ({objective} s; run `floe template`)")
    process_queues = {q for q, b in fed.items() if "floe-process" in b}
    glue_rules = [r for r in resources.values() if r.get("Type") == "AWS::Events::Rule"
                  and "aws.glue" in as_list(((r.get("Properties") or {}).get("EventPattern") or {}).get("source") or [])]
    if process_queues and not any(ref_name(t.get("Arn"), "Arn") in process_queues
                                  for r in glue_rules for t in as_list((r.get("Properties") or {}).get("Targets") or [])):
        errors.append("no AWS::Events::Rule sends Glue table changes (source aws.glue) to the process queue")
    return errors


def resource_strings(res):
    """The ARN text of a policy resource (plain, or the string of a !Sub)."""
    if isinstance(res, dict) and "Fn::Sub" in res:
        sub = res["Fn::Sub"]
        return sub if isinstance(sub, str) else sub[0]
    return res if isinstance(res, str) else None


def scope_errors(name, st, scope):
    prefix, db, tables = scope
    errors = []
    sid = st.get("Sid", "?")
    wide = {f"{prefix}/*" if prefix else "*", f"{prefix}*" if prefix else "*"}
    for res in as_list(st.get("Resource", [])):
        arn = resource_strings(res)
        if arn is None:
            continue
        if arn.startswith("arn:aws:s3:::") and "/" in arn:
            key = arn.split("/", 1)[1]
            if key in wide:
                errors.append(f"{name}: statement {sid} covers the whole warehouse ({arn}); name each table's prefix")
        if ":table/" in arn and arn.startswith("arn:aws:glue:"):
            table_db, _, table = arn.split(":table/", 1)[1].partition("/")
            if table_db != db or table not in tables:
                errors.append(f"{name}: statement {sid} names Glue table {table_db}/{table}, not a configured table")
    cond = ((st.get("Condition") or {}).get("StringLike") or {}).get("s3:prefix")
    for p in as_list(cond or []):
        if isinstance(p, str) and p in wide:
            errors.append(f"{name}: statement {sid} lists the whole warehouse ({p})")
    return errors


def policy_errors(name, policies, scope):
    """No managed policies, no wildcard action or resource, and (with a deploy config) no
    warehouse-wide or unconfigured-table resource in a function's or state machine's policies."""
    errors = []
    for policy in as_list(policies or []):
        if isinstance(policy, str):
            errors.append(f"{name}: managed policy {policy} is not scoped to floe's prefixes")
            continue
        for st in statements(policy):
            if st.get("Effect") != "Allow":
                continue
            for action in as_list(st.get("Action", [])):
                if action == "*" or (isinstance(action, str) and action.endswith(":*")):
                    errors.append(f"{name}: statement {st.get('Sid', '?')} allows {action}")
            for res in as_list(st.get("Resource", [])):
                if res == "*":
                    errors.append(f"{name}: statement {st.get('Sid', '?')} allows Resource *")
            if scope is not None:
                errors.extend(scope_errors(name, st, scope))
    return errors


def map_states(states):
    """Every Map state of a states block, nested ones included."""
    for st in (states or {}).values():
        if st.get("Type") == "Map":
            yield st
            yield from map_states((st.get("ItemProcessor") or {}).get("States"))


def backfill_errors(name, sm, ingest_names):
    errors = []
    props = sm.get("Properties", {})
    states = (props.get("Definition") or {}).get("States") or {}
    def distributed(m):
        return ((m.get("ItemProcessor") or {}).get("ProcessorConfig") or {}).get("Mode") == "DISTRIBUTED"
    maps = [m for m in map_states(states) if distributed(m)]
    if not maps:
        return [f"{name}: no Distributed Map (ItemProcessor.ProcessorConfig.Mode DISTRIBUTED)"]
    # Every map over S3 items (a listing or a manifest) runs distributed, not in one execution.
    for k, m in states.items():
        if m.get("Type") == "Map" and m.get("ItemReader") and not distributed(m):
            errors.append(f"{name}: {k} reads S3 items inline: no Distributed Map for it")
    for m in maps:
        reader = (m.get("ItemReader") or {}).get("Resource", "")
        if reader not in ("arn:aws:states:::s3:listObjectsV2", "arn:aws:states:::s3:getObject"):
            errors.append(f"{name}: ItemReader must list S3 or read a manifest, not {reader or 'nothing'}")
        batcher = m.get("ItemBatcher") or {}
        if not (batcher.get("MaxItemsPerBatch") or batcher.get("MaxItemsPerBatchPath")):
            errors.append(f"{name}: ItemBatcher with MaxItemsPerBatch: one ingest invocation commits a batch")
        if "Bucket.$" not in (batcher.get("BatchInput") or {}) and "Bucket" not in (batcher.get("BatchInput") or {}):
            errors.append(f"{name}: ItemBatcher.BatchInput must carry the Bucket (listed items name none)")
        for k in ("MaxConcurrency", "ToleratedFailurePercentage"):
            if k not in m and f"{k}Path" not in m:
                errors.append(f"{name}: Map needs {k} (or {k}Path)")
        if (m.get("ResultWriter") or {}).get("Resource") != "arn:aws:states:::s3:putObject":
            errors.append(f"{name}: Map needs a ResultWriter to S3")
        tasks = [t for t in ((m.get("ItemProcessor") or {}).get("States") or {}).values() if t.get("Type") == "Task"]
        invokes = [t for t in tasks if t.get("Resource") == "arn:aws:states:::lambda:invoke"
                   and (t.get("Parameters") or {}).get("Payload.$") == "$"]
        if not invokes:
            errors.append(f"{name}: the map's Task must invoke a Lambda with the batch (Payload.$: $)")
        for t in invokes:
            if not t.get("Retry"):
                errors.append(f"{name}: the ingest Task needs a Retry (a batch is idempotent)")
    subs = props.get("DefinitionSubstitutions") or {}
    targets = {v.get("Fn::GetAtt", [None])[0] if isinstance(v, dict) and isinstance(v.get("Fn::GetAtt"), list) else None
               for v in subs.values()}
    if not targets & ingest_names:
        errors.append(f"{name}: DefinitionSubstitutions must name the ingest function (Fn::GetAtt <fn>.Arn)")
    return errors


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "template.yaml"
    root = sys.argv[2] if len(sys.argv) > 2 else "."
    scope = deploy_scope(sys.argv[3]) if len(sys.argv) > 3 else None
    template, matches = decode(path)
    if matches:
        for m in matches:
            print(f"{path}: cannot parse: {m}")
        return 1
    errors = []
    resources = template.get("Resources", {})
    functions = {k: v for k, v in resources.items() if v.get("Type") == "AWS::Serverless::Function"}
    if not functions:
        errors.append("no AWS::Serverless::Function in the template")
    glob = template.get("Globals", {}).get("Function", {})
    for name, fn in functions.items():
        props = fn.get("Properties", {})
        meta = fn.get("Metadata", {})
        get = lambda k: props.get(k, glob.get(k))
        if meta.get("BuildMethod") != "rust-cargolambda":
            errors.append(f"{name}: BuildMethod must be rust-cargolambda")
        if get("Runtime") != "provided.al2023" or get("Handler") != "bootstrap":
            errors.append(f"{name}: needs Runtime provided.al2023 and Handler bootstrap")
        if get("Architectures") != ["arm64"]:
            errors.append(f"{name}: Architectures must be [arm64]")
        code = props.get("CodeUri", "")
        manifest = os.path.join(root, code, "Cargo.toml")
        binary = meta.get("BuildProperties", {}).get("Binary")
        if not os.path.exists(manifest):
            errors.append(f"{name}: CodeUri {code} is not a package of the workspace")
        else:
            with open(manifest, "rb") as f:
                pkg = tomllib.load(f)
            bins = {b.get("name") for b in pkg.get("bin", [])} | {pkg["package"]["name"]}
            if binary not in bins:
                errors.append(f"{name}: BuildProperties.Binary {binary} is not a binary of {code}")
            handled = HANDLED_EVENTS.get(binary)
            if handled is None:
                errors.append(f"{name}: binary {binary} has no known event types")
            for ev_name, ev in (props.get("Events") or {}).items():
                if handled is not None and ev.get("Type") not in handled:
                    errors.append(f"{name}: event {ev_name} of type {ev.get('Type')} is not handled by {binary}")
        # Nothing fails silently: SQS-fed functions have a redrive to a DLQ on their queue;
        # every other function has an on-failure destination for its asynchronous invocations.
        events = (props.get("Events") or {}).values()
        sqs_fed = any(ev.get("Type") == "SQS" for ev in events)
        on_failure = (((props.get("EventInvokeConfig") or {}).get("DestinationConfig") or {}).get("OnFailure") or {})
        if not sqs_fed and not on_failure.get("Destination"):
            errors.append(f"{name}: needs EventInvokeConfig.DestinationConfig.OnFailure (a DLQ)")
        if "Role" in props:
            errors.append(f"{name}: uses a shared Role; each function needs its own scoped policies")
        errors.extend(policy_errors(name, props.get("Policies"), scope))
    if len(sys.argv) > 3:
        errors.extend(freshness_errors(resources, functions, freshness_objectives(sys.argv[3])))
    config = sys.argv[3] if len(sys.argv) > 3 else None
    errors.extend(queue_errors(template, resources, functions,
                               freshness_objectives(config) if config else None,
                               lag_objectives(config) if config else None))
    ingest_names = {k for k, v in functions.items()
                    if (v.get("Metadata", {}).get("BuildProperties") or {}).get("Binary") == "floe-ingest"}
    machines = {k: v for k, v in resources.items() if v.get("Type") == "AWS::Serverless::StateMachine"}
    for name, sm in machines.items():
        errors.extend(backfill_errors(name, sm, ingest_names))
        errors.extend(policy_errors(name, sm.get("Properties", {}).get("Policies"), scope))
    buckets = {k: v for k, v in resources.items() if v.get("Type") == "AWS::S3::Bucket"}
    policies = [v for v in resources.values() if v.get("Type") == "AWS::S3::BucketPolicy"]
    for name, b in buckets.items():
        p = b.get("Properties", {})
        sse = (p.get("BucketEncryption") or {}).get("ServerSideEncryptionConfiguration") or []
        if not any(r.get("ServerSideEncryptionByDefault", {}).get("SSEAlgorithm") == "aws:kms" and r.get("BucketKeyEnabled") for r in sse):
            errors.append(f"{name}: needs aws:kms encryption with BucketKeyEnabled")
        if (p.get("VersioningConfiguration") or {}).get("Status") != "Enabled":
            errors.append(f"{name}: versioning must be Enabled")
        rules = [r for r in ((p.get("LifecycleConfiguration") or {}).get("Rules") or [])
                 if r.get("Status") == "Enabled" and not r.get("Prefix") and not r.get("Filter")]
        if not any(r.get("NoncurrentVersionExpiration") for r in rules):
            errors.append(f"{name}: versioned, so it needs a whole-bucket lifecycle rule with "
                          "NoncurrentVersionExpiration (else every deleted file is kept for ever)")
        if not any(r.get("AbortIncompleteMultipartUpload") for r in rules):
            errors.append(f"{name}: needs a whole-bucket lifecycle rule with "
                          "AbortIncompleteMultipartUpload (abandoned uploads are billed until aborted)")
        pab = p.get("PublicAccessBlockConfiguration") or {}
        for k in ["BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"]:
            if pab.get(k) is not True:
                errors.append(f"{name}: PublicAccessBlockConfiguration.{k} must be true")
        denies_plain = False
        for pol in policies:
            if pol["Properties"].get("Bucket") != {"Ref": name}:
                continue
            for st in statements(pol["Properties"].get("PolicyDocument")):
                cond = (st.get("Condition") or {}).get("Bool") or {}
                if st.get("Effect") == "Deny" and str(cond.get("aws:SecureTransport")).lower() == "false":
                    denies_plain = True
        if not denies_plain:
            errors.append(f"{name}: needs a bucket policy denying aws:SecureTransport=false")
    for e in errors:
        print(e)
    if errors:
        return 1
    scoped = f", scoped to the {len(scope[2])} tables of {sys.argv[3]}" if scope else ""
    print(f"template rules: {len(functions)} functions, {len(machines)} state machine(s), {len(buckets)} bucket(s){scoped}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
