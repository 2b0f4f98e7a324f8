//! Lesson 7, CUDA graphs: capture a step once, replay it for the cost of one launch. Host data
//! enters and leaves a graph through slots: pinned buffers the graph owns, which the host fills
//! and reads between launches. A graph that owns everything it uses launches without a host
//! wait, through a `Pending`.

use cuda_mem::{CaptureMode, DeviceBuffer, GraphFlags, PinnedBuffer, Stream};

fn main() -> cuda_mem::Result<()> {
    let stream = Stream::non_blocking()?;
    let len = 1 << 16;
    let weights = DeviceBuffer::from_slice(&vec![2.0f32; len])?;
    // Captured copies need pinned host memory (the runtime refuses pageable memory there).
    let mut input = PinnedBuffer::<f32>::zeroed(len)?;
    let mut output = PinnedBuffer::<f32>::zeroed(len)?;
    let mut result = PinnedBuffer::<f32>::zeroed(len)?;

    // Nothing runs during the capture: the closure records the step into a graph.
    let (graph, (input_slot, output_slot, result_slot)) = stream.capture_with(CaptureMode::ThreadLocal, |s| {
        let mut staged = s.temporary::<f32>(len)?; // graph memory, freed when the graph ends
        let input_slot = s.copy_from_host_slot(&mut staged, &mut input)?;
        let result_slot = s.copy_to_host_slot(&mut result, &staged)?;
        let output_slot = s.copy_to_host_slot(&mut output, weights.as_slice())?;
        Ok((input_slot, output_slot, result_slot))
    })?;
    let mut exec = graph.instantiate(GraphFlags::empty())?;

    for step in 0..10 {
        exec.host_mut(&input_slot)?.fill(step as f32); // what this launch uploads
        exec.launch(&stream)?; // returns once the launch has completed
        assert!(exec.host(&result_slot)?.iter().all(|&x| x == step as f32));
    }
    assert!(exec.host(&output_slot)?.iter().all(|&x| x == 2.0));
    println!("one capture, 10 launches: each uploaded its step number and read it back");

    // A graph that owns all it uses (graph memory; its stream borrowed for 'static) launches
    // without a host wait: a Pending owns the executable graph until its launches complete.
    let stream: &'static Stream = Box::leak(Box::new(Stream::non_blocking()?));
    let (graph, key) = stream.capture_with(CaptureMode::ThreadLocal, |s| {
        let (mut out, key) = s.output::<u32>(len)?; // graph memory that outlives each launch
        s.set_bytes(&mut out, 1)?;
        Ok(key)
    })?;
    let pending = graph.instantiate(GraphFlags::empty())?.launch_pending(stream)?; // no wait
    let pending = pending.then(|s, exec| exec.launches_in(s)?.launch())?; // nor here
    // ... the CPU prepares the next step here ...
    let exec = pending.wait()?; // back once both launches have completed
    assert!(exec.output(&key)?.to_vec()?.iter().all(|&x| x == 0x0101_0101));
    println!("two launches queued without a host wait, one wait for both");
    Ok(())
}
