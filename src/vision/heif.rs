//! HEIC (HEIF) images, what an iPhone or a Mac's screenshot tool may
//! save: on a Mac decoded by the OS's own ImageIO (no HEVC decoder of
//! Ondo's own, and none to trust with uploads), elsewhere refused by name.

use super::image::{ImageError, ImageLimits};

/// Whether `bytes` start as a HEIF file: an ISO box `ftyp` whose brand is
/// one of HEIF's image brands.
pub fn is_heif(bytes: &[u8]) -> bool {
    const BRANDS: [&[u8; 4]; 8] = [
        b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1",
    ];
    bytes.len() >= 12 && &bytes[4..8] == b"ftyp" && BRANDS.iter().any(|b| &bytes[8..12] == *b)
}

/// A decoded HEIF image: RGB pixels, its EXIF orientation not yet applied.
pub struct Decoded {
    pub width: u32,
    pub height: u32,
    pub rgb: Vec<u8>,
    /// The EXIF orientation (1 to 8) the file records.
    pub orientation: u8,
}

#[cfg(not(target_os = "macos"))]
fn unavailable() -> ImageError {
    ImageError::Unsupported(
        "HEIC, which Ondo decodes with macOS's own decoder, not on this system".into(),
    )
}

/// The (width, height, EXIF orientation) the file's header records,
/// checked against `limits`.
#[cfg(not(target_os = "macos"))]
pub fn header(_bytes: &[u8], _limits: ImageLimits) -> Result<(u32, u32, u8), ImageError> {
    Err(unavailable())
}

/// `bytes` decoded within `limits`.
#[cfg(not(target_os = "macos"))]
pub fn decode(_bytes: &[u8], _limits: ImageLimits) -> Result<Decoded, ImageError> {
    Err(unavailable())
}

#[cfg(target_os = "macos")]
pub use image_io::{decode, header};

/// ImageIO and Core Graphics through their C functions (no crate of
/// bindings: a handful of calls).
#[cfg(target_os = "macos")]
mod image_io {
    use std::ffi::c_void;

    use super::{Decoded, ImageError, ImageLimits};

    type CFTypeRef = *const c_void;

    #[repr(C)]
    struct CGRect {
        x: f64,
        y: f64,
        width: f64,
        height: f64,
    }

    /// kCFNumberSInt64Type.
    const CF_NUMBER_SINT64: isize = 4;
    /// kCGImageAlphaNoneSkipLast: RGBX, 4 bytes a pixel.
    const ALPHA_NONE_SKIP_LAST: u32 = 5;

    #[link(name = "CoreFoundation", kind = "framework")]
    unsafe extern "C" {
        fn CFDataCreate(allocator: CFTypeRef, bytes: *const u8, length: isize) -> CFTypeRef;
        fn CFDictionaryGetValue(dictionary: CFTypeRef, key: CFTypeRef) -> CFTypeRef;
        fn CFNumberGetValue(number: CFTypeRef, kind: isize, value: *mut c_void) -> bool;
        fn CFRelease(object: CFTypeRef);
    }

    #[link(name = "ImageIO", kind = "framework")]
    unsafe extern "C" {
        static kCGImagePropertyPixelWidth: CFTypeRef;
        static kCGImagePropertyPixelHeight: CFTypeRef;
        static kCGImagePropertyOrientation: CFTypeRef;
        fn CGImageSourceCreateWithData(data: CFTypeRef, options: CFTypeRef) -> CFTypeRef;
        fn CGImageSourceCopyPropertiesAtIndex(
            source: CFTypeRef,
            index: usize,
            options: CFTypeRef,
        ) -> CFTypeRef;
        fn CGImageSourceCreateImageAtIndex(
            source: CFTypeRef,
            index: usize,
            options: CFTypeRef,
        ) -> CFTypeRef;
    }

    #[link(name = "CoreGraphics", kind = "framework")]
    unsafe extern "C" {
        fn CGColorSpaceCreateDeviceRGB() -> CFTypeRef;
        fn CGBitmapContextCreate(
            data: *mut c_void,
            width: usize,
            height: usize,
            bits_per_component: usize,
            bytes_per_row: usize,
            space: CFTypeRef,
            bitmap_info: u32,
        ) -> CFTypeRef;
        fn CGContextDrawImage(context: CFTypeRef, rect: CGRect, image: CFTypeRef);
    }

    /// A Core Foundation object released when dropped; `None` for null.
    struct Owned(CFTypeRef);

    impl Owned {
        fn new(object: CFTypeRef) -> Option<Self> {
            (!object.is_null()).then_some(Self(object))
        }
    }

    impl Drop for Owned {
        fn drop(&mut self) {
            // SAFETY: a non-null object this wrapper was given ownership of.
            unsafe { CFRelease(self.0) }
        }
    }

    fn damaged(what: &str) -> ImageError {
        ImageError::Damaged(format!("macOS could not read the HEIC file's {what}"))
    }

    /// The image source over `bytes` (copied into a CFData).
    fn source(bytes: &[u8]) -> Result<Owned, ImageError> {
        // SAFETY: CFDataCreate copies `bytes`; the source keeps the data
        // alive by its own reference.
        unsafe {
            let data = Owned::new(CFDataCreate(
                std::ptr::null(),
                bytes.as_ptr(),
                bytes.len() as isize,
            ))
            .ok_or_else(|| damaged("bytes"))?;
            Owned::new(CGImageSourceCreateWithData(data.0, std::ptr::null()))
                .ok_or_else(|| damaged("container"))
        }
    }

    fn number(properties: CFTypeRef, key: CFTypeRef) -> Option<i64> {
        let mut value: i64 = 0;
        // SAFETY: `properties` is a live dictionary; the value it returns
        // is borrowed (a CFNumber), read into an i64.
        unsafe {
            let number = CFDictionaryGetValue(properties, key);
            (!number.is_null()
                && CFNumberGetValue(number, CF_NUMBER_SINT64, (&mut value as *mut i64).cast()))
            .then_some(value)
        }
    }

    pub fn header(bytes: &[u8], limits: ImageLimits) -> Result<(u32, u32, u8), ImageError> {
        if bytes.len() as u64 > limits.max_bytes {
            return Err(ImageError::TooManyBytes {
                bytes: bytes.len() as u64,
                limit: limits.max_bytes,
            });
        }
        let source = source(bytes)?;
        // SAFETY: the properties dictionary is owned (a Copy function).
        let properties = unsafe {
            Owned::new(CGImageSourceCopyPropertiesAtIndex(
                source.0,
                0,
                std::ptr::null(),
            ))
        }
        .ok_or_else(|| damaged("header"))?;
        // SAFETY: the keys are ImageIO's constants.
        let (width, height, orientation) = unsafe {
            (
                number(properties.0, kCGImagePropertyPixelWidth),
                number(properties.0, kCGImagePropertyPixelHeight),
                number(properties.0, kCGImagePropertyOrientation),
            )
        };
        let (Some(width), Some(height)) = (width, height) else {
            return Err(damaged("size"));
        };
        let (width, height) = (
            u32::try_from(width).map_err(|_| damaged("size"))?,
            u32::try_from(height).map_err(|_| damaged("size"))?,
        );
        if u64::from(width) * u64::from(height) > limits.max_pixels {
            return Err(ImageError::TooManyPixels {
                width,
                height,
                limit: limits.max_pixels,
            });
        }
        Ok((width, height, orientation.unwrap_or(1).clamp(1, 8) as u8))
    }

    pub fn decode(bytes: &[u8], limits: ImageLimits) -> Result<Decoded, ImageError> {
        let (width, height, orientation) = header(bytes, limits)?;
        let source = source(bytes)?;
        // SAFETY: the image is owned (a Create function).
        let image = unsafe {
            Owned::new(CGImageSourceCreateImageAtIndex(
                source.0,
                0,
                std::ptr::null(),
            ))
        }
        .ok_or_else(|| damaged("pixels"))?;
        let (w, h) = (width as usize, height as usize);
        let mut rgbx = vec![0u8; w * h * 4];
        // SAFETY: the context draws into `rgbx`, which outlives it and has
        // room for h rows of w * 4 bytes; every object made is released.
        unsafe {
            let space =
                Owned::new(CGColorSpaceCreateDeviceRGB()).ok_or_else(|| damaged("colors"))?;
            let context = Owned::new(CGBitmapContextCreate(
                rgbx.as_mut_ptr().cast(),
                w,
                h,
                8,
                w * 4,
                space.0,
                ALPHA_NONE_SKIP_LAST,
            ))
            .ok_or_else(|| damaged("pixels"))?;
            let rect = CGRect {
                x: 0.0,
                y: 0.0,
                width: w as f64,
                height: h as f64,
            };
            CGContextDrawImage(context.0, rect, image.0);
        }
        let rgb = rgbx
            .chunks_exact(4)
            .flat_map(|pixel| [pixel[0], pixel[1], pixel[2]])
            .collect();
        Ok(Decoded {
            width,
            height,
            rgb,
            orientation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first bytes of a HEIC file: a box length, `ftyp`, the brand.
    fn heic_start(brand: &[u8; 4]) -> Vec<u8> {
        let mut bytes = vec![0, 0, 0, 24];
        bytes.extend_from_slice(b"ftyp");
        bytes.extend_from_slice(brand);
        bytes.extend_from_slice(&[0; 12]);
        bytes
    }

    #[test]
    fn heif_is_known_by_its_ftyp_brand() {
        assert!(is_heif(&heic_start(b"heic")));
        assert!(is_heif(&heic_start(b"mif1")));
        // An MP4 video is an ISO file too, of another brand.
        assert!(!is_heif(&heic_start(b"isom")));
        assert!(!is_heif(b"\x89PNG\r\n\x1a\n"));
    }

    #[cfg(not(target_os = "macos"))]
    #[test]
    fn off_a_mac_heic_is_refused_saying_which_formats_are_read() {
        let error = super::super::image::decode(&heic_start(b"heic"), ImageLimits::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("HEIC") && error.contains("PNG, JPEG"),
            "{error}"
        );
    }
}
