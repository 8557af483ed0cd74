//! Getting models: repo ids, the curated catalog, downloads from the hub into
//! the shared Hugging Face cache, the local library, and whether a model fits.

pub mod architecture;
pub mod catalog;
pub mod client;
pub mod config;
pub mod download;
pub mod error;
pub mod fit;
pub(crate) mod http;
pub mod library;
pub mod repo_id;

pub use crate::family::shards::RankPart;
pub use client::{Hub, RepoFile, RepoInfo, SearchHit};
pub use config::HubConfig;
pub use download::{DownloadCancel, DownloadEvent, DownloadOptions, DownloadSummary, OnCancel};
pub use error::HubError;
pub use repo_id::ModelRef;
pub mod sizing;
