//! Every environment variable of Ondo's own (`ONDO_*`), each defined once:
//! its name, what it is for, its default and who reads it. The program's
//! code reads them only through this module (no other file of the library
//! names one); README lists them all, and `ondo doctor` prints those set. A
//! test checks both.

use std::ffi::OsString;

/// Who reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadBy {
    /// The `ondo` command and the app.
    Ondo,
    /// Ondo itself, for measurements: a knob that changes how a model is
    /// computed, never needed to use Ondo.
    Tuning,
    /// Ondo's build (build.rs) or its scripts and tests, not the program.
    BuildAndTests,
}

/// One `ONDO_*` variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    pub name: &'static str,
    /// What it is for, in a line.
    pub purpose: &'static str,
    /// What happens when it is unset.
    pub default: &'static str,
    pub read_by: ReadBy,
}

impl Variable {
    /// Its value, `None` when unset or empty.
    pub fn value(&self) -> Option<String> {
        std::env::var(self.name).ok().filter(|v| !v.is_empty())
    }

    /// Its value as the OS gave it (a path), `None` when unset or empty.
    pub fn os_value(&self) -> Option<OsString> {
        std::env::var_os(self.name).filter(|v| !v.is_empty())
    }

    /// True when set to anything but empty.
    pub fn is_set(&self) -> bool {
        self.os_value().is_some()
    }

    /// Its value parsed, `None` when unset or not of that type.
    pub fn parsed<T: std::str::FromStr>(&self) -> Option<T> {
        self.value()?.trim().parse().ok()
    }

    /// Its value as a size in bytes ("900MiB", "12GiB", "1.5G", "4096"),
    /// `None` when unset; an error saying how to write one when it is not.
    pub fn bytes(&self) -> Option<Result<u64, String>> {
        let value = self.value()?;
        Some(parse_bytes(&value).ok_or_else(|| {
            format!(
                "{}={value} is not a size: write it as bytes or with a unit, like 900MiB or 12GiB",
                self.name
            )
        }))
    }

    /// `Some(false)` for `0`, `Some(true)` for `1`, `None` otherwise: the
    /// on/off switches, whose unset default each reader decides.
    pub fn switch(&self) -> Option<bool> {
        match self.value()?.trim() {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        }
    }
}

pub const HOME: Variable = Variable {
    name: "ONDO_HOME",
    purpose: "Ondo's own data folder: the run history, settings and the models Ondo made",
    default: "~/Library/Application Support/ondo on macOS, ~/.local/share/ondo on Linux",
    read_by: ReadBy::Ondo,
};

pub const API_KEY: Variable = Variable {
    name: "ONDO_API_KEY",
    purpose: "the key `ondo serve` asks every client for (as `--api-key`)",
    default: "no key: only this machine may connect",
    read_by: ReadBy::Ondo,
};

pub const PYTHON: Variable = Variable {
    name: "ONDO_PYTHON",
    purpose: "the Python with mlx-lm that `ondo bench --peer mlx-lm` runs (and the tests compare with)",
    default: "--python, else the project's .venv, else python3",
    read_by: ReadBy::Ondo,
};

pub const NO_KEYCHAIN: Variable = Variable {
    name: "ONDO_NO_KEYCHAIN",
    purpose: "never asks the macOS keychain or the Secret Service for a Hugging Face token (tests and CI set it)",
    default: "the keychain is read when no HF_TOKEN or token file gives one",
    read_by: ReadBy::Ondo,
};

pub const RANK_JOIN_TIMEOUT_S: Variable = Variable {
    name: "ONDO_RANK_JOIN_TIMEOUT_S",
    purpose: "how long a rank of a split run waits for every other rank to start, in seconds",
    default: "60",
    read_by: ReadBy::Ondo,
};

pub const MEMORY_LIMIT: Variable = Variable {
    name: "ONDO_MEMORY_LIMIT",
    purpose: "the most memory a model may take on this machine (like 12GiB): fit checks count no more as free; on each rank of a split run, its own",
    default: "what the system says is available",
    read_by: ReadBy::Ondo,
};

/// `ONDO_MEMORY_LIMIT` in bytes, when it is set and reads as a size (a
/// value that does not is refused where a command starts).
pub fn memory_limit() -> Option<u64> {
    MEMORY_LIMIT.bytes().and_then(Result::ok)
}

pub const SPLIT: Variable = Variable {
    name: "ONDO_SPLIT",
    purpose: "how a rank of a split run divides a model: pipeline (a range of layers each) or tensor (a share of every layer's heads)",
    default: "pipeline",
    read_by: ReadBy::Ondo,
};

pub const CLI: Variable = Variable {
    name: "ONDO_CLI",
    purpose: "the `ondo` command the app starts to run a model split over several machines",
    default: "the one beside the app",
    read_by: ReadBy::Ondo,
};

pub const RANK_STALL_TIMEOUT_S: Variable = Variable {
    name: "ONDO_RANK_STALL_TIMEOUT_S",
    purpose: "how long a split run may go without a token before its rank gives up on the others, in seconds",
    default: "300",
    read_by: ReadBy::Ondo,
};

pub const SPAWNED_AT_NS: Variable = Variable {
    name: "ONDO_SPAWNED_AT_NS",
    purpose: "set by Ondo for a process it starts to time a cold start from (nanoseconds since the Unix epoch)",
    default: "the process times its cold start from its own start",
    read_by: ReadBy::Ondo,
};

pub const DUMP_GRAPH: Variable = Variable {
    name: "ONDO_DUMP_GRAPH",
    purpose: "prints the decode step graph a benchmark counts to standard error",
    default: "not printed",
    read_by: ReadBy::Tuning,
};

pub const JOIN_PROJECTIONS: Variable = Variable {
    name: "ONDO_JOIN_PROJECTIONS",
    purpose: "1 or 0: one matmul for q, k and v (and for gate and up) in a decode step, or one each",
    default: "joined on a GPU, apart on the CPU",
    read_by: ReadBy::Tuning,
};

pub const CUDA_MATVEC: Variable = Variable {
    name: "ONDO_CUDA_MATVEC",
    purpose: "0 turns off Ondo's 4-bit matrix-vector kernel on MLX's CUDA backend",
    default: "on wherever MLX runs on a CUDA GPU",
    read_by: ReadBy::Tuning,
};

pub const CUDA_MATVEC_MIN: Variable = Variable {
    name: "ONDO_CUDA_MATVEC_MIN",
    purpose: "the smallest matrix (in weights) Ondo's CUDA kernel takes",
    default: "16777216 (2^24)",
    read_by: ReadBy::Tuning,
};

pub const CUDA_MATVEC_MIN_ADD: Variable = Variable {
    name: "ONDO_CUDA_MATVEC_MIN_ADD",
    purpose: "the same for a product a residual add follows",
    default: "0 (every such product)",
    read_by: ReadBy::Tuning,
};

pub const CUDA_MATVEC_RESIDUAL: Variable = Variable {
    name: "ONDO_CUDA_MATVEC_RESIDUAL",
    purpose: "0 leaves the residual add after a product to MLX instead of Ondo's CUDA kernel",
    default: "the kernel makes the add",
    read_by: ReadBy::Tuning,
};

pub const CUDA_MATVEC_LAUNCH: Variable = Variable {
    name: "ONDO_CUDA_MATVEC_LAUNCH",
    purpose: "ROWSxCHUNKS (as 8x1): the rows per warp and 16-byte chunks per round of Ondo's CUDA kernel",
    default: "4x1",
    read_by: ReadBy::Tuning,
};

pub const CUDA_MATVEC_SPLIT: Variable = Variable {
    name: "ONDO_CUDA_MATVEC_SPLIT",
    purpose: "1, 2 or 4: the warps that share a row set in Ondo's CUDA kernel",
    default: "chosen per matrix shape",
    read_by: ReadBy::Tuning,
};

pub const CUDA_MATVEC_SOURCE: Variable = Variable {
    name: "ONDO_CUDA_MATVEC_SOURCE",
    purpose: "a file with a variant of Ondo's CUDA kernel to run instead of the built-in one",
    default: "the built-in kernel",
    read_by: ReadBy::Tuning,
};

pub const REQUIRE_PYTHON: Variable = Variable {
    name: "ONDO_REQUIRE_PYTHON",
    purpose: "the tests that compare with Python may not be skipped (`make test` sets it)",
    default: "a test without Python fails, unless ONDO_SKIP_PYTHON asks to skip it",
    read_by: ReadBy::BuildAndTests,
};

pub const SKIP_PYTHON: Variable = Variable {
    name: "ONDO_SKIP_PYTHON",
    purpose: "1 reports the tests that compare with Python as ignored where there is no Python",
    default: "they fail, saying to run make setup",
    read_by: ReadBy::BuildAndTests,
};

pub const SKIP_MACOS_CHECK: Variable = Variable {
    name: "ONDO_SKIP_MACOS_CHECK",
    purpose: "1 skips the macOS type-check of `make test` where the macOS std cannot be added (never in CI)",
    default: "the check runs, and fails if it cannot",
    read_by: ReadBy::BuildAndTests,
};

pub const MLX: Variable = Variable {
    name: "ONDO_MLX",
    purpose: "cuda puts MLX's CUDA build in the project venv instead of the CPU build (scripts/setup.sh)",
    default: "cpu",
    read_by: ReadBy::BuildAndTests,
};

pub const MACOS_BUNDLE: Variable = Variable {
    name: "ONDO_MACOS_BUNDLE",
    purpose: "1 builds the binaries for Ondo.app alone, without a path to this machine's MLX (make dmg)",
    default: "the binaries also find MLX where it was built against",
    read_by: ReadBy::BuildAndTests,
};

pub const PROMPT_CACHE: Variable = Variable {
    name: "ONDO_PROMPT_CACHE",
    purpose: "0 turns off the prompt cache on disk (nothing saved, nothing read back)",
    default: "on, in the prompt-cache folder of Ondo's data folder",
    read_by: ReadBy::Ondo,
};

pub const PROMPT_CACHE_MIN_TOKENS: Variable = Variable {
    name: "ONDO_PROMPT_CACHE_MIN_TOKENS",
    purpose: "the shortest prompt prefix saved to and read from the disk cache, in tokens",
    default: "256",
    read_by: ReadBy::Tuning,
};

pub const TEST_CACHE_WRITE_PAUSE_MS: Variable = Variable {
    name: "ONDO_TEST_CACHE_WRITE_PAUSE_MS",
    purpose: "pauses a prompt cache write between tensors, so a fault test can kill the process mid-write",
    default: "no pause",
    read_by: ReadBy::BuildAndTests,
};

pub const WRITE_BINDINGS: Variable = Variable {
    name: "ONDO_WRITE_BINDINGS",
    purpose: "1 makes the app's bindings test rewrite ui/src/lib/bindings.ts from the Rust types",
    default: "the test fails when the file is out of date",
    read_by: ReadBy::BuildAndTests,
};

/// Every variable, in the order README lists them.
pub const ALL: &[Variable] = &[
    HOME,
    API_KEY,
    PYTHON,
    NO_KEYCHAIN,
    PROMPT_CACHE,
    RANK_JOIN_TIMEOUT_S,
    MEMORY_LIMIT,
    SPLIT,
    CLI,
    RANK_STALL_TIMEOUT_S,
    SPAWNED_AT_NS,
    DUMP_GRAPH,
    JOIN_PROJECTIONS,
    PROMPT_CACHE_MIN_TOKENS,
    CUDA_MATVEC,
    CUDA_MATVEC_MIN,
    CUDA_MATVEC_MIN_ADD,
    CUDA_MATVEC_RESIDUAL,
    CUDA_MATVEC_LAUNCH,
    CUDA_MATVEC_SPLIT,
    CUDA_MATVEC_SOURCE,
    REQUIRE_PYTHON,
    SKIP_PYTHON,
    SKIP_MACOS_CHECK,
    MLX,
    MACOS_BUNDLE,
    TEST_CACHE_WRITE_PAUSE_MS,
    WRITE_BINDINGS,
];

/// The variables set in this process, with their values (API_KEY's shown as
/// set, never its value): what `ondo doctor` prints.
pub fn set_now() -> Vec<(Variable, String)> {
    ALL.iter()
        .filter_map(|variable| {
            let value = variable.value()?;
            let shown = if variable.name == API_KEY.name {
                "(set)".to_owned()
            } else {
                value
            };
            Some((*variable, shown))
        })
        .collect()
}

/// A size in bytes: a number, optionally with a unit (B, K/KB/KiB, M/MB/MiB,
/// G/GB/GiB, T/TB/TiB; every unit counted in powers of 1024, as memory is).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let power = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 1,
        "m" | "mb" | "mib" => 2,
        "g" | "gb" | "gib" => 3,
        "t" | "tb" | "tib" => 4,
        _ => return None,
    };
    let bytes = number * 1024f64.powi(power);
    (bytes.is_finite() && bytes >= 0.0).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_with_or_without_a_unit() {
        assert_eq!(super::parse_bytes("4096"), Some(4096));
        assert_eq!(super::parse_bytes("900MiB"), Some(900 << 20));
        assert_eq!(super::parse_bytes("1.5 GB"), Some(3 << 29));
        assert_eq!(super::parse_bytes("12g"), Some(12 << 30));
        assert_eq!(super::parse_bytes("lots"), None);
        assert_eq!(super::parse_bytes("12 parsecs"), None);
    }

    use super::*;

    #[test]
    fn each_variable_is_listed_once_with_its_purpose_and_default() {
        for (i, variable) in ALL.iter().enumerate() {
            assert!(variable.name.starts_with("ONDO_"), "{}", variable.name);
            assert!(!variable.purpose.is_empty() && !variable.default.is_empty());
            assert!(
                ALL[..i].iter().all(|other| other.name != variable.name),
                "{} listed twice",
                variable.name
            );
        }
    }

    /// README's table of variables names every one, and no other.
    #[test]
    fn readme_lists_every_variable() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
            .expect("README.md");
        for variable in ALL {
            assert!(
                readme.contains(&format!("| `{}` |", variable.name)),
                "README's table of environment variables lacks {}",
                variable.name
            );
        }
        let listed = readme
            .lines()
            .filter(|line| line.starts_with("| `ONDO_"))
            .count();
        assert_eq!(listed, ALL.len(), "README lists a variable ALL does not");
    }

    /// No other file of the program names an `ONDO_*` variable: each is
    /// read through this module.
    #[test]
    fn no_other_file_of_the_program_names_one() {
        fn rust_files(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    rust_files(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    found.push(path);
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        rust_files(&root.join("src"), &mut files);
        rust_files(&root.join("src-tauri/src"), &mut files);
        let mut named = Vec::new();
        for file in files.iter().filter(|f| !f.ends_with("environment.rs")) {
            let text = std::fs::read_to_string(file).unwrap();
            // The program's code, not its tests (which set variables for
            // the processes they start).
            let code = match text.find("\n#[cfg(test)]\nmod ") {
                Some(at) => &text[..at],
                None => &text,
            };
            // `env!("ONDO_GIT_COMMIT")` is the build's, not a variable read.
            if code.replace("env!(\"ONDO_", "").contains("\"ONDO_") {
                named.push(file.display().to_string());
            }
        }
        assert!(
            named.is_empty(),
            "name ONDO_ variables outside environment.rs: {named:?}"
        );
    }
}
