"""A point's rollout store on SmolLM2 with and without `shared_prefix`, side by side in one run.

A point's stores (`PointConfig.shared_prefix`, the `smol` registry's setting) generate with each chat prompt's
forward once per group, its KV cache continued by the group's K rows, instead of once per row; their behaviour
log-probs are still whole-row passes (the bits the scoring pass recomputes). On the chat model a prompt (system turn,
question, answer-format line: ~50 tokens) is several times longer than an answer (<= 12 tokens), so the prompt's
forward is most of a store's cost. Both stores here: the same tasks (`task_pool("math_nl", G)`), RNG domain,
sampling config (K = 4, 12 new tokens, G groups per batch: the registry's) and model; timed `--reps` times each,
interleaved, in fresh folders; medians, the ratio, and whether the sampled tokens and the recorded log-probs agree.

    PYTHONPATH=. python benchmarks/bench_shared_prefix.py [--snapshot DIR] [--groups 16] [--reps 2] [--threads 1]
        [--json PATH]
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchargs import add_record, add_reps, add_threads

import stalebook  # noqa: F401  (pins the CPU numerics before torch loads)

RESULTS = Path(__file__).resolve().parents[1] / "results" / "records" / "bench_shared_prefix.json"
SNAPSHOT = "runs/snapshots/smollm2-135m-instruct-math"


def one_store(model, tok, tasks, sc, shared_prefix: bool, root: Path):
    "(wall seconds, records) of a fresh store of `tasks`."
    from stalebook.core import Domain
    from stalebook.rollouts import RolloutStore, generate_store, numerics_of

    st = RolloutStore(
        root,
        "b" * 64,
        Domain(0, ("bench", "shared-prefix")),
        sc,
        [t.id for t in tasks],
        numerics=numerics_of(model),
        shared_prefix=shared_prefix,
    )
    t0 = time.perf_counter()
    generate_store(model, tok, tasks, st, progress=False)
    return time.perf_counter() - t0, st.records


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--snapshot", default=SNAPSHOT, help="a chat snapshot (default: the warm-started SmolLM2)")
    ap.add_argument("--groups", type=int, default=16)
    add_reps(ap, 2)
    add_threads(ap)
    add_record(ap, "bench_shared_prefix")
    a = ap.parse_args(argv)
    if not Path(a.snapshot).is_dir():
        raise SystemExit(f"{a.snapshot}: no snapshot there; build it with `make smol-warm`")
    from stalebook.model import compute_setup
    from stalebook.rollouts import SamplingConfig, load_run_policy, task_pool

    compute_setup(a.threads)
    model, tok = load_run_policy(a.snapshot, "", "cpu", "float32")
    tasks = task_pool("math_nl", a.groups, 0)
    sc = SamplingConfig(
        group_size=4, max_new_tokens=12, groups_per_batch=a.groups, system_prompt="You are a helpful assistant."
    )
    times, recs = {False: [], True: []}, {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.reps):
            for sp in (False, True):
                s, recs[sp] = one_store(model, tok, tasks, sc, sp, Path(d) / f"{r}-{sp}")
                times[sp].append(s)
                print(f"rep {r}: shared_prefix={sp}: {s:.1f} s", flush=True)
    a_, b_ = recs[False], recs[True]
    out = dict(
        what="a point's rollout store on SmolLM2: whole rows vs shared_prefix generation, side by side",
        snapshot=a.snapshot,
        groups=a.groups,
        K=sc.group_size,
        max_new_tokens=sc.max_new_tokens,
        threads=a.threads,
        rollouts=a.groups * sc.group_size,
        whole_rows_s=statistics.median(times[False]),
        shared_prefix_s=statistics.median(times[True]),
        times=dict(whole_rows=times[False], shared_prefix=times[True]),
        same_tokens=[r["tokens"] for r in a_] == [r["tokens"] for r in b_],
        same_logp=[r["logp"] for r in a_] == [r["logp"] for r in b_],
        prompt_tokens_mean=statistics.mean(len(r["prompt_ids"]) for r in a_),
        completion_tokens_mean=statistics.mean(len(c) for r in a_ for c in r["tokens"]),
    )
    out["speedup"] = out["whole_rows_s"] / out["shared_prefix_s"]
    print(json.dumps({k: v for k, v in out.items() if k != "times"}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
