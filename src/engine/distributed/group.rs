//! MLX's distributed group and its operations, called through mlx-c (mlx-rs
//! has no binding for them). Every byte between ranks goes through these:
//! MLX's ring backend (TCP), JACCL (RDMA over Thunderbolt 5) or NCCL.
//!
//! The operations are lazy like every MLX operation: they join the graph
//! and move bytes when the graph is evaluated, so every rank must evaluate
//! the same operations in the same order.

use std::ffi::{CStr, CString};

use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};

/// One of MLX's distributed backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// TCP sockets in a ring over any network (Ethernet, Wi-Fi, Thunderbolt
    /// bridges): `MLX_HOSTFILE` and `MLX_RANK`.
    Ring,
    /// RDMA over Thunderbolt 5 (macOS 26.2 and later).
    Jaccl,
    /// NVIDIA's collectives, on CUDA.
    Nccl,
    /// MPI, where MLX was built with it.
    Mpi,
}

impl Backend {
    pub const ALL: [Backend; 4] = [Backend::Ring, Backend::Jaccl, Backend::Nccl, Backend::Mpi];

    /// MLX's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::Jaccl => "jaccl",
            Backend::Nccl => "nccl",
            Backend::Mpi => "mpi",
        }
    }

    /// Whether the MLX this process loaded has the backend.
    pub fn is_available(self) -> bool {
        let name = CString::new(self.name()).expect("backend names have no NUL");
        // SAFETY: a NUL-terminated name, read for the call only.
        unsafe { mlx_sys::mlx_distributed_is_available(name.as_ptr()) }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == text.trim())
            .ok_or_else(|| format!("'{text}' is not one of MLX's backends: ring, jaccl, nccl, mpi"))
    }
}

/// The message of the last MLX error raised on this thread.
pub(crate) fn last_mlx_error() -> String {
    // SAFETY: mlx-c returns a NUL-terminated string it keeps until the
    // thread's next error; it is copied at once.
    unsafe { CStr::from_ptr(mlx_sys::mlx_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// The processes that run one model together, each with its rank.
pub struct Group {
    raw: mlx_sys::mlx_distributed_group,
    rank: usize,
    size: usize,
    backend: Backend,
}

// SAFETY: the handle is a heap-allocated C++ group (a shared pointer to the
// backend's state) with no tie to the thread that made it; ownership moves
// whole, and the operations that use it are only built where it is owned.
unsafe impl Send for Group {}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("backend", &self.backend)
            .finish()
    }
}

impl Group {
    /// Joins the group the environment describes (for the ring backend,
    /// `MLX_HOSTFILE` and `MLX_RANK`): blocks until every rank has joined,
    /// or fails with MLX's reason.
    pub fn init(backend: Backend) -> Result<Self, String> {
        if !backend.is_available() {
            return Err(format!(
                "this MLX has no {backend} backend (ring is in every build; jaccl needs macOS \
                 26.2 and Thunderbolt 5; nccl a CUDA build)"
            ));
        }
        let name = CString::new(backend.name()).expect("backend names have no NUL");
        // SAFETY: `raw` is written by mlx-c on success and freed by `Drop`;
        // on failure it is freed here.
        unsafe {
            let mut raw = mlx_sys::mlx_distributed_group_new();
            if mlx_sys::mlx_distributed_init(&mut raw, true, name.as_ptr()) != 0 {
                let reason = last_mlx_error();
                mlx_sys::mlx_distributed_group_free(raw);
                return Err(reason);
            }
            let rank = mlx_sys::mlx_distributed_group_rank(raw);
            let size = mlx_sys::mlx_distributed_group_size(raw);
            Ok(Self {
                raw,
                rank: rank.max(0) as usize,
                size: size.max(1) as usize,
                backend,
            })
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The stream this thread runs the group's operations on. NCCL moves
    /// bytes on the GPU, so its operations go where the model's do, and so
    /// does everything where MLX computes on the CPU. With a GPU, the
    /// other backends move bytes through host memory on a CPU stream, and
    /// MLX's streams belong to the thread that made them: a thread
    /// evaluating on a CPU stream another thread made (MLX's default one,
    /// or the group's) fails ("There is no Stream(cpu, 0) in current
    /// thread"). So each such thread makes its own, once.
    fn stream_here(&self) -> Stream {
        thread_local! {
            static CPU_STREAM: Option<Stream> = computes_on_gpu()
                .then(|| Stream::new_with_device(&mlx_rs::Device::cpu()));
        }
        match self.backend {
            Backend::Nccl => Stream::thread_local_or_default(),
            _ => CPU_STREAM
                .with(Option::clone)
                .unwrap_or_else(Stream::thread_local_or_default),
        }
    }

    /// Runs one mlx-c distributed operation that writes an array.
    fn op(
        &self,
        what: &str,
        call: impl FnOnce(
            *mut mlx_sys::mlx_array,
            mlx_sys::mlx_distributed_group,
            mlx_sys::mlx_stream,
        ) -> std::os::raw::c_int,
    ) -> Result<Array, Exception> {
        let stream = self.stream_here();
        // SAFETY: `result` is handed to an `Array` (which frees it) or freed
        // here; the group and the inputs are borrowed for the call only.
        unsafe {
            let mut result = mlx_sys::mlx_array_new();
            if call(&mut result, self.raw, stream.as_ptr()) != 0 {
                mlx_sys::mlx_array_free(result);
                return Err(Exception::custom(format!(
                    "MLX could not {what}: {}",
                    last_mlx_error()
                )));
            }
            Ok(Array::from_ptr(result))
        }
    }

    /// The sum of `x` over every rank, on every rank.
    pub fn all_sum(&self, x: &Array) -> Result<Array, Exception> {
        self.op("sum across ranks", |result, group, stream| unsafe {
            mlx_sys::mlx_distributed_all_sum(result, x.as_ptr(), group, stream)
        })
    }

    /// Every rank's `x`, concatenated along the first axis in rank order,
    /// on every rank.
    pub fn all_gather(&self, x: &Array) -> Result<Array, Exception> {
        self.op("gather across ranks", |result, group, stream| unsafe {
            mlx_sys::mlx_distributed_all_gather(result, x.as_ptr(), group, stream)
        })
    }

    /// Sends `x` to rank `to`; the result (an empty array) must be
    /// evaluated for the bytes to go.
    pub fn send(&self, x: &Array, to: usize) -> Result<Array, Exception> {
        self.op(
            &format!("send to rank {to}"),
            |result, group, stream| unsafe {
                mlx_sys::mlx_distributed_send(result, x.as_ptr(), to as i32, group, stream)
            },
        )
    }

    /// An array of `like`'s shape and dtype, received from rank `from`.
    pub fn recv_like(&self, like: &Array, from: usize) -> Result<Array, Exception> {
        self.op(
            &format!("receive from rank {from}"),
            |result, group, stream| unsafe {
                mlx_sys::mlx_distributed_recv_like(
                    result,
                    like.as_ptr(),
                    from as i32,
                    group,
                    stream,
                )
            },
        )
    }
}

/// Whether MLX computes on a GPU here (its default device).
pub(super) fn computes_on_gpu() -> bool {
    mlx_rs::Device::default()
        .get_type()
        .is_ok_and(|t| matches!(t, mlx_rs::DeviceType::Gpu))
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `mlx_distributed_init` and is freed once.
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.raw);
        }
    }
}
