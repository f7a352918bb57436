#!/usr/bin/env python3
"""The shipped scripts end with a clear message, not a traceback, on the mistakes a newcomer makes.

usage: scripts_test.py SOURCE_ROOT
"""
import subprocess
import sys

root = sys.argv[1]
failures = 0


def expect(args, status, words):
    """Runs a script from the source root; its exit status and standard error must be as given."""
    global failures
    run = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=60)
    ok = run.returncode == status and all(w in run.stderr for w in words) and "Traceback" not in run.stderr
    print(f"{'ok  ' if ok else 'FAIL'} {' '.join(args)}: exit {run.returncode}, stderr {run.stderr.strip()!r}")
    failures += not ok


expect(["tools/speed.sh", "/nonexistent/pipesim", "1"], 1, ["/nonexistent/pipesim is not an executable pipesim"])
expect(["tools/speed.sh", "/nonexistent/pipesim", "1", "old/pipesim"], 1, ["is not an executable pipesim"])
expect(["tools/speed.sh", "/bin/true", "x"], 1, ["RUNS must be a whole number"])
sys.exit(1 if failures else 0)
