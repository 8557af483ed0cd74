//! Settings MLX reads from the environment once, at its first use, that Ondo
//! chooses for its own process where the user did not. They must be in the
//! environment before the first MLX call, so `apply` runs first thing in
//! `main` (the CLI's and the app's), before any thread starts.
//!
//! A process Ondo starts to compare against (the mlx-lm peer of `ondo
//! bench`) gets the user's environment, not these: the comparison is with
//! mlx-lm as the user would run it.

use std::ffi::OsString;
use std::sync::OnceLock;

/// MLX's CUDA backend records a step's kernels into CUDA graphs of 20 and
/// keeps each executable graph by the shape of its dependencies, so a graph
/// seen before is updated rather than built again; past
/// `MLX_CUDA_GRAPH_CACHE_SIZE` graphs (100 by default) it drops every one
/// of them. On the H200, an 8B decode step queues about 360 kernels, and
/// with room for 1000 graphs the pipelined loop decoded faster in 10 of 12
/// rounds interleaved with MLX's default, over three device sessions
/// (median of the paired differences +3.7%; the sync loop within its noise;
/// docs/benchmarks-log.md, "The whole gpu-bench again, MLX's CUDA graph
/// cache"). The variable means nothing to MLX on a Mac (Metal), so there
/// Ondo sets nothing.
const CUDA_GRAPH_CACHE: (&str, &str) = ("MLX_CUDA_GRAPH_CACHE_SIZE", "1000");

/// Ondo's settings: none on a Mac, where MLX runs on Metal.
const SETTINGS: &[(&str, &str)] = if cfg!(target_os = "macos") {
    &[]
} else {
    &[CUDA_GRAPH_CACHE]
};

/// The settings to put in the environment: those the user has not set
/// (`lookup` reads the environment; a variable set empty is the user's
/// choice too).
pub fn to_apply(lookup: impl Fn(&str) -> Option<OsString>) -> Vec<(&'static str, &'static str)> {
    SETTINGS
        .iter()
        .copied()
        .filter(|(name, _)| lookup(name).is_none())
        .collect()
}

/// What `apply` put in this process's environment.
fn applied() -> &'static OnceLock<Vec<(&'static str, &'static str)>> {
    static APPLIED: OnceLock<Vec<(&'static str, &'static str)>> = OnceLock::new();
    &APPLIED
}

/// Puts Ondo's settings the user has not set into this process's
/// environment. Call before any MLX call and before any thread starts.
pub fn apply() {
    applied().get_or_init(|| {
        let settings = to_apply(|name| std::env::var_os(name));
        for (name, value) in &settings {
            // SAFETY: called first thing in `main`, before any thread that
            // could read the environment exists.
            unsafe { std::env::set_var(name, value) };
        }
        settings
    });
}

/// Each of Ondo's settings this process has, with its value and who chose
/// it, as `ondo doctor` shows them: `("NAME", "VALUE (Ondo's default)")` or
/// `("NAME", "VALUE (yours)")`.
pub fn in_effect() -> Vec<(&'static str, String)> {
    let ours: Vec<&str> = set_by_ondo().collect();
    SETTINGS
        .iter()
        .filter_map(|&(name, _)| {
            let value = std::env::var_os(name)?;
            let who = if ours.contains(&name) {
                "Ondo's default"
            } else {
                "yours"
            };
            Some((name, format!("{} ({who})", value.to_string_lossy())))
        })
        .collect()
}

/// The variables `apply` set (not the user), which a process Ondo starts
/// to compare against should not inherit.
pub fn set_by_ondo() -> impl Iterator<Item = &'static str> {
    applied().get().into_iter().flatten().map(|(name, _)| *name)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::ffi::OsString;

    fn with(vars: &[(&str, &str)]) -> Vec<(&'static str, &'static str)> {
        let map: HashMap<&str, OsString> = vars.iter().map(|(k, v)| (*k, (*v).into())).collect();
        super::to_apply(|name| map.get(name).cloned())
    }

    #[test]
    #[cfg(not(target_os = "macos"))]
    fn ondo_sets_a_larger_cuda_graph_cache_unless_the_user_chose_one() {
        assert_eq!(with(&[]), vec![("MLX_CUDA_GRAPH_CACHE_SIZE", "1000")]);
        assert_eq!(with(&[("MLX_CUDA_GRAPH_CACHE_SIZE", "100")]), vec![]);
        assert_eq!(with(&[("MLX_CUDA_GRAPH_CACHE_SIZE", "")]), vec![]);
        assert_eq!(
            with(&[("MLX_MAX_OPS_PER_BUFFER", "40")]),
            vec![("MLX_CUDA_GRAPH_CACHE_SIZE", "1000")]
        );
    }

    /// Metal reads none of these, so a Mac's process is left as it was.
    #[test]
    #[cfg(target_os = "macos")]
    fn ondo_sets_nothing_on_a_mac() {
        assert_eq!(with(&[]), vec![]);
    }
}
