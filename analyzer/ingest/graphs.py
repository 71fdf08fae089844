"""Device work replayed from a CUDA graph: which rows are, which carry an annotation, and the note
that names the replays nobody annotated.

A kernel (memcpy, memset) replayed from a CUDA graph has no launch of its own: CUPTI links
every node of one replay to the one ``cudaGraphLaunch`` call (its correlation id), and Kineto
writes the node's id as the ``graph node id`` argument (0: not from a graph; libkineto
CuptiActivity.cpp ``getGraphNodeMetadata``). Its step is its replay's: the cudaGraphLaunch
inside a ProfilerStep (analyzer/ingest/steps.py, as any launch).

Annotated (pytorch #179768, ``torch.cuda._graph_annotations.mark_kernels``; the dict of
``torch.distributed._cuda_graph_annotations`` for a captured collective: ``Collective name``,
``In msg nelems``, ``Out msg nelems``, ``Group size``, ``dtype``, ``Process Group Name`` /
``Description`` / ``Ranks``, ``Seq``): the annotation is spliced into the node's args, every
value stringified, either by the Python exporter (``torch/profiler/_chrome_trace_export.py``,
pytorch #184273 / #184637) or by ``torch.cuda._annotate_cuda_graph_trace``. A graphed row is
attributed by it exactly as a kernel by its own record_param_comms arguments
(analyzer/ingest/commid.py: kind, bytes, dtype, group size, process group), with one
exception: its ``Seq`` / ``Comms Id`` were recorded at capture and repeat on every replay, so
they are no cross-rank key (analyzer/analyses/clock.py ``match_key``): such rows are matched by
order.

A replay none of whose rows carries a ``Collective name`` argument is "not annotated": its
NCCL kernels have only their kernel name (kind; process group and bytes unknown). It is named in
the rank's notes with its device time (``replay_notes``), never dropped silently.
"""

from __future__ import annotations

import numpy as np

from analyzer.analyses import intervals as iv

MAX_NAMED = 3
"""Replays named one by one in the note (the rest are counted)."""


def graphed(graph_node: np.ndarray, is_gpu: np.ndarray) -> np.ndarray:
    """Bool per row: device work replayed from a CUDA graph (``graph node id`` > 0)."""
    return np.asarray(is_gpu, bool) & (np.asarray(graph_node, np.int64) > 0)


def replay_notes(graph_rows: np.ndarray, annotated: np.ndarray, launch: np.ndarray,
                 is_comm: np.ndarray, ts: np.ndarray, end: np.ndarray, names: np.ndarray
                 ) -> list[str]:
    """One note naming the CUDA graph replays without annotations, [] when there is none.

    ``graph_rows``: bool per row, graphed device work (``graphed``); ``annotated``: bool per
    row (carries a ``Collective name`` argument); ``launch``: each row's launching CPU row
    (-1 none; the replay = its cudaGraphLaunch); ``is_comm``: bool per row (role comm);
    ``ts`` / ``end``: int64 ns; ``names``: each row's name. A replay's device time is the
    union of its rows' intervals, in ms with 3 decimals in the text; replays with no launch in
    the trace are grouped as one."""
    rows = np.flatnonzero(graph_rows)
    if not len(rows):
        return []
    keys, inv = np.unique(launch[rows], return_inverse=True)
    inv = inv.ravel()
    has_ann = np.zeros(len(keys), bool)
    np.logical_or.at(has_ann, inv, annotated[rows])
    bare = np.flatnonzero(~has_ann)
    if not len(bare):
        return []
    named, total_ns, comm_rows, n_rows = [], 0, 0, 0
    for k in bare.tolist():
        sel = rows[inv == k]
        busy = iv.measure(iv.merge(ts[sel], end[sel]))
        total_ns += busy
        n_rows += len(sel)
        comm_rows += int(is_comm[sel].sum())
        if len(named) < MAX_NAMED:
            at = int(keys[k])
            what = f"{names[at]} at {ts[at] / 1e6:.3f} ms" if at >= 0 else "no launch in trace"
            named.append(f"{what}: {len(sel)} nodes, {busy / 1e6:.3f} ms")
    more = f" and {len(bare) - len(named)} more" if len(bare) > len(named) else ""
    return [f"{len(bare)} CUDA graph replay(s) without kernel annotations "
            f"({'; '.join(named)}{more}; {total_ns / 1e6:.3f} ms device time in all, "
            f"{n_rows} nodes): counted by kernel name; their {comm_rows} communication "
            "kernels have a kind but no process group or bytes "
            "(torch.cuda._graph_annotations.mark_kernels attributes them)"]
