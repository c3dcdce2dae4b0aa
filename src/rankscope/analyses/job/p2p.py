"""Point-to-point sends and recvs paired across the ranks of a process group of more than two ranks
(docs/concepts.md "Collective": pipeline send/recv).

In a group of two ranks a send and its recv are matched like any collective (same sequence number,
or the n-th p2p of each rank). In a larger group (a pipeline's stages in one process group) each
rank's sequence numbers and order count its traffic with every peer together, so they say nothing
about which send feeds which recv: pairs are found by time instead, on the aligned clock. A
pipeline stage talks to its neighbours, the stages before and after it (the group's ranks in
order): per recv (in order of end), the unpaired send of a neighbour whose span overlaps the
recv's and whose end is closest to the recv's end (a send completes when its recv has the data).
A second pass pairs what is left with the group's first and last ranks as neighbours too
(interleaved schedules send from the last stage back to the first).
"""
from __future__ import annotations

import bisect

import numpy as np

#: How many sends on each side of the closest end are looked at per recv and peer.
_SCAN = 8


def pair_p2p(group: list[str], rank: np.ndarray, kind: list[str], start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per row (one send or recv instance: its process group, rank, "send" | "recv", start and end
    on the aligned clock): the id of the pair it belongs to (a send and a recv share one), -1 when
    unpaired."""
    out = np.full(len(rank), -1, dtype=np.int64)
    next_id = 0
    codes = {g: k for k, g in enumerate(sorted(set(group)))}
    code = np.array([codes[g] for g in group], dtype=np.int64)
    for c in range(len(codes)):
        rows = np.flatnonzero(code == c)
        members = sorted({int(r) for r in rank[rows]})
        pos = {r: k for k, r in enumerate(members)}
        n = len(members)
        sends: dict[int, list[tuple[int, int, int]]] = {}          # peer -> sorted (end, start, row)
        recvs = []
        for i in rows.tolist():
            item = (int(end[i]), int(start[i]), i)
            if kind[i] == "send":
                sends.setdefault(int(rank[i]), []).append(item)
            elif kind[i] == "recv":
                recvs.append(item)
        for lst in sends.values():
            lst.sort()
        ends = {q: [x[0] for x in lst] for q, lst in sends.items()}
        used: set[int] = set()
        recvs.sort()
        for wrap in (False, True):
            for e_r, a_r, i in recvs:
                if out[i] >= 0:
                    continue
                p = pos[int(rank[i])]
                peers = {p - 1, p + 1} if not wrap else {(p - 1) % n, (p + 1) % n}
                best = None
                for q in (members[k] for k in peers if 0 <= k < n and k != p):
                    sent = sends.get(q)
                    if not sent:
                        continue
                    k = bisect.bisect_left(ends[q], e_r)
                    for j in range(max(0, k - _SCAN), min(len(sent), k + _SCAN)):
                        e_s, a_s, x = sent[j]
                        if x in used or a_s > e_r or e_s < a_r:
                            continue
                        if best is None or abs(e_s - e_r) < abs(best[0] - e_r):
                            best = (e_s, x)
                if best is not None:
                    used.add(best[1])
                    out[i] = out[best[1]] = next_id
                    next_id += 1
    return out
