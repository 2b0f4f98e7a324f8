//! GPU tests of every kernel against a CPU computation, over device memory, the device view of a
//! mapped pinned buffer, and managed memory. Ignored where no GPU exists; `cargo xtask test` on a
//! GPU host and the bundle's `run` include them.

// The helpers of cuda-mem's GPU tests (the same pattern generator, one copy).
#[path = "../../cuda-mem/tests/common/mod.rs"]
mod common;

use common::pattern;
use cuda_mem::*;
use cuda_mem_kernels::*;

/// Odd lengths: one element, less than a block, and more than a full grid with a ragged tail.
const LENGTHS: [usize; 3] = [1, 1023, (1 << 20) + 7];

#[derive(Debug, Clone, Copy)]
enum Memory {
    Device,
    Mapped,
    Managed,
}

const MEMORIES: [Memory; 3] = [Memory::Device, Memory::Mapped, Memory::Managed];

/// Runs `f` with a device view of a `memory` buffer that starts as a copy of `init`, then returns
/// `f`'s result and the buffer's final contents (read by the host: no kernel uses it any more).
fn with_view<T: Pod, R>(
    memory: Memory,
    init: &[T],
    f: impl FnOnce(&Stream, DeviceSliceMut<'_, T>) -> R,
) -> (R, Vec<T>) {
    let stream = Stream::non_blocking().unwrap();
    match memory {
        Memory::Device => {
            let mut buffer = device_copy(init);
            let result = f(&stream, buffer.as_mut_slice());
            (result, buffer.to_vec().unwrap())
        }
        Memory::Mapped => {
            let mut buffer = PinnedBuffer::from_slice(init, HostAllocFlags::MAPPED).unwrap();
            let result = f(&stream, buffer.device_view_mut().unwrap());
            (result, buffer.to_vec())
        }
        Memory::Managed => {
            let mut buffer = ManagedBuffer::from_slice(init).unwrap();
            let result = f(&stream, buffer.as_mut_slice());
            (result, buffer.host().unwrap().to_vec())
        }
    }
}

/// A device copy of `data` that has landed when this returns: queued inside a scope, which waits
/// for it. (`DeviceBuffer::from_slice` copies with `cudaMemcpy` from pageable memory, which may
/// return before the DMA lands, and so race with kernels on a non-blocking stream.)
fn device_copy<T: Pod>(data: &[T]) -> DeviceBuffer<T> {
    let stream = Stream::non_blocking().unwrap();
    let mut buffer = DeviceBuffer::zeroed(data.len()).unwrap();
    let mut view = buffer.as_mut_slice();
    stream.scope(|s| s.copy_from_host(&mut view, data)).unwrap().unwrap();
    buffer
}

/// Pseudo-random floats in [-4, 4).
fn floats(len: usize, seed: u32) -> Vec<f32> {
    pattern(len, seed).into_iter().map(|x| (x >> 8) as f32 / (1 << 24) as f32 * 8.0 - 4.0).collect()
}

fn xor_all(data: &[u32]) -> u32 {
    data.iter().fold(0, |acc, &x| acc ^ x)
}

#[track_caller]
fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
        panic!("{what}: element {i} is {}, want {}", got[i], want[i]);
    }
}

#[track_caller]
fn assert_words_eq(got: &[u32], want: &[u32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: element {i} is {:#x}, want {:#x}", got[i], want[i]);
    }
}

/// A one-element device buffer holding `value`, for results the kernels must overwrite.
fn slot<T: Pod>(value: T) -> DeviceBuffer<T> {
    device_copy(&[value])
}

fn read_slot<T: Pod>(slot: &DeviceBuffer<T>) -> T {
    slot.to_vec().unwrap()[0]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_fill_writes_every_element_and_nothing_else() {
    for memory in MEMORIES {
        for len in LENGTHS {
            let what = format!("fill_u32 on {len} elements of {memory:?} memory");
            let init = pattern(len + 2, len as u32);
            let (result, got) = with_view(memory, &init, |stream, view| {
                let mut inner = view.slice_mut(1..=len)?;
                stream.scope(|s| fill_u32(s, &mut inner, 0xdead_beef))?
            });
            result.unwrap();
            let mut want = init.clone();
            want[1..=len].fill(0xdead_beef);
            assert_words_eq(&got, &want, &what);

            let what = format!("fill_f32 on {len} elements of {memory:?} memory");
            let init = floats(len + 2, len as u32);
            let (result, got) = with_view(memory, &init, |stream, view| {
                let mut inner = view.slice_mut(1..=len)?;
                stream.scope(|s| fill_f32(s, &mut inner, -1.5))?
            });
            result.unwrap();
            let mut want = init.clone();
            want[1..=len].fill(-1.5);
            assert_bits_eq(&got, &want, &what);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_scale_matches_the_cpu_in_place_and_out_of_place() {
    let alpha = 1.7f32;
    for memory in MEMORIES {
        for len in LENGTHS {
            let x = floats(len, 11 + len as u32);
            let want: Vec<f32> = x.iter().map(|&v| alpha * v).collect();

            let (result, got) =
                with_view(memory, &x, |stream, mut view| stream.scope(|s| scale_in_place_f32(s, &mut view, alpha)));
            result.unwrap().unwrap();
            assert_bits_eq(&got, &want, &format!("scale_f32 in place, {len} elements of {memory:?} memory"));

            let src = device_copy(&x);
            let (result, got) = with_view(memory, &vec![0f32; len], |stream, mut view| {
                stream.scope(|s| scale_f32(s, &mut view, src.as_slice(), alpha))
            });
            result.unwrap().unwrap();
            assert_bits_eq(&got, &want, &format!("scale_f32 from device into {len} elements of {memory:?} memory"));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_axpy_matches_a_fused_multiply_add_on_the_cpu() {
    let alpha = -0.375f32;
    for memory in MEMORIES {
        for len in LENGTHS {
            let x = floats(len, 3 * len as u32);
            let y = floats(len, 5 * len as u32 + 1);
            let want: Vec<f32> = x.iter().zip(&y).map(|(&x, &y)| alpha.mul_add(x, y)).collect();
            let x_device = device_copy(&x);
            let (result, got) = with_view(memory, &y, |stream, mut view| {
                stream.scope(|s| axpy_f32(s, &mut view, alpha, x_device.as_slice()))
            });
            result.unwrap().unwrap();
            assert_bits_eq(&got, &want, &format!("axpy_f32 on {len} elements of {memory:?} memory"));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_checksum_matches_the_cpu_on_random_data() {
    for memory in MEMORIES {
        for len in [0, 1, 1023, 4096, (1 << 20) + 7] {
            let data = pattern(len, 0xc0ffee ^ len as u32);
            let mut out = slot(u64::MAX);
            let mut out_shifted = slot(u64::MAX);
            let (result, _) = with_view(memory, &data, |stream, view| {
                let (mut whole, mut shifted) = (out.as_mut_slice(), out_shifted.as_mut_slice());
                stream.scope(|s| -> Result<()> {
                    checksum_u32(s, &view, &mut whole)?;
                    // A sub-slice that starts one element in: positions restart at 0.
                    checksum_u32(s, view.as_slice().slice(len.min(1)..)?, &mut shifted)
                })?
            });
            result.unwrap();
            let what = format!("checksum_u32 on {len} elements of {memory:?} memory");
            assert_eq!(read_slot(&out), checksum_cpu(&data), "{what}");
            assert_eq!(read_slot(&out_shifted), checksum_cpu(&data[len.min(1)..]), "{what}, from element 1");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_stream_read_xors_every_element_at_every_alignment() {
    for memory in MEMORIES {
        for len in LENGTHS.into_iter().chain([0, 2, 3, 4, 5, 8, 4099]) {
            let data = pattern(len + 3, 77 + len as u32);
            for offset in 0..4 {
                let part = &data[offset..offset + len];
                let mut sink = slot(0x5a5a_5a5a_u32);
                let (result, _) = with_view(memory, &data, |stream, view| {
                    let mut sink_view = sink.as_mut_slice();
                    let part = view.as_slice().slice(offset..offset + len)?;
                    stream.scope(|s| stream_read_u32(s, part, &mut sink_view))?
                });
                result.unwrap();
                assert_eq!(read_slot(&sink), xor_all(part), "stream_read_u32, {len} elements at +{offset}, {memory:?}");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_stream_write_fills_exactly_its_slice_at_every_alignment() {
    for memory in MEMORIES {
        for len in LENGTHS.into_iter().chain([0, 2, 3, 4, 5, 8, 4099]) {
            let init = pattern(len + 8, 99 + len as u32);
            for offset in 0..4 {
                let (result, got) = with_view(memory, &init, |stream, view| {
                    let mut part = view.slice_mut(offset..offset + len)?;
                    stream.scope(|s| stream_write_u32(s, &mut part, 0x0bad_cafe))?
                });
                result.unwrap();
                let mut want = init.clone();
                want[offset..offset + len].fill(0x0bad_cafe);
                assert_words_eq(&got, &want, &format!("stream_write_u32, {len} elements at +{offset}, {memory:?}"));
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_page_touch_write_lands_on_every_stride_and_nowhere_else() {
    let len = (8 << 20) + 7; // 32 MiB of u32
    for memory in MEMORIES {
        for stride_bytes in [4, 64, 4096, 64 << 10, 2 << 20] {
            let (result, got) = with_view(memory, &vec![0u32; len], |stream, mut view| {
                stream.scope(|s| touch_pages_write(s, &mut view, stride_bytes, 0xfeed))
            });
            result.unwrap().unwrap();
            let mut want = vec![0u32; len];
            for i in touched_indices(len, stride_bytes).unwrap() {
                want[i] = 0xfeed;
            }
            assert_words_eq(&got, &want, &format!("touch_pages_write every {stride_bytes} bytes, {memory:?}"));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_page_touch_read_xors_every_stride() {
    let len = (8 << 20) + 7;
    let data = pattern(len, 4242);
    for memory in MEMORIES {
        for stride_bytes in [4, 4096, 64 << 10, 2 << 20] {
            let mut sink = slot(7u32);
            let (result, _) = with_view(memory, &data, |stream, view| {
                let mut sink_view = sink.as_mut_slice();
                stream.scope(|s| touch_pages_read(s, &view, stride_bytes, &mut sink_view))
            });
            result.unwrap().unwrap();
            let want = touched_indices(len, stride_bytes).unwrap().fold(0, |acc, i| acc ^ data[i]);
            assert_eq!(read_slot(&sink), want, "touch_pages_read every {stride_bytes} bytes, {memory:?}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pointer_chase_ends_at_the_cpu_computed_index() {
    // One thread chases serially; under compute-sanitizer (the bundle's `run --sanitize` sets
    // CUDA_MEM_UNDER_SANITIZER) every load is instrumented, so the ring is shorter there.
    let ring_len: u64 = if std::env::var_os("CUDA_MEM_UNDER_SANITIZER").is_some() { 1 << 12 } else { 1 << 20 };
    let ring = chase_ring(ring_len as usize, 2024).unwrap();
    for memory in MEMORIES {
        for (start, steps) in [(0, 0), (5, 1), (123, ring_len / 10), (7, ring_len), (u32::MAX, 3)] {
            let mut out = slot(u32::MAX);
            let (result, _) = with_view(memory, &ring, |stream, view| {
                let mut out_view = out.as_mut_slice();
                stream.scope(|s| pointer_chase(s, &view, start, steps, &mut out_view))
            });
            result.unwrap().unwrap();
            let want = chase_cpu(&ring, start, steps).unwrap();
            assert_eq!(read_slot(&out), want, "pointer_chase from {start} for {steps} steps, {memory:?}");
        }
        assert_eq!(chase_cpu(&ring, 7, ring_len), Some(7), "one cycle through every element");
    }
    // Entries outside the ring are reduced modulo its length, on the device as on the CPU.
    let odd_ring = [7u32, 9, 5];
    for steps in 0..7 {
        let mut out = slot(u32::MAX);
        let (result, _) = with_view(Memory::Device, &odd_ring, |stream, view| {
            let mut out_view = out.as_mut_slice();
            stream.scope(|s| pointer_chase(s, &view, 1, steps, &mut out_view))
        });
        result.unwrap().unwrap();
        assert_eq!(Some(read_slot(&out)), chase_cpu(&odd_ring, 1, steps), "{steps} steps over {odd_ring:?}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_kernels_read_and_write_mapped_pinned_memory_through_its_device_pointer() {
    let device = Device::current().unwrap();
    assert!(device.can_map_host_memory().unwrap());
    let stream = Stream::non_blocking().unwrap();
    let len = (4 << 20) + 3;
    // Written by the host only: no copy to the device ever happens.
    let mut input = PinnedBuffer::<u32>::zeroed_with_flags(len, HostAllocFlags::MAPPED).unwrap();
    input.copy_from_slice(&pattern(len, 31337));
    let mut results = PinnedBuffer::<u64>::zeroed_with_flags(1, HostAllocFlags::MAPPED).unwrap();
    let mut sink = PinnedBuffer::<u32>::zeroed_with_flags(1, HostAllocFlags::MAPPED).unwrap();
    {
        let input_view = input.device_view().unwrap();
        let (mut sum, mut xor) = (results.device_view_mut().unwrap(), sink.device_view_mut().unwrap());
        stream
            .scope(|s| -> Result<()> {
                checksum_u32(s, input_view, &mut sum)?;
                stream_read_u32(s, input_view, &mut xor)
            })
            .unwrap()
            .unwrap();
    }
    // The kernels' results landed in host memory too.
    assert_eq!(results[0], checksum_cpu(&input));
    assert_eq!(sink[0], xor_all(&input));

    // And a kernel writes host memory the host then reads directly.
    {
        let mut view = input.device_view_mut().unwrap();
        stream.scope(|s| stream_write_u32(s, &mut view, 0x600d)).unwrap().unwrap();
    }
    assert!(input.iter().all(|&x| x == 0x600d));
}

/// Alone (`gpu_alone_`, see `cuda-mem/tests/common/mod.rs`): its failed allocation makes the
/// driver trim every pool of the process.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_bad_input_is_a_typed_error_and_later_launches_still_work() {
    if common::skip_unless_alone() {
        return;
    }
    let stream = Stream::non_blocking().unwrap();
    let mut a = DeviceBuffer::<f32>::zeroed(8).unwrap();
    let b = DeviceBuffer::<f32>::zeroed(5).unwrap();
    let mut words = DeviceBuffer::<u32>::zeroed(8).unwrap();
    let mut two = DeviceBuffer::<u64>::zeroed(2).unwrap();
    let mut none = DeviceBuffer::<u32>::zeroed(0).unwrap();
    let mut one = DeviceBuffer::<u32>::zeroed(1).unwrap();
    let (mut a_view, mut words_view, mut two_view) = (a.as_mut_slice(), words.as_mut_slice(), two.as_mut_slice());
    let (mut none_view, mut one_view) = (none.as_mut_slice(), one.as_mut_slice());
    stream
        .scope(|s| {
            let err = scale_f32(s, &mut a_view, b.as_slice(), 2.0).unwrap_err();
            assert_eq!(err.kind(), &ErrorKind::LengthMismatch { src: 5, dst: 8 });
            let err = axpy_f32(s, &mut a_view, 2.0, b.as_slice()).unwrap_err();
            assert_eq!(err.kind(), &ErrorKind::LengthMismatch { src: 5, dst: 8 });
            let err = checksum_u32(s, &words_view, &mut two_view).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
            let err = stream_read_u32(s, &words_view, &mut none_view).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
            let err = touch_pages_write(s, &mut words_view, 6, 1).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
            let err = pointer_chase(s, none_view.as_slice(), 0, 1, &mut one_view).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
        })
        .unwrap();
    // An unrelated failed call must not be reported as a launch failure.
    let err = DeviceBuffer::<u8>::zeroed(1 << 60).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let mut view = words.as_mut_slice();
    stream.scope(|s| fill_u32(s, &mut view, 9)).unwrap().unwrap();
    assert_eq!(words.to_vec().unwrap(), [9; 8]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_geometry_fills_the_device_and_is_cached() {
    let device = Device::current().unwrap();
    let geometry = Geometry::for_device(device).unwrap();
    let threads = device.attribute(DeviceAttribute::MaxThreadsPerMultiProcessor).unwrap() as usize;
    assert_eq!(geometry, Geometry::from_limits(device.multiprocessor_count().unwrap(), threads).unwrap());
    assert_eq!(Geometry::for_device(device).unwrap(), geometry);
    assert!(geometry.resident_blocks() >= geometry.multiprocessors());
    println!("{device}: {} ({geometry:?}), kernels built for {COMPILED_TARGETS}", device.name().unwrap());
}
