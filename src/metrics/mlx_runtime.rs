//! Facts about the MLX library this process runs on: version, backend,
//! device, and memory counters.

use std::ffi::{CStr, CString};

use mlx_rs::{Device, DeviceType};

/// An mlx-c device handle of our own (mlx-rs keeps its handle private), freed
/// on drop.
struct RawDevice(mlx_sys::mlx_device);

impl RawDevice {
    fn new(kind: DeviceType) -> Self {
        // SAFETY: creates a new owned handle; freed in Drop.
        Self(unsafe { mlx_sys::mlx_device_new_type(kind.into(), 0) })
    }
}

impl Drop for RawDevice {
    fn drop(&mut self) {
        // SAFETY: the handle is owned by this value and freed once.
        unsafe {
            mlx_sys::mlx_device_free(self.0);
        }
    }
}

/// Which MLX backend computes: Apple GPU, NVIDIA GPU, or the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Metal,
    Cuda,
    Cpu,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Metal => "metal",
            Backend::Cuda => "cuda",
            Backend::Cpu => "cpu",
        })
    }
}

/// What the loaded MLX is and where it computes.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct MlxRuntime {
    /// MLX's own version string, e.g. "0.32.4".
    pub mlx_version: String,
    /// The backend of the default device.
    pub backend: Backend,
    /// The device's name as MLX reports it (GPU name), else the CPU's name.
    pub device_name: String,
    /// MLX's memory limit for the default device, in bytes.
    pub memory_limit_bytes: u64,
    /// On Metal, the GPU's recommended working set; absent elsewhere.
    pub recommended_working_set_bytes: Option<u64>,
}

impl MlxRuntime {
    /// Asks the loaded MLX library.
    pub fn detect() -> Self {
        // Through mlx-rs first: it installs the error handler that turns
        // MLX's exceptions into errors. The raw calls below would otherwise
        // meet mlx-c's default handler, which exits the process (on a Mac
        // whose MLX cannot load its Metal kernels, the device info does).
        let memory_limit_bytes = mlx_rs::memory::memory_limit().unwrap_or(0) as u64;
        let backend = if gpu_available(mlx_sys::mlx_metal_is_available) {
            Backend::Metal
        } else if gpu_available(mlx_sys::mlx_cuda_is_available) {
            Backend::Cuda
        } else {
            Backend::Cpu
        };
        let kind = match backend {
            Backend::Cpu => DeviceType::Cpu,
            Backend::Metal | Backend::Cuda => DeviceType::Gpu,
        };
        if backend == Backend::Cpu {
            // A CPU-only build would otherwise try the GPU for every op.
            Device::set_default(&Device::cpu());
        }
        let device = RawDevice::new(kind);
        let device_name = device_string(&device, "device_name")
            .or_else(ondo_os::cpu_name)
            .unwrap_or_else(|| "unknown".to_owned());
        let recommended_working_set_bytes =
            device_size(&device, "max_recommended_working_set_size");
        Self {
            mlx_version: mlx_version(),
            backend,
            device_name,
            memory_limit_bytes,
            recommended_working_set_bytes,
        }
    }
}

/// The GPU's name as MLX reports it ("Apple M2 Pro"), when MLX has one and
/// can create its device.
#[cfg(target_os = "macos")]
pub(crate) fn gpu_name() -> Option<String> {
    device_string(&RawDevice::new(DeviceType::Gpu), "device_name")
}

/// The version string of the loaded libmlx.
pub fn mlx_version() -> String {
    // SAFETY: mlx_string_new returns an owned empty string that mlx_version
    // fills; we copy the bytes out before freeing it.
    unsafe {
        let mut text = mlx_sys::mlx_string_new();
        let status = mlx_sys::mlx_version(&mut text);
        let version = if status == 0 {
            let data = mlx_sys::mlx_string_data(text);
            if data.is_null() {
                String::new()
            } else {
                CStr::from_ptr(data).to_string_lossy().into_owned()
            }
        } else {
            String::new()
        };
        mlx_sys::mlx_string_free(text);
        version
    }
}

fn gpu_available(probe: unsafe extern "C" fn(*mut bool) -> std::os::raw::c_int) -> bool {
    let mut available = false;
    // SAFETY: the probe writes one bool through a valid pointer.
    let status = unsafe { probe(&mut available) };
    status == 0 && available
}

fn with_device_info<T>(
    device: &RawDevice,
    read: impl FnOnce(mlx_sys::mlx_device_info) -> Option<T>,
) -> Option<T> {
    // SAFETY: the info object is created, filled for a live device, read, and
    // freed here; nothing borrowed from it escapes `read` (strings are copied).
    unsafe {
        let mut info = mlx_sys::mlx_device_info_new();
        let result = if mlx_sys::mlx_device_info_get(&mut info, device.0) == 0 {
            read(info)
        } else {
            None
        };
        mlx_sys::mlx_device_info_free(info);
        result
    }
}

fn device_string(device: &RawDevice, key: &str) -> Option<String> {
    let key = CString::new(key).ok()?;
    with_device_info(device, |info| {
        let mut exists = false;
        let mut is_string = false;
        let mut value: *const std::os::raw::c_char = std::ptr::null();
        // SAFETY: `info` is live for this closure; out-pointers are valid.
        unsafe {
            if mlx_sys::mlx_device_info_has_key(&mut exists, info, key.as_ptr()) != 0 || !exists {
                return None;
            }
            if mlx_sys::mlx_device_info_is_string(&mut is_string, info, key.as_ptr()) != 0
                || !is_string
            {
                return None;
            }
            if mlx_sys::mlx_device_info_get_string(&mut value, info, key.as_ptr()) != 0
                || value.is_null()
            {
                return None;
            }
            Some(CStr::from_ptr(value).to_string_lossy().into_owned())
        }
    })
    .filter(|s| !s.is_empty())
}

fn device_size(device: &RawDevice, key: &str) -> Option<u64> {
    let key = CString::new(key).ok()?;
    with_device_info(device, |info| {
        let mut exists = false;
        let mut value: usize = 0;
        // SAFETY: `info` is live for this closure; out-pointers are valid.
        unsafe {
            if mlx_sys::mlx_device_info_has_key(&mut exists, info, key.as_ptr()) != 0 || !exists {
                return None;
            }
            if mlx_sys::mlx_device_info_get_size(&mut value, info, key.as_ptr()) != 0 {
                return None;
            }
        }
        Some(value as u64)
    })
}
