"""AWQ-style scales on a tiny random Llama (fast tier): folds keep the float function exactly,
the rounded copy re-quantizes losslessly, bytes are measured, the shared model is untouched."""

from __future__ import annotations

import pytest
import torch

from engine.errors import InputError
from engine.quant import VARIANT_NAMES, awq, variants
from engine.quant.apply import apply_variant
from engine.quant.awq import (
    AwqSearch,
    GroupScale,
    apply_awq,
    cached_search,
    fold_scales,
    folded_model,
    rounded,
    working_copy,
)
from engine.quant.formats import quantize
from engine.quant.scheme import FORMATS
from engine.quant.variants import decoder_linears, embedding_weights

AWQ = ("awq_q4_0", "awq_q3")
IDS = [5, 17, 300, 4000, 12, 7, 99, 1234, 42, 8, 600, 77]


def logits(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]  # (S, V)


def random_search(model, seed: int = 1) -> AwqSearch:
    """Scales spread over ~e^±1 in every group; o's tied per KV head (4 query heads, 2 KV)."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def scale(n: int) -> torch.Tensor:
        return torch.exp(0.7 * torch.randn(n, generator=g))

    layers = []
    for _ in model.model.layers:
        t = scale(kv * hd).reshape(kv, 1, hd)  # one scale per KV-head channel
        o = t.expand(kv, heads // kv, hd).reshape(-1)  # repeated across its query heads
        layers.append({"qkv": GroupScale("qkv", scale(cfg.hidden_size), 0.5, 0.0, 0.0),
                       "gate_up": GroupScale("gate_up", scale(cfg.hidden_size), 0.5, 0.0, 0.0),
                       "down": GroupScale("down", scale(cfg.intermediate_size), 0.5, 0.0, 0.0),
                       "o": GroupScale("o", o, 0.5, 0.0, 0.0)})
    return AwqSearch("q4_0", len(IDS), tuple(layers))


def test_the_names_are_variants_the_cli_lists():
    assert set(AWQ) <= set(VARIANT_NAMES)


def test_folding_any_scales_keeps_the_float_function(tiny_lm):
    """Random scales (not the searched ones, which might be near 1) folded into the norms, up_proj
    and v_proj: logits equal the original's. Fails if any fold is wrong, including o_proj's
    mapping of query heads to KV heads under grouped-query attention."""
    work = working_copy(tiny_lm.model)
    search = random_search(tiny_lm.model)
    fold_scales(work, search)
    layer = work.model.layers[0]
    assert not torch.allclose(layer.self_attn.v_proj.weight,  # the fold did change weights
                              tiny_lm.model.model.layers[0].self_attn.v_proj.weight)
    ref = logits(tiny_lm.model)
    assert (logits(work) - ref).abs().max() <= 1e-5 * max(1.0, float(ref.abs().max()))


def test_an_untied_o_scale_cannot_be_folded_exactly(tiny_lm):
    """The reason o's scale is searched tied: a scale that differs between query heads sharing a
    KV head has no exact fold into v_proj (the check above would fail for it)."""
    work = working_copy(tiny_lm.model)
    search = random_search(tiny_lm.model)
    cfg = tiny_lm.model.config
    untied = torch.exp(0.7 * torch.randn(cfg.num_attention_heads * cfg.head_dim,
                                         generator=torch.Generator().manual_seed(3)))
    layers = tuple({**g, "o": GroupScale("o", untied, 0.5, 0.0, 0.0)} for g in search.layers)
    fold_scales(work, AwqSearch("q4_0", 0, layers))
    assert (logits(work) - logits(tiny_lm.model)).abs().max() > 1e-3


@pytest.mark.parametrize("name", AWQ)
def test_the_searched_scales_fold_exactly(tiny_lm, name):
    work, search = folded_model(tiny_lm, name)
    ref = logits(tiny_lm.model)
    assert (logits(work) - ref).abs().max() <= 1e-5 * max(1.0, float(ref.abs().max()))
    assert len(search.layers) == 2 and all(set(g) == {"qkv", "o", "gate_up", "down"}
                                           for g in search.layers)
    for groups in search.layers:
        for g in groups.values():  # α = 0 (plain rounding) is on the grid: never worse
            assert g.mse_awq <= g.mse_plain and 0.0 <= g.alpha <= 1.0
            assert torch.isfinite(g.scale).all() and (g.scale > 0).all()


@pytest.mark.parametrize("base", ["q4_0", "q3", "q4_1", "q2"])
def test_the_search_rounds_exactly_as_quantize_does(base):
    torch.manual_seed(0)
    w = torch.randn(96, 128) * torch.exp(torch.randn(128))  # uneven columns, as after scaling
    w[3, :32] = 0.0  # an all-zero group
    w[5, 32:64] = 0.25  # a constant group
    assert torch.equal(rounded(w, FORMATS[base]), quantize(w, FORMATS[base]).dequantize())


@pytest.mark.parametrize("name", AWQ)
def test_requantizing_the_copy_is_lossless(tiny_lm, name):
    """What the native low-bit step needs: the copy's decoder Linears already lie on the base
    format's grid, so rounding them again gives the same values."""
    model, _ = apply_awq(tiny_lm, name)
    base = FORMATS[name.removeprefix("awq_")]
    for n, m in decoder_linears(model):
        assert torch.equal(quantize(m.weight, base).dequantize(), m.weight), n
    for w in embedding_weights(model):  # and the LM head, read as Q8_0
        assert torch.equal(quantize(w, FORMATS["q8_0"]).dequantize(), w)


@pytest.mark.parametrize("name", AWQ)
def test_bytes_are_measured_from_the_stored_tensors(tiny_lm, name):
    model, report = apply_awq(tiny_lm, name)
    base = FORMATS[name.removeprefix("awq_")]
    stored = [quantize(m.weight, base) for _, m in decoder_linears(model)]
    assert report.variant == name and "AWQ" in report.storage
    assert report.code_bytes == sum(s.code_bytes for s in stored)
    assert report.group_bytes == sum(s.group_bytes for s in stored)
    assert report.quantized_params == sum(m.weight.numel() for _, m in decoder_linears(model))
    embed = [quantize(w, FORMATS["q8_0"]) for w in embedding_weights(model)]
    assert report.embedding_storage == "Q8_0"
    assert report.embedding_bytes == sum(s.nbytes for s in embed)
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    assert report.other_params == sum(p.numel() for p in norms)
    assert report.other_bytes == sum(p.nbytes for p in norms)
    assert report.nbytes == report.formula_bytes
    plain = apply_variant(tiny_lm, name.removeprefix("awq_"))[1]
    assert report.nbytes == plain.nbytes  # the scales cost no bytes: they live in the norms


def test_the_shared_model_is_untouched_and_nothing_is_shared(tiny_lm):
    before = {n: p.detach().clone() for n, p in tiny_lm.model.named_parameters()}
    model, _ = apply_awq(tiny_lm, "awq_q3")
    for n, p in tiny_lm.model.named_parameters():
        assert torch.equal(p, before[n]), n
    assert not {p.data_ptr() for p in tiny_lm.model.parameters()} & \
        {p.data_ptr() for p in model.parameters()}
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied in the copy
    norm = "model.layers.0.input_layernorm.weight"
    assert not torch.equal(dict(model.named_parameters())[norm], before[norm])  # 1 / s folded
    assert not tiny_lm.model.model.layers[0].self_attn.q_proj._forward_pre_hooks  # hooks gone


def test_it_is_deterministic_and_searches_once(tiny_lm, monkeypatch):
    first, _ = apply_awq(tiny_lm, "awq_q4_0")
    assert cached_search(tiny_lm, "awq_q4_0") is not None
    monkeypatch.setattr(awq, "search_scales", lambda *a, **k: pytest.fail("searched again"))
    second, _ = apply_awq(tiny_lm, "awq_q4_0")
    for (n, a), b in zip(first.named_parameters(), second.parameters()):
        assert torch.equal(a, b), n
    monkeypatch.undo()
    text = "A different calibration text, searched afresh, gives the same scales twice over."
    one = folded_model(tiny_lm, "awq_q4_0", text=text)[1]
    awq._SEARCHES.clear()
    two = folded_model(tiny_lm, "awq_q4_0", text=text)[1]
    for a, b in zip(one.layers, two.layers):
        assert all(torch.equal(a[k].scale, b[k].scale) for k in a)


def test_apply_variant_dispatches_and_reports_progress(tiny_lm):
    seen: list[tuple[float, str]] = []
    awq._SEARCHES.clear()
    apply_awq(tiny_lm, "awq_q3", progress=lambda f, what: seen.append((f, what)))
    assert [f for f, _ in seen] == sorted(f for f, _ in seen) and seen[-1][0] == 1.0
    assert any("layer 2 of 2" in what for _, what in seen)
    _, report = apply_variant(tiny_lm, "awq_q3")
    assert report.variant == "awq_q3"


def test_a_fold_that_changes_the_function_is_refused(tiny_lm, monkeypatch):
    def broken(model, search):  # scales the Linears but forgets the norms: not the same model
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(search.layers[0]["qkv"].scale * 0 + 3.0)

    monkeypatch.setattr(awq, "fold_scales", broken)
    with pytest.raises(InputError, match="not applied") as err:
        folded_model(tiny_lm, "awq_q4_0", text="Another text, so nothing is cached for it yet.")
    assert "\n" not in str(err.value)


def test_bad_names_and_too_little_memory_are_one_line(tiny_lm, monkeypatch):
    for bad in ("awq_q5", "q4_0", "awq_int4"):
        with pytest.raises(InputError, match="unknown AWQ variant") as err:
            apply_awq(tiny_lm, bad)
        assert "\n" not in str(err.value)
    monkeypatch.setattr(variants, "available_memory", lambda: 2 * 10**6)
    monkeypatch.setattr(awq, "working_copy", lambda _m: pytest.fail("it started"))
    with pytest.raises(InputError, match="not started"):
        apply_awq(tiny_lm, "awq_q3")


def test_the_cli_measures_an_awq_variant(tiny_lm, monkeypatch, capsys):
    import json

    import engine.loader
    from engine.__main__ import main

    monkeypatch.setattr(engine.loader, "load_model", lambda *a, **k: tiny_lm)
    assert main(["quality", "--weights", "awq_q3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["weights"] == "awq_q3" and doc["bytes"] == doc["formula_bytes"]
    assert doc["kl_mean"] > 0 and 0 <= doc["top1_agreement"] <= 1
