//! CUDA graphs whose memory stays safe: [`Stream::capture`](crate::Stream::capture) records the
//! work queued through a [`CaptureScope`] into a [`Graph`], which becomes a [`GraphExec`] that can
//! be launched again and again.
//!
//! Everything the captured work borrows (device views, host slices) is borrowed for `'env`, the
//! lifetime parameter of [`Graph`] and [`GraphExec`]: it can be neither dropped nor mutated while
//! the graph or the executable graph lives. No launch is pending when those borrows end, even if
//! the executable graph is forgotten: [`GraphExec::launch`] and [`GraphExec::run`] wait for their
//! stream before they return, and launches queued in a scope ([`GraphExec::launches_in`]) hold
//! the executable graph until the scope's end, which waits. A graph that owns everything it uses
//! (`GraphExec<'static>`) launches without a host wait: [`GraphExec::launch_pending`] moves it
//! into a [`Pending`](crate::Pending) that gives it back once the launch has completed (a
//! forgotten `Pending` leaks it). Memory the graph itself owns
//! (temporaries allocated in the capture) is reached only through views whose stream refuses
//! every use once the capture has ended; outputs, graph memory that outlives a launch, are lent
//! between launches through a borrow of the executable graph ([`GraphOutput`]).
//! docs/soundness.md gives the argument in full.
//!
//! ```no_run
//! # fn main() -> cuda_mem::Result<()> {
//! use cuda_mem::{CaptureMode, DeviceBuffer, GraphFlags, PinnedBuffer, Stream};
//! let stream = Stream::non_blocking()?;
//! let weights = DeviceBuffer::from_slice(&[2.0f32; 256])?;
//! // Pinned host memory: captured copies from pageable memory are not supported by the runtime.
//! let mut input = PinnedBuffer::<f32>::zeroed(256)?;
//! let mut output = PinnedBuffer::<f32>::zeroed(256)?;
//! let (graph, (input_slot, output_slot)) = stream.capture_with(CaptureMode::ThreadLocal, |s| {
//!     let mut tmp = s.temporary::<f32>(256)?; // graph memory, freed at the end of the graph
//!     let input_slot = s.copy_from_host_slot(&mut tmp, &mut input)?;
//!     let output_slot = s.copy_to_host_slot(&mut output, weights.as_slice())?;
//!     Ok((input_slot, output_slot))
//! })?;
//! let mut exec = graph.instantiate(GraphFlags::empty())?;
//! exec.host_mut(&input_slot)?.fill(3.0); // the next launch reads 3.0
//! exec.launch(&stream)?; // returns once the launch has completed
//! assert_eq!(exec.host(&output_slot)?[0], 2.0);
//! # Ok(()) }
//! ```
//!
//! # Private pools
//!
//! Memory a graph needs only while it runs can come from a [`GraphPool`]
//! ([`DeviceCache::graph_pool`](crate::DeviceCache::graph_pool)) instead of graph memory:
//! [`CaptureScope::cached`] carves a block from the pool, its address is baked into the graph,
//! and at the end of the capture (or earlier, at [`CaptureScope::release_cached`], for the
//! capture's own later allocations too) the block returns to the pool's own free lists. Later captures
//! that share the pool reuse those blocks, so K graphs need about the memory of the largest, not
//! the sum (capture the largest first: a smaller graph's blocks fit into its freed ones). The
//! pool's segments are its own `cudaMalloc` memory: the cache's eager users never get them, and
//! neither `empty_cache` nor an out-of-memory release frees them while the pool, or any graph
//! or executable graph made with it, lives.
//!
//! Graphs of one pool share blocks, so they must never run at the same time. Every launch of a
//! graph that allocated from a pool ([`GraphExec::run`], [`GraphExec::launch`]) takes the pool's
//! turn for the whole call, which waits for its launches, whatever stream it launches on: a
//! second thread waits for the turn, and a launch from inside a `run` closure never waits: a busy
//! pool there is an error rather than a deadlock. A launch that does not wait
//! ([`GraphExec::launches_in`], [`GraphExec::launch_pending`]) takes the turn only while it
//! queues: its stream waits on the device for the pool's previous launch, and the pool's next
//! launch waits for it, so the graphs still run one at a time without a host wait.
//!
//! ```no_run
//! # fn main() -> cuda_mem::Result<()> {
//! use cuda_mem::{CaptureMode, Device, DeviceCache, GraphFlags, Stream};
//! let cache = DeviceCache::for_device(Device::current()?)?;
//! let pool = cache.graph_pool()?;
//! let stream = Stream::non_blocking()?;
//! let mut graphs = Vec::new();
//! for batch in [64usize, 32, 16] {
//!     let graph = stream.capture(CaptureMode::ThreadLocal, |s| {
//!         let mut activations = s.cached::<f32>(&pool, batch << 20)?; // zeroed at every launch
//!         s.set_bytes(&mut activations, 1)
//!     })?;
//!     graphs.push(graph.instantiate(GraphFlags::empty())?);
//! }
//! for exec in &mut graphs {
//!     exec.launch(&stream)?; // the graphs of `pool` take turns
//! }
//! println!("{:?}", pool.stats().reserved); // about the largest graph's need
//! # Ok(()) }
//! ```

mod capture;
mod exec;
mod memory;
mod outputs;
mod pool;
mod slots;

pub use capture::{CaptureMode, CaptureScope, Graph};
pub use exec::{GraphExec, GraphFlags, Launches};
pub use memory::GraphMemStats;
pub use outputs::GraphOutput;
pub use pool::GraphPool;
pub use slots::HostSlot;
