"""Plan: the memory plan over the nodes, with vLLM's own arithmetic; the layout is the operator's decision."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from sparkconsole.deploy import engines, freeing
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.deployment_plan import Layout
from sparkconsole.deploy.flow import GIB
from sparkconsole.deploy.recon import NodeFacts, normalize_image
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.steps.base import Step
from sparkconsole.planner.budget import DEFAULT_GMU, DEFAULT_NODE_MEMORY_GIB, field_gmu
from sparkconsole.planner.live import LiveMemory, NodeMemory
from sparkconsole.planner.plan import PlanOptions, compare_tp, layout_row
from sparkconsole.serving.engines import VLLM

if TYPE_CHECKING:
    from sparkconsole.deploy.flow import Flow

LAUNCH_MARGIN = 1 * GIB  # free memory kept above vLLM's start-up check


def _cuda_total(f: NodeFacts) -> float:
    """What vLLM's start-up check calls the device's total (free >= gmu x total): on a GB10 the
    121.69 GiB CUDA reports, else MemTotal. The launch's free-memory need is counted on it."""
    if f.gpu and "GB10" in f.gpu:
        return DEFAULT_NODE_MEMORY_GIB * GIB
    return float(f.mem_total or DEFAULT_NODE_MEMORY_GIB * GIB)


def live_memory(facts: dict[str, NodeFacts]) -> LiveMemory:
    """The nodes' memory as `sparkconsole plan --config/--demo` reads it (each node's MemTotal), so
    the wizard's plan and the planner's give the same KV and concurrency for the same cluster."""
    return LiveMemory(tuple(NodeMemory(n, total_gib=f.mem_total / GIB) if f.mem_total else
                            NodeMemory(n, error="MemTotal was not read") for n, f in facts.items()))


def plan_memory_gib(facts: dict[str, NodeFacts]) -> float:
    """The node memory the plan uses: the smallest live MemTotal (vLLM admits on its smallest rank);
    the contract default only for a node whose MemTotal was not read."""
    return live_memory(facts).effective_gib


class Plan(Step):
    id, title = "plan", "Plan memory: one node or several"
    decisions = ("plan.layout", "plan.text-only")

    @staticmethod
    def vllm_version(flow: Flow) -> str | None:
        """The vLLM whose rules the plan uses: the image's, once the engine step has read it (a
        re-plan after a failed start), else the version of the image asked for (--image, by its tag
        or the known images, :func:`engines.version_from_ref`), else None: the planner assumes the
        newest it knows and says the image's own is unknown until the engine step reads it."""
        if flow.plan.vllm_version:
            return str(flow.plan.vllm_version)
        img = flow.options.image
        if not img:
            return None
        known = next((k.version for k in engines.KNOWN_IMAGES
                      if k.engine is VLLM and normalize_image(k.ref) == normalize_image(img)), None)
        return known or engines.version_from_ref(img)

    async def _text_only(self, base: PlanOptions, tp: int, pp: int, kv: str) -> bool:
        """``plan.text-only``: serve text only (``--language-model-only``, vLLM's own Qwen3.5 recipe for
        text use), with what it frees counted by the planner, when the model has a vision tower.
        A recipe (or the engine's flags) that already says ``--language-model-only`` answers it."""
        flow = self.flow
        if flow.spec.geometry.vision is None or flow.engine_kind is not VLLM:
            flow.update(language_model_only=False)
            return False
        if "--language-model-only" in flow.extra_args:
            flow.update(language_model_only=True)
            return True
        with_vision, text = (layout_row(flow.spec, dataclasses.replace(base, kv_cache_dtype=kv,
                                                                       language_model_only=lmo), tp, pp)
                             for lmo in (False, True))
        if with_vision.get("error") or text.get("error"):
            flow.update(language_model_only=False)
            return False
        freed = with_vision["weights_gib_per_node"] - text["weights_gib_per_node"]
        more = text["max_concurrency"] - with_vision["max_concurrency"]
        measured = (f"the vision tower: {freed:.1f} GiB of weights per node at TP={tp}",
                    f"with it: {with_vision['kv_cache_gib_per_node']:.1f} GiB KV, {with_vision['max_concurrency']:.1f}x "
                    f"concurrency; text only: {text['kv_cache_gib_per_node']:.1f} GiB KV, "
                    f"{text['max_concurrency']:.1f}x (+{more:.1f})")
        rec = "vision" if with_vision["fits"] else "text"
        d = Decision("plan.text-only", self.id, "Images too, or text only?", measured, (
            Option("vision", "keep the vision tower", "the model takes images as well as text, as its checkpoint serves"),
            Option("text", "text only (--language-model-only)",
                   f"the vision tower is not loaded: {freed:.1f} GiB per node go to the KV cache (vLLM's own recipe "
                   "for text use); requests with images are refused"),
        ), rec, "images stay possible and the layout fits with them" if rec == "vision" else
           "only text fits: the vision tower's memory is needed for the KV cache")
        text_only = await self.runner.decide(d) == "text"
        flow.update(language_model_only=text_only)
        return text_only

    @staticmethod
    def options(flow: Flow, vllm_version: str | None) -> PlanOptions:
        """The chosen plan's options, as the plan step stored them (for a re-plan by version)."""
        node_gib = plan_memory_gib(flow.facts)
        return PlanOptions(node_memory_gib=node_gib, max_model_len=flow.plan.max_model_len,
                           gpu_memory_utilization=float(flow.plan.gmu or DEFAULT_GMU),
                           kv_cache_dtype=flow.plan.kv_cache_dtype or "auto", vllm_version=vllm_version, force=True,
                           language_model_only=bool(flow.plan.language_model_only))

    async def decide(self) -> None:
        flow = self.flow
        unread = [n for n in flow.nodes if n not in flow.facts or not flow.facts[n].reachable]
        if unread:  # recon read it twice (Flow.recon)  # a plan on a node's missing figures would be a plan on zeros
            raise StepFailed(f"{', '.join(unread)} did not answer: its memory is unknown, so no plan can be made",
                             "check the node answers over SSH, then --resume")
        facts = flow.facts
        n_nodes = len(self.runner.nodes)
        node_gib = plan_memory_gib(facts)
        for said in live_memory(facts).notes():
            self.runner.note(f"plan: {said}")
        # gmu as memory will be once free-memory has run: at most what stopping every running service
        # frees on the tightest node (vLLM checks free >= gmu x total at start), at most what the field
        # runs at this context length (budget.FIELD_GMU: 0.70 at 262,144 tokens, 0.85 at 65,536)
        best = min((x.mem_available or 0) + sum(freeing.service_bytes(x).values()) for x in facts.values())
        cuda_total = min(_cuda_total(x) for x in facts.values())  # what vLLM's start-up check multiplies
        room = math.floor(100 * (best - LAUNCH_MARGIN) / cuda_total) / 100
        mml_ask = flow.plan.max_model_len_override or flow.options.max_model_len

        def gmu_at(mml: int | None) -> float:
            return float(flow.plan.gmu_override or min(field_gmu(mml)[0], max(0.5, room)))

        gmu = gmu_at(mml_ask or flow.spec.geometry.max_position)
        field, field_source = field_gmu(mml_ask or flow.spec.geometry.max_position)
        if gmu < field and not flow.plan.gmu_override:
            self.runner.note(f"--gpu-memory-utilization {gmu}: even with every service stopped the tightest node has "
                        f"{best / GIB:.1f} GiB free")
        elif not flow.plan.gmu_override and field < DEFAULT_GMU:
            self.runner.note(f"plan: --gpu-memory-utilization {gmu:g} at this context length, as the field runs it "
                             f"({field_source}); a full-length prompt's prefill needs the rest of the node")
        from sparkconsole.planner.overheads import rules_for

        version = self.vllm_version(flow)
        base = PlanOptions(node_memory_gib=node_gib, max_model_len=mml_ask, gpu_memory_utilization=gmu,
                           vllm_version=version)
        self.runner.note(f"plan: {rules_for(version).note}"
                    + ("" if version else "; the image's own vLLM is unknown until the engine step reads it "
                                          "and re-plans"))
        tps = (1, flow.options.tp) if flow.options.tp and flow.options.tp > 1 else (1, *[t for t in (2, 4, 8, 16, 32) if t <= n_nodes])
        layouts = [(t, 1) for t in dict.fromkeys(tps)]
        if n_nodes > 2 and layout_row(flow.spec, base, n_nodes).get("error"):
            layouts.append((1, n_nodes))  # TP cannot divide the model over every node: pipeline stages can
        table = {(t, p): layout_row(flow.spec, base, t, p) for t, p in layouts}
        rows = {t: r for (t, p), r in table.items() if p == 1}
        multi = [t for t in rows if t > 1 and not rows[t].get("error")]
        tp_n = min((t for t in multi if rows[t]["fits"]), default=max(multi, default=1))
        measured = []
        for (tp, pp), row in table.items():
            name = f"TP={tp}" + (f" x PP={pp}" if pp > 1 else "")
            if row.get("error"):
                measured.append(f"{name}: {row['error']}")
                continue
            if row["kv_cache_gib_per_node"] <= 0:
                measured.append(f"{name}: {row['weights_gib_per_node']:.1f} GiB weights per node: more than the "
                                f"node's budget ({gmu} of {node_gib:.2f} GiB): does not fit")
                continue
            measured.append(f"{name}: {row['weights_gib_per_node']:.1f} GiB weights per node, "
                            f"{row['kv_cache_gib_per_node']:.1f} GiB KV, {row['max_concurrency']:.1f}x "
                            f"concurrency at {row['max_model_len']:,} tokens: "
                            f"{'fits' if row['fits'] else 'does not fit'}")
        options = []

        def offer(layout: Layout, label: str, why: str) -> None:
            options.append(Option(layout.value, label, why, payload=layout))

        for (tp, pp), row in table.items():
            if row.get("error"):
                continue
            label = ("one Spark" if tp * pp == 1 else f"TP={tp} over {tp} Sparks" if pp == 1 else
                     f"PP={pp} pipeline stages over {tp * pp} Sparks")
            why = (f"{row['weights_gib_per_node']:.1f} GiB weights per node; "
                   + ("fits" if row["fits"] else "out of memory on loading (the single-node OOM risk)"))
            offer(Layout(tp, pp), label, why)
        fp8 = compare_tp(flow.spec, dataclasses.replace(base, kv_cache_dtype="fp8"), tps=(tp_n,))[0]
        if not fp8.get("error") and tp_n > 1:
            offer(Layout(tp_n, kv_cache_dtype="fp8"), f"TP={tp_n} with fp8 KV cache",
                  f"{fp8['max_concurrency']:.1f}x concurrency (twice the tokens, slightly lower quality)")
        full = rows.get(tp_n) or {}
        if tp_n > 1 and not full.get("error") and full.get("max_model_len", 0) > 32768:
            short = max(32768, int(full["max_model_len"]) // 4)
            short_gmu = gmu_at(short)
            alt = compare_tp(flow.spec, dataclasses.replace(base, max_model_len=short, gpu_memory_utilization=short_gmu),
                             tps=(tp_n,))[0]
            if not alt.get("error"):
                offer(Layout(tp_n, max_model_len=short), f"TP={tp_n} with --max-model-len {short:,}",
                      f"{alt['max_concurrency']:.1f}x concurrency at gmu {short_gmu:g}: more requests at once, "
                      "shorter prompts")
        options.append(Option("4bit", "a 4-bit variant on one Spark",
                              "an NVFP4/INT4 build of the model fits one node (other checkpoint; this run stops)"))
        fitting = sorted((t * p, p, t) for (t, p), row in table.items() if row.get("fits"))
        cheapest = fitting[0] if fitting else None
        rec = Layout(cheapest[2], cheapest[1]).value if cheapest else "4bit"
        why = ("the cheapest layout that fits: " + (f"TP={cheapest[2]}" + (f" x PP={cheapest[1]}" if cheapest[1] > 1
                                                                         else "") if cheapest else "none fits as asked")
               + (f"; one Spark would run out of memory loading {rows[1]['weights_gib_per_node']:.0f} GiB"
                  if 1 in rows and not rows[1].get("fits") and not rows[1].get("error") else ""))
        d = Decision("plan.layout", self.id, "Single-node OOM risk: how to lay the model out",
                     tuple(measured), tuple(options), rec, why)
        layout = await self.runner.choose(d)
        if not isinstance(layout, Layout):  # the one option without a layout: another checkpoint
            raise StepFailed("a 4-bit variant was chosen: that is another checkpoint",
                             "run `sparkconsole deploy --model <the 4-bit repo> --tp 1` (e.g. an NVFP4 build)")
        tp, pp, kv = layout.tp, layout.pp, layout.kv_cache_dtype
        if layout.max_model_len:
            gmu = gmu_at(layout.max_model_len)
            base = dataclasses.replace(base, max_model_len=layout.max_model_len, gpu_memory_utilization=gmu)
        base = dataclasses.replace(base, language_model_only=await self._text_only(base, tp, pp, kv))
        chosen = layout_row(flow.spec, dataclasses.replace(base, kv_cache_dtype=kv), tp, pp)
        flow.update(tp=tp)
        flow.update(pp=pp)
        flow.update(plan_fits=bool(chosen.get("fits")))
        flow.update(plan_vllm_version=rules_for(version).version if version else None)
        flow.update(kv_cache_dtype=kv)
        mml = int(chosen["max_model_len"])
        flow.update(max_model_len=mml, max_concurrency=float(chosen["max_concurrency"]))
        # the memory each node must have free at launch
        flow.update(gmu=gmu)
        need = {n: int(gmu * _cuda_total(facts[n]) + LAUNCH_MARGIN) for n in flow.nodes}
        flow.update(need=need)
        choices = await freeing.choose_all(facts, need, flow.nodes)  # off the event loop (issue 23 item 11)
        for n, c in choices.items():
            what = ", ".join(c.stop) if c.stop else "nothing"
            self.runner.note(f"launch needs {need[n] / GIB:.1f} GiB free (vLLM's start-up check: gmu {gmu} x the "
                        f"{_cuda_total(facts[n]) / GIB:.2f} GiB it takes as total); {c.available / GIB:.1f} GiB available now; must go: {what}"
                        + ("" if c.enough else " (and still short)"), node=n)
        self.runner.note(f"plan: TP={tp}" + (f" x PP={pp}" if pp > 1 else "") + f", --max-model-len {mml:,}, --gpu-memory-utilization {gmu}, KV {kv}, "
                    f"{chosen['weights_gib_per_node']:.1f} GiB weights and {chosen['kv_cache_gib_per_node']:.1f} "
                    f"GiB KV per node, {chosen['max_concurrency']:.1f}x concurrency; {chosen.get('headline', '')}")
