//! CloudWatch Embedded Metric Format: one JSON log line per measurement set, turned into metrics by
//! CloudWatch Logs with no API calls from the function.

use serde_json::{json, Map, Value};

/// Namespace of every floe metric.
pub(crate) const NAMESPACE: &str = "floe";

/// A metric value with its unit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Metric<'a> {
    /// Metric name.
    pub name: &'a str,
    /// Value.
    pub value: f64,
    /// CloudWatch unit (`Count`, `Seconds`, `Milliseconds`, `Bytes`).
    pub unit: &'a str,
}

impl<'a> Metric<'a> {
    /// A count.
    pub(crate) fn count(name: &'a str, value: impl Into<f64>) -> Self {
        Self {
            name,
            value: value.into(),
            unit: "Count",
        }
    }
    /// A duration in seconds.
    pub(crate) fn seconds(name: &'a str, value: f64) -> Self {
        Self {
            name,
            value,
            unit: "Seconds",
        }
    }
}

/// Builds an EMF document with the given dimensions (name, value) and metrics.
pub(crate) fn emf(dimensions: &[(&str, &str)], metrics: &[Metric<'_>], now_ms: i64) -> Value {
    let mut doc = Map::new();
    let dims: Vec<&str> = dimensions.iter().map(|(k, _)| *k).collect();
    let defs: Vec<Value> = metrics
        .iter()
        .map(|m| json!({"Name": m.name, "Unit": m.unit}))
        .collect();
    doc.insert(
        "_aws".into(),
        json!({"Timestamp": now_ms, "CloudWatchMetrics": [{"Namespace": NAMESPACE, "Dimensions": [dims], "Metrics": defs}]}),
    );
    for (k, v) in dimensions {
        doc.insert((*k).into(), Value::from(*v));
    }
    for m in metrics {
        doc.insert(m.name.into(), Value::from(m.value));
    }
    Value::Object(doc)
}

/// Prints an EMF document on stdout, where Lambda ships it to CloudWatch Logs.
pub(crate) fn emit(dimensions: &[(&str, &str)], metrics: &[Metric<'_>]) {
    let doc = || emf(dimensions, metrics, chrono::Utc::now().timestamp_millis());
    #[cfg(test)]
    if capture::keep(doc) {
        return;
    }
    if std::env::var("FLOE_METRICS").as_deref() == Ok("off") {
        return;
    }
    println!("{}", doc());
}

/// Unit tests' view of what a future emits (instead of stdout, shared by the parallel tests).
#[cfg(test)]
pub(crate) mod capture {
    use std::future::Future;
    use std::sync::{Arc, Mutex};

    use serde_json::Value;

    tokio::task_local! {
        static LINES: Arc<Mutex<Vec<Value>>>;
    }

    /// Runs `fut`; what it emitted, one EMF document per line.
    pub(crate) async fn emitted<F: Future>(fut: F) -> (F::Output, Vec<Value>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = LINES.scope(lines.clone(), fut).await;
        let lines = lines.lock().map(|l| l.clone()).unwrap_or_default();
        (out, lines)
    }

    /// Keeps the document when the current future captures; whether it did.
    pub(super) fn keep(doc: impl FnOnce() -> Value) -> bool {
        LINES
            .try_with(|l| {
                if let Ok(mut l) = l.lock() {
                    l.push(doc());
                }
            })
            .is_ok()
    }
}

/// The metrics of a unit of work's usage: `GBSeconds` (duration × memory, what Lambda bills),
/// `ComputeMillis` and the S3 requests by kind (`S3GetRequests`, `S3PutRequests`, …).
pub(crate) fn usage_metrics(u: &crate::summary::Usage) -> Vec<Metric<'static>> {
    let mut m = vec![
        Metric {
            name: "GBSeconds",
            value: u.gb_seconds(),
            unit: "None",
        },
        Metric {
            name: "ComputeMillis",
            value: u.compute_ms as f64,
            unit: "Milliseconds",
        },
    ];
    if let Some(s3) = &u.s3 {
        for (name, n) in [
            ("S3GetRequests", s3.get),
            ("S3PutRequests", s3.put),
            ("S3ListRequests", s3.list),
            ("S3HeadRequests", s3.head),
            ("S3DeleteRequests", s3.delete),
        ] {
            m.push(Metric::count(name, n as f64));
        }
    }
    m
}

/// Emits a unit of work's usage with the given dimensions (always with its `Function`).
pub(crate) fn emit_usage(dimensions: &[(&str, &str)], u: &crate::summary::Usage) {
    let mut dims = vec![("Function", u.function.as_str())];
    dims.extend_from_slice(dimensions);
    emit(&dims, &usage_metrics(u));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emf_document_shape() {
        let d = emf(
            &[("Table", "orders")],
            &[Metric {
                name: "RecordsIn",
                value: 3.0,
                unit: "Count",
            }],
            1,
        );
        assert_eq!(
            d["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0][0],
            "Table"
        );
        assert_eq!(
            d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"],
            "RecordsIn"
        );
        assert_eq!(d["RecordsIn"], 3.0);
        assert_eq!(d["Table"], "orders");
    }

    #[test]
    fn usage_metrics_are_gb_seconds_and_requests_by_kind() {
        let u = crate::summary::Usage {
            function: "ingest".into(),
            compute_ms: 1500,
            memory_mb: 2048,
            s3: Some(crate::summary::S3Requests {
                get: 4,
                put: 2,
                ..Default::default()
            }),
        };
        let d = emf(&[("Function", "ingest")], &usage_metrics(&u), 1);
        assert_eq!(d["GBSeconds"], 3.0);
        assert_eq!(d["ComputeMillis"], 1500.0);
        assert_eq!(d["S3GetRequests"], 4.0);
        assert_eq!(d["S3PutRequests"], 2.0);
        assert_eq!(d["S3ListRequests"], 0.0);
    }
}
