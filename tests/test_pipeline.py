"""The pipelined generator/learner (stalebook.pipeline, two processes): the realised lag never exceeds max_staleness
under either rule (block, drop), the manifest says the run is not bit-reproducible, a pipelined run is neither resumed
nor run by the plain trainer loop (~25 s per pipelined run on the shared 2-core machine); and a reduced staleness study — a few cells through `run_cell` and the sweep
analysis of benchmarks/study_staleness.py — checked against the cells' own results."""
import importlib.util, json, os
from pathlib import Path

import numpy as np
import pytest

from stalebook.core import StalebookError, read_jsonl
from stalebook.rollouts import SamplingConfig
from stalebook.trainer import AsyncConfig, Trainer, TrainConfig, check_lineage

ROOT = Path(__file__).resolve().parents[1]


def _cfg(out, snap, steps=10, **a):
    return TrainConfig(out=str(out), snapshot=str(snap), n_tasks=16, steps=steps, prompts_per_step=3, lineage_steps=(0, 5),
                       sampling=SamplingConfig(group_size=4, max_new_tokens=6), async_training=AsyncConfig(mode="pipelined", **a))


@pytest.mark.parametrize("on_stale,max_staleness", [("block", 1), ("drop", 0)])
def test_pipeline_keeps_lag_within_max_staleness(tmp_path, tiny_snapshot, on_stale, max_staleness):
    from stalebook.pipeline import run_pipeline
    man = run_pipeline(_cfg(tmp_path / "run", tiny_snapshot, on_stale=on_stale, max_staleness=max_staleness), progress=False)
    recs = read_jsonl(tmp_path / "run" / "steps.jsonl").records
    lags = [r["lag"] for r in recs]
    assert len(recs) == 10 and [r["step"] for r in recs] == list(range(10))
    assert 0 <= min(lags) and max(lags) <= max_staleness                        # asserted over the whole run
    assert all(r["lag"] == r["step"] - r["behaviour_step"] for r in recs)
    assert man["bit_reproducible"] is False and "timing" in man["why"] and man["lag_bound_held"] and man["max_lag"] == max(lags)
    assert {int(k): v for k, v in man["lag_histogram"].items()} == {l: lags.count(l) for l in set(lags)}
    if on_stale == "block": assert man["dropped"] == 0
    assert check_lineage(tmp_path / "run") == []
    t = json.loads((tmp_path / "run" / "timings.json").read_text())
    assert t["learner_steps_per_s"] > 0 and t["generated_tokens"] >= sum(r["n_tokens"] for r in recs)
    assert all(r["kl_behav_k3"] >= 0 for r in recs) and recs[0]["lag"] == 0 and recs[0]["logr_max_abs"] < 1e-5
    if on_stale == "block":                                                      # a pipelined run is not resumed
        with pytest.raises(StalebookError, match="not resumable"):
            run_pipeline(_cfg(tmp_path / "run", tiny_snapshot, on_stale=on_stale, max_staleness=max_staleness), progress=False)


def test_pipelined_mode_is_not_run_by_the_trainer_loop(tmp_path, tiny_snapshot):
    with pytest.raises(StalebookError, match="stalebook.pipeline.run_pipeline"): Trainer(_cfg(tmp_path / "run", tiny_snapshot)).run(progress=False)
    with pytest.raises(ValueError, match="records its lag"): AsyncConfig(mode="pipelined", staleness=2)


def _study_script():
    spec = importlib.util.spec_from_file_location("study_staleness", ROOT / "benchmarks" / "study_staleness.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m


def test_reduced_staleness_study(tmp_path, tiny_snapshot, monkeypatch):
    """A reduced study (S in {1, 4} x 2 learning rates x 2 seeds, AdamW, 12 steps): every cell through run_cell, the
    analysis and figures; the analysis agrees with the cells' own results.json, and a rerun reads every cell back."""
    monkeypatch.setenv("STALEBOOK_FIGURES", str(tmp_path / "fig"))
    st = _study_script()
    study = dict(name="reduced", out=str(tmp_path / "study"), staleness=[1, 4], seeds=[0, 1],
                 train=dict(snapshot=str(tiny_snapshot), n_tasks=16, steps=12, prompts_per_step=2, lineage_steps=[0], checkpoint_every=6,
                            sampling=dict(group_size=4, max_new_tokens=6), async_training=dict(mode="sync-every")),
                 optimizers=dict(adamw=dict(lr=[1e-3, 0.3], max_grad_norm=1.0)), criterion=dict(hold=4), eval_n=4, eval_k=2)
    root = Path(study["out"])
    st.run_all(study, root, jobs=1, max_cells=None)
    out = st.analyse(study, root, tmp_path / "res.json", "reduced")
    cells = {rel: json.loads((root / rel / "results.json").read_text()) for rel, _ in st.cells(study)}
    assert len(cells) == 8 and all(r["steps_done"] <= 12 for r in cells.values())
    o = json.loads((tmp_path / "res.json").read_text())["optimizers"]["adamw"]
    tc = np.array(o["t_collapse"])
    for rel, r in cells.items():
        _, S, lr, seed = rel.split("/")
        i, j, k = [1, 4].index(int(S[1:])), [1e-3, 0.3].index(float(lr[2:])), int(seed[4:])
        assert tc[i, j, k] == r["t_collapse"]
        assert r["series"]["lag"][: r["steps_done"]] == [t - max(int(S[1:]) * (t // int(S[1:])) - 1, 0) for t in range(r["steps_done"])]
    # eta_max per (S, seed) by hand: the largest grid eta with it and every smaller one stable
    for i in range(2):
        for k in range(2):
            ok = [tc[i, j, k] < 0 for j in range(2)]
            want = None if not ok[0] else (0.3 if all(ok) else 1e-3)
            assert o["eta_max"][i][k] == want
    assert all((tmp_path / "fig" / f"reduced_{k}.png").exists() for k in ("phase", "tcollapse", "cosine"))
    before = {rel: (root / rel / "results.json").stat().st_mtime_ns for rel in cells}
    st.run_all(study, root, jobs=1, max_cells=None)                              # nothing left to run
    assert before == {rel: (root / rel / "results.json").stat().st_mtime_ns for rel in cells}
