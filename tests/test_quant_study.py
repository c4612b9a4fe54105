"""The quantization study on the tiny model (fast), and its record: round trip and bad input."""

from __future__ import annotations

import dataclasses
import json

import pytest

from engine.errors import InputError, TraceFormatError
from engine.experiments import Experiments, experiments_from_dict, experiments_to_dict
from engine.kernels.native import native_problem
from engine.lens.cost_notice import weights_read
from engine.quant.apply import apply_variant
from engine.quant.gguf_grid import GridCheck
from engine.quant.study import (
    Answer,
    QuantStudy,
    Speed,
    StudyPlan,
    VariantResult,
    run_study,
    sample_prompts,
)
from engine.quant.study_record import study_from_dict, study_from_json, study_to_dict, study_to_json
from engine.quant.variants import WeightReport


def _report(name: str, code_bytes: int) -> WeightReport:
    return WeightReport(name, "storage", 1000, 10, code_bytes, 0, 40, 8, 0)


def fake_study(kl: float = 0.01) -> QuantStudy:
    """A study with made-up numbers (no model): fp32 native, q4_0 native, q3 torch eager."""
    rows = []
    for name, code_bytes, decoder, itl, k in (("fp32", 4000, "native", 20.0, 0.0),
                                              ("q4_0", 500, "native", 6.0, kl),
                                              ("q3", 375, "torch eager", 70.0, 3 * kl)):
        tokens = (5, 6, 7) if name != "q3" else (5, 9, 7, 2)
        rows.append(VariantResult(
            _report(name, code_bytes), 10.0 + k, 10.0 + k, k, 1.0 - k,
            (Answer(tokens, tuple(f"Ġt{t}" for t in tokens)),),
            Speed(decoder, f"{decoder} because", 30.0, itl, 23,
                  4000 if decoder != "native" else code_bytes + 100,
                  0.6 if name == "q4_0" else 0.05), 1.5))
    grid = GridCheck("q4_1", 4, 32, True, 2, 64, 0.0, 1.0, 0.1, 1.0)
    return QuantStudy("tiny", "float32", "cpu", "gettysburg.txt", 320, ("Hi?",), 4, 30.0,
                      (grid,), (grid,), None, tuple(rows), False, "2026-01-01T00:00:00")


# ---- the study on the tiny model --------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_study(tiny_lm):
    plan = StudyPlan(("int8", "q3", "fp32"), sample_prompts()[:1], 4, (0,))
    seen = []
    study = run_study(tiny_lm, plan, 10.0, say=lambda text, done: seen.append(done))
    return study, seen


def test_fp32_comes_first_and_is_the_reference(tiny_study):
    study, _ = tiny_study
    assert [v.name for v in study.variants] == ["fp32", "int8", "q3"]
    ref = study.variants[0]
    assert ref.kl_mean == 0.0 and ref.top1_agreement == 1.0
    for v in study.variants:
        assert v.perplexity == pytest.approx(v.perplexity_transformers, rel=1e-4)
    assert study.variants[2].kl_mean > study.variants[1].kl_mean > 0


def test_progress_is_reported_in_order(tiny_study):
    _, seen = tiny_study
    assert seen == sorted(seen) and seen[0] == 0.0 and seen[-1] == 1.0


def test_bytes_are_the_variants_own_report(tiny_study, tiny_lm):
    study, _ = tiny_study
    _copy, report = apply_variant(tiny_lm, "int8")
    assert study.result("int8").report == report


def test_the_decoder_used_and_the_bytes_it_reads(tiny_study, tiny_lm):
    study, _ = tiny_study
    q3, int8, ref = study.result("q3"), study.result("int8"), study.result("fp32")
    assert q3.speed.decoder == "torch eager" and "q3" in q3.speed.note
    # torch eager reads the float32 copy: as many weight bytes as fp32 holds, not q3's
    assert q3.speed.bytes_per_step > weights_read(tiny_lm.spec)  # the float32 weights one forward reads
    assert q3.speed.bytes_per_step > 3 * q3.report.nbytes
    if native_problem(tiny_lm) is None:
        assert int8.speed.decoder == "native" and ref.speed.decoder == "native"
        assert int8.speed.bytes_per_step < ref.speed.bytes_per_step / 2
    for v in study.variants:
        assert v.speed.steps == 3 and v.speed.itl_ms > 0 and v.speed.ttft_ms > 0
        assert v.speed.mbu(10.0) == pytest.approx(
            v.speed.bytes_per_step / (v.speed.itl_ms / 1000) / 10e9)
        assert v.speed.mbu(None) is None


def test_answers_are_the_greedy_tokens(tiny_study, tiny_lm):
    import torch

    from engine.forward import eos_token_ids, prepare_prompt

    study, _ = tiny_study
    ids = prepare_prompt(tiny_lm.tokenizer, study.prompts[0], True)
    with torch.inference_mode():
        out = tiny_lm.model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    expected = out[0, len(ids):].tolist()
    ends = [i for i, t in enumerate(expected) if t in eos_token_ids(tiny_lm)]
    expected = expected[:ends[0] + 1] if ends else expected  # cut after the end of the turn
    answer = study.result("fp32").answers[0]
    assert list(answer.tokens) == expected
    assert answer.pieces == tuple(tiny_lm.tokenizer.convert_ids_to_tokens(list(answer.tokens)))


def test_the_grid_check_is_part_of_the_study(tiny_study):
    study, _ = tiny_study
    assert [g.grid for g in study.grid][:2] == ["q4_1", "q4_0"]
    assert study.grid[0].tensors == 7  # layer 0's seven Linears
    assert not study.grid[0].lossless  # random weights lie on no grid


def test_a_variant_timed_while_others_used_the_cpus_is_marked(tiny_study):
    study, _ = tiny_study
    for v in study.variants:  # measured from /proc/stat around the variant's decode
        assert v.speed.others_share is None or 0.0 <= v.speed.others_share <= 1.0
    fake = fake_study()
    assert fake.result("q4_0").speed.disturbed and not fake.result("fp32").speed.disturbed


def test_stop_keeps_what_was_measured(tiny_lm):
    plan = StudyPlan(("fp32", "int8"), sample_prompts()[:1], 2, (0,))
    study = run_study(tiny_lm, plan, None, stop=lambda: True)
    assert [v.name for v in study.variants] == ["fp32"] and study.stopped


def test_a_bad_plan_is_one_line():
    with pytest.raises(InputError, match="unknown weights variant 'q5'"):
        StudyPlan(("q5",), ("Hi",), 4)
    with pytest.raises(InputError, match="new tokens"):
        StudyPlan(("fp32",), ("Hi",), 1)
    assert StudyPlan(("q3", "fp32", "q3"), ("Hi",), 4).ordered == ("fp32", "q3")


# ---- first difference and AWQ ----------------------------------------------------------

def test_first_difference_against_fp32():
    study = fake_study()
    assert study.first_difference("q4_0", 0) is None
    assert study.first_difference("q3", 0) == 1


def test_awq_pairs_with_plain_rounding_at_the_same_bits():
    study = fake_study()
    awq = dataclasses.replace(study.variants[1], report=_report("awq_q4_0", 500), kl_mean=0.005,
                              perplexity=10.001)
    study = dataclasses.replace(study, variants=(*study.variants, awq))
    (pair,) = study.awq_pairs()
    assert (pair.awq, pair.plain) == ("awq_q4_0", "q4_0")
    assert pair.kl_ratio == pytest.approx(0.5)
    assert pair.perplexity_change == pytest.approx(10.001 - 10.01)


# ---- the record ------------------------------------------------------------------------

def test_the_record_round_trips_through_json(tiny_study):
    study, _ = tiny_study
    text = study_to_json(study)
    back = study_from_json(text)
    assert study_to_dict(back) == json.loads(text)
    assert back.result("q3").speed == study.result("q3").speed
    assert back.result("int8").report == study.result("int8").report


def test_the_record_travels_with_the_experiments():
    study = fake_study()
    data = json.loads(json.dumps(experiments_to_dict(Experiments(quant_study=study))))
    back = experiments_from_dict(data)
    assert study_to_dict(back.quant_study) == study_to_dict(study)
    assert not Experiments(quant_study=study).empty
    assert experiments_from_dict({}).quant_study is None


def _damaged(change) -> dict:
    data = json.loads(json.dumps(study_to_dict(fake_study())))
    change(data)
    return data


BAD = {
    "a newer version": lambda d: d.update(version=99),
    "not fp32 first": lambda d: d["variants"].reverse(),
    "a variant twice": lambda d: d["variants"].append(d["variants"][1]),
    "negative ITL": lambda d: d["variants"][1]["speed"].update(itl_ms=-1.0),
    "ITL not a number": lambda d: d["variants"][1]["speed"].update(itl_ms="fast"),
    "top-1 above 1": lambda d: d["variants"][1].update(top1_agreement=1.5),
    "an unknown variant": lambda d: d["variants"][1]["report"].update(variant="q5"),
    "a report field missing": lambda d: d["variants"][1]["report"].pop("code_bytes"),
    "a token id as text": lambda d: d["variants"][1]["answers"][0].update(tokens=["5"]),
    "pieces shorter than tokens": lambda d: d["variants"][1]["answers"][0]["pieces"].pop(),
    "answers for another prompt count": lambda d: d["variants"][1]["answers"].append(
        d["variants"][1]["answers"][0]),
    "infinite perplexity": lambda d: d["variants"][0].update(perplexity=float("inf")),
    "no variants": lambda d: d.update(variants=[]),
    "prompts not a list": lambda d: d.update(prompts="Hi"),
    "a grid check not an object": lambda d: d.update(grid=[3]),
    "a CPU share above 1": lambda d: d["variants"][1]["speed"].update(others_share=1.5),
    "no quantized parameter": lambda d: d["variants"][1]["report"].update(quantized_params=0),
}


@pytest.mark.parametrize("case", BAD)
def test_a_damaged_record_is_refused_in_one_line(case):
    with pytest.raises(TraceFormatError) as err:
        study_from_dict(_damaged(BAD[case]))
    assert "\n" not in str(err.value) and str(err.value).startswith("quantization study")


def test_not_json_is_one_line():
    with pytest.raises(TraceFormatError, match="not JSON"):
        study_from_json("{")
    with pytest.raises(TraceFormatError, match="must be an object"):
        study_from_dict([1])
