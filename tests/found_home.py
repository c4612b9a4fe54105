"""A fake home holding GGUF files where Ollama, LM Studio and the Hugging Face cache keep them,
and a folder of the user's with the cases a search must survive (a damaged file, a symlink loop,
a tree deeper than the search goes, a FIFO, a hidden folder)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .gguf_craft import gguf_bytes, metadata, tensors

TINY = gguf_bytes(metadata(), tensors())  # the crafted tiny llama: every tensor F32
OLLAMA_DIGEST = hashlib.sha256(TINY).hexdigest()


@dataclass(frozen=True, slots=True)
class FakeHome:
    home: Path
    ollama_blob: Path
    lmstudio: Path
    hf_link: Path
    folder: Path  # the user's folder (not searched unless named)


def mixed_gguf(path: Path) -> None:
    """Two Q8_0 matrices and an F32 norm, written by gguf-py's own writer."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    q8 = np.zeros((4, 2 * 34), np.uint8)  # 4 rows of 64 weights: two 34-byte Q8_0 blocks each
    writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_k.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("output_norm.weight", np.ones(64, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def manifest(layers: list[dict]) -> str:
    return json.dumps({"schemaVersion": 2,
                       "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                  "digest": "sha256:" + "0" * 64, "size": 2},
                       "layers": layers})


def make_home(root: Path) -> FakeHome:
    home = root / "home"
    store = home / ".ollama" / "models"
    (store / "blobs").mkdir(parents=True)
    blob = store / "blobs" / f"sha256-{OLLAMA_DIGEST}"
    blob.write_bytes(TINY)
    model_layer = {"mediaType": "application/vnd.ollama.image.model",
                   "digest": f"sha256:{OLLAMA_DIGEST}", "size": len(TINY)}
    template = {"mediaType": "application/vnd.ollama.image.template",
                "digest": "sha256:" + "1" * 64, "size": 10}
    tags = store / "manifests" / "registry.ollama.ai" / "library" / "tiny"
    tags.mkdir(parents=True)
    (tags / "1b").write_text(manifest([model_layer, template]))
    other = store / "manifests" / "registry.ollama.ai" / "library" / "nomodel"
    other.mkdir(parents=True)
    (other / "latest").write_text(manifest([template]))  # no model layer: not listed
    (other / "junk").write_text("{not json")

    lmstudio = home / ".lmstudio" / "models" / "publisher" / "tiny-GGUF" / "tiny-Q8_0.gguf"
    lmstudio.parent.mkdir(parents=True)
    mixed_gguf(lmstudio)

    hub = home / ".cache" / "huggingface" / "hub" / "models--org--tiny-GGUF"
    (hub / "blobs").mkdir(parents=True)
    (hub / "blobs" / "abc123").write_bytes(TINY + b"\0" * 32)  # another file than Ollama's
    links = []
    for revision in ("rev1", "rev2"):  # two revisions, one blob: listed once
        link = hub / "snapshots" / revision / "tiny-F32.gguf"
        link.parent.mkdir(parents=True)
        os.symlink("../../blobs/abc123", link)
        links.append(link)

    folder = root / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "good.gguf").write_bytes(TINY + b"\0" * 64)
    (folder / "bad.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    os.symlink(folder, folder / "sub" / "loop")  # back to an ancestor
    os.symlink(folder / "b", folder / "a")  # a ↔ b: a loop of links
    os.symlink(folder / "a", folder / "b")
    deep = folder.joinpath(*[f"d{i}" for i in range(10)])
    deep.mkdir(parents=True)
    (deep / "deep.gguf").write_bytes(TINY + b"\0" * 96)
    os.mkfifo(folder / "fifo.gguf")
    (folder / ".hidden").mkdir()
    (folder / ".hidden" / "hidden.gguf").write_bytes(TINY + b"\0" * 128)
    return FakeHome(home, blob, lmstudio, links[0], folder)


def machine_env(monkeypatch, home: Path) -> None:
    """The process's environment as a machine with `home` and no model variables."""
    monkeypatch.setenv("HOME", str(home))
    for name in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                 "INFERENCE_EXPLORER_MODELS"):
        monkeypatch.delenv(name, raising=False)
