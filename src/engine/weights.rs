//! Reading the safetensors of a model folder, lazily (MLX maps the file and
//! reads a tensor when it is first evaluated), remembering which file each
//! tensor came from so that errors can name it.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use mlx_rs::Array;

use super::LoadError;

/// One stored tensor and the file it came from.
pub struct StoredTensor {
    pub array: Array,
    pub file: String,
}

/// Every tensor of a model folder, by checkpoint name.
pub struct WeightMap {
    pub dir: PathBuf,
    pub tensors: HashMap<String, StoredTensor>,
}

pub use crate::family::shards::{Reads, files_holding};

/// The weight files of a folder: those the index names, else every
/// `model*.safetensors` (mlx-lm's rule).
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    weight_files_read(dir, None)
}

/// The weight files of a folder that hold a tensor `reads` wants: with an
/// index, only those (a missing file nobody here reads is no error);
/// without one, every `model*.safetensors`.
pub fn weight_files_read(dir: &Path, reads: Reads) -> Result<Vec<PathBuf>, LoadError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = fs::read_to_string(&index).map_err(|e| LoadError::WeightFileUnreadable {
            file: index.clone(),
            message: e.to_string(),
        })?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| LoadError::WeightFileUnreadable {
                file: index.clone(),
                message: e.to_string(),
            })?;
        let files = files_holding(&value, reads);
        let mut paths = Vec::with_capacity(files.len());
        for file in files {
            let path = dir.join(&file);
            if !path.is_file() {
                return Err(LoadError::ShardMissing { file: path });
            }
            paths.push(path);
        }
        if !paths.is_empty() {
            return Ok(paths);
        }
    }
    let mut paths: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| LoadError::WeightFileUnreadable {
            file: dir.to_owned(),
            message: e.to_string(),
        })?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        })
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(LoadError::NoWeightFiles {
            dir: dir.to_owned(),
        });
    }
    Ok(paths)
}

/// Opens every weight file of `dir` (lazily; nothing is read yet).
pub fn load_weight_map(dir: &Path) -> Result<WeightMap, LoadError> {
    load_weight_map_read(dir, None)
}

/// Opens the weight files of `dir` that hold a tensor `reads` wants.
pub fn load_weight_map_read(dir: &Path, reads: Reads) -> Result<WeightMap, LoadError> {
    let mut tensors = HashMap::new();
    for path in weight_files_read(dir, reads)? {
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let arrays =
            Array::load_safetensors(&path).map_err(|e| LoadError::WeightFileUnreadable {
                file: path.clone(),
                message: super::mlx_failure(&e),
            })?;
        for (name, array) in arrays {
            tensors.insert(
                name,
                StoredTensor {
                    array,
                    file: file.clone(),
                },
            );
        }
    }
    Ok(WeightMap {
        dir: dir.to_owned(),
        tensors,
    })
}

impl WeightMap {
    /// Removes and returns a tensor, checking its shape (and that it is a
    /// float tensor).
    pub fn take_float(&mut self, name: &str, shape: &[i32]) -> Result<Array, LoadError> {
        let stored = self.take_any(name)?;
        check_shape(name, &stored, shape)?;
        if !stored.array.dtype().is_float() {
            return Err(LoadError::TensorDtype {
                tensor: name.to_owned(),
                file: stored.file,
                expected: "a float type (float32, bfloat16, float16)".to_owned(),
                found: format!("{:?}", stored.array.dtype()),
            });
        }
        Ok(stored.array)
    }

    /// Removes and returns a packed quantized weight (uint32).
    pub fn take_packed(&mut self, name: &str, shape: &[i32]) -> Result<Array, LoadError> {
        let stored = self.take_any(name)?;
        check_shape(name, &stored, shape)?;
        if stored.array.dtype() != mlx_rs::Dtype::Uint32 {
            return Err(LoadError::TensorDtype {
                tensor: name.to_owned(),
                file: stored.file,
                expected: "uint32 (packed quantized)".to_owned(),
                found: format!("{:?}", stored.array.dtype()),
            });
        }
        Ok(stored.array)
    }

    /// Removes and returns the shared exponents of a microscaling format
    /// (mxfp4's scales: uint8).
    pub fn take_exponents(&mut self, name: &str, shape: &[i32]) -> Result<Array, LoadError> {
        let stored = self.take_any(name)?;
        check_shape(name, &stored, shape)?;
        if stored.array.dtype() != mlx_rs::Dtype::Uint8 {
            return Err(LoadError::TensorDtype {
                tensor: name.to_owned(),
                file: stored.file,
                expected: "uint8 (mxfp4 scales)".to_owned(),
                found: format!("{:?}", stored.array.dtype()),
            });
        }
        Ok(stored.array)
    }

    /// A stored tensor, left in place (to read its shape or dtype).
    pub fn peek(&self, name: &str) -> Option<&Array> {
        self.tensors.get(name).map(|stored| &stored.array)
    }

    /// True when the checkpoint stores `name` (used to see which layers are
    /// quantized: those with `.scales`).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Drops a tensor the model does not use on purpose (e.g. a tied head).
    pub fn discard(&mut self, name: &str) {
        self.tensors.remove(name);
    }

    /// Adds a tensor made at load time from stored ones (experts saved one
    /// by one, stacked); `file` is where its parts came from, for errors.
    pub fn insert(&mut self, name: String, array: Array, file: String) {
        self.tensors.insert(name, StoredTensor { array, file });
    }

    /// Removes and returns a tensor whatever its shape and dtype; the
    /// caller checks them.
    pub fn take_stored(&mut self, name: &str) -> Result<StoredTensor, LoadError> {
        self.take_any(name)
    }

    fn take_any(&mut self, name: &str) -> Result<StoredTensor, LoadError> {
        self.tensors
            .remove(name)
            .ok_or_else(|| LoadError::TensorMissing {
                tensor: name.to_owned(),
                dir: self.dir.clone(),
            })
    }

    /// Fails if any tensor was not taken: a checkpoint with extra tensors
    /// is a different model than the config describes.
    pub fn finish(self, model_type: &str) -> Result<(), LoadError> {
        let mut left: Vec<(String, String)> = self
            .tensors
            .into_iter()
            .map(|(name, stored)| (name, stored.file))
            .collect();
        left.sort();
        match left.into_iter().next() {
            None => Ok(()),
            Some((tensor, file)) => Err(LoadError::TensorUnexpected {
                tensor,
                file,
                model_type: model_type.to_owned(),
            }),
        }
    }
}

fn check_shape(name: &str, stored: &StoredTensor, expected: &[i32]) -> Result<(), LoadError> {
    if stored.array.shape() != expected {
        return Err(LoadError::TensorShape {
            tensor: name.to_owned(),
            file: stored.file.clone(),
            expected: expected.to_vec(),
            found: stored.array.shape().to_vec(),
        });
    }
    Ok(())
}
