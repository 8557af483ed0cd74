//! The prompt cache on disk: a conversation's KV cache that leaves memory
//! (its conversation evicted or replaced, its model unloaded, the process
//! quitting) is written to a folder, and a later request whose tokens
//! start with what a saved cache holds reads it back instead of
//! prefilling those tokens, also after a restart.
//!
//! Layout: `<folder>/<key>/<tokens>.safetensors`, where `key` names the
//! model snapshot and the cache settings (the folder, its config, chat
//! template and weight files as they are, and `max_kv_size`): a cache is
//! only ever read into the model and settings that wrote it. Each file is
//! mlx-lm's prompt-cache layout (`cache::file`) with the token ids it holds
//! in its metadata (`ondo_tokens`) and a checksum of its tensors.
//!
//! Files are written by a thread of their own from bytes the engine thread
//! copied out, so a decode step never waits on the disk; a write goes to a
//! temporary name first and is renamed when whole, so neither this process
//! nor another one sharing the folder reads a half-written file. The folder
//! is kept within a byte budget, least recently used out first (a file's
//! modification time is its last use, which every process sharing the
//! folder sees). A file that cannot be used (cut short, damaged, foreign)
//! is reported once, removed, and the prompt is prefilled; a full disk
//! stops the writing, says so once, and serving goes on.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime};

use sha2::Digest;

use super::cache::{KvQuantization, LayerCache};

/// What a cache key is computed from: the model folder, `max_kv_size`,
/// and a quantized KV cache's bits and group size.
type CacheKeyInputs = (PathBuf, Option<usize>, Option<(i32, i32)>);
use super::cache::file::{self, CacheFileError, EncodedCache, TEMPORARY_SUFFIX};

/// The metadata key with the token ids a file's cache holds.
pub const TOKENS_KEY: &str = "ondo_tokens";
/// The metadata key with the model folder that wrote it (mlx-lm's own
/// `model` key holds the same, for `mlx_lm.generate`).
pub const MODEL_KEY: &str = "model";

/// How the disk cache is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskCacheSettings {
    pub folder: PathBuf,
    /// Most bytes the folder's caches take; the least recently used go
    /// first.
    pub budget_bytes: u64,
    /// Shorter prefixes are not worth a file: reading them back costs
    /// about what prefilling them does.
    pub min_tokens: usize,
}

/// Prefixes shorter than this are not saved or read by default.
pub const DEFAULT_MIN_TOKENS: usize = 256;

/// The settings for a cache in `folder` with `budget_bytes` (`None`: the
/// smaller of 20 GiB and a quarter of `free_bytes`; `Some(0)`: off). `None`
/// when the cache is off (a zero budget, or `ONDO_PROMPT_CACHE=0`).
pub fn settings(
    folder: PathBuf,
    budget_bytes: Option<u64>,
    free_bytes: Option<u64>,
) -> Option<DiskCacheSettings> {
    if crate::environment::PROMPT_CACHE.switch() == Some(false) || budget_bytes == Some(0) {
        return None;
    }
    Some(DiskCacheSettings {
        folder,
        budget_bytes: budget_bytes.unwrap_or_else(|| default_budget(free_bytes)),
        min_tokens: crate::environment::PROMPT_CACHE_MIN_TOKENS
            .parsed()
            .unwrap_or(DEFAULT_MIN_TOKENS),
    })
}

/// The default budget: the smaller of 20 GiB and a quarter of the free
/// space where the folder is.
pub fn default_budget(free_bytes: Option<u64>) -> u64 {
    const CAP: u64 = 20 << 30;
    free_bytes.map_or(CAP, |free| CAP.min(free / 4))
}

/// A saved cache as listed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct SavedPrefix {
    pub path: PathBuf,
    /// The model folder that wrote it.
    pub model_dir: String,
    pub tokens: usize,
    pub bytes: u64,
    /// Seconds since the Unix epoch of its last use.
    pub last_used_unix: u64,
}

/// A file's parsed header, kept while the file stays as it was.
struct Known {
    len: u64,
    modified: SystemTime,
    tokens: Arc<Vec<u32>>,
}

/// A saved cache that a prompt can start from.
pub struct Found {
    path: PathBuf,
    /// Tokens of the prompt it holds.
    pub common: usize,
}

/// The weight of the newest sample in a running mean.
const NEWEST: f64 = 0.5;

fn running_mean(old: Option<f64>, sample: f64) -> f64 {
    old.map_or(sample, |old| old + NEWEST * (sample - old))
}

/// Whether reading `bytes` at `read_bytes_per_ms` to skip prefilling
/// `tokens` at `prefill_tokens_per_ms` is slower than the prefill. On a Mac
/// the read wins by an order of magnitude; on a GPU that prefills tens of
/// thousands of tokens a second it can lose, and then prefilling is the
/// faster way to the first token. Without a measure of either, read: the
/// first read is what measures it.
fn read_is_slower(
    bytes: u64,
    tokens: usize,
    read_bytes_per_ms: Option<f64>,
    prefill_tokens_per_ms: Option<f64>,
) -> bool {
    let (Some(read), Some(prefill)) = (read_bytes_per_ms, prefill_tokens_per_ms) else {
        return false;
    };
    bytes as f64 / read > tokens as f64 / prefill
}

/// A saved cache read back for a prompt.
pub struct Restored {
    pub cache: Vec<LayerCache>,
    /// The token ids it holds, cut to what the prompt shares.
    pub tokens: Vec<u32>,
    pub bytes: u64,
    pub read_ms: f64,
}

/// What the writer thread is asked.
struct WriteJob {
    path: PathBuf,
    encoded: EncodedCache,
    /// Files it makes redundant (their tokens are a prefix of its own).
    superseded: Vec<PathBuf>,
}

/// State the engine thread and the writer share.
struct Shared {
    folder: PathBuf,
    budget_bytes: Mutex<u64>,
    /// Set when the disk ran full: no more writes this process.
    stopped: AtomicBool,
    /// What has been reported, so each thing is said once.
    reported: Mutex<HashSet<String>>,
}

impl Shared {
    fn report_once(&self, what: String, message: impl FnOnce() -> String) {
        if let Ok(mut reported) = self.reported.lock()
            && reported.insert(what)
        {
            eprintln!("ondo: {}", message());
        }
    }
}

/// The prompt cache folder, as the engine thread uses it.
pub struct DiskPromptCache {
    shared: Arc<Shared>,
    min_tokens: usize,
    known: HashMap<PathBuf, Known>,
    /// The key of each model folder with its cache settings.
    keys: HashMap<CacheKeyInputs, String>,
    /// Bytes per millisecond of the reads back, a running mean.
    read_bytes_per_ms: Option<f64>,
    /// Prompt tokens per millisecond of each model folder's prefills of at
    /// least `min_tokens`, a running mean.
    prefill_tokens_per_ms: HashMap<PathBuf, f64>,
    writer: Option<(mpsc::Sender<WriteJob>, std::thread::JoinHandle<()>)>,
}

impl DiskPromptCache {
    pub fn open(settings: &DiskCacheSettings) -> Self {
        let shared = Arc::new(Shared {
            folder: settings.folder.clone(),
            budget_bytes: Mutex::new(settings.budget_bytes),
            stopped: AtomicBool::new(false),
            reported: Mutex::new(HashSet::new()),
        });
        let (sender, jobs) = mpsc::channel::<WriteJob>();
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("ondo-cache-writer".into())
            .spawn(move || {
                for job in jobs {
                    write(&writer_shared, job);
                }
            })
            .ok()
            .map(|handle| (sender, handle));
        Self {
            shared,
            min_tokens: settings.min_tokens.max(1),
            known: HashMap::new(),
            keys: HashMap::new(),
            read_bytes_per_ms: None,
            prefill_tokens_per_ms: HashMap::new(),
            writer,
        }
    }

    /// Notes a prefill of `tokens` in `ms` by `model_dir`'s model, the
    /// speed a restore is weighed against. Short prefills are left out:
    /// their fixed costs would make the model look slower than it is at
    /// the lengths worth a file.
    pub fn note_prefill(&mut self, model_dir: &Path, tokens: usize, ms: f64) {
        if tokens < self.min_tokens || ms <= 0.0 {
            return;
        }
        let sample = tokens as f64 / ms;
        let old = self.prefill_tokens_per_ms.get(model_dir).copied();
        self.prefill_tokens_per_ms
            .insert(model_dir.to_owned(), running_mean(old, sample));
    }

    /// The shortest prefix saved or read.
    pub fn min_tokens(&self) -> usize {
        self.min_tokens
    }

    pub fn folder(&self) -> &Path {
        &self.shared.folder
    }

    pub fn set_budget(&self, budget_bytes: u64) {
        if let Ok(mut budget) = self.shared.budget_bytes.lock() {
            *budget = budget_bytes;
        }
    }

    /// The key of `model_dir`'s caches with `max_kv_size` and the KV
    /// cache quantized by `kv` (or not).
    pub fn key(
        &mut self,
        model_dir: &Path,
        max_kv_size: Option<usize>,
        kv: Option<KvQuantization>,
    ) -> String {
        let held = kv.map(|q| (q.bits, q.group_size));
        self.keys
            .entry((model_dir.to_owned(), max_kv_size, held))
            .or_insert_with(|| cache_key(model_dir, max_kv_size, kv))
            .clone()
    }

    /// The token ids of every whole cache file under `key`, refreshed from
    /// the folder (another process may have written or removed some).
    fn entries(&mut self, key: &str) -> Vec<(PathBuf, Arc<Vec<u32>>)> {
        let folder = self.shared.folder.join(key);
        let Ok(listing) = std::fs::read_dir(&folder) else {
            return Vec::new();
        };
        let mut entries = Vec::new();
        for entry in listing.flatten() {
            let path = entry.path();
            if !is_cache_file(&path) {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if let Some(known) = self.known.get(&path)
                && known.len == meta.len()
                && known.modified == modified
            {
                entries.push((path, known.tokens.clone()));
                continue;
            }
            match file::read_header(&path).map_err(Some).and_then(|header| {
                let tokens = header
                    .user_metadata()
                    .get(TOKENS_KEY)
                    .and_then(|t| parse_tokens(t))
                    .ok_or(None)?;
                Ok(tokens)
            }) {
                Ok(tokens) => {
                    let tokens = Arc::new(tokens);
                    self.known.insert(
                        path.clone(),
                        Known {
                            len: meta.len(),
                            modified,
                            tokens: tokens.clone(),
                        },
                    );
                    entries.push((path, tokens));
                }
                Err(error) => self.discard(&path, error),
            }
        }
        entries
    }

    /// Reports once why `path` is not used and removes it.
    fn discard(&mut self, path: &Path, error: Option<CacheFileError>) {
        self.known.remove(path);
        let _ = std::fs::remove_file(path);
        let reason = error.map_or_else(
            || {
                format!(
                    "{} holds no token ids (Ondo did not write it)",
                    path.display()
                )
            },
            |e| e.to_string(),
        );
        self.shared.report_once(path.display().to_string(), || {
            format!("a saved prompt cache was not used and was removed ({reason}); the prompt is prefilled instead")
        });
    }

    /// The saved cache under `key` sharing the longest prefix with
    /// `prompt` (at most all but its last token), when that prefix is at
    /// least the minimum and longer than `better_than` tokens. With
    /// `trims` false (a model with state layers) only a cache the prompt
    /// starts with as a whole will do: a state cannot go back. A cache
    /// whose read would take longer than prefilling the tokens it adds
    /// (at `model_dir`'s measured speed) is passed over.
    pub fn find(
        &mut self,
        key: &str,
        model_dir: &Path,
        prompt: &[u32],
        better_than: usize,
        trims: bool,
    ) -> Option<Found> {
        let mut best: Option<(Found, u64)> = None;
        for (path, tokens) in self.entries(key) {
            let common = super::stream::reusable_prefix(&tokens, prompt);
            if !trims && common < tokens.len() {
                continue;
            }
            if common >= self.min_tokens
                && common > better_than
                && best.as_ref().is_none_or(|(b, _)| common > b.common)
            {
                let bytes = self.known.get(&path).map_or(0, |k| k.len);
                best = Some((Found { path, common }, bytes));
            }
        }
        let (found, bytes) = best?;
        let prefill = self.prefill_tokens_per_ms.get(model_dir).copied();
        if read_is_slower(
            bytes,
            found.common - better_than,
            self.read_bytes_per_ms,
            prefill,
        ) {
            return None;
        }
        Some(found)
    }

    /// Reads `found` back into caches shaped like `template`, cut to the
    /// tokens the prompt shares; `None` (reported and removed) when the
    /// file cannot be used.
    pub fn restore(&mut self, found: Found, template: &[LayerCache]) -> Option<Restored> {
        let start = Instant::now();
        let decoded = match file::read(&found.path, template, true) {
            Ok(decoded) => decoded,
            Err(error) => {
                self.discard(&found.path, Some(error));
                return None;
            }
        };
        let Some(mut tokens) = decoded
            .metadata
            .get(TOKENS_KEY)
            .and_then(|t| parse_tokens(t))
        else {
            self.discard(&found.path, None);
            return None;
        };
        if tokens.len() != decoded.offset as usize {
            self.discard(
                &found.path,
                Some(CacheFileError::Corrupted {
                    path: found.path.clone(),
                    detail: format!(
                        "it names {} tokens and holds {} positions",
                        tokens.len(),
                        decoded.offset
                    ),
                }),
            );
            return None;
        }
        let mut cache = decoded.layers;
        let drop = (tokens.len() - found.common) as i32;
        if drop > 0 && !cache.iter_mut().all(|layer| layer.trim(drop).is_ok()) {
            return None;
        }
        tokens.truncate(found.common);
        touch(&found.path);
        if let Some(known) = self.known.get_mut(&found.path) {
            known.modified = std::fs::metadata(&found.path)
                .and_then(|m| m.modified())
                .unwrap_or(known.modified);
        }
        let read_ms = start.elapsed().as_secs_f64() * 1e3;
        if read_ms > 0.0 && decoded.bytes > 0 {
            let sample = decoded.bytes as f64 / read_ms;
            self.read_bytes_per_ms = Some(running_mean(self.read_bytes_per_ms, sample));
        }
        Some(Restored {
            cache,
            tokens,
            bytes: decoded.bytes,
            read_ms,
        })
    }

    /// Saves `cache` (holding `tokens`) of `model_dir` under `key`, unless
    /// it is too short, a saved cache already holds these tokens, or the
    /// disk ran full. The copy to the host happens here; the write on the
    /// writer thread.
    pub fn save(&mut self, key: &str, model_dir: &Path, tokens: &[u32], cache: &[LayerCache]) {
        if tokens.len() < self.min_tokens || self.shared.stopped.load(Ordering::Relaxed) {
            return;
        }
        let held = cache.first().map_or(0, LayerCache::offset);
        if held as usize != tokens.len() || cache.iter().any(|l| l.rows() != 1) {
            return;
        }
        let mut superseded = Vec::new();
        for (path, saved) in self.entries(key) {
            if saved.starts_with(tokens) {
                // Already on disk (perhaps with more): it was used now.
                touch(&path);
                return;
            }
            if tokens.starts_with(&saved) {
                superseded.push(path);
            }
        }
        let metadata = BTreeMap::from([
            (MODEL_KEY.to_owned(), model_dir.display().to_string()),
            // mlx_lm.generate reads the tokenizer's settings from here.
            ("tokenizer_config".to_owned(), "{}".to_owned()),
            (TOKENS_KEY.to_owned(), format_tokens(tokens)),
        ]);
        let encoded = match EncodedCache::encode(cache, metadata) {
            Ok(encoded) => encoded,
            Err(error) => {
                self.shared.report_once(format!("encode {error}"), || {
                    format!("a prompt cache could not be saved: {error}")
                });
                return;
            }
        };
        let path = self
            .shared
            .folder
            .join(key)
            .join(format!("{}.safetensors", tokens_digest(tokens)));
        if let Some((sender, _)) = &self.writer {
            let _ = sender.send(WriteJob {
                path,
                encoded,
                superseded,
            });
        }
    }

    /// Waits for the writes asked so far (the process is about to quit).
    pub fn finish_writes(&mut self) {
        if let Some((sender, handle)) = self.writer.take() {
            drop(sender);
            let _ = handle.join();
        }
    }
}

impl Drop for DiskPromptCache {
    fn drop(&mut self) {
        self.finish_writes();
    }
}

fn is_cache_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "safetensors")
        && !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// Marks `path` as used now (its modification time is its last use).
fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::options().append(true).open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}

fn format_tokens(tokens: &[u32]) -> String {
    let mut text = String::with_capacity(tokens.len() * 6);
    for (i, t) in tokens.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&t.to_string());
    }
    text
}

pub(crate) fn parse_tokens(text: &str) -> Option<Vec<u32>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(',').map(|t| t.parse().ok()).collect()
}

fn tokens_digest(tokens: &[u32]) -> String {
    let mut hasher = sha2::Sha256::new();
    for t in tokens {
        hasher.update(t.to_le_bytes());
    }
    hex(&hasher.finalize()[..12])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What names a model snapshot for its caches: the folder, and the files
/// that decide what a cache holds (config, tokenizer and chat template by
/// content, weight files by name, size and modification time), and the
/// cache settings: `max_kv_size`, and the bits and group size of a
/// quantized KV cache (a float cache's key names none, and a cache
/// quantized from another position holds the same positions once
/// quantized, so `start` is not part of it).
pub fn cache_key(
    model_dir: &Path,
    max_kv_size: Option<usize>,
    kv: Option<KvQuantization>,
) -> String {
    let mut hasher = sha2::Sha256::new();
    let dir = std::fs::canonicalize(model_dir).unwrap_or_else(|_| model_dir.to_owned());
    hasher.update(dir.display().to_string().as_bytes());
    for name in [
        "config.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "chat_template.json",
        "tokenizer.json",
    ] {
        hasher.update(name.as_bytes());
        if let Ok(bytes) = std::fs::read(dir.join(name)) {
            hasher.update(&bytes);
        }
    }
    let mut weights: Vec<(String, u64, u128)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            let modified = meta
                .modified()
                .ok()?
                .duration_since(SystemTime::UNIX_EPOCH)
                .ok()?
                .as_nanos();
            Some((
                e.file_name().to_string_lossy().into_owned(),
                meta.len(),
                modified,
            ))
        })
        .collect();
    weights.sort();
    for (name, len, modified) in weights {
        hasher.update(format!("{name}:{len}:{modified};").as_bytes());
    }
    hasher.update(format!("max_kv_size={max_kv_size:?}").as_bytes());
    if let Some(q) = kv {
        hasher.update(format!(";kv_bits={};kv_group_size={}", q.bits, q.group_size).as_bytes());
    }
    hex(&hasher.finalize()[..8])
}

/// Writes `job`, drops what it supersedes, and keeps the folder within
/// its budget.
fn write(shared: &Shared, job: WriteJob) {
    if shared.stopped.load(Ordering::Relaxed) {
        return;
    }
    let budget = shared.budget_bytes.lock().map_or(0, |b| *b);
    if job.encoded.tensor_bytes() > budget {
        return;
    }
    let pause = write_pause();
    let pause = || {
        if let Some(pause) = pause {
            std::thread::sleep(pause);
        }
    };
    match job.encoded.write_atomically(&job.path, &pause) {
        Ok(_) => {
            for old in job.superseded {
                let _ = std::fs::remove_file(old);
            }
            keep_within_budget(&shared.folder, budget, &job.path);
        }
        Err(error) if is_disk_full(&error) => {
            shared.stopped.store(true, Ordering::Relaxed);
            shared.report_once("disk full".into(), || {
                format!(
                    "the disk holding {} is full: Ondo stopped saving prompt caches (serving goes on; free some space, or lower the prompt cache budget in Settings)",
                    shared.folder.display()
                )
            });
        }
        Err(error) => shared.report_once(format!("write {}", error.kind()), || {
            format!(
                "a prompt cache could not be saved to {}: {error}",
                job.path.display()
            )
        }),
    }
}

/// The pause between a write's tensors that a fault test asks for.
fn write_pause() -> Option<Duration> {
    crate::environment::TEST_CACHE_WRITE_PAUSE_MS
        .parsed::<u64>()
        .map(Duration::from_millis)
}

fn is_disk_full(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::StorageFull
        || error.raw_os_error() == Some(28)
        || error.kind() == std::io::ErrorKind::QuotaExceeded
}

/// Temporary files older than this were left by a process that died.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// Every entry of every model's folder under `folder` (the folder holds
/// one folder per cache key, and the files are in those).
fn model_files(folder: &Path) -> impl Iterator<Item = std::fs::DirEntry> {
    std::fs::read_dir(folder)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|model| {
            std::fs::read_dir(model.path())
                .into_iter()
                .flatten()
                .flatten()
        })
}

/// Removes the least recently used cache files until the folder is within
/// `budget`, and temporary files a dead process left.
fn keep_within_budget(folder: &Path, budget: u64, just_written: &Path) {
    let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
    for entry in model_files(folder) {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if path.to_string_lossy().ends_with(TEMPORARY_SUFFIX) {
            if modified.elapsed().is_ok_and(|age| age > STALE_TEMPORARY) {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        if is_cache_file(&path) {
            files.push((modified, meta.len(), path));
        }
    }
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    files.sort_by_key(|f| (f.2 == just_written, f.0));
    for (_, len, path) in files {
        if total <= budget {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

/// Every saved cache under `folder`, most recently used first.
pub fn list(folder: &Path) -> Vec<SavedPrefix> {
    let mut saved = Vec::new();
    for entry in model_files(folder) {
        let path = entry.path();
        if !is_cache_file(&path) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        let Ok(header) = file::read_header(&path) else {
            continue;
        };
        let metadata = header.user_metadata();
        let tokens = metadata.get(TOKENS_KEY).map_or(0, |t| {
            if t.is_empty() {
                0
            } else {
                t.split(',').count()
            }
        });
        saved.push(SavedPrefix {
            path,
            model_dir: metadata.get(MODEL_KEY).cloned().unwrap_or_default(),
            tokens,
            bytes: meta.len(),
            last_used_unix: meta
                .modified()
                .ok()
                .and_then(|m| m.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs()),
        });
    }
    saved.sort_by_key(|s| std::cmp::Reverse(s.last_used_unix));
    saved
}

/// Bytes the folder's files take (temporary ones included).
pub fn folder_bytes(folder: &Path) -> u64 {
    model_files(folder)
        .map(|entry| entry.metadata().map_or(0, |m| m.len()))
        .sum()
}

/// Removes the saved caches of models whose folder is `model_dir` or lies
/// under it (every one when `None`); returns how many files went.
pub fn remove(folder: &Path, model_dir: Option<&Path>) -> usize {
    let target = model_dir.map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.to_owned()));
    let mut removed = 0;
    for saved in list(folder) {
        let matches = target.as_ref().is_none_or(|t| {
            let dir = PathBuf::from(&saved.model_dir);
            let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
            dir.starts_with(t)
        });
        if matches && std::fs::remove_file(&saved.path).is_ok() {
            removed += 1;
        }
    }
    // Temporary files go too when all is cleared, and emptied model
    // folders always.
    if target.is_none() {
        for entry in model_files(folder) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    for model in std::fs::read_dir(folder).into_iter().flatten().flatten() {
        let _ = std::fs::remove_dir(model.path());
    }
    removed
}

/// Writes a note on what the folder is for, once (users find it in their
/// data folder and wonder).
pub fn write_readme(folder: &Path) {
    let path = folder.join("README.txt");
    if path.exists() || std::fs::create_dir_all(folder).is_err() {
        return;
    }
    if let Ok(mut file) = std::fs::File::create(&path) {
        let _ = writeln!(
            file,
            "Ondo's prompt caches: KV caches of long prompts, saved when they left memory so that\n\
             a later prompt starting the same way does not prefill them again. Each file is a\n\
             safetensors prompt cache that mlx_lm.generate --prompt-cache-file also reads.\n\
             Safe to delete (ondo cache rm --all, or Settings > Prompt cache > Clear)."
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cache::LayerCache;
    use mlx_rs::Array;

    fn cache_of(tokens: usize) -> Vec<LayerCache> {
        let mut cache = vec![LayerCache::new(None)];
        let data: Vec<f32> = (0..tokens * 4).map(|v| v as f32).collect();
        let kv = Array::from_slice(&data, &[1, 1, tokens as i32, 4]);
        cache[0].update_and_fetch(&kv, &kv).unwrap();
        cache
    }

    fn open(folder: &Path, budget: u64) -> DiskPromptCache {
        DiskPromptCache::open(&DiskCacheSettings {
            folder: folder.to_owned(),
            budget_bytes: budget,
            min_tokens: 4,
        })
    }

    #[test]
    fn a_saved_prefix_is_found_for_a_longer_prompt_and_read_back_cut_to_it() {
        let folder = tempfile::tempdir().unwrap();
        let model = tempfile::tempdir().unwrap();
        let mut disk = open(folder.path(), 1 << 30);
        let key = disk.key(model.path(), None, None);
        let tokens: Vec<u32> = (100..120).collect();
        disk.save(&key, model.path(), &tokens, &cache_of(20));
        disk.finish_writes();
        let mut disk = open(folder.path(), 1 << 30);
        let mut prompt: Vec<u32> = (100..112).collect();
        prompt.extend([7, 8, 9]);
        let found = disk.find(&key, Path::new("m"), &prompt, 0, true).unwrap();
        assert_eq!(found.common, 12);
        assert!(
            disk.find(&key, Path::new("m"), &prompt, 12, true).is_none(),
            "not better than memory"
        );
        assert!(
            disk.find(&key, Path::new("m"), &prompt, 0, false).is_none(),
            "a state cannot go back"
        );
        let restored = disk.restore(found, &[LayerCache::new(None)]).unwrap();
        assert_eq!(restored.tokens, (100..112).collect::<Vec<u32>>());
        assert_eq!(restored.cache[0].offset(), 12);
        assert!(restored.bytes > 20 * 4 * 4 * 2);
        // Too short a prefix is not worth a file.
        let other: Vec<u32> = vec![1, 2, 3];
        disk.save(&key, model.path(), &other, &cache_of(3));
        disk.finish_writes();
        assert_eq!(list(folder.path()).len(), 1);
    }

    #[test]
    fn a_read_slower_than_the_prefill_it_saves_is_skipped() {
        let folder = tempfile::tempdir().unwrap();
        let model = tempfile::tempdir().unwrap();
        let mut disk = open(folder.path(), 1 << 30);
        let key = disk.key(model.path(), None, None);
        let tokens: Vec<u32> = (100..164).collect();
        disk.save(&key, model.path(), &tokens, &cache_of(64));
        disk.finish_writes();
        let prompt: Vec<u32> = (100..170).collect();
        // No read measured yet: read, which measures it.
        let found = disk.find(&key, model.path(), &prompt, 0, true).unwrap();
        disk.restore(found, &[LayerCache::new(None)]).unwrap();
        // A model that prefilled a billion tokens a millisecond gains
        // nothing from any read; one at a token a second gains from this
        // one. Prefills shorter than the cache's minimum say nothing.
        let fast = Path::new("fast");
        let slow = Path::new("slow");
        disk.note_prefill(fast, 2, 1e-12);
        assert!(disk.find(&key, fast, &prompt, 0, true).is_some());
        disk.note_prefill(fast, 1_000_000_000, 1.0);
        assert!(
            disk.find(&key, fast, &prompt, 0, true).is_none(),
            "prefilling is faster than reading"
        );
        disk.note_prefill(slow, 1_000, 1_000_000.0);
        assert!(disk.find(&key, slow, &prompt, 0, true).is_some());
    }

    #[test]
    fn the_least_recently_used_leave_first_and_a_longer_cache_replaces_its_prefix() {
        let folder = tempfile::tempdir().unwrap();
        let model = tempfile::tempdir().unwrap();
        // Room for two 64-token caches (2 KiB of tensors and a header each).
        let mut disk = open(folder.path(), 6000);
        let key = disk.key(model.path(), None, None);
        let a: Vec<u32> = (0..64).collect();
        let b: Vec<u32> = (1000..1064).collect();
        let c: Vec<u32> = (2000..2064).collect();
        disk.save(&key, model.path(), &a, &cache_of(64));
        disk.finish_writes();
        disk = open(folder.path(), 6000);
        std::thread::sleep(Duration::from_millis(20));
        disk.save(&key, model.path(), &b, &cache_of(64));
        disk.finish_writes();
        disk = open(folder.path(), 6000);
        std::thread::sleep(Duration::from_millis(20));
        // Using a marks it recent: b is the oldest when c comes.
        let found = disk
            .find(
                &key,
                Path::new("m"),
                &[a.clone(), vec![5]].concat(),
                0,
                true,
            )
            .unwrap();
        disk.restore(found, &[LayerCache::new(None)]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        disk.save(&key, model.path(), &c, &cache_of(64));
        disk.finish_writes();
        let left: Vec<usize> = list(folder.path()).iter().map(|s| s.tokens).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        let mut disk = open(folder.path(), 6000);
        assert!(
            disk.find(
                &key,
                Path::new("m"),
                &[b.clone(), vec![5]].concat(),
                0,
                true
            )
            .is_none()
        );
        assert!(
            disk.find(
                &key,
                Path::new("m"),
                &[c.clone(), vec![5]].concat(),
                0,
                true
            )
            .is_some()
        );
        // A longer cache of the same start replaces the shorter one.
        let longer: Vec<u32> = (0..80).collect();
        let mut disk = open(folder.path(), 1 << 20);
        disk.save(&key, model.path(), &longer, &cache_of(80));
        disk.finish_writes();
        let tokens: Vec<usize> = list(folder.path()).iter().map(|s| s.tokens).collect();
        assert_eq!(
            tokens.len(),
            2,
            "the 64-token prefix of the new file went: {tokens:?}"
        );
        assert!(tokens.contains(&80), "{tokens:?}");
    }

    #[test]
    fn a_damaged_file_is_reported_removed_and_not_used() {
        let folder = tempfile::tempdir().unwrap();
        let model = tempfile::tempdir().unwrap();
        let mut disk = open(folder.path(), 1 << 30);
        let key = disk.key(model.path(), None, None);
        let tokens: Vec<u32> = (0..32).collect();
        disk.save(&key, model.path(), &tokens, &cache_of(32));
        disk.finish_writes();
        let path = list(folder.path())[0].path.clone();
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() - 5;
        bytes[at] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let mut disk = open(folder.path(), 1 << 30);
        let found = disk
            .find(
                &key,
                Path::new("m"),
                &(0..40).collect::<Vec<u32>>(),
                0,
                true,
            )
            .unwrap();
        assert!(disk.restore(found, &[LayerCache::new(None)]).is_none());
        assert!(!path.exists(), "the damaged file is removed");
        // A file another program put there is never used either.
        std::fs::write(
            folder.path().join(&key).join("x.safetensors"),
            b"\x08\0\0\0\0\0\0\0{}      ",
        )
        .unwrap();
        assert!(
            disk.find(
                &key,
                Path::new("m"),
                &(0..40).collect::<Vec<u32>>(),
                0,
                true
            )
            .is_none()
        );
        assert!(list(folder.path()).is_empty());
    }
}
