"""Executors across processes: 6 `stalebook work` workers racing over 12 synthetic units (each unit claimed and run
exactly once), workers SIGKILLed at >= 5 different moments (takeover after the TTL, bytes identical to an undisturbed
run), a reduced ranking registry on 2 workers (the same files and frozen table as the local executor), the Ray
executor (a private head on loopback without a dashboard; a 2-node `ray.cluster_utils.Cluster` losing a node), the
status's owners and throughput, and bad input (one line, exit != 0, nothing claimed). Slow (`make test-slow`): the
races, the worker kills, the GPU split, the demo on 2 workers and the Ray head (a minute or less each, many processes
starting); the real tiny registry's demo slice on 6 workers and on the 2-node Ray cluster (with and without a node
removed), and one of its code families as a Ray task — each against the local executor's bytes."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import EXE, content_files, ranking_registry, run, synthetic_registry

# Ray's single-machine mode: this host resolves to 127.0.0.1 for the Ray heads these tests start (read when Ray is
# imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def differing(a: dict, b: dict) -> list[str]:
    "Content files that only one of two runs has or whose bytes differ ([] when the runs are byte-identical)."
    return sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))


def race_registry(tmp: Path, units=12, phases=3, work_s=0.4) -> Path:
    "The synthetic registry the workers race over (12 units of 0.4 s phases unless told)."
    return synthetic_registry(tmp, units=units, phases=phases, work_s=work_s, name="race")


def attempts(root: Path) -> list[dict]:
    return [
        dict(json.loads(l), unit=f.parent.name)
        for f in sorted((root / "units").glob("*/attempts.jsonl"))
        for l in f.read_text().splitlines()
    ]


def worker_events(root: Path) -> list[dict]:
    return [
        json.loads(l) for f in sorted((root / "queue" / "workers").glob("*.jsonl")) for l in f.read_text().splitlines()
    ]


def work(reg, root, *extra, env=None, **kw):
    return subprocess.Popen(
        [EXE, "work", str(reg), "--root", str(root), "--quiet", *map(str, extra)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        **kw,
    )


# ---------------------------------------------------------------- races: 6 workers, 12 units


# slow (70 s here: 8 processes); in the default run nbs/35_executors races two in-process workers over 6 units
@pytest.mark.slow
def test_six_workers_run_every_unit_exactly_once(tmp_path):
    """6 worker processes over 12 units: all exit 0, each unit claimed once, each phase started and finished once, bytes
    as the local executor's."""
    reg = race_registry(tmp_path)
    assert run(["run", reg, "--root", tmp_path / "ref", "--quiet"]).returncode == 0
    procs = [work(reg, tmp_path / "r", "--ttl", 30) for _ in range(6)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [o[1][-500:] for o in outs]
    ev = attempts(tmp_path / "r")
    units = [f"u{i:03d}" for i in range(12)]
    for kind in ("start", "done"):  # every phase of every unit executed exactly once
        assert sorted((e["unit"], e["phase"]) for e in ev if e["event"] == kind) == [
            (u, f"p{j}") for u in units for j in range(3)
        ]
    claims = [e for e in worker_events(tmp_path / "r") if e["event"] in ("claim", "takeover")]
    assert sorted(e["unit"] for e in claims) == units and {e["event"] for e in claims} == {
        "claim"
    }  # no unit claimed twice
    assert len({e["owner"] for e in claims}) >= 2  # the work was shared
    done = {u: json.loads((tmp_path / "r/queue" / u / "done.json").read_text()) for u in units}
    assert {d["gen"] for d in done.values()} == {1} and not list((tmp_path / "r/queue").glob("*/lease-*.json"))
    assert content_files(tmp_path / "ref") == content_files(tmp_path / "r")
    # status: every unit done, its owner named; a throughput and no ETA left
    st = json.loads(run(["status", reg, "--root", tmp_path / "r", "--json"]).stdout)
    assert {u["state"] for u in st["units"].values()} == {"done"} and all(u["owner"] for u in st["units"].values())
    assert st["progress"]["done"] == 12 and st["progress"]["units_per_hour"] > 0 and st["progress"]["eta_s"] == 0


# ---------------------------------------------------------------- worker loss: SIGKILL, takeover after the TTL


def _wait(cond, timeout=300, what=""):
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)


# slow (65 s here); in the default run nbs/35_executors takes over a dead owner's lease and
# test_status_shows_owner_heartbeat_and_stale_lease SIGKILLs a worker
@pytest.mark.slow
def test_killed_workers_are_taken_over_after_ttl_to_identical_bytes(tmp_path):
    """Workers SIGKILLed at 6 different moments — inside a phase's work (3 phases), between a phase's work and its
    record, right after a claim, and mid-phase by the test — each unit taken over by the next worker only after the TTL,
    and the final files byte-identical to an undisturbed run."""
    TTL = 1.5
    reg = race_registry(tmp_path, units=7, phases=3, work_s=0.4)
    assert run(["run", reg, "--root", tmp_path / "ref", "--quiet"]).returncode == 0
    root = tmp_path / "k"

    def claimed(pid):  # its claim (or takeover) on record in its log, and its lease still held
        def text(f):
            try:
                return f.read_text()
            except FileNotFoundError:
                return ""

        log = "".join(text(w) for w in root.glob(f"queue/workers/*-{pid}.jsonl"))
        held = any(f'"pid": {pid},' in text(f) for f in root.glob("queue/*/lease-*.json"))
        return held and ('"event":"claim"' in log or '"event":"takeover"' in log)

    started = lambda pid, unit, phase: (
        any(
            e["event"] == "start" and e["pid"] == pid and e["unit"] == unit and e["phase"] == phase
            for e in attempts(root)
        )
        if (root / "units").is_dir()
        else False
    )
    moments = [
        ("fault", "synthetic:0/0"),
        ("fault", "phase:u001/p1"),
        ("fault", "synthetic:2/2"),
        ("claim", None),
        ("mid-phase", ("u004", "p1")),
        ("fault", "phase:u005/p2"),
    ]
    killed = []
    for how, arg in moments:
        p = work(reg, root, "--ttl", TTL, env={"STALEBOOK_FAULT": arg} if how == "fault" else None)
        if how == "claim":  # killed once its claim is on record: killed between its lease and that record, a worker
            #                    that took over a stale lease would leave no takeover event to count
            _wait(lambda p=p: claimed(p.pid) or p.poll() is not None, what="a claim")
            p.kill()
        elif how == "mid-phase":
            _wait(lambda p=p, arg=arg: started(p.pid, *arg) or p.poll() is not None, what="a phase start")
            p.kill()
        p.communicate(timeout=300)
        assert p.returncode == -signal.SIGKILL, (how, arg, p.returncode)
        killed.append(p.pid)
    last = work(reg, root, "--ttl", TTL)
    assert last.wait(timeout=300) == 0
    assert content_files(tmp_path / "ref") == content_files(root)
    ev = worker_events(root)
    takeovers = [e for e in ev if e["event"] == "takeover"]
    assert len(takeovers) >= 6
    assert all(e["takeover_of"]["age_s"] >= TTL for e in takeovers)  # never before the TTL
    assert {int(e["takeover_of"]["owner"].split("/")[1].split()[0]) for e in takeovers} >= set(killed)
    # a phase whose record was written never ran again; only phases a kill interrupted ran twice
    done = [(e["unit"], e["phase"]) for e in attempts(root) if e["event"] == "done"]
    assert sorted(done) == sorted(set(done)) and len(done) == 7 * 3
    print(
        f"{len(killed)} kills, {len(takeovers)} takeovers "
        f"(heartbeat ages {sorted(round(e['takeover_of']['age_s'], 1) for e in takeovers)})"
    )


def test_status_shows_owner_heartbeat_and_stale_lease(tmp_path):
    """While a worker runs, status names its owner and heartbeat age; after a SIGKILL the lease turns stale once its TTL
    passed."""
    from stalebook.contracts import format_status, registry_status
    from stalebook.registry import load_registry

    reg = load_registry(race_registry(tmp_path, units=2, phases=2, work_s=6.0))
    p = work(reg.source, tmp_path / "r", "--ttl", 2)
    _wait(lambda: list((tmp_path / "r").glob("queue/u000/lease-*.json")), what="a lease")
    time.sleep(1.0)
    st = registry_status(reg, tmp_path / "r")
    u = st["units"]["u000"]
    assert (
        u["state"] == "running"
        and u["owner"].startswith(f"{os.uname().nodename}/{p.pid}")
        and 0 <= u["heartbeat_age_s"] < 2
    ), u
    txt = format_status(st)
    assert "units: 0 of 2 done, 1 running" in txt and f"/{p.pid}" in txt and "heartbeat" in txt, txt
    p.kill()
    p.wait()
    time.sleep(2.5)
    u = registry_status(reg, tmp_path / "r")["units"]["u000"]
    assert u["state"] == "stale" and u["heartbeat_age_s"] > 2, u


# slow (18 s here); in the default run nbs/35_executors checks worker_devices and its refusals
@pytest.mark.slow
def test_gpus_per_unit_sets_cuda_visible_devices_per_worker(tmp_path, cli, monkeypatch):
    """4 GPUs at 2 per unit: two workers, one with CUDA_VISIBLE_DEVICES=0,1 and one with 2,3 (read back from the units'
    attempts)."""
    reg = race_registry(tmp_path, units=4, phases=1, work_s=0.3)
    r = run(["work", reg, "--root", tmp_path / "r", "--gpus-per-unit", 2], env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CUDA_VISIBLE_DEVICES=0,1" in r.stdout and "CUDA_VISIBLE_DEVICES=2,3" in r.stdout
    labels = {e["owner"].split()[-1] for e in worker_events(tmp_path / "r") if e["event"] == "done"}
    assert labels <= {"w0-gpu0,1", "w1-gpu2,3"} and labels
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    r = cli("work", reg, "--root", tmp_path / "r2", "--gpus-per-unit", 4)
    assert (
        r.returncode == 2
        and "only 2 GPU(s)" in r.stderr
        and r.stderr.count("\n") == 1
        and not (tmp_path / "r2/queue").exists()
    )


# ---------------------------------------------------------------- the ranking study's families on two workers


def family_registry(tmp: Path, snap) -> Path:
    "Two ranking families (seeds 0 and 1) of the reduced registry."
    return ranking_registry(tmp, snap, name="fam", seeds=(0, 1))


# slow (35 s here); the default run has each stage: test_contracts, test_report::test_partial_then_frozen_report
@pytest.mark.slow
def test_demo_runs_its_units_side_by_side_and_reports(tmp_path, tiny_snapshot):
    """`stalebook demo REG --workers 2`: status, two shared workers for the run stage, freeze, report and the decisions;
    exit 0."""
    reg = family_registry(tmp_path, tiny_snapshot)
    r = run(
        ["demo", reg, "--root", tmp_path / "r", "--workers", 2],
        env={"STALEBOOK_FIGURES": str(tmp_path / "figs")},
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"[demo] stalebook run {reg} --executor shared --workers 2 (" in r.stdout
    assert "[work] worker w0" in r.stdout and "[work] worker w1" in r.stdout and "[demo] done in" in r.stdout
    assert (tmp_path / "r/frozen/table.json").is_file() and (tmp_path / "r/report/report-fam-rel.png").is_file()
    assert not (tmp_path / "figs").exists()  # the report stays under the results root, never in a figures folder
    owners = {
        json.loads((tmp_path / "r/queue" / u / "done.json").read_text())["owner"]
        for u in ("tiny-math-s0", "tiny-math-s1")
    }
    assert len(owners) == 2, owners  # one family per worker, side by side


@pytest.mark.slow
@pytest.mark.long
def test_two_workers_on_ranking_families_match_local_executor(tmp_path, tiny_snapshot):
    """Two families (train, stale, point) on 2 `stalebook work` workers: the same content files and frozen table as
    `stalebook run`."""
    reg = family_registry(tmp_path, tiny_snapshot)
    assert run(["run", reg, "--root", tmp_path / "local", "--quiet"]).returncode == 0
    procs = [work(reg, tmp_path / "shared", "--ttl", 60) for _ in range(2)]
    assert [p.wait(timeout=1800) for p in procs] == [0, 0]
    for d in ("local", "shared"):
        assert run(["freeze", reg, "--root", tmp_path / d]).returncode == 0
    a, b = content_files(tmp_path / "local"), content_files(tmp_path / "shared")
    assert "frozen/table.json" in a and differing(a, b) == []
    owners = {
        json.loads((tmp_path / "shared/queue" / u / "done.json").read_text())["owner"]
        for u in ("tiny-math-s0", "tiny-math-s1")
    }
    print(f"families ran in {len(owners)} worker(s)")


@pytest.fixture(scope="module")
def tiny_demo_local(tmp_path_factory) -> dict:
    """The real tiny registry's demo slice (3 families, 9 points) run and frozen by the local executor: its content
    files."""
    root = tmp_path_factory.mktemp("tiny-demo") / "local"
    r = run(["run", "tiny:demo", "--root", root, "--quiet"], timeout=7200)
    assert r.returncode == 0, r.stderr[-2000:]
    assert run(["freeze", "tiny:demo", "--root", root]).returncode == 0
    files = content_files(root)
    assert "frozen/table.json" in files
    return files


def exactly_once(root: Path, units: list[str]) -> None:
    """Every phase of every unit started and finished once (from the units' attempt logs); every unit claimed once,
    never taken over."""
    ev = attempts(root)
    starts = sorted((e["unit"], e["phase"]) for e in ev if e["event"] == "start")
    assert starts == sorted(set(starts)) and {u for u, _ in starts} == set(units), starts
    assert sorted((e["unit"], e["phase"]) for e in ev if e["event"] == "done") == starts
    claims = [e for e in worker_events(root) if e["event"] in ("claim", "takeover")]
    assert sorted(e["unit"] for e in claims) == sorted(units) and {e["event"] for e in claims} == {"claim"}, claims


@pytest.mark.slow
@pytest.mark.long
def test_tiny_demo_on_six_workers_runs_each_unit_once_and_matches_local(tmp_path, tiny_demo_local):
    """6 `stalebook work` workers over the real tiny registry's demo slice: all exit 0, each family claimed once, each
    phase run once, and the frozen table and every content file byte-identical to the local executor's."""
    procs = [work("tiny:demo", tmp_path / "shared", "--ttl", 300) for _ in range(6)]
    outs = [p.communicate(timeout=7200) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [o[1][-500:] for o in outs]
    exactly_once(tmp_path / "shared", [f"tiny-math-s{s}" for s in range(3)])
    assert run(["freeze", "tiny:demo", "--root", tmp_path / "shared"]).returncode == 0
    b = content_files(tmp_path / "shared")
    assert differing(tiny_demo_local, b) == []


# ---------------------------------------------------------------- bad input: one line, exit != 0, nothing claimed


@pytest.mark.parametrize(
    "cmd",
    [
        ["work", "{reg}", "--root", "{root}"],
        ["run", "{reg}", "--executor", "shared", "--root", "{root}"],
        ["run", "{reg}", "--executor", "ray", "--root", "{root}"],
    ],
)
def test_unwritable_root_is_one_line_and_claims_nothing(tmp_path, cmd, cli):
    reg = race_registry(tmp_path, units=2)
    (tmp_path / "file").write_text("a regular file")
    root = tmp_path / "file" / "root"  # below a regular file: not creatable, for root users too
    r = cli(*[c.format(reg=reg, root=root) for c in cmd])
    assert (
        r.returncode == 2
        and r.stderr.count("\n") == 1
        and "not writable" in r.stderr
        and "nothing was claimed" in r.stderr
    ), r.stderr


def test_missing_snapshot_is_one_line_and_claims_nothing(tmp_path, cli, monkeypatch):
    for k in [k for k in os.environ if k.startswith("STALEBOOK_OLMO")]:
        monkeypatch.delenv(k)
    for cmd in (
        ["work", "main", "--root", tmp_path / "r"],
        ["run", "main", "--executor", "ray", "--root", tmp_path / "r"],
        ["run", "main", "--executor", "shared", "--root", tmp_path / "r"],
    ):
        r = cli(*cmd)
        assert (
            r.returncode == 2
            and r.stderr.count("\n") == 1
            and "needs a local snapshot" in r.stderr
            and "nothing was claimed" in r.stderr
        ), r.stderr
    assert not (tmp_path / "r").exists()


def test_unreachable_ray_address_is_one_line_and_claims_nothing(tmp_path, cli):
    pytest.importorskip("ray")
    import socket

    reg = race_registry(tmp_path, units=2)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # a port nobody listens on
    r = cli("run", reg, "--executor", "ray", "--address", f"127.0.0.1:{port}", "--root", tmp_path / "r")
    assert (
        r.returncode == 2
        and r.stderr.count("\n") == 1
        and "no Ray cluster reachable" in r.stderr
        and "nothing was claimed" in r.stderr
    ), r.stderr
    r = cli("run", reg, "--executor", "ray", "--address", "nohost", "--root", tmp_path / "r")
    assert r.returncode == 2 and "expected auto or HOST:PORT" in r.stderr
    assert not (tmp_path / "r" / "queue").exists()


# ---------------------------------------------------------------- the Ray executor


def _listening(pids) -> list[tuple[str, int, str]]:
    "(address, port, process name) of every listening TCP socket of the processes `pids`."
    import psutil

    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out += [
                (c.laddr.ip, c.laddr.port, p.name())
                for c in p.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN
            ]
        except psutil.Error:
            pass
    return out


def _loopback(ip: str) -> bool:
    import ipaddress

    a = ipaddress.ip_address(ip)
    return (a.ipv4_mapped or a).is_loopback if a.version == 6 else a.is_loopback


def _ray_processes() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)]


# slow (35 s here: a Ray head and its workers); the default run keeps the Ray executor's refusals
@pytest.mark.slow
def test_ray_private_head_is_loopback_only_without_dashboard_and_runs_units(tmp_path):
    """The head stalebook starts listens on loopback only and serves no dashboard (checked from the sockets of every
    process it started); one Ray task per synthetic unit leaves the local executor's bytes, read back from the
    volume."""
    ray = pytest.importorskip("ray")
    from stalebook.executors import check_can_start, connect_ray, ray_tasks
    from stalebook.registry import load_registry

    reg = race_registry(tmp_path, units=4, phases=2, work_s=0.1)
    assert run(["run", reg, "--root", tmp_path / "ref", "--quiet"]).returncode == 0
    assert connect_ray(None, num_cpus=2) is True
    try:
        socks = _listening(_ray_processes())
        assert socks and all(_loopback(ip) for ip, _, _ in socks), socks
        assert 8265 not in {port for _, port, _ in socks}
        import psutil

        dash = [
            p for p in psutil.Process().children(recursive=True) if "dashboard/dashboard.py" in " ".join(p.cmdline())
        ]
        assert all("--minimal" in p.cmdline() for p in dash)  # Ray's headless head process: no web server
        r = load_registry(reg)
        res = ray_tasks(r, list(r.units()), check_can_start(r, tmp_path / "r"), ttl_s=30, log=lambda *a: None)
    finally:
        ray.shutdown()
    assert {s["state"] for s in res.values()} == {"done"} and all(
        s["owner"].split()[-1].startswith("ray-task-") for s in res.values()
    )
    assert content_files(tmp_path / "ref") == content_files(tmp_path / "r")


def _ray_cluster_run(tmp_path, reg, remove_node: bool, only: str | None = None):
    """A 2-node `ray.cluster_utils.Cluster` (1 CPU each) runs `reg` (the units matching `only`); with `remove_node`, the
    worker node is removed while a unit runs on it."""
    import threading

    import psutil

    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from stalebook.executors import check_can_start, ray_tasks
    from stalebook.registry import load_registry
    from stalebook.units import select_units

    c = Cluster(
        initialize_head=True, head_node_args=dict(num_cpus=1, node_ip_address="127.0.0.1", include_dashboard=False)
    )
    node = c.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    ray.init(address=c.address)
    r, root, out = load_registry(reg), tmp_path / "ray", {}
    try:
        t = threading.Thread(
            target=lambda: out.update(
                ray_tasks(r, select_units(r, only), check_can_start(r, root), ttl_s=30, log=print)
            )
        )
        t.start()
        if remove_node:
            raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
            on_node = lambda: [
                f
                for f in root.glob("queue/*/lease-*.json")
                if json.loads(f.read_text() or "{}").get("pid") in {p.pid for p in raylet.children(recursive=True)}
            ]
            _wait(
                lambda: any((root / "units" / f.parent.name / "attempts.jsonl").is_file() for f in on_node()),
                timeout=1800,
                what="a unit running on the worker node",
            )
            time.sleep(2)
            c.remove_node(node, allow_graceful=False)
        t.join()
    finally:
        ray.shutdown()
        c.shutdown()
    return out, root


def assert_retried(root: Path) -> None:
    "The removed node's unit was taken over by its retried task (from the workers' logs)."
    takeovers = [e for e in worker_events(root) if e["event"] == "takeover"]
    assert takeovers, "the removed node's unit was not retried"
    print("retry:", [(e["unit"], e["takeover_of"]["reason"], e["takeover_of"]["age_s"]) for e in takeovers])


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("remove_node", [False, True])
def test_ray_cluster_of_two_nodes_gives_local_frozen_table(tmp_path, tiny_snapshot, remove_node):
    """Two ranking families as Ray tasks on a 2-node cluster: the same files and frozen table as the local executor; a
    node removed while its unit runs: the task is retried, resumes from the volume, and the frozen table is still the
    same."""
    reg = family_registry(tmp_path, tiny_snapshot)
    assert run(["run", reg, "--root", tmp_path / "local", "--quiet"]).returncode == 0
    res, root = _ray_cluster_run(tmp_path, reg, remove_node)
    assert {s["state"] for s in res.values()} == {"done"}, res
    for d in (tmp_path / "local", root):
        assert run(["freeze", reg, "--root", d]).returncode == 0
    a, b = content_files(tmp_path / "local"), content_files(root)
    assert "frozen/table.json" in a and differing(a, b) == []
    if remove_node:
        assert_retried(root)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("remove_node", [False, True])
def test_ray_cluster_of_two_nodes_runs_tiny_demo_to_local_frozen_table(tmp_path, tiny_demo_local, remove_node):
    """The real tiny registry's demo slice as Ray tasks on a 2-node cluster: the local executor's frozen table and
    files; with a node removed while its family trains, the task is retried on the other node, resumes, and the bytes
    are still the same."""
    res, root = _ray_cluster_run(tmp_path, "tiny:demo", remove_node)
    assert {s["state"] for s in res.values()} == {"done"}, res
    assert run(["freeze", "tiny:demo", "--root", root]).returncode == 0
    b = content_files(root)
    assert differing(tiny_demo_local, b) == []
    if remove_node:
        assert_retried(root)
    else:
        exactly_once(root, [f"tiny-math-s{s}" for s in range(3)])


@pytest.mark.slow
@pytest.mark.long
def test_ray_task_runs_a_code_family_of_tiny_like_the_local_executor(tmp_path):
    """One code-domain family of the real tiny registry (400 training steps whose rewards run in the sandbox, 4 points)
    as a Ray task on a 2-node cluster: the sandbox works inside a Ray worker, and every content file equals the local
    executor's."""
    local = tmp_path / "local"
    r = run(["run", "tiny", "--only", "tiny-code-s0", "--root", local, "--quiet"], timeout=7200)
    assert r.returncode == 0, r.stderr[-2000:]
    res, root = _ray_cluster_run(tmp_path, "tiny", remove_node=False, only="tiny-code-s0")
    assert {s["state"] for s in res.values()} == {"done"}, res
    exactly_once(root, ["tiny-code-s0"])
    a, b = content_files(local), content_files(root)
    assert any(f.endswith("point.ipynb") for f in a) and differing(a, b) == []
