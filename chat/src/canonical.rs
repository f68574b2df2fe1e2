//! Canonical JSON (sorted keys, no insignificant whitespace) and the canonical order of tools, so the
//! same request always renders to the same tokens.

use serde_json::{Map, Value};

/// A JSON value with every object's keys in sorted order (whatever map type
/// serde_json was built with).
pub(crate) fn canonical_value(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut sorted = Map::new();
            for key in keys {
                sorted.insert(key.clone(), canonical_value(&map[key]));
            }
            Value::Object(sorted)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical_value).collect()),
        other => other.clone(),
    }
}

/// Compact JSON with sorted keys.
pub(crate) fn canonical_json(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    write(&map[key], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// Tool-call arguments as JSON: a string holding JSON is parsed.
pub(crate) fn parsed_arguments(arguments: &Value) -> Value {
    match arguments {
        Value::String(text) => serde_json::from_str(text).unwrap_or_else(|_| arguments.clone()),
        other => other.clone(),
    }
}

fn tool_name(tool: &Value) -> &str {
    tool.get("function")
        .and_then(|function| function.get("name"))
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The order a renderer puts a request's tools in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ToolOrder {
    /// Sorted by function name (ties by canonical JSON): the order a client lists them in cannot change the
    /// prompt's tokens, so prefixes stay cacheable.
    #[default]
    Canonical,
    /// As the request lists them (keys still sorted). Only for reproducing what an unstable order does to
    /// prefix caching.
    AsSent,
}

impl ToolOrder {
    /// `canonical` or `as-sent`.
    pub fn from_name(name: &str) -> Option<ToolOrder> {
        match name {
            "canonical" => Some(ToolOrder::Canonical),
            "as-sent" => Some(ToolOrder::AsSent),
            _ => None,
        }
    }

    /// The tools in this order, every object's keys sorted.
    pub(crate) fn apply(self, tools: &[Value]) -> Vec<Value> {
        match self {
            ToolOrder::Canonical => canonical_tools(tools),
            ToolOrder::AsSent => tools.iter().map(canonical_value).collect(),
        }
    }
}

/// The tools in canonical order and key order.
pub(crate) fn canonical_tools(tools: &[Value]) -> Vec<Value> {
    let mut keyed: Vec<(String, String, Value)> = tools
        .iter()
        .map(|tool| {
            let tool = canonical_value(tool);
            (tool_name(&tool).to_string(), canonical_json(&tool), tool)
        })
        .collect();
    keyed.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    keyed.into_iter().map(|(_, _, tool)| tool).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys() {
        let value = serde_json::json!({"b": [1, {"d": null, "c": "x"}], "a": true});
        assert_eq!(canonical_json(&value), r#"{"a":true,"b":[1,{"c":"x","d":null}]}"#);
    }

    #[test]
    fn tools_keep_their_order_only_when_asked() {
        let tools = vec![
            serde_json::json!({"type": "function", "function": {"name": "quote", "parameters": {"b": 1, "a": 2}}}),
            serde_json::json!({"type": "function", "function": {"name": "book"}}),
        ];
        let names =
            |tools: Vec<Value>| -> Vec<String> { tools.iter().map(|tool| tool_name(tool).to_string()).collect() };
        assert_eq!(names(ToolOrder::Canonical.apply(&tools)), ["book", "quote"]);
        assert_eq!(names(ToolOrder::AsSent.apply(&tools)), ["quote", "book"]);
        assert_eq!(canonical_json(&ToolOrder::AsSent.apply(&tools)[0]), canonical_json(&tools[0]));
        assert_eq!(ToolOrder::from_name("as-sent"), Some(ToolOrder::AsSent));
        assert_eq!(ToolOrder::from_name("sorted"), None);
    }
}
