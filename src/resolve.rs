//! Which model folder a name means, answered once for every client: the
//! CLI, the app and the local server. A name is `tiny` (the built-in
//! synthetic model, written on first use), a repo id in the library (the
//! models folder chosen in the app's settings, then the Hugging Face cache
//! shared with mlx-lm), or, for people at this machine only, a folder.

use std::path::{Path, PathBuf};

use crate::ErrorKind;
use crate::app_settings::AppSettings;
use crate::hub::{ModelRef, library};
use crate::paths::DataDirs;
use crate::run_kinds::RunKind;
use crate::session::SessionPool;
use crate::session::record::RunContext;
use crate::store::Store;

/// The name of the built-in synthetic model.
pub const TINY: &str = "tiny";

/// Who is naming the model, which decides what a name may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedBy {
    /// Someone at this machine (the CLI, the app): folders are fine.
    Local,
    /// A client over the network: repo ids and `tiny` only, never a path.
    Client,
}

/// A model name turned into the folder to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    /// How records and lists name it: the repo id as the library spells it,
    /// `tiny`, or the folder as given.
    pub name: String,
    pub dir: PathBuf,
}

impl ResolvedModel {
    /// What the run record says about this model, for a run of `kind`.
    pub fn run_context(&self, kind: RunKind) -> RunContext {
        RunContext {
            kind,
            ..RunContext::for_model(&self.name, &self.dir)
        }
    }
}

/// Why a name does not lead to a model.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(
        "'{name}' is not a model name: use a repo id such as mlx-community/Qwen3-0.6B-4bit, or tiny"
    )]
    NotAModelName { name: String },
    #[error("{name} is not downloaded (looked in {}); available: {}", looked_in.display(), list(available))]
    NotFound {
        name: String,
        looked_in: PathBuf,
        available: Vec<String>,
    },
    #[error("{name} is only partly downloaded: {problem}")]
    Incomplete { name: String, problem: String },
    #[error("the built-in tiny model could not be written: {0}")]
    Tiny(String),
}

impl ResolveError {
    /// What clients branch on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ResolveError::NotAModelName { .. } => ErrorKind::NotAModelName,
            ResolveError::NotFound { .. } | ResolveError::Incomplete { .. } => {
                ErrorKind::ModelNotFound
            }
            ResolveError::Tiny(_) => ErrorKind::ModelUnavailable,
        }
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none yet".into()
    } else {
        names.join(", ")
    }
}

/// Where downloaded models are looked for: the models folder the app's
/// settings name (the Hugging Face cache unless the user chose another),
/// then the shared cache, so what mlx-lm fetched is found as well.
pub fn model_folders(settings: &AppSettings, dirs: &DataDirs) -> Vec<PathBuf> {
    let chosen = settings.hub_config(dirs).cache_dir;
    let mut folders = vec![chosen];
    if folders[0] != dirs.hf_cache_dir {
        folders.push(dirs.hf_cache_dir.clone());
    }
    folders
}

/// The settings the app saved: from the pool's history, or read from the
/// history file when the pool records nothing (`--no-history`).
pub fn saved_settings(pool: &SessionPool, dirs: &DataDirs) -> AppSettings {
    pool.with_store(|store| AppSettings::load(store))
        .or_else(|| {
            Store::open_default(&dirs.data_dir)
                .ok()
                .map(|s| AppSettings::load(&s))
        })
        .unwrap_or_default()
}

/// Every name a client may use: `tiny`, then the complete downloaded
/// models' repo ids (each once, in library order).
pub fn available_models(folders: &[PathBuf]) -> Vec<String> {
    std::iter::once(TINY.to_owned())
        .chain(downloaded_models(folders).into_iter().map(|m| m.id))
        .collect()
}

/// The complete downloaded models a client may name, each repo once (the
/// first folder that has it wins, as in `resolve_model`), in library order.
pub fn downloaded_models(folders: &[PathBuf]) -> Vec<library::LibraryModel> {
    let mut models: Vec<library::LibraryModel> = Vec::new();
    for folder in folders {
        for model in library::scan_hub_cache(folder) {
            if model.complete && !models.iter().any(|m| m.id.eq_ignore_ascii_case(&model.id)) {
                models.push(model);
            }
        }
    }
    models
}

/// The folder `name` means, with the built-in tiny model written on first
/// use (on the engine thread, through the pool).
pub fn resolve_model(
    pool: &SessionPool,
    name: &str,
    named_by: NamedBy,
) -> Result<ResolvedModel, ResolveError> {
    let dirs = DataDirs::from_env();
    let folders = model_folders(&saved_settings(pool, &dirs), &dirs);
    resolve_model_in(pool, name, named_by, &folders)
}

/// As `resolve_model`, looking for downloaded models in `folders` (from
/// `model_folders`), for a caller that has read the settings already.
pub fn resolve_model_in(
    pool: &SessionPool,
    name: &str,
    named_by: NamedBy,
    folders: &[PathBuf],
) -> Result<ResolvedModel, ResolveError> {
    let dirs = DataDirs::from_env();
    match resolve_name(name, named_by, folders)? {
        Resolved::Tiny => {
            let dir = pool
                .call(move || crate::synth::builtin_tiny_model(&dirs))
                .map_err(|e| ResolveError::Tiny(e.to_string()))?
                .map_err(|e| ResolveError::Tiny(e.to_string()))?;
            Ok(ResolvedModel {
                name: TINY.to_owned(),
                dir,
            })
        }
        Resolved::Model(model) => Ok(model),
    }
}

enum Resolved {
    Tiny,
    Model(ResolvedModel),
}

/// The decision, apart from writing the tiny model (testable without MLX).
fn resolve_name(
    name: &str,
    named_by: NamedBy,
    folders: &[PathBuf],
) -> Result<Resolved, ResolveError> {
    let name = name.trim();
    if name.eq_ignore_ascii_case(TINY) {
        return Ok(Resolved::Tiny);
    }
    if named_by == NamedBy::Local && Path::new(name).is_dir() {
        return Ok(Resolved::Model(ResolvedModel {
            name: name.to_owned(),
            dir: PathBuf::from(name),
        }));
    }
    let not_a_name = || ResolveError::NotAModelName {
        name: name.to_owned(),
    };
    // A client's name is a repo id, never something that reads as a path.
    if named_by == NamedBy::Client && (name.starts_with('/') || name.contains('\\')) {
        return Err(not_a_name());
    }
    let model = ModelRef::parse(name).map_err(|_| not_a_name())?;
    // The name as spelled, then any other spelling of it: repo ids are
    // case-insensitive on the hub, the cache's folders are not.
    let mut incomplete = None;
    for folder in folders {
        match complete_snapshot(folder, &model) {
            Snapshot::Complete(model) => return Ok(Resolved::Model(model)),
            Snapshot::Incomplete(problem) => incomplete = incomplete.or(Some(problem)),
            Snapshot::Absent => {}
        }
    }
    for folder in folders {
        for spelled in library::scan_hub_cache(folder)
            .into_iter()
            .filter(|m| m.id.eq_ignore_ascii_case(&model.repo_id) && m.id != model.repo_id)
        {
            let model = ModelRef {
                repo_id: spelled.id,
                ..model.clone()
            };
            match complete_snapshot(folder, &model) {
                Snapshot::Complete(model) => return Ok(Resolved::Model(model)),
                Snapshot::Incomplete(problem) => incomplete = incomplete.or(Some(problem)),
                Snapshot::Absent => {}
            }
        }
    }
    match incomplete {
        Some(problem) => Err(ResolveError::Incomplete {
            name: model.to_string(),
            problem,
        }),
        None => Err(ResolveError::NotFound {
            name: model.to_string(),
            looked_in: folders.first().cloned().unwrap_or_default(),
            available: available_models(folders),
        }),
    }
}

impl AsRef<Path> for ResolvedModel {
    fn as_ref(&self) -> &Path {
        &self.dir
    }
}

/// A cached snapshot of `model` (in the first of `folders` that has one)
/// holding what `part` reads (`library::holds_part`).
pub fn cached_share(
    folders: &[PathBuf],
    model: &ModelRef,
    part: crate::hub::RankPart,
) -> Option<PathBuf> {
    folders
        .iter()
        .filter_map(|folder| library::cached_snapshot_dir(folder, model))
        .find(|dir| library::holds_part(dir, part).is_ok())
}

/// What the cache under `folder` holds of `model`'s revision.
enum Snapshot {
    Complete(ResolvedModel),
    /// There, but missing what `problem` says.
    Incomplete(String),
    Absent,
}

/// The one rule for a cached snapshot, whichever spelling found it: it
/// resolves only when complete as the library judges it (a config and
/// every weight file), as `downloaded_models` lists it.
fn complete_snapshot(folder: &Path, model: &ModelRef) -> Snapshot {
    let Some(dir) = library::cached_snapshot_dir(folder, model) else {
        return Snapshot::Absent;
    };
    let described =
        library::describe_folder(model.repo_id.clone(), library::ModelSource::HubCache, &dir);
    if described.complete {
        Snapshot::Complete(ResolvedModel {
            name: model.to_string(),
            dir,
        })
    } else {
        Snapshot::Incomplete(described.problem.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cached repo with a snapshot holding a config, as a download leaves it.
    fn cache_repo(cache: &Path, repo_id: &str) -> PathBuf {
        let repo = cache.join(format!("models--{}", repo_id.replace('/', "--")));
        let snapshot = repo.join("snapshots").join("abc123");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::write(snapshot.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
        std::fs::write(snapshot.join("model.safetensors"), b"").unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), "abc123").unwrap();
        snapshot
    }

    /// Makes `snapshot` lack one of the two weight files its index names,
    /// as an interrupted download leaves it.
    fn lose_a_shard(snapshot: &Path) {
        std::fs::remove_file(snapshot.join("model.safetensors")).unwrap();
        let index = serde_json::json!({"weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }});
        std::fs::write(
            snapshot.join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        std::fs::write(snapshot.join("model-00001-of-00002.safetensors"), b"").unwrap();
    }

    fn resolved(result: Result<Resolved, ResolveError>) -> ResolvedModel {
        match result {
            Ok(Resolved::Model(model)) => model,
            Ok(Resolved::Tiny) => panic!("resolved to tiny"),
            Err(error) => panic!("{error}"),
        }
    }

    #[test]
    fn a_repo_id_is_found_in_the_chosen_folder_before_the_shared_cache() {
        let dir = tempfile::tempdir().unwrap();
        let chosen = dir.path().join("chosen");
        let shared = dir.path().join("shared");
        let in_chosen = cache_repo(&chosen, "org/model");
        cache_repo(&shared, "org/model");
        let only_shared = cache_repo(&shared, "org/other");
        let folders = vec![chosen, shared];
        let model = resolved(resolve_name("org/model", NamedBy::Client, &folders));
        assert_eq!(model.dir, in_chosen);
        assert_eq!(model.name, "org/model");
        let model = resolved(resolve_name("org/other", NamedBy::Client, &folders));
        assert_eq!(model.dir, only_shared);
    }

    #[test]
    fn repo_ids_match_without_regard_to_case_and_keep_the_library_spelling() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = cache_repo(dir.path(), "mlx-community/Qwen3-0.6B-4bit");
        let model = resolved(resolve_name(
            "MLX-Community/qwen3-0.6b-4BIT",
            NamedBy::Client,
            &[dir.path().to_owned()],
        ));
        assert_eq!(model.dir, snapshot);
        assert_eq!(model.name, "mlx-community/Qwen3-0.6B-4bit");
    }

    #[test]
    fn every_spelling_refuses_an_incomplete_snapshot_alike() {
        let dir = tempfile::tempdir().unwrap();
        let partial = dir.path().join("partial");
        lose_a_shard(&cache_repo(&partial, "org/Model"));
        let refused = |name: &str, folders: &[PathBuf]| {
            let Err(error) = resolve_name(name, NamedBy::Client, folders) else {
                panic!("{name} resolved to an incomplete snapshot");
            };
            assert_eq!(error.kind(), "model_not_found", "{name}");
            let message = error.to_string();
            assert!(message.contains("1 of 2 weight files missing"), "{message}");
        };
        for name in ["org/Model", "ORG/model"] {
            refused(name, std::slice::from_ref(&partial));
        }
        // A complete copy in a later folder is the one found, either way.
        let whole = dir.path().join("whole");
        let complete = cache_repo(&whole, "org/Model");
        for name in ["org/Model", "ORG/model"] {
            let model = resolved(resolve_name(
                name,
                NamedBy::Client,
                &[partial.clone(), whole.clone()],
            ));
            assert_eq!(model.dir, complete, "{name}");
        }
        // The revision asked for is the snapshot judged, not main's.
        let repo = whole.join("models--org--Model");
        let older = repo.join("snapshots").join("def456");
        std::fs::create_dir_all(&older).unwrap();
        std::fs::write(older.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
        std::fs::write(older.join("model.safetensors"), b"").unwrap();
        lose_a_shard(&older);
        std::fs::write(repo.join("refs").join("v1"), "def456").unwrap();
        for name in ["org/Model@v1", "ORG/model@v1"] {
            refused(name, std::slice::from_ref(&whole));
        }
    }

    #[test]
    fn tiny_is_always_available_and_unknown_names_list_what_is() {
        let dir = tempfile::tempdir().unwrap();
        cache_repo(dir.path(), "org/model");
        let folders = vec![dir.path().to_owned()];
        assert!(matches!(
            resolve_name("TINY", NamedBy::Client, &folders),
            Ok(Resolved::Tiny)
        ));
        let Err(error) = resolve_name("org/missing", NamedBy::Client, &folders) else {
            panic!("found a model that is not there");
        };
        assert_eq!(error.kind(), "model_not_found");
        let message = error.to_string();
        assert!(message.contains("org/missing"), "{message}");
        assert!(message.contains("tiny, org/model"), "{message}");
    }

    #[test]
    fn only_people_at_this_machine_may_name_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().to_str().unwrap();
        let model = resolved(resolve_name(folder, NamedBy::Local, &[]));
        assert_eq!(model.dir, dir.path());
        for name in [folder, "../../etc", "C:\\models\\x", "org/../x"] {
            let Err(error) = resolve_name(name, NamedBy::Client, &[]) else {
                panic!("a client reached {name}");
            };
            assert_eq!(error.kind(), "not_a_model_name", "{name}");
        }
    }

    #[test]
    fn the_models_folder_from_settings_comes_first() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().as_os_str().to_owned();
        let dirs = DataDirs::from_lookup(|name| (name == "HF_HOME").then(|| home.clone()));
        assert_eq!(
            model_folders(&AppSettings::default(), &dirs),
            vec![dirs.hf_cache_dir.clone()]
        );
        let chosen = AppSettings {
            models_folder: Some(dir.path().join("mine")),
            ..AppSettings::default()
        };
        assert_eq!(
            model_folders(&chosen, &dirs),
            vec![dir.path().join("mine"), dirs.hf_cache_dir.clone()]
        );
    }
}
