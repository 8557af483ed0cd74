//! What a model's `preprocessor_config.json` asks of an image before its
//! vision tower sees it: a size, a resampling filter, a rescale factor and
//! a mean and standard deviation per channel. The arithmetic is
//! transformers' Pillow backend's, step for step: the resize in 8 bits
//! (`resample`), the rescale in float64 then float32, the normalization in
//! float32, channels first.

use std::path::Path;

use serde_json::Value;

use super::resample::{Filter, Pixels};

/// A model's image preprocessing, read from its `preprocessor_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    /// Every image is resized to this (width, height), when `resize`.
    pub size: (usize, usize),
    pub resize: bool,
    pub filter: Filter,
    /// Multiplies each 8-bit value, when set (1/255 for most).
    pub rescale_factor: Option<f64>,
    /// Per channel, when normalizing.
    pub mean_std: Option<([f32; 3], [f32; 3])>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{path}: {detail}")]
pub struct ProcessorConfigError {
    pub path: String,
    pub detail: String,
}

fn three(value: &Value, default: f32) -> Option<[f32; 3]> {
    match value {
        Value::Null => Some([default; 3]),
        Value::Number(n) => Some([n.as_f64()? as f32; 3]),
        Value::Array(items) if items.len() == 3 => {
            let mut out = [0f32; 3];
            for (o, v) in out.iter_mut().zip(items) {
                *o = v.as_f64()? as f32;
            }
            Some(out)
        }
        _ => None,
    }
}

/// `dir/preprocessor_config.json`, parsed, with what names an error in
/// it.
pub(super) fn read_preprocessor_config(
    dir: &Path,
) -> Result<(Value, impl Fn(String) -> ProcessorConfigError), ProcessorConfigError> {
    let path = dir.join("preprocessor_config.json").display().to_string();
    let fail = move |detail: String| ProcessorConfigError {
        path: path.clone(),
        detail,
    };
    let text = std::fs::read_to_string(dir.join("preprocessor_config.json")).map_err(|e| {
        fail(format!(
            "{e}; a vision model's folder holds its image processor's settings here"
        ))
    })?;
    let config: Value = serde_json::from_str(&text).map_err(|e| fail(format!("not JSON: {e}")))?;
    Ok((config, fail))
}

impl ImageProcessor {
    /// The processor `dir/preprocessor_config.json` describes.
    pub fn from_model_dir(dir: &Path) -> Result<Self, ProcessorConfigError> {
        let (config, fail) = read_preprocessor_config(dir)?;
        Self::from_config(&config).map_err(fail)
    }

    /// The processor a parsed `preprocessor_config.json` describes.
    pub fn from_config(config: &Value) -> Result<Self, String> {
        let flag = |key: &str| config[key].as_bool().unwrap_or(true);
        let size = &config["size"];
        let size = match (
            size["width"].as_u64(),
            size["height"].as_u64(),
            size["shortest_edge"].as_u64(),
        ) {
            (Some(w), Some(h), _) => (w as usize, h as usize),
            (_, _, Some(edge)) => (edge as usize, edge as usize),
            _ => match size.as_u64() {
                Some(edge) => (edge as usize, edge as usize),
                None => return Err(format!("\"size\" gives no width and height: {size}")),
            },
        };
        let resample = config["resample"].as_i64().unwrap_or(2);
        let filter = Filter::from_pil(resample).ok_or_else(|| {
            format!("\"resample\" is {resample}; Ondo resizes with bilinear (2) or bicubic (3)")
        })?;
        let rescale_factor =
            flag("do_rescale").then(|| config["rescale_factor"].as_f64().unwrap_or(1.0 / 255.0));
        let mean_std = if flag("do_normalize") {
            // transformers' defaults: IMAGENET_STANDARD_MEAN and _STD.
            let mean = three(&config["image_mean"], 0.5).ok_or_else(|| {
                format!("\"image_mean\" is not 3 numbers: {}", config["image_mean"])
            })?;
            let std = three(&config["image_std"], 0.5).ok_or_else(|| {
                format!("\"image_std\" is not 3 numbers: {}", config["image_std"])
            })?;
            Some((mean, std))
        } else {
            None
        };
        Ok(Self {
            size,
            resize: flag("do_resize"),
            filter,
            rescale_factor,
            mean_std,
        })
    }

    /// `image`'s pixel values as the tower takes them: `[3, height, width]`
    /// float32, channels first; with the height and width.
    pub fn pixel_values(&self, image: &Pixels) -> (Vec<f32>, usize, usize) {
        let resized;
        let image = if self.resize {
            resized = image.resize(self.size.0, self.size.1, self.filter);
            &resized
        } else {
            image
        };
        let (w, h, c) = (image.width, image.height, image.channels);
        let mut values = vec![0f32; 3 * w * h];
        for channel in 0..3 {
            let from = channel.min(c - 1);
            let plane = &mut values[channel * w * h..][..w * h];
            for (i, v) in plane.iter_mut().enumerate() {
                let byte = image.data[i * c + from];
                let mut x = match self.rescale_factor {
                    Some(scale) => (f64::from(byte) * scale) as f32,
                    None => f32::from(byte),
                };
                if let Some((mean, std)) = &self.mean_std {
                    x = (x - mean[channel]) / std[channel];
                }
                *v = x;
            }
        }
        (values, h, w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma_3s_config_reads_as_siglip_at_896_bilinear_around_a_half() {
        let config = serde_json::json!({
            "do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null,
            "do_rescale": true, "do_resize": true,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "image_processor_type": "Gemma3ImageProcessor",
            "resample": 2, "rescale_factor": 0.00392156862745098,
            "size": {"height": 896, "width": 896}
        });
        let processor = ImageProcessor::from_config(&config).unwrap();
        assert_eq!(processor.size, (896, 896));
        assert_eq!(processor.filter, Filter::Bilinear);
        let white = Pixels {
            width: 2,
            height: 2,
            channels: 3,
            data: vec![255; 12],
        };
        let (values, h, w) = processor.pixel_values(&white);
        assert_eq!((h, w, values.len()), (896, 896, 3 * 896 * 896));
        assert!(values.iter().all(|&v| v == 1.0));
        let lanczos = serde_json::json!({"size": {"height": 8, "width": 8}, "resample": 1});
        let error = ImageProcessor::from_config(&lanczos).unwrap_err();
        assert!(error.contains("bilinear (2) or bicubic (3)"), "{error}");
    }
}
