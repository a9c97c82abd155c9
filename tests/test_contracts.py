"""Contracts under fault injection: one finished one-family registry, copied once per fault; each fault is refused by
`status` (naming the point and the contract) and by `freeze` (nothing frozen is written). Plus: the PARTIAL watermark,
`--json`, the frozen table's content hash and overwrite refusal, and the SFT ablation's appendix rules."""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import EXE, ranking_registry, small_run

from stalebook.commands import cmd_freeze, cmd_status
from stalebook.contracts import FreezeRefused, freeze, problem_lines, registry_status
from stalebook.registry import load_registry
from stalebook.units import output_hash, run_registry

U, C = "tiny-math-s0", "c-000002"


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_snapshot):
    """(registry file, root) of a one-family GRPO registry (lineage 0 -> 2, one point at c = 2), run to the end. AdamW's
    decoupled weight decay moves the LoRA factors at every step whatever the rewards, so the policy at c = 2 differs
    from beta's by construction (the reduced snapshot may earn no reward variance in two steps)."""
    tmp = tmp_path_factory.mktemp("contracts")
    reg = ranking_registry(tmp, tiny_snapshot, name="c", checkpoints=(2,), train_extra=", weight_decay: 0.1")
    run_registry(load_registry(reg), tmp / "root", progress=False, log=lambda *a: None)
    return reg, tmp / "root"


def copy(finished, tmp_path) -> Path:
    shutil.copytree(finished[1], tmp_path / "root")
    return tmp_path / "root"


def refused(reg, root, contract) -> list[str]:
    "Assert status fails exactly at `contract` of the point (others may fail too), freeze refuses, nothing is frozen."
    st = registry_status(load_registry(reg), root)
    row = st["rows"][0]
    assert row["state"] == "fail" and row["contracts"][contract], row
    lines = [l for l in problem_lines(st) if l.startswith(f"{U}/c2 {contract}: ")]
    assert lines
    with pytest.raises(FreezeRefused) as e:
        freeze(load_registry(reg), root)
    assert "nothing was written" in str(e.value) and any(l.startswith(f"{U}/c2 {contract}: ") for l in e.value.lines)
    assert not (root / "frozen").exists()
    return lines


def reseal(root: Path) -> None:
    "Rewrite the point's manifest hashes after a consistent change, so that only the contract under test can object."
    mf = root / "units" / U / "points" / C / "manifest.json"
    m = json.loads(mf.read_text())
    m["files"] = {rel: output_hash(root / "units" / U / rel) for rel in m["files"]}
    mf.write_text(json.dumps(m))


def test_finished_registry_passes_and_freezes(finished, tmp_path):
    reg, root = finished[0], copy(finished, tmp_path)
    st = registry_status(load_registry(reg), root)
    assert st["state"] == "complete" and st["rows"][0]["contracts"] == {k: [] for k in st["contracts"]}
    assert st["contracts"] == ["objective", "lineage", "generation", "analysis", "manifest"]
    a = freeze(load_registry(reg), root)
    assert a["written"] and sorted(p.name for p in (root / "frozen").iterdir()) == [
        "table.csv",
        "table.json",
        "table.md",
    ]
    t = json.loads((root / "frozen/table.json").read_text())
    assert t["content_hash"] == a["content_hash"] and "not a result about 7B models" in t["title"] and t["rlvr"] is True
    assert a["content_hash"] in (root / "frozen/table.md").read_text()
    assert freeze(load_registry(reg), root)["written"] is False  # identical: nothing to do
    t["rows"][0]["verdict"] = "Effective"
    t["content_hash"] = "0" * 64
    (root / "frozen/table.json").write_text(json.dumps(t))
    with pytest.raises(Exception, match="a different table is frozen there"):
        freeze(load_registry(reg), root)
    assert registry_status(load_registry(reg), root)["state"] == "frozen"


def test_status_partial_watermark_and_json(finished, tmp_path, capsys):
    reg = finished[0]
    r = subprocess.run([EXE, "status", str(reg), "--root", str(tmp_path / "empty")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith(
        "PARTIAL - registry c: 0 of 1 points pass every contract (0 failing, 1 missing)"
    )
    assert "train (step 0/2)" in r.stdout and not (tmp_path / "empty").exists()
    root = copy(finished, tmp_path)
    assert cmd_status([str(reg), "--root", str(root), "--json"]) == 0  # what `stalebook status --json` runs
    st = json.loads(capsys.readouterr().out)
    assert st["state"] == "complete" and st["totals"] == {"pass": 1, "fail": 0, "missing": 0, "items": 1}
    r = subprocess.run([EXE, "freeze", str(reg), "--root", str(tmp_path / "empty")], capture_output=True, text=True)
    assert (
        r.returncode == 1 and f"{U}/c2: missing (train (step 0/2))" in r.stderr and "freeze refused: 1 of 1" in r.stderr
    )


def test_fault_sft_checkpoint_spliced_into_grpo_lineage(finished, tmp_path, tiny_snapshot):
    "An SFT run's step-2 checkpoint in place of the GRPO lineage's: objective and lineage contracts refuse it."
    reg, root = finished[0], copy(finished, tmp_path)
    sft = small_run(tmp_path / "sft", tiny_snapshot, objective="sft")
    dst = root / "units" / U / "train/lineage/step-000002"
    shutil.rmtree(dst)
    shutil.copytree(sft.dir / "lineage/step-000002", dst)
    obj = refused(reg, root, "objective")
    assert any("checkpoint step 2 (meta.json) is 'sft'; the demo table takes GRPO runs only" in l for l in obj)
    lin = [l for l in problem_lines(registry_status(load_registry(reg), root)) if " lineage: " in l]
    assert any("content hash does not match the chain" in l for l in lin) and any(
        "a foreign checkpoint" in l for l in lin
    )


def test_fault_store_copied_from_another_policy(finished, tmp_path):
    """The candidates' R store replaced by a store of another policy (the stale one, beta's): the generation contract
    refuses."""
    reg, root = finished[0], copy(finished, tmp_path)
    res = json.loads((root / "units" / U / "points" / C / "result.json").read_text())["manifest"]["rollout_stores"]
    ro = root / "units" / U / "train/rollouts"
    policy = {k: Path(res[k]).name.split("-")[0] for k in ("stale", "candidates/R")}  # a store is named by its policy
    assert policy["stale"] != policy["candidates/R"], policy  # the premise: two policies
    shutil.rmtree(ro / res["candidates/R"])
    shutil.copytree(ro / res["stale"], ro / res["candidates/R"])
    reseal(root)
    lines = refused(reg, root, "generation")
    assert any(
        l.startswith(f"{U}/c2 generation: store candidates/R is bound to policy ") and "the point's π is" in l
        for l in lines
    ), lines
    assert registry_status(load_registry(reg), root)["rows"][0]["contracts"]["manifest"] == []


def test_fault_one_missing_prompt_group(finished, tmp_path):
    reg, root = finished[0], copy(finished, tmp_path)
    res = json.loads((root / "units" / U / "points" / C / "result.json").read_text())["manifest"]["rollout_stores"]
    f = root / "units" / U / "train/rollouts" / res["validation/A"] / "groups.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:-1]))
    lines = refused(reg, root, "generation")
    assert any("store validation/A: 3 of 4 registered prompt groups complete (missing: " in l for l in lines)


def test_fault_result_with_9999_replicates(finished, tmp_path):
    """A consistent result (manifest resealed) with scipy's default 9,999 replicates: only the analysis contract refuses
    it."""
    from stalebook.point import npz_bytes

    reg, root = finished[0], copy(finished, tmp_path)
    pd = root / "units" / U / "points" / C
    r = json.loads((pd / "result.json").read_text())
    r["result"]["n_boot"] = r["manifest"]["replicates"] = 9_999
    (pd / "result.json").write_text(json.dumps(r))
    with np.load(pd / "boot.npz") as z:
        arrays = {k: z[k][:9_999] for k in z.files}
    (pd / "boot.npz").write_bytes(npz_bytes(arrays))
    reseal(root)
    lines = refused(reg, root, "analysis")
    assert f"{U}/c2 analysis: the result has 9,999 bootstrap replicates; the contract needs exactly 10,000" in lines
    assert [k for k, v in registry_status(load_registry(reg), root)["rows"][0]["contracts"].items() if v] == [
        "analysis"
    ]


def test_content_hash_names_the_results_not_the_machine(finished, tmp_path):
    """Two machines that compute the same bytes freeze the same table: a point run where torch's CPU sqrt is not IEEE
    (the manifest's measured `torch_sqrt_ieee`) or under another Python patch release (the executed notebook's kernel
    metadata) has the same content hash; another package version is another table."""
    reg = finished[0]

    def frozen_hash(name, edit) -> str:
        root = shutil.copytree(finished[1], tmp_path / name)
        nb = root / "units" / U / "points" / C / "point.ipynb"
        edit(json.loads(nb.read_text()), nb, json.loads(nb.with_name("manifest.json").read_text()))
        reseal(root)
        return freeze(load_registry(reg), root)["content_hash"]

    def machine(nbj, nb, m):
        nbj["metadata"]["language_info"]["version"] = "3.11.99"
        nb.write_text(json.dumps(nbj))
        m["environment"]["torch_sqrt_ieee"] = not m["environment"]["torch_sqrt_ieee"]
        nb.with_name("manifest.json").write_text(json.dumps(m))

    def versions(nbj, nb, m):
        m["environment"]["versions"]["numpy"] = "0.0.1"
        nb.with_name("manifest.json").write_text(json.dumps(m))

    same = frozen_hash("same", lambda *a: None)
    assert frozen_hash("machine", machine) == same
    assert frozen_hash("versions", versions) != same


def test_fault_byte_flipped_in_a_referenced_file(finished, tmp_path):
    reg, root = finished[0], copy(finished, tmp_path)
    f = root / "units" / U / "points" / C / "result.md"
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 1
    f.write_bytes(bytes(b))
    lines = refused(reg, root, "manifest")
    assert any(
        l.startswith(f"{U}/c2 manifest: points/{C}/result.md: sha256 ") and "does not match the manifest's" in l
        for l in lines
    )


def test_fault_deleted_executed_notebook(finished, tmp_path, capsys):
    reg, root = finished[0], copy(finished, tmp_path)
    (root / "units" / U / "points" / C / "point.ipynb").unlink()
    assert f"{U}/c2 manifest: points/{C}/point.ipynb: missing" in refused(reg, root, "manifest")
    assert cmd_status([str(reg), "--root", str(root)]) == 1  # the functions the CLI commands run
    assert f"{U}/c2 manifest: points/{C}/point.ipynb: missing" in capsys.readouterr().out
    assert cmd_freeze([str(reg), "--root", str(root)]) == 1
    assert (
        f"{U}/c2 manifest: points/{C}/point.ipynb: missing" in capsys.readouterr().err
        and not (root / "frozen").exists()
    )


def test_sft_ablation_fills_only_its_appendix_never_labelled_rlvr(tmp_path, tiny_snapshot):
    """An SFT registry runs, passes and freezes into the appendix table (labelled: not RLVR); it can never fill a main
    table."""
    reg = ranking_registry(tmp_path, tiny_snapshot, name="sft", checkpoints=(2,), objective="sft", table="appendix")
    run_registry(load_registry(reg), tmp_path / "root", progress=False, log=lambda *a: None)
    t = freeze(load_registry(reg), tmp_path / "root")["table"]
    assert t["table"] == "appendix" and t["objective"] == "sft" and t["rlvr"] is False
    md = (tmp_path / "root/frozen/table.md").read_text()
    assert "supervised policy-shift ablation" in md and md.count("RLVR") == md.count("not RLVR") == 1
    # the same runs registered for a main-style table: refused when the registry is loaded, before anything runs
    main = ranking_registry(tmp_path, tiny_snapshot, name="sftmain", checkpoints=(2,), objective="sft", table="main")
    with pytest.raises(Exception, match="objective 'sft' cannot fill the main table"):
        load_registry(main)
