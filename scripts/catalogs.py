"""Keep the catalogs in step with the source: extract, update, simplify, compile, check.

    python scripts/catalogs.py update [FRAGMENT.json ...]   # extract, fill, simplify, compile
    python scripts/catalogs.py check                        # exit 1 on anything out of step

- extract: Babel reads every `_`, `ngettext` and `N_` in app.py, pages/, ui/, charts/ and engine/ (and the
  English titles of assets/sample_prompts.json and assets/examples/examples.json, and the
  Serving samples' titles and descriptions) into
  assets/locale/messages.pot.
- update: assets/locale/zh_Hant/…/messages.po gets exactly the template's messages (a message no
  longer in the source is dropped; one new to it takes its translation from a FRAGMENT.json
  {msgid: 繁體} if given, else stays empty and `check` fails);
- simplify: zh_Hans is generated, never edited: OpenCC's Taiwan → Mainland conversion with phrases
  (tw2sp: 記憶體 → 内存, 程式 → 程序), then the reviewed fixes in assets/locale/zh_Hans/review.json
  (phrases OpenCC leaves reading wrong), applied in order; the glossary's Simplified column too;
- compile: both `.mo` files, which the app reads (i18n.translations).
"""

from __future__ import annotations

import fcntl
import io
import json
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.extract import extract_from_dir, extract_from_file
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parents[1]
LOCALE = ROOT / "assets" / "locale"
POT = LOCALE / "messages.pot"
REVIEW = LOCALE / "zh_Hans" / "review.json"
GLOSSARY = ROOT / "assets" / "glossary.json"
SOURCES = ("pages", "ui", "charts", "engine")
KEYWORDS = {"_": None, "ngettext": (1, 2), "N_": None}
STREAMS = ROOT / "assets" / "serving_streams.json"  # the Serving page's samples: titles, about
JSON_TITLES = (ROOT / "assets" / "sample_prompts.json", ROOT / "assets" / "examples" / "examples.json")
HEADER = "Inference Explorer"
# Fixed header dates: the generated files change only when their messages do (and `check` can
# compare them byte for byte, the compiled ones included).
DATES = {"creation_date": datetime(2026, 1, 1, tzinfo=timezone.utc),
         "revision_date": datetime(2026, 1, 1, tzinfo=timezone.utc)}


def po(lang: str) -> Path:
    return LOCALE / lang / "LC_MESSAGES" / "messages.po"


def _python_messages() -> Iterator[tuple[str | tuple[str, str], str, int]]:
    """(message, file, line) for every marked string of the app's source."""
    found = [(ROOT / "app.py", extract_from_file("python", ROOT / "app.py", keywords=KEYWORDS))]
    for name in SOURCES:
        found.append((ROOT / name, extract_from_dir(
            ROOT / name, method_map=[("**.py", "python")], keywords=KEYWORDS)))
    for base, results in found:
        for result in results:
            if base.is_dir():
                filename, lineno, message = result[0], result[1], result[2]
                filename = f"{base.name}/{filename}"
            else:
                lineno, message = result[0], result[1]
                filename = base.name
            yield message, filename, lineno


def template() -> Catalog:
    pot = Catalog(project=HEADER, fuzzy=False, **DATES)
    for message, filename, lineno in _python_messages():
        if isinstance(message, tuple):
            message = tuple(m for m in message if m is not None)
        if not message or (isinstance(message, tuple) and not message[0]):
            continue
        pot.add(message, locations=[(filename, lineno)])
    for path in JSON_TITLES:
        for item in json.loads(path.read_text()):
            if item.get("lang", "en") != "en":  # written in its own language: shown as it is
                continue
            pot.add(item["title"], locations=[(path.relative_to(ROOT).as_posix(), 0)])
    streams = json.loads(STREAMS.read_text())
    for item in streams["streams"] + streams["speculation"]:
        for key in ("title", "about"):
            if item.get(key):
                pot.add(item[key], locations=[(STREAMS.relative_to(ROOT).as_posix(), 0)])
    return pot


def _text(catalog: Catalog) -> bytes:
    out = io.BytesIO()
    write_po(out, catalog, width=100, sort_output=True, include_lineno=False)
    return out.getvalue()


def _read(path: Path, locale: str) -> Catalog:
    if not path.exists():
        return Catalog(locale=locale, project=HEADER)
    with path.open("rb") as f:
        return read_po(f, locale=locale)


def _msgstr(message) -> str | tuple[str, ...]:
    return message.string


def _key(msgid) -> str:
    return msgid[0] if isinstance(msgid, tuple) else msgid


def _translated(string) -> bool:
    return all(string) if isinstance(string, tuple) else bool(string)


def filled(pot: Catalog, old: Catalog, fragments: dict[str, str], locale: str) -> Catalog:
    """The template's messages with their translations from `old` or `fragments`."""
    new = Catalog(locale=locale, project=HEADER, fuzzy=False, **DATES)
    for message in pot:
        if not message.id:
            continue
        text = fragments.get(_key(message.id))  # a fragment is a translator's newer word
        before = old.get(message.id)
        string = before.string if before is not None and _translated(before.string) else None
        if text:
            string = (text, text) if isinstance(message.id, tuple) else text
        if string is None:
            string = ("", "") if isinstance(message.id, tuple) else ""
        if isinstance(string, tuple):  # Chinese has one form: msgstr[0] only (as read_po reads it)
            string = string[:new.num_plurals]
        new.add(message.id, string, locations=message.locations, flags=message.flags - {"fuzzy"})
    return new


def simplifier():
    """Traditional (Taiwan) → Simplified (Mainland): OpenCC's tw2sp, then the reviewed fixes."""
    import opencc

    convert = opencc.OpenCC("tw2sp").convert
    fixes = json.loads(REVIEW.read_text())["replace"] if REVIEW.exists() else []

    def simplify(text: str) -> str:
        out = convert(text)
        for wrong, right in fixes:
            out = out.replace(wrong, right)
        return out

    return simplify


def simplified(hant: Catalog, simplify) -> Catalog:
    new = Catalog(locale="zh_Hans", project=HEADER, fuzzy=False, **DATES)
    for message in hant:
        if not message.id:
            continue
        string = message.string
        string = tuple(simplify(s) for s in string) if isinstance(string, tuple) else simplify(string)
        new.add(message.id, string, locations=message.locations, flags=message.flags)
    return new


def glossary_simplified(simplify) -> list[dict]:
    terms = json.loads(GLOSSARY.read_text())
    for term in terms["terms"]:
        term["zh-Hans"] = simplify(term["zh-Hant"])
        if "note-zh-Hant" in term:
            term["note-zh-Hans"] = simplify(term["note-zh-Hant"])
    return terms


def _mo(catalog: Catalog) -> bytes:
    out = io.BytesIO()
    write_mo(out, catalog, use_fuzzy=False)
    return out.getvalue()


def _glossary_text(terms) -> str:
    return json.dumps(terms, ensure_ascii=False, indent=1) + "\n"


def wanted(fragments: dict[str, str]) -> dict[Path, bytes]:
    """Every generated file with the contents it should have now."""
    pot = template()
    hant = filled(pot, _read(po("zh_Hant"), "zh_Hant"), fragments, "zh_Hant")
    simplify = simplifier()
    hans = simplified(hant, simplify)
    files = {POT: _text(pot), po("zh_Hant"): _text(hant), po("zh_Hans"): _text(hans),
             po("zh_Hant").with_suffix(".mo"): _mo(hant), po("zh_Hans").with_suffix(".mo"): _mo(hans)}
    if GLOSSARY.exists():
        files[GLOSSARY] = _glossary_text(glossary_simplified(simplify)).encode()
    return files


def _comparable(path: Path, data: bytes) -> bytes:
    """A .po/.pot without its header lines that carry dates (the creation and revision dates)."""
    if path.suffix not in (".po", ".pot"):
        return data
    return b"\n".join(line for line in data.split(b"\n")
                      if not line.startswith((b'"POT-Creation-Date', b'"PO-Revision-Date')))


def untranslated(catalog_path: Path, locale: str) -> list[str]:
    return [_key(m.id) for m in _read(catalog_path, locale) if m.id and not _translated(m.string)]


@contextmanager
def _locked() -> Iterator[None]:
    with (LOCALE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def update(fragment_paths: Iterable[str]) -> int:
    fragments: dict[str, str] = {}
    for path in fragment_paths:
        try:
            fragments.update(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as e:
            print(f"skipped {path}: {e}")
    with _locked():
        for path, data in wanted(fragments).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or _comparable(path, path.read_bytes()) != _comparable(path, data):
                path.write_bytes(data)
    missing = untranslated(po("zh_Hant"), "zh_Hant")
    print(f"{len(template())} messages; {len(missing)} without a translation")
    for msgid in missing[:40]:
        print("  untranslated:", msgid[:100])
    return 0


def stale() -> list[str]:
    """Generated files that differ from what the source and the Traditional catalog give."""
    return [path.relative_to(ROOT).as_posix() for path, data in wanted({}).items()
            if not path.exists() or _comparable(path, path.read_bytes()) != _comparable(path, data)]


def check() -> int:
    problems = [f"out of step with the source: {p} (run: python scripts/catalogs.py update)"
                for p in stale()]
    problems += [f"untranslated: {m[:100]}" for m in untranslated(po("zh_Hant"), "zh_Hant")]
    for line in problems:
        print(line)
    return 1 if problems else 0


def missing(paths: list[str]) -> int:
    """The marked messages of these source files that neither the Traditional catalog nor any
    fragment in /work/i18n-frag translates (a translator's to-do list)."""
    known = {_key(m.id) for m in _read(po("zh_Hant"), "zh_Hant") if m.id and _translated(m.string)}
    for fragment in sorted(Path("/work/i18n-frag").glob("*.json")):
        try:
            known |= set(json.loads(fragment.read_text()))
        except ValueError:
            print(f"skipped {fragment}: not JSON")
    count = 0
    for path in paths:
        for lineno, message, *_rest in extract_from_file("python", path, keywords=KEYWORDS):
            key = _key(message) if not isinstance(message, tuple) else message[0]
            if key and key not in known:
                count += 1
                print(f"{path}:{lineno}: {key[:110]!r}")
    print(f"{count} without a translation")
    return 1 if count else 0


if __name__ == "__main__":
    command, *args = sys.argv[1:] or ["check"]
    run = {"update": update, "missing": missing}.get(command)
    sys.exit(run(args) if run else check())
