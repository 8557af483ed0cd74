//! MLX's compiled Metal kernels, `mlx.metallib`: where Ondo.app keeps them,
//! where MLX looks for them, and the start-up check that MLX can create its
//! Metal device and load them, with a message that says what is missing and
//! where it was looked for. docs/ARCHITECTURE.md ("Shipping on a Mac") says
//! why the kernels live in the bundle's Resources.
//!
//! Off macOS there is nothing to check: the Linux wheels compute on the CPU
//! or CUDA and have no metallib.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::ErrorKind;

/// The kernels' file name, as the mlx-metal wheel ships it.
pub const METALLIB_FILE: &str = "mlx.metallib";

/// Where Ondo.app keeps the kernels, relative to the bundle's `Contents`.
/// The bundle configuration (`src-tauri/tauri.conf.json`) puts the file
/// here, and a test of the shell checks that it does.
pub const METALLIB_IN_BUNDLE: &str = "Resources/mlx.metallib";

/// The kernels of the app bundle whose executable is `exe`
/// (`Ondo.app/Contents/MacOS/ondo-app`, or the `ondo` beside it); `None`
/// for an executable outside a bundle.
pub fn bundled_metallib(exe: &Path) -> Option<PathBuf> {
    let macos_dir = exe.parent()?;
    let contents = macos_dir.parent()?;
    (macos_dir.file_name()? == "MacOS" && contents.file_name()? == "Contents")
        .then(|| contents.join(METALLIB_IN_BUNDLE))
}

/// Where MLX 0.32 looks for its kernels when no path was set, in its order
/// (`Device::Device` in mlx/backend/metal/device.cpp): beside the libmlx it
/// runs from, as `mlx.metallib`, `Resources/mlx.metallib` and
/// `Resources/default.metallib`. Its last place, the build folder compiled
/// into libmlx on the machine that built it, is not known here and never
/// exists on a user's Mac.
pub fn mlx_search_order(libmlx_dir: &Path) -> Vec<PathBuf> {
    vec![
        libmlx_dir.join(METALLIB_FILE),
        libmlx_dir.join("Resources").join(METALLIB_FILE),
        libmlx_dir.join("Resources").join("default.metallib"),
    ]
}

/// Where one process's kernels are looked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelSearch {
    /// The app bundle's kernels, when this executable is inside a bundle
    /// (whether or not the file is there).
    pub in_bundle: Option<PathBuf>,
    /// Ondo told MLX to load `in_bundle` (it exists); MLX then looks
    /// nowhere else.
    pub told_mlx: bool,
    /// The folder of the libmlx this process loaded, when it can be told.
    pub libmlx_dir: Option<PathBuf>,
}

impl KernelSearch {
    /// The files looked at, in order: the one Ondo named to MLX, or the
    /// bundle's (missing) file and then MLX's own search.
    pub fn looked_in(&self) -> Vec<PathBuf> {
        if self.told_mlx {
            return self.in_bundle.iter().cloned().collect();
        }
        let mut paths: Vec<PathBuf> = self.in_bundle.iter().cloned().collect();
        if let Some(dir) = &self.libmlx_dir {
            paths.extend(mlx_search_order(dir));
        }
        paths
    }
}

/// What the start-up check saw on a Mac: the GPU MLX computes on, the
/// kernels it loaded, and every place they were looked for (all that is
/// known when MLX could not use the GPU).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct MetalReport {
    /// The GPU's name as MLX reports it ("Apple M2 Pro"); `None` when MLX
    /// could not create its Metal device.
    pub device_name: Option<String>,
    /// The kernels MLX loaded; `None` when it loaded none, or found them
    /// only in the build folder compiled into libmlx.
    pub metallib: Option<PathBuf>,
    /// The oldest macOS that file loads on, from its header ("14.0").
    pub metallib_macos: Option<String>,
    /// The libmlx.dylib this process runs.
    pub libmlx: Option<PathBuf>,
    /// Every file looked at for the kernels, in order.
    pub looked_in: Vec<PathBuf>,
}

impl MetalReport {
    /// What is known before MLX is asked: where it looks.
    pub fn of_search(search: &KernelSearch) -> Self {
        Self {
            device_name: None,
            metallib: None,
            metallib_macos: None,
            libmlx: search
                .libmlx_dir
                .as_ref()
                .map(|dir| dir.join("libmlx.dylib")),
            looked_in: search.looked_in(),
        }
    }
}

/// Why MLX cannot use this Mac's GPU.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetalError {
    /// MLX found no Metal device (a virtual machine, a remote or sandboxed
    /// session without the GPU).
    #[error(
        "MLX could not use a Metal GPU ({mlx_says}); Ondo runs models on an Apple Silicon \
         Mac's GPU, which virtual machines and some remote or sandboxed sessions do not offer"
    )]
    NoDevice { mlx_says: String },
    /// None of the places MLX looks holds the kernels.
    #[error(
        "MLX's Metal kernels ({METALLIB_FILE}) were not found, so no model can run; looked for \
         them {}. Reinstall Ondo from its disk image, which carries them in \
         Ondo.app/Contents/Resources",
        list_paths(looked_in)
    )]
    KernelsMissing { looked_in: Vec<PathBuf> },
    /// A kernels file is there but MLX could not load it: built for a newer
    /// macOS, from another MLX release, or damaged.
    #[error("MLX could not load its Metal kernels from {} ({mlx_says}); {}", path.display(), why_unloadable(needs_macos.as_deref(), this_macos.as_deref()))]
    KernelsUnloadable {
        path: PathBuf,
        /// The oldest macOS the file loads on, from its header.
        needs_macos: Option<String>,
        /// The macOS this Mac runs.
        this_macos: Option<String>,
        mlx_says: String,
    },
}

impl MetalError {
    /// The stable name the app and the CLI branch on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NoDevice { .. } => ErrorKind::MetalUnavailable,
            Self::KernelsMissing { .. } | Self::KernelsUnloadable { .. } => {
                ErrorKind::MetalKernelsUnavailable
            }
        }
    }
}

fn list_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        // libmlx's folder could not be told: MLX looked only where it was built.
        return "only where libmlx was built".to_owned();
    }
    let listed: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    format!("at {} and where libmlx was built", listed.join(", "))
}

fn why_unloadable(needs_macos: Option<&str>, this_macos: Option<&str>) -> String {
    match (needs_macos, this_macos) {
        (Some(needs), Some(this)) if version_is_newer(needs, this) => format!(
            "the file is for macOS {needs} and later and this Mac runs macOS {this}: install \
             the Ondo release made for this macOS, or update macOS"
        ),
        _ => "the file is damaged or from another MLX release: reinstall Ondo from its disk image"
            .to_owned(),
    }
}

/// True when version `a` ("15.0") is newer than `b` ("14.6.1").
fn version_is_newer(a: &str, b: &str) -> bool {
    let parts = |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    let (a, b) = (parts(a), parts(b));
    let width = a.len().max(b.len());
    let at = |v: &[u32], i: usize| v.get(i).copied().unwrap_or(0);
    (0..width)
        .map(|i| at(&a, i).cmp(&at(&b, i)))
        .find(|order| order.is_ne())
        .is_some_and(|order| order.is_gt())
}

/// The oldest macOS a metallib loads on, from its first 16 bytes: Apple's
/// metallib files start with `MTLB`, and bytes 12 to 15 hold the target
/// macOS as two little-endian 16-bit numbers, major then minor. (The three
/// mlx-metal 0.32.4 wheels read 14.0, 15.0 and 26.2 there, matching their
/// platform tags and their libmlx's minimum macOS.) `None` for bytes that
/// are not a metallib.
pub fn metallib_macos(header: &[u8]) -> Option<String> {
    if header.len() < 16 || &header[..4] != b"MTLB" {
        return None;
    }
    let major = u16::from_le_bytes([header[12], header[13]]);
    let minor = u16::from_le_bytes([header[14], header[15]]);
    (major > 0).then(|| format!("{major}.{minor}"))
}

/// Turns MLX's failure into what the user is told: no device, no kernels
/// anywhere it looked, or kernels that would not load (and, from the file's
/// header, whether they are for a newer macOS). `header_of` reads a file's
/// first bytes (`None` when there is no file); `this_macos` is this Mac's
/// version.
pub fn diagnose(
    search: &KernelSearch,
    mlx_says: &str,
    this_macos: Option<&str>,
    header_of: impl Fn(&Path) -> Option<Vec<u8>>,
) -> MetalError {
    let mlx_says = crate::engine::mlx_failure(&mlx_says).trim().to_owned();
    // MLX 0.32: "[metal::load_device] No Metal device available. ..."
    // (older releases: "Failed to load device").
    if mlx_says.contains("load_device") || mlx_says.contains("Failed to load device") {
        return MetalError::NoDevice { mlx_says };
    }
    let looked_in = search.looked_in();
    match looked_in
        .iter()
        .find_map(|path| header_of(path).map(|header| (path, header)))
    {
        Some((path, header)) => MetalError::KernelsUnloadable {
            path: path.clone(),
            needs_macos: metallib_macos(&header),
            this_macos: this_macos.map(str::to_owned),
            mlx_says,
        },
        None => MetalError::KernelsMissing { looked_in },
    }
}

/// Tells MLX to load the app bundle's kernels when this executable runs
/// from Ondo.app, and returns where this process's kernels are looked for.
/// MLX reads the path once, when it creates its Metal device, so both
/// binaries call this first thing in `main`; later calls return the same
/// answer. Outside a bundle MLX finds the kernels beside libmlx itself.
pub fn use_bundled_kernels() -> &'static KernelSearch {
    static SEARCH: OnceLock<KernelSearch> = OnceLock::new();
    SEARCH.get_or_init(|| {
        #[cfg(target_os = "macos")]
        {
            on_a_mac::use_bundled_kernels()
        }
        #[cfg(not(target_os = "macos"))]
        {
            KernelSearch::default()
        }
    })
}

/// Checks that MLX can create its Metal device, load its kernels and run
/// one: `Ok(None)` where this MLX has no Metal backend (Linux). Runs MLX
/// work, so the app calls it through the session pool's engine thread.
pub fn check() -> Result<Option<MetalReport>, MetalError> {
    #[cfg(target_os = "macos")]
    {
        on_a_mac::check().map(Some)
    }
    #[cfg(not(target_os = "macos"))]
    {
        Ok(None)
    }
}

#[cfg(target_os = "macos")]
mod on_a_mac {
    use std::ffi::{CStr, CString, OsStr};
    use std::os::unix::ffi::OsStrExt;
    use std::path::PathBuf;

    use mlx_rs::{Array, Device, Stream};

    use super::{KernelSearch, MetalError, MetalReport, bundled_metallib};

    /// The first 16 bytes of `path`, when it is a readable file.
    fn read_header(path: &std::path::Path) -> Option<Vec<u8>> {
        use std::io::Read;
        let mut header = Vec::with_capacity(16);
        std::fs::File::open(path)
            .ok()?
            .take(16)
            .read_to_end(&mut header)
            .ok()?;
        Some(header)
    }

    pub(super) fn use_bundled_kernels() -> KernelSearch {
        let in_bundle = std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .ok()
            .and_then(|exe| bundled_metallib(&exe));
        let told_mlx = match &in_bundle {
            Some(path) if path.is_file() => tell_mlx(path),
            _ => false,
        };
        KernelSearch {
            in_bundle,
            told_mlx,
            libmlx_dir: libmlx_dir(),
        }
    }

    /// Names the kernels' file to MLX; true when MLX took it.
    fn tell_mlx(path: &std::path::Path) -> bool {
        let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: MLX copies the string; it only stores the path here and
        // reads it when it creates its Metal device.
        unsafe { mlx_sys::mlx_metal_set_metallib_path(path.as_ptr()) == 0 }
    }

    // dyld's list of the images loaded into this process (<mach-o/dyld.h>,
    // in libSystem, which every binary links).
    unsafe extern "C" {
        fn _dyld_image_count() -> u32;
        fn _dyld_get_image_name(image_index: u32) -> *const std::ffi::c_char;
    }

    /// The folder of the libmlx.dylib dyld loaded into this process.
    fn libmlx_dir() -> Option<PathBuf> {
        // SAFETY: dyld's image list is read by index below its count; each
        // name is a C string dyld owns for as long as the image is loaded
        // (libmlx stays loaded for the life of the process).
        let count = unsafe { _dyld_image_count() };
        (0..count).find_map(|index| {
            let name = unsafe { _dyld_get_image_name(index) };
            if name.is_null() {
                return None;
            }
            let path = PathBuf::from(OsStr::from_bytes(
                unsafe { CStr::from_ptr(name) }.to_bytes(),
            ));
            let dir = (path.file_name()? == "libmlx.dylib").then(|| path.parent())??;
            // dyld names it as the rpath made it (`.../MacOS/../Frameworks`).
            Some(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()))
        })
    }

    pub(super) fn check() -> Result<MetalReport, MetalError> {
        let search = super::use_bundled_kernels();
        if let Err(mlx_says) = compute_on_the_gpu() {
            return Err(super::diagnose(
                search,
                &mlx_says,
                ondo_os::macos_version().as_deref(),
                read_header,
            ));
        }
        let mut report = MetalReport::of_search(search);
        // MLX loaded the first file of its search that loads.
        report.metallib = report.looked_in.iter().find(|path| path.is_file()).cloned();
        report.metallib_macos = report
            .metallib
            .as_deref()
            .and_then(read_header)
            .and_then(|header| super::metallib_macos(&header));
        report.device_name = crate::metrics::mlx_runtime::gpu_name();
        Ok(report)
    }

    /// Doubles three numbers on the GPU. Creating MLX's Metal device loads
    /// the kernels (its constructor does), and evaluating runs one of them.
    fn compute_on_the_gpu() -> Result<(), String> {
        // Through mlx-rs first: it installs the error handler that turns
        // MLX's exceptions into errors. mlx-c's default handler, which the
        // raw stream call below would otherwise meet, exits the process.
        // On Metal this also creates the device (the allocator needs it).
        mlx_rs::memory::active_memory().map_err(|e| e.what().to_owned())?;
        let gpu = Stream::new_with_device(&Device::gpu());
        let doubled = mlx_rs::with_stream(&gpu, || {
            let numbers = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
            let doubled = numbers.add(&numbers)?;
            doubled.eval()?;
            Ok::<_, mlx_rs::error::Exception>(doubled.as_slice::<f32>().to_vec())
        })
        .map_err(|e| e.what().to_owned())?;
        if doubled == [2.0, 4.0, 6.0] {
            Ok(())
        } else {
            Err(format!("doubling 1, 2, 3 on the GPU gave {doubled:?}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What MLX 0.32.x says when none of its places holds the kernels, as
    /// mlx-rs hands it over (mlx-c's location appended, quoted).
    const MLX_FOUND_NO_KERNELS: &str = "\"Failed to load the default metallib. library not found \
        library not found library not found library not found  at /Users/runner/mlx-c/mlx/c/array.cpp:288\" \
        at /Users/dev/.cargo/registry/src/mlx-rs-0.33.0/src/utils/guard.rs:37:23";

    fn a_bundle() -> KernelSearch {
        KernelSearch {
            in_bundle: Some("/Applications/Ondo.app/Contents/Resources/mlx.metallib".into()),
            told_mlx: false,
            libmlx_dir: Some("/Applications/Ondo.app/Contents/Frameworks".into()),
        }
    }

    fn header_for_macos(major: u16, minor: u16) -> Vec<u8> {
        let mut header = b"MTLB".to_vec();
        header.extend([0x01, 0x80, 0x02, 0x00, 0x07, 0x00, 0x00, 0x81]);
        header.extend(major.to_le_bytes());
        header.extend(minor.to_le_bytes());
        header
    }

    #[test]
    fn the_bundle_keeps_its_kernels_in_resources() {
        assert_eq!(
            bundled_metallib(Path::new("/Applications/Ondo.app/Contents/MacOS/ondo-app")),
            Some("/Applications/Ondo.app/Contents/Resources/mlx.metallib".into())
        );
        assert_eq!(
            bundled_metallib(Path::new("/Applications/Ondo.app/Contents/MacOS/ondo")),
            Some("/Applications/Ondo.app/Contents/Resources/mlx.metallib".into())
        );
        assert_eq!(
            bundled_metallib(Path::new("/work/target/release/ondo")),
            None
        );
        assert_eq!(bundled_metallib(Path::new("ondo")), None);
    }

    #[test]
    fn a_bundle_without_its_kernels_says_what_is_missing_and_every_place_looked() {
        let error = diagnose(&a_bundle(), MLX_FOUND_NO_KERNELS, Some("14.5"), |_| None);
        assert_eq!(error.kind(), ErrorKind::MetalKernelsUnavailable);
        let message = error.to_string();
        for shown in [
            "mlx.metallib",
            "were not found",
            "/Applications/Ondo.app/Contents/Resources/mlx.metallib",
            "/Applications/Ondo.app/Contents/Frameworks/mlx.metallib",
            "/Applications/Ondo.app/Contents/Frameworks/Resources/mlx.metallib",
            "/Applications/Ondo.app/Contents/Frameworks/Resources/default.metallib",
            "where libmlx was built",
            "Reinstall Ondo",
        ] {
            assert!(message.contains(shown), "{shown:?} missing from: {message}");
        }
        assert_eq!(out_of_place(&message), None, "{message}");
    }

    #[test]
    fn kernels_for_a_newer_macos_say_which_macos_they_need() {
        let search = KernelSearch {
            told_mlx: true,
            ..a_bundle()
        };
        let mlx_says = "Can not load metallib from specified location \
            \"/Applications/Ondo.app/Contents/Resources/mlx.metallib\": Invalid library file.";
        let error = diagnose(&search, mlx_says, Some("14.5"), |path| {
            (path == Path::new("/Applications/Ondo.app/Contents/Resources/mlx.metallib"))
                .then(|| header_for_macos(15, 0))
        });
        assert_eq!(error.kind(), ErrorKind::MetalKernelsUnavailable);
        let message = error.to_string();
        for shown in [
            "could not load its Metal kernels from /Applications/Ondo.app/Contents/Resources/mlx.metallib",
            "Invalid library file",
            "macOS 15.0 and later",
            "this Mac runs macOS 14.5",
        ] {
            assert!(message.contains(shown), "{shown:?} missing from: {message}");
        }
        assert_eq!(out_of_place(&message), None, "{message}");
    }

    #[test]
    fn kernels_that_suit_this_macos_but_do_not_load_are_called_damaged() {
        let error = diagnose(
            &a_bundle(),
            "Failed to load the default metallib. Invalid library file",
            Some("15.1"),
            |path| {
                path.ends_with("Frameworks/mlx.metallib")
                    .then(|| header_for_macos(14, 0))
            },
        );
        let message = error.to_string();
        assert!(message.contains("Frameworks/mlx.metallib"), "{message}");
        assert!(
            message.contains("damaged or from another MLX release"),
            "{message}"
        );
    }

    #[test]
    fn no_metal_device_is_not_blamed_on_the_kernels() {
        let mlx_says = "[metal::load_device] No Metal device available. This typically occurs \
            in headless, sandboxed, or virtualized macOS sessions where the GPU is not accessible.";
        let error = diagnose(&a_bundle(), mlx_says, Some("14.5"), |_| {
            Some(header_for_macos(14, 0))
        });
        assert_eq!(error.kind(), ErrorKind::MetalUnavailable);
        assert!(error.to_string().contains("virtual machines"), "{error}");
    }

    #[test]
    fn told_mlx_means_mlx_looked_only_at_the_bundle() {
        let search = KernelSearch {
            told_mlx: true,
            ..a_bundle()
        };
        assert_eq!(
            search.looked_in(),
            vec![PathBuf::from(
                "/Applications/Ondo.app/Contents/Resources/mlx.metallib"
            )]
        );
        let outside = KernelSearch {
            in_bundle: None,
            told_mlx: false,
            libmlx_dir: Some("/src/ondo/target/mlx-metal/mlx/lib".into()),
        };
        assert_eq!(
            outside.looked_in(),
            mlx_search_order(Path::new("/src/ondo/target/mlx-metal/mlx/lib"))
        );
    }

    #[test]
    fn the_header_gives_the_oldest_macos() {
        assert_eq!(
            metallib_macos(&header_for_macos(14, 0)).as_deref(),
            Some("14.0")
        );
        assert_eq!(
            metallib_macos(&header_for_macos(26, 2)).as_deref(),
            Some("26.2")
        );
        assert_eq!(metallib_macos(b"not a metal library"), None);
        assert_eq!(metallib_macos(b"MTLB"), None);
    }

    #[test]
    fn versions_compare_by_number() {
        assert!(version_is_newer("15.0", "14.6.1"));
        assert!(version_is_newer("26.2", "26"));
        assert!(!version_is_newer("14.0", "14.0"));
        assert!(!version_is_newer("14.0", "14.10"));
        assert!(!version_is_newer("9.0", "14.0"));
    }

    #[test]
    fn off_a_mac_there_is_nothing_to_check() {
        if cfg!(not(target_os = "macos")) {
            assert_eq!(check(), Ok(None));
            assert_eq!(use_bundled_kernels(), &KernelSearch::default());
        }
    }

    /// One error of every variant, with its kind; the match fails to
    /// compile when a variant is added without an example here.
    fn one_of_each() -> Vec<(MetalError, ErrorKind)> {
        let examples = vec![
            MetalError::NoDevice {
                mlx_says: "[metal::load_device] No Metal device available.".into(),
            },
            MetalError::KernelsMissing {
                looked_in: a_bundle().looked_in(),
            },
            MetalError::KernelsUnloadable {
                path: "/Applications/Ondo.app/Contents/Resources/mlx.metallib".into(),
                needs_macos: Some("26.2".into()),
                this_macos: Some("15.1".into()),
                mlx_says: "Invalid library file".into(),
            },
        ];
        examples
            .into_iter()
            .map(|error| {
                let kind = match &error {
                    MetalError::NoDevice { .. } => ErrorKind::MetalUnavailable,
                    MetalError::KernelsMissing { .. } | MetalError::KernelsUnloadable { .. } => {
                        ErrorKind::MetalKernelsUnavailable
                    }
                };
                (error, kind)
            })
            .collect()
    }

    #[test]
    fn every_error_has_its_kind_and_words_for_the_app_and_the_terminal() {
        for (error, kind) in one_of_each() {
            assert_eq!(error.kind(), kind, "{error}");
            assert_eq!(out_of_place(&error.to_string()), None, "{error}");
        }
    }

    fn out_of_place(message: &str) -> Option<&'static str> {
        crate::error_kind::out_of_place_in_the_app(message)
    }
}
