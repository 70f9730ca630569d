r"""Any model's own Jinja chat template -> token ids + the assistant loss mask, injection-safe.

A pretrained chat model comes with its template (tokenizer_config.json's "chat_template", or
chat_template.jinja). We render it as transformers does (jinja2's ImmutableSandboxedEnvironment:
a template is data and cannot reach Python), and then do two things transformers does not:

1. Text never becomes a special id. Before rendering, every special-token string inside a
   message's content is replaced by a private-use marker (U+E000 k U+E001); the rendered string
   is cut at the special-token strings that remain (the template's own), those become ids, and
   the text between them is encoded as ordinary text with the markers turned back into the
   characters the user typed. Without such strings in the content, the ids are exactly those
   of HF's `apply_chat_template`.

2. The assistant mask comes from the template itself, by prefixes. For each assistant message
   i, with P = render(messages[:i], add_generation_prompt=True) and
   T = render(messages[:i+1]), the trained tokens are those of T beyond P: the reply and the
   template's end-of-turn token. Worked example (Llama-3 headers, H(r) = <|start_header_id|>r
   <|end_header_id|>\n\n, E = <|eot_id|>):

       whole   <|begin_of_text|> H(user) "Hi" E  H(assistant) "Hello" E
       P       <|begin_of_text|> H(user) "Hi" E  H(assistant)
       T       = whole (the last turn)
       mask    0                 0...    0    0  0...         1       1

   Template text after the last special token of T beyond P (ChatML's "\n" after
   <|im_end|>) is glue that generation never produces and is not trained, as in
   utils/conversation.py. The mask starts at the first token where the whole conversation's
   ids part from P's (a reply starting with a line break may merge with the header's "\n":
   that token carries content and is trained). A template for which P is not a prefix of T,
   or T of the whole (e.g. one that rewrites earlier turns), is refused in one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from utils.conversation import Message, common_prefix_length, is_trained

_MARKER = re.compile("\ue000([0-9]+)\ue001")


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tags) renders its
    body: our masks come from prefixes, so the tags only need to parse."""
    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(format: str) -> str:  # noqa: A002 (the name templates call it with)
    return datetime.now().strftime(format)


class ChatTemplate:
    """One tokenizer's template. `special_tokens` are every added token's string (where the
    rendered text is cut), `variables` the bos_token/eos_token/... strings templates use, and
    `encode_texts` / `token_id` the tokenizer's ordinary-text batch encoder and id lookup."""

    def __init__(self, source: str, where: str, special_tokens: Sequence[str],
                 variables: dict[str, str | None],
                 encode_texts: Callable[[list[str]], list[list[int]]],
                 token_id: Callable[[str], int]) -> None:
        self.where = where
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag])
        environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            self.template = environment.from_string(source)
        except TemplateError as error:
            raise ValueError(f"{where}: the chat template does not parse: {error}") from None
        self.variables = variables
        self.escaped = sorted(special_tokens, key=len, reverse=True) + ["\ue000"]
        self.escape_pattern = re.compile("|".join(map(re.escape, self.escaped)))
        alternatives = "|".join(map(re.escape, self.escaped[:-1])) or "(?!)"  # (?!): no match
        self.special_pattern = re.compile(f"({alternatives})")
        self.special_ids = {token: token_id(token) for token in self.escaped[:-1]}
        self.encode_texts = encode_texts

    # --- text ------------------------------------------------------------------------------
    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        """The template's text for `messages` whose contents are already escaped."""
        try:
            return self.template.render(messages=list(messages), tools=None, documents=None,
                                        add_generation_prompt=add_generation_prompt,
                                        **self.variables)
        except TemplateError as error:
            raise ValueError(f"{self.where}: the chat template failed: {error}") from None

    def escape(self, messages: Sequence[Message]) -> list[Message]:
        """Each special-token string (and the marker character) in a content -> a marker."""
        def marker(match: re.Match) -> str:
            return f"\ue000{self.escaped.index(match[0])}\ue001"
        return [{**message, "content": self.escape_pattern.sub(marker, message["content"])}
                for message in messages]

    # --- ids -------------------------------------------------------------------------------
    def encode(self, rendered: str) -> tuple[list[int], list[bool]]:
        """(ids, is_special) of a rendered string: cut at the template's special tokens, text
        between them encoded as ordinary text with the markers restored."""
        pieces = self.special_pattern.split(rendered)  # text, special, text, special, ...
        texts = [_MARKER.sub(lambda match: self.escaped[int(match[1])], piece)
                 for piece in pieces[0::2]]
        encoded = iter(self.encode_texts(texts))
        ids: list[int] = []
        is_special: list[bool] = []
        for position, piece in enumerate(pieces):
            piece_ids = next(encoded) if position % 2 == 0 else [self.special_ids[piece]]
            ids += piece_ids
            is_special += [position % 2 == 1] * len(piece_ids)
        return ids, is_special

    def generation_prompt(self, messages: Sequence[Message]) -> list[int]:
        """Ids of `messages` and the template's opening of the assistant's reply."""
        return self.encode(self.render(self.escape(messages), add_generation_prompt=True))[0]

    def ids_and_mask(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """(ids, loss mask) of one conversation; see the module docstring."""
        escaped = self.escape(messages)
        whole = self.render(escaped, add_generation_prompt=False)
        ids, is_special = self.encode(whole)
        mask = [0] * len(ids)
        for index, message in enumerate(escaped):
            if not is_trained(message):
                continue
            # Step 1: the two prefixes, which must be prefixes of the whole text.
            prompt = self.render(escaped[:index], add_generation_prompt=True)
            turn = self.render(escaped[:index + 1], add_generation_prompt=False)
            if not (whole.startswith(turn) and turn.startswith(prompt)):
                raise ValueError(
                    f"{self.where}: the chat template is not prefix-stable at message {index} "
                    "(rendering the conversation up to a reply does not give the start of the "
                    "whole rendering), so assistant masks cannot be derived from it")
            # Step 2: where the whole conversation's ids part from each prefix's.
            start = common_prefix_length(ids, self.encode(prompt)[0])
            end = common_prefix_length(ids, self.encode(turn)[0])
            # Step 3: up to the end-of-turn special token; the glue after it is not trained.
            specials = [i for i in range(start, end) if is_special[i]]
            end = specials[-1] + 1 if specials else end
            mask[start:end] = [1] * (end - start)
        return ids, mask
