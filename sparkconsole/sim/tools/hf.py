"""The Hugging Face CLI: ``hf download REPO`` (``huggingface-cli download``) and ``hf auth whoami``.

``hf download`` writes the HF cache layout as huggingface_hub does: ``models--OWNER--NAME/``
``blobs/<sha256>`` (each file first as ``<sha256>.incomplete``, growing as bytes arrive),
``refs/main`` and ``snapshots/<rev>/<file> -> ../../blobs/<sha256>``; ``$HF_HOME`` (default
``~/.cache/huggingface``) picks the cache. Killed midway, the finished files stay and a rerun
fetches only the rest; the unfinished one restarts from zero (huggingface_hub discards a partial
file). The tqdm ``Fetching N files`` bar goes to stderr, the snapshot path to stdout. Without
internet the download fails with urllib3's name-resolution traceback.

``hf auth whoami`` prints ``user:  NAME`` (``user: `` in bold, as huggingface_hub's ``ANSI.bold``
does) when a token is found (``$HF_TOKEN`` or ``$HF_HOME/token``), ``Not logged in`` (exit 0, as
the real command's ``typer.Exit()``) otherwise. The token itself is never printed.
"""

from __future__ import annotations

import asyncio
import json

from sparkconsole.sim import vllm_logs
from sparkconsole.sim.model import (
    MODELS,
    CacheRamp,
    repo_files,
    repo_revision,
    stable_hex,
)
from sparkconsole.sim.sh.interp import IO
from sparkconsole.sim.tools.common import _hf_offline_error
from sparkconsole.sim.vfs import FsError, node_path

HF_CLI_VERSION = "2.4.0"  # what `hf version` says on the lab's hosts (only that line reads it)
STEP_S = 2.0  # sim seconds between progress updates (file sizes, the bar)
HF_USER = "sparkops"
HF_ORGS = ("spark-lab",)
# `hf download` options that take a value (huggingface_hub's cli/download.py)
_VALUE_OPTS = frozenset({"--repo-type", "--revision", "--include", "--exclude", "--cache-dir", "--local-dir",
                         "--token", "--max-workers"})


class HfTools:
    """Mixin: the ``hf`` and ``huggingface-cli`` commands."""

    def _hf_home(self, io: IO) -> str:
        home = io.env.get("HOME") or self.account.home  # type: ignore[attr-defined]
        return io.env.get("HF_HOME") or f"{home.rstrip('/')}/.cache/huggingface"

    async def c_huggingface_cli(self, argv: list[str], io: IO) -> int:
        io.err("⚠️  Warning: 'huggingface-cli download' is deprecated. Use 'hf download' instead.\n")
        return await self.c_hf(["hf", *argv[1:]], io)

    async def c_hf(self, argv: list[str], io: IO) -> int:
        await self.clock.sleep(self.cluster.hf_start_s)  # Python and huggingface_hub importing
        if argv[1:2] == ["version"]:  # as huggingface_hub 2.4.0's hf prints it, into a pipe too (the lab)
            io.out(f"\x1b[32m✓ hf version\x1b[0m\n  version: {HF_CLI_VERSION}\n")
            return 0
        if argv[1:3] == ["auth", "whoami"] or argv[1:2] == ["whoami"]:
            return await self._hf_whoami(io)
        if argv[1:2] != ["download"]:
            io.err("Usage: hf [OPTIONS] COMMAND [ARGS]...\nTry 'hf -h' for help.\n\n"
                   f"Error: No such command '{argv[1] if len(argv) > 1 else ''}'.\n")
            return 2
        args = argv[2:]
        words: list[str] = []
        i = 0
        while i < len(args):  # REPO_ID [FILENAMES]...; an option's value is not a file name
            if args[i].startswith("-"):
                i += 2 if args[i] in _VALUE_OPTS else 1
                continue
            words.append(args[i])
            i += 1
        if not words:
            io.err("Usage: hf download [OPTIONS] REPO_ID [FILENAMES]...\nTry 'hf download -h' for help.\n\n"
                   "Error: Missing argument 'REPO_ID'.\n")
            return 2
        local = next((args[k + 1] for k in range(len(args) - 1) if args[k] == "--local-dir"), None)
        local = local or next((a.split("=", 1)[1] for a in args if a.startswith("--local-dir=")), None)
        if local is not None:
            return await self._hf_download_local(words[0], io, tuple(words[1:]), local)
        return await self._hf_download(words[0], io, tuple(words[1:]))

    async def _hf_repo(self, repo: str, io: IO):
        """The repository as the Hub answers for it: None (said on stderr as huggingface_hub says it)
        when the node does not reach the Hub or the Hub has no such repository."""
        spec = MODELS.get(repo)
        if not self.node.internet:
            await self.clock.sleep(5.2)
            io.err(_hf_offline_error(repo))
            return None
        if spec is None:
            await self.clock.sleep(0.4)
            io.err(f"huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: Root="
                   f"1-{stable_hex(8, repo)}-{stable_hex(24, repo, 'r')})\n\nRepository Not Found for url: "
                   f"https://huggingface.co/api/models/{repo}/revision/main.\nPlease make sure you specified the "
                   "correct `repo_id` and `repo_type`.\nIf you are trying to access a private or gated repo, make "
                   "sure you are authenticated. For more details, see "
                   "https://huggingface.co/docs/huggingface_hub/authentication\nInvalid username or password.\n")
            return None
        return spec

    async def _hf_download_local(self, repo: str, io: IO, only: tuple[str, ...], local: str) -> int:
        """``--local-dir DIR``: the files themselves in DIR (no blobs, no snapshot links; huggingface_hub
        keeps its metadata under ``DIR/.cache/huggingface``), and DIR printed at the end."""
        spec = await self._hf_repo(repo, io)
        if spec is None:
            return 1
        fs = self.fs
        await self.clock.sleep(0.6)
        files = [f for f in repo_files(spec) if not only or f.path in only]
        fs.mkdir(f"{local.rstrip('/')}/.cache/huggingface/download", parents=True)
        for f in files:
            await self.clock.sleep(f.size / self.cluster.internet_bps)
            if f.path == "config.json":  # the one file a reader opens here: its architecture, as the Hub's says
                fs.write_text(f"{local.rstrip('/')}/{f.path}", json.dumps(
                    {"architectures": [spec.architecture], "_name_or_path": repo}, indent=2) + "\n")
            else:
                fs.put_blob(f"{local.rstrip('/')}/{f.path}", f.size, f.sha256)
        io.out(f"{local.rstrip('/')}\n")
        return 0

    async def _hf_whoami(self, io: IO) -> int:
        token = io.env.get("HF_TOKEN")
        if not token:
            try:
                token = self.fs.read_text(self._hf_home(io) + "/token").strip()
            except FsError:
                token = None
        if not token:
            io.out("Not logged in\n")
            return 0
        if not self.node.internet:
            await self.clock.sleep(5.0)
            io.err(_hf_offline_error("whoami-v2").replace("/api/models/whoami-v2/revision/main", "/api/whoami-v2"))
            return 1
        await self.clock.sleep(0.3)
        io.out(f"\x1b[1muser: \x1b[0m {HF_USER}\n\x1b[1morgs: \x1b[0m {','.join(HF_ORGS)}\n")
        return 0

    async def _hf_download(self, repo: str, io: IO, only: tuple[str, ...] = ()) -> int:
        """``only``: the FILENAMES given. Several are ``snapshot_download(allow_patterns=…)`` in
        huggingface_hub's CLI (a name the repository lacks matches nothing and is skipped); the
        snapshot folder is printed either way."""
        spec = await self._hf_repo(repo, io)
        if spec is None:
            return 1
        fs = self.fs
        owner, name = repo.split("/", 1)
        base = f"{self._hf_home(io)}/hub/models--{owner}--{name}"
        rev = repo_revision(repo)
        await self.clock.sleep(0.6)  # the revision and file list from the Hub API
        for d in ("blobs", "refs", f"snapshots/{rev}"):
            fs.mkdir(f"{base}/{d}", parents=True)
        fs.write_text(f"{base}/refs/main", rev)
        files = repo_files(spec)
        if only:
            files = [f for f in files if f.path in only]
        todo = []
        for f in files:
            blob = fs.lookup(f"{base}/blobs/{f.sha256}", follow=False)
            if blob is None or blob.nbytes() != f.size:
                todo.append(f)
            else:
                self._hf_link(base, rev, f.path, f.sha256)
        total = len(files)
        done = total - len(todo)
        t0 = self.now()
        remaining = sum(f.size for f in todo)
        ramp = CacheRamp(self.node_name, t0, t0 + remaining / self.cluster.internet_bps, remaining, path=node_path(fs, base))
        self.cluster.cache_ramps.append(ramp)
        moved = 0
        desc = f"Fetching {total} files"

        def bar() -> str:
            el = max(0.001, self.now() - t0)
            left = (remaining - moved) / self.cluster.internet_bps
            return "\r" + vllm_logs.tqdm_bar(desc, done, total, el).replace("<00:00", "<" + vllm_logs.fmt_interval(left))

        io.err(bar())
        try:
            for f in todo:
                part = f"{base}/blobs/{f.sha256}.incomplete"
                ent = fs.put_blob(part, 0, None)  # a partial file is discarded: start this one again
                got = 0
                while got < f.size:
                    step = min(STEP_S, (f.size - got) / self.cluster.internet_bps)
                    before = self.now()
                    await self.clock.sleep(step)
                    n = min(f.size - got, int((self.now() - before) * self.cluster.internet_bps) or f.size - got)
                    got += n
                    moved += n
                    ent.size = got
                    ent.mtime = self.now()
                    if step >= STEP_S - 1e-9:
                        io.err(bar())
                fs.rename(part, f"{base}/blobs/{f.sha256}")
                ent.sha256 = f.sha256
                self._hf_link(base, rev, f.path, f.sha256)
                done += 1
                io.err(bar())
                await asyncio.sleep(0)
        finally:
            if moved < remaining:  # killed: the page cache stops growing where the bytes stopped
                ramp.t1 = max(ramp.t0 + 1e-6, self.now())
                ramp.nbytes = moved
        io.err("\n")
        io.out(f"{base}/snapshots/{rev}\n")
        return 0

    def _hf_link(self, base: str, rev: str, path: str, sha: str) -> None:
        link = f"{base}/snapshots/{rev}/{path}"
        if self.fs.lookup(link, follow=False) is None:
            self.fs.symlink(f"../../blobs/{sha}", link)
