"""The run's two download files: the trace file with the results computed on it, and the HTML
report. Each is made once per (trace, results) pair and kept in the session's memo.

A published run carries the sender's copies of both (made when the sender's Generate page drew
its download row), so a link's first paint does not build them again: the report's figures take
the server a few tenths of a second, which on a shared machine come out of the very moment the
receiver's browser is starting the app, and a class opening one link would build the same bytes
once per student.
"""

from __future__ import annotations

import zlib

from charts.report import report_html
from engine import Trace
from engine.experiments import Experiments
from engine.records.tracefile import trace_to_bytes
from i18n import DEFAULT, LANGUAGES, language
from ui.memo import held, keep, memo
from ui.state import current_experiments

TRACE_FILE, REPORT_FILE = "trace_file", "report_file"


def report_name(lang: str) -> str:
    """The memo name of the report in `lang` (its words are that language's; the English one keeps
    the plain name)."""
    return REPORT_FILE if lang == DEFAULT else f"{REPORT_FILE}.{lang}"


FILE_NAMES = (TRACE_FILE, *(report_name(lang) for lang in LANGUAGES))


def trace_file_bytes(trace: Trace) -> bytes:
    """The trace file with this session's experiment results (bytes, not a deferred callable:
    see ui/memo.py `file_bytes`)."""
    found = current_experiments()
    return memo(TRACE_FILE, (trace, found), lambda: trace_to_bytes(trace, found))


def report_file_bytes(trace: Trace) -> bytes:
    """The run's HTML report (charts/report.py), in the session's language (one kept per
    language: its words are translated)."""
    found = current_experiments()
    return memo(report_name(language()), (trace, found),
                lambda: report_html(trace, found).encode("utf-8"))


def files_made(trace: Trace) -> bool:
    """Whether this session has made both of the run's files (the report in its language)."""
    found = current_experiments()
    return all(held(name, (trace, found)) is not None
               for name in (TRACE_FILE, report_name(language())))


def made_files(trace: Trace, found: Experiments) -> dict[str, bytes]:
    """The files this session has already made for (trace, found), compressed for keeping (the
    report holds plotly.js: ~5 MB, ~1.5 MB compressed)."""
    made = ((name, held(name, (trace, found))) for name in FILE_NAMES)
    return {name: zlib.compress(data, 6) for name, data in made if data is not None}


def keep_made_files(trace: Trace, found: Experiments, files: dict[str, bytes]) -> None:
    """Take files made elsewhere for a copy of (trace, found) as this session's own."""
    for name, data in files.items():
        if name in FILE_NAMES:
            keep(name, (trace, found), zlib.decompress(data))
