//! Where a decode step's time goes, measured where it costs nothing: the
//! host's time building a step's graph and queueing it, the host's time
//! waiting for the token to be ready, and how many nodes one step's graph
//! has (each node is at least one kernel launch on a GPU, and on a GPU a
//! small model's step is bound by launches, not by reading the weights).

use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

use mlx_rs::Array;
use mlx_rs::error::Exception;
use serde::{Deserialize, Serialize};

/// One run's decode steps, averaged. Not part of the run record: the
/// benchmark reports it (`ondo bench --json`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct StepAnatomy {
    /// Decode steps measured (the first token, which comes out of the
    /// prefill, is not one).
    pub decode_steps: usize,
    /// Host time per step building the step's graph and handing it to MLX
    /// (`async_eval` in the pipelined loop; building only in the sync loop).
    pub host_build_ms: f64,
    /// Host time per step waiting for a token to be ready after asking for
    /// it: in the sync loop the whole execution of the step; in the
    /// pipelined loop what the overlap with building did not hide.
    pub wait_ms: f64,
    /// Nodes (primitives) in one decode step's graph, counted once when
    /// asked for: about the number of kernels a GPU launches per token.
    pub graph_nodes: Option<usize>,
    /// Scalar constants among that graph's inputs, made afresh each step.
    pub scalar_inputs: Option<usize>,
}

/// Running totals a decode loop keeps.
#[derive(Debug, Default)]
pub(crate) struct StepClock {
    steps: usize,
    build: Duration,
    wait: Duration,
    /// Counted once; `Some(None)` when counting failed (a run never fails
    /// for its anatomy).
    pub(crate) graph: Option<Option<GraphSize>>,
}

impl StepClock {
    pub(crate) fn add(&mut self, build: Duration, wait: Duration) {
        self.steps += 1;
        self.build += build;
        self.wait += wait;
    }

    pub(crate) fn anatomy(&self) -> StepAnatomy {
        let per_step = |d: Duration| {
            if self.steps == 0 {
                0.0
            } else {
                d.as_secs_f64() * 1e3 / self.steps as f64
            }
        };
        StepAnatomy {
            decode_steps: self.steps,
            host_build_ms: per_step(self.build),
            wait_ms: per_step(self.wait),
            graph_nodes: self.graph.flatten().map(|g| g.nodes),
            scalar_inputs: self.graph.flatten().map(|g| g.scalar_inputs),
        }
    }
}

/// The size of one step's graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphSize {
    /// Primitives that evaluating the outputs would run.
    pub nodes: usize,
    /// Scalar arrays among the graph's inputs: constants the host makes
    /// (and a GPU receives) afresh for every step.
    pub scalar_inputs: usize,
}

/// The size of the graph behind `outputs`, read from MLX's dump of it.
/// Arrays already evaluated are inputs, not nodes, so for a step built on
/// an evaluated (or already queued) token this is one step's graph.
pub fn graph_size(outputs: &[&Array]) -> Result<GraphSize, Exception> {
    let printed = print_graph(outputs)?;
    // For a look at what a step is made of: `ONDO_DUMP_GRAPH=1 ondo bench
    // MODEL --peer mlx-lm` prints the counted step to standard error.
    if crate::environment::DUMP_GRAPH.is_set() {
        eprintln!("{printed}");
    }
    read_graph_dump(&printed).ok_or_else(|| {
        Exception::custom(format!(
            "MLX printed a graph this version of Ondo cannot read: {}",
            printed.lines().next().unwrap_or("(nothing)")
        ))
    })
}

/// MLX's text dump of the graph behind `outputs`, through a temporary file
/// (mlx-c writes to a C `FILE*`).
fn print_graph(outputs: &[&Array]) -> Result<String, Exception> {
    let raw: Vec<mlx_sys::mlx_array> = outputs.iter().map(|a| a.as_ptr()).collect();
    let mut file = tempfile::tempfile().map_err(|e| Exception::custom(e.to_string()))?;
    // SAFETY: the arrays outlive the call; the vector, the namer and the
    // FILE* are created and freed here; the FILE* writes to a duplicate of
    // `file`'s descriptor, which fclose closes.
    let status = unsafe {
        use std::os::fd::AsRawFd;
        let fd = libc::dup(file.as_raw_fd());
        if fd < 0 {
            return Err(Exception::custom("could not duplicate a file descriptor"));
        }
        let stream = libc::fdopen(fd, c"w".as_ptr());
        if stream.is_null() {
            libc::close(fd);
            return Err(Exception::custom("could not open a stream for MLX's graph"));
        }
        let vector = mlx_sys::mlx_vector_array_new_data(raw.as_ptr(), raw.len());
        let namer = mlx_sys::mlx_node_namer_new();
        let status = mlx_sys::mlx_print_graph(stream.cast(), namer, vector);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(vector);
        libc::fclose(stream);
        status
    };
    if status != 0 {
        return Err(Exception::custom("MLX could not print the step's graph"));
    }
    let mut text = String::new();
    file.seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_string(&mut text))
        .map_err(|e| Exception::custom(e.to_string()))?;
    Ok(text)
}

/// Reads MLX's graph dump: a line `Inputs: A [(shape), dtype], ...`, a
/// line `Outputs: ...`, then one line per primitive, in the order it runs.
fn read_graph_dump(printed: &str) -> Option<GraphSize> {
    let mut lines = printed.lines();
    let inputs = lines.next()?.strip_prefix("Inputs:")?;
    lines.next()?.strip_prefix("Outputs:")?;
    Some(GraphSize {
        nodes: lines.filter(|l| !l.trim().is_empty()).count(),
        scalar_inputs: inputs.matches("[(), ").count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_counts_its_primitives_and_its_scalar_inputs() {
        let a = Array::from_slice(&[1.0f32, 2.0], &[2]);
        let b = Array::from_slice(&[3.0f32, 4.0], &[2]);
        let sum = mlx_rs::ops::add(&a, &b).unwrap();
        let product = mlx_rs::ops::multiply(&sum, &a).unwrap();
        let out = mlx_rs::ops::exp(&product).unwrap();
        // The scalar is broadcast to the array's shape first: a primitive
        // of its own (a view on a GPU, no kernel, but the host handles it).
        let scaled = mlx_rs::ops::multiply(&out, Array::from_f32(2.0)).unwrap();
        assert_eq!(
            graph_size(&[&scaled]).unwrap(),
            GraphSize {
                nodes: 5,
                scalar_inputs: 1
            }
        );
        // Evaluated, it is an input: nothing is left to run.
        mlx_rs::transforms::eval([&scaled]).unwrap();
        assert_eq!(graph_size(&[&scaled]).unwrap().nodes, 0);
    }

    #[test]
    fn per_step_means_divide_by_the_steps() {
        let mut clock = StepClock::default();
        clock.add(Duration::from_millis(2), Duration::from_millis(6));
        clock.add(Duration::from_millis(4), Duration::from_millis(10));
        let a = clock.anatomy();
        assert_eq!(a.decode_steps, 2);
        assert!((a.host_build_ms - 3.0).abs() < 1e-9);
        assert!((a.wait_ms - 8.0).abs() < 1e-9);
        assert_eq!(StepClock::default().anatomy().host_build_ms, 0.0);
    }
}
