//! CloudWatch Embedded Metric Format: a JSON log line that CloudWatch turns into metrics, with no
//! API call from the function ("Specification: Embedded metric format", CloudWatch User Guide).
//! One line holds one set of dimension values and any number of metrics.

use serde_json::{json, Map, Value};

/// The namespace keyway's metrics are published under.
pub const NAMESPACE: &str = "keyway";

/// One EMF line being built.
#[derive(Clone, Debug, PartialEq)]
pub struct Emf {
    timestamp_millis: i64,
    dimensions: Vec<(String, String)>,
    metrics: Vec<(String, &'static str, f64)>,
    /// Members of the line that are no metric: CloudWatch Logs Insights reads them.
    properties: Vec<(String, Value)>,
}

impl Emf {
    /// An empty line stamped `timestamp_millis` (epoch milliseconds).
    pub fn new(timestamp_millis: i64) -> Self {
        Self {
            timestamp_millis,
            dimensions: Vec::new(),
            metrics: Vec::new(),
            properties: Vec::new(),
        }
    }

    /// Adds dimension `name`: every metric of the line is published under its `value`.
    pub fn dimension(mut self, name: &str, value: impl Into<String>) -> Self {
        self.dimensions.push((name.to_owned(), value.into()));
        self
    }

    /// Adds metric `name`, a count (unit `Count`).
    pub fn count(mut self, name: &str, value: u64) -> Self {
        self.metrics.push((name.to_owned(), "Count", value as f64));
        self
    }

    /// Adds metric `name`, a size in bytes (unit `Bytes`).
    pub fn bytes(mut self, name: &str, value: u64) -> Self {
        self.metrics.push((name.to_owned(), "Bytes", value as f64));
        self
    }

    /// A member that is no metric (a list of hot keys, say): searchable in the log, not graphed.
    pub fn property(mut self, name: &str, value: Value) -> Self {
        self.properties.push((name.to_owned(), value));
        self
    }

    /// Adds metric `name`, a duration in milliseconds (unit `Milliseconds`).
    pub fn milliseconds(mut self, name: &str, value: f64) -> Self {
        self.metrics.push((name.to_owned(), "Milliseconds", value));
        self
    }

    /// The line: the `_aws` metadata, then each dimension and metric as a top-level member.
    pub fn to_line(&self) -> String {
        let mut root = Map::new();
        let names: Vec<&str> = self.dimensions.iter().map(|(n, _)| n.as_str()).collect();
        let metrics: Vec<Value> = self
            .metrics
            .iter()
            .map(|(name, unit, _)| json!({"Name": name, "Unit": unit}))
            .collect();
        root.insert(
            "_aws".into(),
            json!({
                "Timestamp": self.timestamp_millis,
                "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE,
                    "Dimensions": [names],
                    "Metrics": metrics,
                }],
            }),
        );
        for (name, value) in &self.dimensions {
            root.insert(name.clone(), Value::String(value.clone()));
        }
        for (name, _, value) in &self.metrics {
            root.insert(name.clone(), json!(value));
        }
        for (name, value) in &self.properties {
            root.insert(name.clone(), value.clone());
        }
        Value::Object(root).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_its_dimensions_and_metrics_and_carries_their_values() {
        let line = Emf::new(1_700_000_000_000)
            .dimension("function", "dynamic-filter")
            .dimension("consumer", "live")
            .count("delivered", 3)
            .count("dropped", 0)
            .to_line();
        let value: Value = serde_json::from_str(&line).unwrap();
        let aws = &value["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(value["_aws"]["Timestamp"], 1_700_000_000_000i64);
        assert_eq!(aws["Namespace"], "keyway");
        assert_eq!(aws["Dimensions"], json!([["function", "consumer"]]));
        assert_eq!(
            aws["Metrics"][0],
            json!({"Name": "delivered", "Unit": "Count"})
        );
        assert_eq!(
            (value["consumer"].as_str(), value["delivered"].as_f64()),
            (Some("live"), Some(3.0))
        );
        assert_eq!(value["dropped"], 0.0);
    }
}
