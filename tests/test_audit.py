"""`stalebook audit` end to end: a pipelined run (two processes, real lags) with token exports audited from its
files gives the numbers its own step log recorded; the same run exported to each framework's format and audited
gives the numbers that format carries; bad input is a one-line error naming the file and line, exit status != 0 and
nothing written, or with --keep-going the complete records kept and the bad ones counted (~40 s: one pipelined run
shared by the module)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stalebook.audit import audit, write_audit
from stalebook.audit_formats import FORMATS
from stalebook.core import read_jsonl
from stalebook.rollouts import SamplingConfig
from stalebook.trainer import AsyncConfig, TrainConfig

EXE = str(Path(sys.executable).parent / "stalebook")
LOGGED = (  # what the trainer logs per step that the stalebook export lets the audit recompute
    "reward_mean",
    "zero_adv_groups",
    "n_groups",
    "n_tokens",
    "logr_max_abs",
    "logr_mean_abs",
    "kl_behav_k3",
    "clip_frac",
    "is_ess_frac",
    "is_log_max",
    "is_beyond_frac",
)


@pytest.fixture(scope="module")
def pipelined_run(tmp_path_factory, shipped_snapshot):
    "A 12-step pipelined GRPO run (max_staleness 2) of the shipped tiny model with token exports and diagnostics."
    from stalebook.pipeline import run_pipeline

    out = tmp_path_factory.mktemp("audit") / "run"
    cfg = TrainConfig(
        out=str(out),
        snapshot=str(shipped_snapshot),
        n_tasks=8,
        steps=12,
        prompts_per_step=3,
        lineage_steps=(0,),
        sampling=SamplingConfig(group_size=4, max_new_tokens=6),
        token_export=True,
        mismatch_diagnostics=True,
        async_training=AsyncConfig(mode="pipelined", max_staleness=2),
    )
    run_pipeline(cfg, progress=False)
    return out, read_jsonl(out / "steps.jsonl").records


def _cli(*args, cwd=None):
    return subprocess.run([EXE, "audit", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_audit_of_a_pipelined_run_equals_its_step_log(pipelined_run, tmp_path):
    run, recs = pipelined_run
    res = audit(run, progress=False)
    assert res["format"] == "stalebook" and len(res["steps"]) == len(recs) == 12
    mism = [k for k in recs[0] if k.startswith("mismatch/")]
    assert len(mism) == 10
    for r, a in zip(recs, res["steps"]):
        assert a["step"] == r["step"] and a["lag_mean"] == r["lag"] == a["lag_max"]
        assert {k: a[k] for k in (*LOGGED, *mism)} == {k: r[k] for k in (*LOGGED, *mism)}
    lags = [r["lag"] for r in recs]
    assert res["run"]["lag_hist"] == {str(k): 12 * lags.count(k) for k in sorted(set(lags))}  # 12 samples a step
    assert max(lags) > 0, "the pipeline never lagged: the lag part of the audit was not exercised"
    # the report: papermill runs the notebook on the JSON, which is written atomically first
    out = write_audit(res, tmp_path / "aud")
    assert json.loads((out / "audit.json").read_text())["run"] == res["run"]
    assert (out / "report.ipynb").is_file() and (out / "figures" / "audit.png").stat().st_size > 10_000
    assert (out / "figures" / "staleness.png").stat().st_size > 10_000 and (out / "audit.html").stat().st_size > 10_000


def test_cli_reads_a_run_and_names_bad_lines(pipelined_run, tmp_path):
    run, _ = pipelined_run
    ok = _cli(run, "--out", tmp_path / "a", "--no-report", "--quiet")
    assert ok.returncode == 0 and "12 steps" in ok.stdout, ok.stderr
    bad = tmp_path / "bad"
    shutil.copytree(run / "token_exports", bad / "token_exports")
    f = sorted((bad / "token_exports").glob("step_*.jsonl"))[4]
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:2]) + "{not json\n" + "".join(lines[3:]))
    r = _cli(bad, "--out", tmp_path / "b", "--quiet")
    assert r.returncode == 2 and f"{f.name}:3: not a JSON record" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "b").exists(), "an audit that failed wrote something"
    r = _cli(bad, "--out", tmp_path / "c", "--no-report", "--quiet", "--keep-going")
    assert r.returncode == 0 and "1 bad records skipped" in r.stdout, r.stderr
    got = json.loads((tmp_path / "c" / "audit.json").read_text())
    assert got["read"]["skipped"] == 1 and got["run"]["samples"] == 12 * 12 - 1
    for args, msg in [
        ((tmp_path / "nowhere",), "no such file or folder"),
        ((run, "--format", "nope"), "invalid choice: 'nope'"),
        ((tmp_path,), "no known format recognised"),
        ((run, "--top-frac", "1.5"), "--top-frac"),
    ]:
        r = _cli(*args, "--out", tmp_path / "x", "--quiet")
        assert r.returncode != 0 and msg in r.stderr, (args, r.stderr)
    assert not (tmp_path / "x").exists()


# Formats read from the frameworks' own files only: reward-only dumps (no log-probs to export) and prime-rl's
# orchestrator traces (the prime-rl exporter writes them beside its token exports); each has a fixture of its own.
READ_ONLY = {"prime-rl-traces": "prime-rl", "verl": "verl", "trl": None, "roll": "roll", "skyrl": "skyrl"}


def test_every_format_has_a_reader_and_an_exporter():
    import stalebook.audit as au
    import stalebook.audit_formats as af

    assert set(FORMATS) >= {"stalebook", "prime-rl", "nemo-rl", "slime", "areal", "martingale", *READ_ONLY}
    for name in set(FORMATS) - {"stalebook", *READ_ONLY}:
        assert callable(getattr(af, f"export_{name.replace('-', '_')}", None) or getattr(au, f"export_{name}")), name
    fixtures = Path(__file__).parent / "fixtures" / "audit"
    for name, folder in READ_ONLY.items():  # TRL's parquet fixture is written by its test (tests/test_audit_formats)
        assert folder is None or (fixtures / folder).is_dir(), name


MISMATCH = (
    "mismatch/logp_abs_diff_mean",
    "mismatch/logp_abs_diff_max",
    "mismatch/k3_kl",
    "mismatch/is_ess_frac",
    "mismatch/is_mean",
    "mismatch/is_max",
    "mismatch/is_beyond_frac",
    "mismatch/is_truncated_mean",
)
CARRIED = {  # per step: what each format's log carries of the trainer's own record
    "prime-rl": ("lag", "reward_mean", "zero_adv_groups", "n_groups", "n_tokens", *MISMATCH),
    "nemo-rl": ("reward_mean", "zero_adv_groups", "n_groups", "n_tokens", *MISMATCH),
    "slime": ("lag", "reward_mean", "zero_adv_groups", "n_groups", "n_tokens", *MISMATCH),
}


@pytest.mark.parametrize("fmt", ["prime-rl", "nemo-rl", "slime", "areal"])
def test_a_run_exported_to_each_format_audits_to_its_own_numbers(pipelined_run, tmp_path, fmt):
    import stalebook.audit_formats as af

    run, recs = pipelined_run
    out = getattr(af, f"export_{fmt.replace('-', '_')}")(run, tmp_path / fmt)
    res = audit(out, progress=False)
    assert res["format"] == fmt and res["read"]["skipped"] == 0
    assert res["run"]["samples"] == 12 * 12 and res["run"]["steps"] == (12 if fmt != "areal" else len(res["steps"]))
    if fmt == "areal":  # no consuming step: grouped by the generating version; rewards and their groups are kept
        versions = sorted({r["behaviour_step"] for r in recs})
        assert [r["version_max"] for r in res["steps"]] == versions
        per_version = {v: [r for r in recs if r["behaviour_step"] == v] for v in versions}
        for a in res["steps"]:
            mine = per_version[a["version_max"]]
            assert a["n_groups"] == sum(r["n_groups"] for r in mine)
            assert a["zero_adv_groups"] == sum(r["zero_adv_groups"] for r in mine)
            assert abs(a["reward_mean"] - sum(r["reward_mean"] * r["n_groups"] for r in mine) / a["n_groups"]) < 1e-12
        return
    for r, a in zip(recs, res["steps"]):
        got = {k: a["lag_mean"] if k == "lag" else a.get(k) for k in CARRIED[fmt]}
        assert got == {k: r[k] for k in CARRIED[fmt]}, (fmt, r["step"])


def test_a_format_without_rewards_reports_groups_as_not_available(tmp_path, monkeypatch):
    "Issue 55 item 0: without rewards n_groups and zero_adv_groups are None in audit.json and 'n/a' in text, never 0."
    import numpy as np

    import stalebook.audit_formats as af
    from stalebook.audit import audit_markdown

    def read(path, log):
        for step in range(3):
            for i in range(2):
                m = np.ones(3, bool)
                yield af.LoggedSample(
                    where=f"{path}:{2 * step + i + 1}",
                    step=step,
                    version=step,
                    version_tail=step,
                    prompt=f"p{i}",
                    n_tokens=3,
                    mask=m,
                    inference_logp=np.full(3, -1.0),
                    trainer_logp=np.full(3, -1.0 + 0.01 * i),
                )

    monkeypatch.setitem(af.FORMATS, "no-rewards", (read, lambda p: False))
    res = audit(tmp_path, "no-rewards", progress=False)
    assert res["run"]["samples"] == 6 and res["run"]["n_groups"] is None and res["run"]["zero_adv_groups"] is None
    assert res["run"]["reward_mean_mean"] is None
    out = write_audit(res, tmp_path / "out", report=False)
    got = json.loads((out / "audit.json").read_text())["run"]
    assert got["n_groups"] is None and got["zero_adv_groups"] is None
    md = audit_markdown(res)
    assert "| n_groups | n/a |" in md and "| zero_adv_groups | n/a |" in md


MG_FLOATS = dict(
    mean_log_ratio="mean_log_ratio",
    mean_abs_log_ratio="mean_abs_log_ratio",
    ratio_mean="ratio_mean",
    max_abs_log_ratio="max_abs_log_ratio",
    ratio_p50="ratio_q50",
    ratio_p95="ratio_q95",
    ratio_max="ratio_max",
    ess="ess",
    ess_fraction="ess_frac",
)
MG_COUNTS = dict(
    lag="lag",
    n_tokens="tokens",
    n_sequences="sequences",
    n_mixed_sequences="sequences_spanning",
    n_confident_disagreements="confident_disagreements",
    n_overflow_tokens="overflow_tokens",
)


def _doctor(ws: Path, tmp_path: Path, eps=("0.1", "0.2")) -> dict:
    "`martingale doctor --json` of a workspace, run as the command a user runs."
    js = tmp_path / f"doctor-{ws.name}.json"
    mg = str(Path(sys.executable).parent / "martingale")
    r = subprocess.run(
        [mg, "doctor", "--dir", str(ws), "--json", str(js), *(a for e in eps for a in ("--eps", e))],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(js.read_text())


def _assert_equal_to_doctor(d: dict, st: dict) -> None:
    "The audit's per-lag table, floor and shares equal martingale doctor's (float_informational) to 1e-9."
    assert len(d["by_lag"]) == len(st["by_lag"]) > 1
    for a, b in zip(d["by_lag"], st["by_lag"]):
        assert {k: a[k] for k in MG_COUNTS} == {k: b[v] for k, v in MG_COUNTS.items()}
        f = a["float_informational"]
        for k, v in MG_FLOATS.items():
            assert abs(f[k] - b[v]) <= 1e-9, (a["lag"], k, f[k], b[v])
        assert f["clipped_fraction"].keys() == b["clipped"].keys()
        for e, x in f["clipped_fraction"].items():
            assert abs(x - b["clipped"][e]) <= 1e-9, (a["lag"], e)
    at = d["attribution"]["float_informational"]
    for k in ("floor", "staleness_share", "engine_share"):
        assert at[k] is not None and abs(at[k] - st[k]) <= 1e-9, (k, at[k], st[k])
    assert d["n_negative_lag_tokens"] == st["negative_lag_tokens"]


def test_the_martingale_demo_audits_to_what_martingale_doctor_says(tmp_path):
    "Issue 55 item 2: `martingale demo --dir`'s workspace, read from tokens.db and from export/ alone."
    ws = tmp_path / "demo"
    r = subprocess.run(
        [str(Path(sys.executable).parent / "martingale"), "demo", "--dir", str(ws)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    res = audit(ws, progress=False)
    assert res["format"] == "martingale" and res["read"]["skipped"] == 0
    _assert_equal_to_doctor(_doctor(ws, tmp_path), res["staleness"])
    assert [b["lag"] for b in res["staleness"]["by_lag"]] == [0, 2, 3, 4]  # revisions at steps 0, 1, 2, 4; scored at 4
    only_export = tmp_path / "exported"
    shutil.copytree(ws / "export", only_export / "export")
    res2 = audit(only_export, progress=False)
    assert res2["format"] == "martingale" and res2["staleness"] == res["staleness"]
    # the clip radii the user names reach the table (doctor with the same radii)
    res3 = audit(ws, progress=False, eps=(0.05, 0.3))
    _assert_equal_to_doctor(_doctor(ws, tmp_path, ("0.05", "0.3")), res3["staleness"])


def test_a_run_recorded_with_martingales_recorder_audits_to_what_martingale_doctor_says(pipelined_run, tmp_path):
    "The pipelined run recorded through martingale's Recorder API: doctor's table is the audit's, read two ways."
    from stalebook.audit import export_martingale

    run, recs = pipelined_run
    ws = export_martingale(run, tmp_path / "ws")
    res = audit(ws, progress=False)
    assert res["format"] == "martingale" and res["run"]["samples"] == 12 * 12
    st = res["staleness"]
    _assert_equal_to_doctor(_doctor(ws, tmp_path), st)
    # the same tokens read from stalebook's own export give the same table (learner log-probs, sample versions)
    own = audit(run, progress=False)["staleness"]
    assert [b["tokens"] for b in own["by_lag"]] == [b["tokens"] for b in st["by_lag"]]
    for a, b in zip(own["by_lag"], st["by_lag"]):
        assert abs(a["mean_abs_log_ratio"] - b["mean_abs_log_ratio"]) <= 1e-12 and a["clipped"] == b["clipped"]
    # per step: each step's shares come from its own lag-0 tokens, None where it has none
    for r in res["steps"]:
        lags = {b["lag"] for b in r["lag_table"]}
        assert (r["floor"] is None) == (0 not in lags)
        assert (r["staleness_share"] is None) == (0 not in lags or not lags - {0})


def test_no_lag_zero_tokens_means_no_floor_not_a_guess():
    "The slime fixture is consumed one step after generation: its floor and shares are None, with the reason."
    res = audit(Path(__file__).parent / "fixtures" / "audit" / "slime", progress=False)
    st = res["staleness"]
    assert [b["lag"] for b in st["by_lag"]] == [1] and st["floor"] is None and st["staleness_share"] is None
    assert "no lag-0 tokens" in st["why"] and all(r.get("floor") is None for r in res["steps"])


# --- alarms (issue 55 item 3): each fired by a record made to trip it, silent on a healthy one -----------------------


def _synthetic(trip: str | None = None, steps: int = 8):
    """A reader of a made-up run: per step 8 samples of 40 loss tokens, half at lag 0 (log w ~ N(0, 0.01)), half at
    lag 1 (~ N(0, 0.05)), rewards mixed in two groups of 4; `trip` damages it in the one way that alarm names."""
    import numpy as np

    from stalebook.audit_formats import LoggedSample

    def read(path, log):
        g = np.random.default_rng(0)
        for t in range(steps):
            for i in range(8):
                lag = i % 2
                x = g.normal(0, 0.05 if lag else 0.01 * (1 + t if trip == "mismatch_trend" else 1), 40)
                beh = np.full(40, -1.0)
                if trip == "stale_server" and t == 5 and i == 0:
                    beh[3], x[3] = -0.1, -3.0  # the engine 90 % sure, the trainer 2.9 nats lower
                if trip == "ess_collapse" and t == 4 and lag:
                    x = g.normal(0, 2.0, 40)
                if trip == "floor_jump" and t == 6 and not lag:
                    x = x * 10
                v = t - lag + (2 if trip == "negative_lag" and t == 3 and i == 1 else 0)
                r = 1.0 if trip == "zero_advantage" and t >= 2 else float(i % 3 == 0)  # steps 2-7: 12 groups
                s = LoggedSample(where=f"{path}:{8 * t + i + 1}", step=t, version=v, version_tail=v,
                                 prompt=f"p{i // 4}", group=f"{t}/{i // 4}", reward=r, n_tokens=40,
                                 mask=np.ones(40, bool), inference_logp=beh, trainer_logp=beh + x)  # fmt: skip
                if trip == "span" and t == 7 and i == 0:  # one sequence in 8 across 3 versions
                    s.token_versions = np.repeat([t - 2, t - 1, t], [14, 13, 13]).astype(float)
                yield s

    return read


ALARM_AT = {"stale_server": 5, "negative_lag": 3, "ess_collapse": 4, "floor_jump": 6, "mismatch_trend": 7, "span": 7,
            "zero_advantage": 7}  # fmt: skip


@pytest.mark.parametrize("kind", [None, *ALARM_AT])
def test_each_alarm_fires_on_a_record_made_to_trip_it_and_only_there(kind, tmp_path, monkeypatch):
    import stalebook.audit_formats as af

    monkeypatch.setitem(af.FORMATS, "synthetic", (_synthetic(kind), lambda p: False))
    res = audit(tmp_path, "synthetic", progress=False)
    got = sorted({(a["kind"], a["step"]) for a in res["alarms"]})
    assert got == ([] if kind is None else [(kind, ALARM_AT[kind])]), got
    if kind:
        a = next(a for a in res["alarms"] if a["kind"] == kind)
        assert a["level"] in ("warn", "error") and a["evidence"] and a["message"]
    if kind == "stale_server":
        assert res["alarms"][0]["evidence"]["confident_disagreements"] == 1 and res["alarms"][0]["level"] == "error"
    if kind == "ess_collapse":
        assert res["alarms"][0]["evidence"]["lag"] == 1 and res["alarms"][0]["evidence"]["ess_frac"] < 0.3
    if kind == "mismatch_trend":
        ev = res["alarms"][0]["evidence"]
        assert ev["series"] == "floor" and ev["spearman"] > 0.9 and ev["p"] < 0.01 and ev["n"] == 8


def test_alarms_on_stalebook_runs_lag_bound_and_lr_zero(pipelined_run, tmp_path):
    "The healthy pipelined run is silent (bound 2); a bound of 1 fires where it lagged 2; lr 0 stops the weights."
    from stalebook.audit import AlarmConfig
    from stalebook.model import default_snapshot
    from stalebook.trainer import Trainer

    run, recs = pipelined_run
    assert audit(run, progress=False, alarms=AlarmConfig(max_lag=2))["alarms"] == []
    res = audit(run, progress=False, alarms=AlarmConfig(max_lag=1))
    assert {a["step"] for a in res["alarms"]} == {r["step"] for r in recs if r["lag"] > 1} != set()
    assert {a["kind"] for a in res["alarms"]} == {"lag_bound"}
    cfg = TrainConfig(out=str(tmp_path / "lr0"), snapshot=str(default_snapshot()), n_tasks=8, steps=5, lr=0.0,
                      prompts_per_step=3, sampling=SamplingConfig(group_size=4, max_new_tokens=6), lineage_steps=(0,),
                      token_export=True, async_training=AsyncConfig(staleness=1, mode="fixed-lag"))  # fmt: skip
    Trainer(cfg).run(progress=False)
    res = audit(cfg.out, progress=False)
    assert {(a["kind"], a["step"]) for a in res["alarms"]} == {("weights_unchanged", t) for t in range(1, 5)}
    # the CLI: --fail-on error exits 3 on the lr-0 run, 0 on the healthy one; warn-only alarms pass --fail-on error
    r = _cli(cfg.out, "--out", tmp_path / "a0", "--no-report", "--quiet", "--fail-on", "error")
    assert r.returncode == 3 and "weights_unchanged" in r.stdout, r.stderr
    assert json.loads((tmp_path / "a0" / "audit.json").read_text())["alarm_counts"]["error"] == 4
    r = _cli(run, "--out", tmp_path / "a1", "--no-report", "--quiet", "--fail-on", "warn", "--max-lag", "2")
    assert r.returncode == 0 and "No alarm fired." in r.stdout, r.stdout
    r = _cli(run, "--out", tmp_path / "a2", "--no-report", "--quiet", "--fail-on", "warn", "--max-lag", "1")
    assert r.returncode == 3 and "[error] lag_bound" in r.stdout
    assert _cli(run, "--out", tmp_path / "a3", "--clip", "0.1,x").returncode == 2


# --- the report (issue 55 item 6) ----------------------------------------------------------------------------------

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                "--window-size=1280,2400"]  # fmt: skip


def _chromium(tmp: Path):
    "A headless Chromium driven by selenium, or a visible skip saying what is missing (CI installs both)."
    import warnings

    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        warnings.warn("selenium not installed: the audit.html browser check is skipped", stacklevel=2)
        pytest.skip("selenium not installed")
    exe, drv = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not exe or not drv:
        why = "chromium / chromium-driver not installed (apt-get install chromium chromium-driver)"
        warnings.warn(f"{why}: the audit.html browser check is skipped", stacklevel=2)
        pytest.skip(why)
    opts = webdriver.ChromeOptions()
    opts.binary_location = exe
    for f in [*CHROME_FLAGS, f"--user-data-dir={tmp / 'chrome-profile'}"]:
        opts.add_argument(f)
    return webdriver.Chrome(options=opts, service=Service(executable_path=drv))


def test_audit_html_opens_in_headless_chromium_with_its_figures(tmp_path):
    "The demo audited by the CLI: audit.html is self-contained, every figure loads, the screenshot is not blank."
    import io

    import numpy as np
    from PIL import Image

    ws = tmp_path / "demo"
    subprocess.run([str(Path(sys.executable).parent / "martingale"), "demo", "--dir", str(ws)], capture_output=True,
                   check=True)  # fmt: skip
    r = _cli(ws, "--out", tmp_path / "aud", "--no-report", "--quiet", "--max-lag", "3", "--advise", "--lr", "1e-6")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[lines.index("Diagnosis:") + 1].startswith("  - Of the off-policy signal in stale tokens")
    assert lines.index("Diagnosis:") < next(i for i, x in enumerate(lines) if x.startswith(" lag   tokens"))
    html = (tmp_path / "aud" / "audit.html").read_text()
    assert "http://" not in html and "https://" not in html  # nothing fetched: figures are inline
    d = _chromium(tmp_path)
    try:
        d.get((tmp_path / "aud" / "audit.html").as_uri())
        imgs = d.execute_script("return [...document.images].map(i => [i.id, i.complete, i.naturalWidth]);")
        alarms = d.execute_script("return document.querySelectorAll('#alarms tr').length;")
        table = d.execute_script("return document.getElementById('lag-table').innerText;")
        png = d.get_screenshot_as_png()
    finally:
        d.quit()
    assert sorted(i[0] for i in imgs) == sorted(f"fig-{k}" for k in ("lags", "per_lag", "floor", "trend", "ranking"))
    assert all(ok and w > 100 for _, ok, w in imgs), imgs
    assert alarms == 1 + 2 and "clip@0.2" in table  # header + lag_bound + zero_advantage
    px = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float64)
    assert px.shape[0] > 500 and px.std() > 10 and (px < 128).mean() > 0.005, (px.shape, px.std())


@pytest.mark.parametrize("fmt", ["verl", "roll", "skyrl"])
def test_a_reward_only_dump_reports_tokens_and_lags_as_not_available(fmt):
    "A reward-only dump logs no token, version or log-prob: those read None (not available), never 0."
    r = audit(Path(__file__).parent / "fixtures" / "audit" / fmt, fmt=fmt, progress=False)["run"]
    assert r["samples"] > 0 and r["n_groups"] > 0 and r["reward_mean_mean"] is not None
    assert r["tokens"] is None and r["lag_mean"] is None and r["lag_token_weighted"] is None and r["lag_hist"] == {}
