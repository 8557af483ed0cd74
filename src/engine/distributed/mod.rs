//! One model across several processes or machines (docs/ARCHITECTURE.md,
//! "Several machines"). No transport of Ondo's own: every byte between
//! ranks goes through MLX's distributed backends (`group`), started the
//! way MLX's launcher starts them (`Launch`: the variables `mlx.launch`
//! sets). Before any model is split, the ranks introduce themselves
//! (`handshake`): a rank running another Ondo, another MLX or another
//! snapshot of the model is refused with the difference named.

pub mod compute;
pub mod group;
pub mod handshake;
pub mod link;
pub mod orders;
pub mod pipeline;
pub mod tensor;

pub use group::{Backend, Group};

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// How a model is divided over the ranks: by layers or by heads.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "lowercase")]
pub enum SplitKind {
    /// Each rank holds a contiguous range of the layers and passes the
    /// hidden states on: one small message a step, any family, but the
    /// ranks take turns (`pipeline`).
    Pipeline,
    /// Each rank holds a share of every layer's heads and MLP width and
    /// every rank works on every layer: two sums a layer, so it wants a
    /// fast link (`tensor`). Dense attention families.
    Tensor,
}

impl SplitKind {
    pub fn name(self) -> &'static str {
        match self {
            SplitKind::Pipeline => "pipeline",
            SplitKind::Tensor => "tensor",
        }
    }

    /// How people say it: "by layers", "by heads".
    pub fn described(self) -> &'static str {
        match self {
            SplitKind::Pipeline => "by layers",
            SplitKind::Tensor => "by heads",
        }
    }

    /// `ONDO_SPLIT`'s choice, pipeline when unset.
    pub fn from_env() -> Result<Self, String> {
        let Some(value) = crate::environment::SPLIT.value() else {
            return Ok(SplitKind::Pipeline);
        };
        match value.trim() {
            "pipeline" | "layers" => Ok(SplitKind::Pipeline),
            "tensor" | "heads" => Ok(SplitKind::Tensor),
            other => Err(format!(
                "{}={other}: say pipeline (each rank a range of layers) or tensor (each rank a \
                 share of every layer's heads)",
                crate::environment::SPLIT.name
            )),
        }
    }
}

impl std::fmt::Display for SplitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// This process's part of the model in `dir`, when it joined a group of
/// several ranks to split that model.
pub fn part_of_this_process(dir: &Path) -> Option<crate::family::shards::RankPart> {
    pipeline::joined()
        .filter(|_| is_split_model(dir))
        .map(Launch::part)
}

/// This process's part of a model split over the ranks it joined.
#[derive(Debug)]
pub enum Split {
    Pipeline(pipeline::Stage),
    Tensor(tensor::TensorShards),
}

impl Split {
    /// This process's part of the model of `config` in `dir`, when it
    /// joined a group of several ranks to split that model; `None` for any
    /// other model, and when it runs alone. A model the launch's split
    /// cannot divide is refused with the reason.
    pub fn of_this_process(
        config: &crate::family::config::ModelConfig,
        dir: &Path,
    ) -> Result<Option<Self>, String> {
        let Some(launch) = pipeline::joined() else {
            return Ok(None);
        };
        if !is_split_model(dir) {
            return Ok(None);
        }
        match launch.split {
            SplitKind::Pipeline => Ok(pipeline::Stage::of_launch(
                launch,
                config.num_hidden_layers,
            )?
            .map(Split::Pipeline)),
            SplitKind::Tensor => {
                if let Some(reason) = tensor::refusal(config, launch.size) {
                    return Err(format!("by heads over {} ranks: {reason}", launch.size));
                }
                // MLX keeps the group it made at the join: this returns it
                // at once.
                let group = Group::init(launch.backend)?;
                Ok(Some(Split::Tensor(tensor::TensorShards::new(group))))
            }
        }
    }
}

/// How this process was started as one rank of several: what MLX's
/// launcher (`mlx.launch`) or a person put in the environment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Launch {
    pub backend: Backend,
    pub rank: usize,
    pub size: usize,
    /// The ring backend's addresses, one list per rank ("ip:port").
    pub ring_hosts: Vec<Vec<String>>,
    /// How models are divided over the ranks (`ONDO_SPLIT`, or `--split`).
    pub split: SplitKind,
}

/// The ring backend's hostfile: one list of "ip:port" per rank, as
/// `mlx.launch --backend ring` writes it into `MLX_HOSTFILE`.
pub fn parse_ring_hostfile(text: &str) -> Result<Vec<Vec<String>>, String> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("not JSON ({e}); it lists each rank's \"ip:port\" addresses"))?;
    let ranks = value
        .as_array()
        .ok_or("it must be a list with one entry per rank: [[\"10.0.0.1:5000\"], ...]")?;
    ranks
        .iter()
        .enumerate()
        .map(|(rank, entry)| {
            let addresses: Vec<String> = match entry {
                serde_json::Value::String(one) => vec![one.clone()],
                serde_json::Value::Array(many) => many
                    .iter()
                    .filter_map(|a| a.as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            };
            if addresses.is_empty() || addresses.iter().any(|a| !a.contains(':')) {
                return Err(format!(
                    "rank {rank}'s entry {entry} is not a list of \"ip:port\" addresses"
                ));
            }
            Ok(addresses)
        })
        .collect()
}

impl Launch {
    /// This rank's part of a model split by this launch.
    pub fn part(&self) -> crate::family::shards::RankPart {
        crate::family::shards::RankPart {
            rank: self.rank,
            size: self.size,
            by_layers: self.split == SplitKind::Pipeline,
        }
    }

    /// The launch the environment describes; `None` for a process started
    /// alone (no `MLX_RANK`, no NCCL world).
    pub fn from_env() -> Result<Option<Self>, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let (Some(size), Some(_)) = (var("MLX_WORLD_SIZE"), var("NCCL_HOST_IP")) {
            let size = size
                .trim()
                .parse()
                .map_err(|_| format!("MLX_WORLD_SIZE={size} is not a number of ranks"))?;
            let rank = var("MLX_RANK")
                .ok_or("MLX_RANK is not set: each rank needs its number (mlx.launch sets it)")?;
            let rank = rank
                .trim()
                .parse()
                .map_err(|_| format!("MLX_RANK={rank} is not a rank number"))?;
            return Ok(Some(Self {
                backend: Backend::Nccl,
                rank,
                size,
                ring_hosts: Vec::new(),
                split: SplitKind::from_env()?,
            }));
        }
        let Some(rank) = var("MLX_RANK") else {
            return Ok(None);
        };
        let rank: usize = rank
            .trim()
            .parse()
            .map_err(|_| format!("MLX_RANK={rank} is not a rank number"))?;
        let backend = if var("MLX_IBV_DEVICES").is_some() || var("MLX_JACCL_COORDINATOR").is_some()
        {
            Backend::Jaccl
        } else {
            Backend::Ring
        };
        let Some(hostfile) = var("MLX_HOSTFILE") else {
            return Err(format!(
                "MLX_RANK={rank} is set but MLX_HOSTFILE is not: the {backend} backend needs the \
                 file listing every rank (mlx.launch writes it)"
            ));
        };
        let text = std::fs::read_to_string(&hostfile)
            .map_err(|e| format!("MLX_HOSTFILE {hostfile}: {e}"))?;
        let ring_hosts = if backend == Backend::Ring {
            parse_ring_hostfile(&text).map_err(|e| format!("MLX_HOSTFILE {hostfile}: {e}"))?
        } else {
            Vec::new()
        };
        let size = if ring_hosts.is_empty() {
            serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.as_array().map(Vec::len))
                .unwrap_or(0)
        } else {
            ring_hosts.len()
        };
        if rank >= size {
            return Err(format!(
                "MLX_RANK={rank}, but MLX_HOSTFILE {hostfile} lists {size} ranks (0 to {})",
                size.saturating_sub(1)
            ));
        }
        Ok(Some(Self {
            backend,
            rank,
            size,
            ring_hosts,
            split: SplitKind::from_env()?,
        }))
    }

    /// Where rank `rank` listens, for messages that name it.
    pub fn address_of(&self, rank: usize) -> Option<&str> {
        self.ring_hosts
            .get(rank)
            .and_then(|a| a.first())
            .map(String::as_str)
    }

    /// Joins the other ranks, waiting at most `ONDO_RANK_JOIN_TIMEOUT_S`
    /// (60 s) for all of them to start.
    pub fn join(&self) -> Result<Group, String> {
        let seconds = crate::environment::RANK_JOIN_TIMEOUT_S
            .parsed::<f64>()
            .filter(|s| *s > 0.0)
            .unwrap_or(60.0);
        self.join_within(std::time::Duration::from_secs_f64(seconds))
    }

    /// Joins the other ranks or gives up after `timeout`. MLX blocks until
    /// every rank has connected, so it waits on a thread of its own; one
    /// that never returns is left behind with the process that gives up.
    pub fn join_within(&self, timeout: std::time::Duration) -> Result<Group, String> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let backend = self.backend;
        std::thread::Builder::new()
            .name("ondo-rank-join".into())
            .spawn(move || {
                let _ = sender.send(Group::init(backend));
            })
            .map_err(|e| format!("could not start joining the other ranks: {e}"))?;
        let others = self.size.saturating_sub(1);
        let group = match receiver.recv_timeout(timeout) {
            Ok(Ok(group)) => group,
            Ok(Err(reason)) => {
                return Err(format!(
                    "rank {} could not join the other {others} over MLX's {} backend: {reason}",
                    self.rank, self.backend
                ));
            }
            Err(_) => {
                let listed: Vec<String> = (0..self.size)
                    .map(|r| match self.address_of(r) {
                        Some(address) => format!("rank {r} at {address}"),
                        None => format!("rank {r}"),
                    })
                    .collect();
                return Err(format!(
                    "rank {} waited {:.0} s and not every rank joined ({}): start the same \
                     command on every host (mlx.launch does), with the ports free",
                    self.rank,
                    timeout.as_secs_f64(),
                    listed.join(", ")
                ));
            }
        };
        if group.size() != self.size || group.rank() != self.rank {
            return Err(format!(
                "MLX made this rank {} of {}, the environment says {} of {}",
                group.rank(),
                group.size(),
                self.rank,
                self.size
            ));
        }
        Ok(group)
    }
}

/// What `ondo doctor --distributed` finds: every rank, alike, and how fast
/// they reach each other.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClusterReport {
    pub backend: Backend,
    pub ranks: Vec<handshake::RankIdentity>,
    /// Where each rank listens (the ring backend's first address).
    pub addresses: Vec<Option<String>>,
    /// Rank 0's timings of the links (empty for one rank).
    pub links: Vec<link::LinkTiming>,
}

/// Joins the other ranks as one rank of a split model: the ranks compare
/// what each runs and the snapshot of the model each would load, and from
/// then on every model this process loads is split (`pipeline`).
/// `find_model` names the folder and the weight bytes of this rank's part
/// of it. Returns the model and every rank's description, in rank order.
pub fn join_as_rank<M>(
    launch: &Launch,
    find_model: impl FnOnce() -> Result<(M, u64), String>,
) -> Result<(M, Vec<handshake::RankIdentity>), String>
where
    M: AsRef<std::path::Path>,
{
    let group = launch.join()?;
    // The folder is found once joined: a rank may fetch its share of the
    // model first, and the others wait for it in the introductions, not in
    // the join's time limit. A rank that found none still introduces
    // itself, so the others hear why rather than wait for good.
    let found = find_model();
    let introduced = on_a_stream_of_this_thread(|| {
        introduce(
            &group,
            Some(
                found
                    .as_ref()
                    .map(|(model, _)| model.as_ref())
                    .map_err(String::as_str),
            ),
            found.as_ref().map_or(0, |(_, bytes)| *bytes),
        )
    });
    let (model, _) = found?;
    let ranks = introduced?;
    let model_dir = model.as_ref();
    // A decode step's message and a prefill chunk's, timed once: what the
    // records estimate the time on the links from.
    let timed = |bytes, rounds| {
        link::probe(&group, bytes, rounds)
            .map_err(|e| format!("timing the links failed: {}", e.what()))
    };
    let (small, large) = on_a_stream_of_this_thread(|| {
        Ok::<_, String>((
            timed(link::PROBE_BYTES[0], 5)?,
            timed(link::PROBE_BYTES[1], 3)?,
        ))
    })?;
    let _ = SPLIT_FACTS.set(SplitFacts {
        kind: launch.split,
        backend: launch.backend,
        hosts: ranks.iter().map(|r| r.host.clone()).collect(),
        hop_ms: small.hop_best_ms,
        sum_ms: small.all_sum_best_ms,
        hop_ms_per_mib: per_mib(&small, &large, |t| t.hop_best_ms),
        sum_ms_per_mib: per_mib(&small, &large, |t| t.all_sum_best_ms),
    });
    let _ = SPLIT_MODEL.set(canonical(model_dir));
    let _ = SHARED_SEED.set(ranks.first().map_or(0, |r| r.seed));
    pipeline::set_joined(launch.clone());
    Ok((model, ranks))
}

/// Runs `work` with a CPU stream made on this thread as MLX's default.
/// The join's exchanges run on the thread that joined, not the engine's:
/// MLX's streams belong to the thread that made them (the default ones to
/// the engine's, which used MLX first), and on a GPU evaluating on another
/// thread's stream fails ("There is no Stream(cpu, 1) in current thread").
/// The messages are small and the ring backend moves them through host
/// memory either way.
fn on_a_stream_of_this_thread<T>(work: impl FnOnce() -> T) -> T {
    if group::computes_on_gpu() {
        mlx_rs::with_device(mlx_rs::Device::cpu(), work)
    } else {
        work()
    }
}

/// Rank 0's seed from the introductions (`shared_seed`).
static SHARED_SEED: OnceLock<u64> = OnceLock::new();

/// The seed every rank samples with where a request names none: rank 0's,
/// drawn when the ranks joined. Ranks that sampled with seeds of their own
/// would draw different tokens and feed the model different inputs.
pub fn shared_seed() -> Option<u64> {
    SHARED_SEED.get().copied()
}

/// A seed from the clock, different for every call in practice.
pub fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The model folder the ranks joined to split, canonical.
static SPLIT_MODEL: OnceLock<PathBuf> = OnceLock::new();

fn canonical(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned())
}

/// Whether `dir` is the model this process joined other ranks to split:
/// only that one is split; any other it loads runs here alone.
pub fn is_split_model(dir: &Path) -> bool {
    pipeline::joined().is_some() && SPLIT_MODEL.get().is_some_and(|m| *m == canonical(dir))
}

/// Why the split model can no longer run (a rank stopped, a link failed),
/// once that happened: the ranks cannot be joined again without a restart.
static LOST: Mutex<Option<String>> = Mutex::new(None);

/// Records that the split cannot go on, and why (the first reason stays).
pub fn mark_lost(reason: &str) {
    let mut lost = LOST.lock().unwrap_or_else(|e| e.into_inner());
    lost.get_or_insert_with(|| reason.to_owned());
}

/// Why the split model can no longer run, if it cannot.
pub fn lost() -> Option<String> {
    LOST.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Whether a run of the split model (or its order to the ranks) is under
/// way: MLX can wait forever in a collective whose peer died, so whoever
/// learns of a lost rank asks this before trusting the process to go on.
static SPLIT_RUN_IN_FLIGHT: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Marks a split run under way until it is dropped.
pub struct SplitRunUnderWay(());

impl SplitRunUnderWay {
    pub fn begin() -> Self {
        SPLIT_RUN_IN_FLIGHT.store(true, std::sync::atomic::Ordering::SeqCst);
        Self(())
    }
}

impl Drop for SplitRunUnderWay {
    fn drop(&mut self) {
        SPLIT_RUN_IN_FLIGHT.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

pub fn split_run_in_flight() -> bool {
    SPLIT_RUN_IN_FLIGHT.load(std::sync::atomic::Ordering::SeqCst)
}

/// What this process's split runs share: how the model is divided, over
/// what, among whom, and how fast a decode step's message crossed the
/// links when the ranks joined.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitFacts {
    pub kind: SplitKind,
    pub backend: Backend,
    /// Each rank's host, in rank order.
    pub hosts: Vec<String>,
    /// One hop of an 8 KiB message from rank to rank, and one sum of it
    /// across every rank, in ms: rank 0's fastest of several, what the
    /// link costs without the waits a busy machine adds.
    pub hop_ms: f64,
    pub sum_ms: f64,
    /// What each further MiB of a message adds to a hop and to a sum, in
    /// ms: the slope between the 8 KiB message and a 4 MiB one (a prefill
    /// chunk's size), never below zero.
    pub hop_ms_per_mib: f64,
    pub sum_ms_per_mib: f64,
}

/// The time one more MiB of message adds, from two timings of different
/// sizes (`time` picks which time).
fn per_mib(
    small: &link::LinkTiming,
    large: &link::LinkTiming,
    time: fn(&link::LinkTiming) -> f64,
) -> f64 {
    let mib = large.bytes.saturating_sub(small.bytes) as f64 / (1u64 << 20) as f64;
    if mib <= 0.0 {
        return 0.0;
    }
    ((time(large) - time(small)) / mib).max(0.0)
}

static SPLIT_FACTS: OnceLock<SplitFacts> = OnceLock::new();

/// This process's split, once it joined other ranks to split a model.
pub fn split_facts() -> Option<&'static SplitFacts> {
    SPLIT_FACTS.get()
}

impl SplitFacts {
    /// What one decode step of one sequence moves between the ranks, for a
    /// model of `layers` layers of `hidden` activations of `element_bytes`:
    /// the most bytes any rank sends, and the time on the links estimated
    /// from the join's timings. Split by layers, each rank but rank 0 sends
    /// its hidden state on and every rank gathers rank 0's (N-1 hops and a
    /// gather, which costs about a sum); split by heads, every layer sums
    /// twice (a ring sum sends 2(N-1)/N of the message from each rank).
    pub fn per_decode_step(&self, layers: u64, hidden: u64, element_bytes: u64) -> (u64, f64) {
        self.pass((layers, hidden, element_bytes), 1)
    }

    /// What a prefill of `tokens` prompt tokens moves between the ranks, in
    /// chunks of `chunk` (all but the last token, then that one as the
    /// first step, as the engine runs it): the most bytes any rank sends
    /// over the whole prefill, and their time on the links.
    pub fn per_prefill(&self, shape: (u64, u64, u64), tokens: u64, chunk: u64) -> (u64, f64) {
        let chunked = tokens.saturating_sub(1);
        let chunk = chunk.max(1);
        let mut passes = vec![chunk; (chunked / chunk) as usize];
        if !chunked.is_multiple_of(chunk) {
            passes.push(chunked % chunk);
        }
        if tokens > 0 {
            passes.push(1);
        }
        passes
            .into_iter()
            .map(|rows| self.pass(shape, rows))
            .fold((0, 0.0), |(bytes, ms), (b, t)| (bytes + b, ms + t))
    }

    /// One forward pass of `rows` tokens through a model of `shape`
    /// (layers, hidden width, bytes per activation element): the most
    /// bytes any rank sends, and the time on the links, each message's
    /// estimated as the 8 KiB message's time plus the MiBs beyond it at
    /// the slope the join timed.
    fn pass(&self, shape: (u64, u64, u64), rows: u64) -> (u64, f64) {
        let (layers, hidden, element_bytes) = shape;
        let n = self.hosts.len().max(1) as u64;
        let row = hidden * element_bytes;
        let message = rows * row;
        let beyond = message.saturating_sub(row) as f64 / (1u64 << 20) as f64;
        let hop = self.hop_ms + beyond * self.hop_ms_per_mib;
        let sum = self.sum_ms + beyond * self.sum_ms_per_mib;
        match self.kind {
            SplitKind::Pipeline => (n * message, (n - 1) as f64 * hop + sum),
            SplitKind::Tensor => (
                2 * layers * 2 * (n - 1) * message / n,
                2.0 * layers as f64 * sum,
            ),
        }
    }
}

/// Every rank's description, gathered on every rank; an error naming the
/// first difference that keeps them from running one model together.
fn introduce(
    group: &Group,
    model: Option<Result<&std::path::Path, &str>>,
    share_bytes: u64,
) -> Result<Vec<handshake::RankIdentity>, String> {
    let runtime = crate::metrics::mlx_runtime::MlxRuntime::detect();
    let totals = ondo_os::memory_totals().ok();
    let limit = crate::environment::memory_limit().unwrap_or(u64::MAX);
    // An unreadable folder is described, not returned early: the exchange
    // must complete on every rank for the others to hear which one it is.
    let own = handshake::RankIdentity {
        rank: group.rank(),
        host: ondo_os::host_name(),
        ondo_version: env!("CARGO_PKG_VERSION").to_owned(),
        mlx_version: runtime.mlx_version.clone(),
        backend: runtime.backend.to_string(),
        device: runtime.device_name.clone(),
        memory_bytes: totals.as_ref().map_or(0, |m| m.total_bytes),
        budget_bytes: totals.as_ref().map_or(0, |m| m.available_bytes).min(limit),
        seed: fresh_seed(),
        share_bytes,
        model: model.map(|found| match found {
            Ok(dir) => handshake::model_snapshot(dir),
            Err(reason) => handshake::ModelSnapshot {
                name: "none".into(),
                digest: format!("unreadable: {reason}"),
            },
        }),
    };
    let ranks = handshake::exchange(group, &own)?;
    handshake::check_same(&ranks)?;
    Ok(ranks)
}

/// What to tell a person when a link between the ranks failed mid-run:
/// which ranks (and hosts) the run had, what MLX said, what to do.
pub fn link_lost(ranks: &[handshake::RankIdentity], launch: &Launch, mlx_said: &str) -> String {
    let hosts: Vec<String> = ranks.iter().map(|r| r.host.clone()).collect();
    let whom = other_ranks(launch, &hosts);
    format!(
        "rank {} lost its link to {whom} mid-run ({}): that rank stopped or the network \
         dropped; this rank's memory is released as it ends, start every rank again",
        launch.rank,
        mlx_said.trim()
    )
}

/// The ranks other than this one, with their hosts (in rank order) and
/// addresses: "rank 1 (studio-2, 10.0.0.2:5000)", or "one of ..." when
/// there are several.
pub fn other_ranks(launch: &Launch, hosts: &[String]) -> String {
    let others: Vec<String> = hosts
        .iter()
        .enumerate()
        .filter(|(rank, _)| *rank != launch.rank)
        .map(|(rank, host)| match launch.address_of(rank) {
            Some(address) => format!("rank {rank} ({host}, {address})"),
            None => format!("rank {rank} ({host})"),
        })
        .collect();
    match others.len() {
        0 => "another rank".to_owned(),
        1 => others[0].clone(),
        _ => format!("one of {}", others.join(", ")),
    }
}

/// Whether an MLX error is a distributed backend's (a lost peer, a link
/// that failed), not the model's.
pub fn is_link_failure(message: &str) -> bool {
    ["[ring]", "[jaccl]", "[nccl]", "[mpi]"]
        .iter()
        .any(|backend| message.contains(backend))
}

/// Joins the other ranks, compares what each runs (and, with `model`, the
/// snapshot each would load) and times the links. Every rank calls it;
/// each gets the same ranks, rank 0 the meaningful timings.
pub fn check_cluster(
    launch: &Launch,
    model: Option<&std::path::Path>,
) -> Result<ClusterReport, String> {
    let group = launch.join()?;
    let (ranks, links) = on_a_stream_of_this_thread(|| {
        let ranks = introduce(&group, model.map(Ok), 0)?;
        let links = if group.size() > 1 {
            link::PROBE_BYTES
                .iter()
                .map(|&bytes| link::probe(&group, bytes, 5))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("timing the links failed: {}", e.what()))?
        } else {
            Vec::new()
        };
        Ok::<_, String>((ranks, links))
    })?;
    Ok(ClusterReport {
        backend: launch.backend,
        addresses: (0..launch.size)
            .map(|r| launch.address_of(r).map(str::to_owned))
            .collect(),
        ranks,
        links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_hostfile_lists_each_ranks_addresses() {
        let hosts =
            parse_ring_hostfile(r#"[["10.0.0.1:5000", "10.0.1.1:5001"], ["10.0.0.2:5000"]]"#)
                .unwrap();
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts[0], ["10.0.0.1:5000", "10.0.1.1:5001"]);
        assert_eq!(
            parse_ring_hostfile(r#"["127.0.0.1:1", "127.0.0.1:2"]"#)
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn a_hostfile_that_is_not_the_rings_says_what_it_should_be() {
        let not_json = parse_ring_hostfile("hosts: a, b").unwrap_err();
        assert!(not_json.contains("ip:port"), "{not_json}");
        let no_port = parse_ring_hostfile(r#"[["studio-1"], ["studio-2"]]"#).unwrap_err();
        assert!(no_port.contains("rank 0"), "{no_port}");
        let object = parse_ring_hostfile(r#"{"hosts": []}"#).unwrap_err();
        assert!(object.contains("one entry per rank"), "{object}");
    }

    fn facts(kind: SplitKind) -> SplitFacts {
        SplitFacts {
            kind,
            backend: Backend::Ring,
            hosts: vec!["studio-1".into(), "studio-2".into()],
            hop_ms: 0.1,
            sum_ms: 0.2,
            hop_ms_per_mib: 1.0,
            sum_ms_per_mib: 2.0,
        }
    }

    #[test]
    fn a_prefill_moves_every_chunk_and_the_first_step() {
        // 8 layers, 1024 wide, 2-byte activations: a row is 2 KiB.
        let shape = (8, 1024, 2);
        let pipeline = facts(SplitKind::Pipeline);
        // 1025 tokens: chunks of 512 and 512, then the last token alone.
        let (bytes, ms) = pipeline.per_prefill(shape, 1025, 512);
        assert_eq!(bytes, 2 * 1025 * 2048);
        let chunk_mib = (512.0 * 2048.0 - 2048.0) / (1u64 << 20) as f64;
        let chunk_ms = (0.1 + chunk_mib) + (0.2 + 2.0 * chunk_mib);
        assert!((ms - (2.0 * chunk_ms + 0.3)).abs() < 1e-9, "{ms}");
        // One token is one decode step.
        assert_eq!(
            pipeline.per_prefill(shape, 1, 512),
            pipeline.per_decode_step(8, 1024, 2)
        );
        // By heads every layer sums twice per pass.
        let (bytes, _) = facts(SplitKind::Tensor).per_prefill(shape, 513, 512);
        assert_eq!(bytes, 2 * 8 * 2 * 513 * 2048 / 2);
    }

    #[test]
    fn every_backend_has_mlxs_name() {
        for backend in Backend::ALL {
            assert_eq!(backend.name().parse::<Backend>(), Ok(backend));
        }
        assert!("tcp".parse::<Backend>().unwrap_err().contains("ring"));
    }
}
