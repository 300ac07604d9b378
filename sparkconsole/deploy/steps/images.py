"""Images: the engine's image on every node with the same ID (a pull, or docker save | ssh docker load)."""

from __future__ import annotations

import asyncio
import hashlib

from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.state import Job
from sparkconsole.deploy.steps.base import Step
from sparkconsole.remote import (
    docker_pull,
    image_copy,
    image_id,
)


class Images(Step):
    id, title = "images", "The image on every node, with the same ID"

    def _missing(self) -> list[str]:
        return [n for n in self.flow.nodes if self.flow.fact(n).image(self.flow.image) is None]

    async def probe(self) -> str | None:
        ids = await self._ids()
        if all(ids.get(n) for n in self.flow.nodes) and len(set(ids.values())) == 1:
            return f"{self.flow.image} is on every node ({next(iter(ids.values()))[:19]})"
        return None

    async def _ids(self) -> dict[str, str]:
        async def one(n: str) -> tuple[str, str]:
            res = await self.runner.read(n, image_id(self.flow.image), timeout=30)
            return n, res.stdout.strip() if res.ok else ""
        return dict(await self.runner.on_all(self.flow.nodes, one))

    async def send(self) -> None:
        """A pull where the node reaches the internet, else a copy from a node that has the image."""
        ids = await self._ids()
        have = [n for n, i in ids.items() if i]
        if not have:
            raise StepFailed(f"{self.flow.image} is on no node", "go back to the engine step (--resume)")
        self._copies: dict[str, Job] = {}

        async def bring(n: str) -> None:
            if ids.get(n):
                return
            if self.flow.fact(n).hub:
                res = await self.runner.change(n, docker_pull(self.flow.image), timeout=3600, key=f"pull {self.flow.image} {n}")
                if not res.ok:
                    raise StepFailed(f"{n}: docker pull failed: {res.stderr.strip()[-300:]}")
                return
            key = f"image-copy-{n}-{hashlib.sha256(self.flow.image.encode()).hexdigest()[:8]}"  # one job per image
            self._copies[n] = await self.runner.start_job(have[0], key, image_copy(self.flow.image, self.flow.user_at(n)),
                                                     self.flow.job_dir(have[0]))

        await asyncio.gather(*(bring(n) for n in self.flow.nodes))

    async def watch(self) -> None:
        async def wait(n: str, job: Job) -> None:
            self.runner.progress(n, "image", None, f"docker save | ssh {n} docker load")
            rc = await self.runner.wait_job(job)
            if rc != 0:
                raise StepFailed(f"copying {self.flow.image} to {n} ended with exit {rc}", "--resume tries again")

        await asyncio.gather(*(wait(n, job) for n, job in self._copies.items()))

    async def verify(self) -> None:
        ids = await self._ids()
        if not all(ids.values()) or len(set(ids.values())) != 1:
            desc = ", ".join(f"{n} {i[:19] or 'missing'}" for n, i in ids.items())
            raise StepFailed(f"image IDs differ or are missing: {desc}",
                             "use the same storage driver on every node (docker info) and copy again")
        self.runner.note(f"{self.flow.image}: the same ID {next(iter(ids.values()))[:19]} on every node")
