"""Run a command while every core is kept busy by another process: how the tests behave on a loaded machine.

    python tools/busy.py -- pytest            # one busy loop per core beside the whole test run
    python tools/busy.py --loops 4 -- pytest tests/test_long_runs.py

CI runners and shared development machines run other work beside a test session; a test that passes
only on an idle machine (a deadline shorter than the work, polling that assumes a speed) fails there.
The loops are plain Python busy loops in separate processes at normal priority; they stop when the
command ends. The exit status is the command's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys


def spin() -> None:
    while True:
        pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    loops = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.loops)]
    for loop in loops:
        loop.start()
    try:
        return subprocess.run(command, check=False).returncode
    finally:
        for loop in loops:
            loop.terminate()
        for loop in loops:
            loop.join()


if __name__ == "__main__":
    sys.exit(main())
