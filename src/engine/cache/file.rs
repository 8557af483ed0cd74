//! A model's cache as a file: safetensors in mlx-lm's prompt-cache layout
//! (`save_prompt_cache` / `load_prompt_cache`), so a file Ondo writes is
//! read by `mlx_lm.generate --prompt-cache-file` and one
//! `mlx_lm.cache_prompt` writes is read here.
//!
//! The layout, per layer `i`: the state's tensors under `i.0`, `i.1`, ...
//! (a list inside the state nests one level more, `i.0.0`); the classes
//! under the metadata keys `1.i`; the caller's metadata under `0.<key>`;
//! and at `2.n` the names of tensors that stand for a scalar (a 0-d int32)
//! or for `None` (an empty float32). Each kind maps to mlx-lm's class:
//!
//! - a growing cache: `KVCache` (keys, values, offset), the keys and
//!   values cut to the positions in use;
//! - a rotating cache: `RotatingKVCache` (keys, values, offset, keep,
//!   max_size, the next write slot), the buffers as they rotate;
//! - a convolution state: `ArraysCache` ([inputs], None, None);
//! - a recurrent state: `ArraysCache` ([conv inputs, matrix], None, None).
//!
//! Ondo adds two metadata keys of its own, which mlx-lm carries along
//! unread: `ondo_crc32`, a CRC-32 of every tensor byte (a file in Ondo's
//! cache folder without one, or with a wrong one, is never used), and
//! whatever the caller adds (the disk cache puts the token ids there).
//! Writes go to a temporary name in the same folder, are flushed to disk,
//! then renamed: a reader sees a whole file or none.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

use super::{
    ConvState, KvCache, KvQuantization, LayerCache, QuantizedArrays, QuantizedKvCache,
    RecurrentState, RotatingKvCache,
};

/// The metadata key holding the CRC-32 of the tensor bytes (hex).
pub const CHECKSUM_KEY: &str = "ondo_crc32";

/// Temporary files end with this; readers skip them.
pub const TEMPORARY_SUFFIX: &str = ".partial";

/// Largest header read (a header holds names, shapes and metadata, and
/// the disk cache's token ids: a few MiB at most).
const MAX_HEADER_BYTES: u64 = 64 << 20;

/// Why a cache file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CacheFileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is cut short: {detail}")]
    Truncated { path: PathBuf, detail: String },
    #[error("{path} is damaged: {detail}")]
    Corrupted { path: PathBuf, detail: String },
    #[error("{path} is not a prompt cache Ondo can read: {detail}")]
    Foreign { path: PathBuf, detail: String },
    #[error("{path} does not fit this model's cache: {detail}")]
    Mismatch { path: PathBuf, detail: String },
    #[error(transparent)]
    Mlx(#[from] Exception),
}

/// One tensor, its bytes on the host.
struct Tensor {
    name: String,
    dtype: Dtype,
    shape: Vec<i32>,
    bytes: Vec<u8>,
}

/// A cache's tensors copied to the host with their metadata: taken on the
/// engine thread (which owns the arrays), written wherever is convenient.
pub struct EncodedCache {
    tensors: Vec<Tensor>,
    metadata: BTreeMap<String, String>,
}

/// A cache read back from a file.
pub struct DecodedCache {
    pub layers: Vec<LayerCache>,
    /// The caller's metadata (`0.<key>` in the file).
    pub metadata: BTreeMap<String, String>,
    /// Positions the cache holds.
    pub offset: i32,
    /// Bytes read from the disk.
    pub bytes: u64,
}

fn dtype_name(dtype: Dtype) -> Option<&'static str> {
    Some(match dtype {
        Dtype::Bool => "BOOL",
        Dtype::Uint8 => "U8",
        Dtype::Uint16 => "U16",
        Dtype::Uint32 => "U32",
        Dtype::Uint64 => "U64",
        Dtype::Int8 => "I8",
        Dtype::Int16 => "I16",
        Dtype::Int32 => "I32",
        Dtype::Int64 => "I64",
        Dtype::Float16 => "F16",
        Dtype::Bfloat16 => "BF16",
        Dtype::Float32 => "F32",
        _ => return None,
    })
}

fn dtype_of(name: &str) -> Option<Dtype> {
    Some(match name {
        "BOOL" => Dtype::Bool,
        "U8" => Dtype::Uint8,
        "U16" => Dtype::Uint16,
        "U32" => Dtype::Uint32,
        "U64" => Dtype::Uint64,
        "I8" => Dtype::Int8,
        "I16" => Dtype::Int16,
        "I32" => Dtype::Int32,
        "I64" => Dtype::Int64,
        "F16" => Dtype::Float16,
        "BF16" => Dtype::Bfloat16,
        "F32" => Dtype::Float32,
        _ => return None,
    })
}

fn element_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
        Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 | Dtype::Complex64 => 8,
        _ => 4,
    }
}

/// The bytes of `array` in row-major order.
fn host_bytes(array: &Array) -> Result<Vec<u8>, Exception> {
    // A view (the used part of a cache buffer) is not contiguous; a flat
    // reshape of it is a contiguous copy.
    let flat = array.reshape(&[-1])?;
    flat.eval()?;
    let n = flat.nbytes();
    if n == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: `flat` is evaluated and row-contiguous, so its data pointer
    // addresses `nbytes` bytes for as long as `flat` lives (the copy is
    // taken before it drops); the pointer is read as bytes whatever the
    // element type.
    let bytes = unsafe {
        let data = mlx_sys::mlx_array_data_uint8(flat.as_ptr());
        if data.is_null() {
            return Err(Exception::custom("MLX gave no data for an evaluated array"));
        }
        std::slice::from_raw_parts(data, n).to_vec()
    };
    Ok(bytes)
}

/// One layer's state as named tensors, scalars and `None`s.
struct LayerEntries<'a> {
    layer: usize,
    tensors: &'a mut Vec<Tensor>,
    specials: &'a mut Vec<(String, &'static str)>,
}

impl LayerEntries<'_> {
    fn array(&mut self, path: &str, array: Option<&Array>) -> Result<(), Exception> {
        let name = format!("{}.{path}", self.layer);
        match array {
            Some(array) => {
                let dtype = array.dtype();
                if dtype_name(dtype).is_none() {
                    return Err(Exception::custom(format!(
                        "a cache array of type {dtype:?} cannot be saved"
                    )));
                }
                self.tensors.push(Tensor {
                    name,
                    dtype,
                    shape: array.shape().to_vec(),
                    bytes: host_bytes(array)?,
                });
            }
            None => {
                self.tensors.push(Tensor {
                    name: name.clone(),
                    dtype: Dtype::Float32,
                    shape: vec![0],
                    bytes: Vec::new(),
                });
                self.specials.push((name, "none"));
            }
        }
        Ok(())
    }

    fn scalar(&mut self, path: &str, value: i32) {
        let name = format!("{}.{path}", self.layer);
        self.tensors.push(Tensor {
            name: name.clone(),
            dtype: Dtype::Int32,
            shape: Vec::new(),
            bytes: value.to_le_bytes().to_vec(),
        });
        self.specials.push((name, "scalar"));
    }
}

impl EncodedCache {
    /// `cache` (one row) and `metadata`, copied to the host.
    pub fn encode(
        cache: &[LayerCache],
        metadata: BTreeMap<String, String>,
    ) -> Result<Self, Exception> {
        let mut tensors = Vec::new();
        let mut specials = Vec::new();
        let mut classes = Vec::with_capacity(cache.len());
        for (layer, kind) in cache.iter().enumerate() {
            if kind.rows() > 1 {
                return Err(Exception::custom(
                    "a batch's cache is saved row by row, not as a batch",
                ));
            }
            let mut entries = LayerEntries {
                layer,
                tensors: &mut tensors,
                specials: &mut specials,
            };
            match kind {
                LayerCache::Growing(c) => {
                    classes.push("KVCache");
                    let used = c.used();
                    entries.array("0", used.as_ref().map(|(k, _)| k))?;
                    entries.array("1", used.as_ref().map(|(_, v)| v))?;
                    entries.scalar("2", c.offset);
                }
                LayerCache::Rotating(c) => {
                    classes.push("RotatingKVCache");
                    entries.array("0", c.keys.as_ref())?;
                    entries.array("1", c.values.as_ref())?;
                    entries.scalar("2", c.offset);
                    entries.scalar("3", c.keep);
                    entries.scalar("4", c.max_size);
                    entries.scalar("5", c.write_at);
                }
                LayerCache::Quantized(c) => {
                    // mlx-lm's QuantizedKVCache state: (keys, values,
                    // offset, group_size, bits), keys and values each
                    // (packed, scales, biases).
                    classes.push("QuantizedKVCache");
                    let q = c.quantization();
                    match c.used() {
                        Some((keys, values)) => {
                            for (side, arrays) in [("0", &keys), ("1", &values)] {
                                for (part, array) in arrays.parts().into_iter().enumerate() {
                                    entries.array(&format!("{side}.{part}"), Some(array))?;
                                }
                            }
                        }
                        None => {
                            entries.array("0", None)?;
                            entries.array("1", None)?;
                        }
                    }
                    entries.scalar("2", c.offset());
                    entries.scalar("3", q.group_size);
                    entries.scalar("4", q.bits);
                }
                LayerCache::Conv(c) => {
                    classes.push("ArraysCache");
                    entries.array("0.0", c.inputs.as_ref())?;
                    entries.array("1", None)?;
                    entries.array("2", None)?;
                }
                LayerCache::Recurrent(c) => {
                    classes.push("ArraysCache");
                    entries.array("0.0", c.conv.inputs.as_ref())?;
                    entries.array("0.1", c.matrix.as_ref())?;
                    entries.array("1", None)?;
                    entries.array("2", None)?;
                }
            }
        }
        let mut all = BTreeMap::new();
        let mut crc = crc32fast::Hasher::new();
        for tensor in &tensors {
            crc.update(&tensor.bytes);
        }
        for (key, value) in metadata {
            all.insert(format!("0.{key}"), value);
        }
        all.insert(
            format!("0.{CHECKSUM_KEY}"),
            format!("{:08x}", crc.finalize()),
        );
        for (i, class) in classes.iter().enumerate() {
            all.insert(format!("1.{i}"), (*class).to_owned());
        }
        // mlx-lm's list of special tensors starts with an empty string so
        // that an empty list still flattens to a key.
        all.insert("2.0".into(), String::new());
        for (n, (name, kind)) in specials.iter().enumerate() {
            all.insert(format!("2.{}.0", n + 1), name.clone());
            all.insert(format!("2.{}.1", n + 1), (*kind).to_owned());
        }
        Ok(Self {
            tensors,
            metadata: all,
        })
    }

    /// Bytes the tensors take on disk.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes.len() as u64).sum()
    }

    /// The safetensors header (its length prefix excluded), padded with
    /// spaces to a multiple of 8 bytes as the format asks.
    fn header(&self) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        header.insert(
            "__metadata__".into(),
            serde_json::to_value(&self.metadata).unwrap_or_default(),
        );
        let mut at = 0u64;
        for tensor in &self.tensors {
            let end = at + tensor.bytes.len() as u64;
            header.insert(
                tensor.name.clone(),
                serde_json::json!({
                    "dtype": dtype_name(tensor.dtype).unwrap_or("F32"),
                    "shape": tensor.shape,
                    "data_offsets": [at, end],
                }),
            );
            at = end;
        }
        let mut bytes = serde_json::to_vec(&header).unwrap_or_default();
        while !bytes.len().is_multiple_of(8) {
            bytes.push(b' ');
        }
        bytes
    }

    /// Writes the file at `path`: to a temporary name beside it, flushed
    /// to the disk, then renamed over `path`. `pause` runs between the
    /// tensors (a fault test stops a process there). On an error the
    /// temporary file is removed.
    pub fn write_atomically(&self, path: &Path, pause: &dyn Fn()) -> std::io::Result<u64> {
        let folder = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(folder)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = folder.join(format!(
            ".{name}.{}.{}{TEMPORARY_SUFFIX}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let result = (|| {
            let mut file =
                std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(&temporary)?);
            let header = self.header();
            file.write_all(&(header.len() as u64).to_le_bytes())?;
            file.write_all(&header)?;
            for tensor in &self.tensors {
                pause();
                file.write_all(&tensor.bytes)?;
            }
            let file = file.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            drop(file);
            std::fs::rename(&temporary, path)?;
            Ok(8 + header.len() as u64 + self.tensor_bytes())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        result
    }
}

/// A file's header: its tensors (name, dtype, shape, byte range in the
/// data) and its metadata.
pub struct Header {
    tensors: BTreeMap<String, (Dtype, Vec<i32>, u64, u64)>,
    pub metadata: BTreeMap<String, String>,
    /// Where the data starts in the file.
    data_start: u64,
    /// Bytes of data the tensors cover.
    data_bytes: u64,
}

impl Header {
    /// Whether the file holds a tensor of that name.
    pub fn holds(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The caller's metadata (mlx-lm's `0.<key>` entries).
    pub fn user_metadata(&self) -> BTreeMap<String, String> {
        self.metadata
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("0.")?.to_owned(), v.clone())))
            .collect()
    }

    /// Bytes of the whole file the header describes.
    pub fn file_bytes(&self) -> u64 {
        self.data_start + self.data_bytes
    }
}

fn parse_header(path: &Path, bytes: &[u8], file_len: u64) -> Result<Header, CacheFileError> {
    let truncated = |detail: String| CacheFileError::Truncated {
        path: path.to_owned(),
        detail,
    };
    let foreign = |detail: String| CacheFileError::Foreign {
        path: path.to_owned(),
        detail,
    };
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| foreign(format!("its header is not safetensors JSON ({e})")))?;
    let Some(object) = value.as_object() else {
        return Err(foreign("its header is not a JSON object".into()));
    };
    let mut tensors = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    let mut data_bytes = 0u64;
    for (name, entry) in object {
        if name == "__metadata__" {
            for (k, v) in entry.as_object().into_iter().flatten() {
                metadata.insert(k.clone(), v.as_str().unwrap_or_default().to_owned());
            }
            continue;
        }
        let dtype = entry["dtype"]
            .as_str()
            .and_then(dtype_of)
            .ok_or_else(|| foreign(format!("tensor {name} has an unknown dtype")))?;
        let shape: Vec<i32> = entry["shape"]
            .as_array()
            .and_then(|s| {
                s.iter()
                    .map(|d| d.as_i64().and_then(|d| i32::try_from(d).ok()))
                    .collect::<Option<Vec<i32>>>()
            })
            .ok_or_else(|| foreign(format!("tensor {name} has no shape")))?;
        let (Some(start), Some(end)) = (
            entry["data_offsets"][0].as_u64(),
            entry["data_offsets"][1].as_u64(),
        ) else {
            return Err(foreign(format!("tensor {name} has no data offsets")));
        };
        let elements: u64 = shape.iter().map(|&d| d.max(0) as u64).product();
        if end < start || end - start != elements * element_size(dtype) as u64 {
            return Err(foreign(format!(
                "tensor {name}'s bytes ({start}..{end}) do not match its shape {shape:?}"
            )));
        }
        data_bytes = data_bytes.max(end);
        tensors.insert(name.clone(), (dtype, shape, start, end));
    }
    let data_start = 8 + bytes.len() as u64;
    if data_start + data_bytes > file_len {
        return Err(truncated(format!(
            "its tensors need {} bytes, the file has {file_len}",
            data_start + data_bytes
        )));
    }
    Ok(Header {
        tensors,
        metadata,
        data_start,
        data_bytes,
    })
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> CacheFileError + '_ {
    move |source| CacheFileError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The length of the JSON header that `start` (the file's first bytes, at
/// least 8 of a whole file) announces, checked against the file's length.
fn header_length(path: &Path, start: &[u8], file_len: u64) -> Result<usize, CacheFileError> {
    let Some(length) = start.get(..8).and_then(|b| b.try_into().ok()) else {
        return Err(CacheFileError::Truncated {
            path: path.to_owned(),
            detail: "shorter than a safetensors header".into(),
        });
    };
    let length = u64::from_le_bytes(length);
    if length > MAX_HEADER_BYTES || length + 8 > file_len {
        return Err(CacheFileError::Truncated {
            path: path.to_owned(),
            detail: format!("its header says {length} bytes, the file has {file_len}"),
        });
    }
    Ok(length as usize)
}

/// The header of the file at `path`, without reading its tensors.
pub fn read_header(path: &Path) -> Result<Header, CacheFileError> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(io_error(path))?;
    let file_len = file.metadata().map_err(io_error(path))?.len();
    let mut start = Vec::with_capacity(8);
    (&mut file)
        .take(8)
        .read_to_end(&mut start)
        .map_err(io_error(path))?;
    let length = header_length(path, &start, file_len)?;
    let mut header = vec![0u8; length];
    file.read_exact(&mut header).map_err(io_error(path))?;
    parse_header(path, &header, file_len)
}

/// The file at `path` read into caches shaped like `template` (the
/// model's empty cache: the same layers of the same kinds). With
/// `require_checksum` a file without Ondo's checksum is refused as
/// foreign; a checksum present is always checked.
pub fn read(
    path: &Path,
    template: &[LayerCache],
    require_checksum: bool,
) -> Result<DecodedCache, CacheFileError> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    let file_len = bytes.len() as u64;
    let length = header_length(path, &bytes, file_len)?;
    let header = parse_header(path, &bytes[8..8 + length], file_len)?;
    let data = &bytes[header.data_start as usize..];
    match header.metadata.get(&format!("0.{CHECKSUM_KEY}")) {
        Some(expected) => {
            let crc = crc32fast::hash(&data[..header.data_bytes as usize]);
            if format!("{crc:08x}") != *expected {
                return Err(CacheFileError::Corrupted {
                    path: path.to_owned(),
                    detail: format!("its checksum is {crc:08x}, the file says {expected}"),
                });
            }
        }
        None if require_checksum => {
            return Err(CacheFileError::Foreign {
                path: path.to_owned(),
                detail: format!("it has no {CHECKSUM_KEY} (Ondo did not write it)"),
            });
        }
        None => {}
    }
    let layers = decode_layers(path, &header, data, template)?;
    let offset = layers
        .iter()
        .filter(|l| !l.is_state())
        .map(LayerCache::offset)
        .max()
        .unwrap_or(0);
    Ok(DecodedCache {
        layers,
        metadata: header.user_metadata(),
        offset,
        bytes: file_len,
    })
}

/// The tensors of layer `layer` as arrays, scalars and `None`s.
struct LayerState<'a> {
    path: &'a Path,
    header: &'a Header,
    data: &'a [u8],
    layer: usize,
    specials: &'a BTreeMap<String, String>,
}

impl LayerState<'_> {
    fn mismatch(&self, detail: String) -> CacheFileError {
        CacheFileError::Mismatch {
            path: self.path.to_owned(),
            detail: format!("layer {}: {detail}", self.layer),
        }
    }

    fn name(&self, at: &str) -> String {
        format!("{}.{at}", self.layer)
    }

    fn array(&self, at: &str) -> Result<Option<Array>, CacheFileError> {
        let name = self.name(at);
        if self.specials.get(&name).map(String::as_str) == Some("none") {
            return Ok(None);
        }
        let Some((dtype, shape, start, end)) = self.header.tensors.get(&name) else {
            return Err(self.mismatch(format!("the file has no tensor {name}")));
        };
        let bytes = &self.data[*start as usize..*end as usize];
        // SAFETY: `bytes` holds exactly the elements of `shape` in `dtype`
        // (checked against the shape when the header was read); MLX copies
        // them into an array of its own.
        let array = unsafe { Array::from_raw_data(bytes.as_ptr().cast(), shape, *dtype) };
        Ok(Some(array))
    }

    fn scalar(&self, at: &str) -> Result<i32, CacheFileError> {
        let name = self.name(at);
        let Some((dtype, shape, start, end)) = self.header.tensors.get(&name) else {
            return Err(self.mismatch(format!("the file has no scalar {name}")));
        };
        let bytes = &self.data[*start as usize..*end as usize];
        let value = match (dtype, bytes.len()) {
            (Dtype::Int32 | Dtype::Uint32, 4) => {
                i32::from_le_bytes(bytes.try_into().unwrap_or([0; 4]))
            }
            (Dtype::Int64 | Dtype::Uint64, 8) => {
                i64::from_le_bytes(bytes.try_into().unwrap_or([0; 8])) as i32
            }
            _ => {
                return Err(self.mismatch(format!(
                    "{name} is not an integer scalar ({dtype:?} {shape:?})"
                )));
            }
        };
        Ok(value)
    }
}

fn kv_pair(state: &LayerState) -> Result<Option<(Array, Array)>, CacheFileError> {
    match (state.array("0")?, state.array("1")?) {
        (Some(k), Some(v)) if k.ndim() == 4 && v.ndim() == 4 => Ok(Some((k, v))),
        (None, None) => Ok(None),
        _ => Err(state.mismatch("keys and values must both be [B, H, positions, D]".into())),
    }
}

/// A `QuantizedKVCache` layer, read where the model's empty growing layer
/// quantizes with `wanted`: its bits and group size must be those, when
/// it quantizes (a float layer takes
/// the file's, as mlx-lm's loader does); `quantized_kv_start` is not in
/// the file and does not matter once a cache is quantized.
fn quantized_layer(
    state: &LayerState,
    wanted: Option<KvQuantization>,
) -> Result<QuantizedKvCache, CacheFileError> {
    let (offset, group_size, bits) = (state.scalar("2")?, state.scalar("3")?, state.scalar("4")?);
    let quantization = match wanted {
        Some(q) if (q.bits, q.group_size) != (bits, group_size) => {
            return Err(state.mismatch(format!(
                "the file's keys and values are in {bits} bits (groups of {group_size}), the \
                 run asks for {} bits (groups of {})",
                q.bits, q.group_size
            )));
        }
        Some(q) => q,
        None => KvQuantization {
            bits,
            group_size,
            start: 0,
        },
    };
    quantization
        .check(&[])
        .map_err(|e| state.mismatch(format!("the file says: {e}")))?;
    let side = |at: &str| -> Result<Option<QuantizedArrays>, CacheFileError> {
        if state.specials.get(&state.name(at)).map(String::as_str) == Some("none") {
            return Ok(None);
        }
        let mut parts = Vec::with_capacity(3);
        for part in 0..3 {
            match state.array(&format!("{at}.{part}"))? {
                Some(a) if a.ndim() == 4 && a.shape()[2] >= offset => {
                    parts.push(a.index((.., .., ..offset, ..)));
                }
                _ => {
                    return Err(state.mismatch(format!(
                        "{at}.{part} must be [B, H, positions, _] holding at least {offset} \
                         positions"
                    )));
                }
            }
        }
        let [packed, scales, biases]: [Array; 3] = parts
            .try_into()
            .map_err(|_| state.mismatch("three arrays per side".into()))?;
        Ok(Some(QuantizedArrays::from_parts([packed, scales, biases])))
    };
    match (side("0")?, side("1")?) {
        (Some(keys), Some(values)) => Ok(QuantizedKvCache::holding(
            keys,
            values,
            Vec::new(),
            quantization,
        )),
        (None, None) => Ok(QuantizedKvCache::new(quantization)),
        _ => Err(state.mismatch("keys without values, or values without keys".into())),
    }
}

fn decode_layers(
    path: &Path,
    header: &Header,
    data: &[u8],
    template: &[LayerCache],
) -> Result<Vec<LayerCache>, CacheFileError> {
    let mut classes = Vec::new();
    while let Some(class) = header.metadata.get(&format!("1.{}", classes.len())) {
        classes.push(class.clone());
    }
    if classes.is_empty() {
        return Err(CacheFileError::Foreign {
            path: path.to_owned(),
            detail: "its metadata names no cache classes (not a prompt cache)".into(),
        });
    }
    if classes.len() != template.len() {
        return Err(CacheFileError::Mismatch {
            path: path.to_owned(),
            detail: format!(
                "it holds {} layers, the model's cache has {}",
                classes.len(),
                template.len()
            ),
        });
    }
    let mut specials = BTreeMap::new();
    let mut n = 1;
    while let Some(name) = header.metadata.get(&format!("2.{n}.0")) {
        let kind = header
            .metadata
            .get(&format!("2.{n}.1"))
            .cloned()
            .unwrap_or_default();
        specials.insert(name.clone(), kind);
        n += 1;
    }
    let mut layers = Vec::with_capacity(template.len());
    let mut position = None;
    for (layer, (class, expected)) in classes.iter().zip(template).enumerate() {
        let state = LayerState {
            path,
            header,
            data,
            layer,
            specials: &specials,
        };
        let decoded = match (class.as_str(), expected) {
            ("KVCache", LayerCache::Growing(want)) => {
                let offset = state.scalar("2")?;
                match kv_pair(&state)? {
                    Some((k, v)) => {
                        if k.shape()[2] < offset || v.shape()[2] < offset {
                            return Err(state.mismatch(format!(
                                "offset {offset} is past the {} positions stored",
                                k.shape()[2]
                            )));
                        }
                        // It quantizes as the run asks once due.
                        LayerCache::Growing(KvCache::holding(
                            k.index((.., .., ..offset, ..)),
                            v.index((.., .., ..offset, ..)),
                            Vec::new(),
                            want.quantization(),
                        ))
                    }
                    None => LayerCache::Growing(KvCache::quantizing(want.quantization())),
                }
            }
            ("QuantizedKVCache", LayerCache::Growing(want)) => {
                LayerCache::Quantized(quantized_layer(&state, want.quantization())?)
            }
            ("RotatingKVCache", LayerCache::Rotating(want)) => {
                let (offset, keep, max_size, write_at) = (
                    state.scalar("2")?,
                    state.scalar("3")?,
                    state.scalar("4")?,
                    state.scalar("5")?,
                );
                if max_size != want.max_size || keep != want.keep {
                    return Err(state.mismatch(format!(
                        "a rotating cache of {max_size} positions keeping {keep}, the model's \
                         holds {} keeping {}",
                        want.max_size, want.keep
                    )));
                }
                let (keys, values) = match kv_pair(&state)? {
                    Some((k, v)) => (Some(k), Some(v)),
                    None => (None, None),
                };
                LayerCache::Rotating(RotatingKvCache {
                    keys,
                    values,
                    offset,
                    max_size,
                    keep,
                    write_at,
                    padding: Vec::new(),
                })
            }
            ("ArraysCache", LayerCache::Conv(want)) => {
                let mut conv = ConvState::new(want.kernel);
                conv.inputs = state.array("0.0")?;
                LayerCache::Conv(conv)
            }
            ("ArraysCache", LayerCache::Recurrent(want)) => {
                let mut recurrent = RecurrentState::new(want.conv.kernel);
                recurrent.conv.inputs = state.array("0.0")?;
                recurrent.matrix = state.array("0.1")?;
                LayerCache::Recurrent(recurrent)
            }
            (class, expected) => {
                return Err(state.mismatch(format!(
                    "the file holds a {class}, the model's layer a {}",
                    expected.kind()
                )));
            }
        };
        if !decoded.is_state() {
            let offset = decoded.offset();
            if *position.get_or_insert(offset) != offset {
                return Err(state.mismatch(format!(
                    "it holds {offset} positions where earlier layers hold {}",
                    position.unwrap_or(0)
                )));
            }
        }
        layers.push(decoded);
    }
    // A state does not count its positions in the file; it has seen what
    // the KV layers have.
    let position = position.unwrap_or(0);
    for layer in &mut layers {
        match layer {
            LayerCache::Conv(c) => c.offset = position,
            LayerCache::Recurrent(c) => c.conv.offset = position,
            _ => {}
        }
    }
    Ok(layers)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{inputs, positions, read_positions, values};
    use super::*;

    fn round_trip(cache: &[LayerCache], template: &[LayerCache]) -> DecodedCache {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("c.safetensors");
        let encoded =
            EncodedCache::encode(cache, BTreeMap::from([("k".into(), "v".into())])).unwrap();
        encoded.write_atomically(&path, &|| {}).unwrap();
        let names: Vec<_> = std::fs::read_dir(folder.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file is left: {names:?}");
        read(&path, template, true).unwrap()
    }

    #[test]
    fn a_growing_cache_comes_back_with_its_positions_and_grows_on() {
        let mut cache = vec![LayerCache::new(None), LayerCache::new(None)];
        for layer in &mut cache {
            layer
                .update_and_fetch(&positions(0, 300), &positions(0, 300))
                .unwrap();
            layer.trim(7).unwrap();
        }
        let back = round_trip(&cache, &[LayerCache::new(None), LayerCache::new(None)]);
        assert_eq!(back.offset, 293);
        assert_eq!(back.metadata["k"], "v");
        let mut layers = back.layers;
        let (k, _) = layers[1]
            .update_and_fetch(&positions(900, 1), &positions(900, 1))
            .unwrap();
        let mut expected: Vec<f32> = (0..293).map(|p| p as f32).collect();
        expected.push(900.);
        assert_eq!(read_positions(&k), expected);
    }

    #[test]
    fn a_wrapped_rotating_cache_comes_back_rotating_the_same_way() {
        let mut cache = vec![LayerCache::new(Some(8))];
        let mut alone = vec![LayerCache::new(Some(8))];
        for p in 0..11 {
            for c in [&mut cache, &mut alone] {
                c[0].update_and_fetch(&positions(p, 1), &positions(p, 1))
                    .unwrap();
            }
        }
        let mut back = round_trip(&cache, &[LayerCache::new(Some(8))]).layers;
        assert_eq!(back[0].offset(), 11);
        for p in 11..14 {
            let (a, _) = back[0]
                .update_and_fetch(&positions(p, 1), &positions(p, 1))
                .unwrap();
            let (b, _) = alone[0]
                .update_and_fetch(&positions(p, 1), &positions(p, 1))
                .unwrap();
            assert_eq!(read_positions(&a), read_positions(&b));
        }
        // A window of another size is another model's cache.
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("c.safetensors");
        EncodedCache::encode(&cache, BTreeMap::new())
            .unwrap()
            .write_atomically(&path, &|| {})
            .unwrap();
        let error = read(&path, &[LayerCache::new(Some(16))], true)
            .err()
            .unwrap();
        assert!(matches!(error, CacheFileError::Mismatch { .. }), "{error}");
    }

    #[test]
    fn a_quantized_cache_comes_back_quantized_and_continues_as_it_would_have() {
        let four = KvQuantization {
            bits: 4,
            group_size: 32,
            start: 0,
        };
        let key = mlx_rs::random::key(7).unwrap();
        let keys = mlx_rs::random::normal::<f32>(&[1, 2, 40, 64], 0.0, 1.0, &key).unwrap();
        let floats = |a: &Array| {
            a.eval().unwrap();
            a.as_slice::<f32>().to_vec()
        };
        let mut kept = LayerCache::Quantized(QuantizedKvCache::new(four));
        kept.update_and_fetch(
            &keys.index((.., .., ..37, ..)),
            &keys.index((.., .., ..37, ..)),
        )
        .unwrap();
        kept.trim(2).unwrap();
        let template = || vec![LayerCache::attention(None, Some(four))];
        let mut back = round_trip(std::slice::from_ref(&kept), &template()).layers;
        assert!(matches!(back[0], LayerCache::Quantized(_)));
        assert_eq!(back[0].offset(), 35);
        assert_eq!(back[0].nbytes(), kept.nbytes());
        // The next positions find exactly what the cache kept in memory
        // would have given.
        let next = keys.index((.., .., 35..40, ..));
        let (a, _) = back[0]
            .update_and_fetch_cached(&next, &next)
            .unwrap()
            .into_float()
            .unwrap();
        let (b, _) = kept
            .update_and_fetch_cached(&next, &next)
            .unwrap()
            .into_float()
            .unwrap();
        assert_eq!(floats(&a), floats(&b));
        // A run asking for 8 bits does not read 4-bit keys.
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("c.safetensors");
        EncodedCache::encode(std::slice::from_ref(&kept), BTreeMap::new())
            .unwrap()
            .write_atomically(&path, &|| {})
            .unwrap();
        let eight = KvQuantization { bits: 8, ..four };
        let error = read(&path, &[LayerCache::attention(None, Some(eight))], true)
            .err()
            .unwrap();
        assert!(error.to_string().contains("4 bits"), "{error}");
        // A float run takes the file's quantization, as mlx-lm's loader does.
        let float = read(&path, &[LayerCache::attention(None, None)], true).unwrap();
        let LayerCache::Quantized(c) = &float.layers[0] else {
            panic!("a quantized file reads into a quantized cache");
        };
        assert_eq!(
            (c.quantization().bits, c.quantization().group_size),
            (4, 32)
        );
        // And a float file read for a quantized run quantizes when due.
        let mut plain = vec![LayerCache::attention(None, None)];
        plain[0].update_and_fetch(&next, &next).unwrap();
        let mut due = round_trip(&plain, &template()).layers;
        assert!(matches!(due[0], LayerCache::Growing(_)));
        let one = keys.index((.., .., ..1, ..));
        due[0].update_and_fetch_cached(&one, &one).unwrap();
        assert!(matches!(due[0], LayerCache::Quantized(_)));
    }

    #[test]
    fn state_layers_come_back_at_the_kv_layers_position() {
        let mut recurrent = RecurrentState::new(3);
        recurrent.conv.extend(&inputs(0, 5)).unwrap();
        recurrent.set_matrix(mlx_rs::ops::ones::<f32>(&[1, 2, 3, 4]).unwrap());
        let mut conv = ConvState::new(3);
        conv.extend(&inputs(0, 5)).unwrap();
        let mut kv = LayerCache::new(None);
        kv.update_and_fetch(&positions(0, 5), &positions(0, 5))
            .unwrap();
        let cache = vec![kv, LayerCache::Conv(conv), LayerCache::Recurrent(recurrent)];
        let template = vec![
            LayerCache::new(None),
            LayerCache::Conv(ConvState::new(3)),
            LayerCache::Recurrent(RecurrentState::new(3)),
        ];
        let back = round_trip(&cache, &template).layers;
        assert!(back.iter().all(|l| l.offset() == 5));
        let LayerCache::Recurrent(r) = &back[2] else {
            panic!("a recurrent layer stays one");
        };
        assert_eq!(values(r.matrix().unwrap()), vec![1.; 24]);
        assert_eq!(
            values(r.conv.inputs.as_ref().unwrap()),
            vec![3., -3., 4., -4.]
        );
    }

    #[test]
    fn a_flipped_byte_a_cut_file_and_a_foreign_file_are_refused_by_name() {
        let mut cache = vec![LayerCache::new(None)];
        cache[0]
            .update_and_fetch(&positions(0, 40), &positions(0, 40))
            .unwrap();
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("c.safetensors");
        let written = EncodedCache::encode(&cache, BTreeMap::new())
            .unwrap()
            .write_atomically(&path, &|| {})
            .unwrap();
        let template = [LayerCache::new(None)];
        let mut bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, written);
        let last = bytes.len() - 3;
        bytes[last] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let error = read(&path, &template, true).err().unwrap();
        assert!(matches!(error, CacheFileError::Corrupted { .. }), "{error}");
        assert!(error.to_string().contains("checksum"), "{error}");
        bytes.truncate(bytes.len() - 100);
        std::fs::write(&path, &bytes).unwrap();
        let error = read(&path, &template, true).err().unwrap();
        assert!(matches!(error, CacheFileError::Truncated { .. }), "{error}");
        std::fs::write(&path, b"not a cache at all").unwrap();
        assert!(read(&path, &template, true).is_err());
    }
}
