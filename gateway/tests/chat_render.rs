//! Chat rendering: pinned ChatML output, canonical tools, the token-prefix
//! property across turns (ChatML and SmolLM2's own template), and template
//! errors.

// Test helpers fail loudly on bad fixtures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use kvroute_gateway::chat::{ChatError, ChatMessage, ChatRenderer, LruTokenCache, TokenRunCache, ToolCall};
use kvroute_gateway::tokenizer::Tokenizer;
use proptest::prelude::*;
use serde_json::{Value, json};

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn chatml() -> ChatRenderer {
    ChatRenderer::new(None, Arc::new(Tokenizer::builtin())).unwrap()
}

fn smollm2() -> ChatRenderer {
    let tokenizer = Tokenizer::from_gguf_path(&kvroute_test_support::smollm2_path()).unwrap();
    let template = tokenizer.chat_template().unwrap().to_string();
    ChatRenderer::new(Some(&template), Arc::new(tokenizer)).unwrap()
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city"]}}})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {"name": "current_time", "parameters": {"type": "object", "properties": {}}}})
}

/// The same tool with every object's keys in another order.
fn weather_tool_reordered() -> Value {
    let text = r#"{"function": {"parameters": {"required": ["city"], "properties": {"unit": {"enum": ["C", "F"], "type": "string"}, "city": {"type": "string"}}, "type": "object"}, "description": "Weather for a city.", "name": "get_weather"}, "type": "function"}"#;
    serde_json::from_str(text).unwrap()
}

#[test]
fn chatml_text_is_pinned() {
    let renderer = chatml();
    assert!(!renderer.uses_model_template());
    let messages = [msg("system", "You are terse."), msg("user", "Hi!")];
    assert_eq!(
        renderer.render_text(&messages, &[], true).unwrap(),
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        renderer.render_text(&messages, &[], false).unwrap(),
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    );
    let tokens = renderer.render_tokens(&messages, &[], true).unwrap();
    assert_eq!(tokens[0], 100_264);
    assert_eq!(tokens.iter().filter(|&&id| id == 100_265).count(), 2);
    assert_eq!(&tokens[tokens.len() - 3..], &Tokenizer::builtin().encode("<|im_start|>assistant\n")[..]);

    let with_tools = [
        msg("user", "Weather in Paris?"),
        ChatMessage {
            role: "assistant".into(),
            content: None,
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: json!("{\"unit\": \"C\", \"city\": \"Paris\"}"),
            }],
            ..ChatMessage::default()
        },
        ChatMessage {
            role: "tool".into(),
            content: Some("18 C".into()),
            tool_call_id: Some("call_1".into()),
            ..ChatMessage::default()
        },
    ];
    let expected = concat!(
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n",
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
        r#"{"function":{"name":"current_time","parameters":{"properties":{},"type":"object"}},"type":"function"}"#,
        "\n",
        r#"{"function":{"description":"Weather for a city.","name":"get_weather","parameters":{"properties":{"city":{"type":"string"},"unit":{"enum":["C","F"],"type":"string"}},"required":["city"],"type":"object"}},"type":"function"}"#,
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within ",
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n",
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n",
        "<|im_start|>assistant\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"C\"}}\n</tool_call><|im_end|>\n",
        "<|im_start|>tool\n<tool_response>\n18 C\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n",
    );
    assert_eq!(renderer.render_text(&with_tools, &[weather_tool(), time_tool()], true).unwrap(), expected);

    // A system message keeps its text ahead of the tool section.
    let text = renderer.render_text(&[msg("system", "Be brief."), msg("user", "x")], &[time_tool()], false).unwrap();
    assert!(text.starts_with("<|im_start|>system\nBe brief.\n\n# Tools\n"), "{text}");
}

#[test]
fn rendering_is_deterministic_and_canonical() {
    let renderer = chatml();
    let messages = [msg("system", "s"), msg("user", "What time is it, and the weather in Oslo?")];
    let reference = renderer.render_tokens(&messages, &[weather_tool(), time_tool()], true).unwrap();
    for _ in 0..3 {
        assert_eq!(renderer.render_tokens(&messages, &[weather_tool(), time_tool()], true).unwrap(), reference);
    }
    // Tool order and key order do not matter.
    assert_eq!(renderer.render_tokens(&messages, &[time_tool(), weather_tool_reordered()], true).unwrap(), reference);
    assert_eq!(
        renderer.render_text(&messages, &[time_tool(), weather_tool_reordered()], true).unwrap(),
        renderer.render_text(&messages, &[weather_tool(), time_tool()], true).unwrap()
    );
    // A different tool set does.
    assert_ne!(renderer.render_tokens(&messages, &[time_tool()], true).unwrap(), reference);

    // Tool-call arguments: object or JSON string, any key order or spacing.
    let call = |arguments: Value| ChatMessage {
        role: "assistant".into(),
        tool_calls: vec![ToolCall { id: "c".into(), name: "get_weather".into(), arguments }],
        ..ChatMessage::default()
    };
    let forms = [
        json!({"city": "Oslo", "unit": "C"}),
        json!({"unit": "C", "city": "Oslo"}),
        json!("{\"unit\":\"C\",\"city\":\"Oslo\"}"),
        json!("{ \"city\" : \"Oslo\",\n \"unit\": \"C\" }"),
    ];
    let rendered: Vec<Vec<u32>> = forms
        .iter()
        .map(|arguments| renderer.render_tokens(&[msg("user", "q"), call(arguments.clone())], &[], false).unwrap())
        .collect();
    assert!(rendered.windows(2).all(|pair| pair[0] == pair[1]));

    // Caching changes nothing.
    let uncached = chatml().with_cache(None);
    assert_eq!(uncached.render_tokens(&messages, &[weather_tool(), time_tool()], true).unwrap(), reference);
}

/// A conversation whose replies start and end with whitespace, the case
/// where tokenizing the whole text would merge across turn boundaries.
fn conversation() -> Vec<ChatMessage> {
    vec![
        msg("system", "You are a helpful assistant."),
        msg("user", "Write a haiku about caches."),
        msg("assistant", "\n\nBlocks wait in the dark,\n  a prefix returns at dawn —\nno need to recompute.  "),
        msg("user", "  Now one about routers 2+2=4?\n"),
        msg("assistant", " Packets find their way;\tthe shortest queue wins again.\n"),
        msg("user", "Thanks! 🦀"),
        msg("assistant", "You're welcome."),
    ]
}

/// For every assistant turn k: tokens(history before k, with generation
/// prompt) is a prefix of tokens(history through k), and every rendering is
/// a prefix of the next.
fn assert_prefix_property(renderer: &ChatRenderer, messages: &[ChatMessage], tools: &[Value]) {
    let full = renderer.render_tokens(messages, tools, false).unwrap();
    for end in 1..=messages.len() {
        let upto = renderer.render_tokens(&messages[..end], tools, false).unwrap();
        assert!(full.starts_with(&upto), "prefix through message {end} is not a token prefix");
        let prompt = renderer.render_tokens(&messages[..end], tools, true).unwrap();
        if end < messages.len() && messages[end].role == "assistant" {
            assert!(full.starts_with(&prompt), "generation prompt before message {} is not a token prefix", end + 1);
            let next = renderer.render_tokens(&messages[..=end], tools, true).unwrap();
            assert!(next.starts_with(&prompt));
        }
        // Tokens decode to exactly the rendered text.
        let text = renderer.render_text(&messages[..end], tools, true).unwrap();
        assert_eq!(renderer.tokenizer().decode(&prompt).unwrap(), text);
    }
}

#[test]
fn chatml_prefix_property() {
    let renderer = chatml();
    assert_prefix_property(&renderer, &conversation(), &[]);
    assert_prefix_property(&renderer, &conversation(), &[weather_tool(), time_tool()]);
    // Whole-text tokenization would differ here: "\n" + "\n\nBlocks" merges.
    let messages = conversation();
    let whole = renderer.tokenizer().encode(&renderer.render_text(&messages[..3], &[], false).unwrap());
    let prompt = renderer.render_tokens(&messages[..2], &[], true).unwrap();
    assert!(!whole.starts_with(&prompt), "this conversation should exercise the per-piece tokenization");
}

#[test]
fn smollm2_template_prefix_property() {
    let renderer = smollm2();
    assert!(renderer.uses_model_template());
    assert_prefix_property(&renderer, &conversation(), &[]);
    // Without a system message the template inserts its own; prefixes still hold.
    assert_prefix_property(&renderer, &conversation()[1..], &[]);
    let text = renderer.render_text(&conversation()[1..2], &[], true).unwrap();
    assert!(text.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"), "{text}");
}

#[test]
fn smollm2_template_matches_reference_prompt() {
    let renderer = smollm2();
    let path = kvroute_test_support::repo_root().join("testdata/smollm2_greedy.json");
    let json: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let case = json["cases"].as_array().unwrap().iter().find(|case| case["name"] == "chat").unwrap();
    let messages = [msg("system", "You are a helpful assistant."), msg("user", "What is 2+2?")];
    assert_eq!(renderer.render_text(&messages, &[], true).unwrap(), case["prompt_text"].as_str().unwrap());
    let expected: Vec<u32> =
        case["prompt_ids"].as_array().unwrap().iter().map(|id| id.as_u64().unwrap() as u32).collect();
    assert_eq!(renderer.render_tokens(&messages, &[], true).unwrap(), expected);
}

#[test]
fn template_errors_are_errors() {
    let tokenizer = Arc::new(Tokenizer::builtin());
    let raising = "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('tool messages are not supported') }}{% endif %}{{ m.content }}{% endfor %}";
    let renderer = ChatRenderer::new(Some(raising), tokenizer.clone()).unwrap();
    assert_eq!(renderer.render_text(&[msg("user", "ok")], &[], true).unwrap(), "ok");
    let err = renderer.render_text(&[msg("user", "a"), msg("tool", "b")], &[], true).unwrap_err();
    assert!(matches!(&err, ChatError::Raised(message) if message == "tool messages are not supported"), "{err}");
    let err = renderer.render_tokens(&[msg("user", "a"), msg("tool", "b")], &[], true).unwrap_err();
    assert!(matches!(err, ChatError::Raised(_)), "{err}");

    let err = ChatRenderer::new(Some("{% for m in messages %}{{ m.content }"), tokenizer.clone()).unwrap_err();
    assert!(matches!(err, ChatError::Template(_)), "{err}");

    let broken = ChatRenderer::new(Some("{{ messages[0].content + 1 }}"), tokenizer.clone()).unwrap();
    let err = broken.render_text(&[msg("user", "a")], &[], false).unwrap_err();
    assert!(matches!(err, ChatError::Render(_)), "{err}");

    // SmolLM2's template concatenates content, so a message without content fails cleanly.
    let err = smollm2().render_text(&[ChatMessage { role: "user".into(), ..ChatMessage::default() }], &[], true);
    assert!(err.is_err());
}

#[test]
fn hugging_face_template_conventions() {
    let tokenizer = Arc::new(Tokenizer::builtin());
    let template = "\
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {{- '[S]' + message.content.strip() }}
    {%- else %}
        {{- '[' + message.role.upper() + ']' + message['content'] }}
    {%- endif %}
{%- endfor %}
{%- if tools %}{% for tool in tools %}{{ '\\n' + tool | tojson }}{% endfor %}{% endif %}
{%- for key, value in {'b': 1}.items() %}|{{ key }}={{ value }}{% endfor %}
{%- if add_generation_prompt %}{{ bos_token }}<gen>{{ eos_token }}{% endif %}";
    let renderer = ChatRenderer::new(Some(template), tokenizer).unwrap();
    let text = renderer.render_text(&[msg("system", "  padded  "), msg("user", "hi")], &[time_tool()], true).unwrap();
    assert_eq!(
        text,
        "[S]padded[USER]hi\n{\"function\": {\"name\": \"current_time\", \"parameters\": {\"properties\": {}, \"type\": \"object\"}}, \"type\": \"function\"}|b=1<gen><|im_end|>"
    );

    let indented =
        ChatRenderer::new(Some("{{ messages[0] | tojson(indent=2) }}"), Arc::new(Tokenizer::builtin())).unwrap();
    assert_eq!(
        indented.render_text(&[msg("user", "é\"")], &[], false).unwrap(),
        "{\n  \"content\": \"é\\\"\",\n  \"role\": \"user\"\n}"
    );
    // `{% generation %}` markers of training templates are accepted.
    let marked = ChatRenderer::new(
        Some("{% generation %}{{ messages[0].content }}{% endgeneration %}"),
        Arc::new(Tokenizer::builtin()),
    )
    .unwrap();
    assert_eq!(marked.render_text(&[msg("user", "x")], &[], false).unwrap(), "x");
}

#[test]
fn unstable_templates_fall_back_to_whole_text() {
    let tokenizer = Arc::new(Tokenizer::builtin());
    // Renders only the last message: earlier renderings are not prefixes.
    let renderer = ChatRenderer::new(Some("{{ messages[-1].content }}!"), tokenizer.clone()).unwrap();
    let messages = [msg("user", "one"), msg("assistant", "two"), msg("user", "three  four")];
    let text = renderer.render_text(&messages, &[], true).unwrap();
    assert_eq!(text, "three  four!");
    assert_eq!(renderer.render_tokens(&messages, &[], true).unwrap(), tokenizer.encode(&text));
}

#[test]
fn messages_deserialize_from_openai_json() {
    let json = json!([
        {"role": "system", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
        {"role": "user", "content": "hello", "name": "alice"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}
        ]},
        {"role": "tool", "content": "3 C", "tool_call_id": "call_9"}
    ]);
    let messages: Vec<ChatMessage> = serde_json::from_value(json).unwrap();
    assert_eq!(messages[0].content.as_deref(), Some("part one\npart two"));
    assert_eq!(messages[1].name.as_deref(), Some("alice"));
    assert_eq!(messages[2].content, None);
    assert_eq!(messages[2].tool_calls[0].name, "get_weather");
    assert_eq!(messages[2].tool_calls[0].id, "call_9");
    assert_eq!(messages[3].tool_call_id.as_deref(), Some("call_9"));
    // Serialized back in OpenAI's shape, with canonical argument text.
    let back = serde_json::to_value(&messages[2]).unwrap();
    assert_eq!(back["tool_calls"][0]["function"]["arguments"], json!("{\"city\":\"Oslo\"}"));
    assert_eq!(back["tool_calls"][0]["type"], json!("function"));

    let image = json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]});
    let err = serde_json::from_value::<ChatMessage>(image).unwrap_err();
    assert!(err.to_string().contains("image_url"), "{err}");
}

#[test]
fn shared_cache_and_thread_safety() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatRenderer>();
    assert_send_sync::<Tokenizer>();
    let cache = Arc::new(LruTokenCache::new(10_000));
    let renderer = chatml().with_cache(Some(cache.clone() as Arc<dyn TokenRunCache>));
    let first = renderer.render_tokens(&conversation(), &[], true).unwrap();
    let held = cache.len();
    assert!(held >= conversation().len());
    assert_eq!(renderer.render_tokens(&conversation(), &[], true).unwrap(), first);
    assert_eq!(cache.len(), held);
}

fn content_strategy() -> impl Strategy<Value = String> {
    let atoms = prop_oneof![
        Just(" ".to_string()),
        Just("\n".to_string()),
        Just("\n\n".to_string()),
        Just("\t".to_string()),
        Just("word".to_string()),
        Just("123".to_string()),
        Just("!".to_string()),
        Just("é".to_string()),
        Just("🦀".to_string()),
        Just("<|im_end|>".to_string()),
        any::<String>(),
    ];
    proptest::collection::vec(atoms, 0..6).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn chatml_prefix_property_holds_for_any_content(contents in proptest::collection::vec(content_strategy(), 1..6)) {
        let renderer = chatml();
        let messages: Vec<ChatMessage> = contents
            .iter()
            .enumerate()
            .map(|(i, content)| msg(if i % 2 == 0 { "user" } else { "assistant" }, content))
            .collect();
        let full = renderer.render_tokens(&messages, &[], false).unwrap();
        for end in 1..messages.len() {
            if messages[end].role == "assistant" {
                let prompt = renderer.render_tokens(&messages[..end], &[], true).unwrap();
                prop_assert!(full.starts_with(&prompt));
            }
        }
    }
}
