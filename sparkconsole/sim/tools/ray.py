"""Ray: ``ray start --head`` / ``--address=HEAD:6379`` (a member shows in ``ray status`` 2-5 s
after its ``start`` returns), ``ray status`` (Ray 2.x autoscaler format, GPUs counted) and
``ray stop``. Ray is modelled on the host as well as in containers (both see the same cluster).
"""

from __future__ import annotations

from sparkconsole.sim import formats as F
from sparkconsole.sim.model import RayCluster, RayMember, stable_hex, stable_int
from sparkconsole.sim.sh.interp import IO
from sparkconsole.sim.tools.common import _opt_val


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
            await self.clock.sleep(0.8)
            io.out(F.ray_status(self.cluster, self.now()))
            return 0
        if sub == "start":
            err, text = self._ray_start(argv[2:], self.now(), container=container)
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

    def _ray_start(self, args: list[str], t: float, container: str | None) -> tuple[str | None, str]:
        head = "--head" in args
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
            self.cluster.ray = RayCluster(addr)
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
        join = t + 2.0 + stable_int(0, 300, self.node_name, t, "join") / 100.0  # GCS handshake, raylet start
        ray.members[self.node_name] = RayMember(self.node_name, nid, ip, join, False, container)
        return None, ("Local node IP: " + ip + "\n\n--------------------\nRay runtime started.\n--------------------\n\n"
                      "To terminate the Ray runtime, run\n  ray stop\n")
