//! Where the hub is, who we are to it and whether to use it at all: read from
//! the same environment variables the Python tools read.

use std::{path::PathBuf, time::Duration};

use crate::paths::DataDirs;

/// How Ondo talks to the hub.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// `HF_ENDPOINT`, else `https://huggingface.co` (no trailing slash).
    pub endpoint: String,
    /// The shared cache (`HF_HUB_CACHE`, `HF_HOME/hub`, `~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
    pub token: Option<String>,
    /// Where the token came from, for `ondo doctor` and error messages.
    pub token_source: Option<TokenSource>,
    /// `HF_HUB_OFFLINE`: never touch the network, use the cache only.
    pub offline: bool,
    /// A transfer that sends nothing for this long counts as dropped.
    pub read_timeout: Duration,
    /// How often a dropped transfer is resumed before giving up (the partial
    /// file is kept either way).
    pub retries: u32,
    /// How many times in all a request is sent while the hub answers it
    /// 429 (too many requests) or 5xx (failing), waiting between tries.
    pub busy_attempts: u32,
    /// The longest one wait for a busy hub; a `Retry-After` asking for more
    /// gives up at once rather than leave a download silently stalled.
    pub max_busy_wait: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    Environment,
    TokenFile,
    Keychain,
}

impl TokenSource {
    /// Where the token was read from, in words a user can act on.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Environment => "the HF_TOKEN environment variable",
            Self::TokenFile => {
                "the Hugging Face token file (HF_TOKEN_PATH, or token beside the hub cache in HF_HOME)"
            }
            Self::Keychain if cfg!(target_os = "macos") => {
                "the keychain (service \"Ondo\", account \"huggingface-token\")"
            }
            Self::Keychain => "the keyring (service Ondo, account huggingface-token)",
        }
    }
}

impl HubConfig {
    pub fn from_env(dirs: &DataDirs) -> Self {
        Self::from_lookup(dirs, |name| {
            std::env::var(name).ok().filter(|v| !v.trim().is_empty())
        })
    }

    pub fn from_lookup(dirs: &DataDirs, lookup: impl Fn(&str) -> Option<String>) -> Self {
        let endpoint = lookup("HF_ENDPOINT")
            .unwrap_or_else(|| "https://huggingface.co".to_owned())
            .trim_end_matches('/')
            .to_owned();
        let offline = lookup("HF_HUB_OFFLINE").is_some_and(|v| is_truthy(&v));
        let (token, token_source) = find_token(dirs, &lookup);
        Self {
            endpoint,
            cache_dir: dirs.hf_cache_dir.clone(),
            token,
            token_source,
            offline,
            read_timeout: Duration::from_secs(30),
            retries: 5,
            busy_attempts: 6,
            max_busy_wait: Duration::from_secs(60),
        }
    }
}

fn is_truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// The order huggingface_hub uses (`HF_TOKEN`, then the token file written by
/// `huggingface-cli login`), then the OS keychain where Ondo's settings store one.
fn find_token(
    dirs: &DataDirs,
    lookup: &impl Fn(&str) -> Option<String>,
) -> (Option<String>, Option<TokenSource>) {
    if let Some(token) = lookup("HF_TOKEN").or_else(|| lookup("HUGGING_FACE_HUB_TOKEN")) {
        return (
            Some(token.trim().to_owned()),
            Some(TokenSource::Environment),
        );
    }
    let token_file = lookup("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| {
        // The token sits beside the hub cache in HF_HOME.
        dirs.hf_cache_dir.parent().map(|home| home.join("token"))
    });
    if let Some(token) = token_file
        .and_then(|path| std::fs::read_to_string(path).ok())
        .map(|text| text.trim().to_owned())
        .filter(|text| !text.is_empty())
    {
        return (Some(token), Some(TokenSource::TokenFile));
    }
    // Tests and CI set ONDO_NO_KEYCHAIN so that no keychain prompt can appear.
    if lookup("ONDO_NO_KEYCHAIN").is_some() {
        return (None, None);
    }
    match keychain::read_token() {
        Some(token) => (Some(token), Some(TokenSource::Keychain)),
        None => (None, None),
    }
}

/// The OS keychain entry Ondo's settings write: service `Ondo`, account
/// `huggingface-token`. Read through the OS's own command-line tool so no
/// keychain library is linked for one lookup.
pub mod keychain {
    pub const SERVICE: &str = "Ondo";
    pub const ACCOUNT: &str = "huggingface-token";

    pub fn read_token() -> Option<String> {
        #[cfg(target_os = "macos")]
        let output = std::process::Command::new("/usr/bin/security")
            .args(["find-generic-password", "-s", SERVICE, "-a", ACCOUNT, "-w"])
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        #[cfg(not(target_os = "macos"))]
        let output = std::process::Command::new("secret-tool")
            .args(["lookup", "service", SERVICE, "account", ACCOUNT])
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        let token = String::from_utf8(output.stdout).ok()?.trim().to_owned();
        (output.status.success() && !token.is_empty()).then_some(token)
    }

    /// Where to tell users to put a token on this OS.
    pub fn hint() -> &'static str {
        if cfg!(target_os = "macos") {
            ", or store it in the keychain (service \"Ondo\", account \"huggingface-token\")"
        } else {
            ", or store it with secret-tool (service Ondo, account huggingface-token)"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> HubConfig {
        let mut map: HashMap<&str, &str> = vars.iter().copied().collect();
        map.insert("ONDO_NO_KEYCHAIN", "1");
        let dirs = DataDirs {
            data_dir: "/nonexistent/ondo".into(),
            models_dir: "/nonexistent/ondo/models".into(),
            hf_cache_dir: "/nonexistent/hf/hub".into(),
        };
        HubConfig::from_lookup(&dirs, |name| map.get(name).map(|v| (*v).to_owned()))
    }

    #[test]
    fn environment_decides_endpoint_token_and_offline() {
        let c = config(&[]);
        assert_eq!(c.endpoint, "https://huggingface.co");
        assert!(!c.offline);
        assert_eq!(c.token, None);
        let c = config(&[
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_TOKEN", "hf_abc\n"),
            ("HF_HUB_OFFLINE", "True"),
        ]);
        assert_eq!(c.endpoint, "http://127.0.0.1:9");
        assert_eq!(c.token.as_deref(), Some("hf_abc"));
        assert_eq!(c.token_source, Some(TokenSource::Environment));
        assert!(c.offline);
        assert!(!config(&[("HF_HUB_OFFLINE", "0")]).offline);
    }

    #[test]
    fn token_file_is_used_when_the_environment_has_none() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tok"), "hf_from_file\n").unwrap();
        let path = dir.path().join("tok");
        let c = config(&[("HF_TOKEN_PATH", path.to_str().unwrap())]);
        assert_eq!(c.token.as_deref(), Some("hf_from_file"));
        assert_eq!(c.token_source, Some(TokenSource::TokenFile));
    }
}
