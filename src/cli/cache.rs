//! `ondo cache`: the prompt caches saved on disk (KV caches of long
//! prompts that left memory, read back when a prompt starts the same way):
//! list them, remove those of a model or all of them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::cli::error::CliError;
use crate::hub::repo_id::ModelRef;
use crate::paths::DataDirs;
use crate::session::prompt_cache;
use crate::text_table::{self, Column, TableStyle};
use crate::units::human_bytes;

#[derive(Debug, Args)]
#[command(after_help = "\
When a conversation's KV cache leaves memory (its model unloads, the server or the app quits,
another conversation takes its place), Ondo saves it to the prompt-cache folder of its data
folder if it holds at least 256 tokens. A later prompt that starts with the same tokens, on the
same model snapshot and cache settings, reads them back instead of prefilling them again: the
run's footer says `read from disk`. The folder stays within a budget (Settings; by default the
smaller of 20 GiB and a quarter of the free space), least recently used out first. Each file is a
safetensors prompt cache that `mlx_lm.generate --prompt-cache-file` also reads.

Examples:
  ondo cache ls
  ondo cache rm mlx-community/Qwen3-4B-4bit
  ondo cache rm --all
  ondo run MODEL --no-disk-cache \"...\"   (one run that neither reads nor saves)")]
pub struct CacheArgs {
    #[command(subcommand)]
    command: CacheCommand,
}

#[derive(Debug, Subcommand)]
enum CacheCommand {
    /// List the saved prompt caches: model, tokens, size, last used.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove the saved prompt caches of one model (a repo id or a folder),
    /// or every one with --all.
    Rm {
        /// A repo id (mlx-community/Qwen3-4B-4bit) or a model folder.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        model: Option<String>,
        /// Remove every saved prompt cache.
        #[arg(long)]
        all: bool,
    },
}

pub fn run(args: CacheArgs) -> Result<ExitCode, CliError> {
    let dirs = DataDirs::from_env();
    match args.command {
        CacheCommand::Ls { json } => ls(&dirs, json),
        CacheCommand::Rm { model, all } => {
            let folder = match (&model, all) {
                (_, true) | (None, _) => None,
                (Some(name), false) => Some(model_folder(&dirs, name)?),
            };
            let removed = prompt_cache::clear(&dirs.prompt_cache_dir(), folder.as_deref());
            let what = model.as_deref().unwrap_or("every model");
            println!(
                "removed {removed} saved prompt cache{} of {what}",
                if removed == 1 { "" } else { "s" }
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The folder whose caches `name` means: a folder as given, else a repo
/// id's folder in the Hugging Face cache.
fn model_folder(dirs: &DataDirs, name: &str) -> Result<PathBuf, CliError> {
    let path = Path::new(name);
    if path.is_dir() {
        return Ok(path.to_owned());
    }
    if name == crate::resolve::TINY {
        return Ok(dirs.models_dir.join(crate::resolve::TINY));
    }
    let model = ModelRef::parse(name).map_err(|e| CliError::from(e).about(name))?;
    Ok(dirs.hf_cache_dir.join(model.cache_folder_name()))
}

fn ls(dirs: &DataDirs, json: bool) -> Result<ExitCode, CliError> {
    let saved = crate::store::Store::open_default(&dirs.data_dir)
        .map(|store| crate::app_settings::AppSettings::load(&store))
        .unwrap_or_default();
    let settings = saved.prompt_cache_settings(dirs);
    let status = prompt_cache::status(&dirs.prompt_cache_dir(), settings.as_ref());
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).expect("plain data")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let rows: Vec<[String; 4]> = status
        .saved
        .iter()
        .map(|saved| {
            [
                display_model(dirs, &saved.model_dir),
                saved.tokens.to_string(),
                human_bytes(saved.bytes),
                ago(now.saturating_sub(saved.last_used_unix)),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("no saved prompt caches in {}", status.folder.display());
    } else {
        let columns = [
            Column::left("MODEL"),
            Column::right("TOKENS"),
            Column::right("SIZE"),
            Column::left("LAST USED"),
        ];
        print!("{}", text_table::render(TableStyle::Plain, &columns, &rows));
    }
    if status.enabled {
        println!(
            "{} of {} budget in {}",
            human_bytes(status.bytes),
            human_bytes(status.budget_bytes),
            status.folder.display()
        );
    } else {
        println!(
            "the prompt cache on disk is off (a budget of 0 in Settings, or ONDO_PROMPT_CACHE=0)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A model folder as people name it: the repo id for a Hugging Face cache
/// snapshot, the folder otherwise.
fn display_model(dirs: &DataDirs, dir: &str) -> String {
    let path = Path::new(dir);
    path.strip_prefix(&dirs.hf_cache_dir)
        .ok()
        .and_then(|rest| rest.components().next())
        .and_then(|c| c.as_os_str().to_str())
        .and_then(|folder| folder.strip_prefix("models--"))
        .map(|repo| repo.replacen("--", "/", 1))
        .unwrap_or_else(|| dir.to_owned())
}

fn ago(seconds: u64) -> String {
    match seconds {
        0..60 => "just now".into(),
        60..3600 => format!("{} min ago", seconds / 60),
        3600..86400 => format!("{} h ago", seconds / 3600),
        _ => format!("{} days ago", seconds / 86400),
    }
}
