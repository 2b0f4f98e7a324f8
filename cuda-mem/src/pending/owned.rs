//! The names [`HostMemory`] and [`DeviceMemory`] had before 2026-12-07, kept one release.

use crate::memory::{DeviceMemory, HostMemory};
use bytemuck::Pod;

/// A host buffer a [`Pending`](crate::Pending) can own: now `HostMemory<Elem = T> + Send +
/// 'static`, which every such buffer implements.
#[deprecated(since = "0.1.0", note = "use `HostMemory<Elem = T> + Send + 'static`")]
pub trait OwnedHost<T: Pod>: HostMemory<Elem = T> + Send + 'static {}
#[allow(deprecated)]
impl<T: Pod, H: HostMemory<Elem = T> + Send + 'static> OwnedHost<T> for H {}

/// A device buffer a [`Pending`](crate::Pending) can own: now `DeviceMemory<Elem = T> + Send +
/// 'static`, which every such buffer implements.
#[deprecated(since = "0.1.0", note = "use `DeviceMemory<Elem = T> + Send + 'static`")]
pub trait OwnedDevice<T: Pod>: DeviceMemory<Elem = T> + Send + 'static {}
#[allow(deprecated)]
impl<T: Pod, D: DeviceMemory<Elem = T> + Send + 'static> OwnedDevice<T> for D {}
