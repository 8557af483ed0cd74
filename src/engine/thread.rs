//! The engine thread: the one place MLX objects live (MLX is not
//! thread-safe). Clients hold a cloneable `EngineHandle` and send plain
//! requests; each request brings its own event sink and cancellation token.
//! The thread keeps loaded models resident and conversations' caches warm
//! until told to let them go; a failed or panicking request does not stop it.
//!
//! Generations on one model share a batch (`engine::batch`): a request
//! joins the running batch at its next step when its model is the batch's,
//! the batch has room (`GenerateRequest::max_batch`) and its KV cache fits
//! the memory left; otherwise it waits, first come first served, and its
//! record says what it waited for. A request for another model waits until
//! the batch drains (two batches would each read their own weights every
//! step and hold two models' caches: on a Mac's one memory that is rarely a
//! win). A request that asks to run alone (`max_batch` 1, the sync loop, a
//! graph count: the benchmarks) waits for the batch to drain and then has
//! the engine to itself. Commands are read between steps, so a load, an
//! unload or a status question never waits for a whole generation. On a
//! backend where a batch does not pay (`backend::batch_rows_limit`: MLX's
//! CUDA backend without Ondo's kernel) every generation runs alone, in turn.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::Instant;

use super::anatomy::StepAnatomy;
use super::batch::{Batch, BatchEvent, FinishedSequence, NewSequence, SequenceId};
use super::disk_cache::{DiskCacheSettings, DiskPromptCache};
use super::distributed::{self, orders};
use super::embed::{EmbedOutcome, EmbedRequest, Embedder, LoadedEncoder};
use super::load::LoadedModel;
use super::request::{CancelToken, EventSink, GenerateRequest, RunError, RunEvent};
use super::sample::Sampler;
use super::stats::BatchShare;
use super::stream::{self, Conversation, PreparedRun, RunSetting, RunText};
use crate::run_kinds::{LoadKind, LoopShape, StopReason};

/// What the engine knows about a resident model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ResidentModel {
    pub model_dir: PathBuf,
    pub model_type: String,
    pub quantization: String,
    pub weights_bytes: u64,
    pub load_ms: f64,
    pub conversations: usize,
    /// What the conversations' KV caches hold now.
    pub kv_cache_bytes: u64,
}

enum Command {
    Generate {
        request: Box<GenerateRequest>,
        sink: EventSink,
        cancel: CancelToken,
        received: Instant,
    },
    Load {
        model_dir: PathBuf,
        reply: mpsc::Sender<Result<ResidentModel, RunError>>,
    },
    Unload {
        model_dir: PathBuf,
        reply: mpsc::Sender<bool>,
    },
    ForgetConversation {
        id: String,
    },
    DropConversations {
        model_dir: Option<PathBuf>,
        reply: mpsc::Sender<u64>,
    },
    Resident {
        reply: mpsc::Sender<Vec<ResidentModel>>,
    },
    /// Embeddings: run between decode steps, at once (one forward pass, no
    /// decode loop to join).
    Embed {
        request: Box<EmbedRequest>,
        reply: mpsc::Sender<Result<EmbedOutcome, RunError>>,
    },
    /// Other MLX work (self-tests, writing synthetic models) that must not
    /// run beside the engine's.
    Call(Box<dyn FnOnce() + Send>),
    /// On a rank other than 0 of a split model that serves: runs rank 0's
    /// orders on the model in `model_dir` until rank 0 finishes (`Ok`) or
    /// the link to it fails (`Err`, said plainly).
    Follow {
        model_dir: PathBuf,
        reply: mpsc::Sender<Result<(), String>>,
    },
    /// Sets up the prompt cache on disk (`None`: none).
    DiskCache {
        settings: Option<DiskCacheSettings>,
        reply: mpsc::Sender<()>,
    },
}

/// Where a blocking generation's events are heard.
pub enum EventDelivery<'a> {
    /// On the caller's thread, each event sent over from the engine's.
    Caller(Box<dyn FnMut(&RunEvent) + 'a>),
    /// On the engine thread, as each happens: for a listener that hands
    /// the events on to another thread anyway (the local server streaming
    /// every token), one thread hop fewer per token. It must be quick: the
    /// engine waits for it.
    EngineThread(Box<dyn FnMut(&RunEvent) + Send>),
}

/// A handle to the engine thread. Cloning is cheap; when the last clone is
/// dropped the thread finishes its queue, waits for MLX to go idle and is
/// joined, so the process never exits while MLX still computes (its static
/// destructors would free buffers a worker is writing).
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::SyncSender<Command>,
    _thread: Arc<JoinOnDrop>,
}

struct JoinOnDrop(Option<std::thread::JoinHandle<()>>);

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        // By now every sender is gone (this guard is dropped after the
        // handle's own sender), so the thread's loop ends. A handle dropped
        // on the engine thread itself (inside a sink) cannot wait for it.
        if let Some(thread) = self.0.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

/// Requests waiting beyond this block the sender (backpressure rather than
/// an unbounded queue).
const QUEUE_DEPTH: usize = 32;

impl EngineHandle {
    /// Starts the engine thread.
    pub fn spawn() -> Result<Self, RunError> {
        let (commands, receiver) = mpsc::sync_channel(QUEUE_DEPTH);
        let thread = std::thread::Builder::new()
            .name("ondo-engine".into())
            .spawn(move || EngineThread::default().serve(receiver))
            .map_err(|e| RunError::Internal(format!("could not start the engine thread: {e}")))?;
        Ok(Self {
            commands,
            _thread: Arc::new(JoinOnDrop(Some(thread))),
        })
    }

    /// Runs rank 0's orders on this rank's part of the split model in
    /// `model_dir` (`ondo serve` on a rank other than 0), until rank 0
    /// finishes serving (`Ok`) or cannot be reached (`Err`).
    pub fn follow(&self, model_dir: &Path) -> Result<(), String> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Follow {
                model_dir: model_dir.to_owned(),
                reply,
            })
            .map_err(|_| RunError::EngineStopped.to_string())?;
        answer
            .recv()
            .unwrap_or_else(|_| Err(RunError::EngineStopped.to_string()))
    }

    /// Queues a generation; its events go to `sink` on the engine thread.
    /// When the engine is gone the sink hears `Failed` at once.
    pub fn generate(&self, request: GenerateRequest, sink: EventSink, cancel: CancelToken) {
        let command = Command::Generate {
            request: Box::new(request),
            sink,
            cancel,
            received: Instant::now(),
        };
        if let Err(mpsc::SendError(Command::Generate { mut sink, .. })) =
            self.commands.send(command)
        {
            sink(RunEvent::Failed {
                error: RunError::EngineStopped,
            });
        }
    }

    /// Runs a generation and waits for it; `on_event` sees every event
    /// (on the caller's thread) before the outcome is returned.
    pub fn generate_blocking(
        &self,
        request: GenerateRequest,
        cancel: CancelToken,
        on_event: impl FnMut(&RunEvent),
    ) -> Result<stream::RunOutcome, RunError> {
        self.generate_blocking_with(request, cancel, EventDelivery::Caller(Box::new(on_event)))
    }

    /// As `generate_blocking`, with the events delivered as `delivery` says.
    pub fn generate_blocking_with(
        &self,
        request: GenerateRequest,
        cancel: CancelToken,
        delivery: EventDelivery<'_>,
    ) -> Result<stream::RunOutcome, RunError> {
        let (sender, events) = mpsc::channel();
        let mut on_caller_thread = None;
        let sink: EventSink = match delivery {
            EventDelivery::Caller(on_event) => {
                on_caller_thread = Some(on_event);
                Box::new(move |event| {
                    let _ = sender.send(event);
                })
            }
            // Only the end crosses to the caller; the rest is heard where it
            // happens.
            EventDelivery::EngineThread(mut on_event) => Box::new(move |event| {
                on_event(&event);
                if matches!(event, RunEvent::Finished { .. } | RunEvent::Failed { .. }) {
                    let _ = sender.send(event);
                }
            }),
        };
        self.generate(request, sink, cancel);
        for event in events {
            if let Some(on_event) = on_caller_thread.as_mut() {
                on_event(&event);
            }
            match event {
                RunEvent::Finished {
                    text,
                    reasoning,
                    tool_calls,
                    raw_text,
                    token_ids,
                    stats,
                    anatomy,
                } => {
                    return Ok(stream::RunOutcome {
                        text,
                        reasoning,
                        tool_calls,
                        raw_text,
                        token_ids,
                        stats: *stats,
                        anatomy,
                    });
                }
                RunEvent::Failed { error } => return Err(error),
                _ => {}
            }
        }
        Err(RunError::EngineStopped)
    }

    /// Loads a model (or finds it resident) without generating.
    pub fn load(&self, model_dir: &Path) -> Result<ResidentModel, RunError> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Load {
                model_dir: model_dir.to_owned(),
                reply,
            })
            .map_err(|_| RunError::EngineStopped)?;
        answer.recv().map_err(|_| RunError::EngineStopped)?
    }

    /// Drops a resident model and its conversations; true if it was resident.
    pub fn unload(&self, model_dir: &Path) -> Result<bool, RunError> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Unload {
                model_dir: model_dir.to_owned(),
                reply,
            })
            .map_err(|_| RunError::EngineStopped)?;
        answer.recv().map_err(|_| RunError::EngineStopped)
    }

    /// Drops a conversation's cache (the next turn prefills everything).
    pub fn forget_conversation(&self, id: &str) -> Result<(), RunError> {
        self.commands
            .send(Command::ForgetConversation { id: id.to_owned() })
            .map_err(|_| RunError::EngineStopped)
    }

    /// Sets up the prompt cache on disk (`None` turns it off): caches that
    /// leave memory are saved there and read back for prompts that start
    /// the same way. Writes already asked finish first.
    pub fn set_disk_cache(&self, settings: Option<DiskCacheSettings>) -> Result<(), RunError> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::DiskCache { settings, reply })
            .map_err(|_| RunError::EngineStopped)?;
        answer.recv().map_err(|_| RunError::EngineStopped)
    }

    /// Drops every conversation cache of one resident model (or of all):
    /// later turns prefill from scratch. Returns the KV bytes freed.
    pub fn drop_conversations(&self, model_dir: Option<&Path>) -> Result<u64, RunError> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::DropConversations {
                model_dir: model_dir.map(Path::to_owned),
                reply,
            })
            .map_err(|_| RunError::EngineStopped)?;
        answer.recv().map_err(|_| RunError::EngineStopped)
    }

    /// Returns MLX's cache of freed buffers to the system; the bytes it held.
    pub fn clear_buffer_cache(&self) -> Result<u64, RunError> {
        self.call(|| {
            let held = mlx_rs::memory::cache_memory().unwrap_or(0) as u64;
            let _ = mlx_rs::memory::clear_cache();
            held
        })
    }

    /// Runs `work` on the engine thread, between requests, and returns its
    /// result: the way for other code that uses MLX to stay off the engine's
    /// toes (MLX is not thread-safe).
    pub fn call<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, RunError> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Call(Box::new(move || {
                let _ = reply.send(work());
            })))
            .map_err(|_| RunError::EngineStopped)?;
        answer
            .recv()
            .map_err(|_| RunError::Internal("the work sent to the engine thread panicked".into()))
    }

    /// Embeds the request's inputs with its model (loaded, or found
    /// resident, in the same pool as the chat models) and waits for them.
    pub fn embed(&self, request: EmbedRequest) -> Result<EmbedOutcome, RunError> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Embed {
                request: Box::new(request),
                reply,
            })
            .map_err(|_| RunError::EngineStopped)?;
        answer.recv().map_err(|_| RunError::EngineStopped)?
    }

    /// The models resident now.
    pub fn resident(&self) -> Result<Vec<ResidentModel>, RunError> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Resident { reply })
            .map_err(|_| RunError::EngineStopped)?;
        answer.recv().map_err(|_| RunError::EngineStopped)
    }
}

struct Resident {
    model: LoadedModel,
    load_ms: f64,
    conversations: HashMap<String, Conversation>,
}

/// A generation the engine has received and not started.
struct Held {
    request: Box<GenerateRequest>,
    sink: EventSink,
    cancel: CancelToken,
    received: Instant,
    /// What it first waited for, once it has waited.
    waited_for: Option<&'static str>,
}

impl Held {
    /// Whether it runs with the engine to itself rather than in a batch.
    fn runs_alone(&self) -> bool {
        runs_alone(&self.request)
    }
}

/// Whether `request` has the engine to itself: it asks for no batch, or
/// measures something a batch would blur (the sync loop's shape, one
/// step's graph).
fn runs_alone(request: &GenerateRequest) -> bool {
    request.max_batch <= 1
        || request.loop_shape == LoopShape::Sync
        || request.count_graph_nodes
        // Every rank of a split model runs its steps in lockstep with the
        // others, one sequence at a time.
        || distributed::is_split_model(&request.model_dir)
}

/// A generation in the batch.
struct LiveRun {
    request: Box<GenerateRequest>,
    sink: EventSink,
    conversation: Conversation,
    prepared: PreparedRun,
    text: RunText,
    load_kind: LoadKind,
    load_ms: f64,
    accepted_at: Instant,
    admission_wait_ms: f64,
    waited_for: Option<&'static str>,
    /// Set when its text ended it (a stop string) before the batch did.
    ended: Option<StopReason>,
}

/// The batch running now and the runs in it.
struct Running {
    key: PathBuf,
    batch: Batch,
    runs: HashMap<SequenceId, LiveRun>,
}

impl Running {
    /// Whether `request`'s KV cache can sit in this batch's: every row of
    /// a layer's cache is float, or quantized the same way (bits, group
    /// size and from which position).
    fn holds_kv_like(&self, request: &GenerateRequest) -> bool {
        self.runs
            .values()
            .all(|run| run.request.kv_quantization() == request.kv_quantization())
    }
}

struct EngineThread {
    models: HashMap<PathBuf, Resident>,
    /// Encoders (BERT) kept warm beside the decoders, with their load
    /// times: they only embed.
    encoders: HashMap<PathBuf, (LoadedEncoder, f64)>,
    running: Option<Running>,
    /// Generations waiting to start, first come first served.
    held: VecDeque<Held>,
    /// The backend's bound on a batch's rows (`backend::batch_rows_limit`).
    rows_limit: usize,
    /// The prompt cache on disk, when set up.
    disk: Option<DiskPromptCache>,
    /// Conversations that ended with their run (no id to keep them
    /// under), to be saved to the disk once their client has its answer.
    retiring: Vec<(PathBuf, Conversation)>,
}

impl Default for EngineThread {
    fn default() -> Self {
        Self {
            models: HashMap::new(),
            encoders: HashMap::new(),
            running: None,
            held: VecDeque::new(),
            rows_limit: super::backend::batch_rows_limit(),
            disk: None,
            retiring: Vec::new(),
        }
    }
}

/// Folders are compared by their canonical path, so `./m` and `/abs/m` are
/// the same resident model.
fn model_key(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned())
}

/// The group of ranks this process joined to split a model.
fn split_group() -> Result<distributed::Group, String> {
    let launch = distributed::pipeline::joined()
        .ok_or("this process did not join other ranks to split a model")?;
    // MLX keeps the group it made at the join: this returns it at once.
    distributed::Group::init(launch.backend)
}

/// Blocks until the default stream has no queued work.
fn wait_for_mlx() {
    // SAFETY: a plain C call without arguments; MLX is only used from this
    // thread.
    unsafe {
        mlx_sys::mlx_synchronize_default();
    }
}

/// An embedding model makes vectors, not replies: a generation on one is
/// refused with a word on what to do.
fn refuse_embedding_model(model: &LoadedModel) -> Result<(), RunError> {
    match model.embedding {
        Some(_) => Err(RunError::InvalidSettings(format!(
            "{} is an embedding model: it turns text into vectors and cannot chat; ask it for embeddings (ondo embed, /v1/embeddings, /api/embed) or pick a chat model",
            model.dir.display()
        ))),
        None => Ok(()),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

fn finished_event(outcome: stream::RunOutcome) -> RunEvent {
    RunEvent::Finished {
        text: outcome.text,
        reasoning: outcome.reasoning,
        tool_calls: outcome.tool_calls,
        raw_text: outcome.raw_text,
        token_ids: outcome.token_ids,
        stats: Box::new(outcome.stats),
        anatomy: outcome.anatomy,
    }
}

/// Bytes of KV cache a run of `tokens` positions adds on `model` with
/// `request`'s cache settings: each attention layer's keys and values per
/// position, a windowed layer's up to its window, a bounded cache's up to
/// its bound; a growing layer's in `kv_bits` bits plus a scale and a bias
/// per group once the cache has `quantized_kv_start` positions (all of it
/// is quantized then).
fn kv_bytes_for(model: &LoadedModel, tokens: usize, request: &GenerateRequest) -> u64 {
    let element = match model.model.float_dtype().as_str() {
        "float32" => 4,
        _ => 2,
    };
    let bounded = request.max_kv_size.is_some();
    let tokens = request
        .max_kv_size
        .map_or(tokens, |bound| tokens.min(bound)) as u64;
    let quantized = request
        .kv_quantization()
        .filter(|q| !bounded && tokens > 0 && tokens >= q.start.max(0) as u64);
    model
        .model
        .layer_caches()
        .iter()
        .map(|&(window, per_position)| match (window, quantized) {
            (None, Some(q)) => q.bytes_per_position(per_position, element) * tokens,
            _ => {
                let kept = window.map_or(tokens, |w| tokens.min(w.max(0) as u64));
                per_position * kept * element
            }
        })
        .sum()
}

impl EngineThread {
    fn serve(mut self, commands: mpsc::Receiver<Command>) {
        let mut open = true;
        loop {
            if self.running.is_none() && self.held.is_empty() {
                // Idle: wait for work.
                match commands.recv() {
                    Ok(command) => self.handle(command),
                    Err(_) => break,
                }
            }
            // Whatever else has come in, without waiting.
            while open {
                match commands.try_recv() {
                    Ok(command) => self.handle(command),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => open = false,
                }
            }
            self.admit();
            if self.running.is_some() {
                self.step();
            } else if !open && self.held.is_empty() {
                break;
            }
        }
        // Leave nothing running behind the arrays (and perhaps the process).
        wait_for_mlx();
        // The other ranks of a split model that served here end with it.
        if orders::is_serving()
            && distributed::lost().is_none()
            && let Err(reason) =
                split_group().and_then(|g| orders::send(&g, &orders::Order::Finish))
        {
            eprintln!("note: the other ranks were not told to finish: {reason}");
        }
        // Quitting: what the conversations hold goes to the disk, and the
        // writes finish before the thread does.
        self.save_retiring();
        let keys: Vec<PathBuf> = self.models.keys().cloned().collect();
        for key in keys {
            self.save_conversations(&key, |_| true);
        }
        if let Some(mut disk) = self.disk.take() {
            disk.finish_writes();
        }
        self.models.clear();
        self.encoders.clear();
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Generate {
                request,
                sink,
                cancel,
                received,
            } => self.held.push_back(Held {
                request,
                sink,
                cancel,
                received,
                waited_for: None,
            }),
            Command::Load { model_dir, reply } => {
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    self.ensure_loaded(&model_dir).map(|(_, key)| key)
                }))
                .unwrap_or_else(|p| Err(RunError::Internal(panic_message(p.as_ref()))))
                .map(|key| self.describe(&key));
                let _ = reply.send(result.and_then(|d| d.ok_or(RunError::EngineStopped)));
            }
            Command::Unload { model_dir, reply } => {
                let key = model_key(&model_dir);
                // Runs on it end here, as if cancelled, before it goes.
                if self.running.as_ref().is_some_and(|r| r.key == key) {
                    self.end_batch(|_| None);
                }
                self.save_conversations(&key, |_| true);
                let removed =
                    self.models.remove(&key).is_some() | self.encoders.remove(&key).is_some();
                if removed {
                    let _ = mlx_rs::memory::clear_cache();
                }
                let _ = reply.send(removed);
            }
            Command::ForgetConversation { id } => {
                let keys: Vec<PathBuf> = self.models.keys().cloned().collect();
                for key in keys {
                    self.save_conversations(&key, |c| c == id);
                }
                for resident in self.models.values_mut() {
                    resident.conversations.remove(&id);
                }
            }
            Command::DiskCache { settings, reply } => {
                if let Some(mut old) = self.disk.take() {
                    old.finish_writes();
                }
                self.disk = settings.map(|s| {
                    super::disk_cache::write_readme(&s.folder);
                    DiskPromptCache::open(&s)
                });
                let _ = reply.send(());
            }
            Command::DropConversations { model_dir, reply } => {
                let key = model_dir.as_deref().map(model_key);
                let dirs: Vec<PathBuf> = self
                    .models
                    .keys()
                    .filter(|dir| key.as_ref().is_none_or(|k| k == *dir))
                    .cloned()
                    .collect();
                for dir in dirs {
                    self.save_conversations(&dir, |_| true);
                }
                let mut freed = 0u64;
                for (dir, resident) in self.models.iter_mut() {
                    if key.as_ref().is_none_or(|k| k == dir) {
                        freed += resident
                            .conversations
                            .drain()
                            .map(|(_, c)| c.kv_cache_bytes() as u64)
                            .sum::<u64>();
                    }
                }
                let _ = reply.send(freed);
            }
            Command::Embed { request, reply } => {
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    if super::embed::is_encoder_folder(&request.model_dir) {
                        let ((load_kind, load_ms), key) =
                            self.ensure_encoder(&request.model_dir)?;
                        let (encoder, _) = self
                            .encoders
                            .get(&key)
                            .ok_or_else(|| RunError::Internal("a loaded model vanished".into()))?;
                        return super::embed::embed(
                            Embedder::Encoder(encoder),
                            &request,
                            load_kind,
                            load_ms,
                        );
                    }
                    if distributed::is_split_model(&request.model_dir) {
                        return Err(RunError::InvalidSettings(format!(
                            "{} is split over several ranks here, which only generate together; \
                             embed with a model that runs on this machine alone",
                            request.model_dir.display()
                        )));
                    }
                    let ((load_kind, load_ms), key) = self.ensure_loaded(&request.model_dir)?;
                    let resident = self
                        .models
                        .get(&key)
                        .ok_or_else(|| RunError::Internal("a loaded model vanished".into()))?;
                    super::embed::embed(
                        Embedder::Decoder(&resident.model),
                        &request,
                        load_kind,
                        load_ms,
                    )
                }))
                .unwrap_or_else(|p| Err(RunError::Internal(panic_message(p.as_ref()))));
                let _ = reply.send(result);
            }
            Command::Follow { model_dir, reply } => {
                let _ = reply.send(self.follow(&model_dir));
            }
            Command::Call(work) => {
                // A panic drops the reply sender; the caller hears of it.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(work));
            }
            Command::Resident { reply } => {
                let mut all: Vec<ResidentModel> = self
                    .models
                    .keys()
                    .filter_map(|k| self.describe(k))
                    .collect();
                all.extend(self.encoders.values().map(|(e, load_ms)| ResidentModel {
                    model_dir: e.dir.clone(),
                    model_type: e.model_type.clone(),
                    quantization: e.float_dtype.clone(),
                    weights_bytes: e.weights_bytes as u64,
                    load_ms: *load_ms,
                    conversations: 0,
                    kv_cache_bytes: 0,
                }));
                all.sort_by(|a, b| a.model_dir.cmp(&b.model_dir));
                let _ = reply.send(all);
            }
        }
    }

    fn describe(&self, key: &Path) -> Option<ResidentModel> {
        let in_batch = self
            .running
            .as_ref()
            .filter(|r| r.key == key)
            .map_or(0, |r| r.batch.kv_cache_bytes() as u64);
        self.models.get(key).map(|r| ResidentModel {
            model_dir: r.model.dir.clone(),
            model_type: r.model.model_type.clone(),
            quantization: r.model.quantization_label(),
            weights_bytes: r.model.weights_bytes as u64,
            load_ms: r.load_ms,
            conversations: r.conversations.len(),
            kv_cache_bytes: in_batch
                + r.conversations
                    .values()
                    .map(|c| c.kv_cache_bytes() as u64)
                    .sum::<u64>(),
        })
    }

    /// Loads the encoder `dir` unless resident; returns (cold or warm, key).
    fn ensure_encoder(&mut self, dir: &Path) -> Result<((LoadKind, f64), PathBuf), RunError> {
        let key = model_key(dir);
        if self.encoders.contains_key(&key) {
            return Ok(((LoadKind::Warm, 0.0), key));
        }
        let start = Instant::now();
        let encoder = LoadedEncoder::load(dir)?;
        let load_ms = start.elapsed().as_secs_f64() * 1e3;
        self.encoders.insert(key.clone(), (encoder, load_ms));
        Ok(((LoadKind::Cold, load_ms), key))
    }

    /// Loads `dir` unless resident; returns (cold or warm, key).
    fn ensure_loaded(&mut self, dir: &Path) -> Result<((LoadKind, f64), PathBuf), RunError> {
        let key = model_key(dir);
        if self.models.contains_key(&key) {
            return Ok(((LoadKind::Warm, 0.0), key));
        }
        // An encoder only embeds: a generation (or a chat preload) on one
        // is told so rather than that its architecture is unknown.
        if super::embed::is_encoder_folder(dir) {
            return Err(RunError::InvalidSettings(format!(
                "{} is an embedding model (an encoder): it turns text into vectors and cannot chat; ask it for embeddings (ondo embed, /v1/embeddings, /api/embed) or pick a chat model",
                dir.display()
            )));
        }
        let start = Instant::now();
        let model = LoadedModel::load(dir)?;
        let load_ms = start.elapsed().as_secs_f64() * 1e3;
        self.models.insert(
            key.clone(),
            Resident {
                model,
                load_ms,
                conversations: HashMap::new(),
            },
        );
        Ok(((LoadKind::Cold, load_ms), key))
    }

    /// Starts the generations at the front of the line that can start now.
    fn admit(&mut self) {
        // Where the backend cannot batch, every run has the engine alone.
        let batching = self.rows_limit > 1;
        while let Some(front) = self.held.front_mut() {
            let alone = front.runs_alone() || !batching;
            let wait = match &self.running {
                None => None,
                Some(running) => {
                    let key = model_key(&front.request.model_dir);
                    if alone {
                        Some("batch_to_drain")
                    } else if key != running.key {
                        Some("another_model")
                    } else if running.runs.len() >= front.request.max_batch {
                        Some("batch_full")
                    } else if !running.holds_kv_like(&front.request) {
                        Some("kv_settings")
                    } else if !front.cancel.is_cancelled()
                        && !fits(&self.models, running, &front.request)
                    {
                        Some("memory")
                    } else {
                        None
                    }
                }
            };
            if let Some(why) = wait {
                front.waited_for.get_or_insert(why);
                return;
            }
            let Some(held) = self.held.pop_front() else {
                return;
            };
            if alone {
                self.run_alone(held);
            } else {
                self.join(held);
            }
        }
    }

    /// Runs `held` with the engine to itself, to the end.
    fn run_alone(&mut self, held: Held) {
        let Held {
            request,
            mut sink,
            cancel,
            ..
        } = held;
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.generate_alone(&request, &cancel, &mut sink)
        }));
        // A pipelined run leaves its last step queued. Let it finish before
        // the client hears the end: the next request then starts on an
        // idle MLX, and a client that exits right away never exits under
        // running work.
        wait_for_mlx();
        let event = match result {
            Ok(Ok(outcome)) => finished_event(outcome),
            Ok(Err(error)) => RunEvent::Failed { error },
            Err(payload) => {
                // The model's state may be half-updated: drop it.
                self.retiring.clear();
                self.models.remove(&model_key(&request.model_dir));
                RunEvent::Failed {
                    error: RunError::Internal(panic_message(payload.as_ref())),
                }
            }
        };
        sink(event);
        self.save_retiring();
    }

    /// `request` as every rank of the split model runs it: with one seed,
    /// and without the saved prompt caches (a file on disk would hold one
    /// rank's layers). Conversations stay warm on every rank; the ranks
    /// agree on what each reuses before every run (`agree_on_prefix`).
    /// `Err` once the split is lost.
    fn prepare_split_run(
        &mut self,
        request: &GenerateRequest,
    ) -> Result<GenerateRequest, RunError> {
        if let Some(reason) = distributed::lost() {
            let key = model_key(&request.model_dir);
            if self.models.remove(&key).is_some() {
                let _ = mlx_rs::memory::clear_cache();
            }
            return Err(RunError::Distributed(format!(
                "{reason}; the split model cannot run until every rank is started again \
                 (restart ondo serve --hostfile)"
            )));
        }
        if request.prompt_cache_file.is_some() {
            return Err(RunError::InvalidSettings(
                "a prompt cache file holds every layer of one process's cache; a model split \
                 over several ranks starts from its prompt"
                    .into(),
            ));
        }
        // Every rank must draw the same tokens: a request without a seed
        // gets one here, a fresh one per request from rank 0 of a server
        // (its order carries it), rank 0's from the introductions for a
        // run every rank started itself.
        let mut sampler = request.sampler.clone();
        if sampler.seed.is_none() {
            sampler.seed = Some(if orders::is_serving() {
                distributed::fresh_seed()
            } else {
                distributed::shared_seed().unwrap_or(0)
            });
        }
        Ok(GenerateRequest {
            disk_cache: false,
            sampler,
            ..request.clone()
        })
    }

    /// Rank 0 gives the other ranks `request` and hears that each can run
    /// it, before any rank starts the model's collectives.
    fn order_split_run(&mut self, request: &GenerateRequest, key: &Path) -> Result<(), RunError> {
        let group = split_group().map_err(RunError::Distributed)?;
        let order = orders::Order::Generate {
            request: Box::new(request.clone()),
        };
        let ready = orders::send(&group, &order).and_then(|()| orders::answer(&group, Ok(())));
        match ready {
            Ok(Ok(())) => Ok(()),
            Ok(Err(refused)) => Err(RunError::Distributed(refused)),
            Err(link) => Err(self.split_lost(key, &link)),
        }
    }

    /// The split model's link failed (`said`): the model is unloaded here
    /// (its other ranks are gone or out of step) and later requests for it
    /// are refused with the reason; the other models serve on.
    fn split_lost(&mut self, key: &Path, said: &str) -> RunError {
        let whom = match (distributed::pipeline::joined(), distributed::split_facts()) {
            (Some(launch), Some(facts)) => distributed::other_ranks(launch, &facts.hosts),
            _ => "another rank".to_owned(),
        };
        distributed::mark_lost(&format!(
            "the link to {whom} of the split model failed: that rank stopped or the network \
             dropped ({})",
            said.trim()
        ));
        if self.models.remove(key).is_some() {
            let _ = mlx_rs::memory::clear_cache();
        }
        RunError::Distributed(format!(
            "{}; the split model is unloaded: restart ondo serve --hostfile to run it again",
            distributed::lost().unwrap_or_default()
        ))
    }

    /// A rank other than 0: runs rank 0's orders on `model_dir` until it
    /// finishes serving.
    fn follow(&mut self, model_dir: &Path) -> Result<(), String> {
        let group = split_group()?;
        // Its share loads now, so the first request does not wait for it; a
        // share that cannot load is said again in the answer to each order.
        if let Err(error) = self.ensure_loaded(model_dir) {
            eprintln!("note: this rank's share of the model did not load: {error}");
        }
        // Conversation ids, least recently used first.
        let mut used: VecDeque<String> = VecDeque::new();
        loop {
            let mut request = match orders::receive(&group)? {
                orders::Order::Finish => return Ok(()),
                orders::Order::Generate { request } => request,
            };
            // Rank 0's folder is its own; this rank runs its copy.
            request.model_dir = model_dir.to_owned();
            let ready = self
                .ensure_loaded(model_dir)
                .map(drop)
                .map_err(|e| e.to_string());
            if orders::answer(&group, ready)?.is_err() {
                continue;
            }
            let cancel = CancelToken::new();
            let mut sink: EventSink = Box::new(|_| {});
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.generate_alone(&request, &cancel, &mut sink)
            }));
            wait_for_mlx();
            if let Some(id) = &request.conversation {
                used.retain(|u| u != id);
                used.push_back(id.clone());
            }
            while used.len() > FOLLOWER_CONVERSATIONS {
                if let (Some(oldest), Some(resident)) =
                    (used.pop_front(), self.models.get_mut(&model_key(model_dir)))
                {
                    resident.conversations.remove(&oldest);
                }
            }
            match result {
                Ok(Ok(_)) => {}
                Ok(Err(error)) if distributed::is_link_failure(&error.to_string()) => {
                    return Err(error.to_string());
                }
                Ok(Err(error)) => eprintln!("note: a split run ended with: {error}"),
                Err(payload) => {
                    return Err(format!(
                        "a split run panicked: {}",
                        panic_message(payload.as_ref())
                    ));
                }
            }
        }
    }

    /// Saves the conversations that ended with their runs to the disk.
    fn save_retiring(&mut self) {
        for (key, conversation) in std::mem::take(&mut self.retiring) {
            if let (Some(disk), Some(resident)) = (self.disk.as_mut(), self.models.get(&key)) {
                save_conversation(disk, &resident.model, &conversation);
            }
        }
    }

    /// Saves to the disk the conversations of the model at `key` whose id
    /// `chosen` picks (they are about to leave memory).
    fn save_conversations(&mut self, key: &Path, chosen: impl Fn(&str) -> bool) {
        let (Some(disk), Some(resident)) = (self.disk.as_mut(), self.models.get(key)) else {
            return;
        };
        for (id, conversation) in &resident.conversations {
            if chosen(id) {
                save_conversation(disk, &resident.model, conversation);
            }
        }
    }

    fn generate_alone(
        &mut self,
        request: &GenerateRequest,
        cancel: &CancelToken,
        sink: &mut EventSink,
    ) -> Result<stream::RunOutcome, RunError> {
        // Peak memory is per request, so a cold run's peak includes the load.
        mlx_rs::memory::reset_peak_memory()?;
        let split_request;
        let split = distributed::is_split_model(&request.model_dir);
        let request = if split {
            split_request = self.prepare_split_run(request)?;
            &split_request
        } else {
            request
        };
        let ((load_kind, load_ms), key) = self.ensure_loaded(&request.model_dir)?;
        let _under_way = split.then(distributed::SplitRunUnderWay::begin);
        if split && orders::is_serving() {
            self.order_split_run(request, &key)?;
        }
        let accepted_at = Instant::now();
        let resident = self
            .models
            .get_mut(&key)
            .ok_or_else(|| RunError::Internal("a loaded model vanished".into()))?;
        refuse_embedding_model(&resident.model)?;
        let mut conversation = take_conversation(resident, request);
        let setting = RunSetting {
            load_kind,
            load_ms,
            accepted_at,
            batch: None,
        };
        let outcome = if split {
            // Every rank must start from the same cached positions.
            let prepared = stream::prepare(&resident.model, &mut conversation, request, None);
            agree_on_prefix(&resident.model, &mut conversation, request, prepared).and_then(
                |prepared| {
                    stream::run_prepared(
                        &resident.model,
                        &mut conversation,
                        request,
                        prepared,
                        setting,
                        cancel,
                        &mut |event| sink(event),
                    )
                },
            )
        } else {
            stream::run(
                &resident.model,
                &mut conversation,
                request,
                setting,
                self.disk.as_mut(),
                cancel,
                &mut |event| sink(event),
            )
        };
        if split
            && let Err(error) = &outcome
            && distributed::is_link_failure(&error.to_string())
        {
            return Err(self.split_lost(&key, &error.to_string()));
        }
        // A failed turn leaves the cache in an unknown state: drop it.
        match (&outcome, &request.conversation) {
            (Ok(_), Some(id)) => {
                resident.conversations.insert(id.clone(), conversation);
            }
            (Ok(_), None) => self.retiring.push((key, conversation)),
            (Err(_), _) => {}
        }
        outcome
    }

    /// Takes `held` into the batch (starting one on its model when none
    /// runs): loads the model if needed, prepares the prompt on the
    /// conversation's cache and joins.
    fn join(&mut self, held: Held) {
        let Held {
            request,
            mut sink,
            cancel,
            received,
            waited_for,
        } = held;
        let admitted_at = Instant::now();
        let joined = std::panic::catch_unwind(AssertUnwindSafe(|| -> Result<(), RunError> {
            if self.running.is_none() {
                // Peak memory is per batch: a cold start's includes the load.
                mlx_rs::memory::reset_peak_memory()?;
            }
            let ((load_kind, load_ms), key) = self.ensure_loaded(&request.model_dir)?;
            // The time to first token starts here, with the model loaded:
            // reading a prompt cache from the disk (in prepare) is part of it.
            let accepted_at = Instant::now();
            let resident = self
                .models
                .get_mut(&key)
                .ok_or_else(|| RunError::Internal("a loaded model vanished".into()))?;
            refuse_embedding_model(&resident.model)?;
            let mut conversation = take_conversation(resident, &request);
            let model = &resident.model;
            let prepared = stream::prepare(model, &mut conversation, &request, self.disk.as_mut())?;
            sink(RunEvent::Started {
                load_kind,
                load_ms,
                prompt_tokens: prepared.prompt.len(),
                cached_tokens: prepared.cached,
            });
            let sampler = Sampler::new(request.sampler.clone())?;
            let constraint = request
                .constraint
                .as_ref()
                .map(|c| model.constraint(c, prepared.format))
                .transpose()?
                .flatten();
            let text = RunText::new(model, &request, &prepared);
            let sequence = NewSequence {
                constraint,
                prompt: prepared.new_tokens().to_vec(),
                cache: std::mem::take(&mut conversation.cache),
                sampler,
                max_tokens: request.max_tokens,
                stop_tokens: if request.ignore_eos {
                    Vec::new()
                } else {
                    model.eos_token_ids.clone()
                },
                cancel: Some(cancel.clone()),
                prefill_step_size: Some(request.prefill_step_size),
                images: prepared.new_images(),
            };
            let running = self.running.get_or_insert_with(|| Running {
                key: key.clone(),
                batch: Batch::new(),
                runs: HashMap::new(),
            });
            let id = running.batch.join(sequence)?;
            running.runs.insert(
                id,
                LiveRun {
                    request,
                    sink: Box::new(|_| {}),
                    conversation,
                    prepared,
                    text,
                    load_kind,
                    load_ms,
                    accepted_at,
                    admission_wait_ms: (admitted_at - received).as_secs_f64() * 1e3,
                    waited_for,
                    ended: None,
                },
            );
            // The sink moves in last: until here a failure still reaches it.
            if let Some(live) = running.runs.get_mut(&id) {
                live.sink = std::mem::replace(&mut sink, Box::new(|_| {}));
            }
            Ok(())
        }));
        let failure = match joined {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error),
            Err(payload) => Some(RunError::Internal(panic_message(payload.as_ref()))),
        };
        if let Some(error) = failure {
            sink(RunEvent::Failed { error });
            if self.running.as_ref().is_some_and(|r| r.runs.is_empty()) {
                self.running = None;
            }
        }
    }

    /// One step of the batch, and what it gave: tokens to their runs' text,
    /// finished runs concluded.
    fn step(&mut self) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        let Some(resident) = self.models.get(&running.key) else {
            self.end_batch(|_| Some(RunError::Internal("the batch's model is gone".into())));
            return;
        };
        let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| {
            running.batch.step(&resident.model.model)
        }));
        let events = match stepped {
            Ok(Ok(events)) => events,
            Ok(Err(error)) => {
                let error = RunError::from(error);
                self.end_batch(|_| Some(error.clone()));
                return;
            }
            Err(payload) => {
                let error = RunError::Internal(panic_message(payload.as_ref()));
                let key = running.key.clone();
                self.end_batch(|_| Some(error.clone()));
                // The model's state may be half-updated: drop it.
                self.models.remove(&key);
                return;
            }
        };
        let mut finished = Vec::new();
        for event in events {
            match event {
                BatchEvent::Token { id, token, .. } => {
                    let Some(live) = running.runs.get_mut(&id) else {
                        continue;
                    };
                    if live.ended.is_some() {
                        continue;
                    }
                    let sink = &mut live.sink;
                    match live.text.token(token, &mut |event| sink(event)) {
                        Ok(None) | Ok(Some(StopReason::Eos)) => {}
                        Ok(Some(reason)) => {
                            live.ended = Some(reason);
                            match running.batch.leave(id, reason) {
                                Ok(Some(done)) => finished.push(done),
                                // It left at this step anyway; its
                                // `Finished` follows.
                                Ok(None) => {}
                                Err(error) => {
                                    let error = RunError::from(error);
                                    self.end_batch(|_| Some(error.clone()));
                                    return;
                                }
                            }
                        }
                        Err(error) => {
                            live.ended = Some(StopReason::Cancelled);
                            let _ = running.batch.leave(id, StopReason::Cancelled);
                            if let Some(mut live) = running.runs.remove(&id) {
                                (live.sink)(RunEvent::Failed { error });
                            }
                        }
                    }
                }
                BatchEvent::Finished(done) => finished.push(done),
            }
        }
        for done in finished {
            self.conclude(done);
        }
        self.save_retiring();
        if self
            .running
            .as_ref()
            .is_some_and(|r| r.batch.is_empty() && r.runs.is_empty())
        {
            // The batch drained: let its last pass finish before anything
            // runs alone or another model starts.
            wait_for_mlx();
            self.running = None;
        }
    }

    /// A run that left the batch: its text ended, its conversation keeps
    /// its cache, and its client hears the outcome.
    fn conclude(&mut self, done: FinishedSequence) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        let Some(live) = running.runs.remove(&done.id) else {
            return;
        };
        let LiveRun {
            request,
            mut sink,
            mut conversation,
            prepared,
            text,
            load_kind,
            load_ms,
            accepted_at,
            admission_wait_ms,
            waited_for,
            ended,
        } = live;
        let Some(resident) = self.models.get_mut(&running.key) else {
            sink(RunEvent::Failed {
                error: RunError::Internal("the batch's model is gone".into()),
            });
            return;
        };
        let (min_rows, median_rows, max_rows) = BatchShare::rows(&done.batch_sizes);
        let share = BatchShare {
            min_rows,
            median_rows,
            max_rows,
            admission_wait_ms,
            waited_for: waited_for.map(str::to_owned),
            prefill_chunks: done.prefill_chunks,
            interleaved_chunks: done.interleaved_chunks,
        };
        let reason = ended.unwrap_or(done.reason);
        conversation.cache = done.cache;
        let outcome = text
            .end(reason, &mut |event| sink(event))
            .and_then(|ended| {
                stream::conclude(
                    &resident.model,
                    &mut conversation,
                    &request,
                    prepared,
                    ended,
                    done.prefill_snapshot,
                    StepAnatomy::default(),
                    RunSetting {
                        load_kind,
                        load_ms,
                        accepted_at,
                        batch: Some(share),
                    },
                )
            });
        match outcome {
            Ok(mut outcome) => {
                outcome.stats.constraint = done.constraint;
                if let Some(disk) = self.disk.as_mut() {
                    disk.note_prefill(
                        &resident.model.dir,
                        outcome.stats.prefill_tokens,
                        outcome.stats.prefill_ms,
                    );
                }
                match &request.conversation {
                    Some(id) => {
                        resident.conversations.insert(id.clone(), conversation);
                    }
                    None => self.retiring.push((running.key.clone(), conversation)),
                }
                sink(finished_event(outcome));
            }
            Err(error) => sink(RunEvent::Failed { error }),
        }
    }

    /// Ends every run in the batch: each hears `error_of(run)`'s error, or,
    /// where that is `None`, its outcome so far as cancelled.
    fn end_batch(&mut self, error_of: impl Fn(&LiveRun) -> Option<RunError>) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        let ids: Vec<SequenceId> = running.runs.keys().copied().collect();
        let mut cancelled = Vec::new();
        for id in ids {
            let Some(live) = running.runs.get(&id) else {
                continue;
            };
            match error_of(live) {
                Some(error) => {
                    if let Some(mut live) = running.runs.remove(&id) {
                        (live.sink)(RunEvent::Failed { error });
                    }
                }
                None => {
                    if let Ok(Some(done)) = running.batch.leave(id, StopReason::Cancelled) {
                        cancelled.push(done);
                    } else if let Some(mut live) = running.runs.remove(&id) {
                        (live.sink)(RunEvent::Failed {
                            error: RunError::Internal("its batch was stopped".into()),
                        });
                    }
                }
            }
        }
        for done in cancelled {
            self.conclude(done);
        }
        wait_for_mlx();
        self.running = None;
    }
}

/// Saves `conversation`'s cache to the disk when its requests allowed it.
fn save_conversation(disk: &mut DiskPromptCache, model: &LoadedModel, conversation: &Conversation) {
    if !conversation.save_to_disk {
        return;
    }
    let key = disk.key(
        &model.dir,
        conversation.max_kv_size,
        conversation.kv_quantization,
    );
    let tokens = super::stream::tokens_on_disk(&conversation.tokens, &conversation.images);
    disk.save(&key, &model.dir, &tokens, &conversation.cache);
}

/// Conversations a rank other than 0 keeps warm per split model; rank 0's
/// pool decides what its own keep, and a conversation only one side still
/// holds is prefilled whole on every rank (`agree_on_prefix`).
const FOLLOWER_CONVERSATIONS: usize = 16;

/// Every rank of a split model prepares its run from its own conversation
/// cache; this gathers what each would reuse (or why it could not prepare)
/// and holds the ranks to one answer: the same cached positions on every
/// rank, else every rank starts the prompt afresh; a rank that could not
/// prepare it fails the run on every rank.
fn agree_on_prefix(
    model: &LoadedModel,
    conversation: &mut Conversation,
    request: &GenerateRequest,
    prepared: Result<stream::PreparedRun, RunError>,
) -> Result<stream::PreparedRun, RunError> {
    use crate::engine::distributed::compute;
    let group = split_group().map_err(RunError::Distributed)?;
    // Each rank's cached positions and prompt length, or why it could not
    // prepare; with them the time its share took alone (for the records).
    type Said = Result<(usize, usize, Option<compute::ShareCompute>), String>;
    let own: Said = prepared
        .as_ref()
        .map(|p| (p.cached, p.prompt.len(), model.share_compute))
        .map_err(ToString::to_string);
    let said = serde_json::to_vec(&own).map_err(|e| RunError::Internal(e.to_string()))?;
    let parts = orders::gather_bytes(&group, &said).map_err(RunError::Distributed)?;
    let all: Vec<Said> = parts
        .iter()
        .map(|part| {
            serde_json::from_slice(part)
                .unwrap_or_else(|e| Err(format!("its answer was unreadable ({e})")))
        })
        .collect();
    compute::note_ranks(
        all.iter()
            .map(|a| a.as_ref().ok().and_then(|(_, _, timed)| *timed))
            .collect(),
    );
    let prepared = prepared?;
    if let Some((rank, Err(reason))) = all.iter().enumerate().find(|(_, a)| a.is_err()) {
        return Err(RunError::Distributed(format!(
            "rank {rank} could not prepare the prompt: {reason}"
        )));
    }
    let positions = |said: &Said| said.as_ref().ok().map(|(cached, len, _)| (*cached, *len));
    if all.iter().all(|a| positions(a) == positions(&own)) {
        return Ok(prepared);
    }
    *conversation = Conversation::new(model, request.max_kv_size, request.kv_quantization());
    stream::prepare(model, conversation, request, None)
}

/// The conversation `request` continues (taken out of the model's, to be
/// put back when the run succeeds), or a fresh one.
fn take_conversation(resident: &mut Resident, request: &GenerateRequest) -> Conversation {
    let fresh = || {
        Conversation::new(
            &resident.model,
            request.max_kv_size,
            request.kv_quantization(),
        )
    };
    match &request.conversation {
        // A different cache size or quantization cannot continue the old
        // cache.
        Some(id) => match resident.conversations.remove(id) {
            Some(c)
                if c.max_kv_size == request.max_kv_size
                    && c.kv_quantization == request.kv_quantization() =>
            {
                c
            }
            _ => fresh(),
        },
        None => fresh(),
    }
}

/// Whether `request`'s KV cache (its prompt and `max_tokens`, or its
/// bound) fits beside what is resident: within the request's memory budget
/// when it has one, and in the memory the system has left beyond a reserve
/// that keeps it out of critical pressure.
fn fits(models: &HashMap<PathBuf, Resident>, running: &Running, request: &GenerateRequest) -> bool {
    let Some(resident) = models.get(&running.key) else {
        return true;
    };
    let model = &resident.model;
    let prompt = stream::prompt_ids(model, &request.prompt).map_or(0, |p| p.ids.len());
    let need = kv_bytes_for(model, prompt + request.max_tokens, request);
    // What the running sequences will still add: each up to its own end.
    let coming: u64 = running
        .runs
        .values()
        .map(|live| {
            let total = live.prepared.prompt.len() + live.request.max_tokens;
            let now = live.prepared.prompt.len() + live.text.generated();
            kv_bytes_for(model, total, &live.request).saturating_sub(kv_bytes_for(
                model,
                now,
                &live.request,
            ))
        })
        .sum();
    if let Some(budget) = request.memory_budget_bytes {
        let held: u64 = models
            .values()
            .map(|r| {
                r.model.weights_bytes as u64
                    + r.conversations
                        .values()
                        .map(|c| c.kv_cache_bytes() as u64)
                        .sum::<u64>()
            })
            .sum::<u64>()
            + running.batch.kv_cache_bytes() as u64;
        if held + coming + need > budget {
            return false;
        }
    }
    match ondo_os::memory_snapshot() {
        Ok(memory) => {
            if memory.level == ondo_os::PressureLevel::Critical {
                return false;
            }
            // A tenth of the machine's memory stays free for the system
            // and other apps: a batch alone never takes the last of it.
            let reserve = memory.total_bytes / 10;
            coming + need + reserve <= memory.available_bytes
        }
        Err(_) => true,
    }
}
