"""The pipelined generator/learner (stalebook.pipeline, two processes): the realised lag never exceeds max_staleness
under either rule (block, drop), the manifest says the run is not bit-reproducible, a pipelined run is neither resumed
nor run by the plain trainer loop (~25 s per pipelined run on the shared 2-core machine). The reduced staleness study
(cells as registry units) is tests/test_staleness_study.py."""

import json

import pytest

from stalebook.core import StalebookError, read_jsonl
from stalebook.rollouts import SamplingConfig
from stalebook.trainer import AsyncConfig, TrainConfig, Trainer, check_lineage


def _cfg(out, snap, steps=10, **a):
    return TrainConfig(
        out=str(out),
        snapshot=str(snap),
        n_tasks=16,
        steps=steps,
        prompts_per_step=3,
        lineage_steps=(0, 5),
        sampling=SamplingConfig(group_size=4, max_new_tokens=6),
        async_training=AsyncConfig(mode="pipelined", **a),
    )


@pytest.mark.parametrize("on_stale,max_staleness", [("block", 1), ("drop", 0)])
def test_pipeline_keeps_lag_within_max_staleness(tmp_path, tiny_snapshot, on_stale, max_staleness):
    from stalebook.pipeline import run_pipeline

    man = run_pipeline(
        _cfg(tmp_path / "run", tiny_snapshot, on_stale=on_stale, max_staleness=max_staleness), progress=False
    )
    recs = read_jsonl(tmp_path / "run" / "steps.jsonl").records
    lags = [r["lag"] for r in recs]
    assert len(recs) == 10 and [r["step"] for r in recs] == list(range(10))
    assert 0 <= min(lags) and max(lags) <= max_staleness  # asserted over the whole run
    assert all(r["lag"] == r["step"] - r["behaviour_step"] for r in recs)
    assert (
        man["bit_reproducible"] is False
        and "timing" in man["why"]
        and man["lag_bound_held"]
        and man["max_lag"] == max(lags)
    )
    assert {int(k): v for k, v in man["lag_histogram"].items()} == {l: lags.count(l) for l in set(lags)}
    if on_stale == "block":
        assert man["dropped"] == 0
    assert check_lineage(tmp_path / "run") == []
    t = json.loads((tmp_path / "run" / "timings.json").read_text())
    assert t["learner_steps_per_s"] > 0 and t["generated_tokens"] >= sum(r["n_tokens"] for r in recs)
    assert all(r["kl_behav_k3"] >= 0 for r in recs) and recs[0]["lag"] == 0 and recs[0]["logr_max_abs"] < 1e-5
    if on_stale == "block":  # a pipelined run is not resumed
        with pytest.raises(StalebookError, match="not resumable"):
            run_pipeline(
                _cfg(tmp_path / "run", tiny_snapshot, on_stale=on_stale, max_staleness=max_staleness), progress=False
            )


def test_pipelined_mode_is_not_run_by_the_trainer_loop(tmp_path, tiny_snapshot):
    with pytest.raises(StalebookError, match="stalebook.pipeline.run_pipeline"):
        Trainer(_cfg(tmp_path / "run", tiny_snapshot)).run(progress=False)
    with pytest.raises(ValueError, match="records its lag"):
        AsyncConfig(mode="pipelined", staleness=2)
