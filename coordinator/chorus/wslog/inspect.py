"""Out-of-process inspection of a writeset log (``chorus log inspect/verify``): read-only,
tolerant of a writer appending or reusing files meanwhile."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import crc32c as _crc32c

from chorus.wslog.format import (DATA_START, FREE_HEADER, SEGMENT_HEAD, SEGMENT_HEADER_SIZE, SEGMENT_MAGIC, U32,
                                 LogCorrupt)
from chorus.wslog.scan import FoundSegment, analyze, describe, open_found, scan_records, segment_paths

# They read files a writer may be changing: they read again while what they find keeps changing.
_READ_ATTEMPTS = 5
_READ_PAUSE = 0.05

def inspect_segment(path: str) -> dict[str, Any]:
    """Everything about one segment file: header fields, records, where the valid data ends.

    Keys: ``file``, ``file_bytes``, ``header`` (the raw fields, or None for a free or short file),
    ``state`` (``segment``, ``free`` or ``bad header``), ``header_problem``, ``records`` (gid,
    origin, flags, size, offset, crc_ok, and for a piece of a record that spans segments
    ``piece``: total, offset, length; a record that fails its check is listed last with
    ``crc_ok`` false when its length could be read), ``record_count``, ``first_gid``,
    ``last_gid``, ``valid_end``, ``first_bad_offset`` and ``problem`` (None when clean), and
    ``unsettled`` (a writer kept changing the file while it was read).
    """
    result: dict[str, Any] = {}
    for attempt in range(_READ_ATTEMPTS):
        if attempt:
            time.sleep(_READ_PAUSE)
        previous, result = result, _inspect_once(path)
        if result["problem"] is None and not result["unsettled"]:
            break
        if previous and previous["problem"] == result["problem"] and not result["unsettled"]:
            break
    return result


def _inspect_once(path: str) -> dict[str, Any]:
    f = open_found(path, writable=False)
    if f is None:
        raise LogCorrupt(f"{path} does not exist")
    try:
        result: dict[str, Any] = {
            "file": path, "file_bytes": f.size, "header": _raw_header_fields(f.raw_header),
            "state": "free" if f.raw_header == FREE_HEADER else "bad header" if f.header is None else "segment",
            "header_problem": f.header_problem, "records": [], "record_count": 0, "first_gid": 0, "last_gid": 0,
            "valid_end": None, "first_bad_offset": None, "problem": None, "unsettled": False,
        }
        if f.header_problem is not None:
            result["first_bad_offset"] = 0
            result["problem"] = {"offset": 0, "kind": "header", "message": f.header_problem}
        if f.header is not None and f.mm is not None:
            scan = scan_records(f.mm, f.header, listing=True)
            result.update(records=scan.listing, record_count=scan.records, first_gid=scan.first_gid,
                          last_gid=scan.last_gid, valid_end=scan.end)
            if scan.problem is not None:
                result["first_bad_offset"] = scan.end
                result["problem"] = {"offset": scan.end, "kind": scan.problem.kind, "message": describe(scan.problem)}
        result["unsettled"] = os.pread(f.fd, SEGMENT_HEADER_SIZE, 0) != f.raw_header
        return result
    finally:
        f.close()


def _raw_header_fields(raw: bytes) -> Optional[dict[str, Any]]:
    if len(raw) < SEGMENT_HEADER_SIZE or raw == FREE_HEADER:
        return None
    magic, version, header_size, flags, seq, epoch, segment_bytes, prev_gid, first_gid = SEGMENT_HEAD.unpack_from(raw)
    (crc,) = U32.unpack_from(raw, SEGMENT_HEAD.size)
    return {"magic_ok": magic == SEGMENT_MAGIC, "version": version, "header_size": header_size, "flags": flags,
            "seq": seq, "epoch": epoch, "segment_bytes": segment_bytes, "prev_gid": prev_gid, "first_gid": first_gid,
            "crc_ok": crc == _crc32c.crc32c(raw[:SEGMENT_HEAD.size])}


def verify_directory(directory: str) -> dict[str, Any]:
    """Check every segment of a log directory without the writer.

    Keys: ``directory``, ``ok`` (no problem found), ``segments`` (one dict per file: the live ones
    in log order, then the others), ``problems`` (file, offset, kind, message), the totals
    ``segment_count``, ``live_segments``, ``records``, ``bytes``, ``low_gid``, ``high_gid``,
    ``base_gid``, and ``unsettled`` (a writer kept changing the files while they were read).
    Raises :class:`LogCorrupt` when ``directory`` is not a directory.
    """
    if not os.path.isdir(directory):
        raise LogCorrupt(f"{directory} is not a directory")
    result: dict[str, Any] = {}
    for attempt in range(_READ_ATTEMPTS):
        if attempt:
            time.sleep(_READ_PAUSE)
        previous, result = result, _verify_once(directory)
        if not result["problems"] and not result["unsettled"]:
            break
        if previous and previous["problems"] == result["problems"] and not result["unsettled"]:
            break
    return result


def _verify_once(directory: str) -> dict[str, Any]:
    found = [f for f in (open_found(p, writable=False) for p in segment_paths(directory)) if f is not None]
    changed: list[FoundSegment] = []
    try:
        for _ in range(3):
            for f in found:
                f.state, f.scan = "free", None
            an = analyze([f for f in found if f not in changed])
            # A file whose header changed while it was read was reused (or reset) by the writer:
            # what was read of it is no finding. Decide again without it.
            now = [f for f in found if f not in changed and os.pread(f.fd, SEGMENT_HEADER_SIZE, 0) != f.raw_header]
            if not now:
                break
            changed.extend(now)
    finally:
        for f in found:
            f.close()
    unsettled = bool(changed)
    segments = []
    for f in an.found:
        h, s = f.header, f.scan
        segments.append({
            "file": f.name, "state": f.state, "seq": h.seq if h else None, "epoch": h.epoch if h else None,
            "prev_gid": h.prev_gid if h else None, "first_gid": s.first_gid if s else 0,
            "last_gid": s.last_gid if s else 0, "records": s.records if s else 0,
            "bytes": s.end - DATA_START if s else 0, "valid_end": s.end if s else None,
            "continues": s.lead[0] if s and s.lead else None, "continued": s.tail[0] if s and s.tail else None,
        })
    segments.extend({"file": f.name, "state": "changed while read", "seq": None, "epoch": None, "prev_gid": None,
                     "first_gid": 0, "last_gid": 0, "records": 0, "bytes": 0, "valid_end": None, "continues": None,
                     "continued": None} for f in changed)
    live = [f for f in an.live if f.scan is not None]
    with_records = [f for f in live if f.scan and f.scan.records]
    return {
        "directory": directory,
        "ok": not an.problems,
        "segments": segments,
        "problems": [p.as_dict() for p in an.problems],
        "segment_count": len(found),
        "live_segments": len(live),
        "records": sum(f.scan.records for f in live if f.scan),
        "bytes": sum(f.scan.end - DATA_START for f in live if f.scan),
        "low_gid": with_records[0].scan.first_gid if with_records and with_records[0].scan else 0,
        "high_gid": with_records[-1].scan.last_gid if with_records and with_records[-1].scan else 0,
        "base_gid": live[0].header.prev_gid if live and live[0].header else 0,
        "unsettled": unsettled,
    }
