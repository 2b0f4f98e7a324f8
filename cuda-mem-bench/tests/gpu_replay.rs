//! GPU test of the log replay: a log recorded on the GPU replays against another resource with
//! the same peak. Ignored where no GPU exists.

use cuda_mem::resource::{
    DeviceResource, LogFormat, LoggingResource, PoolResource, ResourceBuffer, StatisticsResource,
};
use cuda_mem::{Device, MemPool, PoolProps, Stream};
use cuda_mem_bench::replay::replay;
use cuda_mem_workloads::log::parse_log;
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn device() -> Device {
    Device::current().unwrap()
}

/// A log recorded from an inference-like workload on the pool replays against cudaMalloc with
/// the same peak.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_recorded_workload_replays_with_the_same_peak() {
    let stream = Stream::non_blocking().unwrap();
    let path = std::env::temp_dir().join(format!("cuda-mem-replay-{}.csv", std::process::id()));
    let pool = MemPool::new(PoolProps::new(device())).unwrap();
    let recorded = Arc::new(StatisticsResource::new(LoggingResource::new(
        PoolResource::new(pool),
        std::fs::File::create(&path).unwrap(),
        LogFormat::Csv,
    )));
    {
        let weights = ResourceBuffer::<f32>::zeroed(recorded.clone(), &stream, 8 * MIB).unwrap();
        for step in 0..16 {
            let activations = ResourceBuffer::<f32>::zeroed(recorded.clone(), &stream, MIB + step * 4096).unwrap();
            let scratch = ResourceBuffer::<u8>::zeroed(recorded.clone(), &stream, 3 * MIB).unwrap();
            drop((activations, scratch));
        }
        drop(weights);
    }
    recorded.inner().flush().unwrap();
    let events = parse_log(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let target = StatisticsResource::new(DeviceResource::new(device()));
    let report = replay(&events, &target, stream.as_stream_ref()).unwrap();
    assert_eq!(report.peak_bytes, recorded.stats().peak_bytes);
    assert_eq!(target.stats().peak_bytes, recorded.stats().peak_bytes);
    assert_eq!((report.allocations, report.frees, report.unfreed_in_log), (33, 33, 0));
}
