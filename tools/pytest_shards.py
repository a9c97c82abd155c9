"""Run tests/ as N concurrent pytest processes over disjoint sets of test files (`make pytest`).

Most tests spend their time in one subprocess at a time (a `stalebook` command, a killed and resumed run), so on a
2-core machine two shards finish in about half the time. pytest-xdist would do the same per test; this keeps the
test dependencies as they are and keeps every file (its module fixtures, a Ray head) inside one process. Files are
assigned by longest-expected-first to the least-loaded shard, with the per-file seconds measured on 2 cores in
DIR/durations.json (a file not listed counts as the median). Each shard has its own --basetemp, log and JUnit XML;
the logs are printed after all shards end, and a line every minute says which are still running.

    python tools/pytest_shards.py [-n N] [--tests DIR] [--write-durations] [pytest args...]

N defaults to $PYTEST_SHARDS, else to the usable cores (at most 4).

Exit status: 0 if every shard passed; otherwise the first non-zero one (5, "no tests collected", counts as failure).
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def plan(files: list[str], weights: dict, n: int) -> list[list[str]]:
    "Greedy longest-processing-time assignment of files to n shards (deterministic: ties by name)."
    default = statistics.median(weights.values()) if weights else 1.0
    shards, load = [[] for _ in range(n)], [0.0] * n
    for f in sorted(files, key=lambda f: (-weights.get(f, default), f)):
        i = min(range(n), key=lambda k: (load[k], k))
        shards[i].append(f); load[i] += weights.get(f, default)
    return [sorted(s) for s in shards if s]


def file_seconds(xml: Path) -> dict:
    "{test file: seconds} summed over the test cases of a JUnit XML report (setup and teardown included)."
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        f = next((m + ".py" for m in case.get("classname", "").split(".") if m.startswith("test_")), "?")
        out[f] = out.get(f, 0.0) + float(case.get("time") or 0)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    p.add_argument("-n", type=int, default=int(os.environ.get("PYTEST_SHARDS") or min(4, cores)),
                   help="number of shards (default: $PYTEST_SHARDS, else the usable cores up to 4; 1: one plain pytest)")
    p.add_argument("--tests", type=Path, default=ROOT / "tests", help="the test folder (default: tests/ of this checkout)")
    p.add_argument("--write-durations", action="store_true", help="store the measured per-file seconds in DIR/durations.json")
    a, extra = p.parse_known_args(argv)
    if a.n < 1: p.error(f"-n must be >= 1, got {a.n}")
    tests = a.tests.resolve()
    if not tests.is_dir(): p.error(f"--tests {a.tests}: not a directory")
    cwd, durations = tests.parent, tests / "durations.json"
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if a.n == 1: return subprocess.call([*base, str(tests), *extra], cwd=cwd)
    weights = json.loads(durations.read_text()) if durations.is_file() else {}
    files = sorted(p.name for p in tests.glob("test_*.py"))
    if not files:
        print(f"[shards] no test_*.py in {tests}", flush=True); return 5
    shards = plan(files, weights, a.n)
    tmp = Path(tempfile.mkdtemp(prefix="stalebook-shards-"))
    procs, t0 = [], time.time()
    for i, fs in enumerate(shards):
        log = open(tmp / f"shard{i}.log", "w")
        print(f"[shards] shard {i}: {len(fs)} files, ~{sum(weights.get(f, 0) for f in fs):.0f} s: {' '.join(fs)}", flush=True)
        procs.append((subprocess.Popen([*base, f"--basetemp={tmp / f'tmp{i}'}", f"--junitxml={tmp / f'shard{i}.xml'}",
                                        *[str(tests / f) for f in fs], *extra], cwd=cwd, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        report = t0 + 60
        while any(pr.poll() is None for pr, _ in procs):
            time.sleep(1)
            if time.time() >= report:
                report += 60
                state = ", ".join(f"shard {i} {'running' if pr.poll() is None else f'done (exit {pr.returncode})'}" for i, (pr, _) in enumerate(procs))
                print(f"[shards] {(time.time() - t0) / 60:.0f} min: {state}", flush=True)
    except KeyboardInterrupt:
        for pr, _ in procs: pr.terminate()
        raise
    rcs = [pr.wait() for pr, _ in procs]
    for _, log in procs: log.close()
    measured = {}
    for i in range(len(shards)):
        print(f"\n[shards] ---- shard {i} (exit {rcs[i]}) ----", flush=True)
        sys.stdout.write((tmp / f"shard{i}.log").read_text()); sys.stdout.flush()
        if (tmp / f"shard{i}.xml").is_file(): measured.update(file_seconds(tmp / f"shard{i}.xml"))
    print(f"\n[shards] {len(shards)} shards in {time.time() - t0:.0f} s, exit {rcs}; per shard (measured): "
          + ", ".join(f"{sum(measured.get(f, 0) for f in fs):.0f} s" for fs in shards), flush=True)
    if a.write_durations and measured:
        durations.write_text(json.dumps({f: round(s, 1) for f, s in sorted(measured.items())}, indent=1) + "\n")
        print(f"[shards] wrote {durations}")
    shutil.rmtree(tmp, ignore_errors=True)
    bad = [rc for rc in rcs if rc != 0]
    return bad[0] if bad else 0


if __name__ == "__main__":
    sys.exit(main())
