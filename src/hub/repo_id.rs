//! Repo ids and revisions as users type them (`org/name`, `org/name@revision`),
//! checked before any of it becomes part of a URL or a path in the cache.

use std::fmt;

use super::HubError;

/// A model repository on the hub at one revision (a branch, tag or commit).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ModelRef {
    pub repo_id: String,
    pub revision: String,
}

impl ModelRef {
    pub const DEFAULT_REVISION: &'static str = "main";

    /// Parses `org/name` or `org/name@revision`.
    pub fn parse(text: &str) -> Result<Self, HubError> {
        let text = text.trim();
        let (repo_id, revision) = match text.split_once('@') {
            Some((repo, rev)) => (repo, rev),
            None => (text, Self::DEFAULT_REVISION),
        };
        check_repo_id(repo_id)?;
        check_revision(revision)?;
        Ok(Self {
            repo_id: repo_id.to_owned(),
            revision: revision.to_owned(),
        })
    }

    /// The folder name the Hugging Face cache uses: `models--org--name`.
    pub fn cache_folder_name(&self) -> String {
        cache_folder_name(&self.repo_id)
    }

    pub(crate) fn hf_repo(&self) -> hf_hub::Repo {
        hf_hub::Repo::with_revision(
            self.repo_id.clone(),
            hf_hub::RepoType::Model,
            self.revision.clone(),
        )
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.revision == Self::DEFAULT_REVISION {
            f.write_str(&self.repo_id)
        } else {
            write!(f, "{}@{}", self.repo_id, self.revision)
        }
    }
}

pub(crate) fn cache_folder_name(repo_id: &str) -> String {
    format!("models--{}", repo_id.replace('/', "--"))
}

/// The hub's own rule: one or two parts of letters, digits, `-`, `_` and `.`,
/// at most 96 characters each, not starting or ending with `-` or `.`, and
/// never `--` or `..` (the cache uses `--` as its separator; `..` would climb
/// out of it).
fn check_repo_id(repo_id: &str) -> Result<(), HubError> {
    let invalid = |why: &str| HubError::InvalidRepoId {
        repo_id: repo_id.to_owned(),
        reason: why.to_owned(),
    };
    let parts: Vec<&str> = repo_id.split('/').collect();
    if parts.len() != 2 {
        return Err(invalid(
            "expected ORG/NAME, for example mlx-community/Qwen3-0.6B-4bit",
        ));
    }
    for part in parts {
        if part.is_empty() || part.len() > 96 {
            return Err(invalid("each part must have 1 to 96 characters"));
        }
        if !part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(invalid(
                "only letters, digits, '-', '_' and '.' are allowed",
            ));
        }
        if part.contains("--") || part.contains("..") {
            return Err(invalid("'--' and '..' are not allowed"));
        }
        if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) {
            return Err(invalid("a part cannot start or end with '-' or '.'"));
        }
    }
    Ok(())
}

/// Revisions become a file under `refs/` (branch names may contain `/`), so
/// nothing that could climb out of it or hide in a path is accepted.
fn check_revision(revision: &str) -> Result<(), HubError> {
    let ok = !revision.is_empty()
        && revision.len() <= 255
        && !revision.starts_with('/')
        && !revision.ends_with('/')
        && revision
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
        && revision
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(())
    } else {
        Err(HubError::InvalidRevision {
            revision: revision.to_owned(),
        })
    }
}

/// File names inside a repo come from the server; refuse any that would land
/// outside the snapshot folder.
pub(crate) fn check_repo_file(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_repo_and_revision() {
        let r = ModelRef::parse("mlx-community/Qwen3-0.6B-4bit").unwrap();
        assert_eq!(r.revision, "main");
        assert_eq!(
            r.cache_folder_name(),
            "models--mlx-community--Qwen3-0.6B-4bit"
        );
        let r = ModelRef::parse("org/name@refs/pr/1").unwrap();
        assert_eq!(r.revision, "refs/pr/1");
        assert_eq!(r.to_string(), "org/name@refs/pr/1");
    }

    #[test]
    fn refuses_path_tricks() {
        for bad in [
            "../etc",
            "org/..",
            "org/../x",
            "org/na--me",
            "/abs/path",
            "org/name/extra",
            "org/.hidden",
            "org/na me",
            "org\\name",
            "org/",
            "",
        ] {
            let err = ModelRef::parse(bad).unwrap_err();
            assert_eq!(err.kind(), "invalid_repo_id", "{bad}");
        }
        for bad in [
            "org/name@../../x",
            "org/name@/abs",
            "org/name@a/../b",
            "org/name@",
        ] {
            let err = ModelRef::parse(bad).unwrap_err();
            assert_eq!(err.kind(), "invalid_revision", "{bad}");
        }
    }

    #[test]
    fn repo_files_stay_inside_the_snapshot() {
        assert!(check_repo_file("model.safetensors"));
        assert!(check_repo_file("sub/dir/file.json"));
        for bad in ["../x", "a/../../x", "/etc/passwd", "a//b", "a\\b", ""] {
            assert!(!check_repo_file(bad), "{bad}");
        }
    }
}
