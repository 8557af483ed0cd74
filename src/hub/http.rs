//! One request to the hub, made the way the real hub needs it made:
//! redirects followed by hand (a relative `Location` resolved against the URL
//! asked; the token sent only to the hub's own origin, never to the storage
//! host a large file is sent to), answers of 429 and 5xx waited out and sent
//! again (honouring `Retry-After`, bounded in tries and in the length of one
//! wait), and every other refusal turned into a named [`HubError`].

use std::time::{Duration, SystemTime};

use reqwest::{Method, Response, StatusCode, Url, header};

use super::{Hub, HubError, ModelRef, download::DownloadCancel};

/// Redirects followed for one request before the answer counts as broken.
const MAX_REDIRECTS: usize = 10;
/// The wait before the second try when the hub sent no `Retry-After`;
/// doubled for each try after it.
const FIRST_BUSY_WAIT: Duration = Duration::from_secs(1);
/// The hub's message for a token it does not know (sent with 401 and, on
/// the real hub, `X-Error-Code: RepoNotFound`, so the code alone misleads).
const INVALID_TOKEN_MESSAGE: &str = "Invalid credentials";

/// A wait before a request is sent again because the hub answered busy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BusyWait {
    /// The repo file asked for; `None` for the repo's info.
    pub file: Option<String>,
    /// 429, or the 5xx status.
    pub status: u16,
    pub wait: Duration,
    /// The try that comes after the wait (2 for the first retry).
    pub attempt: u32,
    /// Tries in all before giving up.
    pub attempts: u32,
}

/// What one request asks for, and whose it is (for the errors).
pub(crate) struct HubRequest<'a> {
    pub method: Method,
    pub url: Url,
    /// The `Range` header, such as `bytes=1000-`.
    pub range: Option<String>,
    pub model: &'a ModelRef,
    /// The repo file asked for, if it is one.
    pub file: Option<&'a str>,
}

/// Who hears about waits for a busy hub, and what cuts them short.
#[derive(Default)]
pub(crate) struct WaitWatch<'a> {
    pub on_wait: Option<&'a mut (dyn FnMut(BusyWait) + Send)>,
    pub cancel: Option<&'a DownloadCancel>,
}

impl Hub {
    /// Sends `request`, following redirects and waiting out a busy hub, and
    /// returns a successful answer (206 and 416 included: the transfer
    /// decides what a range answer means) or the error it amounts to.
    pub(crate) async fn send(
        &self,
        request: &HubRequest<'_>,
        watch: &mut WaitWatch<'_>,
    ) -> Result<Response, HubError> {
        let attempts = self.config.busy_attempts.max(1);
        let mut attempt = 1;
        loop {
            let response = self.follow_redirects(request).await?;
            let status = response.status();
            if status.is_success() || status == StatusCode::RANGE_NOT_SATISFIABLE {
                return Ok(response);
            }
            if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
                return Err(self.refusal(response, request).await);
            }
            if attempt >= attempts {
                return Err(self.busy_error(status, attempt, None));
            }
            let asked = retry_after(response.headers(), SystemTime::now());
            let wait = busy_wait(attempt, asked, self.config.max_busy_wait).map_err(|asked| {
                self.busy_error(status, attempt, Some(asked.as_secs_f64().ceil() as u64))
            })?;
            drop(response);
            attempt += 1;
            if let Some(on_wait) = watch.on_wait.as_mut() {
                on_wait(BusyWait {
                    file: request.file.map(str::to_owned),
                    status: status.as_u16(),
                    wait,
                    attempt,
                    attempts,
                });
            }
            match watch.cancel {
                Some(cancel) => tokio::select! {
                    () = cancel.cancelled() => return Err(HubError::Cancelled),
                    () = tokio::time::sleep(wait) => {}
                },
                None => tokio::time::sleep(wait).await,
            }
        }
    }

    /// Sends the request and follows redirects by hand, so that each hop
    /// decides for itself whether the token goes with it (only to the hub's
    /// origin) and the answer shows which host gave it: a 403 from the
    /// storage host is an expired link, from the hub a refusal.
    async fn follow_redirects(&self, request: &HubRequest<'_>) -> Result<Response, HubError> {
        let mut url = request.url.clone();
        let mut method = request.method.clone();
        for _ in 0..=MAX_REDIRECTS {
            let mut builder = self.http.request(method.clone(), url.clone());
            if let Some(token) = &self.config.token
                && self.is_hub_origin(&url)
            {
                builder = builder.bearer_auth(token);
            }
            if let Some(range) = &request.range {
                builder = builder.header(header::RANGE, range);
            }
            let response = tokio::time::timeout(self.config.read_timeout, builder.send())
                .await
                .map_err(|_| HubError::Unreachable {
                    endpoint: self.config.endpoint.clone(),
                    detail: format!("no answer in {} s", self.config.read_timeout.as_secs_f32()),
                })?
                .map_err(|err| self.transfer_error(url.as_str(), err))?;
            if !response.status().is_redirection() {
                return Ok(response);
            }
            let Some(location) = response
                .headers()
                .get(header::LOCATION)
                .and_then(|value| value.to_str().ok())
            else {
                return Ok(response);
            };
            // The hub sends small files to `/api/resolve-cache/...` with a
            // relative Location: it is relative to the URL asked.
            url = url.join(location).map_err(|err| HubError::BadResponse {
                url: url.to_string(),
                detail: format!("a redirect to '{location}', which is not a URL: {err}"),
            })?;
            if response.status() == StatusCode::SEE_OTHER {
                method = Method::GET;
            }
        }
        Err(HubError::BadResponse {
            url: request.url.to_string(),
            detail: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    /// Whether `url` is on the hub itself (scheme, host and port of the
    /// endpoint), the only place the token may go.
    pub(crate) fn is_hub_origin(&self, url: &Url) -> bool {
        self.endpoint_url
            .as_ref()
            .is_some_and(|endpoint| endpoint.origin() == url.origin())
    }

    fn busy_error(
        &self,
        status: StatusCode,
        attempts: u32,
        asked_wait_seconds: Option<u64>,
    ) -> HubError {
        let endpoint = self.config.endpoint.clone();
        let max_wait_seconds = self.config.max_busy_wait.as_secs();
        if status == StatusCode::TOO_MANY_REQUESTS {
            HubError::RateLimited {
                endpoint,
                attempts,
                asked_wait_seconds,
                max_wait_seconds,
            }
        } else {
            HubError::ServerError {
                endpoint,
                status: status.as_u16(),
                attempts,
                asked_wait_seconds,
                max_wait_seconds,
            }
        }
    }

    /// The error a refusing answer amounts to, from its status, the hub's
    /// `X-Error-Code` and its message.
    async fn refusal(&self, response: Response, request: &HubRequest<'_>) -> HubError {
        let status = response.status().as_u16();
        let url = response.url().clone();
        let header_text = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let code = header_text("x-error-code");
        let message_header = header_text("x-error-message");
        let body = response.text().await.unwrap_or_default();
        let message = if message_header.is_empty() {
            serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|json| json.get("error")?.as_str().map(str::to_owned))
                .unwrap_or(body)
        } else {
            message_header
        };
        let excerpt: String = message.trim().chars().take(300).collect();
        let file = request.file.unwrap_or(url.path()).to_owned();
        if !self.is_hub_origin(&url) {
            // The storage host a large file was sent to: its link is signed
            // and expires, and an expired one is refused with 403 or 410.
            return if matches!(status, 403 | 410) {
                HubError::LinkExpired {
                    file,
                    status,
                    detail: excerpt,
                }
            } else {
                HubError::Http {
                    status,
                    url: url.to_string(),
                    body: excerpt,
                }
            };
        }
        let repo_id = request.model.repo_id.clone();
        let token_sent = self.config.token.is_some();
        match (status, code.as_str()) {
            // The hub answers a token it does not know with 401 whatever was
            // asked, public repos included.
            (401, code)
                if token_sent && (message.contains(INVALID_TOKEN_MESSAGE) || code.is_empty()) =>
            {
                HubError::TokenRefused {
                    endpoint: self.config.endpoint.clone(),
                    token_source: self.config.token_source,
                }
            }
            (404, "RevisionNotFound") => HubError::RevisionNotFound {
                repo_id,
                revision: request.model.revision.clone(),
            },
            (404, "EntryNotFound") => HubError::EntryNotFound { repo_id, file },
            // Without a token the hub answers 401 RepoNotFound both for a
            // repo that does not exist and for a private one.
            (404, _) | (401, "RepoNotFound") => HubError::RepoNotFound {
                repo_id,
                endpoint: self.config.endpoint.clone(),
            },
            (401, _) => HubError::Unauthorized {
                repo_id,
                keychain: super::config::keychain::hint(),
            },
            (403, _) => HubError::Forbidden { repo_id },
            (status, _) => HubError::Http {
                status,
                url: url.to_string(),
                body: excerpt,
            },
        }
    }

    pub(crate) fn transfer_error(&self, url: &str, err: reqwest::Error) -> HubError {
        if err.is_connect() || err.is_timeout() {
            HubError::Unreachable {
                endpoint: self.config.endpoint.clone(),
                detail: root_cause(&err),
            }
        } else if err.is_decode() {
            HubError::BadResponse {
                url: url.to_owned(),
                detail: root_cause(&err),
            }
        } else {
            HubError::Interrupted {
                file: url.to_owned(),
                detail: root_cause(&err),
            }
        }
    }
}

/// reqwest's top-level message is generic ("error sending request"); the
/// innermost cause says what happened ("Connection refused").
pub(crate) fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// The wait a `Retry-After` header asks for: seconds, or an HTTP date (a
/// date already past asks for no wait).
pub(crate) fn retry_after(headers: &header::HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// How long to wait before try `attempt + 1`: what the hub asked for, else
/// an exponential backoff with jitter (so that many clients refused at once
/// do not all come back at once), at most `max_wait`. A hub asking for more
/// than `max_wait` gets `Err` with what it asked.
pub(crate) fn busy_wait(
    attempt: u32,
    asked: Option<Duration>,
    max_wait: Duration,
) -> Result<Duration, Duration> {
    match asked {
        Some(asked) if asked > max_wait => Err(asked),
        Some(asked) => Ok(asked),
        None => {
            let full = FIRST_BUSY_WAIT
                .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(16)))
                .min(max_wait);
            // Between half and all of it.
            Ok(full.mul_f64(0.5 + fastrand::f64() * 0.5))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(retry_after: &str) -> header::HeaderMap {
        let mut headers = header::HeaderMap::new();
        headers.insert(header::RETRY_AFTER, retry_after.parse().unwrap());
        headers
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_as_a_date() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2026 07:28:00 GMT").unwrap();
        assert_eq!(
            retry_after(&headers("120"), now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            retry_after(&headers(" 1 "), now),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            retry_after(&headers("Wed, 21 Oct 2026 07:28:30 GMT"), now),
            Some(Duration::from_secs(30))
        );
        // A date already past: go now.
        assert_eq!(
            retry_after(&headers("Wed, 21 Oct 2026 07:00:00 GMT"), now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers("soon"), now), None);
        assert_eq!(retry_after(&headers("-5"), now), None);
        assert_eq!(retry_after(&header::HeaderMap::new(), now), None);
    }

    #[test]
    fn busy_waits_honour_the_hub_grow_without_it_and_stay_bounded() {
        let cap = Duration::from_secs(60);
        // What the hub asks for is what is waited, up to the cap.
        assert_eq!(
            busy_wait(1, Some(Duration::from_secs(1)), cap),
            Ok(Duration::from_secs(1))
        );
        assert_eq!(busy_wait(5, Some(cap), cap), Ok(cap));
        assert_eq!(
            busy_wait(1, Some(Duration::from_secs(3600)), cap),
            Err(Duration::from_secs(3600))
        );
        // Without it: 1 s, 2 s, 4 s, ... each between half and all of that.
        for attempt in 1..=5u32 {
            let full = Duration::from_secs(1 << (attempt - 1));
            for _ in 0..20 {
                let wait = busy_wait(attempt, None, cap).unwrap();
                assert!(wait >= full / 2 && wait <= full, "{attempt}: {wait:?}");
            }
        }
        // Never past the cap, however many tries.
        for attempt in [7, 30, u32::MAX] {
            assert!(busy_wait(attempt, None, cap).unwrap() <= cap);
        }
    }
}
