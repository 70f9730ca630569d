"""`TextOnlyTokenizerFast`: a `PreTrainedTokenizerFast` that never turns text into special ids.

Two conventions exist for text that merely *contains* a special-token string such as
"<|im_end|>" or "<|eot_id|>":
- HF's (AutoTokenizer): it becomes the special id, as in every HF chat model;
- ours (every encode path here: encode, __call__, tokenize, encode_batch): it stays ordinary
  text, whatever the caller passes (`split_special_tokens` is always on). Only the chat
  renderers (utils/conversation.py, utils/chat_template.py) insert special ids, by id, so a
  user cannot forge a turn boundary.

Both our own tokenizers (`Z2allTokenizer`) and those of pretrained models
(`PretrainedTokenizer`) are built on it. The tokenizer.json post-processor still applies
(a Llama tokenizer's BOS is added to plain text, as HF does).
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerFast


class TextOnlyTokenizerFast(PreTrainedTokenizerFast):
    """`PreTrainedTokenizerFast` whose every encode path keeps special-token strings as text;
    adds `encode_batch(texts)` (ordinary text, no post-processor)."""

    # --- encode paths: special-token strings are always ordinary text ------------------------
    def _encode_plus(self, *args: Any, **kwargs: Any):
        # transformers' one entry point for encode, __call__ and tokenize; a caller's
        # split_special_tokens=False is overridden here.
        kwargs["split_special_tokens"] = True
        kwargs.pop("sanitize_control_tokens", None)
        return super()._encode_plus(*args, **kwargs)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, as ordinary text: the library's own batch encoder (Rust,
        multi-threaded), with no Python work per token."""
        if isinstance(texts, str):
            raise TypeError("encode_batch takes a list of texts; use encode(text) for one text")
        self.backend_tokenizer.encode_special_tokens = True
        encodings = self.backend_tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def apply_chat_template(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(
            "z2all's tokenizer keeps special-token strings as text, so it cannot encode a "
            "rendered template: use utils.conversation (injection-safe ids built by id), or "
            "transformers.AutoTokenizer.from_pretrained(dir) for the HF convention")

    # --- decoding: exact, and loud about ids outside the vocabulary --------------------------
    def _decode(self, token_ids: int | list[int], skip_special_tokens: bool = False,
                clean_up_tokenization_spaces: bool | None = None, **kwargs: Any) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        bad = [i for i in ids if not 0 <= i < len(self)]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {len(self)})")
        return super()._decode(ids, skip_special_tokens=skip_special_tokens,
                               clean_up_tokenization_spaces=False)

