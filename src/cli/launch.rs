//! `--hostfile`: Ondo starting the other ranks of a split run itself, for
//! those without MLX's Python launcher. It does what `mlx.launch --backend
//! ring` does: gives every rank an address, writes the ring's hostfile,
//! starts the same command on every host (over ssh, or as a process here
//! for this machine) with `MLX_RANK` and `MLX_HOSTFILE` set, and runs rank
//! 0 in this process. The other ranks' words reach this terminal prefixed
//! with their rank; one that stops with an error ends the run here too.

use std::io::{BufRead, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::ErrorKind;
use crate::cli::error::CliError;
use crate::engine::distributed::{Backend, Launch, SplitKind};

/// The port the first remote rank listens on, the next one up for each
/// rank after it (mlx.launch's default start).
const FIRST_REMOTE_PORT: u16 = 32323;

/// One host of a launch hostfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// What to ssh to.
    pub ssh: String,
    /// The address the other ranks reach it at, when it is not `ssh`.
    pub ip: Option<String>,
}

impl Host {
    /// Whether this is the machine Ondo runs on (`here`, its host name in
    /// lower case): started as a process, no ssh.
    fn is_here(&self, here: &str) -> bool {
        let name = self.ssh.trim().to_ascii_lowercase();
        matches!(name.as_str(), "localhost" | "127.0.0.1" | "::1")
            || name == here
            || name.strip_suffix(".local") == Some(here)
    }
}

/// This machine's host name in lower case, as `Host::is_here` compares it.
fn here() -> String {
    ondo_os::host_name().to_ascii_lowercase()
}

/// A launch hostfile, as mlx.launch reads one (`[{"ssh": "studio-2",
/// "ips": ["10.0.0.2"]}, ...]`) or as a plain list of host names
/// (`["studio-1.local", "studio-2.local"]`); one entry per rank, rank 0
/// first.
pub fn parse_hostfile(text: &str) -> Result<Vec<Host>, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "not JSON ({e}): list one host per rank, like [\"studio-1.local\", \"studio-2.local\"]"
        )
    })?;
    let entries = value
        .as_array()
        .filter(|entries| entries.len() >= 2)
        .ok_or("it must list two hosts or more, one per rank, rank 0 first")?;
    entries
        .iter()
        .enumerate()
        .map(|(rank, entry)| match entry {
            serde_json::Value::String(name) if !name.trim().is_empty() => Ok(Host {
                ssh: name.trim().to_owned(),
                ip: None,
            }),
            serde_json::Value::Object(fields) => {
                let ssh = fields
                    .get("ssh")
                    .and_then(|s| s.as_str())
                    .filter(|s| !s.trim().is_empty())
                    .ok_or(format!("rank {rank}'s entry has no \"ssh\" host name"))?;
                let ip = fields
                    .get("ips")
                    .and_then(|ips| ips.as_array())
                    .and_then(|ips| ips.first())
                    .and_then(|ip| ip.as_str())
                    .map(str::to_owned);
                Ok(Host {
                    ssh: ssh.trim().to_owned(),
                    ip,
                })
            }
            other => Err(format!(
                "rank {rank}'s entry {other} is neither a host name nor {{\"ssh\": ..., \"ips\": [...]}}"
            )),
        })
        .collect()
}

/// A free port on this machine (found by binding port 0; freed before the
/// rank binds it).
fn free_port() -> Result<u16, String> {
    TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port here for a rank: {e}"))
}

/// Every rank's ring address: 127.0.0.1 when every host is this one, else
/// each host's IPv4 address as the others reach it (MLX's ring takes
/// addresses, not names).
fn ring_addresses(hosts: &[Host], here: &str) -> Result<Vec<String>, String> {
    let all_here = hosts.iter().all(|h| h.is_here(here));
    let mut remote_port = FIRST_REMOTE_PORT;
    let mut addresses = Vec::new();
    for (rank, host) in hosts.iter().enumerate() {
        let port = if host.is_here(here) {
            free_port()?
        } else {
            remote_port += 1;
            remote_port - 1
        };
        let ip = if all_here {
            "127.0.0.1".to_owned()
        } else if let Some(ip) = &host.ip {
            ip.clone()
        } else if host.is_here(here) {
            // The address this machine reaches the first other host from.
            let other = hosts
                .iter()
                .find(|h| !h.is_here(here))
                .map(|h| h.ip.clone().map_or_else(|| ipv4_of(h), Ok));
            let other = other.unwrap_or_else(|| Ok("127.0.0.1".to_owned()))?;
            local_address_towards(&other)?
        } else {
            ipv4_of(host).map_err(|e| format!("rank {rank}: {e}"))?
        };
        addresses.push(format!("{ip}:{port}"));
    }
    Ok(addresses)
}

/// `host`'s IPv4 address, looked up by name.
fn ipv4_of(host: &Host) -> Result<String, String> {
    use std::net::ToSocketAddrs;
    let found = (host.ssh.as_str(), 0)
        .to_socket_addrs()
        .map_err(|e| e.to_string())
        .and_then(|mut all| {
            all.find(|a| a.is_ipv4())
                .ok_or_else(|| "no IPv4 address".to_owned())
        });
    found.map(|a| a.ip().to_string()).map_err(|e| {
        format!(
            "could not find {}'s address ({e}): name it in the hostfile as {{\"ssh\": \"{}\", \
             \"ips\": [\"10.0.0.2\"]}}",
            host.ssh, host.ssh
        )
    })
}

/// This machine's address on the way to `other` (no packet is sent: a UDP
/// socket is only pointed there).
fn local_address_towards(other: &str) -> Result<String, String> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    socket
        .connect((other, FIRST_REMOTE_PORT))
        .and_then(|_| socket.local_addr())
        .map(|a| a.ip().to_string())
        .map_err(|e| format!("no route from here to {other}: {e}"))
}

/// `text` quoted for a POSIX shell.
fn shell_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The other ranks this process started; dropping it stops any still
/// running.
pub struct StartedRanks {
    children: Arc<Mutex<Vec<(usize, String, Child)>>>,
    _ring_file: tempfile::NamedTempFile,
}

impl StartedRanks {
    /// Waits up to `limit` for the other ranks to finish after rank 0 has
    /// (they end right after the last collective); any left are stopped.
    pub fn finish(self, limit: std::time::Duration) {
        let started = std::time::Instant::now();
        while started.elapsed() < limit {
            let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
            children.retain_mut(|(_, _, child)| matches!(child.try_wait(), Ok(None)));
            if children.is_empty() {
                return;
            }
            drop(children);
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for StartedRanks {
    fn drop(&mut self) {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for (_, _, child) in children.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What rank 0 does when a rank it started stops with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenARankFails {
    /// Stop every rank and end (a run: it cannot finish).
    EndThisProcess,
    /// Mark the split model lost and go on (a server: its other models
    /// still serve, and requests for the split one hear why it cannot).
    LoseTheSplit,
}

/// Starts ranks 1.. of `hostfile` running this same command (`args`, the
/// command line without `--hostfile`), and returns the launch rank 0 runs
/// in this process.
pub fn start_ranks(
    hostfile: &Path,
    args: &[std::ffi::OsString],
    split: SplitKind,
    when_a_rank_fails: WhenARankFails,
) -> Result<(Launch, StartedRanks), String> {
    let text = std::fs::read_to_string(hostfile)
        .map_err(|e| format!("--hostfile {}: {e}", hostfile.display()))?;
    let hosts =
        parse_hostfile(&text).map_err(|e| format!("--hostfile {}: {e}", hostfile.display()))?;
    let here = here();
    let addresses = ring_addresses(&hosts, &here)?;
    let ring_hosts: Vec<Vec<String>> = addresses.iter().map(|a| vec![a.clone()]).collect();
    let ring_text = serde_json::to_string(&ring_hosts).map_err(|e| e.to_string())?;
    let mut ring_file = tempfile::Builder::new()
        .prefix("ondo-ring-")
        .suffix(".json")
        .tempfile()
        .map_err(|e| format!("could not write the ring's hostfile: {e}"))?;
    ring_file
        .write_all(ring_text.as_bytes())
        .map_err(|e| format!("could not write the ring's hostfile: {e}"))?;
    // MLX's ring backend reads its rank and hostfile from the environment
    // when this process joins.
    // SAFETY: `ondo run` calls this first, before it starts any thread that
    // could read the environment.
    unsafe {
        std::env::set_var("MLX_RANK", "0");
        std::env::set_var("MLX_HOSTFILE", ring_file.path());
    }
    let exe = std::env::current_exe().map_err(|e| format!("where is this ondo? {e}"))?;
    let children = Arc::new(Mutex::new(Vec::new()));
    for (rank, host) in hosts.iter().enumerate().skip(1) {
        let env = [
            ("MLX_RANK", rank.to_string()),
            (crate::environment::SPLIT.name, split.name().to_owned()),
        ];
        let mut command = if host.is_here(&here) {
            let mut command = Command::new(&exe);
            command
                .args(args)
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .env("MLX_HOSTFILE", ring_file.path())
                .stdin(Stdio::null());
            // A group of its own: Ctrl-C at the terminal reaches rank 0
            // alone, which ends the others in step (a server tells them to
            // finish after the requests in flight).
            #[cfg(unix)]
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
            command
        } else {
            // The ring's hostfile goes over ssh's stdin into a file there;
            // the same Ondo is expected at the same path on every machine
            // (the ranks' introductions check the versions).
            let remote_file = format!("/tmp/ondo-ring-{}-{rank}.json", std::process::id());
            let mut line = format!("cat > {remote_file} && ");
            for (key, value) in &env {
                line.push_str(&format!("{key}={} ", shell_quoted(value)));
            }
            line.push_str(&format!("MLX_HOSTFILE={remote_file} exec "));
            line.push_str(&shell_quoted(&exe.to_string_lossy()));
            for arg in args {
                line.push(' ');
                line.push_str(&shell_quoted(&arg.to_string_lossy()));
            }
            let mut command = Command::new("ssh");
            command
                .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"])
                .arg(&host.ssh)
                .arg(line)
                .stdin(Stdio::piped());
            command
        };
        command.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|e| format!("could not start rank {rank} on {}: {e}", host.ssh))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(ring_text.as_bytes());
        }
        // Its words, prefixed with who said them.
        if let Some(stderr) = child.stderr.take() {
            let who = format!("rank {rank} ({})", host.ssh);
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stderr)
                    .lines()
                    .map_while(Result::ok)
                {
                    eprintln!("{who}: {line}");
                }
            });
        }
        children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((rank, host.ssh.clone(), child));
    }
    watch(Arc::clone(&children), when_a_rank_fails);
    let launch = Launch {
        backend: Backend::Ring,
        rank: 0,
        size: hosts.len(),
        ring_hosts,
        split,
    };
    Ok((
        launch,
        StartedRanks {
            children,
            _ring_file: ring_file,
        },
    ))
}

/// Acts when another rank stops with an error: rank 0 would otherwise wait
/// for it to join, or for a collective it never answers.
fn watch(children: Arc<Mutex<Vec<(usize, String, Child)>>>, when_a_rank_fails: WhenARankFails) {
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let mut all = children.lock().unwrap_or_else(|e| e.into_inner());
            if all.is_empty() {
                return;
            }
            let failed = all
                .iter_mut()
                .find_map(|(rank, host, child)| match child.try_wait() {
                    Ok(Some(status)) if !status.success() => Some((*rank, host.clone(), status)),
                    _ => None,
                });
            if let Some((rank, host, status)) = failed {
                // Its last words come through the reader thread first.
                drop(all);
                std::thread::sleep(std::time::Duration::from_millis(300));
                let mut all = children.lock().unwrap_or_else(|e| e.into_inner());
                if when_a_rank_fails == WhenARankFails::LoseTheSplit {
                    let reason = format!("rank {rank} ({host}) stopped ({status})");
                    eprintln!(
                        "error: {reason}: its words are above, prefixed with its rank; the split \
                         model is unloaded and the other models serve on"
                    );
                    crate::engine::distributed::mark_lost(&reason);
                    // The others cannot run it without that rank either.
                    for (_, _, child) in all.iter_mut() {
                        let _ = child.kill();
                    }
                    drop(all);
                    // A run under way usually ends with MLX's error; one
                    // that waits on the dead rank never would, and neither
                    // would anything queued behind it.
                    let limit = std::time::Instant::now() + std::time::Duration::from_secs(10);
                    while crate::engine::distributed::split_run_in_flight()
                        && std::time::Instant::now() < limit
                    {
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                    if crate::engine::distributed::split_run_in_flight() {
                        eprintln!(
                            "error: the split run under way is waiting on rank {rank} for good \
                             (MLX does not give up on a lost peer): this server stops; start it \
                             again"
                        );
                        std::process::exit(1);
                    }
                    return;
                }
                for (_, _, child) in all.iter_mut() {
                    let _ = child.kill();
                }
                eprintln!(
                    "error: rank {rank} ({host}) stopped ({status}): its words are above, \
                     prefixed with its rank; every rank runs the same command, so it must find \
                     the same Ondo and the same model there"
                );
                std::process::exit(1);
            }
        }
    });
}

/// This process's launch, if it is one rank of several, and the ranks it
/// started itself: from `--hostfile` (Ondo starts the others), else from
/// what mlx.launch put in the environment. `split` (`--split`) overrides
/// `ONDO_SPLIT`.
pub fn this_launch(
    hostfile: Option<&Path>,
    split: Option<SplitKind>,
    when_a_rank_fails: WhenARankFails,
) -> Result<(Option<Launch>, Option<StartedRanks>), CliError> {
    let invalid = |message: String| CliError::new(ErrorKind::InvalidSettings, message);
    let from_env = Launch::from_env().map_err(invalid)?;
    let (mut launch, started) = match (hostfile, from_env) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "--hostfile starts the other ranks itself; a command that mlx.launch (or \
                 MLX_RANK) already started as a rank runs without it"
                    .into(),
            ));
        }
        (Some(file), None) => {
            let split = match split {
                Some(split) => split,
                None => SplitKind::from_env().map_err(invalid)?,
            };
            let (launch, started) =
                start_ranks(file, &args_without_hostfile(), split, when_a_rank_fails)
                    .map_err(|e| CliError::new(ErrorKind::Distributed, e))?;
            (Some(launch), Some(started))
        }
        (None, launch) => (launch, None),
    };
    match (&mut launch, split) {
        (Some(launch), Some(split)) => launch.split = split,
        (None, Some(_)) => {
            return Err(invalid(
                "--split divides a model over the ranks of a launch; this process was not \
                 started as one (give --hostfile, start every rank with mlx.launch, or set \
                 MLX_RANK and MLX_HOSTFILE)"
                    .into(),
            ));
        }
        _ => {}
    }
    Ok((launch, started))
}

/// This process's command line without `--hostfile FILE`: what every other
/// rank runs.
pub fn args_without_hostfile() -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for arg in std::env::args_os().skip(1) {
        if skip_next {
            skip_next = false;
            continue;
        }
        let text = arg.to_string_lossy();
        if text == "--hostfile" {
            skip_next = true;
        } else if !text.starts_with("--hostfile=") {
            out.push(arg);
        }
    }
    out
}

/// Joins the other ranks of `launch` for the model `name` names: once
/// joined, finds its folder (fetching from the hub only this rank's share,
/// the weight files of its layers, where the cache lacks it; mlx-lm's
/// `sharded_load` does the same) and introduces this rank with it.
pub fn join_with_model(
    pool: &crate::session::SessionPool,
    name: &str,
    launch: &Launch,
) -> Result<
    (
        crate::resolve::ResolvedModel,
        Vec<crate::engine::distributed::handshake::RankIdentity>,
    ),
    CliError,
> {
    let mut own_failure = None;
    let joined = crate::engine::distributed::join_as_rank(launch, || {
        match find_share(pool, name, launch) {
            // The weight bytes of this rank's part, from its own files.
            Ok(model) => {
                let bytes = crate::hub::sizing::share_bytes(&model.dir, launch.part()).unwrap_or(0);
                Ok((model, bytes))
            }
            Err(error) => {
                let told = error.to_string();
                own_failure = Some(error);
                Err(told)
            }
        }
    });
    joined.map_err(|e| own_failure.unwrap_or_else(|| CliError::new(ErrorKind::Distributed, e)))
}

/// The folder of `name` with what this rank reads: a whole model as for a
/// run alone, else a cached snapshot holding this rank's share, else the
/// share fetched from the hub now.
fn find_share(
    pool: &crate::session::SessionPool,
    name: &str,
    launch: &Launch,
) -> Result<crate::resolve::ResolvedModel, CliError> {
    use crate::resolve::{ResolveError, ResolvedModel};
    let err = match crate::resolve::resolve_model(pool, name, crate::resolve::NamedBy::Local) {
        Ok(model) => return Ok(model),
        Err(err @ (ResolveError::NotFound { .. } | ResolveError::Incomplete { .. })) => err,
        Err(err) => return Err(CliError::from(err).about(name)),
    };
    let Ok(model) = crate::hub::ModelRef::parse(name) else {
        return Err(CliError::from(err).about(name));
    };
    let share = launch.part();
    let dirs = crate::paths::DataDirs::from_env();
    let folders =
        crate::resolve::model_folders(&crate::resolve::saved_settings(pool, &dirs), &dirs);
    if let Some(dir) = crate::resolve::cached_share(&folders, &model, share) {
        return Ok(ResolvedModel {
            name: model.to_string(),
            dir,
        });
    }
    eprintln!(
        "rank {}: {model} is not here whole; fetching from the hub what rank {} of {} reads",
        launch.rank, launch.rank, launch.size
    );
    let dir = super::models::fetch_share(&model, share)?;
    crate::hub::library::holds_part(&dir, share).map_err(|problem| {
        CliError::from(ResolveError::Incomplete {
            name: model.to_string(),
            problem,
        })
        .about(name)
    })?;
    Ok(ResolvedModel {
        name: model.to_string(),
        dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostfiles_read_as_mlx_launch_writes_them_or_as_plain_names() {
        let hosts =
            parse_hostfile(r#"[{"ssh": "studio-1", "ips": ["10.0.0.1"]}, {"ssh": "studio-2"}]"#)
                .unwrap();
        assert_eq!(hosts[0].ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(hosts[1].ssh, "studio-2");
        let hosts = parse_hostfile(r#"["a.local", "b.local", "c.local"]"#).unwrap();
        assert_eq!(hosts.len(), 3);
        let one = parse_hostfile(r#"["a.local"]"#).unwrap_err();
        assert!(one.contains("two hosts"), "{one}");
        let bad = parse_hostfile(r#"["a", 7]"#).unwrap_err();
        assert!(bad.contains("rank 1"), "{bad}");
    }

    #[test]
    fn addresses_are_loopback_when_every_rank_is_here() {
        let named = |name: &str| Host {
            ssh: name.into(),
            ip: None,
        };
        let all =
            ring_addresses(&[named("localhost"), named("127.0.0.1")], &super::here()).unwrap();
        assert!(all.iter().all(|a| a.starts_with("127.0.0.1:")), "{all:?}");
        assert_ne!(all[0], all[1]);
        let mixed = ring_addresses(
            &[
                Host {
                    ssh: "localhost".into(),
                    ip: Some("10.0.0.1".into()),
                },
                Host {
                    ssh: "studio-2".into(),
                    ip: Some("10.0.0.2".into()),
                },
            ],
            &super::here(),
        )
        .unwrap();
        assert_eq!(mixed[1], format!("10.0.0.2:{FIRST_REMOTE_PORT}"));
        assert!(mixed[0].starts_with("10.0.0.1:"), "{mixed:?}");
        let unknown = ring_addresses(
            &[named("localhost"), named("nohost.invalid")],
            &super::here(),
        )
        .unwrap_err();
        assert!(
            unknown.contains("nohost.invalid") && unknown.contains("\"ips\""),
            "{unknown}"
        );
    }

    #[test]
    fn shell_quoting_keeps_quotes_inside() {
        assert_eq!(shell_quoted("it's"), r"'it'\''s'");
    }
}
