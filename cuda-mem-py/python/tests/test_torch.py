"""PyTorch and cuda_mem through DLPack, both ways, with values checked and the stream contract."""
import cuda_mem
from helpers import SLEEP_CYCLES, floats, need_torch_cuda, raises, unpack_floats


def test_torch_takes_device_and_pooled_buffers_without_a_copy():
    torch = need_torch_cuda()
    values = [float(i) - 3.25 for i in range(12)]
    for kind in ("device", "pooled"):
        buf = cuda_mem.from_bytes(floats(values), "float32", shape=(3, 4), kind=kind)
        t = torch.from_dlpack(buf)
        assert t.is_cuda and t.device.index == buf.device, kind
        assert t.shape == (3, 4) and t.dtype == torch.float32 and t.data_ptr() == buf.ptr, kind
        assert t.cpu().flatten().tolist() == values, kind
        t.mul_(2)  # torch writes the cuda-mem memory itself
        torch.cuda.synchronize()
        assert unpack_floats(buf.read()) == [2 * v for v in values], kind


def test_torch_dtypes_map_both_ways():
    torch = need_torch_cuda()
    pairs = {
        "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
        "uint8": torch.uint8, "float16": torch.float16, "bfloat16": torch.bfloat16,
        "float32": torch.float32, "float64": torch.float64, "bool": torch.bool,
        "complex64": torch.complex64,
    }
    for name, dtype in pairs.items():
        buf = cuda_mem.zeros((2, 5), name)
        t = torch.from_dlpack(buf)
        assert t.dtype == dtype and t.shape == (2, 5), name
        back = cuda_mem.from_dlpack(torch.ones((5, 2), dtype=dtype, device="cuda"))
        assert back.dtype == name and back.shape == (5, 2), name


def test_torch_managed_and_pinned_buffers_as_cuda_and_cpu_tensors():
    torch = need_torch_cuda()
    managed = cuda_mem.from_bytes(floats([1.0, 2.0, 3.0]), "float32", kind="managed")
    t = torch.from_dlpack(managed.with_dl_device((2, managed.device)))
    assert t.is_cuda and t.cpu().tolist() == [1.0, 2.0, 3.0]
    pinned = cuda_mem.from_bytes(floats([4.0, 5.0]), "float32", kind="pinned")
    h = torch.from_dlpack(pinned.with_dl_device((1, 0)))
    assert h.device.type == "cpu" and h.tolist() == [4.0, 5.0] and h.data_ptr() == pinned.ptr


def test_a_torch_tensor_becomes_a_cuda_mem_view():
    torch = need_torch_cuda()
    t = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6)
    view = cuda_mem.from_dlpack(t)
    assert (view.shape, view.dtype, view.ptr) == ((4, 6), "float32", t.data_ptr())
    assert view.dl_device == (2, t.device.index)
    assert unpack_floats(view.read()) == [float(i) for i in range(24)]
    view.write(floats([-1.0] * 24))
    torch.cuda.synchronize()
    assert t.flatten().tolist() == [-1.0] * 24, "the view wrote torch's memory"
    del t
    assert unpack_floats(view.read()) == [-1.0] * 24, "the view keeps the tensor's memory"
    view.release()


def test_torch_round_trip_keeps_the_values():
    torch = need_torch_cuda()
    t = torch.randn(1000, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    back = torch.from_dlpack(cuda_mem.from_bytes(cuda_mem.from_dlpack(t).read(), "float32"))
    assert torch.equal(back, t)


def test_strided_torch_tensors_are_read_and_written_element_by_element():
    torch = need_torch_cuda()
    x = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6)
    for strided in (x.t(), x[:, ::2], x[1:, 1::3], x.unsqueeze(0).expand(3, 4, 6)[:, :, 2]):
        view = cuda_mem.from_dlpack(strided)
        assert view.shape == tuple(strided.shape) and view.strides == tuple(strided.stride())
        assert not view.is_contiguous
        assert unpack_floats(view.read()) == strided.flatten().tolist(), strided.stride()
    y = torch.zeros(4, 6, device="cuda")
    view = cuda_mem.from_dlpack(y.t())
    view.write(floats([float(i) for i in range(24)]))
    torch.cuda.synchronize()
    assert y.t().flatten().tolist() == [float(i) for i in range(24)]
    assert cuda_mem.from_dlpack(x).is_contiguous


def test_torch_tensors_cuda_mem_cannot_view_are_refused():
    torch = need_torch_cuda()
    raises(ValueError, cuda_mem.from_dlpack, torch.zeros(4), match="not in CUDA device or managed memory")
    raises(ValueError, cuda_mem.from_dlpack, torch.zeros(4, device="cuda"), dtype="int32", match="holds float32")


def test_torch_reads_after_the_producers_pending_work():
    """cuda_mem produces: a long kernel, then a fill, both pending on the buffer's stream; torch
    consumes on its own stream after `__dlpack__(stream=its stream)` and sees the fill."""
    torch = need_torch_cuda()
    stream = cuda_mem.Stream()
    on_producer = torch.cuda.ExternalStream(stream.handle)
    for round_ in range(4):
        value = 0x50 + round_
        buf = cuda_mem.zeros(1 << 24, "uint8", kind="pooled", stream=stream)
        with torch.cuda.stream(on_producer):
            torch.cuda._sleep(SLEEP_CYCLES)  # pending on the producer's stream
        buf.fill_byte_async(value)  # after the sleep, on the same stream
        consumer = torch.cuda.Stream()
        with torch.cuda.stream(consumer):
            t = torch.from_dlpack(buf)  # torch passes consumer's handle as `stream`
            ok = bool((t == value).all())  # runs on `consumer`
        assert ok, f"round {round_}: torch read before the producer's fill"
        ok = bool((torch.from_dlpack(buf) == value).all())  # default stream: stream=1 path
        assert ok, f"round {round_}: the legacy stream read before the fill"
        # Releasing the export waits for the device: done here, not while the next round's
        # work is pending (which would order it by accident).
        del t
        torch.cuda.synchronize()


def test_cuda_mem_reads_after_torchs_pending_work():
    """torch produces on a side stream (a long kernel, then a fill); cuda_mem's view reads on
    the legacy stream, which torch orders after the side stream through `__dlpack__(stream=1)`."""
    torch = need_torch_cuda()
    side = torch.cuda.Stream()
    for round_ in range(4):
        value = 0x60 + round_
        t = torch.zeros(1 << 24, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            t.fill_(value)
            view = cuda_mem.from_dlpack(t)
            data = view.read()
        assert data == bytes([value]) * (1 << 24), f"round {round_}: the view read before torch's fill"
        torch.cuda.synchronize()
