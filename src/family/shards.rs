//! Which stored tensors a part of a model holds when the model is split
//! over ranks: by layers, a contiguous range of the decoder layers (mlx-lm's
//! split: as even as it can be, the lower ranks taking one layer more where
//! the count does not divide, the highest rank running the first layers)
//! and every tensor outside the layers; by heads, a slice of every tensor.
//! The loader, the download and the fit all ask the same questions here.

use super::config::ModelConfig;

/// The layers `rank` of `size` runs out of `layers`: `(first, end)`.
pub fn layer_range(layers: usize, rank: usize, size: usize) -> Result<(usize, usize), String> {
    if size == 0 || rank >= size {
        return Err(format!("rank {rank} of {size} ranks"));
    }
    if layers < size {
        return Err(format!(
            "a model of {layers} layers cannot be split over {size} ranks: each needs a layer"
        ));
    }
    let (base, extra) = (layers / size, layers % size);
    let share = |r: usize| base + usize::from(r < extra);
    let first: usize = (rank + 1..size).map(share).sum();
    Ok((first, first + share(rank)))
}

/// One rank's part of a split model, known before anything is loaded or
/// downloaded: rank `rank` of `size`, by layers or by heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RankPart {
    pub rank: usize,
    pub size: usize,
    /// A range of the layers each (pipeline); else a share of every
    /// layer's heads (tensor).
    pub by_layers: bool,
}

impl RankPart {
    /// The decoder layers this rank runs, `(first, end)`: all of them when
    /// split by heads.
    pub fn layers(&self, config: &ModelConfig) -> Result<(usize, usize), String> {
        if self.by_layers {
            layer_range(config.num_hidden_layers, self.rank, self.size)
        } else {
            Ok((0, config.num_hidden_layers))
        }
    }

    /// Whether this rank reads the stored tensor `name` of a model of
    /// `config`: everything but another rank's decoder layers.
    pub fn reads(&self, config: &ModelConfig, name: &str) -> bool {
        let Ok((first, end)) = self.layers(config) else {
            return true;
        };
        decoder_layer_of(config, name).is_none_or(|layer| (first..end).contains(&layer))
    }

    /// "rank 1 of 2 (layers 0-11)", for messages.
    pub fn described(&self, config: &ModelConfig) -> String {
        match (self.by_layers, self.layers(config)) {
            (true, Ok((first, end))) => format!(
                "rank {} of {} (layers {first}-{})",
                self.rank,
                self.size,
                end.saturating_sub(1)
            ),
            _ => format!("rank {} of {} (by heads)", self.rank, self.size),
        }
    }
}

/// The decoder layer a stored tensor belongs to: its name after the
/// family's renames (as the loader applies them), under
/// `{weight_prefix}.layers.N.`. A vision tower's layers, the embedding and
/// the final norm belong to none.
pub fn decoder_layer_of(config: &ModelConfig, stored: &str) -> Option<usize> {
    let mut name = stored.to_owned();
    for (from, to) in &config.renamed_prefixes {
        if let Some(rest) = name.strip_prefix(from.as_str()) {
            name = format!("{to}{rest}");
        }
    }
    let rest = name
        .strip_prefix(config.weight_prefix.as_str())?
        .strip_prefix(".layers.")?;
    rest.split('.').next()?.parse().ok()
}

/// Which stored tensors a reader wants: all, or those a test says.
pub type Reads<'a> = Option<&'a dyn Fn(&str) -> bool>;

/// The files an index (`model.safetensors.index.json`) names that hold any
/// tensor `reads` wants, sorted, each once. A file holding only other
/// ranks' layers is not needed, on disk or from the hub.
pub fn files_holding(index: &serde_json::Value, reads: Reads) -> Vec<String> {
    let mut files: Vec<String> = index["weight_map"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(name, _)| reads.is_none_or(|reads| reads(name)))
                .filter_map(|(_, file)| file.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.dedup();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_split_as_mlx_lm_splits_them() {
        // 30 layers over 4 ranks: 8, 8, 7, 7; the last rank runs the first.
        let ranges: Vec<(usize, usize)> = (0..4).map(|r| layer_range(30, r, 4).unwrap()).collect();
        assert_eq!(ranges, [(22, 30), (14, 22), (7, 14), (0, 7)]);
        assert_eq!(layer_range(4, 0, 1).unwrap(), (0, 4));
        assert_eq!(layer_range(5, 0, 2).unwrap(), (2, 5));
        assert_eq!(layer_range(5, 1, 2).unwrap(), (0, 2));
    }

    fn llama_of(layers: usize) -> ModelConfig {
        crate::family::settle(&serde_json::json!({
            "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": layers,
            "vocab_size": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "tie_word_embeddings": true
        }))
        .unwrap()
    }

    fn part(rank: usize, by_layers: bool) -> RankPart {
        RankPart {
            rank,
            size: 2,
            by_layers,
        }
    }

    #[test]
    fn a_rank_split_by_layers_needs_only_the_files_of_its_layers() {
        let config = llama_of(6);
        // The highest rank runs the first layers.
        let (first, last) = (part(1, true), part(0, true));
        assert_eq!(first.described(&config), "rank 1 of 2 (layers 0-2)");
        assert!(first.reads(&config, "model.layers.2.mlp.up_proj.weight"));
        assert!(!first.reads(&config, "model.layers.3.mlp.up_proj.weight"));
        assert!(!last.reads(&config, "model.layers.0.self_attn.q_proj.scales"));
        for both in [
            "model.embed_tokens.weight",
            "model.norm.weight",
            "lm_head.weight",
        ] {
            assert!(
                first.reads(&config, both) && last.reads(&config, both),
                "{both}"
            );
        }
        let index = serde_json::json!({"weight_map": {
            "model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
            "model.layers.5.mlp.up_proj.weight": "model-00002-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors",
        }});
        let files = |part: RankPart| files_holding(&index, Some(&|name| part.reads(&config, name)));
        // The final norm is everyone's: rank 1 needs the second file too.
        assert_eq!(files(first).len(), 2);
        assert_eq!(files(last), ["model-00002-of-00002.safetensors"]);
        let index = serde_json::json!({"weight_map": {
            "model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
            "model.layers.5.mlp.up_proj.weight": "model-00002-of-00002.safetensors",
        }});
        let files = |part: RankPart| files_holding(&index, Some(&|name| part.reads(&config, name)));
        assert_eq!(files(first), ["model-00001-of-00002.safetensors"]);
        assert_eq!(files(last), ["model-00002-of-00002.safetensors"]);
        // By heads every rank holds a slice of every tensor.
        assert_eq!(files(part(1, false)).len(), 2);
    }

    #[test]
    fn a_multimodal_checkpoints_text_layers_are_found_in_either_spelling() {
        let mut config = llama_of(4);
        config.read_inside_language_model(&[]);
        let first = part(1, true);
        assert_eq!(
            decoder_layer_of(&config, "language_model.model.layers.3.mlp.up_proj.weight"),
            Some(3)
        );
        assert_eq!(
            decoder_layer_of(&config, "model.language_model.layers.2.mlp.up_proj.weight"),
            Some(2)
        );
        assert!(!first.reads(&config, "model.language_model.layers.2.mlp.up_proj.weight"));
        // The vision tower's layers are nobody's decoder layers: every rank reads them.
        assert_eq!(
            decoder_layer_of(&config, "vision_tower.encoder.layers.3.mlp.fc1.weight"),
            None
        );
        assert!(first.reads(&config, "vision_tower.encoder.layers.3.mlp.fc1.weight"));
    }

    #[test]
    fn a_model_with_fewer_layers_than_ranks_says_so() {
        let error = layer_range(2, 0, 3).unwrap_err();
        assert!(
            error.contains("2 layers") && error.contains("3 ranks"),
            "{error}"
        );
    }
}
