"""The quantization study: every chosen weight variant of the loaded model, measured side by side.

Per variant, one after the other (one variant copy alive at a time, freed after its phase):
- bytes: the variant's WeightReport (measured from the stored tensors, beside the formula);
- quality against float32 by teacher forcing on the shipped text (engine/quant/quality.py):
  perplexity (two ways), mean KL(fp32 ‖ variant) per position, top-1 agreement;
- answers: greedy tokens for a few sample prompts, cut after the first end-of-sequence token, so
  the page can mark the first token that differs from float32's;
- speed: TTFT (the prompt's forward, torch) and ITL (median decode step) with the decoder used —
  the native C step where it reads this format (`NATIVE_WEIGHTS`), else torch eager, and why —
  the bytes one decode step streams, and MBU = bytes per step / ITL / measured read bandwidth
  (the bandwidth ceiling of engine/kernels/microbench.py, as the Prefill vs decode page uses).
Before the variants, a grid check (engine/quant/gguf_grid.py): does re-quantizing the loaded
weights to a grid give them back exactly?

The result is a plain, versioned record (engine/quant/study_record.py: JSON, no pickle), kept
with a session's experiments and checked on the way in like every record of engine/records.
"""

from __future__ import annotations

import gc
import json
import re
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache

from i18n import N_, _

from ..assets import asset
from ..clock import MachineSample, clock_ms, others_share
from ..errors import EngineError, InputError
from ..forward import decode_one_token, eos_token_ids, prefill, prepare_prompt, timed_greedy
from ..lens.compare import first_difference
from ..loader import LoadedModel
from ..spec import spec_from_model
from ..timing.disturbance import OTHERS_LIMIT
from ..timing.dtype_compare import cast_copy
from ..timing.roofline import forward_work
from . import VARIANT_NAMES
from .apply import apply_variant, refuse_mapped
from .gguf_grid import GridCheck, embedding_grids, linear_grids
from .quality import kl_per_position, perplexity, scored_forward
from .texts import read_text, text_ids
from .variants import AWQ_PREFIX, FLOAT_VARIANTS, WeightReport

STUDY_VERSION = 1
SAMPLE_PROMPTS = asset("sample_prompts.json")
PROMPT_TITLES = ("Capital of France", "Explain the KV cache", "Haiku")
AWQ_NAMES = tuple(n for n in VARIANT_NAMES if n.startswith(AWQ_PREFIX))
DEFAULT_VARIANTS = ("fp32", "fp16", "int8", "q4_0", "q4_1", "q3", *AWQ_NAMES)
# Hosted: one click has a few seconds of model time, so fewer variants, one prompt, a shorter
# answer and the grid checked on three layers (first, middle, last) instead of all. AWQ comes
# right after its plain twin: a budget that ends the run early still shows what AWQ buys.
HOSTED_VARIANTS = ("fp32", "q4_0", *(n for n in AWQ_NAMES if n == "awq_q4_0"), "int8", "q3")
NEW_TOKENS, HOSTED_NEW_TOKENS = 24, 16
MAX_VARIANTS, MAX_PROMPTS, MAX_NEW_TOKENS = 16, 8, 256  # what a record may hold
# why a variant's steps ran where they did (Speed.note, kept English in a record; shown_note shows)
NOTE_FLOAT = N_("no native {name} step: torch eager on {name} weights")
NOTE_NATIVE = N_("the native C step")
NOTE_CODES = N_("the native C step reads the {base} codes and scales themselves")
NOTE_FAILED = N_("the native step failed to start: {error}")
KV_FORMULA = N_("2 · layers · KV heads · head_dim · bytes per element · context")  # _() shown
STUDY_MAPPED = N_("The comparison quantizes float32 copies of the weights; a model opened from a "
                  "GGUF file runs on its stored blocks, already quantized: its own weights are "
                  "the reference, and it holds no float32 weights to quantize. Load the default "
                  "model to compare variants.")

Progress = Callable[[str, float], None]


def sample_prompts(titles: Sequence[str] = PROMPT_TITLES) -> tuple[str, ...]:
    """The sample prompts of assets/sample_prompts.json with these titles, in this order."""
    table = {s["title"]: s["prompt"] for s in json.loads(SAMPLE_PROMPTS.read_text())}
    return tuple(table[t] for t in titles)


@dataclass(frozen=True, slots=True)
class StudyPlan:
    variants: tuple[str, ...]
    prompts: tuple[str, ...]
    new_tokens: int
    grid_layers: tuple[int, ...] | None = None  # None: every layer

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANT_NAMES]
        if unknown:
            raise InputError(_("unknown weights variant {name}: use one of {names}").format(
                name=repr(unknown[0]), names=", ".join(VARIANT_NAMES)))
        if not self.variants or len(self.variants) > MAX_VARIANTS:
            raise InputError(_("choose 1 to {limit} weights variants").format(limit=MAX_VARIANTS))
        if not 1 <= len(self.prompts) <= MAX_PROMPTS or not all(p.strip() for p in self.prompts):
            raise InputError(_("the study needs 1 to {limit} non-empty prompts").format(
                limit=MAX_PROMPTS))
        if not 2 <= self.new_tokens <= MAX_NEW_TOKENS:
            raise InputError(_("new tokens must be between 2 and {limit}").format(
                limit=MAX_NEW_TOKENS))

    @property
    def ordered(self) -> tuple[str, ...]:
        """fp32 (the reference every other variant is compared with) first, then as chosen."""
        return ("fp32", *(v for v in dict.fromkeys(self.variants) if v != "fp32"))


def default_plan(hosted: bool = False, layers: int = 0) -> StudyPlan:
    if hosted:
        grid = tuple(sorted({0, layers // 2, max(layers - 1, 0)})) if layers else (0,)
        return StudyPlan(HOSTED_VARIANTS, sample_prompts()[:1], HOSTED_NEW_TOKENS, grid)
    return StudyPlan(DEFAULT_VARIANTS, sample_prompts(), NEW_TOKENS)


@dataclass(frozen=True, slots=True)
class Answer:
    tokens: tuple[int, ...]  # greedy ids, up to and including the first end-of-sequence token
    pieces: tuple[str, ...]  # the tokenizer's pieces of those ids (Ġ for a space)


@dataclass(frozen=True, slots=True)
class Speed:
    decoder: str  # "native" or "torch eager"
    note: str  # why this decoder, in one line
    ttft_ms: float  # median over the prompts of the prompt's forward (torch)
    itl_ms: float  # median decode step over every prompt's steps
    steps: int  # decode steps timed
    bytes_per_step: int  # weights the step streams + the KV cache read at the mean context
    others_share: float | None = None  # other programs' share of all CPUs while it was timed

    @property
    def disturbed(self) -> bool:
        """Other programs used ≥ OTHERS_LIMIT of the CPUs meanwhile (engine/timing/disturbance)."""
        return self.others_share is not None and self.others_share >= OTHERS_LIMIT

    def mbu(self, bandwidth_gb_s: float | None) -> float | None:
        """bytes per step / ITL / measured read bandwidth."""
        if not bandwidth_gb_s:
            return None
        return self.bytes_per_step / (self.itl_ms / 1000) / (bandwidth_gb_s * 1e9)


@dataclass(frozen=True, slots=True)
class VariantResult:
    report: WeightReport
    perplexity: float  # our loop over log-softmax
    perplexity_transformers: float  # exp(transformers' loss): must agree
    kl_mean: float  # nats, mean over the text's positions
    top1_agreement: float  # share of positions with fp32's most probable token
    answers: tuple[Answer, ...]  # one per prompt
    speed: Speed
    seconds: float

    @property
    def name(self) -> str:
        return self.report.variant


@dataclass(frozen=True, slots=True)
class AwqPair:
    """An AWQ variant beside plain rounding to the same format."""

    awq: str
    plain: str
    kl_ratio: float | None  # awq KL / plain KL (< 1: AWQ loses less); None when plain KL is 0
    perplexity_change: float  # awq perplexity − plain perplexity
    top1_change: float  # awq top-1 agreement − plain's


@dataclass(frozen=True, slots=True)
class QuantStudy:
    model: str
    dtype: str  # the loaded weights every variant was made from
    device: str
    text: str  # the quality text's file name
    text_tokens: int
    prompts: tuple[str, ...]
    new_tokens: int
    bandwidth_gb_s: float | None  # the read-bandwidth ceiling MBU is measured against
    grid: tuple[GridCheck, ...]  # the decoder Linears re-quantized to each grid
    embedding_grid: tuple[GridCheck, ...]
    grid_layers: tuple[int, ...] | None  # None: every layer
    variants: tuple[VariantResult, ...]  # fp32 first
    stopped: bool = False  # ended early (a time budget): fewer variants than planned
    created_at: str = ""
    version: int = STUDY_VERSION

    def result(self, name: str) -> VariantResult | None:
        return next((v for v in self.variants if v.name == name), None)

    def first_difference(self, name: str, prompt: int) -> int | None:
        """The first answer position where variant `name` differs from fp32 (None: identical)."""
        ref, other = self.result("fp32"), self.result(name)
        if ref is None or other is None:
            return None
        return first_difference(ref.answers[prompt].tokens, other.answers[prompt].tokens)

    def awq_pairs(self) -> list[AwqPair]:
        pairs = []
        for r in self.variants:
            plain = self.result(r.name.removeprefix(AWQ_PREFIX))
            if r.name.startswith(AWQ_PREFIX) and plain is not None:
                pairs.append(AwqPair(r.name, plain.name,
                                     r.kl_mean / plain.kl_mean if plain.kl_mean > 0 else None,
                                     r.perplexity - plain.perplexity,
                                     r.top1_agreement - plain.top1_agreement))
        return pairs


def native_choice(lm: LoadedModel, name: str) -> tuple[bool, str]:
    """(True, what it reads) when the native C step runs variant `name` on `lm` (its variant
    copy), else (False, why torch eager runs it instead), in one line."""
    from ..kernels.native import native_problem

    if name in FLOAT_VARIANTS and name != "fp32":
        return False, NOTE_FLOAT.format(name=name)
    problem = native_problem(lm, name)
    if problem:
        return False, problem
    base = name.removeprefix(AWQ_PREFIX)
    return True, NOTE_NATIVE if base == "fp32" else NOTE_CODES.format(base=base)


def _note_pattern(template: str) -> str:
    """A regular expression matching `template` formatted: each {field} a group (a repeated
    field the same text again)."""
    seen: set[str] = set()

    def field(match: re.Match) -> str:
        name = match.group(1)
        group = f"(?P={name})" if name in seen else f"(?P<{name}>.+?)"
        seen.add(name)
        return group
    return re.sub(r"\\\{(\w+)\\\}", field, re.escape(template))


def shown_note(note: str) -> str:
    """A record's Speed.note (English) in the session's language when it is one of this
    module's lines; any other line (the native step's own reasons) as it is."""
    for template in (NOTE_FLOAT, NOTE_NATIVE, NOTE_CODES, NOTE_FAILED):
        found = re.fullmatch(_note_pattern(template), note, re.DOTALL)
        if found:
            return _(template).format(**found.groupdict())
    return note


def _stepper(model: Any, native: Any, cache: DynamicCache, n: int,
             device: torch.device) -> Callable[[int, int], torch.Tensor]:
    """Decode step i after an n-token prompt: (token, i) → (V,) logits, native or torch eager."""
    if native is not None:
        return lambda token, i: native.step_logits(token, n + i)

    def eager(token: int, _i: int) -> torch.Tensor:
        return decode_one_token(model, torch.tensor([[token]], device=device), cache)[0]
    return eager


def _greedy_runs(model: Any, prompts: list[list[int]], new_tokens: int, device: torch.device,
                 native: Any = None) -> tuple[list[list[int]], list[float], list[float]]:
    """Each prompt through `model` (torch prefill, timed: the TTFT), then `new_tokens` greedy
    tokens by the native step (its cache loaded with the prefill's K/V) or by torch eager."""
    answers, ttft, steps = [], [], []
    with torch.inference_mode():
        for ids in prompts:
            cache = DynamicCache(config=model.config)
            start = clock_ms(device)
            first, _unused = prefill(model, torch.tensor([ids], device=device), cache)
            ttft.append(clock_ms(device) - start)
            if native is not None:
                native.load_prefix(cache, len(ids))
            tokens, times = timed_greedy(first, _stepper(model, native, cache, len(ids), device),
                                         new_tokens, device)
            answers.append(tokens)
            steps.extend(times)
    return answers, ttft, steps


def measure_speed(lm: LoadedModel, name: str, copy: Any, prompts: list[list[int]],
                  new_tokens: int) -> tuple[list[list[int]], Speed]:
    """The greedy answers and the speed of variant `name` (`copy`: its dequantized model)."""
    from ..kernels.native import NativeDecoder

    variant_lm = replace(lm, model=copy)  # float32, on the variant's grid: packed as it is
    use_native, note = native_choice(variant_lm, name)
    native = run_model = None
    if use_native:
        try:
            native = NativeDecoder(variant_lm, max(len(p) for p in prompts) + new_tokens, name)
        except EngineError as err:
            use_native, note = False, NOTE_FAILED.format(error=err)
    if name in FLOAT_VARIANTS and not use_native:  # the real dtype: 2 bytes per weight read
        run_model = cast_copy(lm.model, FLOAT_VARIANTS[name])
    else:
        run_model = copy  # torch eager reads its dequantized float32 tensors
    # what one decode step reads, by the roofline's formula (engine/timing/roofline.py) for the
    # model that ran — with the native step's packed bytes in place of the float tensors'
    spec = spec_from_model(run_model, lm.spec.name)
    streamed = int(native.weight_bytes) if use_native else None
    try:
        before = MachineSample.now(lm.device)
        answers, ttft, steps = _greedy_runs(run_model, prompts, new_tokens, lm.device, native)
        others = others_share(before, MachineSample.now(lm.device))
    finally:
        del native, run_model
        gc.collect()
    context = statistics.mean(len(p) + 1 + i for p in prompts for i in range(new_tokens - 1))
    read = forward_work(spec, 1, round(context) - 1, streamed=streamed).bytes
    speed = Speed("native" if use_native else "torch eager", note, statistics.median(ttft),
                  statistics.median(steps), len(steps), int(read), others)
    return answers, speed


def _cut(tokens: list[int], eos: frozenset[int]) -> list[int]:
    end = next((i for i, t in enumerate(tokens) if t in eos), None)
    return tokens if end is None else tokens[:end + 1]


def _variant_copy(lm: LoadedModel, name: str, say: Progress, done: float) -> tuple[Any, WeightReport]:
    """apply_variant, with AWQ's scale search reporting its progress (it takes the longest)."""
    if not name.startswith(AWQ_PREFIX):
        return apply_variant(lm, name)
    from .awq import apply_awq

    return apply_awq(lm, name, lambda _fraction, text: say(
        _("{variant}: {step}…").format(variant=name, step=text), done))


def _grid(lm: LoadedModel, layers: tuple[int, ...] | None) -> tuple[tuple[GridCheck, ...],
                                                                   tuple[GridCheck, ...]]:
    chosen = None if layers is None else [i for i in layers if 0 <= i < lm.spec.layers] or [0]
    return tuple(linear_grids(lm.model, chosen)), tuple(embedding_grids(lm.model))


def run_study(lm: LoadedModel, plan: StudyPlan, bandwidth_gb_s: float | None,
              say: Progress | None = None, stop: Callable[[], bool] | None = None,
              text: str | None = None, text_name: str = "gettysburg.txt") -> QuantStudy:
    """Measure every variant of `plan` (fp32 first). `stop()` is checked before each variant:
    the variants finished so far are returned, with `stopped` set. A model on a GGUF file's
    blocks is refused (`STUDY_MAPPED`): every variant would be a float32 copy of it."""
    refuse_mapped(lm, STUDY_MAPPED)
    say = say or (lambda _text, _done: None)
    stop = stop or (lambda: False)
    names = plan.ordered
    total = len(names) + 1
    ids = text_ids(lm, read_text() if text is None else text)
    prompts = [prepare_prompt(lm.tokenizer, p, True) for p in plan.prompts]
    eos = eos_token_ids(lm)
    say(_("Checking which grids the loaded weights already lie on…"), 0.0)
    grid, embedding_grid = _grid(lm, plan.grid_layers)
    results: list[VariantResult] = []
    ref = None
    stopped = False
    for i, name in enumerate(names):
        if i and stop():
            stopped = True
            break
        start = time.perf_counter()
        say(_("{variant}: quantizing a copy of the weights…").format(variant=name), (i + 1) / total)
        copy, report = _variant_copy(lm, name, say, (i + 1) / total)
        try:
            say(_("{variant}: quality on {text}…").format(variant=name, text=text_name),
                (i + 1.3) / total)
            logp, ppl_transformers = scored_forward(copy, ids)
            if ref is None:
                ref = logp
            kl = kl_per_position(ref, logp)  # (S − 1,) nats, as `python -m engine quality`
            top1 = (ref.argmax(-1) == logp.argmax(-1)).double().mean()
            ppl = perplexity(logp, ids)
            del logp
            say(_("{variant}: answering {n} prompt(s), timing each step…").format(
                variant=name, n=len(prompts)), (i + 1.6) / total)
            tokens, speed = measure_speed(lm, name, copy, prompts, plan.new_tokens)
        finally:
            del copy
            gc.collect()
        answers = tuple(Answer(tuple(t), tuple(lm.tokenizer.convert_ids_to_tokens(t)))
                        for t in (_cut(a, eos) for a in tokens))
        # KL ≥ 0 in exact arithmetic; a rounding of −1e-12 for identical weights is 0
        results.append(VariantResult(report, ppl, ppl_transformers, max(float(kl.mean()), 0.0),
                                     float(top1), answers, speed, time.perf_counter() - start))
    say(_("Done."), 1.0)
    return QuantStudy(lm.spec.name, lm.spec.dtype, str(lm.device), text_name, len(ids),
                      tuple(plan.prompts), plan.new_tokens, bandwidth_gb_s, grid, embedding_grid,
                      plan.grid_layers, tuple(results), stopped,
                      time.strftime("%Y-%m-%dT%H:%M:%S"))
