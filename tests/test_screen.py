"""The screened candidate pool of a ranking point (nbs/28_point, `screen_rollouts` / `screen_pool`) through the
registry machinery: the screen runs once per family in its own store, the point's pools are the kept prompts, the
screen is in the point's identity, and a screen that cannot fill the pools is refused with one line."""

import json
import shutil

import numpy as np
import pytest

from stalebook.contracts import problem_lines, registry_status
from stalebook.core import ConfigError, hash_file
from stalebook.registry import load_registry
from stalebook.units import run_registry

REG = """name: {name}
kind: ranking
models: {{tiny: {{}}}}
study:
  table: demo
  checkpoints: [0]
  train: {{prompts_per_step: 8, lr: 0.05, checkpoint_every: 1, sampling: {{group_size: 8, max_new_tokens: 6}}}}
  point: {{n_candidates: 12, n_validation: 4, k: 3, group_size: 4, max_new_tokens: 6, groups_per_batch: 4,
          k_sketch: 256{point}}}
  blocks: [{{models: [tiny], domains: [math], seeds: [0]}}]
"""


def registry(tmp_path, name, point=""):
    f = tmp_path / f"{name}.yaml"
    f.write_text(REG.format(name=name, point=point))
    return f


@pytest.fixture(scope="module")
def screened(tmp_path_factory):
    "(registry file, root) of the screened one-point registry, run once for this module's tests."
    tmp = tmp_path_factory.mktemp("screened")
    reg = registry(tmp, "scr", ", screen_rollouts: 4, screen_pool: 64")
    run_registry(load_registry(reg), tmp / "root", progress=False, log=lambda *a: None)
    return reg, tmp / "root"


def test_screened_point_runs_through_the_registry(screened):
    reg, root = screened
    st = registry_status(load_registry(reg), root)
    assert st["state"] == "complete", problem_lines(st)
    res = json.loads(next(root.rglob("result.json")).read_text())
    scr, man = res["result"]["screen"], res["manifest"]
    assert scr["pool"] == 64 and scr["rollouts"] == 4 and 16 <= scr["kept"] <= 64, scr
    assert (man["config"]["screen_rollouts"], man["config"]["screen_pool"]) == (4, 64)  # in the point's identity
    stores = {p.parent.name: p for p in root.rglob("groups.jsonl")}
    assert hash_file(stores[man["screen_store"]]) == man["screen_store_hash"]
    assert man["screen_store"] not in man["rollout_stores"].values()
    # every kept prompt had mixed screening rewards; the point's candidates are among the screened prompts
    screen = [json.loads(line) for line in stores[man["screen_store"]].read_text().splitlines()]
    mixed = {r["task_id"] for r in screen if min(r["rewards"]) < max(r["rewards"])}
    cands = [json.loads(line) for line in stores[man["rollout_stores"]["candidates/R"]].read_text().splitlines()]
    assert len(cands) == 12 and {r["task_id"] for r in cands} <= mixed


def test_screened_pool_has_fewer_homogeneous_groups(tmp_path, screened):
    """What the screen is for: on the point's own fresh R rollouts (an independent draw), the share of candidate
    groups whose rewards are all equal is lower with the screen than without (same model, same seed)."""
    run_registry(load_registry(registry(tmp_path, "plain")), tmp_path / "plain", progress=False, log=lambda *a: None)
    share = {}
    for name, root in (("plain", tmp_path / "plain"), ("screened", screened[1])):
        man = json.loads(next(root.rglob("result.json")).read_text())["manifest"]
        path = next(p for p in root.rglob("groups.jsonl") if p.parent.name == man["rollout_stores"]["candidates/R"])
        rw = np.array([json.loads(line)["rewards"] for line in path.read_text().splitlines()])
        share[name] = float((rw.min(1) == rw.max(1)).mean())
    assert share["screened"] < share["plain"], share


@pytest.mark.parametrize("point", [", screen_rollouts: 4, screen_pool: 10", ", screen_rollouts: 1, screen_pool: 48"])
def test_a_screen_that_cannot_fill_the_pools_is_refused_in_one_line(tmp_path, point, cli):
    reg = registry(tmp_path, "bad", point)
    with pytest.raises(ConfigError) as e:
        load_registry(reg)
    msg = str(e.value)
    assert str(reg) in msg and "screen" in msg and "\n" not in msg, msg
    r = cli("status", reg, "--root", tmp_path / "root")
    assert r.returncode != 0 and "screen" in r.stderr and r.stderr.count("\n") == 1, (r.returncode, r.stderr)
    assert not (tmp_path / "root").exists()


def test_an_edited_screen_is_refused_by_the_generation_contract(tmp_path, screened):
    """The pools are re-derived from the screen store the result names: a screen whose rewards were edited (so that
    another prompt would have been kept) fails the generation contract, naming the screen store."""
    reg, root = screened[0], tmp_path / "root"
    shutil.copytree(screened[1], root)
    man = json.loads(next(root.rglob("result.json")).read_text())["manifest"]
    f = next(p for p in root.rglob("groups.jsonl") if p.parent.name == man["screen_store"])
    recs = [json.loads(line) for line in f.read_text().splitlines()]
    first = next(r for r in recs if min(r["rewards"]) < max(r["rewards"]))  # a kept prompt, now homogeneous
    first["rewards"] = [0.0] * len(first["rewards"])
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    probs = problem_lines(registry_status(load_registry(reg), root))
    assert any("store screen" in p for p in probs), probs
    assert any("another prompt list than the registered pool" in p for p in probs), probs
