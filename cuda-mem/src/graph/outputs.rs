//! Graph memory that outlives a launch: an allocation node with no free node
//! ([`CaptureScope::output`](crate::CaptureScope::output)). Each launch of an executable graph
//! made with `cudaGraphInstantiateFlagAutoFreeOnLaunch` first frees what the previous launch left
//! allocated, then allocates it again at the same address; between launches eager code reads it
//! through [`GraphExec::output`](crate::GraphExec::output), whose view borrows the executable
//! graph, so the next launch (`&mut self`) and the drop wait for the view to end. Whatever the
//! last launch left allocated is freed when the executable graph drops.

use crate::error::{CudaError, ErrorKind, Result};
use crate::raw;
use crate::stream::Stream;
use bytemuck::Pod;
use std::any::TypeId;
use std::cell::Cell;
use std::ffi::c_void;
use std::marker::PhantomData;

/// The key to one output of a graph ([`CaptureScope::output`](crate::CaptureScope::output)): `len`
/// elements of graph memory that the last launch left allocated, read between launches through
/// [`GraphExec::output`](crate::GraphExec::output).
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{CaptureMode, GraphFlags, Stream};
/// let stream = Stream::non_blocking()?;
/// let (graph, key) = stream.capture_with(CaptureMode::ThreadLocal, |s| {
///     let (mut out, key) = s.output::<u32>(16)?; // allocated by each launch, freed by the next
///     s.set_bytes(&mut out, 1)?;
///     Ok(key)
/// })?;
/// let mut exec = graph.instantiate(GraphFlags::empty())?; // AUTO_FREE_ON_LAUNCH is added
/// assert!(exec.output(&key).is_err()); // no launch yet: the output does not exist
/// for _ in 0..3 {
///     exec.launch(&stream)?;
///     let view = exec.output(&key)?; // borrows `exec` until its last use
///     assert_eq!(view.to_vec()?, vec![0x0101_0101; 16]);
/// }
/// drop(exec); // frees what the last launch left allocated
/// # Ok(()) }
/// ```
pub struct GraphOutput<T> {
    graph: u64,
    index: usize,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for GraphOutput<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for GraphOutput<T> {}

impl<T> std::fmt::Debug for GraphOutput<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphOutput").field("graph", &self.graph).field("index", &self.index).finish()
    }
}

/// One allocation node of a graph without a free node (type-erased).
#[derive(Debug)]
pub(crate) struct OutputRecord {
    graph: u64,
    index: usize,
    ptr: *mut c_void,
    len: usize,
    bytes: usize,
    type_id: TypeId,
}

impl OutputRecord {
    /// Records output `index` of graph `graph`: `len` elements of T at the address the graph's
    /// allocation node allocates at (`bytes` of them; 0 for an empty output, which has no node).
    pub(crate) fn new<T: Pod>(graph: u64, index: usize, ptr: *mut c_void, len: usize) -> (Self, GraphOutput<T>) {
        let record = Self { graph, index, ptr, len, bytes: len * size_of::<T>(), type_id: TypeId::of::<T>() };
        (record, GraphOutput { graph, index, _type: PhantomData })
    }
}

/// Whether the outputs are allocated now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No launch yet: the allocations do not exist.
    NotLaunched,
    /// The last `run` queued launches and all of them completed: the last one's allocations hold
    /// what it wrote.
    Ready,
    /// A launch was queued but the call failed, or a launch had completed before a `run` that
    /// panicked: the allocations exist, their contents are unknown. They are not handed out.
    Unknown,
}

/// The outputs' state before a `run`.
#[derive(Debug)]
pub(crate) struct RunStart(State);

/// The outputs of one executable graph and what the launches did to them.
#[derive(Debug)]
pub(crate) struct Outputs {
    records: Vec<OutputRecord>,
    /// A `Cell` so that launches queued in a scope ([`Launches`](crate::Launches)) note theirs.
    state: Cell<State>,
    /// Whether the current (or a panicked) `run` queued a launch: [`Launches`](crate::Launches)
    /// sets it, so it is right even when the run unwinds.
    pub(crate) queued: Cell<bool>,
    /// The stream of the last launch, which the drop frees the allocations on.
    last_stream: Option<Stream>,
}

// SAFETY: the records are device addresses and figures that no thread dereferences; another
// thread holding the executable graph may free them (on drop) through runtime calls, which take
// addresses from any thread. The stream is `Send`.
unsafe impl Send for Outputs {}

impl Outputs {
    pub(crate) fn new(records: Vec<OutputRecord>) -> Self {
        Self { records, state: Cell::new(State::NotLaunched), queued: Cell::new(false), last_stream: None }
    }

    /// True when the graph has outputs, so it must be instantiated to free them on relaunch.
    pub(crate) fn any(&self) -> bool {
        !self.records.is_empty()
    }

    /// Notes the start of a `run` on `stream`: until [`Outputs::end_run`] the outputs are not
    /// handed out, which is what a panic in the run leaves. Returns the state to restore should
    /// the run queue no launch.
    pub(crate) fn begin_run(&mut self, stream: &Stream) -> RunStart {
        let start = self.begin();
        if self.any() && self.last_stream.as_ref().is_none_or(|last| last.as_raw() != stream.as_raw()) {
            self.last_stream = Some(stream.clone());
        }
        start
    }

    /// [`Outputs::begin_run`]'s bookkeeping of the state.
    fn begin(&mut self) -> RunStart {
        if self.queued.replace(false) && !self.records.is_empty() {
            self.state.set(State::Unknown); // launches of a run that panicked
        }
        let before = RunStart(self.state.get());
        if self.records.is_empty() {
            return before;
        }
        if self.state.get() == State::Ready {
            self.state.set(State::Unknown);
        }
        before
    }

    /// Notes the end of a `run` that returned: whether it queued a launch and succeeded.
    pub(crate) fn end_run(&mut self, before: RunStart, succeeded: bool) {
        if self.records.is_empty() {
            return;
        }
        self.state.set(match (self.queued.replace(false), succeeded) {
            (false, _) => before.0,
            (true, true) => State::Ready,
            (true, false) => State::Unknown,
        });
    }

    /// Notes the start of launches queued in a scope on `stream` ([`GraphExec::launches_in`](crate::GraphExec::launches_in)):
    /// a panicked run's launches count, and the drop frees on `stream` from now on.
    pub(crate) fn begin_scope(&mut self, stream: &Stream) {
        let start = self.begin_run(stream);
        // A scope notes each launch as it is queued: nothing to restore at an end it never sees.
        self.state.set(start.0);
    }

    /// Notes a launch queued in a scope: its outputs are the ones lent once it has completed,
    /// which the scope's end (or the `Pending`'s) waits for before the executable graph is
    /// reachable again.
    pub(crate) fn note_scope_launch(&self) {
        if self.any() {
            self.state.set(State::Ready);
        }
    }

    /// The address and length of `key`'s output, if it belongs here and the last launch left it
    /// allocated and written.
    pub(crate) fn find<T: Pod>(&self, key: &GraphOutput<T>) -> Result<(*mut T, usize)> {
        let found = self.records.iter().find(|r| r.graph == key.graph && r.index == key.index);
        let record = match found {
            Some(record) if record.type_id == TypeId::of::<T>() => record,
            _ => {
                let kind = ErrorKind::InvalidArgument("the graph output belongs to another graph");
                return Err(CudaError::new(kind, format!("GraphExec::output of {key:?}")));
            }
        };
        // `queued` is still set only after a run that panicked.
        match if self.queued.get() { State::Unknown } else { self.state.get() } {
            State::Ready => Ok((record.ptr.cast(), record.len)),
            State::NotLaunched => {
                let kind = ErrorKind::InvalidArgument("a graph output exists only after a launch has completed");
                Err(CudaError::new(kind, format!("GraphExec::output of {key:?} before the first launch")))
            }
            State::Unknown => {
                let kind =
                    ErrorKind::InvalidArgument("the last run of the graph failed or panicked: its output is unknown");
                Err(CudaError::new(kind, format!("GraphExec::output of {key:?}")))
            }
        }
    }

    /// Frees what the last launch left allocated: in order on that launch's stream
    /// (`cudaFreeAsync`), or with `cudaFree` where that stream refuses (a per-thread stream of
    /// another thread). Errors are reported quietly: this runs on drop.
    pub(crate) fn free_outstanding(&mut self) {
        // A launch queued by a run that panicked allocated them too.
        if self.state.get() == State::NotLaunched && !self.queued.get() {
            return;
        }
        self.state.set(State::NotLaunched);
        let stream = self.last_stream.take();
        let call = stream.as_ref().map(Stream::call);
        for record in self.records.iter().filter(|r| r.bytes != 0) {
            let freed = match &call {
                // SAFETY: a launch allocated `record` (the state says one was queued) and none
                // follows to free it (auto-free on launch frees at the next launch; this is the
                // drop); every launch has completed (`launch` and `run` wait, also when they
                // unwind; a scope or `Pending` that launched holds the executable graph until its
                // launches have completed), and no view of it lives (views borrow the executable
                // graph).
                Some(Ok(call)) => unsafe { raw::pools::free_async(record.ptr, call.as_raw(), record.bytes) },
                _ => Err(CudaError::new(ErrorKind::InvalidArgument("no launch stream"), "freeing a graph output")),
            };
            if freed.is_err() {
                // SAFETY: as above; `cudaFree` waits for the device first and frees graph memory too.
                raw::quiet(unsafe {
                    raw::memory::free(record.ptr, || format!("a graph output of {} bytes", record.bytes))
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outputs() -> (Outputs, GraphOutput<u32>) {
        let (record, key) = OutputRecord::new::<u32>(7, 0, std::ptr::null_mut(), 16);
        (Outputs::new(vec![record]), key)
    }

    fn refused(outputs: &Outputs, key: &GraphOutput<u32>) -> &'static str {
        match outputs.find(key).unwrap_err().kind() {
            ErrorKind::InvalidArgument(why) => why,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn outputs_are_lent_only_after_a_run_that_launched_and_succeeded() {
        let (mut outputs, key) = outputs();
        assert!(refused(&outputs, &key).contains("only after a launch"));
        let start = outputs.begin();
        outputs.end_run(start, true); // queued nothing: still no output
        assert!(refused(&outputs, &key).contains("only after a launch"));
        let start = outputs.begin();
        outputs.queued.set(true);
        outputs.end_run(start, true);
        assert_eq!(outputs.find(&key).unwrap().1, 16);
        let start = outputs.begin();
        outputs.end_run(start, true); // a run without launches keeps the last one's output
        assert!(outputs.find(&key).is_ok());
        let start = outputs.begin();
        outputs.queued.set(true);
        outputs.end_run(start, false);
        assert!(refused(&outputs, &key).contains("failed or panicked"));
    }

    #[test]
    fn launches_queued_in_a_scope_lend_the_outputs_afterwards() {
        let (mut outputs, key) = outputs();
        let _ = outputs.begin();
        outputs.queued.set(true); // a run that panicked after launching
        let start = outputs.begin();
        outputs.state.set(start.0); // what `begin_scope` does, without a stream
        assert!(refused(&outputs, &key).contains("failed or panicked"));
        outputs.note_scope_launch();
        assert_eq!(outputs.find(&key).unwrap().1, 16);
        let start = outputs.begin();
        outputs.end_run(start, true); // a later run that queues nothing keeps them
        assert!(outputs.find(&key).is_ok());
    }

    #[test]
    fn a_panicked_run_leaves_the_outputs_unknown_and_allocated() {
        let (mut outputs, key) = outputs();
        let _ = outputs.begin();
        outputs.queued.set(true); // launched, then the closure unwound: no end_run
        assert!(refused(&outputs, &key).contains("failed or panicked"));
        let start = outputs.begin();
        assert_eq!(outputs.state.get(), State::Unknown, "the next run sees the panicked run's launches");
        outputs.end_run(start, true);
        assert!(refused(&outputs, &key).contains("failed or panicked"));
        let (_, other_key) = OutputRecord::new::<u32>(8, 0, std::ptr::null_mut(), 16);
        assert!(refused(&outputs, &other_key).contains("another graph"));
    }
}
