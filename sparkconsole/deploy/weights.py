"""Weights on every node, checked against the Hub's own file list.

The Hub's tree API gives each file's size and, for large (LFS) files, its sha256 (``lfs.oid``).
A node's copy is read with ``find`` (sizes through the links, and the links that point nowhere)
and, where it matters, ``sha256sum``. Missing, wrong-size, wrong-hash and broken-link files are
reported apart (deploy-failures.md §1-3): "0 of 48 safetensors shards" after a "copy complete"
is exactly the case a size listing catches and a ``du`` does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkconsole.deploy.flow import Flow
    from sparkconsole.deploy.recon import NodeFacts


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str | None  # for LFS files


def parse_tree(text: str) -> list[HubFile]:
    """The Hub tree API's JSON (``/api/models/REPO/tree/REV?recursive=true``); [] when unreadable."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    out = []
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict) or item.get("type") != "file":
            continue
        lfs = item.get("lfs") if isinstance(item.get("lfs"), dict) else None
        try:
            size = int((lfs or {}).get("size", item.get("size")))
        except (TypeError, ValueError):
            continue
        out.append(HubFile(str(item.get("path")), size, str(lfs["oid"]) if lfs and lfs.get("oid") else None))
    return out


def parse_sizes(text: str) -> dict[str, int]:
    """``find -L DIR -type f -printf '%s %P\\n'``: relative path → bytes."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        size, _, path = line.strip().partition(" ")
        if size.isdigit() and path:
            out[path] = int(size)
    return out


def parse_sha256sum(text: str) -> dict[str, str]:
    """``sha256sum FILE…``: file name (as given) → hex digest."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and len(parts[0]) == 64:
            out[parts[1].lstrip("*")] = parts[0]
    return out


@dataclass
class Verdict:
    """One node's copy against the Hub's list."""

    node: str
    total: int = 0
    ok: int = 0
    missing: list[str] = field(default_factory=list)
    wrong_size: list[str] = field(default_factory=list)
    wrong_hash: list[str] = field(default_factory=list)
    broken_links: list[str] = field(default_factory=list)
    bytes_present: int = 0
    bytes_total: int = 0

    @property
    def complete(self) -> bool:
        return not (self.missing or self.wrong_size or self.wrong_hash or self.broken_links) and self.total > 0

    def summary(self) -> str:
        if self.complete:
            return f"{self.ok}/{self.total} files, {self.bytes_total / 1e9:.1f} GB verified"
        parts = [f"{self.ok}/{self.total} files good"]
        for name, items in (("missing", self.missing), ("wrong size", self.wrong_size),
                            ("wrong sha256", self.wrong_hash), ("broken links", self.broken_links)):
            if items:
                parts.append(f"{len(items)} {name} (e.g. {items[0]})")
        return ", ".join(parts)


def compare(node: str, hub: list[HubFile], sizes: dict[str, int], broken: list[str],
            hashes: dict[str, str] | None = None) -> Verdict:
    """Check a node's listing (paths relative to the snapshot) against the Hub's files."""
    v = Verdict(node=node, total=len(hub), bytes_total=sum(f.size for f in hub))
    broken_set = {b.strip() for b in broken if b.strip()}
    v.broken_links = sorted(broken_set)
    for f in hub:
        if f.path in broken_set:
            continue
        have = sizes.get(f.path)
        if have is None:
            v.missing.append(f.path)
            continue
        v.bytes_present += min(have, f.size)
        if have != f.size:
            v.wrong_size.append(f.path)
            continue
        if hashes is not None and f.sha256 and hashes.get(f.path) not in (None, f.sha256):
            v.wrong_hash.append(f.path)
            continue
        v.ok += 1
    return v


# ---- the port a peer's ssh dials (the copies: rsync, docker save | ssh, the network step's check) ----

def peer_ssh_port(facts: NodeFacts, dialled: int | None) -> int | None:
    """The port another node's ssh must dial to reach this node's sshd over the fast link (None:
    22). Before, the copies always dialled 22, so a node whose sshd listens elsewhere was never
    reached. The console's own port (``dialled``: the inventory's, else the ssh config's) is the
    sshd's when recon saw the node listen on it; where it did not, that port is a forward on the
    way (a NAT, a gateway, the demo's simulator) and the node's own sshd is the one ``ss`` names
    (root sees the names), else 22. Listeners not read: the console's port is the best evidence."""
    if not dialled or dialled == 22:
        return None
    if not facts.listeners or any(x.port == dialled for x in facts.listeners):
        return dialled
    sshd = sorted(x.port for x in facts.listeners if x.process == "sshd")
    return None if not sshd or 22 in sshd else sshd[0]


def peer_port(flow: Flow, node: str) -> int | None:
    """:func:`peer_ssh_port` of ``node`` in ``flow``: the port its transport dialled (the ssh
    config's Port counts), else the inventory's."""
    dialled = getattr(flow.runner.transports.get(node), "target_port", None) or flow.runner.config.node(node).port
    return peer_ssh_port(flow.fact(node), dialled)
