//! [`GroupComm`]: the [`TpComm`] of a tensor-parallel rank, over a [`Transport`]'s
//! collectives within its group, timing them.

use std::time::Instant;

use super::sp;
use super::tensor::Tensor;
use super::tp::{Shard, TpComm};
use super::transport::{Transport, TransportError};

/// [`TpComm`] over a [`Transport`]'s all-reduce within `group` (world ranks in tensor-parallel
/// rank order): f32 data are widened into a reused f64 buffer, summed in group order and
/// rounded once, so every member gets the same bits. Keeps the seconds its collectives took.
pub struct GroupComm<'t, T: Transport + ?Sized> {
    transport: &'t mut T,
    group: &'t [usize],
    shard: Shard,
    buffer: &'t mut Vec<f64>,
    sequence_parallel: bool,
    /// Seconds spent in collectives since this was made.
    pub spent_s: f64,
}

impl<'t, T: Transport + ?Sized> GroupComm<'t, T> {
    /// The collective of `transport`'s rank within `group` (which must contain it), widening
    /// into `buffer`.
    pub fn new(transport: &'t mut T, group: &'t [usize], buffer: &'t mut Vec<f64>) -> Self {
        let me = transport.rank();
        let rank = group.iter().position(|&r| r == me).unwrap_or(0);
        GroupComm {
            transport,
            group,
            shard: Shard {
                rank,
                size: group.len().max(1),
            },
            buffer,
            sequence_parallel: false,
            spent_s: 0.0,
        }
    }

    /// The same collective with sequence parallelism `on` (see [`TpComm::seq_part`]).
    pub fn sequence_parallel(mut self, on: bool) -> Self {
        self.sequence_parallel = on;
        self
    }
}

impl<T: Transport + ?Sized> TpComm for GroupComm<'_, T> {
    fn shard(&self) -> Shard {
        self.shard
    }

    fn all_reduce(&mut self, data: &mut [f32]) -> Result<(), TransportError> {
        if self.group.len() < 2 {
            return Ok(());
        }
        let start = Instant::now();
        self.buffer.clear();
        self.buffer.extend(data.iter().map(|&x| f64::from(x)));
        self.transport.all_reduce_sum(self.group, self.buffer)?;
        for (x, &v) in data.iter_mut().zip(self.buffer.iter()) {
            *x = v as f32;
        }
        self.spent_s += start.elapsed().as_secs_f64();
        Ok(())
    }

    fn all_reduce_f64(&mut self, data: &mut [f64]) -> Result<(), TransportError> {
        if self.group.len() < 2 {
            return Ok(());
        }
        let start = Instant::now();
        self.transport.all_reduce_sum(self.group, data)?;
        self.spent_s += start.elapsed().as_secs_f64();
        Ok(())
    }

    fn seq_part(&self) -> Shard {
        if self.sequence_parallel {
            self.shard
        } else {
            Shard::WHOLE
        }
    }

    fn reduce_rows(&mut self, mut t: Tensor, sequences: usize) -> Result<Tensor, TransportError> {
        if !self.sequence_parallel || self.group.len() < 2 {
            self.all_reduce(t.data_mut())?;
            return Ok(t);
        }
        let start = Instant::now();
        let out = sp::reduce_scatter(&mut *self.transport, self.group, self.buffer, &t, sequences);
        self.spent_s += start.elapsed().as_secs_f64();
        out
    }

    fn gather_rows(
        &mut self,
        t: &Tensor,
        sequences: usize,
    ) -> Result<Option<Tensor>, TransportError> {
        if !self.sequence_parallel || self.group.len() < 2 {
            return Ok(None);
        }
        let start = Instant::now();
        let out = sp::all_gather(&mut *self.transport, self.group, self.buffer, t, sequences);
        self.spent_s += start.elapsed().as_secs_f64();
        out.map(Some)
    }
}
