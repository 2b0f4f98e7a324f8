"""CuPy and cuda_mem through DLPack."""
import cuda_mem
from helpers import floats, need_cupy, raises, unpack_floats


def test_cupy_takes_device_managed_and_pooled_buffers():
    cupy = need_cupy()
    values = [float(i) / 4 for i in range(12)]
    for kind in ("device", "pooled", "managed"):
        buf = cuda_mem.from_bytes(floats(values), "float32", shape=(4, 3), kind=kind)
        source = buf if kind != "managed" else buf.with_dl_device((2, buf.device))
        a = cupy.from_dlpack(source)
        assert a.shape == (4, 3) and a.dtype == cupy.float32 and a.data.ptr == buf.ptr, kind
        assert a.ravel().get().tolist() == values, kind
        a += 1
        cupy.cuda.runtime.deviceSynchronize()
        assert unpack_floats(buf.read()) == [v + 1 for v in values], kind


def test_cupy_takes_managed_memory_as_managed():
    cupy = need_cupy()
    buf = cuda_mem.from_bytes(floats([7.0, 8.0]), "float32", kind="managed")
    assert buf.__dlpack_device__() == (13, buf.device)
    a = cupy.from_dlpack(buf)  # kDLCUDAManaged
    assert a.data.ptr == buf.ptr and a.get().tolist() == [7.0, 8.0]


def test_a_cupy_array_becomes_a_cuda_mem_view():
    cupy = need_cupy()
    a = cupy.arange(10, dtype=cupy.int64)
    view = cuda_mem.from_dlpack(a)
    assert (view.shape, view.dtype, view.ptr) == ((10,), "int64", a.data.ptr)
    assert view.read() == b"".join(i.to_bytes(8, "little") for i in range(10))
    view.write(bytes(80))
    cupy.cuda.runtime.deviceSynchronize()
    assert a.get().tolist() == [0] * 10
    raises(ValueError, cuda_mem.from_dlpack, cupy.zeros((4, 4))[:, ::2], match="non-contiguous")
    raises(ValueError, cuda_mem.from_dlpack, a, dtype="float64", match="holds int64")


def test_cupy_reads_after_the_producers_pending_work():
    cupy = need_cupy()
    stream = cuda_mem.Stream()
    spin = cupy.RawKernel(
        r"""extern "C" __global__ void spin(long long cycles) {
            long long start = clock64();
            while (clock64() - start < cycles) {}
        }""",
        "spin",
    )
    for round_ in range(4):
        value = 0x70 + round_
        buf = cuda_mem.zeros(1 << 24, "uint8", kind="pooled", stream=stream)
        with cupy.cuda.ExternalStream(stream.handle):
            spin((1,), (1,), (cupy.int64(100_000_000),))
        buf.fill_byte_async(value)
        consumer = cupy.cuda.Stream(non_blocking=True)
        with consumer:
            ok = bool((cupy.from_dlpack(buf) == value).all())
        assert ok, f"round {round_}: cupy read before the producer's fill"
