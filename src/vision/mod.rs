//! Images for vision models: a file or an upload decoded within limits
//! (`image`), resized exactly as Pillow resizes (`resample`), and turned
//! into the pixel values a model's image processor gives its vision tower
//! (`preprocess`, or `patch_grid` for models that take each image at
//! about its own size).

pub mod heif;
pub mod image;
pub mod patch_grid;
pub mod preprocess;
pub mod resample;

pub use image::{ImageError, ImageLimits, check_encoded, decode, dimensions};
pub use patch_grid::{PatchGrid, PatchGridProcessor};
pub use preprocess::ImageProcessor;
pub use resample::{Filter, Pixels};
