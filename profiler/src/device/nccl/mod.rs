//! The NCCL transport (feature `cuda`): ranks are threads of one process, one GPU each (rank
//! `r` on GPU `r`), and tensors travel between GPUs through NCCL.
//!
//! - **Point-to-point.** Each direction of each pipeline link (`from → to`) has its own
//!   two-rank communicator and its own stream on each side, in which `from` only sends and `to`
//!   only receives. NCCL matches sends and receives in order, and a send's kernel waits on its
//!   GPU until the receive is posted, so with one communicator per pair a send queued behind
//!   another could wait for a receive that waits for this rank: separate directions cannot
//!   deadlock, since each stream holds only sends or only receives for one peer. A message is a
//!   header (`[stage, micro-batch, direction, rows, cols]`, u64) and the data (f32); the
//!   receiver takes the next message from the peer and keeps those with other [`Tag`]s until
//!   asked for, as [`InProcess`](super::InProcess) does.
//! - **Sends never wait for their receive.** The tensor is copied to the GPU on a separate
//!   upload stream (and waited for), the NCCL send is queued on the link's stream, and the
//!   buffers are kept until the send is done.
//! - **All-reduce** within a group (the data-parallel replicas of a pipeline rank) uses that
//!   group's communicator: an all-gather of every member's f64 data, then the sum in group
//!   order on the host, so every member gets the same bits as the in-process transport's sum
//!   (and as each other).
//! - **Connections** are made when the world is built: the communicators (`ncclCommInitAll`
//!   from the calling thread) and one tiny transfer on each, all in one NCCL group, so no first
//!   send waits on the host for its peer to connect.
//!
//! Limits. [`Abort`] is honoured where the host waits: a receive or an all-reduce polls its GPU
//! work every few microseconds and gives up within [`ABORT_POLL`](super::ABORT_POLL) of the
//! switch (or at its timeout); the NCCL work it queued cannot be cancelled, so the endpoint is
//! unusable afterwards and every later call fails. Dropping an endpoint waits (at most the
//! timeout, unless aborted) for its sends to be received, then aborts its communicators
//! (`ncclCommAbort`), which ends whatever is still queued. Building the world cannot be
//! interrupted. Untested on a GPU as of this writing.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream};
use cudarc::nccl::Comm;

use super::cuda::{call_failed, CudaError};
use super::tensor::Tensor;
use super::transport::{sum_in_group_order, Abort, Direction, Tag, Transport, TransportError};

mod world;

/// Elements of a message header: stage, micro-batch, direction, rows, cols.
const HEADER: usize = 5;

/// A send in flight: its buffers live until `done` completes.
struct InFlight {
    done: CudaEvent,
    _header: CudaSlice<u64>,
    _data: Option<CudaSlice<f32>>,
}

/// One rank's endpoint. Make them with [`NcclTransport::world`] and move one into each rank's
/// thread.
pub struct NcclTransport {
    // Fields drop in order: the communicators first (`ncclCommAbort` ends any queued work),
    // then the buffers that work used.
    /// Communicators in which this rank sends to the key (this rank is comm rank 0).
    sends: HashMap<usize, Comm>,
    /// Communicators in which this rank receives from the key (this rank is comm rank 1).
    recvs: HashMap<usize, Comm>,
    /// All-reduce groups (world ranks in order) and their communicators.
    groups: Vec<(Vec<usize>, Comm)>,
    in_flight: VecDeque<InFlight>,
    stash: HashMap<(usize, Tag), VecDeque<Tensor>>,
    upload: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    abort: Abort,
    /// Why the endpoint can no longer be used (a wait gave up with NCCL work queued).
    broken: Option<String>,
}

// SAFETY: `Comm` holds a raw `ncclComm_t`, so it is not `Send`. NCCL allows a communicator to
// be used from any thread as long as one thread at a time does; an endpoint is owned and used
// by one rank thread at a time (`Transport` takes `&mut self`), and every other field is
// `Send`.
unsafe impl Send for NcclTransport {}

/// Which link or group a failure concerns, for messages.
fn nccl_failed<'a>(
    what: &'a str,
    ordinal: usize,
) -> impl Fn(cudarc::nccl::result::NcclError) -> CudaError + 'a {
    move |e| CudaError::Call {
        what: what.to_string(),
        ordinal,
        message: format!("{:?}", e.0),
    }
}

/// Waits for `done` while polling, giving up at `deadline` or once `abort` is set.
fn wait_until(done: &CudaEvent, abort: &Abort, deadline: Instant) -> Result<(), Wait> {
    let mut polls = 0u32;
    loop {
        match done.try_is_complete() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(Wait::Failed(e.to_string())),
        }
        if abort.is_set() {
            return Err(Wait::Aborted);
        }
        if Instant::now() >= deadline {
            return Err(Wait::TimedOut);
        }
        polls += 1;
        // spin briefly for latency, then yield the core
        if polls > 1000 {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::thread::yield_now();
        }
    }
}

/// How a wait ended, when it did not succeed.
enum Wait {
    TimedOut,
    Aborted,
    Failed(String),
}

impl NcclTransport {
    fn device_error(&self, e: CudaError) -> TransportError {
        TransportError::Device {
            rank: self.rank,
            message: e.to_string(),
        }
    }

    fn invalid(&self, message: String) -> TransportError {
        TransportError::Invalid {
            rank: self.rank,
            message,
        }
    }

    /// Fails if an earlier wait left NCCL work queued; binds this rank's GPU to the thread;
    /// frees the buffers of finished sends.
    fn ready(&mut self) -> Result<(), TransportError> {
        if let Some(why) = &self.broken {
            return Err(self.invalid(format!("the NCCL endpoint is unusable: {why}")));
        }
        self.ctx.bind_to_thread().map_err(|e| {
            self.device_error(call_failed("binding the GPU's context", self.rank)(e))
        })?;
        while let Some(f) = self.in_flight.front() {
            match f.done.try_is_complete() {
                Ok(true) => drop(self.in_flight.pop_front()),
                Ok(false) => break,
                Err(e) => return Err(self.device_error(call_failed("ncclSend", self.rank)(e))),
            }
        }
        Ok(())
    }

    /// Waits for the work queued so far on `stream`, as [`wait_until`] does; a failed wait
    /// breaks the endpoint.
    fn wait(
        &mut self,
        stream: &CudaStream,
        peer: usize,
        what: &dyn Fn() -> String,
        start: Instant,
    ) -> Result<(), TransportError> {
        let done = stream
            .record_event(None)
            .map_err(|e| self.device_error(call_failed("recording an event", self.rank)(e)))?;
        let r = wait_until(&done, &self.abort, start + self.timeout);
        let (e, why) = match r {
            Ok(()) => return Ok(()),
            Err(Wait::TimedOut) => (
                TransportError::Timeout {
                    rank: self.rank,
                    peer,
                    what: what(),
                    waited_s: start.elapsed().as_secs_f64(),
                },
                "a receive timed out",
            ),
            Err(Wait::Aborted) => (
                TransportError::Aborted {
                    rank: self.rank,
                    peer,
                    what: what(),
                },
                "another rank failed",
            ),
            Err(Wait::Failed(message)) => (
                TransportError::Device {
                    rank: self.rank,
                    message: format!("NCCL work on GPU {} failed: {message}", self.rank),
                },
                "its GPU work failed",
            ),
        };
        self.broken = Some(why.into());
        Err(e)
    }

    /// The next message from `peer` (whatever its tag), waiting at most until `start` plus the
    /// timeout.
    fn next_message(
        &mut self,
        peer: usize,
        wanted: Tag,
        start: Instant,
    ) -> Result<(Tag, Tensor), TransportError> {
        let Some(comm) = self.recvs.get(&peer) else {
            return Err(self.invalid(format!(
                "no NCCL link from rank {peer} (links from: {:?})",
                self.recvs.keys().collect::<Vec<_>>()
            )));
        };
        let stream = comm.stream();
        let what = || wanted.to_string();
        let rank = self.rank;
        let failed = move |what: &'static str| call_failed(what, rank);
        let mut header_dev = stream
            .alloc_zeros::<u64>(HEADER)
            .map_err(|e| self.device_error(failed("allocating on the GPU")(e)))?;
        comm.recv(&mut header_dev, 0)
            .map_err(|e| self.device_error(nccl_failed("ncclRecv", self.rank)(e)))?;
        self.wait(&stream, peer, &what, start)?;
        let header = stream
            .clone_dtoh(&header_dev)
            .and_then(|h| stream.synchronize().map(|()| h))
            .map_err(|e| self.device_error(failed("copying from the GPU")(e)))?;
        let [stage, microbatch, direction, rows, cols] = header[..] else {
            return Err(self.invalid(format!(
                "a header of {} values from rank {peer}",
                header.len()
            )));
        };
        let direction = match direction {
            0 => Direction::Activation,
            1 => Direction::Gradient,
            d => return Err(self.invalid(format!("direction {d} in a header from rank {peer}"))),
        };
        let tag = Tag {
            stage: stage as u32,
            microbatch: microbatch as u32,
            direction,
        };
        let (rows, cols) = (rows as usize, cols as usize);
        let n = rows * cols;
        let data = if n == 0 {
            Vec::new()
        } else {
            let comm = &self.recvs[&peer];
            let mut data_dev = stream
                .alloc_zeros::<f32>(n)
                .map_err(|e| self.device_error(failed("allocating on the GPU")(e)))?;
            comm.recv(&mut data_dev, 0)
                .map_err(|e| self.device_error(nccl_failed("ncclRecv", self.rank)(e)))?;
            self.wait(&stream, peer, &what, start)?;
            stream
                .clone_dtoh(&data_dev)
                .and_then(|d| stream.synchronize().map(|()| d))
                .map_err(|e| self.device_error(failed("copying from the GPU")(e)))?
        };
        Ok((tag, Tensor::from_vec(rows, cols, data)))
    }
}

impl Transport for NcclTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    /// Copies the header and the tensor to the GPU (waiting for the copy only), queues the two
    /// NCCL sends on the link's stream and returns.
    fn send(&mut self, peer: usize, tag: Tag, tensor: Tensor) -> Result<(), TransportError> {
        self.ready()?;
        let Some(comm) = self.sends.get(&peer) else {
            return Err(self.invalid(format!(
                "no NCCL link to rank {peer} (links to: {:?})",
                self.sends.keys().collect::<Vec<_>>()
            )));
        };
        let rank = self.rank;
        let failed = move |what: &'static str| call_failed(what, rank);
        let direction = match tag.direction {
            Direction::Activation => 0,
            Direction::Gradient => 1,
        };
        let (rows, cols) = tensor.shape();
        let header = [
            u64::from(tag.stage),
            u64::from(tag.microbatch),
            direction,
            rows as u64,
            cols as u64,
        ];
        let copied = (|| {
            let h = self.upload.clone_htod(&header[..])?;
            let d = if tensor.is_empty() {
                None
            } else {
                Some(self.upload.clone_htod(tensor.data())?)
            };
            self.upload.synchronize()?;
            Ok((h, d))
        })();
        let (h, d) = copied.map_err(|e| self.device_error(failed("copying to the GPU")(e)))?;
        let sent = comm.send(&h, 1).and_then(|_| match &d {
            Some(d) => comm.send(d, 1).map(|_| ()),
            None => Ok(()),
        });
        sent.map_err(|e| self.device_error(nccl_failed("ncclSend", self.rank)(e)))?;
        let done = comm
            .stream()
            .record_event(None)
            .map_err(|e| self.device_error(failed("recording an event")(e)))?;
        self.in_flight.push_back(InFlight {
            done,
            _header: h,
            _data: d,
        });
        Ok(())
    }

    fn recv(&mut self, peer: usize, tag: Tag) -> Result<Tensor, TransportError> {
        if let Some(t) = self
            .stash
            .get_mut(&(peer, tag))
            .and_then(VecDeque::pop_front)
        {
            return Ok(t);
        }
        self.ready()?;
        let start = Instant::now();
        loop {
            let (got, tensor) = self.next_message(peer, tag, start)?;
            if got == tag {
                return Ok(tensor);
            }
            self.stash.entry((peer, got)).or_default().push_back(tensor);
        }
    }

    /// An all-gather of every member's data over the group's communicator, then the sum in
    /// group order on the host: the in-process transport's bits on every member.
    fn all_reduce_sum(&mut self, group: &[usize], data: &mut [f64]) -> Result<(), TransportError> {
        if !group.contains(&self.rank) {
            return Err(self.invalid(format!(
                "all-reduce over group {group:?}, which does not contain it"
            )));
        }
        if group.len() == 1 {
            return Ok(());
        }
        self.ready()?;
        let Some((_, comm)) = self.groups.iter().find(|(g, _)| g == group) else {
            return Err(self.invalid(format!(
                "no NCCL communicator for group {group:?} (groups: {:?})",
                self.groups.iter().map(|(g, _)| g).collect::<Vec<_>>()
            )));
        };
        let stream = comm.stream();
        let rank = self.rank;
        let failed = move |what: &'static str| call_failed(what, rank);
        let n = data.len();
        let queued = (|| {
            let mine = stream.clone_htod(&*data)?;
            let all = stream.alloc_zeros::<f64>(n * group.len())?;
            Ok((mine, all))
        })();
        let (mine, mut all) =
            queued.map_err(|e| self.device_error(failed("copying to the GPU")(e)))?;
        comm.all_gather(&mine, &mut all)
            .map_err(|e| self.device_error(nccl_failed("ncclAllGather", self.rank)(e)))?;
        // the ring neighbour stands for "a member" in a timeout's message
        let at = group.iter().position(|&r| r == self.rank).unwrap_or(0);
        let peer = group[(at + 1) % group.len()];
        let what = || format!("its part of the all-reduce over ranks {group:?}");
        self.wait(&stream, peer, &what, Instant::now())?;
        let parts = stream
            .clone_dtoh(&all)
            .and_then(|v| stream.synchronize().map(|()| v))
            .map_err(|e| self.device_error(failed("copying from the GPU")(e)))?;
        sum_in_group_order(&parts, data);
        Ok(())
    }
}

impl Drop for NcclTransport {
    /// Waits (at most the timeout, and not once the world is aborted or the endpoint broken)
    /// for the sends still in flight to be received, so that a rank that finishes first does
    /// not cut off its last messages; then the fields drop, communicators first.
    fn drop(&mut self) {
        let deadline = Instant::now() + self.timeout;
        if self.broken.is_some() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        while let Some(f) = self.in_flight.front() {
            if wait_until(&f.done, &self.abort, deadline).is_err() {
                return;
            }
            self.in_flight.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cuda::device_count;

    fn tag(stage: u32, microbatch: u32) -> Tag {
        Tag {
            stage,
            microbatch,
            direction: Direction::Activation,
        }
    }

    /// Two ranks on two GPUs: out-of-order receives, an empty tensor, and an all-reduce whose
    /// sum is the same bits on both.
    fn two_ranks() {
        let abort = Abort::new();
        let world = NcclTransport::world(
            2,
            &[(0, 1), (1, 0)],
            &[vec![0, 1]],
            Duration::from_secs(60),
            &abort,
        )
        .expect("two GPUs and NCCL are present");
        let results: Vec<Vec<f64>> = std::thread::scope(|s| {
            let handles: Vec<_> = world
                .into_iter()
                .map(|mut t| {
                    s.spawn(move || {
                        if t.rank() == 0 {
                            t.send(1, tag(1, 0), Tensor::full(2, 3, 0.5)).unwrap();
                            t.send(1, tag(1, 1), Tensor::full(1, 2, 1.5)).unwrap();
                            t.send(1, tag(1, 2), Tensor::zeros(0, 4)).unwrap();
                            let back = t.recv(1, tag(0, 0)).unwrap();
                            assert_eq!(back.data(), [7.0]);
                        } else {
                            assert_eq!(t.recv(0, tag(1, 1)).unwrap().data(), [1.5, 1.5]);
                            assert_eq!(t.recv(0, tag(1, 2)).unwrap().shape(), (0, 4));
                            let first = t.recv(0, tag(1, 0)).unwrap();
                            assert_eq!((first.shape(), first.data()[5]), ((2, 3), 0.5));
                            t.send(0, tag(0, 0), Tensor::full(1, 1, 7.0)).unwrap();
                        }
                        let mut data = vec![0.1 * (t.rank() + 1) as f64, 1.0, 1e-17];
                        t.all_reduce_sum(&[0, 1], &mut data).unwrap();
                        data
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results[0], results[1]);
        assert_eq!(results[0], [0.1 + 0.2, 2.0, 2e-17]);
    }

    /// With two GPUs, NCCL moves tensors and sums; otherwise the world is refused in one line
    /// that says why (no driver, too few GPUs, no NCCL).
    #[test]
    fn two_ranks_over_nccl_or_the_refusal() {
        let refusal =
            NcclTransport::world(2, &[(0, 1)], &[], Duration::from_secs(5), &Abort::new()).err();
        match (device_count(), refusal) {
            (Ok(gpus), None) if gpus >= 2 => two_ranks(),
            (Err(CudaError::NoDriver), Some(e)) => {
                assert_eq!(e, CudaError::NoDriver);
                eprintln!("no CUDA driver: the NCCL test did not run");
            }
            (Ok(gpus), Some(e)) if gpus < 2 => {
                assert_eq!(e, CudaError::TooFewGpus { ranks: 2, gpus });
                let text = e.to_string();
                assert!(
                    text.contains("2 ranks but") && text.contains("one GPU per rank"),
                    "{text}"
                );
                eprintln!("{text}: the NCCL test did not run");
            }
            (Ok(_), Some(e @ CudaError::NoLibrary { .. })) => {
                assert!(e.to_string().contains("NCCL (libnccl.so)"), "{e}");
                eprintln!("{e}: the NCCL test did not run");
            }
            (count, refusal) => panic!("GPUs: {count:?}; the world: {refusal:?}"),
        }
    }
}
