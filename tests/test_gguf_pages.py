"""What the pages run, on a model opened from a GGUF file: memory-mapped, every matrix a
`StoredLinear` and the embedding a `StoredEmbedding` (engine/gguf/mapped.py), so no float weight
tensor exists to read.

A tiny synthetic llama 3 file (scripts/synth_gguf.py: 2 layers × 256, Llama 3.1's 128,256-token
vocabulary, Q4_K / Q6_K blocks) is opened once. Every test runs with `StoredEmbedding.weight` —
the whole table dequantized to float32, 2.1 GB for an 8B model — made to raise, so a page that
reached for it would fail here. Checked:
- the fixed ones against independent references: the embedding neighbours against cosine
  similarity computed on the whole dequantized table (here, in the test), in bounded chunks;
  the logit lens's last row against the model's own forward; the serving runner's logits against
  the model's forward; the one-head recompute;
- the ones that work through hooks unchanged (what-if ablation, patching, branches, the KV-cache
  lab, timing sweeps, eager vs native C decode) run and stay finite;
- the ones that would need a float32 copy refuse in their one line: the dtype comparison,
  torch.compile, the quantization study, the drift, any weights variant.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine import GenerationSettings, Run
from engine.errors import EngineError
from engine.gguf import stored
from engine.gguf.stored import StoredEmbedding
from scripts.synth_gguf import write_synthetic
from scripts.synth_vocab import VocabMissing

PROMPT = "The quick brown fox jumps over the lazy dog because"


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    """The tiny file, opened on its blocks (it is a mapped model: `file_map`)."""
    from engine.loader import is_mapped_model, load_model

    path = tmp_path_factory.mktemp("gguf_pages") / "tiny-llama3-q4_k_m.gguf"
    try:
        write_synthetic(path, "tiny", "llama3", "q4_k_m", "llama3_1", seed=3)
    except VocabMissing as err:  # `make vocab` installs it; CI runs it first
        pytest.fail(str(err))
    lm = load_model(str(path))
    assert is_mapped_model(lm.model) and isinstance(lm.model.get_input_embeddings(), StoredEmbedding)
    return lm


@pytest.fixture(autouse=True)
def no_float_table(monkeypatch):
    """The whole embedding table in float32 is never made."""
    def whole_table(_self):
        raise AssertionError("the whole embedding table was dequantized")

    monkeypatch.setattr(StoredEmbedding, "weight", property(whole_table))


@pytest.fixture(scope="module")
def ids(mapped) -> list[int]:
    return mapped.tokenizer(PROMPT).input_ids


def _exact_cosines(m: stored.StoredMatrix, token: int) -> torch.Tensor:
    """(V,) cosine similarity of every row with row `token`, on dequantized rows, in float64."""
    query = stored.rows(m, torch.tensor([token]))[0].double()
    out = []
    for start in range(0, m.rows, 8192):
        block = stored.rows(m, torch.arange(start, min(start + 8192, m.rows))).double()
        out.append(block @ query / (block.norm(dim=-1) * query.norm()).clamp_min(1e-12))
    return torch.cat(out)


def test_embedding_neighbours_on_the_stored_table_are_exact_and_bounded(mapped, monkeypatch):
    from engine.lens import embeddings

    asked: list[int] = []
    real_rows = embeddings.rows

    def counted(m, which):
        asked.append(which.numel())
        return real_rows(m, which)

    monkeypatch.setattr(embeddings, "rows", counted)
    index = embeddings.EmbeddingIndex(mapped)
    m = mapped.model.get_input_embeddings().matrix
    chunk = embeddings.CHUNK_BYTES // (4 * m.cols)
    assert index.vocab_size == m.rows == 128_256
    assert max(asked) <= chunk < m.rows  # the norms: a bounded chunk of rows at a time
    assert index.nbytes == 4 * m.rows  # only the norms are held, not a float table
    token = mapped.tokenizer(" king", add_special_tokens=False).input_ids[0]
    asked.clear()
    near = index.neighbours(token, 10)
    assert max(asked) <= embeddings.CANDIDATES  # a query dequantizes its candidates only
    exact = _exact_cosines(m, token)
    exact[token] = -2.0
    want = torch.topk(exact, 10)
    assert near.ids.tolist() == want.indices.tolist()
    np.testing.assert_allclose(near.scores, want.values.numpy(), rtol=0, atol=1e-5)
    assert token not in near.ids


def test_the_embedding_map_dequantizes_only_the_rows_it_draws(mapped, monkeypatch):
    from engine.lens import embeddings

    index = embeddings.EmbeddingIndex(mapped)
    asked: list[int] = []
    real_rows = embeddings.rows
    monkeypatch.setattr(embeddings, "rows", lambda m, which: asked.append(which.numel())
                        or real_rows(m, which))
    coords, sample, background = index.pca_map([5, 6, 7], background=300)
    assert asked == [3 + 300]
    assert coords.shape == (3, 2) and background.shape == (300, 2) and len(set(sample)) == 300
    assert np.isfinite(coords).all() and np.isfinite(background).all()


def test_the_logit_lens_last_row_is_the_models_own_prediction(mapped, ids):
    from engine.lens.logit_lens import logit_lens

    trace = Run(mapped, PROMPT, GenerationSettings(max_new_tokens=2, chat_template=False,
                                                   record_attention=False)).run_all()
    step = trace.steps[0]
    rows = logit_lens(mapped, step.hidden, step.token_id)
    assert len(rows) == mapped.spec.layers + 1
    with torch.inference_mode():
        logits = mapped.model(input_ids=torch.tensor([list(trace.prompt_token_ids)])).logits[0, -1]
    probs = torch.softmax(logits, -1)
    assert rows[-1].top_ids[0] == int(probs.argmax()) == step.token_id
    assert rows[-1].chosen_rank == 0
    assert math.isclose(rows[-1].chosen_prob, float(probs[step.token_id]), rel_tol=1e-4)


def test_one_head_recomputed_from_the_models_own_q_k_v(mapped, ids):
    from engine.lens.inspect_head import capture_qkv, explain_head

    inputs = capture_qkv(mapped, ids, 1)
    spec = mapped.spec
    assert inputs.query.shape == (spec.heads, len(ids), spec.head_dim)
    assert inputs.key.shape == (spec.kv_heads, len(ids), spec.head_dim)
    steps = explain_head(inputs, 3, len(ids) - 1)
    assert math.isclose(float(steps.weights.sum()), 1.0, rel_tol=1e-9)
    assert np.isfinite(steps.output).all()


def test_the_serving_runner_multiplies_on_the_blocks_and_matches_the_forward(mapped, ids):
    from engine.serving.engine import serve
    from engine.serving.model_runner import Chunk, PagedModelRunner, packs_weights
    from engine.serving.record import ServingConfig
    from engine.serving.requests import make_requests

    assert not packs_weights(mapped)
    runner = PagedModelRunner(mapped, num_blocks=8, block_size=16)
    assert all(lin.module is not None and lin.packed is None
               for layer in runner.linears for lin in layer.values())
    got = runner.forward([Chunk(ids, 0, list(range(len(ids))), list(range(len(ids))))])[0]
    with torch.inference_mode():
        want = mapped.model(input_ids=torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    run = serve(mapped, make_requests(mapped.tokenizer, ["Hi.", "What is a cat?"], 3),
                ServingConfig(num_blocks=16))
    assert [len(r.token_ids) for r in run.requests] == [3, 3]


def test_what_if_ablation_patching_and_branches_run_on_the_blocks(mapped, ids):
    from engine.whatif.ablate import Ablation, ablate, head_sweep
    from engine.whatif.branch import branch, run_snapshot
    from engine.whatif.patch import patch_grid

    settings = GenerationSettings(max_new_tokens=3, chat_template=False)
    result = ablate(mapped, PROMPT, Ablation(1, (0, 2)), settings, new_tokens=3)
    assert result.kl >= 0 and len(result.ablated_tokens) == 3
    sweep = head_sweep(mapped, ids, layers=[0])
    assert np.isfinite(sweep[0]).all() and np.isnan(sweep[1]).all()
    other = mapped.tokenizer(PROMPT.replace("fox", "cat")).input_ids
    assert len(other) == len(ids)
    grid = patch_grid(mapped, ids, other)
    assert grid.logit_diff.shape == (mapped.spec.layers, len(ids))
    assert np.isfinite(grid.logit_diff).all()
    trace = Run(mapped, PROMPT, settings).run_all()
    snapshot, _seconds = run_snapshot(mapped, trace)
    other_token = (trace.output_token_ids[1] + 1) % mapped.spec.vocab_size
    child = branch(mapped, trace, 1, other_token, snapshot)
    assert child.trace.branch.same_as_rerun and child.trace.output_token_ids[1] == other_token


def test_the_kv_cache_lab_and_the_timing_sweeps_run_on_the_blocks(mapped, ids):
    from engine.kv.cachelab import compare_caches
    from engine.kv.kvcache import CacheConfig
    from engine.timing.sweeps import batch_timer, decode_timer, prefill_timer

    runs = list(compare_caches(mapped, ids, ids[:4], [CacheConfig("int8"),
                                                      CacheConfig("window", 4, 1)]))
    assert [r.config.kind for r in runs] == ["full", "int8", "window"]
    assert all(np.isfinite(r.kl).all() and (r.kl > -1e-6).all() for r in runs)
    for timer, size in ((prefill_timer(mapped), 16), (decode_timer(mapped), 16),
                        (batch_timer(mapped, 16, 2), 2)):
        assert timer(size) > 0


def test_eager_and_native_c_compare_but_compiling_is_refused_in_one_line(mapped, ids):
    from engine.kernels.compiled import COMPILE_MAPPED, CompiledDecoder, compare_decode
    from engine.models import native_decoder

    native = native_decoder(mapped)
    found = compare_decode(CompiledDecoder(mapped), ids, 4, 1, compile=False, native=native,
                           bandwidth_mb=0)
    assert set(found.steps) == {"eager", "native C"}
    with pytest.raises(EngineError) as err:
        compare_decode(CompiledDecoder(mapped), ids, 4, 1, compile=True, bandwidth_mb=0)
    assert str(err.value) == COMPILE_MAPPED and "\n" not in COMPILE_MAPPED


def test_what_needs_a_float32_copy_refuses_in_one_line(mapped, ids, monkeypatch):
    from engine.models import MAPPED_VARIANTS, build_variant
    from engine.quant.apply import MAPPED_COPY, apply_variant
    from engine.quant.drift import DRIFT_MAPPED, measure_drift
    from engine.quant.study import STUDY_MAPPED, default_plan, run_study
    from engine.timing import dtype_compare

    def no_copy(*_args, **_kwargs):
        raise AssertionError("a float copy of the model was started")

    monkeypatch.setattr(dtype_compare, "cast_copy", no_copy)
    refusals = [
        (lambda: dtype_compare.compare_dtypes(mapped, ids, 2, 1), dtype_compare.DTYPES_MAPPED),
        (lambda: run_study(mapped, default_plan(layers=1), None), STUDY_MAPPED),
        (lambda: measure_drift(mapped, ["q4_0"], ids, "x"), DRIFT_MAPPED),
        (lambda: apply_variant(mapped, "int8"), MAPPED_COPY),
        (lambda: build_variant(mapped, "q4_k_m"), MAPPED_VARIANTS),
    ]
    for call, line in refusals:
        with pytest.raises(EngineError) as err:
            call()
        assert str(err.value) == line and "\n" not in line
    assert build_variant(mapped, "fp32", with_native=False).lm is mapped  # its own weights
