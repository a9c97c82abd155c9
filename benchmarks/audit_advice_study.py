"""`stalebook audit --advise` on cells of the staleness study, against the study's measured eta_max (issue 55 item 4).

A few cells of `configs/registries/staleness-tiny.yaml` (its train section; AdamW, seed 0, exact lag S) are run again
with token exports on; each run is audited with `advise_lr` = the cell's lr, and the advice (the largest lr at the
run's largest lag from the drift per lag, and from the clip crossings) is set beside the study's measured eta_max at
that S (`results/records/study_staleness.json`, median over seeds). Safe: advice <= measured; loose: the ratio.

    PYTHONPATH=. python benchmarks/audit_advice_study.py [--json results/records/audit_advice_study.json]

About 40 s of CPU per cell of 100 steps on the 2-core machine.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics)
from benchargs import add_record

import yaml  # isort: skip

from stalebook.audit import audit
from stalebook.core import from_dict
from stalebook.model import default_snapshot
from stalebook.registry import deep_merge
from stalebook.trainer import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]
CELLS = [(1, 0.00125), (4, 0.00125), (16, 0.00125), (4, 0.0025)]  # (S, lr): AdamW, seed 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_record(ap, "audit_advice_study")
    a = ap.parse_args(argv)
    reg = yaml.safe_load((ROOT / "configs" / "registries" / "staleness-tiny.yaml").read_text())
    study = json.loads((ROOT / "results" / "records" / "study_staleness.json").read_text())["optimizers"]["adamw"]
    measured = dict(zip(study["S"], study["eta_max_median"]))
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for S, lr in CELLS:
            cell = dict(seed=0, lr=lr, optimizer="adamw", max_grad_norm=1.0, async_training=dict(staleness=S),
                        token_export=True, snapshot=str(default_snapshot()), out=f"{d}/S{S}-lr{lr}")  # fmt: skip
            cfg = from_dict(TrainConfig, deep_merge(reg["study"]["train"], cell), src="study cell")
            t0 = time.time()
            Trainer(cfg).run(progress=False)
            res = audit(cfg.out, progress=False, advise_lr=lr)
            adv, st = res["advice"], res["staleness"]
            m = measured[S]
            row = dict(S=S, lr=lr, lags=[b["lag"] for b in st["by_lag"]], floor=st["floor"], advice=adv,
                       measured_eta_max=m, safe=adv.get("eta_max") is not None and adv["eta_max"] <= m,
                       drift_over_measured=adv.get("eta_max_drift") and adv["eta_max_drift"] / m,
                       clip_over_measured=adv.get("eta_max_clip") and adv["eta_max_clip"] / m,
                       seconds=time.time() - t0)  # fmt: skip
            rows.append(row)
            print(f"S={S} lr={lr}: advice {adv.get('eta_max')} (drift {adv.get('eta_max_drift')}, clip "
                  f"{adv.get('eta_max_clip')}), measured eta_max {m:.4g}", flush=True)  # fmt: skip
    Path(a.json).write_text(
        json.dumps(dict(study="staleness-tiny", optimizer="adamw", seed=0, cells=rows), indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
