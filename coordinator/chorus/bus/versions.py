"""The cluster's bus protocol version (rolling upgrades), without I/O.

Each coordinator speaks a range of bus protocol versions (bus/proto.py: ``MIN_VERSION`` ..
``VERSION``) and says so in its GID request; the answer to a request carries the cluster's version
and every member's range. The **cluster version** is the highest version every member of the
primary component speaks. Every node sends at it and reads every version it speaks. It is decided
only where membership is, in the total order, so every node decides alike:

- a node asking to join that does not speak the cluster's version is not admitted (every node
  alike: the answer leaves it out) and stays out with an error naming both ranges;
- when a member leaves (or is dropped, or asks to join again after an upgrade), and when one is
  admitted, the version is computed again from the members' ranges; it only moves up there;
- a node that bootstraps opens its cluster at the highest version it speaks; one that re-forms a
  cluster at the highest version every node that asked in the view speaks.

A member that said nothing of its versions (a release before version 4) speaks 3 only
(``proto.LEGACY``).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

from chorus.bus import proto as bp


def agreed(ranges: Iterable[bp.RangeT]) -> Optional[int]:
    """The highest version every range includes (None: no version is common to them all)."""
    ranges = list(ranges)
    if not ranges:
        return None
    hi = min(r[1] for r in ranges)
    return hi if hi >= max(r[0] for r in ranges) else None


def describe(members: Mapping[str, bp.RangeT]) -> str:
    return ", ".join(f"{n} {lo}..{hi}" for n, (lo, hi) in sorted(members.items())) or "none"


def refusal(node: str, speaks: bp.RangeT, version: int, members: Mapping[str, bp.RangeT]) -> Optional[str]:
    """Why ``node``, speaking ``speaks``, cannot join a cluster at ``version`` (None: it can)."""
    if speaks[0] <= version <= speaks[1]:
        return None
    what = "an older" if speaks[1] < version else "a newer"
    return (f"node {node} speaks bus protocol versions {speaks[0]}..{speaks[1]}, the cluster runs version "
            f"{version} (its members speak: {describe(members)}): {what} release than the cluster's cannot join "
            "it; upgrade (or downgrade) this node to a release that speaks version "
            f"{version} (docs/DEPLOY.md section 8)")


def moved(version: int, members: Mapping[str, bp.RangeT]) -> int:
    """The cluster version after a membership change: computed again from the members' ranges,
    never lower than it was (a member that cannot speak it was not admitted)."""
    v = agreed(members.values())
    return max(version, v) if v is not None else version
