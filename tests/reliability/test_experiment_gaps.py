"""What a report says of the runs of an experiment it does not hold (issue 43 R17): repeats of a
record of strategies (``--repeat``, no declared arms) that are missing are counted, and a run dir
that a killed ``--repeat`` record claimed but never started (its record lock alone) is named
when the folder is read, not only when the next record sweeps it. Hand-built runs."""

from __future__ import annotations

from analyzer.compare.runs import analyse
from analyzer.contract import schemas
from analyzer.ingest.rundirs import discover
from reports import markdown
from tests.reports.builders import details, write_run

MS = 1_000_000


def _repeats(root, strategy: str, steps_ms: float, only: list[int], repeats: int = 4,
             order: tuple[str, ...] = ("single", "ddp")) -> None:
    """Run dirs ``<strategy>.r<k>`` for k in ``only`` of a ``--strategy single,ddp --repeat
    repeats`` record (no declared settings: an ordinary experiment of strategies)."""
    ranks = 1 if strategy == "single" else 2
    for k in only:
        walls = {0: (1,) * ranks, **{i: (int(steps_ms * MS),) * ranks for i in (1, 2, 3)}}
        write_run(root / f"{strategy}.r{k}", strategy=strategy, walls=walls,
                  experiment={"id": "e1", "arm": strategy, "repeat": k, "repeats": repeats,
                              "order": list(order)})


def test_missing_repeats_of_a_strategy_experiment_are_named(tmp_path):
    """single and ddp recorded with --repeat 4; ddp.r3, ddp.r4 lost (deleted, or never
    recorded): the report counts ddp's repeats, as it does for declared arms."""
    root = tmp_path / "t"
    _repeats(root, "single", 9, [1, 2, 3, 4])
    _repeats(root, "ddp", 6, [1, 2])
    rep = analyse(root)
    assert not rep.ranking.declared
    assert rep.ranking.missing == ["strategy ddp: 2 of 4 repeats"]
    assert "Not in this report: strategy ddp: 2 of 4 repeats." in details(markdown.render(rep))
    full = tmp_path / "f"  # every repeat here: nothing said
    _repeats(full, "single", 9, [1, 2], repeats=2)
    _repeats(full, "ddp", 6, [1, 2], repeats=2)
    assert analyse(full).ranking.missing == []


def test_a_run_dir_holding_only_the_record_lock_is_named_when_read(tmp_path):
    """A --repeat record killed after claiming ddp.r3 and ddp.r4 (each holds only the record
    lock, as ``tracer/rundir.py`` ``lock_run_dir`` leaves it): the walk names both, skipped."""
    root = tmp_path / "t"
    _repeats(root, "single", 9, [1, 2, 3, 4])
    _repeats(root, "ddp", 6, [1, 2])
    for k in (3, 4):
        (root / f"ddp.r{k}").mkdir()
        (root / f"ddp.r{k}" / schemas.LOCK_NAME).write_text("12345\nboot:1:2\n")
    found = discover(root)
    assert sorted(r.name for r in found.runs) == ["ddp.r1", "ddp.r2", "single.r1", "single.r2",
                                                  "single.r3", "single.r4"]
    said = [w for w in found.warnings if "record lock" in w]
    assert [w.split(":")[0] for w in said] == [str(root / "ddp.r3"), str(root / "ddp.r4")], found.warnings
    assert all("no run yet; skipped" in w for w in said)
