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
            "wildcard resource",
            "Resource: !GetAtt DataKey.Arn",
            "Resource: \"*\"",
            "Resource *",
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
