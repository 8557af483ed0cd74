//! Talking to the hub: repo info with file sizes and checksums, model search,
//! small files read straight into memory. Requests go through
//! `Hub::send` in `hub::http` (redirects, waits for a busy hub, error
//! mapping); hf-hub gives the cache layout.

use reqwest::{Method, Url};
use serde::{Deserialize, Serialize};

use super::{
    HubConfig, HubError, ModelRef,
    http::{HubRequest, WaitWatch},
    repo_id::check_repo_file,
};

/// One client for the hub and the cache it fills.
#[derive(Clone)]
pub struct Hub {
    pub(crate) config: HubConfig,
    /// Follows no redirects and carries no token: [`Hub::send`] does both
    /// per request.
    pub(crate) http: reqwest::Client,
    /// The endpoint parsed; `None` when `HF_ENDPOINT` is not a URL (every
    /// request then says so).
    pub(crate) endpoint_url: Option<Url>,
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
    /// The top-level `model_type` of the repo's config.json, as the hub's
    /// search gives it (`config=true`); `None` when the repo has no config.
    #[serde(default)]
    pub model_type: Option<String>,
    /// "not supported yet: model_type X (Ondo runs: ...)" when the engine
    /// cannot run it; `None` when it can, or when the hub sent no config.
    #[serde(default)]
    pub unsupported: Option<String>,
}

/// A search result as the hub sends it: the hit, and the part of the repo's
/// config.json the hub includes when asked for it.
#[derive(Deserialize)]
struct SearchResponseItem {
    #[serde(flatten)]
    hit: SearchHit,
    #[serde(default)]
    config: Option<serde_json::Value>,
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
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("ondo/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| HubError::BadResponse {
                url: config.endpoint.clone(),
                detail: format!("cannot set up the HTTP client: {err}"),
            })?;
        let endpoint_url = Url::parse(&config.endpoint).ok();
        Ok(Self {
            config,
            http,
            endpoint_url,
            cache,
        })
    }

    pub fn config(&self) -> &HubConfig {
        &self.config
    }

    /// The repo's files at `model.revision`, with sizes and checksums,
    /// telling `watch` about waits for a busy hub.
    pub(crate) async fn repo_info_watched(
        &self,
        model: &ModelRef,
        watch: &mut WaitWatch<'_>,
    ) -> Result<RepoInfo, HubError> {
        self.refuse_when_offline(model)?;
        let mut segments = vec!["api", "models"];
        segments.extend(model.repo_id.split('/'));
        segments.extend(["revision", model.revision.as_str()]);
        let mut url = self.url(&segments)?;
        url.query_pairs_mut().append_pair("blobs", "true");
        let response = self.send(&self.get(url, model, None), watch).await?;
        let url = response.url().to_string();
        let info: InfoResponse = response
            .json()
            .await
            .map_err(|err| self.transfer_error(&url, err))?;
        let commit = info.sha.ok_or_else(|| HubError::BadResponse {
            url: url.clone(),
            detail: "no commit sha in the repo info".into(),
        })?;
        if commit.is_empty() || !commit.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(HubError::BadResponse {
                url,
                detail: format!("'{commit}' is not a commit sha"),
            });
        }
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
        let mut url = self.url(&["api", "models"])?;
        url.query_pairs_mut()
            .append_pair("search", text)
            .append_pair("filter", "mlx")
            .append_pair("sort", "downloads")
            .append_pair("direction", "-1")
            .append_pair("limit", &limit.to_string())
            // Each result then carries its config's model_type, so whether
            // Ondo runs it is known without a request per result.
            .append_pair("config", "true");
        let placeholder = ModelRef {
            repo_id: text.to_owned(),
            revision: ModelRef::DEFAULT_REVISION.into(),
        };
        let response = self
            .send(
                &self.get(url, &placeholder, None),
                &mut WaitWatch::default(),
            )
            .await?;
        let url = response.url().to_string();
        let items: Vec<SearchResponseItem> = response
            .json()
            .await
            .map_err(|err| self.transfer_error(&url, err))?;
        Ok(items
            .into_iter()
            .map(|item| {
                let model_type = item
                    .config
                    .as_ref()
                    .and_then(|config| super::architecture::model_type(config))
                    .map(str::to_owned);
                // Without a config in the answer nothing is known yet; the
                // pull reads the repo's config.json before any weights.
                let unsupported = item
                    .config
                    .as_ref()
                    .and_then(|_| super::architecture::unsupported_reason(model_type.as_deref()));
                SearchHit {
                    unsupported,
                    model_type,
                    ..item.hit
                }
            })
            .collect())
    }

    /// A small file (config.json) read into memory without touching the cache,
    /// so the fit can be judged before anything is downloaded.
    pub(crate) async fn read_small_file(
        &self,
        model: &ModelRef,
        file: &str,
        watch: &mut WaitWatch<'_>,
    ) -> Result<Vec<u8>, HubError> {
        self.refuse_when_offline(model)?;
        let url = self.file_url(model, &model.revision, file)?;
        let response = self.send(&self.get(url, model, Some(file)), watch).await?;
        let url = response.url().to_string();
        Ok(response
            .bytes()
            .await
            .map_err(|err| self.transfer_error(&url, err))?
            .to_vec())
    }

    /// The first `len` bytes of a file (a safetensors header), by HTTP Range.
    pub(crate) async fn read_file_prefix(
        &self,
        model: &ModelRef,
        file: &str,
        len: u64,
        watch: &mut WaitWatch<'_>,
    ) -> Result<Vec<u8>, HubError> {
        self.refuse_when_offline(model)?;
        let url = self.file_url(model, &model.revision, file)?;
        let request = HubRequest {
            range: Some(format!("bytes=0-{}", len.saturating_sub(1))),
            ..self.get(url, model, Some(file))
        };
        let response = self.send(&request, watch).await?;
        let url = response.url().to_string();
        let bytes = response
            .bytes()
            .await
            .map_err(|err| self.transfer_error(&url, err))?;
        Ok(bytes[..bytes.len().min(len as usize)].to_vec())
    }

    /// `{endpoint}/{org}/{name}/resolve/{revision}/{file}`. Fetching by a
    /// commit sha rather than a branch keeps every file of a download on
    /// one commit while others push to the branch.
    pub(crate) fn file_url(
        &self,
        model: &ModelRef,
        revision: &str,
        file: &str,
    ) -> Result<Url, HubError> {
        let mut segments: Vec<&str> = model.repo_id.split('/').collect();
        segments.extend(["resolve", revision]);
        segments.extend(file.split('/'));
        self.url(&segments)
    }

    /// The endpoint with `segments` appended to its path, each one escaped:
    /// a revision such as `refs/pr/1` is one segment, its `/` sent as `%2F`.
    fn url(&self, segments: &[&str]) -> Result<Url, HubError> {
        let not_a_url = || HubError::Unreachable {
            endpoint: self.config.endpoint.clone(),
            detail: "HF_ENDPOINT is not a URL such as https://huggingface.co".into(),
        };
        let mut url = self.endpoint_url.clone().ok_or_else(not_a_url)?;
        url.path_segments_mut()
            .map_err(|()| not_a_url())?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    fn get<'a>(&self, url: Url, model: &'a ModelRef, file: Option<&'a str>) -> HubRequest<'a> {
        HubRequest {
            method: Method::GET,
            url,
            range: None,
            model,
            file,
        }
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
}
