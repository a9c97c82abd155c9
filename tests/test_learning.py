"""The tiny model learns: GRPO on the math domain raises the training reward beyond 2 standard errors
(slow: about a minute of training on one core, plus the full tiny-snapshot build if it is not there yet)."""
import importlib.util, math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _learn_tiny():
    spec = importlib.util.spec_from_file_location("learn_tiny", ROOT / "benchmarks" / "learn_tiny.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m


def test_pooled_group_stats_matches_direct():
    "The start/end SE reconstructed from per-step (mean, SE, n) equals the SE computed from the group means."
    import numpy as np
    g = np.random.default_rng(0)
    groups = [g.random(int(n)) for n in g.integers(2, 9, 7)]
    recs = [dict(n_groups=len(x), reward_mean=float(x.mean()), reward_se=float(x.std(ddof=1) / math.sqrt(len(x)))) for x in groups]
    allg = np.concatenate(groups)
    mu, se, n = _learn_tiny().pooled_group_stats(recs)
    assert n == len(allg) and abs(mu - allg.mean()) < 1e-12
    assert abs(se - allg.std(ddof=1) / math.sqrt(len(allg))) < 1e-12


@pytest.mark.slow
def test_grpo_raises_math_reward(tmp_path):
    from stalebook.core import load_config
    from stalebook.model import default_snapshot
    from stalebook.trainer import Trainer, TrainConfig
    lt = _learn_tiny()
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        snap = default_snapshot(log=lambda *a: None)                 # the full warm-started tiny snapshot (built once)
        cfg = load_config(TrainConfig, ROOT / "configs" / "tiny" / "train-math.yaml",
                          overrides=dict(out=str(tmp_path / "run"), snapshot=str(snap), steps=100, lineage_steps=[0, 100]))
        recs = Trainer(cfg).run(progress=False).log.records
    finally:
        torch.set_num_threads(old)
    assert len(recs) == 100
    s = lt.train_summary(recs, 10)
    print(f"math reward first 10 steps {s['start']:.3f} ± {s['start_se']:.3f} -> last 10 {s['end']:.3f} ± {s['end_se']:.3f}; "
          f"zero-advantage groups {s['zero_adv_total']}/{s['groups_total']}")
    assert s["diff"] > 2 * s["diff_se"], s
    assert 0 < s["zero_adv_total"] < s["groups_total"]               # counted, and not every group is homogeneous
