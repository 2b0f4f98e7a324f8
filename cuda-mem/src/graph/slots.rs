//! Host memory a graph reads or writes at every launch, reachable between launches through the
//! executable graph that holds its borrow.

use crate::error::{CudaError, ErrorKind, Result};
use bytemuck::Pod;
use std::any::TypeId;
use std::marker::PhantomData;

/// The key to a host slice that captured copies read or write ([`CaptureScope::copy_from_host_slot`](crate::CaptureScope::copy_from_host_slot),
/// [`CaptureScope::copy_to_host_slot`](crate::CaptureScope::copy_to_host_slot)). The graph
/// borrows the slice exclusively for its whole life; [`GraphExec::host`](crate::GraphExec::host)
/// and [`GraphExec::host_mut`](crate::GraphExec::host_mut) lend it back between launches.
pub struct HostSlot<T> {
    pub(crate) graph: u64,
    pub(crate) index: usize,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for HostSlot<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for HostSlot<T> {}

impl<T> std::fmt::Debug for HostSlot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSlot").field("graph", &self.graph).field("index", &self.index).finish()
    }
}

/// One host slice a graph holds an exclusive borrow of (type-erased).
#[derive(Debug)]
pub(crate) struct SlotRecord {
    graph: u64,
    index: usize,
    ptr: *mut u8,
    len: usize,
    type_id: TypeId,
}

impl SlotRecord {
    /// Records `slice` as slot `index` of graph `graph`; the caller keeps the exclusive borrow
    /// of `slice` alive for as long as the record lives.
    pub(crate) fn new<T: Pod>(graph: u64, index: usize, slice: &mut [T]) -> (Self, HostSlot<T>) {
        let record =
            Self { graph, index, ptr: slice.as_mut_ptr().cast(), len: slice.len(), type_id: TypeId::of::<T>() };
        (record, HostSlot { graph, index, _type: PhantomData })
    }

    /// The address and length of the slice `slot` names, if `records` hold it.
    pub(crate) fn find<T: Pod>(records: &[SlotRecord], slot: &HostSlot<T>) -> Result<(*mut T, usize)> {
        let found = records.iter().find(|r| r.graph == slot.graph && r.index == slot.index);
        match found {
            Some(record) if record.type_id == TypeId::of::<T>() => Ok((record.ptr.cast(), record.len)),
            _ => {
                let kind = ErrorKind::InvalidArgument("the host slot belongs to another graph");
                Err(CudaError::new(kind, format!("GraphExec host access to {slot:?}")))
            }
        }
    }
}
