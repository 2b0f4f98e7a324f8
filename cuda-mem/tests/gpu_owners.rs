//! The stream-ordered owners (`StreamBuffer`, `CachedBuffer`, `ResourceBuffer`) on a GPU, through
//! the one bookkeeping they share: a free waits for every stream passed to `use_on`, `free_on`
//! frees on another stream after all of them; and every device owner in a `Pending` and in an
//! owned DLPack export.

mod common;

use common::{Gate, MIB, assert_same, pattern, until_held};
use cuda_mem::resource::default_resource;
use cuda_mem::resource::{
    MemoryKind, MemoryResource, PinnedResource, ResourceBuffer, ResourceHostBuffer, StatisticsResource,
};
use cuda_mem::{Device, DeviceCache, ErrorKind, PinnedBuffer, Stream, StreamBuffer, StreamOrdered};
use std::sync::Arc;

fn device() -> Device {
    Device::current().expect("a GPU")
}

fn stream() -> Stream {
    Stream::non_blocking().unwrap()
}

/// A cache of its own, for the life of the process, so its figures are this test's alone and its
/// buffers are `'static` (what a `Pending` or an owned export takes).
fn own_cache() -> &'static DeviceCache {
    Box::leak(Box::new(DeviceCache::new(device()).unwrap()))
}

/// Stream `b` is held by a gate and used the buffer (`use_on`): the free, on the owner's stream
/// (drop) or on a third stream (`free_on`), must wait for `b`, so work queued after the free on
/// the freeing stream stays pending while the gate holds `b`. The per-thread stream is refused.
fn frees_wait_for_their_users<B: StreamOrdered>(make: impl Fn(&Stream) -> B) {
    for free_elsewhere in [false, true] {
        let pending_after_free = until_held(|| {
            let (a, b, c) = (stream(), stream(), stream());
            let mut buffer = make(&a);
            a.synchronize().unwrap(); // the allocation and zeroing are done: only `b` can delay
            let gate = Gate::hold(&b);
            buffer.use_on(&b).unwrap();
            buffer.use_on(&b).unwrap(); // remembered once; harmless twice
            let freeing = if free_elsewhere {
                buffer.free_on(&c).unwrap();
                &c
            } else {
                drop(buffer);
                &a
            };
            let after = freeing.record_event().unwrap();
            let pending = !after.is_complete().unwrap();
            let held = gate.release();
            after.synchronize().unwrap();
            (held, pending)
        });
        assert!(pending_after_free, "free elsewhere: {free_elsewhere}: the free did not wait for the user stream");
    }
    let per_thread = Stream::per_thread().unwrap();
    let mut buffer = make(&stream());
    let err = buffer.use_on(&per_thread).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(m) if m.contains("per-thread")), "{err}");
    let err = buffer.free_on(&per_thread).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(m) if m.contains("per-thread")), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_stream_buffer_frees_wait_for_the_streams_passed_to_use_on() {
    frees_wait_for_their_users(|s| StreamBuffer::<u32>::zeroed(s.clone(), MIB).unwrap());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_cached_buffer_frees_wait_for_the_streams_passed_to_use_on() {
    let cache = own_cache();
    frees_wait_for_their_users(|s| cache.zeroed::<u32>(s.clone(), MIB).unwrap());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_resource_buffer_frees_wait_for_the_streams_passed_to_use_on() {
    let resource = default_resource(device()).unwrap();
    frees_wait_for_their_users(|s| ResourceBuffer::<u32>::zeroed(resource.clone(), s.clone(), MIB).unwrap());
}

/// `ResourceBuffer::free_on` gives the memory back through its resource (the statistics see it
/// go), and data written on the user stream is intact up to the free.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_resource_buffer_free_on_returns_the_memory_through_its_resource() {
    let counted = Arc::new(StatisticsResource::new(default_resource(device()).unwrap()));
    let (a, b) = (stream(), stream());
    let want = pattern(MIB / 4, 9);
    let mut buffer = ResourceBuffer::<u32>::zeroed(counted.clone(), a.clone(), want.len()).unwrap();
    assert_eq!(counted.stats().current_bytes, want.len() * 4);
    buffer.use_on(&b).unwrap();
    let mut view = buffer.as_mut_slice();
    b.scope(|s| s.copy_from_host(&mut view, &want)).unwrap().unwrap();
    assert_same(&buffer.to_vec().unwrap(), &want);
    buffer.free_on(&b).unwrap();
    assert_eq!(counted.stats().current_bytes, 0, "freed through the resource");
    b.synchronize().unwrap();
}

/// The device views' names before 2026-12-03 stay one release, deprecated, and give the views
/// `as_slice` / `as_mut_slice` give.
#[test]
#[ignore = "needs a CUDA GPU"]
#[allow(deprecated)]
fn gpu_the_device_view_names_before_2026_12_03_give_the_same_views() {
    let mut managed = cuda_mem::ManagedBuffer::<u32>::zeroed(1024).unwrap();
    let view = |s: cuda_mem::DeviceSlice<'_, u32>| (s.as_device_ptr() as usize, s.len());
    assert_eq!(view(managed.as_device_slice()), view(managed.as_slice()));
    let old = view(managed.as_device_slice_mut().as_slice());
    assert_eq!(old, view(managed.as_mut_slice().as_slice()));
    let stream = stream();
    let mut buffer = ResourceBuffer::<u32>::zeroed(default_resource(device()).unwrap(), stream.clone(), 1024).unwrap();
    assert_eq!(view(buffer.device_slice().unwrap()), view(buffer.as_slice()));
    let old = view(buffer.device_slice_mut().unwrap().as_slice());
    assert_eq!(old, view(buffer.as_mut_slice().as_slice()));
}

/// Pinned host memory from a resource is a `ResourceHostBuffer`, with host views only: a
/// `ResourceBuffer` (whose device views cannot fail) refuses the resource with a typed error that
/// names the right owner, and the host buffer reads back what the host wrote after its zeroing.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pinned_memory_from_a_resource_is_a_host_buffer_and_refused_as_a_device_owner() {
    let resource: Arc<dyn MemoryResource> = Arc::new(PinnedResource::new(Default::default()));
    assert_eq!(resource.kind(), MemoryKind::PinnedHost);
    let stream = stream();
    let err = ResourceBuffer::<u32>::zeroed(resource.clone(), stream.clone(), 1024).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(m) if m.contains("ResourceHostBuffer")), "{err}");
    let mut buffer = ResourceHostBuffer::<u32>::zeroed(resource, stream.clone(), 1024).unwrap();
    assert!(buffer.host().unwrap().iter().all(|&x| x == 0));
    buffer.host_mut().unwrap().fill(7);
    assert_eq!(buffer.to_vec().unwrap(), vec![7; 1024]);
    buffer.free().unwrap();
}

/// A `CachedBuffer` (of a `'static` cache, with an owned stream) and a `ResourceBuffer` (owned
/// resource and stream) go through `Pending` like the other device owners: upload, more work on
/// another stream with `then_on`, and download into a pageable `Vec`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pending_moves_cached_and_resource_buffers_through_upload_then_on_and_download() {
    let (a, b) = (stream(), stream());
    let want = pattern(MIB, 4);
    let host = || PinnedBuffer::from_slice(&want, Default::default()).unwrap();

    let cached = own_cache().zeroed::<u32>(a.clone(), want.len()).unwrap();
    let (cached, copy) = a
        .upload(cached, host())
        .unwrap()
        .then_on(&b, |s, (device, copy)| s.copy_to_host(&mut copy[..], device.as_slice()))
        .unwrap()
        .wait()
        .unwrap();
    assert_same(&copy, &want);
    let (back, _cached) = a.download(vec![0u32; want.len()], cached).unwrap().wait().unwrap();
    assert_same(&back, &want);

    let resource = default_resource(device()).unwrap();
    let pooled = ResourceBuffer::<u32>::zeroed(resource, a.clone(), want.len()).unwrap();
    let (pooled, _) = a.upload(pooled, host()).unwrap().wait().unwrap();
    let (back, _pooled) = b.download(vec![0u32; want.len()], pooled).unwrap().wait().unwrap();
    assert_same(&back, &want);
}

/// Forgetting a `Pending` leaks the cached buffer it owns: its block never returns to the cache
/// (the cache's figures keep it allocated), so nothing can reuse memory the copy may still use.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_forgotten_pending_keeps_its_cached_block_out_of_the_cache() {
    let cache = own_cache();
    let stream = stream();
    let bytes = 4 * MIB;
    let buffer = cache.zeroed::<u8>(stream.clone(), bytes).unwrap();
    let leaked = buffer.as_slice().as_device_ptr() as usize;
    let host = PinnedBuffer::<u8>::zeroed(bytes).unwrap();
    std::mem::forget(stream.upload(buffer, host).unwrap());
    stream.synchronize().unwrap();
    assert!(cache.stats().allocated.current >= bytes, "{:?}", cache.stats());
    let next = cache.zeroed::<u8>(stream.clone(), bytes).unwrap();
    assert_ne!(next.as_slice().as_device_ptr() as usize, leaked, "the leaked block is never handed out again");
}

#[cfg(feature = "dlpack")]
mod dlpack {
    use super::*;
    use cuda_mem::dlpack::ffi::kDLCUDA;
    use cuda_mem::dlpack::{DLDevice, DlpackImport, DlpackTensor};

    /// An owned export of a cached buffer owns the block until the consumer's deleter runs: the
    /// cache counts it allocated meanwhile, the import reads the data after the producer stream
    /// (carried with the export), and the deleter gives the block back.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_dlpack_owned_export_of_a_cached_buffer_holds_its_block_until_the_deleter() {
        let cache = own_cache();
        let stream = stream();
        let want = pattern(MIB / 4, 6);
        let mut buffer = cache.zeroed::<u32>(stream.clone(), want.len()).unwrap();
        buffer.as_mut_slice().copy_from_host(&want).unwrap();
        let address = buffer.as_slice().as_device_ptr() as usize;
        let tensor = DlpackTensor::owned(buffer).unwrap();
        assert_eq!(tensor.data_ptr() as usize, address);
        assert_eq!(tensor.device(), DLDevice { device_type: kDLCUDA, device_id: device().ordinal() as i32 });
        assert_eq!(tensor.producer().map(Stream::as_raw), Some(stream.as_raw()));
        let raw = tensor.into_raw();
        assert!(cache.stats().allocated.current >= want.len() * 4, "the export holds the block");
        // SAFETY: a live export of ours, handed over once.
        let import = unsafe { DlpackImport::from_raw(raw) }.unwrap();
        assert_eq!(import.producer().map(Stream::as_raw), Some(stream.as_raw()));
        assert_same(&import.device_slice::<u32>(device()).unwrap().to_vec().unwrap(), &want);
        drop(import); // runs the deleter: waits for the device, then returns the block
        assert_eq!(cache.stats().allocated.current, 0, "{:?}", cache.stats());
    }

    /// The same for a resource's buffer: freed through its resource when the deleter runs.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_dlpack_owned_export_of_a_resource_buffer_frees_through_the_resource_at_the_deleter() {
        let counted = Arc::new(StatisticsResource::new(default_resource(device()).unwrap()));
        let stream = stream();
        let want = pattern(4096, 2);
        let mut buffer = ResourceBuffer::<u32>::zeroed(counted.clone(), stream.clone(), want.len()).unwrap();
        buffer.as_mut_slice().copy_from_host(&want).unwrap();
        let tensor = DlpackTensor::owned(buffer).unwrap();
        assert_eq!(tensor.device(), DLDevice { device_type: kDLCUDA, device_id: device().ordinal() as i32 });
        // SAFETY: a live export of ours, handed over once.
        let import = unsafe { DlpackImport::from_raw(tensor.into_raw()) }.unwrap();
        assert_eq!(counted.stats().current_bytes, want.len() * 4, "the export holds the memory");
        assert_same(&import.device_slice::<u32>(device()).unwrap().to_vec().unwrap(), &want);
        drop(import);
        assert_eq!(counted.stats().current_bytes, 0, "freed through the resource");
    }
}
