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

use std::path::Path;
use std::time::Instant;

use mlx_rs::error::Exception;
use mlx_rs::{Array, ops};
use serde_json::Value;

use super::model::decoder::{ChunkImages, ImageInsert};
use super::model::qwen_vision::{QwenVision, QwenVisionConfig};
use super::model::siglip::{Gemma3Vision, SiglipConfig};
use super::weights::WeightMap;
use super::{LoadError, RunError};
use crate::vision::{ImageLimits, ImageProcessor, PatchGridProcessor};

/// The tensor a folder with Gemma 3's vision tower has.
const PATCH_KERNEL: &str = "vision_tower.vision_model.embeddings.patch_embedding.weight";

/// The tensor a folder with Qwen's vision tower has (mlx-community's name,
/// then transformers').
const QWEN_PATCH_KERNEL: [&str; 2] = [
    "vision_tower.patch_embed.proj.weight",
    "model.visual.patch_embed.proj.weight",
];

/// The tensors of a multimodal checkpoint's vision part.
const VISION_PREFIXES: [&str; 3] = ["vision_tower.", "multi_modal_projector.", "model.visual."];

/// How many image tokens an image fills, and how they lie: `rows` x
/// `cols`, row by row (Gemma 3's pooled 16 x 16; Qwen's merged patch
/// grid, which its 3-D rope reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageShape {
    pub rows: usize,
    pub cols: usize,
}

impl ImageShape {
    pub fn tokens(&self) -> usize {
        self.rows * self.cols
    }
}

/// How a family's images become tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageLayout {
    /// Every image the same tokens, which the processor writes as two
    /// newlines, the begin marker, the image tokens, the end marker and
    /// two newlines where the template wrote the begin marker (Gemma 3).
    Fixed { per_image: usize },
    /// An image at about its own size: the template writes the begin
    /// marker, one image token and the end marker, and the processor
    /// repeats that image token as often as the image's grid fills
    /// (Qwen3-VL).
    Grid(PatchGridProcessor),
}

/// The tokens that mark an image in a prompt, from config.json.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageTokens {
    /// The id every image token has in the prompt.
    pub image: u32,
    /// The markers before and after an image's tokens.
    pub begin: u32,
    pub end: u32,
    pub layout: ImageLayout,
}

impl ImageTokens {
    /// The image tokens of the model folder `dir` whose config.json is
    /// `config`: Gemma 3's (keys at the top level or in `text_config`,
    /// transformers' defaults where absent) or Qwen3-VL's (its processor's
    /// settings read from `dir`); `None` for a config without a vision
    /// part.
    pub fn of_config(config: &Value, dir: &Path) -> Result<Option<Self>, String> {
        if !config.get("vision_config").is_some_and(Value::is_object) {
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
        match config.get("model_type").and_then(Value::as_str) {
            Some("gemma3") => Ok(Some(Self {
                layout: ImageLayout::Fixed {
                    per_image: count("mm_tokens_per_image", 256)? as usize,
                },
                image: count("image_token_index", 262_144)? as u32,
                begin: count("boi_token_index", 255_999)? as u32,
                end: count("eoi_token_index", 256_000)? as u32,
            })),
            Some(qwen @ ("qwen3_vl" | "qwen3_5" | "qwen3_5_moe")) => {
                let processor =
                    PatchGridProcessor::from_model_dir(dir).map_err(|e| e.to_string())?;
                // The published checkpoints' ids where a config leaves them
                // out.
                let (image, begin, end) = match qwen {
                    "qwen3_vl" => (151_655, 151_652, 151_653),
                    _ => (248_056, 248_053, 248_054),
                };
                Ok(Some(Self {
                    layout: ImageLayout::Grid(processor),
                    image: count("image_token_id", image)? as u32,
                    begin: count("vision_start_token_id", begin)? as u32,
                    end: count("vision_end_token_id", end)? as u32,
                }))
            }
            _ => Ok(None),
        }
    }

    /// How each of `images` (whole image files) lies in tokens, from their
    /// headers alone (no pixel decoded).
    pub fn shapes(
        &self,
        images: &[&[u8]],
        limits: ImageLimits,
    ) -> Result<Vec<ImageShape>, RunError> {
        images
            .iter()
            .enumerate()
            .map(|(n, bytes)| {
                let named = |e: String| {
                    RunError::InvalidSettings(if images.len() > 1 {
                        format!("image {}: {e}", n + 1)
                    } else {
                        e
                    })
                };
                match &self.layout {
                    ImageLayout::Fixed { per_image } => {
                        let side = (*per_image as f64).sqrt().round() as usize;
                        Ok(if side * side == *per_image {
                            ImageShape {
                                rows: side,
                                cols: side,
                            }
                        } else {
                            ImageShape {
                                rows: 1,
                                cols: *per_image,
                            }
                        })
                    }
                    ImageLayout::Grid(processor) => {
                        let (width, height) = crate::vision::dimensions(bytes, limits)
                            .map_err(|e| named(e.to_string()))?;
                        let grid = processor.grid(width, height).map_err(named)?;
                        let m = processor.merge_size;
                        Ok(ImageShape {
                            rows: grid.height / m,
                            cols: grid.width / m,
                        })
                    }
                }
            })
            .collect()
    }

    /// `text` (a rendered prompt) with each image's marker expanded into
    /// the tokens that image fills (`shapes`, in order); an error unless
    /// the template wrote exactly one marker per image.
    pub fn expand_markers(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        shapes: &[ImageShape],
    ) -> Result<String, RunError> {
        let token = |id: u32| {
            tokenizer.id_to_token(id).ok_or_else(|| {
                RunError::Load(format!(
                    "the tokenizer has no token {id}, which config.json names for images"
                ))
            })
        };
        let (begin, end, image) = (token(self.begin)?, token(self.end)?, token(self.image)?);
        let marker = match self.layout {
            ImageLayout::Fixed { .. } => &begin,
            ImageLayout::Grid(_) => &image,
        };
        let pieces: Vec<&str> = text.split(marker.as_str()).collect();
        let markers = pieces.len() - 1;
        if markers != shapes.len() {
            return Err(RunError::InvalidSettings(format!(
                "the prompt shows {} image(s) but its chat template placed {markers}; \
                 this model's template does not take images where they were given",
                shapes.len()
            )));
        }
        let mut expanded = String::with_capacity(text.len());
        for (piece, shape) in pieces.iter().zip(shapes) {
            expanded.push_str(piece);
            let run = image.repeat(shape.tokens());
            match self.layout {
                ImageLayout::Fixed { .. } => {
                    expanded.push_str(&format!("\n\n{begin}{run}{end}\n\n"));
                }
                ImageLayout::Grid(_) => expanded.push_str(&run),
            }
        }
        expanded.push_str(pieces.last().copied().unwrap_or_default());
        Ok(expanded)
    }

    /// Where each image's tokens start in `ids`, checked against `shapes`:
    /// every image fills one unbroken run of as many image tokens as its
    /// shape holds.
    pub fn image_starts(&self, ids: &[u32], shapes: &[ImageShape]) -> Result<Vec<usize>, RunError> {
        let mut starts = Vec::with_capacity(shapes.len());
        let mut i = 0;
        while i < ids.len() {
            if ids[i] != self.image {
                i += 1;
                continue;
            }
            let run = ids[i..].iter().take_while(|&&id| id == self.image).count();
            let expected = shapes.get(starts.len()).map(ImageShape::tokens);
            if expected != Some(run) {
                return Err(RunError::InvalidSettings(format!(
                    "the prompt holds a run of {run} image tokens where {} were expected; do \
                     not type the model's image token as text",
                    expected.map_or("none".to_owned(), |n| n.to_string())
                )));
            }
            starts.push(i);
            i += run;
        }
        if starts.len() != shapes.len() {
            return Err(RunError::InvalidSettings(format!(
                "the prompt holds {} image(s) worth of image tokens for {} image(s)",
                starts.len(),
                shapes.len()
            )));
        }
        Ok(starts)
    }
}

/// The tower of a vision model, with what it reads.
enum Tower {
    /// Gemma 3's SigLIP tower at its fixed size; its features are divided
    /// by the square root of the text width (`text_hidden`) before the
    /// embeddings' scale brings them back (mlx-vlm's order).
    Siglip {
        tower: Gemma3Vision,
        processor: ImageProcessor,
        text_hidden: usize,
    },
    /// Qwen's tower, each image at its own size (the processor is in the
    /// tokens' layout).
    Qwen(QwenVision),
}

/// A loaded vision tower with what it takes to place its tokens.
pub struct VisionModel {
    tower: Tower,
    pub tokens: ImageTokens,
}

/// Whether the model folder `dir` has a vision tower Ondo runs, from its
/// files alone (no weights read): a multimodal config of a vision family,
/// its image processor's settings, and the tower's tensors named in a
/// safetensors header.
pub fn folder_sees_images(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else {
        return false;
    };
    let Ok(config) = serde_json::from_str::<Value>(&text) else {
        return false;
    };
    matches!(ImageTokens::of_config(&config, dir), Ok(Some(_)))
        && dir.join("preprocessor_config.json").is_file()
        && super::weights::weight_files(dir).is_ok_and(|files| {
            files.iter().any(|file| {
                super::cache::file::read_header(file).is_ok_and(|header| {
                    std::iter::once(PATCH_KERNEL)
                        .chain(QWEN_PATCH_KERNEL)
                        .any(|name| header.holds(name))
                })
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
    let config_path = weights.dir.join("config.json");
    let invalid = |message: String| LoadError::ConfigInvalid {
        path: config_path.clone(),
        message,
    };
    let vision_config = config.get("vision_config").cloned().unwrap_or(Value::Null);
    let tower = if weights.contains(PATCH_KERNEL) {
        let Some(tokens) = ImageTokens::of_config(config, &weights.dir).map_err(invalid)? else {
            return Ok(None);
        };
        let ImageLayout::Fixed { per_image } = tokens.layout else {
            return Err(invalid(format!(
                "a SigLIP vision tower in a {model_type} checkpoint, whose images are not laid \
                 out as Gemma 3's"
            )));
        };
        let siglip: SiglipConfig = serde_json::from_value(vision_config)
            .map_err(|e| invalid(format!("vision_config: {e}")))?;
        let processor =
            ImageProcessor::from_model_dir(&weights.dir).map_err(|e| LoadError::ConfigInvalid {
                path: weights.dir.join(&e.path),
                message: format!("the image processor's settings: {}", e.detail),
            })?;
        let tower = Gemma3Vision::load(siglip, text_hidden, per_image, weights, quant)?;
        (
            Tower::Siglip {
                tower,
                processor,
                text_hidden,
            },
            tokens,
        )
    } else if QWEN_PATCH_KERNEL.iter().any(|name| weights.contains(name)) {
        // transformers' names for the tower are read as mlx-community's.
        for name in weights
            .tensors
            .keys()
            .filter(|k| k.starts_with("model.visual."))
            .cloned()
            .collect::<Vec<_>>()
        {
            if let Some(tensor) = weights.tensors.remove(&name) {
                let renamed = format!("vision_tower.{}", &name["model.visual.".len()..]);
                weights.tensors.insert(renamed, tensor);
            }
        }
        let Some(tokens) =
            ImageTokens::of_config(config, &weights.dir).map_err(|e| LoadError::ConfigInvalid {
                path: weights.dir.join("preprocessor_config.json"),
                message: format!("the image processor's settings: {e}"),
            })?
        else {
            return Ok(None);
        };
        let qwen: QwenVisionConfig = serde_json::from_value(vision_config)
            .map_err(|e| invalid(format!("vision_config: {e}")))?;
        if let ImageLayout::Grid(processor) = &tokens.layout
            && (processor.patch_size != qwen.patch_size
                || processor.merge_size != qwen.spatial_merge_size
                || processor.temporal_patch_size != qwen.temporal_patch_size)
        {
            return Err(invalid(format!(
                "the image processor cuts {}-pixel patches merged {}x{} ({} in time), the vision \
                 tower reads {}-pixel patches merged {}x{} ({} in time)",
                processor.patch_size,
                processor.merge_size,
                processor.merge_size,
                processor.temporal_patch_size,
                qwen.patch_size,
                qwen.spatial_merge_size,
                qwen.spatial_merge_size,
                qwen.temporal_patch_size
            )));
        }
        (
            Tower::Qwen(QwenVision::load(qwen, text_hidden, weights, quant)?),
            tokens,
        )
    } else {
        return Ok(None);
    };
    let (tower, tokens) = tower;
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
    Ok(Some(VisionModel { tower, tokens }))
}

/// One image's tokens as the tower gives them: the embeddings that take
/// the image tokens' place, and (Qwen3-VL) what DeepStack adds to their
/// hidden states after each of the first text layers.
#[derive(Clone)]
pub struct EncodedImage {
    /// `[tokens, hidden]`, before any embedding scale.
    pub main: Array,
    pub deepstack: Vec<Array>,
}

impl VisionModel {
    /// Every weight array (to evaluate at load and count bytes).
    pub fn arrays(&self) -> Vec<&Array> {
        match &self.tower {
            Tower::Siglip { tower, .. } => tower.arrays(),
            Tower::Qwen(tower) => tower.arrays(),
        }
    }

    /// Whether image tokens turn by a 3-D position (Qwen3-VL, Qwen 3.5).
    fn positions_in_3d(&self) -> bool {
        matches!(self.tower, Tower::Qwen(_))
    }

    /// Each image's tokens (`images` are whole image files), as the tower
    /// and projector give them for the image as its processor prepares it
    /// (before `encode` readies them for the embeddings).
    pub fn features(
        &self,
        images: &[&[u8]],
        limits: ImageLimits,
    ) -> Result<Vec<EncodedImage>, RunError> {
        let mut encoded = Vec::with_capacity(images.len());
        for (n, bytes) in images.iter().enumerate() {
            let named = |e: String| {
                RunError::InvalidSettings(if images.len() > 1 {
                    format!("image {}: {e}", n + 1)
                } else {
                    e
                })
            };
            let pixels = crate::vision::decode(bytes, limits).map_err(|e| named(e.to_string()))?;
            encoded.push(match &self.tower {
                Tower::Siglip {
                    tower, processor, ..
                } => {
                    let (chw, height, width) = processor.pixel_values(&pixels);
                    let values = Array::from_slice(&chw, &[1, 3, height as i32, width as i32])
                        .transpose_axes(&[0, 2, 3, 1])?
                        .as_dtype(tower.dtype())?;
                    let features = tower.encode(&values)?;
                    let tokens = features.shape()[1];
                    EncodedImage {
                        main: features.reshape(&[tokens, -1])?,
                        deepstack: Vec::new(),
                    }
                }
                Tower::Qwen(tower) => {
                    let ImageLayout::Grid(processor) = &self.tokens.layout else {
                        unreachable!("a Qwen tower is loaded with a grid layout");
                    };
                    let (rows, grid) = processor.patches(&pixels).map_err(named)?;
                    let patches = Array::from_slice(
                        &rows,
                        &[grid.patches() as i32, processor.patch_values() as i32],
                    )
                    .as_dtype(tower.dtype())?;
                    let features = tower.encode(&patches, grid.height, grid.width)?;
                    EncodedImage {
                        main: features.main,
                        deepstack: features.deepstack,
                    }
                }
            });
        }
        Ok(encoded)
    }

    /// Decodes, encodes and evaluates `fresh` (image files whose tokens
    /// start at `starts` in the prompt) for a prompt whose images are
    /// `all` (each image's first token and shape, the cached ones too):
    /// what the prefill puts in their place, and where a 3-D rope turns
    /// every token.
    pub fn encode(
        &self,
        fresh: &[&[u8]],
        starts: Vec<usize>,
        all: &[(usize, ImageShape)],
        limits: ImageLimits,
    ) -> Result<PromptImages, RunError> {
        let started = Instant::now();
        let mut features = self.features(fresh, limits)?;
        if let Tower::Siglip { text_hidden, .. } = &self.tower {
            // Divided by the square root of the text width, in the
            // features' dtype: the embedding scale the decoder applies to
            // every position then brings them back (to within its bfloat16
            // rounding).
            for image in &mut features {
                let root =
                    Array::from_f32((*text_hidden as f32).sqrt()).as_dtype(image.main.dtype())?;
                image.main = ops::divide(&image.main, &root)?;
            }
        }
        let mut arrays: Vec<&Array> = Vec::new();
        for image in &features {
            arrays.push(&image.main);
            arrays.extend(image.deepstack.iter());
        }
        mlx_rs::transforms::eval(arrays)?;
        Ok(PromptImages {
            starts,
            features,
            rope: self.positions_in_3d().then(|| RopeLayout {
                images: all.to_vec(),
            }),
            offset: 0,
            // Nothing encoded (the cache holds every image) reads as 0 ms.
            encode_ms: match fresh.is_empty() {
                true => 0.0,
                false => started.elapsed().as_secs_f64() * 1e3,
            },
        })
    }
}

/// Where a 3-D rope (Qwen3-VL's) turns each token of a prompt, from where
/// its images are and how their tokens lie. Text turns by its position
/// on all three axes, shifted by what the images before it saved; an
/// image's tokens all share one time position, their row and column
/// counted from it; text after an image resumes one past the image's
/// largest position.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeLayout {
    /// Each image's first token in the prompt and its shape, in order.
    pub images: Vec<(usize, ImageShape)>,
}

impl RopeLayout {
    /// What is added to a text token's position at prompt position `at`
    /// (zero or less): for each image wholly before it, its largest side
    /// less its token count.
    pub fn shift_at(&self, at: usize) -> i32 {
        self.images
            .iter()
            .filter(|(start, shape)| start + shape.tokens() <= at)
            .map(|(_, shape)| shape.rows.max(shape.cols) as i32 - shape.tokens() as i32)
            .sum()
    }

    /// The shift after every image: what decoding adds to the cache's
    /// position.
    pub fn final_shift(&self) -> i32 {
        self.shift_at(usize::MAX)
    }

    /// The time, row and column positions `[3 * (end - start)]` (three rows
    /// one after another) of prompt positions `start..end`, when an image
    /// token lies among them; `None` where all are text (one shift turns
    /// them).
    pub fn positions(&self, start: usize, end: usize) -> Option<Vec<i32>> {
        if !self
            .images
            .iter()
            .any(|(first, shape)| *first < end && first + shape.tokens() > start)
        {
            return None;
        }
        let length = end - start;
        let mut out = vec![0i32; 3 * length];
        for (i, at) in (start..end).enumerate() {
            let (t, r, c) = match self
                .images
                .iter()
                .find(|(first, shape)| *first <= at && at < first + shape.tokens())
            {
                Some(&(first, shape)) => {
                    let base = first as i32 + self.shift_at(first);
                    let j = at - first;
                    (
                        base,
                        base + (j / shape.cols) as i32,
                        base + (j % shape.cols) as i32,
                    )
                }
                None => {
                    let p = at as i32 + self.shift_at(at);
                    (p, p, p)
                }
            };
            out[i] = t;
            out[length + i] = r;
            out[2 * length + i] = c;
        }
        Some(out)
    }
}

/// A prompt's images, encoded: the embeddings that replace its image
/// tokens, and (Qwen3-VL) the 3-D rope's layout of the whole prompt.
#[derive(Clone)]
pub struct PromptImages {
    /// Where each encoded image's tokens start, counted from the run's
    /// first token.
    pub starts: Vec<usize>,
    pub features: Vec<EncodedImage>,
    /// Every image of the prompt (those the cache holds too), for a 3-D
    /// rope; `None` for a model whose rope is 1-D.
    pub rope: Option<RopeLayout>,
    /// The prompt position of the run's first token.
    offset: usize,
    /// Decoding, resizing and the tower and projector, evaluated.
    pub encode_ms: f64,
}

impl std::fmt::Debug for PromptImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptImages")
            .field("starts", &self.starts)
            .field("offset", &self.offset)
            .field("rope", &self.rope)
            .field("encode_ms", &self.encode_ms)
            .finish()
    }
}

impl PromptImages {
    /// The same images with positions counted from prompt position
    /// `offset` (at or before the first image encoded here).
    pub fn after(&self, offset: usize) -> PromptImages {
        PromptImages {
            starts: self.starts.iter().map(|s| s - offset.min(*s)).collect(),
            offset: self.offset + offset,
            ..self.clone()
        }
    }

    /// What decoding adds to the cache's position (non-zero for a 3-D
    /// rope after an image).
    pub fn rope_shift(&self) -> i32 {
        self.rope.as_ref().map_or(0, RopeLayout::final_shift)
    }

    /// What the run's positions `start..end` (counted from its first
    /// token) take: for each image overlapping them, where its rows go
    /// (counted from `start`) and the rows `[1, count, hidden]` with their
    /// DeepStack rows; and, for a 3-D rope, the chunk's positions.
    pub fn within(&self, start: usize, end: usize) -> Result<ChunkImages, Exception> {
        use mlx_rs::ops::indexing::IndexOp;
        let mut inserts = Vec::new();
        for (&first, image) in self.starts.iter().zip(&self.features) {
            let last = first + image.main.shape()[0] as usize;
            let (from, to) = (first.max(start), last.min(end));
            if from >= to {
                continue;
            }
            let rows = |a: &Array| {
                a.index(((from - first) as i32..(to - first) as i32, ..))
                    .expand_dims(0)
            };
            inserts.push(ImageInsert {
                at: (from - start) as i32,
                rows: rows(&image.main)?,
                deepstack: image.deepstack.iter().map(rows).collect::<Result<_, _>>()?,
            });
        }
        let (at, to) = (self.offset + start, self.offset + end);
        let (positions, shift) = match &self.rope {
            Some(rope) => (
                rope.positions(at, to)
                    .map(|p| Array::from_slice(&p, &[3, (to - at) as i32])),
                rope.shift_at(at),
            ),
            None => (None, 0),
        };
        Ok(ChunkImages {
            inserts,
            positions,
            shift,
            rope_3d: self.rope.is_some(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_3d_rope_turns_images_by_row_and_column_and_text_after_them_resumes_past_them() {
        // Two images: 2x3 tokens at 3, then 3x1 tokens at 11.
        let layout = RopeLayout {
            images: vec![
                (3, ImageShape { rows: 2, cols: 3 }),
                (11, ImageShape { rows: 3, cols: 1 }),
            ],
        };
        let p = layout.positions(0, 16).unwrap();
        let (t, r, c) = (&p[..16], &p[16..32], &p[32..]);
        assert_eq!(&t[..3], &[0, 1, 2]);
        // The first image: one time position (3), rows 3..5, columns 3..6.
        assert_eq!(&t[3..9], &[3; 6]);
        assert_eq!(&r[3..9], &[3, 3, 3, 4, 4, 4]);
        assert_eq!(&c[3..9], &[3, 4, 5, 3, 4, 5]);
        // Text resumes one past the largest (5): 6, 7 at prompt 9, 10.
        assert_eq!(&t[9..11], &[6, 7]);
        assert_eq!(layout.shift_at(9), -3);
        // The second image (taller than wide) starts at 8.
        assert_eq!(&t[11..14], &[8, 8, 8]);
        assert_eq!(&r[11..14], &[8, 9, 10]);
        assert_eq!(&c[11..14], &[8, 8, 8]);
        assert_eq!(&t[14..], &[11, 12]);
        assert_eq!(layout.final_shift(), -3);
        // A chunk of text alone needs no positions, only its shift.
        assert_eq!(layout.positions(9, 11), None);
        assert!(layout.positions(8, 10).is_some());
    }
}
