"""The parity tolerance: one type for the gate, drift and the loss envelope (docs/method.md
"Reading the report").

A value ``x`` checked against its reference ``r`` is within tolerance iff ``|x - r| <= atol +
rtol * |r|`` (``torch.testing.assert_close``); a tensor iff ``max |x - r| <= limit(max |r|)``,
the max-norm form (analyzer/analyses/parity.py, rule 3). The tracer writes it into the manifest,
report.json holds it; msgspec only, so a cached report decodes without numpy.
"""

from __future__ import annotations

import math

import msgspec


class Tolerance(msgspec.Struct, kw_only=True, frozen=True):
    """The parity tolerance, ``|x - r| <= atol + rtol * |r|``, and where its numbers come from.
    Raises ``ValueError`` for a negative or non-finite rtol / atol."""

    rtol: float
    """Relative tolerance (dimensionless)."""
    atol: float
    """Absolute tolerance (in the compared values' units)."""
    source: str
    """Where the numbers come from, stated in every report."""
    precision: str = ""
    """What they are chosen for: ``fp32``, ``bf16``, ``mixed bf16,bf16,fp32``; "" where not
    said (a tolerance applied bitwise, a report.json or manifest written before the field)."""

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def limit(self, ref_abs_max):
        """``atol + rtol * ref_abs_max``: the largest ``max |x - r|`` allowed where ``max |r|``
        is ``ref_abs_max`` (a float, or a numpy / pandas array: elementwise; NaN stays NaN)."""
        return self.atol + self.rtol * ref_abs_max

    def envelope(self, step: int, ref: float) -> float:
        """The loss limit at ``step`` (0-based) for the baseline's loss ``ref``, the divergence
        envelope ``(step + 1) x limit(|ref|)``: in a stable run an earlier difference is not
        amplified and each step adds at most one step's rounding, while a bug that changes an
        update moves the loss by a whole step (docs/recording.md, "Loss beyond step 0")."""
        return (step + 1) * self.limit(abs(ref))

    def describe(self) -> str:
        """One line, e.g. ``rtol 1.3e-06, atol 1e-05; torch.testing.assert_close defaults ...``."""
        return f"rtol {self.rtol:.3g}, atol {self.atol:.3g}; {self.source}"


# Source: torch.testing.assert_close defaults (https://pytorch.org/docs/stable/testing.html).
TOLERANCES = {p: Tolerance(rtol=rtol, atol=1e-5, precision=p,
                           source=f"torch.testing.assert_close defaults for {p}")
              for p, rtol in (("fp32", 1.3e-6), ("bf16", 1.6e-2), ("fp16", 1e-3))}
"""Parity tolerance by precision (``fp16``: mixed precision's only, never a record's precision)."""

# Mixed precision (``--mixed-precision PARAM,REDUCE,BUFFER``; docs/recording.md,
# "Tolerances of the training setup"). The baseline rounds each rank's rows' gradient as that rank does and adds
# them in REDUCE in rank order (tracer/training.py), so what is left is the order of the W - 1
# additions, the collective's against the baseline's, each rounded: at most 2 (W - 1) u of the
# summed magnitudes (u = unit roundoff of REDUCE; W = 2: one commutative addition, bitwise equal,
# as measured on FSDP1, FSDP2 and DDP). rtol = max(torch's default for the dtype, 2 (W - 1) u),
# atol torch's. BUFFER does not enter: buffers are cast the same way in the baseline and the ranks.
UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


def mixed_precision_tolerance(dtypes: list[str], world_size: int) -> Tolerance:
    """The tolerance for ``--mixed-precision`` ``dtypes`` [PARAM, REDUCE, BUFFER] on
    ``world_size`` ranks: the rule above, for the lower of PARAM and REDUCE (all fp32: fp32's
    numbers). Raises ``ValueError`` for an unknown dtype name."""
    unknown = [d for d in dtypes if d not in UNIT_ROUNDOFF]
    if unknown:
        raise ValueError(f"unknown mixed-precision dtype {unknown[0]!r}; expected one of "
                         f"{', '.join(UNIT_ROUNDOFF)}")
    precision = "mixed " + ",".join(dtypes)
    low = [d for d in dtypes[:2] if d != "fp32"]
    if not low:
        return msgspec.structs.replace(TOLERANCES["fp32"], precision=precision)
    dtype = max(low, key=UNIT_ROUNDOFF.__getitem__)
    rtol = max(TOLERANCES[dtype].rtol, 2 * (world_size - 1) * UNIT_ROUNDOFF[dtype])
    return Tolerance(rtol=rtol, atol=TOLERANCES[dtype].atol, precision=precision, source=(
        f"2 (W - 1) u for the order of a {dtype} reduction of W = {world_size} partial sums, which "
        "the baseline rounds per rank's rows as the ranks do (u = unit roundoff), or "
        f"torch.testing.assert_close's {dtype} default when larger"))


# Float8 training (``--float8``, issue 45: torchao ``convert_to_float8_training``, tensorwise
# dynamic scaling). The baseline trains the same float8 model (tracer/gpuonly.py), so what is
# left is where the two runs *cast* differently: a tensorwise cast scales by the tensor's amax,
# and a rank's activations and output gradients are its batch shard, the baseline's the global
# batch, so their scales differ and an element rounds to a different float8 value (the weights
# are all-gathered in high precision and cast whole: the same amax, the same cast). Each cast of
# a normal value errs by at most u |v| (u = unit roundoff: float8_e4m3fn 2^-4, 3 mantissa bits;
# float8_e5m2 2^-3, 2 bits), independently in the two runs, so a float8 matmul's element differs
# by at most 2 (u_a + u_b) times the sum of its products' magnitudes: forward (inputs e4m3,
# weights alike) 2 u4; input gradient (output gradient e5m2) 2 u5; weight gradient (output
# gradient e5m2 x input e4m3) 2 (u5 + u4) = 0.375, the largest, taken as rtol (of max |r|, the
# max-norm form; values below float8's smallest normal err by less than that in absolute terms).
# A first-order bound, loose by construction: it passes a float8 run whose differences are
# rounding and still fails a wrong gradient scale or a missing reduction (100 % or more).
# Measured with torchao 0.18's float8 emulation on CPU (the same casts; reference model, 2-4
# shards of an 8-row batch, hidden 64-256): gradients differ by 0.11-0.14 of max |r|,
# activations by 0.03-0.07 (2-8 layers).
FLOAT8_UNIT_ROUNDOFF = {"float8_e4m3fn": 2.0 ** -4, "float8_e5m2": 2.0 ** -3}


def float8_tolerance() -> Tolerance:
    """The parity tolerance of a ``--float8`` record against its float8 baseline: rtol
    2 (u_e5m2 + u_e4m3) = 0.375 (the comment above), atol torch's bf16 default."""
    u = FLOAT8_UNIT_ROUNDOFF
    rtol = 2 * (u["float8_e5m2"] + u["float8_e4m3fn"])
    return Tolerance(rtol=rtol, atol=TOLERANCES["bf16"].atol, precision="float8 tensorwise", source=(
        "2 (u_e5m2 + u_e4m3) for a float8 weight-gradient matmul whose operands the ranks and the "
        "float8 baseline scale by different amaxes (a batch shard's against the global batch's; "
        "u = unit roundoff), torch.testing.assert_close's bf16 atol"))


# torch.compile (``tracer record --compile blocks | model``; tracer/compiling.py, docs/method.md
# "Parity under torch.compile"). The baseline is compiled the same way, so the ranks and the
# baseline run the same inductor graphs: the same fusions, the same upcasts inside a fused kernel
# (inductor computes a fused bf16 chain in fp32 and rounds once, where eager rounds after each op:
# both sides do it), the same extern matmuls. What still differs is the shape each graph was
# specialised for -- the baseline's B rows, a rank's B / W -- and a reduction over the rows
# (a weight or bias gradient, a loss mean) is then split and vectorised per shape: a different
# order of the same float sum on each rank, then the collective's W - 1 additions. Two orders of a
# sum differ by at most 2 (W - 1) u of the summed magnitudes for the partial sums' addition plus
# the within-rank reorder that eager DDP / FSDP already show (the precision's default covers it,
# measured: fsdp2 / ddp compiled blocks max grad rel L2 1.6e-07 at W = 2, as eager). Hence the
# mixed-precision rule's form: rtol = max(torch's default for the precision, 2 (W - 1) u).


def compile_tolerance(precision: str, world_size: int, mode: str) -> Tolerance:
    """The tolerance of a ``--compile mode`` record in ``precision`` (fp32 / bf16, autocast) on
    ``world_size`` ranks: the rule above. Raises ``KeyError`` for an unknown precision."""
    rtol = max(TOLERANCES[precision].rtol, 2 * (world_size - 1) * UNIT_ROUNDOFF[precision])
    return Tolerance(rtol=rtol, atol=TOLERANCES[precision].atol, precision=precision, source=(
        f"torch.compile ({mode}) on both sides: the baseline runs the same inductor graphs, "
        f"specialised for its whole batch, so sums over rows change order; 2 (W - 1) u for "
        f"W = {world_size} or torch.testing.assert_close's {precision} default when larger"))
