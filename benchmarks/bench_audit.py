"""Streaming audit: rows/s and peak RSS of `stalebook audit` on a generated log of 1 GB, against a quarter of it.

A stalebook token export (the widest of the formats: three per-token log-prob arrays per row) is generated with
`--rows-per-step` rows of `--width` tokens per step until the folder holds `--gb` GB (and, for the comparison, a
quarter of that); the values are random but valid (log-probs < 0, masks, lags 0..3). Each log is then audited in a
fresh process (`stalebook audit --no-report --quiet`), which reports its own peak RSS (`ru_maxrss`) and wall time.
Bounded memory means the peak RSS of the 1 GB audit is that of the quarter-size one, not four times it. The
baseline the issue names is what a script would do without streaming: the same quarter-size log parsed into a
list of records in one process (its peak RSS is measured the same way; it is not run on the full log).

    PYTHONPATH=. python benchmarks/bench_audit.py [--gb 1.0] [--root /tmp/bench-audit] [--keep]
                                                  [--json results/records/bench_audit.json]

The machine is shared (2 cores, other jobs running): wall times are indicative; the RSS ratio is the result.

With `--martingale-mb MB` it measures instead the same tokens through the two doctors, side by side (issue 55): a
martingale workspace of about MB MB of `tokens.db` is recorded with martingale's own `Recorder` (revisions at steps
0.., 64 sequences of 128 tokens a step at lags 0..3, every token scored at its step), then audited in a fresh process
by `stalebook audit` (format martingale) and by martingale's doctor (`decompose` + `attribute`, what
`martingale doctor --json` runs): scored tokens per second and peak RSS of each, and the largest difference of their
per-lag tables (written to `results/records/bench_audit_martingale.json`).

    PYTHONPATH=. python benchmarks/bench_audit.py --martingale-mb 50
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
from benchargs import add_record

import numpy as np  # isort: skip

HERE = Path(__file__).resolve().parent
CHILD = """
import json, resource, sys, time
from pathlib import Path
mode, path = sys.argv[1], sys.argv[2]
from stalebook.audit import audit  # the imports (torch: ~0.4 GB of RSS) are not timed

rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
if mode == "audit":
    res = audit(path, progress=False)
    rows = res["run"]["samples"]
elif mode == "audit-martingale":
    res = audit(path, "martingale", progress=False)
    rows, out = res["run"]["tokens"], res["staleness"]
elif mode == "doctor":
    from martingale.diagnostics import attribute, decompose
    from martingale.record import TokenLedger
    led = TokenLedger(Path(path) / "tokens.db", readonly=True)
    d = decompose(led)
    d["attribution"] = attribute(d)
    rows, out = d["n_scored_tokens"], d
else:  # the baseline: every record parsed into memory
    from pathlib import Path
    recs = [json.loads(line) for f in sorted(Path(path, "token_exports").glob("step_*.jsonl")) for line in open(f)]
    rows = len(recs)
wall = time.perf_counter() - t0
if mode in ("audit-martingale", "doctor"):
    Path(sys.argv[3]).write_text(json.dumps(out))
print(json.dumps(dict(rows=rows, wall_s=wall, rss_after_imports_mb=rss_import,
                      peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


def row_pool(rows: int, width: int, seed: int = 0) -> list[str]:
    "JSON tails (everything after step and version) of `rows` distinct valid rows of `width` tokens."
    g, out = np.random.default_rng(seed), []
    for i in range(rows):
        n = int(g.integers(width // 2, width + 1))
        mask = [1] * n + [0] * (width - n)
        samp = (-g.exponential(1.0, n)).tolist()
        beh = [x + float(g.normal(0, 1e-3)) for x in samp] + [0.0] * (width - n)
        lrn = [x + float(g.normal(0, 0.05)) for x in beh[:n]] + [0.0] * (width - n)
        tail = dict(
            format="stalebook-token-export/1",
            policy_hash="0" * 16,
            width=width,
            dtype="float64",
            correction="none",
            level="token",
            is_threshold=2.0,
            clip_epsilon=0.2,
            clip_epsilon_high=None,
            row=i,
            group=i // 8,
            prompt_ids=[int(x) for x in g.integers(0, 50000, 64)],
            completion_ids=[int(x) for x in g.integers(0, 50000, n)],
            reward=float(g.random() < 0.5),
            advantage=float(g.normal()),
            mask=mask,
            sampler_logp=samp,
            behaviour_logp=beh,
            learner_logp=lrn,
        )
        out.append(json.dumps(tail)[1:])
    return out


def generate(folder: Path, gb: float, rows_per_step: int, width: int) -> dict:
    "A token-export folder of about `gb` GB; returns rows, steps and bytes written."
    d = folder / "token_exports"
    d.mkdir(parents=True, exist_ok=True)
    pool, size, step, rows = row_pool(rows_per_step, width), 0, 0, 0
    while size < gb * 1e9:
        lines = "".join(f'{{"step": {step}, "version": {step - (step + i) % 4}, {t}\n' for i, t in enumerate(pool))
        (d / f"step_{step:06d}.jsonl").write_text(lines)
        size, step, rows = size + len(lines), step + 1, rows + len(pool)
    return dict(bytes=size, steps=step, rows=rows)


def martingale_record(ws: Path, mb: float, per_step: int = 64, length: int = 128, seed: int = 0) -> dict:
    "A martingale workspace of about `mb` MB of tokens.db, recorded with martingale's Recorder; its size and counts."
    import hashlib

    from martingale.record import Recorder, SamplerConfig

    sampler = SamplerConfig(temperature=1.0, top_p=1.0, max_tokens=length, logprobs_mode="processed_logprobs",
                            dtype="bfloat16", engine="bench", engine_version="0", seed_policy="bench",
                            logprobs_source="engine_sampling", temperature_applied=True)  # fmt: skip
    g, rec, revs, step, seqs = np.random.default_rng(seed), Recorder(ws), {}, 0, 0
    db = ws / "tokens.db"
    while db.stat().st_size + (ws / "tokens.db-wal").stat().st_size * (ws / "tokens.db-wal").exists() < mb * 1e6:
        w = hashlib.blake2b(f"w{step}".encode(), digest_size=32).hexdigest()
        revs[step] = rec.publish_revision(w, b"bench tokenizer", sampler, step=step).digest
        for i in range(per_step):
            v = max(0, step - i % 4)
            beh = -g.exponential(1.0, length)
            with rec.sequence(actor_id=0, sequence_id=f"{step}-{i}", prompt_ids=[1, 2, i]) as s:
                for t, lp in zip(g.integers(0, 50000, length).tolist(), beh.tolist()):
                    s.token(revs[v], t, lp, dtype="f64")
                s.reward(float(i % 2), dtype="f64")
            drift = g.normal(0, 1e-3 + 0.05 * (step - v), length)
            rec.score(s.record.digest, revs[step], (beh + drift).tolist(), dtype="f64")
            seqs += 1
        step += 1
    rec.ledger.close()
    return dict(bytes=db.stat().st_size, steps=step, sequences=seqs, tokens=seqs * length)


def martingale_side_by_side(root: Path, mb: float, out_json: Path) -> None:
    "Both doctors on one martingale record, each in a fresh process."
    ws = root / "martingale"
    ws.mkdir(parents=True)
    t0 = time.perf_counter()
    g = martingale_record(ws, mb)
    print(f"recorded {g['bytes'] / 1e6:.0f} MB, {g['tokens']} tokens with martingale's Recorder in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    res = dict(
        machine=f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), shared", record=g, runs={}
    )
    for mode in ("audit-martingale", "doctor"):
        r = child(mode, ws, root / f"{mode}.json")
        res["runs"][mode] = dict(r, tokens_per_s=r["rows"] / r["wall_s"])
        print(f"[{mode}] {r['rows'] / r['wall_s']:.0f} tokens/s, peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    a, d = (json.loads((root / f"{m}.json").read_text()) for m in ("audit-martingale", "doctor"))
    keys = dict(mean_abs_log_ratio="mean_abs_log_ratio", ratio_mean="ratio_mean", ess_fraction="ess_frac")
    gap = max(
        abs(x["float_informational"][k] - y[v]) for x, y in zip(d["by_lag"], a["by_lag"]) for k, v in keys.items()
    )
    res["largest_difference_per_lag"] = gap
    speed = res["runs"]["audit-martingale"]["tokens_per_s"] / res["runs"]["doctor"]["tokens_per_s"]
    res["ratios"] = dict(tokens_per_s_audit_over_doctor=speed)
    print(f"largest per-lag difference {gap:.1e}; audit / doctor speed {speed:.2f}")
    out_json.write_text(json.dumps(res, indent=2) + "\n")


def child(mode: str, path: Path, out: Path | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    args = [sys.executable, "-c", CHILD, mode, str(path)] + ([str(out)] if out else [])
    out = subprocess.run(args, capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{mode} on {path} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--rows-per-step", type=int, default=64)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--root", default="/tmp/bench-audit")
    ap.add_argument("--keep", action="store_true", help="keep the generated logs")
    add_record(ap, "bench_audit")
    ap.add_argument("--martingale-mb", type=float, default=None, help="the side-by-side with martingale doctor instead")
    a = ap.parse_args(argv)
    root = Path(a.root)
    shutil.rmtree(root, ignore_errors=True)
    if a.martingale_mb:
        try:
            return martingale_side_by_side(root, a.martingale_mb, Path(a.json).with_name("bench_audit_martingale.json"))
        finally:
            if not a.keep:
                shutil.rmtree(root, ignore_errors=True)
    res = dict(machine=f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), shared", runs={})
    load0 = os.getloadavg()[0]
    for name, gb in (("quarter", a.gb / 4), ("full", a.gb)):
        t0 = time.perf_counter()
        g = generate(root / name, gb, a.rows_per_step, a.width)
        print(
            f"[{name}] generated {g['bytes'] / 1e9:.2f} GB, {g['rows']} rows, {g['steps']} steps "
            f"in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        r = child("audit", root / name)
        assert r["rows"] == g["rows"], (r, g)
        res["runs"][name] = dict(g, **r, rows_per_s=r["rows"] / r["wall_s"], mb_per_s=g["bytes"] / 1e6 / r["wall_s"])
        print(
            f"[{name}] audit: {r['rows'] / r['wall_s']:.0f} rows/s, {g['bytes'] / 1e6 / r['wall_s']:.1f} MB/s, "
            f"peak RSS {r['peak_rss_mb']:.0f} MB ({r['rss_after_imports_mb']:.0f} MB after the imports)",
            flush=True,
        )
    base = child("load-all", root / "quarter")
    res["runs"]["quarter_load_all"] = base
    q, f = res["runs"]["quarter"], res["runs"]["full"]
    res["ratios"] = dict(
        rss_full_over_quarter=f["peak_rss_mb"] / q["peak_rss_mb"],
        rss_load_all_over_audit_quarter=base["peak_rss_mb"] / q["peak_rss_mb"],
        own_rss_full_over_quarter=(f["peak_rss_mb"] - f["rss_after_imports_mb"])
        / (q["peak_rss_mb"] - q["rss_after_imports_mb"]),
        own_rss_load_all_over_audit_quarter=(base["peak_rss_mb"] - base["rss_after_imports_mb"])
        / (q["peak_rss_mb"] - q["rss_after_imports_mb"]),
        rows_per_s_full_over_quarter=f["rows_per_s"] / q["rows_per_s"],
    )
    print(
        f"baseline (quarter log parsed into memory): peak RSS {base['peak_rss_mb']:.0f} MB; ratios "
        + ", ".join(f"{k} {v:.2f}" for k, v in res["ratios"].items()),
        flush=True,
    )
    res["machine"] += f"; load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
