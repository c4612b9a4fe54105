"""GGUF files: open any llama-family GGUF as a model, and export a weights variant as one.

Modules, one job each:
- `names`: llama.cpp's tensor names for a Hugging Face llama-family model, and the row order
  llama.cpp gives the query and key weights (`permute` / `unpermute`);
- `header`: reads and checks a file's header (metadata, tensor table) against the file's size
  before anything is allocated or memory-mapped — gguf-py's reader trusts every count it reads;
- `table`: the file's tensor table as a record (`GGUFTable`: name, GGML type, shape, bytes, bits
  per weight), kept on the loaded model and printed by `python -m engine gguf-info`;
- `reader`: the torch model and tokenizer from a checked file's own tensors (`open_gguf`; the
  loader calls it for a `--model PATH.gguf`);
- `writer`: writes named tensors in their GGML types, the architecture's settings and the
  tokenizer with gguf-py's `GGUFWriter`;
- `export`: a weights variant of a loaded model as GGUF tensors (the quantizers of engine/quant);
- `cli`: `python -m engine export` and `python -m engine gguf-info`;
- `blocks`: a file's tensors as stored (GGML blocks by the table's offsets), for the native step
  to decode on (engine/models.py `native_decoder`);
- `discover` and `models_cli`: the GGUF files already on this machine (Ollama, LM Studio, the
  Hugging Face cache, the user's folders) and `python -m engine models`; each file weighed at the
  model store's default context, so they sit at the engine's top.

Reading is part of loading a model, so `names`, `header`, `table`, `reader` and `writer` sit in
the engine's core (they import nothing above it); `export` and `cli` quantize and `blocks` feeds
the native step, so they are a subsystem beside engine/quant and engine/kernels
(tests/test_layering.py places each module).
The package itself imports nothing.
"""
