//! `ondo serve`: the local server in the foreground, with a line per
//! request, until Ctrl-C (which lets the requests in flight finish).

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::api::{LocalServer, ServerConfig};
use crate::app_settings::{AppSettings, DEFAULT_PORT};
use crate::cli::error::CliError;
use crate::paths::DataDirs;
use crate::resolve::{available_models, model_folders};
use crate::session::{PoolSettings, SessionPool};
use crate::store::Store;

#[derive(Debug, Args)]
#[command(after_help = "\
Any OpenAI, Anthropic or Ollama client works: point its base URL at the server.
  curl http://127.0.0.1:11480/v1/chat/completions \\
    -d '{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}'
  curl http://127.0.0.1:11480/v1/messages \\
    -d '{\"model\": \"tiny\", \"max_tokens\": 64, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}'
  curl http://127.0.0.1:11480/api/chat \\
    -d '{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}'
Models are named by repo id (as `ondo ls` lists them) or tiny. Every
request is recorded: `ondo runs --kind api`. Fields a request leaves out take
the app's generation defaults (Settings).

A model too large for this machine is served split over several: name it and
the machines, and Ondo starts the other ranks over ssh; this machine serves,
the others compute their share of every request. Requests for the split model
run one at a time, each machine keeping the conversations' caches for its
share; other models serve here as usual. If a rank stops, the split model is
unloaded and its requests answer why; restart to run it again.
  ondo serve ./Llama-3.3-70B-Instruct-4bit --hostfile hosts.json --split tensor")]
pub struct ServeArgs {
    /// Load this model now, before the first request asks for it; with
    /// --hostfile (or under mlx.launch), the model to split over the ranks.
    #[arg(value_name = "MODEL")]
    model: Option<String>,
    /// Serve MODEL split over these machines (rank 0, this one, first): a
    /// JSON list of host names, or mlx.launch's hostfile. See `ondo run
    /// --help` for the format; the same Ondo must be at the same path on
    /// each.
    #[arg(long, value_name = "FILE", requires = "model")]
    hostfile: Option<std::path::PathBuf>,
    /// How the ranks divide MODEL: by layers (`pipeline`, the default) or
    /// by heads (`tensor`, wants a fast link). Same as ONDO_SPLIT.
    #[arg(long, value_enum, value_name = "HOW")]
    split: Option<crate::engine::distributed::SplitKind>,
    /// The address to listen on: 127.0.0.1 serves this machine only; any
    /// other (0.0.0.0: every network) needs an API key.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port (0: any free one).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Ask every request for `Authorization: Bearer KEY` or `x-api-key:
    /// KEY` (default: the ONDO_API_KEY environment variable, if set).
    #[arg(long)]
    api_key: Option<String>,
    /// Let web pages from this origin call the server, e.g.
    /// https://app.example (repeatable; `*` allows any).
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// Requests that may wait for the engine at once; more get 503.
    #[arg(long, default_value_t = ServerConfig::default().max_waiting)]
    max_waiting: usize,
    /// The longest a request waits for the engine, in seconds; longer gets 503.
    #[arg(long, default_value_t = ServerConfig::default().wait_limit_s)]
    wait_limit: u64,
    /// Most requests decoded together in one batch (default: the app's
    /// saved setting, else 8). Each step reads the weights once for all of
    /// them; 1 serves one request at a time.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    max_batch: Option<u64>,
    /// Connections open at once; the next waits to be accepted until one closes.
    #[arg(long, default_value_t = ServerConfig::default().max_connections)]
    max_connections: usize,
    /// Seconds to wait for a client that sends nothing (a request's head on
    /// a new or idle connection, the rest of a body) before closing its
    /// connection.
    #[arg(long, value_name = "SECONDS", default_value_t = ServerConfig::default().idle_timeout_s)]
    idle_timeout: u64,
    /// Do not open the history at all: requests are not recorded (`ondo
    /// runs`), and the app's saved settings (models folder, generation
    /// defaults, keep-alive) are not read; the defaults apply.
    #[arg(long)]
    no_history: bool,
    /// Stop serving when stdin closes, as Ctrl-C does: for a program that
    /// starts `ondo serve` as its child (the app, for a split model), so
    /// the server ends when that program does.
    #[arg(long)]
    until_stdin_closes: bool,
}

pub fn run(args: ServeArgs) -> Result<ExitCode, CliError> {
    let mut config = ServerConfig {
        host: args.host,
        port: args.port,
        api_key: args
            .api_key
            .or_else(|| crate::environment::API_KEY.value())
            .filter(|k| !k.trim().is_empty()),
        allowed_origins: args.allowed_origins,
        max_waiting: args.max_waiting,
        wait_limit_s: args.wait_limit,
        max_batch: args.max_batch.map(|n| n as usize),
        max_connections: args.max_connections,
        idle_timeout_s: args.idle_timeout,
        named_folders: Vec::new(),
    };
    // Refuse an open address before starting the engine.
    config.socket_address()?;
    // Listen for Ctrl-C before any other thread starts (they inherit how
    // signals are handled) and before anyone can know the address.
    let mut stop_signals = StopSignals::listen().map_err(|e| e.to_string())?;
    // Started as one rank of several: every rank runs this command; rank 0
    // serves, the others follow its orders.
    let (launch, started) = super::launch::this_launch(
        args.hostfile.as_deref(),
        args.split,
        super::launch::WhenARankFails::LoseTheSplit,
    )?;
    let launch = launch.filter(|launch| launch.size > 1);
    if let Some(launch) = &launch {
        let Some(model) = args.model.as_deref() else {
            return Err(CliError::new(
                crate::ErrorKind::InvalidSettings,
                format!(
                    "rank {} of a split server needs the MODEL to split: every rank runs the \
                     same `ondo serve MODEL` command",
                    launch.rank
                ),
            ));
        };
        if launch.rank != 0 {
            return follow(launch, model, stop_signals);
        }
    }
    // Rank 0 only: the other ranks' stdin is not their starter's.
    if args.until_stdin_closes {
        stop_signals.also_when_stdin_closes();
    }
    let dirs = DataDirs::from_env();
    let store = if args.no_history {
        None
    } else {
        match Store::open_default(&dirs.data_dir) {
            Ok(store) => Some(store),
            Err(err) => {
                eprintln!("note: requests will not be recorded: {err}");
                None
            }
        }
    };
    // The app's keep-alive and memory budget apply here too.
    let saved = store.as_ref().map(AppSettings::load).unwrap_or_default();
    let pool_settings = if store.is_some() {
        saved.pool_settings()
    } else {
        PoolSettings::default()
    };
    let keyed = config.api_key.is_some();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let pool = SessionPool::start(pool_settings, store)?;
    pool.set_prompt_cache(saved.prompt_cache_settings(&dirs))?;
    if let Some(name) = &args.model {
        let model = match &launch {
            Some(launch) => {
                let model = join_split(&pool, launch, name)?;
                crate::engine::distributed::orders::start_serving();
                model
            }
            None => crate::resolve::resolve_model(&pool, name, crate::resolve::NamedBy::Local)
                .map_err(|e| CliError::from(e).about(name))?,
        };
        // A folder is named for clients by its name (they may not name
        // paths); a repo id is theirs already.
        if std::path::Path::new(name).is_dir() {
            let folder = model
                .dir
                .canonicalize()
                .unwrap_or_else(|_| model.dir.clone());
            let client_name = folder
                .file_name()
                .map_or_else(|| name.clone(), |n| n.to_string_lossy().into_owned());
            eprintln!("clients name {name} as \"{client_name}\"");
            config.named_folders.push(crate::resolve::ResolvedModel {
                name: client_name,
                dir: folder,
            });
        }
        pool.preload(&model.dir, &model.name)
            .map_err(|e| CliError::from(e).about(name))?;
        if let Some(resident) = pool.engine_resident()?.into_iter().find(|r| {
            std::fs::canonicalize(&r.model_dir).ok() == std::fs::canonicalize(&model.dir).ok()
        }) {
            eprintln!(
                "loaded {} in {:.0} ms ({} of weights here)",
                model.name,
                resident.load_ms,
                crate::units::human_bytes(resident.weights_bytes)
            );
        }
    }
    let pool = Arc::new(pool);
    let mut server = LocalServer::start(
        pool,
        config,
        Arc::new(|log: &crate::api::RequestLog| eprintln!("{}", log.line())),
    )?;
    let url = server.url();
    println!(
        "Ondo is serving at {url} (OpenAI API and Responses under /v1, Anthropic under \
         /v1/messages, Ollama API under /api)"
    );
    let _ = std::io::stdout().flush();
    eprintln!(
        "models: {}{}\nCtrl-C stops after answering the requests in flight",
        available_models(&model_folders(&saved, &dirs)).join(", "),
        if keyed {
            "\nevery request needs the header 'Authorization: Bearer <key>'"
        } else {
            ""
        }
    );

    runtime.block_on(stop_signals.next());
    server.stop_accepting();
    let status = server.status();
    let in_flight = status.waiting + usize::from(status.in_flight.is_some());
    if in_flight > 0 {
        eprintln!("stopping after {in_flight} request(s) in flight; Ctrl-C again cancels them");
    }
    runtime.block_on(async {
        let mut cancelled = false;
        while !server.is_stopped() {
            tokio::select! {
                _ = stop_signals.next(), if !cancelled => {
                    server.cancel_in_flight();
                    cancelled = true;
                }
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    });
    eprintln!(
        "stopped; {} generation(s) served",
        server.status().requests_served
    );
    server.stop();
    // The engine told the other ranks to finish as it stopped; they end
    // with that.
    if let Some(started) = started {
        started.finish(Duration::from_secs(30));
    }
    Ok(ExitCode::SUCCESS)
}

/// Joins the other ranks to split the model `name` names (each rank
/// fetching its share where it lacks it), and prints (rank 0) who holds
/// what and whether each share fits, at the default context.
fn join_split(
    pool: &SessionPool,
    launch: &crate::engine::distributed::Launch,
    name: &str,
) -> Result<crate::resolve::ResolvedModel, CliError> {
    let (model, ranks) = super::launch::join_with_model(pool, name, launch)?;
    let dir = model.dir.as_path();
    let whole = crate::hub::sizing::facts_from_folder(dir)
        .ok()
        .map(|facts| {
            facts.estimate_held_in(
                crate::hub::fit::DEFAULT_CONTEXT_TOKENS,
                crate::hub::sizing::MachineMemory::read(None),
                None,
            )
        });
    let plan = super::run::split_plan(dir, launch, &ranks, whole, false).map_err(CliError::from)?;
    if launch.rank == 0 {
        eprintln!("{plan}");
    }
    Ok(model)
}

/// A rank other than 0: joins, loads its share and runs rank 0's orders
/// until rank 0 stops serving.
fn follow(
    launch: &crate::engine::distributed::Launch,
    name: &str,
    mut stop_signals: StopSignals,
) -> Result<ExitCode, CliError> {
    // Stopped by a signal of its own, it ends at once; rank 0 hears of it
    // from the link, and its other models serve on.
    let rank = launch.rank;
    std::thread::spawn(move || {
        if let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() {
            runtime.block_on(stop_signals.next());
            eprintln!("rank {rank} stopped by a signal");
            std::process::exit(130);
        }
    });
    end_with_parent(rank);
    let pool = SessionPool::start(PoolSettings::default(), None)?;
    let model = join_split(&pool, launch, name)?;
    pool.engine_follow(&model.dir).map_err(|e| {
        CliError::new(
            crate::ErrorKind::Distributed,
            format!("rank {} stopped following rank 0: {e}", launch.rank),
        )
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Ends this rank when the process that started it is gone (rank 0 here,
/// or the ssh session from it): a rank waiting in a gather for an order
/// from a rank 0 that died would otherwise wait for good, holding its
/// share of the model.
fn end_with_parent(rank: usize) {
    #[cfg(unix)]
    {
        // SAFETY: getppid has no preconditions and cannot fail.
        let parent = unsafe { libc::getppid() };
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(500));
                // SAFETY: as above.
                if unsafe { libc::getppid() } != parent {
                    eprintln!(
                        "rank {rank}: the process that started it is gone (rank 0 stopped); ending"
                    );
                    std::process::exit(1);
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = rank;
}

/// Ctrl-C, or a polite kill (SIGTERM) where there is one.
///
/// On Unix the two signals are blocked in every thread and taken by one
/// thread with `sigwait`, rather than caught by a handler: MLX's CPU backend
/// compiles kernels through `system()`, which ignores SIGINT in the whole
/// process while the compiler runs, and a handler would lose a Ctrl-C that
/// came then. A blocked signal waits instead, whatever its disposition.
struct StopSignals {
    received: tokio::sync::mpsc::UnboundedReceiver<()>,
    /// For stops that are not signals (stdin closing).
    sender: tokio::sync::mpsc::UnboundedSender<()>,
}

impl StopSignals {
    /// Starts listening; call it before starting other threads.
    fn listen() -> std::io::Result<Self> {
        let (sender, received) = tokio::sync::mpsc::unbounded_channel();
        let kept = sender.clone();
        #[cfg(unix)]
        {
            let signals = block_stop_signals()?;
            std::thread::Builder::new()
                .name("ondo-signals".into())
                .spawn(move || {
                    loop {
                        let mut signal = 0;
                        // SAFETY: `signals` is an initialised set, and
                        // `signal` a valid place for the answer.
                        let waited = unsafe { libc::sigwait(&signals, &mut signal) };
                        if waited == 0 && sender.send(()).is_err() {
                            break;
                        }
                    }
                })?;
        }
        #[cfg(not(unix))]
        {
            std::thread::Builder::new()
                .name("ondo-signals".into())
                .spawn(move || {
                    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    while runtime.block_on(tokio::signal::ctrl_c()).is_ok() {
                        if sender.send(()).is_err() {
                            break;
                        }
                    }
                })?;
        }
        Ok(Self {
            received,
            sender: kept,
        })
    }

    /// Also stops when stdin reaches its end: the program that started
    /// this server as its child ended, or closed it to stop it.
    fn also_when_stdin_closes(&self) {
        let sender = self.sender.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            let _ = sender.send(());
        });
    }

    async fn next(&mut self) {
        // The sender lives as long as the process: no end to wait for.
        let _ = self.received.recv().await;
    }
}

/// Blocks SIGINT and SIGTERM in this thread (and so in every thread it
/// starts from now on); returns the set.
#[cfg(unix)]
fn block_stop_signals() -> std::io::Result<libc::sigset_t> {
    let mut signals = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: the set is initialised by sigemptyset before anything reads
    // it; pthread_sigmask only changes this thread's mask.
    unsafe {
        libc::sigemptyset(signals.as_mut_ptr());
        libc::sigaddset(signals.as_mut_ptr(), libc::SIGINT);
        libc::sigaddset(signals.as_mut_ptr(), libc::SIGTERM);
        let failed = libc::pthread_sigmask(libc::SIG_BLOCK, signals.as_ptr(), std::ptr::null_mut());
        if failed != 0 {
            return Err(std::io::Error::from_raw_os_error(failed));
        }
        Ok(signals.assume_init())
    }
}
