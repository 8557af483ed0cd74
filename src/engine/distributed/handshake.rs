//! The ranks introduce themselves before they split a model: each one's
//! host, Ondo, MLX, device and memory, and the model snapshot it would
//! load, gathered on every rank through MLX (`Group::all_gather`). Ranks
//! that would compute different things together (another Ondo, another
//! MLX, another snapshot) are refused at start with the difference named,
//! not found out from wrong tokens later.

use serde::{Deserialize, Serialize};

use super::Group;

/// What one rank says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankIdentity {
    pub rank: usize,
    pub host: String,
    pub ondo_version: String,
    pub mlx_version: String,
    /// "cpu", "metal" or "cuda".
    pub backend: String,
    pub device: String,
    pub memory_bytes: u64,
    /// What a model may take on this rank: the memory available when it
    /// joined, no more than its `ONDO_MEMORY_LIMIT`.
    #[serde(default)]
    pub budget_bytes: u64,
    /// A seed this rank drew; every rank samples with rank 0's where a
    /// request names none, so the ranks draw the same tokens.
    #[serde(default)]
    pub seed: u64,
    /// The weight bytes of this rank's share of the model, read from its
    /// own files (a rank split by layers may hold no other rank's); 0 when
    /// not known.
    #[serde(default)]
    pub share_bytes: u64,
    /// The model folder's snapshot this rank would load (`model_snapshot`),
    /// `None` when none is named.
    pub model: Option<ModelSnapshot>,
}

/// A model folder as the ranks compare it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSnapshot {
    /// The folder's name (a hub snapshot's is its commit).
    pub name: String,
    /// A digest of the config and of the weights index (or, unsharded, of
    /// each weight file's name and size), or why the folder could not be
    /// read: what the ranks compare (the same
    /// snapshot may sit in differently named folders on two machines).
    pub digest: String,
}

impl std::fmt::Display for ModelSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.digest)
    }
}

/// What every rank said, in rank order, gathered on every rank.
pub fn exchange(group: &Group, own: &RankIdentity) -> Result<Vec<RankIdentity>, String> {
    let bytes = serde_json::to_vec(own).map_err(|e| e.to_string())?;
    let parts = super::orders::gather_bytes(group, &bytes)
        .map_err(|e| format!("the ranks could not introduce themselves: {e}"))?;
    parts
        .iter()
        .enumerate()
        .map(|(rank, part)| {
            serde_json::from_slice(part)
                .map_err(|e| format!("rank {rank} sent a description Ondo cannot read ({e})"))
        })
        .collect()
}

/// `Err` naming the first difference that would make the ranks compute
/// different things (or refuse each other's bytes), and what to do.
pub fn check_same(ranks: &[RankIdentity]) -> Result<(), String> {
    let Some(first) = ranks.first() else {
        return Ok(());
    };
    let name = |r: &RankIdentity| format!("rank {} ({})", r.rank, r.host);
    for other in &ranks[1..] {
        if other.ondo_version != first.ondo_version {
            return Err(format!(
                "{} runs Ondo {} and {} runs Ondo {}: install the same Ondo on every machine",
                name(first),
                first.ondo_version,
                name(other),
                other.ondo_version
            ));
        }
        if other.mlx_version != first.mlx_version {
            return Err(format!(
                "{} runs MLX {} and {} runs MLX {}: every rank needs the same MLX (the same \
                 Ondo build brings it)",
                name(first),
                first.mlx_version,
                name(other),
                other.mlx_version
            ));
        }
        let digest = |r: &RankIdentity| r.model.as_ref().map(|m| m.digest.clone());
        if digest(other) != digest(first) {
            let shown = |m: &Option<ModelSnapshot>| {
                m.as_ref()
                    .map_or_else(|| "no model".into(), ToString::to_string)
            };
            return Err(format!(
                "{} has {} and {} has {}: every rank must load the same snapshot (download \
                 the same revision on each machine)",
                name(first),
                shown(&first.model),
                name(other),
                shown(&other.model)
            ));
        }
    }
    Ok(())
}

/// A model folder's snapshot as the ranks compare it: its name, and a
/// digest of its config and of its weights index, or of each weight
/// file's name and size where there is no index (the weights themselves
/// are too large to hash at every start); a folder
/// that cannot be read gets the reason in place of the digest.
pub fn model_snapshot(dir: &std::path::Path) -> ModelSnapshot {
    let name = dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let digest = snapshot_digest(dir).unwrap_or_else(|reason| format!("unreadable: {reason}"));
    ModelSnapshot { name, digest }
}

fn snapshot_digest(dir: &std::path::Path) -> Result<String, String> {
    use sha2::Digest as _;
    let mut digest = sha2::Sha256::new();
    let config_path = dir.join("config.json");
    let config =
        std::fs::read(&config_path).map_err(|e| format!("{}: {e}", config_path.display()))?;
    digest.update(&config);
    // A sharded snapshot is named by its index (every file, every tensor):
    // a rank split by layers may hold only the files of its own layers.
    let index_path = dir.join("model.safetensors.index.json");
    if let Ok(index) = std::fs::read(&index_path) {
        digest.update(&index);
        return Ok(short_hex(&digest.finalize()));
    }
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            // The size of the file a hub snapshot's link points at.
            let size = std::fs::metadata(entry.path()).ok()?.len();
            name.ends_with(".safetensors").then_some((name, size))
        })
        .collect();
    files.sort();
    for (name, size) in &files {
        digest.update(name.as_bytes());
        digest.update(size.to_le_bytes());
    }
    Ok(short_hex(&digest.finalize()))
}

fn short_hex(digest: &[u8]) -> String {
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, ondo: &str, mlx: &str, model: Option<&str>) -> RankIdentity {
        let model = model.map(|digest| ModelSnapshot {
            name: format!("folder-{rank}"),
            digest: digest.to_owned(),
        });
        RankIdentity {
            rank,
            host: format!("studio-{}", rank + 1),
            ondo_version: ondo.into(),
            mlx_version: mlx.into(),
            backend: "metal".into(),
            device: "Apple M4 Max".into(),
            memory_bytes: 64 << 30,
            budget_bytes: 48 << 30,
            seed: 7,
            share_bytes: 0,
            model,
        }
    }

    #[test]
    fn ranks_that_agree_pass() {
        // The same snapshot in folders of different names.
        let same = [
            rank(0, "0.1.0", "0.32.4", Some("ab12")),
            rank(1, "0.1.0", "0.32.4", Some("ab12")),
        ];
        assert_eq!(check_same(&same), Ok(()));
    }

    #[test]
    fn a_different_ondo_mlx_or_snapshot_is_named_with_its_rank_and_host() {
        let ondo = check_same(&[
            rank(0, "0.1.0", "0.32.4", None),
            rank(1, "0.2.0", "0.32.4", None),
        ])
        .unwrap_err();
        assert!(ondo.contains("rank 1 (studio-2) runs Ondo 0.2.0"), "{ondo}");
        let mlx = check_same(&[
            rank(0, "0.1.0", "0.32.4", None),
            rank(1, "0.1.0", "0.31.0", None),
        ])
        .unwrap_err();
        assert!(mlx.contains("MLX 0.31.0"), "{mlx}");
        let model = check_same(&[
            rank(0, "0.1.0", "0.32.4", Some("ab12")),
            rank(1, "0.1.0", "0.32.4", Some("cd34")),
        ])
        .unwrap_err();
        assert!(
            model.contains("rank 1 (studio-2) has folder-1 (cd34)")
                && model.contains("same snapshot"),
            "{model}"
        );
    }

    #[test]
    fn a_snapshot_changes_with_the_config_and_the_weight_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{\"a\": 1}").unwrap();
        std::fs::write(dir.path().join("model.safetensors"), [0u8; 10]).unwrap();
        let first = model_snapshot(dir.path());
        std::fs::write(dir.path().join("model.safetensors"), [0u8; 11]).unwrap();
        let resized = model_snapshot(dir.path());
        std::fs::write(dir.path().join("config.json"), "{\"a\": 2}").unwrap();
        let reconfigured = model_snapshot(dir.path());
        assert_ne!(first.digest, resized.digest);
        assert_ne!(resized.digest, reconfigured.digest);
        let missing = model_snapshot(&dir.path().join("gone"));
        assert!(missing.digest.starts_with("unreadable: "), "{missing}");
    }

    #[test]
    fn a_sharded_snapshot_is_the_same_whichever_of_its_files_a_rank_holds() {
        let index = r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
        let (whole, part) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for dir in [whole.path(), part.path()] {
            std::fs::write(dir.join("config.json"), "{\"a\": 1}").unwrap();
            std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
            std::fs::write(dir.join("model-00001-of-00002.safetensors"), [0u8; 10]).unwrap();
        }
        std::fs::write(
            whole.path().join("model-00002-of-00002.safetensors"),
            [0u8; 10],
        )
        .unwrap();
        assert_eq!(
            model_snapshot(whole.path()).digest,
            model_snapshot(part.path()).digest
        );
        std::fs::write(
            part.path().join("model.safetensors.index.json"),
            index.replace('b', "c"),
        )
        .unwrap();
        assert_ne!(
            model_snapshot(whole.path()).digest,
            model_snapshot(part.path()).digest
        );
    }
}
