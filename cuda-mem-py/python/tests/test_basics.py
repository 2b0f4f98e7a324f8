"""The module on its own: allocation, copies, and the DLPack protocol against itself."""
import gc

import cuda_mem
from helpers import floats, need, need_gpu, raises, unpack_floats

KINDS = ("device", "managed", "pinned", "pooled", "cached")


def test_every_kind_allocates_zeroed_and_round_trips_bytes():
    need_gpu()
    for kind in KINDS:
        buf = cuda_mem.zeros((4, 8), "float32", kind=kind)
        assert (buf.shape, buf.dtype, buf.nbytes, buf.kind) == ((4, 8), "float32", 128, kind)
        assert buf.read() == bytes(128), kind
        values = [float(i) * 0.5 for i in range(32)]
        buf.write(floats(values))
        assert unpack_floats(buf.read()) == values, kind
        buf.fill_byte(0x3F)
        assert buf.read() == b"\x3f" * 128, kind
        assert buf.ptr != 0
        assert (buf.stream is not None) == (kind in ("pooled", "cached"))


def test_from_bytes_reshape_and_view_share_the_memory():
    need_gpu()
    buf = cuda_mem.from_bytes(bytes(range(24)), "uint8", kind="device")
    assert buf.shape == (24,)
    grid = buf.reshape((2, 3, 4))
    assert grid.shape == (2, 3, 4) and grid.ptr == buf.ptr
    words = buf.view("uint32")
    assert words.shape == (6,) and words.dtype == "uint32"
    grid.fill_byte(7)
    assert buf.read() == bytes([7]) * 24
    raises(ValueError, buf.reshape, (5, 5), match="cannot reshape")
    odd = cuda_mem.from_bytes(bytes(20), "uint8", kind="device")
    raises(ValueError, odd.view, "float64", match="20 bytes are not whole float64 elements")
    raises(ValueError, buf.write, b"short", match="5 bytes given for a buffer of 24")
    raises(ValueError, cuda_mem.zeros, 4, "float128", match="unknown dtype")
    raises(ValueError, cuda_mem.zeros, 4, kind="texture", match='unknown kind "texture": use "device", "managed"')


def test_pooled_buffers_use_the_given_stream_and_the_retaining_pool():
    need_gpu()
    stream = cuda_mem.Stream()
    buf = cuda_mem.zeros(1 << 20, "uint8", kind="pooled", stream=stream)
    assert buf.stream.handle == stream.handle
    buf.fill_byte_async(0x5A)
    assert buf.read() == b"\x5a" * (1 << 20), "read waits for the buffer's stream"
    stats = cuda_mem.pool_stats(stream.device)
    assert stats["used_current"] >= 1 << 20 and stats["reserved_current"] >= stats["used_current"]
    raises(ValueError, cuda_mem.zeros(4, kind="device").fill_byte_async, 1, match="only pooled and cached buffers")


def test_dlpack_device_names_each_kind():
    need_gpu()
    ordinal = cuda_mem.zeros(1).device
    assert cuda_mem.zeros(1, kind="device").__dlpack_device__() == (2, ordinal)
    assert cuda_mem.zeros(1, kind="pooled").__dlpack_device__() == (2, ordinal)
    assert cuda_mem.zeros(1, kind="managed").__dlpack_device__() == (13, ordinal)
    assert cuda_mem.zeros(1, kind="pinned").__dlpack_device__() == (3, 0)
    assert cuda_mem.zeros(1, kind="managed").with_dl_device((2, ordinal)).__dlpack_device__() == (2, ordinal)
    assert cuda_mem.zeros(1, kind="pinned").with_dl_device((1, 0)).__dlpack_device__() == (1, 0)
    raises(ValueError, cuda_mem.zeros(1, kind="device").with_dl_device, (1, 0), match="without a copy")


def test_capsules_are_versioned_or_legacy_as_asked():
    need_gpu()
    buf = cuda_mem.from_bytes(floats([1.0, 2.0, 3.0, 4.0]), "float32", shape=(2, 2))
    versioned = buf.__dlpack__(max_version=(1, 0))
    assert 'capsule object "dltensor_versioned"' in repr(versioned)
    legacy = buf.__dlpack__()
    assert 'capsule object "dltensor"' in repr(legacy)
    for capsule in (versioned, legacy):
        view = cuda_mem.from_dlpack(capsule)
        assert (view.shape, view.dtype, view.ptr) == ((2, 2), "float32", buf.ptr)
        assert unpack_floats(view.read()) == [1.0, 2.0, 3.0, 4.0]
        assert 'capsule object "used_dltensor' in repr(capsule)
        raises(TypeError, cuda_mem.from_dlpack, capsule, match="unconsumed DLPack capsule")
    raises(BufferError, buf.__dlpack__, copy=True)
    raises(BufferError, buf.__dlpack__, dl_device=(1, 0))
    raises(ValueError, buf.__dlpack__, stream=0, match="stream 0")


def test_a_view_keeps_the_memory_after_the_buffer_is_gone():
    need_gpu()
    buf = cuda_mem.from_bytes(bytes(range(64)), kind="device")
    view = cuda_mem.from_dlpack(buf)
    del buf
    gc.collect()
    assert view.read() == bytes(range(64))
    view.write(bytes(64))
    assert view.read() == bytes(64)
    view.release()
    raises(ValueError, view.read, match="released")


def test_unconsumed_capsules_free_their_buffer():
    need_gpu()
    before = cuda_mem.pool_stats()["used_current"]
    for _ in range(8):
        capsule = cuda_mem.zeros(1 << 24, "uint8", kind="pooled").__dlpack__(max_version=(1, 0))
        del capsule  # the capsule's destructor runs the deleter: device sync, then the free
    gc.collect()
    cuda_mem.synchronize()
    after = cuda_mem.pool_stats()["used_current"]
    assert after <= before + (1 << 24), f"pool use grew from {before} to {after}"


def test_import_checks_dtype_device_and_layout():
    need_gpu()
    buf = cuda_mem.zeros(16, "int32")
    raises(ValueError, cuda_mem.from_dlpack, buf, dtype="float32", match="holds int32, not float32")
    count = cuda_mem.device_count()
    raises(ValueError, cuda_mem.from_dlpack, buf, device=(buf.device + 1) % max(count, 2))
    raises(ValueError, cuda_mem.from_dlpack, buf, device=count, match="does not exist")
    assert cuda_mem.from_dlpack(buf, dtype="int32").dtype == "int32"
    np = need("numpy")
    host = np.arange(16, dtype=np.float32)
    raises(ValueError, cuda_mem.from_dlpack, host, match="not in CUDA device or managed memory")


def test_pinned_memory_reaches_numpy_without_a_copy():
    need_gpu()
    np = need("numpy")
    buf = cuda_mem.from_bytes(floats([1.5, 2.5, 3.5, 4.5, 5.5, 6.5]), "float32", shape=(2, 3), kind="pinned")
    array = np.from_dlpack(buf.with_dl_device((1, 0)))
    assert array.shape == (2, 3) and array.dtype == np.float32
    assert array.tolist() == [[1.5, 2.5, 3.5], [4.5, 5.5, 6.5]]
    array[0, 0] = 9.0
    assert unpack_floats(buf.read())[0] == 9.0, "NumPy wrote the pinned memory itself"


def test_empty_allocates_every_kind_with_its_shape():
    need_gpu()
    for kind in KINDS:
        buf = cuda_mem.empty((3, 4), "float64", kind=kind)
        assert (buf.shape, buf.nbytes, buf.kind) == ((3, 4), 96, kind)
        buf.write(bytes(range(96)))
        assert buf.read() == bytes(range(96))
    assert cuda_mem.empty(0).nbytes == 0
    raises(ValueError, buf.fill_byte, 256, match="byte value 256 is outside 0..=255")
    raises(TypeError, buf.fill_byte, "7", match="a byte value is an int, not str")


def test_a_view_of_a_pooled_buffer_waits_for_its_stream():
    """The capsule carries the buffer's stream to cuda-mem's own import: a blocking read of the
    view waits for a fill still queued on the buffer's stream."""
    need_gpu()
    stream = cuda_mem.Stream()
    for round_ in range(4):
        buf = cuda_mem.zeros(1 << 26, "uint8", kind="pooled", stream=stream)
        buf.fill_byte_async(0x40 + round_)
        view = cuda_mem.from_dlpack(buf, stream=-1)       # no ordering asked of the producer
        data = view.read()
        assert data[0] == data[-1] == 0x40 + round_ and data.count(0x40 + round_) == len(data), round_


def test_buffers_describe_themselves_through_the_cuda_array_interface():
    need_gpu()
    buf = cuda_mem.zeros((2, 3), "int16")
    assert buf.__cuda_array_interface__ == {
        "shape": (2, 3), "typestr": "<i2", "data": (buf.ptr, False), "version": 3, "strides": None, "stream": None,
    }
