"""A flame graph as one self-contained SVG (Brendan Gregg's layout): a person opens the
file in a browser, with nothing fetched (no script, style sheet or font from outside).

Stacks are merged by frame name from the root up; a frame's width is its share of the
total weight, children sorted by name, the root at the bottom. Each frame carries its
full name and weight in a <title> (the browser's tooltip); its text is cut to what fits
a monospace font of FONT px. Colours come from a hash of the name, so the same function
has the same colour in every graph. A click zooms on a frame (a few lines of inline
script; without script the graph is still whole). Pure: stacks in, text out.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

__all__ = ["CHAR_WIDTH", "FONT", "PAD", "ROW", "colour", "fit", "render"]

FONT = 12  # px, monospace
CHAR_WIDTH = FONT * 0.6  # a monospace glyph's advance, about 0.6 em
ROW = 16  # px per frame
PAD = 10  # px left and right
TOP = 34  # px above the frames: the title and the zoom reset
BOTTOM = 10
MIN_WIDTH = 0.1  # px: narrower frames are not drawn (their weight stays in the parent)
ROOT = "all"

_ZOOM = """<script><![CDATA[(function(){
var L=%(left)s,W=%(width)s,C=%(char)s,fs=document.querySelectorAll("g.f"),
reset=document.getElementById("reset");
function fit(t,w){var n=Math.floor((w-6)/C);if(n<3)return"";
return t.length<=n?t:t.slice(0,n-2)+"..";}
function put(g,x,w){var r=g.querySelector("rect"),t=g.querySelector("text");
r.setAttribute("x",x.toFixed(2));r.setAttribute("width",w.toFixed(2));
t.setAttribute("x",(x+3).toFixed(2));t.textContent=fit(g.getAttribute("data-n"),w);
g.style.display="";}
function at(g,k){return +g.querySelector("rect").getAttribute(k);}
function zoom(z){var zx=at(z,"data-x"),zw=at(z,"data-w"),zy=at(z,"y"),k=W/zw,e=1e-6;
fs.forEach(function(g){var x=at(g,"data-x"),w=at(g,"data-w"),y=at(g,"y");
if(y>zy&&x<=zx+e&&x+w>=zx+zw-e)put(g,L,W);
else if(y<=zy&&x>=zx-e&&x+w<=zx+zw+e)put(g,L+(x-zx)*k,w*k);
else g.style.display="none";});reset.style.display="";}
fs.forEach(function(g){g.addEventListener("click",function(){zoom(g);});});
reset.addEventListener("click",function(){fs.forEach(function(g){
put(g,at(g,"data-x"),at(g,"data-w"));});reset.style.display="none";});
})();]]></script>"""


@dataclass
class _Node:
    name: str
    weight: float = 0.0
    children: dict[str, _Node] = field(default_factory=dict)


def _tree(stacks: Iterable[tuple[Sequence[str], float]]) -> _Node:
    """Stacks merged from the root; weights that are not finite and above zero are
    left out."""
    root = _Node(ROOT)
    for frames, weight in stacks:
        w = float(weight)
        if not (math.isfinite(w) and w > 0):
            continue
        root.weight += w
        node = root
        for name in frames:
            node = node.children.setdefault(str(name), _Node(str(name)))
            node.weight += w
    return root


def colour(name: str) -> str:
    """The "hot" palette of FlameGraph (reds, oranges, yellows), picked by a hash of
    the name: deterministic across runs and graphs."""
    h = hashlib.sha1(name.encode()).digest()
    r = 205 + h[0] * 50 // 255
    g = h[1] * 230 // 255
    b = h[2] * 55 // 255
    return f"#{r:02x}{g:02x}{b:02x}"


def fit(text: str, width: float) -> str:
    """As much of `text` as fits `width` px ("..": cut), "" when under 3 characters do
    (the same rule as the zoom script's)."""
    n = math.floor((width - 6) / CHAR_WIDTH)
    if n < 3:
        return ""
    return text if len(text) <= n else text[: n - 2] + ".."


def _depth(node: _Node) -> int:
    return 1 + max((_depth(c) for c in node.children.values()), default=0)


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def _frames(
    node: _Node, x: float, depth: int, scale: float, base: float, total: float, unit: str
) -> list[str]:
    """The <g> of `node` and of its children (root-first order)."""
    w = node.weight * scale
    if w < MIN_WIDTH:
        return []
    y = base - depth * ROW
    share = 100.0 * node.weight / total
    tip = f"{node.name} ({node.weight:.6g} {unit}, {share:.2f}%)"
    out = [
        f'<g class="f" data-n={quoteattr(node.name)}><title>{escape(tip)}</title>'
        f'<rect x="{_fmt(x)}" y="{_fmt(y)}" width="{_fmt(w)}" height="{ROW - 1}" '
        f'fill="{colour(node.name)}" rx="2" data-x="{_fmt(x)}" data-w="{_fmt(w)}"/>'
        f'<text x="{_fmt(x + 3)}" y="{_fmt(y + ROW - 4)}">{escape(fit(node.name, w))}</text></g>'
    ]
    child_x = x
    for name in sorted(node.children):
        child = node.children[name]
        out += _frames(child, child_x, depth + 1, scale, base, total, unit)
        child_x += child.weight * scale
    return out


def render(
    stacks: Iterable[tuple[Sequence[str], float]],
    *,
    title: str = "Flame graph",
    unit: str = "norm cost",
    width: int = 1200,
    zoom: bool = True,
) -> str:
    """The SVG of (frames root-first, weight) pairs; stacks with the same frames add up.
    `unit` names the weight in the tooltips; `zoom` adds the click-to-zoom script."""
    root = _tree(stacks)
    span = width - 2 * PAD
    rows = _depth(root)
    height = TOP + rows * ROW + BOTTOM
    base = TOP + (rows - 1) * ROW  # the root's row, at the bottom
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">\n'
        '<defs><linearGradient id="bg" x1="0" y1="0" x2="0" y2="1">'
        '<stop offset="5%" stop-color="#eeeeee"/><stop offset="95%" stop-color="#eeeeb0"/>'
        "</linearGradient></defs>\n"
        "<style>text{font-family:monospace;font-size:"
        f"{FONT}px;fill:#000}}g.f{{cursor:pointer}}g.f:hover rect{{stroke:#000;"
        "stroke-width:0.5}#reset{cursor:pointer}</style>\n"
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="url(#bg)"/>\n'
        f'<text x="{width / 2:.1f}" y="20" text-anchor="middle" '
        f'style="font-size:{FONT + 4}px">{escape(title)}</text>\n'
        f'<text id="reset" x="{PAD}" y="20" style="display:none">Reset zoom</text>\n'
    )
    if root.weight <= 0:
        empty = f'<text x="{PAD}" y="{TOP + ROW}">no samples</text>\n'
        return head + empty + "</svg>\n"
    body = _frames(root, float(PAD), 0, span / root.weight, base, root.weight, unit)
    script = ""
    if zoom:
        script = _ZOOM % {"left": PAD, "width": span, "char": CHAR_WIDTH} + "\n"
    return head + "\n".join(body) + "\n" + script + "</svg>\n"
