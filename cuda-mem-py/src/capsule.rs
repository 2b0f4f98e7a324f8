//! DLPack capsules: `"dltensor_versioned"` (DLPack 1.x) and the legacy `"dltensor"`. A consumer
//! takes the tensor by renaming the capsule to `"used_…"`; only an unconsumed capsule calls the
//! tensor's deleter when it is destroyed.

use crate::to_py;
use cuda_mem::dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use cuda_mem::dlpack::{DlpackImport, DlpackTensor};
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{CStr, c_void};

const VERSIONED: &CStr = c"dltensor_versioned";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_LEGACY: &CStr = c"used_dltensor";

/// Destroys a versioned capsule: releases the tensor unless a consumer took it.
///
/// # Safety
/// Called by Python with a capsule this module made, holding the GIL.
unsafe extern "C" fn destroy_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: a live capsule; a consumed one was renamed, so `IsValid` is false and the tensor
    // is the consumer's. An unconsumed one holds our export, whose deleter has not run.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let tensor = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr()).cast::<DLManagedTensorVersioned>();
            if let Some(deleter) = (*tensor).deleter {
                deleter(tensor);
            }
        }
    }
}

/// As [`destroy_versioned`], for the legacy capsule.
///
/// # Safety
/// As for [`destroy_versioned`].
unsafe extern "C" fn destroy_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_versioned`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let tensor = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if let Some(deleter) = (*tensor).deleter {
                deleter(tensor);
            }
        }
    }
}

/// A capsule holding `tensor`, versioned or legacy.
pub(crate) fn export<'py>(py: Python<'py>, tensor: DlpackTensor<'static>, legacy: bool) -> PyResult<Bound<'py, PyAny>> {
    let (pointer, name, destructor): (*mut c_void, &CStr, ffi::PyCapsule_Destructor) = if legacy {
        (tensor.into_raw_legacy().map_err(to_py)?.cast(), LEGACY, destroy_legacy)
    } else {
        (tensor.into_raw().cast(), VERSIONED, destroy_versioned)
    };
    // SAFETY: a non-null pointer, a static name, and a destructor for that name.
    let capsule = unsafe { ffi::PyCapsule_New(pointer, name.as_ptr(), Some(destructor)) };
    if capsule.is_null() {
        // Python could not make the capsule: release the tensor here.
        // SAFETY: our export, whose deleter has not run; no capsule holds it.
        unsafe {
            if legacy {
                let tensor = pointer.cast::<DLManagedTensor>();
                if let Some(deleter) = (*tensor).deleter {
                    deleter(tensor);
                }
            } else {
                let tensor = pointer.cast::<DLManagedTensorVersioned>();
                if let Some(deleter) = (*tensor).deleter {
                    deleter(tensor);
                }
            }
        }
    }
    // SAFETY: a new reference, or null with the Python error set.
    unsafe { Bound::from_owned_ptr_or_err(py, capsule) }
}

/// Takes the tensor out of a producer's capsule: marks the capsule used, then checks and holds
/// the tensor (released on error by `DlpackImport`).
///
/// Anything else than an unconsumed capsule of those names is a `TypeError`; the tensor's
/// description (version, null pointers, dtype, shape, strides, sizes) is checked by
/// `DlpackImport`. What cannot be checked is the name's promise: a capsule named `"dltensor"` or
/// `"dltensor_versioned"` holds a live tensor of its producer, as the DLPack protocol requires
/// (making one with another pointer takes `ctypes.pythonapi`, which can write any memory
/// already).
pub(crate) fn take(capsule: &Bound<'_, PyAny>) -> PyResult<DlpackImport> {
    let object = capsule.as_ptr();
    // SAFETY: `IsValid` accepts any object; a valid capsule's pointer is the producer's tensor,
    // whose ownership passes to us when we rename the capsule (its destructor then leaves it).
    unsafe {
        if ffi::PyCapsule_IsValid(object, VERSIONED.as_ptr()) == 1 {
            let tensor = ffi::PyCapsule_GetPointer(object, VERSIONED.as_ptr());
            if tensor.is_null() || ffi::PyCapsule_SetName(object, USED_VERSIONED.as_ptr()) != 0 {
                return Err(PyErr::fetch(capsule.py()));
            }
            return DlpackImport::from_raw(tensor.cast()).map_err(to_py);
        }
        if ffi::PyCapsule_IsValid(object, LEGACY.as_ptr()) == 1 {
            let tensor = ffi::PyCapsule_GetPointer(object, LEGACY.as_ptr());
            if tensor.is_null() || ffi::PyCapsule_SetName(object, USED_LEGACY.as_ptr()) != 0 {
                return Err(PyErr::fetch(capsule.py()));
            }
            return DlpackImport::from_raw_legacy(tensor.cast()).map_err(to_py);
        }
    }
    Err(PyTypeError::new_err("expected an unconsumed DLPack capsule (named \"dltensor_versioned\" or \"dltensor\")"))
}
