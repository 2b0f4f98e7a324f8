//! The per-device default resource, which applications can replace.

use super::{DeviceResource, MemoryResource, PoolResource};
use crate::device::Device;
use crate::error::Result;
use crate::pool::MemPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

type Defaults = Mutex<HashMap<usize, Arc<dyn MemoryResource>>>;

fn defaults() -> &'static Defaults {
    static DEFAULTS: OnceLock<Defaults> = OnceLock::new();
    DEFAULTS.get_or_init(Default::default)
}

/// The device's default resource: the one set with [`set_default_resource`], else (created on
/// first use) cuda-mem's retaining pool of the device ([`MemPool::retaining`], the pool
/// [`StreamBuffer::zeroed`](crate::StreamBuffer::zeroed) uses too), or plain `cudaMalloc` on
/// devices without pools. The driver's pools are left as they are.
pub fn default_resource(device: Device) -> Result<Arc<dyn MemoryResource>> {
    let mut map = defaults().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(resource) = map.get(&device.ordinal()) {
        return Ok(Arc::clone(resource));
    }
    let resource: Arc<dyn MemoryResource> = if device.memory_pools_supported()? {
        Arc::new(PoolResource::new(MemPool::retaining(device)?))
    } else {
        Arc::new(DeviceResource::new(device))
    };
    map.insert(device.ordinal(), Arc::clone(&resource));
    Ok(resource)
}

/// Makes `resource` the device's default and returns the previous one, if any was set or created.
/// Buffers already allocated keep the resource they came from.
pub fn set_default_resource(device: Device, resource: Arc<dyn MemoryResource>) -> Option<Arc<dyn MemoryResource>> {
    defaults().lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(device.ordinal(), resource)
}

#[cfg(test)]
mod tests {
    use super::super::testing::HostResource;
    use super::*;

    #[test]
    fn setting_a_default_returns_the_previous_one() {
        let device = Device::new_unchecked_for_tests(77);
        let first: Arc<dyn MemoryResource> = Arc::new(HostResource::default());
        let second: Arc<dyn MemoryResource> = Arc::new(HostResource::default());
        assert!(set_default_resource(device, Arc::clone(&first)).is_none());
        let previous = set_default_resource(device, Arc::clone(&second)).unwrap();
        assert!(Arc::ptr_eq(&previous, &first));
        assert!(Arc::ptr_eq(&default_resource(device).unwrap(), &second));
    }
}
