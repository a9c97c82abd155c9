"""The tiny snapshot through plain transformers/peft APIs, build determinism, LoRA adapters and the policy hash."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import REDUCED

from stalebook.core import Domain, StalebookError, hash_dir
from stalebook.model import (
    BUILD_FILE,
    LoraSpec,
    TinySpec,
    adapter_state,
    build_tiny_snapshot,
    ensure_tiny_snapshot,
    left_pad,
    load_adapter,
    load_policy,
    policy_hash,
    render_prompt,
    save_adapter,
    split_at_stop,
    stop_token_ids,
)
from stalebook.pretrained import PACKAGED_MODELS, import_snapshot, packaged_model, smol_snapshot
from stalebook.snapshot import LOCKFILE, read_lock, write_lock

ROOT = Path(__file__).resolve().parents[1]


def _py(code, env_extra=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _cli(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from stalebook.cli import main; sys.exit(main(sys.argv[1:]))", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_reduced_build_is_deterministic(tiny_snapshot, tmp_path):
    "Building twice on the same machine gives the same revision (and identical files)."
    d2 = tmp_path / "again"
    build_tiny_snapshot(d2, TinySpec(**REDUCED), log=lambda *a: None)
    assert hash_dir(d2) == hash_dir(tiny_snapshot, exclude=[LOCKFILE])
    assert write_lock(d2)["revision"] == read_lock(tiny_snapshot)["revision"]
    d3 = tmp_path / "other-seed"
    build_tiny_snapshot(d3, TinySpec(**REDUCED, seed=1), log=lambda *a: None)
    assert hash_dir(d3) != hash_dir(d2)  # the revision does depend on the content


def test_snapshot_files_and_params(tiny_snapshot):
    names = {p.name for p in tiny_snapshot.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "stalebook_build.json",
        LOCKFILE,
    } <= names
    rec = json.loads((tiny_snapshot / "stalebook_build.json").read_text())
    assert 400_000 < rec["n_params"] < 600_000
    cfg = json.loads((tiny_snapshot / "config.json").read_text())
    assert (cfg["model_type"], cfg["hidden_size"], cfg["num_hidden_layers"]) == ("llama", 128, 3)


PLAIN_LOAD = """
import json, os, socket, sys
attempts = []
def hook(ev, args):
    if ev.startswith("socket.") and ev in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
                                           "socket.sendto"):
        attempts.append(ev); raise OSError("network blocked in test: " + ev)
sys.addaudithook(hook)
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import LoraConfig, PeftModel, get_peft_model
d, ad = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
m = AutoModelForCausalLM.from_pretrained(d, local_files_only=True)
ids = tok("12+7=", return_tensors="pt").input_ids
base = m(ids).logits
torch.manual_seed(0)
pm = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
pm.save_pretrained(ad)
m2 = AutoModelForCausalLM.from_pretrained(d, local_files_only=True)
pm2 = PeftModel.from_pretrained(m2, ad)
out = pm2(ids).logits
print(json.dumps({"attempts": attempts, "ids": ids[0].tolist(), "decoded": tok.decode(ids[0], skip_special_tokens=True),
                  "diff": float((out - base).abs().max()), "files": sorted(os.listdir(ad)), "cls": type(tok).__name__,
                  "vocab": len(tok), "eos": tok.eos_token_id, "pad": tok.pad_token_id}))
"""


def test_loads_with_plain_apis_in_fresh_process_network_blocked(tiny_snapshot, tmp_path):
    code = "import sys; sys.argv[1:] = %r\n" % [str(tiny_snapshot), str(tmp_path / "ad")] + textwrap.dedent(PLAIN_LOAD)
    r = _py(code, {"HF_HUB_OFFLINE": "1"})
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["attempts"] == []
    assert out["decoded"] == "12+7=" and len(out["ids"]) == 6 and out["eos"] == 2 and out["pad"] == 0
    assert "adapter_model.safetensors" in out["files"] and "adapter_config.json" in out["files"]
    assert out["diff"] == 0.0  # fresh LoRA has B = 0: the adapted model equals the base


def _lora_policy(snap, seed=0):
    return load_policy(snap, lora=LoraSpec(r=4, alpha=8.0), init_domain=Domain(seed, ("lora",)))


HASH_CODE = """
import sys
from stalebook.core import Domain
from stalebook.model import LoraSpec, load_policy, policy_hash, load_adapter
from transformers import AutoModelForCausalLM
m, _ = load_policy(sys.argv[1], lora=LoraSpec(r=4, alpha=8.0), init_domain=Domain(0, ("lora",)))
base, _ = load_policy(sys.argv[1])
print(policy_hash(m), policy_hash(load_adapter(base, sys.argv[2])))
"""


def test_policy_hash_across_processes_and_sensitivity(tiny_snapshot, tmp_path):
    m, tok = _lora_policy(tiny_snapshot)
    h = policy_hash(m)
    ad = tmp_path / "adapter"
    assert save_adapter(m, ad) == h
    r = _py("import sys; sys.argv[1:] = %r\n" % [str(tiny_snapshot), str(ad)] + textwrap.dedent(HASH_CODE))
    assert r.stdout.split() == [h, h]  # fresh process: same init, and the saved adapter
    assert policy_hash(_lora_policy(tiny_snapshot, seed=1)[0]) != h
    name = next(n for n, p in m.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        dict(m.named_parameters())[name].view(-1)[0] += 1e-3
    assert policy_hash(m) != h  # one adapter weight changed
    assert policy_hash(m, base_revision="0" * 64) != policy_hash(m)
    base, _ = load_policy(tiny_snapshot)
    assert adapter_state(base) == {}


def test_adapter_roundtrip_and_wrong_base(tiny_snapshot, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    m, tok = _lora_policy(tiny_snapshot)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=Domain(0, ("t", n)).torch()) * 0.05)
    ad = tmp_path / "ad"
    h = save_adapter(m, ad)
    ids = tok("3+4=", return_tensors="pt").input_ids
    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_snapshot, local_files_only=True), ad)
    assert torch.equal(plain(ids).logits, m(ids).logits)
    base, _ = load_policy(tiny_snapshot)
    assert policy_hash(load_adapter(base, ad)) == h
    meta = json.loads((ad / "stalebook_adapter.json").read_text())
    (ad / "stalebook_adapter.json").write_text(json.dumps({**meta, "base_revision": "f" * 64}))
    with pytest.raises(StalebookError, match="trained on base"):
        load_adapter(load_policy(tiny_snapshot)[0], ad)


def test_dtype_and_device_arguments(tiny_snapshot):
    m, _ = load_policy(
        tiny_snapshot, dtype="bfloat16", lora=LoraSpec(r=2, alpha=4.0, dropout=0.1, target_modules=("q_proj",))
    )
    assert next(m.base_model.model.parameters()).dtype == torch.bfloat16
    assert all("q_proj" in n for n, p in m.named_parameters() if p.requires_grad)
    with pytest.raises(StalebookError, match="unknown dtype"):
        load_policy(tiny_snapshot, dtype="float99")


def test_load_policy_refuses_unverified_snapshot(tiny_snapshot, tmp_path):
    import shutil

    d = tmp_path / "s"
    shutil.copytree(tiny_snapshot, d)
    (d / "config.json").write_text(
        (d / "config.json").read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05')
    )
    with pytest.raises(StalebookError, match="hash mismatch: config.json"):
        load_policy(d)


def test_cli_help_and_one_line_errors(tmp_path, cli):
    r = cli("--help")
    assert r.returncode == 0 and "snapshot" in r.stdout and "preflight" in r.stdout
    for args, msg in [
        (("snapshot",), "choose 'tiny', 'import' or 'lock'"),
        (("snapshot", "import", str(tmp_path / "x.gguf")), "--out"),
        (("snapshot", "tiny"), "--out"),
        (("snapshot", "tiny", "--out", str(tmp_path / "x"), "--threads", "zero"), "invalid int"),
        (("snapshot", "lock", str(tmp_path / "nope")), "is not a directory"),
        (("snapshot", "bake"), "invalid choice"),
        (("preflight",), "dir"),
    ]:
        r = cli(*args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, (args, r.stderr)
    (tmp_path / "exists").mkdir()
    r = cli("snapshot", "tiny", "--out", str(tmp_path / "exists"))
    assert r.returncode == 2 and "already exists" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.long
def test_full_tiny_build_has_the_shipped_revision(tmp_path, shipped_snapshot):
    """The real embedded snapshot rebuilt from scratch through the CLI: pass rates in [0.2, 0.8] per domain, printed,
    and, under the pinned numerics, the very revision shipped with the package (so the package data is what the
    code builds, on any x86-64 CPU with AVX2)."""
    t0 = time.time()
    r = _cli("snapshot", "tiny", "--out", str(tmp_path / "tiny"), timeout=1800)
    dt = time.time() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    print(r.stdout)
    print(f"build wall time {dt:.1f} s")
    rec = json.loads((tmp_path / "tiny" / "stalebook_build.json").read_text())
    assert set(rec["pass_rate"]) == {"math", "code"} and all(0.2 <= v <= 0.8 for v in rec["pass_rate"].values())
    assert "math pass rate" in r.stdout and "code pass rate" in r.stdout
    assert rec["numerics"] == "pinned"
    rev = read_lock(tmp_path / "tiny")["revision"]
    assert rev in r.stdout and rev == read_lock(shipped_snapshot)["revision"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_policy_same_hash_as_cpu(tiny_snapshot, tmp_path):
    "The same load_policy call on CUDA/bfloat16: forward, sampling, adapter save/load and a device-independent hash."
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from stalebook.model import sample_completions

    spec = LoraSpec(r=4, alpha=8.0)
    mg, tok = load_policy(tiny_snapshot, device="cuda", dtype="bfloat16", lora=spec, init_domain=Domain(0, ("lora",)))
    mc, _ = load_policy(tiny_snapshot, device="cpu", dtype="bfloat16", lora=spec, init_domain=Domain(0, ("lora",)))
    assert next(mg.parameters()).is_cuda
    assert policy_hash(mg) == policy_hash(mc)
    outs = sample_completions(mg, tok, ["3+4=", "f(1)=3;f(2)=5;f=lambda x:"], Domain(0, ("s",)).torch())
    assert len(outs) == 2
    ad = tmp_path / "ad"
    h = save_adapter(mg, ad)
    back = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_snapshot, local_files_only=True, dtype=torch.bfloat16), ad
    )
    assert policy_hash(back, base_revision=mg.stalebook_base_revision) == h


def test_ensure_tiny_snapshot_reuses_and_repairs(tiny_snapshot, tmp_path):
    d = tmp_path / "t"
    shutil.copytree(tiny_snapshot, d)
    mt = (d / "model.safetensors").stat().st_mtime_ns
    logs = []
    assert (
        ensure_tiny_snapshot(d, TinySpec(**REDUCED), log=logs.append)["revision"]
        == read_lock(tiny_snapshot)["revision"]
    )
    assert logs == [] and (d / "model.safetensors").stat().st_mtime_ns == mt  # valid: nothing rebuilt
    (d / "config.json").write_text("{}")
    lock = ensure_tiny_snapshot(d, TinySpec(**REDUCED), log=logs.append)
    assert (
        logs[0].startswith(f"rebuilding {d}: hash mismatch: config.json")
        and lock["revision"] == read_lock(tiny_snapshot)["revision"]
    )


def test_import_hf_folder_locked_and_reproducible(tiny_snapshot, tmp_path, cli):
    """`snapshot import` of a Hugging Face folder (the tiny snapshot, a base model without a chat template): refused
    unless allowed, then a locked snapshot whose revision does not depend on where it was written."""
    r = cli("snapshot", "import", tiny_snapshot, "--out", tmp_path / "a")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(tiny_snapshot) in r.stderr and "no chat template" in r.stderr and not (tmp_path / "a").exists()
    r = cli("snapshot", "import", tiny_snapshot, "--out", tmp_path / "a", "--allow-no-chat-template")
    assert r.returncode == 0 and "locked" in r.stdout, r.stderr
    lock_b = import_snapshot(tiny_snapshot, tmp_path / "sub" / "b", require_chat_template=False, log=lambda *a: None)
    assert read_lock(tmp_path / "a")["revision"] == lock_b["revision"]
    rec = json.loads((tmp_path / "a" / BUILD_FILE).read_text())
    assert rec["source"]["format"] == "hf" and rec["tokenizer"]["stop_tokens"] == ["<eos>"]
    m, tok = load_policy(tmp_path / "a", dtype="auto")
    assert tok.padding_side == "left" and next(m.parameters()).dtype == torch.float32
    r = cli("snapshot", "import", tiny_snapshot, "--out", tmp_path / "a", "--allow-no-chat-template")
    assert r.returncode == 2 and "already exists" in r.stderr


def test_import_refuses_bad_folders(tmp_path, cli):
    "One line naming the file, exit 2, nothing written: missing source, no config, unsupported or quantized model."
    (tmp_path / "empty").mkdir()
    for name, cfg in [
        ("bert", {"model_type": "bert"}),
        ("awq", {"model_type": "qwen2", "quantization_config": {"quant_method": "awq"}}),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    for src, msg in [
        ("absent", "absent: no such file or folder"),
        ("empty", "empty: not a Hugging Face model folder (no config.json)"),
        ("bert", "bert/config.json: architecture 'bert' is not supported"),
        ("awq", "awq/config.json: a pre-quantized folder (awq) is not supported"),
    ]:
        r = cli("snapshot", "import", tmp_path / src, "--out", tmp_path / "out")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, (src, r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["absent", "awq", "bert", "empty"][1:]


def test_missing_real_model_gets_the_how_to(tmp_path, monkeypatch):
    monkeypatch.setitem(
        PACKAGED_MODELS, "nosuch", {**PACKAGED_MODELS["smollm2"], "dist": "no-such-dist", "package": "no_such_pkg_xyz"}
    )
    with pytest.raises(StalebookError, match=r"nosuch: the package no-such-dist is not installed \(run `make smol`\)"):
        packaged_model("nosuch")
    monkeypatch.setenv("STALEBOOK_SMOL", str(tmp_path / "smol"))
    with pytest.raises(StalebookError, match=r"no SmolLM2 snapshot \(run `make smol`\)"):
        smol_snapshot()


def test_tiny_prompts_unchanged_by_the_chat_path(tiny_snapshot):
    "Without a chat template the prompt is `tok(prompt).input_ids`; the stop token is <eos>; left padding is masked."
    m, tok = load_policy(tiny_snapshot)
    assert render_prompt(tok, "1+2=") == tok("1+2=").input_ids
    assert stop_token_ids(tok, m.generation_config) == (tok.eos_token_id,)
    assert split_at_stop([4, tok.eos_token_id, 5], stop_token_ids(tok)) == ([4], True)
    ids, att, pos = left_pad([tok("12+3=").input_ids, tok("1+2=").input_ids], tok.pad_token_id)
    with torch.no_grad():
        padded = m(input_ids=ids, attention_mask=att, position_ids=pos).logits[1, -1]
        alone = m(input_ids=torch.tensor([tok("1+2=").input_ids])).logits[0, -1]
    assert torch.allclose(padded, alone, atol=1e-5)
