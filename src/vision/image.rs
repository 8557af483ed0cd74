//! An image file or upload into RGB pixels, within limits checked before
//! any pixel is decoded: a 50 MB upload or a 100-megapixel image is
//! refused from its size or its header, never decoded into gigabytes.
//!
//! The pixels are those mlx-vlm's `load_image` gives a processor: the
//! EXIF orientation applied, then RGB with any alpha channel dropped (as
//! Pillow's `convert("RGB")` drops it), and a GIF's first frame.

use std::io::Cursor;

use image::{ImageDecoder, ImageFormat, ImageReader};

use super::resample::Pixels;

/// How large an image may be, in bytes and in pixels (a setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(default)]
pub struct ImageLimits {
    pub max_bytes: u64,
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    /// 20 MiB (what hosted APIs take per image) and 32 megapixels (a
    /// phone's 24-megapixel photo passes; a 40-megapixel one does not).
    fn default() -> Self {
        Self {
            max_bytes: 20 << 20,
            max_pixels: 32_000_000,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error(
        "the image is {bytes} bytes, more than the {limit} allowed; send a smaller file (or raise \
         the largest image in Settings, or --max-image-mib)"
    )]
    TooManyBytes { bytes: u64, limit: u64 },
    #[error(
        "the image is {width}x{height} pixels, more than the {limit} allowed; scale it down first \
         (or raise the image pixels in Settings, or --max-image-megapixels)"
    )]
    TooManyPixels { width: u32, height: u32, limit: u64 },
    #[error("the file is not an image Ondo reads ({0}); send PNG, JPEG, WebP or GIF")]
    Unsupported(String),
    #[error("the image could not be decoded: {0}")]
    Damaged(String),
}

/// The formats read; anything else is refused by name.
const READ: [ImageFormat; 4] = [
    ImageFormat::Png,
    ImageFormat::Jpeg,
    ImageFormat::WebP,
    ImageFormat::Gif,
];

/// An image file's decoder, its header checked against `limits` (the
/// bytes, the format, the pixel count) before any pixel is decoded.
fn open(bytes: &[u8], limits: ImageLimits) -> Result<impl ImageDecoder + '_, ImageError> {
    if bytes.len() as u64 > limits.max_bytes {
        return Err(ImageError::TooManyBytes {
            bytes: bytes.len() as u64,
            limit: limits.max_bytes,
        });
    }
    let format = image::guess_format(bytes)
        .map_err(|_| ImageError::Unsupported("its first bytes match no image format".into()))?;
    if !READ.contains(&format) {
        return Err(ImageError::Unsupported(format!("{format:?}")));
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    // The decoder refuses to allocate past this too, whatever the header
    // claims (4 bytes a pixel, and room for a decoder's own buffers).
    let mut decoder_limits = image::Limits::default();
    decoder_limits.max_alloc = Some(limits.max_pixels.saturating_mul(8).max(1 << 20));
    reader.limits(decoder_limits);
    let decoder = reader
        .into_decoder()
        .map_err(|e| ImageError::Damaged(e.to_string()))?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(ImageError::TooManyPixels {
            width,
            height,
            limit: limits.max_pixels,
        });
    }
    Ok(decoder)
}

/// The (width, height) `decode` would give, read from the header alone
/// (the EXIF orientation applied): what a model whose image tokens follow
/// the image's size needs to count them.
pub fn dimensions(bytes: &[u8], limits: ImageLimits) -> Result<(usize, usize), ImageError> {
    if super::heif::is_heif(bytes) {
        let (width, height, orientation) = super::heif::header(bytes, limits)?;
        // EXIF orientations 5 to 8 turn the picture a quarter.
        return Ok(if orientation >= 5 {
            (height as usize, width as usize)
        } else {
            (width as usize, height as usize)
        });
    }
    let mut decoder = open(bytes, limits)?;
    let (width, height) = decoder.dimensions();
    let (width, height) = (width as usize, height as usize);
    use image::metadata::Orientation::*;
    Ok(match decoder.orientation() {
        Ok(Rotate90 | Rotate270 | Rotate90FlipH | Rotate270FlipH) => (height, width),
        _ => (width, height),
    })
}

/// Checks an image sent as base64 (`encoded`) against `limits` without
/// decoding it: its size from the text's length, its pixels from a header
/// decoded from the text's first part. What the header alone cannot say
/// (a damaged file, a header past that part) is left to `decode`.
pub fn check_encoded(encoded: &str, limits: ImageLimits) -> Result<(), ImageError> {
    use base64::Engine as _;
    let encoded = encoded.trim();
    let padding = encoded.bytes().rev().take_while(|&b| b == b'=').count();
    let bytes = (encoded.len() / 4 * 3).saturating_sub(padding) as u64;
    if bytes > limits.max_bytes {
        return Err(ImageError::TooManyBytes {
            bytes,
            limit: limits.max_bytes,
        });
    }
    // A header fits in the first 64 KiB (a JPEG's may follow its EXIF
    // block, itself at most 64 KiB).
    let head = &encoded[..encoded.len().min(96 * 1024) / 4 * 4];
    let Ok(head) = base64::engine::general_purpose::STANDARD.decode(head) else {
        return Ok(());
    };
    match dimensions(&head, limits) {
        Err(error @ ImageError::TooManyPixels { .. }) => Err(error),
        _ => Ok(()),
    }
}

/// `bytes` (a whole image file) decoded to RGB pixels within `limits`.
pub fn decode(bytes: &[u8], limits: ImageLimits) -> Result<Pixels, ImageError> {
    if super::heif::is_heif(bytes) {
        let heif = super::heif::decode(bytes, limits)?;
        let rgb = image::RgbImage::from_raw(heif.width, heif.height, heif.rgb)
            .ok_or_else(|| ImageError::Damaged("the HEIC pixels do not fill the image".into()))?;
        let mut decoded = image::DynamicImage::ImageRgb8(rgb);
        if let Some(orientation) = image::metadata::Orientation::from_exif(heif.orientation) {
            decoded.apply_orientation(orientation);
        }
        let rgb = decoded.to_rgb8();
        return Ok(Pixels {
            width: rgb.width() as usize,
            height: rgb.height() as usize,
            channels: 3,
            data: rgb.into_raw(),
        });
    }
    let mut decoder = open(bytes, limits)?;
    let (width, height) = decoder.dimensions();
    let orientation = decoder.orientation().ok();
    let mut decoded = image::DynamicImage::from_decoder(decoder).map_err(|e| match e {
        image::ImageError::Limits(_) => ImageError::TooManyPixels {
            width,
            height,
            limit: limits.max_pixels,
        },
        other => ImageError::Damaged(other.to_string()),
    })?;
    if let Some(orientation) = orientation {
        decoded.apply_orientation(orientation);
    }
    let rgb = decoded.to_rgb8();
    Ok(Pixels {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        channels: 3,
        data: rgb.into_raw(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32) -> Vec<u8> {
        let image = image::RgbaImage::from_fn(width, height, |x, y| {
            image::Rgba([x as u8, y as u8, 9, if x % 2 == 0 { 255 } else { 0 }])
        });
        let mut bytes = Vec::new();
        image
            .write_to(&mut Cursor::new(&mut bytes), ImageFormat::Png)
            .unwrap();
        bytes
    }

    #[test]
    fn a_png_decodes_to_rgb_with_its_alpha_dropped() {
        let pixels = decode(&png(5, 3), ImageLimits::default()).unwrap();
        assert_eq!((pixels.width, pixels.height, pixels.channels), (5, 3, 3));
        // Pixel (1, 2): fully transparent, its colour kept as it is.
        let at = (2 * 5 + 1) * 3;
        assert_eq!(&pixels.data[at..at + 3], &[1, 2, 9]);
    }

    /// A PNG whose header says `width` x `height` and whose pixels are a
    /// single row's worth: what a hostile upload looks like.
    fn png_claiming(width: u32, height: u32) -> Vec<u8> {
        let mut bytes = png(1, 1);
        // The IHDR chunk: length (4), "IHDR" (4), width, height, 5 more
        // bytes, then its CRC over type and data.
        let ihdr = 8;
        bytes[ihdr + 8..ihdr + 12].copy_from_slice(&width.to_be_bytes());
        bytes[ihdr + 12..ihdr + 16].copy_from_slice(&height.to_be_bytes());
        let crc = crc32fast::hash(&bytes[ihdr + 4..ihdr + 8 + 13]);
        bytes[ihdr + 8 + 13..ihdr + 8 + 17].copy_from_slice(&crc.to_be_bytes());
        bytes
    }

    #[test]
    fn a_40_megapixel_header_is_refused_before_any_pixel_is_decoded() {
        let bytes = png_claiming(8000, 5000);
        // Refused for its size, not as damaged: the header was read, the
        // missing pixels never asked for.
        let error = decode(&bytes, ImageLimits::default()).unwrap_err();
        assert_eq!(
            error,
            ImageError::TooManyPixels {
                width: 8000,
                height: 5000,
                limit: 32_000_000
            }
        );
        assert!(error.to_string().contains("8000x5000"), "{error}");
    }

    #[test]
    fn an_image_in_base64_is_checked_from_its_length_and_header_alone() {
        use base64::Engine as _;
        let limits = ImageLimits {
            max_bytes: 1000,
            max_pixels: 100,
        };
        let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        assert_eq!(check_encoded(&encode(&png(5, 3)), limits), Ok(()));
        assert_eq!(
            check_encoded(&encode(&[0u8; 1001]), limits),
            Err(ImageError::TooManyBytes {
                bytes: 1001,
                limit: 1000
            })
        );
        assert!(matches!(
            check_encoded(&encode(&png_claiming(20, 10)), limits),
            Err(ImageError::TooManyPixels { .. })
        ));
        // Not an image at all: left for the decoder to name.
        assert_eq!(check_encoded(&encode(b"hello"), limits), Ok(()));
    }

    #[test]
    fn too_many_bytes_or_pixels_and_other_files_are_refused_by_name() {
        let bytes = png(40, 30);
        let small = ImageLimits {
            max_bytes: 100,
            max_pixels: 1_000_000,
        };
        assert!(matches!(
            decode(&bytes, small),
            Err(ImageError::TooManyBytes { .. })
        ));
        let few = ImageLimits {
            max_bytes: 1 << 20,
            max_pixels: 1000,
        };
        assert_eq!(
            decode(&bytes, few),
            Err(ImageError::TooManyPixels {
                width: 40,
                height: 30,
                limit: 1000
            })
        );
        let error = decode(b"%PDF-1.7 not an image", ImageLimits::default()).unwrap_err();
        assert!(
            error.to_string().contains("PNG, JPEG, WebP or GIF"),
            "{error}"
        );
        let mut cut = png(40, 30);
        cut.truncate(cut.len() / 2);
        assert!(matches!(
            decode(&cut, ImageLimits::default()),
            Err(ImageError::Damaged(_))
        ));
    }
}
