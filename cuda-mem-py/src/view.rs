//! `cuda_mem.from_dlpack` and `cuda_mem.View`: another library's tensor held by cuda-mem.

use crate::{capsule, to_py};
use cuda_mem::Device;
use cuda_mem::dlpack::DlpackImport;
use cuda_mem::dlpack::ffi::{kDLCUDA, kDLCUDAManaged};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

/// A DLPack tensor of another library (PyTorch, CuPy, JAX, ...) in CUDA device or managed memory,
/// held by cuda-mem without a copy. The producer's deleter runs when the view is released
/// (`release()`, or garbage collection).
#[pyclass(module = "cuda_mem")]
pub(crate) struct View {
    import: Option<DlpackImport>,
    device: Device,
}

impl View {
    fn import(&self) -> PyResult<&DlpackImport> {
        self.import.as_ref().ok_or_else(|| PyValueError::new_err("the view was released"))
    }
}

/// Takes `obj` (any object with `__dlpack__`, or a DLPack capsule) as a `View`, whatever its
/// strides (compact tensors are viewed in place; others are read and written element by element). For CUDA memory
/// the producer orders `stream` (default 1: the legacy default stream, which the view's blocking
/// copies use) after its pending work; `stream` goes to the producer's `__dlpack__` as given, so a
/// handle above 2 must be a live stream of the tensor's device. With `dtype` or `device`, a tensor
/// of another element type or device is refused with `ValueError`. A capsule is trusted to hold
/// what its name says (see `capsule::take`).
#[pyfunction]
#[pyo3(signature = (obj, *, stream=None, dtype=None, device=None))]
pub(crate) fn from_dlpack(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    stream: Option<i64>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<View> {
    let wanted_dtype = dtype.map(crate::args::dtype).transpose()?;
    let device = crate::args::device(device)?;
    let capsule = if obj.hasattr("__dlpack__")? { call_dlpack(py, obj, stream)? } else { obj.clone() };
    let import = capsule::take(&capsule)?;
    if let Some(wanted) = wanted_dtype
        && wanted != import.dtype()
    {
        return Err(PyValueError::new_err(format!(
            "the tensor holds {}, not {}",
            import.dtype().name(),
            wanted.name()
        )));
    }
    let dl_device = import.device();
    if dl_device.device_type != kDLCUDA && dl_device.device_type != kDLCUDAManaged {
        return Err(PyValueError::new_err(format!(
            "the tensor is not in CUDA device or managed memory (DLPack device type {}); cuda_mem views \
             device memory",
            dl_device.device_type
        )));
    }
    let ordinal = match device {
        Some(ordinal) => ordinal,
        None => usize::try_from(dl_device.device_id).unwrap_or(usize::MAX),
    };
    let device = Device::new(ordinal).map_err(to_py)?;
    // Checks the ordinal against `device` now, before any use.
    import.check_device(device).map_err(to_py)?;
    Ok(View { import: Some(import), device })
}

/// `obj.__dlpack__(stream=…, max_version=(1, 0))`, or without `max_version` for producers that
/// predate it.
fn call_dlpack<'py>(py: Python<'py>, obj: &Bound<'py, PyAny>, stream: Option<i64>) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = PyDict::new(py);
    if obj.hasattr("__dlpack_device__")? {
        let (device_type, _) = obj.call_method0("__dlpack_device__")?.extract::<(i32, i32)>()?;
        if device_type == kDLCUDA || device_type == kDLCUDAManaged {
            kwargs.set_item("stream", stream.unwrap_or(1))?;
        }
    }
    kwargs.set_item("max_version", (1, 0))?;
    match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Err(err) if err.is_instance_of::<PyTypeError>(py) => {
            kwargs.del_item("max_version")?;
            obj.call_method("__dlpack__", (), Some(&kwargs))
        }
        result => result,
    }
}

#[pymethods]
impl View {
    /// The extents.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.import()?.shape())
    }

    /// The strides, in elements (the row-major ones when the producer gave none).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.import()?.strides())
    }

    /// True for a compact row-major tensor; a strided one (a transpose, a slice with a step) is
    /// read and written element by element.
    #[getter]
    fn is_contiguous(&self) -> PyResult<bool> {
        Ok(self.import()?.is_compact())
    }

    /// The element type's name.
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        Ok(self.import()?.dtype().name())
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> PyResult<usize> {
        Ok(self.import()?.size_bytes())
    }

    /// `(device_type, device_id)` as the producer named it.
    #[getter]
    fn dl_device(&self) -> PyResult<(i32, i32)> {
        let device = self.import()?.device();
        Ok((device.device_type, device.device_id))
    }

    /// The address of the first element.
    #[getter]
    fn ptr(&self) -> PyResult<usize> {
        Ok(self.import()?.data_ptr() as usize)
    }

    /// True when the producer marked the tensor read-only.
    #[getter]
    fn read_only(&self) -> PyResult<bool> {
        Ok(self.import()?.is_read_only())
    }

    /// A copy of the elements' bytes, row-major whatever the strides (blocking copies on the
    /// legacy default stream, after the producer's stream when it is a cuda-mem buffer's).
    fn read<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let (import, device) = (self.import()?, self.device);
        let bytes = py.detach(|| import.read_bytes(device)).map_err(to_py)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Overwrites the elements with `data` (`bytes` of `nbytes`, row-major whatever the
    /// strides; blocking). Refused for read-only tensors.
    fn write(&mut self, py: Python<'_>, data: &Bound<'_, PyBytes>) -> PyResult<()> {
        let device = self.device;
        let import = self.import.as_mut().ok_or_else(|| PyValueError::new_err("the view was released"))?;
        let bytes = data.as_bytes();
        py.detach(|| import.write_bytes(device, bytes)).map_err(to_py)
    }

    /// Calls the producer's deleter now; the view is unusable afterwards.
    fn release(&mut self) {
        self.import = None;
    }

    fn __repr__(&self) -> String {
        match &self.import {
            Some(import) => format!(
                "cuda_mem.View(shape={:?}, dtype={}, dl_device={:?}, ptr={:p})",
                import.shape(),
                import.dtype().name(),
                (import.device().device_type, import.device().device_id),
                import.data_ptr()
            ),
            None => "cuda_mem.View(released)".into(),
        }
    }
}
