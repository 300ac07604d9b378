"""The simulated Spark behaves like stock DGX OS by default (issue 22), and like the old lenient twin
only under the ``permissive`` scenario.

Stock: the login user is ``nvidia`` (uid 1000, in ``sudo`` and ``docker``, as a real Spark's ``id``
prints it), ``sudo`` asks for a password (``sudo -n`` fails unless a NOPASSWD rule such as
sparkrun's ``tee /proc/sys/vm/drop_caches`` allows the exact command), the host has no ``hf``,
``huggingface-cli`` or ``uvx``, a peer's sshd takes only its login user (``root@PEER`` is
``Permission denied (publickey)``), and containers see the login user's cache at
``/root/.cache/huggingface`` through their bind mount. Every check goes through the sim's own
shell (or its SSH server), as the console would meet it; the texts are the real tools' (fixtures in
tests/fixtures/real/dgx-os/).
"""

from __future__ import annotations

import asyncssh
import pytest

from sparkconsole.sim import SimClock, build, start_demo_cluster
from sparkconsole.sim.model import model_dir
from tests.conftest import REAL, real_fixture
from tests.test_sim_model import sh
from tests.test_sim_shell import _connect

HEAD, WORKER = "spark-1a32", "spark-5be3"
EMBED = "Qwen/Qwen3-Embedding-0.6B"
RERANK = "Qwen/Qwen3-Reranker-0.6B"
HOME = "/home/nvidia"
HF = f"{HOME}/.cache/huggingface"
DROP_RULE = ("/usr/bin/tee", "/proc/sys/vm/drop_caches")  # sparkrun's sudoers.d rule [sparkrun scripts]

# sudo.ws's text (Ubuntu 24.04), the fixture's first line; sudo-rs (Ubuntu 25.10+) words it otherwise
PASSWORD_REQUIRED = real_fixture("dgx-os/sudo-n-password-required.txt").splitlines()[0] + "\n"
NO_TERMINAL = ("sudo: a terminal is required to read the password; either use the -S option to read from "
               "standard input or configure an askpass helper\n")
DOCKER_DENIED = "permission denied while trying to connect to the docker API at unix:///var/run/docker.sock\n"


def cluster(scenario: str = "story"):
    return build(scenario, clock=SimClock.frozen())


def peer(c) -> str:
    """The worker's address on the cabled port (the layout decides it: link-local on a stock node)."""
    return c.nodes[WORKER].fast_ip


def drops(c, node: str = HEAD) -> int:
    return len(c.nodes[node].drop_times)


def test_the_sudo_fixture_is_sudo_ws_text() -> None:
    assert PASSWORD_REQUIRED == "sudo: a password is required\n"
    assert "sudo: interactive authentication is required" in (REAL / "dgx-os/sudo-n-password-required.txt").read_text()


# ---- the login user ---------------------------------------------------------------------------------


async def test_stock_login_user_is_nvidia_like_the_real_capture() -> None:
    c = cluster()
    out, err, rc = await sh(c, HEAD, "id")
    real_id = next(ln for ln in (REAL / "dgx-os/stock-spark-id-ip.txt").read_text().splitlines()
                   if ln.startswith("uid="))
    assert rc == 0 and err == "" and out == real_id.replace("jhunt", "nvidia") + "\n"
    assert out.startswith("uid=1000(nvidia) gid=1000(nvidia) groups=1000(nvidia),4(adm),27(sudo),")
    assert out.rstrip().endswith(",988(docker)")
    out, _, rc = await sh(c, HEAD, "id -un; id -u; id -g; id -gn; id -G; id -Gn; whoami; id -u root; id nobody")
    assert rc == 1 and out == ("nvidia\n1000\n1000\nnvidia\n1000 4 27 29 30 46 100 122 988\n"
                               "nvidia adm sudo audio dip plugdev users lpadmin docker\nnvidia\n0\n")
    out, _, rc = await sh(c, HEAD, 'echo "$HOME" ~ "$USER" "$LOGNAME"; pwd; cd /tmp; cd; pwd; echo ~/x')
    assert rc == 0 and out == f"{HOME} {HOME} nvidia nvidia\n{HOME}\n{HOME}\n{HOME}/x\n"


async def test_permissive_login_is_root_as_before() -> None:
    c = cluster("permissive")
    out, _, rc = await sh(c, HEAD, 'id; id -un; whoami; echo "$HOME" ~; pwd')
    assert rc == 0 and out == "uid=0(root) gid=0(root) groups=0(root)\nroot\nroot\n/root /root\n/root\n"
    assert c.login(HEAD).home == "/root" and c.model_dir(HEAD, EMBED).startswith("/root/.cache/huggingface/hub/")


async def test_the_hf_cache_is_the_login_users() -> None:
    c = cluster()
    assert c.login(HEAD).user == "nvidia" and c.login(HEAD).hf_home == HF
    assert c.model_dir(HEAD, EMBED) == model_dir(EMBED, HOME) == f"{HF}/hub/models--Qwen--Qwen3-Embedding-0.6B"
    assert c.has_model(HEAD, EMBED) and c.has_model(WORKER, EMBED)
    out, _, rc = await sh(c, HEAD, "ls ~/.cache/huggingface/hub; test -s ~/.cache/huggingface/token && echo token; "
                                   "ls /root/.cache/huggingface")
    assert rc == 2 and "models--Qwen--Qwen3-Embedding-0.6B\n" in out and out.endswith("token\n")


# ---- sudo -------------------------------------------------------------------------------------------


async def test_stock_sudo_needs_a_password() -> None:
    c = cluster()
    assert await sh(c, HEAD, "sudo -n true") == ("", PASSWORD_REQUIRED, 1)
    assert await sh(c, HEAD, "sudo true") == ("", NO_TERMINAL + PASSWORD_REQUIRED, 1)
    assert await sh(c, HEAD, "sudo -n systemctl stop ollama") == ("", PASSWORD_REQUIRED, 1)
    assert await sh(c, HEAD, f"sudo -n -l {' '.join(DROP_RULE)}") == ("", PASSWORD_REQUIRED, 1)
    assert await sh(c, HEAD, "sudo -n -l") == ("", PASSWORD_REQUIRED, 1)
    before = drops(c)
    _, err, rc = await sh(c, HEAD, "sudo -n sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'")
    assert (err, rc) == (PASSWORD_REQUIRED, 1) and drops(c) == before


async def test_dropping_caches_as_the_login_user_is_permission_denied() -> None:
    c = cluster()
    before = drops(c)
    out, err, rc = await sh(c, HEAD, "echo 3 > /proc/sys/vm/drop_caches")
    assert rc != 0 and err == "sh: 1: cannot create /proc/sys/vm/drop_caches: Permission denied\n"
    out, err, rc = await sh(c, HEAD, "echo 3 | tee /proc/sys/vm/drop_caches")
    assert (out, err, rc) == ("3\n", "tee: /proc/sys/vm/drop_caches: Permission denied\n", 1)
    assert drops(c) == before


async def test_sparkruns_nopasswd_rule_allows_exactly_the_tee() -> None:
    c = cluster()
    c.nodes[HEAD].sudo_rules.append(DROP_RULE)
    assert await sh(c, HEAD, "sudo -n -l /usr/bin/tee /proc/sys/vm/drop_caches") == (
        "/usr/bin/tee /proc/sys/vm/drop_caches\n", "", 0)
    assert (await sh(c, HEAD, "sudo -n -l tee /proc/sys/vm/drop_caches"))[0] == "/usr/bin/tee /proc/sys/vm/drop_caches\n"
    out, _, rc = await sh(c, HEAD, "sudo -n -l")
    assert rc == 0 and "(root) NOPASSWD: /usr/bin/tee /proc/sys/vm/drop_caches" in out
    before = drops(c)
    assert await sh(c, HEAD, "sync; echo 3 | sudo -n /usr/bin/tee /proc/sys/vm/drop_caches > /dev/null") == ("", "", 0)
    assert drops(c) == before + 1
    # the rule is one command: anything else still needs the password
    for cmd in ("sudo -n true", "sudo -n -l true", "echo 3 | sudo -n /usr/bin/tee /tmp/x",
                "echo 3 | sudo -n /usr/bin/tee -a /proc/sys/vm/drop_caches",
                "sudo -n sh -c 'echo 3 > /proc/sys/vm/drop_caches'"):
        assert await sh(c, HEAD, cmd) == ("", PASSWORD_REQUIRED, 1), cmd
    assert drops(c) == before + 1
    assert await sh(c, WORKER, "echo 3 | sudo -n /usr/bin/tee /proc/sys/vm/drop_caches") == ("", PASSWORD_REQUIRED, 1)


async def test_a_sudo_all_rule_runs_commands_as_root() -> None:
    c = cluster()
    c.nodes[HEAD].sudo_rules.append(("ALL",))
    assert await sh(c, HEAD, "sudo -n true") == ("", "", 0)
    out, _, rc = await sh(c, HEAD, "sudo -n id; sudo -n sh -c 'echo $HOME $USER $SUDO_USER; id -un'; id -un")
    assert rc == 0 and out == "uid=0(root) gid=0(root) groups=0(root)\n/root root nvidia\nroot\nnvidia\n"
    before = drops(c)
    assert await sh(c, HEAD, "sudo -n sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'") == ("", "", 0)
    assert drops(c) == before + 1
    assert await sh(c, HEAD, "sudo -n frobnicate") == ("", "sudo: frobnicate: command not found\n", 1)


async def test_permissive_sudo_runs_anything() -> None:
    c = cluster("permissive")
    before = drops(c)
    assert await sh(c, HEAD, "sudo -n true && sudo true") == ("", "", 0)
    assert await sh(c, HEAD, "sudo -n sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'") == ("", "", 0)
    assert await sh(c, HEAD, "echo 3 | sudo -n /usr/bin/tee /proc/sys/vm/drop_caches") == ("3\n", "", 0)
    assert drops(c) == before + 2
    assert (await sh(c, HEAD, "sudo -n -l /usr/bin/tee /proc/sys/vm/drop_caches"))[2] == 0


# ---- tools on the host ------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", ["hf download Qwen/Qwen3-Embedding-0.6B", "hf auth whoami",
                                 "huggingface-cli download x", "uvx hf download x", "/usr/local/bin/hf version"])
async def test_stock_host_has_no_hf_or_uvx(cmd: str) -> None:
    c = cluster()
    name = cmd.split()[0]
    assert await sh(c, HEAD, cmd) == ("", f"sh: 1: {name}: not found\n", 127)


async def test_command_v_says_what_the_host_has() -> None:
    c = cluster()
    for tool in ("hf", "huggingface-cli", "uvx"):
        assert await sh(c, HEAD, f"command -v {tool}") == ("", "", 1), tool
        assert (await sh(c, HEAD, f"which {tool}"))[2] == 1
    out, _, rc = await sh(c, HEAD, "command -v rsync ping curl ss ssh docker sudo tee true")
    assert rc == 0 and out.split() == ["/usr/bin/rsync", "/usr/bin/ping", "/usr/bin/curl", "/usr/bin/ss",
                                       "/usr/bin/ssh", "/usr/bin/docker", "/usr/bin/sudo", "/usr/bin/tee",
                                       "/usr/bin/true"]
    p = cluster("permissive")
    assert await sh(p, HEAD, "command -v hf") == ("/usr/local/bin/hf\n", "", 0)
    out, _, rc = await sh(p, HEAD, "hf auth whoami")  # huggingface_hub's bold "user: " label
    assert rc == 0 and out.startswith("\x1b[1muser: \x1b[0m sparkops\n")
    assert await sh(p, WORKER, "hf auth whoami") == ("Not logged in\n", "", 0)
    assert (await sh(p, HEAD, "uvx hf"))[2] == 127


# ---- ssh, rsync and docker load between nodes -------------------------------------------------------


async def test_stock_peer_takes_only_its_login_user() -> None:
    c = cluster()
    ip = peer(c)
    denied = f"root@{ip}: Permission denied (publickey).\r\n"
    assert await sh(c, HEAD, f"ssh -o BatchMode=yes root@{ip} true") == ("", denied, 255)
    assert await sh(c, HEAD, f"ssh -l root {ip} true") == ("", denied, 255)
    for target in (f"nvidia@{ip}", ip, f"-l nvidia {ip}"):
        out, err, rc = await sh(c, HEAD, f"ssh -o BatchMode=yes {target} 'hostname; id -un; echo $HOME'")
        assert (out, err, rc) == (f"{WORKER}\nnvidia\n{HOME}\n", "", 0), target


async def test_permissive_peer_takes_root() -> None:
    c = cluster("permissive")
    out, err, rc = await sh(c, HEAD, f"ssh -o BatchMode=yes root@{peer(c)} 'hostname; id -un'")
    assert (out, err, rc) == (f"{WORKER}\nroot\n", "", 0)


async def test_rsync_to_root_at_a_stock_peer_fails_and_to_the_login_user_lands_in_its_home() -> None:
    c = cluster()
    ip = peer(c)
    src = c.model_dir(HEAD, RERANK)
    _, err, rc = await sh(c, HEAD, f"rsync -a -e 'ssh -o BatchMode=yes' {src} root@{ip}:.cache/huggingface/hub/")
    assert rc == 255 and err.startswith(f"root@{ip}: Permission denied (publickey).\r\n"
                                        "rsync: connection unexpectedly closed (0 bytes received so far) [sender]\n")
    assert not c.has_model(WORKER, RERANK)
    assert (await sh(c, HEAD, f"rsync -a -e ssh {src} {ip}:.cache/huggingface/hub/"))[2] == 0
    assert c.has_model(WORKER, RERANK) and c.fs(WORKER).exists(f"{HF}/hub/models--Qwen--Qwen3-Reranker-0.6B/refs/main")


async def test_docker_save_to_root_at_a_stock_peer_is_refused() -> None:
    c = cluster()
    ip = peer(c)
    img = "vllm/vllm-openai:v0.17.0"
    assert await sh(c, HEAD, f"docker save {img} | ssh root@{ip} docker load") == (
        "", f"root@{ip}: Permission denied (publickey).\r\n", 255)
    assert img not in c.images_on(WORKER)
    assert await sh(c, HEAD, f"docker save {img} | ssh -o BatchMode=yes nvidia@{ip} docker load") == (
        f"Loaded image: {img}\n", "", 0)
    assert img in c.images_on(WORKER)


# ---- docker access ----------------------------------------------------------------------------------


async def test_docker_without_the_docker_group_is_permission_denied() -> None:
    c = cluster()
    assert (await sh(c, WORKER, "docker ps -q"))[2] == 0  # a stock login is in the group
    c.nodes[WORKER].docker_group = False
    out, _, _ = await sh(c, WORKER, "id -Gn")
    assert "docker" not in out.split()
    assert await sh(c, WORKER, "docker ps") == ("", DOCKER_DENIED, 1)
    img = "vllm/vllm-openai:v0.17.0"
    _, err, rc = await sh(c, HEAD, f"docker save {img} | ssh {peer(c)} docker load")  # the far side's load
    assert (err, rc) == (DOCKER_DENIED, 1) and img not in c.images_on(WORKER)


# ---- containers: root inside, the login user's cache mounted ---------------------------------------


async def test_a_container_sees_the_login_users_cache_through_its_bind_mount() -> None:
    c = cluster()
    mount = f"-v {HF}:/root/.cache/huggingface"
    _, _, rc = await sh(c, HEAD, f"docker run -d --name box {mount} --entrypoint sleep vllm/vllm-openai:v0.17.0 infinity")
    assert rc == 0
    out, err, rc = await sh(c, HEAD, "docker exec box sh -c 'id -un; echo $HOME; mkdir -p /root/.cache/huggingface/"
                                     "sparkconsole/r1 && echo started > /root/.cache/huggingface/sparkconsole/r1/serve.log"
                                     " && ls /root/.cache/huggingface/hub'")
    assert rc == 0 and err == "" and out.startswith("root\n/root\n") and "models--Qwen--Qwen3-Embedding-0.6B\n" in out
    assert await sh(c, HEAD, "cat ~/.cache/huggingface/sparkconsole/r1/serve.log") == ("started\n", "", 0)
    assert not c.fs(HEAD).exists("/root/.cache/huggingface/sparkconsole")
    # hf is in the image: NVIDIA's playbooks download inside the container, into the mounted cache
    c.fs(HEAD).remove(c.model_dir(HEAD, EMBED), recursive=True)
    out, _, rc = await sh(c, HEAD, f"docker exec box hf download {EMBED}")
    assert rc == 0 and out.startswith("/root/.cache/huggingface/hub/models--Qwen--Qwen3-Embedding-0.6B/snapshots/")
    assert c.has_model(HEAD, EMBED)


async def test_an_offline_engine_finds_weights_only_through_the_mount() -> None:
    c = cluster()
    args = f"vllm/vllm-openai:v0.14.1 {EMBED} --gpu-memory-utilization 0.05 --runner pooling"
    await sh(c, WORKER, f"docker run -d --name e1 -v {HF}:/root/.cache/huggingface {args} --port 8011")
    await sh(c, WORKER, f"docker run -d --name e2 {args} --port 8012")  # no mount: an empty cache
    out, _, _ = await sh(c, WORKER, "sleep 200; docker ps -a --format '{{.Names}} {{.State}}'; docker logs e2 2>&1")
    assert "e1 running" in out and "e2 exited" in out
    assert "couldn't find them in the cached files" in out


async def test_permissive_containers_map_root_to_root() -> None:
    c = cluster("permissive")
    hf = "/root/.cache/huggingface"
    await sh(c, HEAD, f"docker run -d --name box -v {hf}:{hf} --entrypoint sleep vllm/vllm-openai:v0.17.0 infinity")
    assert (await sh(c, HEAD, f"docker exec box sh -c 'echo x > {hf}/f'; cat {hf}/f"))[0] == "x\n"


# ---- the SSH server: who the console logs in as -----------------------------------------------------


@pytest.mark.parametrize("scenario,user", [("story", "nvidia"), ("permissive", "root")])
async def test_the_demo_logs_in_as_the_login_user(scenario: str, user: str) -> None:
    async with start_demo_cluster(scenario=scenario, clock=SimClock.frozen()) as demo:
        node = demo.config.node(HEAD)
        assert node.user == user
        async with _connect(node) as conn:
            r = await conn.run("id -un; echo $HOME", check=False)
            assert r.stdout == f"{user}\n{'/root' if user == 'root' else HOME}\n"
        if scenario == "story":
            with pytest.raises(asyncssh.PermissionDenied):
                async with asyncssh.connect(node.host, port=node.port, username="root",
                                            client_keys=[node.identity], known_hosts=node.known_hosts):
                    pass


# ---- the page cache without root ------------------------------------------------------------------


async def test_a_copied_model_leaves_the_page_cache_by_dd_nocache_without_sudo() -> None:
    """What the caches step sends where sudo needs a password (``remote.evict_page_cache``): the
    model's pages go, the rest of the cache stays; as GNU dd does for anyone who may
    read the files (coreutils: ``dd if=FILE iflag=nocache count=0``)."""
    from sparkconsole.remote import evict_page_cache, rsync_dir

    c = cluster()
    src = model_dir(EMBED, HOME)
    before, dropped = c.memory(WORKER).cached, drops(c, WORKER)
    _out, err, rc = await sh(c, HEAD, rsync_dir(src, f"nvidia@{peer(c)}", src).shell())
    assert rc == 0, err
    grown = c.memory(WORKER).cached
    assert grown > before + 1e9  # the embeddings model's 1.2 GB sit in the worker's page cache
    _, err, rc = await sh(c, WORKER, "dd if=/etc/hostname of=/tmp/x")
    assert rc == 1 and "only `dd if=FILE iflag=nocache count=0" in err  # copies are not modelled
    _, err, rc = await sh(c, WORKER, evict_page_cache(f"{HF}/hub").shell())
    assert (rc, err) == (0, "")
    after = c.memory(WORKER).cached
    # the copy's pages went, and those the worker's embeddings engine read of the same files a day ago;
    # the rest of the cache stayed (nothing was dropped as a whole)
    assert after < grown - 1e9 and after <= before and after > 0.3e9 and drops(c, WORKER) == dropped
    _, err, rc = await sh(c, WORKER, "dd if=/nonexistent iflag=nocache count=0")
    assert rc == 1 and err == "dd: failed to open '/nonexistent': No such file or directory\n"


async def test_a_node_reads_a_models_config_from_the_hub_with_its_token_as_a_header() -> None:
    """What the wizard sends for a model it has not bundled (``remote.hub_file``): the token read by
    the node's shell and given to curl on stdin (``-H @-``); a file the repo lacks is curl's exit 22
    (``-f``), and a node without internet cannot resolve the Hub."""
    import json

    from sparkconsole.remote import hub_file

    c = cluster()
    out, err, rc = await sh(c, HEAD, hub_file("Qwen/Qwen3.5-122B-A10B-FP8", "config.json").shell())
    assert rc == 0, err
    assert "Qwen3_5MoeForConditionalGeneration" in json.loads(out)["architectures"]
    _, err, rc = await sh(c, HEAD, hub_file("Qwen/Qwen3.5-122B-A10B-FP8", "model.safetensors.index.json").shell())
    assert rc == 22 and "404" in err
    _, err, rc = await sh(c, WORKER, hub_file("Qwen/Qwen3.5-122B-A10B-FP8", "config.json").shell())
    assert rc == 6 and "Could not resolve host" in err
