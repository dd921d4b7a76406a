"""Wall time of `oodbench --help` and of each `oodbench AREA --help`: the median of repeated runs.

    python benchmarks/cli_startup.py [--repeats 7]

Each run is a fresh interpreter (`python -m oodbench.cli …`), so the figure includes Python's start-up and
every import the command needs. The machine's load average is printed beside the figures: on a busy machine
they grow with the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = [
    [],
    ["evaluate"],
    ["run"],
    ["extract"],
    ["zeroshot"],
    ["analyze"],
    ["report"],
    ["audit"],
    ["annotate"],
]


def _time(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "oodbench.cli", *args, "--help"], capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> None:
    """Print one line per command: median and spread of its --help wall time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    repeats = parser.parse_args().repeats
    _time([])  # warm the file cache once
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs")
    print(f"{'command':<28} {'median s':>9} {'min s':>7} {'max s':>7}")
    for args in COMMANDS:
        times = [_time(args) for _ in range(repeats)]
        label = "oodbench " + " ".join([*args, "--help"])
        print(f"{label:<28} {statistics.median(times):>9.2f} {min(times):>7.2f} {max(times):>7.2f}")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
