//! The facts a fit verdict needs (weight bytes and the KV cache's shape),
//! gathered from a local folder, from the hub before downloading (config.json
//! and a safetensors header by Range, nothing written), or from the catalog.

use std::path::Path;

use serde::Serialize;

use super::{
    Hub, HubError, ModelRef, architecture, catalog,
    download::needed_for_inference,
    fit::{self, FitEstimate, FitInput, ModelShape},
    http::WaitWatch,
};

/// What is known about a model's size before it is loaded.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ModelFacts {
    pub weights_bytes: u64,
    #[serde(skip)]
    pub shape: ModelShape,
    /// Where the facts came from: "folder", "hub" or "catalog" (approximate).
    pub source: &'static str,
}

/// The machine's side of the fit: free and total memory, and on a Mac
/// MLX's recommended working set (the caller passes it; the hub does not
/// load MLX).
#[derive(Debug, Clone, Copy)]
pub struct MachineMemory {
    pub available_bytes: u64,
    pub total_bytes: u64,
    pub working_set_bytes: Option<u64>,
}

impl MachineMemory {
    /// The machine's memory now, no more than `ONDO_MEMORY_LIMIT` where
    /// that is set.
    pub fn read(working_set_bytes: Option<u64>) -> Self {
        let totals = ondo_os::memory_totals().unwrap_or(ondo_os::MemoryTotals {
            total_bytes: 0,
            available_bytes: 0,
        });
        let limit = crate::environment::memory_limit().unwrap_or(u64::MAX);
        Self {
            available_bytes: totals.available_bytes.min(limit),
            total_bytes: totals.total_bytes.min(limit),
            working_set_bytes,
        }
    }
}

impl ModelFacts {
    pub fn estimate(&self, context_tokens: u64, machine: MachineMemory) -> FitEstimate {
        self.estimate_held_in(context_tokens, machine, None)
    }

    /// `estimate`, with the KV cache held in `kv_bits` where asked.
    pub fn estimate_held_in(
        &self,
        context_tokens: u64,
        machine: MachineMemory,
        kv_bits: Option<fit::KvCacheBits>,
    ) -> FitEstimate {
        fit::estimate_fit(&FitInput {
            weights_bytes: self.weights_bytes,
            shape: self.shape.clone(),
            context_tokens,
            available_bytes: machine.available_bytes,
            total_bytes: machine.total_bytes,
            working_set_bytes: machine.working_set_bytes,
            kv_bits,
        })
    }
}

/// Refuses a config whose architecture the engine does not run, before
/// anything else is read or fetched.
fn check_runnable(id: &str, config: &serde_json::Value) -> Result<(), HubError> {
    architecture::check_config(config).map_err(|unsupported| HubError::UnsupportedModelType {
        model: id.to_owned(),
        unsupported,
    })
}

fn not_sizable(id: &str) -> impl FnOnce(fit::FitError) -> HubError + '_ {
    move |err| HubError::NotAModel {
        repo_id: id.to_owned(),
        reason: err.to_string(),
    }
}

/// Facts of a model folder on disk.
pub fn facts_from_folder(dir: &Path) -> Result<ModelFacts, HubError> {
    let id = dir.display().to_string();
    let config_path = dir.join("config.json");
    let bytes = std::fs::read(&config_path).map_err(HubError::io(&config_path))?;
    let config: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|err| HubError::NotAModel {
            repo_id: id.clone(),
            reason: format!("config.json is not valid JSON: {err}"),
        })?;
    check_runnable(&id, &config)?;
    let weights: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(HubError::io(dir))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        })
        .collect();
    // Where this machine holds only some of a sharded snapshot's files (one
    // rank's layers), its index gives the whole model's size.
    let indexed = std::fs::read(dir.join("model.safetensors.index.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .filter(|index| {
            crate::family::shards::files_holding(index, None)
                .iter()
                .any(|file| !dir.join(file).is_file())
        })
        .and_then(|index| index["metadata"]["total_size"].as_u64());
    let weights_bytes = indexed.unwrap_or_else(|| {
        weights
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    });
    let dtype = weights
        .first()
        .and_then(|p| fit::read_safetensors_header(p).ok())
        .and_then(|h| fit::safetensors_float_dtype(&h));
    let shape = ModelShape::from_config(&config, dtype.as_deref()).map_err(not_sizable(&id))?;
    Ok(ModelFacts {
        weights_bytes,
        shape,
        source: "folder",
    })
}

/// A folder's weight bytes by decoder layer (read from the safetensors
/// headers, nothing else): the bytes of each layer's tensors (names with
/// `layers.N.`), and of the rest (embeddings, final norm, head, a vision
/// tower), which every rank of a split model holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerBytes {
    pub shared: u64,
    pub by_layer: std::collections::BTreeMap<usize, u64>,
}

impl LayerBytes {
    /// The bytes a rank holding layers `first..end` keeps.
    pub fn of_layers(&self, first: usize, end: usize) -> u64 {
        self.shared + self.by_layer.range(first..end).map(|(_, b)| b).sum::<u64>()
    }
}

impl LayerBytes {
    /// The bytes `share` keeps of a model of `layers` layers: its range of
    /// layers, or (by heads) a 1/size slice of every layer's projections
    /// (norms are a rounding error beside them); the embeddings and head
    /// whole either way.
    pub fn of_share(&self, layers: usize, share: crate::family::shards::RankPart) -> Option<u64> {
        match share.by_layers {
            true => {
                let (first, end) =
                    crate::family::shards::layer_range(layers, share.rank, share.size).ok()?;
                Some(self.of_layers(first, end))
            }
            false => Some(
                self.shared
                    + self.of_layers(0, layers).saturating_sub(self.shared)
                        / share.size.max(1) as u64,
            ),
        }
    }
}

/// The weight bytes of `share` of the model in `dir`, from the files there
/// (which need hold no other rank's layers).
pub fn share_bytes(dir: &Path, share: crate::family::shards::RankPart) -> Option<u64> {
    let layers = facts_from_folder(dir).ok()?.shape.num_hidden_layers as usize;
    layer_bytes(dir).ok()?.of_share(layers, share)
}

/// `dir`'s weight bytes by decoder layer (`LayerBytes`): each tensor in
/// the decoder layer its family's loader puts it in
/// (`family::shards::decoder_layer_of`, the rule the ranks load by).
pub fn layer_bytes(dir: &Path) -> Result<LayerBytes, HubError> {
    let not_a_model = |reason: String| HubError::NotAModel {
        repo_id: dir.display().to_string(),
        reason,
    };
    let config_path = dir.join("config.json");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).map_err(HubError::io(&config_path))?)
            .map_err(|e| not_a_model(format!("{}: {e}", config_path.display())))?;
    let config = crate::family::settle(&config)
        .map_err(|e| not_a_model(format!("{}: {e}", config_path.display())))?;
    let mut bytes = LayerBytes::default();
    for entry in std::fs::read_dir(dir).map_err(HubError::io(dir))?.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let header = fit::read_safetensors_header(&path).map_err(HubError::io(&path))?;
        let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
            .map_err(|e| {
                not_a_model(format!(
                    "{}: the safetensors header is not JSON: {e}",
                    path.display()
                ))
            })?;
        for (name, tensor) in &header {
            let Some([start, end]) = tensor["data_offsets"]
                .as_array()
                .and_then(|o| Some([o.first()?.as_u64()?, o.get(1)?.as_u64()?]))
            else {
                continue;
            };
            let size = end.saturating_sub(start);
            match crate::family::shards::decoder_layer_of(&config, name) {
                Some(layer) => *bytes.by_layer.entry(layer).or_default() += size,
                None => bytes.shared += size,
            }
        }
    }
    Ok(bytes)
}

impl Hub {
    /// Facts of a repo on the hub, without downloading it: the weight sizes
    /// from the repo info, config.json into memory, and (only when the config
    /// names no dtype) the first weight file's header by Range.
    pub async fn facts_from_hub(&self, model: &ModelRef) -> Result<ModelFacts, HubError> {
        self.facts_from_hub_watched(model, &mut WaitWatch::default())
            .await
    }

    /// [`Hub::facts_from_hub`], telling `watch` about waits for a busy hub.
    pub(crate) async fn facts_from_hub_watched(
        &self,
        model: &ModelRef,
        watch: &mut WaitWatch<'_>,
    ) -> Result<ModelFacts, HubError> {
        let info = self.repo_info_watched(model, watch).await?;
        // The files are read at the commit the info describes, even if the
        // branch moves meanwhile.
        let model = &ModelRef {
            repo_id: model.repo_id.clone(),
            revision: info.commit.clone(),
        };
        let weights: Vec<_> = info
            .files
            .iter()
            .filter(|f| needed_for_inference(&f.path) && f.path.ends_with(".safetensors"))
            .collect();
        let weights_bytes = weights.iter().map(|f| f.size_bytes).sum();
        let config_bytes = self.read_small_file(model, "config.json", watch).await?;
        let config: serde_json::Value =
            serde_json::from_slice(&config_bytes).map_err(|err| HubError::NotAModel {
                repo_id: model.repo_id.clone(),
                reason: format!("config.json is not valid JSON: {err}"),
            })?;
        // Said before any weight file is touched, even by a Range request.
        check_runnable(&model.repo_id, &config)?;
        let config_has_dtype = ["torch_dtype", "dtype"].iter().any(|key| {
            config.get(key).is_some()
                || config.get("text_config").and_then(|t| t.get(key)).is_some()
        });
        let mut dtype = None;
        if let (false, Some(first)) = (config_has_dtype, weights.first()) {
            // The header's length, then the whole header (JSON) after it.
            let len_bytes = self.read_file_prefix(model, &first.path, 8, watch).await?;
            if let Ok(len) = <[u8; 8]>::try_from(len_bytes.as_slice()) {
                let header_len = u64::from_le_bytes(len).min(100 << 20);
                let header = self
                    .read_file_prefix(model, &first.path, 8 + header_len, watch)
                    .await?;
                dtype = fit::safetensors_float_dtype(header.get(8..).unwrap_or_default());
            }
        }
        let shape = ModelShape::from_config(&config, dtype.as_deref())
            .map_err(not_sizable(&model.repo_id))?;
        Ok(ModelFacts {
            weights_bytes,
            shape,
            source: "hub",
        })
    }
}

impl Hub {
    /// Facts for what a user named: a model folder, a repo in the cache, a
    /// repo on the hub (nothing downloaded), or, offline, a catalog entry.
    /// Returns the facts and the name to show.
    pub async fn facts_for(&self, text: &str) -> Result<(ModelFacts, String), HubError> {
        let as_path = Path::new(text);
        if as_path.is_dir() {
            return Ok((facts_from_folder(as_path)?, text.to_owned()));
        }
        let model = ModelRef::parse(text)?;
        if let Some(snapshot) = super::library::cached_snapshot_dir(&self.config.cache_dir, &model)
        {
            return Ok((facts_from_folder(&snapshot)?, model.to_string()));
        }
        match self.facts_from_hub(&model).await {
            Ok(facts) => Ok((facts, model.to_string())),
            // Offline or unreachable: the catalog still knows its own models.
            Err(err @ (HubError::Unreachable { .. } | HubError::NotCachedOffline { .. })) => {
                match facts_from_catalog(&model.repo_id) {
                    Some(facts) => Ok((facts?, model.to_string())),
                    None => Err(err),
                }
            }
            Err(err) => Err(err),
        }
    }
}

/// Facts from the curated catalog (approximate sizes), for offline advice.
/// `None` when the catalog does not list the repo.
pub fn facts_from_catalog(repo_id: &str) -> Option<Result<ModelFacts, HubError>> {
    let entry = catalog::find(repo_id)?;
    Some(facts_of_entry(entry))
}

fn facts_of_entry(entry: &catalog::CatalogEntry) -> Result<ModelFacts, HubError> {
    check_runnable(entry.repo_id, &entry.config())?;
    Ok(ModelFacts {
        weights_bytes: entry.size_bytes,
        shape: entry.shape().map_err(not_sizable(entry.repo_id))?,
        source: "catalog",
    })
}

/// A catalog entry as offered on this machine: its fit at a context,
/// whether it is already downloaded, and whether the engine runs it.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct CatalogOffer {
    pub entry: &'static catalog::CatalogEntry,
    pub fit: FitEstimate,
    pub downloaded: bool,
    /// "not supported yet: model_type X (Ondo runs: ...)" when the engine
    /// cannot run it; such a model is listed but not downloaded.
    pub unsupported: Option<String>,
}

/// The catalog with a verdict for each model on this machine.
pub fn catalog_offers(
    cache_dir: &Path,
    context_tokens: u64,
    machine: MachineMemory,
) -> Vec<CatalogOffer> {
    catalog::catalog()
        .iter()
        .filter_map(|entry| {
            // The catalog's tests check every entry's config is sizable.
            let shape = entry.shape().ok()?;
            let facts = ModelFacts {
                weights_bytes: entry.size_bytes,
                shape,
                source: "catalog",
            };
            Some(CatalogOffer {
                entry,
                fit: facts.estimate(context_tokens, machine),
                downloaded: super::library::find_cached(cache_dir, entry.repo_id)
                    .is_some_and(|m| m.complete),
                unsupported: entry.unsupported(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_of_layers_holds_its_layers_and_the_shared_tensors() {
        let bytes = LayerBytes {
            shared: 10,
            by_layer: [(0, 1), (1, 2), (2, 4)].into_iter().collect(),
        };
        assert_eq!(bytes.of_layers(1, 3), 16);
        assert_eq!(bytes.of_layers(0, 1), 11);
    }

    #[test]
    fn a_synth_folders_layers_and_the_rest_add_up_to_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut options =
            crate::synth::SynthOptions::for_preset(crate::synth::preset_named("tiny").unwrap());
        options.layers = Some(3);
        crate::synth::write_model(&options, dir.path(), &mut |_| {}).unwrap();
        let bytes = layer_bytes(dir.path()).unwrap();
        assert_eq!(
            bytes.by_layer.keys().copied().collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert!(bytes.shared > 0);
        let files: u64 = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
            .map(|e| e.metadata().unwrap().len())
            .sum();
        let tensors = bytes.of_layers(0, 3);
        assert!(
            tensors < files && files - tensors < 64 * 1024,
            "{tensors} of {files}"
        );
    }

    #[test]
    fn a_vision_towers_layers_are_shared_not_the_decoders() {
        let dir = tempfile::tempdir().unwrap();
        let mut options =
            crate::synth::SynthOptions::for_preset(crate::synth::preset_named("tiny").unwrap());
        options.arch = crate::family::find("gemma3").unwrap();
        options.layers = Some(2);
        crate::synth::write_model(&options, dir.path(), &mut |_| {}).unwrap();
        let bytes = layer_bytes(dir.path()).unwrap();
        // Its checkpoint names the text layers under the language model and
        // the tower's encoder layers under the tower: only the text's count.
        assert_eq!(bytes.by_layer.keys().copied().collect::<Vec<_>>(), [0, 1]);
    }
}
