//! Images in a prompt: the vision part of a multimodal checkpoint, and the
//! image tokens it puts where the prompt shows an image.
//!
//! A message's images reach the chat template as `{"type": "image"}` parts
//! before its text; the template writes the model's image marker for each
//! (Gemma 3: `<start_of_image>`), and the processor's rule expands each
//! marker into the tokens the image fills (Gemma 3: two newlines, the
//! marker, `mm_tokens_per_image` image tokens, the end marker, two
//! newlines), as transformers' and mlx-vlm's processors expand it before
//! tokenizing. Each image is decoded within the limits, resized and
//! normalized as its `preprocessor_config.json` says (`crate::vision`),
//! and run through the tower and projector once; its tokens' embeddings
//! then take the place of the image tokens' during the prefill.

use std::time::Instant;

use mlx_rs::error::Exception;
use mlx_rs::{Array, ops};
use serde_json::Value;

use super::model::siglip::{Gemma3Vision, SiglipConfig};
use super::weights::WeightMap;
use super::{LoadError, RunError};
use crate::vision::{ImageLimits, ImageProcessor};

/// The tensor a Gemma 3 folder with a vision tower has.
const PATCH_KERNEL: &str = "vision_tower.vision_model.embeddings.patch_embedding.weight";

/// The tensors of a multimodal checkpoint's vision part.
const VISION_PREFIXES: [&str; 2] = ["vision_tower.", "multi_modal_projector."];

/// The tokens that mark an image in a prompt, from config.json.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageTokens {
    /// The id every image token has in the prompt.
    pub image: u32,
    /// The markers before and after an image's tokens.
    pub begin: u32,
    pub end: u32,
    /// Tokens each image fills.
    pub per_image: usize,
}

impl ImageTokens {
    /// Gemma 3's, read from `config` (its keys at the top level or in
    /// `text_config`; transformers' defaults where absent); `None` for a
    /// config without a vision part.
    pub fn of_config(config: &Value) -> Result<Option<Self>, String> {
        if config.get("model_type").and_then(Value::as_str) != Some("gemma3")
            || !config.get("vision_config").is_some_and(Value::is_object)
        {
            return Ok(None);
        }
        let count = |key: &str, default: u64| -> Result<u64, String> {
            let value = config
                .get(key)
                .or_else(|| config.get("text_config").and_then(|t| t.get(key)));
            match value {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_u64()
                    .ok_or_else(|| format!("{key} is {v}, not a whole number")),
            }
        };
        Ok(Some(Self {
            per_image: count("mm_tokens_per_image", 256)? as usize,
            image: count("image_token_index", 262_144)? as u32,
            begin: count("boi_token_index", 255_999)? as u32,
            end: count("eoi_token_index", 256_000)? as u32,
        }))
    }

    /// `text` (a rendered prompt) with each of its `images` markers
    /// expanded into the tokens the image fills; an error unless the
    /// template wrote exactly one marker per image.
    pub fn expand_markers(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        images: usize,
    ) -> Result<String, RunError> {
        let token = |id: u32| {
            tokenizer.id_to_token(id).ok_or_else(|| {
                RunError::Load(format!(
                    "the tokenizer has no token {id}, which config.json names for images"
                ))
            })
        };
        let (boi, eoi, image) = (token(self.begin)?, token(self.end)?, token(self.image)?);
        let markers = text.matches(boi.as_str()).count();
        if markers != images {
            return Err(RunError::InvalidSettings(format!(
                "the prompt shows {images} image(s) but its chat template placed {markers}; \
                 this model's template does not take images where they were given"
            )));
        }
        let expanded = format!("\n\n{boi}{}{eoi}\n\n", image.repeat(self.per_image));
        Ok(text.replace(boi.as_str(), &expanded))
    }
}

/// A loaded vision tower with what it takes to place its tokens.
pub struct VisionModel {
    tower: Gemma3Vision,
    processor: ImageProcessor,
    pub tokens: ImageTokens,
    /// The text model's width: image features are divided by its square
    /// root before the embeddings' scale is applied (mlx-vlm's order).
    text_hidden: usize,
}

/// Whether the model folder `dir` has a vision tower Ondo runs, from its
/// files alone (no weights read): a multimodal config of a vision family,
/// its image processor's settings, and the tower's tensors named in a
/// safetensors header.
pub fn folder_sees_images(dir: &std::path::Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else {
        return false;
    };
    let Ok(config) = serde_json::from_str::<Value>(&text) else {
        return false;
    };
    matches!(ImageTokens::of_config(&config), Ok(Some(_)))
        && dir.join("preprocessor_config.json").is_file()
        && super::weights::weight_files(dir).is_ok_and(|files| {
            files.iter().any(|file| {
                super::cache::file::read_header(file).is_ok_and(|header| header.holds(PATCH_KERNEL))
            })
        })
}

/// The vision part of the checkpoint in `weights`, when `config` (its
/// config.json) has one and the folder holds its tensors; `None` for a text
/// model, or a multimodal config whose folder was converted without its
/// tower (it answers text only, as before).
pub fn load(
    model_type: &str,
    config: &Value,
    text_hidden: usize,
    weights: &mut WeightMap,
    quant: Option<&super::model::QuantConfig>,
) -> Result<Option<VisionModel>, LoadError> {
    if !weights.contains(PATCH_KERNEL) {
        return Ok(None);
    }
    let config_path = weights.dir.join("config.json");
    let invalid = |message: String| LoadError::ConfigInvalid {
        path: config_path.clone(),
        message,
    };
    let vision_config: SiglipConfig =
        serde_json::from_value(config.get("vision_config").cloned().unwrap_or(Value::Null))
            .map_err(|e| invalid(format!("vision_config: {e}")))?;
    let Some(tokens) = ImageTokens::of_config(config).map_err(invalid)? else {
        return Ok(None);
    };
    let processor =
        ImageProcessor::from_model_dir(&weights.dir).map_err(|e| LoadError::ConfigInvalid {
            path: weights.dir.join(&e.path),
            message: format!("the image processor's settings: {}", e.detail),
        })?;
    let tower = Gemma3Vision::load(vision_config, text_hidden, tokens.per_image, weights, quant)?;
    // Loading is strict: a vision tensor the tower did not take means a
    // tower other than the config describes.
    let mut left: Vec<&String> = weights
        .tensors
        .keys()
        .filter(|name| VISION_PREFIXES.iter().any(|p| name.starts_with(p)))
        .collect();
    left.sort();
    if let Some(name) = left.first() {
        return Err(LoadError::TensorUnexpected {
            tensor: (*name).clone(),
            file: weights.tensors[*name].file.clone(),
            model_type: model_type.to_owned(),
        });
    }
    Ok(Some(VisionModel {
        tower,
        processor,
        tokens,
        text_hidden,
    }))
}

impl VisionModel {
    /// Every weight array (to evaluate at load and count bytes).
    pub fn arrays(&self) -> Vec<&Array> {
        self.tower.arrays()
    }

    /// Where each image's tokens start in `ids`, checked against `images`:
    /// every image fills one unbroken run of its tokens.
    pub fn image_starts(&self, ids: &[u32], images: usize) -> Result<Vec<usize>, RunError> {
        let mut starts = Vec::with_capacity(images);
        let mut i = 0;
        while i < ids.len() {
            if ids[i] != self.tokens.image {
                i += 1;
                continue;
            }
            let run = ids[i..]
                .iter()
                .take_while(|&&id| id == self.tokens.image)
                .count();
            if run != self.tokens.per_image {
                return Err(RunError::InvalidSettings(format!(
                    "the prompt holds a run of {run} image tokens where an image fills {}; do \
                     not type the model's image token as text",
                    self.tokens.per_image
                )));
            }
            starts.push(i);
            i += run;
        }
        if starts.len() != images {
            return Err(RunError::InvalidSettings(format!(
                "the prompt holds {} image(s) worth of image tokens for {images} image(s)",
                starts.len()
            )));
        }
        Ok(starts)
    }

    /// Pixel values `[n, height, width, 3]` (channels last, as the tower
    /// reads them) of `images` (whole image files), in `dtype`.
    pub fn pixel_values(
        &self,
        images: &[&[u8]],
        limits: ImageLimits,
        dtype: mlx_rs::Dtype,
    ) -> Result<Array, RunError> {
        let mut values = Vec::new();
        let mut size = (0, 0);
        for (n, bytes) in images.iter().enumerate() {
            let pixels = crate::vision::decode(bytes, limits).map_err(|e| {
                RunError::InvalidSettings(if images.len() > 1 {
                    format!("image {}: {e}", n + 1)
                } else {
                    e.to_string()
                })
            })?;
            let (chw, height, width) = self.processor.pixel_values(&pixels);
            size = (height, width);
            values.extend(chw);
        }
        let (height, width) = (size.0 as i32, size.1 as i32);
        let chw = Array::from_slice(&values, &[images.len() as i32, 3, height, width]);
        Ok(chw.transpose_axes(&[0, 2, 3, 1])?.as_dtype(dtype)?)
    }

    /// The image tokens `[n, tokens_per_image, text hidden]` of `pixels`
    /// (`pixel_values`), as the tower and projector give them.
    pub fn features(&self, pixels: &Array) -> Result<Array, Exception> {
        self.tower.encode(pixels)
    }

    /// Decodes, encodes and evaluates `images` for a prompt whose image
    /// tokens start at `starts`: what the prefill puts in their place.
    pub fn encode(
        &self,
        images: &[&[u8]],
        starts: Vec<usize>,
        limits: ImageLimits,
    ) -> Result<PromptImages, RunError> {
        let started = Instant::now();
        let pixels = self.pixel_values(images, limits, self.tower.dtype())?;
        let features = self.features(&pixels)?;
        // Divided by the square root of the text width, in the features'
        // dtype: the embedding scale the decoder applies to every position
        // then brings them back (to within its bfloat16 rounding).
        let root = Array::from_f32((self.text_hidden as f32).sqrt()).as_dtype(features.dtype())?;
        let features = ops::divide(&features, &root)?;
        features.eval()?;
        Ok(PromptImages {
            starts,
            features,
            tokens_per_image: self.tokens.per_image,
            encode_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }
}

/// A prompt's images, encoded: the embeddings that replace its image
/// tokens.
#[derive(Clone)]
pub struct PromptImages {
    /// Where each image's tokens start in the prompt.
    pub starts: Vec<usize>,
    /// `[images, tokens_per_image, hidden]`, before the embedding scale.
    pub features: Array,
    pub tokens_per_image: usize,
    /// Decoding, resizing and the tower and projector, evaluated.
    pub encode_ms: f64,
}

impl std::fmt::Debug for PromptImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptImages")
            .field("starts", &self.starts)
            .field("tokens_per_image", &self.tokens_per_image)
            .field("encode_ms", &self.encode_ms)
            .finish()
    }
}

impl PromptImages {
    /// The same images with positions counted from prompt position
    /// `offset` (at or before the first image).
    pub fn after(&self, offset: usize) -> PromptImages {
        PromptImages {
            starts: self.starts.iter().map(|s| s - offset.min(*s)).collect(),
            ..self.clone()
        }
    }

    /// The embeddings for prompt positions `start..end`: for each image
    /// overlapping it, where its rows go (counted from `start`) and the
    /// rows `[1, count, hidden]`.
    pub fn within(&self, start: usize, end: usize) -> Result<Vec<(i32, Array)>, Exception> {
        let mut inserts = Vec::new();
        for (n, &first) in self.starts.iter().enumerate() {
            let last = first + self.tokens_per_image;
            let (from, to) = (first.max(start), last.min(end));
            if from >= to {
                continue;
            }
            let rows =
                self.features
                    .index_rows(n as i32, (from - first) as i32, (to - first) as i32)?;
            inserts.push(((from - start) as i32, rows));
        }
        Ok(inserts)
    }
}

trait ImageRows {
    fn index_rows(&self, image: i32, from: i32, to: i32) -> Result<Array, Exception>;
}

impl ImageRows for Array {
    /// Rows `from..to` of image `image`, as `[1, to - from, hidden]`.
    fn index_rows(&self, image: i32, from: i32, to: i32) -> Result<Array, Exception> {
        use mlx_rs::ops::indexing::IndexOp;
        Ok(self.index((image..image + 1, from..to, ..)))
    }
}
