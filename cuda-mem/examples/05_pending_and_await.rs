//! Lesson 5, `Pending` and `.await`: work that outlives the call. `upload`, `download` and
//! `queue` take their buffers by value and return at once; the `Pending` owns the buffers until
//! the GPU is done, then hands them back (`wait`, or `.await` in any executor).

use cuda_mem::{DeviceBuffer, PinnedBuffer, Stream};
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

fn main() -> cuda_mem::Result<()> {
    let stream = Stream::non_blocking()?;
    let len = 1 << 20;
    let input = PinnedBuffer::from_slice(&vec![3u32; len], Default::default())?;
    let device = DeviceBuffer::<u32>::zeroed(len)?;

    // Returns at once; the copy runs while this thread prepares the next batch. `then` queues
    // more work on the same buffers after it, still without waiting on the host.
    let upload = stream.upload(device, input)?.then(|s, (device, _input)| {
        let (mut head, _) = device.as_mut_slice().split_at_mut(4)?;
        s.set_bytes(&mut head, 0)
    })?;
    let next_batch: Vec<u32> = (0..len as u32).collect(); // CPU work overlapping the copy
    // `input[0] = 1` here would not compile: the buffers are inside `upload`.
    let (device, input) = upload.wait()?;

    // Awaiting instead of waiting: woken by the GPU when the copy has finished.
    let back = PinnedBuffer::<u32>::zeroed(len)?;
    let (back, device) = block_on(stream.download(back, device)?)?;
    assert_eq!(back[..4], [0; 4]);
    assert_eq!(back[4..], input[4..]);
    println!("{len} u32 up, 4 zeroed after, and back; {} prepared meanwhile", next_batch.len());

    // `queue` runs any copies (and kernels) on owned buffers in one go.
    let pending = stream.queue((device, back), |s, (device, back)| s.copy_to_host(&mut back[..], device.as_slice()))?;
    let (_device, back) = pending.wait()?;
    assert!(back[4..].iter().all(|&x| x == 3));
    println!("queued work handed its buffers back");
    Ok(())
}

/// A minimal executor for the lesson: polls `future` on this thread, parking between wakes.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        match future.as_mut().poll(&mut context) {
            Poll::Ready(output) => return output,
            Poll::Pending => thread::park(),
        }
    }
}
