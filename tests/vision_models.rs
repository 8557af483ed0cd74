//! Vision models against mlx-vlm on the same synthetic folder and image
//! files: Gemma 3's image features (its SigLIP tower and projector) and
//! Qwen3-VL's (its tower, merger and DeepStack taps) within 1e-4 of
//! mlx-vlm's, Qwen3-VL's 3-D rope positions equal to mlx-vlm's, and `ondo run --image`'s greedy tokens equal to
//! mlx-vlm's generate_step for a prompt with one image and with two, in
//! both loop shapes; a model without a tower, and an image over the limits,
//! refused by name.

mod common;

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use image::{ImageFormat, RgbImage};
use ondo::engine::chat_template::{ChatMessage, ChatTemplate};
use ondo::engine::load::LoadedModel;
use ondo::engine::vision::RopeLayout;
use ondo::session::chat::ChatFeatures;
use ondo::vision::ImageLimits;
use serde_json::Value;

/// Greedy tokens compared per run.
const TOKENS: usize = 12;

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn ondo(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    /// `ondo` with this home's folders, to add to before it runs.
    fn command(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ondo"));
        command
            .env("ONDO_HOME", self.dir.path().join("home"))
            .env("HF_HUB_CACHE", self.dir.path().join("hf"))
            .env("ONDO_NO_KEYCHAIN", "1");
        command
    }

    fn synth(&self, name: &str, args: &[&str]) -> PathBuf {
        let dir = self.dir.path().join(name);
        let mut all = vec!["synth", "tiny", dir.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = self.ondo(&all);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

/// `ondo synth` arguments for a float32 folder of `arch`; a Qwen one with
/// a head of its own (a tied random head repeats a token whatever the
/// image; Gemma 3's is always tied).
fn synth_args(arch: &str) -> Vec<&str> {
    let mut args = vec!["--arch", arch, "--dtype", "f32"];
    if arch.starts_with("qwen") {
        args.push("--untied-head");
    }
    args
}

/// A screenshot-like picture: panels, edges, noise and a gradient.
fn picture(width: u32, height: u32, seed: u32) -> Vec<u8> {
    let mut state = 0x2545_f491_u32 ^ seed;
    let image = RgbImage::from_fn(width, height, |x, y| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let noise = (state % 256) as u8;
        match ((x / 97) + (y / 61) + seed) % 4 {
            0 => image::Rgb([240, 240, 245]),
            1 => image::Rgb([(x % 256) as u8, (y % 256) as u8, 128]),
            2 => image::Rgb([noise, noise / 2, 255 - noise]),
            _ => image::Rgb([30, 90, 200]),
        }
    });
    let mut bytes = Vec::new();
    image::DynamicImage::ImageRgb8(image)
        .write_to(&mut Cursor::new(&mut bytes), ImageFormat::Png)
        .unwrap();
    bytes
}

/// The prompt Ondo's chat template renders for `question` with `images`
/// image(s), before the markers are expanded.
fn rendered(model: &Path, question: &str, images: usize) -> String {
    rendered_turns(
        model,
        &[ChatMessage {
            images: vec![String::new(); images],
            ..ChatMessage::user(question)
        }],
    )
}

fn rendered_turns(model: &Path, messages: &[ChatMessage]) -> String {
    let template = ChatTemplate::from_model_dir(model).unwrap().unwrap();
    template
        .render_with(messages, None, &serde_json::Map::new(), true)
        .unwrap()
}

/// mlx-vlm's input ids, greedy tokens and image features for `prompt`
/// with `images`.
fn mlx_vlm(home: &Home, model: &Path, prompt: &str, images: &[&Path]) -> (Value, Vec<f32>) {
    let prompt_file = home.file("prompt.txt", prompt.as_bytes());
    let out = home.dir.path().join("features.bin");
    let tokens = TOKENS.to_string();
    let mut args = vec![
        model.to_str().unwrap(),
        prompt_file.to_str().unwrap(),
        tokens.as_str(),
        out.to_str().unwrap(),
    ];
    args.extend(images.iter().map(|p| p.to_str().unwrap()));
    let meta = common::python_script_json("vlm_reference.py", &args);
    let features = std::fs::read(&out)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (meta, features)
}

/// `ondo run --json` on `model` with `images`: its greedy token ids.
fn ondo_tokens(
    home: &Home,
    model: &Path,
    question: &str,
    images: &[&Path],
    loop_shape: &str,
    extra: &[&str],
) -> Vec<u64> {
    let tokens = TOKENS.to_string();
    let mut args = vec![
        "run",
        model.to_str().unwrap(),
        question,
        "--json",
        "--no-history",
        "--max-tokens",
        &tokens,
        "--ignore-eos",
        "--loop",
        loop_shape,
    ];
    for image in images {
        args.push("--image");
        args.push(image.to_str().unwrap());
    }
    args.extend_from_slice(extra);
    let out = home.ondo(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    record["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// Ondo's image features of `image` on `model` (loaded here): their shape
/// and values, as mlx-vlm's reference writes them (`[1, tokens, hidden]`
/// for one image; Qwen's main features and then DeepStack's,
/// `[1 + taps, tokens, hidden]`).
fn ondo_features(model: &Path, image: &Path) -> (Vec<u64>, Vec<f32>) {
    let loaded = LoadedModel::load(model).unwrap();
    let vision = loaded
        .vision
        .as_ref()
        .expect("the folder has a vision tower");
    let bytes = std::fs::read(image).unwrap();
    let [image] = <[_; 1]>::try_from(vision.features(&[&bytes], ImageLimits::default()).unwrap())
        .ok()
        .unwrap();
    let all: Vec<mlx_rs::Array> = std::iter::once(image.main).chain(image.deepstack).collect();
    let stacked = mlx_rs::ops::stack(&all, 0)
        .unwrap()
        .as_dtype(mlx_rs::Dtype::Float32)
        .unwrap();
    let shape = stacked.shape().iter().map(|&d| d as u64).collect();
    (shape, stacked.as_slice::<f32>().to_vec())
}

fn worst_difference(ours: &[f32], theirs: &[f32]) -> f32 {
    assert_eq!(ours.len(), theirs.len());
    ours.iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

fn ids(value: &Value) -> Vec<u64> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "needs the project venv with mlx-vlm")]
fn gemma3_sees_images_as_mlx_vlm_does() {
    let home = Home::new();
    let model = home.synth("gemma3", &["--arch", "gemma3", "--dtype", "f32"]);
    let screen = home.file("screen.png", &picture(1024, 640, 0));
    let photo = home.file("photo.png", &picture(300, 400, 1));
    let question = "What is in this picture?";

    // One image: the features, the prompt's ids and the greedy tokens.
    let (theirs, their_features) =
        mlx_vlm(&home, &model, &rendered(&model, question, 1), &[&screen]);
    let (shape, ours) = ondo_features(&model, &screen);
    assert_eq!(shape, ids(&theirs["shape"]));
    let worst = worst_difference(&ours, &their_features);
    assert!(worst <= 1e-4, "image features differ by {worst}");
    let spread = their_features.iter().map(|v| v.abs()).fold(0f32, f32::max);
    assert!(
        spread > 1e-2,
        "the features are all near zero ({spread}): a test that cannot fail"
    );

    let want = ids(&theirs["tokens"]);
    for shape in ["pipelined", "sync"] {
        assert_eq!(
            ondo_tokens(&home, &model, question, &[&screen], shape, &[]),
            want,
            "one image, {shape} loop"
        );
    }

    // Two images, and the same question without one: the image changes
    // the answer, so the tokens above did not come from the text alone.
    let (theirs, _) = mlx_vlm(
        &home,
        &model,
        &rendered(&model, question, 2),
        &[&screen, &photo],
    );
    assert_eq!(
        ondo_tokens(
            &home,
            &model,
            question,
            &[&screen, &photo],
            "pipelined",
            &[]
        ),
        ids(&theirs["tokens"]),
        "two images"
    );
    assert_ne!(
        ids(&theirs["tokens"]),
        want,
        "a second image changes the answer"
    );
}

/// A 4-bit Gemma 3 folder carries a copy of its tied embedding as the head,
/// as mlx-vlm's conversions do (mlx-vlm cannot fill a missing quantized
/// head from the embedding), and answers with an image as mlx-vlm does.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "needs the project venv with mlx-vlm")]
fn a_quantized_gemma3_folder_loads_in_mlx_vlm_and_answers_alike() {
    let home = Home::new();
    let model = home.synth(
        "gemma3-4bit",
        &["--arch", "gemma3", "--dtype", "f32", "--bits", "4"],
    );
    let screen = home.file("screen.png", &picture(640, 400, 3));
    let question = "What is in this picture?";
    let (theirs, _) = mlx_vlm(&home, &model, &rendered(&model, question, 1), &[&screen]);
    assert_eq!(
        ondo_tokens(&home, &model, question, &[&screen], "pipelined", &[]),
        ids(&theirs["tokens"])
    );
}

/// `ondo bench --image --peer mlx-vlm`: the encode is a phase of its own on
/// Ondo's rows, both sides answer the same prompt with the same greedy
/// tokens, and every Ondo run lands in the history with its image.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "needs the project venv with mlx-vlm")]
fn bench_with_an_image_times_the_encode_beside_mlx_vlm() {
    let home = Home::new();
    let model = home.synth("gemma3", &["--arch", "gemma3", "--dtype", "f32"]);
    let screen = home.file("screen.png", &picture(640, 400, 2));
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            model.to_str().unwrap(),
            "--image",
            screen.to_str().unwrap(),
            "--gen",
            "8",
        ];
        args.extend_from_slice(extra);
        home.ondo(&args)
    };
    let out = bench(&[
        "--reps",
        "2",
        "--warmup",
        "1",
        "--peer",
        "mlx-vlm",
        "--loop",
        "pipelined,sync",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["test"], "img640x400+tg8");
    let sides = result["sides"].as_array().unwrap();
    let names: Vec<&str> = sides.iter().map(|s| s["side"].as_str().unwrap()).collect();
    assert_eq!(names, ["ondo pipelined", "ondo sync", "mlx-vlm"]);
    for ondo in &sides[..2] {
        assert!(ondo["image_tokens"].as_u64().unwrap() > 0, "{ondo}");
        for phase in ["image_encode_ms", "prefill_ms", "ttft_ms"] {
            assert_eq!(
                ondo[phase]["samples"].as_array().unwrap().len(),
                2,
                "{phase}"
            );
            assert!(
                ondo[phase]["median"].as_f64().unwrap() > 0.0,
                "{phase}: {ondo}"
            );
        }
        // The first token waits for the encode and the prefill.
        assert!(
            ondo["ttft_ms"]["median"].as_f64().unwrap()
                >= ondo["image_encode_ms"]["median"].as_f64().unwrap(),
            "{ondo}"
        );
        assert_eq!(
            ondo["prompt_tokens"], sides[2]["prompt_tokens"],
            "same prompt"
        );
    }
    assert!(
        sides[2]["image_encode_ms"].is_null(),
        "mlx-vlm does not time it apart"
    );
    assert!(sides[2]["decode_tps"]["median"].as_f64().unwrap() > 0.0);
    assert_eq!(result["same_tokens_as_mlx_vlm"], true);
    for ratio in ["ttft_ratio", "decode_ratio"] {
        assert!(result[ratio].as_f64().unwrap() > 0.0, "{ratio}");
    }

    // Ondo's runs are in the history, warm-ups included, each with its image.
    let bench_id = result["bench_id"].as_str().unwrap();
    let report = home.ondo(&[
        "report",
        "--bench",
        bench_id,
        "--include-warmup",
        "--format",
        "json",
    ]);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "3 repetitions of 2 loop shapes");
    assert!(
        runs.iter()
            .all(|r| r["images"] == 1 && r["test"] == "img640x400+tg8")
    );

    // The table a person reads, and the peers that cannot answer.
    let out = bench(&["--reps", "1", "--warmup", "0"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && table.contains("encode ms"),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bench(&["--reps", "1", "--warmup", "0", "--peer", "mlx-lm"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--peer mlx-vlm"));
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "needs the project venv with mlx-vlm")]
fn qwen3_vl_sees_images_at_their_own_size_as_mlx_vlm_does() {
    qwen_sees_images_as_mlx_vlm_does("qwen3_vl");
}

/// Qwen 3.5's tower is Qwen3-VL's without DeepStack, before its gated
/// DeltaNet text model, whose attention layers turn image tokens by the
/// same 3-D rope on their rotated quarter.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "needs the project venv with mlx-vlm")]
fn qwen3_5_sees_images_as_mlx_vlm_does() {
    qwen_sees_images_as_mlx_vlm_does("qwen3_5");
}

fn qwen_sees_images_as_mlx_vlm_does(arch: &str) {
    let home = Home::new();
    // An untied head (a tied random one repeats a token whatever the
    // image), seed 1: its random Qwen 3.5 answers differently with a
    // second image within the tokens compared (seed 0's does not before
    // the 12th).
    let model = home.synth(
        arch,
        &[
            "--arch",
            arch,
            "--dtype",
            "f32",
            "--seed",
            "1",
            "--untied-head",
        ],
    );
    let screen = home.file("screen.png", &picture(1024, 640, 0));
    let photo = home.file("photo.png", &picture(300, 400, 1));
    let question = "What is in this picture?";

    // One image: its features (the main ones and each DeepStack tap), the
    // prompt's ids and 3-D positions, the greedy tokens.
    let (theirs, their_features) =
        mlx_vlm(&home, &model, &rendered(&model, question, 1), &[&screen]);
    let (shape, ours) = ondo_features(&model, &screen);
    // 1024x640 within 262,144 pixels: 640x384, 40x24 patches, 240 tokens.
    assert_eq!(shape, ids(&theirs["shape"]));
    assert_eq!(&shape[1..], &[240, 256]);
    let worst = worst_difference(&ours, &their_features);
    assert!(worst <= 1e-4, "image features differ by {worst}");
    let spread = their_features.iter().map(|v| v.abs()).fold(0f32, f32::max);
    assert!(spread > 1e-2, "the features are all near zero ({spread})");

    let loaded = LoadedModel::load(&model).unwrap();
    let vision = loaded.vision.as_ref().unwrap();
    let check_positions = |theirs: &Value, images: &[&Path]| {
        let input_ids: Vec<u32> = ids(&theirs["input_ids"])
            .iter()
            .map(|&i| i as u32)
            .collect();
        let files: Vec<Vec<u8>> = images.iter().map(|p| std::fs::read(p).unwrap()).collect();
        let files: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
        let shapes = vision
            .tokens
            .shapes(&files, ImageLimits::default())
            .unwrap();
        let starts = vision.tokens.image_starts(&input_ids, &shapes).unwrap();
        let layout = RopeLayout {
            images: starts.into_iter().zip(shapes).collect(),
        };
        let positions: Vec<i64> = layout
            .positions(0, input_ids.len())
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect();
        let want: Vec<i64> = theirs["positions"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|axis| axis.as_array().unwrap().iter().map(|p| p.as_i64().unwrap()))
            .collect();
        assert_eq!(positions, want, "3-D rope positions");
        assert_eq!(
            i64::from(layout.final_shift()),
            theirs["rope_delta"].as_i64().unwrap()
        );
    };
    check_positions(&theirs, &[&screen]);

    let want = ids(&theirs["tokens"]);
    for shape in ["pipelined", "sync"] {
        assert_eq!(
            ondo_tokens(&home, &model, question, &[&screen], shape, &[]),
            want,
            "one image, {shape} loop"
        );
    }
    // Prefilled 16 tokens at a time, the image spans 15 chunks: its rows,
    // DeepStack's and the positions are cut at each chunk's edges.
    assert_eq!(
        ondo_tokens(
            &home,
            &model,
            question,
            &[&screen],
            "pipelined",
            &["--prefill-step-size", "16"]
        ),
        want,
        "one image in chunks of 16"
    );

    // Two images of different shapes: positions continue past the first.
    let (theirs, _) = mlx_vlm(
        &home,
        &model,
        &rendered(&model, question, 2),
        &[&screen, &photo],
    );
    check_positions(&theirs, &[&screen, &photo]);
    assert_eq!(
        ondo_tokens(
            &home,
            &model,
            question,
            &[&screen, &photo],
            "pipelined",
            &[]
        ),
        ids(&theirs["tokens"]),
        "two images"
    );

    assert_ne!(
        ids(&theirs["tokens"]),
        want,
        "a second image changes the answer"
    );
}

#[test]
fn an_image_for_a_model_without_eyes_or_over_the_limits_is_refused_by_name() {
    let home = Home::new();
    let text_model = home.synth("llama", &[]);
    let image = home.file("a.png", &picture(64, 64, 2));
    let out = home.ondo(&[
        "run",
        text_model.to_str().unwrap(),
        "hi",
        "--image",
        image.to_str().unwrap(),
        "--no-history",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("reads text only"), "{stderr}");

    // A PNG whose header claims 8000x6000 pixels is refused from the
    // header, before anything is decoded.
    let model = home.synth("gemma3", &["--arch", "gemma3"]);
    // The chat knows which model takes images before anything is sent.
    assert!(ChatFeatures::of_model_dir(&model).sees_images);
    assert!(!ChatFeatures::of_model_dir(&text_model).sees_images);
    let huge = home.file("huge.png", &huge_png());
    let out = home.ondo(&[
        "run",
        model.to_str().unwrap(),
        "hi",
        "--image",
        huge.to_str().unwrap(),
        "--no-history",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("8000x6000 pixels"), "{stderr}");

    // The limit is a setting: 1 megapixel refuses a 1200x1000 image the
    // default takes.
    let photo = home.file("photo.png", &picture(1200, 1000, 4));
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            model.to_str().unwrap(),
            "hi",
            "--image",
            photo.to_str().unwrap(),
            "--no-history",
            "--max-tokens",
            "1",
        ];
        args.extend_from_slice(extra);
        home.ondo(&args)
    };
    assert!(run(&[]).status.success());
    let out = run(&["--max-image-megapixels", "1"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("1200x1000 pixels") && stderr.contains("--max-image-megapixels"),
        "{stderr}"
    );
}

#[test]
fn a_conversation_about_an_image_is_read_back_from_disk_only_for_that_image() {
    let home = Home::new();
    let (cat, dog) = (
        home.file("cat.png", &picture(96, 64, 5)),
        home.file("dog.png", &picture(96, 64, 6)),
    );
    let question = "Describe every panel of this screenshot: the colours, the edges and \
                    the text you can see, one by one, in order, and what each is for.";
    // Gemma 3, and Qwen3-VL, whose positions after an image depend on it.
    for arch in ["gemma3", "qwen3_vl"] {
        let model = home.synth(arch, &synth_args(arch));
        let run = |image: &Path, extra: &[&str]| -> Value {
            let out = home
                .command()
                .env("ONDO_PROMPT_CACHE_MIN_TOKENS", "16")
                .env_remove("ONDO_PROMPT_CACHE")
                .args(["run", model.to_str().unwrap(), question, "--image"])
                .arg(image)
                .args([
                    "--max-tokens",
                    "8",
                    "--ignore-eos",
                    "--json",
                    "--no-history",
                ])
                .args(extra)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{arch}: {stderr}");
            serde_json::from_slice(&out.stdout).unwrap()
        };
        let first = run(&cat, &[]);
        assert_eq!(first["prefix_source"], "none", "{arch}: {first}");
        // The next process asks about the same image: its tokens come back
        // from the disk with the text around them, not encoded again.
        let again = run(&cat, &[]);
        assert_eq!(again["prefix_source"], "disk", "{arch}: {again}");
        assert_eq!(
            again["cached_tokens"].as_u64().unwrap() + 1,
            again["prompt_tokens"].as_u64().unwrap(),
            "{arch}: {again}"
        );
        let prefilled = run(&cat, &["--no-disk-cache"]);
        assert_eq!(
            ids(&again["token_ids"]),
            ids(&prefilled["token_ids"]),
            "{arch}: a prefix with an image read back answers as prefilled"
        );
        // Another image at the same place shares only the text before it.
        let other = run(&dog, &[]);
        assert_ne!(other["prefix_source"], "disk", "{arch}: {other}");
        assert_eq!(
            ids(&other["token_ids"]),
            ids(&run(&dog, &["--no-disk-cache"])["token_ids"]),
            "{arch}"
        );
    }
}

/// A PNG whose header claims 8000x6000 pixels (its pixels are 8x8).
fn huge_png() -> Vec<u8> {
    let mut huge = picture(8, 8, 3);
    huge[16..20].copy_from_slice(&8000u32.to_be_bytes());
    huge[20..24].copy_from_slice(&6000u32.to_be_bytes());
    // The header chunk's checksum covers its type and its 13 bytes.
    let crc = crc32fast::hash(&huge[12..29]);
    huge[29..33].copy_from_slice(&crc.to_be_bytes());
    huge
}

/// POSTs `body` to `path` on the server at `url` (`http://host:port`):
/// the status and the body of the answer.
fn post_json(url: &str, path: &str, body: &Value) -> (u16, String) {
    use std::io::{Read, Write};
    let address = url.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let text = body.to_string();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

/// Writes `model` where a download of `repo_id` would be, in the Hugging
/// Face cache under `home`, so the server finds it by name.
fn cache_as(home: &Home, model: &Path, repo_id: &str) {
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = home
        .dir
        .path()
        .join("hf/hub")
        .join(format!("models--{}", repo_id.replace('/', "--")));
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(snapshot.parent().unwrap()).unwrap();
    std::fs::rename(model, &snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
}

/// `ondo serve` for `home`, and its address.
fn serve(home: &Home) -> (std::process::Child, String) {
    let mut served = Command::new(env!("CARGO_BIN_EXE_ondo"))
        .env("ONDO_HOME", home.dir.path().join("home"))
        .env("HF_HUB_CACHE", home.dir.path().join("hf/hub"))
        .env("HF_HUB_OFFLINE", "1")
        .env("ONDO_NO_KEYCHAIN", "1")
        .env_remove("ONDO_API_KEY")
        .args(["serve", "--port", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(served.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let url = first
        .split_whitespace()
        .find(|word| word.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_owned();
    (served, url)
}

/// `vision_clients.py` against `url` with `args`, what it printed.
fn clients(url: &str, args: &Value) -> Value {
    let out = Command::new(common::python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/vision_clients.py"))
        .args([url, &args.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[cfg_attr(
    ondo_skip_python,
    ignore = "needs the project venv with mlx-vlm and the clients"
)]
fn a_screenshot_through_every_official_client_gets_mlx_vlms_answer() {
    for arch in ["gemma3", "qwen3_vl"] {
        screenshot_through_every_client(arch);
    }
}

fn screenshot_through_every_client(arch: &str) {
    let home = Home::new();
    let model = home.synth(arch, &synth_args(arch));
    let screen = home.file("screen.png", &picture(1024, 640, 4));
    let question = "Read the screen for me.";
    let (theirs, _) = mlx_vlm(&home, &model, &rendered(&model, question, 1), &[&screen]);
    let want = theirs["text"].as_str().unwrap().to_owned();
    assert!(
        !want.is_empty(),
        "mlx-vlm's answer is empty: a test that cannot fail"
    );
    cache_as(&home, &model, "ondo-test/vision");
    let (mut served, url) = serve(&home);
    let got = clients(
        &url,
        &serde_json::json!({
            "model": "ondo-test/vision",
            "image": screen,
            "question": question,
            "max_tokens": TOKENS,
        }),
    );
    let _ = served.kill();
    let _ = served.wait();
    for client in ["openai", "responses", "ollama", "anthropic"] {
        assert_eq!(
            got[client].as_str(),
            Some(want.as_str()),
            "{arch}: {client}"
        );
    }
    // An image over the pixel limit is refused from its header, before the
    // request waits for the engine: 400, and the message says why.
    let (mut served, url) = serve(&home);
    let (status, body) = post_json(
        &url,
        "/v1/chat/completions",
        &serde_json::json!({
            "model": "ondo-test/vision",
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": format!(
                    "data:image/png;base64,{}",
                    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, huge_png())
                )}},
                {"type": "text", "text": question},
            ]}],
        }),
    );
    let _ = served.kill();
    let _ = served.wait();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("8000x6000 pixels"), "{body}");
    // Anthropic's count_tokens counts the image as the tokens it fills
    // (for Qwen3-VL, from the image's size read from its header).
    assert_eq!(
        got["anthropic_count"], got["openai_prompt_tokens"],
        "{arch}"
    );
}

#[test]
#[cfg_attr(
    ondo_skip_python,
    ignore = "needs the project venv with mlx-vlm and the clients"
)]
fn a_follow_up_about_the_same_image_reuses_its_tokens_and_encodes_nothing() {
    // Qwen3-VL's follow-up also turns by positions shifted past the cached
    // image, which nothing re-encodes.
    for arch in ["gemma3", "qwen3_vl"] {
        follow_up_reuses_the_image(arch);
    }
}

fn follow_up_reuses_the_image(arch: &str) {
    let home = Home::new();
    let model = home.synth(arch, &synth_args(arch));
    let screen = home.file("screen.png", &picture(640, 480, 5));
    let (question, follow_up) = ("What is on the left?", "And on the right?");
    let reference_model = home.dir.path().join("reference-model");
    copy_folder(&model, &reference_model);
    cache_as(&home, &model, "ondo-test/vision");
    let (mut served, url) = serve(&home);
    let got = clients(
        &url,
        &serde_json::json!({
            "model": "ondo-test/vision",
            "image": screen,
            "question": question,
            "follow_up": follow_up,
            "max_tokens": TOKENS,
        }),
    );
    let _ = served.kill();
    let _ = served.wait();
    let (first, second) = (&got["first"]["ondo"], &got["second"]["ondo"]);
    assert_eq!(first["images"], 1);
    assert!(first["image_encode_ms"].as_f64().unwrap() > 0.0, "{first}");
    // The second turn shows the same image at the same place: its tokens
    // come from the conversation's cache, and nothing is encoded.
    assert_eq!(second["images"], 1);
    assert_eq!(second["image_encode_ms"].as_f64(), Some(0.0), "{second}");
    assert!(
        second["cached_tokens"].as_u64().unwrap() + 1 >= first["prompt_tokens"].as_u64().unwrap(),
        "the follow-up reused the first turn's cache: {second}"
    );
    // And the answer from the reused cache is mlx-vlm's for the whole
    // conversation, prefilled from scratch.
    let turns = [
        ChatMessage {
            images: vec![String::new()],
            ..ChatMessage::user(question)
        },
        ChatMessage::assistant(got["first"]["text"].as_str().unwrap()),
        ChatMessage::user(follow_up),
    ];
    let (theirs, _) = mlx_vlm(
        &home,
        &reference_model,
        &rendered_turns(&reference_model, &turns),
        &[&screen],
    );
    assert_eq!(
        got["second"]["text"].as_str(),
        theirs["text"].as_str(),
        "{arch}"
    );
}

fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "needs the project venv with mlx-vlm")]
fn a_tower_the_converter_quantized_is_read_and_answers_as_mlx_vlm() {
    let home = Home::new();
    let model = home.synth("gemma3", &["--arch", "gemma3", "--dtype", "f32"]);
    let quantized =
        common::python_script_json("quantize_tower.py", &[model.to_str().unwrap(), "4"]);
    assert!(quantized["quantized"].as_u64().unwrap() > 0);
    let screen = home.file("screen.png", &picture(800, 600, 6));
    let question = "What is in this picture?";
    let (theirs, their_features) =
        mlx_vlm(&home, &model, &rendered(&model, question, 1), &[&screen]);
    let (_, ours) = ondo_features(&model, &screen);
    let worst = worst_difference(&ours, &their_features);
    assert!(worst <= 1e-4, "image features differ by {worst}");
    assert_eq!(
        ondo_tokens(&home, &model, question, &[&screen], "pipelined", &[]),
        ids(&theirs["tokens"])
    );
}
