//! The session pool: models kept warm on purpose. A loaded model stays
//! resident for a keep-alive time after its last use (or forever), several
//! at once within a memory budget, the least recently used evicted first;
//! conversations keep their KV caches. Under memory pressure the pool gives
//! memory back (caches first, then idle models). Every run is recorded with
//! the memory it saw, and every load, hit, eviction and unload with its reason.

pub mod chat;
pub mod prompt_cache;
pub mod record;
pub mod roofline;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ondo_os::{PressureLevel, PressureSampler};
use serde::{Deserialize, Serialize};

use crate::engine::embed::{EmbedOutcome, EmbedRequest};
use crate::engine::stream::RunOutcome;
use crate::engine::thread::EventDelivery;
use crate::engine::{CancelToken, EngineHandle, GenerateRequest, RunError, RunEvent};
use crate::run_kinds::LoadKind;
use crate::store::{MemorySample, PoolEvent, Provenance, RunRecord, Store, now_rfc3339};
use record::{MemoryDuringRun, RunContext};

/// How long an idle model stays loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum KeepAlive {
    For(Duration),
    Forever,
}

impl KeepAlive {
    pub const DEFAULT: KeepAlive = KeepAlive::For(Duration::from_secs(10 * 60));
}

/// The pool's policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PoolSettings {
    pub keep_alive: KeepAlive,
    /// Most bytes of weights and KV caches kept resident; `None`: no bound
    /// beyond memory pressure.
    pub memory_budget_bytes: Option<u64>,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            keep_alive: KeepAlive::DEFAULT,
            memory_budget_bytes: None,
        }
    }
}

/// A resident model as the pool sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PooledModel {
    pub model_id: String,
    pub model_dir: PathBuf,
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    pub idle_ms: u64,
    /// When keep-alive will unload it, if it stays idle; `None`: never.
    pub expires_in_ms: Option<u64>,
    pub busy: bool,
}

struct Entry {
    model_id: String,
    model_dir: PathBuf,
    weights_bytes: u64,
    kv_cache_bytes: u64,
    last_used: Instant,
    busy: usize,
    /// A keep-alive of this model's own (a client asked for it with a
    /// request); `None`: the pool's.
    keep_alive: Option<KeepAlive>,
}

impl Entry {
    fn keep_alive(&self, pool_default: KeepAlive) -> KeepAlive {
        self.keep_alive.unwrap_or(pool_default)
    }
}

/// Where the pool reads the pressure level (the sampler; tests pass their own).
pub type PressureSource = Box<dyn Fn() -> PressureLevel + Send + Sync>;

struct Shared {
    engine: EngineHandle,
    settings: Mutex<PoolSettings>,
    models: Mutex<HashMap<PathBuf, Entry>>,
    events: Mutex<VecDeque<PoolEvent>>,
    store: Option<Mutex<Store>>,
    sampler: PressureSampler,
    pressure: PressureSource,
    last_level: Mutex<PressureLevel>,
    last_store_error: Mutex<Option<String>>,
    stop: (Mutex<bool>, Condvar),
}

/// Sampling rates: a run's timeline at 4 Hz, slowly when nothing runs.
const SAMPLE_WHILE_RUNNING: Duration = Duration::from_millis(250);
const SAMPLE_WHILE_IDLE: Duration = Duration::from_secs(5);
/// Pool events kept in memory for the UI (all are in the store).
const RECENT_EVENTS: usize = 200;

/// A pool of warm models over one engine.
pub struct SessionPool {
    shared: Arc<Shared>,
    reaper: Option<JoinHandle<()>>,
}

impl SessionPool {
    /// Starts the engine thread and a pool over it that records into `store`
    /// (when given) and reacts to the system's memory pressure. The pool is
    /// the one way into the engine: every run goes through `run`, so every
    /// run is recorded the same way (a cold start is never mistaken for warm).
    pub fn start(settings: PoolSettings, store: Option<Store>) -> Result<Self, RunError> {
        Self::start_with_pressure_source(settings, store, Box::new(system_pressure_level))
    }

    /// As `start`, with the pressure level read from `pressure` instead of
    /// the system (tests exercise the pool's reactions, and keep a busy
    /// machine's real pressure out of tests that are about something else).
    pub fn start_with_pressure_source(
        settings: PoolSettings,
        store: Option<Store>,
        pressure: PressureSource,
    ) -> Result<Self, RunError> {
        let engine = EngineHandle::spawn()?;
        let sampler = PressureSampler::start(SAMPLE_WHILE_IDLE);
        Ok(Self::build(engine, settings, store, sampler, pressure))
    }

    fn build(
        engine: EngineHandle,
        settings: PoolSettings,
        store: Option<Store>,
        sampler: PressureSampler,
        pressure: PressureSource,
    ) -> Self {
        let shared = Arc::new(Shared {
            engine,
            settings: Mutex::new(settings),
            models: Mutex::new(HashMap::new()),
            events: Mutex::new(VecDeque::new()),
            store: store.map(Mutex::new),
            sampler,
            pressure,
            last_level: Mutex::new(PressureLevel::Normal),
            last_store_error: Mutex::new(None),
            stop: (Mutex::new(false), Condvar::new()),
        });
        let reaper = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ondo-pool".into())
                .spawn(move || reap(&shared))
                .ok()
        };
        Self { shared, reaper }
    }

    /// Runs `work` on the engine thread between requests (MLX is not
    /// thread-safe): self-tests, writing synthetic models. Generation goes
    /// through `run` instead, so that it is recorded.
    pub fn call<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, RunError> {
        self.shared.engine.call(work)
    }

    /// Where and with what this process runs (asked of MLX once).
    pub fn provenance(&self) -> &'static Provenance {
        record::provenance(&self.shared.engine)
    }

    /// The device MLX computes on (asked once), which names the memory
    /// bandwidth measured on it.
    pub fn device_name(&self) -> &'static str {
        record::device_name(&self.shared.engine)
    }

    /// The models the engine holds now, as it describes them (type,
    /// quantization, weights, load time).
    pub fn engine_resident(&self) -> Result<Vec<crate::engine::thread::ResidentModel>, RunError> {
        self.shared.engine.resident()
    }

    /// On a rank other than 0 of a split server: runs rank 0's orders
    /// until rank 0 finishes (`Engine::follow`).
    pub fn engine_follow(&self, model_dir: &Path) -> Result<(), String> {
        self.shared.engine.follow(model_dir)
    }

    pub fn settings(&self) -> PoolSettings {
        *lock(&self.shared.settings)
    }

    /// New settings apply at once (a shorter keep-alive can unload now).
    pub fn set_settings(&self, settings: PoolSettings) {
        *lock(&self.shared.settings) = settings;
        let (_, wake) = &self.shared.stop;
        wake.notify_all();
    }

    /// Runs one request through the engine, keeping its model warm, and
    /// records it. `on_event` hears the engine's events as they happen.
    pub fn run(
        &self,
        request: GenerateRequest,
        context: RunContext,
        cancel: CancelToken,
        on_event: impl FnMut(&RunEvent),
    ) -> Result<(RunOutcome, RunRecord), RunError> {
        let delivery = EventDelivery::Caller(Box::new(on_event));
        self.shared.run(request, context, cancel, delivery)
    }

    /// As `run`, with `on_event` called on the engine thread as each event
    /// happens, for a listener that hands every token on to another thread
    /// anyway (the local server): one thread hop fewer per token. It must
    /// be quick, since the engine waits for it.
    pub fn run_on_engine_thread(
        &self,
        request: GenerateRequest,
        context: RunContext,
        cancel: CancelToken,
        on_event: impl FnMut(&RunEvent) + Send + 'static,
    ) -> Result<(RunOutcome, RunRecord), RunError> {
        let delivery = EventDelivery::EngineThread(Box::new(on_event));
        self.shared.run(request, context, cancel, delivery)
    }

    /// Embeds through the engine, keeping the model warm like a chat
    /// model's, and records the run (its kind from `context`, normally
    /// `embed`).
    pub fn embed(
        &self,
        request: EmbedRequest,
        context: RunContext,
    ) -> Result<(EmbedOutcome, RunRecord), RunError> {
        self.shared.embed(request, context)
    }

    /// Unloads a model now (the user asked); true if it was resident.
    pub fn unload(&self, model_dir: &Path) -> Result<bool, RunError> {
        self.shared.unload(&model_key(model_dir), "user")
    }

    /// Loads a model without generating (a client asked to have it warm),
    /// within the memory budget like a run's load. Returns whether it was
    /// loaded now (false: it was resident already).
    pub fn preload(&self, model_dir: &Path, model_id: &str) -> Result<bool, RunError> {
        let key = model_key(model_dir);
        if let Some(entry) = lock(&self.shared.models).get_mut(&key) {
            entry.last_used = Instant::now();
            return Ok(false);
        }
        self.shared.make_room(weights_on_disk(&key), &key)?;
        let loaded = self.shared.engine.load(&key)?;
        lock(&self.shared.models)
            .entry(key)
            .or_insert_with(|| Entry {
                model_id: model_id.to_owned(),
                model_dir: loaded.model_dir.clone(),
                weights_bytes: loaded.weights_bytes,
                kv_cache_bytes: loaded.kv_cache_bytes,
                last_used: Instant::now(),
                busy: 0,
                keep_alive: None,
            });
        self.shared.note(
            "load",
            model_id,
            "preload asked",
            Some(loaded.weights_bytes),
        );
        Ok(true)
    }

    /// Gives a resident model a keep-alive of its own (a client of the
    /// local server asks with each request), or back the pool's (`None`).
    /// A zero keep-alive unloads it as soon as no run uses it: now, if none
    /// does. Returns false when the model is not resident.
    pub fn keep_model_alive(
        &self,
        model_dir: &Path,
        keep_alive: Option<KeepAlive>,
    ) -> Result<bool, RunError> {
        let key = model_key(model_dir);
        let unload_now = {
            let mut models = lock(&self.shared.models);
            let Some(entry) = models.get_mut(&key) else {
                return Ok(false);
            };
            entry.keep_alive = keep_alive;
            entry.busy == 0 && keep_alive == Some(KeepAlive::For(Duration::ZERO))
        };
        if unload_now {
            self.shared.unload(&key, "keep-alive 0 asked by a client")?;
        } else {
            // A shorter time may already have passed.
            self.shared.expire_idle();
        }
        Ok(true)
    }

    /// The resident models, most recently used first.
    pub fn resident(&self) -> Vec<PooledModel> {
        let keep_alive = self.settings().keep_alive;
        let models = lock(&self.shared.models);
        let mut all: Vec<PooledModel> = models
            .values()
            .map(|e| {
                let idle = e.last_used.elapsed();
                PooledModel {
                    model_id: e.model_id.clone(),
                    model_dir: e.model_dir.clone(),
                    weights_bytes: e.weights_bytes,
                    kv_cache_bytes: e.kv_cache_bytes,
                    idle_ms: idle.as_millis() as u64,
                    expires_in_ms: match e.keep_alive(keep_alive) {
                        KeepAlive::Forever => None,
                        KeepAlive::For(d) => Some(d.saturating_sub(idle).as_millis() as u64),
                    },
                    busy: e.busy > 0,
                }
            })
            .collect();
        all.sort_by_key(|m| m.idle_ms);
        all
    }

    /// What the pool did recently, oldest first.
    pub fn events(&self) -> Vec<PoolEvent> {
        lock(&self.shared.events).iter().cloned().collect()
    }

    /// The last failure to write to the store, if any (runs still work).
    pub fn last_store_error(&self) -> Option<String> {
        lock(&self.shared.last_store_error).clone()
    }

    /// Runs the keep-alive and pressure checks now (the background thread
    /// does this every few hundred milliseconds).
    pub fn tick(&self) {
        self.shared.tick();
    }

    /// Sets up the prompt cache on disk (`None`: none): conversations that
    /// leave memory are saved there and read back for prompts that start
    /// the same way (`AppSettings::prompt_cache_settings` makes them).
    pub fn set_prompt_cache(
        &self,
        settings: Option<prompt_cache::DiskCacheSettings>,
    ) -> Result<(), RunError> {
        self.shared.engine.set_disk_cache(settings)
    }

    /// Forgets a conversation's KV cache (the next turn prefills it all).
    pub fn forget_conversation(&self, id: &str) -> Result<(), RunError> {
        self.shared.engine.forget_conversation(id)
    }

    /// Runs `work` with the store, if there is one.
    pub fn with_store<T>(&self, work: impl FnOnce(&mut Store) -> T) -> Option<T> {
        self.shared.store.as_ref().map(|s| work(&mut lock(s)))
    }

    /// Records a run that happened outside the engine: a request to another
    /// program's server, timed by Ondo as its client. `work` runs while the
    /// pressure sampler watches as closely as during Ondo's own runs (the
    /// server usually shares this machine's memory), and the record it
    /// returns gets the pressure and swap seen and is written with that
    /// memory timeline, like every other run.
    pub fn record_outside_run<E>(
        &self,
        work: impl FnOnce() -> Result<RunRecord, E>,
    ) -> Result<RunRecord, E> {
        let shared = &self.shared;
        shared.sampler.set_interval(SAMPLE_WHILE_RUNNING);
        let started = Instant::now();
        let started_unix_ms = unix_ms();
        let before = ondo_os::memory_snapshot().ok();
        let result = work();
        let after = ondo_os::memory_snapshot().ok();
        if lock(&shared.models).values().all(|e| e.busy == 0) {
            shared.sampler.set_interval(SAMPLE_WHILE_IDLE);
        }
        let mut record = result?;
        let memory = shared.memory_during(started, started_unix_ms, before, after);
        record.pressure_start = memory.pressure_start;
        record.pressure_max = memory.pressure_max;
        record.pressure_end = memory.pressure_end;
        record.swap_delta_bytes = memory.swap_delta_bytes;
        if let Some(store) = &shared.store
            && let Err(err) = lock(store).insert_run(&record, &memory.timeline)
        {
            *lock(&shared.last_store_error) = Some(err.to_string());
        }
        Ok(record)
    }

    /// The latest system memory sample.
    pub fn memory_now(&self) -> Option<ondo_os::MemorySnapshot> {
        self.shared
            .sampler
            .latest()
            .or_else(|| ondo_os::memory_snapshot().ok())
    }
}

impl Drop for SessionPool {
    fn drop(&mut self) {
        let (stopped, wake) = &self.shared.stop;
        *lock(stopped) = true;
        wake.notify_all();
        if let Some(reaper) = self.reaper.take() {
            let _ = reaper.join();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take the pool down with it.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn model_key(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned())
}

/// The weight files' size: what loading will add, known before loading.
fn weights_on_disk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// The system's memory pressure now: the pool's pressure source unless
/// its starter passes another.
pub fn system_pressure_level() -> PressureLevel {
    ondo_os::memory_snapshot()
        .map(|s| s.level)
        .unwrap_or(PressureLevel::Unknown)
}

fn level_name(level: PressureLevel) -> String {
    serde_json::to_value(level)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

/// The background thread: checks keep-alive and pressure until the pool drops.
fn reap(shared: &Shared) {
    let (stopped, wake) = &shared.stop;
    let mut guard = lock(stopped);
    while !*guard {
        let interval = match lock(&shared.settings).keep_alive {
            KeepAlive::For(d) => (d / 4).clamp(Duration::from_millis(20), Duration::from_secs(1)),
            KeepAlive::Forever => Duration::from_secs(1),
        };
        guard = wake
            .wait_timeout(guard, interval)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        if *guard {
            break;
        }
        drop(guard);
        shared.tick();
        guard = lock(stopped);
    }
}

impl Shared {
    fn note(&self, action: &str, model_id: &str, reason: &str, bytes: Option<u64>) {
        let event = PoolEvent {
            at: now_rfc3339(),
            action: action.to_owned(),
            model_id: model_id.to_owned(),
            reason: reason.to_owned(),
            bytes,
        };
        if let Some(store) = &self.store
            && let Err(err) = lock(store).insert_pool_event(&event)
        {
            *lock(&self.last_store_error) = Some(err.to_string());
        }
        let mut events = lock(&self.events);
        if events.len() == RECENT_EVENTS {
            events.pop_front();
        }
        events.push_back(event);
    }

    fn run(
        &self,
        mut request: GenerateRequest,
        mut context: RunContext,
        cancel: CancelToken,
        delivery: EventDelivery<'_>,
    ) -> Result<(RunOutcome, RunRecord), RunError> {
        // A batch admits a sequence only while weights and caches stay
        // within the pool's budget.
        request.memory_budget_bytes = lock(&self.settings).memory_budget_bytes;
        if context.conversation_id.is_none() {
            context.conversation_id = request.conversation.clone();
        }
        let key = model_key(&request.model_dir);
        let was_resident = self.begin_use(&key, &context)?;
        self.sampler.set_interval(SAMPLE_WHILE_RUNNING);
        let started = Instant::now();
        let started_unix_ms = unix_ms();
        let before = ondo_os::memory_snapshot().ok();
        let result = self
            .engine
            .generate_blocking_with(request.clone(), cancel, delivery);
        let after = ondo_os::memory_snapshot().ok();
        // A model kept for no time at all (a client's keep-alive 0) goes as
        // soon as its last run ends, not at the next tick.
        self.end_use(&key, &context);
        let outcome = result?;
        if outcome.stats.load_kind == LoadKind::Cold {
            self.note(
                "load",
                &context.model_id,
                if was_resident {
                    "reloaded"
                } else {
                    "first use"
                },
                Some(outcome.stats.weights_bytes),
            );
        }

        let memory = self.memory_during(started, started_unix_ms, before, after);
        let provenance = record::provenance(&self.engine);
        let device = record::device_name(&self.engine);
        let bandwidth = self
            .store
            .as_ref()
            .and_then(|s| roofline::stored_bandwidth_gbps(&lock(s), &provenance.backend, device));
        let (mut record, timeline) =
            record::record_from_stats(&outcome.stats, &context, provenance, memory, bandwidth);
        record.max_tokens = request.max_tokens as u64;
        if let Some(store) = &self.store {
            let mut store = lock(store);
            if let (Some(id), Some(title)) = (&context.conversation_id, &context.conversation_title)
                && let Err(err) = store.upsert_conversation(id, &context.model_id, title)
            {
                *lock(&self.last_store_error) = Some(err.to_string());
            }
            if let Err(err) = store.insert_run(&record, &timeline) {
                *lock(&self.last_store_error) = Some(err.to_string());
            }
        }
        Ok((outcome, record))
    }

    fn embed(
        &self,
        request: EmbedRequest,
        context: RunContext,
    ) -> Result<(EmbedOutcome, RunRecord), RunError> {
        let key = model_key(&request.model_dir);
        let was_resident = self.begin_use(&key, &context)?;
        self.sampler.set_interval(SAMPLE_WHILE_RUNNING);
        let started = Instant::now();
        let started_unix_ms = unix_ms();
        let before = ondo_os::memory_snapshot().ok();
        let result = self.engine.embed(request);
        let after = ondo_os::memory_snapshot().ok();
        self.end_use(&key, &context);
        let outcome = result?;
        self.finish(
            &outcome.stats,
            &context,
            was_resident,
            started,
            started_unix_ms,
            before,
            after,
        )
        .map(|record| (outcome, record))
    }

    /// Marks `key` busy (making room for it when it is not resident);
    /// whether it was resident.
    fn begin_use(&self, key: &Path, context: &RunContext) -> Result<bool, RunError> {
        let was_resident = match lock(&self.models).get_mut(key) {
            Some(entry) => {
                entry.busy += 1;
                true
            }
            None => false,
        };
        if was_resident {
            self.note("hit", &context.model_id, "warm", None);
        } else {
            self.make_room(weights_on_disk(key), key)?;
        }
        Ok(was_resident)
    }

    /// Keeps the entry of `key` (or makes it) as the engine now holds it,
    /// used now and no longer busy for this run.
    fn end_use(&self, key: &Path, context: &RunContext) {
        let resident = self.engine.resident().unwrap_or_default();
        let now_resident = resident.iter().find(|r| model_key(&r.model_dir) == key);
        {
            let mut models = lock(&self.models);
            match now_resident {
                Some(r) => {
                    let entry = models.entry(key.to_owned()).or_insert_with(|| Entry {
                        model_id: context.model_id.clone(),
                        model_dir: r.model_dir.clone(),
                        weights_bytes: r.weights_bytes,
                        kv_cache_bytes: 0,
                        last_used: Instant::now(),
                        busy: 0,
                        keep_alive: None,
                    });
                    entry.weights_bytes = r.weights_bytes;
                    entry.kv_cache_bytes = r.kv_cache_bytes;
                    entry.last_used = Instant::now();
                    entry.busy = entry.busy.saturating_sub(1);
                }
                None => {
                    models.remove(key);
                }
            }
            if models.values().all(|e| e.busy == 0) {
                self.sampler.set_interval(SAMPLE_WHILE_IDLE);
            }
        }
        self.expire_idle();
    }

    /// Notes a cold load and writes the run's record.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        stats: &crate::engine::RunStats,
        context: &RunContext,
        was_resident: bool,
        started: Instant,
        started_unix_ms: u64,
        before: Option<ondo_os::MemorySnapshot>,
        after: Option<ondo_os::MemorySnapshot>,
    ) -> Result<RunRecord, RunError> {
        if stats.load_kind == LoadKind::Cold {
            self.note(
                "load",
                &context.model_id,
                if was_resident {
                    "reloaded"
                } else {
                    "first use"
                },
                Some(stats.weights_bytes),
            );
        }
        let memory = self.memory_during(started, started_unix_ms, before, after);
        let provenance = record::provenance(&self.engine);
        let (record, timeline) =
            record::record_from_stats(stats, context, provenance, memory, None);
        if let Some(store) = &self.store
            && let Err(err) = lock(store).insert_run(&record, &timeline)
        {
            *lock(&self.last_store_error) = Some(err.to_string());
        }
        Ok(record)
    }

    /// The run's memory: pressure at start, worst and end, swap growth, and
    /// the sampled timeline (the samples taken during it plus both ends).
    fn memory_during(
        &self,
        started: Instant,
        started_unix_ms: u64,
        before: Option<ondo_os::MemorySnapshot>,
        after: Option<ondo_os::MemorySnapshot>,
    ) -> MemoryDuringRun {
        let mut snapshots: Vec<ondo_os::MemorySnapshot> = before.iter().cloned().collect();
        snapshots.extend(self.sampler.since(started_unix_ms));
        snapshots.extend(after.iter().cloned());
        let level = |s: Option<&ondo_os::MemorySnapshot>| {
            level_name(s.map_or(PressureLevel::Unknown, |s| s.level))
        };
        let worst = snapshots
            .iter()
            .map(|s| s.level)
            .fold(PressureLevel::Unknown, PressureLevel::worst);
        let _ = started;
        let timeline: Vec<MemorySample> = snapshots
            .iter()
            .map(|s| MemorySample {
                t_ms: s.taken_at_unix_ms.saturating_sub(started_unix_ms) as f64,
                level: level_name(s.level),
                used_bytes: s.used_bytes,
                app_bytes: s.app_bytes,
                wired_bytes: s.wired_bytes,
                compressed_bytes: s.compressed_bytes,
                swap_used_bytes: s.swap_used_bytes,
                footprint_bytes: s.process_footprint_bytes,
            })
            .collect();
        MemoryDuringRun {
            pressure_start: level(before.as_ref()),
            pressure_max: level_name(worst),
            pressure_end: level(after.as_ref()),
            swap_delta_bytes: match (&before, &after) {
                (Some(b), Some(a)) => a.swap_used_bytes as i64 - b.swap_used_bytes as i64,
                _ => 0,
            },
            footprint_bytes: after.as_ref().map_or(0, |a| a.process_footprint_bytes),
            timeline,
        }
    }

    /// Evicts least recently used idle models until `incoming` more bytes fit
    /// in the budget.
    fn make_room(&self, incoming: u64, for_key: &Path) -> Result<(), RunError> {
        let Some(budget) = lock(&self.settings).memory_budget_bytes else {
            return Ok(());
        };
        loop {
            let victim = {
                let models = lock(&self.models);
                let used: u64 = models
                    .values()
                    .map(|e| e.weights_bytes + e.kv_cache_bytes)
                    .sum();
                if used + incoming <= budget {
                    return Ok(());
                }
                models
                    .iter()
                    .filter(|(k, e)| e.busy == 0 && k.as_path() != for_key)
                    .min_by_key(|(_, e)| e.last_used)
                    .map(|(k, _)| k.clone())
            };
            match victim {
                Some(key) => {
                    self.unload(&key, "memory budget")?;
                }
                // Everything left is in use: load anyway, the budget is a goal.
                None => return Ok(()),
            }
        }
    }

    fn unload(&self, key: &Path, reason: &str) -> Result<bool, RunError> {
        // The event is noted before the engine lets go, so that whoever sees
        // the model gone from `resident` also finds why in `events`.
        let entry = lock(&self.models).remove(key);
        if let Some(entry) = entry {
            self.note(
                "unload",
                &entry.model_id,
                reason,
                Some(entry.weights_bytes + entry.kv_cache_bytes),
            );
        }
        self.engine.unload(key)
    }

    /// The models no run is using, least recently used first: the order in
    /// which the pool gives memory back.
    fn idle_least_recent_first(&self) -> Vec<(PathBuf, String)> {
        let models = lock(&self.models);
        let mut idle: Vec<(&PathBuf, &Entry)> =
            models.iter().filter(|(_, e)| e.busy == 0).collect();
        idle.sort_by_key(|(_, e)| e.last_used);
        idle.into_iter()
            .map(|(k, e)| (k.clone(), e.model_id.clone()))
            .collect()
    }

    /// Keep-alive: idle models past their time go.
    fn expire_idle(&self) {
        let pool_default = lock(&self.settings).keep_alive;
        let expired: Vec<PathBuf> = lock(&self.models)
            .iter()
            .filter(|(_, e)| {
                e.busy == 0
                    && match e.keep_alive(pool_default) {
                        KeepAlive::For(keep_alive) => e.last_used.elapsed() >= keep_alive,
                        KeepAlive::Forever => false,
                    }
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            let _ = self.unload(&key, "keep-alive expired");
        }
    }

    fn tick(&self) {
        self.expire_idle();
        // Pressure: act once each time the level gets worse.
        let level = (self.pressure)();
        let previous = std::mem::replace(&mut *lock(&self.last_level), level);
        if PressureLevel::worst(level, previous) == previous {
            return;
        }
        match level {
            PressureLevel::Warning => {
                for (key, model_id) in self.idle_least_recent_first() {
                    if let Ok(freed) = self.engine.drop_conversations(Some(&key)) {
                        if let Some(e) = lock(&self.models).get_mut(&key) {
                            e.kv_cache_bytes = 0;
                        }
                        self.note("trim_caches", &model_id, "pressure warning", Some(freed));
                    }
                }
            }
            PressureLevel::Critical => {
                for (key, _) in self.idle_least_recent_first() {
                    let _ = self.unload(&key, "pressure critical");
                }
                if let Ok(freed) = self.engine.clear_buffer_cache() {
                    self.note("clear_mlx_cache", "", "pressure critical", Some(freed));
                }
            }
            PressureLevel::Normal | PressureLevel::Unknown => {}
        }
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
