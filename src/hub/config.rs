//! Where the hub is, who we are to it and whether to use it at all: read from
//! the same environment variables the Python tools read.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

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
                "the Hugging Face token file (HF_TOKEN_PATH, else token in HF_HOME, where huggingface-cli login writes it)"
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
        let (token, token_source) = find_token(&lookup);
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

/// The order huggingface_hub's `get_token` uses (`HF_TOKEN`, then the token
/// file that `huggingface-cli login` writes), then a token the user stored in
/// the OS keychain for Ondo (see [`keychain`]).
fn find_token(lookup: &impl Fn(&str) -> Option<String>) -> (Option<String>, Option<TokenSource>) {
    if let Some(token) = lookup("HF_TOKEN")
        .or_else(|| lookup("HUGGING_FACE_HUB_TOKEN"))
        .and_then(|token| clean_token(&token))
    {
        return (Some(token), Some(TokenSource::Environment));
    }
    if let Some(token) = std::fs::read_to_string(token_path(lookup))
        .ok()
        .and_then(|text| clean_token(&text))
    {
        return (Some(token), Some(TokenSource::TokenFile));
    }
    // Tests and CI set ONDO_NO_KEYCHAIN so that no keychain prompt can appear.
    if lookup(crate::environment::NO_KEYCHAIN.name).is_some() {
        return (None, None);
    }
    match keychain::read_token() {
        Some(token) => (Some(token), Some(TokenSource::Keychain)),
        None => (None, None),
    }
}

/// Where huggingface_hub reads and `huggingface-cli login` writes the token
/// (its `constants.HF_TOKEN_PATH`): `HF_TOKEN_PATH`, else `token` in
/// `HF_HOME`, which defaults to `$XDG_CACHE_HOME/huggingface`, else
/// `~/.cache/huggingface`. Both values have `~` and `$VAR` expanded as Python
/// does. The hub cache plays no part: `HF_HUB_CACHE` may point anywhere.
pub fn token_path(lookup: &impl Fn(&str) -> Option<String>) -> PathBuf {
    let home = || {
        lookup("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| dirs::home_dir().unwrap_or_else(|| PathBuf::from("/")))
    };
    let hf_home = lookup("HF_HOME").unwrap_or_else(|| {
        let cache = lookup("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| home().join(".cache"));
        cache.join("huggingface").to_string_lossy().into_owned()
    });
    let hf_home = expand_user_and_vars(&hf_home, lookup);
    let token_path = lookup("HF_TOKEN_PATH").unwrap_or_else(|| {
        Path::new(&hf_home)
            .join("token")
            .to_string_lossy()
            .into_owned()
    });
    PathBuf::from(expand_user_and_vars(&token_path, lookup))
}

/// Python's `os.path.expandvars(os.path.expanduser(path))` on POSIX: a
/// leading `~` becomes `HOME`, and `$NAME` or `${NAME}` the variable's value
/// where it is set (an unset one stays as written). `~user` stays as written:
/// Ondo does not read other users' home folders.
fn expand_user_and_vars(path: &str, lookup: &impl Fn(&str) -> Option<String>) -> String {
    let mut path = path.to_owned();
    if path == "~" || path.starts_with("~/") {
        let home = lookup("HOME")
            .or_else(|| dirs::home_dir().map(|h| h.to_string_lossy().into_owned()))
            .unwrap_or_default();
        let rest = &path[1..];
        let expanded = format!("{}{rest}", home.trim_end_matches('/'));
        path = if expanded.is_empty() {
            "/".to_owned()
        } else {
            expanded
        };
    }
    let mut expanded = String::with_capacity(path.len());
    let mut rest = path.as_str();
    while let Some(dollar) = rest.find('$') {
        expanded.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        let (name, written_len) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) => (&braced[..end], end + 2),
                None => ("", 0),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        match (written_len > 0).then(|| lookup(name)).flatten() {
            Some(value) => expanded.push_str(&value),
            None => expanded.push_str(&rest[dollar..dollar + 1 + written_len]),
        }
        rest = &after[written_len..];
    }
    expanded.push_str(rest);
    expanded
}

/// huggingface_hub's `_clean_token`: line breaks removed, spaces trimmed, an
/// empty token is none.
fn clean_token(token: &str) -> Option<String> {
    let token = token.replace(['\r', '\n'], "");
    let token = token.trim();
    (!token.is_empty()).then(|| token.to_owned())
}

/// A token the user stored in the OS keychain for Ondo: service `Ondo`,
/// account `huggingface-token`. Ondo only reads this entry, never writes it;
/// the user makes it with the OS's own tool (`security add-generic-password`
/// on macOS, `secret-tool store` elsewhere), as [`hint`] tells them. Read
/// through that same tool so no keychain library is linked for one lookup.
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

    /// `vars` is the whole environment, with a home that holds nothing unless
    /// `vars` names another, so the machine's own login never leaks in.
    fn lookup_in(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let mut map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        map.insert("ONDO_NO_KEYCHAIN".into(), "1".into());
        map.entry("HOME".into())
            .or_insert_with(|| "/nonexistent/home".into());
        move |name| map.get(name).cloned()
    }

    fn config(vars: &[(&str, &str)]) -> HubConfig {
        let lookup = lookup_in(vars);
        let dirs = DataDirs::from_lookup(|name| lookup(name).map(Into::into));
        HubConfig::from_lookup(&dirs, lookup)
    }

    fn write_token(path: &Path, token: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, format!("{token}\n")).unwrap();
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

    #[test]
    fn the_login_token_in_hf_home_is_found_with_the_hub_cache_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let hf_home = dir.path().join("hf-home");
        let cache = dir.path().join("big-disk/hub");
        // Where `huggingface-cli login` writes it, and a decoy beside the cache.
        write_token(&hf_home.join("token"), "hf_from_login");
        write_token(&dir.path().join("big-disk/token"), "hf_beside_the_cache");
        let c = config(&[
            ("HF_HOME", hf_home.to_str().unwrap()),
            ("HF_HUB_CACHE", cache.to_str().unwrap()),
        ]);
        assert_eq!(c.cache_dir, cache);
        assert_eq!(c.token.as_deref(), Some("hf_from_login"));
        assert_eq!(c.token_source, Some(TokenSource::TokenFile));
    }

    #[test]
    fn hf_token_path_comes_before_hf_home_and_hf_token_before_both() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_str().unwrap();
        let hf_home = dir.path().join("hf-home");
        write_token(&hf_home.join("token"), "hf_in_hf_home");
        write_token(&dir.path().join("tokens/mine"), "hf_at_the_path");
        for written in ["~/tokens/mine", "$TOKENS/mine", "${TOKENS}/mine"] {
            let vars = [
                ("HOME", home),
                ("TOKENS", &format!("{home}/tokens")),
                ("HF_HOME", hf_home.to_str().unwrap()),
                ("HF_TOKEN_PATH", written),
            ];
            let c = config(&vars);
            assert_eq!(c.token.as_deref(), Some("hf_at_the_path"), "{written}");
            assert_eq!(c.token_source, Some(TokenSource::TokenFile));
            let c = config(&[vars.as_slice(), &[("HF_TOKEN", "hf_env")]].concat());
            assert_eq!(c.token.as_deref(), Some("hf_env"));
            assert_eq!(c.token_source, Some(TokenSource::Environment));
        }
        // A path with no file behind it means no token, as for Python.
        let c = config(&[
            ("HF_HOME", hf_home.to_str().unwrap()),
            ("HF_TOKEN_PATH", "/nonexistent/token"),
        ]);
        assert_eq!(c.token, None);
    }

    #[test]
    fn hf_home_defaults_to_the_xdg_cache_then_the_home_cache() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let xdg = dir.path().join("xdg");
        let home_token = home.join(".cache/huggingface/token");
        let xdg_token = xdg.join("huggingface/token");
        write_token(&home_token, "hf_in_home");
        write_token(&xdg_token, "hf_in_xdg");
        let home = home.to_str().unwrap();
        let xdg = xdg.to_str().unwrap();
        let with_xdg = [("HOME", home), ("XDG_CACHE_HOME", xdg)];
        assert_eq!(token_path(&lookup_in(&with_xdg)), xdg_token);
        assert_eq!(config(&with_xdg).token.as_deref(), Some("hf_in_xdg"));
        assert_eq!(token_path(&lookup_in(&[("HOME", home)])), home_token);
        assert_eq!(
            config(&[("HOME", home)]).token.as_deref(),
            Some("hf_in_home")
        );
        // HF_HOME itself may start with ~, as Python expands it too.
        assert_eq!(
            token_path(&lookup_in(&[("HOME", home), ("HF_HOME", "~/hf")])),
            Path::new(home).join("hf/token")
        );
    }

    #[test]
    fn paths_expand_like_pythons_expanduser_and_expandvars() {
        let lookup = lookup_in(&[("HOME", "/u/ada/"), ("A", "/a"), ("A_B", "ab")]);
        for (written, expanded) in [
            ("~", "/u/ada"),
            ("~/x", "/u/ada/x"),
            ("~ada/x", "~ada/x"),
            ("x/~/y", "x/~/y"),
            ("$A/x", "/a/x"),
            ("${A}x", "/ax"),
            ("$A_B-$A", "ab-/a"),
            ("$UNSET/x", "$UNSET/x"),
            ("${UNSET}", "${UNSET}"),
            ("a$", "a$"),
            ("$/x", "$/x"),
            ("${}", "${}"),
            ("${A", "${A"),
            ("~/$A", "/u/ada//a"),
        ] {
            assert_eq!(
                expand_user_and_vars(written, &lookup),
                expanded,
                "{written}"
            );
        }
    }
}
