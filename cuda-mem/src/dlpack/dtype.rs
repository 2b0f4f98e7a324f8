//! Element types: DLPack's `DLDataType` for the types cuda-mem buffers hold.

use super::ffi::{self, DLDataType};
use super::invalid;
use crate::error::Result;

/// A DLPack element type with one lane (vector types are refused on import).
///
/// ```
/// use cuda_mem::dlpack::DataType;
/// assert_eq!(DataType::from_name("float32"), Some(DataType::F32));
/// assert_eq!(DataType::F32.size(), 4);
/// assert_eq!(DataType::BF16.name(), "bfloat16");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataType {
    /// `int8`
    I8,
    /// `int16`
    I16,
    /// `int32`
    I32,
    /// `int64`
    I64,
    /// `uint8`
    U8,
    /// `uint16`
    U16,
    /// `uint32`
    U32,
    /// `uint64`
    U64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// `float32`
    F32,
    /// `float64`
    F64,
    /// One-byte booleans (0 or 1).
    Bool,
    /// Two `float32`.
    Complex64,
    /// Two `float64`.
    Complex128,
}

/// Every type, for lookups by name or code.
const ALL: [DataType; 15] = [
    DataType::I8,
    DataType::I16,
    DataType::I32,
    DataType::I64,
    DataType::U8,
    DataType::U16,
    DataType::U32,
    DataType::U64,
    DataType::F16,
    DataType::BF16,
    DataType::F32,
    DataType::F64,
    DataType::Bool,
    DataType::Complex64,
    DataType::Complex128,
];

impl DataType {
    /// The DLPack code and bits.
    pub const fn to_dl(self) -> DLDataType {
        let (code, bits) = match self {
            Self::I8 => (ffi::kDLInt, 8),
            Self::I16 => (ffi::kDLInt, 16),
            Self::I32 => (ffi::kDLInt, 32),
            Self::I64 => (ffi::kDLInt, 64),
            Self::U8 => (ffi::kDLUInt, 8),
            Self::U16 => (ffi::kDLUInt, 16),
            Self::U32 => (ffi::kDLUInt, 32),
            Self::U64 => (ffi::kDLUInt, 64),
            Self::F16 => (ffi::kDLFloat, 16),
            Self::BF16 => (ffi::kDLBfloat, 16),
            Self::F32 => (ffi::kDLFloat, 32),
            Self::F64 => (ffi::kDLFloat, 64),
            Self::Bool => (ffi::kDLBool, 8),
            Self::Complex64 => (ffi::kDLComplex, 64),
            Self::Complex128 => (ffi::kDLComplex, 128),
        };
        DLDataType { code, bits, lanes: 1 }
    }

    /// The type a `DLDataType` names, or [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for vector types
    /// (lanes other than 1) and codes or widths this crate does not know.
    pub fn from_dl(dtype: DLDataType) -> Result<Self> {
        if dtype.lanes != 1 {
            return Err(invalid(
                "vector element types (lanes other than 1) are not supported",
                format!("importing a DLPack tensor of {dtype:?}"),
            ));
        }
        ALL.into_iter().find(|t| t.to_dl() == dtype).ok_or_else(|| {
            invalid("an element type cuda-mem does not know", format!("importing a DLPack tensor of {dtype:?}"))
        })
    }

    /// Bytes of one element.
    pub const fn size(self) -> usize {
        self.to_dl().bits as usize / 8
    }

    /// The NumPy name (`"float32"`, `"bfloat16"`, `"complex64"`, `"bool"`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::I8 => "int8",
            Self::I16 => "int16",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::U8 => "uint8",
            Self::U16 => "uint16",
            Self::U32 => "uint32",
            Self::U64 => "uint64",
            Self::F16 => "float16",
            Self::BF16 => "bfloat16",
            Self::F32 => "float32",
            Self::F64 => "float64",
            Self::Bool => "bool",
            Self::Complex64 => "complex64",
            Self::Complex128 => "complex128",
        }
    }

    /// The type with this NumPy name.
    pub fn from_name(name: &str) -> Option<Self> {
        ALL.into_iter().find(|t| t.name() == name)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Element types with a DLPack code: the integers, `f32` and `f64`. Sealed: the export trusts
/// that [`DlpackElement::DTYPE`] describes `Self`'s size exactly.
pub trait DlpackElement: bytemuck::Pod + sealed::Sealed {
    /// The DLPack type of `Self`.
    const DTYPE: DataType;
}

macro_rules! elements {
    ($($t:ty => $d:ident),+) => {$(
        impl sealed::Sealed for $t {}
        impl DlpackElement for $t {
            const DTYPE: DataType = DataType::$d;
        }
    )+};
}

elements!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    f32 => F32, f64 => F64);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn element_types_map_to_their_codes_and_sizes() {
        fn check<T: DlpackElement>(code: u8) {
            let dl = T::DTYPE.to_dl();
            assert_eq!((dl.code, usize::from(dl.bits), dl.lanes), (code, 8 * size_of::<T>(), 1));
            assert_eq!(T::DTYPE.size(), size_of::<T>());
        }
        check::<i8>(ffi::kDLInt);
        check::<i64>(ffi::kDLInt);
        check::<u16>(ffi::kDLUInt);
        check::<u32>(ffi::kDLUInt);
        check::<f32>(ffi::kDLFloat);
        check::<f64>(ffi::kDLFloat);
        assert_eq!(DataType::BF16.to_dl(), DLDataType { code: ffi::kDLBfloat, bits: 16, lanes: 1 });
        assert_eq!(DataType::Complex128.size(), 16);
    }

    #[test]
    fn every_type_round_trips_through_its_code_and_name() {
        for t in ALL {
            assert_eq!(DataType::from_dl(t.to_dl()).unwrap(), t);
            assert_eq!(DataType::from_name(t.name()), Some(t));
        }
        assert_eq!(DataType::from_name("float128"), None);
    }

    #[test]
    fn vector_and_unknown_types_are_refused() {
        let vector = DLDataType { code: ffi::kDLFloat, bits: 32, lanes: 4 };
        let err = DataType::from_dl(vector).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::InvalidArgument("vector element types (lanes other than 1) are not supported")
        );
        for odd in [
            DLDataType { code: ffi::kDLFloat, bits: 24, lanes: 1 },
            DLDataType { code: ffi::kDLOpaqueHandle, bits: 64, lanes: 1 },
            DLDataType { code: 200, bits: 8, lanes: 1 },
        ] {
            let err = DataType::from_dl(odd).unwrap_err();
            assert_eq!(err.kind(), &ErrorKind::InvalidArgument("an element type cuda-mem does not know"), "{odd:?}");
        }
    }
}
