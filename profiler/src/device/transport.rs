//! Moving tensors between ranks: the [`Transport`] trait and its in-process implementation
//! ([`InProcess`](super::InProcess), in `inprocess.rs`: one thread per rank, `std::sync::mpsc`
//! channels).
//!
//! The trait is what every backend provides — point-to-point sends and receives of tensors
//! named by a [`Tag`], and a summing all-reduce within a group of ranks — so the MPI backend
//! (tags and communicators, feature `mpi`) and the NCCL backend (one communicator per direction
//! of each pipeline link, feature `cuda`) implement it without the runtime changing. Sends never wait for their receive;
//! receives wait at most a timeout and then fail naming the peer, and give up within
//! [`ABORT_POLL`] once the world's [`Abort`] switch is set (a rank failed).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::tensor::Tensor;

/// Which way a tensor travels along the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// A forward activation, from stage `s − 1` to stage `s`.
    Activation,
    /// A backward gradient, from stage `s + 1` to stage `s`.
    Gradient,
}

/// Names one point-to-point message: the stage that *consumes* it, the micro-batch and the
/// direction. An activation for stage 3 of micro-batch 5 is `Tag { stage: 3, microbatch: 5,
/// direction: Activation }`; the gradient stage 3 sends back is for stage 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag {
    /// The stage that consumes the tensor.
    pub stage: u32,
    /// The micro-batch.
    pub microbatch: u32,
    /// Activation or gradient.
    pub direction: Direction,
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.direction {
            Direction::Activation => "activation",
            Direction::Gradient => "gradient",
        };
        write!(
            f,
            "the {what} for stage {} of micro-batch {}",
            self.stage, self.microbatch
        )
    }
}

/// How often a blocked receive looks at the [`Abort`] switch: the longest a rank keeps waiting
/// after another rank failed.
pub const ABORT_POLL: Duration = Duration::from_millis(10);

/// A switch shared by every endpoint of a world: once a rank fails it is set, and every
/// receive blocked anywhere in the world gives up with [`TransportError::Aborted`] within
/// [`ABORT_POLL`] instead of waiting out its timeout. Clones share the switch.
#[derive(Debug, Clone, Default)]
pub struct Abort(Arc<AtomicBool>);

impl Abort {
    /// A switch that is not set.
    pub fn new() -> Self {
        Abort::default()
    }

    /// Sets the switch, for good.
    pub fn trigger(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the switch is set.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Why a transfer failed. Messages name both ranks.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TransportError {
    /// A receive waited longer than the timeout.
    #[error("rank {rank} waited {waited_s:.1} s for {what} from rank {peer}, which never sent it (did rank {peer} fail or its schedule differ?)")]
    Timeout {
        /// The waiting rank.
        rank: usize,
        /// The rank it waited for.
        peer: usize,
        /// What it waited for.
        what: String,
        /// How long it waited, seconds.
        waited_s: f64,
    },
    /// The receive gave up because another rank failed (the [`Abort`] switch was set).
    #[error("rank {rank} stopped waiting for {what} from rank {peer}: another rank failed")]
    Aborted {
        /// The waiting rank.
        rank: usize,
        /// The rank it waited for.
        peer: usize,
        /// What it waited for.
        what: String,
    },
    /// The peer is gone (its endpoint was dropped).
    #[error("rank {rank} cannot reach rank {peer}: its endpoint is closed")]
    Disconnected {
        /// This rank.
        rank: usize,
        /// The rank it tried to reach.
        peer: usize,
    },
    /// The device under the transport failed (a CUDA or NCCL call).
    #[error("rank {rank}: {message}")]
    Device {
        /// This rank.
        rank: usize,
        /// The call and the library's error.
        message: String,
    },
    /// A rank or group outside the world, or a payload of the wrong size.
    #[error("rank {rank}: {message}")]
    Invalid {
        /// This rank.
        rank: usize,
        /// What is wrong.
        message: String,
    },
}

/// Point-to-point and collective transfers of one rank. One endpoint per rank; an endpoint is
/// used by one thread.
pub trait Transport {
    /// This endpoint's rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// Sends `tensor` to `peer`; returns without waiting for the receive.
    fn send(&mut self, peer: usize, tag: Tag, tensor: Tensor) -> Result<(), TransportError>;

    /// Receives the tensor `peer` sent with `tag`, waiting at most the endpoint's timeout.
    /// Messages may arrive in any order; others are kept until asked for.
    fn recv(&mut self, peer: usize, tag: Tag) -> Result<Tensor, TransportError>;

    /// Sums `data` element-wise over the ranks of `group` (which must contain this rank); every
    /// member ends with the same bits. Every member calls it with its groups in the same order.
    /// The data is f64: the executor widens its f32 weight gradients, sums them here and
    /// rounds each sum once back to f32 (NCCL and MPI reduce f64 natively).
    fn all_reduce_sum(&mut self, group: &[usize], data: &mut [f64]) -> Result<(), TransportError>;

    /// Reduce-scatter: `data` holds `group.len()` chunks of `out.len()` values; member `i` of
    /// `group` gets in `out` the sum over the members of their chunk `i`, each element summed
    /// from 0.0 in group order (the bits of [`Transport::all_reduce_sum`]'s sum). By default
    /// an all-reduce of the whole `data`, of which this member keeps its chunk.
    fn reduce_scatter_sum(
        &mut self,
        group: &[usize],
        data: &[f64],
        out: &mut [f64],
    ) -> Result<(), TransportError> {
        let me = member_index(self.rank(), group)?;
        let mut all = data.to_vec();
        self.all_reduce_sum(group, &mut all)?;
        let n = out.len();
        out.copy_from_slice(&all[me * n..(me + 1) * n]);
        Ok(())
    }

    /// All-gather: `out` (`group.len()` chunks of `mine.len()` values) gets every member's
    /// `mine` in group order. By default an all-reduce in which each member fills its chunk
    /// and zeros elsewhere (exact: one non-zero term per element).
    fn all_gather(
        &mut self,
        group: &[usize],
        mine: &[f64],
        out: &mut [f64],
    ) -> Result<(), TransportError> {
        let me = member_index(self.rank(), group)?;
        let n = mine.len();
        out.fill(0.0);
        out[me * n..(me + 1) * n].copy_from_slice(mine);
        self.all_reduce_sum(group, out)
    }
}

/// Where `rank` sits in `group`, or the error of a collective over a group without it.
fn member_index(rank: usize, group: &[usize]) -> Result<usize, TransportError> {
    group
        .iter()
        .position(|&r| r == rank)
        .ok_or_else(|| TransportError::Invalid {
            rank,
            message: format!("a collective over group {group:?}, which does not contain it"),
        })
}

/// A borrowed endpoint is an endpoint (so a caller can keep its own, e.g. to abort an MPI job
/// after the run returns an error).
impl<T: Transport + ?Sized> Transport for &mut T {
    fn rank(&self) -> usize {
        (**self).rank()
    }

    fn world_size(&self) -> usize {
        (**self).world_size()
    }

    fn send(&mut self, peer: usize, tag: Tag, tensor: Tensor) -> Result<(), TransportError> {
        (**self).send(peer, tag, tensor)
    }

    fn recv(&mut self, peer: usize, tag: Tag) -> Result<Tensor, TransportError> {
        (**self).recv(peer, tag)
    }

    fn all_reduce_sum(&mut self, group: &[usize], data: &mut [f64]) -> Result<(), TransportError> {
        (**self).all_reduce_sum(group, data)
    }

    fn reduce_scatter_sum(
        &mut self,
        group: &[usize],
        data: &[f64],
        out: &mut [f64],
    ) -> Result<(), TransportError> {
        (**self).reduce_scatter_sum(group, data, out)
    }

    fn all_gather(
        &mut self,
        group: &[usize],
        mine: &[f64],
        out: &mut [f64],
    ) -> Result<(), TransportError> {
        (**self).all_gather(group, mine, out)
    }
}

/// Sums the members' parts into `out`: `parts` holds member 0's `out.len()` values, then member
/// 1's, and so on; each element is summed from 0.0, adding the members in group order. Every
/// transport's all-reduce sums through this, so all give the same bits.
pub(crate) fn sum_in_group_order(parts: &[f64], out: &mut [f64]) {
    out.fill(0.0);
    for part in parts.chunks_exact(out.len().max(1)) {
        for (s, x) in out.iter_mut().zip(part) {
            *s += x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::InProcess;
    use std::time::Instant;

    fn tag(stage: u32, microbatch: u32) -> Tag {
        Tag {
            stage,
            microbatch,
            direction: Direction::Activation,
        }
    }

    #[test]
    fn out_of_order_messages_are_kept_until_asked_for() {
        let mut w = InProcess::world(2, Duration::from_secs(5));
        let mut b = w.pop().unwrap();
        let mut a = w.pop().unwrap();
        a.send(1, tag(1, 0), Tensor::full(1, 1, 0.0)).unwrap();
        a.send(1, tag(1, 1), Tensor::full(1, 1, 1.0)).unwrap();
        assert_eq!(b.recv(0, tag(1, 1)).unwrap().data(), [1.0]);
        assert_eq!(b.recv(0, tag(1, 0)).unwrap().data(), [0.0]);
    }

    #[test]
    fn a_missing_message_times_out_naming_the_peer() {
        let mut w = InProcess::world(2, Duration::from_millis(50));
        let e = w[1].recv(0, tag(3, 5)).unwrap_err().to_string();
        assert!(
            e.contains("rank 1 waited") && e.contains("from rank 0"),
            "{e}"
        );
        assert!(e.contains("stage 3 of micro-batch 5"), "{e}");
        assert!(w[0].recv(7, tag(0, 0)).is_err());
    }

    #[test]
    fn an_abort_ends_a_blocked_receive_quickly() {
        let abort = Abort::new();
        let mut w = InProcess::world_with_abort(2, Duration::from_secs(60), &abort);
        let start = Instant::now();
        let e = std::thread::scope(|s| {
            let waiter = s.spawn(|| w[1].recv(0, tag(1, 0)));
            std::thread::sleep(Duration::from_millis(30));
            abort.trigger();
            waiter.join().unwrap()
        })
        .unwrap_err();
        assert!(
            matches!(
                e,
                TransportError::Aborted {
                    rank: 1,
                    peer: 0,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn parts_are_summed_from_zero_in_group_order() {
        // 1e16 + 1 rounds back to 1e16: adding the two 1e16s first would give 1
        let parts = [1e16, 0.5, 1.0, 0.5, -1e16, 1.0];
        let mut out = [7.0, 7.0];
        sum_in_group_order(&parts, &mut out);
        assert_eq!(out, [0.0, 2.0]);
        sum_in_group_order(&[], &mut []);
    }

    #[test]
    fn all_reduce_sums_in_group_order_on_every_thread() {
        let world = InProcess::world(4, Duration::from_secs(5));
        let results: Vec<Vec<f64>> = std::thread::scope(|s| {
            let handles: Vec<_> = world
                .into_iter()
                .map(|mut t| {
                    s.spawn(move || {
                        let group = if t.rank() % 2 == 0 {
                            vec![0, 2]
                        } else {
                            vec![1, 3]
                        };
                        let mut data = vec![t.rank() as f64, 1.0];
                        t.all_reduce_sum(&group, &mut data).unwrap();
                        t.all_reduce_sum(&group, &mut data).unwrap();
                        data
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results[0], [4.0, 4.0]);
        assert_eq!(results[2], [4.0, 4.0]);
        assert_eq!(results[1], [8.0, 4.0]);
        assert_eq!(results[3], [8.0, 4.0]);
    }
}
