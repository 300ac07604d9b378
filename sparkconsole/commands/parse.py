"""`sparkconsole parse KIND FILE|-`: run one of the console's own parsers on a saved output.

Prints exactly one JSON object with exactly the keys of the contract in ARCHITECTURE.md, so
other tools can rely on it. Any text, however odd, gives exit 0 and what could be read (nulls,
empty lists); a file that cannot be read (missing, a directory, binary, not UTF-8) is a one-line
error and exit 2.

Kinds beyond the contract table (documented as extras, same rules): ``ib-ports`` (grep -H of
/sys/class/infiniband port files), ``ip-addr`` (``ip -j addr`` or ``ip addr``/``ip link`` text),
``docker-stats`` (``docker stats --no-stream --format '{{json .}}'``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkconsole.errors import UserError
from sparkconsole.logs.follow import json_safe
from sparkconsole.probe import parsers as p

GPU_KEYS = ("index", "name", "temperature_c", "power_w", "power_limit_w", "memory_used_mib",
            "memory_total_mib", "utilization_pct", "pstate")
PROCESS_KEYS = ("gpu", "pid", "type", "name", "memory_mib")
MEMINFO_KEYS = ("mem_total_bytes", "mem_available_bytes", "mem_free_bytes", "cached_bytes",
                "buffers_bytes", "swap_total_bytes", "swap_free_bytes")
LINK_KEYS = ("rdma_device", "port", "netdev", "state")
CONTAINER_KEYS = ("id", "name", "image", "state", "status")
RAY_KEYS = ("active_nodes", "pending_nodes", "cpus_total", "cpus_used", "gpus_total", "gpus_used")
IB_PORT_KEYS = ("rdma_device", "port", "state", "rate_gbps")
INTERFACE_KEYS = ("name", "ifindex", "mtu", "operstate", "carrier", "mac", "ipv4")


def _pick(obj: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for k in keys:
        v = getattr(obj, k, None)
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


def _nvidia_smi(text: str) -> dict[str, Any]:
    t = p.parse_nvidia_smi_table(text)
    return {
        "driver_version": t.driver_version,
        "cuda_version": t.cuda_version,
        "gpus": [_pick(g, GPU_KEYS) for g in t.gpus],
        "processes": [_pick(pr, PROCESS_KEYS) for pr in t.processes],
    }


def _nvidia_smi_csv(text: str) -> dict[str, Any]:
    return {"rows": [dict(r) for r in p.parse_nvidia_smi_csv(text).rows]}


def _meminfo(text: str) -> dict[str, Any]:
    return _pick(p.parse_meminfo(text), MEMINFO_KEYS)


def _ibdev2netdev(text: str) -> dict[str, Any]:
    return {"links": [_pick(link, LINK_KEYS) for link in p.parse_ibdev2netdev(text)]}


def _docker_ps(text: str) -> dict[str, Any]:
    return {"containers": [_pick(c, CONTAINER_KEYS) for c in p.parse_docker_ps(text)]}


def _ray_status(text: str) -> dict[str, Any]:
    return _pick(p.parse_ray_status(text), RAY_KEYS)


def _vllm_log(text: str) -> dict[str, Any]:
    # vLLM's own reader of its log, taken from the engine as every other caller takes it. Imported
    # here: the log readers are larger modules, and the other kinds must not depend on them.
    from sparkconsole.serving.engines import VLLM

    tracker = VLLM.log_tracker()
    tracker.feed_text(text)
    return dict(tracker.report.contract_dict())


def _vllm_metrics(text: str) -> dict[str, Any]:
    # Imported here, like the log parser: only this kind needs prometheus_client's parser.
    from sparkconsole.serving.metrics import contract_dict, parse_metrics

    return contract_dict(parse_metrics(text))


def _ib_ports(text: str) -> dict[str, Any]:
    return {"ports": [_pick(pt, IB_PORT_KEYS) for pt in p.parse_ib_ports(text)]}


def _ip_addr(text: str) -> dict[str, Any]:
    return {"interfaces": [_pick(i, INTERFACE_KEYS) for i in p.parse_ip_addr(text)]}


def _docker_stats(text: str) -> dict[str, Any]:
    stats = p.parse_docker_stats(text)
    return {"containers": [
        {"name": name, "cpu_pct": cpu, "mem_used_bytes": used, "mem_limit_bytes": limit}
        for name, (cpu, used, limit) in stats.items()
    ]}


#: The contract's kinds, in the order of its table.
KINDS: dict[str, Callable[[str], dict[str, Any]]] = {
    "nvidia-smi": _nvidia_smi,
    "nvidia-smi-csv": _nvidia_smi_csv,
    "meminfo": _meminfo,
    "ibdev2netdev": _ibdev2netdev,
    "docker-ps": _docker_ps,
    "ray-status": _ray_status,
    "vllm-log": _vllm_log,
    "vllm-metrics": _vllm_metrics,
}
#: Extras, same rules, not in the contract table.
EXTRA_KINDS: dict[str, Callable[[str], dict[str, Any]]] = {
    "ib-ports": _ib_ports,
    "ip-addr": _ip_addr,
    "docker-stats": _docker_stats,
}
ALL_KINDS = {**KINDS, **EXTRA_KINDS}


def add_parser(subs: argparse._SubParsersAction) -> None:
    p_ = subs.add_parser(
        "parse",
        help="parse a saved command output with the console's own parsers; prints one JSON object",
        description="Parse the output of one command (as saved to FILE, or '-' for stdin) with the "
        "parsers the console uses, and print one JSON object. Kinds of the contract: "
        + ", ".join(KINDS) + ". Extras: " + ", ".join(EXTRA_KINDS) + ".",
    )
    p_.add_argument("kind", metavar="KIND", choices=list(ALL_KINDS), help="one of: " + ", ".join(ALL_KINDS))
    p_.add_argument("file", metavar="FILE", help="the saved output, or - for stdin")
    p_.set_defaults(func=run)


def read_text(name: str) -> str:
    """The file's text, or a :class:`UserError` (exit 2) saying in one line why it cannot be read."""
    try:
        if name == "-":
            data = sys.stdin.buffer.read()
            where = "stdin"
        else:
            path = Path(name)
            where = name
            if path.is_dir():
                raise UserError(f"{name}: is a directory, not a file")
            data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{name}: no such file") from None
    except PermissionError:
        raise UserError(f"{name}: permission denied") from None
    except IsADirectoryError:
        raise UserError(f"{name}: is a directory, not a file") from None
    except OSError as exc:
        raise UserError(f"{name}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if b"\x00" in data:
        raise UserError(f"{where}: not a text file (it holds NUL bytes)")
    try:
        return data.decode("utf-8-sig")  # a BOM is not part of the output
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}: not UTF-8 text (bad byte at offset {exc.start})") from None


def run(args: argparse.Namespace) -> int:
    text = read_text(args.file)
    result = ALL_KINDS[args.kind](text)
    # the parsed values are the saved output's own words: ESC and the other C0 controls come out as
    # \u escapes (json.dumps), DEL, C1 and lone surrogates too (json_safe): nothing a terminal acts on
    print(json_safe(json.dumps(result, ensure_ascii=False)))
    return 0
