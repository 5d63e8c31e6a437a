"""From a step's logits to text: the batch's tokens sampled in one pass, each request's tokens
decoded incrementally, and stop sequences held back until they are decided."""

import torch

from agents.llm.tool_format import partial_suffix


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator=None) -> int:
    """Greedy at temperature 0; otherwise nucleus sampling from softmax(logits / temperature)."""
    return sample_rows(logits.unsqueeze(0), [temperature], [top_p], [generator])[0]


def sample_rows(
    logits: torch.Tensor, temperatures: list[float], top_ps: list[float], generators: list
) -> list[int]:
    """One token per row of [rows, vocab] logits, each with its row's settings: the greedy rows
    in one argmax, the others in one softmax and one nucleus cut; a row with its own generator
    (a seed) draws from it, so its draws do not depend on the rest of the batch."""
    tokens = [0] * len(temperatures)
    greedy = [i for i, t in enumerate(temperatures) if t == 0]
    if greedy:
        for i, token in zip(greedy, logits[greedy].argmax(dim=-1).tolist(), strict=True):
            tokens[i] = token
    drawn = [i for i, t in enumerate(temperatures) if t != 0]
    if not drawn:
        return tokens
    scale = torch.tensor([temperatures[i] for i in drawn], dtype=torch.float32).unsqueeze(1)
    probs = torch.softmax(logits[drawn].float() / scale, dim=-1)
    cut = [row for row, i in enumerate(drawn) if top_ps[i] < 1]
    if cut:
        top_p = torch.tensor([top_ps[drawn[row]] for row in cut]).unsqueeze(1)
        sorted_probs, order = probs[cut].sort(dim=-1, descending=True)
        # keep the smallest set of tokens whose probability reaches top_p
        sorted_probs[sorted_probs.cumsum(-1) - sorted_probs > top_p] = 0
        probs[cut] = torch.zeros_like(sorted_probs).scatter(1, order, sorted_probs)
    shared = [row for row, i in enumerate(drawn) if generators[i] is None]
    if shared:
        for row, token in zip(
            shared, torch.multinomial(probs[shared], 1)[:, 0].tolist(), strict=True
        ):
            tokens[drawn[row]] = token
    for row, i in enumerate(drawn):
        if generators[i] is not None:
            tokens[i] = int(torch.multinomial(probs[row], 1, generator=generators[i]))
    return tokens


class Detokenizer:
    """A request's reply text, decoding only its newest tokens (after the last committed
    piece's, for context: a merged space or the tail of a multi-byte character depends on what
    precedes it) rather than the whole reply at every token, as TGI and vLLM do. Text is
    committed once it ends on a whole character; until then the pending tail (ending in
    U+FFFD) is shown, not committed."""

    def __init__(self, decode):
        self.decode = decode  # token ids -> text, special tokens skipped
        self.tokens: list[int] = []
        self.committed = ""
        self.context = 0  # the tokens of the last committed piece begin here
        self.read = 0  # tokens before this are in `committed`

    def add(self, token: int) -> str:
        """The whole text so far, `token` included."""
        self.tokens.append(token)
        before = self.decode(self.tokens[self.context : self.read])
        text = self.decode(self.tokens[self.context :])
        new = text[len(before) :]
        if new and not new.endswith("\ufffd"):
            self.committed += new
            self.context, self.read = self.read, len(self.tokens)
            return self.committed
        return self.committed + new


class StopText:
    """Turns the growing decoded text into safe pieces: text that might still become a stop
    sequence, or ends inside a multi-byte character, is held back until it is decided."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.text = ""
        self.sent = 0

    def advance(self, text: str) -> tuple[str, bool]:
        self.text = text
        hits = [
            i
            for i in (text.find(stop, max(0, self.sent - len(stop))) for stop in self.stops)
            if i >= 0
        ]
        if hits:
            return self._emit(min(hits)), True
        hold = max((partial_suffix(text, stop) for stop in self.stops), default=0)
        end = len(text) - hold
        while end > self.sent and text[end - 1] == "\ufffd":  # an incomplete UTF-8 character
            end -= 1
        return self._emit(end), False

    def flush(self) -> str:
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        piece = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece
