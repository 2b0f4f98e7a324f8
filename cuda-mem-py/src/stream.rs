//! `cuda_mem.Stream`: a non-blocking CUDA stream.

use crate::{device_or_current, to_py};
use pyo3::prelude::*;

/// A non-blocking CUDA stream. `handle` is the `cudaStream_t` as an integer, for
/// `torch.cuda.ExternalStream`, `cupy.cuda.ExternalStream` or `__dlpack__(stream=...)`.
#[pyclass(module = "cuda_mem", frozen)]
pub(crate) struct Stream {
    pub(crate) inner: cuda_mem::Stream,
}

#[pymethods]
impl Stream {
    #[new]
    #[pyo3(signature = (device=None))]
    fn new(device: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let device = device_or_current(crate::args::device(device)?)?;
        cuda_mem::Stream::on_device(device).map(|inner| Self { inner }).map_err(to_py)
    }

    /// The `cudaStream_t` as an integer.
    #[getter]
    fn handle(&self) -> usize {
        self.inner.as_raw() as usize
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.inner.device().ordinal()
    }

    /// Blocks until the stream's work has completed.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.synchronize()).map_err(to_py)
    }

    fn __repr__(&self) -> String {
        format!("cuda_mem.Stream(handle={:#x}, device={})", self.handle(), self.device())
    }
}
