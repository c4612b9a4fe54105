""""What to notice" about weights in fewer bits: the bytes of weights one decode step of the
trace's model reads in fp32 / fp16 / int8 / Q4_0, and which of them this run read — the story's
stage after the KV cache (engine/lens/notice.py and cost_notice.py have the others).

Every decode step reads every weight once, and decode waits on memory, so the bytes a step reads
bound how fast it can go. They are computed from the trace's model spec with the quantization
calculator's formulas (engine/quant/calculator.py: params × bits / 8, the bits including each
format's scales), over the parts the variants quantize (engine/quant/variants.py SCOPE):
- float formats: every weight a step reads × 32 or 16 / 8;
- integer formats: the decoder layers' weights (parameters − embedding tables − norms) in the
  format, the embedding / LM head in Q8_0 (8 + 16/32 = 8.5 bits), the norms in float32.
An untied input embedding is only looked up, one row per token, so its other rows are left out
(as cost_notice.weights_read does). When the trace records the native decoder, its
measured bytes (the packed buffer it streamed) and the median ITL it achieved are used.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..quant.calculator import format_bits, stored_bytes
from ..quant.scheme import FORMATS
from ..records.trace import Trace
from ..settings import FLOAT_WEIGHTS
from ..spec import ModelSpec
from ..timing.metrics import forward_median_ms, summarize
from .wording import size

STORY_FORMATS = ("fp32", "fp16", "int8", "q4_0")  # the explainer's four (4-bit as Q4_0)
EMBEDDING_FORMAT = "q8_0"  # the integer variants' embedding / LM head (engine/quant/variants.py)
NORM_BYTES = 4  # the norms stay float32 in every integer variant
AWQ_PREFIX = "awq_"  # awq_<format> stores its base format (engine/quant/variants.py)


def label(name: str) -> str:
    """How the story writes a format: fp32, fp16, int8, Q4_0, AWQ Q3."""
    base = name.removeprefix(AWQ_PREFIX)
    shown = base.upper() if base.startswith("q") else base  # Q4_0, Q4_K_M
    return f"AWQ {shown}" if name.startswith(AWQ_PREFIX) else shown


def bits_label(spec: ModelSpec, name: str) -> str:
    """A format and its stored bits per layer weight, scales included: "Q4_0 · 4.5 bits"."""
    try:
        bits = format_bits(name.removeprefix(AWQ_PREFIX), spec.hidden_size)
    except ValueError:
        return label(name)
    return f"{label(name)} · {bits:.3g} bits"


@dataclass(frozen=True, slots=True)
class Parts:
    """What one decode step reads, in parameters, split the way the variants store it."""

    layers: int  # decoder-layer weights: parameters − embedding tables − norms
    embedding: int  # embedding / LM head rows read: vocab · hidden (+ one input row if untied)
    norms: int  # hidden · (2 · layers + 1): two RMSNorms per layer and the final one

    @property
    def total(self) -> int:
        return self.layers + self.embedding + self.norms


def step_parts(spec: ModelSpec) -> Parts:
    tables = 1 if spec.tie_word_embeddings else 2
    norms = spec.hidden_size * (2 * spec.layers + 1)
    layers = spec.param_count - tables * spec.vocab_size * spec.hidden_size - norms
    embedding = spec.vocab_size * spec.hidden_size + (0 if spec.tie_word_embeddings else spec.hidden_size)
    return Parts(layers, embedding, norms)


def step_bytes(spec: ModelSpec, name: str) -> float:
    """Weight bytes one decode step of `spec`'s model reads stored as variant `name`
    (ValueError for a name the calculator does not know)."""
    parts = step_parts(spec)
    base = name.removeprefix(AWQ_PREFIX)
    if base not in FORMATS:  # fp32 / fp16 / bf16
        return stored_bytes(parts.total, base)
    return (stored_bytes(parts.layers, base, spec.hidden_size)
            + stored_bytes(parts.embedding, EMBEDDING_FORMAT) + parts.norms * NORM_BYTES)


def formula(spec: ModelSpec) -> str:
    """The formula of step_bytes with this model's numbers, for the figure's caption."""
    parts = step_parts(spec)
    return (f"fp32 / fp16: all {parts.total:,} weights a step reads × 32 or 16 bits / 8. "
            f"int8 and Q4_0: the layers' {parts.layers:,} weights × their bits / 8 — int8 "
            f"{format_bits('int8', spec.hidden_size):.2f} bits (8 + one float16 scale per row of "
            f"{spec.hidden_size}), Q4_0 {format_bits('q4_0'):g} bits (4 + one float16 scale per 32) "
            f"— + the embedding / LM head's {parts.embedding:,} × {format_bits(EMBEDDING_FORMAT):g} "
            f"/ 8 (Q8_0) + the norms' {parts.norms:,} × {NORM_BYTES} B (float32)")


@dataclass(frozen=True, slots=True)
class WeightsNotice:
    weights: str  # the run's variant: trace.decoder.weights, or the spec's dtype for older traces
    formats: tuple[str, ...]  # STORY_FORMATS, plus the run's own when it is another one
    formula_bytes: tuple[float, ...]  # step_bytes of each format (0 for a name it cannot count)
    decoder: str | None  # "native", "torch", or None for traces from before the record
    measured_bytes: int | None  # the native decoder's buffer, when it ran
    itl_median_ms: float | None
    decode_steps: int

    def bytes_of(self, name: str) -> float:
        return self.formula_bytes[self.formats.index(name)] if name in self.formats else 0.0

    @property
    def float_copy(self) -> bool:
        """Torch eager ran an integer variant: its steps multiplied by a float32 copy of the
        rounded values (engine/quant/variants.py), so they read fp32's bytes, not the codes."""
        return self.decoder == "torch" and self.weights.removeprefix(AWQ_PREFIX) in FORMATS

    @property
    def read_bytes(self) -> float:
        """What a decode step of this run read: measured when the native step ran, else the formula."""
        if self.measured_bytes is not None:
            return float(self.measured_bytes)
        return self.bytes_of("fp32" if self.float_copy else self.weights)

    @property
    def other(self) -> str:
        """The format the line compares with: Q4_0 for a run that read float weights, fp32 for
        one whose native step read the codes of an integer format."""
        integer = self.weights.removeprefix(AWQ_PREFIX) in FORMATS
        return "fp32" if integer and not self.float_copy else "q4_0"

    @property
    def text(self) -> str:
        if not self.read_bytes:
            return (f"This run used “{self.weights}” weights, a format this story cannot count; "
                    "the Quantization page measures every variant it knows.")
        own, other, other_bytes = label(self.weights), label(self.other), self.bytes_of(self.other)
        less = self.other == "q4_0"
        ratio = self.read_bytes / other_bytes if less else other_bytes / self.read_bytes
        if self.measured_bytes is not None:
            head = (f"The native C step ran this run's decode on {own} weights: each step read "
                    f"{size(self.read_bytes)} of them (measured: the buffer it streams; the "
                    f"formula gives {size(self.bytes_of(self.weights))})")
        elif self.float_copy:
            head = (f"This run's weights were rounded to {own}, but torch eager multiplied by a "
                    f"float32 copy of those values: each decode step read {size(self.read_bytes)} "
                    f"(the native C step reads the {own} codes themselves, "
                    f"{size(self.bytes_of(self.weights))})")
        else:
            head = f"Each decode step of this run read {size(self.read_bytes)} of weights ({own})"
        line = (head + f"; stored as {other} the same step would read {size(other_bytes)}, "
                f"{ratio:.1f}× {'less' if less else 'more'}.")
        if not self.decode_steps or self.itl_median_ms is None:
            return line + " This run stopped after its first token, so it had no decode step to time."
        rate = self.read_bytes / self.itl_median_ms / 1e6  # bytes per ms → GB/s
        line += (f" At its median ITL of {self.itl_median_ms:.1f} ms that is {rate:.1f} GB/s of "
                 "weights (bytes per step ÷ ITL)")
        if less:
            return line + (f": decode waits on memory, so {other} would raise the ceiling on "
                           f"its speed {ratio:.1f}×.")
        return line + "."


def weights_notice(trace: Trace) -> WeightsNotice:
    spec = trace.model
    record = trace.decoder
    weights = record.weights if record is not None else FLOAT_WEIGHTS.get(spec.dtype, spec.dtype)
    formats = STORY_FORMATS + (() if weights in STORY_FORMATS else (weights,))
    counted = []
    for name in formats:
        try:
            counted.append(step_bytes(spec, name))
        except ValueError:  # a variant the calculator does not know: the line says so
            counted.append(0.0)
    native = record is not None and record.name == "native"
    return WeightsNotice(weights, formats, tuple(counted), record.name if record else None,
                         record.weight_bytes if native else None,
                         summarize(trace).itl_p50_ms if trace.speculation is None
                         else forward_median_ms(trace), len(trace.decode_forwards))
