"""Hostile node names, model ids, image names, paths and values through every command builder:
nothing a user, a config or a node typed ever runs as shell code (issue 14, part 3).

Every builder of :mod:`sparkconsole.remote` (and the weights step's copy-beside-the-download script)
gets, in each of its string arguments, values written to break out of a shell word: ``$(touch C)``,
backticks, ``;``, ``&&``, ``|``, newlines, quotes of both kinds, ``${IFS}``, option look-alikes,
NUL, ``..``. Each value names its own canary file ``C``. A builder either refuses the value with a
one-line :class:`ValidationError`, or returns a command; every command returned is then RUN, for
real: through the local ``/bin/sh`` (dash) and through a real OpenSSH ``sshd`` on loopback, where
root's login shell (bash) reads it, exactly as a node would. The tools the commands call are
stand-ins on ``PATH`` that do nothing, except that they run on what a real node would run through a
shell again: ``docker … sh -c X`` runs ``X``, ``ssh HOST CMD`` runs ``CMD``, ``setsid``/``nohup``
run their command. So a value that escaped at any level, even in the remote command of an ``ssh``
inside a ``docker save | ssh … docker load``, creates its canary. None may exist afterwards.
"""

from __future__ import annotations

import asyncio
import shlex
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkconsole import remote as R
from sparkconsole.config import parse_config
from sparkconsole.errors import ConfigError, ValidationError
from sparkconsole.transport.base import command_text
from sparkconsole.transport.ssh import SshTransport
from tests.lab.sshd import LabSshd

# {c}: this value's canary file
HOSTILE = [
    "$(touch {c})", "`touch {c}`", "; touch {c}", "a;touch {c}", "a && touch {c}", "a || touch {c}", "a | touch {c}",
    "a\ntouch {c}", "a\rtouch {c}", "a'; touch {c}; '", 'a"; touch {c}; "', "a'$(touch {c})'", 'a"$(touch {c})"',
    "$(touch${{IFS}}{c})", "a$(touch {c})b", "a`touch {c}`b", "a & touch {c}", "a > {c}", "a\x00; touch {c}",
    "-oProxyCommand=touch {c}", "--rsh=touch {c}", "-e touch {c}", "/tmp/$(touch {c})", "~/`touch {c}`",
    "/tmp/a/../../{c}", "owner/$(touch {c})", "$(touch {c})/model", "x/y; touch {c}", "img:tag; touch {c}",
    "http://127.0.0.1:8000/$(touch {c})", "{{\"a\": \"$(touch {c})\"}}", "K=$(touch {c})", "\\$(touch {c})",
]

BENIGN_PATH = "/tmp/sparkconsole-hostile"


_BENCH = {"concurrency": 1, "num_prompts": 1, "input_len": 8, "output_len": 8, "result_dir": BENIGN_PATH,
          "result_filename": "r.json"}


def _builders() -> dict[str, Callable[[str], R.RemoteCommand]]:
    """Every builder, one entry per string argument (the others benign)."""
    job = R.JobFiles.under(BENIGN_PATH, "job")
    rs = R.rsync_dir(BENIGN_PATH + "/src", "root@127.0.0.1", BENIGN_PATH + "/dst")
    return {
        "docker_action.name": lambda v: R.docker_action("stop", v),
        "docker_action.action": lambda v: R.docker_action(v, "c1"),
        "systemctl_action.unit": lambda v: R.systemctl_action("restart", v),
        "docker_logs.name": lambda v: R.docker_logs(v),
        "docker_logs.since": lambda v: R.docker_logs("c1", since=v),
        "systemctl_show.unit": lambda v: R.systemctl_show(["ollama", v]),
        "journalctl_follow.unit": lambda v: R.journalctl_follow(v),
        "hub_reachable.model": lambda v: R.hub_reachable(v),
        "hub_tree.model": lambda v: R.hub_tree(v),
        "hub_tree.revision": lambda v: R.hub_tree("Qwen/Qwen3.5-122B-A10B-FP8", revision=v),
        "hf_download.model": lambda v: R.hf_download(v),
        "rsync_dir.src": lambda v: R.rsync_dir(v, "root@127.0.0.1", BENIGN_PATH),
        "rsync_dir.user_host": lambda v: R.rsync_dir(BENIGN_PATH, v, BENIGN_PATH),
        "rsync_dir.user": lambda v: R.rsync_dir(BENIGN_PATH, f"{v}@127.0.0.1", BENIGN_PATH),
        "rsync_dir.dest": lambda v: R.rsync_dir(BENIGN_PATH, "root@127.0.0.1", v),
        "rsync_dir.exclude": lambda v: R.rsync_dir(BENIGN_PATH, "root@127.0.0.1", BENIGN_PATH, exclude=(v,)),
        "ssh_to.user_host": lambda v: R.ssh_to(v, "true"),
        "ssh_to.argv": lambda v: R.ssh_to("root@127.0.0.1", "echo", v),
        "mkdir_p.path": lambda v: R.mkdir_p(v),
        "image_layers.image": lambda v: R.image_layers(v),
        "docker_pull.image": lambda v: R.docker_pull(v),
        "image_copy.image": lambda v: R.image_copy(v, "root@127.0.0.1"),
        "image_copy.user_host": lambda v: R.image_copy("vllm/vllm-openai:v0.17.0", v),
        "python_in_image.image": lambda v: R.python_in_image(v, "print(1)"),
        "python_in_image.program": lambda v: R.python_in_image("vllm/vllm-openai:v0.17.0", v),
        "ping_df.ip": lambda v: R.ping_df(v, 8972),
        "docker_run.name": lambda v: R.docker_run(v, "img:1", options=[]),
        "docker_run.image": lambda v: R.docker_run("c1", v, options=[]),
        "docker_run.args": lambda v: R.docker_run("c1", "img:1", options=[], args=["ray", "start", v]),
        "docker_run.env_value": lambda v: R.docker_run("c1", "img:1", options=[], env=[("NCCL_SOCKET_IFNAME", v)]),
        "docker_run.env_key": lambda v: R.docker_run("c1", "img:1", options=[], env=[(v, "1")]),
        "docker_run.mount_src": lambda v: R.docker_run("c1", "img:1", options=[], mounts=[(v, "/root/x")]),
        "docker_run.mount_dst": lambda v: R.docker_run("c1", "img:1", options=[], mounts=[(BENIGN_PATH, v)]),
        "docker_run.entrypoint": lambda v: R.docker_run("c1", "img:1", options=[], entrypoint=v),
        "docker_exec.container": lambda v: R.docker_exec(v, ["true"]),
        "docker_exec.argv": lambda v: R.docker_exec("c1", ["sh", "-c", "echo \"$0\"", v]),
        "docker_exec.env_value": lambda v: R.docker_exec("c1", ["true"], env=[("VLLM_HOST_IP", v)]),
        "docker_exec.env_key": lambda v: R.docker_exec("c1", ["true"], env=[(v, "1")]),
        "docker_state.name": lambda v: R.docker_state(v),
        "docker_rm_force.name": lambda v: R.docker_rm_force("c1", v),
        "http_get.url": lambda v: R.http_get(v),
        "http_post_json.url": lambda v: R.http_post_json(v, "{}"),
        "http_post_json.body": lambda v: R.http_post_json("http://127.0.0.1:8000/v1/chat/completions", v),
        "serve_in_container.container": lambda v: R.serve_in_container(v, ["vllm", "serve", "m/x"], BENIGN_PATH + "/l"),
        "serve_in_container.argv": lambda v: R.serve_in_container("c1", ["vllm", "serve", v], BENIGN_PATH + "/l"),
        "serve_in_container.log": lambda v: R.serve_in_container("c1", ["vllm", "serve", "m/x"], v),
        "serve_in_container.env": lambda v: R.serve_in_container("c1", ["vllm"], BENIGN_PATH + "/l", env=[("K", v)]),
        "JobFiles.under.name": lambda v: R.detached(BENIGN_PATH, R.JobFiles.under(BENIGN_PATH, v), R.command("true")),
        "detached.job_dir": lambda v: R.detached(v, job, R.command("true")),
        "detached.inner": lambda v: R.detached(BENIGN_PATH, job, R.command("echo", v)),
        "with_env.value": lambda v: R.with_env([("HF_HOME", v)], R.command("true")),
        "with_env.key": lambda v: R.with_env([(v, "1")], R.command("true")),
        "command.argv": lambda v: R.command("echo", v),
        "sectioned.section": lambda v: R.sectioned([("s", R.command("echo", v))]),
        "sectioned.name": lambda v: R.sectioned([(v, "true")]),
        "and_then": lambda v: R.and_then(R.command("true"), R.command("echo", v)),
        "piped": lambda v: R.piped(R.command("echo", v), R.command("cat")),
        "write_in_container.text": lambda v: R.write_in_container("c1", BENIGN_PATH + "/f.json", v),
        "write_in_container.path": lambda v: R.write_in_container("c1", v, "[]"),
        "write_in_container.container": lambda v: R.write_in_container(v, BENIGN_PATH + "/f.json", "[]"),
        "hf_download_in_image.image": lambda v: R.hf_download_in_image(v, "a/b", BENIGN_PATH, (1000, 1000), "d1"),
        "hf_download_in_image.model": lambda v: R.hf_download_in_image("img:1", v, BENIGN_PATH, None, "d1"),
        "hf_download_in_image.hf_dir": lambda v: R.hf_download_in_image("img:1", "a/b", v, None, "d1"),
        "hf_download_in_image.name": lambda v: R.hf_download_in_image("img:1", "a/b", BENIGN_PATH, None, v),
        "uvx_hf_download.model": lambda v: R.uvx_hf_download(v),
        "evict_page_cache.hub_dir": lambda v: R.evict_page_cache(v),
        "hub_file.model": lambda v: R.hub_file(v, "config.json"),
        "hub_file.filename": lambda v: R.hub_file("Qwen/Qwen3.5-122B-A10B-FP8", v),
        "drop_caches_rule.user": lambda v: R.command("echo", R.drop_caches_rule(v)),
        "stream_copy.download_rc": lambda v: R.stream_copy(rs, R.JobFiles(BENIGN_PATH + "/l", v, BENIGN_PATH + "/p"),
                                                           every_s=0),
        "stream_copy.download_pid": lambda v: R.stream_copy(rs, R.JobFiles(BENIGN_PATH + "/l", BENIGN_PATH + "/r", v),
                                                            every_s=0),
        "job_check.pid": lambda v: R.job_check(R.JobFiles(BENIGN_PATH + "/l", BENIGN_PATH + "/r", v)),
        "stream_copy.rsync_dest": lambda v: R.stream_copy(R.rsync_dir(BENIGN_PATH, "root@127.0.0.1", v),
                                                        R.JobFiles.under(BENIGN_PATH, "done"), 0),
        # the served endpoint's API key (issue 23, item 15)
        "api_key_path.home": lambda v: R.command("cat", R.api_key_path(v)),
        "make_api_key.path": lambda v: R.make_api_key(v),
        "with_key_from_file.path": lambda v: R.with_key_from_file(R.docker_run("c1", "img:1", options=[]), v),
        "with_key_from_file.args": lambda v: R.with_key_from_file(R.docker_run("c1", "img:1", options=[], args=[v]),
                                                                  BENIGN_PATH + "/key"),
        "with_key_from_file.name": lambda v: R.with_key_from_file(R.docker_run("c1", "img:1", options=[]),
                                                                  BENIGN_PATH + "/key", name=v),
        "http_get_keyed.url": lambda v: R.http_get_keyed(v, BENIGN_PATH + "/key"),
        "http_get_keyed.key_file": lambda v: R.http_get_keyed("http://127.0.0.1:8000/v1/models", v),
        "http_post_json_keyed.body": lambda v: R.http_post_json_keyed("http://127.0.0.1:8000/v1/chat/completions", v,
                                                                      BENIGN_PATH + "/key"),
        "http_post_json_keyed.key_file": lambda v: R.http_post_json_keyed("http://127.0.0.1:8000/v1/x", "{}", v),
        "http_status.url": lambda v: R.http_status(v),
        # engines found on their own (issue 24, item 1): a port is a number or nothing
        "metrics_probe.port": lambda v: R.metrics_probe(v),  # type: ignore[arg-type]
        # issue 24, item 4: the benchmark's commands
        "vllm_bench_serve.container": lambda v: R.vllm_bench_serve(v, 8000, "m", "o/m", **_BENCH),
        "vllm_bench_serve.served": lambda v: R.vllm_bench_serve("c1", 8000, v, "o/m", **_BENCH),
        "vllm_bench_serve.tokenizer": lambda v: R.vllm_bench_serve("c1", 8000, "m", v, **_BENCH),
        "vllm_bench_serve.result_dir": lambda v: R.vllm_bench_serve(
            "c1", 8000, "m", "o/m", **{**_BENCH, "result_dir": v}),
        "vllm_bench_serve.result_filename": lambda v: R.vllm_bench_serve(
            "c1", 8000, "m", "o/m", **{**_BENCH, "result_filename": v}),
        "vllm_bench_serve.key_file": lambda v: R.vllm_bench_serve("c1", 8000, "m", "o/m", **_BENCH, key_file=v),
        "llama_benchy.served": lambda v: R.llama_benchy(8000, v, [1, 2], 16, 8),
        "llama_benchy.tokenizer": lambda v: R.llama_benchy(8000, "m", [1], 16, 8, tokenizer=v),
    }


# Stand-ins for the tools: nothing real happens, but what a node would hand to a shell again is.
STUBS = {
    "docker": 'while [ $# -gt 0 ]; do if [ "$1" = sh ] && [ "$2" = -c ]; then shift 2; exec sh -c "$@"; fi; shift; '
              'done; exit 0',
    "ssh": 'for a; do last=$a; done; exec sh -c "$last"',  # the remote command, as the remote shell reads it
    "setsid": 'exec "$@"', "nohup": 'exec "$@"',
    **{t: "exit 0" for t in ("rsync", "hf", "curl", "sudo", "systemctl", "journalctl", "ping", "vllm", "ray",
                             "python3", "sleep", "uvx", "dd")},
}


@pytest.fixture
def canary_run(tmp_path: Path):
    """``(commands, canaries_dir, prefix)``: every command the builders accept for every hostile
    value, each value with its own canary path; ``prefix`` puts the stand-ins first on PATH."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in STUBS.items():
        p = stubs / name
        p.write_text(f"#!/bin/sh\n{body}\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    canaries = tmp_path / "canary"
    canaries.mkdir()
    Path(BENIGN_PATH).mkdir(exist_ok=True)
    (Path(BENIGN_PATH) / "done.rc").write_text("0\n")  # the download stream_copy waits for has ended
    built: list[tuple[str, str, str]] = []  # (builder, value, shell text)
    refused: list[tuple[str, str, str]] = []
    k = 0
    for name, build in _builders().items():
        for raw in HOSTILE:
            k += 1
            value = raw.format(c=canaries / f"{k}-{name}")
            try:
                text = command_text(build(value))  # what a transport sends (it refuses a NUL byte)
            except ValidationError as exc:
                refused.append((name, value, str(exc)))
                continue
            built.append((name, value, text))
    prefix = f"PATH={shlex.quote(str(stubs))}:$PATH; export PATH; cd {shlex.quote(str(tmp_path))}; "
    return built, refused, canaries, prefix


def _check(canaries: Path, built: list, refused: list, where: str) -> None:
    made = sorted(p.name for p in canaries.iterdir())
    assert not made, f"{where}: injected: {made[:10]}"
    for name, value, msg in refused:
        assert "\n" not in msg and "\r" not in msg and msg.strip(), (name, value, msg)
    print(f"\n{where}: {len(built) + len(refused)} hostile inputs into {len(_builders())} builder arguments: "
          f"{len(refused)} refused (one line each), {len(built)} built and run, 0 canaries")


async def _settle(canaries: Path) -> None:
    await asyncio.sleep(0.5)  # detached commands (… & echo $!) finish in the background


async def test_hostile_values_never_run_through_local_sh(canary_run) -> None:
    built, refused, canaries, prefix = canary_run
    assert built and refused
    sem = asyncio.Semaphore(4)

    async def one(text: str) -> None:
        async with sem:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", prefix + text, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    await asyncio.gather(*(one(t) for _n, _v, t in built))
    await _settle(canaries)
    _check(canaries, built, refused, "local /bin/sh")


@pytest.mark.sshd
async def test_hostile_values_never_run_through_a_real_openssh_node(canary_run, sshd: LabSshd) -> None:
    """The same commands on a real node: sent over a kept asyncssh connection to a real sshd, where
    each is read by ``$SHELL -c`` (root's bash) exactly as sshd hands an exec request to it, 64 to
    an exec channel. A command costs ~95 ms in an ssh session here (3 ms under a local sh), so the
    real node gets the first 3 accepted values of every builder argument (the local test runs all)."""
    built, refused, canaries, prefix = canary_run
    per_arg: dict[str, int] = {}
    built = [b for b in built if per_arg.setdefault(b[0], 0) < 3 and not per_arg.__setitem__(b[0], per_arg[b[0]] + 1)]
    transport = SshTransport(sshd.node_config("hostile"))
    sem = asyncio.Semaphore(6)
    results = []

    async def batch(texts: list[str]) -> None:
        script = "".join(f"bash -c {shlex.quote(prefix + t)} </dev/null >/dev/null 2>&1; echo ran\n" for t in texts)
        async with sem:
            results.append((len(texts), await transport.run("sh -s", timeout=60, input=script)))

    texts = [t for _n, _v, t in built]
    try:
        await asyncio.gather(*(batch(texts[i:i + 64]) for i in range(0, len(texts), 64)))
    finally:
        await transport.close()
    assert all(r.ok and r.stdout.count("ran") == n for n, r in results), [r.stderr for _n, r in results][:3]
    await _settle(canaries)
    _check(canaries, built, refused, "real OpenSSH, bash (3 accepted values per argument)")


def test_hostile_node_names_and_hosts_in_the_inventory_are_one_line_errors(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    bad = 0
    for raw in HOSTILE:
        value = raw.format(c=canary)
        for key in ("name", "host"):
            node = {"name": "spark-1", "host": "127.0.0.1", key: value}
            toml = "[[nodes]]\n" + "".join(f"{k} = {_toml_str(v)}\n" for k, v in node.items())
            try:
                parse_config(toml)
            except ConfigError as exc:
                bad += 1
                assert "\n" not in exc.message and exc.message.strip()
                continue
            raise AssertionError(f"{key}={value!r} was accepted")
    assert bad == 2 * len(HOSTILE) and not canary.exists()


def _toml_str(v: str) -> str:
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}" for c in v) + '"'


@pytest.mark.sshd
async def test_a_nul_byte_is_refused_before_it_can_drop_the_nodes_connection(sshd: LabSshd) -> None:
    """A NUL in an exec request made OpenSSH drop the connection, and every channel of the node with
    it (the probe, a followed log): found by the run above. Now it is a one-line error and the
    connection stays."""
    transport = SshTransport(sshd.node_config("nul"))
    try:
        assert (await transport.run("echo up")).stdout == "up\n"
        follower = await transport.open_process("cat")
        with pytest.raises(ValidationError) as exc:
            await transport.run(R.command("echo", "a\x00b"))
        assert "NUL" in exc.value.message and "\n" not in exc.value.message
        assert (await transport.run("echo still")).stdout == "still\n"
        await follower.write_line("the other channel lives")
        assert await follower.read_line() == "the other channel lives"
        await follower.close()
        assert sshd.accepted_logins() == 1  # never re-dialled
    finally:
        await transport.close()
