"""Preflight fault injection: each fault refused with its own message; a correct snapshot passes; compute mode
blocks the network and credential discovery; the lockfile works on an HF cache snapshot layout."""
import json, os, shutil, subprocess, sys, textwrap
from pathlib import Path

import pytest

from stalebook.core import hash_dir
from stalebook.preflight import (LOCKFILE, ensure_tiny_snapshot, read_lock, snapshot_layout, verify_snapshot, write_lock)

ROOT = Path(__file__).resolve().parents[1]

def _run(code, *args, env_extra=None, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"PYTHONPATH": str(ROOT), **(env_extra or {})})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)

CLI = "import sys; from stalebook.cli import main; sys.exit(main(sys.argv[1:]))"

@pytest.fixture
def snap(tiny_snapshot, tmp_path):
    d = tmp_path / "snap"; shutil.copytree(tiny_snapshot, d)
    return d

def _edit_lock(d, f):
    lock = json.loads((d / LOCKFILE).read_text()); f(lock); (d / LOCKFILE).write_text(json.dumps(lock))

def test_correct_snapshot_passes_cli(snap):
    r = _run(CLI, "preflight", snap)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("preflight: OK") and read_lock(snap)["revision"] in r.stdout
    assert verify_snapshot(snap) == []
    assert read_lock(snap)["revision"] == hash_dir(snap, exclude=[LOCKFILE])

def test_flipped_byte(snap):
    p = snap / "model.safetensors"; b = bytearray(p.read_bytes()); b[len(b) // 2] ^= 0x01; p.write_bytes(bytes(b))
    assert verify_snapshot(snap) == [verify_snapshot(snap)[0]] and verify_snapshot(snap)[0].startswith("hash mismatch: model.safetensors")

def test_missing_file(snap):
    (snap / "tokenizer.json").unlink()
    assert verify_snapshot(snap) == ["file missing: tokenizer.json"]

def test_extra_file(snap):
    (snap / "sub").mkdir(); (snap / "sub" / "notes.txt").write_text("hi")
    assert verify_snapshot(snap) == ["extra file: sub/notes.txt"]

def test_wrong_revision(snap):
    rev = read_lock(snap)["revision"]
    assert verify_snapshot(snap, revision=rev) == []
    bad = verify_snapshot(snap, revision="ab" * 32)
    assert len(bad) == 1 and bad[0].startswith("revision: expected abababab") and rev[:16] in bad[0]
    _edit_lock(snap, lambda l: l.update(revision="cd" * 32))
    assert verify_snapshot(snap)[0].startswith("revision: lockfile revision cdcdcdcd") and "does not match its file list" in verify_snapshot(snap)[0]

def test_changed_schema(snap, monkeypatch):
    _edit_lock(snap, lambda l: l["schema"].update(vocab_size=999))
    assert verify_snapshot(snap) == ["schema: vocab_size is 31, lockfile says 999"]
    write_lock(snap)
    import stalebook.tasks
    monkeypatch.setattr(stalebook.tasks, "SCHEMA_VERSION", "tasks/999")
    assert verify_snapshot(snap) == ["schema: task_schema_version is 'tasks/999', lockfile says 'tasks/1'"]
    monkeypatch.undo()
    assert verify_snapshot(snap, expect_schema={"model_type": "qwen2"}) == ["schema: model_type is 'llama', run expects 'qwen2'"]

def test_failing_verifier_self_test(snap, monkeypatch):
    import stalebook.tasks
    monkeypatch.setattr(stalebook.tasks, "reward", lambda task, completion: (1.0, {}))   # a verifier that accepts everything
    bad = verify_snapshot(snap)
    assert bad and all(b.startswith("verifier self-test:") and "expected 0.0" in b for b in bad)
    assert any(" math " in b for b in bad) and any(" code " in b for b in bad)
    monkeypatch.undo()
    _edit_lock(snap, lambda l: l["self_test"]["math"][0].update(completion="41"))        # tampered expectation
    assert verify_snapshot(snap) == ["verifier self-test: math case 0 (selftest-math-1, completion '41') got reward 0.0, expected 1.0"]

def test_cli_prints_one_line_per_failure_and_reads_no_weights(snap):
    p = snap / "model.safetensors"; b = bytearray(p.read_bytes()); b[-1] ^= 0xFF; p.write_bytes(bytes(b))
    (snap / "tokenizer_config.json").unlink(); (snap / "x.bin").write_bytes(b"x")
    code = """
    import sys
    opened = []
    sys.addaudithook(lambda ev, a: opened.append(str(a[0])) if ev == "open" and isinstance(a[0], str) and a[0].endswith("safetensors") else None)
    from stalebook.cli import main
    rc = main(sys.argv[1:])
    print("MODULES", "torch" in sys.modules, "safetensors" in sys.modules, "transformers" in sys.modules, len(opened))
    sys.exit(rc)
    """
    r = _run(code, "preflight", snap)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 1
    assert lines[:-1] == ["preflight: FAIL file missing: tokenizer_config.json", "preflight: FAIL extra file: x.bin",
                          lines[2]] and lines[2].startswith("preflight: FAIL hash mismatch: model.safetensors")
    assert lines[-1] == "MODULES False False False 1"     # only the hash read touched the weights file

def test_planted_token_file_not_read(tmp_path):
    hf = tmp_path / "hf"; hf.mkdir(); (hf / "token").write_text("hf_plantedHOMEtoken\n")
    custom = tmp_path / "mytoken"; custom.write_text("hf_plantedCUSTOMtoken\n")
    code = """
    import os, sys
    opened = []
    sys.addaudithook(lambda ev, a: opened.append(os.fsdecode(a[0])) if ev == "open" and isinstance(a[0], (str, bytes)) and "token" in os.fsdecode(a[0]) else None)
    import huggingface_hub
    from huggingface_hub import get_token
    if sys.argv[1] == "compute":
        from stalebook.preflight import enter_compute_mode
        enter_compute_mode()
    print("TOKEN", get_token())
    print("OPENED", [p for p in opened if p in sys.argv[2:]])
    if sys.argv[1] == "compute":                        # even a direct read of the configured token file is refused
        try: open(sys.argv[2]).read(); print("READ", sys.argv[2])
        except PermissionError as e: print("REFUSED", e)
    """
    for tok_env, planted, path in [({"HF_HOME": str(hf)}, "hf_plantedHOMEtoken", hf / "token"),
                                   ({"HF_HOME": str(hf), "HF_TOKEN_PATH": str(custom)}, "hf_plantedCUSTOMtoken", custom),
                                   ({"HF_HOME": str(hf), "HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": ""}, "hf_plantedHOMEtoken", hf / "token")]:
        ctl = _run(code, "control", path, env_extra=tok_env)
        assert f"TOKEN {planted}" in ctl.stdout, ctl.stderr          # the planted file WOULD change behaviour
        assert f"OPENED ['{path}'" in ctl.stdout                    # (huggingface_hub opens it, maybe twice)
        r = _run(code, "compute", path, env_extra=tok_env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["TOKEN None", "OPENED []",
                                         f"REFUSED compute mode: reading the Hugging Face token file {path} is refused"], r.stdout

def test_network_refused_in_compute_mode_loopback_allowed():
    code = """
    import socket, threading
    from stalebook.preflight import enter_compute_mode, NetworkRefused
    env = enter_compute_mode()
    import os
    print("ENV", os.environ["HF_HUB_OFFLINE"], os.environ["TRANSFORMERS_OFFLINE"], os.environ["HF_HUB_DISABLE_IMPLICIT_TOKEN"], "HF_TOKEN" in os.environ)
    for f in (lambda: socket.socket().connect(("93.184.216.34", 80)), lambda: socket.getaddrinfo("huggingface.co", 443),
              lambda: socket.gethostbyname("example.com")):
        try: f(); print("ALLOWED")
        except NetworkRefused as e: print("REFUSED", e, isinstance(e, OSError))
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    c = socket.create_connection(srv.getsockname(), timeout=2); print("LOOPBACK ok"); c.close(); srv.close()
    try:
        import huggingface_hub; huggingface_hub.hf_hub_download("gpt2", "config.json"); print("DOWNLOADED")
    except Exception as e: print("HUB", type(e).__name__)
    """
    r = _run(code, env_extra={"HF_TOKEN": "hf_x"})
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "ENV 1 1 1 False"
    assert out[1] == "REFUSED compute mode: network access refused (socket.connect ('93.184.216.34', 80)) True"
    assert out[2] == "REFUSED compute mode: network access refused (socket.getaddrinfo 'huggingface.co') True"
    assert out[3] == "REFUSED compute mode: network access refused (socket.gethostbyname 'example.com') True"
    assert out[4] == "LOOPBACK ok" and out[5].startswith("HUB ") and "DOWNLOADED" not in r.stdout

def _hf_cache_layout(src, root, commit="0123456789abcdef0123456789abcdef01234567"):
    "Build `models--org--tiny/{blobs,snapshots/<commit>,refs/main}` by hand, files as relative symlinks into blobs/."
    from stalebook.core import hash_file
    repo = root / "models--stalebook--tiny"
    (repo / "blobs").mkdir(parents=True); snap = repo / "snapshots" / commit; snap.mkdir(parents=True)
    (repo / "refs").mkdir(); (repo / "refs" / "main").write_text(commit)
    for p in sorted(src.iterdir()):
        if p.name == LOCKFILE: continue
        h = hash_file(p); shutil.copyfile(p, repo / "blobs" / h)
        (snap / p.name).symlink_to(Path("..") / ".." / "blobs" / h)
    return snap

def test_hf_cache_snapshot_layout(tiny_snapshot, tmp_path):
    from stalebook.model import load_policy
    snap = _hf_cache_layout(tiny_snapshot, tmp_path / "hub")
    assert snapshot_layout(snap)["layout"] == "hf-cache" and (snap / "config.json").is_symlink()
    r = _run(CLI, "snapshot", "lock", snap)
    assert r.returncode == 0 and "(hf-cache)" in r.stdout, r.stderr
    lock = read_lock(snap)
    assert (lock["hf_repo"], lock["hf_commit"]) == ("stalebook/tiny", snap.name)
    assert lock["revision"] == read_lock(tiny_snapshot)["revision"]      # same content, same revision, any layout
    assert verify_snapshot(snap) == []
    m, tok = load_policy(snap)
    assert m.stalebook_base_revision == lock["revision"]
    blob = (snap / "model.safetensors").resolve(); b = bytearray(blob.read_bytes()); b[100] ^= 1; blob.write_bytes(bytes(b))
    assert verify_snapshot(snap)[0].startswith("hash mismatch: model.safetensors")
    b[100] ^= 1; blob.write_bytes(bytes(b)); assert verify_snapshot(snap) == []
    moved = snap.parent / ("f" * 40); snap.rename(moved)
    assert verify_snapshot(moved) == [f"revision: hf cache commit {'f' * 40} != locked {snap.name}"]

def test_ensure_tiny_snapshot_reuses_and_repairs(tiny_snapshot, tmp_path):
    from stalebook.model import TinySpec
    from conftest import REDUCED
    d = tmp_path / "t"; shutil.copytree(tiny_snapshot, d)
    mt = (d / "model.safetensors").stat().st_mtime_ns
    logs = []
    assert ensure_tiny_snapshot(d, TinySpec(**REDUCED), log=logs.append)["revision"] == read_lock(tiny_snapshot)["revision"]
    assert logs == [] and (d / "model.safetensors").stat().st_mtime_ns == mt         # valid: nothing rebuilt
    (d / "config.json").write_text("{}")
    lock = ensure_tiny_snapshot(d, TinySpec(**REDUCED), log=logs.append)
    assert logs[0].startswith(f"rebuilding {d}: hash mismatch: config.json") and lock["revision"] == read_lock(tiny_snapshot)["revision"]

def test_lockfile_errors(tmp_path, snap):
    assert verify_snapshot(tmp_path / "nope") == [f"snapshot: {tmp_path / 'nope'} is not a directory"]
    (snap / LOCKFILE).unlink()
    assert verify_snapshot(snap)[0].startswith("lockfile: ") and "no lockfile" in verify_snapshot(snap)[0]
    (snap / LOCKFILE).write_text("{not json")
    assert "not valid JSON" in verify_snapshot(snap)[0]
