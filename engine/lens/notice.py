""""What to notice" in a trace: one line per stage of the guided story, computed from the run.

The story page (pages/story.py) walks through inference stage by stage on the session's own
trace; each stage ends with a line such as "head 3 of layer 12 puts 61% of its weight on the
first token". Every number in those lines is computed here from the Trace (its arrays and its
model spec) by a formula the line names, never written in by hand: a test changes the trace and
sees the text change. Each function returns a small frozen record: the numbers (for tests and
figures) and `text`, plain text (no markdown; the page escapes it), so a trace's own strings —
token pieces — can never format the page.

A trace may lack attention (recorded off) or hidden states (example traces leave them out): the
records then say so in their text instead of failing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..records.trace import Step, Trace
from ..spec import ModelSpec
from .attention_stats import has_attention, head_summary
from .rope import inverse_frequencies
from .tokens import piece_bytes
from .wording import isolated, probability, shown

SINK_SHARE = 0.5  # a head putting more than this on the first token is called a sink (as head_roles)


# ---------------------------------------------------------------- text → tokens

@dataclass(frozen=True, slots=True)
class Word:
    text: str
    pieces: tuple[str, ...]  # readable pieces, as `shown` writes them


_WORD = re.compile(r"\w+")  # letters and digits of any script (おはよう, Доброе, café)


def prompt_words(trace: Trace) -> list[Word]:
    """The prompt's words (runs of letters or digits, any script) and the tokens that hold
    their bytes. Byte-level BPE can cut a character in two, so a word is matched on the decoded
    text and mapped back to the tokens overlapping its bytes; special tokens separate words."""
    buffer, spans = b"", []  # spans: (start, end) bytes of each non-special token
    pieces = []
    for piece, special in zip(trace.prompt_pieces, trace.prompt_special):
        raw = None if special else piece_bytes(piece)
        if not raw:
            buffer += b"\n"  # a special token ends any word
            continue
        spans.append((len(buffer), len(buffer) + len(raw)))
        pieces.append(piece)
        buffer += raw
    text = buffer.decode("utf-8", "surrogateescape")  # lossless: offsets map back exactly
    words = []
    for match in _WORD.finditer(text):
        start = len(text[:match.start()].encode("utf-8", "surrogateescape"))
        end = start + len(match.group().encode("utf-8", "surrogateescape"))
        held = [shown(p).strip() for p, (a, b) in zip(pieces, spans) if a < end and b > start]
        words.append(Word(match.group(), tuple(held)))
    return words


@dataclass(frozen=True, slots=True)
class TokensNotice:
    characters: int  # of the prompt the user typed
    tokens: int  # prompt tokens the model read (chat template included)
    special: int
    word: Word | None  # the word cut into the most pieces (the longest when none is cut)
    typed: bool = True  # the word is one the user typed, not one the chat template added

    @property
    def text(self) -> str:
        head = (f"Your prompt's {self.characters:,} characters"
                + (" and the chat template's turns around them" if self.special else "")
                + f" became {self.tokens:,} tokens"
                + (f" ({self.special} of them special tokens of the chat template)" if self.special
                   else "") + ".")
        if self.word is None:
            return head
        k = len(self.word.pieces)
        if k == 1:
            return (head + " Every word is a single token here, even the longest, "
                    f"“{isolated(self.word.text)}”.")
        partial = any("<" in p for p in self.word.pieces)
        word = isolated(self.word.text)
        which = (f"The word cut into the most pieces, “{word}”," if self.typed else
                 f"Every word you typed is a single token; the chat template's “{word}”")
        return (head + f" {which} became {k}: " + " · ".join(self.word.pieces)
                + "." + (" The <..> pieces are raw UTF-8 bytes: the tokenizer saw these characters "
                         "too rarely to give them tokens of their own." if partial else ""))


def _most_split(words: list[Word]) -> Word:
    """The word with the most pieces; ties: the longer, then the first."""
    return max(words, key=lambda w: (len(w.pieces), len(w.text), -words.index(w)))


def tokens_notice(trace: Trace) -> TokensNotice:
    """Counts, and the word split into the most pieces: among the words the user typed first,
    then among those the chat template added; when none is split, the longest typed word."""
    words = prompt_words(trace)
    typed = [w for w in words if w.text and w.text in trace.prompt] or words
    count = (len(trace.prompt), len(trace.prompt_token_ids), sum(trace.prompt_special))
    if not words:
        return TokensNotice(*count, None)
    best = _most_split(typed)
    if len(best.pieces) > 1:
        return TokensNotice(*count, best)
    anywhere = _most_split(words)
    if len(anywhere.pieces) > 1:
        return TokensNotice(*count, anywhere, typed=False)
    return TokensNotice(*count, max(typed, key=lambda w: (len(w.text), -typed.index(w))))


# ---------------------------------------------------------------- embeddings and RoPE

@dataclass(frozen=True, slots=True)
class EmbeddingsNotice:
    vocab: int
    hidden: int
    table_params: int  # vocab · hidden
    share: float  # of all parameters
    tied: bool
    theta: float
    head_dim: int
    last_position: int
    fastest_rad: float  # pair 0's angle at the last position = position · θ^0
    slowest_rad: float  # the last pair's: position · θ^(−(head_dim − 2)/head_dim)

    @property
    def text(self) -> str:
        tied = " (the same table is the LM head at the end)" if self.tied else ""
        return (f"Each token id picked one row of the {self.vocab:,} × {self.hidden} embedding table: "
                f"{self.table_params / 1e6:.1f} M parameters, {self.share:.0%} of the model{tied}. "
                f"RoPE then turns each of the {self.head_dim // 2} dimension pairs of q and k by "
                f"position · θ^(−2i/{self.head_dim}), θ = {self.theta:,.0f}: at the last position, "
                f"{self.last_position}, pair 0 has turned {self.fastest_rad:,.0f} rad "
                f"({self.fastest_rad / (2 * np.pi):,.1f} turns), the slowest pair only "
                f"{np.degrees(self.slowest_rad):.2f}°.")


def last_position(trace: Trace) -> int:
    """The position of the last token the model read (its KV cache holds 0 … this one); the last
    produced token was never fed back, so it has no position yet."""
    return trace.steps[-1].context_len - 1 if trace.steps else max(len(trace.prompt_token_ids) - 1, 0)


def embeddings_notice(trace: Trace) -> EmbeddingsNotice:
    spec = trace.model
    theta = spec.rope_theta or 10_000.0
    table = spec.vocab_size * spec.hidden_size
    position = last_position(trace)
    freq = inverse_frequencies(theta, spec.head_dim)  # (head_dim/2,) radians per position
    return EmbeddingsNotice(spec.vocab_size, spec.hidden_size, table, table / spec.param_count,
                            spec.tie_word_embeddings, theta, spec.head_dim, position,
                            float(position * freq[0]), float(position * freq[-1]))


# ---------------------------------------------------------------- attention

@dataclass(frozen=True, slots=True)
class AttentionNotice:
    recorded: bool
    layer: int = -1  # the head with the most weight on the first token
    head: int = -1
    first_share: float = 0.0  # its mean weight on the first token over the prompt's query rows
    first_piece: str = ""
    previous_layer: int = -1  # the head with the most weight on the previous token
    previous_head: int = -1
    previous_share: float = 0.0
    query_rows: int = 0

    @property
    def text(self) -> str:
        if not self.recorded:
            return ("This trace was recorded without attention weights (“Record attention” off), "
                    "so there is nothing to measure here: switch it on and Generate again.")
        kind = ("an attention sink: a place to park weight when nothing else matters"
                if self.first_share > SINK_SHARE else "the closest this run has to a sink")
        previous = ("a previous-token head" if self.previous_share > SINK_SHARE
                    else "the most previous-token-minded head of the recorded layers")
        return (f"Head {self.head} of layer {self.layer} puts {self.first_share:.0%} of its weight "
                f"on the first token, “{self.first_piece}” — {kind}. Head {self.previous_head} "
                f"of layer {self.previous_layer} puts {self.previous_share:.0%} on the token just "
                f"before each query ({previous}). Both are means over the prefill's query rows: "
                f"all {self.query_rows} for the first token (row 0 can only look at itself), "
                f"the {self.query_rows - 1} that have a previous token for the other.")


def attention_notice(trace: Trace) -> AttentionNotice:
    """The strongest first-token (sink) head and the strongest previous-token head, from the
    prefill weights of every recorded layer (engine.lens.attention_stats.head_summary)."""
    if not has_attention(trace):
        return AttentionNotice(recorded=False)
    summary = head_summary(trace)  # each (L_rec, H)
    li, h = np.unravel_index(int(np.argmax(summary["first"])), summary["first"].shape)
    pi, ph = np.unravel_index(int(np.argmax(summary["previous"])), summary["previous"].shape)
    first = trace.prompt_pieces[0] if trace.prompt_pieces else ""
    return AttentionNotice(
        True, trace.attention_layers[li], int(h), float(summary["first"][li, h]), shown(first),
        trace.attention_layers[pi], int(ph), float(summary["previous"][pi, ph]),
        len(trace.prompt_token_ids))


# ---------------------------------------------------------------- FFN and the residual stream

def attention_params_per_layer(spec: ModelSpec) -> int:
    """q, k, v and o projections: hidden · (heads + 2 · kv_heads) · head_dim + heads · head_dim · hidden."""
    return (spec.hidden_size * (spec.heads + 2 * spec.kv_heads) * spec.head_dim
            + spec.heads * spec.head_dim * spec.hidden_size)


def params_per_layer(spec: ModelSpec) -> float:
    """(parameters − embedding tables · vocab · hidden − final norm's hidden) / layers."""
    tables = 1 if spec.tie_word_embeddings else 2
    return (spec.param_count - tables * spec.vocab_size * spec.hidden_size - spec.hidden_size) / spec.layers


def residual_norms(trace: Trace) -> np.ndarray | None:
    """(layers + 1,) ‖x‖ of the residual stream at the prompt's last position: the embedding
    output, then after each layer 0 … L−1 (the last before the final norm); None when the trace
    has no hidden states."""
    hidden = trace.steps[0].hidden if trace.steps else None  # (L + 1, hidden)
    if hidden is None:
        return None
    return np.linalg.norm(hidden.astype(np.float64), axis=-1)


@dataclass(frozen=True, slots=True)
class FFNNotice:
    layer_params: float
    attention_params: int
    ffn_params: float  # the rest of the layer: the FFN and its two norms
    norms: tuple[float, ...] | None  # residual_norms, None without hidden states

    @property
    def ffn_share(self) -> float:
        return self.ffn_params / self.layer_params

    @property
    def text(self) -> str:
        split = (f"Of each layer's {self.layer_params / 1e6:.2f} M parameters, the feed-forward "
                 f"network (and the layer's two norms) holds {self.ffn_share:.0%} and attention's "
                 f"q, k, v, o projections {1 - self.ffn_share:.0%}: attention moves information "
                 "between tokens, the FFN does most of the computing on each.")
        if self.norms is None:
            return split + (" This trace has no hidden states (example runs leave them out), so "
                            "the residual stream itself cannot be shown: generate a run here to see it.")
        return split + (f" Each layer adds its output to the residual stream: at the prompt's last "
                        f"token its length ‖x‖ grew from {self.norms[0]:.2f} after the embedding to "
                        f"{self.norms[-1]:.2f} after layer {len(self.norms) - 2}.")


def ffn_notice(trace: Trace) -> FFNNotice:
    spec = trace.model
    per_layer, attention = params_per_layer(spec), attention_params_per_layer(spec)
    norms = residual_norms(trace)
    return FFNNotice(per_layer, attention, per_layer - attention,
                     None if norms is None else tuple(float(n) for n in norms))


# ---------------------------------------------------------------- next token and sampling

@dataclass(frozen=True, slots=True)
class SamplingNotice:
    greedy: bool
    temperature: float
    top_p: float
    top_k: int
    tokens: int
    off_top: int  # tokens that were not the model's most probable
    step: int  # the step the line (and the figure) is about
    piece: str
    prob: float
    rank: int  # 1 = the most probable
    runner_up: str = ""
    runner_up_prob: float = 0.0

    @property
    def text(self) -> str:
        if self.tokens == 0:
            return "This run produced no token yet."
        if self.greedy:
            return (f"Greedy decoding (temperature 0) took the most probable token at each of the "
                    f"{self.tokens} steps. The model was least sure at step {self.step}: “{self.piece}” "
                    f"with p = {probability(self.prob)}" + (f", the runner-up “{self.runner_up}” "
                                                   f"{probability(self.runner_up_prob)}"
                                                   if self.runner_up else "")
                    + ".")
        limits = "".join([f", top-p {self.top_p:g}" if self.top_p < 1 else "",
                          f", top-k {self.top_k}" if self.top_k else ""])
        head = (f"Sampled at temperature {self.temperature:g}{limits}: {self.off_top} of "
                f"{self.tokens} tokens were not the model's first choice.")
        return head + (f" At step {self.step} it took “{self.piece}”, its rank-{self.rank} candidate "
                       f"(p = {probability(self.prob)} under the model's own distribution)."
                       if self.rank > 1 else f" Its least sure step was {self.step}: “{self.piece}”, "
                       f"p = {probability(self.prob)}.")


def sampling_step(trace: Trace) -> Step | None:
    """The step worth a look: sampled runs, the one that took the lowest-ranked token (the
    first of equals); greedy runs (or none off the top), the least probable choice."""
    if not trace.steps:
        return None
    worst = max(trace.steps, key=lambda s: (s.chosen_rank, -s.index))
    if not trace.settings.greedy and worst.chosen_rank > 0:
        return worst
    return min(trace.steps, key=lambda s: (s.chosen_prob, s.index))


def sampling_notice(trace: Trace) -> SamplingNotice:
    s = trace.settings
    step = sampling_step(trace)
    if step is None:
        return SamplingNotice(s.greedy, s.temperature, s.top_p, s.top_k, 0, 0, -1, "", 0.0, 0)
    others = [(shown(p), float(q)) for p, q, i in zip(step.top_pieces, step.top_probs, step.top_ids)
              if int(i) != step.token_id]
    runner = others[0] if others else ("", 0.0)
    return SamplingNotice(s.greedy, s.temperature, s.top_p, s.top_k, len(trace.steps),
                          sum(x.chosen_rank > 0 for x in trace.steps), step.index,
                          shown(step.piece), step.chosen_prob, step.chosen_rank + 1, *runner)
