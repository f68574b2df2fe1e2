//! Cutting a long conversation into its per-message pieces from one rendering of the whole, instead of
//! one rendering per prefix (which is quadratic in the number of messages).
//!
//! The cut is defined by the prefixes: message k's piece ends where the rendering of messages `..=k`
//! ends, and an assistant message's piece starts after the generation prompt that asked for it
//! ([`ChatRenderer::pieces_by_prefixes`] renders exactly that). Here the same cuts come from a
//! [`Layout`]: the rendering of the whole conversation and where each message's text ends in it.
//!
//! - ChatML is rendered by this crate, which records where each message ends as it goes: exact.
//! - A model's template is rendered once with each message wrapped in an object that notes how much
//!   text had been written whenever the template read it. Message k starts at its first read after the
//!   last read of message k - 1 (reads from a scan of the conversation before the main loop come
//!   earlier): a template that reads a message before writing it, as chat templates do, gives exactly
//!   its start, and so the end of the message before. A few prefixes (the first, the
//!   middle and the last, and the generation prompts before the first and the last assistant replies)
//!   are then rendered for real and must agree; otherwise the conversation is tokenized whole, which is
//!   what an unstable template gets anyway.
//!
//! Either way the work is a constant number of renderings of the conversation.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use minijinja::value::{DynObject, Enumerator, Object, ObjectRepr};
use minijinja::{Environment, Value as JinjaValue};
use serde_json::Value;

use super::{ChatRenderer, Piece, Rendering};
use crate::ChatError;
use crate::chatml::{CHATML_GENERATION_PROMPT, render_chatml_marking};
use crate::message::{ChatMessage, message_value};
use crate::template::TEMPLATE_NAME;

/// Conversations of up to this many messages are cut by rendering each prefix (at most this many
/// renderings each for the prefixes and the generation prompts).
pub(super) const RENDER_PREFIXES_UP_TO: usize = 8;

/// The rendering of a whole conversation, without a generation prompt, and where each message ends.
struct Layout {
    text: String,
    /// `ends[k]`: the length of the rendering of `messages[..=k]`.
    ends: Vec<usize>,
    /// What rendering with a generation prompt adds at the end (`Err`: that rendering failed; `None`:
    /// it is not an extension of `text`).
    generation: Result<Option<String>, ChatError>,
    /// Whether the layout was measured rather than known, so it must be checked against prefixes.
    measured: bool,
}

impl ChatRenderer {
    /// [`ChatRenderer::pieces`] from one rendering of the conversation (see the module documentation).
    pub(super) fn pieces_by_layout(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<Rendering, ChatError> {
        let whole = |renderer: &ChatRenderer| {
            renderer.render_canonical(messages, tools, add_generation_prompt).map(Rendering::Whole)
        };
        let Some(layout) = self.layout(messages, tools) else {
            return whole(self);
        };
        if layout.measured && !self.agrees_with_prefixes(messages, tools, &layout) {
            return whole(self);
        }
        let Layout { text, ends, generation, .. } = layout;
        let generation_prompt = generation.as_ref().ok().and_then(Option::as_deref).filter(|g| !g.is_empty());
        let mut pieces = Vec::with_capacity(messages.len() * 2 + 1);
        let mut done = 0;
        for (k, message) in messages.iter().enumerate() {
            let end = ends[k];
            if message.role == "assistant" {
                // The generation prompt that asked for this reply, as a piece of its own: what rendering
                // the messages before it with a generation prompt adds to their rendering (`done`).
                let first;
                let prompt = if k == 0 {
                    first = self.render_canonical(&[], tools, true).ok();
                    first.as_deref().filter(|prompt| !prompt.is_empty())
                } else {
                    generation_prompt
                };
                if let Some(prompt) = prompt {
                    if done + prompt.len() > end || !text[done..].starts_with(prompt) {
                        return whole(self);
                    }
                    pieces.push(Piece { text: prompt.to_string(), reply: None });
                    done += prompt.len();
                }
            }
            if end < done {
                return whole(self);
            }
            if end > done {
                let reply = (message.role == "assistant" && message.tool_calls.is_empty())
                    .then(|| message.content.clone())
                    .flatten();
                pieces.push(Piece { text: text[done..end].to_string(), reply });
            }
            done = end;
        }
        if add_generation_prompt {
            match generation? {
                None => return whole(self),
                Some(prompt) if !prompt.is_empty() => pieces.push(Piece { text: prompt, reply: None }),
                Some(_) => {}
            }
        }
        Ok(Rendering::Pieces(pieces))
    }

    /// The layout of a conversation (of at least one message), or `None` when it cannot be measured.
    fn layout(&self, messages: &[ChatMessage], tools: &[Value]) -> Option<Layout> {
        let Some(env) = &self.template else {
            let mut ends = Vec::with_capacity(messages.len());
            #[cfg(test)]
            count_rendering();
            let text = render_chatml_marking(messages, tools, false, &mut ends);
            let generation = Ok(Some(CHATML_GENERATION_PROMPT.to_string()));
            return Some(Layout { text, ends, generation, measured: false });
        };
        let text = self.render_canonical(messages, tools, false).ok()?;
        let ends = self.measure(env, messages, tools, &text)?;
        let generation = self
            .render_canonical(messages, tools, true)
            .map(|full| full.strip_prefix(text.as_str()).map(str::to_string));
        Some(Layout { text, ends, generation, measured: true })
    }

    /// Renders with probed messages and derives where each message ends in `text` (the plain rendering).
    fn measure(
        &self,
        env: &Environment<'static>,
        messages: &[ChatMessage],
        tools: &[Value],
        text: &str,
    ) -> Option<Vec<usize>> {
        let probe = Arc::new(Probe::default());
        let probed: Vec<JinjaValue> = messages
            .iter()
            .enumerate()
            .map(|(index, message)| {
                let value = JinjaValue::from_serialize(message_value(message));
                let inner = value.as_object()?.clone();
                Some(JinjaValue::from_object(ProbedMessage { index, inner, probe: probe.clone() }))
            })
            .collect::<Option<_>>()?;
        let template = env.get_template(TEMPLATE_NAME).ok()?;
        let context = self.context(JinjaValue::from(probed), tools, false);
        let mut writer = ProbeWriter { probe: probe.clone(), out: Vec::with_capacity(text.len()) };
        #[cfg(test)]
        count_rendering();
        template.render_captured_to(context, &mut writer).ok()?;
        if writer.out != text.as_bytes() {
            return None;
        }
        // Each message's reads in time order: (when, text written by then).
        let reads = probe.reads.lock().ok()?;
        let mut seen: Vec<Vec<(usize, usize)>> = vec![Vec::new(); messages.len()];
        for (when, &(index, written)) in reads.iter().enumerate() {
            seen.get_mut(index)?.push((when, written));
        }
        // Message k starts at its first read after the last read of message k - 1: reads made earlier
        // (a scan of the conversation before the main loop, say) are not where it is written.
        let mut ends = Vec::with_capacity(messages.len());
        for k in 1..messages.len() {
            let (after, _) = *seen[k - 1].last()?;
            let &(_, start) = seen[k].iter().find(|&&(when, _)| when > after)?;
            ends.push(start);
        }
        ends.push(text.len());
        let ordered = ends.windows(2).all(|pair| pair[0] <= pair[1]);
        (ordered && ends.iter().all(|&end| text.is_char_boundary(end))).then_some(ends)
    }

    /// Whether a measured layout agrees with real renderings of a few prefixes and generation prompts.
    fn agrees_with_prefixes(&self, messages: &[ChatMessage], tools: &[Value], layout: &Layout) -> bool {
        let n = messages.len();
        let prefix_of = |k: usize| &layout.text[..layout.ends[k - 1]];
        let mut lengths = vec![1, n / 2, n - 1];
        lengths.dedup();
        for k in lengths.into_iter().filter(|&k| (1..n).contains(&k)) {
            match self.render_canonical(&messages[..k], tools, false) {
                Ok(rendered) if rendered == prefix_of(k) => {}
                _ => return false,
            }
        }
        let generation = layout.generation.as_ref().ok().and_then(Option::as_deref).filter(|g| !g.is_empty());
        let replies: Vec<usize> = (1..n).filter(|&k| messages[k].role == "assistant").collect();
        for k in [replies.first(), replies.last()].into_iter().flatten().copied() {
            let before = prefix_of(k);
            // The prefix rendering splits off a generation prompt when it extends the text before the reply.
            let split = self
                .render_canonical(&messages[..k], tools, true)
                .ok()
                .filter(|prompt| prompt.len() > before.len() && prompt.starts_with(before));
            let agrees = match (split, generation) {
                (None, None) => true,
                (Some(prompt), Some(generation)) => {
                    prompt.len() == before.len() + generation.len() && prompt.ends_with(generation)
                }
                _ => false,
            };
            if !agrees {
                return false;
            }
        }
        true
    }
}

/// What a probed rendering noted: text written so far, and each read of a message with the amount of
/// text written before it.
#[derive(Debug, Default)]
struct Probe {
    written: AtomicUsize,
    reads: Mutex<Vec<(usize, usize)>>,
}

impl Probe {
    fn read(&self, index: usize) {
        let written = self.written.load(Ordering::Relaxed);
        if let Ok(mut reads) = self.reads.lock() {
            reads.push((index, written));
        }
    }
}

/// A message as the template sees it, noting each time the template reads it.
#[derive(Debug)]
struct ProbedMessage {
    index: usize,
    inner: DynObject,
    probe: Arc<Probe>,
}

impl Object for ProbedMessage {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        self.inner.repr()
    }

    fn get_value(self: &Arc<Self>, key: &JinjaValue) -> Option<JinjaValue> {
        self.probe.read(self.index);
        self.inner.get_value(key)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.probe.read(self.index);
        self.inner.enumerate()
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        self.inner.enumerator_len()
    }

    fn is_true(self: &Arc<Self>) -> bool {
        self.inner.is_true()
    }

    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.probe.read(self.index);
        self.inner.render(f)
    }
}

/// The output of a probed rendering, counting what was written.
struct ProbeWriter {
    probe: Arc<Probe>,
    out: Vec<u8>,
}

impl Write for ProbeWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.out.extend_from_slice(bytes);
        self.probe.written.fetch_add(bytes.len(), Ordering::Relaxed);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
thread_local! {
    static RENDERINGS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts one rendering of a conversation (tests check that cutting one takes a bounded number).
#[cfg(test)]
pub(super) fn count_rendering() {
    RENDERINGS.with(|count| count.set(count.get() + 1));
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_tokenizer::Tokenizer;

    /// A system message, then user and assistant turns whose text starts and ends with white space.
    fn conversation(turns: usize) -> Vec<ChatMessage> {
        let mut messages = vec![ChatMessage::new("system", "You are terse.")];
        for i in 0..turns {
            messages.push(ChatMessage::new("user", &format!("  question {i}?\n")));
            messages.push(ChatMessage::new("assistant", &format!("\n\nanswer {i} ")));
        }
        messages.push(ChatMessage::new("user", "last"));
        messages
    }

    fn renderer(template: Option<&str>) -> ChatRenderer {
        ChatRenderer::new(template, Arc::new(Tokenizer::builtin())).unwrap()
    }

    fn smollm2() -> ChatRenderer {
        let tokenizer = Tokenizer::from_gguf_path(&kvroute_test_support::smollm2_path()).unwrap();
        let template = tokenizer.chat_template().unwrap().to_string();
        ChatRenderer::new(Some(&template), Arc::new(tokenizer)).unwrap()
    }

    /// Llama 3 style: the system message is taken out of the list before the loop.
    const SLICING: &str = "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}{%- set system_message = \
        messages[0]['content']|trim %}{%- set messages = messages[1:] %}{%- else %}{%- set system_message = 'Be \
        helpful.' %}{%- endif %}{{- '<|start_header_id|>system<|end_header_id|>\n\n' + system_message + '<|eot_id|>' \
        }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + \
        message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- \
        '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}";

    /// Qwen style: the system message in a header, and a backwards scan of the conversation first.
    const SCANNING: &str = "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + \
        messages[0].content + '<|im_end|>\n' }}{%- endif %}{%- set ns = namespace(last=0) %}{%- for message in \
        messages[::-1] %}{%- if message.role == 'user' and ns.last == 0 %}{%- set ns.last = 1 %}{%- endif %}{%- \
        endfor %}{%- for message in messages %}{%- if message.role == 'system' and loop.first %}{%- else %}{{- \
        '<|im_start|>' + message.role + '\n' + message.content | tojson + '<|im_end|>\n' }}{%- endif %}{%- endfor \
        %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}";

    /// Writes before it reads each message: the layout cannot be measured, so the text is cut whole.
    const WRITES_FIRST: &str = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if \
        add_generation_prompt %}<|assistant|>{% endif %}";

    /// Rewrites earlier turns: unstable, whole text either way.
    const UNSTABLE: &str = "{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}";

    fn assert_same_cut(renderer: &ChatRenderer, messages: &[ChatMessage], tools: &[Value]) {
        let starts_with_reply = messages[0].role == "assistant";
        for len in RENDER_PREFIXES_UP_TO + 1..=messages.len() {
            let cut = renderer.pieces_by_prefixes(&messages[..len], tools, true).unwrap();
            assert!(starts_with_reply || matches!(cut, Rendering::Pieces(_)), "{len} messages: cut whole");
            for generation in [false, true] {
                let by_prefixes = renderer.pieces_by_prefixes(&messages[..len], tools, generation).unwrap();
                let by_layout = renderer.pieces_by_layout(&messages[..len], tools, generation).unwrap();
                assert_eq!(by_layout, by_prefixes, "{len} messages, generation prompt {generation}");
            }
        }
    }

    #[test]
    fn one_rendering_cuts_like_every_prefix() {
        let weather = serde_json::json!({"type": "function", "function": {"name": "weather"}});
        assert_same_cut(&renderer(None), &conversation(8), &[]);
        assert_same_cut(&renderer(None), &conversation(8), std::slice::from_ref(&weather));
        assert_same_cut(&renderer(None), &conversation(8)[1..], std::slice::from_ref(&weather));
        assert_same_cut(&smollm2(), &conversation(8), &[]);
        assert_same_cut(&smollm2(), &conversation(8)[1..], &[]);
        assert_same_cut(&renderer(Some(SLICING)), &conversation(8), &[]);
        assert_same_cut(&renderer(Some(SLICING)), &conversation(8)[1..], &[]);
        assert_same_cut(&renderer(Some(SCANNING)), &conversation(8), &[]);
        // A conversation that starts with the assistant.
        assert_same_cut(&renderer(None), &conversation(8)[2..], std::slice::from_ref(&weather));
        // (SmolLM2 puts its default system message before it: every cut is whole.)
        assert_same_cut(&smollm2(), &conversation(8)[2..], &[]);
    }

    #[test]
    fn random_conversations_cut_like_every_prefix() {
        let atoms = [" ", "\n", "\n\n", "\t", "word", "123", "!", "é", "🦀", "<|im_end|>", "{{ x }}", ""];
        let roles = ["user", "assistant", "assistant", "system", "tool"];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |bound: usize| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as usize % bound
        };
        let weather = serde_json::json!({"type": "function", "function": {"name": "weather"}});
        let renderers = [renderer(None), smollm2(), renderer(Some(SLICING))];
        for _ in 0..24 {
            let messages: Vec<ChatMessage> = (0..9 + next(12))
                .map(|_| {
                    let content: String = (0..next(5)).map(|_| atoms[next(atoms.len())]).collect();
                    ChatMessage::new(roles[next(roles.len())], &content)
                })
                .collect();
            for renderer in &renderers {
                for tools in [&[][..], std::slice::from_ref(&weather)] {
                    for generation in [false, true] {
                        let by_prefixes = renderer.pieces_by_prefixes(&messages, tools, generation).unwrap();
                        let by_layout = renderer.pieces_by_layout(&messages, tools, generation).unwrap();
                        assert_eq!(by_layout, by_prefixes, "{renderer:?} {messages:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn unmeasurable_templates_are_cut_whole() {
        let messages = conversation(8);
        for template in [WRITES_FIRST, UNSTABLE] {
            let renderer = renderer(Some(template));
            let text = renderer.render_canonical(&messages, &[], true).unwrap();
            assert_eq!(renderer.pieces_by_layout(&messages, &[], true).unwrap(), Rendering::Whole(text));
        }
    }

    #[test]
    fn renderings_do_not_grow_with_the_conversation() {
        for renderer in [renderer(None), smollm2(), renderer(Some(SLICING)), renderer(Some(SCANNING))] {
            for turns in [8, 64, 512] {
                let messages = conversation(turns);
                RENDERINGS.with(|count| count.set(0));
                let pieces = renderer.pieces(&messages, &[], true).unwrap();
                let renderings = RENDERINGS.with(std::cell::Cell::get);
                assert!(matches!(pieces, Rendering::Pieces(_)));
                assert!(renderings <= 10, "{renderer:?}: {renderings} renderings for {} messages", messages.len());
            }
        }
    }
}
