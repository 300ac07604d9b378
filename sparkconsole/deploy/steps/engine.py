"""Engine: does the image's vLLM (or SGLang) know the model's architecture? Offer known-good images.

The one sure answer is the image's own Python (``docker run --rm IMAGE python3 -c …``), and running
it is a change: it creates a container (and takes the GPU while it runs). So it is sent from
``send``, like every change: shown first (``--plan-only`` prints it), confirmed, journaled, and never
sent read-only or plan-only. The decision goes by what this deployment already measured and, for an
image not run yet, by what its name says (:func:`engines.expected_facts`: a known image, or the vLLM
version in its tag); ``send`` then runs the chosen image's Python and ``verify`` judges it. An image
that turns out not to serve the model sends the flow back to this step, where the decision is asked
again with the measurement in hand.
"""

from __future__ import annotations

from sparkconsole.deploy import engines
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.deployment_plan import ImageChoice
from sparkconsole.deploy.recon import normalize_image
from sparkconsole.deploy.runner import GoTo, StepFailed
from sparkconsole.deploy.steps.base import Step
from sparkconsole.deploy.steps.plan import Plan
from sparkconsole.planner.plan import layout_row
from sparkconsole.remote import (
    docker_pull,
    python_in_image,
)
from sparkconsole.serving.engines import VLLM, for_image


class Engine(Step):
    id, title = "engine", "Engine: does the image know the model?"
    decisions = ("engine.image",)

    def _archs(self) -> tuple[str, ...]:
        return tuple(self.flow.spec.geometry.architectures) or engines.QWEN35[:1]

    async def _check(self, node: str, image: str) -> engines.EngineFacts:
        """Run the image's own Python once on ``node`` and keep what it said (``engine_checks``). A
        change (:func:`python_in_image` is mutating): only ``send`` calls this, so the runner shows it,
        has it confirmed, journals it, refuses it read-only; rehearsing, nothing runs and nothing is kept."""
        # with the GPU where recon read one: only then can torch say whether its build has kernels for it
        cmd = python_in_image(image, engines.engine_program(self._archs()), gpus=bool(self.flow.fact(node).gpu))
        res = await self.runner.change(node, cmd, timeout=180)
        if self.runner.rehearsing:
            return engines.EngineFacts(image=image)
        ef = engines.parse_engine_output(image, res.stdout + res.stderr, res.exit_status)
        self._keep(ef)
        return ef

    def _keep(self, ef: engines.EngineFacts) -> None:
        checked = dict(self.flow.plan.engine_checks or {})
        checked[ef.image] = ef.to_json()
        self.flow.update(engine_checks=checked)

    def _measured(self, image: str) -> engines.EngineFacts | None:
        """What the image's own Python said earlier in this deployment (None: never run)."""
        d = (self.flow.plan.engine_checks or {}).get(image)
        return None if not d or d.get("expected") else engines.EngineFacts.from_json(image, d)

    def _facts(self, image: str) -> engines.EngineFacts:
        """The image as far as it is known without running anything: measured, else by its name."""
        return self._measured(image) or engines.expected_facts(image, self._archs())

    def _not_run_why(self) -> str | None:
        """Why this run may not run an image's Python (None: it may)."""
        if self.runner.plan_only:
            return "plan-only sends no change"
        if self.runner.read_only:
            return "read-only sends no change"
        return None

    async def decide(self) -> None:
        flow = self.flow
        archs = tuple(flow.spec.geometry.architectures)
        arch = archs[0] if archs else "?"
        head = flow.fact(flow.head)
        present = {normalize_image(i.ref) for x in flow.facts.values() for i in x.images}
        candidates = [flow.options.image] if flow.options.image else sorted(
            (i.ref for i in head.images if for_image(i.ref) is not None), reverse=True)
        measured, good = [], []
        unchecked, maybe = [], []  # not run yet; of those, vLLM images whose name does not say
        # images whose canary failed in this deployment (the canary step): offered last, never recommended
        failed = {img: str(d["canary_error"]) for img, d in (flow.plan.engine_checks or {}).items()
                  if d.get("canary_error")}
        for img in candidates:
            if img in failed:
                measured.append(f"{img}: the canary failed: {failed[img]}")
                continue
            if normalize_image(img) not in present:
                measured.append(f"{img}: not on any node yet")
                continue
            ef = self._facts(img)
            if ef.error:
                measured.append(f"{img}: could not run its Python ({ef.error})")
                continue
            knows = ef.knows(arch)
            gpu = ef.gpu_verdict()
            verdict = 'registered' if knows else 'NOT registered' if knows is False else 'unknown'
            if ef.expected:
                unchecked.append(img)
                since = engines.ARCH_SINCE_VLLM.get(arch)
                measured.append(f"{img}: vLLM {ef.vllm or '?'}, SGLang {ef.versions.get('sglang') or '-'} by its name"
                                f" (its own Python not run yet): {arch} {verdict}"
                                + (f" (vLLM registers it from {since} on)" if since and ef.vllm else ""))
            else:
                measured.append(f"{img}: vLLM {ef.vllm or '-'}, transformers {ef.versions.get('transformers') or '-'}"
                                f", SGLang {ef.versions.get('sglang') or '-'}: {arch} {verdict}; " + _build_words(ef))
            if knows and ef.vllm and gpu is None:  # an SGLang image is offered as the SGLang engine, below
                good.append((engines.version_tuple(ef.vllm), img))
            elif ef.expected and knows is None and VLLM.version_module in ef.versions:
                maybe.append(img)
        # on a GB10, an upstream build is offered after every GB10 build, with the field's warning, and
        # recommended only when nothing else knows the model (engines.UPSTREAM_ON_GB10)
        gb10 = any(engines.is_gb10(flow.fact(n).gpu) for n in flow.nodes if n in flow.facts)
        upstream = {img for _, img in good if gb10 and engines.gb10_build(img) is False and img != flow.options.image}
        good = [g for g in good if g[1] not in upstream]
        if upstream:
            self.runner.note(f"not recommended on GB10: {', '.join(sorted(upstream))}, {engines.UPSTREAM_ON_GB10}",
                             "warning")
        why_not = self._not_run_why()
        if why_not and unchecked:
            self.runner.note(f"not checked: the own Python of {', '.join(unchecked)} (its vLLM, whether it registers "
                             f"{arch}, its CUDA build, Ray, hf): running it starts a container and {why_not}; the "
                             "choice goes by the images' names", "warning")
        options = [Option(img, f"{img} (on the nodes, knows {arch})", "already here: nothing to pull"
                          + ("" if self._measured(img) else "; its own Python is run before anything is copied"),
                          payload=ImageChoice(VLLM.name, img)) for _, img in sorted(good, reverse=True)]
        # on the nodes, and its name does not say: trying it costs one run of its Python, not a pull
        options += [Option(img, f"{img} (on the nodes; {arch} unknown until its Python runs)",
                           "its own Python is run before anything is copied; if it does not register "
                           f"{arch}, this step asks again", payload=ImageChoice(VLLM.name, img)) for img in maybe]
        asked = flow.options.image
        if asked and all(o.value != asked for o in options) and normalize_image(asked) not in present:
            # named by the operator (--image) or the recipe: first, pulled like any other
            by = f"recipe {flow.options.recipe}" if flow.options.recipe else "--image"
            options.append(Option(asked, f"{asked} (named by {by})",
                                  "pulled on a node with internet, copied to the others; its own Python is run "
                                  "before anything else is copied", payload=ImageChoice(flow.engine, asked)))
        # the known images, GB10 builds first on a GB10 (then newest first, as listed)
        known = sorted(engines.KNOWN_IMAGES, key=lambda k: gb10 and engines.gb10_build(k.ref) is False)
        for k in known:
            if k.engine is VLLM and all(o.value != k.ref for o in options) and arch in k.archs and k.ref not in failed:
                warn = f"; {engines.UPSTREAM_ON_GB10}" if gb10 and engines.gb10_build(k.ref) is False else ""
                options.append(Option(k.ref, f"{k.ref} (vLLM {k.version}, known to work)",
                                      k.note + ("; present" if normalize_image(k.ref) in present else
                                                "; pulled on a node with internet, copied to the others") + warn,
                                      payload=ImageChoice(VLLM.name, k.ref)))
        for img in sorted(upstream):  # present, knows the model, but no GB10 kernels: last, said why
            options.append(Option(img, f"{img} (on the nodes; upstream build)", engines.UPSTREAM_ON_GB10,
                                  payload=ImageChoice(VLLM.name, img)))
        for img, line in sorted(failed.items()):  # proven not to serve the model here: last, with the engine's words
            if all(o.value != img for o in options):
                options.append(Option(img, f"{img} (its canary failed)", f"the canary said: {line}",
                                      payload=ImageChoice(VLLM.name, img)))
        for other in (k for k in engines.KNOWN_IMAGES if k.engine is not VLLM):  # another engine, experimental
            if all(o.value != other.engine.name for o in options):
                options.append(Option(other.engine.name, f"{other.engine.label} ({other.ref})", other.note,
                                      experimental=True, payload=ImageChoice(other.engine.name, other.ref)))
        rec = options[0].value
        why = (f"{options[0].value} knows {arch}" if good else
               f"{rec} is a GB10 build that knows {arch} (pinned by its image ID after the pull); the upstream "
               f"image on the nodes is {engines.UPSTREAM_ON_GB10}" if upstream and rec not in upstream else
               f"{rec} is the image {'the recipe' if flow.options.recipe else '--image'} names" if rec == asked else
               f"{rec} is on the nodes and may know {arch} (its name does not say): its own Python is run first, "
               "and this step asks again if it does not" if maybe else
               f"no image on the nodes knows {arch}; {rec} does (pinned by its image ID after the pull)")
        d = Decision("engine.image", self.id, "Engine compatibility: which image serves the model",
                     tuple(measured), tuple(options), rec, why, free_text=True,
                     parse=lambda ref: ImageChoice(VLLM.name, ref))  # an image the operator names
        choice: ImageChoice = await self.runner.choose(d)
        flow.update(engine=choice.engine, image=choice.ref)
        # chosen with its own Python's verdict in hand: a failed check then stops instead of asking again
        self._chosen_measured = self._measured(choice.ref) is not None
        if not self._chosen_measured:
            # what the later steps read (Ray, hf) until send runs the image, or for good read-only / plan-only
            self._keep(engines.expected_facts(choice.ref, self._archs()))

    def _holder(self, image: str) -> str:
        for n, x in self.flow.facts.items():
            if x.image(image):
                return n
        return self.flow.head

    async def send(self) -> None:
        """Pull the image where none has it, then run its own Python once (a change; skipped when this
        deployment ran it before, when the model is already served, and read-only: said as not checked)."""
        img = self.flow.image
        node = None
        if not any(x.image(img) for x in self.flow.facts.values()):
            src = next((n for n, x in self.flow.facts.items() if x.hub), None)
            if src is None:
                raise StepFailed(f"{img} is on no node and no node reaches the internet",
                                 "load it on one node (`docker load < image.tar`), then --resume")
            res = await self.runner.change(src, docker_pull(img), timeout=3600, key=f"pull {img} {src}")
            if not res.ok:
                raise StepFailed(f"{src}: docker pull {img} failed: {res.stderr.strip()[-300:]}")
            await self.flow.recon([src])
            node = src  # where it was pulled (rehearsing, recon cannot see it yet)
        if self._measured(img) is not None:
            return
        if await self.flow.serving():
            # a run again over a served model: nothing will be started (the later steps see it served),
            # so the check would change a node for nothing
            self.runner.note(f"not checked: {img}'s own Python: the model is already served on port "
                             f"{self.flow.options.port}, so nothing will be started")
            return
        if self.runner.read_only:
            self.runner.note(f"not checked: {img}'s own Python (its vLLM, whether it registers the model's "
                             "architecture, its CUDA build, Ray): running it starts a container, and read-only sends "
                             "no change; the image was chosen by its name", "warning")
            return
        head = self.flow.head
        node = node or (head if self.flow.fact(head).image(img) else self._holder(img))
        await self._check(node, img)

    async def verify(self) -> None:
        flow = self.flow
        img = flow.image
        arch = (flow.spec.geometry.architectures or ["?"])[0]
        ident = next((i.id for x in flow.facts.values() for i in x.images if normalize_image(i.ref) == normalize_image(img)),
                     "")
        flow.update(image_id=ident)
        ef = self._measured(img)
        if ef is None:  # not run (read-only, already served): send said so; the choice stands by the name
            return
        gpu = ef.gpu_verdict()
        if ef.error or not ef.knows(arch) or gpu:
            self.runner.forget("engine.image")
            why = (f"its Python could not be run ({ef.error})" if ef.error else gpu if gpu else
                   f"its {flow.engine} ({ef.vllm or ef.versions.get('sglang') or '-'}) does not register {arch}")
            if getattr(self, "_chosen_measured", True):
                raise StepFailed(f"{img}: {why}",
                                 "choose another image: --resume and answer engine.image, or --image IMG")
            # chosen by its name: ask again, now with what its own Python said
            raise GoTo("engine", f"{img}: {why}")
        self.runner.note(f"{img}: vLLM {ef.vllm or '-'}, SGLang {ef.versions.get('sglang') or '-'}, "
                    f"{arch} registered; {_build_words(ef)}; image ID {ident[:19]}")
        if ef.has("ray") is False and flow.executor == "ray":
            self.runner.note(f"{img} has no Ray (NGC 26.05 and vLLM images from about 0.19 ship without it): the "
                             "cluster step offers vLLM's native multi-node instead", "warning")
        if ef.cuda and engines.version_tuple(ef.cuda) < (13,):
            self.runner.note(f"{img} is a CUDA {ef.cuda} build: vLLM's Blackwell recipe names the -cu130 tags "
                             "(from 0.20 the plain tag is CUDA 13)", "warning")
        if flow.engine_kind is VLLM and ef.vllm:  # the planner is vLLM's own arithmetic
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
