"""The framework formats' readers on bad input (`stalebook.audit_formats`): each kind of damage to a fixture stops the
read with an error naming the file and the line (or record), and under keep_going costs exactly the damaged records.

The fixtures (tests/fixtures/audit/<format>/) are written by tests/fixtures/audit/make_fixtures.py; each case below
copies one to a temporary folder and damages one file. A case absent from a format's table cannot occur in it: NeMo-RL's
records carry no step (the file name is the only one), so they cannot mix steps.
"""

import json
import re
import shutil
from pathlib import Path

import pytest

from stalebook.audit_formats import AuditInputError, ReadLog, detect_format, read_samples

FIX = Path(__file__).parent / "fixtures" / "audit"
TOTAL = {"prime-rl": 7, "nemo-rl": 8, "slime": 8, "areal": 5, "verl": 8, "roll": 8, "skyrl": 6}  # samples per fixture


def edit_line(f: Path, n: int, edit) -> None:
    "Replace line n (1-based) of a JSON-lines file by `edit(record)` (a dict, or a str written as it is)."
    lines = f.read_text().splitlines(keepends=True)
    new = edit(json.loads(lines[n - 1]))
    lines[n - 1] = new if isinstance(new, str) else json.dumps(new) + "\n"
    f.write_text("".join(lines))


def cut_last_line(f: Path) -> int:
    "Cut the file's last line in half, as a crash mid-write leaves it; its line number."
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    return len(lines)


def without(*keys):
    return lambda r: {k: v for k, v in r.items() if k not in keys}


def with_(**kv):
    return lambda r: {**r, **kv}


def garbled(r):
    return '{"step": 3, "token_ids": [1, 2,, oops\n'


# (case, damage(root) -> the text the error must name, samples kept under keep_going, records skipped)
def jsonl_cases(fmt, rel, line, missing, schema, mixed, lengths, malformed):
    "The cases for a JSON-lines format: each damages line `line` of `rel` (the last line of `rel` when truncated)."
    name = Path(rel).name

    def damage(edit):
        return lambda root: (edit_line(root / rel, line, edit), f"{name}:{line}")[1]

    cases = {
        "garbled line": (damage(garbled), TOTAL[fmt] - 1, 1),
        "truncated last line": (lambda root: f"{name}:{cut_last_line(root / rel)}", TOTAL[fmt] - 1, 1),
        "missing field": (damage(without(missing)), TOTAL[fmt] - 1, 1),
        "malformed value": (damage(malformed), TOTAL[fmt] - 1, 1),  # text where the format writes a number
    }
    if lengths:  # a format with per-token arrays
        cases["array lengths"] = (damage(lengths), TOTAL[fmt] - 1, 1)
    if schema:
        cases["unknown schema"] = (damage(schema), TOTAL[fmt] - 1, 1)
    if mixed:
        cases["mixed steps"] = (damage(mixed), TOTAL[fmt] - 1, 1)
    return cases


def shorten(key, nested=False):
    "Drop the last entry of a per-token array (`nested`: NeMo-RL's batch of one, [[...]])."
    return lambda r: {**r, key: [r[key][0][:-1]] if nested else r[key][:-1]}


def areal_legacy(root):
    (root / "rollout" / "3" / "9f2c.txt").write_text("idx: 1 / 2, seqlen: 187, reward is 1.0.\nprompt is \n...\n")
    return "9f2c.txt:1"


CASES = {
    "prime-rl": jsonl_cases(
        "prime-rl",
        "token_exports/step_3/rank_0.jsonl",
        2,
        missing="trainer_logprobs",
        schema=with_(schema_version=2),
        mixed=with_(step=10),
        lengths=shorten("loss_mask"),
        malformed=lambda r: {**r, "trainer_logprobs": ["x"] * len(r["trainer_logprobs"])},
    ),
    "nemo-rl": jsonl_cases(
        "nemo-rl",
        "train_data_step2.jsonl",
        3,
        missing="prev_logprobs",
        schema=without("token_ids", "token_loss_mask", "sample_loss_mask", "advantages"),  # before NeMo-RL f11f99c79
        mixed=None,
        lengths=shorten("prev_logprobs", nested=True),
        malformed=with_(rewards=["x"]),
    ),
    "areal": jsonl_cases(
        "areal",
        "rollout/12/2.jsonl",
        2,
        missing="tail_version",
        schema=None,
        mixed=with_(tail_version=3),
        lengths=with_(prompt_len=30),  # a prompt longer than its sequence
        malformed=with_(reward="x"),
    ),
}
CASES["areal"]["unknown schema"] = (areal_legacy, TOTAL["areal"], 1)
CASES["verl"] = jsonl_cases("verl", "2.jsonl", 2, missing="score", schema=None, mixed=with_(step=3), lengths=None,
                            malformed=with_(score="x"))  # fmt: skip
CASES["skyrl"] = jsonl_cases("skyrl", "dumped_evals/global_step_5_evals/gsm8k.jsonl", 1, missing="score", schema=None,
                             mixed=None, lengths=None, malformed=with_(score="x"))  # fmt: skip


def roll_case(edit, names, kept):
    "Damage ROLL's step-1 object (one line, 2 samples): `names` the error must name, `kept` samples under keep_going."
    return (lambda root: (edit_line(root / "rollout_dump_data.step_1.jsonl", 1, edit), names)[1], kept, 1)


def roll_set(key, i, value):
    return lambda r: {**r, key: [value if j == i else x for j, x in enumerate(r[key])]}


CASES["roll"] = {  # a whole-object error costs the step's 2 samples, a sample's error that sample
    "garbled line": roll_case(garbled, "step_1.jsonl:1", TOTAL["roll"] - 2),
    "truncated last line": (
        lambda root: f"step_1.jsonl:{cut_last_line(root / 'rollout_dump_data.step_1.jsonl')}",
        TOTAL["roll"] - 2,
        1,
    ),  # fmt: skip
    "missing field": roll_case(without("scores"), "step_1.jsonl:1: missing field 'scores'", TOTAL["roll"] - 2),
    "array lengths": roll_case(lambda r: {**r, "scores": r["scores"][:1]}, "step_1.jsonl:1: arrays", TOTAL["roll"] - 2),
    "malformed value": roll_case(roll_set("scores", 1, "x"), "step_1.jsonl:1#1", TOTAL["roll"] - 1),
    "mixed steps": roll_case(roll_set("global_step", 0, 3), "step_1.jsonl:1#0: global_step 3", TOTAL["roll"] - 1),
}


def slime_edit(rel, edit):
    "Damage a slime dump: `edit(the loaded object)` is saved back in its place."

    def damage(root):
        import torch

        f = root / rel
        d = torch.load(f, weights_only=True)
        edit(d)
        torch.save(d, f)

    return damage


def slime_case(rel, edit, names, kept, skipped=1):
    return (lambda root: (slime_edit(rel, edit)(root), names)[1], kept, skipped)


def slime_bytes(rel, cut):
    def damage(root):
        f = root / rel
        f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2] if cut else b"not a torch file at all")
        return rel

    return damage


CASES["slime"] = {
    "garbled file": (slime_bytes("rollout_data/2.pt", cut=False), TOTAL["slime"] - 2, 1),
    "truncated file": (slime_bytes("rollout_data/2.pt", cut=True), TOTAL["slime"] - 2, 1),
    "garbled record": slime_case("rollout_data/1.pt", lambda d: d["samples"].__setitem__(1, "oops"), "1.pt#1", 7),
    "missing field": slime_case("rollout_data/1.pt", lambda d: d["samples"][1].pop("response_length"), "1.pt#1", 7),
    "array lengths": slime_case("rollout_data/1.pt", lambda d: d["samples"][1]["loss_mask"].pop(), "1.pt#1", 7),
    "unknown schema": slime_case("train_data/1.pt", lambda d: d.update(format_version=3), "train_data/1.pt", 8),
    "mixed steps": slime_case("rollout_data/2.pt", lambda d: d.update(rollout_id=7), "rollout_data/2.pt", 6),
}


@pytest.mark.parametrize("fmt,case", [(f, c) for f, cs in CASES.items() for c in cs])
def test_bad_input(tmp_path, fmt, case):
    root = tmp_path / fmt
    shutil.copytree(FIX / fmt, root)
    damage, kept, skipped = CASES[fmt][case]
    names = damage(root)
    with pytest.raises(AuditInputError) as e:
        list(read_samples(root, fmt))
    assert names in str(e.value), str(e.value)
    log = ReadLog(keep_going=True)
    assert len(list(read_samples(root, fmt, log))) == kept
    assert log.skipped == skipped and names in log.reasons[0], log.reasons


@pytest.mark.parametrize("fmt", list(TOTAL))
def test_fixture_read_and_detected(fmt):
    log = ReadLog()
    assert len(list(read_samples(FIX / fmt, log=log))) == TOTAL[fmt] and log.skipped == 0
    assert detect_format(FIX / fmt) == fmt
    with pytest.raises(AuditInputError, match="unknown format 'nope'"):
        list(read_samples(FIX / fmt, "nope"))


def test_detect_refuses_empty_folder(tmp_path):
    with pytest.raises(AuditInputError, match=re.escape(f"{tmp_path}: no known format recognised")):
        detect_format(tmp_path)
    with pytest.raises(AuditInputError, match="no such file"):
        detect_format(tmp_path / "absent")


@pytest.mark.parametrize("fmt", list(TOTAL))
def test_empty_folder_named_by_each_reader(tmp_path, fmt):
    with pytest.raises(AuditInputError, match=re.escape(str(tmp_path))):
        list(read_samples(tmp_path, fmt))


def test_prime_rl_unstable_step(tmp_path):
    "A step folder without STABLE (a run cut off mid-step) is bad input; keep_going skips that step."
    root = tmp_path / "prime-rl"
    shutil.copytree(FIX / "prime-rl", root)
    (root / "token_exports" / "step_3" / "STABLE").unlink()
    with pytest.raises(AuditInputError, match="step_3: no STABLE marker"):
        list(read_samples(root, "prime-rl"))
    log = ReadLog(keep_going=True)
    assert len(list(read_samples(root, "prime-rl", log))) == TOTAL["prime-rl"] - 2 and log.skipped == 1


def test_slime_dict_reward_read_by_its_key(tmp_path):
    """math_dapo's reward {'score', 'acc', 'pred'}: read by `reward_key`, else the entry the train dump's raw_reward
    matches, else 'score'; never dropped."""
    log = ReadLog()
    xs = list(read_samples(FIX / "slime", "slime", log))
    dapo = [x for x in xs if x.reward_key is not None]
    assert [(x.where.split("slime/")[1], x.reward, x.reward_key) for x in dapo] == [
        ("rollout_data/1.pt#3", 1.0, "score")
    ]
    assert (
        all(x.reward is not None for x in xs)
        and log.used["reward_key"] == "'score' (matched against the train dump's raw_reward)"
    )
    shutil.copytree(FIX / "slime" / "rollout_data", tmp_path / "rollout_data")  # no train dumps: the default
    log = ReadLog()
    assert [x.reward for x in read_samples(tmp_path, "slime", log)] == [x.reward for x in xs]
    assert log.used["reward_key"].startswith("'score' (default: the rollout dump does not record it")
    acc = list(read_samples(FIX / "slime", "slime", reward_key="acc"))
    assert [x.reward for x in acc] == [x.reward for x in xs]  # acc True and score 1.0 agree on this sample
    with pytest.raises(AuditInputError, match=r"1\.pt#3: .*reward\['pred'\] is a str"):
        list(read_samples(FIX / "slime", "slime", reward_key="pred"))
    with pytest.raises(AuditInputError, match="--reward-key: format nemo-rl takes no such option"):
        list(read_samples(FIX / "nemo-rl", "nemo-rl", reward_key="acc"))


def test_slime_lag_follows_the_update_interval():
    "The lag of a weight version depends on --update-weights-interval; `log.used` says which interval was used."
    base, log = list(read_samples(FIX / "slime", "slime")), ReadLog()
    two = list(read_samples(FIX / "slime", "slime", log, update_weights_interval=2))
    # versions '1' -> 0 updates either way; '2' -> 1 update at I = 1, 2 updates at I = 2
    assert [(x.version, x.version_tail) for x in base[:2]] == [(0, 0), (0, 1)]
    assert [(x.version, x.version_tail) for x in two[:2]] == [(0, 0), (0, 2)]
    assert [x.step - x.version for x in base[4:6]] == [1, 1] and [x.step - x.version for x in two[4:6]] == [0, 0]
    assert log.used["update_weights_interval"] == "2 (given)"
    for x in two:
        if x.version is not None:
            assert x.lag_in_flight + x.lag_in_queue == x.step - x.version
    with pytest.raises(AuditInputError, match="--update-weights-interval: 0"):
        list(read_samples(FIX / "slime", "slime", update_weights_interval=0))


def test_prime_rl_own_clip_mask_read():
    "prime-rl's is_masked* are read as clipped*: equal to the DPPO rule recomputed from the two log-probs (0.05 here)."
    import numpy as np

    xs = list(read_samples(FIX / "prime-rl", "prime-rl"))
    n_clipped = 0
    for x in xs:
        delta = np.exp(x.trainer_logp) - np.exp(x.inference_logp)
        high = x.mask & (x.advantage > 0) & (delta > 0.05)
        low = x.mask & (x.advantage < 0) & (delta < -0.05)
        assert x.clipped_high.tolist() == high.tolist() and x.clipped_low.tolist() == low.tolist(), x.where
        assert x.clipped.tolist() == (high | low).tolist(), x.where
        n_clipped += int(x.clipped.sum())
    assert n_clipped > 0  # the fixture holds masked tokens (without them this test would check nothing)
    flight = [(x.lag_in_flight, x.lag_in_queue, x.step - x.version) for x in xs if x.version is not None]
    assert all(a + b == c for a, b, c in flight) and flight[0] == (1, 0, 1)


def test_areal_version_rle_read_exactly(tmp_path):
    "AReaL after #1408: version_rle gives each loss token's version; a bad run-length record is FILE:LINE, skipped."
    log = ReadLog()
    xs = list(read_samples(FIX / "areal-rle", log=log))
    assert detect_format(FIX / "areal-rle") == "areal" and log.skipped == 0 and len(xs) == 5
    for x, line in zip(
        xs, [ln for f in sorted((FIX / "areal-rle").rglob("*.jsonl")) for ln in f.read_text().split("\n") if ln]
    ):
        r = json.loads(line)
        expanded = [v for v, c in r["version_rle"] for _ in range(c)]  # the run-length code undone by hand
        assert x.token_versions.tolist() == expanded and x.n_tokens == len(expanded)
        assert (x.version, x.version_tail) == (min(expanded), max(expanded))
    root = tmp_path / "areal-rle"
    shutil.copytree(FIX / "areal-rle", root)
    edit_line(root / "rollout/4/0.jsonl", 2, lambda r: {**r, "version_rle": [[3, 2], [4, 30]]})
    edit_line(root / "rollout/6/2.jsonl", 1, lambda r: {**r, "tail_version": 7, "version_rle": [[5, 2], [7, 2]]})
    with pytest.raises(AuditInputError, match=r"0\.jsonl:2: version_rle counts 32 tokens"):
        list(read_samples(root, "areal"))
    log = ReadLog(keep_going=True)
    assert len(list(read_samples(root, "areal", log))) == 3 and log.skipped == 2
    assert "2.jsonl:1: tail_version 7 in the folder of version 6" in log.reasons[1]


def write_trl_fixture(root: Path) -> Path:
    "A TRL output_dir as GRPOTrainer's log() writes it (pandas' to_parquet: pyarrow): steps 1 and 2, 2 rewards."
    import pyarrow as pa
    import pyarrow.parquet as pq

    q = [{"role": "user", "content": "What is 2+2?"}]
    for step, acc, fmt in ((1, [1.0, 0.0, 0.0, 1.0], [1.0, 1.0, None, 0.0]), (2, [1.0, 1.0], [1.0, 1.0])):
        n = len(acc)
        table = pa.table({"step": [step] * n, "prompt": [q] * n, "completion": ["4"] * n, "accuracy_reward": acc,
                          "format_reward": fmt, "advantage": [0.5 - k % 2 for k in range(n)]})  # fmt: skip
        (root / "completions").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / "completions" / f"completions_{step:05d}.parquet")
    return root


def test_trl_completions(tmp_path):
    "TRL's logged completions: the reward is the sum of the reward columns (NaN left out), or those reward_key names."
    pytest.importorskip("pyarrow", reason="pyarrow is not installed: TRL's parquet files cannot be read or written")
    root = write_trl_fixture(tmp_path / "trl")
    assert detect_format(root) == "trl"
    log = ReadLog()
    xs = list(read_samples(root, log=log))
    acc, fmt = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], [1.0, 1.0, None, 0.0, 1.0, 1.0]
    assert [x.reward for x in xs] == [a + (f or 0.0) for a, f in zip(acc, fmt)]
    assert [x.step for x in xs] == [0, 0, 0, 0, 1, 1] and {x.version for x in xs} == {None}
    assert log.used["reward_key"].startswith("'accuracy_reward,format_reward' (default")
    assert [x.reward for x in read_samples(root, "trl", reward_key="accuracy_reward")] == acc
    (root / "completions" / "completions_00002.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(AuditInputError, match="completions_00002.parquet: not a readable parquet file"):
        list(read_samples(root, "trl"))
    log = ReadLog(keep_going=True)
    assert len(list(read_samples(root, "trl", log))) == 4 and log.skipped == 1


def test_trl_without_pyarrow_is_one_line(tmp_path):
    "Without pyarrow the TRL reader stops with one line naming the package (only checked where pyarrow is missing)."
    import importlib.util

    if importlib.util.find_spec("pyarrow") is not None:
        pytest.skip("pyarrow is installed: the missing-package error cannot occur here")
    (tmp_path / "completions").mkdir()
    (tmp_path / "completions" / "completions_00001.parquet").write_bytes(b"PAR1")
    with pytest.raises(AuditInputError, match=r"needs the package pyarrow \(not installed\)$"):
        list(read_samples(tmp_path, "trl"))


def test_reward_only_formats_leave_lag_and_is_unavailable():
    "verl, ROLL and SkyRL: rewards and groups read; every lag, version and log-prob field None (never 0)."
    lag_is = ("version", "version_tail", "lag_in_flight", "lag_in_queue", "token_versions", "inference_logp",
              "trainer_logp", "learner_logp", "mask", "n_tokens", "clipped")  # fmt: skip
    for fmt in ("verl", "roll", "skyrl"):
        xs = list(read_samples(FIX / fmt))
        assert all(getattr(x, f) is None for x in xs for f in lag_is), fmt
        assert all(x.reward is not None and x.group.startswith(f"{x.step}/") for x in xs), fmt
    # pass rates: each prompt's mean reward over SkyRL's three evaluations, against the lines read by hand
    by_hand = {}
    for f in sorted((FIX / "skyrl").rglob("gsm8k.jsonl"), key=lambda f: int(f.parent.name.split("_")[2])):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            s = sum(r["score"]) if isinstance(r["score"], list) else r["score"]
            by_hand.setdefault(r["input_prompt"], []).append(s)
    got = {}
    for x in read_samples(FIX / "skyrl"):
        got.setdefault(x.prompt, []).append(x.reward)
    assert sorted(got.values()) == sorted(by_hand.values())


def test_prime_rl_traces_alone(tmp_path):
    "prime-rl's traces without token exports: the lag split from run.work.policy; a bad policy span is FILE:LINE."
    root = tmp_path / "run"
    shutil.copytree(FIX / "prime-rl" / "rollouts", root / "rollouts")
    assert detect_format(root) == "prime-rl-traces"
    xs = list(read_samples(root))
    eps = [json.loads(ln) for n in (2, 3) for ln in (root / f"rollouts/step_{n}/train/effective/traces.jsonl").open()]
    assert len(xs) == len(eps) == 6
    for x, ep in zip(xs, eps):
        p = ep["run"]["work"]["policy"]
        assert (x.lag_in_flight, x.lag_in_queue) == (p["end"] - p["start"], ep["run"]["work"]["step"] - p["end"])
    assert [x.reward for x in xs][:3] == [1.25, 0.25, 0.0]
    assert list(read_samples(root, "prime-rl-traces", subset="all")) == []  # the fixture has no all/ subset
    bad_span = {"step": 2, "policy": {"start": "v2", "end": 2}}
    edit_line(
        root / "rollouts/step_3/train/effective/traces.jsonl", 2, lambda r: {**r, "run": {**r["run"], "work": bad_span}}
    )
    with pytest.raises(AuditInputError, match=r"traces.jsonl:2: .*not a span of two integer versions"):
        list(read_samples(root))
    log = ReadLog(keep_going=True)
    assert len(list(read_samples(root, log=log))) == 5 and log.skipped == 1
    with pytest.raises(AuditInputError, match="--kind/--subset"):
        list(read_samples(root, "prime-rl-traces", kind="nope"))
