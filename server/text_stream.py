"""Token ids -> text deltas that are safe to send, honouring the request's stop strings.

Two things can make the text of the tokens so far unsafe to send yet:
- a multi-byte character (Chinese, emoji) split over several tokens decodes to U+FFFD until
  its last byte arrives, so we wait while the text ends in U+FFFD (as `generate.py` does);
- a stop string may be forming: with stop "END", text ending in "E" or "EN" is held back.
  Once "END" appears, everything before it is sent and the response ends there (OpenAI's rule:
  the stop string itself is not returned).

Example, stop = ["END"]:  tokens "Hi", " E", "ND", ...  ->  deltas "Hi", "", " " and stopped.
"""

from __future__ import annotations

from utils.tokenizer_protocol import Tokenizer


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stop_strings: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.token_ids: list[int] = []
        self.sent = 0  # characters of the decoded text already returned
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one generated token; returns the new text that may be sent (maybe "")."""
        self.token_ids.append(token_id)
        text = self.tokenizer.decode(self.token_ids)
        return "" if text.endswith("\ufffd") else self._release(text, final=False)

    def finish(self) -> str:
        """The rest of the text once generation has ended."""
        return self._release(self.tokenizer.decode(self.token_ids), final=True)

    def _release(self, text: str, final: bool) -> str:
        if self.stopped:
            return ""
        found = [index for index in (text.find(stop, self.sent) for stop in self.stop_strings)
                 if index >= 0]
        if found:
            end, self.stopped = min(found), True
        elif final:
            end = len(text)
        else:
            end = len(text) - self._forming_stop_length(text)
        delta = text[self.sent:end]
        self.sent = max(self.sent, end)
        return delta

    def _forming_stop_length(self, text: str) -> int:
        """Length of the longest end of `text` that begins some stop string."""
        longest = 0
        for stop in self.stop_strings:
            for size in range(min(len(stop) - 1, len(text) - self.sent), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
