"""Snapshot lockfile and verification: each fault refused with its own message, nothing loaded to check;
the lockfile works on a Hugging Face cache snapshot layout (module `stalebook.snapshot`)."""

import json
import shutil
from pathlib import Path

from conftest import CLI, run_code

from stalebook.snapshot import LOCKFILE, read_lock, snapshot_layout, verify_snapshot, write_lock
from stalebook.tasks import SCHEMA_VERSION


def _edit_lock(d, f):
    lock = json.loads((d / LOCKFILE).read_text())
    f(lock)
    (d / LOCKFILE).write_text(json.dumps(lock))


def test_flipped_byte(snap):
    p = snap / "model.safetensors"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01
    p.write_bytes(bytes(b))
    assert verify_snapshot(snap) == [verify_snapshot(snap)[0]] and verify_snapshot(snap)[0].startswith(
        "hash mismatch: model.safetensors"
    )


def test_missing_file(snap):
    (snap / "tokenizer.json").unlink()
    assert verify_snapshot(snap) == ["file missing: tokenizer.json"]


def test_extra_file(snap):
    (snap / "sub").mkdir()
    (snap / "sub" / "notes.txt").write_text("hi")
    assert verify_snapshot(snap) == ["extra file: sub/notes.txt"]


def test_wrong_revision(snap):
    rev = read_lock(snap)["revision"]
    assert verify_snapshot(snap, revision=rev) == []
    bad = verify_snapshot(snap, revision="ab" * 32)
    assert len(bad) == 1 and bad[0].startswith("revision: expected abababab") and rev[:16] in bad[0]
    _edit_lock(snap, lambda l: l.update(revision="cd" * 32))
    assert (
        verify_snapshot(snap)[0].startswith("revision: lockfile revision cdcdcdcd")
        and "does not match its file list" in verify_snapshot(snap)[0]
    )


def test_changed_schema(snap):
    _edit_lock(snap, lambda l: l["schema"].update(vocab_size=999))
    assert verify_snapshot(snap) == ["schema: vocab_size is 31, lockfile says 999"]
    write_lock(snap)
    _edit_lock(snap, lambda l: l["schema"].update(task_schema_version="tasks/0"))  # locked under an older task schema
    assert verify_snapshot(snap) == [f"schema: task_schema_version is {SCHEMA_VERSION!r}, lockfile says 'tasks/0'"]
    write_lock(snap)
    assert verify_snapshot(snap, expect_schema={"model_type": "qwen2"}) == [
        "schema: model_type is 'llama', run expects 'qwen2'"
    ]


def test_failing_verifier_self_test(snap):
    bad = verify_snapshot(snap, reward_fn=lambda task, completion: (1.0, {}))  # a verifier that accepts everything
    assert bad and all(b.startswith("verifier self-test:") and "expected 0.0" in b for b in bad)
    assert any(" math " in b for b in bad) and any(" code " in b for b in bad)
    assert verify_snapshot(snap) == []  # the package's verifier passes it
    _edit_lock(snap, lambda l: l["self_test"]["math"][0].update(completion="41"))  # tampered expectation
    assert verify_snapshot(snap) == [
        "verifier self-test: math case 0 (selftest-math-1, completion '41') got reward 0.0, expected 1.0"
    ]


def _hf_cache_layout(src, root, commit="0123456789abcdef0123456789abcdef01234567"):
    "Build `models--org--tiny/{blobs,snapshots/<commit>,refs/main}` by hand, files as relative symlinks into blobs/."
    from stalebook.core import hash_file

    repo = root / "models--stalebook--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for p in sorted(src.iterdir()):
        if p.name == LOCKFILE:
            continue
        h = hash_file(p)
        shutil.copyfile(p, repo / "blobs" / h)
        (snap / p.name).symlink_to(Path("..") / ".." / "blobs" / h)
    return snap


def test_hf_cache_snapshot_layout(tiny_snapshot, tmp_path):
    from stalebook.model import load_policy

    snap = _hf_cache_layout(tiny_snapshot, tmp_path / "hub")
    assert snapshot_layout(snap)["layout"] == "hf-cache" and (snap / "config.json").is_symlink()
    r = run_code(CLI, "snapshot", "lock", snap)
    assert r.returncode == 0 and "(hf-cache)" in r.stdout, r.stderr
    lock = read_lock(snap)
    assert (lock["hf_repo"], lock["hf_commit"]) == ("stalebook/tiny", snap.name)
    assert lock["revision"] == read_lock(tiny_snapshot)["revision"]  # same content, same revision, any layout
    assert verify_snapshot(snap) == []
    m, tok = load_policy(snap)
    assert m.stalebook_base_revision == lock["revision"]
    blob = (snap / "model.safetensors").resolve()
    b = bytearray(blob.read_bytes())
    b[100] ^= 1
    blob.write_bytes(bytes(b))
    assert verify_snapshot(snap)[0].startswith("hash mismatch: model.safetensors")
    b[100] ^= 1
    blob.write_bytes(bytes(b))
    assert verify_snapshot(snap) == []
    moved = snap.parent / ("f" * 40)
    snap.rename(moved)
    assert verify_snapshot(moved) == [f"revision: hf cache commit {'f' * 40} != locked {snap.name}"]


def test_lockfile_errors(tmp_path, snap):
    assert verify_snapshot(tmp_path / "nope") == [f"snapshot: {tmp_path / 'nope'} is not a directory"]
    (snap / LOCKFILE).unlink()
    assert verify_snapshot(snap)[0].startswith("lockfile: ") and "no lockfile" in verify_snapshot(snap)[0]
    (snap / LOCKFILE).write_text("{not json")
    assert "not valid JSON" in verify_snapshot(snap)[0]
