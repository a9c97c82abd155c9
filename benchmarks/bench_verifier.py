"""Code-verifier throughput: the fork server against a fresh sandbox per program, and what it buys a GRPO step.

1. Verifier: the same 200 distinct programs (100 synthetic code tasks of level 1 with distinct reference
   expressions, each with its reference completion and a wrong one: half correct) verified by `tasks.rewards` with
   2 workers, once through a pool of fork servers and once through fresh per-program sandboxes, side by side in one
   run and interleaved
   (per-program, fork, per-program, fork, ...). Fork-server timings are *cold*: the pool is new, so they
   include starting its templates; a second, warm pass on the same pool is reported too. Both paths must
   give byte-identical rewards and details (checked).
2. GRPO step: `Trainer.train_step` on the tiny snapshot, prompts_per_step = 16, group_size = 16
   (256 completions per step), max_new_tokens = 12, lr 3e-3 (the learning configs), on the math domain
   and on the code domain (the trainer's verifier: a VerifierProcess with fork servers on the cores the model
   leaves), each also with `shared_prefix` (each prompt's tokens run once per group in generation and in the
   teacher-forced passes), steps interleaved after one warm-up step each. First the criterion's measurement:
   those four arms alone, round after round (--criterion-steps). Then every arm together (--steps): the same
   four, and code with per-program sandboxes, with the verifier's parent side in the trainer's own process (what
   the trainer did before the VerifierProcess), and with a verifier that costs nothing: the floor no verifier can
   lower, with whole rows and with the shared prefix. That floor is measured on the same trajectory: a trainer
   whose verifier looks up the verdicts the code arm's verifier has just given the same completions (it samples
   the same completions because it gets the same rewards; a miss is counted and verified). A verifier that gave
   every completion 0 would be cheaper still but would not learn, and would sample other completions than the
   code arm. The time spent in `batch_rewards` is measured by wrapping it (not re-implemented); the trainer
   verifies on a thread, micro-batch by micro-batch in the learner's order, while the model's passes run, so
   that time is mostly hidden. The criterion's arms run alone first, for more rounds, so that nothing else shares
   the two cores around their steps (the per-program arm starts 80 fresh sandboxes per step); both loops are
   reported. Ratios are reported of the medians and as the median of per-round
   ratios (each round runs every arm once, so a round's ratio compares steps seconds apart). Goal: code step
   <= 2x math step, with the same trainer settings.

    PYTHONPATH=. python benchmarks/bench_verifier.py [--repeat 2] [--steps 3] [--criterion-steps 16]
                                                    [--snapshot $STALEBOOK_TINY]
                                                    [--json results/records/bench_verifier.json] [--append]

The machine is shared (2 cores, other jobs running): every ratio is measured side by side in one run.
"""

import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchargs import add_record  # noqa: E402 (after the sys.path insert above)

from stalebook import sandbox  # noqa: E402 (after the sys.path insert above)
from stalebook import tasks as T  # noqa: E402 (after the sys.path insert above)
from stalebook import trainer as TR  # noqa: E402 (after the sys.path insert above)
from stalebook.core import Domain  # noqa: E402 (after the sys.path insert above)
from stalebook.rollouts import SamplingConfig  # noqa: E402 (after the sys.path insert above)


def programs(n_tasks: int = 100):
    "n_tasks synthetic code tasks x (reference, wrong) = 2 n_tasks distinct programs, half correct."
    seen, ts = set(), []
    for t in T.synthetic_tasks("code", 8 * n_tasks, Domain(0, ("bench", "verifier")), level=1):
        if t.answer not in seen and len(ts) < n_tasks:
            seen.add(t.answer)
            ts.append(t)
    rows = [(t, c) for t in ts for c in (t.answer, t.answer + "+1")]
    assert len({T.code_program(t, c) for t, c in rows}) == len(rows)
    return [t for t, _ in rows], [c for _, c in rows]


def verify(tasks, comps, workers: int, fork_server: bool) -> dict:
    with sandbox.Pool(workers=workers, fork_server=fork_server) as pool:
        t0 = time.perf_counter()
        got = T.rewards(tasks, comps, workers=workers, pool=pool)
        cold = time.perf_counter() - t0
        warm = None
        if fork_server:
            t0 = time.perf_counter()
            again = T.rewards(tasks, comps, workers=workers, pool=pool)
            warm = time.perf_counter() - t0
            assert again == got
        stats, fallback = dict(pool.stats), pool.fallback
    if fork_server and (fallback or stats["per_program"]):
        raise SystemExit(f"fork server did not run: {fallback}")
    return dict(seconds=cold, warm_seconds=warm, rewards=got, stats=stats)


def bench_verifier(repeat: int, workers: int) -> dict:
    tasks, comps = programs()
    runs, ref = [], None
    for rep in range(repeat):
        fresh = verify(tasks, comps, workers, fork_server=False)
        fork = verify(tasks, comps, workers, fork_server=True)
        for r in (fresh, fork):
            if ref is None:
                ref = json.dumps(r["rewards"], sort_keys=True)
            assert json.dumps(r["rewards"], sort_keys=True) == ref, "the two paths disagree"
        n = len(tasks)
        run = dict(
            per_program_s=round(fresh["seconds"], 3),
            fork_cold_s=round(fork["seconds"], 3),
            fork_warm_s=round(fork["warm_seconds"], 3),
            per_program_pps=round(n / fresh["seconds"], 1),
            fork_cold_pps=round(n / fork["seconds"], 1),
            fork_warm_pps=round(n / fork["warm_seconds"], 1),
            ratio_cold=round(fresh["seconds"] / fork["seconds"], 2),
            ratio_warm=round(fresh["seconds"] / fork["warm_seconds"], 2),
        )
        runs.append(run)
        print(
            f"verifier rep {rep + 1}/{repeat}: per-program {run['per_program_pps']:.0f} programs/s | fork server "
            f"{run['fork_cold_pps']:.0f}/s cold, {run['fork_warm_pps']:.0f}/s warm | "
            f"ratio {run['ratio_cold']:.1f}x cold, "
            f"{run['ratio_warm']:.1f}x warm",
            flush=True,
        )
    n_ok = sum(r for r, _ in json.loads(ref))
    return dict(
        n_programs=len(tasks),
        n_correct=int(n_ok),
        workers=workers,
        isolation=sandbox.isolation(),
        runs=runs,
        paths_agree=True,
    )


def trainer(
    domain: str, snapshot: str, out: Path, shared_prefix: bool = False, reward_fn=None, data=None
) -> TR.Trainer:
    cfg = TR.TrainConfig(
        out=str(out / domain),
        snapshot=snapshot,
        domain=domain,
        task_level=0,
        n_tasks=256,
        seed=0,
        steps=100,
        prompts_per_step=16,
        sampling=SamplingConfig(group_size=16, max_new_tokens=12, groups_per_batch=16),
        lr=3e-3,
        lineage_steps=(0,),
        checkpoint_every=1000,
        shared_prefix=shared_prefix,
    )
    return TR.Trainer(cfg, reward_fn=reward_fn, data=data)  # data: the source whose `score` verifies rows


ARMS = [
    ("math", "math", None, False),
    ("code", "code", "process", False),
    ("code_per_program", "code", "process-per-program", False),
    ("code_replayed", "code", "replay:code", False),
    ("math_shared_prefix", "math", None, True),
    ("code_shared_prefix", "code", "process", True),
    ("code_shared_prefix_in_process", "code", "thread", True),
    ("code_shared_prefix_replayed", "code", "replay:code_shared_prefix", True),
]  # name, domain, verifier, shared prefix
CRITERION = [
    a for a in ARMS if a[0] in ("math", "code", "math_shared_prefix", "code_shared_prefix")
]  # the trainer as a run uses it


def run_arms(arms, steps: int, snapshot: str) -> tuple[dict, dict]:
    """Rounds of one train_step per arm (`arms`: name, domain, verifier, shared prefix), after one warm-up round: each
    arm's per-step rows and mean prompt length. Verifiers: `process` (the trainer's own, a VerifierProcess on the cores
    the model leaves, fork servers), `process-per-program` (the same with fresh sandboxes), `thread` (its verifier
    thread calling `tasks.rewards` in this process: what the trainer did before), `replay:ARM` (ARM's verdicts of this
    round, looked up)."""
    spent = {"t": 0.0, "programs": 0, "arm": None, "missed": 0}
    verdicts = {name: {} for name, *_ in arms}  # (task id, text) -> the arm's verdict this round
    real = TR.batch_rewards

    def timed(tasks, texts, *a, **k):
        t0 = time.perf_counter()
        try:
            got = real(tasks, texts, *a, **k)
            verdicts[spent["arm"]].update(((t.id, x), r) for t, x, r in zip(tasks, texts, got))
            return got
        finally:
            spent["t"] += time.perf_counter() - t0
            spent["programs"] += len(
                {
                    (T.code_program(t, x), t.tests)
                    for t, x in zip(tasks, texts)
                    if t.domain == "code" and T.code_precheck(t, x)[1] is None
                }
            )

    def replay(src):
        def reward_fn(task, text):
            if (task.id, text) in verdicts[src]:
                return verdicts[src][task.id, text]
            spent["missed"] += 1
            return T.reward(task, text)

        return reward_fn

    class TimedData(TR.OnlineData):
        "The trainer's data, its rows verified through `timed` (the data source's `score` hook)."

        def score(self, tasks, texts, *a, **k):
            return timed(tasks, texts, *a, **k)

    with tempfile.TemporaryDirectory(prefix="bench-verifier-") as d:
        trs = {
            name: trainer(
                dom,
                snapshot,
                Path(d) / name,
                sp,
                replay(v.split(":")[1]) if (v or "").startswith("replay:") else None,
                TimedData(),
            )
            for name, dom, v, sp in arms
        }
        for name, _, v, _ in arms:
            if v == "thread":
                pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stalebook-verifier")
                trs[name].data.verifier = pool
        rows = {name: [] for name, *_ in arms}
        for i in range(steps + 1):  # step 0 = warm-up (processes and templates start there)
            for v in verdicts.values():
                v.clear()
            for name, _, v, _ in arms:
                spent.update(t=0.0, programs=0, arm=name, missed=0)
                if v == "process-per-program" and i == 0:
                    os.environ["STALEBOOK_SANDBOX_FORKSERVER"] = "0"
                try:
                    rec = trs[name].train_step()
                finally:
                    os.environ.pop("STALEBOOK_SANDBOX_FORKSERVER", None)
                if i:
                    rows[name].append(
                        dict(
                            t_step=rec["t_step"],
                            t_gen=rec["t_gen"],
                            t_reward=round(spent["t"], 4),
                            programs=spent["programs"],
                            completion_tokens=rec["n_tokens"],
                            reward_mean=rec["reward_mean"],
                            replay_misses=spent["missed"],
                        )
                    )
            if i:
                print(
                    f"step {i}/{steps}: " + "  ".join(f"{n} {rows[n][-1]['t_step']:.2f}s" for n, *_ in arms), flush=True
                )
        for tr in trs.values():
            if tr.data.verifier_proc is not None:
                tr.data.verifier_proc.close()
    prompt = {n: round(statistics.mean(len(t.prompt) for t in tr.tasks), 1) for n, tr in trs.items()}
    return rows, prompt


def ratios(rows: dict, a: str, b: str) -> tuple[float, float]:
    "Step time of arm a over arm b: (ratio of the medians, median of the rounds' own ratios)."
    med = lambda n: statistics.median(r["t_step"] for r in rows[n])
    return round(med(a) / med(b), 2), round(
        statistics.median(x["t_step"] / y["t_step"] for x, y in zip(rows[a], rows[b])), 2
    )


def bench_criterion(steps: int, snapshot: str) -> dict:
    """The criterion's measurement: the trainer on code against the trainer on math, whole rows and shared prefix, and
    nothing else in the rounds (the diagnostic arms' fresh sandboxes and extra processes would share the same 2
    cores)."""
    rows, _ = run_arms(CRITERION, steps, snapshot)
    return dict(
        steps=steps,
        rows=rows,
        median_step_s={n: round(statistics.median(r["t_step"] for r in rs), 3) for n, rs in rows.items()},
        code_to_math=dict(zip(("medians", "per_round"), ratios(rows, "code", "math"))),
        code_to_math_shared_prefix=dict(
            zip(("medians", "per_round"), ratios(rows, "code_shared_prefix", "math_shared_prefix"))
        ),
        ratio_completion_tokens_code_to_math=round(
            statistics.mean(r["completion_tokens"] for r in rows["code"])
            / statistics.mean(r["completion_tokens"] for r in rows["math"]),
            2,
        ),
    )


def bench_step(steps: int, snapshot: str) -> dict:
    "Every arm in each round: what verification costs a step (per-program, in-process, replayed), side by side."
    rows, prompt = run_arms(ARMS, steps, snapshot)
    med = {n: statistics.median(r["t_step"] for r in rs) for n, rs in rows.items()}
    sp = lambda n: round(med[n] / med["math_shared_prefix"], 2)
    paired = lambda a, b: ratios(rows, a, b)[1]
    return dict(
        prompts_per_step=16,
        group_size=16,
        max_new_tokens=12,
        steps=steps,
        rows=rows,
        mean_prompt_chars=prompt,
        verifier_workers=TR.verifier_workers(1),
        median_step_s={n: round(v, 3) for n, v in med.items()},
        median_reward_s={n: round(statistics.median(r["t_reward"] for r in rs), 3) for n, rs in rows.items()},
        ratio_code_to_math=round(med["code"] / med["math"], 2),
        ratio_code_to_math_shared_prefix=sp("code_shared_prefix"),
        ratio_code_in_process_to_math_shared_prefix=sp("code_shared_prefix_in_process"),
        ratio_code_per_program_to_math=round(med["code_per_program"] / med["math"], 2),
        ratio_code_replayed_to_math=round(med["code_replayed"] / med["math"], 2),
        ratio_code_replayed_to_math_shared_prefix=sp("code_shared_prefix_replayed"),
        paired_ratio={
            "code/math": paired("code", "math"),
            "code_replayed/math": paired("code_replayed", "math"),
            "code/math, shared prefix": paired("code_shared_prefix", "math_shared_prefix"),
            "code_replayed/math, shared prefix": paired("code_shared_prefix_replayed", "math_shared_prefix"),
            "code/code_replayed": paired("code", "code_replayed"),
            "code/code_replayed, shared prefix": paired("code_shared_prefix", "code_shared_prefix_replayed"),
        },
        replay_misses=sum(r["replay_misses"] for rs in rows.values() for r in rs),
        speedup_shared_prefix={d: round(med[d] / med[f"{d}_shared_prefix"], 2) for d in ("math", "code")},
        ratio_completion_tokens_code_to_math=round(
            statistics.mean(r["completion_tokens"] for r in rows["code"])
            / statistics.mean(r["completion_tokens"] for r in rows["math"]),
            2,
        ),
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=2, help="verifier comparisons (each: per-program, then fork server)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="timed GRPO steps per arm, all arms (after one warm-up step)")
    p.add_argument(
        "--criterion-steps", type=int, default=16, help="timed GRPO steps per arm, the criterion's four arms alone"
    )
    p.add_argument(
        "--snapshot", default=os.environ.get("STALEBOOK_TINY", ""), help="tiny snapshot (default $STALEBOOK_TINY)"
    )
    p.add_argument("--no-step", action="store_true", help="skip the GRPO-step part")
    add_record(p, "bench_verifier")
    p.add_argument(
        "--append", action="store_true", help="add this invocation to the file's list instead of replacing it"
    )
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    inv = dict(
        cores=sandbox.cores(),
        cpu=platform.processor() or platform.machine(),
        shared_machine=True,
        verifier=bench_verifier(a.repeat, a.workers),
    )
    if not a.no_step:
        inv["criterion"], inv["step"] = bench_criterion(a.criterion_steps, a.snapshot), bench_step(a.steps, a.snapshot)
    v = inv["verifier"]["runs"]
    print(
        f"verifier: fork server / per-program = {', '.join(str(r['ratio_cold']) for r in v)}x (cold), "
        f"{', '.join(str(r['ratio_warm']) for r in v)}x (warm)"
    )
    if "criterion" in inv:
        c = inv["criterion"]
        print(
            f"the criterion's arms alone, {c['steps']} rounds: "
            f"code / math {c['code_to_math']['medians']:.2f}x (per round "
            f"{c['code_to_math']['per_round']:.2f}x) whole rows, "
            f"{c['code_to_math_shared_prefix']['medians']:.2f}x (per round "
            f"{c['code_to_math_shared_prefix']['per_round']:.2f}x) shared prefix; median steps "
            + ", ".join(f"{k} {v:.2f}s" for k, v in c["median_step_s"].items())
        )
    if "step" in inv:
        s = inv["step"]
        m = s["median_step_s"]
        print(
            f"GRPO 16x16 step (median): math {m['math']:.2f}s, code {m['code']:.2f}s "
            f"({s['ratio_code_to_math']:.2f}x math; "
            f"per-program sandboxes {m['code_per_program']:.2f}s, "
            f"{s['ratio_code_per_program_to_math']:.2f}x) | shared prefix: "
            f"math {m['math_shared_prefix']:.2f}s, code {m['code_shared_prefix']:.2f}s "
            f"({s['ratio_code_to_math_shared_prefix']:.2f}x math; "
            f"verifier in this process {m['code_shared_prefix_in_process']:.2f}s, "
            f"{s['ratio_code_in_process_to_math_shared_prefix']:.2f}x) | "
            f"verification {s['median_reward_s']['code_shared_prefix']:.2f}s per code step, "
            "overlapping the model's passes"
        )
        print(
            f"the same trajectory with its verdicts replayed (no verification): code {m['code_replayed']:.2f}s "
            f"({s['ratio_code_replayed_to_math']:.2f}x math), shared prefix {m['code_shared_prefix_replayed']:.2f}s "
            f"({s['ratio_code_replayed_to_math_shared_prefix']:.2f}x) | replay misses {s['replay_misses']}"
        )
        print("median of per-round ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in s["paired_ratio"].items()))
    path = Path(a.json)
    old = json.loads(path.read_text()) if a.append and path.exists() else {"invocations": []}
    old["invocations"].append(inv)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old, indent=1) + "\n")
    return inv


if __name__ == "__main__":
    main()
