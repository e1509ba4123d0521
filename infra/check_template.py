#!/usr/bin/env python3
"""Policy and structure rules for template.yaml that cfn-lint does not know.

Security (floe's contract for a deployment):
  * every function has its own role: inline `Policies`, no shared `Role`;
  * no `*` action or `service:*` action, and no `Resource: "*"`, in any function policy;
  * the data bucket: KMS encryption with a bucket key, versioning on, public access fully blocked,
    and a bucket policy denying requests without TLS.
Structure:
  * every function is `rust-cargolambda` on provided.al2023/arm64 with `Handler: bootstrap`, and
    its `CodeUri` is a package of this workspace whose name matches `BuildProperties.Binary`;
  * every event type is one the function's binary handles.

Exit status 1 with one line per violation; 0 and a summary when clean.
Usage: check_template.py [template.yaml] [workspace root]
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


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "template.yaml"
    root = sys.argv[2] if len(sys.argv) > 2 else "."
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
        for policy in as_list(props.get("Policies") or []):
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
    buckets = {k: v for k, v in resources.items() if v.get("Type") == "AWS::S3::Bucket"}
    policies = [v for v in resources.values() if v.get("Type") == "AWS::S3::BucketPolicy"]
    for name, b in buckets.items():
        p = b.get("Properties", {})
        sse = (p.get("BucketEncryption") or {}).get("ServerSideEncryptionConfiguration") or []
        if not any(r.get("ServerSideEncryptionByDefault", {}).get("SSEAlgorithm") == "aws:kms" and r.get("BucketKeyEnabled") for r in sse):
            errors.append(f"{name}: needs aws:kms encryption with BucketKeyEnabled")
        if (p.get("VersioningConfiguration") or {}).get("Status") != "Enabled":
            errors.append(f"{name}: versioning must be Enabled")
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
    print(f"template rules: {len(functions)} functions, {len(buckets)} bucket(s): ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
