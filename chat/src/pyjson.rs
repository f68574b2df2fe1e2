//! `tojson` as Hugging Face chat templates expect it: Python's `json.dumps` formatting.

use minijinja::value::Kwargs;
use minijinja::{ErrorKind, Value as JinjaValue};
use serde_json::Value;

/// `tojson` as Hugging Face defines it for chat templates: Python's
/// `json.dumps(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub(crate) fn tojson(value: &JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|err| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {err}")))?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"));
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = PyJson {
        indent,
        item,
        key,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(JinjaValue::from_safe_string(out))
}

/// Python `json.dumps` formatting.
struct PyJson {
    indent: Option<usize>,
    item: String,
    key: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl PyJson {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(indent) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', indent * depth));
        }
    }

    fn write(&self, value: &Value, depth: usize, out: &mut String) {
        match value {
            Value::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            Value::Object(map) if !map.is_empty() => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    self.string(key, out);
                    out.push_str(&self.key);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
            Value::String(text) => self.string(text, out),
            other => out.push_str(&other.to_string()),
        }
    }

    fn string(&self, text: &str, out: &mut String) {
        out.push('"');
        for c in text.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}
