"""The one parity tolerance (analyzer/contract/tolerance.py): its limit and loss envelope, with
limits computed by hand in numbers that binary floating point holds exactly."""

from __future__ import annotations

import msgspec
import numpy as np
import pandas as pd
import pytest

from analyzer.analyses import parity
from analyzer.contract.report_types import FirstDivergence, Parity
from analyzer.contract.tolerance import TOLERANCES, Tolerance

HALF = Tolerance(rtol=0.5, atol=0.25, source="hand-made")


def test_limit_is_atol_plus_rtol_times_the_reference_maximum():
    assert HALF.limit(0.0) == 0.25
    assert HALF.limit(3.0) == 1.75  # 0.25 + 0.5 * 3
    assert Tolerance(rtol=0.0, atol=0.0, source="bitwise").limit(8.0) == 0.0


def test_limit_of_an_array_is_elementwise():
    assert HALF.limit(np.array([0.0, 1.0, 4.0])).tolist() == [0.25, 0.75, 2.25]
    assert HALF.limit(pd.Series([2.0, 6.0])).tolist() == [1.25, 3.25]


def test_loss_envelope_grows_linearly_with_the_step_and_takes_the_absolute_reference():
    assert HALF.envelope(0, 3.0) == 1.75
    assert HALF.envelope(2, -3.0) == 5.25  # 3 x (0.25 + 0.5 * |-3|)


def test_fp32_default_is_torchs_and_says_so():
    fp32 = TOLERANCES["fp32"]
    assert (fp32.rtol, fp32.atol, fp32.precision) == (1.3e-6, 1e-5, "fp32")
    assert fp32.source == "torch.testing.assert_close defaults for fp32"
    assert fp32.limit(2.0) == 1e-5 + 1.3e-6 * 2.0


@pytest.mark.parametrize("bad", [{"rtol": -0.1}, {"atol": float("nan")}, {"atol": float("inf")}])
def test_negative_or_non_finite_numbers_are_refused(bad):
    with pytest.raises(ValueError, match="finite number >= 0"):
        Tolerance(**{"rtol": 0.1, "atol": 0.1, "source": "s", **bad})


def test_a_tolerance_cannot_be_changed_once_made():
    with pytest.raises(AttributeError):
        TOLERANCES["fp32"].rtol = 0.1


def test_override_keeps_the_other_number_and_names_who_set_it():
    tol = parity.tolerance_for("bf16", atol=0.5)
    assert (tol.rtol, tol.atol, tol.precision) == (1.6e-2, 0.5, "bf16")
    assert tol.source == "atol set by the user; otherwise torch.testing.assert_close defaults for bf16"
    assert tol.limit(2.0) == 0.5 + 1.6e-2 * 2.0


def test_report_json_written_before_the_one_type_still_decodes():
    """A first divergence's tolerance once had no ``precision``: it reads as "" ."""
    fd = {"tensor": "w", "kind": "grad", "step": 0, "rel_l2": 0.5, "max_abs_diff": 1.0,
          "limit": 0.5, "nonfinite": 0, "subject": "grad w",
          "tolerance": {"rtol": 0.5, "atol": 0.25, "source": "s"}}
    parity_json = {"status": "fail", "reason": "r", "first_divergence": fd,
                   "tolerance": {"rtol": 0.5, "atol": 0.25, "precision": "fp32", "source": "s"}}
    got = msgspec.convert(parity_json, Parity)
    assert isinstance(got.first_divergence, FirstDivergence)
    assert got.first_divergence.tolerance == Tolerance(rtol=0.5, atol=0.25, source="s")
    assert got.tolerance.precision == "fp32"
