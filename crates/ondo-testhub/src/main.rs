//! `ondo-testhub`: the test hub as a process, for the desktop app's
//! end-to-end tests, which point the app's hub endpoint at it.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ondo_testhub::TestHub;

/// A fake Hugging Face hub for Ondo's end-to-end tests.
///
/// Serves model folders on 127.0.0.1 with the hub's download protocol (repo
/// info, resolve, LFS redirects, byte ranges, error codes). Prints one line,
/// `ondo-testhub listening on http://127.0.0.1:PORT`, then serves until killed.
#[derive(Parser)]
#[command(name = "ondo-testhub")]
struct Args {
    /// Serve FOLDER as repo ORG/NAME (repeatable).
    #[arg(long = "repo", value_name = "ORG/NAME=FOLDER", value_parser = parse_repo)]
    repos: Vec<(String, PathBuf)>,
    /// Require `Authorization: Bearer TOKEN` for ORG/NAME (repeatable).
    #[arg(long = "gated", value_name = "ORG/NAME=TOKEN", value_parser = parse_gate)]
    gates: Vec<(String, String)>,
    /// Throttle every file body to about this many bytes per second.
    #[arg(long, value_name = "N")]
    bytes_per_second: Option<u64>,
}

fn parse_repo(text: &str) -> Result<(String, PathBuf), String> {
    parse_gate(text).map(|(repo_id, folder)| (repo_id, PathBuf::from(folder)))
}

fn parse_gate(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((repo_id, value)) if !repo_id.is_empty() && !value.is_empty() => {
            Ok((repo_id.to_string(), value.to_string()))
        }
        _ => Err(format!("expected ORG/NAME=VALUE, got {text:?}")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let hub = match TestHub::start() {
        Ok(hub) => hub,
        Err(error) => {
            eprintln!("ondo-testhub: cannot start the server: {error}");
            return ExitCode::FAILURE;
        }
    };
    for (repo_id, folder) in &args.repos {
        if let Err(error) = hub.add_repo(repo_id, folder) {
            eprintln!(
                "ondo-testhub: cannot serve {} as {repo_id}: {error}",
                folder.display()
            );
            return ExitCode::FAILURE;
        }
    }
    for (repo_id, token) in &args.gates {
        hub.set_gated(repo_id, Some(token));
    }
    hub.set_bytes_per_second(args.bytes_per_second);

    let mut stdout = std::io::stdout();
    if writeln!(stdout, "ondo-testhub listening on {}", hub.url())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    // The server runs on its own thread; this one only keeps the process alive
    // until a signal ends it.
    loop {
        std::thread::park();
    }
}
