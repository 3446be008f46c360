//! [`InProcess`]: the in-process [`Transport`] — one thread per rank, `std::sync::mpsc`
//! channels; collectives exchange parts between the members and add them in group order.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use super::tensor::Tensor;
use super::transport::{sum_in_group_order, Abort, Tag, Transport, TransportError, ABORT_POLL};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    P2p(Tag),
    Reduce { group: Vec<usize>, seq: u64 },
}

/// What a message carries: a tensor, or one rank's part of an all-reduce.
enum Payload {
    Tensor(Tensor),
    Reduce(Vec<f64>),
}

struct Message {
    from: usize,
    key: Key,
    payload: Payload,
}

/// The in-process transport: ranks are threads of one process and messages go over channels.
/// Make the endpoints with [`InProcess::world`] and move one into each rank's thread.
pub struct InProcess {
    rank: usize,
    senders: Vec<Sender<Message>>,
    inbox: Receiver<Message>,
    stash: HashMap<(usize, Key), VecDeque<Payload>>,
    reduce_seq: HashMap<Vec<usize>, u64>,
    timeout: Duration,
    abort: Abort,
}

impl InProcess {
    /// `world_size` connected endpoints, rank `i` at index `i`; receives give up after
    /// `timeout`.
    pub fn world(world_size: usize, timeout: Duration) -> Vec<InProcess> {
        InProcess::world_with_abort(world_size, timeout, &Abort::new())
    }

    /// Like [`InProcess::world`], and receives also give up within [`ABORT_POLL`] once
    /// `abort` is set.
    pub fn world_with_abort(world_size: usize, timeout: Duration, abort: &Abort) -> Vec<InProcess> {
        let (senders, inboxes): (Vec<_>, Vec<_>) = (0..world_size).map(|_| channel()).unzip();
        inboxes
            .into_iter()
            .enumerate()
            .map(|(rank, inbox)| InProcess {
                rank,
                senders: senders.clone(),
                inbox,
                stash: HashMap::new(),
                reduce_seq: HashMap::new(),
                timeout,
                abort: abort.clone(),
            })
            .collect()
    }

    fn invalid(&self, message: String) -> TransportError {
        TransportError::Invalid {
            rank: self.rank,
            message,
        }
    }

    fn check_peer(&self, peer: usize) -> Result<(), TransportError> {
        if peer < self.senders.len() {
            Ok(())
        } else {
            Err(self.invalid(format!(
                "peer {peer} is outside the {} ranks",
                self.senders.len()
            )))
        }
    }

    fn post(&self, peer: usize, key: Key, payload: Payload) -> Result<(), TransportError> {
        self.check_peer(peer)?;
        let message = Message {
            from: self.rank,
            key,
            payload,
        };
        self.senders[peer]
            .send(message)
            .map_err(|_| TransportError::Disconnected {
                rank: self.rank,
                peer,
            })
    }

    /// The payload `peer` sent under `key`: from the stash, or from the inbox (stashing what
    /// else arrives meanwhile), waiting at most the timeout.
    fn take(
        &mut self,
        peer: usize,
        key: Key,
        what: impl Fn() -> String,
    ) -> Result<Payload, TransportError> {
        self.check_peer(peer)?;
        let wanted = (peer, key);
        if let Some(p) = self.stash.get_mut(&wanted).and_then(VecDeque::pop_front) {
            return Ok(p);
        }
        let start = Instant::now();
        let deadline = start + self.timeout;
        loop {
            if self.abort.is_set() {
                return Err(TransportError::Aborted {
                    rank: self.rank,
                    peer,
                    what: what(),
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.inbox.recv_timeout(left.min(ABORT_POLL)) {
                Ok(m) if m.from == wanted.0 && m.key == wanted.1 => return Ok(m.payload),
                Ok(m) => self
                    .stash
                    .entry((m.from, m.key))
                    .or_default()
                    .push_back(m.payload),
                Err(RecvTimeoutError::Timeout) if !left.is_zero() => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(TransportError::Timeout {
                        rank: self.rank,
                        peer,
                        what: what(),
                        waited_s: start.elapsed().as_secs_f64(),
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(TransportError::Disconnected {
                        rank: self.rank,
                        peer,
                    })
                }
            }
        }
    }
}

impl Transport for InProcess {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.senders.len()
    }

    fn send(&mut self, peer: usize, tag: Tag, tensor: Tensor) -> Result<(), TransportError> {
        self.post(peer, Key::P2p(tag), Payload::Tensor(tensor))
    }

    fn recv(&mut self, peer: usize, tag: Tag) -> Result<Tensor, TransportError> {
        match self.take(peer, Key::P2p(tag), || tag.to_string())? {
            Payload::Tensor(t) => Ok(t),
            Payload::Reduce(_) => Err(self.invalid(format!(
                "{tag} from rank {peer} arrived as an all-reduce part"
            ))),
        }
    }

    /// Every member sends its data to every other member, then adds all contributions in
    /// group order (`sum_in_group_order`), so the sum is bitwise the same everywhere.
    fn all_reduce_sum(&mut self, group: &[usize], data: &mut [f64]) -> Result<(), TransportError> {
        if group.len() == 1 && group.contains(&self.rank) {
            return Ok(());
        }
        let parts = self.exchange(group, |_| data.to_vec(), data.len())?;
        sum_in_group_order(&parts, data);
        Ok(())
    }

    /// Each member sends member `i` only its chunk `i`, then adds the chunks it got in group
    /// order.
    fn reduce_scatter_sum(
        &mut self,
        group: &[usize],
        data: &[f64],
        out: &mut [f64],
    ) -> Result<(), TransportError> {
        let n = out.len();
        if data.len() != n * group.len() {
            return Err(self.invalid(format!(
                "reduce-scatter of {} values over {} members into chunks of {n}",
                data.len(),
                group.len()
            )));
        }
        let parts = self.exchange(group, |i| data[i * n..(i + 1) * n].to_vec(), n)?;
        sum_in_group_order(&parts, out);
        Ok(())
    }

    /// Each member sends its part to every other member, and puts the parts in group order.
    fn all_gather(
        &mut self,
        group: &[usize],
        mine: &[f64],
        out: &mut [f64],
    ) -> Result<(), TransportError> {
        let parts = self.exchange(group, |_| mine.to_vec(), mine.len())?;
        if parts.len() != out.len() {
            return Err(self.invalid(format!(
                "all-gather of {} values into {}",
                parts.len(),
                out.len()
            )));
        }
        out.copy_from_slice(&parts);
        Ok(())
    }
}

impl InProcess {
    /// One collective step over `group`: sends member `i` the values `part(i)` (`len` of
    /// them), and returns the parts addressed to this rank, concatenated in group order (its
    /// own taken without a message). Collectives over a group are numbered, so every member
    /// must call them in the same order.
    fn exchange(
        &mut self,
        group: &[usize],
        part: impl Fn(usize) -> Vec<f64>,
        len: usize,
    ) -> Result<Vec<f64>, TransportError> {
        if !group.contains(&self.rank) {
            return Err(self.invalid(format!(
                "a collective over group {group:?}, which does not contain it"
            )));
        }
        let counter = self.reduce_seq.entry(group.to_vec()).or_insert(0);
        let seq = *counter;
        *counter += 1;
        let key = Key::Reduce {
            group: group.to_vec(),
            seq,
        };
        for (i, &peer) in group.iter().enumerate().filter(|&(_, &p)| p != self.rank) {
            self.post(peer, key.clone(), Payload::Reduce(part(i)))?;
        }
        let me = group.iter().position(|&r| r == self.rank).unwrap_or(0);
        let mut parts = Vec::with_capacity(len * group.len());
        for &peer in group {
            if peer == self.rank {
                parts.extend(part(me));
                continue;
            }
            let what = || format!("its part of collective #{seq}");
            let got = match self.take(peer, key.clone(), what)? {
                Payload::Reduce(v) => v,
                Payload::Tensor(_) => {
                    return Err(self.invalid(format!(
                        "collective #{seq}: rank {peer} sent a tensor instead"
                    )))
                }
            };
            if got.len() != len {
                return Err(self.invalid(format!(
                    "collective #{seq}: rank {peer} sent {} elements, this rank expects {len}",
                    got.len()
                )));
            }
            parts.extend(got);
        }
        Ok(parts)
    }
}
