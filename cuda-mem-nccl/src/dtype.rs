//! Element types and reduction operations, as NCCL numbers them (`ncclDataType_t`,
//! `ncclRedOp_t`). The data type comes from the element type, so a buffer of `f32` can only be
//! reduced as `ncclFloat32`.

use cuda_mem::Pod;
use std::ffi::c_int;

/// `ncclDataType_t` values of the element types this crate reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `ncclInt8`.
    Int8,
    /// `ncclUint8`.
    Uint8,
    /// `ncclInt32`.
    Int32,
    /// `ncclUint32`.
    Uint32,
    /// `ncclInt64`.
    Int64,
    /// `ncclUint64`.
    Uint64,
    /// `ncclFloat32`.
    Float32,
    /// `ncclFloat64`.
    Float64,
}

impl DataType {
    /// The value in nccl.h.
    pub fn code(self) -> c_int {
        match self {
            Self::Int8 => 0,
            Self::Uint8 => 1,
            Self::Int32 => 2,
            Self::Uint32 => 3,
            Self::Int64 => 4,
            Self::Uint64 => 5,
            Self::Float32 => 7,
            Self::Float64 => 8,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::Int8 | Self::Uint8 => 1,
            Self::Int32 | Self::Uint32 | Self::Float32 => 4,
            Self::Int64 | Self::Uint64 | Self::Float64 => 8,
        }
    }
}

mod sealed {
    pub trait Element {}
}

/// An element type NCCL reduces: `i8`, `u8`, `i32`, `u32`, `i64`, `u64`, `f32`, `f64`. Sealed:
/// the data type NCCL is told must be the element's layout.
pub trait NcclType: Pod + sealed::Element {
    /// The NCCL data type of this element type.
    const DATA_TYPE: DataType;
}

macro_rules! nccl_type {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Element for $t {}
        impl NcclType for $t {
            const DATA_TYPE: DataType = DataType::$d;
        }
    )*};
}

nccl_type!(i8 => Int8, u8 => Uint8, i32 => Int32, u32 => Uint32, i64 => Int64, u64 => Uint64, f32 => Float32, f64 => Float64);

/// `ncclRedOp_t`: how the ranks' elements combine. Integer sums and products wrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg`: the sum divided by the number of ranks.
    Avg,
}

impl ReduceOp {
    /// The value in nccl.h.
    pub fn code(self) -> c_int {
        match self {
            Self::Sum => 0,
            Self::Prod => 1,
            Self::Max => 2,
            Self::Min => 3,
            Self::Avg => 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: NcclType>(code: c_int) {
        assert_eq!(T::DATA_TYPE.code(), code, "{}", std::any::type_name::<T>());
        assert_eq!(T::DATA_TYPE.size(), size_of::<T>(), "{}", std::any::type_name::<T>());
    }

    #[test]
    fn element_types_map_to_nccl_h_values_of_their_size() {
        check::<i8>(0);
        check::<u8>(1);
        check::<i32>(2);
        check::<u32>(3);
        check::<i64>(4);
        check::<u64>(5);
        check::<f32>(7);
        check::<f64>(8);
    }

    #[test]
    fn reduce_ops_map_to_nccl_h_values() {
        let ops = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];
        assert_eq!(ops.map(ReduceOp::code), [0, 1, 2, 3, 4]);
    }
}
