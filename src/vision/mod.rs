//! Images for vision models: a file or an upload decoded within limits
//! (`image`), resized exactly as Pillow resizes (`resample`), and turned
//! into the pixel values a model's image processor gives its vision tower
//! (`preprocess`).

pub mod image;
pub mod preprocess;
pub mod resample;

pub use image::{ImageError, ImageLimits, decode};
pub use preprocess::ImageProcessor;
pub use resample::{Filter, Pixels};
