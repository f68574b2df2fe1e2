//! A Hugging Face chat template compiled for minijinja, with the functions and filters templates use.

use minijinja::{Environment, ErrorKind, Value as JinjaValue};

use crate::ChatError;
use crate::pyjson::tojson;
use crate::strftime::strftime_now;

/// The name the compiled template is registered under.
pub(crate) const TEMPLATE_NAME: &str = "chat_template";

/// Marks an error raised by the template's `raise_exception`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

pub(crate) fn render_error(err: minijinja::Error) -> ChatError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&err);
    while let Some(cause) = source {
        if let Some(raised) = cause.downcast_ref::<Raised>() {
            return ChatError::Raised(raised.0.clone());
        }
        source = cause.source();
    }
    ChatError::Render(err.to_string())
}

/// Compiles a Hugging Face chat template.
pub(crate) fn compile(source: &str) -> Result<Environment<'static>, ChatError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    minijinja_contrib::add_to_environment(&mut env);
    env.add_function("raise_exception", |message: String| -> Result<JinjaValue, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
    });
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_template_owned(TEMPLATE_NAME, strip_generation_tags(source))
        .map_err(|err| ChatError::Template(err.to_string()))?;
    Ok(env)
}

/// Turns Hugging Face's `{% generation %}` / `{% endgeneration %}` markers
/// (which only mark assistant text for training masks) into a no-op block.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let tag = &rest[start..start + len + 2];
        let inner = tag[2..tag.len() - 2].trim_matches('-').trim();
        let left = if tag.starts_with("{%-") { "-" } else { "" };
        let right = if tag.ends_with("-%}") { "-" } else { "" };
        match inner {
            "generation" => out.push_str(&format!("{{%{left} if true {right}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{left} endif {right}%}}")),
            _ => out.push_str(tag),
        }
        rest = &rest[start + tag.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_no_ops() {
        assert_eq!(strip_generation_tags("a{% generation %}b{%- endgeneration -%}c"), "a{% if true %}b{%- endif -%}c");
        assert_eq!(strip_generation_tags("{{ x }}{% if y %}z{% endif %}"), "{{ x }}{% if y %}z{% endif %}");
    }
}
