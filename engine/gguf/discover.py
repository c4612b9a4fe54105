"""The GGUF files already on this machine: Ollama's store, LM Studio's folders, the Hugging Face
cache and the folders the user names, each with what its header says and whether it fits.

People who run models locally already hold GGUF files, kept by the tools they pulled them with
under names those tools chose (Ollama's are content hashes). Listing them by the name the user
knows, with what opening one would cost here, saves finding and typing a path.

The search is bounded because a folder the user names may be a whole disk: at most `MAX_FILES`
files, `MAX_DEPTH` folders down, `MAX_ENTRIES` directory entries looked at in all; every folder
is entered once (by device and inode, so a symlink loop ends), hidden folders are skipped, and
only regular files are read (a FIFO named `x.gguf` would block a reader forever). A header is
read once per (file, size, mtime) and kept (`read_header` takes ~0.1–0.3 s on a 128k
vocabulary, and the sidebar asks again on every rerun); a file it refuses is listed with its one
line. What a file needs is engine/gguf/fit.py's figure at the context the loader checks
(`reader.DEFAULT_CONTEXT`), against the memory available now: the list and the loader agree.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fit import GB, Memory, available_memory, fit_problem, need
from .header import GGUFError, Header, read_header
from .reader import DEFAULT_CONTEXT

MODELS_ENV = "INFERENCE_EXPLORER_MODELS"  # folders (os.pathsep-separated) to search as well
MAX_FILES = 256  # files listed, all sources together
MAX_DEPTH = 6  # folders below a folder the user names
MAX_ENTRIES = 50_000  # directory entries looked at, all sources together
MAX_MANIFEST_BYTES = 1 << 20  # an Ollama manifest is a few hundred bytes
CACHED_HEADERS = 1024
OLLAMA_MODEL = "application/vnd.ollama.image.model"  # the manifest layer that is the GGUF
OLLAMA_REGISTRY, OLLAMA_NAMESPACE = "registry.ollama.ai", "library"  # left out of short names
OLLAMA_SERVICE = Path("/usr/share/ollama/.ollama/models")  # the Linux service's store
DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
SOURCES = ("ollama", "lmstudio", "huggingface", "folder")  # the listing's order
SOURCE_NAMES = {"ollama": "Ollama", "lmstudio": "LM Studio", "huggingface": "Hugging Face cache",
                "folder": "folder"}


@dataclass(frozen=True, slots=True)
class FoundModel:
    """One GGUF file found here: what it is, where it came from, and what opening it needs."""

    name: str  # as its tool names it: "llama3.2:3b", "bartowski/Llama-3.2-1B-GGUF/x.gguf"
    source: str  # one of SOURCES
    path: str  # what the model box takes (the Hugging Face cache: the snapshot's link)
    file_bytes: int
    architecture: str | None = None
    parameters: int | None = None  # weights of every tensor, norms included
    types: tuple[tuple[str, int], ...] = ()  # (GGML type, tensors), most common first
    main_type: str | None = None  # the type that stores the most weights
    need_bytes: int | None = None  # fit.need at DEFAULT_CONTEXT: weights, KV cache, buffers
    shortfall: int = 0  # bytes more than available (0: it fits)
    fit_line: str | None = None  # fit_problem's line when it does not fit
    error: str | None = None  # the reader's one line when the file is no usable GGUF

    @property
    def fits(self) -> bool:
        return self.error is None and self.shortfall == 0

    @property
    def type_mix(self) -> str:
        """"Q4_K ×193, F32 ×66, Q6_K ×33", as gguf-info and export write it."""
        return ", ".join(f"{kind} ×{n}" for kind, n in self.types)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "path": self.path,
                "file_bytes": self.file_bytes, "architecture": self.architecture,
                "parameters": self.parameters, "types": dict(self.types),
                "main_type": self.main_type, "need_bytes": self.need_bytes,
                "fits": self.fits, "more_bytes_needed": self.shortfall, "fit_line": self.fit_line,
                "error": self.error}


@dataclass(frozen=True, slots=True)
class _Summary:
    """What a header says that the listing needs (kept per file, size and mtime)."""

    architecture: str
    parameters: int
    types: tuple[tuple[str, int], ...]
    main_type: str
    tensor_bytes: int
    layers: int
    kv_heads: int
    head_dim: int


_HEADERS: OrderedDict[tuple[str, int, int], _Summary | str] = OrderedDict()
_HEADERS_LOCK = threading.Lock()


class _Budget:
    """What one search may still look at, and the folders it has entered."""

    def __init__(self) -> None:
        self.entries = MAX_ENTRIES
        self.folders: set[tuple[int, int]] = set()
        self.files: dict[str, FoundModel] = {}  # real path → the first name found for it

    def spent(self) -> bool:
        return self.entries <= 0 or len(self.files) >= MAX_FILES


def _int(value: Any) -> int | None:
    """A metadata count as an int; a per-layer array (some architectures) as its largest."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(max(value)) if len(value) else None
    except (TypeError, ValueError):
        return None


def _summary(header: Header) -> _Summary:
    table = header.table
    arch = table.architecture
    weights: dict[str, int] = {}
    for t in table.tensors:
        weights[t.ggml_type] = weights.get(t.ggml_type, 0) + t.n_elements
    heads = _int(header.get(f"{arch}.attention.head_count")) or 0
    width = _int(header.get(f"{arch}.embedding_length")) or 0
    head_dim = _int(header.get(f"{arch}.attention.key_length")) or (width // heads if heads else 0)
    return _Summary(arch, table.n_elements, tuple(table.type_counts().items()),
                    max(weights, key=weights.__getitem__) if weights else "–",
                    table.tensor_bytes, _int(header.get(f"{arch}.block_count")) or 0,
                    _int(header.get(f"{arch}.attention.head_count_kv")) or heads, head_dim)


def _read(real: str, info: os.stat_result) -> _Summary | str:
    """The file's summary, or the reader's one line; from the cache while size and mtime hold."""
    key = (real, info.st_size, info.st_mtime_ns)
    with _HEADERS_LOCK:
        if key in _HEADERS:
            _HEADERS.move_to_end(key)
            return _HEADERS[key]
    try:
        found: _Summary | str = _summary(read_header(real))
    except GGUFError as err:
        found = str(err)
    with _HEADERS_LOCK:
        _HEADERS[key] = found
        while len(_HEADERS) > CACHED_HEADERS:
            _HEADERS.popitem(last=False)
    return found


def _regular(path: Path) -> tuple[str, os.stat_result] | None:
    """(real path, stat) of a readable regular file, links followed; None for anything else."""
    try:
        real = os.path.realpath(path, strict=True)
        info = os.stat(real)
    except (OSError, ValueError, RuntimeError):  # a dangling link, a loop, a NUL byte
        return None
    if not stat.S_ISREG(info.st_mode) or not os.access(real, os.R_OK):
        return None
    return real, info


def _walk(root: Path, depth: int, budget: _Budget, wanted: str | None = ".gguf") -> Iterator[Path]:
    """Files under `root`, at most `depth` folders down, whose names end in `wanted` (None:
    every file), in name order; each folder entered once, hidden ones never."""
    stack = [(root, 0)]
    while stack and not budget.spent():
        folder, level = stack.pop()
        try:
            info = os.stat(folder)
            if (info.st_dev, info.st_ino) in budget.folders or not stat.S_ISDIR(info.st_mode):
                continue
            budget.folders.add((info.st_dev, info.st_ino))
            with os.scandir(folder) as it:
                entries = []
                for entry in it:
                    budget.entries -= 1
                    if budget.entries < 0:
                        break
                    entries.append(entry)
        except (OSError, ValueError):
            continue
        below = []
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir()  # follows a link: its target is checked on entering
            except OSError:
                continue
            if is_dir:
                if level < depth:
                    below.append((Path(entry.path), level + 1))
            elif wanted is None or entry.name.lower().endswith(wanted):
                yield Path(entry.path)
        stack.extend(reversed(below))


def _ollama_name(parts: tuple[str, ...]) -> str:
    """Ollama's short name of manifests/<registry>/<namespace>/<model>/<tag>: the default
    registry and its `library` namespace left out, as `ollama list` prints it."""
    registry, namespace, model, tag = parts
    if registry == OLLAMA_REGISTRY:
        return f"{model}:{tag}" if namespace == OLLAMA_NAMESPACE else f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"


def _ollama_blob(manifest: Path, store: Path) -> Path | None:
    """The blob a manifest's model layer names, or None (not a model, or not JSON we know)."""
    found = _regular(manifest)
    if found is None or found[1].st_size > MAX_MANIFEST_BYTES:
        return None
    try:
        layers = json.loads(Path(found[0]).read_bytes()).get("layers")
    except (OSError, ValueError, AttributeError):
        return None
    for layer in layers if isinstance(layers, list) else ():
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL:
            match = DIGEST.fullmatch(str(layer.get("digest", "")))
            return store / "blobs" / f"sha256-{match.group(1)}" if match else None
    return None


def _ollama(store: Path, budget: _Budget) -> Iterator[tuple[str, Path]]:
    manifests = store / "manifests"
    for manifest in _walk(manifests, 3, budget, wanted=None):
        parts = manifest.relative_to(manifests).parts
        blob = _ollama_blob(manifest, store) if len(parts) == 4 else None
        if blob is not None:
            yield _ollama_name(parts), blob


def _lmstudio(folder: Path, budget: _Budget) -> Iterator[tuple[str, Path]]:
    for path in _walk(folder, 3, budget):  # <publisher>/<repo>/[a folder of parts]/file
        yield path.relative_to(folder).as_posix(), path


def _huggingface(hub: Path, budget: _Budget) -> Iterator[tuple[str, Path]]:
    """models--<org>--<name>/snapshots/<revision>/**.gguf, named <org>/<name>/<file>."""
    repos = []
    try:
        with os.scandir(hub) as it:
            for entry in it:
                budget.entries -= 1
                if budget.entries < 0:
                    break
                if entry.name.startswith("models--"):
                    repos.append(Path(entry.path))
    except (OSError, ValueError):
        return
    for repo in sorted(repos):
        snapshots = repo / "snapshots"
        for path in _walk(snapshots, 4, budget):
            inside = path.relative_to(snapshots).parts[1:]  # without the revision
            yield "/".join([*repo.name.removeprefix("models--").split("--"), *inside]), path


def _folder(folder: Path, budget: _Budget) -> Iterator[tuple[str, Path]]:
    if folder.suffix.lower() == ".gguf" and _regular(folder) is not None:
        yield folder.name, folder  # a file named where a folder was asked for: that file
        return
    for path in _walk(folder, MAX_DEPTH, budget):
        yield path.relative_to(folder).as_posix(), path


def _paths(value: str | None) -> list[Path]:
    return [Path(p).expanduser() for p in (value or "").split(os.pathsep) if p.strip()]


def search_places(extra_folders: Iterable[str | os.PathLike] = (), home: Path | None = None,
                  environ: Mapping[str, str] | None = None) -> list[tuple[str, Path]]:
    """(source, folder) in the order they are searched. The Linux service's Ollama store is
    searched for the real home only (a test's fake home stands for the whole machine)."""
    env = os.environ if environ is None else environ
    real_home = home is None
    home = Path.home() if home is None else Path(home)
    ollama = [*_paths(env.get("OLLAMA_MODELS")), home / ".ollama" / "models",
              *([OLLAMA_SERVICE] if real_home else [])]
    hf_home = _paths(env.get("HF_HOME")) or [home / ".cache" / "huggingface"]
    hub = (_paths(env.get("HF_HUB_CACHE")) or _paths(env.get("HUGGINGFACE_HUB_CACHE"))
           or [hf_home[0] / "hub"])
    places = [("ollama", p) for p in ollama]
    places += [("lmstudio", home / ".lmstudio" / "models"),
               ("lmstudio", home / ".cache" / "lm-studio" / "models")]
    places += [("huggingface", p) for p in hub]
    places += [("folder", p) for p in _paths(env.get(MODELS_ENV))]
    places += [("folder", Path(p).expanduser()) for p in extra_folders if str(p).strip()]
    return places


_FINDERS = {"ollama": _ollama, "lmstudio": _lmstudio, "huggingface": _huggingface,
            "folder": _folder}


def _described(name: str, source: str, path: Path, real: str, info: os.stat_result,
               memory: Memory) -> FoundModel:
    summary = _read(real, info)
    if isinstance(summary, str):
        return FoundModel(name, source, str(path), info.st_size, error=summary)
    cost = need(summary.tensor_bytes, summary.layers, summary.kv_heads, summary.head_dim,
                DEFAULT_CONTEXT)  # the loader's own figure (reader.open_gguf), so both agree
    return FoundModel(name, source, str(path), info.st_size, summary.architecture,
                      summary.parameters, summary.types, summary.main_type, cost.total,
                      max(0, cost.total - memory.available), fit_problem(name, cost, memory))


def find_models(extra_folders: Iterable[str | os.PathLike] = (), home: Path | None = None, *,
                environ: Mapping[str, str] | None = None,
                memory: Memory | None = None) -> list[FoundModel]:
    """Every GGUF file found (each file once, under the first name found for it), in the order
    of SOURCES, then by name; at most MAX_FILES. `home`, `environ` and `memory` stand in for the
    machine's in tests."""
    budget = _Budget()
    memory = memory or available_memory()
    for source, place in search_places(extra_folders, home, environ):
        for name, path in _FINDERS[source](place, budget):
            if budget.spent():
                break
            found = _regular(path)
            if found is None or found[0] in budget.files:
                continue
            budget.files[found[0]] = _described(name, source, Path(os.path.abspath(path)),
                                                *found, memory)
    return sorted(budget.files.values(), key=lambda m: (SOURCES.index(m.source), m.name))


def describe(model: FoundModel) -> str:
    """One line for the command line: name, source, what it is, its size and the fit."""
    where = SOURCE_NAMES[model.source]
    if model.error is not None:
        return f"{model.name} ({where}): not readable: {model.error}"
    n = model.parameters or 0
    params = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n:,}"
    size = (f"{model.file_bytes / GB:.2f} GB" if model.file_bytes >= GB else
            f"{model.file_bytes / 1e6:.1f} MB")
    fit = "fits" if model.fits else f"needs {model.shortfall / GB:.1f} GB more"
    return (f"{model.name} ({where}): {model.architecture}, {params} parameters, "
            f"{model.type_mix}; {size}; {fit}")
