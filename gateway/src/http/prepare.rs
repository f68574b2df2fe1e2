//! From an HTTP request body to a [`GenerateSpec`]: parse the JSON, check the model and the request
//! ([`crate::request_checks`]), render and tokenize the prompt ([`crate::prompts`]). The completion
//! endpoints and `/debug/route` all go through here, so an explained request is the real one. CPU-heavy
//! for large bodies: the handlers run it in the [`crate::cpu_pool::CpuPool`].

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::AppState;
use super::openai::{ChatCompletionRequest, CommonParams, CompletionRequest, PromptInput, StringOrList};
use crate::prompts::PromptSource;
use crate::request_checks::{self, Limits, Params};
use crate::service::{GenerateSpec, ServiceError};
use crate::tenants::Tenant;

/// A checked request, ready to route.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub spec: GenerateSpec,
    /// The served model id, for the response.
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
}

/// Parses a request body as JSON into `T`, naming the offending field on error. Outside bytes: fuzzed.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ServiceError> {
    if std::str::from_utf8(bytes).is_err() {
        return Err(ServiceError::bad_request("the request body is not valid UTF-8", None));
    }
    let mut json = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut json) {
        Ok(request) => json.end().map(|()| request).map_err(|error| bad_body(&error)),
        Err(error) => Err(explain(error, serde_json::from_slice(bytes).ok().as_ref())),
    }
}

/// Deserializes a request from parsed JSON, naming the offending field on error.
fn from_json<T: DeserializeOwned>(value: &Value) -> Result<T, ServiceError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|error| explain(error, Some(value)))
}

/// The error of a body that did not deserialize. A flattened struct hides which of its fields failed, so
/// when the error has no path, the shared parameters are checked on their own to name the field.
fn explain<E: std::fmt::Display>(error: serde_path_to_error::Error<E>, value: Option<&Value>) -> ServiceError {
    if error.path().to_string() == "."
        && let Some(value) = value.filter(|value| value.is_object())
        && let Err(common) = serde_path_to_error::deserialize::<_, CommonParams>(value)
    {
        return invalid_body(common);
    }
    invalid_body(error)
}

fn bad_body(error: &dyn std::fmt::Display) -> ServiceError {
    ServiceError::bad_request(format!("invalid request body: {error}"), None)
}

fn invalid_body<E: std::fmt::Display>(error: serde_path_to_error::Error<E>) -> ServiceError {
    let path = error.path().to_string();
    if path == "." { bad_body(error.inner()) } else { bad_body(&format!("{path}: {}", error.inner())) }
}

/// The parameters of an HTTP request, for [`request_checks::check`].
pub fn params(common: &CommonParams) -> Params {
    Params {
        max_tokens: common.max_completion_tokens.or(common.max_tokens),
        temperature: common.temperature,
        top_p: common.top_p,
        seed: common.seed,
        stop: common.stop.clone().map(StringOrList::into_vec).unwrap_or_default(),
        n: common.n,
        cache_salt: common.cache_salt.clone(),
        user: common.user.clone(),
    }
}

/// Checks the fields both endpoints share and builds the spec of a request for `prompt`.
pub fn spec_from(
    common: &CommonParams,
    tenant: Tenant,
    prompt: Vec<u32>,
    default_max_tokens: u32,
) -> Result<GenerateSpec, ServiceError> {
    let limits = Limits { default_max_tokens, ..Limits::default() };
    request_checks::check_prompt(&prompt)?;
    Ok(request_checks::check(&params(common), &limits)?.into_spec(tenant, prompt))
}

/// Checks a completion request and tokenizes its prompt.
pub fn completion(state: &AppState, tenant: Tenant, request: CompletionRequest) -> Result<Prepared, ServiceError> {
    let model = state.gateway.check_model(request.common.model.as_deref())?;
    let checked = request_checks::check(&params(&request.common), &state.limits)?;
    let source = match request.prompt {
        PromptInput::Text(text) => PromptSource::Text(text),
        PromptInput::Tokens(ids) => PromptSource::Tokens(ids),
        PromptInput::Texts(mut texts) if texts.len() == 1 => PromptSource::Text(texts.remove(0)),
        PromptInput::TokenLists(mut lists) if lists.len() == 1 => PromptSource::Tokens(lists.remove(0)),
        _ => return Err(ServiceError::bad_request("batched prompts are not supported", Some("prompt"))),
    };
    let prompt = state.prompts.tokens(source)?;
    request_checks::check_prompt(&prompt)?;
    Ok(Prepared {
        spec: checked.into_spec(tenant, prompt),
        model,
        stream: request.common.stream,
        include_usage: request.common.stream_options.is_some_and(|options| options.include_usage),
    })
}

/// Checks a chat request and renders and tokenizes its conversation.
pub fn chat(state: &AppState, tenant: Tenant, request: ChatCompletionRequest) -> Result<Prepared, ServiceError> {
    let model = state.gateway.check_model(request.common.model.as_deref())?;
    request_checks::check_messages(request.messages.len(), &state.limits)?;
    let checked = request_checks::check(&params(&request.common), &state.limits)?;
    let source = PromptSource::Chat { messages: request.messages, tools: request.tools };
    let prompt = state.prompts.tokens(source)?;
    request_checks::check_prompt(&prompt)?;
    Ok(Prepared {
        spec: checked.into_spec(tenant, prompt),
        model,
        stream: request.common.stream,
        include_usage: request.common.stream_options.is_some_and(|options| options.include_usage),
    })
}

/// Parses and prepares a `/v1/completions` body.
pub fn completion_body(state: &AppState, tenant: Tenant, body: &[u8]) -> Result<Prepared, ServiceError> {
    completion(state, tenant, parse_json(body)?)
}

/// Parses and prepares a `/v1/chat/completions` body.
pub fn chat_body(state: &AppState, tenant: Tenant, body: &[u8]) -> Result<Prepared, ServiceError> {
    chat(state, tenant, parse_json(body)?)
}

/// Parses and prepares a `/debug/route` body: a chat request when it has `messages`, else a completion
/// request, for the tenant named by its `tenant` field (needed when the gateway has API keys).
pub fn explain_body(state: &AppState, body: &[u8]) -> Result<Prepared, ServiceError> {
    let value: Value = parse_json(body)?;
    let tenant = match value.get("tenant") {
        None | Some(Value::Null) if state.tenants.is_open() => Tenant::anonymous(),
        None | Some(Value::Null) => {
            return Err(ServiceError::bad_request(
                "name the tenant whose cache scope to explain: \"tenant\": NAME",
                Some("tenant"),
            ));
        }
        Some(Value::String(name)) => state
            .tenants
            .by_name(name)
            .ok_or_else(|| ServiceError::bad_request(format!("no tenant is named {name:?}"), Some("tenant")))?,
        Some(_) => return Err(ServiceError::bad_request("tenant must be a string", Some("tenant"))),
    };
    if value.get("messages").is_some() {
        chat(state, tenant, from_json(&value)?)
    } else {
        completion(state, tenant, from_json(&value)?)
    }
}
