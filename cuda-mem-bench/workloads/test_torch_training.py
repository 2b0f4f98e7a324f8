"""The trace converter of torch_training.py, on fabricated snapshots; needs no torch.

    cd cuda-mem-bench/workloads && python3 -m unittest -v test_torch_training
"""
import contextlib
import io
import os
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_training import draw_shapes, encode_workload, parse_args, snapshot_to_workload  # noqa: E402

ALLOC, FREE, FREE_ON, EMPTY_CACHE = 0, 1, 2, 3


def read_workload(data):
    """A reader written from cuda-mem-workloads/src/format.rs (independent of the writer):
    returns (name, [[(kind, id, bytes, lane_field), ...] per lane]); raises ValueError on
    malformed input, as `format::read` refuses it."""
    f = io.BytesIO(data)

    def take(n):
        chunk = f.read(n)
        if len(chunk) != n:
            raise ValueError("truncated")
        return chunk

    if take(4) != b"CMWL":
        raise ValueError("no magic")
    version, lanes, name_len = struct.unpack("<III", take(12))
    if version != 1:
        raise ValueError(f"version {version}")
    if name_len > 4096 or lanes > 65536:
        raise ValueError("implausible header")
    name = take(name_len).decode("utf-8")
    out = []
    for _ in range(lanes):
        (count,) = struct.unpack("<Q", take(8))
        ops = []
        for _ in range(count):
            record = take(16)
            kind, zero = record[0], record[1]
            other = int.from_bytes(record[2:4], "little")
            ident = int.from_bytes(record[4:8], "little")
            nbytes = int.from_bytes(record[8:16], "little")
            if zero != 0:
                raise ValueError("byte 1 must be 0")
            if kind == ALLOC and nbytes == 0:
                raise ValueError("alloc of 0 bytes")
            if kind == FREE_ON and other >= lanes:
                raise ValueError("free_on names a missing lane")
            if kind > EMPTY_CACHE:
                raise ValueError(f"bad kind {kind}")
            ops.append((kind, ident, nbytes, other))
        out.append(ops)
    if f.read(1):
        raise ValueError("trailing bytes")
    return name, out


def check_balanced(test, lane):
    """Every id is allocated, then freed once, and may come back after its free; returns the
    most bytes live at once."""
    live, peak, total = {}, 0, 0
    for kind, ident, nbytes, _ in lane:
        if kind == ALLOC:
            test.assertNotIn(ident, live, "an id allocated twice")
            test.assertGreater(nbytes, 0)
            live[ident] = nbytes
            total += nbytes
            peak = max(peak, total)
        elif kind == FREE:
            test.assertIn(ident, live, "a free of an id that is not live")
            total -= live.pop(ident)
    test.assertEqual(live, {}, "every alloc is freed by the end")
    return peak


def ev(action, addr, size, stream=7):
    """A trace entry as torch.cuda.memory._snapshot() gives it (context=None: no frames)."""
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": []}


def snapshot(events):
    return {"segments": [], "device_traces": [events]}


def freed(addr, size, stream=7):
    return [ev("free_requested", addr, size, stream), ev("free_completed", addr, size, stream)]


class ConverterTest(unittest.TestCase):
    def convert(self, events, **kwargs):
        data, summary = snapshot_to_workload(snapshot(events), log=io.StringIO(), **kwargs)
        name, lanes = read_workload(data)
        self.assertEqual(name, "training_torch")
        self.assertEqual(len(lanes), 1)
        return lanes[0], summary, data

    def test_a_simple_trace_becomes_ops_with_small_reused_ids(self):
        A, B, C = 0x7F00_0000_0000, 0x7F00_0020_0000, 0x7F00_0040_0000
        events = [
            ev("segment_alloc", A, 2 << 20),
            ev("alloc", A, 1000),
            ev("alloc", B, 3000),
            *freed(A, 1000),
            ev("alloc", C, 500),           # takes id 0 again (the smallest free)
            ev("alloc", A, 700),           # A reused: a fresh id (2)
            *freed(B, 3000),
            *freed(C, 500),
            *freed(A, 700),
            ev("segment_free", A, 2 << 20),
        ]
        lane, summary, data = self.convert(events)
        self.assertEqual([op[:3] for op in lane], [
            (ALLOC, 0, 1000), (ALLOC, 1, 3000), (FREE, 0, 0), (ALLOC, 0, 500), (ALLOC, 2, 700),
            (FREE, 1, 0), (FREE, 0, 0), (FREE, 2, 0),
        ])
        self.assertTrue(all(op[3] == 0 for op in lane), "one lane: the lane field stays 0")
        self.assertEqual(check_balanced(self, lane), 4200)
        self.assertEqual(summary["peak_live_bytes"], 4200)
        self.assertEqual(summary["free_action"], "free_requested")
        self.assertEqual((summary["allocs"], summary["frees"], summary["ids"]), (4, 4, 3))
        self.assertEqual(len(data), 16 + len("training_torch") + 8 + 16 * 8)

    def test_frees_before_the_trace_are_dropped_and_live_allocations_freed_at_the_end(self):
        P, Q, R = 0x1000, 0x2000, 0x3000
        events = [
            *freed(P, 64),                 # allocated before the ring began: dropped
            ev("alloc", Q, 128),
            ev("alloc", R, 256),           # never freed: a parameter, say
            *freed(Q, 128),
            ev("free_completed", 0x9000, 8),  # unmatched as well (but not the chosen action)
        ]
        lane, summary, _ = self.convert(events)
        self.assertEqual([op[:3] for op in lane],
                         [(ALLOC, 0, 128), (ALLOC, 1, 256), (FREE, 0, 0), (FREE, 1, 0)])
        self.assertEqual(summary["unmatched_frees_dropped"], 1)
        self.assertEqual(summary["unfreed_at_end"], 1)
        check_balanced(self, lane)

        lane, summary, _ = self.convert(events, drop_unfreed=True)
        self.assertEqual([op[:3] for op in lane], [(ALLOC, 0, 128), (FREE, 0, 0)])
        self.assertEqual(summary["unfreed_handling"], "dropped")

    def test_only_free_completed_in_the_trace_serves_as_the_free(self):
        events = [ev("alloc", 0x10, 512), ev("alloc", 0x20, 512), ev("free_completed", 0x10, 512),
                  ev("alloc", 0x30, 1024), ev("free_completed", 0x20, 512), ev("free_completed", 0x30, 1024)]
        lane, summary, _ = self.convert(events)
        self.assertEqual(summary["free_action"], "free_completed")
        self.assertEqual([op[:3] for op in lane], [(ALLOC, 0, 512), (ALLOC, 1, 512), (FREE, 0, 0),
                                                   (ALLOC, 0, 1024), (FREE, 1, 0), (FREE, 0, 0)])
        self.assertEqual(summary["peak_live_bytes"], 1536)

    def test_free_requested_is_the_program_order_when_a_free_completes_later(self):
        # record_stream: the free is requested at once, completed after the other stream's work;
        # meanwhile the program allocated elsewhere.
        events = [ev("alloc", 0x10, 100), ev("free_requested", 0x10, 100), ev("alloc", 0x20, 200),
                  ev("free_completed", 0x10, 100), ev("free_requested", 0x20, 200),
                  ev("free_completed", 0x20, 200)]
        lane, summary, _ = self.convert(events)
        self.assertEqual([op[:3] for op in lane], [(ALLOC, 0, 100), (FREE, 0, 0), (ALLOC, 0, 200), (FREE, 0, 0)])
        self.assertEqual(summary["peak_live_bytes"], 200)
        lane, summary, _ = self.convert(events, free_action="free_completed")
        self.assertEqual([op[:3] for op in lane], [(ALLOC, 0, 100), (ALLOC, 1, 200), (FREE, 0, 0), (FREE, 1, 0)])
        self.assertEqual(summary["peak_live_bytes"], 300)

    def test_zero_bytes_missing_frees_and_several_streams(self):
        log = io.StringIO()
        events = [ev("alloc", 0x10, 0, stream=1), *freed(0x10, 0, stream=1),  # 0 bytes: dropped, with its free
                  ev("alloc", 0x20, 64, stream=1),
                  ev("alloc", 0x20, 96, stream=2),                 # free of the first one missing
                  *freed(0x20, 96, stream=2),
                  ev("segment_map", 0x40, 1 << 21), ev("snapshot", 0, 0),
                  {"action": "oom", "device_free": 0, "size": 1 << 40, "stream": 2, "time_us": 0}]  # no addr
        data, summary = snapshot_to_workload(snapshot(events), log=log)
        _, (lane,) = read_workload(data)
        self.assertEqual([op[:3] for op in lane], [(ALLOC, 0, 64), (FREE, 0, 0), (ALLOC, 0, 96), (FREE, 0, 0)])
        self.assertEqual(summary["zero_size_dropped"], 1)
        self.assertEqual(summary["reallocated_while_live"], 1)
        self.assertEqual(summary["streams"], [1, 2])
        self.assertIn("streams", log.getvalue())
        self.assertIn("0 bytes", log.getvalue())

    def test_an_empty_trace_and_a_missing_device(self):
        lane, summary, data = self.convert([])
        self.assertEqual(lane, [])
        self.assertEqual(data, b"CMWL" + struct.pack("<III", 1, 1, 14) + b"training_torch" + struct.pack("<Q", 0))
        with self.assertRaises(ValueError):
            snapshot_to_workload({"device_traces": []}, device=0, log=None)

    def test_a_large_random_trace_stays_balanced(self):
        import random

        rng = random.Random(5)
        events, live, next_addr, expected_peak, total = [], [], 1 << 20, 0, 0
        for _ in range(20000):
            if live and rng.random() < 0.48:
                addr, size = live.pop(rng.randrange(len(live)))
                events += freed(addr, size)
                total -= size
            else:
                size = rng.randint(1, 1 << 24)
                events.append(ev("alloc", next_addr, size))
                live.append((next_addr, size))
                next_addr += 1 << 25
                total += size
                expected_peak = max(expected_peak, total)
        lane, summary, _ = self.convert(events)
        self.assertEqual(check_balanced(self, lane), expected_peak)
        self.assertEqual(summary["peak_live_bytes"], expected_peak)
        self.assertEqual(summary["unfreed_at_end"], len(live))
        self.assertLessEqual(summary["ids"], summary["allocs"])

    def test_the_reader_refuses_what_format_rs_refuses(self):
        data = encode_workload("t", [[(ALLOC, 0, 7), (FREE_ON, 0, 0, 0), (EMPTY_CACHE, 0, 0)]])
        self.assertEqual(read_workload(data)[1][0], [(ALLOC, 0, 7, 0), (FREE_ON, 0, 0, 0), (EMPTY_CACHE, 0, 0, 0)])
        for cut in range(len(data)):
            with self.assertRaises(ValueError):
                read_workload(data[:cut])
        with self.assertRaises(ValueError):
            read_workload(encode_workload("t", [[(FREE_ON, 0, 0, 3)]]))


class ShapesTest(unittest.TestCase):
    def test_shapes_are_seeded_and_in_range(self):
        shapes = draw_shapes(1234, 500, (4, 16), (128, 1024))
        self.assertEqual(shapes, draw_shapes(1234, 500, (4, 16), (128, 1024)))
        self.assertTrue(all(4 <= b <= 16 and 128 <= t <= 1024 and t % 64 == 0 for b, t in shapes))
        self.assertEqual({t for _, t in shapes}, set(range(128, 1025, 64)))
        self.assertEqual({b for b, _ in shapes}, set(range(4, 17)))


class ArgumentsTest(unittest.TestCase):
    def test_hooks_are_cuda_mems_and_default_to_all(self):
        self.assertEqual(parse_args(["--allocator", "cuda-mem"]).cuda_mem_hooks, "all")
        self.assertEqual(parse_args(["--allocator", "cuda-mem", "--cuda-mem-hooks", "none"]).cuda_mem_hooks, "none")
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            parse_args(["--allocator", "native", "--cuda-mem-hooks", "none"])


if __name__ == "__main__":
    unittest.main()
