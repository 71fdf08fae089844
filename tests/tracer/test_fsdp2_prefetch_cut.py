"""--fsdp2-prefetch deeper than the units there are: a one-line warning naming what was used."""
from tracer.strategies import prefetch_cut


def test_depth_beyond_the_units_warns_with_the_depth_used():
    assert prefetch_cut(2, 2) == ("warning: --fsdp2-prefetch 2: the model has 2 FSDP2 unit(s), so "
                                  "a unit prefetches at most 1; used 1 (the manifest's fsdp2_prefetch)")


def test_depth_that_fits_or_none_asked_is_silent():
    assert prefetch_cut(3, 2) is None
    assert prefetch_cut(2, 0) is None


def test_launcher_reads_the_cut_from_the_manifest(tmp_path):
    import json

    from tracer.strategies import prefetch_cut_of

    (tmp_path / "manifest.json").write_text(json.dumps(
        {"strategy_options": {"fsdp_units": ["layers.0", "layers.1"]}}))
    assert prefetch_cut_of(2, tmp_path).endswith("used 1 (the manifest's fsdp2_prefetch)")
    assert prefetch_cut_of(None, tmp_path) is None and prefetch_cut_of(1, tmp_path) is None
