"""Canary: prove the chosen image on the GPU with a miniature of the model, before the weights move.

An image that cannot serve the model fails only at serve time, after 119 GB have moved: a flag its
vLLM does not know (argparse, exit 2), a ``config.json`` or tokenizer its transformers cannot load
(NGC 26.03.post1 rejected ``model_type qwen3_5``), kernels its build lacks (the block-FP8 CUTLASS GEMM
of an upstream build returns ``Error Internal`` on GB10's sm_121: vllm#40758, vllm#43367), a tool
parser or chat template that breaks on the first chat. So before the weights step this step, on one
node that has the image (the head where it can):

1. downloads the model's ``config.json``, tokenizer and generation config (kilobytes) with the
   image's own ``hf``;
2. writes a *miniature* of the model with the image's own Python
   (:mod:`sparkconsole.serving.miniature_writer`, piped on stdin): the same architecture, layer kinds,
   experts, head shapes and FP8 block quantization, two layers, random weights, about 0.4 GB;
3. serves it at TP=1 on 127.0.0.1 with the deployment's own flags (the recipe's), the same way the
   serve step will start the real model;
4. sends one chat that offers a tool (so the tool parser and the chat template run), then removes
   the container.

Each phase is a :class:`~sparkconsole.deploy.events.CanaryEvent`. A failure is the decision
``canary.failure`` carrying the engine's own error line: another image (back to the engine step,
where this image is no longer recommended), go on without the proof, or stop. Its decode rate is no
performance claim: the miniature has two tiny layers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import time

from sparkconsole.deploy import engines
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.events import CanaryEvent
from sparkconsole.deploy.runner import GoTo, StepFailed
from sparkconsole.deploy.state import Started
from sparkconsole.deploy.steps.base import Step
from sparkconsole.deploy.steps.cluster import DOCKER_OPTS
from sparkconsole.deploy.steps.serve import DockerLogFollow, Serve
from sparkconsole.logs.follow import display_text
from sparkconsole.remote import (
    docker_rm_force,
    docker_run,
    hf_download_in_image,
    http_post_json,
    python_stdin_in_image,
)
from sparkconsole.serving import miniature

# What the canary fetches from the Hub: the config and what the tokenizer and the chat template need.
# ``hf download`` fetches only the files named that exist; a file the repository lacks is skipped.
CANARY_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja", "vocab.json", "merges.txt", "special_tokens_map.json")
# the writer's own refusals of a model it has no miniature for (miniature_writer.make_miniature)
NO_FAMILY = ("unknown model_type", "is not supported (fp8 block or unquantized only)")
CANARY_PORT = 18999  # on 127.0.0.1 only, beside (never on) the deployment's own port
CANARY_MAX_LEN = 4096  # the miniature needs no long context; a small one keeps its KV cache small
# a fraction of the node's memory: vLLM's start refuses a gmu whose share of the GPU's memory is more
# than is free at its start ("Free memory on device … is less than desired GPU memory utilization"), so
# the canary takes at most CANARY_GMU and at most FREE_SHARE of what recon read available; the
# miniature (~0.4 GB of weights, ~1 GiB of activations and graphs) needs CANARY_NEED_BYTES in all
CANARY_GMU = 0.15
FREE_SHARE = 0.8
CANARY_NEED_BYTES = 4 * 2**30
CANARY_TIMEOUT_S = 900.0  # sim/real seconds for the miniature's start: CUDA graphs and torch.compile dominate
CHAT_TIMEOUT_S = 120
# one chat that offers a tool: the tool parser and the chat template both run on it
CHAT_BODY = {
    "model": "canary",
    "messages": [{"role": "user", "content": "What is the weather in Paris today?"}],
    "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "max_tokens": 16,
    "temperature": 0,
}
# flags the miniature's one-node, one-GPU start must not take from the deployment's: the layout's own
# and the distributed ones (the serve step adds them per node)
_LAYOUT_FLAGS = ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--nnodes", "--node-rank",
                 "--master-addr", "--master-port", "--headless", "--distributed-executor-backend",
                 "--data-parallel-size", "-dp")
_LAYOUT_FLAGS_NO_VALUE = ("--headless",)


def _drop_layout_flags(args: tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in _LAYOUT_FLAGS:
            skip = "=" not in a and name not in _LAYOUT_FLAGS_NO_VALUE
            continue
        out.append(a)
    return tuple(out)


class Canary(Step):
    id, title = "canary", "Canary: a miniature of the model on the chosen image, before the weights move"
    decisions = ("canary.failure",)
    done_when_serving = True

    # ---- what the canary is keyed by: the image and the flags --------------------------------------
    def _key(self) -> str:
        spec = self._spec()
        text = json.dumps([self.flow.image, self.flow.options.model, list(spec.extra_args)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _node(self) -> str:
        """The head when it has the image (the engine step pulled it where it could), else the node
        that has it: the canary needs the image, not the head."""
        flow = self.flow
        if flow.fact(flow.head).image(flow.image) is not None:
            return flow.head
        return next((n for n in flow.nodes if n in flow.facts and flow.fact(n).image(flow.image)), flow.head)

    def _gmu(self, node: str) -> float | None:
        """The canary's gpu-memory-utilization on ``node``: CANARY_GMU, less where the node has less
        free (the free-memory step, which stops what holds memory, comes later); None when what is
        free cannot hold the miniature."""
        f = self.flow.fact(node)
        if not f.mem_total or f.mem_available is None:
            return CANARY_GMU
        gmu = min(CANARY_GMU, int(100 * FREE_SHARE * f.mem_available / f.mem_total) / 100)
        return gmu if gmu * f.mem_total >= CANARY_NEED_BYTES else None

    def _dirs(self, node: str) -> tuple[str, str]:
        """(the miniature's folder as the node sees it, as the containers see it under /hf)."""
        rel = f"sparkconsole/{self.runner.state.short_id}/canary"
        return f"{self.flow.fact(node).hf_dir}/{rel}", f"/hf/{rel}"

    def _spec(self):
        """The serve step's own start (its flags: the recipe's, the reasoning parser, fastsafetensors,
        --language-model-only) made into a one-GPU start of the miniature on 127.0.0.1."""
        spec = Serve(self.flow)._spec()
        model = f"/root/.cache/huggingface/sparkconsole/{self.runner.state.short_id}/canary/mini"
        gmu = self._gmu(self._at) if getattr(self, "_at", "") else CANARY_GMU
        return dataclasses.replace(spec, model=model,
                                   served_name="canary", host="127.0.0.1", port=CANARY_PORT, tp=1, pp=1,
                                   gpu_memory_utilization=gmu or CANARY_GMU, max_model_len=CANARY_MAX_LEN,
                                   extra_args=_drop_layout_flags(spec.extra_args))

    def _event(self, phase: str, text: str, level: str = "info") -> None:
        node = getattr(self, "_at", "")
        self.runner.emit(CanaryEvent(self.id, f"canary: {text}", level, node, phase))  # type: ignore[arg-type]

    async def probe(self) -> str | None:
        flow = self.flow
        kind = flow.engine_kind
        if not kind.canary:
            return f"no canary for {kind.label}: its start is checked at serve time"
        done = (flow.plan.canary or {})
        if done.get("ok") and done.get("key") == self._key():
            return f"passed before for {flow.image} with these flags ({done.get('summary', '')})"
        return None

    async def send(self) -> None:
        flow = self.flow
        if self.runner.read_only:
            self.runner.note("not run: the canary starts containers on a node, and read-only sends no change; "
                             f"{flow.image} is proven only when the model itself starts", "warning")
            return
        node = self._at = self._node()
        fact = flow.fact(node)
        if not fact.gpu and not self.runner.plan_only:
            # what the canary proves is the image's kernels on this GPU: without one it proves nothing
            self.runner.note(f"not run: recon read no GPU on {node}; {flow.image} is proven only when the model "
                             "itself starts", "warning")
            return
        if not fact.hub and not self.runner.plan_only:
            self.runner.note(f"not run: {node} does not reach the Hub for the model's config and tokenizer; "
                             f"{flow.image} is proven only when the model itself starts", "warning")
            return
        if self._gmu(node) is None:
            share = min(CANARY_GMU, FREE_SHARE * (fact.mem_available or 0) / (fact.mem_total or 1))
            self.runner.note(f"not run: the canary may take {share * (fact.mem_total or 0) / 2**30:.1f} GiB of {node} "
                             f"(at most {CANARY_GMU:.0%} of its memory and {FREE_SHARE:.0%} of the "
                             f"{(fact.mem_available or 0) / 2**30:.1f} GiB available), less than the miniature's "
                             f"{CANARY_NEED_BYTES / 2**30:.0f} GiB; {flow.image} is proven only when the model itself "
                             "starts", "warning")
            return
        ctr_dir = self._dirs(node)[1]
        owner = (fact.uid, fact.gid) if fact.uid is not None and fact.gid is not None and fact.uid != 0 else None
        self._started = False
        # 1. the config and the tokenizer, with the image's hf, into the node's own HF cache
        # into the canary's own folder (--local-dir): a path known before the download, so --plan-only shows
        # the writer's command exactly as it is sent, and the user's cache gets no half snapshot
        src = f"{ctr_dir}/src"
        res = await self.runner.change(node, hf_download_in_image(flow.image, flow.options.model, fact.hf_dir, owner,
                                                                  flow.container("canary-fetch"), files=CANARY_FILES,
                                                                  local_dir=src), timeout=600)
        if self.runner.rehearsing:  # what plan-only shows: the writer, the start and the removal
            for cmd in (self._writer(ctr_dir, src, owner), self._serve_cmd(node),
                        docker_rm_force(flow.container("canary"))):
                await self.runner.change(node, cmd)
            return
        if not res.ok:
            await self._failed("config", _last_line(res.stderr) or f"hf download exited {res.exit_status}")
            return
        snapshot = src
        self._event("config", f"config and tokenizer of {flow.options.model} read with {flow.image}'s hf")
        # 2. the miniature, written by the image's own Python
        res = await self.runner.change(node, self._writer(ctr_dir, snapshot, owner), timeout=600)
        events = miniature.parse_events(res.stdout[-miniature.MAX_LINE_CHARS * miniature.MAX_EVENTS:])
        summary = miniature.summarize(events, res.stderr[-65536:], res.exit_status)
        if not summary.done and summary.error and any(w in summary.error for w in NO_FAMILY):
            # the writer has no family for this model: nothing is known about the image either way
            self.runner.note(f"not run: {summary.error.removeprefix('miniature: error: ')}; {flow.image} is "
                             "proven only when the model itself starts", "warning")
            return
        if not summary.done:
            await self._failed("written", summary.error or "the miniature writer ended without its last line")
            return
        size = f"{summary.bytes / 1e6:,.0f} MB" if summary.bytes else "?"
        self._event("written", f"miniature written: {summary.architecture or summary.model_type or '?'}, "
                               f"{summary.tensors or '?':,} tensors, {size}"
                               + (f" in {summary.seconds:.1f} s" if summary.seconds is not None else ""))
        self._summary = summary
        # 3. served at TP=1, on 127.0.0.1, with the deployment's flags; a canary container left by an
        # interrupted run (the console killed mid-canary) is removed first, or the name would clash
        name = flow.container("canary")
        left = await flow.inspect(node, name)
        if left is not None and not left.missing:
            await self.runner.change(node, docker_rm_force(name), timeout=120)
        run = self._serve_cmd(node)
        res = await self.runner.change(node, run, timeout=300)
        self._started = res.ok
        if res.ok and res.stdout.strip():  # recorded: a teardown after an interrupted canary removes it
            self.runner.state.started.append(Started(node, "container", name, res.stdout.strip()[:64]))
            self.runner.save()
        if not res.ok:
            await self._failed("served", _last_line(res.stderr) or f"docker run exited {res.exit_status}")

    def _writer(self, ctr_dir: str, snapshot: str, owner: tuple[int, int] | None):
        return python_stdin_in_image(self.flow.image, miniature.program_text(), [snapshot, f"{ctr_dir}/mini"],
                                     name=self.flow.container("canary-write"), hf_dir=self.flow.fact(self._at).hf_dir,
                                     user=owner, what=f"write a miniature of {self.flow.options.model}")

    def _serve_cmd(self, node: str):
        flow = self.flow
        kind = flow.engine_kind
        (launch,) = kind.launches(self._spec(), "single", [(node, "127.0.0.1")])
        return docker_run(flow.container("canary"), flow.image, options=DOCKER_OPTS, entrypoint=launch.entrypoint,
                          args=list(launch.args), env=[*kind.launch_env, *launch.env],
                          mounts=[(flow.fact(node).hf_dir, "/root/.cache/huggingface")],
                          summary=f"serve the miniature with {flow.image} at TP=1 on 127.0.0.1:{CANARY_PORT} "
                                  "(the deployment's flags)")

    async def watch(self) -> None:
        if self.runner.rehearsing or not getattr(self, "_started", False):
            return
        try:
            await self._follow()
        finally:
            await self._remove()

    async def _remove(self) -> None:
        name = self.flow.container("canary")
        res = await self.runner.change(self._at, docker_rm_force(name), timeout=120)
        if not res.ok and "No such container" not in res.stderr:
            self.runner.note(f"the canary's container could not be removed: {_last_line(res.stderr)}", "warning",
                             self._at)
            return
        started = self.runner.state.started
        started[:] = [s for s in started if not (s.node == self._at and s.name == name)]
        self.runner.save()

    async def _follow(self) -> None:
        flow, node = self.flow, self._at
        name = flow.container("canary")
        kind = flow.engine_kind
        tracker, follow = kind.log_tracker(), DockerLogFollow()  # this engine's reader of its own log
        if tracker is None:
            raise StepFailed(f"the console does not read {kind.label}'s log: the canary cannot follow its start")
        seen: list[str] = []  # the log's lines, for the root cause a failure's summary line may hide
        t0 = time.monotonic()
        speed = self.runner.settings.speed
        while True:
            res = await self.runner.read(node, follow.command(name), quiet=True)
            for line in follow.feed(res.stdout, res.stderr) if res.ok else []:
                for part in line.splitlines() or [line]:
                    tracker.feed(part)
                    seen.append(part)
            rep = tracker.report
            if rep.state == "ready":
                took = (time.monotonic() - t0) * speed
                self._event("served", f"miniature served by {flow.image} (ready in {took:.0f} s; KV cache "
                                      f"{rep.kv_cache_gib if rep.kv_cache_gib is not None else '?'} GiB)")
                break
            if rep.state == "failed":
                await self._failed("served", _root_cause(seen) or rep.failure_line or "the engine failed", kind.advise(rep))
                return
            st = await flow.inspect(node, name)
            if st is not None and (st.missing or st.status in ("exited", "dead")):
                res = await self.runner.read(node, follow.command(name), quiet=True)
                for line in follow.feed(res.stdout, res.stderr) if res.ok else []:
                    tracker.feed(line)
                    seen.append(line)
                rep = tracker.report
                await self._failed("served", _root_cause(seen) or rep.failure_line or _last_line(res.stdout + res.stderr)
                                   or f"its container {st.status}", kind.advise(rep))
                return
            if (time.monotonic() - t0) * speed > CANARY_TIMEOUT_S:
                await self._failed("served", f"not ready after {CANARY_TIMEOUT_S:.0f} s")
                return
            await asyncio.sleep(self.runner.settings.poll_s)
        await self._chat()

    async def _chat(self) -> None:
        node = self._at
        t = time.monotonic()
        res = await self.runner.read(node, http_post_json(f"http://127.0.0.1:{CANARY_PORT}/v1/chat/completions",
                                                          json.dumps(CHAT_BODY), CHAT_TIMEOUT_S),
                                     timeout=CHAT_TIMEOUT_S + 10)
        took = max(1e-6, (time.monotonic() - t) * self.runner.settings.speed)
        body = res.stdout[-65536:]
        try:
            answer = json.loads(body) if res.ok else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not answer.get("choices"):
            err = (answer or {}).get("error") if isinstance(answer, dict) else None
            msg = (err.get("message") if isinstance(err, dict) else err) or _last_line(body or res.stderr)
            await self._failed("answered", f"the chat failed: {msg or 'no answer'}")
            return
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
        tokens = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else None
        rate = f", {tokens / took:.0f} tokens/s (a miniature's rate: no performance claim)" if tokens else ""
        self._event("answered", f"one chat with a tool offered answered ({tokens or '?'} tokens{rate})")
        self.flow.update(canary={"ok": True, "key": self._key(), "image": self.flow.image,
                                 "summary": f"{self._summary.tensors or '?'} tensors, served, answered"})

    async def _failed(self, phase: str, line: str, advice: str | None = None) -> None:
        """The decision after a failed phase: its line is the engine's (or the tool's) own."""
        flow = self.flow
        line = display_text(line)[:400]
        self._event(phase, f"failed at '{phase}': {line}", "error")
        if self.runner.state.answers.get("canary.failure") is not None and \
                (flow.plan.canary or {}).get("failed_key") == self._key():
            self.runner.forget("canary.failure")  # the same failure again: asked again, not replayed
        flow.update(canary={"ok": False, "failed_key": self._key(), "image": flow.image, "phase": phase,
                            "error": line})
        checks = dict(flow.plan.engine_checks or {})
        checks[flow.image] = {**checks.get(flow.image, {}), "canary_error": line}
        flow.update(engine_checks=checks)
        kernels = engines.is_kernel_failure(line)
        measured = (f"{flow.image} on {self._at}: {phase} failed", f"the engine said: {line}")
        if advice:
            measured += (advice,)
        options = [
            Option("image", "choose another image (back to the engine step)",
                   "the engine step asks again; this image is no longer recommended"
                   + (" (its kernels fail on this GPU)" if kernels else "")),
            Option("continue", "go on without the proof", "the weights move; the model's own start meets the "
                   "same failure unless the cause is the miniature's", experimental=True),
            Option("stop", "stop here", "nothing more is started; --resume asks again"),
        ]
        rec = "image" if kernels or phase in ("config", "served") else "stop"
        why = ("an image built for GB10 (sm_121) has the kernels this one lacks" if kernels else
               "another image's vLLM or transformers may load this model" if rec == "image" else
               "the cause is in the flags or the template: fix the recipe, then --resume")
        answer = await self.runner.decide(Decision("canary.failure", self.id, "The canary failed: what now",
                                                   measured, tuple(options), rec, why))
        if answer == "image":
            self.runner.forget("engine.image", "canary.failure")
            raise GoTo("engine", f"the canary failed on {flow.image}: {line}")
        if answer == "stop":
            raise StepFailed(f"the canary failed on {flow.image}: {line}",
                             "choose another image or fix the recipe's flags, then --resume")
        self.runner.note(f"going on without the canary's proof: {line}", "warning")


# an exception's line in a log (``RuntimeError: Error Internal``, ``ValueError: …``), after any process prefix
_EXC_LINE = re.compile(r"(?:^|\s|\] )((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): .+)$")
# the symptoms vLLM prints above and below the root cause (the engine core's summary, the API server's)
_SYMPTOMS = ("Engine core initialization failed", "EngineCore failed to start", "WorkerProc failed to start",
             "Failed core proc")
MAX_SCAN_LINES = 4000


def _root_cause(lines: list[str]) -> str:
    """The engine's own root-cause line in its log: a kernel failure first, else the first exception
    line that is not one of vLLM's summary symptoms (the tracker reports the symptom, which names no
    cause: "Engine core initialization failed. See root cause above")."""
    tail = lines[-MAX_SCAN_LINES:]
    for line in tail:
        if engines.is_kernel_failure(line):
            m = _EXC_LINE.search(line.strip())
            return display_text(m.group(1) if m else line.strip())[:400]
    for line in tail:
        m = _EXC_LINE.search(line.strip())
        if m and not any(s in m.group(1) for s in _SYMPTOMS):
            return display_text(m.group(1))[:400]
    return ""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return display_text(lines[-1])[:400] if lines else ""
