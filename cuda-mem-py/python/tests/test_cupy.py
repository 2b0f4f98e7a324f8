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
    stepped = cupy.arange(16, dtype=cupy.float32).reshape(4, 4)[:, ::2]
    view = cuda_mem.from_dlpack(stepped)
    assert (view.shape, view.strides, view.is_contiguous) == ((4, 2), (4, 2), False)
    assert unpack_floats(view.read()) == stepped.get().flatten().tolist()
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


def test_cupy_takes_buffers_through_the_cuda_array_interface():
    cupy = need_cupy()
    buf = cuda_mem.from_bytes(floats([1.0, 2.0, 3.0, 4.0]), "float32", shape=(2, 2))
    interface = buf.__cuda_array_interface__
    assert interface["version"] == 3 and interface["typestr"] == "<f4" and interface["stream"] is None
    a = cupy.asarray(buf)                               # through __cuda_array_interface__, no copy
    assert a.data.ptr == buf.ptr and a.get().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    stream = cuda_mem.Stream()
    pooled = cuda_mem.zeros(1 << 20, "uint8", kind="pooled", stream=stream)
    pooled.fill_byte_async(9)
    assert pooled.__cuda_array_interface__["stream"] == stream.handle
    assert int(cupy.asarray(pooled).sum()) == 9 << 20  # CuPy waits for the stream it names
    assert not hasattr(cuda_mem.zeros(4, kind="pinned"), "__cuda_array_interface__")
    assert not hasattr(cuda_mem.zeros(4, "bfloat16"), "__cuda_array_interface__")
    assert cuda_mem.empty((3, 5), "int16").shape == (3, 5)


def test_cupy_allocates_from_cuda_mems_cache():
    need_cupy()
    import subprocess
    import sys

    from helpers import PACKAGE_ROOT

    # A process of its own: the allocator stays CuPy's for the rest of the process otherwise.
    script = f"""
import sys, json
sys.path.insert(0, {PACKAGE_ROOT!r})
import cupy, cuda_mem.cupy
alloc = cuda_mem.cupy.install()
x = cupy.arange(1 << 20, dtype=cupy.float64)  # sums of integers below 2**53 are exact
with cupy.cuda.Stream(non_blocking=True):
    y = (x * 2).sum()
    value = float(y)
stats = alloc.stats(0)
del x
cuda_mem.cupy.uninstall()
print(json.dumps({{"value": value, "allocated": stats["allocated_current"], "count": stats["alloc_count"],
                  "after": alloc.stats(0)["allocated_current"]}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    import json

    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["value"] == float(sum(range(1 << 20)) * 2), result
    assert result["count"] >= 2 and result["allocated"] >= 8 << 20, result
    assert result["after"] < result["allocated"], result
