"""Collective metadata from either exporter, and kernels replayed from a CUDA graph (issue 30
item 3; analyzer/ingest/graphs.py, decode.py, classify.py).

One hand-built NCCL-shaped rank of 2, times in µs:
  step 0 [0, 2000): an eager all_reduce as the Python exporter writes it (pytorch #184273:
      the kernel carries its own metadata plus all of record_param_comms', Seq 3 and a Comms
      Id included), kernel [200, 260); then replay A of an annotated graph (cudaGraphLaunch at
      100): a compute node [300, 400) and an NCCL node [400, 600) whose annotation (pytorch
      #179768, torch.distributed._cuda_graph_annotations: every value a string) says
      allreduce of 1,024 Float on process group "3" ("mesh_dp", ranks [0, 1], size 2), Seq 7.
  step 1 [2000, 4000): replay B of an unannotated graph (cudaGraphLaunch at 2,100): a compute
      node [2300, 2500) and an NCCL node [2500, 2800); then replay A again (launch at 2,120):
      [3000, 3100) and its NCCL node [3100, 3300), the same annotation, Seq 7 again.
Expected: the eager all_reduce: pg "0", 4,096 bytes, Seq 3, Comms Id "12345", keyed by Seq.
Replay A's NCCL nodes: all_reduce, pg "3", mesh_dp, group 2, Float, 4,096 bytes, rule
gpu.nccl_kernel.args, steps 0 and 1, no Seq (capture-time: it repeats), keyed by order.
Replay B's NCCL node: all_reduce from its name, step 1, pg unknown, bytes unknown, and a note
naming replay B: 2 nodes, 0.500 ms of device time, 1 communication kernel.
"""

from __future__ import annotations

from analyzer.api import load_events, load_tables
from tests.merge.builders import meta, write

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x32"
CPU, TID, STREAM = 4242, 1, 20
ANNOTATION = {"Collective name": "allreduce", "In msg nelems": "1024", "Out msg nelems": "1024",
              "Group size": "2", "Process Group Name": "3", "Process Group Description":
              "mesh_dp", "Process Group Ranks": "[0, 1]", "Is asynchronized op": "False",
              "Rank": "0", "dtype": "Float", "Seq": "7"}


def _cpu(name, ts, dur, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": CPU, "tid": TID, "ts": ts, "dur": dur,
            "args": args}


def _kernel(name, ts, dur, corr, node=0, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": STREAM, "ts": ts,
            "dur": dur, "args": {"queued": 0, "device": 0, "context": 1, "stream": STREAM,
                                 "correlation": corr, "graph id": 5 if node else 0,
                                 "graph node id": node, "External id": corr, **args}}


def _replay(launch_ts, corr, kernels, annotated):
    ev = [_cpu("cudaGraphLaunch", launch_ts, 10, cat="cuda_runtime", correlation=corr)]
    for name, ts, dur, node in kernels:
        extra = ANNOTATION if annotated and name == AR else {}
        ev.append(_kernel(name, ts, dur, corr, node, **extra))
    return ev


def _trace() -> dict:
    rpc = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
           "Group size": 2, "dtype": "Float", "Process Group Name": "0",
           "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]",
           "Rank": 0, "Seq": 3, "Comms Id": 12345, "Input Dims": [[1024]],
           "Input type": ["float"]}
    ev = [meta(CPU, 0, "process_name", name="python3"),
          meta(CPU, TID, "thread_name", name="thread 1 (python3)"),
          meta(0, 0, "process_name", name="GPU 0"),
          _cpu("ProfilerStep#0", 0, 1999, cat="user_annotation"),
          _cpu("ProfilerStep#1", 2000, 1999, cat="user_annotation"),
          _cpu("record_param_comms", 40, 20, **rpc),
          _cpu("cudaLaunchKernel", 50, 1, cat="cuda_runtime", correlation=400),
          _kernel(AR, 200, 60, 400, **rpc)]  # Python exporter: the linked op's args appended
    ev += _replay(100, 500, [(GEMM, 300, 100, 11), (AR, 400, 200, 12)], True)
    ev += _replay(2100, 501, [(GEMM, 2300, 200, 21), (AR, 2500, 300, 22)], False)
    ev += _replay(2120, 502, [(GEMM, 3000, 100, 11), (AR, 3100, 200, 12)], True)
    return {"schemaVersion": 1, "traceEvents": ev, "cudaGraphInlineAnnotated": True,
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}}


def test_graph_kernels_by_annotation(tmp_path):
    path = write(tmp_path / "job" / "rank0.trace.json", _trace())
    job = load_tables(path.parent, jobs=1)
    c = job.collectives.sort_values("start_ns").reset_index(drop=True)
    assert c["start_ns"].tolist() == [t * 1000 for t in (200, 400, 2500, 3100)]
    assert c["kind"].astype(str).tolist() == ["all_reduce"] * 4
    assert c["pg"].astype(str).tolist() == ["0", "3", "", "3"]
    assert c["pg_desc"].astype(str).tolist() == ["default_pg", "mesh_dp", "", "mesh_dp"]
    assert c["bytes"].tolist() == [4096, 4096, -1, 4096]
    assert c["group_size"].tolist() == [2, 2, -1, 2]
    assert c["dtype"].astype(str).tolist() == ["Float", "Float", "", "Float"]
    assert c["step"].tolist() == [0, 0, 1, 1]
    assert c["rule"].astype(str).tolist() == ["gpu.nccl_kernel.args", "gpu.nccl_kernel.args",
                                              "gpu.nccl_kernel", "gpu.nccl_kernel.args"]
    assert c["pg_seq"].tolist() == [3, -1, -1, -1]
    assert c["comms_id"].astype(str).tolist() == ["12345", "", "", ""]
    assert c["seq_source"].astype(str).tolist() == ["Seq", "order", "order", "order"]
    assert c["seq"].tolist() == [3, 0, 0, 1]


def test_unannotated_replay_is_named(tmp_path):
    path = write(tmp_path / "one.json", _trace())
    events, _ = load_events(path)
    notes = [w for w in events.attrs["warnings"] if "CUDA graph" in w]
    assert notes == [
        "1 CUDA graph replay(s) without kernel annotations (cudaGraphLaunch at 2.100 ms: "
        "2 nodes, 0.500 ms; 0.500 ms device time in all, 2 nodes): counted by kernel name; "
        "their 1 communication kernels have a kind but no process group or bytes "
        "(torch.cuda._graph_annotations.mark_kernels attributes them)"]
    job = load_tables(path, jobs=1)
    assert any("CUDA graph replay" in w for w in job.ranks[0].warnings)
