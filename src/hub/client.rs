//! Talking to the hub: repo info with file sizes and checksums, model search,
//! small files read straight into memory. Built on hf-hub's API client (which
//! carries the endpoint, token and user agent); errors are mapped from the
//! hub's status codes and `X-Error-Code` so each has its own [`HubError`].

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde::{Deserialize, Serialize};

use super::{HubConfig, HubError, ModelRef, config::keychain, repo_id::check_repo_file};

/// One client for the hub and the cache it fills.
#[derive(Clone)]
pub struct Hub {
    pub(crate) config: HubConfig,
    pub(crate) api: hf_hub::api::tokio::Api,
    pub(crate) cache: hf_hub::Cache,
}

/// A repo at one commit, with what each file is.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct RepoInfo {
    pub repo_id: String,
    /// The commit the revision pointed at when asked.
    pub commit: String,
    pub gated: bool,
    pub files: Vec<RepoFile>,
}

#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct RepoFile {
    pub path: String,
    pub size_bytes: u64,
    /// The name of the file's blob in the cache (the hub's ETag): the LFS
    /// sha256 for large files, the git blob id otherwise.
    pub blob_id: String,
    /// For LFS files, the sha256 the bytes must hash to.
    pub sha256: Option<String>,
}

/// A model found by `search`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct SearchHit {
    pub id: String,
    #[serde(default)]
    pub downloads: u64,
    #[serde(default)]
    pub likes: u64,
    #[serde(default, rename = "lastModified")]
    pub last_modified: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Deserialize)]
struct InfoResponse {
    sha: Option<String>,
    #[serde(default)]
    gated: serde_json::Value,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default, rename = "blobId")]
    blob_id: Option<String>,
    #[serde(default)]
    lfs: Option<LfsInfo>,
}

#[derive(Deserialize)]
struct LfsInfo {
    sha256: String,
    size: u64,
}

impl Hub {
    pub fn new(config: HubConfig) -> Result<Self, HubError> {
        let cache = hf_hub::Cache::new(config.cache_dir.clone());
        let api = hf_hub::api::tokio::ApiBuilder::from_cache(cache.clone())
            .with_endpoint(config.endpoint.clone())
            .with_token(config.token.clone())
            .with_user_agent("ondo", env!("CARGO_PKG_VERSION"))
            .with_progress(false)
            .build()
            .map_err(|err| HubError::BadResponse {
                url: config.endpoint.clone(),
                detail: format!("cannot set up the HTTP client: {err}"),
            })?;
        Ok(Self { config, api, cache })
    }

    pub fn config(&self) -> &HubConfig {
        &self.config
    }

    /// The repo's files at `model.revision`, with sizes and checksums.
    pub async fn repo_info(&self, model: &ModelRef) -> Result<RepoInfo, HubError> {
        self.refuse_when_offline(model)?;
        let request = self
            .api
            .repo(model.hf_repo())
            .info_request()
            .query(&[("blobs", "true")]);
        let response = self.send(request, model, None).await?;
        let url = response.url().to_string();
        let info: InfoResponse = response
            .json()
            .await
            .map_err(|err| self.transfer_error(&url, err))?;
        let commit = info.sha.ok_or_else(|| HubError::BadResponse {
            url: url.clone(),
            detail: "no commit sha in the repo info".into(),
        })?;
        let mut files = Vec::with_capacity(info.siblings.len());
        for sibling in info.siblings {
            if !check_repo_file(&sibling.rfilename) {
                return Err(HubError::BadResponse {
                    url,
                    detail: format!("unsafe file name '{}'", sibling.rfilename),
                });
            }
            let (blob_id, sha256, size) = match (sibling.lfs, sibling.blob_id) {
                (Some(lfs), _) => (lfs.sha256.clone(), Some(lfs.sha256), lfs.size),
                (None, Some(blob)) => (blob, None, sibling.size.unwrap_or(0)),
                (None, None) => {
                    return Err(HubError::BadResponse {
                        url,
                        detail: format!("no blob id for '{}'", sibling.rfilename),
                    });
                }
            };
            files.push(RepoFile {
                path: sibling.rfilename,
                size_bytes: size,
                blob_id,
                sha256,
            });
        }
        Ok(RepoInfo {
            repo_id: model.repo_id.clone(),
            commit,
            gated: !matches!(
                info.gated,
                serde_json::Value::Bool(false) | serde_json::Value::Null
            ),
            files,
        })
    }

    /// Models whose id contains `text`, MLX ones only, most downloaded first.
    pub async fn search(&self, text: &str, limit: usize) -> Result<Vec<SearchHit>, HubError> {
        if self.config.offline {
            return Err(HubError::Unreachable {
                endpoint: self.config.endpoint.clone(),
                detail: "offline mode is on (HF_HUB_OFFLINE)".into(),
            });
        }
        let url = format!("{}/api/models", self.config.endpoint);
        let request = self.api.client().get(&url).query(&[
            ("search", text),
            ("filter", "mlx"),
            ("sort", "downloads"),
            ("direction", "-1"),
            ("limit", &limit.to_string()),
        ]);
        let placeholder = ModelRef {
            repo_id: text.to_owned(),
            revision: ModelRef::DEFAULT_REVISION.into(),
        };
        let response = self.send(request, &placeholder, None).await?;
        response
            .json()
            .await
            .map_err(|err| self.transfer_error(&url, err))
    }

    /// A small file (config.json) read into memory without touching the cache,
    /// so the fit can be judged before anything is downloaded.
    pub async fn read_small_file(&self, model: &ModelRef, file: &str) -> Result<Vec<u8>, HubError> {
        self.refuse_when_offline(model)?;
        let url = self.file_url(model, file);
        let response = self
            .send(self.api.client().get(&url), model, Some(file))
            .await?;
        Ok(response
            .bytes()
            .await
            .map_err(|err| self.transfer_error(&url, err))?
            .to_vec())
    }

    /// The first `len` bytes of a file (a safetensors header), by HTTP Range.
    pub async fn read_file_prefix(
        &self,
        model: &ModelRef,
        file: &str,
        len: u64,
    ) -> Result<Vec<u8>, HubError> {
        self.refuse_when_offline(model)?;
        let url = self.file_url(model, file);
        let request = self.api.client().get(&url).header(
            reqwest::header::RANGE,
            format!("bytes=0-{}", len.saturating_sub(1)),
        );
        let response = self.send(request, model, Some(file)).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|err| self.transfer_error(&url, err))?;
        Ok(bytes[..bytes.len().min(len as usize)].to_vec())
    }

    pub(crate) fn file_url(&self, model: &ModelRef, file: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{}",
            self.config.endpoint,
            model.repo_id,
            model.revision.replace('/', "%2F"),
            file
        )
    }

    fn refuse_when_offline(&self, model: &ModelRef) -> Result<(), HubError> {
        if self.config.offline {
            Err(HubError::NotCachedOffline {
                model: model.to_string(),
            })
        } else {
            Ok(())
        }
    }

    /// Sends a request and turns the hub's error answers into named errors.
    pub(crate) async fn send(
        &self,
        request: reqwest::RequestBuilder,
        model: &ModelRef,
        file: Option<&str>,
    ) -> Result<Response, HubError> {
        let response = tokio::time::timeout(self.config.read_timeout, request.send())
            .await
            .map_err(|_| HubError::Unreachable {
                endpoint: self.config.endpoint.clone(),
                detail: format!("no answer in {} s", self.config.read_timeout.as_secs_f32()),
            })?
            .map_err(|err| self.transfer_error(&self.config.endpoint, err))?;
        let status = response.status();
        if status.is_success() || status == StatusCode::RANGE_NOT_SATISFIABLE {
            return Ok(response);
        }
        let code = response
            .headers()
            .get("x-error-code")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let url = response.url().to_string();
        let repo_id = model.repo_id.clone();
        Err(match (status.as_u16(), code.as_str()) {
            (404, "RevisionNotFound") => HubError::RevisionNotFound {
                repo_id,
                revision: model.revision.clone(),
            },
            (404, "EntryNotFound") => HubError::EntryNotFound {
                repo_id,
                file: file.unwrap_or("").to_owned(),
            },
            (404, _) | (401, "RepoNotFound") => HubError::RepoNotFound {
                repo_id,
                endpoint: self.config.endpoint.clone(),
            },
            (401, _) => HubError::Unauthorized {
                repo_id,
                keychain: keychain::hint(),
            },
            (403, _) => HubError::Forbidden { repo_id },
            (status, _) => {
                let body = response.text().await.unwrap_or_default();
                HubError::Http {
                    status,
                    url,
                    body: body.chars().take(300).collect(),
                }
            }
        })
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

/// How long to wait before resuming a dropped transfer for the `attempt`th time.
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(200 * 2u64.pow(attempt.min(5)))
}
