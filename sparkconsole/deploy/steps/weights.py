"""Weights: download once where the Hub is reached, copy over the fast link beside the download, verify
sizes and hashes everywhere; a link that goes down mid-copy is the operator's decision."""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING

from sparkconsole.deploy import netenv
from sparkconsole.deploy import weights as weight_files
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.recon import INSTALL, missing_tool
from sparkconsole.deploy.runner import GoTo, StepFailed
from sparkconsole.deploy.state import Job
from sparkconsole.deploy.steps.base import Step
from sparkconsole.remote import (
    JobFiles,
    RemoteCommand,
    command,
    hf_download,
    hf_download_in_image,
    hub_tree,
    mkdir_p,
    rsync_dir,
    stream_copy,
    uvx_hf_download,
)

if TYPE_CHECKING:
    from sparkconsole.deploy.flow import Flow

LINK_WAIT_S = 900.0  # how long the weights step waits for a fast link that went down mid-copy
LINK_RETRIES = 3  # copy passes started again after the link came back


def _find_sizes(snap: str) -> RemoteCommand:
    return command("find", "-L", snap, "-type", "f", "-printf", "%s %P\\n")


def _find_broken(snap: str) -> RemoteCommand:
    return command("find", snap, "-xtype", "l")


class Weights(Step):
    id, title = "weights", "Weights: download once, copy over the fast link, verify everywhere"
    decisions = ("weights.link",)

    async def _hub_files(self) -> list[weight_files.HubFile]:
        cached = self.flow.plan.hub_files
        if cached:
            return list(cached)
        src = next((n for n, x in self.flow.facts.items() if x.hub), None)
        if src is None:
            return []
        res = await self.runner.read(src, hub_tree(self.flow.options.model), timeout=60)
        files = weight_files.parse_tree(res.stdout)
        self.flow.update(hub_files=list(files))
        return files

    async def _verify_node(self, node: str, hub: list[weight_files.HubFile], hashes: bool = False) -> weight_files.Verdict:
        snap_root = f"{self.flow.model_dir(node)}/snapshots"
        sizes = await self.runner.read(node, _find_sizes(snap_root), timeout=120)
        broken = await self.runner.read(node, _find_broken(snap_root), timeout=120)
        listing = {re.sub(r"^[0-9a-f]{40}/", "", p): s for p, s in weight_files.parse_sizes(sizes.stdout).items()}
        bad_links = [re.sub(r"^.*/snapshots/[0-9a-f]{40}/", "", b) for b in broken.stdout.split("\n") if b.strip()]
        sums = None
        if hashes:
            # a file whose sha256 matched before (hashed as it landed, or by an earlier verify) and
            # whose size is still right is not read again (deploy-failures.md §3)
            known = {p: h for p, h in ((self.flow.plan.weights_hashed or {}).get(node) or {}).items()
                     if any(f.path == p and f.size == listing.get(p) for f in hub)}
            files = [f.path for f in hub if f.sha256 and listing.get(f.path) == f.size and f.path not in known]
            rev_dir = next((p.split("/")[0] for p in weight_files.parse_sizes(sizes.stdout) if "/" in p), "")
            sums = dict(known)
            if files and rev_dir:
                paths = [f"{snap_root}/{rev_dir}/{p}" for p in files]
                res = await self.runner.read(node, command("sha256sum", *paths), timeout=3600)
                sums.update({k.split(f"/{rev_dir}/", 1)[-1]: v for k, v in weight_files.parse_sha256sum(res.stdout).items()})
                good = {f.path: f.sha256 for f in hub if f.sha256 and sums.get(f.path) == f.sha256}
                if good.keys() - known.keys():
                    hashed = dict(self.flow.plan.weights_hashed or {})
                    hashed[node] = {**known, **good}
                    self.flow.update(weights_hashed=hashed)
        return weight_files.compare(node, hub, listing, bad_links, sums)

    async def probe(self) -> str | None:
        hub = await self._hub_files()
        if not hub:
            return None
        verdicts = await self.runner.on_all(self.flow.nodes, lambda n: self._verify_node(n, hub))
        self._verdicts = {v.node: v for v in verdicts}  # send decides from these: its rehearsal reads nothing
        if all(v.complete for v in verdicts):
            return "already on every node: " + "; ".join(f"{v.node} {v.summary()}" for v in verdicts)
        return None

    def _source(self) -> str | None:
        done = self.flow.plan.weights_ok or {}
        for n in self.flow.nodes:
            if done.get(n):
                return n
        return next((n for n in self.flow.nodes if self.flow.fact(n).hub), None)

    def _download_cmd(self, src: str) -> RemoteCommand:
        """``hf download`` where the tool is on ``src``: the host's ``hf``, else ``uvx hf``, else the
        engine image's own ``hf`` (a stock Spark has neither on the host: NVIDIA's playbooks run the
        download in the vLLM container); none of them: stop with how to get one."""
        flow, f = self.flow, self.flow.fact(src)
        if f.tools.get("hf") is not False:  # present, or not read (an older recon): the host's
            return hf_download(flow.options.model)
        if f.tools.get("uvx"):
            return uvx_hf_download(flow.options.model)
        check = (flow.plan.engine_checks or {}).get(flow.image) or {}
        # plan-only: the engine step's pull was planned, not sent, so the image is not there yet
        here = f.image(flow.image) is not None or self.runner.plan_only
        if here and (check.get("clis") or {}).get("hf"):
            owner = (f.uid, f.gid) if f.uid is not None and f.gid is not None and f.uid != 0 else None
            return hf_download_in_image(flow.image, flow.options.model, f.hf_dir, owner,
                                        flow.container("download"))
        raise StepFailed(f"{src}: no `hf` to download with: not on the host, no uvx, and {flow.image or 'the image'} "
                         f"{'has none' if check else 'is not on this node'}", f"on {src}: {INSTALL['hf']}; then --resume")

    def _copy_cmd(self, src: str, n: str, streamed: bool) -> RemoteCommand:
        """The copy to ``n``: beside a running download, each file as soon as it is whole (then a
        final pass); else one rsync."""
        flow = self.flow
        rsync = rsync_dir(flow.model_dir(src), flow.user_at(n), flow.model_dir(n), port=weight_files.peer_port(flow, n))
        if not streamed:
            return rsync
        return stream_copy(rsync, JobFiles.under(flow.job_dir(src), "weights-download"))

    async def send(self) -> None:
        """The download where the weights are not whole yet, and a copy to every worker that lacks
        them, started beside the download (each file goes as soon as it is whole)."""
        flow = self.flow
        hub = await self._hub_files()
        if not hub:
            raise StepFailed("no node reaches the Hub, so the model's file list cannot be read",
                             "connect one node to the internet, or copy the weights by hand and --resume")
        src = self._source()
        if src is None:
            raise StepFailed("no node holds the weights and none reaches the Hub",
                             "copy the model to one node's HF cache, then --resume")
        # rsync runs on both ends of each copy: a missing one is said before anything starts, not met as "exit 127"
        for n in flow.nodes:
            for end in ((src, n) if n != src else ()):
                if missing_tool(flow.fact(end), "rsync"):
                    raise StepFailed(f"{end}: rsync is not installed (the copy to {n} runs it on both ends)",
                                     f"on {end}: {INSTALL['rsync']}; then --resume")
        v = self._verdicts.get(src) or await self._verify_node(src, hub)
        self._download: Job | None = None
        self._downloaded = 1.0
        if not v.complete:
            self._downloaded = 0.0
            # the login user makes the cache's folders: a download in the image mounts HF_HOME
            # (``-v DIR:/hf``), and docker would make a missing DIR as root, which the user's
            # download then cannot write (recon reads the disk without making anything)
            await self.runner.change(src, mkdir_p(flow.model_dir(src)), key=f"mkdir weights {src}")
            self._download = await self.runner.start_job(src, "weights-download", self._download_cmd(src),
                                                         flow.job_dir(src))
        # the copies start now, beside the download: each file goes to the workers as soon as it is
        # whole, so the copy ends a pass after the download instead of a whole copy after it
        self._copies: dict[str, Job] = {}
        for n in flow.nodes:
            if n == src or (self._verdicts.get(n) or await self._verify_node(n, hub)).complete:
                continue
            await self.runner.change(n, mkdir_p(flow.model_dir(n)), key=f"mkdir weights {n}")
            self._copies[n] = await self.runner.start_job(src, f"weights-copy-{n}",
                                                     self._copy_cmd(src, n, self._download is not None),
                                                     flow.job_dir(src))

    async def watch(self) -> None:
        """The download and the copies to their end; files hashed on the workers as they land; a
        fast link that goes down meanwhile is the operator's decision (wait, or back to network)."""
        flow = self.flow
        hub = await self._hub_files()
        src = self._source()
        assert src is not None  # send found one
        download, copies = self._download, self._copies
        ok = dict(flow.plan.weights_ok or {})
        self._link_lock, self._link_back = asyncio.Lock(), set()
        copying = {n: asyncio.ensure_future(self.runner.wait_job(job, lambda text, n=n: self._copy_progress(n, text)))
                   for n, job in copies.items()}
        self._copy_errors = {}
        hashing = asyncio.ensure_future(self._hash_as_they_land(hub, set(copies), copying))
        downloading = None
        try:
            if download is not None:
                downloading = asyncio.ensure_future(
                    self.runner.wait_job(download, lambda text: self._download_progress(src, text)))
                await asyncio.wait({downloading, hashing}, return_when=asyncio.FIRST_COMPLETED)
                if hashing.done() and hashing.exception() is not None:
                    raise hashing.exception()  # type: ignore[misc]  # the fast link went down: back to network
                rc = await downloading
                self._downloaded = 1.0
                if rc != 0:
                    raise StepFailed(f"{src}: hf download ended with exit {rc}",
                                     "read the job's log; a re-run (--resume) keeps the finished files")
                v = await self._verify_node(src, hub)
                if not v.complete:
                    raise StepFailed(f"{src}: the download is incomplete: {v.summary()}",
                                     "--resume downloads the rest")
            ok[src] = True
            flow.update(weights_ok=ok)
            for n in copying:
                rc = await copying[n]
                for _again in range(LINK_RETRIES):
                    if rc == 0 or not await self._link_check(n, ended=True):
                        break
                    # the link was down and is back: the copy starts again where it stopped (--partial)
                    job = await self.runner.start_job(src, f"weights-copy-{n}", self._copy_cmd(src, n, False),
                                                 flow.job_dir(src))
                    copying[n] = asyncio.ensure_future(
                        self.runner.wait_job(job, lambda text, n=n: self._copy_progress(n, text)))
                    rc = await copying[n]
                if rc != 0:
                    raise StepFailed(f"copy to {n} ended with exit {rc}", "--resume continues it (--partial)")
            await hashing
        finally:
            tasks = [*copying.values(), hashing, *([downloading] if downloading is not None else [])]
            for task in tasks:
                task.cancel()  # a failure above: what runs on the nodes goes on (--resume re-attaches)
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _link_check(self, n: str, ended: bool = False) -> bool:
        """A copy to ``n`` failed (``ended``: the job itself; else one of its passes): read the nodes
        again. With the fast link fine, False (the failure was something else), unless the link
        went down and came back while the job ran (then an ended copy is started again: True).
        When it is down the operator decides: wait for it (the download goes on; the copy resumes
        where it stopped once the port is Up: True), or stop, which sends the flow back to the
        network step, where the fix is said. One check at a time: the hashing loop and the end of
        a copy can see the same outage."""
        async with self._link_lock:
            problems = await self._link_problems()
            if problems:
                await self._offer_to_wait(n, problems[0])  # returns once the link is back (adds n)
            if ended and n in self._link_back:
                self._link_back.discard(n)
                return True
            return bool(problems)

    async def _offer_to_wait(self, n: str, p: netenv.Problem) -> None:
        """The decision ``weights.link``: wait for the link (then the copy to ``n`` goes on), or stop
        (back to the network step, which says the fix)."""
        what = f"{(p.node + ': ') if p.node else ''}{p.what}"
        self.runner.note(f"the copy to {n} failed: {what}", "error", node=n)
        src = self._source() or self.flow.head
        measured = [what, f"copy to {n}: stopped (the cut file stays: rsync --partial)"]
        if self._downloaded < 1.0:
            measured.append(f"download on {src}: {self._downloaded:.0%}, going on (it does not use the fast link)")
        d = Decision("weights.link", self.id, "The fast link went down during the copy", tuple(measured),
                     (Option("wait", "wait for the link, then go on",
                             f"{p.fix}; the copy resumes where it stopped once the port is Up again"),
                      Option("stop", "stop here", "fix the link by hand; --resume copies the rest")),
                     "wait", "only the copy needs the fast link: a reseated cable costs minutes, a restart none of "
                     "the bytes already sent")
        answer = await self.runner.decide(d)
        self.runner.forget(d.id)  # asked again if the link goes down once more
        if answer == "stop":
            raise GoTo("network", f"the fast link changed during the copy to {n}: {p.what}")
        await self._wait_for_link(n, p.what)
        self._link_back.add(n)

    async def _link_problems(self) -> list[netenv.Problem]:
        facts = await self.flow.recon(self.flow.nodes)
        return [p for p in netenv.check_links([facts[x] for x in self.flow.nodes if x in facts]) if p.kind != "mtu"]

    async def _wait_for_link(self, n: str, what: str) -> None:
        """Read the links every few polls until the fast link is back; past ``LINK_WAIT_S`` the
        flow goes back to the network step (which stops with the fix)."""
        speed = self.runner.settings.speed
        started = time.monotonic()
        self.runner.note(f"waiting for the fast link ({what}); the download goes on", "warning", node=n)
        while True:
            if self.runner.cancelled:
                raise StepFailed("stopped by the operator while waiting for the fast link",
                                 "--resume checks the link and copies the rest")
            await asyncio.sleep(max(self.runner.settings.poll_s * 5, 0.05))
            waited = (time.monotonic() - started) * speed
            if not await self._link_problems():
                self.runner.note(f"the fast link is back after {waited:.0f} s: the copy to {n} goes on", node=n)
                return
            if waited > LINK_WAIT_S:
                raise GoTo("network", f"the fast link stayed down {waited:.0f} s during the copy to {n}: {what}")

    async def _hash_as_they_land(self, hub: list[weight_files.HubFile], nodes: set[str],
                                 copying: dict[str, asyncio.Future[int]]) -> None:
        """Read-only, while the copies run: hash on each worker the files that arrived whole, so
        the final verify only reads the last ones (about a shard instead of the whole model); a
        copy pass that could not reach its worker has the links read again (:meth:`_link_check`)."""
        while any(not t.done() for t in copying.values()):
            await asyncio.wait(list(copying.values()), timeout=max(self.runner.settings.poll_s, 0.05) * 5)
            for n in nodes:
                if copying[n].done():
                    continue
                if self._copy_errors.pop(n, None):
                    await self._link_check(n)
                await self._verify_node(n, hub, hashes=True)

    def _download_progress(self, node: str, text: str) -> None:
        last = re.split(r"[\r\n]", text.strip())[-1] if text.strip() else ""
        m = re.search(r"(\d+)%\|.*?\|\s*(\d+)/(\d+)", last)
        if m:
            self._downloaded = int(m.group(1)) / 100
            self.runner.progress(node, "download", self._downloaded, last.strip()[-120:])

    _downloaded = 1.0  # while a download runs: its fraction (a copy beside it cannot be further)

    def __init__(self, flow: Flow) -> None:
        super().__init__(flow)
        self._copy_errors: dict[str, str] = {}  # a copy pass that failed, by worker: the link is read again
        self._download: Job | None = None
        self._copies: dict[str, Job] = {}
        self._verdicts: dict[str, weight_files.Verdict] = {}  # what the probe read per node

    @property
    def verdicts(self) -> dict[str, weight_files.Verdict]:
        """What the probe read per node (a rehearsal's twin puts the weights where they are whole)."""
        return dict(self._verdicts)

    def _copy_progress(self, node: str, text: str) -> None:
        last = text.strip().splitlines()[-3:]
        if any("rsync error" in x or "ssh: connect to host" in x for x in last):
            self._copy_errors[node] = last[-1]  # a pass failed: the link is read again
        for part in reversed(re.split(r"[\r\n]", text.strip())):
            m = re.match(r"\s*([\d,]+)\s+(\d+)%\s+(\S+)\s+(\S+)", part)
            if m:
                # a pass beside the download is at 100% of what was downloaded when it started
                self.runner.progress(node, "copy", int(m.group(2)) / 100 * self._downloaded, part.strip())
                return

    async def verify(self) -> None:
        hub = await self._hub_files()
        verdicts = await self.runner.on_all(self.flow.nodes, lambda n: self._verify_node(n, hub, hashes=n != self._source()))
        bad = [v for v in verdicts if not v.complete]
        for v in verdicts:
            self.runner.note(f"weights: {v.summary()}", "info" if v.complete else "error", node=v.node)
        if bad:
            raise StepFailed(f"{bad[0].node}: weights incomplete: {bad[0].summary()}",
                             "--resume copies what is missing (rsync -L --partial)")
        self.flow.update(weights_ok={v.node: True for v in verdicts})
