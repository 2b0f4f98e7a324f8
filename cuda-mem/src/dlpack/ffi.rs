//! The C structs of the DLPack header (`dlpack.h`, version 1.x), written out from the
//! specification. Field names are the header's, so code reads like the C it meets.

#![allow(non_camel_case_types, non_upper_case_globals)] // the header's spelling

use std::ffi::c_void;

/// The major version this crate produces and accepts.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// The minor version this crate produces: it uses nothing beyond DLPack 1.0.
pub const DLPACK_MINOR_VERSION: u32 = 0;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy for this export.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;

/// `DLDeviceType`, a C enum (an `int` on every ABI cuda-mem supports).
pub type DLDeviceType = i32;
/// `kDLCPU`: host memory.
pub const kDLCPU: DLDeviceType = 1;
/// `kDLCUDA`: CUDA device memory.
pub const kDLCUDA: DLDeviceType = 2;
/// `kDLCUDAHost`: pinned host memory (`cudaMallocHost`).
pub const kDLCUDAHost: DLDeviceType = 3;
/// `kDLROCM`: ROCm device memory.
pub const kDLROCM: DLDeviceType = 10;
/// `kDLCUDAManaged`: CUDA managed memory (`cudaMallocManaged`).
pub const kDLCUDAManaged: DLDeviceType = 13;

/// `DLDataTypeCode` values (stored in `DLDataType::code`, a `uint8_t`).
pub const kDLInt: u8 = 0;
/// Unsigned integers.
pub const kDLUInt: u8 = 1;
/// IEEE floating point.
pub const kDLFloat: u8 = 2;
/// Opaque handles.
pub const kDLOpaqueHandle: u8 = 3;
/// bfloat16.
pub const kDLBfloat: u8 = 4;
/// Complex numbers (two floats).
pub const kDLComplex: u8 = 5;
/// Booleans.
pub const kDLBool: u8 = 6;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLPackVersion {
    /// Incompatible ABI changes bump this.
    pub major: u32,
    /// Compatible additions bump this.
    pub minor: u32,
}

/// `DLDevice`: where the data lives.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDevice {
    /// A `kDL…` device type.
    pub device_type: DLDeviceType,
    /// The device ordinal (0 for host memory).
    pub device_id: i32,
}

/// `DLDataType`: element type code, bits per lane, lanes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDataType {
    /// A `kDL…` type code.
    pub code: u8,
    /// Bits of one lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`: a strided view of typed data.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLTensor {
    /// Base address; the data starts `byte_offset` bytes after it.
    pub data: *mut c_void,
    /// Where `data` lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or null for compact row-major.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensorVersioned`: a tensor with its owner's context and deleter (DLPack 1.x).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The version the producer wrote this struct for.
    pub version: DLPackVersion,
    /// The producer's context, for the deleter.
    pub manager_ctx: *mut c_void,
    /// Releases the tensor; called once by the consumer, with this struct's address.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_…` bits.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// `DLManagedTensor`: the unversioned struct of DLPack before 1.0 (the `"dltensor"` capsule).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context, for the deleter.
    pub manager_ctx: *mut c_void,
    /// Releases the tensor; called once by the consumer, with this struct's address.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[cfg(test)]
mod tests {
    //! Sizes, alignments and field offsets against the header's C layout on LP64 targets
    //! (x86-64 and aarch64 Linux): pointers, `uint64_t` and `int64_t*` are 8 bytes, enums 4.
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn version_device_and_dtype_match_the_c_layout() {
        assert_eq!((size_of::<DLPackVersion>(), align_of::<DLPackVersion>()), (8, 4));
        assert_eq!((offset_of!(DLPackVersion, major), offset_of!(DLPackVersion, minor)), (0, 4));
        assert_eq!((size_of::<DLDevice>(), align_of::<DLDevice>()), (8, 4));
        assert_eq!((offset_of!(DLDevice, device_type), offset_of!(DLDevice, device_id)), (0, 4));
        assert_eq!((size_of::<DLDataType>(), align_of::<DLDataType>()), (4, 2));
        assert_eq!(
            (offset_of!(DLDataType, code), offset_of!(DLDataType, bits), offset_of!(DLDataType, lanes)),
            (0, 1, 2)
        );
    }

    #[test]
    fn tensor_matches_the_c_layout() {
        assert_eq!((size_of::<DLTensor>(), align_of::<DLTensor>()), (48, 8));
        assert_eq!(offset_of!(DLTensor, data), 0);
        assert_eq!(offset_of!(DLTensor, device), 8);
        assert_eq!(offset_of!(DLTensor, ndim), 16);
        assert_eq!(offset_of!(DLTensor, dtype), 20);
        assert_eq!(offset_of!(DLTensor, shape), 24);
        assert_eq!(offset_of!(DLTensor, strides), 32);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);
    }

    #[test]
    fn managed_tensors_match_the_c_layout() {
        assert_eq!((size_of::<DLManagedTensorVersioned>(), align_of::<DLManagedTensorVersioned>()), (80, 8));
        assert_eq!(offset_of!(DLManagedTensorVersioned, version), 0);
        assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
        assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
        assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
        assert_eq!((size_of::<DLManagedTensor>(), align_of::<DLManagedTensor>()), (64, 8));
        assert_eq!(offset_of!(DLManagedTensor, dl_tensor), 0);
        assert_eq!(offset_of!(DLManagedTensor, manager_ctx), 48);
        assert_eq!(offset_of!(DLManagedTensor, deleter), 56);
        // A nullable function pointer is one pointer wide, as in C.
        assert_eq!(size_of::<Option<unsafe extern "C" fn(*mut DLManagedTensor)>>(), 8);
    }

    #[test]
    fn constants_match_the_header() {
        assert_eq!([kDLCPU, kDLCUDA, kDLCUDAHost, kDLROCM, kDLCUDAManaged], [1, 2, 3, 10, 13]);
        assert_eq!([kDLInt, kDLUInt, kDLFloat, kDLOpaqueHandle, kDLBfloat, kDLComplex, kDLBool], [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!((DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_FLAG_BITMASK_IS_COPIED), (1, 2));
    }
}
