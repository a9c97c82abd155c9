"""No process leaves a temporary folder behind. A `stalebook demo` of a reduced ranking registry (worker processes,
training, stores, analysis, the report notebook through papermill) and a `stalebook point` (its papermill notebook),
each started with an empty temporary folder of its own as `$TMPDIR` (Python's `tempfile` and the processes it starts
make theirs there), must leave that folder as empty as they found it. Its own folder, not a count of /tmp: other tests
run beside this one on other workers and make and remove their own entries in /tmp at the same time."""

import gc
import os
import subprocess
import tempfile

import pytest
import yaml
from conftest import EXE, ranking_registry, small_run

from stalebook.rollouts import LoraFolders


def _run(args, tmpdir, cwd):
    "`stalebook ARGS` in a fresh process whose temporary folder is `tmpdir`; the entries it left there."
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    r = subprocess.run([EXE, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return sorted(p.name for p in tmpdir.iterdir())


# slow (about a minute of CPU: two workers, training, two points, the report notebook); a point is in the default run
@pytest.mark.slow
def test_a_demo_leaves_no_temporary_folder(tmp_path, tiny_snapshot):
    reg = ranking_registry(tmp_path, tiny_snapshot, name="tmpcheck", checkpoints=(0, 1), seeds=(0,))
    left = _run(["demo", reg, "--root", tmp_path / "root", "--workers", 2], tmp_path / "tmp", tmp_path)
    assert (tmp_path / "root/frozen/table.json").is_file()  # the demo ran its four stages
    assert left == []


def test_a_point_leaves_no_temporary_folder(tmp_path, tiny_snapshot):
    run = small_run(tmp_path / "run", tiny_snapshot).dir
    small = dict(n_candidates=12, n_validation=4, k=3, group_size=4, max_new_tokens=6, groups_per_batch=4)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml.safe_dump(dict(run=str(run), k_sketch=256, n_boot=200, checkpoint=2, **small)))
    # a $TMPDIR deeper than a Unix socket's name can hold (a cluster job's scratch folder): the notebook's kernel
    # talks over local TCP instead, and still leaves nothing behind
    deep = tmp_path / ("scratch-" + "d" * 72) / "tmp"
    deep.parent.mkdir()
    left = _run(["point", cfg], deep, tmp_path)
    assert list(run.rglob("result.json")) or list(tmp_path.rglob("result.json"))  # the point ran to its result
    assert left == []


def test_adapter_folders_without_a_root_go_with_their_object(tmp_path, monkeypatch):
    "An inference engine's adapter folders (`LoraFolders()` with no root: a temporary folder) removed with the object."
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folders = LoraFolders()
    root = folders.root
    assert root.is_dir() and root.parent == tmp_path
    (tmp_path / "named").mkdir()
    named = LoraFolders(tmp_path / "named")  # a folder the caller named stays the caller's
    del folders, named
    gc.collect()
    assert not root.exists() and (tmp_path / "named").is_dir()
