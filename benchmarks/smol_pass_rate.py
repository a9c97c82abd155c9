"""Temperature-1 pass rate of SmolLM2-135M-Instruct as imported on the natural-language math family (`math_nl`).

N prompts from `task_pool("math_nl", N, seed, level)`, K samples each at temperature 1 (stalebook's hf sampler:
chat-template prompts with the system prompt given on the command line, stop at <|im_end|>), graded by the family's
verifier (`reward`: the number right after the last 'Answer:', compared exactly; text that is not a number judged by
math-verify). Prints the pass rate with its binomial standard error over the N*K samples, the standard error of the
mean over prompts (the K samples of a prompt are not independent), how many completions used the 'Answer:' format, and
a few example completions. This is the "before warm start" baseline of the real model. The snapshot is a Q4_1 GGUF
dequantization (see its stalebook_build.json), not the original bf16 weights.

    PYTHONPATH=. python benchmarks/smol_pass_rate.py --system "You are a helpful assistant." [--n 32] [--k 2]
        [--tokens 24] [--threads 2] [--level 0] [--seed 0] [--examples 4] [--snapshot DIR]
"""

import math
import sys
import time


def _parser():
    from benchargs import add_threads

    from stalebook.core import CommandParser

    ap = CommandParser(prog="smol_pass_rate.py", description=__doc__.splitlines()[0])
    ap.add_argument("--system", required=True, help="the system turn of every prompt (stated explicitly)")
    ap.add_argument("--n", type=int, default=32, help="prompts")
    ap.add_argument("--k", type=int, default=2, help="samples per prompt")
    ap.add_argument("--tokens", type=int, default=24, help="max new tokens (<= 24)")
    add_threads(ap, 2)
    ap.add_argument("--level", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=int, default=4)
    ap.add_argument("--snapshot", default="", help="snapshot folder (default: the `make smol` one)")
    return ap


def _check(a) -> None:
    from stalebook.core import StalebookError
    from stalebook.tasks import MATH_NL_LEVELS

    for name, lo in (("n", 1), ("k", 1), ("tokens", 1), ("threads", 1), ("examples", 0), ("seed", 0)):
        if getattr(a, name) < lo:
            raise StalebookError(f"--{name} must be >= {lo}, got {getattr(a, name)}")
    if a.tokens > 24:
        raise StalebookError(f"--tokens must be <= 24, got {a.tokens}")
    if a.level not in MATH_NL_LEVELS:
        raise StalebookError(f"--level must be one of {MATH_NL_LEVELS}, got {a.level}")
    if not a.system.strip():
        raise StalebookError("--system must not be empty")


def main(argv=None) -> int:
    import torch

    from stalebook.core import Domain
    from stalebook.model import load_policy
    from stalebook.pretrained import smol_snapshot
    from stalebook.rollouts import SamplingConfig, make_sampler, sample_batch, task_pool
    from stalebook.tasks import reward

    a = _parser().parse_args(argv)
    _check(a)
    torch.set_num_threads(a.threads)
    snap = a.snapshot or str(smol_snapshot())
    model, tok = load_policy(snap, device="cpu", dtype="float32")  # as imported: no adapter
    model.eval()
    tasks = task_pool("math_nl", a.n, a.seed, a.level)
    sc = SamplingConfig(
        group_size=a.k, max_new_tokens=a.tokens, temperature=1.0, groups_per_batch=a.n, system_prompt=a.system
    )
    t0 = time.perf_counter()
    gen = sample_batch(make_sampler("hf", model, tok), tasks, Domain(a.seed, ("bench", "smol_pass_rate")), sc)
    t_gen = time.perf_counter() - t0
    rows = [reward(tasks[i // a.k], text) for i, text in enumerate(gen.texts)]
    r = [x for x, _ in rows]
    m = len(r)
    p = sum(r) / m
    per_prompt = [sum(r[i * a.k : (i + 1) * a.k]) / a.k for i in range(a.n)]
    se_prompt = math.sqrt(sum((x - p) ** 2 for x in per_prompt) / (a.n - 1) / a.n) if a.n > 1 else float("nan")
    fmt = sum(d["method"] == "answer" for _, d in rows)
    print(
        f"SmolLM2-135M-Instruct as imported (Q4_1 GGUF dequantized), float32 CPU, {a.threads} threads; math_nl level "
        f"{a.level}, seed {a.seed}: {a.n} prompts x K={a.k}, temperature 1, <= {a.tokens} new tokens, "
        f"system prompt {a.system!r}"
    )
    print(
        f"pass rate {p:.3f} ± {math.sqrt(p * (1 - p) / m):.3f} (binomial SE, {int(sum(r))}/{m}); "
        f"SE over prompts {se_prompt:.3f}"
    )
    print(f"'Answer: N' format used in {fmt}/{m} completions; generation {t_gen:.1f} s")
    for i in range(min(a.examples, m)):
        t = tasks[i // a.k]
        print(f"  [{rows[i][0]:.0f}] {t.prompt.splitlines()[0]!r} (ref {t.answer}) -> {gen.texts[i]!r}")
    return 0


if __name__ == "__main__":
    from stalebook.core import StalebookError

    try:
        sys.exit(main())
    except StalebookError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
