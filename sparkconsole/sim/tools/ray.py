"""Ray: ``ray start --head`` / ``--address=HEAD:6379`` (a member shows in ``ray status`` 2-5 s
after its ``start`` returns), ``ray status`` (Ray 2.x autoscaler format, GPUs counted) and
``ray stop``. Ray is modelled on the host as well as in containers (both see the same cluster).

Token authentication, as the field's Ray does it (docs.ray.io ray-security/token-auth.html and
ray-core/internals/token-authentication.html): from Ray 2.52.0; ``RAY_AUTH_MODE`` (``disabled`` |
``token``) switches it and must be the same on every node; with ``token`` the token is
``RAY_AUTH_TOKEN``, else the first line of the file ``RAY_AUTH_TOKEN_PATH`` names (whitespace trimmed;
unreadable or empty is fatal), else ``~/.ray/auth_token``. Ray 2.61 turns it on by default for every
cluster ("Ray 2.59 enables token authentication by default for local clusters, and Ray 2.61 extends it to
all clusters", docs.ray.io banner): here a Ray of 2.61 or newer with ``RAY_AUTH_MODE`` unset is in token
mode; ``ray start --head`` is no local ``ray.init()``, so 2.59's default for local clusters does not
apply to it. A Ray older than 2.52 ignores the variables. A head in token mode keeps its token; a member
or ``ray status`` without the same one is refused with Ray's own text (below).
"""

from __future__ import annotations

from sparkconsole.sim import formats as F
from sparkconsole.sim.container import container_env, container_fs
from sparkconsole.sim.model import IMAGES, RayCluster, RayMember, stable_hex, stable_int
from sparkconsole.sim.sh.interp import IO
from sparkconsole.sim.tools.common import _norm_image, _opt_val
from sparkconsole.sim.vfs import FsError

RAY_AUTH_SINCE = (2, 52)  # "Token authentication is available in Ray 2.52.0 or later" (token-auth.html)
RAY_AUTH_DEFAULT_SINCE = (2, 61)  # token mode by default for all clusters (docs.ray.io banner)

# Ray's texts (ray-project/ray python/ray/_private/authentication/authentication_constants.py)
_TOKEN_SETUP_INSTRUCTIONS = ("Please provide an authentication token using one of these methods:\n"
                             "  1. Set the RAY_AUTH_TOKEN environment variable\n"
                             "  2. Set the RAY_AUTH_TOKEN_PATH environment variable (pointing to a token file)\n"
                             "  3. Create a token file at the default location: ~/.ray/auth_token")
# token mode on, no token anywhere: what `ray start` raises before it starts anything
# (authentication_token_setup.ensure_token_if_auth_enabled raises AuthenticationError with it)
RAY_NO_TOKEN = ("ray.exceptions.AuthenticationError: Token authentication is enabled but no authentication "
                "token was found. " + _TOKEN_SETUP_INSTRUCTIONS + "\n")
# the cluster wants a token and the caller sent none (HTTP_REQUEST_MISSING_TOKEN_ERROR_MESSAGE, Ray's 401)
RAY_MISSING_TOKEN = ("The Ray cluster requires authentication, but no token was provided.\n\n"
                     + _TOKEN_SETUP_INSTRUCTIONS + "\n")
# the caller sent another token (HTTP_REQUEST_INVALID_TOKEN_ERROR_MESSAGE, Ray's 403)
RAY_INVALID_TOKEN = ("The authentication token you provided is invalid or incorrect.\n\n"
                     + _TOKEN_SETUP_INSTRUCTIONS + "\n")


def _version(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def ray_auth(version: str, env: dict[str, str], fs) -> tuple[bool, str | None, str | None]:
    """(token mode on, the token, the error) of a Ray process of ``version`` started with ``env``,
    its files ``fs``. A Ray without the feature (older than 2.52, or none: "") is never in token mode."""
    v = _version(version) if version else ()
    if not v or v < RAY_AUTH_SINCE:
        return False, None, None
    mode = env.get("RAY_AUTH_MODE")
    on = mode.lower() == "token" if mode is not None else v >= RAY_AUTH_DEFAULT_SINCE
    if not on:
        return False, None, None
    if env.get("RAY_AUTH_TOKEN"):
        return True, env["RAY_AUTH_TOKEN"].strip(), None
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path:  # the file's first line, trimmed; unreadable or empty is fatal (authentication_token_loader.cc)
        try:
            text = fs.read_text(path)
        except FsError:  # absent, a folder, unreadable: Ray cannot open it either
            text = ""
        token = (text.splitlines() or [""])[0].strip()
        if not token:
            return True, None, ("ray.exceptions.AuthenticationError: RAY_AUTH_TOKEN_PATH is set but file cannot be "
                                f"opened or is empty: {path}\n")
        return True, token, None
    home = env.get("HOME") or "/root"
    try:
        token = (fs.read_text(f"{home}/.ray/auth_token").splitlines() or [""])[0].strip()
    except FsError:
        token = ""
    return (True, token, None) if token else (True, None, RAY_NO_TOKEN)


class RayTools:
    """Mixin: the ``ray`` CLI."""

    # ---- ray ---------------------------------------------------------------------------------

    async def c_ray(self, argv: list[str], io: IO, container: str | None = None) -> int:
        container = container or (self.container.name if getattr(self, "container", None) else None)
        sub = argv[1] if len(argv) > 1 else ""
        if sub == "status":
            addr = _opt_val(argv, "--address", None)
            members = self.cluster.ray_members()
            here = any(m.node == self.node_name for m in members)
            if self.cluster.ray is None or (not here and addr is None):
                io.err("ConnectionError: Could not find any running Ray instance. Please specify the one to connect "
                       "to by setting `--address` flag or `RAY_ADDRESS` environment variable.\n")
                return 1
            if addr is not None and addr != self.cluster.ray.address:
                io.err("ConnectionError: ray client connection timeout\n")
                return 1
            refused = self._ray_refused(*self._ray_auth_here(io.env, container))
            if refused:
                io.err(refused)
                return 1
            await self.clock.sleep(0.8)
            io.out(F.ray_status(self.cluster, self.now()))
            return 0
        if sub == "start":
            err, text = self._ray_start(argv[2:], self.now(), container=container, env=io.env)
            if err:
                io.err(err)
                return 1
            io.out(text)
            if "--block" in argv:
                while True:
                    await self.clock.sleep(3600)
            return 0
        if sub == "stop":
            ray = self.cluster.ray
            n = 0
            if ray is not None and self.node_name in ray.members:
                m = ray.members.pop(self.node_name)
                n = 7 if m.head else 4
                if m.head:
                    self.cluster.ray = None
            io.out(f"Stopped all {n} Ray processes.\n" if n else "Did not find any active Ray processes.\n")
            return 0
        io.err(f"Usage: ray [OPTIONS] COMMAND [ARGS]...\nTry 'ray --help' for help.\n\nError: No such command '{sub}'.\n")
        return 2

    def _ray_auth_here(self, env: dict[str, str] | None, container: str | None) -> tuple[bool, str | None, str | None]:
        """:func:`ray_auth` of a Ray process here: in a container shell (``docker exec``) its image's Ray,
        ``env`` and files; for a container's main process (``docker run``: ``container`` named, no
        shell in it) the container's environment and files; on the host, no Ray of a known version."""
        ct = getattr(self, "container", None)
        if ct is None and container is not None:
            ct = self.cluster.container(self.node_name, container)
            if ct is not None:
                img = IMAGES.get(_norm_image(ct.image))
                return ray_auth(img.ray if img is not None else "", container_env(self.cluster, ct, img),
                                container_fs(self.cluster, ct, img))
        if ct is None:
            return ray_auth("", env or {}, self.fs)
        img = IMAGES.get(_norm_image(ct.image))
        return ray_auth(img.ray if img is not None else "", dict(env or {}), self.fs)

    def _ray_refused(self, on: bool, token: str | None, err: str | None) -> str | None:
        """Why the running cluster refuses a caller in mode ``on`` with ``token`` (None: it does not)."""
        if err:
            return err
        want = self.cluster.ray.token if self.cluster.ray is not None else None
        if want is None:
            return None  # a cluster without token mode takes anybody (a token sent along is not looked at)
        if not on or token is None:
            return RAY_MISSING_TOKEN
        return None if token == want else RAY_INVALID_TOKEN

    def _ray_start(self, args: list[str], t: float, container: str | None,
                   env: dict[str, str] | None = None) -> tuple[str | None, str]:
        head = "--head" in args
        on, token, auth_err = self._ray_auth_here(env, container)
        if auth_err:  # token mode without a readable token: Ray stops before it starts anything
            return auth_err, ""
        ip = _opt_val(args, "--node-ip-address", None) or self.node.lan_ip
        port = _opt_val(args, "--port", "6379")
        ray = self.cluster.ray
        if ray is not None and self.node_name in ray.members:
            return ("ConnectionError: Ray is trying to start at " + ip + ":" + port + ", but is already running at "
                    + ray.address + ". Please specify a different port using the `--port` flag of `ray start` "
                    "command.\n", "")
        nid = stable_hex(56, "raynode", self.node_name, t)
        if head:
            addr = f"{ip}:{port}"
            self.cluster.ray = RayCluster(addr, token=token if on else None)
            self.cluster.ray.members[self.node_name] = RayMember(
                self.node_name, nid, ip, t + 2.0, True, container,
                dashboard_host=_opt_val(args, "--dashboard-host", "127.0.0.1"))  # Ray's default: localhost
            return None, (
                "Usage stats collection is disabled.\n\nLocal node IP: " + ip + "\n\n"
                "--------------------\nRay runtime started.\n--------------------\n\nNext steps\n"
                "  To add another node to this Ray cluster, run\n"
                f"    ray start --address='{addr}'\n\n"
                "  To connect to this Ray cluster:\n    import ray\n    ray.init()\n\n"
                "  To terminate the Ray runtime, run\n    ray stop\n\n"
                "  To view the status of the cluster, use\n    ray status\n")
        addr = _opt_val(args, "--address", None)
        if addr is None:
            return ("ValueError: `--address` is required to join a cluster, or `--head` to start one.\n", "")
        addr = addr.strip("'\"")
        host = addr.split(":")[0]
        target = self.cluster.reachable(self.node, host)
        if ray is None or ray.address != addr or target is None:
            return (f"ConnectionError: Unable to connect to GCS (ray head) at {addr}. Check that (1) Ray with "
                    "matching version started successfully at the specified address, (2) this node can reach the "
                    "specified address, and (3) there is no firewall setting preventing access.\n", "")
        refused = self._ray_refused(on, token, None)
        if refused:  # the head's GCS turns the member away: no token, or another one
            return refused, ""
        join = t + 2.0 + stable_int(0, 300, self.node_name, t, "join") / 100.0  # GCS handshake, raylet start
        ray.members[self.node_name] = RayMember(self.node_name, nid, ip, join, False, container)
        return None, ("Local node IP: " + ip + "\n\n--------------------\nRay runtime started.\n--------------------\n\n"
                      "To terminate the Ray runtime, run\n  ray stop\n")
