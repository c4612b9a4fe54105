"""The browser code a first run will need, loaded once the page is usable rather than in its
first paint.

Streamlit's front end loads each element's code when that element is first drawn. Plotly's
(~4.7 MB) and the code block's syntax highlighter (~1.5 MB) each take the browser's main thread
for up to a second to compile; drawn on a first visit, they hold back the prompt box. Drawn first
during a run, they would take that second from the first decode steps (the browser and the model
share the cores on a one-machine setup). So Generate's first visit draws neither and asks the
browser to import both once the app is idle: the same files, under the same addresses, that the
front end imports later, so it finds them loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import streamlit as st

FRONT_END_JS = Path(st.__file__).parent / "static" / "static" / "js"
CHUNKS = ("PlotlyChart", "StreamlitSyntaxHighlighter")  # st.plotly_chart's and st.code's code

SCRIPT = """
<script>
if (!window.__iePreload) {
  window.__iePreload = true;
  const files = %s;
  const main = document.querySelector('script[type="module"][src*="/static/js/index."]');
  const idle = () => document.querySelector('[data-testid="stApp"][data-test-script-state="notRunning"]')
    && document.querySelector(%s);
  const load = () => {
    const folder = main.src.replace(/[^/]*$/, "");
    files.forEach((name) => import(folder + name).catch(() => {}));
  };
  const wait = () => {
    if (!idle()) { setTimeout(wait, 200); return; }
    if (window.requestIdleCallback) requestIdleCallback(load, {timeout: 1000}); else load();
  };
  if (main) setTimeout(wait, 200);
}
</script>
"""


def chunk_files(stems: tuple[str, ...] = CHUNKS, folder: Path = FRONT_END_JS) -> tuple[str, ...]:
    """The file names of `stems` in this Streamlit's front end (each is one hashed file)."""
    found = [sorted(folder.glob(f"{stem}.*.js")) for stem in stems]
    return tuple(paths[0].name for paths in found if len(paths) == 1)


def preload_chart_code(drawn: str) -> None:
    """Ask the browser to load the chart and code-block code once the app is idle and the element
    `drawn` (a CSS selector: what the visitor came for, the prompt box) is on screen."""
    files = chunk_files()
    if files:
        script = SCRIPT % (json.dumps(list(files)), json.dumps(drawn))
        st.html(script, unsafe_allow_javascript=True)
