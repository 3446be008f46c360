//! Building the NCCL world: the communicators of every link and group, and their
//! connections.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::{group_end, group_start, Comm};

use super::{nccl_failed, wait_until, NcclTransport, Wait};
use crate::device::cuda::{
    call_failed, device_count, open, require, require_driver, CudaError, Library,
};
use crate::device::transport::Abort;

impl NcclTransport {
    /// `world_size` connected endpoints, rank `r` on GPU `r`, rank `i` at index `i`, with a
    /// point-to-point link for each directed pair `(from, to)` of `pairs` and an all-reduce
    /// communicator for each group of `groups` (world ranks, in the order the sum runs);
    /// receives and all-reduces give up after `timeout`, or within
    /// [`ABORT_POLL`](crate::device::ABORT_POLL) once `abort` is set.
    ///
    /// # Errors
    /// [`CudaError::NoDriver`] without a driver; [`CudaError::TooFewGpus`] when there are fewer
    /// GPUs than ranks (NCCL runs one rank per GPU); [`CudaError::NoLibrary`] without NCCL;
    /// [`CudaError::NoDevice`] or [`CudaError::Call`] if a GPU or NCCL fails; a
    /// [`CudaError::Call`] naming the pair or group if one is not a set of distinct ranks
    /// inside the world.
    pub fn world(
        world_size: usize,
        pairs: &[(usize, usize)],
        groups: &[Vec<usize>],
        timeout: Duration,
        abort: &Abort,
    ) -> Result<Vec<NcclTransport>, CudaError> {
        require_driver()?;
        let gpus = device_count()?;
        if gpus < world_size {
            return Err(CudaError::TooFewGpus {
                ranks: world_size,
                gpus,
            });
        }
        require(Library::Nccl)?;
        let bad = |message: String| CudaError::Call {
            what: "building the NCCL world".into(),
            ordinal: 0,
            message,
        };
        for &(from, to) in pairs {
            if from == to || from >= world_size || to >= world_size {
                return Err(bad(format!(
                    "link {from} → {to} is not between two ranks of the {world_size}"
                )));
            }
        }
        for g in groups {
            let mut sorted = g.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != g.len() || g.iter().any(|&r| r >= world_size) {
                return Err(bad(format!(
                    "group {g:?} is not a set of ranks of the {world_size}"
                )));
            }
        }
        let ctxs = (0..world_size).map(open).collect::<Result<Vec<_>, _>>()?;
        let stream = |r: usize| {
            ctxs[r]
                .new_stream()
                .map_err(call_failed("creating a stream", r))
        };
        let mut world = Vec::with_capacity(world_size);
        for (rank, ctx) in ctxs.iter().enumerate() {
            world.push(NcclTransport {
                sends: HashMap::new(),
                recvs: HashMap::new(),
                groups: Vec::new(),
                in_flight: VecDeque::new(),
                stash: HashMap::new(),
                upload: stream(rank)?,
                ctx: ctx.clone(),
                rank,
                world_size,
                timeout,
                abort: abort.clone(),
                broken: None,
            });
        }
        let mut links: Vec<(usize, usize)> = pairs.to_vec();
        links.sort_unstable();
        links.dedup();
        for (from, to) in links {
            let comms = Comm::from_devices(vec![stream(from)?, stream(to)?])
                .map_err(nccl_failed("ncclCommInitAll for a link", from))?;
            let [sender, receiver]: [Comm; 2] = comms.try_into().map_err(|_| {
                bad("ncclCommInitAll made the wrong number of communicators".into())
            })?;
            world[from].sends.insert(to, sender);
            world[to].recvs.insert(from, receiver);
        }
        for g in groups.iter().filter(|g| g.len() > 1) {
            let streams = g
                .iter()
                .map(|&r| stream(r))
                .collect::<Result<Vec<_>, _>>()?;
            let comms = Comm::from_devices(streams)
                .map_err(nccl_failed("ncclCommInitAll for a group", g[0]))?;
            for (&member, comm) in g.iter().zip(comms) {
                world[member].groups.push((g.clone(), comm));
            }
        }
        connect(&world, timeout)?;
        Ok(world)
    }
}

/// Makes every connection now — one tiny send and receive on each link, one all-gather on each
/// group, all in one NCCL group from this thread — and waits for them (at most `timeout`).
fn connect(world: &[NcclTransport], timeout: Duration) -> Result<(), CudaError> {
    let failed = |e| nccl_failed("connecting NCCL links", 0)(e);
    let mut buffers: Vec<CudaSlice<u64>> = Vec::new();
    let mut streams: Vec<Arc<CudaStream>> = Vec::new();
    let alloc = |comm: &Comm, n: usize| {
        comm.stream()
            .alloc_zeros::<u64>(n)
            .map_err(call_failed("allocating on the GPU", comm.ordinal()))
    };
    for t in world {
        for comm in t.sends.values().chain(t.recvs.values()) {
            buffers.push(alloc(comm, 1)?);
            streams.push(comm.stream());
        }
        for (g, comm) in &t.groups {
            buffers.push(alloc(comm, 1)?);
            buffers.push(alloc(comm, g.len())?);
            streams.push(comm.stream());
        }
    }
    group_start().map_err(failed)?;
    let mut at = buffers.iter_mut();
    let mut queue = || -> Result<(), CudaError> {
        for t in world {
            for comm in t.sends.values() {
                let b = at.next().expect("one buffer per link end");
                comm.send(&*b, 1).map_err(failed)?;
            }
            for comm in t.recvs.values() {
                let b = at.next().expect("one buffer per link end");
                comm.recv(b, 0).map_err(failed)?;
            }
            for (_, comm) in &t.groups {
                let one = at.next().expect("two buffers per group member");
                let all = at.next().expect("two buffers per group member");
                comm.all_gather(&*one, all).map_err(failed)?;
            }
        }
        Ok(())
    };
    let queued = queue();
    let ended = group_end().map_err(failed);
    queued?;
    ended?;
    let deadline = Instant::now() + timeout;
    for s in &streams {
        let done = s
            .record_event(None)
            .map_err(call_failed("recording an event", s.context().ordinal()))?;
        match wait_until(&done, &Abort::new(), deadline) {
            Ok(()) => {}
            Err(Wait::Failed(message)) => {
                return Err(CudaError::Call {
                    what: "connecting NCCL links".into(),
                    ordinal: s.context().ordinal(),
                    message,
                })
            }
            Err(_) => {
                return Err(CudaError::Call {
                    what: "connecting NCCL links".into(),
                    ordinal: s.context().ordinal(),
                    message: format!("not done after {:.0} s", timeout.as_secs_f64()),
                })
            }
        }
    }
    Ok(())
}
