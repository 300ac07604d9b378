"""Network tools: ``ibdev2netdev``, ``ip``, ``ethtool``, ``ping`` (iputils: ``-c -W -M do -s``,
the path MTU, link down, lost node), ``ssh`` (to a node by name or address, ``-o BatchMode``,
``ConnectTimeout``), ``ss -ltnp`` (who holds each listening port) and ``curl`` (a local or remote
vLLM server's ``/health``, ``/v1/models``, ``/v1/chat/completions``, ``/metrics``
(:mod:`~sparkconsole.sim.vllm_metrics`); the Hub's model and tree API on a node with internet; ``-s -S -f -o -w '%{http_code}' --max-time --max-filesize``; a chat completion
takes prefill plus its tokens at the model's decode rate of sim time, :func:`~sparkconsole.sim.
vllm_logs.chat_seconds`, when it is alone on the engine; under load it ends when the engine's
scheduler model says (:func:`~sparkconsole.sim.vllm_metrics.chat_started`: a queue, a bigger batch,
a preemption)).
"""

from __future__ import annotations

import ipaddress
import json
import re

from sparkconsole.sim import formats as F
from sparkconsole.sim import vllm_logs, vllm_metrics
from sparkconsole.sim.hostile import hostile_page
from sparkconsole.sim.model import (
    HUB_CONFIGS,
    LAN_RSYNC_BPS,
    MODELS,
    LogLine,
    SimNode,
    planner_spec,
    repo_files,
    repo_revision,
    stable_int,
)
from sparkconsole.sim.sh.interp import IO
from sparkconsole.sim.tools.common import _opt_val, _ssh_target, _ssh_user
from sparkconsole.sim.vfs import FsError

# servers the simulated containers run that listen by themselves, with their defaults when argv says
# nothing: SGLang's ServerArgs host "127.0.0.1", port 30000
_OWN_LISTEN = {"sglang": ("127.0.0.1", "30000")}

HUB = "huggingface.co"


class NetTools:
    """Mixin: the network tools of a node's shell."""

    async def c_ibdev2netdev(self, argv: list[str], io: IO) -> int:
        io.out(F.ibdev2netdev(self.cluster, self.node_name))
        return 0

    async def c_ip(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        js = "-j" in args or "-json" in args
        br = "-br" in args or "-brief" in args
        family = "inet" if "-4" in args else "inet6" if "-6" in args else None
        args = [a for a in args if not a.startswith("-")]
        obj = args[0] if args else ""
        if obj in ("a", "addr", "address"):
            if js:
                io.out(F.ip_j_addr(self.cluster, self.node_name, family))
                return 0
            only = None
            if len(args) >= 3 and args[1] in ("show", "s", "dev"):
                only = args[-1]
            text, rc = (F.ip_br_addr if br else F.ip_addr)(self.cluster, self.node_name, only, family)
            (io.out if rc == 0 else io.err)(text)
            return rc
        if obj in ("l", "link"):
            if br:
                io.out(F.ip_br_link(self.cluster, self.node_name))
                return 0
            text, rc = F.ip_addr(self.cluster, self.node_name, args[-1] if len(args) >= 3 else None)
            io.out("".join(ln + "\n" for ln in text.splitlines() if not ln.startswith(("    inet", "       valid"))))
            return rc
        io.err(f'Object "{obj}" is unknown, try "ip help".\n')
        return 255

    async def c_ethtool(self, argv: list[str], io: IO) -> int:
        ifs = [a for a in argv[1:] if not a.startswith("-")]
        if not ifs:
            io.err("ethtool: bad command line argument(s)\n")
            return 1
        text, rc = F.ethtool(self.cluster, self.node_name, ifs[0])
        (io.out if rc == 0 else io.err)(text)
        return rc

    # ---- ping --------------------------------------------------------------------------------

    def _route_iface(self, ip: str):
        """The local interface whose subnet holds ``ip`` (a /24 of two-subnet, the 169.254/16 of
        IPv4LL), else the default route's (the LAN)."""
        try:
            dst = ipaddress.IPv4Address(ip)
        except ValueError:
            return self.node.iface("enP7s7")
        for i in self.node.ifaces:
            if i.kind != "loopback" and any(dst in ipaddress.IPv4Interface(a).network for a in i.ipv4):
                return i
        return self.node.iface("enP7s7")

    async def c_ping(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        count, wait, size, df = 0, 10.0, 56, False
        targets: list[str] = []
        i = 0
        while i < len(args):
            a = args[i]
            if a in ("-c", "-W", "-s", "-M", "-i", "-I", "-w", "-t"):
                if i + 1 >= len(args):
                    io.err(f"ping: option requires an argument -- '{a[1]}'\n")
                    return 2
                v = args[i + 1]
                try:
                    if a == "-c":
                        count = int(v)
                    elif a == "-W":
                        wait = float(v)
                    elif a == "-s":
                        size = int(v)
                    elif a == "-M":
                        df = v == "do"
                except ValueError:
                    io.err(f"ping: invalid argument: '{v}'\n")
                    return 1
                i += 2
                continue
            if a.startswith("-") and a not in ("-q", "-n", "-4"):
                io.err(f"ping: invalid option -- '{a[1:]}'\n")
                return 2
            if not a.startswith("-"):
                targets.append(a)
            i += 1
        if not targets:
            io.err("ping: usage error: Destination address required\n")
            return 1
        ip = targets[-1]
        if not re.fullmatch(r"\d+\.\d+\.\d+\.\d+", ip):
            n = self.cluster.nodes.get(ip)
            if n is None:
                io.err(f"ping: {ip}: Temporary failure in name resolution\n")
                return 2
            ip = n.lan_ip
        n_pk = count or 4
        local = ip in self.node.ips()
        dst = self.node if local else self.cluster.reachable(self.node, ip)
        out_if = self._route_iface(ip)
        mtu_here = self.node.mtu_of(out_if) if out_if is not None else 1500
        link_down = out_if is not None and out_if.kind == "cx7" and not self.node.link_up(out_if)
        mtu_there = 65536
        if dst is not None and not local:
            far = next((x for x in dst.ifaces if any(a.split("/")[0] == ip for a in x.ipv4)), None)
            mtu_there = dst.mtu_of(far) if far is not None else 1500
        io.out(f"PING {ip} ({ip}) {size}({size + 28}) bytes of data.\n")
        ok = errors = 0
        rtts: list[float] = []
        for k in range(n_pk):
            if k:
                await self.clock.sleep(1.0)
            if df and size + 28 > mtu_here and not local:
                io.out(f"ping: local error: message too long, mtu={mtu_here}\n")
                errors += 1
                continue
            if link_down:
                if k % 3 == 2 or k == n_pk - 1:
                    src = out_if.ipv4[0].split("/")[0] if out_if and out_if.ipv4 else self.node.lan_ip
                    for j in range(k - k % 3, k + 1):
                        io.out(f"From {src} icmp_seq={j + 1} Destination Host Unreachable\n")
                        errors += 1
                continue
            if dst is None or (size + 28 > mtu_there and not local):
                continue
            fast = ip in (dst.fast_ip, dst.fast_ip2)
            ms = (0.031 if local else 0.112 if fast else 0.286) + 0.05 * (
                stable_int(0, 1000, self.node_name, ip, k, round(self.now())) / 1000) + size / 2.5e6
            rtts.append(ms)
            io.out(f"{size + 8} bytes from {ip}: icmp_seq={k + 1} ttl=64 time={ms:.3f} ms\n")
            ok += 1
        if not ok and dst is None and not link_down and not errors:
            await self.clock.sleep(wait)
        loss = 100 - ok * 100 // max(n_pk, 1)
        err_s = f", +{errors} errors" if errors else ""
        elapsed = (n_pk - 1) * 1000 + stable_int(2, 60, self.node_name, ip, "t")
        io.out(f"\n--- {ip} ping statistics ---\n{n_pk} packets transmitted, {ok} received{err_s}, {loss}% packet "
               f"loss, time {elapsed}ms\n")
        if ok:
            avg = sum(rtts) / len(rtts)
            mdev = (sum((r - avg) ** 2 for r in rtts) / len(rtts)) ** 0.5
            io.out(f"rtt min/avg/max/mdev = {min(rtts):.3f}/{avg:.3f}/{max(rtts):.3f}/{mdev:.3f} ms\n")
            return 0
        return 1

    # ---- ssh ---------------------------------------------------------------------------------

    def _resolve(self, host: str) -> SimNode | None:
        host = host.split("@")[-1]
        if host in self.cluster.nodes:
            n = self.cluster.nodes[host]
            return None if n.lost(self.now()) else n
        if host in self.node.ips() or host in ("localhost", self.node_name):
            return self.node
        return self.cluster.reachable(self.node, host)

    def ssh_refusal(self, dst: SimNode, user: str | None, host: str) -> str | None:
        """What ssh prints (stderr, exit 255) when ``dst``'s sshd refuses ``user`` (None: the user
        this shell runs as), else None. A stock node takes its login user's key only: Ubuntu's sshd
        has ``PermitRootLogin prohibit-password`` and root has no key from the peer, so
        ``root@PEER`` fails as OpenSSH says it [real-dgx-os.md "The login user"]; NVIDIA's playbooks
        exchange keys for ``$USER@peer`` [dgx-spark-playbooks connect-two-sparks]. The permissive
        twin takes anyone, as before."""
        unknown = self.host_key_refusal(dst, host)
        if unknown is not None:
            return unknown
        user = user or self.account.user  # type: ignore[attr-defined]
        if self.cluster.permissive or user == self.cluster.login(dst.name).user:
            return None
        return f"{user}@{host}: Permission denied (publickey).\r\n"

    def host_key_refusal(self, dst: SimNode, host: str, port: int | None = None) -> str | None:
        """What OpenSSH prints before any login when the peer's host key is not in this user's
        ``~/.ssh/known_hosts`` under the name it was dialled by (``HOST``, ``[HOST]:PORT`` off port
        22, a hashed ``|1|SALT|HASH`` name too): with BatchMode there is no one to ask, so ssh says
        "Host key verification failed." and exits 255 (sshconnect.c, check_host_key); a known name
        with another key gets the "REMOTE HOST IDENTIFICATION HAS CHANGED" warning first. Checked
        in the ``new-keys`` scenario, where the nodes never ssh'd to each other over the fast link;
        the others model nodes whose known_hosts already hold their peers' keys. ``port`` None
        (rsync's and docker's ssh): either form of the name is taken."""
        if self.cluster.scenario != "new-keys" or dst is self.node:
            return None
        want = F.ssh_host_key(self.cluster, dst.name).split()[:2]
        path = f"{self.account.home.rstrip('/')}/.ssh/known_hosts"  # type: ignore[attr-defined]
        try:
            text = self.fs.read_text(path)  # type: ignore[attr-defined]
        except FsError:
            text = ""
        seen = False
        for line in text.splitlines()[:10_000]:
            words = line.split()
            if len(words) < 3 or words[0].startswith("#") or words[0].startswith("@"):
                continue
            if not any(_known_name(n, host, port) for n in words[0].split(",")):
                continue
            if words[1:3] == want:
                return None
            seen = seen or words[1] == want[0]
        if seen:
            return ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\r\n"
                    "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\r\n"
                    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\r\n"
                    "Host key verification failed.\r\n")
        return "Host key verification failed.\r\n"

    async def c_ssh(self, argv: list[str], io: IO) -> int:
        from sparkconsole.sim.shell import Shell

        host, cmd = _ssh_target(argv[1:])
        if host is None:
            io.err("usage: ssh [-46AaCfGgKkMNnqsTtVvXxYy] [-B bind_interface] [-b bind_address]\n"
                   "           [-c cipher_spec] [-D [bind_address:]port] [-E log_file] [-e escape_char]\n"
                   "           [-F configfile] [-I pkcs11] [-i identity_file]\n"
                   "           [-J destination] [-L address] [-l login_name] [-m mac_spec]\n"
                   "           [-O ctl_cmd] [-o option] [-p port] [-Q query_option] [-R address]\n"
                   "           [-S ctl_path] [-W host:port] [-w local_tun[:remote_tun]]\n"
                   "           destination [command [argument ...]]\n")
            return 255
        timeout = 120.0
        for k, a in enumerate(argv):
            if a == "-o" and k + 1 < len(argv) and argv[k + 1].lower().startswith("connecttimeout="):
                timeout = float(argv[k + 1].split("=", 1)[1])
        h = host.split("@")[-1]
        dst = self._resolve(host)
        if dst is None:
            n = self.cluster.node_by_ip(h) or self.cluster.nodes.get(h)
            if n is None and not re.fullmatch(r"\d+\.\d+\.\d+\.\d+", h):
                io.err(f"ssh: Could not resolve hostname {h}: Temporary failure in name resolution\r\n")
            elif n is not None and n.lost(self.now()):
                await self.clock.sleep(timeout)
                io.err(f"ssh: connect to host {h} port 22: Connection timed out\r\n")
            else:
                await self.clock.sleep(3.0)
                io.err(f"ssh: connect to host {h} port 22: No route to host\r\n")
            return 255
        await self.clock.sleep(self.cluster.peer_ssh_s)
        port = _opt_val(argv[1:], "-p", "22")
        unknown = self.host_key_refusal(dst, h, int(port) if port.isdigit() else 22)
        refused = unknown or self.ssh_refusal(dst, _ssh_user(argv[1:], host)[0], h)
        if refused is not None:
            io.err(refused)
            return 255
        if io.stdin:  # what ssh carries to the far side, at the link's rate (the fast link's, or the LAN's)
            fast = h in (dst.fast_ip, dst.fast_ip2)
            await self.clock.sleep(len(io.stdin) / (self.cluster.fast_bps if fast else LAN_RSYNC_BPS))
        if not cmd:
            io.err("Pseudo-terminal will not be allocated because stdin is not a terminal.\r\n")
            return await Shell(self.cluster, dst.name).run(io.stdin or "", io.out, io.err, "")
        return await Shell(self.cluster, dst.name).run(" ".join(cmd), io.out, io.err, io.stdin)

    # ---- ss ----------------------------------------------------------------------------------

    def listeners(self) -> list[tuple[str, int, str, int]]:
        """(address, port, process name, pid) of every listening TCP socket on this node."""
        t = self.now()
        out = [("0.0.0.0", 22, "sshd", 1187), ("127.0.0.53%lo", 53, "systemd-resolve", 702),
               ("127.0.0.1", 11000, "dgx-dashboard", 2214)]
        for c in self.cluster.containers_on(self.node_name):
            if not c.running(t):
                continue
            e = c.engine
            if e is not None and not e.ended(t) and t >= e.started + 20.0:
                pid = stable_int(2000, 90000, c.id, "hostpid")
                out.append((e.host, e.port, "vllm" if "python" not in " ".join(c.argv[:2]) else "python3", pid))
            out.extend((addr, port, name, c.host_pid) for addr, port, name in c.listens)
            listen = _OWN_LISTEN.get(c.kind)
            if listen is not None:
                argv = list(c.argv)
                out.append((_opt_val(argv, "--host", listen[0]), int(_opt_val(argv, "--port", listen[1])), "python3",
                            stable_int(2000, 90000, c.id, "hostpid")))
        ray = self.cluster.ray
        if ray is not None:
            m = ray.members.get(self.node_name)
            if m is not None and m.head and m.since - 1.5 <= t:
                pid = stable_int(2000, 90000, self.node_name, "gcs", m.node_id)
                out.append(("0.0.0.0", int(ray.address.rsplit(":", 1)[1]), "gcs_server", pid))
                out.append((m.dashboard_host, 8265, "python3", pid + 41))
        out.extend(self.node.listens)  # a twin's listeners that no container owns
        return sorted(out, key=lambda r: r[1])

    async def c_ss(self, argv: list[str], io: IO) -> int:
        flags = "".join(a.lstrip("-") for a in argv[1:] if a.startswith("-") and not a.startswith("--"))
        if "l" not in flags or "t" not in flags:
            io.err("sparksim: only `ss -ltn[p]` (listening TCP sockets) is modelled\n")
            return 1
        procs = "p" in flags
        rows = [("State", "Recv-Q", "Send-Q", "Local Address:Port", "Peer Address:Port", "Process")]
        for addr, port, name, pid in self.listeners():
            rows.append(("LISTEN", "0", "4096" if port != 22 else "128", f"{addr}:{port}", "0.0.0.0:*",
                         f'users:(("{name}",pid={pid},fd={stable_int(3, 40, name, port)}))' if procs else ""))
        w_local = max(len(r[3]) for r in rows)
        w_peer = max(len(r[4]) for r in rows)
        for r in rows:
            if r[0] == "State":
                io.out(f"{'State':<6} {'Recv-Q':<6} {'Send-Q':<6} {'Local Address:Port':>{w_local}} "
                       f"{'Peer Address:Port':>{w_peer}}{'Process' if procs else ''}\n")
                continue
            io.out(f"{r[0]:<6} {r[1]:<6} {r[2]:<6} {r[3]:>{w_local}} {r[4]:>{w_peer}}    {r[5]}".rstrip() + "\n")
        return 0

    # ---- curl --------------------------------------------------------------------------------

    async def c_curl(self, argv: list[str], io: IO) -> int:
        value_opts = {"-o", "--output", "-w", "--write-out", "--max-time", "-m", "-X", "--request", "-H", "--header",
                      "-d", "--data", "--data-raw", "--data-binary", "--connect-timeout", "-u", "--user", "-A",
                      "--retry", "-x", "--stderr", "-r", "--range", "--max-filesize"}
        flags: set[str] = set()
        opts: dict[str, str] = {}
        headers: list[str] = []  # every -H, in order (``@-``: lines from stdin, ``@FILE``: from a file)
        urls: list[str] = []
        args = argv[1:]
        i = 0
        while i < len(args):
            a = args[i]
            if a.startswith("--"):
                k, eq, v = a.partition("=")
                if k in value_opts and not eq:
                    v = args[i + 1] if i + 1 < len(args) else ""
                    i += 1
                if k in value_opts:
                    opts[k] = v
                    if k == "--header":
                        headers.append(v)
                else:
                    flags.add(k)
            elif a.startswith("-") and len(a) > 1:
                j = 1
                while j < len(a):
                    f = "-" + a[j]
                    if f in value_opts:
                        v = a[j + 1:] or (args[i + 1] if i + 1 < len(args) else "")
                        if not a[j + 1:]:
                            i += 1
                        opts[f] = v
                        if f == "-H":
                            headers.append(v)
                        break
                    flags.add(f)
                    j += 1
            else:
                urls.append(a)
            i += 1
        if not urls:
            io.err("curl: no URL specified!\ncurl: try 'curl --help' or 'curl --manual' for more information\n")
            return 2
        if opts.get("--stderr") == "-":  # curl's own messages into the output stream, in order
            io = IO(io.out, io.out, io.stdin, io.env, io.proc)
        # several URLs: one transfer after the other, each with its own -w line; the exit code is the
        # last transfer's (curl 7.88 here: `curl -w … URL1 URL2`)
        rc = 0
        for url in urls:
            rc = await self._curl_one(url, io, flags, opts, headers, write_out_fmt=opts.get("-w", opts.get("--write-out")))
        return rc

    async def _curl_one(self, url: str, io: IO, flags: set[str], opts: dict[str, str], headers: list[str],
                        write_out_fmt: str | None) -> int:
        silent = "-s" in flags or "--silent" in flags
        show_err = "-S" in flags or "--show-error" in flags
        fail = "-f" in flags or "--fail" in flags
        data = next((opts[k] for k in ("-d", "--data", "--data-raw", "--data-binary") if k in opts), None)
        method = opts.get("-X", opts.get("--request")) or ("POST" if data is not None else "GET")
        output = opts.get("-o", opts.get("--output"))
        given = url
        url = url if "://" in url else "http://" + url  # no scheme: curl guesses http
        write_out = None if write_out_fmt is None else write_out_fmt.replace("%{url_effective}", url).replace(
            "%{url}", given)
        m = re.match(r"(https?)://([^/:]+)(?::(\d+))?(/[^?]*)?(\?.*)?$", url)
        if not m:
            io.err("curl: (3) URL rejected: Malformed input to a URL function\n")
            return 3
        scheme, host, port_s, path, query = m.group(1), m.group(2), m.group(3), m.group(4) or "/", m.group(5) or ""
        port = int(port_s or (443 if scheme == "https" else 80))
        sent: dict[str, str] = {}  # the request's headers by lower-case name (curl's -H, @- and @FILE read)
        for h in headers:
            if h.startswith("@"):
                src = h[1:]
                try:
                    lines = (io.stdin or "") if src == "-" else self.fs.read_text(src, self.cwd)
                except FsError:
                    io.err(f"Warning: Failed to open {src}\n")
                    return 26
            else:
                lines = h
            for line in lines.splitlines():
                name, colon, value = line.partition(":")
                if colon and name.strip():
                    sent[name.strip().lower()] = value.strip()

        def error(code: int, msg: str) -> int:
            # the message, then the -w line (a real curl 7.88 with --stderr -: "curl: (7) …" first)
            if not silent or show_err:
                io.err(f"curl: ({code}) {msg}\n")
            if write_out is not None:
                io.out(_write_out(write_out, 0))
            return code

        if host == HUB or host.endswith("." + HUB):
            if not self.node.internet:
                await self.clock.sleep(0.02)
                return error(6, f"Could not resolve host: {host}")
            await self.clock.sleep(0.18)
            rng = opts.get("-r", opts.get("--range"))
            ranged = _hub_range(path, rng) if rng else None
            if ranged is not None:  # a bounded read of a weight file (a rehearsal measuring the line)
                n = ranged
                await self.clock.sleep(n / self.cluster.internet_bps)
                if write_out is not None:
                    io.out(_write_out(write_out, 206).replace("%{size_download}", str(n)).replace(
                        "%{time_starttransfer}", "0.180000").replace("%{time_total}", f"{0.18 + n / self.cluster.internet_bps:.6f}"))
                return 0
            status, body = _hub_answer(path, query)
        else:
            mt = opts.get("--max-time", opts.get("-m"))
            try:
                max_time = float(mt) if mt else None
            except ValueError:
                max_time = None
            r = await self._curl_local(host, port, path, method, data, error, max_time, sent.get("authorization"))
            if isinstance(r, int):
                return r
            status, body = r
        if fail and status >= 400:
            return error(22, f"The requested URL returned error: {status}")
        if not isinstance(body, str):  # a page sent chunked, made as it is read (sim/hostile.py)
            return self._curl_stream(body, io, opts, output, write_out, status, error)
        if output is None or output == "-":
            io.out(body)
        elif output != "/dev/null":
            self.fs.write_text(output, body, self.cwd)
        if write_out is not None:
            io.out(_write_out(write_out, status))
        return 0

    def _curl_stream(self, body, io: IO, opts: dict[str, str], output: str | None, write_out: str | None,
                     status: int, error) -> int:
        """A body of unknown length (chunked: no Content-Length) written as it comes. ``--max-filesize``
        stops the transfer once the body passes it: curl 8.4.0 and later do so during the transfer ("Starting
        with curl 8.4.0, this option aborts the transfer if it reaches the threshold during transfer",
        https://curl.se/docs/manpage.html#--max-filesize), and a Spark's Ubuntu 24.04 has curl 8.5.0
        (https://packages.ubuntu.com/noble/curl). A reader that has what it wants (``head -c`` before it:
        the pipe is closed) ends the transfer too, as SIGPIPE does (curl's exit 23, a write error)."""
        limit = _size_arg(opts.get("--max-filesize"))
        chunks: list[str] = []
        if output is None or output == "-":
            sink = io.out
        elif output == "/dev/null":
            def sink(_s: str) -> None:
                return None
        else:
            sink = chunks.append
        got = 0
        for chunk in body:
            got += len(chunk.encode())
            if limit is not None and got > limit:
                if chunks:
                    self.fs.write_text(output, "".join(chunks), self.cwd)
                return error(63, "Maximum file size exceeded")
            sink(chunk)
            if getattr(sink, "closed", False):
                return 23
        if chunks:
            self.fs.write_text(output, "".join(chunks), self.cwd)
        if write_out is not None:
            io.out(_write_out(write_out, status))
        return 0

    async def _curl_local(self, host: str, port: int, path: str, method: str, data: str | None, error,
                          max_time: float | None = None, authorization: str | None = None):
        loopback = host in ("localhost", "127.0.0.1", "0.0.0.0")
        node = self.node if loopback else self._resolve(host)
        run = self.cluster.engine_on_port(node.name, port, self.now()) if node else None
        if run is not None and run.host.startswith("127.") and not (loopback and node is self.node):
            run = None  # bound to 127.0.0.1: nothing reaches it but this node's own loopback
        if run is None:
            return error(7, f"Failed to connect to {host} port {port} after 0 ms: Couldn't connect to server")
        if run.api_key and path.startswith("/v1") and method != "OPTIONS" and authorization != f"Bearer {run.api_key}":
            # vLLM's key check (vllm/entrypoints/openai/api_server.py): /v1 only; /health, /metrics and
            # /version answer anyone, and OPTIONS (CORS preflight) passes
            self._access_log(node.name, run, path, method, "401 Unauthorized")
            return 401, '{"error":"Unauthorized"}'
        if (path.startswith("/v1/") and method == "POST" and run.hung_at is not None and self.now() >= run.hung_at
                and run.failed_at is not None):
            # a TP worker is lost: the request waits on the hung collective until the engine dies
            await self.clock.sleep(max(0.0, run.failed_at - self.now()))
            return error(52, "Empty reply from server")
        created = int(self.clock.epoch())
        status = "200 OK"
        if path == "/health":
            body = ""
        elif path == "/v1/models":
            body = vllm_logs.models_json(run, created)
        elif path == "/version":
            body = '{"version":"' + run.version + '"}'
        elif path == "/metrics" and method == "GET":
            body = hostile_page(self.cluster, node.name, run, self.now()) or vllm_metrics.render(
                run, self.now(), self.clock.epoch(0.0))
        elif path == "/v1/chat/completions" and method == "POST":
            body, ok = vllm_logs.chat_json(run, data or "", created)
            status = "200 OK" if ok else "400 Bad Request"
            if ok:  # prefill, then one token after the other: the answer comes when the last is decoded
                took = vllm_logs.chat_seconds(run, body)
                t_sent = self.now()
                req = _count_chat(run, t_sent, body, data or "")
                # alone on the engine it ends ``took`` after it was sent; a queue, a bigger batch or a
                # preemption (other requests arriving meanwhile) moves its end later: wait on that
                wait = took if req.end - t_sent - took <= 1e-6 else req.end - t_sent  # from t_sent
                while True:
                    if max_time is not None and wait > max_time:
                        await self.clock.sleep(max_time - (self.now() - t_sent))
                        vllm_metrics.chat_aborted(run, req, self.now())
                        return error(28, f"Operation timed out after {int(max_time * 1000)} milliseconds with 0 "
                                         "bytes received")
                    await self.clock.sleep(wait - (self.now() - t_sent))
                    if req.end - self.now() <= 1e-6:
                        break
                    wait = req.end - t_sent
                if node is None or self.cluster.engine_on_port(node.name, port, self.now()) is not run:
                    return error(52, "Empty reply from server")
        else:
            body = '{"detail":"Not Found"}'
            status = "404 Not Found"
        self._access_log(node.name if node else self.node_name, run, path, method, status)
        return int(status.split()[0]), body

    def _access_log(self, node: str, run, path: str, method: str, status: str) -> None:
        for c in self.cluster.containers_on(node):
            if c.engine is run:
                c.log.append(LogLine(self.now(), vllm_logs.access_line(run, path, method, status)))


def _count_chat(run, t: float, answer: str, request: str):
    """Register a chat completion with the engine's ``/metrics`` (its tokens are the answer's
    ``usage``, so the counters rise by exactly what the client was told)."""
    usage = json.loads(answer).get("usage") or {}
    try:
        req = json.loads(request or "{}")
    except json.JSONDecodeError:
        req = {}
    mt = req.get("max_tokens", req.get("max_completion_tokens")) if isinstance(req, dict) else None
    msgs = req.get("messages") if isinstance(req, dict) else None
    return vllm_metrics.chat_started(run, t, int(usage.get("prompt_tokens") or 0),
                                     int(usage.get("completion_tokens") or 0),
                                     int(mt) if isinstance(mt, int) else None, json.dumps(msgs, sort_keys=True))


def _size_arg(value: str | None) -> int | None:
    """curl's size argument (``--max-filesize 16777216``, ``100K``, ``3m``, ``1G``) in bytes; None when
    absent or not a size."""
    m = re.fullmatch(r"(\d+)([kKmMgG]?)", value or "")
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}[m.group(2).lower()]


def _write_out(fmt: str, status: int) -> str:
    """curl's ``-w``: ``%{http_code}`` (``000`` without a response) and the escapes ``\\n``."""
    out = fmt.replace("%{http_code}", f"{status:03d}").replace("%{response_code}", f"{status:03d}")
    return out.replace("\\n", "\n").replace("\\t", "\t")


def _hub_range(path: str, rng: str) -> int | None:
    """``curl -r A-B`` of a file the Hub holds for a model of the catalogue: the bytes it sends (the
    range, cut at the file's end); None for anything else (answered as a whole request)."""
    r = re.match(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)$", path)
    m = re.fullmatch(r"(\d+)-(\d*)", rng)
    if not r or not m or r.group(1) not in MODELS:
        return None
    f = next((x for x in repo_files(MODELS[r.group(1)]) if x.path == r.group(2)), None)
    if f is None:
        return None
    lo, hi = int(m.group(1)), int(m.group(2)) if m.group(2) else f.size - 1
    return max(0, min(hi, f.size - 1) - lo + 1)


def _hub_answer(path: str, query: str) -> tuple[int, str]:
    """The Hub's answer to ``/api/models/REPO``, ``/api/models/REPO/tree/main?recursive=true`` and
    ``/REPO/resolve/REV/config.json`` (the model's config; the planner's bundled one, so a node can
    read a spec for the console). Other files by ``resolve``: 404 as the Hub answers a missing one."""
    r = re.match(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
    if r and r.group(1) in HUB_CONFIGS:  # a twin's own model: the config its rehearsal read
        if r.group(3) == "config.json":
            return 200, json.dumps(HUB_CONFIGS[r.group(1)])
        return 404, json.dumps({"error": "Entry not found"})
    if r:
        spec = planner_spec(r.group(1)) if r.group(1) in MODELS else None
        if spec is None:
            return 401 if r.group(1) not in MODELS else 404, json.dumps({"error": "Repository Not Found"})
        if r.group(3) == "config.json":
            return 200, json.dumps(dict(spec.config))
        return 404, json.dumps({"error": "Entry not found"})
    m = re.match(r"/api/models/([^/]+/[^/]+?)(?:/tree/([^/]+)(/.*)?)?/?$", path)
    if not m:
        return 404, "Not Found"
    repo, rev = m.group(1), m.group(2)
    spec = MODELS.get(repo)
    if spec is None:
        return 401, json.dumps({"error": "Invalid username or password."})
    files = repo_files(spec)
    sha = repo_revision(repo)
    if rev is None:
        return 200, json.dumps({
            "_id": sha[:24], "id": repo, "modelId": repo, "author": repo.split("/")[0], "sha": sha,
            "private": False, "gated": False, "disabled": False, "library_name": "transformers",
            "pipeline_tag": "image-text-to-text" if "ConditionalGeneration" in spec.architecture else "text-generation",
            "tags": ["transformers", "safetensors", "fp8" if "FP8" in repo else "bf16"],
            "config": {"architectures": [spec.architecture]},
            "siblings": [{"rfilename": f.path} for f in files],
            "usedStorage": spec.disk_bytes, "lastModified": "2026-02-24T10:31:07.000Z",
        }, separators=(",", ":"))
    entries = []
    for f in files:
        e: dict[str, object] = {"type": "file", "oid": f.git_oid, "size": f.size, "path": f.path}
        if f.lfs:
            e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 135 if f.size >= 10**10 else 134}
        entries.append(e)
    return 200, json.dumps(entries, separators=(",", ":"))


def _known_name(pattern: str, host: str, port: int | None) -> bool:
    """Whether one known_hosts name (``HOST``, ``[HOST]:PORT``, ``|1|SALT|HASH``) names ``host`` on
    ``port`` (None: any port), as OpenSSH matches it (hostfile.c; wildcards are not modelled)."""
    import base64
    import hashlib
    import hmac

    names = [host if port in (None, 22) else f"[{host}]:{port}"]
    if port is None:
        names.append(f"[{host}]:")
    if pattern.startswith("|1|"):
        try:
            _, _, salt, digest = pattern.split("|")
            key = base64.b64decode(salt)
            want = base64.b64decode(digest)
        except ValueError:
            return False
        return any(hmac.compare_digest(hmac.new(key, n.encode(), hashlib.sha1).digest(), want)
                   for n in names if not n.endswith(":"))
    return any(pattern == n or (n.endswith(":") and pattern.startswith(n)) for n in names)
