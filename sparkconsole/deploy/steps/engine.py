"""Engine: does the image's vLLM (or SGLang) know the model's architecture? Offer known-good images."""

from __future__ import annotations

from sparkconsole.deploy import engines
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.deployment_plan import ImageChoice
from sparkconsole.deploy.recon import normalize_image
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.steps.base import Step
from sparkconsole.deploy.steps.plan import Plan
from sparkconsole.planner.plan import layout_row
from sparkconsole.remote import (
    docker_pull,
    python_in_image,
)


class Engine(Step):
    id, title = "engine", "Engine: does the image know the model?"
    decisions = ("engine.image",)

    async def _check(self, node: str, image: str) -> engines.EngineFacts:
        archs = tuple(self.flow.spec.geometry.architectures) or engines.QWEN35[:1]
        # with the GPU where recon read one: only then can torch say whether its build has kernels for it
        cmd = python_in_image(image, engines.engine_program(archs), gpus=bool(self.flow.fact(node).gpu))
        res = await self.runner.read(node, cmd, timeout=180)
        ef = engines.parse_engine_output(image, res.stdout + res.stderr, res.exit_status)
        checked = dict(self.flow.plan.engine_checks or {})
        checked[image] = {"versions": ef.versions, "archs": ef.archs, "error": ef.error, "clis": ef.clis,
                          "cuda": ef.cuda, "device": ef.device, "cuda_archs": list(ef.cuda_archs)}
        self.flow.update(engine_checks=checked)
        return ef

    async def decide(self) -> None:
        flow = self.flow
        archs = tuple(flow.spec.geometry.architectures)
        arch = archs[0] if archs else "?"
        head = flow.fact(flow.head)
        present = {normalize_image(i.ref) for x in flow.facts.values() for i in x.images}
        candidates = [flow.options.image] if flow.options.image else sorted(
            (i.ref for i in head.images if "vllm" in i.ref or "sglang" in i.ref), reverse=True)
        measured, good = [], []
        for img in candidates:
            if normalize_image(img) not in present:
                measured.append(f"{img}: not on any node yet")
                continue
            ef = await self._check(flow.head if head.image(img) else self._holder(img), img)
            if ef.error:
                measured.append(f"{img}: could not run its Python ({ef.error})")
                continue
            knows = ef.knows(arch)
            gpu = ef.gpu_verdict()
            measured.append(f"{img}: vLLM {ef.vllm or '-'}, transformers {ef.versions.get('transformers') or '-'}"
                            f", SGLang {ef.versions.get('sglang') or '-'}: {arch} "
                            f"{'registered' if knows else 'NOT registered' if knows is False else 'unknown'}; "
                            + _build_words(ef))
            if knows and ef.vllm and gpu is None:  # an SGLang image is offered as the SGLang engine, below
                good.append((engines.version_tuple(ef.vllm), img))
        options = [Option(img, f"{img} (on the nodes, knows {arch})", "already here: nothing to pull",
                          payload=ImageChoice("vllm", img)) for _, img in sorted(good, reverse=True)]
        for k in engines.KNOWN_IMAGES:
            if k.engine == "vllm" and all(o.value != k.ref for o in options) and arch in k.archs:
                options.append(Option(k.ref, f"{k.ref} (vLLM {k.version}, known to work)",
                                      k.note + ("; present" if normalize_image(k.ref) in present else
                                                "; pulled on a node with internet, copied to the others"),
                                      payload=ImageChoice("vllm", k.ref)))
        sg = next((k for k in engines.KNOWN_IMAGES if k.engine == "sglang"), None)
        if sg is not None:
            options.append(Option("sglang", f"SGLang ({sg.ref})", sg.note, experimental=True,
                                  payload=ImageChoice("sglang", sg.ref)))
        rec = options[0].value
        why = (f"{options[0].value} knows {arch}" if good else
               f"no image on the nodes knows {arch}; {rec} does (pinned by its image ID after the pull)")
        d = Decision("engine.image", self.id, "Engine compatibility: which image serves the model",
                     tuple(measured), tuple(options), rec, why, free_text=True,
                     parse=lambda ref: ImageChoice("vllm", ref))  # an image the operator names
        choice: ImageChoice = await self.runner.choose(d)
        flow.update(engine=choice.engine, image=choice.ref)

    def _holder(self, image: str) -> str:
        for n, x in self.flow.facts.items():
            if x.image(image):
                return n
        return self.flow.head

    async def send(self) -> None:
        img = self.flow.image
        if not any(x.image(img) for x in self.flow.facts.values()):
            src = next((n for n, x in self.flow.facts.items() if x.hub), None)
            if src is None:
                raise StepFailed(f"{img} is on no node and no node reaches the internet",
                                 "load it on one node (`docker load < image.tar`), then --resume")
            res = await self.runner.change(src, docker_pull(img), timeout=3600, key=f"pull {img} {src}")
            if not res.ok:
                raise StepFailed(f"{src}: docker pull {img} failed: {res.stderr.strip()[-300:]}")
            await self.flow.recon([src])

    async def verify(self) -> None:
        flow = self.flow
        img = flow.image
        arch = (flow.spec.geometry.architectures or ["?"])[0]
        ef = await self._check(self._holder(img), img)
        gpu = ef.gpu_verdict()
        if ef.error or not ef.knows(arch) or gpu:
            self.runner.forget("engine.image")
            why = (f"its Python could not be run ({ef.error})" if ef.error else gpu if gpu else
                   f"its {flow.engine} ({ef.vllm or ef.versions.get('sglang') or '-'}) does not register {arch}")
            raise StepFailed(f"{img}: {why}", "choose another image: --resume and answer engine.image, or --image IMG")
        ident = next((i.id for x in flow.facts.values() for i in x.images if normalize_image(i.ref) == normalize_image(img)),
                     "")
        flow.update(image_id=ident)
        self.runner.note(f"{img}: vLLM {ef.vllm or '-'}, SGLang {ef.versions.get('sglang') or '-'}, "
                    f"{arch} registered; {_build_words(ef)}; image ID {ident[:19]}")
        if flow.engine == "vllm" and ef.has("ray") is False and flow.executor == "ray":
            self.runner.note(f"{img} has no Ray (NGC 26.05 and vLLM images from about 0.19 ship without it): the "
                             "cluster step offers vLLM's native multi-node instead", "warning")
        if ef.cuda and engines.version_tuple(ef.cuda) < (13,):
            self.runner.note(f"{img} is a CUDA {ef.cuda} build: vLLM's Blackwell recipe names the -cu130 tags "
                             "(from 0.20 the plain tag is CUDA 13)", "warning")
        if flow.engine == "vllm" and ef.vllm:
            self._replan(ef.vllm)

    def _replan(self, version: str) -> None:
        """The plan again under the image's vLLM rules (CUDA graphs in the budget from 0.19, the KV
        print from 0.20), when the plan step assumed another version; the verdict names it."""
        from sparkconsole.planner.overheads import rules_for

        flow = self.flow
        flow.update(vllm_version=version)
        if flow.plan.tp is None or rules_for(version).version == flow.plan.plan_vllm_version:
            return
        row = layout_row(flow.spec, Plan.options(flow, version), int(flow.plan.tp or 1), int(flow.plan.pp or 1))
        flow.update(plan_vllm_version=rules_for(version).version)
        if row.get("error"):
            self.runner.note(f"re-plan for the image's vLLM {version}: {row['error']}")
            return
        flow.update(plan_fits=bool(row["fits"]))
        self.runner.note(f"re-plan for the image's vLLM {version}: {row['kv_cache_gib_per_node']:.1f} GiB KV per node, "
                    f"{row['max_concurrency']:.1f}x concurrency at {row['max_model_len']:,} tokens; {row['headline']}")


def _build_words(ef: engines.EngineFacts) -> str:
    """The image's build in words: its torch's CUDA, the GPU it ran on and whether it has kernels
    for it, and whether it has Ray (NGC 26.05 has none)."""
    gpu = ef.gpu_verdict()
    parts = [f"torch CUDA {ef.cuda or '?'}"]
    if ef.device:
        parts.append(f"GPU sm_{ef.device.replace('.', '')}: " + ("NO kernels" if gpu else "kernels present"))
    else:
        parts.append("no GPU in the check")
    ray = ef.has("ray")
    if ray is not None:
        parts.append("Ray " + ((ef.versions.get("ray") or "present") if ray else "absent"))
    return ", ".join(parts)
