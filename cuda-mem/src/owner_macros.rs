//! What every owning buffer spells the same way, written once.

/// `Debug` for an owner of `T` elements: its name and the listed fields.
macro_rules! debug_fields {
    ($owner:ident $(<$lt:lifetime>)?: $($field:ident),+) => {
        impl<$($lt,)? T: bytemuck::Pod> std::fmt::Debug for $owner<$($lt,)? T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($owner))$(.field(stringify!($field), &self.$field))+.finish()
            }
        }
    };
}

/// `len`, `is_empty` and `size_bytes` of an owner of `len` elements of `T`, inside its `impl`.
macro_rules! element_count {
    () => {
        /// Number of elements.
        pub fn len(&self) -> usize {
            self.len
        }

        /// True when the buffer has no elements.
        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        /// Size in bytes (no overflow: the allocation of this size succeeded).
        fn size_bytes(&self) -> usize {
            self.len * size_of::<T>()
        }
    };
}

/// `device_view` / `device_view_mut` of pinned host memory allocated with
/// `HostAllocFlags::MAPPED`, inside the owner's `impl`; the owner provides
/// `fn mapped_parts(&self) -> (bool, *mut T, usize)`: whether it is mapped, its host address and
/// its length.
macro_rules! mapped_host_views {
    () => {
        /// The device's view of mapped memory (`cudaHostGetDevicePointer`), borrowed from the
        /// buffer. Errors with [`ErrorKind::NotMapped`](crate::ErrorKind::NotMapped) unless
        /// allocated with [`HostAllocFlags::MAPPED`](crate::HostAllocFlags::MAPPED).
        pub fn device_view(&self) -> Result<DeviceSlice<'_, T>> {
            let (mapped, host, len) = self.mapped_parts();
            let ptr = crate::raw::host::mapped_device_ptr(mapped, host, len)?;
            // SAFETY: the view borrows `self`, so the memory stays allocated; host writes need
            // `&mut self`, which the borrow excludes.
            Ok(unsafe { DeviceSlice::from_raw_parts(ptr, len) })
        }

        /// The device's exclusive view of mapped memory; see `device_view`.
        pub fn device_view_mut(&mut self) -> Result<DeviceSliceMut<'_, T>> {
            let (mapped, host, len) = self.mapped_parts();
            let ptr = crate::raw::host::mapped_device_ptr(mapped, host, len)?;
            // SAFETY: the view borrows `self` exclusively, so the host cannot touch the memory.
            Ok(unsafe { DeviceSliceMut::from_raw_parts(ptr, len) })
        }
    };
}

/// `host` / `host_mut` of host-accessible memory, inside the owner's `impl`; the owner provides
/// `fn before_host_access(&self) -> Result<()>`, which refuses or waits until the host may touch
/// the memory.
macro_rules! host_views {
    () => {
        /// The host's view, once `before_host_access` allows it (see the type's docs).
        pub fn host(&self) -> Result<&[T]> {
            self.before_host_access()?;
            // SAFETY: initialised at allocation and host-accessible; `before_host_access` ruled
            // out GPU work on it (see the type's docs); the borrow keeps it allocated.
            Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
        }

        /// The host's exclusive view; see `host`.
        pub fn host_mut(&mut self) -> Result<&mut [T]> {
            self.before_host_access()?;
            // SAFETY: as in `host`, and `&mut self` makes it exclusive.
            Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
        }
    };
}

/// `free` of a stream-ordered owner, inside its `impl`, documented by `$doc`: the owner provides
/// `fn release(&mut self) -> Result<()>`, and a zero `len` leaves its drop nothing to free.
macro_rules! free_now {
    ($doc:literal) => {
        #[doc = $doc]
        pub fn free(mut self) -> Result<()> {
            let result = self.release();
            self.len = 0; // nothing left for drop to free
            result
        }
    };
}

/// The parts of [`DeviceMemory`](crate::DeviceMemory) every owner forwards to its inherent
/// methods of the same names, inside its `impl DeviceMemory` (which adds `device`), in a file that
/// imports the view types.
macro_rules! forward_device_views {
    () => {
        type Elem = T;

        fn len(&self) -> usize {
            Self::len(self)
        }

        fn as_slice(&self) -> DeviceSlice<'_, T> {
            Self::as_slice(self)
        }

        fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, T> {
            Self::as_mut_slice(self)
        }
    };
}

/// The [`StreamOrdered`](crate::StreamOrdered) impl of a stream-ordered owner `$owner<'_, T>`
/// whose inherent methods of the same names do the work, in a file that imports the names it uses.
macro_rules! forward_stream_ordered {
    ($owner:ident) => {
        impl<T: Pod> StreamOrdered for $owner<'_, T> {
            fn stream(&self) -> &Stream {
                Self::stream(self)
            }
            fn use_on(&mut self, other: &Stream) -> Result<()> {
                Self::use_on(self, other)
            }
            fn free_on(self, stream: &Stream) -> Result<()> {
                Self::free_on(self, stream)
            }
            fn free(self) -> Result<()> {
                Self::free(self)
            }
        }
    };
}
