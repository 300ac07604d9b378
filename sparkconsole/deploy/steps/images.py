"""Images: the engine's image on every node with the same layers (a pull, or docker save | ssh docker load).

Layers, not IDs: under Docker's containerd image store (Docker 29's default on new installs) an image's
ID can change across ``docker save | docker load`` when one platform is exported (moby#48401, #47674,
docker/cli#6670), while ``.RootFS.Layers`` (the uncompressed layer digests) stay what they were."""

from __future__ import annotations

import asyncio
import hashlib

from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.state import Job
from sparkconsole.deploy.steps.base import Step
from sparkconsole.deploy.weights import peer_port
from sparkconsole.remote import (
    docker_pull,
    image_copy,
    image_layers,
)


class Images(Step):
    id, title = "images", "The image on every node, with the same layers"
    _layers: dict[str, str] = {}  # node -> its layers as `docker image inspect` printed them ("" absent)

    def _missing(self) -> list[str]:
        return [n for n in self.flow.nodes if self.flow.fact(n).image(self.flow.image) is None]

    async def probe(self) -> str | None:
        self._layers = await self._read_layers()
        ids = self._layers
        if all(ids.get(n) for n in self.flow.nodes) and len(set(ids.values())) == 1:
            return f"{self.flow.image} is on every node (the same {_count(ids)} layers)"
        return None

    async def _read_layers(self) -> dict[str, str]:
        async def one(n: str) -> tuple[str, str]:
            res = await self.runner.read(n, image_layers(self.flow.image), timeout=30)
            text = res.stdout.strip()
            return n, text if res.ok and text.startswith("[") else ""
        return dict(await self.runner.on_all(self.flow.nodes, one))

    async def send(self) -> None:
        """A pull where the node reaches the internet, else a copy from a node that has the image
        (what the probe read decides: the rehearsal and the send read nothing twice)."""
        ids = self._layers or await self._read_layers()
        have = [n for n, i in ids.items() if i]
        if not have and self.runner.plan_only:
            # plan-only: the engine step's pull (on the first node with internet) was planned, not sent
            src = next((n for n in self.flow.nodes if self.flow.fact(n).hub), None)
            if src is not None:
                ids, have = {**ids, src: "planned"}, [src]
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
            copy = image_copy(self.flow.image, self.flow.user_at(n), port=peer_port(self.flow, n))
            self._copies[n] = await self.runner.start_job(have[0], key, copy, self.flow.job_dir(have[0]))

        await asyncio.gather(*(bring(n) for n in self.flow.nodes))

    async def watch(self) -> None:
        async def wait(n: str, job: Job) -> None:
            self.runner.progress(n, "image", None, f"docker save | ssh {n} docker load")
            rc = await self.runner.wait_job(job)
            if rc != 0:
                raise StepFailed(f"copying {self.flow.image} to {n} ended with exit {rc}", "--resume tries again")

        await asyncio.gather(*(wait(n, job) for n, job in self._copies.items()))

    async def verify(self) -> None:
        ids = await self._read_layers()
        if not all(ids.values()) or len(set(ids.values())) != 1:
            desc = ", ".join(f"{n} {_count({n: i}) if i else 'missing'}" for n, i in ids.items())
            raise StepFailed(f"the image's layers differ or are missing: {desc}",
                             "copy it again (--resume); if it still differs, pull it on each node")
        stores = {self.flow.fact(n).image_store for n in self.flow.nodes if n in self.flow.facts}
        self.runner.note(f"{self.flow.image}: the same {_count(ids)} layers on every node"
                         + (" (image IDs may differ: containerd image store)" if "containerd" in stores else ""))


def _count(layers: dict[str, str]) -> str:
    """How many layers the one listing in ``layers`` names (its digests, not the text)."""
    text = next(iter(layers.values()), "")
    return str(text.count("sha256:"))
