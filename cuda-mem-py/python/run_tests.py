#!/usr/bin/env python3
"""Runs the test functions of tests/test_*.py without pytest:
`python3 run_tests.py [-k TEXT] [--skip TEXT[,TEXT...]]` (those whose `file::name` holds TEXT, or
holds none of the skipped ones).

Each `test_*` function runs once; `unittest.SkipTest` counts as skipped (as under pytest). The
last line is the summary, e.g. `42 passed, 0 failed, 3 skipped`; the exit status is 1 when a
test failed.
"""
import importlib
import os
import sys
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "tests")]
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def main(argv):
    pattern = argv[argv.index("-k") + 1] if "-k" in argv else ""
    skips = argv[argv.index("--skip") + 1].split(",") if "--skip" in argv else []
    passed = failed = skipped = 0
    for name in sorted(os.listdir(os.path.join(HERE, "tests"))):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        module = importlib.import_module(name[:-3])
        for attr in sorted(vars(module)):
            test = getattr(module, attr)
            if not (attr.startswith("test_") and callable(test)) or pattern not in f"{name}::{attr}":
                continue
            if any(skip in f"{name}::{attr}" for skip in skips):
                continue
            label = f"{name}::{attr}"
            try:
                test()
            except unittest.SkipTest as why:
                skipped += 1
                print(f"SKIP {label}: {why}")
            except Exception:  # noqa: BLE001 - every failure is reported and counted
                failed += 1
                print(f"FAIL {label}")
                traceback.print_exc()
            else:
                passed += 1
                print(f"ok   {label}")
            sys.stdout.flush()
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
