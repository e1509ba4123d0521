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
    if std::env::var("FLOE_METRICS").as_deref() == Ok("off") {
        return;
    }
    println!(
        "{}",
        emf(dimensions, metrics, chrono::Utc::now().timestamp_millis())
    );
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
}
