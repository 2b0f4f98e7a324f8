//! `StreamUses`: the cross-stream bookkeeping of every stream-ordered owner
//! ([`StreamBuffer`](crate::StreamBuffer), [`CachedBuffer`](crate::CachedBuffer),
//! [`ResourceBuffer`](crate::resource::ResourceBuffer)). An owner's memory is ordered on one
//! stream; a use on another stream is ordered after the owner's work with an event and
//! remembered, so the free can be ordered after that stream's work in turn.

use super::{Event, Stream};
use crate::error::Result;
use crate::maybe_owned::MaybeOwned;

/// The other streams that used an owner's memory, each to be waited for before the free.
#[derive(Debug, Default)]
pub(crate) struct StreamUses {
    users: Vec<Stream>,
}

impl StreamUses {
    pub(crate) const fn new() -> Self {
        Self { users: Vec::new() }
    }

    /// Prepares a use on `other` of memory ordered on `owner`: `other` waits (on the device) for
    /// the work queued on `owner` so far, and `other` is remembered for the free.
    pub(crate) fn use_on(&mut self, owner: &Stream, other: &Stream, operation: &'static str) -> Result<()> {
        if other.is_same_stream(owner) {
            return Ok(());
        }
        other.require_orderable(operation)?;
        other.wait_event(&Event::fence(owner)?)?;
        self.remember(other);
        Ok(())
    }

    /// Checks `freeing` for a free in place of `owner`, and makes `owner` one of the streams the
    /// free waits for. Nothing is ordered yet: [`StreamUses::order_before`] does it.
    pub(crate) fn hand_over(&mut self, owner: &Stream, freeing: &Stream, operation: &'static str) -> Result<()> {
        freeing.require_orderable(operation)?;
        self.remember(owner);
        Ok(())
    }

    /// Moves the free of memory ordered on `owner` to `freeing`: checks `freeing`, remembers
    /// `owner` as a user, and makes `freeing` the owner (nothing to do when they are one stream).
    pub(crate) fn move_free<'a>(
        &mut self,
        owner: &mut MaybeOwned<'a, Stream>,
        freeing: &Stream,
        operation: &'static str,
    ) -> Result<()> {
        if !freeing.is_same_stream(owner) {
            self.hand_over(owner, freeing, operation)?;
            *owner = MaybeOwned::Owned(freeing.clone());
        }
        Ok(())
    }

    fn remember(&mut self, user: &Stream) {
        if !self.users.iter().any(|u| u.is_same_stream(user)) {
            self.users.push(user.clone());
        }
    }

    /// Makes `stream` wait for the work queued so far on every remembered stream, so a free
    /// queued on `stream` next cannot overtake it. Where an event cannot order a user, the host
    /// waits for that user instead (correct, slower). Only when even that fails is the error
    /// returned: the user stays remembered, and the caller must then keep the memory out of
    /// reuse for good, since the end of that user's work cannot be known.
    ///
    /// Nothing to do in the common case (no other stream used the memory): inlined, with the
    /// rest out of line.
    #[inline]
    pub(crate) fn order_before(&mut self, stream: &Stream) -> Result<()> {
        if self.users.is_empty() { Ok(()) } else { self.order_users_before(stream) }
    }

    #[cold]
    #[inline(never)]
    fn order_users_before(&mut self, stream: &Stream) -> Result<()> {
        while let Some(user) = self.users.last() {
            if !user.is_same_stream(stream) {
                let ordered = Event::fence(user).and_then(|done| stream.wait_event(&done));
                if ordered.is_err() {
                    user.synchronize()?;
                }
            }
            self.users.pop();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::stream::StreamKind;
    use crate::stream::tests::{unused_stream, unused_stream_at};

    fn invalid(err: crate::CudaError, message: &str) -> bool {
        matches!(err.kind(), ErrorKind::InvalidArgument(m) if m.contains(message))
    }

    /// A use on the owner's own stream is ordered already: nothing is queued or remembered.
    #[test]
    fn a_use_on_the_owners_stream_is_a_no_op() {
        let owner = unused_stream();
        let mut uses = StreamUses::new();
        uses.use_on(&owner, &owner.clone(), "test::use_on").unwrap();
        assert!(uses.users.is_empty());
    }

    /// The per-thread stream and a capture's stream are refused before any runtime call, for
    /// uses and for frees alike, and nothing is remembered.
    #[test]
    fn uses_and_frees_on_unorderable_streams_are_refused_before_the_runtime() {
        let owner = unused_stream();
        let capture = owner.capture_handle(&owner);
        let per_thread = unused_stream_at(0x2, StreamKind::PerThread(std::thread::current().id()));
        let mut uses = StreamUses::new();
        for (stream, message) in [
            (capture, "capture's stream cannot record events"),
            (&per_thread, "per-thread default stream cannot order"),
        ] {
            let err = uses.use_on(&owner, stream, "test::use_on").unwrap_err();
            assert!(invalid(err.clone(), message), "{err}");
            assert!(err.to_string().contains("test::use_on"), "{err}");
            let err = uses.hand_over(&owner, stream, "test::free_on").unwrap_err();
            assert!(invalid(err, message));
        }
        assert!(uses.users.is_empty(), "a refused stream is never remembered");
    }

    /// A free handed to another stream waits for the owner's stream, once however often it is
    /// named; ordering a stream after itself needs no event (so it reaches no runtime call here).
    #[test]
    fn a_hand_over_remembers_the_owner_once_and_a_stream_is_not_ordered_after_itself() {
        let owner = unused_stream();
        let freeing = unused_stream_at(0x1000, StreamKind::Borrowed);
        let mut uses = StreamUses::new();
        uses.hand_over(&owner, &freeing, "test::free_on").unwrap();
        uses.hand_over(&owner.clone(), &freeing, "test::free_on").unwrap();
        assert_eq!(uses.users.len(), 1);
        uses.order_before(&owner).unwrap();
        assert!(uses.users.is_empty(), "an ordered user is forgotten");
    }
}
