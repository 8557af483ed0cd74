//! The engine thread: the one place MLX objects live (MLX is not
//! thread-safe). Clients hold a cloneable `EngineHandle` and send plain
//! requests; each request brings its own event sink and cancellation token.
//! The thread keeps loaded models resident and conversations' caches warm
//! until told to let them go; a failed or panicking request does not stop it.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::Instant;

use super::load::LoadedModel;
use super::request::{CancelToken, EventSink, GenerateRequest, RunError, RunEvent};
use super::stream::{self, Conversation};
use crate::run_kinds::LoadKind;

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
    /// Other MLX work (self-tests, writing synthetic models) that must not
    /// run beside the engine's.
    Call(Box<dyn FnOnce() + Send>),
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

    /// Queues a generation; its events go to `sink` on the engine thread.
    /// When the engine is gone the sink hears `Failed` at once.
    pub fn generate(&self, request: GenerateRequest, sink: EventSink, cancel: CancelToken) {
        let command = Command::Generate {
            request: Box::new(request),
            sink,
            cancel,
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

#[derive(Default)]
struct EngineThread {
    models: HashMap<PathBuf, Resident>,
}

/// Folders are compared by their canonical path, so `./m` and `/abs/m` are
/// the same resident model.
fn model_key(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned())
}

/// Blocks until the default stream has no queued work.
fn wait_for_mlx() {
    // SAFETY: a plain C call without arguments; MLX is only used from this
    // thread.
    unsafe {
        mlx_sys::mlx_synchronize_default();
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

impl EngineThread {
    fn serve(mut self, commands: mpsc::Receiver<Command>) {
        for command in commands {
            match command {
                Command::Generate {
                    request,
                    mut sink,
                    cancel,
                } => {
                    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        self.generate(&request, &cancel, &mut sink)
                    }));
                    // A pipelined run leaves its last step queued. Let it
                    // finish before the client hears the end: the next
                    // request then starts on an idle MLX, and a client that
                    // exits right away never exits under running work.
                    wait_for_mlx();
                    let event = match result {
                        Ok(Ok(outcome)) => RunEvent::Finished {
                            text: outcome.text,
                            reasoning: outcome.reasoning,
                            tool_calls: outcome.tool_calls,
                            raw_text: outcome.raw_text,
                            token_ids: outcome.token_ids,
                            stats: Box::new(outcome.stats),
                            anatomy: outcome.anatomy,
                        },
                        Ok(Err(error)) => RunEvent::Failed { error },
                        Err(payload) => {
                            // The model's state may be half-updated: drop it.
                            self.models.remove(&model_key(&request.model_dir));
                            RunEvent::Failed {
                                error: RunError::Internal(panic_message(payload.as_ref())),
                            }
                        }
                    };
                    sink(event);
                }
                Command::Load { model_dir, reply } => {
                    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        self.ensure_loaded(&model_dir).map(|(_, key)| key)
                    }))
                    .unwrap_or_else(|p| Err(RunError::Internal(panic_message(p.as_ref()))))
                    .map(|key| self.describe(&key));
                    let _ = reply.send(result.and_then(|d| d.ok_or(RunError::EngineStopped)));
                }
                Command::Unload { model_dir, reply } => {
                    let removed = self.models.remove(&model_key(&model_dir)).is_some();
                    if removed {
                        let _ = mlx_rs::memory::clear_cache();
                    }
                    let _ = reply.send(removed);
                }
                Command::ForgetConversation { id } => {
                    for resident in self.models.values_mut() {
                        resident.conversations.remove(&id);
                    }
                }
                Command::DropConversations { model_dir, reply } => {
                    let key = model_dir.as_deref().map(model_key);
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
                    all.sort_by(|a, b| a.model_dir.cmp(&b.model_dir));
                    let _ = reply.send(all);
                }
            }
        }
        // Leave nothing running behind the arrays (and perhaps the process).
        wait_for_mlx();
        self.models.clear();
    }

    fn describe(&self, key: &Path) -> Option<ResidentModel> {
        self.models.get(key).map(|r| ResidentModel {
            model_dir: r.model.dir.clone(),
            model_type: r.model.model_type.clone(),
            quantization: r.model.quantization_label(),
            weights_bytes: r.model.weights_bytes as u64,
            load_ms: r.load_ms,
            conversations: r.conversations.len(),
            kv_cache_bytes: r
                .conversations
                .values()
                .map(|c| c.kv_cache_bytes() as u64)
                .sum(),
        })
    }

    /// Loads `dir` unless resident; returns (cold or warm, key).
    fn ensure_loaded(&mut self, dir: &Path) -> Result<((LoadKind, f64), PathBuf), RunError> {
        let key = model_key(dir);
        if self.models.contains_key(&key) {
            return Ok(((LoadKind::Warm, 0.0), key));
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

    fn generate(
        &mut self,
        request: &GenerateRequest,
        cancel: &CancelToken,
        sink: &mut EventSink,
    ) -> Result<stream::RunOutcome, RunError> {
        // Peak memory is per request, so a cold run's peak includes the load.
        mlx_rs::memory::reset_peak_memory()?;
        let ((load_kind, load_ms), key) = self.ensure_loaded(&request.model_dir)?;
        let accepted_at = Instant::now();
        let resident = self
            .models
            .get_mut(&key)
            .ok_or_else(|| RunError::Internal("a loaded model vanished".into()))?;
        let model = &resident.model;
        let fresh = || Conversation::new(model, request.max_kv_size);
        let mut conversation = match &request.conversation {
            // A different cache size cannot continue the old cache.
            Some(id) => match resident.conversations.remove(id) {
                Some(c) if c.max_kv_size == request.max_kv_size => c,
                _ => fresh(),
            },
            None => fresh(),
        };
        let outcome = stream::run(
            model,
            &mut conversation,
            request,
            load_kind,
            load_ms,
            accepted_at,
            cancel,
            &mut |event| sink(event),
        );
        // A failed turn leaves the cache in an unknown state: drop it.
        if let (Ok(_), Some(id)) = (&outcome, &request.conversation) {
            resident.conversations.insert(id.clone(), conversation);
        }
        outcome
    }
}
