//! Turning a finished run into the flat record the store keeps: the engine's
//! statistics, what the caller knows about the model and the run, the memory
//! seen during it, and where it ran.

use std::sync::OnceLock;

use crate::engine::{EngineHandle, RunStats};
use crate::run_kinds::{PrefixSource, RunKind};
use crate::store::{MemorySample, Provenance, RunRecord, now_rfc3339};

/// mlx-rs as pinned in Cargo.toml (`=0.33.0`); tests/sessions.rs checks it.
pub const MLX_RS_VERSION: &str = "0.33.0";

/// What this process runs with and on, asked of MLX (on the engine thread)
/// and the OS once.
struct ThisProcess {
    provenance: Provenance,
    /// MLX's name for the device it computes on; the memory bandwidth is
    /// measured and kept per backend and device.
    device: String,
}

fn this_process(engine: &EngineHandle) -> &'static ThisProcess {
    static THIS_PROCESS: OnceLock<ThisProcess> = OnceLock::new();
    THIS_PROCESS.get_or_init(|| {
        let runtime = engine
            .call(crate::metrics::mlx_runtime::MlxRuntime::detect)
            .ok();
        let unknown = || "unknown".to_owned();
        ThisProcess {
            provenance: Provenance {
                app_version: env!("CARGO_PKG_VERSION").to_owned(),
                app_commit: env!("ONDO_GIT_COMMIT").to_owned(),
                build_profile: build_profile().to_owned(),
                mlx_version: runtime
                    .as_ref()
                    .map_or_else(unknown, |r| r.mlx_version.clone()),
                mlx_rs_version: MLX_RS_VERSION.to_owned(),
                backend: runtime
                    .as_ref()
                    .map_or_else(unknown, |r| r.backend.to_string()),
                os: ondo_os::os_description(),
                cpu: ondo_os::cpu_name().unwrap_or_else(unknown),
                ram_bytes: ondo_os::memory_totals().map_or(0, |m| m.total_bytes),
            },
            device: runtime
                .as_ref()
                .map_or_else(unknown, |r| r.device_name.clone()),
        }
    })
}

/// Where and with what this process's runs happen (asked of MLX once).
pub fn provenance(engine: &EngineHandle) -> &'static Provenance {
    &this_process(engine).provenance
}

/// The device MLX computes on, as MLX names it (asked once): with the
/// backend, what a measured memory bandwidth belongs to.
pub fn device_name(engine: &EngineHandle) -> &'static str {
    &this_process(engine).device
}

/// "debug" or "release": debug builds are much slower and every timing from
/// one says so.
pub fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// What the caller knows about a run that the engine does not.
#[derive(Debug, Clone, Default)]
pub struct RunContext {
    pub kind: RunKind,
    /// Repo id or folder as the user named it.
    pub model_id: String,
    pub model_revision: Option<String>,
    pub parameters: Option<u64>,
    pub download_ms: f64,
    pub conversation_id: Option<String>,
    /// The client program's `User-Agent` (requests to the local server).
    pub user_agent: Option<String>,
    /// A title for a new conversation (its first message, shortened).
    pub conversation_title: Option<String>,
    pub bench_id: Option<String>,
    pub test: Option<String>,
    pub repetition: Option<u32>,
    pub warmup: bool,
    /// Streams sent at once in a concurrency benchmark's round.
    pub concurrency: Option<u64>,
}

impl RunContext {
    /// What the record says about the model: the name the user gave, and the
    /// revision and parameter count when the folder tells.
    pub fn for_model(name: &str, dir: &std::path::Path) -> Self {
        let described = crate::hub::library::describe_folder(
            name.to_owned(),
            crate::hub::library::ModelSource::Folder,
            dir,
        );
        // A snapshot folder of the HF cache is named after its commit.
        let revision = dir
            .parent()
            .filter(|p| p.ends_with("snapshots"))
            .and_then(|_| dir.file_name())
            .map(|n| n.to_string_lossy().into_owned());
        Self {
            model_id: name.to_owned(),
            model_revision: revision,
            parameters: described.parameters,
            ..Self::default()
        }
    }
}

/// Memory as seen by the pressure sampler over one run.
#[derive(Debug, Clone, Default)]
pub struct MemoryDuringRun {
    pub pressure_start: String,
    pub pressure_max: String,
    pub pressure_end: String,
    pub swap_delta_bytes: i64,
    pub footprint_bytes: u64,
    pub timeline: Vec<MemorySample>,
}

/// A new run id: time-ordered, unique enough across processes.
pub fn new_run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let now = chrono::Utc::now();
    hasher.write_i64(now.timestamp_nanos_opt().unwrap_or(0));
    format!(
        "r-{}-{:08x}",
        now.timestamp_millis(),
        hasher.finish() as u32
    )
}

/// The flat record of one finished run.
pub fn record_from_stats(
    stats: &RunStats,
    context: &RunContext,
    provenance: &Provenance,
    memory: MemoryDuringRun,
    memory_bandwidth_gbps: Option<f64>,
) -> (RunRecord, Vec<MemorySample>) {
    let bytes_per_token = stats.weights_bytes + stats.kv_cache_bytes;
    let roofline = memory_bandwidth_gbps
        .filter(|bw| *bw > 0.0 && stats.decode_tps > 0.0)
        .map(|bw| stats.decode_tps * bytes_per_token as f64 / (bw * 1e9) * 100.0);
    let record = RunRecord {
        run_id: new_run_id(),
        created_at: now_rfc3339(),
        kind: context.kind,
        bench_id: context.bench_id.clone(),
        test: context.test.clone(),
        repetition: context.repetition,
        warmup: context.warmup,
        conversation_id: context.conversation_id.clone(),
        user_agent: context.user_agent.clone(),
        model_id: context.model_id.clone(),
        model_path: stats.model_dir.clone(),
        model_revision: context.model_revision.clone(),
        model_type: stats.model_type.clone(),
        quantization: stats.quantization.clone(),
        parameters: context.parameters,
        weights_bytes: stats.weights_bytes,
        download_ms: context.download_ms,
        load_ms: stats.load_ms,
        ttft_ms: stats.ttft_ms,
        prefill_ms: stats.prefill_ms,
        decode_ms: stats.decode_ms,
        reasoning_ms: stats.reasoning_ms,
        cold_start_ms: None,
        prefill_tps: stats.prefill_tps,
        decode_tps: stats.decode_tps,
        prompt_tps: stats.prompt_tps,
        generation_tps: stats.generation_tps,
        prompt_tokens: stats.prompt_tokens as u64,
        cached_tokens: stats.cached_tokens as u64,
        prefill_tokens: stats.prefill_tokens as u64,
        generated_tokens: stats.generated_tokens as u64,
        reasoning_tokens: stats.reasoning_tokens as u64,
        mlx_peak_bytes: stats.mlx_peak_bytes,
        mlx_active_bytes: stats.mlx_active_bytes,
        mlx_cache_bytes: stats.mlx_cache_bytes,
        kv_cache_bytes: stats.kv_cache_bytes,
        footprint_bytes: memory.footprint_bytes,
        pressure_start: memory.pressure_start,
        pressure_max: memory.pressure_max,
        pressure_end: memory.pressure_end,
        swap_delta_bytes: memory.swap_delta_bytes,
        decode_bytes_per_token: Some(bytes_per_token),
        memory_bandwidth_gbps,
        decode_roofline_pct: roofline,
        load_kind: stats.load_kind,
        fresh_process: false,
        prefix_source: stats.prefix_source,
        prefix_read_bytes: (stats.prefix_source == PrefixSource::Disk)
            .then_some(stats.prefix_read_bytes),
        prefix_read_ms: (stats.prefix_source == PrefixSource::Disk).then_some(stats.prefix_read_ms),
        loop_shape: stats.loop_shape,
        prefill_step_size: stats.prefill_step_size as u64,
        max_kv_size: stats.max_kv_size.map(|n| n as u64),
        kv_bits: stats.kv_bits.map(u64::from),
        images: stats.images as u64,
        image_tokens: (stats.images > 0).then_some(stats.image_tokens as u64),
        image_encode_ms: (stats.images > 0).then_some(stats.image_encode_ms),
        max_tokens: 0,
        temperature: f64::from(stats.sampler.temperature),
        top_p: f64::from(stats.sampler.top_p),
        top_k: u64::from(stats.sampler.top_k),
        min_p: f64::from(stats.sampler.min_p),
        repetition_penalty: stats.sampler.repetition_penalty.map(f64::from),
        seed: stats.sampler.seed,
        stop_reason: stats.stop_reason,
        error: None,
        server_name: None,
        endpoint_url: None,
        endpoint_dialect: None,
        server_prompt_tokens: None,
        server_load_ms: None,
        server_prefill_ms: None,
        server_decode_ms: None,
        server_prefill_tps: None,
        server_decode_tps: None,
        batch_min_rows: stats.batch.as_ref().map(|b| b.min_rows as u64),
        batch_median_rows: stats.batch.as_ref().map(|b| b.median_rows as u64),
        batch_max_rows: stats.batch.as_ref().map(|b| b.max_rows as u64),
        admission_wait_ms: stats.batch.as_ref().map(|b| b.admission_wait_ms),
        waited_for: stats.batch.as_ref().and_then(|b| b.waited_for.clone()),
        prefill_chunks: stats.batch.as_ref().map(|b| b.prefill_chunks as u64),
        interleaved_chunks: stats.batch.as_ref().map(|b| b.interleaved_chunks as u64),
        constraint: stats.constraint.as_ref().map(|c| c.kind.clone()),
        mask_ms_per_token: stats.constraint.as_ref().map(|c| c.mask_ms_per_token),
        concurrency: context.concurrency,
        aggregate_tps: None,
        split: None,
        split_ranks: None,
        split_backend: None,
        split_hosts: None,
        split_step_bytes: None,
        split_step_link_ms: None,
        split_prefill_bytes: None,
        split_prefill_link_ms: None,
        split_rank_step_ms: None,
        split_rank_prefill_tps: None,
        provenance: provenance.clone(),
    };
    // Only the model the ranks split is split; any other runs here alone.
    let split = crate::engine::distributed::split_facts().filter(|_| {
        crate::engine::distributed::is_split_model(std::path::Path::new(&stats.model_dir))
    });
    let record = match split {
        Some(split) => with_split(record, split, stats.prefill_step_size as u64),
        None => record,
    };
    (record, memory.timeline)
}

/// `record` of a model split over ranks, with how it was split and what a
/// decode step moved between them (the model's width and activation type
/// from its folder).
fn with_split(
    record: RunRecord,
    split: &crate::engine::distributed::SplitFacts,
    prefill_chunk: u64,
) -> RunRecord {
    let shape = step_shape(&record.model_path);
    let step = shape.map(|(layers, hidden, bytes)| split.per_decode_step(layers, hidden, bytes));
    let prefill = shape
        .filter(|_| record.prefill_tokens > 0)
        .map(|shape| split.per_prefill(shape, record.prefill_tokens, prefill_chunk));
    let timed = crate::engine::distributed::compute::ranks();
    let listed = |f: fn(&crate::engine::distributed::compute::ShareCompute) -> String| {
        timed
            .as_ref()
            .map(|ranks| ranks.iter().map(f).collect::<Vec<_>>().join(", "))
    };
    RunRecord {
        split_rank_step_ms: listed(|rank| format!("{:.3}", rank.step_ms)),
        split_rank_prefill_tps: listed(|rank| format!("{:.0}", rank.prefill_tps)),
        split: Some(split.kind.name().to_owned()),
        split_ranks: Some(split.hosts.len() as u64),
        split_backend: Some(split.backend.name().to_owned()),
        split_hosts: Some(split.hosts.join(", ")),
        split_step_bytes: step.map(|(bytes, _)| bytes),
        split_step_link_ms: step.map(|(_, ms)| ms),
        split_prefill_bytes: prefill.map(|(bytes, _)| bytes),
        split_prefill_link_ms: prefill.map(|(_, ms)| ms),
        ..record
    }
}

/// A model's layers, hidden width and bytes per activation element.
type StepShape = (u64, u64, u64);

/// A model folder's `StepShape`, read from its folder once per process
/// (every run of a split model asks).
fn step_shape(model_path: &str) -> Option<StepShape> {
    static SHAPES: std::sync::Mutex<Vec<(String, Option<StepShape>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut shapes = SHAPES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, shape)) = shapes.iter().find(|(path, _)| path == model_path) {
        return *shape;
    }
    let shape = crate::hub::sizing::facts_from_folder(std::path::Path::new(model_path))
        .ok()
        .map(|facts| {
            let shape = facts.shape;
            (
                shape.num_hidden_layers,
                shape.hidden_size,
                shape.kv_dtype.bytes(),
            )
        });
    shapes.push((model_path.to_owned(), shape));
    shape
}
