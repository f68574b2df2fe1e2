//! ChatML, the rendering for models without a chat template.

use serde_json::Value;

use crate::canonical::{canonical_json, parsed_arguments};
use crate::message::ChatMessage;

/// The tool section ChatML puts into the system message.
fn chatml_tools_section(tools: &[Value]) -> String {
    let mut out = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        out.push('\n');
        out.push_str(&canonical_json(tool));
    }
    out.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    out
}

/// ChatML, the rendering for models without a template:
/// `<|im_start|>{role}\n{content}<|im_end|>\n` per message and
/// `<|im_start|>assistant\n` as the generation prompt. With tools, the
/// system message (one is added first if there is none) ends with a tool
/// section listing each tool as canonical JSON on its own line; assistant
/// tool calls follow the content as `<tool_call>\n{"name":..,"arguments":..}\n</tool_call>`
/// and tool results are wrapped in `<tool_response>\n..\n</tool_response>`.
pub(crate) fn render_chatml(messages: &[ChatMessage], tools: &[Value], add_generation_prompt: bool) -> String {
    render_chatml_marking(messages, tools, add_generation_prompt, &mut Vec::new())
}

/// [`render_chatml`], pushing onto `ends` where each message's text ends: the length of the rendering
/// of the messages up to it.
pub(crate) fn render_chatml_marking(
    messages: &[ChatMessage],
    tools: &[Value],
    add_generation_prompt: bool,
    ends: &mut Vec<usize>,
) -> String {
    let mut out = String::new();
    let mut rest = messages;
    if !tools.is_empty() {
        out.push_str("<|im_start|>system\n");
        if let Some((first, tail)) = messages.split_first().filter(|(first, _)| first.role == "system") {
            let content = first.content.as_deref().unwrap_or_default();
            if !content.is_empty() {
                out.push_str(content);
                out.push_str("\n\n");
            }
            rest = tail;
        }
        out.push_str(&chatml_tools_section(tools));
        out.push_str("<|im_end|>\n");
        if rest.len() < messages.len() {
            ends.push(out.len());
        }
    }
    for message in rest {
        out.push_str("<|im_start|>");
        out.push_str(&message.role);
        out.push('\n');
        let content = message.content.as_deref().unwrap_or_default();
        if message.role == "tool" {
            out.push_str("<tool_response>\n");
            out.push_str(content);
            out.push_str("\n</tool_response>");
        } else {
            out.push_str(content);
        }
        for (i, call) in message.tool_calls.iter().enumerate() {
            if i > 0 || !content.is_empty() {
                out.push('\n');
            }
            out.push_str("<tool_call>\n{\"name\":");
            out.push_str(&Value::String(call.name.clone()).to_string());
            out.push_str(",\"arguments\":");
            out.push_str(&canonical_json(&parsed_arguments(&call.arguments)));
            out.push_str("}\n</tool_call>");
        }
        out.push_str("<|im_end|>\n");
        ends.push(out.len());
    }
    if add_generation_prompt {
        out.push_str(CHATML_GENERATION_PROMPT);
    }
    out
}

/// What ChatML adds for the assistant's reply.
pub(crate) const CHATML_GENERATION_PROMPT: &str = "<|im_start|>assistant\n";
