//! `ondo doctor`.

use std::process::ExitCode;

use clap::Args;

use crate::ErrorKind;
use crate::cli::error::CliError;
use crate::doctor::DoctorReport;
use crate::metallib::MetalReport;
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
