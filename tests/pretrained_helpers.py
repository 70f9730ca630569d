"""Pretrained-style tokenizer directories built offline: the tiny byte-level BPE of
tests/conftest.py with a model family's special tokens and chat template (ChatML, Llama-3 headers
with BOS, Zephyr). The templates mark what the assistant is trained on with transformers'
`{% generation %}` tags, so `apply_chat_template(..., return_assistant_tokens_mask=True)` is an
independent reference for our prefix-derived masks. Also random conversations."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import tokenizers
from tokenizers.processors import TemplateProcessing

_ASSISTANT = ("{% if message['role'] == 'assistant' %}{% generation %}{{ REPLY }}"
              "{% endgeneration %}{% else %}{{ REPLY }}{% endif %}")


def _template(header: str, reply: str, glue: str, prompt: str, preamble: str = "") -> str:
    return (preamble + "{% for message in messages %}{{ " + header + " }}"
            + _ASSISTANT.replace("REPLY", reply) + glue + "{% endfor %}"
            "{% if add_generation_prompt %}{{ " + prompt + " }}{% endif %}")


STYLES = {
    "chatml": dict(
        specials=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        bos=None, eos="<|im_end|>", stops=["<|im_end|>", "<|endoftext|>"],
        template=_template("'<|im_start|>' + message['role'] + '\\n'",
                           "message['content'] + '<|im_end|>'", "{{ '\\n' }}",
                           "'<|im_start|>assistant\\n'")),
    "llama3": dict(
        specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"],
        bos="<|begin_of_text|>", eos="<|end_of_text|>", stops=["<|end_of_text|>", "<|eot_id|>"],
        template=_template("'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'",
                           "message['content'] | trim + '<|eot_id|>'", "",
                           "'<|start_header_id|>assistant<|end_header_id|>\\n\\n'",
                           preamble="{{ bos_token }}")),
    "zephyr": dict(
        specials=["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"],
        bos="<s>", eos="</s>", stops=["</s>"],
        template=_template("'<|' + message['role'] + '|>\\n'", "message['content'] + eos_token",
                           "{{ '\\n' }}", "'<|assistant|>\\n'")),
}


def make_pretrained_tokenizer_dir(base_dir: Path, out: Path, style: str) -> Path:
    """`base_dir`'s tokenizer.json + the style's special tokens, a BOS post-processor for
    Llama-3, tokenizer_config.json, generation_config.json; Zephyr's template goes to
    chat_template.jinja (where transformers 5 writes it), the others' into the config."""
    spec = STYLES[style]
    raw = tokenizers.Tokenizer.from_file(str(base_dir / "tokenizer.json"))
    raw.add_special_tokens([tokenizers.AddedToken(token, special=True, normalized=False)
                            for token in spec["specials"]])
    if spec["bos"] == "<|begin_of_text|>":
        bos_id = raw.token_to_id(spec["bos"])
        raw.post_processor = TemplateProcessing(single=f"{spec['bos']} $A",
                                                pair=f"{spec['bos']} $A $B",
                                                special_tokens=[(spec["bos"], bos_id)])
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    raw.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": spec["bos"],
              "eos_token": spec["eos"], "clean_up_tokenization_spaces": False}
    if style == "zephyr":
        (out / "chat_template.jinja").write_text(spec["template"])
    else:
        config["chat_template"] = spec["template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    stops = [raw.token_to_id(token) for token in spec["stops"]]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    return out


_WORDS = ["hello", "the model", "我们的", "日本語", "😀", "(x)", "**bold**", "12345", "def f():",
          "  indented", "tab\there", "end."]
_SPACES = [" ", "  ", "\n", "\n\n", "\t", ""]


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(_WORDS) + rng.choice(_SPACES) for _ in range(rng.randint(1, 6)))


def random_conversation(rng: random.Random, injected: list[str] = ()) -> list[dict]:
    """system? (user, assistant)+; `injected` strings are sprinkled into the contents."""
    def content() -> str:
        text = random_text(rng)
        if injected and rng.random() < 0.5:
            cut = rng.randint(0, len(text))
            text = text[:cut] + rng.choice(injected) + text[cut:]
        return text
    messages = [{"role": "system", "content": content()}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 3)):
        messages += [{"role": "user", "content": content()},
                     {"role": "assistant", "content": content()}]
    return messages
