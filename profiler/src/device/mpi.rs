//! The MPI transport (feature `mpi`): one process per rank under `mpirun`, through the `mpi`
//! crate (Open MPI or MPICH).
//!
//! World rank `r = (replica · pp + pipeline rank) · tp + tensor-parallel rank`, tp fastest as
//! in Megatron and in the thread transport. The world is split into three kinds of
//! communicator, as in a DP × PP × TP grid:
//! - one *pipeline* communicator per (replica, tensor-parallel rank) (its `pp` ranks):
//!   point-to-point sends between pipeline neighbours, as a header (`[rows, cols]`, u64) and the
//!   data (f32) under one MPI tag made from the [`Tag`]; buffered sends (`MPI_Bsend`), so a send
//!   never waits for its receive; receives poll (`MPI_Improbe`) until their timeout;
//! - one *data-parallel* communicator per (pipeline rank, tensor-parallel rank) (its `dp`
//!   replicas): the gradient all-reduce;
//! - one *tensor-parallel* communicator per (replica, pipeline rank) (its `tp` ranks): the
//!   layers' all-reduces, and the reduce-scatters and all-gathers of sequence parallelism
//!   (the trait's defaults: built on the all-reduce below, so the same bits as the threads'
//!   and more traffic than `MPI_Reduce_scatter` would need).
//!
//! An all-reduce over the whole world (the start-of-step barrier, gathering the report) uses
//! `MPI_COMM_WORLD`. An all-reduce is not `MPI_Allreduce`, whose sums MPI only recommends be
//! the same bits on every rank, in an order of its choosing: it is a gather to the
//! communicator's first rank (`MPI_Gather`), the sum there in group order, and a broadcast of
//! the sum (`MPI_Bcast`), [`REDUCE_CHUNK`] values at a time. Every member gets the same bits for
//! any group size, and the in-process transport's bits.
//!
//! When a rank fails it calls [`Mpi::abort`] (`MPI_Abort`), which ends every process of the
//! job: nothing waits for a dead rank.

use std::time::{Duration, Instant};

use mpi::environment::Universe;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use super::tensor::Tensor;
use super::transport::{sum_in_group_order, Direction, Tag, Transport, TransportError};

/// Stages below this and micro-batches below [`MAX_MICROBATCHES`] fit in an MPI tag.
pub const MAX_STAGES: u32 = 1 << 10;
/// See [`MAX_STAGES`].
pub const MAX_MICROBATCHES: u32 = 1 << 19;

/// Values (f64) per gather and broadcast of an all-reduce: the first member holds one chunk of
/// every member's data at a time, 8 MiB each.
pub const REDUCE_CHUNK: usize = 1 << 20;

/// Bytes MPI may add to each buffered send (`MPI_BSEND_OVERHEAD` is about 100 in Open MPI).
const BSEND_OVERHEAD_BYTES: usize = 1024;

/// This process's endpoint of an MPI job.
pub struct Mpi {
    rank: usize,
    size: usize,
    pp: usize,
    timeout: Duration,
    world: SimpleCommunicator,
    tp: usize,
    pipeline: SimpleCommunicator,
    data_parallel: SimpleCommunicator,
    tensor_parallel: SimpleCommunicator,
    /// Ranks of this rank's data-parallel group, in order.
    dp_group: Vec<usize>,
    /// Ranks of this rank's tensor-parallel group, in order.
    tp_group: Vec<usize>,
    /// Dropped last: finalises MPI after the communicators are freed.
    _universe: Universe,
}

impl Mpi {
    /// Initialises MPI and splits the world (which must be `pp × dp × tp` processes) into the
    /// pipeline, data-parallel and tensor-parallel communicators; receives give up after
    /// `timeout`. Buffered sends get a buffer for `max_messages` outstanding tensors of up to
    /// `max_tensor_bytes` each (one step's sends from one rank).
    pub fn init(
        pp: usize,
        tp: usize,
        timeout: Duration,
        max_messages: usize,
        max_tensor_bytes: usize,
    ) -> Result<Mpi, TransportError> {
        let invalid = |message: String| TransportError::Invalid { rank: 0, message };
        let mut universe = mpi::initialize()
            .ok_or_else(|| invalid("MPI was already initialised in this process".into()))?;
        let world = universe.world();
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        let grid = pp * tp;
        if grid == 0 || !size.is_multiple_of(grid) {
            return Err(TransportError::Invalid {
                rank,
                message: format!(
                    "the MPI job has {size} processes, not a multiple of pp × tp = {grid}"
                ),
            });
        }
        let split = |color: usize| {
            world
                .split_by_color_with_key(Color::with_value(color as i32), rank as i32)
                .ok_or_else(|| TransportError::Invalid {
                    rank,
                    message: "MPI could not split the world into communicators".into(),
                })
        };
        // (replica, tp rank); (pp rank, tp rank); (replica, pp rank)
        let pipeline = split(rank / grid * tp + rank % tp)?;
        let data_parallel = split(rank % grid)?;
        let tensor_parallel = split(rank / tp)?;
        let per_message = max_tensor_bytes + 16 + 2 * BSEND_OVERHEAD_BYTES;
        universe.set_buffer_size(max_messages.max(1) * per_message + (1 << 20));
        Ok(Mpi {
            rank,
            size,
            pp,
            tp,
            timeout,
            dp_group: (0..size / grid).map(|d| d * grid + rank % grid).collect(),
            tp_group: (0..tp).map(|t| rank / tp * tp + t).collect(),
            world,
            pipeline,
            data_parallel,
            tensor_parallel,
            _universe: universe,
        })
    }

    /// Ends every process of the job with exit status `code` (`MPI_Abort`).
    pub fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    /// Seconds since an arbitrary origin, the same on every rank of one machine (`MPI_Wtime`).
    pub fn wtime_s(&self) -> f64 {
        mpi::environment::time()
    }

    /// The MPI library's version line.
    pub fn library_version(&self) -> String {
        mpi::environment::library_version().unwrap_or_default()
    }

    fn invalid(&self, message: String) -> TransportError {
        TransportError::Invalid {
            rank: self.rank,
            message,
        }
    }

    /// This rank's pipeline-communicator rank for world rank `peer`, which must be in its
    /// replica and hold the same tensor-parallel rank.
    fn pipeline_rank(&self, peer: usize) -> Result<i32, TransportError> {
        let grid = self.pp * self.tp;
        if peer >= self.size
            || peer / grid != self.rank / grid
            || peer % self.tp != self.rank % self.tp
        {
            return Err(self.invalid(format!(
                "rank {peer} is not a pipeline neighbour of this rank (same replica and tensor-parallel rank)"
            )));
        }
        Ok((peer / self.tp % self.pp) as i32)
    }

    fn mpi_tag(&self, tag: Tag) -> Result<i32, TransportError> {
        if tag.stage >= MAX_STAGES || tag.microbatch >= MAX_MICROBATCHES {
            return Err(self.invalid(format!(
                "{tag} does not fit in an MPI tag (stages < {MAX_STAGES}, micro-batches < {MAX_MICROBATCHES})"
            )));
        }
        let direction = match tag.direction {
            Direction::Activation => 0,
            Direction::Gradient => 1,
        };
        Ok(((tag.stage << 20) | (tag.microbatch << 1) | direction) as i32)
    }
}

impl Transport for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn send(&mut self, peer: usize, tag: Tag, tensor: Tensor) -> Result<(), TransportError> {
        let to = self.pipeline.process_at_rank(self.pipeline_rank(peer)?);
        let t = self.mpi_tag(tag)?;
        let (rows, cols) = tensor.shape();
        to.buffered_send_with_tag(&[rows as u64, cols as u64][..], t);
        to.buffered_send_with_tag(tensor.data(), t);
        Ok(())
    }

    fn recv(&mut self, peer: usize, tag: Tag) -> Result<Tensor, TransportError> {
        let from = self.pipeline.process_at_rank(self.pipeline_rank(peer)?);
        let t = self.mpi_tag(tag)?;
        let start = Instant::now();
        let mut polls = 0u64;
        let header = loop {
            if let Some(m) = from.immediate_matched_probe_with_tag(t) {
                break m.matched_receive_vec::<u64>().0;
            }
            if start.elapsed() > self.timeout {
                return Err(TransportError::Timeout {
                    rank: self.rank,
                    peer,
                    what: tag.to_string(),
                    waited_s: start.elapsed().as_secs_f64(),
                });
            }
            polls += 1;
            // spin briefly for low latency, then yield the core
            if polls > 1000 {
                std::thread::sleep(Duration::from_micros(50));
            }
        };
        let [rows, cols] = header[..] else {
            return Err(self.invalid(format!(
                "{tag} from rank {peer}: a header of {} values",
                header.len()
            )));
        };
        // MPI keeps the order of messages between two ranks with one tag: the data is next
        let (data, _) = from.receive_vec_with_tag::<f32>(t);
        if data.len() as u64 != rows * cols {
            return Err(self.invalid(format!(
                "{tag} from rank {peer}: {} values for a {rows} × {cols} tensor",
                data.len()
            )));
        }
        Ok(Tensor::from_vec(rows as usize, cols as usize, data))
    }

    /// Over the data-parallel communicator (`group` = this rank's replicas of its pipeline
    /// rank), the tensor-parallel one (`group` = its tensor-parallel group) or the world (`group` = every rank), whose ranks are in `group`'s order: for each
    /// [`REDUCE_CHUNK`] values, a gather of every member's values to the first member, their
    /// sum there in group order (`sum_in_group_order`, as [`InProcess`](super::InProcess)
    /// adds), and a broadcast of the sum. Every member must pass the same number of values
    /// (another number is an MPI error).
    fn all_reduce_sum(&mut self, group: &[usize], data: &mut [f64]) -> Result<(), TransportError> {
        let whole: Vec<usize> = (0..self.size).collect();
        let comm = if group == self.dp_group.as_slice() {
            &self.data_parallel
        } else if group == self.tp_group.as_slice() {
            &self.tensor_parallel
        } else if group == whole.as_slice() {
            &self.world
        } else {
            return Err(self.invalid(format!(
                "all-reduce over {group:?}: the MPI transport has communicators for the data-parallel group {:?}, the tensor-parallel group {:?} and the world",
                self.dp_group, self.tp_group
            )));
        };
        if group.len() == 1 {
            return Ok(());
        }
        let root = comm.process_at_rank(0);
        let is_root = comm.rank() == 0;
        // the parts of one chunk, on the first member only
        let held = if is_root {
            data.len().min(REDUCE_CHUNK)
        } else {
            0
        };
        let mut parts = vec![0.0f64; held * group.len()];
        for chunk in data.chunks_mut(REDUCE_CHUNK) {
            if is_root {
                let parts = &mut parts[..chunk.len() * group.len()];
                root.gather_into_root(&*chunk, &mut *parts);
                sum_in_group_order(parts, chunk);
            } else {
                root.gather_into(&*chunk);
            }
            root.broadcast_into(chunk);
        }
        Ok(())
    }
}
