"""Verify: /health, /v1/models and one chat completion with its reasoning kept apart; then who can
reach the endpoint, as the head's own sockets and a request without the key say it."""

from __future__ import annotations

import json
import time

from sparkconsole.deploy.recon import parse_ss
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.steps.base import Step
from sparkconsole.remote import (
    http_get,
    http_get_keyed,
    http_post_json_keyed,
    http_status,
    listening_tcp,
)
from sparkconsole.serving.engines import VLLM
from sparkconsole.serving.engines.base import EngineKind

CHAT_PROMPT = "What is 12*17? Answer with the number."

# What vLLM's API key leaves open lives with vLLM (serving/engines/vllm.py ``keyless_paths``).
VLLM_KEYLESS_MODEL_PATHS, VLLM_KEYLESS_READ_PATHS, VLLM_KEYLESS_CONTROL_PATHS = VLLM.keyless_paths
# Ray's head and nodes (``ray start``'s defaults, which the wizard does not change): the GCS on
# --port, the Ray client server on --ray-client-server-port, the dashboard agent's HTTP server on
# --dashboard-agent-listen-port (it takes job submissions: it runs code; ray/dashboard/
# http_server_agent.py binds 0.0.0.0 unless the node's address is 127.0.0.1), the dashboard itself
# (bound to 127.0.0.1 by the wizard's --dashboard-host); the raylet, object manager and metrics
# export ports are picked at start.
RAY_HEAD_PORTS = ((6379, "the GCS"), (10001, "the Ray client server"))
RAY_NODE_PORTS = ((52365, "the dashboard agent, which accepts job submissions"),)
RAY_DASHBOARD_PORT = 8265


def keyless_paths_text(kind: EngineKind = VLLM) -> str:
    """In words: what an engine started with an API key still answers without it (its object says)."""
    if kind.keyless_paths is None:
        return f"{kind.label} may answer other paths than /v1 without it"
    model, read, control = kind.keyless_paths
    return (f"{kind.label} checks the key only on paths that start with /v1: without it, "
            f"{', '.join(model)} still run the model, "
            f"{', '.join(read)} answer anyone (the tokenizer, the engine's state and load)"
            + (f", and {', '.join(control)} rescales it where the release has it" if control else ""))


def ray_ports_text(head: str) -> str:
    """In words: the ports Ray opens on the nodes, which the endpoint's key does not guard."""
    on_head = ", ".join(f"{p} ({what})" for p, what in RAY_HEAD_PORTS)
    on_each = ", ".join(f"{p} ({what})" for p, what in RAY_NODE_PORTS)
    return (f"Ray's ports listen on every interface: on {head} {on_head}; on every node {on_each}, and the "
            "raylet, object manager and metrics ports Ray picks at start. They take no authentication unless the "
            "image's Ray honours the token the wizard gives it (Ray 2.52 and later; the token crosses the network in "
            f"clear). Ray's dashboard ({RAY_DASHBOARD_PORT}) listens on 127.0.0.1 only")


class Verify(Step):
    id, title = "verify", "Health, models, one chat completion"

    async def verify(self) -> None:
        flow = self.flow
        base = f"http://127.0.0.1:{flow.options.port}"
        served = flow.served_name
        key = flow.api_key_file  # sent along when the head has one: /v1 wants it then (the node reads it)
        health = await self.runner.read(flow.head, http_get(f"{base}/health", fail=True), timeout=30)
        if not health.ok:
            raise StepFailed(f"/health did not answer 200 (exit {health.exit_status})", "read the engine's log")
        models = await self.runner.read(flow.head, http_get_keyed(f"{base}/v1/models", key), timeout=30)
        if f'"{served}"' not in models.stdout:
            raise StepFailed(f"/v1/models does not name {served}: {models.stdout[:200]}",
                             f"the engine wants another API key than {key}?" if "Unauthorized" in models.stdout
                             else "another server holds the port? ss -ltnp")
        body = json.dumps({"model": served, "messages": [{"role": "user", "content": CHAT_PROMPT}],
                           "max_tokens": 512})
        t0 = time.monotonic()
        chat = await self.runner.read(flow.head, http_post_json_keyed(f"{base}/v1/chat/completions", body, key),
                                      timeout=600)
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
        await self._who_can_reach()
        self.runner.state.result = "served"
        self.runner.save()

    async def _who_can_reach(self) -> None:
        """Say who can use the endpoint, from what the head measures rather than what was asked: the
        address its API socket is bound to (``ss -ltn``) and what /v1 answers a request without the
        key (401: vLLM's key check; 200: anyone). What was asked (serve.access) and what is measured
        must agree: an engine asked to want a key that answers without one is a failed deployment.
        Then the cluster's own ports, which take no key whatever was chosen."""
        flow, head = self.flow, self.runner.head
        port = flow.options.port
        keyless = await self.runner.read(flow.head, http_status(f"http://127.0.0.1:{port}/v1/models"), timeout=30)
        code = keyless.stdout.strip()[-3:]
        bound = None
        if flow.fact(flow.head).tools.get("ss") is not False:
            ss = await self.runner.read(flow.head, listening_tcp(), timeout=30)
            found = next((x for x in parse_ss(ss.stdout) if x.port == port), None) if ss.ok else None
            bound = found.address if found is not None else None
        local = _loopback(bound) if bound is not None else flow.plan.access == "local"
        asked = flow.plan.access
        if asked == "api-key" and code == "200":
            raise StepFailed("the endpoint answers /v1 without the API key",
                             "its engine was started without the key: `sparkconsole deploy --teardown`, then deploy "
                             "again with serve.access=api-key")
        if asked == "local" and not local:
            raise StepFailed(f"the endpoint listens on {bound}, not on 127.0.0.1 only",
                             "its engine was started for the network: `sparkconsole deploy --teardown`, then deploy "
                             "again with serve.access=local")
        tunnel = _tunnel(head, port)
        level = "info"
        if local:
            endpoint = f"http://localhost:{port}/v1"
            text = (f"endpoint {endpoint} through an SSH tunnel only: {flow.engine_kind.label} listens on 127.0.0.1 "
                    f"of {head.name}, so nothing on the network reaches any of its paths (/v1, /metrics, /health and "
                    f"the rest); from a laptop: {tunnel}")
        else:
            endpoint = f"http://{head.host}:{port}/v1"
            where = "every interface" if bound in (None, "0.0.0.0", "*", "[::]") else bound
            if code == "401":
                keyless = keyless_paths_text(flow.engine_kind)
                text = (f"endpoint {endpoint}: anyone who reaches it with the API key can use /v1 (header "
                        f"`Authorization: Bearer KEY`; 401 without it). Not all of port {port} is closed: {keyless}. The key stays on {head.name}, "
                        f"in {flow.api_key_file}: `{_ssh(head)} cat {flow.api_key_file}`. Listening on {where} of "
                        f"{head.name}; from a laptop without a route to it: {tunnel}. To close the port to the network, "
                        "serve with serve.access=local (127.0.0.1, reached through that SSH tunnel)")
                level = "warning"
            else:
                level = "warning"
                text = (f"endpoint {endpoint}: anyone who reaches {head.host}:{port} can use the model, with no key, on "
                        f"every path (/v1, /metrics and the rest; listening on {where} of {head.name}; "
                        "serve.access=api-key would require one on /v1, serve.access=local closes the port to the "
                        f"network); from a laptop without a route to it: {tunnel}")
        self.runner.state.endpoint = endpoint
        self.runner.note(text, level)
        cluster = self._cluster_ports()
        if cluster:
            self.runner.note(cluster)

    def _cluster_ports(self) -> str | None:
        """The ports the nodes open to each other, which no key guards: said whatever the endpoint's
        access (``--node-ip-address``, ``--master-addr`` and the NCCL/Gloo interfaces name the fast
        link, but the servers behind these ports listen on every interface)."""
        flow = self.flow
        if len(flow.nodes) < 2:
            return None
        head = flow.head
        trusted = "keep the cluster on a trusted network"
        kind = flow.engine_kind
        if flow.executor == "native":
            return (f"{kind.label}'s rendezvous ({kind.rendezvous_what}port {kind.rendezvous_port} of {head}) takes no "
                    f"authentication and listens on every interface of {head}: {trusted}")
        return (f"{ray_ports_text(str(head))}. Whoever reaches them without authentication can run code in the "
                f"Ray containers: {trusted}")


def _loopback(address: str) -> bool:
    """Whether ``ss`` shows a socket bound to the loopback only (``127.0.0.1``, ``[::1]``)."""
    return address.startswith("127.") or address in ("[::1]", "::1", "localhost")


def _ssh(head: object) -> str:
    """``ssh [-p PORT] USER@HOST``: the head as the inventory reaches it (its login user, its ssh port)."""
    user, host, ssh_port = getattr(head, "user", None), getattr(head, "host", ""), getattr(head, "port", None)
    target = f"{user}@{host}" if user else str(host)
    return "ssh" + (f" -p {ssh_port}" if ssh_port and ssh_port != 22 else "") + f" {target}"


def _tunnel(head: object, port: int) -> str:
    """The ``ssh -L`` a laptop runs to reach the head's API: as the inventory reaches the head (its
    login user, its ssh port), since a stock Spark takes no root and a demo node listens elsewhere."""
    return _ssh(head).replace("ssh", f"ssh -L {port}:localhost:{port}", 1)
