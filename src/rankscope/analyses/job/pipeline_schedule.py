"""A pipeline's step re-timed under another microbatch count or schedule (docs/concepts.md "What-if").

The measured dependency graph (critical_path.py) holds one schedule: with another microbatch count
or an interleaved schedule the graph itself changes. So these what-ifs build the changed graph from
what was measured and list-schedule it: p stages (ranks of a pp group), v model chunks per rank
(virtual stages k = c p + s), m microbatches. Per stage s, its measured compute per step C_s (ms:
compute + comm_overlapped) is spread evenly over its 2 m v actions, a forward taking one third of a
microbatch's compute and its backward two thirds (the usual backward = 2 x forward); each action
also pays the stage's measured host time per action o_s (host + idle_other of the step / 2 m v: the
schedule's own Python, launches and sends, paid per microbatch whatever its size), and each hop
between stages the pipeline's measured transfer time h (median pp send/recv transfer).

Dependencies: F(k, j) after F(k-1, j) + h; B(k, j) after B(k+1, j) + h and after F(k, j). A rank
runs its forwards and its backwards each in a fixed order (microbatches in groups of p, its chunks
in turn: Megatron's interleaved order; plain order for one chunk) and, of its next forward and next
backward, the one that can start first (ties: the backward); GPipe runs every forward of a rank
before its first backward; 1F1B keeps at most p - s microbatches in flight on stage s (its
warm-up). Interleaved runs like GPipe over its chunks (the same bubble, more memory): with
Megatron's warm-up order this greedy choice leaves more bubble than the schedule's own
(p-1)/(v m + p-1) (116 ms instead of 107 for 4 equal stages of 90 ms, 8 microbatches, 2 chunks),
forwards first gives the theory's 107. The step is the makespan.
The saving of a change is makespan(measured schedule) - makespan(changed), both built this way, so
the model's own simplifications cancel; the theory figure beside it is (p-1)/(m+p-1) of the
bottleneck stage's compute: max C x (p-1) (1/(v m) - 1/(v' m')).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PipelineModel:
    compute_ms: list[float]            # per stage, per step
    host_ms: list[float]               # per stage, per step: host time paid per action
    hop_ms: float                      # one send/recv between neighbouring stages
    microbatches: int
    chunks: int = 1                    # model chunks per rank (interleaved: > 1)
    schedule: str = "1f1b"             # "gpipe" | "1f1b" | "interleaved"


def makespan(model: PipelineModel, microbatches: int | None = None, chunks: int | None = None,
             schedule: str | None = None) -> float:
    """The step (ms) of `model`'s pipeline run with `microbatches`, `chunks` and `schedule` (default:
    the model's own): list scheduling of its forward and backward actions (module docstring)."""
    m = microbatches or model.microbatches
    v = chunks or model.chunks
    sched = schedule or model.schedule
    p = len(model.compute_ms)
    last = p * v - 1
    per_action = [c / (3.0 * m * v) for c in model.compute_ms]
    host = [h / (2.0 * model.microbatches * model.chunks) for h in model.host_ms]
    forwards_first = sched == "gpipe" or v > 1
    limit = [m * v] * p if forwards_first else [p - s for s in range(p)]
    # each rank's forwards and backwards in the order it runs them: microbatches in groups of p,
    # its chunks in turn within a group (forwards first chunk first, backwards last chunk first)
    groups = [range(g, min(g + p, m)) for g in range(0, m, p)]
    fwd = [[(c * p + s, j) for grp in groups for c in range(v) for j in grp] for s in range(p)]
    bwd = [[(c * p + s, j) for grp in groups for c in reversed(range(v)) for j in grp] for s in range(p)]
    f_end: dict[tuple[int, int], float] = {}
    b_end: dict[tuple[int, int], float] = {}
    nf, nb, free = [0] * p, [0] * p, [0.0] * p
    end = 0.0
    for _ in range(2 * m * v * p):
        best = None
        for s in range(p):
            if nf[s] < len(fwd[s]) and nf[s] - nb[s] < limit[s]:
                k, j = fwd[s][nf[s]]
                dep = f_end.get((k - 1, j)) if k > 0 else 0.0
                if dep is not None:
                    start = max(free[s], dep + (model.hop_ms if k > 0 else 0.0))
                    best = min(best or (start, 1, s), (start, 1, s))
            if nb[s] < len(bwd[s]) and not (forwards_first and nf[s] < len(fwd[s])):
                k, j = bwd[s][nb[s]]
                own = f_end.get((k, j))
                nxt = b_end.get((k + 1, j)) if k < last else own
                if own is not None and nxt is not None:
                    start = max(free[s], own, nxt + (model.hop_ms if k < last else 0.0))
                    best = min(best or (start, 0, s), (start, 0, s))
        if best is None:                  # every action scheduled
            break
        start, forward, s = best
        if forward:
            key = fwd[s][nf[s]]
            nf[s] += 1
            free[s] = f_end[key] = start + per_action[s] + host[s]
        else:
            key = bwd[s][nb[s]]
            nb[s] += 1
            free[s] = b_end[key] = start + 2.0 * per_action[s] + host[s]
        end = max(end, free[s])
    return end


def theory_saving_ms(model: PipelineModel, microbatches: int, chunks: int) -> float:
    """(p-1)/(v m + p-1) of the step, as the bottleneck stage's compute sees it: max C x (p-1) x
    (1/(v m) - 1/(v' m')), the saving of the ideal pipeline of equal stages."""
    p = len(model.compute_ms)
    before = 1.0 / (model.chunks * model.microbatches)
    after = 1.0 / (chunks * microbatches)
    return max(model.compute_ms) * (p - 1) * (before - after)
