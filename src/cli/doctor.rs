//! `ondo doctor`.

use std::process::ExitCode;

use clap::Args;

use crate::ErrorKind;
use crate::cli::error::CliError;
use crate::doctor::DoctorReport;
use crate::units::human_bytes;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: DoctorArgs) -> Result<ExitCode, CliError> {
    let report = DoctorReport::collect();
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::new(ErrorKind::Internal, e.to_string()))?;
        println!("{text}");
    } else {
        print_text(&report);
    }
    Ok(if report.healthy() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_text(r: &DoctorReport) {
    println!("Ondo {} ({} build)", r.ondo_version, r.build_profile);
    println!("MLX          {}", r.mlx_version);
    println!("backend      {}", r.backend);
    println!("device       {}", r.device);
    println!("os           {}", r.os);
    println!(
        "memory       {} total, {} available",
        human_bytes(r.total_memory_bytes),
        human_bytes(r.available_memory_bytes)
    );
    println!("MLX limit    {}", human_bytes(r.mlx_memory_limit_bytes));
    if let Some(ws) = r.recommended_working_set_bytes {
        println!("GPU working set {}", human_bytes(ws));
    }
    println!("data         {}", r.data_dir.display());
    println!("models       {}", r.models_dir.display());
    println!("hub cache    {}", r.hf_cache_dir.display());
    let token = match r.hub_token_source {
        Some(source) => format!(
            "token from {}",
            serde_json::to_value(source)
                .unwrap_or_default()
                .as_str()
                .unwrap_or("?")
                .replace('_', " ")
        ),
        None => "no token (public models only)".to_owned(),
    };
    let offline = if r.hub_offline {
        ", offline (HF_HUB_OFFLINE)"
    } else {
        ""
    };
    println!("hub          {}, {token}{offline}", r.hub_endpoint);
    if let Some(m) = &r.memory {
        println!(
            "pressure     {} (used {}, app {}, wired {}, compressed {}, cached {}, swap {})",
            serde_json::to_value(m.level)
                .unwrap_or_default()
                .as_str()
                .unwrap_or("?"),
            human_bytes(m.used_bytes),
            human_bytes(m.app_bytes),
            human_bytes(m.wired_bytes),
            human_bytes(m.compressed_bytes),
            human_bytes(m.cached_bytes),
            human_bytes(m.swap_used_bytes)
        );
    }
    println!();
    for check in &r.checks {
        let mark = if check.passed { "ok  " } else { "FAIL" };
        println!("[{mark}] {:<24} {}", check.name, check.detail);
    }
    if r.build_profile == "debug" {
        println!();
        println!("note: this is a debug build; timings from it understate what Ondo does.");
    }
}
