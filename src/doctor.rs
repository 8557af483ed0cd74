//! `ondo doctor`: what Ondo runs on, and whether MLX computes correctly here.
//!
//! The checks compare MLX's answers with values computed in plain Rust, so a
//! broken BLAS or a mismatched libmlx shows up as a failed check, not as a
//! model that quietly talks nonsense.

use mlx_rs::{Array, ops};

use crate::metallib::MetalReport;
use crate::metrics::mlx_runtime::{Backend, MlxRuntime};
use crate::paths::DataDirs;
use crate::session::record::build_profile;

/// The MLX release that the vendored mlx-c (mlx-sys 0.7.0) was written for.
pub const EXPECTED_MLX_VERSION: &str = "0.32.4";

/// One self-test and its outcome.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Check {
    pub name: String,
    pub passed: bool,
    /// What was compared, or what went wrong and what to do.
    pub detail: String,
}

/// An `ONDO_*` variable set in this process.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct SetVariable {
    pub name: String,
    pub value: String,
    /// What it does (`crate::environment`).
    pub purpose: String,
}

/// Everything `ondo doctor` prints.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct DoctorReport {
    pub ondo_version: String,
    pub mlx_version: String,
    pub backend: Backend,
    pub device: String,
    /// On a Mac: the Metal device and where MLX's kernels came from (or
    /// where they were looked for). Absent elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "specta", specta(optional))]
    pub metal: Option<MetalReport>,
    pub os: String,
    pub total_memory_bytes: u64,
    pub available_memory_bytes: u64,
    pub mlx_memory_limit_bytes: u64,
    pub recommended_working_set_bytes: Option<u64>,
    pub build_profile: String,
    pub data_dir: std::path::PathBuf,
    pub models_dir: std::path::PathBuf,
    pub hf_cache_dir: std::path::PathBuf,
    /// `HF_ENDPOINT` or the public hub.
    pub hub_endpoint: String,
    /// Where the hub token comes from (never the token itself); None: no token.
    pub hub_token_source: Option<crate::hub::config::TokenSource>,
    /// `HF_HUB_OFFLINE` is on.
    pub hub_offline: bool,
    /// The system's memory pressure now, with the Activity Monitor breakdown.
    pub memory: Option<ondo_os::MemorySnapshot>,
    /// Ondo's own environment variables set in this process
    /// (`crate::environment`; an API key's value is not shown).
    pub variables: Vec<SetVariable>,
    pub checks: Vec<Check>,
}

impl DoctorReport {
    /// Probes the machine and runs the self-tests.
    pub fn collect() -> Self {
        // First: on a Mac this is where MLX creates its Metal device and
        // loads its kernels, with the bundle's kernels named if there are.
        let metal_check = crate::metallib::check();
        let runtime = MlxRuntime::detect();
        let dirs = DataDirs::from_env();
        let memory = ondo_os::memory_totals().ok();
        let hub = crate::hub::HubConfig::from_env(&dirs);
        let mut checks = vec![version_check(&runtime.mlx_version)];
        let (metal, gpu_works) = match metal_check {
            Ok(None) => (None, true),
            Ok(Some(report)) => {
                checks.push(metal_passed(&report));
                (Some(report), true)
            }
            Err(error) => {
                checks.push(outcome(METAL_CHECK, Err(error.to_string())));
                let search = crate::metallib::use_bundled_kernels();
                (Some(MetalReport::of_search(search)), false)
            }
        };
        // Without the GPU they would only repeat the failure above.
        if gpu_works {
            checks.push(outcome("matmul f32", check_matmul()));
            checks.push(outcome("quantized matmul 4-bit", check_quantized_matmul()));
            // Where a backend has kernels of Ondo's own (CUDA), they are
            // checked against MLX's too.
            if let Some((name, result)) = crate::engine::backend::self_check() {
                checks.push(outcome(name, result));
            }
        }
        Self {
            ondo_version: env!("CARGO_PKG_VERSION").to_owned(),
            mlx_version: runtime.mlx_version.clone(),
            backend: runtime.backend,
            device: runtime.device_name.clone(),
            metal,
            os: ondo_os::os_description(),
            total_memory_bytes: memory.map_or(0, |m| m.total_bytes),
            available_memory_bytes: memory.map_or(0, |m| m.available_bytes),
            mlx_memory_limit_bytes: runtime.memory_limit_bytes,
            recommended_working_set_bytes: runtime.recommended_working_set_bytes,
            build_profile: build_profile().to_owned(),
            data_dir: dirs.data_dir,
            models_dir: dirs.models_dir,
            hf_cache_dir: dirs.hf_cache_dir,
            hub_endpoint: hub.endpoint,
            hub_token_source: hub.token_source,
            hub_offline: hub.offline,
            memory: ondo_os::memory_snapshot().ok(),
            variables: crate::environment::set_now()
                .into_iter()
                .map(|(variable, value)| SetVariable {
                    name: variable.name.to_owned(),
                    value,
                    purpose: variable.purpose.to_owned(),
                })
                .collect(),
            checks,
        }
    }

    /// True when every check passed.
    pub fn healthy(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}

fn version_check(found: &str) -> Check {
    let passed = found == EXPECTED_MLX_VERSION;
    Check {
        name: "MLX version".to_owned(),
        passed,
        detail: if passed {
            format!("libmlx {found}, as mlx-c expects")
        } else {
            format!(
                "libmlx {found}, but Ondo's mlx-c was written for {EXPECTED_MLX_VERSION}; \
                 install mlx[cpu]=={EXPECTED_MLX_VERSION} (`make setup`) and rebuild"
            )
        },
    }
}

/// The name of the check that MLX runs on the Mac's GPU.
const METAL_CHECK: &str = "Metal GPU and kernels";

fn metal_passed(report: &MetalReport) -> Check {
    let device = report.device_name.as_deref().unwrap_or("the GPU");
    let kernels = match &report.metallib {
        Some(path) => format!("kernels from {}", path.display()),
        None => "kernels from where libmlx was built".to_owned(),
    };
    Check {
        name: METAL_CHECK.to_owned(),
        passed: true,
        detail: format!("{device} computes; {kernels}"),
    }
}

fn outcome(name: &str, result: Result<String, String>) -> Check {
    let (passed, detail) = match result {
        Ok(detail) => (true, detail),
        Err(detail) => (false, detail),
    };
    Check {
        name: name.to_owned(),
        passed,
        detail,
    }
}

/// What to do when MLX cannot compute at all: the library is there (the
/// process started) but unusable, e.g. a missing Metal library or BLAS.
const HOW_TO_GET_MLX: &str = "on macOS reinstall Ondo from its disk image (the \
app carries libmlx and its kernels); on Linux reinstall the MLX wheel with \
make setup (it puts mlx[cpu]==0.32.4 into .venv) and rebuild";

fn mlx_err(e: impl std::fmt::Display) -> String {
    let e = crate::engine::mlx_failure(&e);
    format!("MLX could not compute ({e}); {HOW_TO_GET_MLX}")
}

/// Largest difference between two equally long slices.
fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - y).abs())
        .fold(0.0, f64::max)
}

/// A 16x48 by 48x8 matmul against the same product summed in f64.
fn check_matmul() -> Result<String, String> {
    let (m, k, n) = (16usize, 48usize, 8usize);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0)
        .collect();
    let mut expected = vec![0f64; m * n];
    for r in 0..m {
        for c in 0..n {
            expected[r * n + c] = (0..k)
                .map(|i| f64::from(a[r * k + i]) * f64::from(b[i * n + c]))
                .sum();
        }
    }
    let product = ops::matmul(
        Array::from_slice(&a, &[m as i32, k as i32]),
        Array::from_slice(&b, &[k as i32, n as i32]),
    )
    .map_err(mlx_err)?;
    product.eval().map_err(mlx_err)?;
    let diff = max_abs_diff(product.as_slice::<f32>(), &expected);
    // Inputs are exact in f32; only summation order differs.
    if diff <= 1e-4 {
        Ok(format!("{m}x{k} by {k}x{n}, max difference {diff:.1e}"))
    } else {
        Err(format!(
            "{m}x{k} by {k}x{n} differs from the exact product by {diff:.3e}; \
             the BLAS that libmlx loaded computes wrong results"
        ))
    }
}

/// Quantizes weights chosen so that 4-bit affine quantization is lossless
/// (each group of 64 spans exactly 16 evenly spaced levels of a power-of-two
/// step), then compares
/// `quantized_matmul` with the f64 product of the original weights.
fn check_quantized_matmul() -> Result<String, String> {
    let (out_features, in_features, group_size, bits) = (8usize, 128usize, 64i32, 4i32);
    let w: Vec<f32> = (0..out_features * in_features)
        .map(|i| {
            let (row, col) = (i / in_features, i % in_features);
            let group = col / group_size as usize;
            let scale = 0.25 * (1 + row % 3) as f32;
            // A negative integer offset with |min| > |max| makes MLX pick the
            // minimum as the exact edge and `scale` as the exact step.
            let offset = -8.0 - ((row + group) % 4) as f32;
            // Every level 0..=15 occurs in each group, so min and max are exact.
            let level = ((col * 7 + row) % 16) as f32;
            scale * (offset + level)
        })
        .collect();
    let x: Vec<f32> = (0..in_features)
        .map(|i| ((i % 9) as f32 - 4.0) / 2.0)
        .collect();
    let expected: Vec<f64> = (0..out_features)
        .map(|r| {
            (0..in_features)
                .map(|c| f64::from(w[r * in_features + c]) * f64::from(x[c]))
                .sum()
        })
        .collect();
    let w_array = Array::from_slice(&w, &[out_features as i32, in_features as i32]);
    let (wq, scales, biases) = ops::quantize(&w_array, group_size, bits).map_err(mlx_err)?;
    let x_array = Array::from_slice(&x, &[1, in_features as i32]);
    let y = ops::quantized_matmul(&x_array, &wq, &scales, &biases, true, group_size, bits)
        .map_err(mlx_err)?;
    y.eval().map_err(mlx_err)?;
    let diff = max_abs_diff(y.as_slice::<f32>(), &expected);
    if diff <= 1e-3 {
        Ok(format!(
            "{out_features}x{in_features}, group size {group_size}, max difference {diff:.1e}"
        ))
    } else {
        Err(format!(
            "4-bit quantized product differs from the exact one by {diff:.3e}; \
             this libmlx's quantized kernels are broken"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_tests_pass_on_this_machine() {
        let report = DoctorReport::collect();
        for check in &report.checks {
            assert!(check.passed, "{}: {}", check.name, check.detail);
        }
        assert_eq!(report.mlx_version, EXPECTED_MLX_VERSION);
        assert!(report.total_memory_bytes > 0);
    }

    #[test]
    fn off_a_mac_the_report_is_as_it_was() {
        if cfg!(target_os = "macos") {
            return;
        }
        let report = DoctorReport::collect();
        assert_eq!(report.metal, None);
        let json = serde_json::to_value(&report).unwrap();
        assert!(json.get("metal").is_none(), "{json}");
        let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["MLX version", "matmul f32", "quantized matmul 4-bit"]
        );
    }

    #[test]
    fn a_wrong_version_fails_with_what_to_install() {
        let check = version_check("0.20.0");
        assert!(!check.passed);
        assert!(
            check.detail.contains("mlx[cpu]==0.32.4"),
            "{}",
            check.detail
        );
    }
}
