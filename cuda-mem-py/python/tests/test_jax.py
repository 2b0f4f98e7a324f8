"""JAX and cuda_mem through DLPack."""
import cuda_mem
from helpers import floats, need, need_jax_gpu, unpack_floats


def _from_dlpack(jax, obj):
    jnp = need("jax.numpy")
    if hasattr(jnp, "from_dlpack"):
        return jnp.from_dlpack(obj)
    return jax.dlpack.from_dlpack(obj)


def test_jax_takes_device_and_pooled_buffers():
    jax = need_jax_gpu()
    values = [float(i) * 1.5 for i in range(16)]
    for kind in ("device", "pooled"):
        buf = cuda_mem.from_bytes(floats(values), "float32", shape=(4, 4), kind=kind)
        a = _from_dlpack(jax, buf)
        assert a.shape == (4, 4) and str(a.dtype) == "float32", kind
        assert a.ravel().tolist() == values, kind
        assert (a * 2).ravel().tolist() == [2 * v for v in values], kind


def test_jax_dlpack_from_dlpack_takes_a_buffer():
    jax = need_jax_gpu()
    buf = cuda_mem.from_bytes(floats([1.0, 2.0, 3.0]), "float32")
    a = jax.dlpack.from_dlpack(buf)
    assert a.tolist() == [1.0, 2.0, 3.0]


def test_a_jax_array_becomes_a_cuda_mem_view():
    jax = need_jax_gpu()
    jnp = need("jax.numpy")
    a = jnp.arange(12, dtype=jnp.float32).reshape(3, 4) + 0.5
    a.block_until_ready()
    view = cuda_mem.from_dlpack(a)
    assert (view.shape, view.dtype) == ((3, 4), "float32")
    assert unpack_floats(view.read()) == [i + 0.5 for i in range(12)]
    del a
    assert len(view.read()) == 48
