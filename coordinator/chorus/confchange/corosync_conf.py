"""Corosync's node list in ``corosync.conf``, read and rewritten as text (no I/O).

``chorus node add`` / ``remove`` on a host change the ``nodelist`` block (one ``node`` block
added or removed) and, if the file sets ``quorum.expected_votes``, that number with it; the rest
of the file, comments included, stays as it was. The same file and the same change give the same
text on every host, so the hosts can rewrite their own copy or receive one copy.

Corosync 3 (Debian 12) takes a changed node list at run time: ``corosync-cfgtool -R`` makes every
running Corosync of the cluster read its file again (knet adds or drops the links), and
votequorum counts the new node list's votes (``corosync-quorumtool -s`` shows them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


class CorosyncConfError(Exception):
    """The file cannot be read as a node list, or the change cannot be made."""


@dataclass(frozen=True)
class CorosyncNode:
    nodeid: int
    name: str
    address: str  # ring0_addr


_BLOCK_OPEN = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*\{\s*(#.*)?$")
_BLOCK_CLOSE = re.compile(r"^\s*\}\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*:\s*(.*?)\s*(#.*)?$")


@dataclass
class _Block:
    name: str
    start: int  # line of "name {"
    end: int = -1  # line of its "}"
    parent: Optional["_Block"] = None


def _blocks(lines: list[str]) -> list[_Block]:
    """Every block of the file, with its first and last lines."""
    out: list[_Block] = []
    stack: list[_Block] = []
    for i, line in enumerate(lines):
        if line.strip().startswith("#") or not line.strip():
            continue
        m = _BLOCK_OPEN.match(line)
        if m:
            b = _Block(m.group(1), i, parent=stack[-1] if stack else None)
            stack.append(b)
            out.append(b)
        elif _BLOCK_CLOSE.match(line):
            if not stack:
                raise CorosyncConfError(f"line {i + 1}: '}}' closes no block")
            stack.pop().end = i
    if stack:
        raise CorosyncConfError(f"block {stack[-1].name} (line {stack[-1].start + 1}) is not closed")
    return out


def _keys(lines: list[str], b: _Block) -> dict[str, tuple[int, str]]:
    """The block's own keys (not its sub-blocks'): key -> (line, value)."""
    out: dict[str, tuple[int, str]] = {}
    depth = 0
    for i in range(b.start + 1, b.end):
        line = lines[i]
        if _BLOCK_OPEN.match(line):
            depth += 1
        elif _BLOCK_CLOSE.match(line):
            depth -= 1
        elif depth == 0:
            m = _KEY.match(line)
            if m:
                out[m.group(1)] = (i, m.group(2))
    return out


def _nodelist(lines: list[str]) -> tuple[_Block, list[tuple[_Block, CorosyncNode]]]:
    blocks = _blocks(lines)
    lists = [b for b in blocks if b.name == "nodelist" and b.parent is None]
    if len(lists) != 1:
        raise CorosyncConfError("the file must have one top-level nodelist block "
                                f"(it has {len(lists)}): Chorus changes the node list only there")
    nodelist = lists[0]
    nodes: list[tuple[_Block, CorosyncNode]] = []
    for b in blocks:
        if b.parent is not nodelist:
            continue
        if b.name != "node":
            raise CorosyncConfError(f"line {b.start + 1}: nodelist holds a {b.name} block")
        k = _keys(lines, b)
        if "nodeid" not in k or not k["nodeid"][1].isdigit():
            raise CorosyncConfError(f"line {b.start + 1}: a node without a numeric nodeid")
        address = k.get("ring0_addr", (0, ""))[1]
        nodes.append((b, CorosyncNode(int(k["nodeid"][1]), k.get("name", (0, ""))[1], address)))
    return nodelist, nodes


def read_nodes(text: str) -> list[CorosyncNode]:
    """The nodes of the file's node list, in its order."""
    return [n for _, n in _nodelist(text.splitlines())[1]]


def _expected_votes(lines: list[str], count: int) -> None:
    """Set quorum.expected_votes to ``count`` if the file sets it (else votequorum counts the
    node list's votes itself)."""
    for b in _blocks(lines):
        if b.name == "quorum" and b.parent is None:
            k = _keys(lines, b)
            if "expected_votes" in k:
                i = k["expected_votes"][0]
                indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
                lines[i] = f"{indent}expected_votes: {count}"


def add_node(text: str, node: CorosyncNode) -> str:
    """``text`` with ``node`` added at the end of the node list. Refused (nothing changed) if its
    name, address or node id is taken, or one is missing."""
    lines = text.splitlines()
    nodelist, nodes = _nodelist(lines)
    if not node.name or not node.address:
        raise CorosyncConfError("a node needs a name and an address")
    if not 0 < node.nodeid < 2 ** 32:
        raise CorosyncConfError(f"node id {node.nodeid} is not 1 to 4294967295")
    for _, n in nodes:
        for what in ("name", "address", "nodeid"):
            if getattr(n, what) == getattr(node, what):
                raise CorosyncConfError(f"the node list has {what} {getattr(node, what)} already "
                                        f"(node {n.name or n.nodeid})")
    inner = "  "
    if nodes:
        first = lines[nodes[0][0].start]
        inner = first[:len(first) - len(first.lstrip())]
    outer = lines[nodelist.start][:len(lines[nodelist.start]) - len(lines[nodelist.start].lstrip())]
    step = inner[len(outer):] or "  "
    block = [f"{inner}node {{", f"{inner}{step}name: {node.name}", f"{inner}{step}nodeid: {node.nodeid}",
             f"{inner}{step}ring0_addr: {node.address}", f"{inner}}}"]
    lines[nodelist.end:nodelist.end] = block
    _expected_votes(lines, len(nodes) + 1)
    return "\n".join(lines) + "\n"


def remove_node(text: str, name: str) -> str:
    """``text`` without node ``name`` (its name, or its ring0 address). Refused if no node has it,
    or it is the last one."""
    lines = text.splitlines()
    _, nodes = _nodelist(lines)
    found = [(b, n) for b, n in nodes if name in (n.name, n.address)]
    if not found:
        raise CorosyncConfError(f"the node list has no node {name} (it has "
                                f"{', '.join(n.name or str(n.nodeid) for _, n in nodes) or 'none'})")
    if len(nodes) == 1:
        raise CorosyncConfError(f"{name} is the last node of the node list")
    b, _ = found[0]
    del lines[b.start:b.end + 1]
    _expected_votes(lines, len(nodes) - 1)
    return "\n".join(lines) + "\n"


def next_nodeid(text: str) -> int:
    """One above the highest node id of the list."""
    return max((n.nodeid for n in read_nodes(text)), default=0) + 1


def tie_breaker(text: str) -> str:
    """The node id whose half wins an even split with this file (corosync.bus._tie_breaker's rule
    read from the text): "" without ``quorum.auto_tie_breaker: 1``."""
    lines = text.splitlines()
    ids = [n.nodeid for n in read_nodes(text)]
    for b in _blocks(lines):
        if b.name == "quorum" and b.parent is None:
            k = _keys(lines, b)
            if k.get("auto_tie_breaker", (0, "0"))[1] != "1" or not ids:
                return ""
            rule = k.get("auto_tie_breaker_node", (0, "lowest"))[1] or "lowest"
            if rule == "lowest":
                return str(min(ids))
            if rule == "highest":
                return str(max(ids))
            first = rule.split()[0]
            return first if first.isdigit() else ""
    return ""
