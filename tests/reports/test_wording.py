"""Report text on real records: a divergence in the loss is named once ("the loss (step N)"),
and FSDP1's numbered unit names ("#k") are defined where they appear."""

from __future__ import annotations

from tests.inputs import cli, copy_run


def test_loss_divergence_is_named_once(ddp_run, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.remanifest import refresh_manifest

    traces = tmp_path / "traces"
    run = copy_run(ddp_run, traces / "ddp")
    table = pq.read_table(run / "numerics.parquet")
    num = table.to_pandas()
    last = int(num.loc[num["kind"] == "loss", "step"].max())
    hit = (num["kind"] == "loss") & (num["metric"] == "value") & (num["step"] == last)
    num.loc[hit, "value"] += 1.0  # the loss off by 1.0 at the last step; tensors untouched
    pq.write_table(pa.Table.from_pandas(num, schema=table.schema, preserve_index=False),
                   run / "numerics.parquet")  # same schema, schema-version metadata included
    refresh_manifest(run)
    out = tmp_path / "r"
    proc = cli("report", str(traces), "--out", str(out))
    assert proc.returncode == 0, proc.stderr  # a report is written (`gate` is what exits 1)
    md = (out / "report.md").read_text()
    assert "loss loss" not in md + proc.stdout
    want = f"the loss (step {last})"
    assert f"First divergence: {want}: max \\|diff\\| 1" in md  # the verdict: |+1.0| off
    assert f"first divergence: {want}: max \\|diff\\| 1 " in md  # the parity table's "why"
    assert f"| {want}: rel L2" in md  # the parity table's "first divergence" cell
    assert "(first divergence in the loss)" in md  # why the ranking is withheld


def test_fsdp1_unit_names_are_defined(fsdp_fault_run, tmp_path):
    out = tmp_path / "rep"
    proc = cli("report", str(copy_run(fsdp_fault_run, tmp_path / "fsdp")), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    md = proc.stdout
    section = md[md.index("## FSDP prefetch"):md.index("## Recorded settings")]
    units = {row.split("|")[2].strip() for row in section.splitlines()
             if row.startswith("| forward") or row.startswith("| backward")}
    assert units and all(u.startswith("#") for u in units)  # FSDP1: numbered, not named
    assert "#0" in units
    definition = '"#k" is the all_gather issued k-th (from #0) in that phase'
    # written once, in the closing part, and linked from the section (issue 28)
    assert "[FSDP units](#fsdp-units)" in section
    part = md[md.index("## How each figure is measured"):]
    assert definition in part[part.index("### FSDP units"):] and md.count(definition) == 1
    html = (out / "report.html").read_text().replace("&quot;", '"')
    assert definition in html and html.index("#0</td>") < html.index(definition)
