//! `Group`: collectives of several communicators of one process, launched together
//! (`ncclGroupStart` … `ncclGroupEnd`) and waited for before the buffers are lent back.

use crate::communicator::Communicator;
use crate::dtype::{DataType, NcclType, ReduceOp};
use crate::raw;
use crate::status::{chain, invalid};
use cuda_mem::launch::same_len;
use cuda_mem::{DeviceSlice, DeviceSliceMut, Result, Stream};
use std::ffi::c_void;
use std::marker::PhantomData;

/// Collectives of several communicators, recorded first and launched by [`Group::run`] in one
/// group call, which is how one thread drives several GPUs (one call per communicator outside a
/// group would wait for the other ranks, which this thread has not reached yet). `run` then
/// waits for every stream used, so the buffers, borrowed for `'a`, are free of NCCL's work when
/// it returns.
///
/// Nothing is launched before `run`: between `ncclGroupStart` and `ncclGroupEnd` only this
/// crate's code runs, so a panic cannot leave half a group launched, and a group that is
/// dropped or forgotten launches nothing.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{Device, MemPool, PoolProps, Stream, StreamBuffer};
/// use cuda_mem_nccl::{Communicator, Group, ReduceOp};
/// let devices = Device::all()?;
/// let clique = Communicator::init_all(&devices)?;
/// let streams = devices.iter().map(|&d| Stream::on_device(d)).collect::<Result<Vec<_>, _>>()?;
/// let mut buffers = streams
///     .iter()
///     .map(|s| StreamBuffer::<f32>::zeroed(s, 1 << 20))
///     .collect::<Result<Vec<_>, _>>()?;
/// let mut views: Vec<_> = buffers.iter_mut().map(|b| b.as_mut_slice()).collect();
/// let mut group = Group::new();
/// for ((comm, stream), view) in clique.comms().iter().zip(&streams).zip(&mut views) {
///     group.all_reduce_in_place(comm, stream, view, ReduceOp::Sum)?;
/// }
/// group.run()?;
/// # Ok(()) }
/// ```
///
/// A view recorded in a group stays lent to it until `run`:
///
/// ```compile_fail,E0499
/// use cuda_mem_nccl::{Communicator, Group, ReduceOp};
/// fn step(comm: &Communicator, stream: &cuda_mem::Stream, grads: &mut cuda_mem::DeviceBuffer<f32>) -> cuda_mem::Result<()> {
///     let mut view = grads.as_mut_slice();
///     let mut group = Group::new();
///     group.all_reduce_in_place(comm, stream, &mut view, ReduceOp::Sum)?;
///     view.set_bytes(0)?; // error: `view` is still lent to the group
///     group.run()
/// }
/// ```
#[derive(Debug, Default)]
pub struct Group<'a> {
    ops: Vec<Queued<'a>>,
}

/// One recorded all-reduce.
#[derive(Debug)]
struct Queued<'a> {
    comm: &'a Communicator,
    stream: &'a Stream,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: DataType,
    op: ReduceOp,
    /// The views stay borrowed (the destination exclusively) while the group lives.
    _views: PhantomData<&'a mut ()>,
}

impl<'a> Queued<'a> {
    fn new<T: NcclType>(
        comm: &'a Communicator,
        stream: &'a Stream,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        op: ReduceOp,
    ) -> Self {
        Self { comm, stream, send, recv, count, datatype: T::DATA_TYPE, op, _views: PhantomData }
    }
}

impl<'a> Group<'a> {
    /// An empty group.
    pub fn new() -> Self {
        Self { ops: Vec::new() }
    }

    /// Records `dst = op over every rank's src` on `comm`, queued on `stream` (a created stream
    /// of `comm`'s device) when the group runs; `src` is a shared view (`as_slice()` of a
    /// `DeviceSliceMut`). Stream-ordered memory makes `stream` wait for its own stream now.
    pub fn all_reduce<T: NcclType>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        src: DeviceSlice<'a, T>,
        dst: &'a mut DeviceSliceMut<'_, T>,
        op: ReduceOp,
    ) -> Result<()> {
        check_stream(comm, stream)?;
        same_len(src.len(), dst.len(), "ncclAllReduce")?;
        order_after(stream, src.stream())?;
        order_after(stream, dst.stream())?;
        let (send, recv) = (src.as_device_ptr().cast(), dst.as_device_ptr().cast());
        self.ops.push(Queued::new::<T>(comm, stream, send, recv, src.len(), op));
        Ok(())
    }

    /// Records an in-place all-reduce of `buffer` (see [`Group::all_reduce`]).
    pub fn all_reduce_in_place<T: NcclType>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        buffer: &'a mut DeviceSliceMut<'_, T>,
        op: ReduceOp,
    ) -> Result<()> {
        check_stream(comm, stream)?;
        order_after(stream, buffer.stream())?;
        let ptr = buffer.as_device_ptr();
        self.ops.push(Queued::new::<T>(comm, stream, ptr.cast_const().cast(), ptr.cast(), buffer.len(), op));
        Ok(())
    }

    /// Launches every recorded collective in one group call and waits for every stream used
    /// (also when a launch failed: what was launched completes before the borrows end).
    pub fn run(self) -> Result<()> {
        self.run_repeated(1)
    }

    /// [`Group::run`] with the recorded collectives launched `times` times, one group call after
    /// the other (in-place all-reduces then reduce the previous results), and one wait at the
    /// end: what a benchmark or a loop of steps on the same buffers queues without a host wait
    /// in between.
    pub fn run_repeated(self, times: usize) -> Result<()> {
        if self.ops.is_empty() || times == 0 {
            return Ok(());
        }
        let launched = (0..times).try_for_each(|_| launch(&self.ops));
        let mut streams: Vec<&Stream> = Vec::new();
        let mut waited = Ok(());
        for op in &self.ops {
            if !streams.iter().any(|s| s.as_raw() == op.stream.as_raw()) {
                streams.push(op.stream);
                waited = chain(waited, op.stream.synchronize());
            }
        }
        chain(launched, waited)
    }
}

/// `ncclGroupStart`, every recorded all-reduce, `ncclGroupEnd` (also after a failed call: the
/// group must end on this thread). No code but this crate's runs in between.
fn launch(ops: &[Queued<'_>]) -> Result<()> {
    raw::group_start()?;
    let mut queued = Ok(());
    for op in ops {
        // SAFETY: each range was borrowed for the group's lifetime when it was recorded, and
        // `Group::run` waits for every stream before that ends.
        queued = unsafe { op.comm.enqueue(op.stream, op.send, op.recv, op.count, op.datatype, op.op) };
        if queued.is_err() {
            break;
        }
    }
    chain(queued, raw::group_end())
}

/// A group takes created streams only: the launch happens inside `ncclGroupEnd`, where a
/// built-in handle (legacy, per-thread) would be resolved against whatever device NCCL has
/// current then.
fn check_stream(comm: &Communicator, stream: &Stream) -> Result<()> {
    comm.check_stream(stream, "ncclAllReduce in a group")?;
    let handle = stream.as_raw() as usize;
    if handle <= 2 {
        return Err(invalid(
            "a group needs created streams, not the legacy or per-thread default stream",
            format!("ncclAllReduce in a group with {stream:?}"),
        ));
    }
    Ok(())
}

/// Makes `stream` wait for the stream `owner` the memory is ordered on, if any.
fn order_after(stream: &Stream, owner: Option<&Stream>) -> Result<()> {
    match owner {
        Some(owner) => stream.wait_for(owner),
        None => Ok(()),
    }
}
