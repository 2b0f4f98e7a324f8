//! The few pickle opcodes a memory snapshot needs, as CPython's pickler writes them at
//! protocol 4 (unframed): dicts, lists, tuples, strings, integers of any size and booleans, with
//! repeated strings (dict keys, actions, file names) and frame lists memoized, so each costs two
//! bytes after its first use.

use super::{FIXED_WORDS, FixedWord};
use rustc_hash::FxHashMap;

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const MARK: u8 = b'(';
const SETITEMS: u8 = b'u';
const APPENDS: u8 = b'e';
const TUPLE2: u8 = 0x86;
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINUNICODE: u8 = b'X';
const SHORT_BINUNICODE: u8 = 0x8c;
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// Items of one list or dict go out in batches of this many (what CPython's pickler does), so
/// the unpickler's stack stays small.
pub(crate) const BATCH: usize = 1000;

/// Writes a pickle into a byte vector. Strings and lists it memoizes are borrowed for `'a`.
pub(crate) struct Pickler<'a> {
    out: Vec<u8>,
    /// Memo indices of the fixed words, by word.
    words: [Option<u32>; FIXED_WORDS],
    strings: FxHashMap<&'a str, u32>,
    /// Memo indices of lists, by the address of what they were written from.
    lists: FxHashMap<usize, u32>,
    next_memo: u32,
}

impl<'a> Pickler<'a> {
    pub(crate) fn new(capacity: usize) -> Self {
        let mut out = Vec::with_capacity(capacity);
        out.extend_from_slice(&[PROTO, 4]);
        Self {
            out,
            words: [None; FIXED_WORDS],
            strings: FxHashMap::default(),
            lists: FxHashMap::default(),
            next_memo: 0,
        }
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.out.push(STOP);
        self.out
    }

    fn memo_get(&mut self, index: u32) {
        match u8::try_from(index) {
            Ok(i) => self.out.extend_from_slice(&[BINGET, i]),
            Err(_) => {
                self.out.push(LONG_BINGET);
                self.out.extend_from_slice(&index.to_le_bytes());
            }
        }
    }

    /// Memoizes the object just written (the next memo index, as the unpickler counts).
    fn memoize(&mut self) -> u32 {
        self.out.push(MEMOIZE);
        let index = self.next_memo;
        self.next_memo += 1;
        index
    }

    fn raw_str(&mut self, s: &str) {
        match u8::try_from(s.len()) {
            Ok(len) => self.out.extend_from_slice(&[SHORT_BINUNICODE, len]),
            Err(_) => {
                self.out.push(BINUNICODE);
                self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            }
        }
        self.out.extend_from_slice(s.as_bytes());
    }

    /// One of the snapshot's fixed words (a key, an action): written once, then fetched from
    /// the memo.
    pub(crate) fn key(&mut self, word: impl FixedWord) {
        let slot = word.slot();
        if let Some(index) = self.words[slot] {
            return self.memo_get(index);
        }
        self.raw_str(word.text());
        self.words[slot] = Some(self.memoize());
    }

    /// A dictionary entry: a fixed key and an unsigned integer value.
    pub(crate) fn uint_field(&mut self, key: impl FixedWord, value: u64) {
        self.key(key);
        self.uint(value);
    }

    /// A string that may recur (a file or function name).
    pub(crate) fn shared_str(&mut self, s: &'a str) {
        if let Some(&index) = self.strings.get(s) {
            return self.memo_get(index);
        }
        self.raw_str(s);
        let index = self.memoize();
        self.strings.insert(s, index);
    }

    pub(crate) fn int(&mut self, value: i128) {
        if (0..=0xff).contains(&value) {
            self.out.extend_from_slice(&[BININT1, value as u8]);
        } else if (0..=0xffff).contains(&value) {
            self.out.push(BININT2);
            self.out.extend_from_slice(&(value as u16).to_le_bytes());
        } else if i32::try_from(value).is_ok() {
            self.out.push(BININT);
            self.out.extend_from_slice(&(value as i32).to_le_bytes());
        } else {
            // Two's complement, little-endian, in as few bytes as keep the sign.
            let bytes = value.to_le_bytes();
            let mut n = bytes.len();
            while n > 1 {
                let (top, next) = (bytes[n - 1], bytes[n - 2]);
                let redundant = (top == 0 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0);
                if !redundant {
                    break;
                }
                n -= 1;
            }
            self.out.extend_from_slice(&[LONG1, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    pub(crate) fn uint(&mut self, value: u64) {
        self.int(i128::from(value));
    }

    pub(crate) fn bool(&mut self, value: bool) {
        self.out.push(if value { NEWTRUE } else { NEWFALSE });
    }

    pub(crate) fn tuple2(&mut self, a: u64, b: u64) {
        self.uint(a);
        self.uint(b);
        self.out.push(TUPLE2);
    }

    /// A dict whose items `items` writes as key, value, key, value... (at most [`BATCH`] pairs).
    pub(crate) fn dict(&mut self, items: impl FnOnce(&mut Self)) {
        self.out.extend_from_slice(&[EMPTY_DICT, MARK]);
        items(self);
        self.out.push(SETITEMS);
    }

    /// A list of `items` that recurs (shared frames): written once, then fetched from the memo.
    /// Empty lists are written as they are.
    pub(crate) fn shared_list<T>(&mut self, items: &'a [T], item: impl FnMut(&mut Self, &'a T)) {
        if items.is_empty() {
            return self.out.push(EMPTY_LIST);
        }
        let place = items.as_ptr() as usize;
        if let Some(&index) = self.lists.get(&place) {
            return self.memo_get(index);
        }
        self.list(items, item);
        let index = self.memoize();
        self.lists.insert(place, index);
    }

    /// A list of `items`, each written by `item`.
    pub(crate) fn list<T>(&mut self, items: &'a [T], mut item: impl FnMut(&mut Self, &'a T)) {
        self.out.push(EMPTY_LIST);
        for batch in items.chunks(BATCH) {
            self.out.push(MARK);
            for x in batch {
                item(self, x);
            }
            self.out.push(APPENDS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Word;

    #[test]
    fn integers_take_the_shortest_opcode() {
        let mut p = Pickler::new(0);
        for v in [0i128, 255, 256, 65535, 65536, -1, i32::MAX as i128, 1 << 31, 1 << 40, -(1 << 40), u64::MAX as i128] {
            p.int(v);
        }
        let bytes = p.finish();
        let expected: &[u8] = &[
            PROTO, 4, BININT1, 0, BININT1, 255, BININT2, 0, 1, BININT2, 255, 255, BININT, 0, 0, 1, 0, BININT, 255, 255,
            255, 255, BININT, 255, 255, 255, 127, LONG1, 5, 0, 0, 0, 128, 0, LONG1, 6, 0, 0, 0, 0, 0, 1, LONG1, 6, 0,
            0, 0, 0, 0, 255, LONG1, 9, 255, 255, 255, 255, 255, 255, 255, 255, 0, STOP,
        ];
        assert_eq!(bytes, expected);
    }

    #[test]
    fn repeated_keys_and_lists_come_from_the_memo() {
        let frames = [1u8, 2];
        let mut p = Pickler::new(0);
        p.key(Word::Size);
        p.key(Word::Size);
        p.shared_str("a.rs");
        p.shared_str("a.rs");
        p.shared_list(&frames, |p, &x| p.int(i128::from(x)));
        p.shared_list(&frames, |p, &x| p.int(i128::from(x)));
        let bytes = p.finish();
        let expected: &[u8] = &[
            PROTO,
            4,
            SHORT_BINUNICODE,
            4,
            b's',
            b'i',
            b'z',
            b'e',
            MEMOIZE,
            BINGET,
            0,
            SHORT_BINUNICODE,
            4,
            b'a',
            b'.',
            b'r',
            b's',
            MEMOIZE,
            BINGET,
            1,
            EMPTY_LIST,
            MARK,
            BININT1,
            1,
            BININT1,
            2,
            APPENDS,
            MEMOIZE,
            BINGET,
            2,
            STOP,
        ];
        assert_eq!(bytes, expected);
    }
}
