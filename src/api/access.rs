//! Who may use the local server: the checks every request passes before a
//! route sees it. On the loopback address the Host header must name this
//! machine (a web page that points its own domain at 127.0.0.1, DNS
//! rebinding, is refused); a request from a web page (it carries `Origin`)
//! is refused unless its origin was allowed, and an allowed one gets the
//! CORS headers; with an API key, every route wants `Authorization: Bearer`
//! or, as Anthropic's clients send it, `x-api-key`.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ApiFailure, Dialect};

/// The access rules of one running server.
#[derive(Debug, Clone)]
pub(crate) struct AccessRules {
    /// Requests must name localhost or a loopback address as their host.
    pub loopback_only_hosts: bool,
    pub api_key: Option<String>,
    /// Web origins allowed to call (`*`: any).
    pub allowed_origins: Vec<String>,
}

impl AccessRules {
    fn origin_allowed(&self, origin: &str) -> bool {
        self.allowed_origins
            .iter()
            .any(|allowed| allowed == "*" || allowed.eq_ignore_ascii_case(origin))
    }

    /// The first rule `headers` break, if any (the preflight aside).
    fn check(&self, headers: &HeaderMap, preflight: bool) -> Result<(), ApiError> {
        if self.loopback_only_hosts {
            let host = headers
                .get(header::HOST)
                .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
                .unwrap_or_default();
            if !names_this_machine(&host) {
                return Err(ApiError::HostRefused { host });
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
            if !self.origin_allowed(&origin) {
                return Err(ApiError::OriginRefused { origin });
            }
        }
        // A browser's preflight never carries credentials; the request it
        // precedes does.
        if let Some(key) = &self.api_key
            && !preflight
        {
            let bearer = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(bearer_token);
            let api_key = headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::trim);
            // Either header may carry it (a client may fill the other with
            // a placeholder).
            let sent = [bearer, api_key];
            if !sent.iter().flatten().any(|sent| same_secret(sent, key)) {
                return Err(ApiError::KeyRefused);
            }
        }
        Ok(())
    }
}

/// `Bearer <token>` (the scheme in any case).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Compares without stopping at the first difference, so the time taken
/// does not tell an attacker how much of a guess was right.
fn same_secret(sent: &str, key: &str) -> bool {
    let (sent, key) = (sent.as_bytes(), key.as_bytes());
    let mut difference = sent.len() ^ key.len();
    for (i, byte) in key.iter().enumerate() {
        difference |= usize::from(byte ^ sent.get(i).copied().unwrap_or(0));
    }
    difference == 0
}

/// Whether a Host header names this machine: `localhost` or a loopback
/// address, with or without a port.
pub(crate) fn names_this_machine(host: &str) -> bool {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [::1]:port
        match rest.split_once(']') {
            Some((address, "")) => address,
            Some((address, port)) if port.strip_prefix(':').is_some_and(is_port) => address,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_port(digits: &str) -> bool {
    !digits.is_empty() && digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit())
}

/// The middleware: refuses what the rules do not allow, answers an allowed
/// preflight, and adds CORS headers for an allowed origin.
pub(crate) async fn enforce(
    State(rules): State<Arc<AccessRules>>,
    request: Request,
    next: Next,
) -> Response {
    let dialect = Dialect::of_path(request.uri().path());
    let origin = request.headers().get(header::ORIGIN).cloned();
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if let Err(error) = rules.check(request.headers(), preflight) {
        return ApiFailure::new(dialect, error).into_response();
    }
    let mut response = if preflight {
        let mut response = StatusCode::NO_CONTENT.into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
        );
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(
                "authorization, content-type, x-api-key, anthropic-version, anthropic-beta",
            ),
        );
        headers.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        response
    } else {
        next.run(request).await
    };
    // Only an allowed origin reaches here with an Origin header.
    if let Some(origin) = origin {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn only_names_of_this_machine_pass_as_hosts() {
        for host in [
            "localhost",
            "localhost:11480",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.5.6.7:80",
            "[::1]",
            "[::1]:11480",
            "localhost.:11480",
        ] {
            assert!(names_this_machine(host), "{host}");
        }
        for host in [
            "",
            "evil.example",
            "evil.example:11480",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "192.168.1.2:11480",
            "[::2]:80",
            "localhost:port",
            "[::1]x",
        ] {
            assert!(!names_this_machine(host), "{host}");
        }
    }

    #[test]
    fn the_key_is_checked_whole_and_only_as_a_bearer_token() {
        let rules = AccessRules {
            loopback_only_hosts: false,
            api_key: Some("s3cret".into()),
            allowed_origins: Vec::new(),
        };
        let with = |value: &str| headers(&[(header::AUTHORIZATION, value)]);
        assert!(rules.check(&with("Bearer s3cret"), false).is_ok());
        assert!(rules.check(&with("bearer  s3cret "), false).is_ok());
        for wrong in ["Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret"] {
            assert!(
                matches!(rules.check(&with(wrong), false), Err(ApiError::KeyRefused)),
                "{wrong}"
            );
        }
        assert!(matches!(
            rules.check(&HeaderMap::new(), false),
            Err(ApiError::KeyRefused)
        ));
        // Anthropic's clients send it as x-api-key.
        let keyed = |value: &str| headers(&[(header::HeaderName::from_static("x-api-key"), value)]);
        assert!(rules.check(&keyed("s3cret"), false).is_ok());
        for wrong in ["s3cre", "Bearer s3cret", ""] {
            assert!(
                matches!(rules.check(&keyed(wrong), false), Err(ApiError::KeyRefused)),
                "{wrong}"
            );
        }
        // A preflight carries no key.
        assert!(rules.check(&HeaderMap::new(), true).is_ok());
    }

    #[test]
    fn web_pages_need_an_allowed_origin() {
        let mut rules = AccessRules {
            loopback_only_hosts: true,
            api_key: None,
            allowed_origins: Vec::new(),
        };
        let page = headers(&[
            (header::HOST, "127.0.0.1:11480"),
            (header::ORIGIN, "https://app.example"),
        ]);
        assert!(matches!(
            rules.check(&page, false),
            Err(ApiError::OriginRefused { .. })
        ));
        rules.allowed_origins = vec!["https://APP.example".into()];
        assert!(rules.check(&page, false).is_ok());
        rules.allowed_origins = vec!["*".into()];
        assert!(rules.check(&page, false).is_ok());
        let rebinding = headers(&[(header::HOST, "app.example:11480")]);
        assert!(matches!(
            rules.check(&rebinding, false),
            Err(ApiError::HostRefused { .. })
        ));
    }
}
