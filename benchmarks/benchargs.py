"""The command-line arguments the benchmarks share, defined once: torch threads (part of a run's identity), the record a
benchmark writes and its timed repetitions. A benchmark adds them to its own parser:

    ap = argparse.ArgumentParser(description=__doc__)
    add_threads(ap)
    add_record(ap, "bench_x")  # --json, default results/records/bench_x.json
"""

import argparse
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[1] / "results" / "records"


def add_threads(ap: argparse.ArgumentParser, default: int = 1) -> None:
    "`--threads`: torch CPU threads of every timed stage."
    ap.add_argument(
        "--threads",
        type=int,
        default=default,
        help=f"torch CPU threads, part of a run's identity (default {default}; more threads than free cores made "
        "steps 10-100x slower on a shared 2-core machine)",
    )


def add_record(ap: argparse.ArgumentParser, name: str = "") -> None:
    "`--json`: the record to write, results/records/<name>.json by default ('' or no name: none)."
    default = str(RECORDS / f"{name}.json") if name else ""
    ap.add_argument("--json", default=default, help=f"the record to write ({default or 'none'} by default; '': none)")


def add_reps(ap: argparse.ArgumentParser, default: int, what: str = "timed repetitions of each stage (median)") -> None:
    "`--reps`: how many times each timed stage runs."
    ap.add_argument("--reps", type=int, default=default, help=f"{what} (default {default})")
