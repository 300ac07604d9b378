"""docs/getting-started.md, run step by step: every command on the page, in order, against the demo
cluster served as real SSH hosts (``sparkconsole demo --serve``), as a user types them.

The page marks each fenced block with HTML comments a reader does not see, one per command, just
before the block::

    <!-- test: exit 1; says "DOES NOT FIT"; says "way out: more nodes" -->

Directives (separated by ``;``): ``exit N`` (default 0), ``says "TEXT"`` (in what it prints),
``answers "LINE"`` (a line on its stdin), ``in a terminal`` (run in a detached tmux, ``says`` read
off the screen) with ``keys "KEYS"`` sent then, ``interrupt after "TEXT"`` (Ctrl-C to its process
group once TEXT is printed), ``installs "NAME"`` (NAME is then on the PATH, in the fresh home),
``writes PATH`` with ``adds time_scale`` (the block is a file's text), ``script`` (the block is one
bash script) with ``curl on NODE``, ``fingerprint of NODE`` (the fingerprint printed is that of the
node's ``/etc/ssh`` key: the comparison the page asks for), and ``not run: WHY``. A block without its
comments, or a directive the parser does not know, fails
:func:`test_every_block_of_the_page_is_run_or_says_why_not`.

Also: ``HF_HUB_OFFLINE=1`` keeps the walk off the Hugging Face Hub (the example model's config is
bundled; the demo's Hub is simulated); only ``uv tool install .`` may reach the package index.

What stands in for the user's machine, and why:

* a fresh ``$HOME`` (a temporary folder): the inventory goes to the page's
  ``~/.config/sparkconsole/cluster.toml``, ``uv tool install .`` puts the command in its
  ``~/.local/bin``, the state in its ``~/.local/state``. Only uv's download cache is the real one;
* ``~/.ssh/config`` names the page's Sparks (``Host spark-1a32`` → the demo node's 127.0.0.1 port)
  with the demo's client key: the user's ``ssh-copy-id`` and ssh config ("What you need"), so the
  page's commands run exactly as written, host names included;
* ``ssh`` on the PATH is OpenSSH with ``-F ~/.ssh/config``: OpenSSH reads the config from the
  account's home in the password database, not ``$HOME`` (openssh-portable ssh.c,
  ``process_config_files``: ``snprintf(buf, sizeof buf, "%s/%s", pw->pw_dir, _PATH_SSH_USER_CONFFILE)``);
* the inventory gains ``time_scale``: the demo's clock runs ``SPEED`` times faster, and the wizard's
  waits follow it (the inventory ``demo --serve`` writes says the same);
* ``curl on NODE``: the demo's engines exist inside the simulated nodes, not on a port of this
  machine, so the page's ``curl`` is sent over SSH to that node, where ``spark-1a32`` is the node.
"""

from __future__ import annotations

import base64
import hashlib
import os
import queue
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.demo_support import GUARD_S, ROOT, SSH, SSH_LINE, TMUX, Tmux, read_until, stop_demo, wait_exit
from tests.proc_support import line_reader

PAGE = ROOT / "docs" / "getting-started.md"
README = ROOT / "README.md"
SPEED = 200  # the demo's clock against the wall: the 20-minute download takes seconds
# one command may take this long before the test gives up: a guard against a hang, never a bound on speed
COMMAND_GUARD_S = 300.0

pytestmark = pytest.mark.timeout(900)

FENCE = re.compile(r"^(```|~~~)")
MARK = re.compile(r"^<!--\s*test:\s*(?P<body>.*?)\s*-->\s*$")
QUOTED = r'"(?P<text>[^"]*)"'
DIRECTIVES = {
    "exit": re.compile(r"^exit (?P<n>\d+)$"),
    "says": re.compile(rf"^says {QUOTED}$"),
    "answers": re.compile(rf"^answers {QUOTED}$"),
    "keys": re.compile(rf"^keys {QUOTED}$"),
    "interrupt": re.compile(rf"^interrupt after {QUOTED}$"),
    "installs": re.compile(rf"^installs {QUOTED}$"),
    "writes": re.compile(r"^writes (?P<path>\S+)$"),
    "curl": re.compile(r"^curl on (?P<node>[A-Za-z0-9.-]+)$"),
    "fingerprint": re.compile(r"^fingerprint of (?P<node>[A-Za-z0-9.-]+)$"),
    "terminal": re.compile(r"^in a terminal$"),
    "time_scale": re.compile(r"^adds time_scale$"),
    "script": re.compile(r"^script$"),
}


@dataclass
class Step:
    """One command of the page (or one whole block: a file's text, a script) and how it is checked."""

    section: str
    line: int  # of its block's opening fence
    text: str
    not_run: str | None = None
    exit: int = 0
    says: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    interrupt: str | None = None
    installs: str | None = None
    writes: str | None = None
    curl_on: str | None = None
    fingerprint_of: str | None = None  # the printed fingerprint is this node's own (its /etc/ssh key)
    terminal: bool = False
    time_scale: bool = False
    script: bool = False

    def where(self) -> str:
        return f"{PAGE.name}:{self.line} ({self.section}): {self.text.splitlines()[0] if self.text else ''}"


def _directives(body: str) -> tuple[dict, list[str]]:
    """A ``test:`` comment's directives as keyword values, and what in it was not understood."""
    if body.startswith("not run:"):
        reason = body[len("not run:"):].strip()
        return ({"not_run": reason}, []) if reason else ({}, ["'not run:' without a reason"])
    found: dict = {"says": [], "answers": [], "keys": []}
    bad = []
    for part in (p.strip() for p in re.findall(r'(?:[^;"]|"[^"]*")+', body)):
        for name, rx in DIRECTIVES.items():
            m = rx.match(part)
            if m is None:
                continue
            if name in ("says", "answers", "keys"):
                found[name].append(m["text"])
            elif name == "exit":
                found["exit"] = int(m["n"])
            elif name == "interrupt":
                found["interrupt"] = m["text"]
            elif name == "installs":
                found["installs"] = m["text"]
            elif name == "writes":
                found["writes"] = m["path"]
            elif name == "curl":
                found["curl_on"] = m["node"]
            elif name == "fingerprint":
                found["fingerprint_of"] = m["node"]
            else:
                found[name] = True
            break
        else:
            bad.append(f"unknown directive {part!r}")
    return found, bad


def _commands(block: list[str]) -> list[str]:
    """The commands of a shell block: continued lines (``\\``) joined, blank and comment lines left out."""
    out: list[str] = []
    pending = ""
    for line in block:
        if pending:
            pending += "\n" + line
        elif line.strip() and not line.lstrip().startswith("#"):
            pending = line
        if pending and not pending.endswith("\\"):
            out.append(pending)
            pending = ""
    if pending:
        out.append(pending)
    return out


def parse_page(text: str) -> tuple[list[Step], list[str]]:
    """Every step of the page in order, and every problem with its markup (a block without its
    comments, a comment before no block, a count of comments unlike the block's commands)."""
    steps: list[Step] = []
    problems: list[str] = []
    lines = text.splitlines()
    section = "(top)"
    marks: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARK.match(line)
        if m:
            marks.append((i + 1, m["body"]))
            i += 1
            continue
        if FENCE.match(line.strip()):
            start, fence = i + 1, line.strip()[:3]
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                j += 1
            block = lines[i + 1:j]
            i = j + 1
            if not marks:
                problems.append(f"line {start} ({section}): a block with no <!-- test: ... --> comment before it")
                continue
            parsed = []
            for at, body in marks:
                found, bad = _directives(body)
                problems += [f"line {at}: {b}" for b in bad]
                parsed.append(found)
            marks = []
            whole = len(parsed) == 1 and (parsed[0].get("script") or parsed[0].get("writes"))
            units = ["\n".join(block)] if whole else _commands(block)
            if len(units) != len(parsed):
                problems.append(f"line {start} ({section}): {len(units)} command(s) but {len(parsed)} test comment(s)")
                continue
            steps += [Step(section=section, line=start, text=u, **p) for u, p in zip(units, parsed, strict=True)]
            continue
        if line.startswith("## "):
            section = line[3:].strip()
        if marks and line.strip():
            problems.append(f"line {marks[0][0]}: a test comment that no block follows")
            marks = []
        i += 1
    if marks:
        problems.append(f"line {marks[0][0]}: a test comment that no block follows")
    return steps, problems


# ---- the page's markup ----------------------------------------------------------------------------


def test_every_block_of_the_page_is_run_or_says_why_not():
    steps, problems = parse_page(PAGE.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)
    assert steps, "no steps found"
    for s in steps:
        assert s.not_run is None or s.not_run.strip(), s.where()
        assert s.says or s.writes or s.installs or s.not_run, f"a step that checks nothing: {s.where()}"
    sections = [s.section for s in steps]
    for n in range(1, 11):  # every numbered section of the walk has its commands run
        assert any(sec.startswith(f"{n}. ") for sec in sections), f"no step under section {n}"


def test_the_markup_parser_finds_what_is_wrong():
    """The checks above catch what they are for: an unmarked block, a count mismatch, a bad directive."""
    _, problems = parse_page("## 1. x\n\n```bash\nsparkconsole --version\n```\n")
    assert any("no <!-- test" in p for p in problems), problems
    _, problems = parse_page('<!-- test: says "a" -->\n```bash\nfoo\nbar\n```\n')
    assert any("2 command(s) but 1" in p for p in problems), problems
    _, problems = parse_page('<!-- test: prints "a" -->\n```bash\nfoo\n```\n')
    assert any("unknown directive" in p for p in problems), problems
    _, problems = parse_page("<!-- test: not run: -->\n```bash\nfoo\n```\n")
    assert any("without a reason" in p for p in problems), problems
    steps, problems = parse_page('<!-- test: exit 1; says "x" -->\n```bash\nfoo \\\n  --bar  # c\n# only a note\n```\n')
    assert not problems and len(steps) == 1 and steps[0].exit == 1 and steps[0].text == "foo \\\n  --bar  # c"


def test_the_readme_installs_as_the_page_does():
    """The README's install block is the page's first block, so running the page runs it too."""
    readme, _ = parse_page_blocks(README.read_text(encoding="utf-8"), "## Install")
    page, _ = parse_page_blocks(PAGE.read_text(encoding="utf-8"), "## 1. Install")
    assert readme and readme == page, (readme, page)
    assert any(c.startswith("uv tool install .") for c in readme), readme


def parse_page_blocks(text: str, heading: str) -> tuple[list[str], str]:
    """The commands of the first fenced block under ``heading``, and that section's text."""
    part = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    block = part.split("```bash\n", 1)[1].split("```", 1)[0]
    return _commands(block.splitlines()), part


# ---- running it against the demo ------------------------------------------------------------------


def _uv_dir() -> list[str]:
    """Where ``uv`` is when it is not on the PATH: the pinned one scripts/_setup installs into .tools/."""
    if shutil.which("uv"):
        return []
    local = ROOT / ".tools" / "bin"
    assert (local / "uv").exists(), "no uv: run scripts/test, which installs the pinned uv into .tools/"
    return [str(local)]


def _uv_cache() -> str:
    """uv's download cache as this machine has it (the fresh home would otherwise start it empty)."""
    uv = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    r = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


class Walk:
    """The user's machine for the walk: a fresh home, its PATH, and the demo cluster behind its ssh config."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.home = tmp / "home"
        self.shims = tmp / "shims"
        self.curl_shims = tmp / "curl-shims"
        for d in (self.home, self.shims, self.curl_shims):
            d.mkdir()
        drop = {"VIRTUAL_ENV", "TMUX", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT", "UV_TOOL_DIR", "UV_TOOL_BIN_DIR"}
        env = {k: v for k, v in os.environ.items()
               if k not in drop and not k.startswith(("XDG_", "SPARKCONSOLE_"))}
        env.update(HOME=str(self.home), LANG="C.UTF-8", HF_HUB_OFFLINE="1", UV_CACHE_DIR=_uv_cache(),
                   PATH=os.pathsep.join([str(self.shims), str(self.home / ".local" / "bin"), *_uv_dir(),
                                         os.environ.get("PATH", "")]))
        env.setdefault("UV_SYSTEM_CERTS", "1")  # as scripts/_setup sets it: the system's certificate store
        self.env = env
        ssh_config = self.home / ".ssh" / "config"
        _executable(self.shims / "ssh", f'#!/bin/sh\nexec {SSH} -F {shlex.quote(str(ssh_config))} "$@"\n')
        self.log: list[str] = []

    def connect(self, printed: list[str]) -> None:
        """The user's ssh set-up for the demo's nodes: their key, and a Host entry per node name."""
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        entries = []
        key = None
        for line in printed:
            m = SSH_LINE.match(line)
            if m is None:
                continue
            argv = shlex.split(m["cmd"])
            key = argv[argv.index("-i") + 1]
            user = argv[-1].split("@")[0]  # the node's login user (nvidia), as a user's ssh config names it
            entries.append(f"Host {m['node']}\n  HostName 127.0.0.1\n  Port {argv[argv.index('-p') + 1]}\n"
                           f"  User {user}\n")
        assert key is not None and len(entries) == 2, printed
        shutil.copyfile(key, ssh_dir / "id_ed25519")
        (ssh_dir / "id_ed25519").chmod(0o600)
        # absolute paths: OpenSSH expands ~ to the account's home, not $HOME
        entries.append(f"Host *\n  IdentityFile {ssh_dir / 'id_ed25519'}\n  IdentitiesOnly yes\n"
                       f"  UserKnownHostsFile {ssh_dir / 'known_hosts'}\n  BatchMode yes\n")
        (ssh_dir / "config").write_text("".join(entries))

    def expand(self, path: str) -> Path:
        return Path(path.replace("~", str(self.home), 1) if path.startswith("~/") else path)

    # -- one step ---------------------------------------------------------------------------------

    def run(self, step: Step) -> None:
        t0 = time.monotonic()
        if step.not_run is not None:
            self.log.append(f"not run: {step.where()}: {step.not_run}")
            return
        if step.writes:
            self._write(step)
        elif step.terminal:
            self._terminal(step)
        else:
            self._command(step)
        self.log.append(f"{time.monotonic() - t0:6.1f} s  {step.where()}")
        if step.installs:
            found = shutil.which(step.installs, path=self.env["PATH"])
            assert found and Path(found).is_relative_to(self.home), (
                f"{step.where()}: {step.installs} on the PATH is {found}, not the one just installed")

    def _write(self, step: Step) -> None:
        text = step.text + "\n"
        if step.time_scale:
            assert "[cluster]\n" in text, f"{step.where()}: no [cluster] table to add time_scale to"
            text = text.replace("[cluster]\n", f"[cluster]\ntime_scale = {SPEED}\n", 1)
        path = self.expand(step.writes)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def _command(self, step: Step) -> None:
        env = dict(self.env)
        if step.curl_on:
            _executable(self.curl_shims / "curl",
                        f"#!{sys.executable}\nimport os, shlex, sys\n"
                        f"os.execv({SSH!r}, ['ssh', '-F', os.path.expanduser('~/.ssh/config'), {step.curl_on!r}, "
                        "shlex.join(['curl', *sys.argv[1:]])])\n")
            env["PATH"] = os.pathsep.join([str(self.curl_shims), env["PATH"]])
        argv = ["bash", "-e", "-c", step.text] if step.script else ["bash", "-c", step.text]
        stdin = "".join(a + "\n" for a in step.answers)
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            if stdin:
                proc.stdin.write(stdin)
                proc.stdin.close()
            lines = line_reader(proc.stdout)
            printed: list[str] = []
            if step.interrupt:
                printed = read_until(proc, lines, lambda p: any(step.interrupt in x for x in p), step.where(),
                                     timeout=COMMAND_GUARD_S)
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
            printed += _rest(lines)
            proc.wait(timeout=COMMAND_GUARD_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()
        out = "\n".join(printed)
        tail = "\n".join(printed[-60:])
        assert proc.returncode == step.exit, f"{step.where()}: exit {proc.returncode}, not {step.exit}\n{tail}"
        assert "Traceback" not in out, f"{step.where()}: a traceback\n{out[-4000:]}"
        missing = [s for s in step.says if s not in out]
        assert not missing, f"{step.where()}: does not say {missing}\n{tail}"
        if step.fingerprint_of:
            own = self._fingerprint(step.fingerprint_of)
            assert f"fingerprint: {own}" in out, f"{step.where()}: not {step.fingerprint_of}'s key {own}\n{tail}"

    def _fingerprint(self, node: str) -> str:
        """The SHA256 fingerprint of ``node``'s own host key, read from its ``/etc/ssh`` as the page
        says to compare it (``ssh-keygen -lf``'s form: SHA256 of the key blob, base64 unpadded)."""
        r = subprocess.run(["ssh", node, "cat", "/etc/ssh/ssh_host_ed25519_key.pub"], env=self.env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=GUARD_S)
        assert r.returncode == 0, r.stderr
        blob = base64.b64decode(r.stdout.split()[1])
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")

    def _terminal(self, step: Step) -> None:
        assert TMUX is not None
        exit_file = self.tmp / f"exit-{step.line}"
        inner = f"{step.text}; echo EXIT=$? > {shlex.quote(str(exit_file))}"
        t = Tmux(self.env)
        try:
            t.start(f"bash -c {shlex.quote(inner)}")
            screen = t.wait_for(*step.says, timeout=GUARD_S)
            assert "Traceback" not in screen, screen
            for keys in step.keys:
                t.send(keys)
            got = wait_exit(exit_file, screen)
        finally:
            t.kill()
        assert got == f"EXIT={step.exit}", f"{step.where()}: {got}\n{screen}"


def _rest(lines: queue.Queue[str | None]) -> list[str]:
    """What a process prints until it closes its output (each wait guarded)."""
    out: list[str] = []
    deadline = time.monotonic() + COMMAND_GUARD_S
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"still printing after {COMMAND_GUARD_S:g} s: {out[-20:]!r}"
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        if line is None:
            return out
        out.append(line.rstrip("\n"))


@pytest.mark.skipif(not os.access(SSH, os.X_OK), reason="no OpenSSH client at /usr/bin/ssh")
@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/test installs it)")
def test_the_page_walks_from_install_to_a_served_model_and_back_on_the_demo(tmp_path):
    steps, problems = parse_page(PAGE.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)
    walk = Walk(tmp_path)
    demo = subprocess.Popen([sys.executable, "-m", "sparkconsole.cli", "demo", "--serve", "--speed", str(SPEED)],
                            cwd=ROOT, env={**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "demo-state")},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        printed = read_until(demo, line_reader(demo.stdout), lambda p: any(s.startswith("Try:") for s in p),
                             "demo --serve")
        walk.connect(printed)
        for step in steps:
            try:
                walk.run(step)
            except AssertionError as exc:
                raise AssertionError("\n".join([*walk.log, str(exc)])) from None
        print("\n".join(walk.log))
    finally:
        err = stop_demo(demo, signal.SIGINT)
    assert demo.returncode == 0, err
