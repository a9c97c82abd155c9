"""Hostile-code corpus for the code verifier (stalebook.sandbox via stalebook.tasks).

Every hostile program targets the MBPP fixture task `smaller(a, b)` and tries to obtain reward 1
without solving it, to hurt the parent, or to leave something behind. Each must get reward 0, the parent
(and an unrelated sentinel process) must survive, nothing may be left running or written, and the whole
corpus must finish in bounded time. Correct programs run in the same parallel batch must still get 1.
The corpus runs on both verifier paths (fork server, fresh sandbox per program) in both isolation modes.

Fork-server isolation between programs is tested separately: state one program leaves (files, FIFOs,
shared memory, System V IPC, keyrings, environment, module state, processes, exhausted descriptors /
processes / disk, a chmod-ed work dir) must be invisible to the next program of the same template, with a
positive control (the same state *is* visible inside one program, where the channel exists at all); a
program verified concurrently on the other template must not be able to see, signal, ptrace or read the
other (with a positive control of the attack code outside the sandbox); a program that kills or stops its
template costs only its own reward; and a template that cannot start makes the pool fall back, said once.
"""

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stalebook import sandbox
from stalebook.core import hash_file
from stalebook.tasks import code_reward, load_tasks_jsonl, rewards

FIX = Path(__file__).parent / "fixtures"
ORACLE = FIX / "mbpp_sample.jsonl"
SANDBOX_PY = Path(sandbox.__file__)
LIM = sandbox.Limits(cpu_s=2, wall_s=4.0)
BOUND_S = 60.0


def _task():
    t = load_tasks_jsonl(ORACLE, "mbpp")[0]
    return t


def _listener():
    "A TCP server on 127.0.0.1 in the parent's network namespace; records anything it receives."
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    got, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            c.settimeout(1)
            try:
                got.append(c.recv(100) or b"<connected>")
            except OSError:
                got.append(b"<connected>")
            c.close()

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    return srv.getsockname()[1], got, lambda: (stop.set(), th.join(), srv.close())


def hostile_corpus(port: int, canary: Path) -> dict[str, str]:
    oracle, sbx = str(ORACLE), str(SANDBOX_PY)
    return {
        "infinite_loop": "def smaller(a, b):\n    while True: pass\n",
        "cpu_loop_ignoring_sigxcpu": "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass\n",
        "sleep_forever": "import time\ntime.sleep(3600)\n",
        "fork_bomb": "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n",
        "fork_bomb_setsid_escape": (
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    while True:\n"
            "        try: os.fork()\n        except OSError: time.sleep(0.01)\n"
            "def smaller(a, b): return a\n"
        ),
        "daemon_outlives_harness": (
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(120)\n    os._exit(0)\n"
            "def smaller(a, b): return b\n"
        ),
        "memory_bomb": "x = bytearray(1 << 36)\ndef smaller(a, b): return a\n",
        "memory_bomb_growing": "l = []\nwhile True: l.append(bytearray(10**7))\n",
        "huge_output": (
            "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 65536)\n"
        ),
        "huge_result": "def smaller(a, b):\n    return 'x' * (50 * 10**6)\n",
        "disk_fill": "with open('big', 'wb') as f:\n    while True: f.write(b'0' * 10**6)\n",
        "write_outside_workdir": (
            f"import os\nfor p in [{str(canary / 'pwned')!r}, {sbx!r}, '/etc/pwned', '/pwned', '/usr/pwned']:\n"
            "    try:\n        with open(p, 'a') as f: f.write('pwned')\n    except OSError: pass\n"
            "def smaller(a, b): return a\n"
        ),
        "read_oracle_file": f"import json\nexec(json.loads(open({oracle!r}).readline())['code'])\n",
        "read_oracle_from_frames": (
            "import sys, gc\ndef smaller(a, b):\n    f = sys._getframe(1)\n    while f:\n"
            "        for k in ('expected', 'exp', 'check', 'want'):\n"
            "            if k in f.f_locals: return f.f_locals[k]\n        f = f.f_back\n"
            "    for o in gc.get_objects():\n"
            "        if type(o).__name__ == 'Check': return o.expected\n    return None\n"
        ),
        "sys_modules_os_exit": "import sys\nsys.modules['os']._exit(0)\n",
        "importlib_reload_kill_parent": (
            "import importlib, os\nos = importlib.reload(os)\nos.kill(os.getppid(), 9)\nos._exit(0)\n"
        ),
        "loader_escape": "posix = __import__('builtins').__loader__.load_module('posix')\nposix._exit(0)\n",
        "ctypes_escape": (
            "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.kill(libc.getppid(), 9)\nlibc.kill(-1, 9)\nlibc._exit(0)\n"
        ),
        "socket_exfiltration": (
            f"import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    s.sendall(b'PWNED')\nexcept OSError: pass\n"
            "try: socket.getaddrinfo('example.com', 80)\nexcept OSError: pass\n"
            "def smaller(a, b): return a\n"
        ),
        "kill_parent": "import os\nos.kill(os.getppid(), 9)\n",
        "kill_everything": "import os\nos.kill(-1, 9)\n",
        "sys_exit_before_tests": "import sys\nsys.exit(0)\n",
        "os_exit_before_tests": "import os\nos._exit(0)\n",
        "oracle_file_tampering": (
            f"import json\nwith open({oracle!r}, 'w') as f:\n"
            "    f.write(json.dumps({'task_id': 1, 'text': 't', 'code': 'x', 'test_list': ['assert True']}))\n"
            "def smaller(a, b): return a\n"
        ),
        "harness_tampering": (
            'import json, builtins\njson.dumps = lambda *a, **k: \'{"status": "ok", "outputs": []}\'\n'
            "builtins.type = lambda o: int\ndef smaller(a, b): return 0\n"
        ),
        # reads the nonce and the payload from the harness frame, forges a well-framed "all pass" message
        "forge_result_channel": (
            "import sys, os, json\nf = sys._getframe(1)\nnonce, p = f.f_locals['nonce'], f.f_locals['p']\n"
            "n = len(p['calls']) + len(p['raw'])\nfd = int(sys.argv[1])\n"
            "os.write(fd, (nonce + json.dumps({'status': 'ok', 'outputs': [{'b': True}] * n}) + '\\n').encode())\n"
            "os._exit(0)\n"
        ),
        "forge_stdout_and_pipe": (
            "import os, sys\nprint('all tests passed')\n"
            'os.write(int(sys.argv[1]), b\'{"status": "ok", "outputs": []}\\n\')\n'
            "def smaller(a, b): return min(a, b)\n"
        ),
        "lying_eq_object": (
            "class A:\n    def __eq__(self, o): return True\n    __hash__ = None\ndef smaller(a, b): return A()\n"
        ),
        "lying_int_subclass": (
            "class I(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
            "def smaller(a, b): return I(0)\n"
        ),
        # against the parent process (on the fork-server path: the template); each returns the right answer iff the
        # attack worked
        "ptrace_parent": (
            "import ctypes, os\nlibc, pp = ctypes.CDLL(None), os.getppid()\n"
            "ok = libc.ptrace(16, pp, 0, 0) == 0\n"  # attach,
            "if ok: os.waitpid(pp, 0x40000000); libc.ptrace(17, pp, 0, 0)\n"  # wait, detach
            "def smaller(a, b): return min(a, b) if ok else None\n"
        ),
        "read_parent_proc": (
            "import os\nok = False\nfor q in ('environ', 'mem', 'maps', 'fd'):\n    try:\n"
            "        p = f'/proc/{os.getppid()}/{q}'\n"
            "        ok |= bool(os.listdir(p) if q == 'fd' else open(p, 'rb').read(1))\n"
            "    except Exception: pass\ndef smaller(a, b): return min(a, b) if ok else None\n"
        ),
        "stop_parent": (
            "import os, signal\ntry: signal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGSTOP)\n"
            "except OSError: pass\ndef smaller(a, b): return None\n"
        ),
        "exhaust_processes_and_fds": (
            "import os, time\nfds = []\ntry:\n    while True: fds.append(os.open('/dev/null', 0))\n"
            "except OSError: pass\nfor _ in range(64):\n    try:\n        if os.fork() == 0:\n"
            "            os.setsid(); time.sleep(60); os._exit(0)\n    except OSError: break\n"
            "def smaller(a, b): return None\n"
        ),
    }


CORRECT = {
    "correct_min": "def smaller(a, b):\n    return min(a, b)\n",
    "correct_uses_workdir_and_prints": (
        "import os\nwith open('scratch.txt', 'w') as f: f.write('ok')\nprint('hello ' * 100)\n"
        "def smaller(a, b):\n    return a if a < b else b\n"
    ),
    "correct_with_recursion": (
        "def smaller(a, b):\n    return b if a > b else (a if a == b or a < b else smaller(b, a))\n"
    ),
}


CORRECT = {
    "correct_min": "def smaller(a, b):\n    return min(a, b)\n",
    "correct_uses_workdir_and_prints": (
        "import os\nwith open('scratch.txt', 'w') as f: f.write('ok')\nprint('hello ' * 100)\n"
        "def smaller(a, b):\n    return a if a < b else b\n"
    ),
    "correct_with_recursion": (
        "def smaller(a, b):\n    return b if a > b else (a if a == b or a < b else smaller(b, a))\n"
    ),
}


def _sandbox_uid_procs(uids):
    left = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            st = (p / "status").read_text()
        except OSError:
            continue
        uid = int(next(l for l in st.splitlines() if l.startswith("Uid:")).split()[1])
        if uid in uids:
            left.append(int(p.name))
    return left


def _gone(uids, within=3.0):
    "No process of `uids` is left (polled: SIGKILLed processes take a moment to disappear)."
    end = time.monotonic() + within
    while _sandbox_uid_procs(uids) and time.monotonic() < end:
        time.sleep(0.05)
    return _sandbox_uid_procs(uids) == []


def _pool(mode, server, workers, limits=LIM, uids=None, template=sandbox.FORK_SERVER):
    """A pool verifying on `server` ('fork' or 'per-program'; skipped where that cannot run here), its templates running
    `template`; `uids`, a list: every throwaway uid the pool runs under is appended to it (the pool's `uid_source`)."""
    if mode == "namespaces" and sandbox.isolation() != "namespaces":
        pytest.skip("namespaces not permitted here (the rlimits runs still cover the corpus)")
    p = sandbox.Pool(workers=workers, limits=limits, mode=mode, fork_server=server == "fork", server=template)
    if server == "fork" and not p.fork_server:
        pytest.skip("no fork server here (needs a throwaway uid: root)")
    if uids is not None:
        own = p.uid_source
        p.uid_source = lambda: uids.append(own()) or uids[-1]
    return p


@pytest.mark.parametrize("server", ["fork", "per-program"])
@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
def test_hostile_corpus(mode, server, tmp_path):
    "≈ 10 s per (mode, path) here (the 4 s wall-clock cases run side by side)."
    canary = tmp_path / "canary"
    canary.mkdir()
    canary.chmod(0o777)
    uids = []
    pool = _pool(mode, server, workers=8, uids=uids)
    port, received, stop = _listener()
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    before = {p: hash_file(p) for p in (ORACLE, SANDBOX_PY)}
    task = _task()
    cases = {**hostile_corpus(port, canary), **CORRECT}
    assert len(hostile_corpus(port, canary)) >= 15
    timings = []
    t0 = time.monotonic()
    try:
        res = dict(
            zip(cases, rewards([task] * len(cases), list(cases.values()), workers=8, timings=timings, pool=pool))
        )
        total = time.monotonic() - t0
        live = {u: _sandbox_uid_procs({u}) for u in uids}
    finally:
        stop()
        pool.close()
    try:
        print(f"\n[{mode}, {server}] corpus of {len(cases)} programs in {total:.1f}s; pool {pool.stats}")
        for (name, (r, d)), tm in zip(res.items(), timings):
            print(f"  {name:32s} reward={r:.0f} wall={tm['wall_s']:5.2f}s [{tm['server']}]  {d.get('reason')}")
        bad = {n: d.get("reason") for n, (r, d) in res.items() if (r != 0.0) != (n in CORRECT)}
        assert not bad, bad
        assert all(d["isolation"] == mode for _, d in res.values())
        assert all(tm["server"] == server for tm in timings)
        assert all(tm["wall_s"] <= LIM.wall_s + sandbox.GRACE_S + 1 for tm in timings)
        assert not any("wall_s" in d for _, d in res.values())  # timing is a sidecar, never a detail
        assert total < BOUND_S
        assert sentinel.poll() is None, "an unrelated process was killed"
        assert received == [], f"network reached the parent's listener: {received}"
        assert {p: hash_file(p) for p in before} == before, "a host file was modified"
        assert list(canary.iterdir()) == [], "a file was written outside the work dir"
        if server == "fork":  # between programs nothing but the templates themselves ran under the throwaway uids
            assert all(len(v) <= 1 for v in live.values()), live
            assert pool.stats["fork"] == len(cases) and pool.stats["per_program"] == 0
        assert _gone(set(uids)), "sandbox processes survived"
    finally:
        sentinel.kill()
        sentinel.wait()
    # specific mechanisms, not just "0 for some reason"
    why = {n: d["reason"] for n, (_, d) in res.items()}
    assert "timeout" in why["sleep_forever"]
    assert "overflow" in why["huge_result"] or "timeout" in why["huge_result"]
    assert "forged" in why["forge_stdout_and_pipe"] or "garbled" in why["forge_stdout_and_pipe"]
    assert "without a result message" in why["os_exit_before_tests"]
    assert "SystemExit" in why["sys_exit_before_tests"]
    # a forger that found the nonce gets its message accepted, and then fails on the values it had to guess
    assert "tests failed" in why["forge_result_channel"]
    if server == "fork":
        if mode == "namespaces":  # same uid as its template: it can kill it, and loses
            assert "template died" in why["kill_parent"] and "template died" in why["kill_everything"]
        assert "stopped answering" in why["stop_parent"] and pool.stats["replaced"] >= 1


# ---------------------------------------------------------------- isolation between programs (fork server)
# name: (leaver body, finder body, modes in which the state is visible *within* one program)
LEAKS = {
    "work_dir_file": (
        "open('leak.txt', 'w').write('x')",
        "FOUND = os.path.exists('leak.txt')",
        {"namespaces", "rlimits"},
    ),
    "tmp_file": (
        "open('/tmp/stalebook-leak', 'w').write('x')",
        "FOUND = os.path.exists('/tmp/stalebook-leak')",
        {"namespaces"},
    ),
    "tmp_fifo": (
        "os.mkfifo('/tmp/stalebook-fifo')",
        "FOUND = os.path.exists('/tmp/stalebook-fifo')",
        {"namespaces", "rlimits"},
    ),
    "tmp_dir": ("os.mkdir('/tmp/stalebook-dir')", "FOUND = os.path.exists('/tmp/stalebook-dir')", {"namespaces"}),
    "posix_shm": (
        "import _posixshmem\n"
        "fd = _posixshmem.shm_open('/stalebook-leak', os.O_CREAT | os.O_RDWR, 0o666); os.write(fd, b'x')",
        "import _posixshmem\nfd = _posixshmem.shm_open('/stalebook-leak', os.O_RDWR, 0)\n"
        "FOUND = os.pread(fd, 1, 0) == b'x'",
        set(),
    ),
    "sysv_shm": (
        "import ctypes\nctypes.CDLL(None).shmget(0x5b5b, 4096, 0o1666)",
        "import ctypes\nFOUND = ctypes.CDLL(None).shmget(0x5b5b, 0, 0) >= 0",
        {"namespaces"},
    ),
    "sysv_msg": (
        "import ctypes\nctypes.CDLL(None).msgget(0x5b5c, 0o1666)",
        "import ctypes\nFOUND = ctypes.CDLL(None).msgget(0x5b5c, 0) >= 0",
        {"namespaces"},
    ),
    "keyring": (
        "import ctypes\nctypes.CDLL(None).syscall(248, b'user', b'stalebook-leak', b'x', 1, -4)",
        "import ctypes\nFOUND = ctypes.CDLL(None).syscall(250, 10, -4, b'user', b'stalebook-leak', 0) > 0",
        {"namespaces"},
    ),
    "environment": (
        "os.environ['STALEBOOK_LEAK'] = '1'; os.putenv('STALEBOOK_LEAK2', '1')",
        "FOUND = 'STALEBOOK_LEAK' in os.environ or os.environ.get('STALEBOOK_LEAK2') == '1'",
        {"namespaces", "rlimits"},
    ),
    "module_state": (
        "import json, builtins\n"
        "json.STALEBOOK_LEAK = 1; builtins.STALEBOOK_LEAK = 1; sys.modules['stalebook_leak'] = json",
        "import json, builtins\n"
        "FOUND = hasattr(json, 'STALEBOOK_LEAK') or hasattr(builtins, 'STALEBOOK_LEAK') "
        "or 'stalebook_leak' in sys.modules",
        {"namespaces", "rlimits"},
    ),
    "daemon_process": (
        "import time\nif os.fork() == 0:\n    os.setsid()\n"
        "    while True:\n        open('alive', 'w').close(); time.sleep(0.01)",
        "import time\nend = time.monotonic() + 1\nwhile not FOUND and time.monotonic() < end:\n"
        "    FOUND = os.path.exists('alive'); time.sleep(0.01)",
        {"namespaces"},
    ),
    "processes_exhausted": (
        "import time\nfor _ in range(64):\n    try:\n"
        "        if os.fork() == 0:\n            os.setsid(); time.sleep(60); os._exit(0)\n"
        "    except OSError: break",
        "import threading\ntry: threading.Thread(target=lambda: None).start()\nexcept RuntimeError: FOUND = True",
        {"namespaces"},
    ),
    "descriptors_exhausted": (
        "fds = [os.open('/dev/null', 0) for _ in range(40)]",
        "try: [os.open('/dev/null', 0) for _ in range(8)]\nexcept OSError: FOUND = True",
        {"namespaces", "rlimits"},
    ),
    "disk_full": (
        "for i in range(40):\n    with open(f'fill{i}', 'wb') as f: f.write(b'0' * ((1 << 20) - 1))",
        "try:\n    with open('probe', 'wb') as f: f.write(b'1' * 100000)\nexcept OSError: FOUND = True",
        {"namespaces"},
    ),
    "work_dir_chmod": (
        "os.chmod('.', 0o500)",
        "try: open('probe2', 'w').close()\nexcept OSError: FOUND = True",
        {"namespaces", "rlimits"},
    ),
}

if os.uname().machine != "x86_64":
    del LEAKS["keyring"]  # its syscall numbers are x86_64's


def _leaver(body):
    return (
        f"import os, sys\ntry:\n{textwrap.indent(body, '    ')}\n"
        "except Exception: pass\ndef smaller(a, b): return None\n"
    )


def _finder(body, pre=""):
    return (
        f"import os, sys\nFOUND = False\n{pre}try:\n{textwrap.indent(body, '    ')}\nexcept Exception: pass\n"
        "def smaller(a, b): return min(a, b) if FOUND else None\n"
    )


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
def test_no_state_survives_to_the_next_program(mode):
    "Leaver, then finder, on one template: the finder must find nothing. Positive control: both in one program. ≈ 3 s."
    uids = []
    task = _task()
    with _pool(mode, "fork", workers=1, uids=uids) as pool:
        run = lambda code: pool.run(code, task.tests)
        for name, (leave, find, open_in) in LEAKS.items():
            ctl = run(_finder(find, pre=_leaver(leave).replace("def smaller(a, b): return None\n", "")))
            assert ctl.ok == (mode in open_in), (name, "positive control", ctl.reason)
            assert not run(_leaver(leave)).ok
            found = run(_finder(find))
            assert not found.ok, (name, "state survived to the next program", found.reason)
            assert run(CORRECT["correct_uses_workdir_and_prints"]).ok, name  # and the next correct program still passes
        # the child holds exactly /dev/null, stderr and the result pipe (it closed the payload pipe), none of the
        # template's
        fds = pool.run(
            "import os\ndef fds():\n    out = []\n    for f in range(1024):\n        try: os.fstat(f); out.append(f)\n"
            "        except OSError: pass\n    return out\n",
            ["assert fds() == [1, 2, 3]"],
        )
        assert fds.ok, fds.reason
        assert pool.stats["started"] == 1 and pool.stats["replaced"] == 0  # it really was one template throughout
        assert (
            len(pool.uids) == 1 and len(_sandbox_uid_procs(set(pool.uids))) == 1
        )  # ... and only the template is running
    assert _gone(set(uids))


STATUS_FINDER = (
    "import gc\nf, seen = sys._getframe(1), []\nwhile f:\n    seen += list(f.f_locals.values()); f = f.f_back\n"
    "seen += [o for o in gc.get_objects() if type(o) is dict]\n"
    "FOUND = any(type(v) is dict and v.get('rc') == 42 for v in seen)"
)


def test_template_holds_nothing_of_the_previous_program():
    """No live object of the template (frames, gc-tracked objects) tells a program anything about the one before, here
    its exit status. Positive control: the same finder sees it when the template keeps its last status. ≈ 1 s."""
    task = _task()
    keeping = sandbox.FORK_SERVER.replace("del st, msg, fds; gc.collect()", "pass")
    assert keeping != sandbox.FORK_SERVER
    for keep in (False, True):
        with _pool(sandbox.isolation(), "fork", workers=1, template=keeping if keep else sandbox.FORK_SERVER) as pool:
            assert not pool.run("import os\nos._exit(42)", task.tests).ok
            assert pool.run(_finder(STATUS_FINDER), task.tests).ok == keep


WARM_FINDER = (
    "import gc\ngc.unfreeze()\nFOUND = any(getattr(o, '__name__', '') in ('_w', 'C') for o in gc.get_objects())"
)


def test_template_warm_up_leaves_nothing_alive():
    """The template runs the compiler once on its own snippet before it serves (`_warm`); nothing that snippet defined
    stays alive for a program to find. Positive control: a template that keeps the snippet's globals. ≈ 1 s."""
    task = _task()
    keeping = sandbox.FORK_SERVER.replace("    g = {}\n", "    global _KEEP\n    g = _KEEP = {}\n", 1)
    assert keeping != sandbox.FORK_SERVER
    for keep in (False, True):
        with _pool(sandbox.isolation(), "fork", workers=1, template=keeping if keep else sandbox.FORK_SERVER) as pool:
            assert pool.run(_finder(WARM_FINDER), task.tests).ok == keep


VICTIM = (
    "import os, time\nMARK = 'stalebook-' + 'victim-marker'\nopen('marker', 'w').write(MARK)\n"
    "try:\n    import ctypes\n    ctypes.CDLL(None).shmget(0x5b5d, 4096, 0o1666)\nexcept Exception: pass\n"
    "time.sleep(1.5)\ndef smaller(a, b): return min(a, b)\n"
)
# tries for 1.2 s to find, signal, ptrace or read any process that is neither itself, its parent nor init; or the
# victim's work-dir file or System V segment. TARGETS = None: every pid it can see.
ATTACK = """
import os, time, glob
TARGETS = {targets}
FOUND = []
def attack():
    me, up = os.getpid(), os.getppid()
    try: pids = TARGETS or [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in (me, up, 1)]
    except OSError: pids = []
    for pid in pids:
        for how, f in (("signal", lambda: os.kill(pid, 0)),
                       ("read", lambda: open(f'/proc/{{pid}}/environ', 'rb').read(1)),
                       ("mem", lambda: open(f'/proc/{{pid}}/maps').read(1))):
            try: f(); FOUND.append(how)
            except Exception: pass
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.ptrace(16, pid, 0, 0) == 0: FOUND.append("ptrace"); libc.ptrace(17, pid, 0, 0)
        except Exception: pass
    for p in glob.glob('/tmp/stalebook-*/marker') + glob.glob('/tmp/*/marker'):
        try: FOUND.append("file:" + open(p).read())
        except Exception: pass
    try:
        import ctypes
        if ctypes.CDLL(None).shmget(0x5b5d, 0, 0) >= 0: FOUND.append("sysv")
    except Exception: pass
end = time.monotonic() + 1.2
while time.monotonic() < end and not FOUND:
    attack(); time.sleep(0.05)
"""


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
def test_concurrent_neighbour_is_out_of_reach(mode, tmp_path):
    "Victim and attacker verified at the same time on the two templates of a pool. ≈ 2 s."
    uids = []
    task = _task()
    attacker = ATTACK.format(targets=None) + "def smaller(a, b): return min(a, b) if FOUND else None\n"
    with _pool(mode, "fork", workers=2, uids=uids) as pool:
        with ThreadPoolExecutor(2) as ex:  # both templates up first
            list(
                ex.map(
                    lambda _: pool.run("def smaller(a, b): return a\nimport time; time.sleep(0.3)", task.tests),
                    range(2),
                )
            )
        span = {}

        def go(name, code):
            t0 = time.monotonic()
            r = pool.run(code, task.tests)
            span[name] = (t0, time.monotonic())
            return r

        with ThreadPoolExecutor(2) as ex:
            fv, fa = ex.submit(go, "victim", VICTIM), ex.submit(go, "attacker", attacker)
            victim, attack = fv.result(), fa.result()
        assert pool.stats["started"] == 2
    assert victim.ok, ("the victim was disturbed", victim.reason)
    assert not attack.ok, ("the attacker reached its neighbour", attack.reason)
    (v0, v1), (a0, a1) = span["victim"], span["attacker"]
    assert min(v1, a1) - max(v0, a0) > 1.0, "the two programs did not run concurrently"
    assert _gone(set(uids))
    # positive control: the same attack code, outside any sandbox, against a plain process doing what the victim does
    d = tmp_path / "stalebook-ctl"
    d.mkdir()
    victim_p = subprocess.Popen(
        [sys.executable, "-c", VICTIM.replace("def smaller(a, b): return min(a, b)\n", "")], cwd=d
    )
    try:
        time.sleep(0.3)
        out = subprocess.run(
            [sys.executable, "-c", ATTACK.format(targets=[victim_p.pid]) + "print(sorted(set(FOUND)))"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    finally:
        victim_p.kill()
        victim_p.wait()
    assert {"signal", "read", "mem", "ptrace"} <= set(eval(out)), out


def test_template_killed_or_stopped_costs_only_that_program():
    "A program that kills or stops its template gets 0; the template is replaced; the next program gets 1. ≈ 4 s."
    uids = []
    task, lim = _task(), sandbox.Limits(cpu_s=1, wall_s=1.0)
    mode = sandbox.isolation()
    with _pool(mode, "fork", workers=1, limits=lim, uids=uids) as pool:
        kill = (
            "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)\n"
            "def smaller(a, b): return min(a, b)\n"
        )
        stop = kill.replace("SIGKILL", "SIGSTOP")
        for code, why in ((kill, "template died"), (stop, "stopped answering")):
            r = pool.run(code, task.tests)
            assert not r.ok and why in r.reason, r.reason
            assert pool.run(CORRECT["correct_min"], task.tests).ok
        assert pool.stats["replaced"] == 2 and pool.stats["started"] == 3
    assert _gone(set(uids))


def test_fallback_when_the_template_cannot_start(capsys):
    """A template that exits at once: the pool says so once (per process: no other test starts this template) and
    verifies with a fresh sandbox per program. ≈ 1 s."""
    task = _task()
    for _ in range(2):
        with sandbox.Pool(workers=2, limits=LIM, server="import os\nos._exit(3)\n") as pool:
            if not pool.fork_server:
                pytest.skip("no fork server here (needs a throwaway uid: root)")
            got = [pool.run(c, task.tests) for c in (CORRECT["correct_min"], "def smaller(a, b): return a")]
            assert [r.ok for r in got] == [True, False] and {r.server for r in got} == {"per-program"}
            assert pool.fallback and "exit status 3" in pool.fallback
    err = capsys.readouterr().err
    assert err.count("fork server unavailable") == 1, err


BENIGN = {
    "correct": "def smaller(a, b): return min(a, b)",
    "wrong": "def smaller(a, b): return a",
    "raises": "def smaller(a, b): return 1 / 0",
    "syntax_at_runtime": "def smaller(a, b): return eval('1 +')",
    "sigkill_self": "import os\nos.kill(os.getpid(), 9)",
    "exit_0": "import os\nos._exit(0)",
    "sys_exit_3": "import sys\nsys.exit(3)",
    "unsupported_value": "def smaller(a, b): return object()",
    "huge_result": "def smaller(a, b): return 'x' * (5 * 10**6)",
    "prints": "print('x' * 10000)\ndef smaller(a, b): return min(a, b)",
    "memory_error": "x = bytearray(1 << 36)",
}


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
def test_both_paths_give_the_same_details(mode):
    "`detail()` depends on the program, not on the path that verified it. ≈ 2 s."
    task = _task()
    with _pool(mode, "fork", workers=2) as fork, _pool(mode, "per-program", workers=2) as fresh:
        for name, code in BENIGN.items():
            a, b = fork.run(code, task.tests), fresh.run(code, task.tests)
            assert (a.server, b.server) == ("fork", "per-program")
            assert a.detail() == b.detail(), (name, a.detail(), b.detail())
            if name == "huge_result":
                assert a.reason == "result channel overflow", a.reason


def test_pass_fail_agree_with_python_semantics():
    "Parent-side judging agrees with evaluating the assert in plain Python, on benign programs."
    import random

    g = random.Random(7)  # fixed seed; test-only data
    progs = [
        "def f(x): return x * 2",
        "def f(x): return [x, x]",
        "def f(x): return (x,)",
        "def f(x): return x / 2",
        "def f(x): return str(x)",
        "def f(x): return {x: 1}",
        "def f(x): return x > 3",
        "def f(x): return None",
        "def f(x): return {x}",
        "def f(x): return 1.0 * x",
    ]
    tests = []
    for x in range(6):
        tests += [
            f"assert f({x}) == {x * 2}",
            f"assert f({x}) == [{x}, {x}]",
            f"assert f({x}) == ({x},)",
            f"assert abs(f({x}) - {x / 2}) < 1e-9",
            f"assert f({x}) == '{x}'",
            f"assert f({x}) is True",
            f"assert f({x}) is None",
            f"assert not f({x})",
            f"assert f({x})",
            f"assert f({x}) == {{{x}}}",
        ]
    for prog in progs:
        ns = {}
        exec(prog, ns)
        sample = g.sample(tests, 8)
        for t in sample:
            try:
                exec(t, ns)
                want = True
            except Exception:
                want = False
            got = sandbox.run_tests(prog, [t]).ok
            assert got == want, (prog, t, got, want)


def test_raw_tests_run_in_child_and_are_flagged():
    r = sandbox.run_tests("def f(x): return x + 1", ["for i in range(3): assert f(i) == i + 1"])
    assert r.ok and r.oracle == "child"
    r = sandbox.run_tests("def f(x): return x", ["for i in range(3): assert f(i) == i + 1"])
    assert not r.ok and r.oracle == "child"
    r = sandbox.run_tests("def f(x): return x", ["assert f(1) == 1"])
    assert r.ok and r.oracle == "parent"


@pytest.mark.parametrize("server", ["fork", "per-program"])
def test_fork_bomb_small_nproc_reaped_quickly(server):
    "With a tiny RLIMIT_NPROC the fork bomb is bounded and everything is gone right after the wall timeout."
    uids = []
    lim = sandbox.Limits(cpu_s=1, wall_s=2, nproc=4)
    with _pool(sandbox.isolation(), server, workers=1, limits=lim, uids=uids) as pool:
        pool.run("def f(x): return x", ["assert f(1) == 1"])  # the template (if any) is up
        t0 = time.monotonic()
        r = pool.run("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n", ["assert f(1) == 1"])
        dt = time.monotonic() - t0
        assert pool.run("def f(x): return x", ["assert f(1) == 1"]).ok  # and the next program has its processes
    assert not r.ok and dt < 4
    assert _gone(set(uids), within=0.3)


def test_code_reward_rejects_without_spawning():
    t = _task()
    for c, why in (("", "empty"), ("def smaller(a, b) return a", "syntax"), ("x" * 30000, "too long")):
        r, d = code_reward(t, c)
        assert r == 0.0 and why in d["reason"]
