//! Lesson 2, copy in a scope: asynchronous copies that borrow memory. `Stream::scope` (like
//! `std::thread::scope`) synchronizes the stream before its borrows end, so while the copies run
//! the compiler refuses to let anything free, drop or write the memory they use.

use cuda_mem::{DeviceBuffer, PinnedBuffer, Stream};

fn main() -> cuda_mem::Result<()> {
    let stream = Stream::non_blocking()?;
    let len = 1 << 20;
    // Pinned host memory makes the copies truly asynchronous (pageable memory works too, through
    // the driver's staging).
    let mut input = PinnedBuffer::<u32>::zeroed(len)?;
    input.iter_mut().enumerate().for_each(|(i, x)| *x = i as u32);
    let mut output = PinnedBuffer::<u32>::zeroed(len)?;
    let mut a = DeviceBuffer::<u32>::zeroed(len)?;
    let mut b = DeviceBuffer::<u32>::zeroed(len)?;
    let (mut a_view, mut b_view) = (a.as_mut_slice(), b.as_mut_slice());

    // Everything below is queued on `stream` and runs in order; `try_scope` returns once the
    // stream has finished, and passes on the first error.
    stream.try_scope(|s| {
        s.copy_from_host(&mut a_view, &input)?; // H2D
        s.copy_from_device(&mut b_view, &a_view)?; // D2D
        s.copy_to_host(&mut output, &b_view) // D2H
    })?;
    // Here `input[0] = 1;` inside the scope, or `drop(a)` before it ends, would not compile.
    assert_eq!(output[..], input[..]);
    println!("{len} u32 went up, across and back");

    // Views split without copying; each part is a destination of its own.
    let (mut head, _tail) = b.as_mut_slice().split_at_mut(16)?;
    stream.try_scope(|s| s.set_bytes(&mut head, 0))?;
    assert_eq!(b.as_slice().slice(..17)?.to_vec()?, [&[0; 16][..], &[16]].concat());
    println!("the first 16 zeroed through a split view");

    // A scope can also hold several streams' work: the second waits for the first through an
    // event, and the scope waits for both.
    let other = Stream::non_blocking()?;
    let done = stream.record_event()?;
    other.wait_event(&done)?;
    other.try_scope(|s| s.copy_to_host(&mut output, a.as_slice()))?;
    assert_eq!(output[..], input[..]);
    println!("read back on a second stream after an event");
    Ok(())
}
