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

from i18n import _, chinese

from ..records.trace import Step, Trace
from ..spec import ModelSpec
from .attention_stats import has_attention, head_summary
from .rope import inverse_frequencies
from .tokens import piece_bytes
from .wording import isolated, probability, shown

SINK_SHARE = 0.5  # a head putting more than this on the first token is called a sink (as head_roles)


def sentences(*parts: str) -> str:
    """Whole sentences, each translated on its own, as one line: a space between them in English,
    none in Chinese (a sentence there ends with 。)."""
    return ("" if chinese() else " ").join(parts)


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
        if self.special:
            head = _("Your prompt's {characters:,} characters and the chat template's turns around "
                     "them became {tokens:,} tokens ({special} of them special tokens of the chat "
                     "template).").format(characters=self.characters, tokens=self.tokens,
                                          special=self.special)
        else:
            head = _("Your prompt's {characters:,} characters became {tokens:,} tokens.").format(
                characters=self.characters, tokens=self.tokens)
        if self.word is None:
            return head
        k = len(self.word.pieces)
        word = isolated(self.word.text)
        if k == 1:
            return sentences(head, _("Every word is a single token here, even the longest, "
                                     "“{word}”.").format(word=word))
        pieces = " · ".join(self.word.pieces)
        if self.typed:
            split = _("The word cut into the most pieces, “{word}”, became {k}: {pieces}.")
        else:
            split = _("Every word you typed is a single token; the chat template's “{word}” became "
                      "{k}: {pieces}.")
        parts = [head, split.format(word=word, k=k, pieces=pieces)]
        if any("<" in p for p in self.word.pieces):
            parts.append(_("The <..> pieces are raw UTF-8 bytes: the tokenizer saw these characters "
                           "too rarely to give them tokens of their own."))
        return sentences(*parts)


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
        if self.tied:
            table = _("Each token id picked one row of the {vocab:,} × {hidden} embedding table: "
                      "{millions:.1f} M parameters, {share:.0%} of the model (the same table is the "
                      "LM head at the end).")
        else:
            table = _("Each token id picked one row of the {vocab:,} × {hidden} embedding table: "
                      "{millions:.1f} M parameters, {share:.0%} of the model.")
        rope = _("RoPE then turns each of the {pairs} dimension pairs of q and k by "
                 "position · θ^(−2i/{head_dim}), θ = {theta:,.0f}: at the last position, "
                 "{position}, pair 0 has turned {fastest:,.0f} rad ({turns:,.1f} turns), the "
                 "slowest pair only {slowest:.2f}°.")
        return sentences(
            table.format(vocab=self.vocab, hidden=self.hidden, millions=self.table_params / 1e6,
                         share=self.share),
            rope.format(pairs=self.head_dim // 2, head_dim=self.head_dim, theta=self.theta,
                        position=self.last_position, fastest=self.fastest_rad,
                        turns=self.fastest_rad / (2 * np.pi),
                        slowest=float(np.degrees(self.slowest_rad))))


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
            return _("This trace was recorded without attention weights (“Record attention” off), "
                     "so there is nothing to measure here: switch it on and Generate again.")
        if self.first_share > SINK_SHARE:
            first = _("Head {head} of layer {layer} puts {share:.0%} of its weight on the first "
                      "token, “{piece}” — an attention sink: a place to park weight when nothing "
                      "else matters.")
        else:
            first = _("Head {head} of layer {layer} puts {share:.0%} of its weight on the first "
                      "token, “{piece}” — the closest this run has to a sink.")
        if self.previous_share > SINK_SHARE:
            previous = _("Head {head} of layer {layer} puts {share:.0%} on the token just before "
                         "each query (a previous-token head).")
        else:
            previous = _("Head {head} of layer {layer} puts {share:.0%} on the token just before "
                         "each query (the most previous-token-minded head of the recorded layers).")
        return sentences(
            first.format(head=self.head, layer=self.layer, share=self.first_share,
                         piece=self.first_piece),
            previous.format(head=self.previous_head, layer=self.previous_layer,
                            share=self.previous_share),
            _("Both are means over the prefill's query rows: all {rows} for the first token (row 0 "
              "can only look at itself), the {others} that have a previous token for the "
              "other.").format(rows=self.query_rows, others=self.query_rows - 1))


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
        split = _("Of each layer's {millions:.2f} M parameters, the feed-forward network (and the "
                  "layer's two norms) holds {ffn:.0%} and attention's q, k, v, o projections "
                  "{attention:.0%}: attention moves information between tokens, the FFN does most "
                  "of the computing on each.").format(millions=self.layer_params / 1e6,
                                                       ffn=self.ffn_share,
                                                       attention=1 - self.ffn_share)
        if self.norms is None:
            return sentences(split, _("This trace has no hidden states (example runs leave them "
                                      "out), so the residual stream itself cannot be shown: "
                                      "generate a run here to see it."))
        return sentences(split, _("Each layer adds its output to the residual stream: at the "
                                  "prompt's last token its length ‖x‖ grew from {first:.2f} after "
                                  "the embedding to {last:.2f} after layer {layer}.").format(
            first=self.norms[0], last=self.norms[-1], layer=len(self.norms) - 2))


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
            return _("This run produced no token yet.")
        if self.greedy:
            if self.runner_up:
                return _("Greedy decoding (temperature 0) took the most probable token at each of "
                         "the {tokens} steps. The model was least sure at step {step}: “{piece}” "
                         "with p = {p}, the runner-up “{runner_up}” {runner_up_p}.").format(
                    tokens=self.tokens, step=self.step, piece=self.piece,
                    p=probability(self.prob), runner_up=self.runner_up,
                    runner_up_p=probability(self.runner_up_prob))
            return _("Greedy decoding (temperature 0) took the most probable token at each of the "
                     "{tokens} steps. The model was least sure at step {step}: “{piece}” with "
                     "p = {p}.").format(tokens=self.tokens, step=self.step, piece=self.piece,
                                        p=probability(self.prob))
        limits = [_("temperature {temperature:g}").format(temperature=self.temperature)]
        if self.top_p < 1:
            limits.append(f"top-p {self.top_p:g}")
        if self.top_k:
            limits.append(f"top-k {self.top_k}")
        head = _("Sampled at {limits}: {off_top} of {tokens} tokens were not the model's first "
                 "choice.").format(limits=("、" if chinese() else ", ").join(limits),
                                   off_top=self.off_top, tokens=self.tokens)
        if self.rank > 1:
            step = _("At step {step} it took “{piece}”, its rank-{rank} candidate (p = {p} under "
                     "the model's own distribution).")
        else:
            step = _("Its least sure step was {step}: “{piece}”, p = {p}.")
        return sentences(head, step.format(step=self.step, piece=self.piece, rank=self.rank,
                                           p=probability(self.prob)))


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
