"""Tasks and verifiers: synthetic generators, answer extraction, math/code rewards, loaders, fixtures."""

import json
import pickle
import re
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stalebook import sandbox
from stalebook.core import Domain, StalebookError
from stalebook.rollouts import task_pool
from stalebook.tasks import (
    ALPHABET,
    CODE_LEVELS,
    DOMAINS,
    MATH_LEVELS,
    MATH_NL_FORMAT,
    MATH_NL_LEVELS,
    SCHEMA_VERSION,
    Task,
    VerifierProcess,
    call_with_timeout,
    extract_answer,
    extract_final_answer,
    load_tasks_jsonl,
    math_reward,
    parse_number,
    reward,
    rewards,
    run_self_test,
    self_test_cases,
    synthetic_tasks,
)

FIX = Path(__file__).parent / "fixtures"


# ---------------------------------------------------------------- synthetic generators
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(MATH_LEVELS))
def test_synthetic_math_reference_is_true_arithmetic(seed, level):
    for t in synthetic_tasks("math", 20, Domain(seed, ("m",)), level):
        assert t.prompt.endswith("=") and set(t.prompt + t.answer) <= set(ALPHABET)
        # independent check: Python evaluates the prompt's expression
        assert int(t.answer) == eval(t.prompt[:-1], {"__builtins__": {}})
        assert reward(t, t.answer)[0] == 1.0 and reward(t, str(int(t.answer) + 1))[0] == 0.0
        assert len(t.prompt) <= 12 and len(t.answer) <= 12


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(CODE_LEVELS))
def test_synthetic_code_prompt_consistent_with_reference(seed, level):
    for t in synthetic_tasks("code", 30, Domain(seed, ("c",)), level):
        assert set(t.prompt + t.answer) <= set(ALPHABET) and len(t.answer) <= 12 and len(t.prompt) <= 40
        f = eval("lambda x:" + t.answer)
        shown = [p.split("=") for p in t.prompt.split(";")[:-1]]
        for lhs, rhs in shown:
            assert f(int(lhs[2:-1])) == int(rhs)
        held = [int(s.split("(")[1].split(")")[0]) for s in t.tests]
        assert not set(held) & {int(lhs[2:-1]) for lhs, _ in shown}, "held-out inputs must not be shown"


def test_synthetic_code_reward_in_sandbox_per_level():
    for lv in CODE_LEVELS:
        for t in synthetic_tasks("code", 3, Domain(5, ("code", lv)), lv):
            assert reward(t, t.answer)[0] == 1.0
            assert reward(t, t.answer + "+1")[0] == 0.0
            assert reward(t, "(" + t.answer + ")\nimport os; os._exit(0)")[0] == 1.0  # only the first line is used


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31))
def test_code_nl_words_and_reference_agree_and_the_sandbox_grades_the_answer_line(seed):
    """code_nl (the chat models' code family): the description's numbers are the reference's, an independent
    evaluation of the reference matches every held-out test, and only the line after 'Answer:' is the program."""
    from stalebook.tasks import uses_answer_format

    ts = synthetic_tasks("code_nl", 12, Domain(seed, ("cnl",)))
    for t in ts:
        assert t.domain == "code" and t.meta["program"] == "answer" and t.answer.startswith("lambda x: ")
        desc = t.prompt.split("returns ", 1)[1].split(".\n", 1)[0]
        assert sorted(re.findall(r"\d+", desc)) == sorted(re.findall(r"\d+", t.answer))
        f = eval(t.answer, {"__builtins__": {"max": max, "abs": abs}})
        for test in t.tests:
            x, want = re.fullmatch(r"assert f\((\d+)\)==(-?\d+)", test).groups()
            assert f(int(x)) == int(want)
    comps = [f"Answer: {ts[0].answer}", f"{ts[0].answer}", f"Answer: {ts[0].answer} + 100", "Answer:\n`lambda x: 1`"]
    got = rewards([ts[0]] * 4, comps)
    assert [r for r, _ in got][:3] == [1.0, 0.0, 0.0] and got[1][1]["reason"] == "no answer line"
    assert [uses_answer_format(ts[0], c) for c in comps] == [True, False, True, True]


def _batch():
    """A GRPO-like batch: 4 code prompts x 6 samples (repeats, programs equal up to a trailing line, rejects) + 2 math
    rows."""
    ts = synthetic_tasks("code", 4, Domain(9, ("batch",)), 1)
    comps = lambda t: [t.answer, t.answer, t.answer + "\nignored", "x", "", t.answer + "+1"]
    tm = synthetic_tasks("math", 1, Domain(9, ("m",)), 0)[0]
    tasks = [t for t in ts for _ in range(6)] + [tm, tm]
    return tasks, [c for t in ts for c in comps(t)] + [tm.answer, "no"]


def test_rewards_batch_keeps_order_verifies_each_program_once_and_times_separately():
    "≈ 1 s."
    tasks, comps = _batch()
    with sandbox.Pool(workers=2) as pool:
        timings = []
        got = rewards(tasks, comps, workers=2, timings=timings, pool=pool)
        assert pool.stats["fork"] + pool.stats["per_program"] == 4 * 3  # 3 distinct programs per prompt ("" never runs)
    assert got == [reward(t, c) for t, c in zip(tasks, comps)]  # what each row gets alone, in order
    assert [r for r, _ in got] == [1, 1, 1, 0, 0, 0] * 4 + [1, 0]
    assert len(timings) == len(tasks) and [t["reused"] for t in timings[:6]] == [False, True, True, False, False, False]
    assert all(t["wall_s"] == 0 for t in timings if t["reused"]) and all(
        t["server"] in ("fork", "per-program") for t in timings[:4]
    )
    assert not any(k in d for _, d in got for k in ("wall_s", "server", "stderr_tail"))
    assert rewards([], []) == []
    with pytest.raises(ValueError):
        rewards(tasks, comps[:-1])


def test_reward_details_are_a_function_of_task_and_completion():
    "The same batch twice, and once on each verifier path: byte-identical JSON of all rewards and details. ≈ 2 s."
    tasks, comps = _batch()
    hostile = synthetic_tasks("code", 1, Domain(9, ("h",)), 0)[0]
    tasks, comps = tasks + [hostile] * 3, comps + ["__import__('os').getpid()", "__import__('os').getcwd()", "1/0"]
    runs = []
    for fork_server in (True, True, False):
        with sandbox.Pool(workers=2, fork_server=fork_server) as pool:
            runs.append(json.dumps(rewards(tasks, comps, workers=2, pool=pool), sort_keys=True))
    assert runs[0] == runs[1] == runs[2]
    keys = {
        "domain",
        "task",
        "ok",
        "reason",
        "n_tests",
        "n_passed",
        "exit_status",
        "timed_out",
        "isolation",
        "oracle",
        "extracted",
        "method",
        "reference",
        "exact",
        "math_verify",
    }
    assert all(set(d) <= keys for _, d in json.loads(runs[0])), "a detail carries a field that is not reproducible"


def test_synthetic_deterministic_and_domain_sensitive():
    d = Domain(3, ("pool",))
    for dom in ("math", "code"):
        a, b = synthetic_tasks(dom, 50, d, 1), synthetic_tasks(dom, 50, d, 1)
        assert a == b and [t.id for t in a] == [t.id for t in b]
        assert a != synthetic_tasks(dom, 50, d.child("other"), 1)
        assert len({t.id for t in a}) == 50
    with pytest.raises(StalebookError):
        synthetic_tasks("poetry", 1, d)
    with pytest.raises(StalebookError):
        synthetic_tasks("math", 1, d, level=9)


def test_alphabet_covers_every_level_and_is_small():
    chars = set()
    for dom, levels in (("math", MATH_LEVELS), ("code", CODE_LEVELS)):
        for lv in levels:
            for t in synthetic_tasks(dom, 500, Domain(11, (dom, lv)), lv):
                chars |= set(t.prompt + t.answer)
    assert chars <= set(ALPHABET) and len(ALPHABET) <= 40 and len(set(ALPHABET)) == len(ALPHABET)
    assert set("0123456789") <= chars


def test_task_json_roundtrip_and_schema():
    assert isinstance(SCHEMA_VERSION, str) and SCHEMA_VERSION
    for t in synthetic_tasks("code", 5, Domain(1, ()), 2) + synthetic_tasks("math", 5, Domain(1, ()), 2):
        assert Task.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    with pytest.raises(StalebookError):
        Task("x", "chem", "p", "a")
    with pytest.raises(StalebookError):
        Task("x", "code", "p", "a", ())
    with pytest.raises(StalebookError):
        Task.from_dict({"id": "x", "domain": "math", "prompt": "p", "answer": "1", "bogus": 1})


# ---------------------------------------------------------------- math extraction and reward
@settings(max_examples=200, deadline=None)
@given(st.integers(-(10**6), 10**6), st.text(alphabet="abc xyz.,!\n", max_size=30))
def test_extraction_property_hash_boxed_last(n, noise):
    # #### wins over everything; \boxed wins over trailing numbers; otherwise the last number
    assert parse_number(extract_answer(f"{noise} 17 {noise}\n#### {n}")[0]) == n
    assert parse_number(extract_answer(f"7 {noise} \\boxed{{{n}}} {noise}")[0]) == n
    assert parse_number(extract_answer(f"{noise} 3 {noise} {n}")[0]) == n


@settings(max_examples=200, deadline=None)
@given(st.fractions(max_denominator=50).filter(lambda f: abs(f) < 10**6))
def test_numeric_comparison_is_exact(q):
    t = Task("q", "math", "?", f"{q.numerator}/{q.denominator}" if q.denominator != 1 else str(q.numerator))
    assert reward(t, f"#### {q.numerator}/{q.denominator}")[0] == 1.0
    assert reward(t, f"#### {q.numerator + 1}/{q.denominator}")[0] == 0.0
    if q.denominator in (1, 2, 4, 5, 8, 10):
        assert reward(t, f"{float(q):.6f}")[0] == 1.0  # finite decimal: exact


def test_math_reward_cases():
    t = Task("t", "math", "?", "1234")
    for c, want in (
        ("#### 1,234", 1),
        ("\\boxed{1234}", 1),
        ("1234.0", 1),
        ("1234.01", 0),
        ("12345", 0),
        ("x1234", 0),
        ("#### 1234 and later 5", 1),
        ("", 0),
        ("the answer is 1234.", 1),
    ):
        assert reward(t, c)[0] == want, c
    r, d = reward(t, "#### 1,234")
    json.dumps(d)
    assert d["method"] == "####" and d["extracted"] == "1,234"


def _sleeper(conn, s):
    time.sleep(s)
    conn.send(True)


def _crasher(conn):
    import os

    os._exit(3)


def test_call_with_timeout_is_process_safe():
    t0 = time.monotonic()
    assert call_with_timeout(_sleeper, (30,), timeout=0.5) is None
    assert time.monotonic() - t0 < 3
    assert call_with_timeout(_sleeper, (0,), timeout=5) is True
    assert call_with_timeout(_crasher, (), timeout=5) is None


# ---------------------------------------------------------------- self-test
def test_self_test_cases_pass_and_cover_both_outcomes():
    for dom in ("math", "code"):
        cases = self_test_cases(dom)
        assert {w for _, _, w in cases} == {0.0, 1.0}
        assert run_self_test(dom) == []


# ---------------------------------------------------------------- loaders and fixtures
@pytest.mark.parametrize("fmt", ["gsm8k", "humaneval", "mbpp"])
def test_fixtures_load_and_verify(fmt):
    ts = load_tasks_jsonl(FIX / f"{fmt}_sample.jsonl", fmt)
    assert len(ts) >= 3 and len({t.id for t in ts}) == len(ts)
    for t in ts:
        good = t.meta["solution"] if fmt == "gsm8k" else t.answer
        r, d = reward(t, good)
        assert r == 1.0, (t.id, d)
        bad = (
            "#### 999999"
            if fmt == "gsm8k"
            else (t.answer.replace("return ", "return None and ", 1) if "return " in t.answer else "pass")
        )
        assert reward(t, bad)[0] == 0.0, t.id


def test_humaneval_asserts_become_parent_side_checks():
    ts = load_tasks_jsonl(FIX / "humaneval_sample.jsonl", "humaneval")
    add = ts[0]
    assert add.tests == ("assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(0, 0) == 0")
    assert reward(add, "    return a + b + (a == 0 and b == 0)\n")[0] == 0.0  # fails one assert only
    loop = [t for t in ts if len(t.tests) == 1 and "check(" in t.tests[0]]
    assert loop and reward(loop[0], loop[0].answer)[1]["oracle"] == "child"


GOOD = {
    "gsm8k": '{"question": "1+1?", "answer": "#### 2"}',
    "humaneval": json.dumps(
        {
            "task_id": "X/0",
            "prompt": "def f(x):\n",
            "canonical_solution": "    return x\n",
            "test": "def check(candidate):\n    assert candidate(1) == 1\n",
            "entry_point": "f",
        }
    ),
    "mbpp": json.dumps(
        {"task_id": 9, "text": "id", "code": "def f(x):\n    return x\n", "test_list": ["assert f(1) == 1"]}
    ),
}
BAD = {
    "gsm8k": [
        '{"question": "q", "answer": "no final answer"}',
        '{"question": 3, "answer": "#### 2"}',
        "[1, 2]",
        '{"question": "q"',
        '{"question": "q", "answer": "#### two"}',
    ],
    "humaneval": [
        '{"task_id": "X/1", "prompt": "def f(x):\\n", "canonical_solution": "    return x\\n", '
        '"test": "assert True", "entry_point": "f"}',
        '{"task_id": "X/1", "prompt": "def f(x:\\n", "canonical_solution": "", '
        '"test": "def check(c):\\n    assert c(1)==1\\n", "entry_point": "f"}',
        '{"task_id": "X/1", "prompt": "def f(x):\\n", "canonical_solution": "    return x\\n", '
        '"test": "def check(c):\\n    assert c(1)==1\\n", "entry_point": "f g"}',
    ],
    "mbpp": [
        '{"task_id": 1, "text": "t", "code": "def f(x): return x", "test_list": []}',
        '{"task_id": 1, "text": "t", "code": "def f(x): return x", "test_list": ["assert f(1) =="]}',
        '{"task_id": 1, "text": "t", "code": "def f(x): return x", "test_list": ["assert f(1)==1"], '
        '"test_setup_code": "import os"}',
    ],
}


@pytest.mark.parametrize("fmt", ["gsm8k", "humaneval", "mbpp"])
def test_malformed_line_names_file_and_line_nothing_partial(fmt, tmp_path):
    for bad in BAD[fmt]:
        p = tmp_path / f"{fmt}.jsonl"
        p.write_text(GOOD[fmt] + "\n\n" + bad + "\n")
        with pytest.raises(StalebookError) as e:
            load_tasks_jsonl(p, fmt)
        msg = str(e.value)
        assert f"{p}:3:" in msg and "\n" not in msg, msg
    line = (
        GOOD[fmt] if fmt != "gsm8k" else '{"id": "g1", "question": "1+1?", "answer": "#### 2"}'
    )  # gsm8k ids are positional unless given
    p = tmp_path / "dup.jsonl"
    p.write_text(line + "\n" + line + "\n")
    with pytest.raises(StalebookError, match=r"dup\.jsonl:2: .*duplicate"):
        load_tasks_jsonl(p, fmt)
    p.write_text(GOOD[fmt] + "\n")
    assert len(load_tasks_jsonl(p, fmt)) == 1
    with pytest.raises(StalebookError, match="unknown task format"):
        load_tasks_jsonl(p, "csv")
    with pytest.raises(StalebookError, match="cannot read"):
        load_tasks_jsonl(tmp_path / "missing.jsonl", fmt)


def test_verifier_process_whose_caller_is_gone_exits_quietly(capfd):
    """A VerifierProcess server whose caller closed its end of the answer pipe mid-request (the caller died) exits with
    status 0, its pool closed, without a traceback on stderr (the server's stderr is this process's: capfd reads it)."""
    vp = VerifierProcess(1)
    t, c, _ = self_test_cases("code")[0]
    slow = "(lambda: [sum(range(200000)) for _ in range(20)] and 2*x+1)()"  # still being verified when we leave
    req = pickle.dumps(([{f.name: getattr(t, f.name) for f in fields(t)}] * 2, [c, slow]))
    vp.p.stdin.write(len(req).to_bytes(8, "little") + req)  # one request, framed as `VerifierProcess.rewards` sends it
    vp.p.stdin.flush()
    vp.p.stdout.close()  # nobody reads the answer
    vp.p.stdin.close()
    assert vp.p.wait(timeout=120) == 0
    vp.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def without_math_verify(monkeypatch):
    "This process as if math-verify were not installed: `find_spec` finds nothing and an import of it fails."
    monkeypatch.setitem(sys.modules, "math_verify", None)


# ---------------------------------------------------------------- math_nl: natural-language math for chat models
_WORD_OPS = (("bags", "*"), ("buys", "+"), ("puts in", "+"), ("gives", "-"), ("lost", "-"))  # first match


def _value_of_question(q: str) -> int:
    "Independent reading of a math_nl question: its two numbers and the operation its words name."
    a, b = (int(s) for s in re.findall(r"\d+", q))
    if q.startswith("What is "):
        op = q.split()[3]
    else:
        op = next(o for w, o in _WORD_OPS if w in q)
    return {"+": a + b, "-": a - b, "×": a * b, "*": a * b}[op]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(MATH_NL_LEVELS))
def test_math_nl_reference_is_what_the_question_says(seed, level):
    ts = task_pool("math_nl", 20, seed, level)
    assert len({t.id for t in ts}) == 20
    for t in ts:
        q, fmt = t.prompt.split("\n")
        assert t.domain == "math_nl" and fmt == MATH_NL_FORMAT and t.tests == ()
        assert int(t.answer) == _value_of_question(q) >= 0, t.prompt
        assert t.meta["kind"] == ("arithmetic" if q.startswith("What is ") else "word")


def test_math_nl_pool_is_deterministic_and_pinned():
    ts = task_pool("math_nl", 2, 0)
    assert ts == task_pool("math_nl", 2, 0)
    assert [(t.id, t.prompt, t.answer) for t in ts] == [
        (
            "math_nl-l0-e56da7f16b-0",
            "Tom has 5 stickers and buys 10 more. How many stickers does he have now?\n" + MATH_NL_FORMAT,
            "15",
        ),
        ("math_nl-l0-e56da7f16b-1", "What is 7 - 2?\n" + MATH_NL_FORMAT, "5"),
    ]
    assert task_pool("math_nl", 2, 1) != ts and task_pool("math_nl", 2, 0, 1) != ts
    assert {t.meta["kind"] for t in task_pool("math_nl", 40, 0, 1)} == {"arithmetic", "word"}
    assert any("×" in t.prompt for t in task_pool("math_nl", 40, 0, 1))  # level 1 multiplies
    assert not any("×" in t.prompt or "bags" in t.prompt for t in task_pool("math_nl", 200, 0, 0))
    with pytest.raises(StalebookError, match="math_nl level"):
        task_pool("math_nl", 1, 0, 2)


@pytest.mark.parametrize("installed", [False, True])
def test_existing_families_are_unchanged(monkeypatch, installed):
    """Digest of math/code tasks of every level and of math rewards on fixed completions (taken before math_nl), the
    same whether math-verify is installed or not: the synthetic math domain's grader does not depend on it."""
    import hashlib

    if not installed:
        without_math_verify(monkeypatch)
    h = hashlib.sha256()
    for dom, levels in (("math", MATH_LEVELS), ("code", CODE_LEVELS)):
        for lv in levels:
            for t in task_pool(dom, 30, 7, lv):
                h.update(json.dumps(t.to_dict(), sort_keys=True).encode())
                if dom == "math":
                    for c in (t.answer, "#### " + t.answer, "Answer: " + t.answer + " then 3", "x"):
                        h.update(json.dumps(reward(t, c, timing=None), sort_keys=True).encode())
    assert h.hexdigest() == "6ce4918b322538d42354804907ee60297c68bb703c6e76e81e439f68dd077d15"


def test_math_nl_grader_accepts_the_format_and_rejects_the_rest():
    t = Task("nl", "math_nl", "What is 7 + 5?\n" + MATH_NL_FORMAT, "12")
    for c, want in (
        ("Answer: 12", 1),
        ("7 + 5 = 12.\nAnswer: 12", 1),
        ("**Answer:** 12", 1),
        ("answer: $12$", 1),
        ("Answer: \\boxed{12}", 1),
        ("Answer: 12 apples.", 1),
        ("Answer: 12.0", 1),
        ("Answer: 5\nSorry. Answer: 12", 1),  # the last marker counts
        ("Answer: 12\nSorry. Answer: 5", 0),
        ("Answer: 13", 0),
        ("Answer: 120", 0),
        ("Answer: 12.5", 0),
        ("12", 0),  # right number, no format
        ("The answer is 12.", 0),
        ("Answer: 7 + 5 = 12", 1),  # not a number: math-verify reads the equation's value
        ("Answer: 7 + 5 = 13", 0),
        ("Answer: $\\frac{24}{2}$", 1),
        ("Answer: twelve", 0),  # math-verify does not read words
        ("Answer:", 0),
        ("", 0),
    ):
        assert reward(t, c)[0] == want, c
    r, d = reward(t, "So Answer: 12")
    json.dumps(d)
    assert d["domain"] == "math_nl" and d["method"] == "answer" and d["extracted"] == "12" and d["exact"]
    assert [x for x, _ in rewards([t, t, t], ["Answer: 12", "12", "Answer: 12"])] == [1.0, 0.0, 1.0]


@settings(max_examples=50, deadline=None)
@given(st.integers(-(10**6), 10**6), st.text(st.characters(blacklist_characters="aA"), max_size=30))
def test_final_answer_extraction_property(n, noise):
    assert extract_final_answer(f"{noise}\nAnswer: {n}") == (str(n), "answer")
    assert extract_final_answer(f"{noise} {n}")[1] == "none"  # no marker, no answer


def test_math_nl_task_validation_and_self_test():
    with pytest.raises(StalebookError, match="has no tests"):
        Task("x", "math_nl", "q", "1", ("assert True",))
    with pytest.raises(StalebookError, match="domain must be one of"):
        Task("x", "mathnl", "q", "1")
    with pytest.raises(StalebookError, match="domain must be one of"):
        synthetic_tasks("mathnl", 1, Domain(0, ("x",)))
    assert "math_nl" in DOMAINS
    cases = self_test_cases("math_nl")
    assert {w for _, _, w in cases} == {0.0, 1.0} and run_self_test("math_nl") == []


def test_math_nl_needs_math_verify_and_says_so(monkeypatch):
    "math_nl without math-verify: a one-line error naming it and how to install it, not a silent 0."
    t = Task("nl", "math_nl", "What is 7 + 5?\n" + MATH_NL_FORMAT, "12")
    without_math_verify(monkeypatch)
    with pytest.raises(StalebookError, match=r"^grading math_nl needs math-verify.*make setup"):
        reward(t, "Answer: 12")
    with pytest.raises(StalebookError, match="math-verify"):
        run_self_test("math_nl")
    assert reward(Task("m", "math", "?", "12"), "12")[0] == 1.0  # the synthetic math domain does not need it


def test_math_nl_math_verify_path():
    "math-verify (a dependency) accepts an answer our exact parser cannot read; a number it never sees."
    c = "Answer: $\\frac{24}{2}$"
    assert extract_final_answer(c) == ("$\\frac{24}{2}$", "answer-text")
    assert math_reward("12", c, use_math_verify=False, extract=extract_final_answer)[0] == 0.0
    r, d = math_reward("12", c, use_math_verify=True, extract=extract_final_answer)
    assert r == 1.0 and d["math_verify"] is True
    assert math_reward("12", "Answer: $\\frac{26}{2}$", use_math_verify=True, extract=extract_final_answer)[0] == 0.0
    # an expression where only the number was asked for: the exact path refuses it, math-verify reads its value
    assert math_reward("12", "Answer: 7 + 5 = 12", use_math_verify=False, extract=extract_final_answer)[0] == 0.0
    assert math_reward("12", "Answer: 7 + 5 = 12", use_math_verify=True, extract=extract_final_answer)[0] == 1.0
    assert "math_verify" not in math_reward("12", "Answer: 13", use_math_verify=True, extract=extract_final_answer)[1]


def test_smol_pass_rate_rejects_bad_arguments_before_loading_a_model(monkeypatch):
    import importlib.util

    path = Path(__file__).parent.parent / "benchmarks" / "smol_pass_rate.py"
    monkeypatch.syspath_prepend(str(path.parent))  # its shared arguments (benchargs.py), as when it is run
    spec = importlib.util.spec_from_file_location("smol_pass_rate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for argv, field in (
        (["--n", "4"], "--system"),
        (["--system", "s", "--n", "0"], "--n"),
        (["--system", "s", "--tokens", "25"], "--tokens"),
        (["--system", "s", "--level", "5"], "--level"),
        (["--system", " "], "--system"),
    ):
        with pytest.raises(StalebookError, match=field):
            mod.main(argv)
