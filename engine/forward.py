"""Generation as plain functions around the model (gpt-fast's shape), not `model.generate`.

`prefill()` runs the whole prompt once and fills the KV cache; `decode_one_token()` runs one token
against it; with the cache off, `forward_full()` recomputes the whole sequence every step.
`timed_greedy()` strings a prefill's logits and any decode step into a timed greedy continuation.
The recorded run (engine/runner.py), the native and compiled decoders, the dtype comparison, the
quantization study and speculative decoding all call these, so every path runs the same forward.

Shapes: B = 1 (one sequence), T = tokens in this forward, S = positions so far, V = vocabulary,
L = decoder layers.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from transformers import Cache, DynamicCache

from .clock import clock_ms
from .errors import InputError
from .loader import LoadedModel

Forward = tuple[torch.Tensor, torch.Tensor | None]  # logits (V,), hidden (L+1, hidden) or None
# What a transformers cache layer may hold: keys and values, and the scales of a quantized one.
CACHE_TENSORS = ("keys", "values", "key_scales", "value_scales", "latent", "index_keys")


_SENTINEL = "\x00user text\x00"  # stands for the prompt when the chat template is rendered


def text_ids(tokenizer: Any, text: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of text someone typed, as ordinary text: a typed `<|im_end|>` is the several
    tokens of its characters, never the model's end-of-turn token (`split_special_tokens`), so
    no visitor can forge a turn of the chat. Text without such strings tokenizes as usual."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens,
                          split_special_tokens=True)["input_ids"])


def special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens: the named ones (bos, eos, …) and every added token
    marked special — Llama 3's `<|start_header_id|>` / `<|end_header_id|>` are only the latter."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return set(tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}


def _holds_added_token(tokenizer: Any, text: str) -> bool:
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return any(t.content in text for t in added.values())


def _chat_text(tokenizer: Any, content: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                         add_generation_prompt=True, tokenize=False)


def prepare_prompt(tokenizer: Any, prompt: str, chat_template: bool) -> list[int]:
    """Token ids of the prompt: wrapped in the model's chat template (as a user turn) by default.

    The template's own markers (`<|im_start|>`, `<|im_end|>`) are special tokens; the prompt is
    ordinary text (`text_ids`) even where it spells a marker. A prompt holding no added token's
    string is tokenized with the template text in one call, exactly as `generate()` users do; one
    that does is tokenized apart from the template text around it."""
    if not (chat_template and getattr(tokenizer, "chat_template", None)):
        return text_ids(tokenizer, prompt, add_special_tokens=True)
    text = _chat_text(tokenizer, prompt)
    if not _holds_added_token(tokenizer, prompt):
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    before, _, after = _chat_text(tokenizer, _SENTINEL).partition(_SENTINEL)
    if before + prompt + after != text:  # a template that rewrites the text: no place to split
        raise InputError("this model's chat template changes the prompt, so the special-token "
                         "text in it (such as <|im_end|>) cannot be kept as text: remove it, "
                         "or turn the chat template off")
    return (list(tokenizer(before, add_special_tokens=False)["input_ids"])
            + text_ids(tokenizer, prompt)
            + list(tokenizer(after, add_special_tokens=False)["input_ids"]))


def _forward(model: Any, input_ids: torch.Tensor, cache: Cache | None,
             want_hidden: bool) -> Forward:
    """input_ids (1, T) → the last position's logits (V,) and, with `want_hidden`, its residual
    stream (L+1, hidden): entering every layer, then the last layer's output.

    transformers hands over its last hidden state after the final norm, which rescales it (and
    so is not the residual stream any more); the final norm's input, read by a hook, is the last
    layer's output itself. The lens applies the final norm to every row alike."""
    if not want_hidden:
        out = model(input_ids=input_ids, cache=cache, use_cache=cache is not None, logits_to_keep=1)
        return out.logits[0, -1], None
    norm = getattr(getattr(model, "model", None), "norm", None)
    last: list[torch.Tensor] = []
    hook = None if norm is None else norm.register_forward_pre_hook(
        lambda module, args: last.append(args[0][0, -1]))
    try:
        out = model(input_ids=input_ids, cache=cache, use_cache=cache is not None,
                    output_hidden_states=True, logits_to_keep=1)
    finally:
        if hook is not None:
            hook.remove()
    rows = [h[0, -1] for h in out.hidden_states[:-1]]
    rows.append(last[-1] if last else out.hidden_states[-1][0, -1])  # no final norm: as given
    return out.logits[0, -1], torch.stack(rows)  # (V,), (L+1, hidden)


def prefill(model: Any, prompt_ids: torch.Tensor, cache: Cache | None,
            want_hidden: bool = False) -> Forward:
    """One forward over the whole prompt (1, T); fills `cache` and returns the last logits."""
    return _forward(model, prompt_ids, cache, want_hidden)


def decode_one_token(model: Any, token: torch.Tensor, cache: DynamicCache,
                     want_hidden: bool = False) -> Forward:
    """One forward of a single token (1, 1) against the cache, which grows by one position."""
    return _forward(model, token, cache, want_hidden)


def forward_full(model: Any, all_ids: torch.Tensor, want_hidden: bool = False) -> Forward:
    """Cache off: recompute the whole sequence (1, S) to get the next token's logits."""
    return _forward(model, all_ids, None, want_hidden)


def eos_token_ids(lm: LoadedModel) -> frozenset[int]:
    """Every id that ends a generation: the generation config's (one or many) and the
    tokenizer's; for a GGUF's model also every end-of-generation token llama.cpp stops at
    (`<|eot_id|>`, `<|im_end|>`, `<|endoftext|>`, … where the vocabulary has them as control
    tokens), so a run ends where llama.cpp's would."""
    ids: set[int] = set()
    configured = getattr(lm.model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if lm.tokenizer.eos_token_id is not None:
        ids.add(lm.tokenizer.eos_token_id)
    if lm.gguf_tensors is not None:  # llama.cpp ends at every end-of-generation token it knows
        from .gguf.vocab import EOG_TEXTS

        added = getattr(lm.tokenizer, "added_tokens_decoder", None) or {}
        ids.update(i for i, t in added.items()
                   if t.special and t.content in EOG_TEXTS and i < lm.spec.vocab_size)
    return frozenset(ids)


def timed_greedy(first_logits: torch.Tensor, step: Callable[[int, int], torch.Tensor],
                 new_tokens: int, device: torch.device) -> tuple[list[int], list[float]]:
    """A greedy continuation for timing a decode step: the first token from the prefill's logits
    (V,), then `step(token, i)` → (V,) logits for decode step i. Returns the tokens and each
    step's ms (synchronized clock). Shared by the compiled, native and dtype comparisons."""
    token = int(first_logits.argmax())
    tokens, times = [token], []
    for i in range(new_tokens - 1):
        start = clock_ms(device)
        token = int(step(token, i).argmax())
        times.append(clock_ms(device) - start)
        tokens.append(token)
    return tokens, times


def cache_layer_bytes(cache: Any) -> tuple[int, ...]:
    """Bytes held by each layer's cached tensors (transformers' Cache.layers API), measured from
    the tensors themselves (numel · element size), scales of a quantized cache included."""
    if cache is None:
        return ()
    sizes = []
    for layer in cache.layers:
        size = 0
        for name in CACHE_TENSORS:
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                size += tensor.numel() * tensor.element_size()  # = tensor.nbytes
        sizes.append(size)
    return tuple(sizes)
