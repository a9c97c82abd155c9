"""The command surface (stalebook.cli): every `cmd_*` function of the package is a command of the table and every
entry resolves to one; the commands live in `stalebook.commands` (and cli's own three) only, and no other module
parses arguments; every `stalebook X` that the package, the notebooks and the README mention is a command;
`stalebook pipeline --help` works through the installed console script, and `stalebook --help` loads no command."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stalebook import cli, commands
from stalebook.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "stalebook"
EXE = str(Path(sys.executable).parent / "stalebook")

# `stalebook X` inside backticks (inline code may wrap a line), a line of a fenced code block, or a parser's prog
BACKTICKED = re.compile(r"`stalebook\s+([a-z][\w-]*)")
SHELL_LINE = re.compile(r"^\s*(?:\$\s+)?stalebook\s+([a-z][\w-]*)")
PROG = re.compile(r"""prog\s*=\s*["']stalebook\s+([a-z][\w-]*)""")


# the modules that may define commands and parse arguments: the entry point (its own three light commands), the
# commands layer, and core (which defines CommandParser)
COMMAND_MODULES = {"stalebook.cli", "stalebook.commands"}
PARSING_MODULES = COMMAND_MODULES | {"stalebook.core"}


def package_modules():
    "(module name, parsed source) of every module of the package."
    for f in sorted(PKG.rglob("*.py")):
        yield ".".join(f.relative_to(ROOT).with_suffix("").parts), ast.parse(f.read_text())


def cmd_functions() -> set[str]:
    "`module:function` of every module-level `def cmd_*` in the package source."
    return {
        f"{mod}:{node.name}"
        for mod, tree in package_modules()
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("cmd_")
    }


def argument_parsing(mod: str, tree) -> list[str]:
    "What in a module parses arguments: an argparse import, a use of CommandParser or ArgumentParser."
    found = [
        f"{mod}: imports argparse"
        for n in ast.walk(tree)
        if isinstance(n, ast.Import)
        for a in n.names
        if a.name == "argparse"
    ]
    found += [
        f"{mod}:{n.lineno}: {n.id if isinstance(n, ast.Name) else n.attr}"
        for n in ast.walk(tree)
        if (isinstance(n, ast.Name) and n.id in ("CommandParser", "ArgumentParser"))
        or (isinstance(n, ast.Attribute) and n.attr in ("CommandParser", "ArgumentParser"))
    ]
    return found


def texts(path: Path) -> list[str]:
    "The texts of a file a reader sees: a notebook's markdown and code cells, or the whole file."
    if path.suffix == ".ipynb":
        return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
    return [path.read_text()]


def mentions(text: str, prog: bool = False) -> list[str]:
    "The X of every `stalebook X` mentioned in `text` (inline code, fenced code blocks, and with `prog` parser progs)."
    found = BACKTICKED.findall(text)
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and (m := SHELL_LINE.match(line)):
            found.append(m.group(1))
    return found + (PROG.findall(text) if prog else [])


def documented() -> dict[str, set[str]]:
    "{X: files mentioning `stalebook X`} over the package source, the notebooks (with nbs/experiments) and README.md."
    files = [*sorted(PKG.rglob("*.py")), *sorted((ROOT / "nbs").rglob("*.ipynb")), ROOT / "README.md"]
    out: dict[str, set[str]] = {}
    for f in files:
        for t in texts(f):
            for x in mentions(t, prog=f.suffix == ".py"):
                out.setdefault(x, set()).add(str(f.relative_to(ROOT)))
    return out


def test_every_cmd_function_is_a_command_and_every_command_resolves():
    fns = cmd_functions()
    assert "stalebook.commands:cmd_pipeline" in fns  # the scan sees the package
    outside = sorted(f for f in fns if f.split(":")[0] not in COMMAND_MODULES)
    assert not outside, f"commands defined outside stalebook.commands and stalebook.cli: {outside}"
    names, targets = {f.split(":")[1] for f in fns}, {target for target, _ in COMMANDS.values()}
    assert len(names) == len(fns), f"a command defined twice: {sorted(fns)}"
    assert not names - targets, f"cmd_* functions missing from cli.COMMANDS: {sorted(names - targets)}"
    assert not targets - names, (
        f"cli.COMMANDS entries that are no cmd_* function of the package: {sorted(targets - names)}"
    )
    for name, (target, help_) in COMMANDS.items():
        f = getattr(cli, target, None) or getattr(commands, target)  # the entry point's own, or a command module's
        assert callable(f) and f.__name__ == target and f.__doc__ and help_, name


def test_only_the_command_layer_parses_arguments():
    bad = [x for mod, tree in package_modules() if mod not in PARSING_MODULES for x in argument_parsing(mod, tree)]
    assert not bad, f"argument parsing outside stalebook.commands and stalebook.cli: {bad}"
    assert argument_parsing("x", ast.parse("import argparse\np = CommandParser(prog='x')")) == [
        "x: imports argparse",
        "x:2: CommandParser",
    ]  # the scan is not vacuous


def test_help_loads_no_command_module():
    "`stalebook --help` (and a bad command) imports neither the commands layer nor torch: it stays instant."
    code = (
        "import contextlib, io, sys\n"
        "from stalebook.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    assert main(['--help']) == 0 and main(['nope']) == 2 and main(['version']) == 0\n"
        "print('stalebook.commands' in sys.modules, 'torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stdout + r.stderr


def test_every_mentioned_command_exists():
    found = documented()
    assert {"run", "status", "freeze", "pipeline", "demo"} <= set(found)  # the scan finds what is there
    unknown = {x: sorted(fs) for x, fs in found.items() if x not in COMMANDS}
    assert not unknown, "mentioned but not commands: " + "; ".join(
        f"`stalebook {x}` in {', '.join(fs)}" for x, fs in sorted(unknown.items())
    )


def test_the_scan_reports_an_unknown_command_with_its_file(tmp_path):
    "The scanner itself: inline code across a line break, fenced lines, progs; prose and placeholders are not commands."
    text = (
        "Run `stalebook frobnicate X`, then `stalebook\nstatus R`; stalebook reproduces (prose); `stalebook COMMAND`;"
        " `stalebook --help`.\n```bash\n$ stalebook run tiny\nstalebook wibble --x\n```\nstalebook outside fences\n"
    )
    assert mentions(text) == ["frobnicate", "status", "run", "wibble"]
    assert mentions('CommandParser(prog="stalebook flub")', prog=True) == ["flub"]
    nb = tmp_path / "x.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": ["see `stalebook frobnicate`"]}]}))
    assert [mentions(t) for t in texts(nb)] == [["frobnicate"]]


def test_pipeline_help_through_the_console_script():
    r = subprocess.run([EXE, "pipeline", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: stalebook pipeline") and "async_training.mode: pipelined" in r.stdout
    r = subprocess.run([EXE, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "\n  pipeline " in r.stdout


@pytest.mark.parametrize("argv", [["pipeline"], ["pipeline", "/nonexistent/config.yaml"], ["pipelines"]])
def test_pipeline_bad_arguments_are_one_line(cli, argv):
    r = cli(*argv)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("stalebook: error:"), r.stderr


class _ClosedPipe:
    "A stdout whose reader has gone away, as `stalebook ... | head` leaves it once head exits."

    def write(self, s):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    """A reader that closed the pipe ends the command with exit 141 (as a Unix filter killed by SIGPIPE reports it) and
    no traceback, instead of a BrokenPipeError."""
    from stalebook.cli import main

    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["version"]) == 141
    assert "Traceback" not in capsys.readouterr().err
