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

/// The CUDA Array Interface's (NumPy's) typestr of `dtype`, little-endian; None for bfloat16,
/// which has none.
pub(crate) fn typestr(dtype: DataType) -> Option<&'static str> {
    Some(match dtype {
        DataType::I8 => "|i1",
        DataType::I16 => "<i2",
        DataType::I32 => "<i4",
        DataType::I64 => "<i8",
        DataType::U8 => "|u1",
        DataType::U16 => "<u2",
        DataType::U32 => "<u4",
        DataType::U64 => "<u8",
        DataType::F16 => "<f2",
        DataType::F32 => "<f4",
        DataType::F64 => "<f8",
        DataType::Bool => "|b1",
        DataType::Complex64 => "<c8",
        DataType::Complex128 => "<c16",
        _ => return None,
    })
}
