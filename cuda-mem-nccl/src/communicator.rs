//! `Communicator` (one rank) and `Clique` (every rank of one process, from `ncclCommInitAll`):
//! creation, all-reduce in a stream scope, and destruction after their work.

use crate::dtype::{DataType, NcclType, ReduceOp};
use crate::raw::{self, Comm};
use crate::status::{chain, invalid};
use crate::unique_id::UniqueId;
use cuda_mem::launch::{CurrentDevice, same_len};
use cuda_mem::{Device, DeviceSliceMut, DeviceSource, Result, Stream, StreamScope};
use std::ffi::{c_int, c_void};
use std::fmt;

/// Where a communicator is in its life; its drop does what is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Live,
    /// Finalized (with its clique, in one group): only `ncclCommDestroy` is left.
    Finalized,
    /// Destroyed or aborted.
    Released,
}

/// One rank of an NCCL communicator, on one device.
///
/// Collectives are queued on a stream of the communicator's device, through a
/// [`StreamScope`] ([`Communicator::all_reduce`]) or a [`Group`](crate::Group) (several
/// communicators of one process at once). Either way the buffers stay borrowed until the stream
/// has passed the collective, exactly as for copies and kernels.
///
/// Dropping it finalizes (waits for its work and synchronizes with the other ranks, which must
/// drop theirs too) and destroys it; after an asynchronous error it aborts instead. Dropping one
/// rank while this thread still has to drive another rank of the same communicator hangs: keep
/// the ranks of one process in a [`Clique`], which finalizes them together.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{Device, Stream, StreamBuffer};
/// use cuda_mem_nccl::{Communicator, ReduceOp, UniqueId};
/// // One process per GPU: rank 0 makes the id and sends it to the others (here: one rank).
/// let device = Device::new(0)?;
/// let comm = Communicator::init_rank(device, 1, &UniqueId::new()?, 0)?;
/// let stream = Stream::on_device(device)?;
/// let mut grads = StreamBuffer::<f32>::zeroed(&stream, 1 << 20)?;
/// let mut view = grads.as_mut_slice();
/// stream.try_scope(|s| comm.all_reduce_in_place(s, &mut view, ReduceOp::Sum))?;
/// # Ok(()) }
/// ```
///
/// Two threads cannot share one (NCCL's calls on a communicator are not thread-safe):
///
/// ```compile_fail,E0277
/// fn shared<T: Sync>() {}
/// shared::<cuda_mem_nccl::Communicator>();
/// ```
pub struct Communicator {
    raw: Comm,
    device: Device,
    rank: usize,
    ranks: usize,
    state: State,
}

// SAFETY: NCCL lets any thread use a communicator, one thread at a time (its calls on one
// communicator are not thread-safe; its calls on different communicators are). The thread the
// value moves to may queue collectives, register buffers and destroy it; `&mut` or ownership
// means no other thread uses it meanwhile. Not `Sync`: two threads calling through `&self` at
// once would race inside NCCL. The device it belongs to is fixed; every call makes it current.
unsafe impl Send for Communicator {}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("device", &self.device)
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .finish()
    }
}

/// Restores the caller's current device when NCCL may have changed it.
struct RestoreDevice(Device);

impl Drop for RestoreDevice {
    fn drop(&mut self) {
        if Device::current().is_ok_and(|now| now != self.0) {
            // A failure leaves another device current, which the next call that needs one sets.
            let _ = self.0.set_current();
        }
    }
}

impl Communicator {
    /// Rank `rank` of a communicator of `ranks` ranks, on `device` (`ncclCommInitRank`). Every
    /// rank calls this with the same `id`, concurrently (each in its own process or thread):
    /// the call returns once all have joined.
    pub fn init_rank(device: Device, ranks: usize, id: &UniqueId, rank: usize) -> Result<Self> {
        let (ranks_c, rank_c) = rank_args(ranks, rank)?;
        let _device = CurrentDevice::set(device)?;
        // SAFETY: `device` is current on this thread for the call.
        let raw = unsafe { raw::comm_init_rank(ranks_c, id.as_raw(), rank_c)? };
        Ok(Self { raw, device, rank, ranks, state: State::Live })
    }

    /// One communicator per device, all of this process, ranked in the order given
    /// (`ncclCommInitAll`): for one process driving several GPUs, from one thread through
    /// [`Group`](crate::Group) or from one thread per GPU ([`Clique::comms_mut`]).
    pub fn init_all(devices: &[Device]) -> Result<Clique> {
        let operation = || format!("ncclCommInitAll over {devices:?}");
        if devices.is_empty() {
            return Err(invalid("a clique needs at least one device", operation()));
        }
        if devices.iter().enumerate().any(|(i, d)| devices[..i].contains(d)) {
            return Err(invalid("each device may hold one rank of a communicator", operation()));
        }
        let ordinals: Vec<c_int> = devices.iter().map(|d| d.ordinal() as c_int).collect();
        let _restore = RestoreDevice(Device::current()?);
        let raws = raw::comm_init_all(&ordinals)?;
        let ranks = devices.len();
        let comms = raws
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (raw, &device))| Communicator { raw, device, rank, ranks, state: State::Live })
            .collect();
        Ok(Clique { comms })
    }

    /// The device this rank runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// What NCCL says of this communicator (`ncclCommCuDevice`, `ncclCommUserRank`,
    /// `ncclCommCount`): (device ordinal, rank, ranks).
    pub fn query(&self) -> Result<(usize, usize, usize)> {
        // SAFETY: a live communicator; `&self` on a `!Sync` value: no other thread uses it.
        let (device, rank, ranks) =
            unsafe { (raw::comm_cu_device(self.raw)?, raw::comm_user_rank(self.raw)?, raw::comm_count(self.raw)?) };
        Ok((device.max(0) as usize, rank.max(0) as usize, ranks.max(0) as usize))
    }

    /// An error the communicator's work met after its call returned (`ncclCommGetAsyncError`),
    /// e.g. a peer that failed; `Ok` while none.
    pub fn async_error(&self) -> Result<()> {
        // SAFETY: a live communicator used by this thread only.
        unsafe { raw::comm_async_error(self.raw) }
    }

    /// Queues `dst[i] = op over every rank's src[i]` (`ncclAllReduce`) on the scope's stream,
    /// which must belong to this communicator's device. `src` and `dst` have the same length on
    /// every rank. Stream-ordered memory is waited for on its own stream first, as by every
    /// scope operation. The memory must be accessible from this device (its own, or a peer's
    /// with access enabled).
    pub fn all_reduce<'scope, 'v: 'scope, T: NcclType>(
        &'scope self,
        scope: &StreamScope<'scope, '_>,
        src: impl DeviceSource<'scope, T>,
        dst: &mut DeviceSliceMut<'v, T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_stream(scope.stream(), "ncclAllReduce")?;
        let (send, count) = scope.device_ptr(src)?;
        same_len(count, dst.len(), "ncclAllReduce")?;
        let recv = scope.device_ptr_mut(dst)?;
        // SAFETY: both addresses cover `count` elements of T lent to the scope, which
        // synchronizes its stream before the borrows end; `self` is borrowed as long.
        unsafe { self.enqueue(scope.stream(), send.cast(), recv.cast(), count, T::DATA_TYPE, op) }
    }

    /// [`Communicator::all_reduce`] with the result written over the input.
    pub fn all_reduce_in_place<'scope, 'v: 'scope, T: NcclType>(
        &'scope self,
        scope: &StreamScope<'scope, '_>,
        buffer: &mut DeviceSliceMut<'v, T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_stream(scope.stream(), "ncclAllReduce")?;
        let count = buffer.len();
        let ptr = scope.device_ptr_mut(buffer)?;
        // SAFETY: as in `all_reduce`; NCCL allows send == recv (in place).
        unsafe { self.enqueue(scope.stream(), ptr.cast_const().cast(), ptr.cast(), count, T::DATA_TYPE, op) }
    }

    /// Refuses a stream of another device: NCCL would queue on the wrong device, or fail.
    pub(crate) fn check_stream(&self, stream: &Stream, operation: &'static str) -> Result<()> {
        if stream.device() == self.device {
            return Ok(());
        }
        Err(invalid(
            "the stream belongs to another device than the communicator",
            format!("{operation} of rank {} on {} with a stream of {}", self.rank, self.device, stream.device()),
        ))
    }

    /// Queues one all-reduce on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` address `count` elements of `datatype` that stay allocated, and are not
    /// otherwise written, until `stream` passes the collective.
    pub(crate) unsafe fn enqueue(
        &self,
        stream: &Stream,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        datatype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let _device = CurrentDevice::set(self.device)?;
        // With the communicator's device current: a built-in stream then means its stream of
        // that device (the caller checked the stream's device), the per-thread one only here.
        let handle = stream.checked_raw()?;
        // SAFETY: the caller's contract for the memory; a live communicator used by this thread
        // only; `handle` means `stream` here.
        unsafe { raw::all_reduce(send, recv, count, datatype.code(), op.code(), self.raw, handle) }
    }

    /// The handle, for the registration and group layers.
    pub(crate) fn as_raw(&self) -> Comm {
        self.raw
    }

    /// Finalizes and destroys now, reporting what failed (dropping does the same quietly).
    /// After an asynchronous error, or when finalizing fails, it aborts instead.
    pub fn destroy(mut self) -> Result<()> {
        self.release()
    }

    /// Frees the communicator without synchronizing with its peers (`ncclCommAbort`), e.g. after
    /// a peer failed. The collectives queued through this crate have completed by then: scopes
    /// and groups wait for them before the communicator can be moved.
    pub fn abort(mut self) -> Result<()> {
        self.state = State::Released;
        let _device = CurrentDevice::set(self.device).ok();
        // SAFETY: a live communicator, released once (its state now says so).
        unsafe { raw::comm_abort(self.raw) }
    }

    fn release(&mut self) -> Result<()> {
        let state = std::mem::replace(&mut self.state, State::Released);
        if state == State::Released {
            return Ok(());
        }
        // NCCL sets its device itself; this keeps the caller's current device as it was.
        let _device = CurrentDevice::set(self.device).ok();
        if state == State::Live {
            // SAFETY: a live communicator used by this thread only.
            let finalized = unsafe { raw::comm_async_error(self.raw).and_then(|()| raw::comm_finalize(self.raw)) };
            if let Err(err) = finalized {
                // SAFETY: as above; released once.
                return Err(match unsafe { raw::comm_abort(self.raw) } {
                    Ok(()) => err,
                    Err(later) => err.with_later(later),
                });
            }
        }
        // SAFETY: finalized, so no work of it is pending; released once.
        unsafe { raw::comm_destroy(self.raw) }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// The checked (ranks, rank) as NCCL's ints.
fn rank_args(ranks: usize, rank: usize) -> Result<(c_int, c_int)> {
    match (c_int::try_from(ranks), c_int::try_from(rank)) {
        (Ok(ranks_c), Ok(rank_c)) if ranks >= 1 && rank < ranks => Ok((ranks_c, rank_c)),
        _ => Err(invalid(
            "the rank must be below the number of ranks, which must be at least 1 and fit in an int",
            format!("ncclCommInitRank of rank {rank} of {ranks}"),
        )),
    }
}

/// Every rank of a communicator that one process drives (from [`Communicator::init_all`]),
/// rank `i` on the `i`-th device given. Dropping it finalizes all ranks in one group call, then
/// destroys them (one thread cannot finalize them one by one: each waits for the others).
#[derive(Debug)]
pub struct Clique {
    comms: Vec<Communicator>,
}

impl Clique {
    /// The ranks, in order.
    pub fn comms(&self) -> &[Communicator] {
        &self.comms
    }

    /// The ranks, for handing one to each thread (`&mut Communicator` is `Send`). Replacing one
    /// by another communicator, or taking it out, makes this clique finalize it separately.
    pub fn comms_mut(&mut self) -> &mut [Communicator] {
        &mut self.comms
    }

    /// The number of ranks.
    pub fn len(&self) -> usize {
        self.comms.len()
    }

    /// Always false: a clique has at least one rank.
    pub fn is_empty(&self) -> bool {
        self.comms.is_empty()
    }

    /// Finalizes every live rank in one group; where that fails, aborts them.
    fn finalize_together(&mut self) -> Result<()> {
        let live: Vec<usize> = (0..self.comms.len()).filter(|&i| self.comms[i].state == State::Live).collect();
        if live.is_empty() {
            return Ok(());
        }
        let _restore = RestoreDevice(Device::current()?);
        let mut finalized = Ok(());
        for &i in &live {
            // SAFETY: a live communicator, used by this thread only (`&mut self`).
            finalized = chain(finalized, unsafe { raw::comm_async_error(self.comms[i].raw) });
        }
        if finalized.is_ok() {
            finalized = raw::group_start();
        }
        if finalized.is_ok() {
            for &i in &live {
                // SAFETY: as above.
                finalized = chain(finalized, unsafe { raw::comm_finalize(self.comms[i].raw) });
            }
            finalized = chain(finalized, raw::group_end());
        }
        for &i in &live {
            let comm = &mut self.comms[i];
            if finalized.is_ok() {
                comm.state = State::Finalized;
            } else {
                comm.state = State::Released;
                // SAFETY: as above; released once (its state now says so).
                finalized = chain(finalized, unsafe { raw::comm_abort(comm.raw) });
            }
        }
        finalized
    }

    /// Finalizes and destroys every rank now, reporting what failed (dropping does the same
    /// quietly).
    pub fn destroy(mut self) -> Result<()> {
        let mut outcome = self.finalize_together();
        for comm in &mut self.comms {
            outcome = chain(outcome, comm.release());
        }
        outcome
    }
}

impl Drop for Clique {
    fn drop(&mut self) {
        // Then each rank's own drop destroys it (finalized), or does nothing (aborted).
        let _ = self.finalize_together();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_mem::ErrorKind;

    #[test]
    fn ranks_are_checked_before_nccl_is_called() {
        assert_eq!(rank_args(2, 1).unwrap(), (2, 1));
        for (ranks, rank) in [(0, 0), (2, 2), (1, 5), (usize::MAX, 0)] {
            let err = rank_args(ranks, rank).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
            assert!(err.operation().contains(&format!("rank {rank} of {ranks}")), "{err}");
        }
    }

    /// NCCL's own failure (here an unknown data type, refused by its argument checks before
    /// anything is queued) comes back as its status with its words.
    #[test]
    #[ignore = "needs a CUDA GPU and libnccl"]
    fn gpu_nccl_failures_carry_its_status_and_words() {
        use crate::status::NcclStatus;
        let device = Device::new(0).unwrap();
        let comm = Communicator::init_rank(device, 1, &UniqueId::new().unwrap(), 0).unwrap();
        let stream = Stream::on_device(device).unwrap();
        let mut buffer = cuda_mem::DeviceBuffer::<u32>::zeroed(16).unwrap();
        let ptr = buffer.as_mut_slice().as_device_ptr().cast::<c_void>();
        let _device = CurrentDevice::set(device).unwrap();
        // SAFETY: 16 live u32; NCCL refuses the data type before queuing anything.
        let err =
            unsafe { raw::all_reduce(ptr, ptr, 16, 99, 0, comm.as_raw(), stream.checked_raw().unwrap()) }.unwrap_err();
        assert_eq!(NcclStatus::of(&err), Some(NcclStatus::InvalidArgument), "{err}");
        let text = err.to_string();
        eprintln!("{text}");
        assert!(text.starts_with("ncclAllReduce of 16 elements failed: NCCL error 4: ncclInvalidArgument"), "{text}");
        stream.synchronize().unwrap();
    }

    #[test]
    fn a_clique_needs_distinct_devices_and_at_least_one() {
        // Refused before any CUDA or NCCL call, so this runs without a GPU.
        let err = Communicator::init_all(&[]).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    }
}
