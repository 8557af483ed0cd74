//! `ondo bench MODEL --image FILE`: a question about images, timed with the
//! image's own phase (vision tower and projector) apart from the prefill
//! and the decode, optionally side by side with Python mlx-vlm on the same
//! folder and files (`--peer mlx-vlm`).
//!
//! Each repetition opens the conversation with its own system turn, so the
//! prompt differs from its first tokens on and no side reuses the image
//! tokens of the repetition before (Ondo's prefix cache would: the same
//! image at the same place is not encoded again). Sides alternate who goes
//! first; warm-up repetitions are recorded and left out of the statistics.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::peer::{MlxVlmPeer, VlmRun};
use super::{BenchEnvironment, BenchError, BenchPlan, Summary, plan, ratio};
use crate::engine::chat_template::ChatMessage;
use crate::engine::{CancelToken, GenerateRequest, Prompt, RunStats};
use crate::run_kinds::RunKind;
use crate::session::SessionPool;
use crate::session::record::RunContext;
use crate::store::RunRecord;
use crate::vision::image::ImageLimits;

/// What the user asks about: the files, in order, and the question.
#[derive(Debug, Clone)]
pub struct ImagePlan {
    /// The model and the shape: repetitions, warm-up, tokens to generate,
    /// loop shapes, prefill step (prompt lengths do not apply: the prompt
    /// is the chat turn).
    pub plan: BenchPlan,
    pub images: Vec<PathBuf>,
    pub question: String,
}

/// One file of the plan as the benchmark saw it.
#[derive(Debug, Clone, Serialize)]
pub struct ImageFile {
    pub path: PathBuf,
    pub width: usize,
    pub height: usize,
    pub bytes: u64,
}

/// One side's numbers over the measured repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct ImageSide {
    /// "ondo pipelined", "ondo sync" or "mlx-vlm".
    pub side: String,
    /// The prompt's tokens, the image tokens included.
    pub prompt_tokens: usize,
    /// Tokens standing for the images (Ondo's count; mlx-vlm does not say).
    pub image_tokens: Option<usize>,
    /// Request handed over to first token: decoding and resizing the files,
    /// the vision tower and projector, the prefill, the first step.
    pub ttft_ms: Summary,
    /// The vision tower and projector alone (Ondo's engine times it apart).
    pub image_encode_ms: Option<Summary>,
    /// The prompt's prefill alone, the image tokens spliced in.
    pub prefill_ms: Option<Summary>,
    pub decode_tps: Summary,
    pub peak_bytes: Summary,
}

/// Everything an image benchmark produced.
#[derive(Debug, Clone, Serialize)]
pub struct ImageBenchOutcome {
    pub bench_id: String,
    /// "img896x896+tg64": the images' sizes and the tokens generated.
    pub test: String,
    pub model_dir: PathBuf,
    pub images: Vec<ImageFile>,
    pub question: String,
    pub generate_tokens: usize,
    pub repetitions: usize,
    pub warmup: usize,
    pub environment: BenchEnvironment,
    pub mlx_vlm_version: Option<String>,
    pub sides: Vec<ImageSide>,
    /// Ondo's first loop shape over mlx-vlm, medians: time to first token
    /// (below 1 is quicker) and decode rate (above 1 is faster).
    pub ttft_ratio: Option<f64>,
    pub decode_ratio: Option<f64>,
    /// Ondo's greedy ids (its first loop shape) equal mlx-vlm's in every
    /// measured repetition; `None` without the peer.
    pub same_tokens_as_mlx_vlm: Option<bool>,
    /// Every Ondo run, warm-ups included, as recorded in the history.
    #[serde(skip)]
    pub records: Vec<RunRecord>,
}

/// The name of a plan's one test: each image's size, then the tokens generated.
pub fn test_name(files: &[ImageFile], generate_tokens: usize) -> String {
    let sizes: Vec<String> = files
        .iter()
        .map(|f| format!("{}x{}", f.width, f.height))
        .collect();
    format!("img{}+tg{generate_tokens}", sizes.join(","))
}

/// Reads each file's size from its header, refusing what a chat would refuse.
fn read_files(paths: &[PathBuf]) -> Result<(Vec<ImageFile>, Vec<String>), BenchError> {
    use base64::Engine as _;
    if paths.is_empty() {
        return Err(BenchError::Plan("give at least one --image FILE".into()));
    }
    let mut files = Vec::new();
    let mut encoded = Vec::new();
    for path in paths {
        let bytes = std::fs::read(path)
            .map_err(|e| BenchError::Plan(format!("--image {}: {e}", path.display())))?;
        let (width, height) = crate::vision::image::dimensions(&bytes, ImageLimits::default())
            .map_err(|e| BenchError::Plan(format!("--image {}: {e}", path.display())))?;
        files.push(ImageFile {
            path: path.clone(),
            width,
            height,
            bytes: bytes.len() as u64,
        });
        encoded.push(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    Ok((files, encoded))
}

/// The system turn of repetition `round`: different in each, so the
/// prompts share no prefix a cache could carry over.
fn system_turn(round: usize) -> String {
    format!("Benchmark repetition {round}. Answer the question about the image.")
}

/// Per side: ttft, encode, prefill, decode tok/s, peak bytes.
type Samples = [Vec<f64>; 5];

/// Runs `image_plan` on Ondo's engine (every run recorded under one bench
/// id) and, with `peer_python`, on mlx-vlm alternately; `progress` hears
/// (done, total) after each run.
pub fn run_image_bench(
    pool: &SessionPool,
    image_plan: &ImagePlan,
    peer_python: Option<&Path>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ImageBenchOutcome, BenchError> {
    let plan = &image_plan.plan;
    let shape = &plan.shape;
    shape.check()?;
    if shape.vary.is_some() || shape.max_kv_size.is_some() || shape.kv_bits.is_some() {
        return Err(BenchError::Plan(
            "an image benchmark runs the default KV cache: --vary, --max-kv-size and \
             --kv-bits apply to text prompts"
                .into(),
        ));
    }
    let question = image_plan.question.trim();
    if question.is_empty() {
        return Err(BenchError::Plan(
            "--question is empty: ask something about the image".into(),
        ));
    }
    let (files, encoded) = read_files(&image_plan.images)?;
    let test = test_name(&files, shape.generate_tokens);
    let mut peer = match peer_python {
        Some(python) => Some(MlxVlmPeer::start(python, &plan.model_dir)?),
        None => None,
    };
    let bench_id = plan::new_bench_id();
    let provenance = pool.provenance();
    let rounds = shape.warmup + shape.repetitions;
    let ondo_sides = shape.loops.len();
    let sides = ondo_sides + usize::from(peer.is_some());
    let total = rounds * sides;
    let mut done = 0;
    let mut samples: Vec<Samples> = vec![Default::default(); sides];
    let mut counts: Vec<(usize, Option<usize>)> = vec![(0, None); sides];
    let mut records = Vec::new();
    let mut described: Option<RunStats> = None;
    let mut same_tokens = peer.as_ref().map(|_| true);
    for round in 0..rounds {
        let measured = round >= shape.warmup;
        let system = system_turn(round);
        let mut order: Vec<usize> = (0..sides).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut ondo_ids: Option<Vec<u32>> = None;
        let mut peer_ids: Option<Vec<u32>> = None;
        for side in order {
            let row = if side < ondo_sides {
                let prompt = Prompt::chat(
                    Some(system.clone()),
                    vec![ChatMessage {
                        images: encoded.clone(),
                        ..ChatMessage::user(question.to_owned())
                    }],
                );
                let request = GenerateRequest {
                    max_tokens: shape.generate_tokens,
                    prefill_step_size: shape.prefill_step_size,
                    loop_shape: shape.loops[side],
                    ignore_eos: true,
                    // A benchmark times the encode and the prefill: no
                    // prompt cache read from the disk.
                    disk_cache: false,
                    ..GenerateRequest::new(&plan.model_dir, prompt)
                };
                let context = RunContext {
                    bench_id: Some(bench_id.clone()),
                    test: Some(test.clone()),
                    repetition: Some(round as u32),
                    warmup: !measured,
                    ..plan.context(RunKind::Bench)
                };
                let (outcome, record) = pool.run(request, context, CancelToken::new(), |_| {})?;
                records.push(record);
                let s = outcome.stats;
                if side == 0 {
                    ondo_ids = Some(outcome.token_ids);
                }
                counts[side] = (s.prompt_tokens, Some(s.image_tokens));
                let row = [
                    s.ttft_ms,
                    s.image_encode_ms,
                    s.prefill_ms,
                    s.decode_tps,
                    s.mlx_peak_bytes as f64,
                ];
                described.get_or_insert(s);
                row
            } else {
                let Some(peer) = peer.as_mut() else {
                    unreachable!("a peer side exists only with the peer")
                };
                let run: VlmRun = peer.generate(
                    &system,
                    question,
                    &image_plan.images,
                    shape.generate_tokens,
                    shape.prefill_step_size,
                )?;
                counts[side] = (run.prompt_tokens, None);
                let row = [
                    run.ttft_ms,
                    f64::NAN,
                    f64::NAN,
                    run.decode_tps.unwrap_or(0.0),
                    run.peak_memory_bytes as f64,
                ];
                peer_ids = Some(run.generated_ids);
                row
            };
            if measured {
                for (metric, value) in row.into_iter().enumerate() {
                    samples[side][metric].push(value);
                }
            }
            done += 1;
            progress(done, total);
        }
        if measured
            && let (Some(same), Some(ours), Some(theirs)) =
                (same_tokens.as_mut(), ondo_ids.as_ref(), peer_ids.as_ref())
        {
            *same &= ours == theirs;
        }
    }

    let names: Vec<String> = shape
        .loops
        .iter()
        .map(|l| format!("ondo {l}"))
        .chain(peer.as_ref().map(|_| "mlx-vlm".to_owned()))
        .collect();
    let summary = |values: &[f64]| {
        let kept: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        (!kept.is_empty()).then(|| Summary::from_samples(&kept))
    };
    let results: Vec<ImageSide> = names
        .into_iter()
        .enumerate()
        .map(|(side, name)| {
            let [ttft, encode, prefill, decode, peak] = &samples[side];
            ImageSide {
                side: name,
                prompt_tokens: counts[side].0,
                image_tokens: counts[side].1,
                ttft_ms: Summary::from_samples(ttft),
                image_encode_ms: summary(encode),
                prefill_ms: summary(prefill),
                decode_tps: Summary::from_samples(decode),
                peak_bytes: Summary::from_samples(peak),
            }
        })
        .collect();
    let (ttft_ratio, decode_ratio) = match (results.first(), results.get(ondo_sides)) {
        (Some(ours), Some(theirs)) => (
            Some(ratio(ours.ttft_ms.median, theirs.ttft_ms.median)),
            Some(ratio(ours.decode_tps.median, theirs.decode_tps.median)),
        ),
        _ => (None, None),
    };
    let described = described.unwrap_or_default();
    Ok(ImageBenchOutcome {
        bench_id,
        test,
        model_dir: plan.model_dir.clone(),
        images: files,
        question: question.to_owned(),
        generate_tokens: shape.generate_tokens,
        repetitions: shape.repetitions,
        warmup: shape.warmup,
        environment: BenchEnvironment {
            ondo_version: provenance.app_version.clone(),
            build_profile: provenance.build_profile.clone(),
            mlx_version: provenance.mlx_version.clone(),
            backend: provenance.backend.clone(),
            mlx_lm_version: None,
            cpu: provenance.cpu.clone(),
            os: provenance.os.clone(),
            memory_bytes: provenance.ram_bytes,
            model_type: described.model_type,
            quantization: described.quantization,
            weights_bytes: described.weights_bytes,
        },
        mlx_vlm_version: peer.as_ref().map(|p| p.info.mlx_vlm_version.clone()),
        sides: results,
        ttft_ratio,
        decode_ratio,
        same_tokens_as_mlx_vlm: same_tokens,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_is_named_by_each_images_size_and_the_tokens_generated() {
        let file = |width, height| ImageFile {
            path: "a.png".into(),
            width,
            height,
            bytes: 1,
        };
        assert_eq!(test_name(&[file(896, 896)], 64), "img896x896+tg64");
        assert_eq!(
            test_name(&[file(640, 480), file(32, 48)], 16),
            "img640x480,32x48+tg16"
        );
    }

    #[test]
    fn every_repetition_opens_with_its_own_system_turn() {
        assert_ne!(system_turn(0), system_turn(1));
    }
}
