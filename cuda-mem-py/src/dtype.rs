//! Element types and shapes as Python spells them.

use cuda_mem::dlpack::DataType;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The type named `name` (`"float32"`, `"uint8"`, `"bfloat16"`, ...).
pub(crate) fn parse(name: &str) -> PyResult<DataType> {
    DataType::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown dtype {name:?}: use int8..int64, uint8..uint64, float16, bfloat16, float32, float64, bool, \
             complex64 or complex128"
        ))
    })
}

/// The element count of `shape`, or a `ValueError` when it overflows.
pub(crate) fn elements(shape: &[usize]) -> PyResult<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| PyValueError::new_err(format!("the shape {shape:?} has more elements than fit in memory")))
}

/// The byte count of `shape` elements of `dtype`.
pub(crate) fn bytes(shape: &[usize], dtype: DataType) -> PyResult<usize> {
    elements(shape)?
        .checked_mul(dtype.size())
        .ok_or_else(|| PyValueError::new_err(format!("{shape:?} elements of {} overflow", dtype.name())))
}
