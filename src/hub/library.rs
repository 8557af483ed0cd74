//! The local library: models in the shared Hugging Face cache (so what mlx-lm
//! or transformers fetched shows up), folders the user added, and the models
//! Ondo made itself. Each with what it is and what it takes on disk.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::{HubError, ModelRef, architecture, fit, repo_id::cache_folder_name};
use crate::paths::DataDirs;

/// Where a library entry lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum ModelSource {
    /// A repo in the Hugging Face cache.
    HubCache,
    /// A folder the user added.
    Folder,
    /// Made by Ondo (the built-in tiny model, `ondo synth`).
    Ondo,
}

/// One model on this machine.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct LibraryModel {
    /// The repo id for cached models, the folder path otherwise.
    pub id: String,
    pub source: ModelSource,
    /// The folder to load (for a cached repo: the snapshot of its main ref,
    /// else its newest snapshot).
    pub path: PathBuf,
    /// Refs pointing at the snapshot (`main`, tags).
    pub revisions: Vec<String>,
    pub commit: Option<String>,
    /// Every byte the model holds on disk (all snapshots' blobs for a repo).
    pub size_on_disk_bytes: u64,
    /// Bytes of unfinished downloads (`.incomplete` files) kept for resume.
    pub partial_bytes: u64,
    /// The config's top-level `model_type`: the architecture the engine
    /// picks the model's code by (`hub::architecture`).
    pub model_type: Option<String>,
    /// "not supported yet: model_type X (Ondo runs: ...)" when the engine
    /// cannot run this architecture; `None` when it can (or there is no
    /// readable config, which `problem` says).
    pub unsupported: Option<String>,
    /// "4-bit", "8-bit", or the float dtype ("bfloat16").
    pub quantization: Option<String>,
    /// Counted from the safetensors headers (packed quantized weights unpacked).
    pub parameters: Option<u64>,
    /// Has a config and every weight file its index names.
    pub complete: bool,
    /// What is wrong when it is not complete.
    pub problem: Option<String>,
    /// An embedding model (sentence-transformers' pooling files): it makes
    /// vectors (`ondo embed`, `/v1/embeddings`), not chat.
    pub embedding: bool,
}

/// Lists the whole library, cached repos first, each group sorted.
pub fn scan(dirs: &DataDirs) -> Vec<LibraryModel> {
    let mut models = scan_hub_cache(&dirs.hf_cache_dir);
    let mut folders: Vec<LibraryModel> = user_folders(dirs)
        .into_iter()
        .map(|path| describe_folder(path.display().to_string(), ModelSource::Folder, &path))
        .collect();
    folders.sort_by(|a, b| a.id.cmp(&b.id));
    models.extend(folders);
    if let Ok(entries) = fs::read_dir(&dirs.models_dir) {
        let mut own: Vec<LibraryModel> = entries
            .flatten()
            .filter(|e| e.path().join("config.json").is_file())
            .map(|e| describe_folder(e.path().display().to_string(), ModelSource::Ondo, &e.path()))
            .collect();
        own.sort_by(|a, b| a.id.cmp(&b.id));
        models.extend(own);
    }
    models
}

/// The cached repos under `cache_dir`.
pub fn scan_hub_cache(cache_dir: &Path) -> Vec<LibraryModel> {
    let Ok(entries) = fs::read_dir(cache_dir) else {
        return Vec::new();
    };
    let mut models: Vec<LibraryModel> = entries
        .flatten()
        .filter_map(|entry| {
            let folder = entry.file_name().into_string().ok()?;
            let repo_id = folder.strip_prefix("models--")?.replacen("--", "/", 1);
            describe_cached_repo(&repo_id, &entry.path())
        })
        .collect();
    models.sort_by_key(|m| m.id.to_lowercase());
    models
}

/// The library entry of one cached repo, if it has any snapshot.
pub fn find_cached(cache_dir: &Path, repo_id: &str) -> Option<LibraryModel> {
    describe_cached_repo(repo_id, &cache_dir.join(cache_folder_name(repo_id)))
}

/// The snapshot folder `model`'s revision names in the cache (a ref, or a
/// commit given directly), when it has a config.
pub fn cached_snapshot_dir(cache_dir: &Path, model: &ModelRef) -> Option<PathBuf> {
    let repo_dir = cache_dir.join(model.cache_folder_name());
    let commit = fs::read_to_string(repo_dir.join("refs").join(&model.revision))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| model.revision.clone());
    let snapshot = repo_dir.join("snapshots").join(commit);
    snapshot.join("config.json").is_file().then_some(snapshot)
}

fn describe_cached_repo(repo_id: &str, repo_dir: &Path) -> Option<LibraryModel> {
    let refs = read_refs(&repo_dir.join("refs"));
    let snapshots: Vec<PathBuf> = fs::read_dir(repo_dir.join("snapshots"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    // Prefer what `main` points at, then any ref, then the newest snapshot.
    let by_ref = |name: &str| {
        refs.iter()
            .find(|(r, _)| r == name)
            .map(|(_, commit)| repo_dir.join("snapshots").join(commit))
            .filter(|p| p.is_dir())
    };
    let snapshot = by_ref("main")
        .or_else(|| refs.iter().find_map(|(r, _)| by_ref(r)))
        .or_else(|| {
            snapshots
                .iter()
                .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
                .cloned()
        })?;
    let commit = snapshot.file_name()?.to_str()?.to_owned();
    let mut model = describe_folder(repo_id.to_owned(), ModelSource::HubCache, &snapshot);
    model.revisions = refs
        .iter()
        .filter(|(_, c)| *c == commit)
        .map(|(r, _)| r.clone())
        .collect();
    model.commit = Some(commit);
    let (size, partial) = blob_bytes(&repo_dir.join("blobs"));
    model.size_on_disk_bytes = size;
    model.partial_bytes = partial;
    if partial > 0 && model.complete {
        // A newer revision is half-downloaded; the snapshot itself is usable.
        model.problem = Some("an unfinished download is kept for resume".into());
    }
    Some(model)
}

fn read_refs(refs_dir: &Path) -> Vec<(String, String)> {
    let mut refs = Vec::new();
    let mut stack = vec![refs_dir.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let (Ok(name), Ok(commit)) =
                (path.strip_prefix(refs_dir), fs::read_to_string(&path))
            {
                refs.push((
                    name.to_string_lossy().into_owned(),
                    commit.trim().to_owned(),
                ));
            }
        }
    }
    refs.sort();
    refs
}

fn blob_bytes(blobs_dir: &Path) -> (u64, u64) {
    let (mut whole, mut partial) = (0, 0);
    for entry in fs::read_dir(blobs_dir).into_iter().flatten().flatten() {
        let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
        if entry.file_name().to_string_lossy().ends_with(".incomplete") {
            partial += len;
        } else {
            whole += len;
        }
    }
    (whole + partial, partial)
}

/// Reads what a model folder is from its config and safetensors headers.
pub fn describe_folder(id: String, source: ModelSource, dir: &Path) -> LibraryModel {
    let config: Option<serde_json::Value> = fs::read(dir.join("config.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let weights = weight_files(dir);
    let missing: Vec<&String> = weights
        .iter()
        .filter(|name| !dir.join(name).is_file())
        .collect();
    let problem = if config.is_none() {
        Some("config.json is missing or unreadable".to_owned())
    } else if weights.is_empty() {
        Some("no model*.safetensors weights".to_owned())
    } else if !missing.is_empty() {
        Some(format!(
            "{} of {} weight files missing ({}); pull it again to finish",
            missing.len(),
            weights.len(),
            missing[0]
        ))
    } else {
        None
    };
    let present: Vec<PathBuf> = weights
        .iter()
        .map(|name| dir.join(name))
        .filter(|p| p.is_file())
        .collect();
    let size: u64 = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| fs::metadata(e.path()).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    let embedding = crate::family::embedding::is_embedding_folder(dir);
    // The encoders Ondo runs (BERT) are no decoder family; as embedding
    // models they run.
    let encoder = config
        .as_ref()
        .and_then(|c| c["model_type"].as_str())
        .is_some_and(|t| crate::family::embedding::ENCODER_MODEL_TYPES.contains(&t));
    let unsupported = config
        .as_ref()
        .filter(|_| !(embedding && encoder))
        .and_then(architecture::unsupported_config_reason);
    let config = config.unwrap_or_default();
    LibraryModel {
        id,
        source,
        path: dir.to_owned(),
        revisions: Vec::new(),
        commit: None,
        size_on_disk_bytes: size,
        partial_bytes: 0,
        model_type: architecture::model_type(&config).map(str::to_owned),
        unsupported,
        quantization: quantization_label(&config, &present),
        parameters: count_parameters(&config, &present),
        complete: problem.is_none(),
        problem,
        embedding,
    }
}

/// The weight files a folder should have: those its index names, else the
/// `model*.safetensors` present.
fn weight_files(dir: &Path) -> Vec<String> {
    let index = fs::read(dir.join("model.safetensors.index.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    if let Some(map) = index
        .as_ref()
        .and_then(|i| i.get("weight_map"))
        .and_then(|m| m.as_object())
    {
        let names: BTreeSet<String> = map
            .values()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        return names.into_iter().collect();
    }
    let mut names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        .collect();
    names.sort();
    names
}

fn quantization_label(config: &serde_json::Value, weights: &[PathBuf]) -> Option<String> {
    let quant = config
        .get("quantization")
        .or_else(|| config.get("quantization_config"));
    if let Some(bits) = quant.and_then(|q| q.get("bits")).and_then(|b| b.as_u64()) {
        return Some(format!("{bits}-bit"));
    }
    let text = architecture::text_config(config);
    let dtype = text
        .get("torch_dtype")
        .or_else(|| text.get("dtype"))
        .and_then(|d| d.as_str())
        .map(str::to_owned);
    dtype.or_else(|| {
        let header = fit::read_safetensors_header(weights.first()?).ok()?;
        let dtype = fit::safetensors_float_dtype(&header)?;
        Some(
            match dtype.as_str() {
                "BF16" => "bfloat16",
                "F16" => "float16",
                "F32" => "float32",
                other => other,
            }
            .to_owned(),
        )
    })
}

/// Parameters from the tensor shapes: quantized weights are packed 32 / bits
/// values per U32, and their scales and biases are not parameters.
fn count_parameters(config: &serde_json::Value, weights: &[PathBuf]) -> Option<u64> {
    if weights.is_empty() {
        return None;
    }
    let bits = config
        .get("quantization")
        .and_then(|q| q.get("bits"))
        .and_then(|b| b.as_u64());
    let mut total = 0u64;
    for path in weights {
        let header = fit::read_safetensors_header(path).ok()?;
        let header: serde_json::Value = serde_json::from_slice(&header).ok()?;
        for (name, tensor) in header.as_object()? {
            if name == "__metadata__" {
                continue;
            }
            let shape = tensor.get("shape")?.as_array()?;
            let elements: u64 = shape.iter().filter_map(|d| d.as_u64()).product();
            let dtype = tensor.get("dtype").and_then(|d| d.as_str()).unwrap_or("");
            let stem = name.rsplit_once('.').map_or("", |(_, last)| last);
            if bits.is_some() && (stem == "scales" || stem == "biases") {
                // A quantized layer's scales/biases sit beside its packed weight.
                let weight_name = format!("{}.weight", name.rsplit_once('.').unwrap().0);
                if header
                    .get(&weight_name)
                    .and_then(|w| w.get("dtype"))
                    .and_then(|d| d.as_str())
                    == Some("U32")
                {
                    continue;
                }
            }
            total += match (dtype, bits) {
                ("U32", Some(bits)) if bits > 0 => elements * (32 / bits),
                _ => elements,
            };
        }
    }
    Some(total)
}

/// Whether the snapshot in `dir` holds what `part` of a split model reads:
/// its config, its tokenizer and the weight files of its layers (a rank
/// split by layers needs no other rank's), or what is missing.
pub fn holds_part(dir: &Path, part: crate::family::shards::RankPart) -> Result<(), String> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|_| format!("no config.json in {}", dir.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", config_path.display()))?;
    let config = crate::family::settle(&value).map_err(|e| e.to_string())?;
    if !dir.join("tokenizer.json").is_file() {
        return Err(format!("no tokenizer.json in {}", dir.display()));
    }
    let index_path = dir.join("model.safetensors.index.json");
    let Ok(index) = std::fs::read(&index_path) else {
        // One file holds every tensor: the part needs all of it.
        return match std::fs::read_dir(dir)
            .map_err(|e| e.to_string())?
            .flatten()
            .any(|f| {
                let name = f.file_name().to_string_lossy().into_owned();
                name.starts_with("model") && name.ends_with(".safetensors")
            }) {
            true => Ok(()),
            false => Err(format!("no weight files in {}", dir.display())),
        };
    };
    let index: serde_json::Value =
        serde_json::from_slice(&index).map_err(|e| format!("{}: {e}", index_path.display()))?;
    let reads = |name: &str| part.reads(&config, name);
    let missing: Vec<String> = crate::family::shards::files_holding(&index, Some(&reads))
        .into_iter()
        .filter(|file| !dir.join(file).is_file())
        .collect();
    match missing.as_slice() {
        [] => Ok(()),
        files => Err(format!(
            "{} of the files {} reads are missing ({})",
            files.len(),
            part.described(&config),
            files.join(", ")
        )),
    }
}

/// Removes a cached repo (every snapshot and blob, its locks) and returns the
/// bytes freed.
pub fn delete_cached(cache_dir: &Path, model: &ModelRef) -> Result<u64, HubError> {
    let repo_dir = cache_dir.join(model.cache_folder_name());
    if !repo_dir.is_dir() {
        return Err(HubError::NotInLibrary(model.repo_id.clone()));
    }
    let (size, _) = blob_bytes(&repo_dir.join("blobs"));
    fs::remove_dir_all(&repo_dir).map_err(HubError::io(&repo_dir))?;
    let _ = fs::remove_dir_all(cache_dir.join(".locks").join(model.cache_folder_name()));
    Ok(size)
}

/// Folders the user added, kept in `library.json` in Ondo's data folder.
#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
struct UserFolders {
    folders: Vec<PathBuf>,
}

fn user_folders_file(dirs: &DataDirs) -> PathBuf {
    dirs.data_dir.join("library.json")
}

pub fn user_folders(dirs: &DataDirs) -> Vec<PathBuf> {
    fs::read(user_folders_file(dirs))
        .ok()
        .and_then(|b| serde_json::from_slice::<UserFolders>(&b).ok())
        .map(|u| u.folders)
        .unwrap_or_default()
}

/// Adds a model folder to the library (it must have a config.json).
pub fn add_folder(dirs: &DataDirs, folder: &Path) -> Result<LibraryModel, HubError> {
    let folder = fs::canonicalize(folder).map_err(HubError::io(folder))?;
    if !folder.join("config.json").is_file() {
        return Err(HubError::NotAModel {
            repo_id: folder.display().to_string(),
            reason: "the folder has no config.json".into(),
        });
    }
    let mut folders = user_folders(dirs);
    if !folders.contains(&folder) {
        folders.push(folder.clone());
        write_user_folders(dirs, folders)?;
    }
    Ok(describe_folder(
        folder.display().to_string(),
        ModelSource::Folder,
        &folder,
    ))
}

/// Forgets an added folder (its files stay where they are).
pub fn remove_folder(dirs: &DataDirs, folder: &Path) -> Result<(), HubError> {
    let canonical = fs::canonicalize(folder).unwrap_or_else(|_| folder.to_owned());
    let mut folders = user_folders(dirs);
    let before = folders.len();
    folders.retain(|f| f != &canonical && f != folder);
    if folders.len() == before {
        return Err(HubError::NotInLibrary(folder.display().to_string()));
    }
    write_user_folders(dirs, folders)
}

fn write_user_folders(dirs: &DataDirs, folders: Vec<PathBuf>) -> Result<(), HubError> {
    let path = user_folders_file(dirs);
    fs::create_dir_all(&dirs.data_dir).map_err(HubError::io(&dirs.data_dir))?;
    let text = serde_json::to_vec_pretty(&UserFolders { folders }).expect("plain data");
    // Replaced in one step, so a crash never leaves half a list.
    crate::whole_file::write_atomically(&path, &text).map_err(HubError::io(&path))
}
