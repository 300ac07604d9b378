"""Ray's token authentication, made explicit when the operator chooses Ray (``cluster.executor=ray``).

Facts (docs.ray.io ray-security/token-auth.html, ray-core/internals/token-authentication.html): token
authentication exists from Ray 2.52.0; ``RAY_AUTH_MODE`` (``disabled`` | ``token``) must be the same on
every node; with ``token`` Ray reads ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
``~/.ray/auth_token``; Ray 2.61 turns token mode on by default for all clusters. The wizard makes a token on
the head (mode 600, ``~/.config/sparkconsole/ray-token``), copies it head → worker on ssh's stdin, mounts it
read-only into each Ray container with ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``, and teardown
removes the files. The token's value is in no command, event, journal line or state file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex

import pytest

from sparkconsole.deploy.teardown import Teardown
from sparkconsole.errors import ValidationError
from sparkconsole.journal import Journal
from sparkconsole.remote import (
    RAY_TOKEN_IN_CONTAINER,
    copy_ray_token,
    make_ray_token,
    ray_token_env,
    ray_token_mount,
    ray_token_path,
    remove_file,
)
from sparkconsole.sim import SimClock, build
from sparkconsole.sim.model import IMAGE_NEW, IMAGE_NGC_2603, IMAGES
from sparkconsole.sim.tools.ray import RAY_INVALID_TOKEN, RAY_MISSING_TOKEN, RAY_NO_TOKEN
from tests.deploy_support import demo_flow
from tests.test_sim_model import sh

SPEED = 200.0
HEAD, WORKER = "spark-1a32", "spark-5be3"
# Ray's text for token mode without a token (ray-project/ray python/ray/_private/authentication/
# authentication_constants.py, TOKEN_AUTH_ENABLED_BUT_NO_TOKEN_FOUND_ERROR_MESSAGE)
NO_TOKEN_TEXT = "Token authentication is enabled but no authentication token was found."


# ---- the builders ----------------------------------------------------------------------------------

def test_the_token_builders_name_files_never_a_value_and_quote_every_path():
    path = ray_token_path("/home/nvidia")
    assert path == "/home/nvidia/.config/sparkconsole/ray-token"
    made = make_ray_token(path).shell()
    assert made.startswith("umask 077 && mkdir -p /home/nvidia/.config/sparkconsole && ")
    assert "[ -s /home/nvidia/.config/sparkconsole/ray-token ] ||" in made  # kept on a resume
    assert "/proc/sys/kernel/random/uuid" in made and make_ray_token(path).mutating
    cp = copy_ray_token(path, "nvidia@192.168.200.13", "/home/nv2/.config/sparkconsole/ray-token", port=2222)
    text = cp.shell()
    left, pipe, right = text.partition(" | ")
    assert pipe and left == f"[ -s {path} ] && cat {path}"  # the token goes on ssh's stdin
    argv = shlex.split(right)
    assert argv[:6] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-p"] and argv[6:8] == [
        "2222", "nvidia@192.168.200.13"]
    far = shlex.split(argv[8])  # what the worker's shell runs: one quoted argument
    assert far[:2] == ["sh", "-c"] and far[2].startswith("umask 077 && mkdir -p /home/nv2/.config/sparkconsole && cat > ")
    assert "mv -f /home/nv2/.config/sparkconsole/ray-token.new /home/nv2/.config/sparkconsole/ray-token" in far[2]
    assert cp.mutating and "stdin" in cp.summary
    assert ray_token_env() == [("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN_PATH", RAY_TOKEN_IN_CONTAINER)]
    assert ray_token_mount(path) == ["--mount", f"type=bind,source={path},target={RAY_TOKEN_IN_CONTAINER},readonly"]
    assert remove_file(path).shell() == f"rm -f {path}" and remove_file(path).mutating
    for bad in ("/tmp/x;reboot", "/tmp/$(id)", "relative/ray-token", "/tmp/../etc/passwd", "/tmp/a b"):
        for build_one in (make_ray_token, ray_token_mount, remove_file,
                          lambda p: copy_ray_token(p, "nvidia@10.0.0.2", "/home/nvidia/t"),
                          lambda p: copy_ray_token("/home/nvidia/t", "nvidia@10.0.0.2", p)):
            with pytest.raises(ValidationError):
                build_one(bad)
    with pytest.raises(ValidationError):
        copy_ray_token(path, "nvidia@10.0.0.2;reboot", "/home/nvidia/t")
    with pytest.raises(ValidationError):  # --mount's fields are comma-separated
        ray_token_mount("/home/a,target=/etc/ray-token")


# ---- the simulator: Ray's own rules ------------------------------------------------------------------

V261 = "vllm/vllm-openai:v0.17.0-ray2.61"  # a made-up image: no image the field runs carries Ray 2.61 yet


@pytest.fixture
def ray261(monkeypatch):
    """The demo's cluster with an image like vLLM 0.17.0's but Ray 2.61.0 on both nodes."""
    img = dataclasses.replace(IMAGE_NEW, ref=V261, ray="2.61.0")
    monkeypatch.setitem(IMAGES, V261, img)
    c = build("healthy", clock=SimClock.frozen())
    for n in (HEAD, WORKER):
        c.nodes[n].images[V261] = img
    return c


def _start(c, node: str, image: str, env: str = "", token_file: str | None = None) -> str:
    ip = {n: c.nodes[n].fast_ip for n in (HEAD, WORKER)}
    tail = (f"--head --node-ip-address={ip[HEAD]} --port=6379" if node == HEAD else
            f"--address={ip[HEAD]}:6379 --node-ip-address={ip[WORKER]}")
    mount = (f"--mount type=bind,source={token_file},target={RAY_TOKEN_IN_CONTAINER},readonly "
             if token_file else "")
    return f"docker run -d --name ray --network host {env} {mount}--entrypoint ray {image} start --block {tail}"


async def _log(c, node: str) -> str:
    c.clock.advance(5)
    out, err, _rc = await sh(c, node, "docker logs ray")
    return out + err


def _token_file(c, node: str, text: str) -> str:
    path = f"{c.login(node).home}/.config/sparkconsole/ray-token"
    c.fs(node).mkdir(path.rsplit("/", 1)[0], parents=True)
    c.fs(node).write_text(path, text)
    return path


async def test_ray_2_61_wants_a_token_by_default_and_refuses_a_worker_without_it(ray261):
    c = ray261
    tok = "0123456789abcdef0123456789abcdef"
    # no RAY_AUTH_MODE, no token: Ray 2.61 is in token mode by default and stops at once
    _out, err, rc = await sh(c, HEAD, _start(c, HEAD, V261))
    assert rc == 0, err
    assert NO_TOKEN_TEXT in await _log(c, HEAD) and c.ray is None
    await sh(c, HEAD, "docker rm -f ray")
    # the head with the token (the wizard's way: the mode explicit, the file mounted read-only)
    env = "-e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH=" + RAY_TOKEN_IN_CONTAINER
    _out, err, rc = await sh(c, HEAD, _start(c, HEAD, V261, env, _token_file(c, HEAD, tok + "\n")))
    assert rc == 0 and "Ray runtime started." in await _log(c, HEAD) and c.ray is not None and c.ray.token == tok
    # a worker with nothing set: token mode by default, no token: Ray's own text, and it never joins
    await sh(c, WORKER, _start(c, WORKER, V261))
    log = await _log(c, WORKER)
    assert RAY_NO_TOKEN.strip() in log and NO_TOKEN_TEXT in log and WORKER not in c.ray.members
    await sh(c, WORKER, "docker rm -f ray")
    # a worker that turned it off explicitly: the head wants a token and got none
    await sh(c, WORKER, _start(c, WORKER, V261, "-e RAY_AUTH_MODE=disabled"))
    assert RAY_MISSING_TOKEN.splitlines()[0] in await _log(c, WORKER) and WORKER not in c.ray.members
    await sh(c, WORKER, "docker rm -f ray")
    # another token: refused as invalid
    await sh(c, WORKER, _start(c, WORKER, V261, env, _token_file(c, WORKER, "not-the-heads")))
    assert RAY_INVALID_TOKEN.splitlines()[0] in await _log(c, WORKER) and WORKER not in c.ray.members
    await sh(c, WORKER, "docker rm -f ray")
    # an empty token file: fatal, as Ray's loader says (authentication_token_loader.cc)
    await sh(c, WORKER, _start(c, WORKER, V261, env, _token_file(c, WORKER, "")))
    assert ("RAY_AUTH_TOKEN_PATH is set but file cannot be opened or is empty: " + RAY_TOKEN_IN_CONTAINER
            in await _log(c, WORKER))
    await sh(c, WORKER, "docker rm -f ray")
    # the same token: it joins
    await sh(c, WORKER, _start(c, WORKER, V261, env, _token_file(c, WORKER, tok)))
    assert "Ray runtime started." in await _log(c, WORKER) and WORKER in c.ray.members
    # `ray status` in the head's container: with the container's own environment it passes; told to go
    # without the token, the cluster refuses it
    out, err, rc = await sh(c, HEAD, "docker exec ray ray status")
    assert rc == 0 and "Active:" in out, err
    out, err, rc = await sh(c, HEAD, "docker exec -e RAY_AUTH_MODE=disabled ray ray status")
    assert rc == 1 and RAY_MISSING_TOKEN.splitlines()[0] in err


async def test_an_older_ray_ignores_the_variables_and_disabled_turns_it_off(ray261):
    c = ray261
    old = dataclasses.replace(IMAGE_NEW, ref="vllm/vllm-openai:v0.17.0-ray2.51", ray="2.51.0")
    IMAGES[old.ref] = old
    try:
        for n in (HEAD, WORKER):
            c.nodes[n].images[old.ref] = old
        # Ray 2.51: RAY_AUTH_MODE=token and a missing token file mean nothing to it
        await sh(c, HEAD, _start(c, HEAD, old.ref, "-e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH=/nonexistent"))
        assert "Ray runtime started." in await _log(c, HEAD) and c.ray is not None and c.ray.token is None
        await sh(c, WORKER, _start(c, WORKER, old.ref))
        assert "Ray runtime started." in await _log(c, WORKER) and WORKER in c.ray.members
    finally:
        del IMAGES[old.ref]
    for n in (HEAD, WORKER):
        await sh(c, n, "docker rm -f ray")
    c.ray = None
    # Ray 2.61 with RAY_AUTH_MODE=disabled on both: no token anywhere, and the cluster forms
    for n in (HEAD, WORKER):
        await sh(c, n, _start(c, n, V261, "-e RAY_AUTH_MODE=disabled"))
        assert "Ray runtime started." in await _log(c, n)
    assert c.ray is not None and c.ray.token is None and WORKER in c.ray.members


# ---- the wizard on the demo --------------------------------------------------------------------------

async def test_the_wizard_forms_ray_with_a_token_serves_and_teardown_removes_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    # NGC 26.03: a GB10 build with Ray 2.54 (vLLM 0.17.0's upstream image has the same Ray, but its block-FP8
    # kernels fail on GB10 at the canary)
    presets = {"engine.image": IMAGE_NGC_2603.ref, "cluster.executor": "ray"}
    async with demo_flow(tmp_path, presets, speed=SPEED) as run:
        run.flow.runner.journal = Journal(tmp_path / "state" / "journal.jsonl")  # before its first change
        outcome = await asyncio.wait_for(run.task, 400)
        assert outcome.ok, outcome
        sim = run.demo.sim
        head, worker = run.flow.head, next(n for n in run.flow.nodes if n != run.flow.head)
        files = {n: f"{sim.login(n).home}/.config/sparkconsole/ray-token" for n in (head, worker)}
        token = sim.fs(head).read_text(files[head]).strip()
        assert len(token) >= 32 and sim.fs(worker).read_text(files[worker]).strip() == token
        assert sim.ray is not None and sim.ray.token == token and len(sim.ray.members) == 2
        sent = [(n, t) for _t, n, t in run.sent]
        runs = [(n, t) for n, t in sent if t.startswith("docker run -d --name sparkconsole-ray-")]
        assert sorted(n for n, _t in runs) == sorted((head, worker))
        for n, t in runs:
            argv = shlex.split(t)
            assert "RAY_AUTH_MODE=token" in argv and f"RAY_AUTH_TOKEN_PATH={RAY_TOKEN_IN_CONTAINER}" in argv
            assert f"type=bind,source={files[n]},target={RAY_TOKEN_IN_CONTAINER},readonly" in argv
            # Ray's dashboard (it submits jobs: runs code) on the head's loopback only
            assert ("--dashboard-host=127.0.0.1" in argv) == (n == head)
        # made on the head, then copied head → worker over ssh (on its stdin), before any Ray container
        made = [i for i, (n, t) in enumerate(sent) if n == head and "random/uuid" in t and "ray-token" in t]
        copied = [i for i, (n, t) in enumerate(sent) if n == head and t.startswith(f"[ -s {files[head]} ] && cat ")]
        first_run = min(i for i, (_n, t) in enumerate(sent) if t.startswith("docker run -d --name sparkconsole-ray-"))
        assert made and copied and made[0] < copied[0] < first_run
        assert "BatchMode=yes" in sent[copied[0]][1]
        # every `ray status` carries the token's mode and file
        statuses = [t for _n, t in sent if t.endswith(" ray status")]
        assert statuses and all("-e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH=" in t for t in statuses)
        # the served engine runs in the head's Ray container, whose environment has them
        (serve,) = [t for _n, t in sent if "vllm serve" in t and "docker exec" in t and " -d " in t]
        assert "sparkconsole-ray-" in serve
        # the changes were journaled like the others
        journal = (tmp_path / "state" / "journal.jsonl").read_text()
        assert "ray-token" in journal and "RAY_AUTH_TOKEN_PATH" in journal

        # teardown: the containers, then the token files on both nodes
        await Teardown(run.flow).run()
        for n in (head, worker):
            assert sim.fs(n).lookup(files[n]) is None, n
        assert "made_files" not in run.flow.runner.state.facts

        # the value is nowhere: commands, events, journal, state files, anything under the state folder
        assert not any(token in t for _n, t in sent)
        assert not any(token in repr(e) for _t, e in run.events)
        for f in tmp_path.rglob("*"):
            if f.is_file():
                assert token not in f.read_text(errors="replace"), f
