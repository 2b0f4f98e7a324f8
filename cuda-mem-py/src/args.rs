//! Arguments as Python users write them, checked before any CUDA call: a wrong type is
//! `TypeError`, a wrong value `ValueError`, each with a message that names the argument.

use crate::dtype;
use cuda_mem::dlpack::{DLDevice, DataType, MAX_NDIM};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyString};

/// One extent: a non-negative int (or an object with `__index__`, such as a NumPy integer).
fn extent(item: &Bound<'_, PyAny>, shape: &Bound<'_, PyAny>) -> PyResult<usize> {
    if item.is_instance_of::<PyBool>() || item.is_instance_of::<PyFloat>() {
        return Err(PyTypeError::new_err(format!(
            "shape {}: extents are ints, not {}",
            shape.repr()?,
            item.get_type().name()?
        )));
    }
    match item.extract::<i64>() {
        Ok(n) if n < 0 => {
            Err(PyValueError::new_err(format!("shape {}: extents are non-negative (got {n})", shape.repr()?)))
        }
        // Non-negative, and usize is 64 bits on the platforms CUDA supports.
        Ok(n) => Ok(n as usize),
        Err(err) if err.is_instance_of::<PyOverflowError>(item.py()) => Err(PyValueError::new_err(format!(
            "shape {}: extent {} is larger than any memory",
            shape.repr()?,
            item.repr()?
        ))),
        Err(_) => Err(PyTypeError::new_err(format!(
            "shape {}: extents are ints, not {}",
            shape.repr()?,
            item.get_type().name()?
        ))),
    }
}

/// A shape given as an int or a sequence of ints (a tuple, a list, `torch.Size`, ...).
pub(crate) fn shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let scalar = !shape.is_instance_of::<PyString>()
        && !shape.is_instance_of::<PyBytes>()
        && (shape.hasattr("__index__")? || shape.is_instance_of::<PyFloat>());
    if scalar {
        return Ok(vec![extent(shape, shape)?]);
    }
    let items = match shape.try_iter() {
        Ok(items) if !shape.is_instance_of::<PyString>() && !shape.is_instance_of::<PyBytes>() => items,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "shape is an int or a sequence of ints, not {}",
                shape.get_type().name()?
            )));
        }
    };
    // Read no further than one extent too many: an endless iterator must not grow the vector
    // until the process runs out of memory (an abort).
    let extents = items.take(MAX_NDIM + 1).map(|item| extent(&item?, shape)).collect::<PyResult<Vec<usize>>>()?;
    if extents.len() > MAX_NDIM {
        return Err(PyValueError::new_err(format!(
            "shape of more than {MAX_NDIM} dimensions: at most {MAX_NDIM} are supported"
        )));
    }
    Ok(extents)
}

/// An element type: a name (`"float32"`), a NumPy dtype or scalar type, or a PyTorch dtype
/// (`torch.float32`).
pub(crate) fn dtype(dtype: &Bound<'_, PyAny>) -> PyResult<DataType> {
    if let Ok(name) = dtype.cast::<PyString>() {
        return dtype::parse(&name.to_cow()?);
    }
    // A NumPy dtype has `.name`; a NumPy scalar type (`numpy.float32`) `__name__`; a PyTorch
    // dtype prints as "torch.float32".
    for attr in ["name", "__name__"] {
        if let Ok(name) = dtype.getattr(attr)
            && let Ok(name) = name.extract::<String>()
            && let Some(parsed) = DataType::from_name(&name)
        {
            return Ok(parsed);
        }
    }
    let printed = dtype.str()?.to_string();
    match printed.strip_prefix("torch.").and_then(DataType::from_name) {
        Some(parsed) => Ok(parsed),
        None => dtype::parse(&printed),
    }
}

/// A CUDA device: an ordinal (a non-negative int), `"cuda"` (the current device) or
/// `"cuda:N"`, a `torch.device` of type `"cuda"`, or a CuPy or JAX GPU device (their `id`).
/// `None` means the current device.
pub(crate) fn device(device: Option<&Bound<'_, PyAny>>) -> PyResult<Option<usize>> {
    let Some(device) = device else { return Ok(None) };
    if device.is_none() {
        return Ok(None);
    }
    if device.is_instance_of::<PyBool>() {
        return Err(not_a_device(device));
    }
    if device.hasattr("__index__")? {
        return ordinal(device);
    }
    if let Ok(name) = device.cast::<PyString>() {
        return match name.to_cow()?.as_ref() {
            "cuda" => Ok(None),
            text => match text.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Some(n)),
                _ => Err(PyValueError::new_err(format!("device {text:?}: use \"cuda\", \"cuda:N\" or an ordinal"))),
            },
        };
    }
    // torch.device: `type` and `index` (None: the current device).
    if let (Ok(kind), Ok(index)) = (device.getattr("type"), device.getattr("index"))
        && let Ok(kind) = kind.extract::<String>()
    {
        if kind != "cuda" {
            return Err(PyValueError::new_err(format!("device {}: not a CUDA device", device.repr()?)));
        }
        return if index.is_none() { Ok(None) } else { ordinal(&index) };
    }
    // CuPy's `cupy.cuda.Device` and JAX's devices: `id` (JAX's also say their `platform`).
    if let Ok(id) = device.getattr("id") {
        if let Ok(platform) = device.getattr("platform")
            && platform.extract::<String>().is_ok_and(|p| p != "gpu" && p != "cuda")
        {
            return Err(PyValueError::new_err(format!("device {}: not a CUDA device", device.repr()?)));
        }
        if id.hasattr("__index__")? && !id.is_instance_of::<PyBool>() {
            return ordinal(&id);
        }
    }
    Err(not_a_device(device))
}

fn ordinal(value: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    match value.extract::<i64>() {
        Ok(n) if n >= 0 => Ok(Some(n as usize)),
        Ok(_) => Err(PyValueError::new_err(format!("device {}: ordinals are non-negative", value.repr()?))),
        Err(_) => Err(PyValueError::new_err(format!("device {}: no such ordinal", value.repr()?))),
    }
}

fn not_a_device(device: &Bound<'_, PyAny>) -> PyErr {
    let type_name = device.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    PyTypeError::new_err(format!(
        "device is an ordinal (int), \"cuda\" or \"cuda:N\", a torch.device or a CuPy/JAX device, not {type_name}"
    ))
}

/// A DLPack `(device_type, device_id)` pair, each an int32.
pub(crate) fn dl_device((device_type, device_id): (i64, i64)) -> PyResult<DLDevice> {
    match (i32::try_from(device_type), i32::try_from(device_id)) {
        (Ok(device_type), Ok(device_id)) => Ok(DLDevice { device_type, device_id }),
        _ => Err(PyValueError::new_err(format!("dl_device ({device_type}, {device_id}): both are int32 values"))),
    }
}

/// A byte value: an int in 0..=255.
pub(crate) fn byte(value: &Bound<'_, PyAny>) -> PyResult<u8> {
    if value.is_instance_of::<PyBool>() || !value.hasattr("__index__")? {
        return Err(PyTypeError::new_err(format!("a byte value is an int, not {}", value.get_type().name()?)));
    }
    match value.extract::<i64>() {
        Ok(n) if (0..=255).contains(&n) => Ok(n as u8),
        _ => Err(PyValueError::new_err(format!("byte value {} is outside 0..=255", value.repr()?))),
    }
}

/// The allocation kinds `zeros` and `empty` know.
pub(crate) const KINDS: [&str; 5] = ["device", "managed", "pinned", "pooled", "cached"];

/// Checks `kind` against [`KINDS`].
pub(crate) fn kind(kind: &str) -> PyResult<&'static str> {
    KINDS.into_iter().find(|k| *k == kind).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown kind {kind:?}: use \"device\", \"managed\", \"pinned\", \"pooled\" or \"cached\""
        ))
    })
}
