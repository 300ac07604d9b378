"""Verify: /health, /v1/models and one chat completion with its reasoning kept apart."""

from __future__ import annotations

import json
import time

from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.steps.base import Step
from sparkconsole.remote import (
    http_get,
    http_post_json,
)

CHAT_PROMPT = "What is 12*17? Answer with the number."


class Verify(Step):
    id, title = "verify", "Health, models, one chat completion"

    async def verify(self) -> None:
        flow = self.flow
        base = f"http://127.0.0.1:{flow.options.port}"
        served = flow.served_name
        health = await self.runner.read(flow.head, http_get(f"{base}/health", fail=True), timeout=30)
        if not health.ok:
            raise StepFailed(f"/health did not answer 200 (exit {health.exit_status})", "read the engine's log")
        models = await self.runner.read(flow.head, http_get(f"{base}/v1/models"), timeout=30)
        if f'"{served}"' not in models.stdout:
            raise StepFailed(f"/v1/models does not name {served}: {models.stdout[:200]}",
                             "another server holds the port? ss -ltnp")
        body = json.dumps({"model": served, "messages": [{"role": "user", "content": CHAT_PROMPT}],
                           "max_tokens": 512})
        t0 = time.monotonic()
        chat = await self.runner.read(flow.head, http_post_json(f"{base}/v1/chat/completions", body), timeout=600)
        wall = (time.monotonic() - t0) * self.runner.settings.speed
        try:
            data = json.loads(chat.stdout)
            msg = data["choices"][0]["message"]
            tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
        except (ValueError, KeyError, IndexError, TypeError):
            raise StepFailed(f"the chat completion did not come back: {chat.stdout[:200] or chat.stderr[:200]}",
                             "read the engine's log") from None
        tps = tokens / wall if wall > 0 and tokens else None
        flow.update(tokens_per_s=tps)
        answer = (msg.get("content") or "").strip().replace("\n", " ")
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
        self.runner.note(f"chat: {answer[:80]!r}; reasoning returned apart ({len(reasoning)} chars); "
                    f"{tokens} tokens" + (f", {tps:.1f} tok/s" if tps else ""))
        head = self.runner.head
        self.runner.state.endpoint = f"http://{head.host}:{flow.options.port}/v1"
        self.runner.note(f"endpoint {self.runner.state.endpoint} (listening on {head.name}, all interfaces; from a laptop "
                    f"without a route to it: {_tunnel(head, flow.options.port)})")
        self.runner.state.result = "served"
        self.runner.save()


def _tunnel(head: object, port: int) -> str:
    """The ``ssh -L`` a laptop runs to reach the head's API: as the inventory reaches the head (its
    login user, its ssh port), since a stock Spark takes no root and a demo node listens elsewhere."""
    user, host, ssh_port = getattr(head, "user", None), getattr(head, "host", ""), getattr(head, "port", None)
    target = f"{user}@{host}" if user else str(host)
    return f"ssh -L {port}:localhost:{port}" + (f" -p {ssh_port}" if ssh_port and ssh_port != 22 else "") + f" {target}"
