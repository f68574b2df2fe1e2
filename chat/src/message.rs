//! A chat message and tool call in OpenAI's shape, as requests send them and templates see them.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::canonical::{canonical_json, canonical_value, parsed_arguments};

/// A chat message in OpenAI's shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// The text; in JSON either a string, `null`, or a list of text parts
    /// (`[{"type": "text", "text": "..."}]`), which are joined with `\n`.
    #[serde(default, deserialize_with = "content_text")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "null_as_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with text content.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.to_string(), content: Some(content.to_string()), ..ChatMessage::default() }
    }
}

/// A function call made by the assistant.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments; a JSON string holding JSON is parsed when rendering.
    pub arguments: Value,
}

/// OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}`,
/// or the flat `{"id", "name", "arguments"}`.
#[derive(Deserialize)]
struct ToolCallWire {
    #[serde(default)]
    id: String,
    #[serde(default)]
    function: Option<FunctionWire>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize)]
struct FunctionWire {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

impl<'de> Deserialize<'de> for ToolCall {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ToolCall, D::Error> {
        let wire = ToolCallWire::deserialize(deserializer)?;
        let (name, arguments) = match (wire.function, wire.name) {
            (Some(function), _) => (function.name, function.arguments),
            (None, Some(name)) => (name, wire.arguments),
            (None, None) => return Err(D::Error::custom("tool call without a function name")),
        };
        Ok(ToolCall { id: wire.id, name, arguments: arguments.unwrap_or_else(|| Value::Object(Map::new())) })
    }
}

impl Serialize for ToolCall {
    /// OpenAI's shape, the arguments as a canonical JSON string.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let value = serde_json::json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": canonical_json(&parsed_arguments(&self.arguments))},
        });
        value.serialize(serializer)
    }
}

fn content_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in &parts {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("text");
                match (kind, part.get("text").and_then(Value::as_str)) {
                    ("text", Some(text)) => texts.push(text),
                    ("text", None) => return Err(D::Error::custom("text content part without text")),
                    (other, _) => {
                        return Err(D::Error::custom(format!(
                            "content part of type {other:?} is not supported (text only)"
                        )));
                    }
                }
            }
            Ok(Some(texts.join("\n")))
        }
        Some(_) => Err(D::Error::custom("content must be a string, null or a list of text parts")),
    }
}

fn null_as_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<ToolCall>, D::Error> {
    Ok(Option::<Vec<ToolCall>>::deserialize(deserializer)?.unwrap_or_default())
}

/// A message as the template sees it (OpenAI's shape, canonical arguments).
pub(crate) fn message_value(message: &ChatMessage) -> Value {
    let mut object = Map::new();
    object.insert("role".into(), Value::String(message.role.clone()));
    object.insert("content".into(), message.content.clone().map_or(Value::Null, Value::String));
    if !message.tool_calls.is_empty() {
        let calls = message
            .tool_calls
            .iter()
            .map(|call| {
                serde_json::json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": canonical_value(&parsed_arguments(&call.arguments))},
                })
            })
            .collect();
        object.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &message.tool_call_id {
        object.insert("tool_call_id".into(), Value::String(id.clone()));
    }
    if let Some(name) = &message.name {
        object.insert("name".into(), Value::String(name.clone()));
    }
    Value::Object(object)
}
