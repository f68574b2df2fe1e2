//! The checks and limits every generation request passes, whichever ingress it came through: HTTP
//! (`/v1/completions`, `/v1/chat/completions`, `/debug/route`) and gRPC (`kvroute.v1.Generate`) turn
//! their wire fields into [`Params`] and call [`check`], so a request refused by one is refused by the
//! other, with the same message and the same parameter name.

use kvroute_proto::domain::SamplingParams;

use crate::service::ServiceError;
use crate::tenants::Tenant;

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP_SEQUENCES: usize = 4;
/// Longest stop string, in bytes. The text stream looks for every stop string in the text it holds
/// back after each token, so a stop string costs work per generated token in proportion to its length.
pub const MAX_STOP_BYTES: usize = 256;
/// Longest `cache_salt`, in bytes: it becomes part of every block hash's scope.
pub const MAX_CACHE_SALT_BYTES: usize = 256;
/// Default cap on the messages of one chat request (`--max-messages`).
pub const DEFAULT_MAX_MESSAGES: usize = 1024;

/// The limits a gateway enforces on requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Messages per chat request.
    pub max_messages: usize,
    /// max_tokens when the request gives none.
    pub default_max_tokens: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_messages: DEFAULT_MAX_MESSAGES,
            default_max_tokens: crate::service::ServiceConfig::default().default_max_tokens,
        }
    }
}

/// A request's generation parameters, whatever wire they came on. `None` means the client gave none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params {
    /// Signed so that a negative value is a clear error, not a parse error.
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    /// Completions per prompt (HTTP's `n`; gRPC always asks for one).
    pub n: Option<u32>,
    pub cache_salt: Option<String>,
    /// The end user (OpenAI's `user`), for the prefix-cache doctor.
    pub user: Option<String>,
}

/// What a request asks for once its parameters are checked (the prompt comes separately).
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    pub sampling: SamplingParams,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    pub cache_salt: Option<String>,
    pub user: Option<String>,
}

impl Checked {
    /// The spec of a request for `prompt` on behalf of `tenant`.
    pub fn into_spec(self, tenant: Tenant, prompt: Vec<u32>) -> crate::service::GenerateSpec {
        crate::service::GenerateSpec {
            prompt,
            tenant,
            cache_salt: self.cache_salt,
            sampling: self.sampling,
            max_tokens: self.max_tokens,
            stop: self.stop,
            user: self.user,
        }
    }
}

fn bad(message: impl Into<String>, param: &'static str) -> ServiceError {
    ServiceError::bad_request(message, Some(param))
}

/// Checks a request's parameters. Cheap: run it before tokenizing the prompt.
pub fn check(params: &Params, limits: &Limits) -> Result<Checked, ServiceError> {
    if params.n.is_some_and(|n| n != 1) {
        return Err(bad("only n = 1 is supported", "n"));
    }
    let max_tokens = match params.max_tokens {
        None => limits.default_max_tokens,
        Some(value) if value < 1 => {
            return Err(bad(format!("max_tokens must be at least 1, got {value}"), "max_tokens"));
        }
        Some(value) => {
            u32::try_from(value).map_err(|_| bad(format!("max_tokens {value} is too large"), "max_tokens"))?
        }
    };
    let sampling = SamplingParams::new(params.temperature.unwrap_or(1.0), params.top_p.unwrap_or(1.0), params.seed)
        .map_err(|error| {
            bad(error.to_string(), if error.field.ends_with("top_p") { "top_p" } else { "temperature" })
        })?;
    if params.stop.len() > MAX_STOP_SEQUENCES {
        return Err(bad(format!("at most {MAX_STOP_SEQUENCES} stop sequences, got {}", params.stop.len()), "stop"));
    }
    if let Some(long) = params.stop.iter().find(|stop| stop.len() > MAX_STOP_BYTES) {
        return Err(bad(format!("a stop sequence is at most {MAX_STOP_BYTES} bytes, got {}", long.len()), "stop"));
    }
    let cache_salt = params.cache_salt.clone().filter(|salt| !salt.is_empty());
    if let Some(salt) = cache_salt.as_ref().filter(|salt| salt.len() > MAX_CACHE_SALT_BYTES) {
        return Err(bad(
            format!("cache_salt is at most {MAX_CACHE_SALT_BYTES} bytes, got {}", salt.len()),
            "cache_salt",
        ));
    }
    let user = params.user.clone().filter(|user| !user.is_empty());
    Ok(Checked { sampling, max_tokens, stop: params.stop.clone(), cache_salt, user })
}

/// Checks the number of messages of a chat request (before it is rendered).
pub fn check_messages(count: usize, limits: &Limits) -> Result<(), ServiceError> {
    if count == 0 {
        return Err(bad("messages must not be empty", "messages"));
    }
    if count > limits.max_messages {
        return Err(bad(format!("at most {} messages per request, got {count}", limits.max_messages), "messages"));
    }
    Ok(())
}

/// Checks a tokenized prompt.
pub fn check_prompt(prompt: &[u32]) -> Result<(), ServiceError> {
    if prompt.is_empty() {
        return Err(bad("the prompt is empty", "prompt"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_of(result: Result<Checked, ServiceError>) -> Option<&'static str> {
        result.err().and_then(|error| error.param())
    }

    #[test]
    fn defaults_and_refusals() {
        let limits = Limits::default();
        let checked = check(&Params::default(), &limits).unwrap();
        assert_eq!(checked.max_tokens, 256);
        assert_eq!(checked.sampling, SamplingParams::new(1.0, 1.0, None).unwrap());
        let params = |f: fn(&mut Params)| {
            let mut params = Params::default();
            f(&mut params);
            params
        };
        assert_eq!(param_of(check(&params(|p| p.max_tokens = Some(0)), &limits)), Some("max_tokens"));
        assert_eq!(param_of(check(&params(|p| p.max_tokens = Some(-3)), &limits)), Some("max_tokens"));
        assert_eq!(param_of(check(&params(|p| p.max_tokens = Some(1 << 40)), &limits)), Some("max_tokens"));
        assert_eq!(param_of(check(&params(|p| p.temperature = Some(3.0)), &limits)), Some("temperature"));
        assert_eq!(param_of(check(&params(|p| p.top_p = Some(1.5)), &limits)), Some("top_p"));
        assert_eq!(param_of(check(&params(|p| p.n = Some(2)), &limits)), Some("n"));
        assert_eq!(param_of(check(&params(|p| p.stop = vec!["x".into(); 5]), &limits)), Some("stop"));
        assert_eq!(param_of(check(&params(|p| p.stop = vec!["x".repeat(257)]), &limits)), Some("stop"));
        assert_eq!(param_of(check(&params(|p| p.cache_salt = Some("s".repeat(257))), &limits)), Some("cache_salt"));
        assert!(check(&params(|p| p.stop = vec!["x".into(); 4]), &limits).is_ok());
        assert_eq!(check(&params(|p| p.cache_salt = Some(String::new())), &limits).unwrap().cache_salt, None);
        assert!(check_messages(0, &limits).is_err());
        assert!(check_messages(1024, &limits).is_ok());
        assert_eq!(check_messages(1025, &limits).unwrap_err().param(), Some("messages"));
        assert_eq!(check_prompt(&[]).unwrap_err().param(), Some("prompt"));
    }
}
