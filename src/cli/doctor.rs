//! `ondo doctor`.

use std::process::ExitCode;

use clap::Args;

use crate::ErrorKind;
use crate::cli::error::CliError;
use crate::doctor::DoctorReport;
use crate::metallib::MetalReport;
use crate::units::human_bytes;

#[derive(Debug, Args)]
#[command(after_help = "\
Several machines: start one `ondo doctor --distributed` on each, the way
MLX's launcher starts any command, and rank 0 prints whether they can run
one model together:
  mlx.launch --hostfile hosts.json --backend ring -- ondo doctor --distributed
(or set MLX_RANK and MLX_HOSTFILE on each by hand: the hostfile lists each
rank's \"ip:port\", [[\"10.0.0.1:5000\"], [\"10.0.0.2:5000\"]]), or let
Ondo start the others over ssh, as `ondo run --hostfile` does:
  ondo doctor --distributed --hostfile hosts.json   (hosts.json: [\"studio-1.local\", \"studio-2.local\"])
Each rank
joins the others through MLX's backend; they compare Ondo's and MLX's
versions and, with --model, the snapshot of the model folder each would
load, and refuse to go on when they differ, naming the rank and what
differs. Then rank 0 times the links as a split model uses them: a message
passed from rank to rank (pipeline parallel, once a step) and a sum across
ranks (tensor parallel, twice a layer).")]
pub struct DoctorArgs {
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Check the ranks of a run split across processes or machines (see below).
    #[arg(long)]
    distributed: bool,
    /// With --distributed: the model folder each rank would load; the ranks
    /// compare their snapshots.
    #[arg(long, value_name = "DIR", requires = "distributed")]
    model: Option<std::path::PathBuf>,
    /// With --distributed: start the other ranks from here (a JSON list of
    /// hosts, this one first, as `ondo run --hostfile` takes it) instead of
    /// through mlx.launch.
    #[arg(long, value_name = "FILE", requires = "distributed")]
    hostfile: Option<std::path::PathBuf>,
}

pub fn run(args: DoctorArgs) -> Result<ExitCode, CliError> {
    if args.distributed {
        return distributed(&args);
    }
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

/// `ondo doctor --distributed`: rank 0 prints the ranks and the links; the
/// others print nothing unless something is wrong.
fn distributed(args: &DoctorArgs) -> Result<ExitCode, CliError> {
    use crate::engine::distributed::check_cluster;
    let (launch, started) = super::launch::this_launch(
        args.hostfile.as_deref(),
        None,
        super::launch::WhenARankFails::EndThisProcess,
    )?;
    let launch = launch.ok_or_else(|| {
        CliError::new(
            ErrorKind::InvalidSettings,
            "this process was not started as a rank: run it under mlx.launch --hostfile \
             hosts.json --backend ring -- ondo doctor --distributed, give --hostfile, or set \
             MLX_RANK and MLX_HOSTFILE (see ondo doctor --help)",
        )
    })?;
    let report = check_cluster(&launch, args.model.as_deref())
        .map_err(|message| CliError::new(ErrorKind::Distributed, message))?;
    if let Some(started) = started {
        started.finish(std::time::Duration::from_secs(30));
    }
    if launch.rank != 0 {
        return Ok(ExitCode::SUCCESS);
    }
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::new(ErrorKind::Internal, e.to_string()))?;
        println!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} ranks over MLX's {} backend, alike (Ondo {}, MLX {})",
        report.ranks.len(),
        report.backend,
        report.ranks[0].ondo_version,
        report.ranks[0].mlx_version
    );
    for (rank, address) in report.ranks.iter().zip(&report.addresses) {
        println!(
            "rank {}  {}{}  {} ({}), {}{}",
            rank.rank,
            rank.host,
            address
                .as_deref()
                .map(|a| format!(" [{a}]"))
                .unwrap_or_default(),
            rank.device,
            rank.backend,
            human_bytes(rank.memory_bytes),
            rank.model
                .as_ref()
                .map(|m| format!(", model {m}"))
                .unwrap_or_default()
        );
    }
    for link in &report.links {
        println!(
            "link  {:>9}: {:.3} ms a hop ({:.2} GB/s), {:.3} ms to sum across ranks",
            human_bytes(link.bytes),
            link.hop_ms,
            link.hop_gbps,
            link.all_sum_ms
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_text(r: &DoctorReport) {
    println!("Ondo {} ({} build)", r.ondo_version, r.build_profile);
    println!("MLX          {}", r.mlx_version);
    println!("backend      {}", r.backend);
    println!("device       {}", r.device);
    if let Some(metal) = &r.metal {
        println!("metallib     {}", metallib_line(metal));
    }
    println!("os           {}", r.os);
    println!(
        "memory       {} total, {} available",
        human_bytes(r.total_memory_bytes),
        human_bytes(r.available_memory_bytes)
    );
    println!("MLX limit    {}", human_bytes(r.mlx_memory_limit_bytes));
    for (name, value) in crate::engine::mlx_settings::in_effect() {
        println!("MLX setting  {name}={value}");
    }
    for variable in &r.variables {
        println!(
            "set          {}={} ({})",
            variable.name, variable.value, variable.purpose
        );
    }
    println!("allocator    {}", crate::allocator());
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

/// Where MLX's kernels came from, or every place they were looked for.
fn metallib_line(metal: &MetalReport) -> String {
    match (&metal.metallib, &metal.device_name) {
        (Some(path), _) => match &metal.metallib_macos {
            Some(macos) => format!("{} (macOS {macos} and later)", path.display()),
            None => path.display().to_string(),
        },
        (None, Some(_)) => "from where libmlx was built".to_owned(),
        (None, None) => {
            let looked_in: Vec<String> = metal
                .looked_in
                .iter()
                .map(|path| path.display().to_string())
                .collect();
            if looked_in.is_empty() {
                "not loaded; MLX looked only where libmlx was built".to_owned()
            } else {
                format!("not loaded; looked in {}", looked_in.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle_report() -> MetalReport {
        MetalReport {
            device_name: Some("Apple M2 Pro".into()),
            metallib: Some("/Applications/Ondo.app/Contents/Resources/mlx.metallib".into()),
            metallib_macos: Some("14.0".into()),
            libmlx: Some("/Applications/Ondo.app/Contents/Frameworks/libmlx.dylib".into()),
            looked_in: vec!["/Applications/Ondo.app/Contents/Resources/mlx.metallib".into()],
        }
    }

    #[test]
    fn the_metallib_line_names_the_file_mlx_loaded() {
        assert_eq!(
            metallib_line(&bundle_report()),
            "/Applications/Ondo.app/Contents/Resources/mlx.metallib (macOS 14.0 and later)"
        );
    }

    #[test]
    fn the_metallib_line_lists_the_places_tried_when_none_loaded() {
        let report = MetalReport {
            device_name: None,
            metallib: None,
            metallib_macos: None,
            looked_in: vec![
                "/Applications/Ondo.app/Contents/Resources/mlx.metallib".into(),
                "/Applications/Ondo.app/Contents/Frameworks/mlx.metallib".into(),
            ],
            ..bundle_report()
        };
        assert_eq!(
            metallib_line(&report),
            "not loaded; looked in /Applications/Ondo.app/Contents/Resources/mlx.metallib, \
             /Applications/Ondo.app/Contents/Frameworks/mlx.metallib"
        );
    }
}
