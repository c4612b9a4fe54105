"""Measurements of what a page draws, read from the DOM and plotly's SVG in the browser: the
smallest text, axis titles outside their figure, legends on a plot, the toolbar over a label.
Each is a JavaScript function for `page.evaluate`; it returns the offenders, so a failing
assertion names them."""

from __future__ import annotations

# Every visible text node's effective size in CSS px, smallest first: [size, text, tag]. An SVG
# text's size is its font size times the scale of its transforms (plotly shrinks text with a
# transform). Icons (Material Symbols ligatures) are pictures, not text, and are left out.
TEXT_SIZES = """() => {
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent.trim();
    const e = node.parentElement;
    if (!text || !e || ["SCRIPT", "STYLE", "NOSCRIPT"].includes(e.tagName)) continue;
    if (e.closest('[data-testid="stIconMaterial"], [data-testid="stIconEmoji"]')) continue;
    const style = getComputedStyle(e);
    if (style.fontFamily.includes("Material")) continue;
    if (style.visibility === "hidden" || parseFloat(style.opacity) === 0) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const box = range.getBoundingClientRect();
    if (box.width < 1 || box.height < 1) continue;  // not drawn (display: none, collapsed)
    let hidden = false;
    for (let a = e; a; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (parseFloat(s.opacity) === 0 || s.visibility === "hidden") { hidden = true; break; }
    }
    if (hidden) continue;
    let size = parseFloat(style.fontSize);
    if (e instanceof SVGElement && e.getCTM) {
      const m = e.getCTM();
      if (m) size *= Math.hypot(m.a, m.b);
    }
    out.push([Math.round(size * 10) / 10, text.slice(0, 50), e.tagName]);
  }
  return out.sort((a, b) => a[0] - b[0]);
}"""

# Every plotly chart's text whose box lies outside the chart's own SVG (cut at the figure's edge):
# axis and colorbar titles, tick labels, text on bars and points, legend entries. [chart index,
# text, which side].
TEXT_OUTSIDE = """() => {
  const out = [];
  document.querySelectorAll('.js-plotly-plot').forEach((plot, i) => {
    const svg = plot.querySelector('.main-svg');
    if (!svg) return;
    const f = svg.getBoundingClientRect();
    plot.querySelectorAll('.main-svg text').forEach(t => {
      if (!t.textContent.trim() || t.closest('.hoverlayer')) return;
      const b = t.getBoundingClientRect();
      if (b.width < 1 || b.height < 1) return;  // not drawn (a tick plotly left out)
      const sides = [];
      if (b.left < f.left - 1) sides.push("left");
      if (b.right > f.right + 1) sides.push("right");
      if (b.top < f.top - 1) sides.push("top");
      if (b.bottom > f.bottom + 1) sides.push("bottom");
      if (sides.length) out.push([i, t.textContent, sides.join(" ")]);
    });
  });
  return out;
}"""

# Overlaps inside each plotly chart: a legend over a plot area, a legend or axis title outside
# the chart, and the toolbar (modebar, drawn over the chart's top right) over any text of the
# chart, and a chart whose bottom passes its element's box (the next element is drawn over it).
# [chart index, what, text].
CHART_OVERLAPS = """() => {
  const out = [];
  const meets = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 &&
                          a.top < b.bottom - 1 && b.top < a.bottom - 1;
  document.querySelectorAll('.js-plotly-plot').forEach((plot, i) => {
    const svg = plot.querySelector('.main-svg');
    if (!svg) return;
    const f = svg.getBoundingClientRect();
    const areas = [...plot.querySelectorAll('.draglayer .nsewdrag')].map(r => r.getBoundingClientRect());
    plot.querySelectorAll('.legend').forEach(legend => {
      const box = legend.querySelector('.bg') || legend;
      const l = box.getBoundingClientRect();
      if (l.width < 1) return;
      if (areas.some(a => meets(a, l))) out.push([i, "legend on the plot", legend.textContent.slice(0, 60)]);
      if (l.left < f.left - 1 || l.right > f.right + 1 || l.top < f.top - 1 || l.bottom > f.bottom + 1)
        out.push([i, "legend outside the chart", legend.textContent.slice(0, 60)]);
    });
    const box = plot.closest('[data-testid="stElementContainer"]');
    if (box && f.bottom > box.getBoundingClientRect().bottom + 1)
      out.push([i, "chart past its box", String(Math.round(f.bottom - box.getBoundingClientRect().bottom))]);
    const bar = plot.querySelector('.modebar');
    if (!bar) return;
    const m = bar.getBoundingClientRect();
    if (m.width < 1) return;
    plot.querySelectorAll('svg text').forEach(t => {
      if (t.textContent.trim() && meets(m, t.getBoundingClientRect()))
        out.push([i, "toolbar over a label", t.textContent.slice(0, 60)]);
    });
  });
  return out;
}"""

# The top of the first figure (a plotly chart, else the token chips) inside `.st-key-<key>`
# relative to the viewport, and the viewport's height: [top, bottom, height].
FIGURE_BOX = """(key) => {
  const box = document.querySelector('.st-key-' + key);
  const fig = box && (box.querySelector('.js-plotly-plot') || box.querySelector('.ie-chips'));
  if (!fig) return null;
  const r = fig.getBoundingClientRect();
  return [r.top, r.bottom, window.innerHeight];
}"""

# Every select box's shown value cut short (its input's text wider than the input): [text].
SELECT_CUT = """() => [...document.querySelectorAll('[data-testid="stSelectbox"] input')]
  .filter(e => e.value && e.getClientRects().length && e.scrollWidth > e.clientWidth + 1)
  .map(e => e.value)"""
