//! `cuda_mem`, the Python module: cuda-mem buffers (device, managed, pinned, and stream-ordered
//! from the retaining pool) that PyTorch, CuPy, JAX and NumPy take without a copy through
//! DLPack (`__dlpack__`, `__dlpack_device__`), and `from_dlpack` for their tensors.
//!
//! Built by maturin into the `cuda_mem` package as `cuda_mem._cuda_mem` (`cargo xtask wheel`;
//! docs/python.md); `cuda_mem/__init__.py` re-exports it.

mod args;
mod buffer;
mod capsule;
mod dtype;
mod stream;
mod view;

use cuda_mem::{CudaError, Device, ErrorKind, MemPool};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pyo3::create_exception!(
    cuda_mem,
    CudaRuntimeError,
    PyRuntimeError,
    "A CUDA call failed (the message says which, and why)."
);

pyo3::create_exception!(
    cuda_mem,
    NoDriverError,
    CudaRuntimeError,
    "The machine has no NVIDIA driver (libcuda.so.1 could not be loaded): no GPU can be used."
);

/// The Python exception for a cuda-mem error: `ValueError` for bad arguments,
/// `cuda_mem.NoDriverError` where no driver exists, else `cuda_mem.CudaRuntimeError`.
pub(crate) fn to_py(err: CudaError) -> PyErr {
    if err.is_no_driver() {
        return NoDriverError::new_err(err.to_string());
    }
    match err.kind() {
        ErrorKind::InvalidArgument(_)
        | ErrorKind::InvalidDevice { .. }
        | ErrorKind::SizeOverflow { .. }
        | ErrorKind::LengthMismatch { .. } => PyValueError::new_err(err.to_string()),
        _ => CudaRuntimeError::new_err(err.to_string()),
    }
}

/// The device with this ordinal, or the current one.
pub(crate) fn device_or_current(ordinal: Option<usize>) -> PyResult<Device> {
    match ordinal {
        Some(ordinal) => Device::new(ordinal).map_err(to_py),
        None => Device::current().map_err(to_py),
    }
}

/// Number of CUDA devices.
#[pyfunction]
fn device_count() -> PyResult<usize> {
    Device::count().map_err(to_py)
}

/// Blocks until all work queued on the device has completed (`cudaDeviceSynchronize`).
#[pyfunction]
#[pyo3(signature = (device=None))]
fn synchronize(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let device = device_or_current(args::device(device)?)?;
    py.detach(|| device.synchronize()).map_err(to_py)
}

/// Reserved and used bytes (current and high-water) of cuda-mem's retaining pool of a device,
/// the pool `kind="pooled"` buffers come from.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn pool_stats<'py>(py: Python<'py>, device: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyDict>> {
    let stats =
        MemPool::retaining(device_or_current(args::device(device)?)?).and_then(|pool| pool.stats()).map_err(to_py)?;
    let dict = PyDict::new(py);
    dict.set_item("reserved_current", stats.reserved_current)?;
    dict.set_item("reserved_high", stats.reserved_high)?;
    dict.set_item("used_current", stats.used_current)?;
    dict.set_item("used_high", stats.used_high)?;
    Ok(dict)
}

#[pymodule]
#[pyo3(name = "_cuda_mem")]
fn cuda_mem_py(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CudaRuntimeError", m.py().get_type::<CudaRuntimeError>())?;
    m.add("NoDriverError", m.py().get_type::<NoDriverError>())?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(buffer::zeros, m)?)?;
    m.add_function(wrap_pyfunction!(buffer::empty, m)?)?;
    m.add_function(wrap_pyfunction!(buffer::from_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(view::from_dlpack, m)?)?;
    m.add_class::<buffer::Buffer>()?;
    m.add_class::<view::View>()?;
    m.add_class::<stream::Stream>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
