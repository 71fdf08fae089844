"""What a browser shows of report.html, checked without a human: the headless Chromium test's
logic as pure functions (issue 28), so it is tested on hand-made dumps where Chromium is absent.

Approach: the test writes a copy of report.html with ``SCRIPT`` added (the report itself carries
no script), loads it in ``chromium --headless --window-size=1400,900 --dump-dom``; the script,
run at load, writes the page's geometry -- the viewport, the decision line, the findings block
and each of its items, every ``<svg>`` -- as JSON into ``<pre id="paritytrace-geometry">``;
``geometry_from_dom`` reads it back from the dumped DOM and ``problems`` says what is wrong:
the decision or a first-screen finding not wholly inside the first viewport, a plot drawn with
zero width or height, fewer plots drawn than the page has. (Chromium's --window-size counts the
window's frame, so the inner height it reports is below 900; the layout depends on the width
only, which must be 1400, and positions are checked against 1400x900.)
"""

from __future__ import annotations

import html
import json
import re

VIEWPORT = (1400, 900)
GEOMETRY_ID = "paritytrace-geometry"
SCRIPT = """
(function () {
  function box(el) {
    if (!el) return null;
    var r = el.getBoundingClientRect();
    return {x: r.left, y: r.top, width: r.width, height: r.height};
  }
  var out = {
    viewport: [window.innerWidth, window.innerHeight],
    decision: box(document.getElementById('decision')),
    findings: box(document.getElementById('findings')),
    finding_items: Array.prototype.map.call(document.querySelectorAll('#findings li'), box),
    plots: Array.prototype.map.call(document.querySelectorAll('svg'), function (s) {
      var t = s.querySelector('title');
      return {title: t ? t.textContent : '', rect: box(s)};
    })
  };
  var pre = document.createElement('pre');
  pre.id = '%s';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
""" % GEOMETRY_ID


def instrument(page: str) -> str:
    """``page`` with ``SCRIPT`` run at the end of its body."""
    i = page.rindex("</body>")
    return page[:i] + f"<script>{SCRIPT}</script>" + page[i:]


def geometry_from_dom(dom: str) -> dict:
    """The JSON ``SCRIPT`` wrote, from Chromium's ``--dump-dom`` output. Raises ``ValueError``
    when the dump holds none (the script did not run)."""
    m = re.search(rf'<pre id="{GEOMETRY_ID}">(.*?)</pre>', dom, re.S)
    if not m:
        raise ValueError("no geometry in the dumped DOM: the script did not run")
    return json.loads(html.unescape(m.group(1)))


def _inside(rect: dict | None, width: float, height: float) -> bool:
    """Drawn (non-zero size) and wholly inside the viewport [0, width] x [0, height]."""
    return (rect is not None and rect["width"] > 0 and rect["height"] > 0 and rect["x"] >= 0
            and rect["y"] >= 0 and rect["x"] + rect["width"] <= width
            and rect["y"] + rect["height"] <= height)


def problems(geom: dict, *, plots: int, viewport: tuple[int, int] = VIEWPORT) -> list[str]:
    """What is wrong with the geometry dump ``geom`` of a page with ``plots`` ``<svg>`` plots:
    [] when the decision, the findings block and each of its items lie wholly in the first
    ``viewport`` (width, height), and every plot is drawn with non-zero width and height."""
    width, height = viewport
    out = []
    # the width decides the layout; the height does not (report.html's CSS has no vh unit),
    # and headless Chromium's --window-size counts the window's frame, so its inner height is
    # below 900: the positions are checked against ``height`` itself
    if (geom.get("viewport") or [None])[0] != width:
        out.append(f"viewport {geom.get('viewport')} is not {width} wide")
    for name in ("decision", "findings"):
        if not _inside(geom.get(name), width, height):
            out.append(f"{name} not wholly in the first {width}x{height} viewport: {geom.get(name)}")
    for i, rect in enumerate(geom.get("finding_items") or []):
        if not _inside(rect, width, height):
            out.append(f"finding {i + 1} not wholly in the first viewport: {rect}")
    drawn = geom.get("plots") or []
    if len(drawn) != plots:
        out.append(f"{len(drawn)} plots drawn, the page has {plots}")
    for p in drawn:
        r = p.get("rect")
        if not r or r["width"] <= 0 or r["height"] <= 0:
            out.append(f"plot drawn with zero size: {p.get('title')!r} {r}")
    return out
