//! Images into pixel values, against Pillow and transformers on the same
//! files: Ondo's decoding (PNG, WebP, GIF: the same bytes as Pillow's;
//! JPEG: within a decoder's rounding), its resizing (Pillow's bilinear and
//! bicubic, byte for byte, shrinking and enlarging), Gemma 3's image
//! processor (transformers' Pillow backend: the same float32 values within
//! one unit of rounding), and Qwen3-VL's (mlx-vlm's: the same grid and
//! the same patch values).

mod common;

use std::io::Cursor;
use std::path::{Path, PathBuf};

use image::{ImageFormat, RgbImage, RgbaImage};
use ondo::vision::{Filter, ImageLimits, ImageProcessor, Pixels, decode};
use serde_json::Value;

/// A screenshot-like picture: flat panels, sharp edges, text-like noise and
/// a gradient, so every resampling weight meets a change of colour.
fn picture(width: u32, height: u32) -> RgbImage {
    let mut state = 0x2545_f491_u32;
    RgbImage::from_fn(width, height, |x, y| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let noise = (state % 256) as u8;
        match ((x / 97) + (y / 61)) % 4 {
            0 => image::Rgb([240, 240, 245]),
            1 => image::Rgb([(x % 256) as u8, (y % 256) as u8, 128]),
            2 => image::Rgb([noise, noise / 2, 255 - noise]),
            _ if (x + y) % 7 < 2 => image::Rgb([20, 20, 20]),
            _ => image::Rgb([30, 90, 200]),
        }
    })
}

fn encode(image: &image::DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut bytes = Vec::new();
    image
        .write_to(&mut Cursor::new(&mut bytes), format)
        .unwrap();
    bytes
}

fn reference(args: &[&str]) -> Value {
    common::python_script_json("image_reference.py", args)
}

/// Pillow's pixels of `file`, resized to `size` with `filter` when given.
fn pillow(file: &Path, size: Option<(usize, usize, Filter)>) -> Pixels {
    let out = file.with_extension("pillow");
    let mut args = vec![
        "pixels".to_owned(),
        file.display().to_string(),
        out.display().to_string(),
    ];
    if let Some((w, h, filter)) = size {
        let number = match filter {
            Filter::Bilinear => 2,
            Filter::Bicubic => 3,
        };
        args.extend([w.to_string(), h.to_string(), number.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let meta = reference(&args);
    Pixels {
        width: meta["width"].as_u64().unwrap() as usize,
        height: meta["height"].as_u64().unwrap() as usize,
        channels: 3,
        data: std::fs::read(&out).unwrap(),
    }
}

fn largest_difference(a: &[u8], b: &[u8]) -> u8 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with Pillow")]
fn images_decode_and_resize_to_the_bytes_pillow_gives() {
    let dir = tempfile::tempdir().unwrap();
    let screenshot = image::DynamicImage::ImageRgb8(picture(1024, 640));
    let small = image::DynamicImage::ImageRgb8(picture(37, 23));
    let transparent = image::DynamicImage::ImageRgba8(RgbaImage::from_fn(50, 40, |x, y| {
        image::Rgba([(x * 5) as u8, (y * 6) as u8, 77, ((x + y) * 3) as u8])
    }));
    let files = [
        write(
            dir.path(),
            "screen.png",
            &encode(&screenshot, ImageFormat::Png),
        ),
        write(dir.path(), "small.png", &encode(&small, ImageFormat::Png)),
        write(
            dir.path(),
            "alpha.png",
            &encode(&transparent, ImageFormat::Png),
        ),
        write(
            dir.path(),
            "screen.webp",
            &encode(&screenshot, ImageFormat::WebP),
        ),
        write(dir.path(), "small.gif", &encode(&small, ImageFormat::Gif)),
    ];
    for file in &files {
        let ours = decode(&std::fs::read(file).unwrap(), ImageLimits::default()).unwrap();
        let theirs = pillow(file, None);
        assert_eq!(
            (ours.width, ours.height),
            (theirs.width, theirs.height),
            "{}",
            file.display()
        );
        assert!(
            ours.data == theirs.data,
            "{}: decoded pixels differ",
            file.display()
        );
        let sizes = [
            (896, 896),
            (ours.width / 3 + 1, ours.height / 2 + 1),
            (ours.width * 2 + 3, ours.height + 5),
        ];
        for filter in [Filter::Bilinear, Filter::Bicubic] {
            for (w, h) in sizes {
                let resized = ours.resize(w, h, filter);
                let expected = pillow(file, Some((w, h, filter)));
                assert_eq!(
                    largest_difference(&resized.data, &expected.data),
                    0,
                    "{} to {w}x{h} {filter:?}",
                    file.display()
                );
            }
        }
    }
    // A JPEG: two decoders' inverse DCTs may round apart, by a unit or two.
    let jpeg = write(
        dir.path(),
        "photo.jpg",
        &encode(&screenshot, ImageFormat::Jpeg),
    );
    let ours = decode(&std::fs::read(&jpeg).unwrap(), ImageLimits::default()).unwrap();
    let theirs = pillow(&jpeg, None);
    let difference = largest_difference(&ours.data, &theirs.data);
    assert!(difference <= 3, "JPEG pixels differ by {difference}");
}

#[test]
#[cfg_attr(
    ondo_skip_python,
    ignore = "ONDO_SKIP_PYTHON: no Python with transformers"
)]
fn gemma_3s_pixel_values_are_transformers_to_one_rounding() {
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null,
        "do_rescale": true, "do_resize": true,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "image_processor_type": "Gemma3ImageProcessor",
        "pan_and_scan_max_num_crops": null, "pan_and_scan_min_crop_size": null,
        "pan_and_scan_min_ratio_to_activate": null,
        "processor_class": "Gemma3Processor",
        "resample": 2, "rescale_factor": 0.00392156862745098,
        "size": {"height": 896, "width": 896}
    });
    let config_path = write(
        dir.path(),
        "preprocessor_config.json",
        config.to_string().as_bytes(),
    );
    let processor = ImageProcessor::from_model_dir(dir.path()).unwrap();
    for (name, image) in [
        ("screen.png", picture(1024, 640)),
        ("tiny.png", picture(30, 50)),
    ] {
        let file = write(
            dir.path(),
            name,
            &encode(&image::DynamicImage::ImageRgb8(image), ImageFormat::Png),
        );
        let pixels = decode(&std::fs::read(&file).unwrap(), ImageLimits::default()).unwrap();
        let (ours, height, width) = processor.pixel_values(&pixels);
        let out = file.with_extension("values");
        let meta = reference(&[
            "gemma3",
            file.to_str().unwrap(),
            out.to_str().unwrap(),
            config_path.to_str().unwrap(),
        ]);
        assert_eq!(
            meta["shape"],
            serde_json::json!([3, height, width]),
            "{name}"
        );
        let theirs: Vec<f32> = std::fs::read(&out)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1.2e-7, "{name}: pixel values differ by {worst}");
    }
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-vlm")]
fn qwen_patches_are_mlx_vlms_value_for_value() {
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "size": {"shortest_edge": 4096, "longest_edge": 262_144},
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "do_rescale": true, "rescale_factor": 0.00392156862745098, "do_normalize": true,
        "processor_class": "Qwen3VLProcessor",
        "image_processor_type": "Qwen2VLImageProcessorFast"
    });
    write(
        dir.path(),
        "preprocessor_config.json",
        config.to_string().as_bytes(),
    );
    let processor = ondo::vision::PatchGridProcessor::from_model_dir(dir.path()).unwrap();
    // A wide screenshot (shrunk), a portrait photo, a small image whose
    // sides round half to even (80/32 and 48/32), one grown to the
    // smallest area. PNGs: the decoded bytes are Pillow's (the test above),
    // so what differs would be the processor's.
    let files = [
        ("screen.png", picture(1024, 640)),
        ("photo.png", picture(300, 400)),
        ("ties.png", picture(80, 48)),
        ("tiny.png", picture(20, 30)),
    ];
    for (name, image) in files {
        let file = write(
            dir.path(),
            name,
            &encode(&image::DynamicImage::ImageRgb8(image), ImageFormat::Png),
        );
        let bytes = std::fs::read(&file).unwrap();
        let pixels = decode(&bytes, ImageLimits::default()).unwrap();
        let (ours, grid) = processor.patches(&pixels).unwrap();
        // The header alone gives the same grid (what counting tokens reads).
        let (w, h) = ondo::vision::dimensions(&bytes, ImageLimits::default()).unwrap();
        assert_eq!(processor.grid(w, h).unwrap(), grid, "{name}");
        let out = file.with_extension("patches");
        let meta = reference(&[
            "qwen3_vl",
            file.to_str().unwrap(),
            out.to_str().unwrap(),
            dir.path().to_str().unwrap(),
        ]);
        assert_eq!(
            meta["grid"],
            serde_json::json!([1, grid.height, grid.width]),
            "{name}"
        );
        let theirs: Vec<f32> = std::fs::read(&out)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(ours.len(), theirs.len(), "{name}");
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert_eq!(worst, 0.0, "{name}: patches differ by {worst}");
    }
}
