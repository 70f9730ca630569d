"""A pretrained tokenizer's own template (utils/chat_template.py through tokenizer.load_tokenizer
and utils.conversation), checked against transformers: ids = AutoTokenizer.apply_chat_template's,
assistant masks = its `return_assistant_tokens_mask` (the templates' {% generation %} tags), for
ChatML, Llama-3 headers with BOS and Zephyr; our ChatML renderer = the template path on the
demo template; text never becomes a special id; stop ids = the generation config's."""

from __future__ import annotations

import json
import random

import pytest
from transformers import AutoTokenizer, GenerationConfig

from dataset.build import build_datasets
from tests.pretrained_helpers import (
    STYLES,
    make_pretrained_tokenizer_dir,
    random_conversation,
    random_text,
)
from tokenizer import load_tokenizer
from utils.chat_template import ChatTemplate
from utils.conversation import (
    CHAT_TEMPLATE,
    build_generation_prompt,
    render_conversation,
    render_conversations,
    stop_ids,
)
from utils.labels import IGNORE_INDEX
from utils.tokenizer_protocol import TemplatedTokenizer, Tokenizer


@pytest.fixture(scope="module", params=sorted(STYLES))
def pair(request, tiny_hf_tokenizer_dir, tmp_path_factory):
    """(our tokenizer, stock AutoTokenizer, style) on one pretrained-style directory."""
    directory = make_pretrained_tokenizer_dir(
        tiny_hf_tokenizer_dir, tmp_path_factory.mktemp("pretrained") / request.param,
        request.param)
    return load_tokenizer(directory), AutoTokenizer.from_pretrained(directory), request.param


@pytest.mark.parametrize("seed", range(3))
def test_ids_and_masks_equal_transformers(pair, seed):
    ours, hf, _ = pair
    rng = random.Random(seed)
    conversations = [random_conversation(rng) for _ in range(8)]
    for messages, (ids, mask) in zip(conversations, render_conversations(ours, conversations)):
        reference = hf.apply_chat_template(messages, tokenize=True, return_dict=True,
                                           return_assistant_tokens_mask=True)
        assert ids == reference["input_ids"]
        assert mask == reference["assistant_masks"]
        assert sum(mask) > 0


def test_sft_dataset_trains_on_transformers_assistant_mask(pair, tmp_path):
    """Through the real data path (build_datasets: worker processes, the online cache): each
    sample's labels are the next tokens where transformers' assistant mask is 1."""
    ours, hf, _ = pair
    rng = random.Random(21)
    conversations = [random_conversation(rng) for _ in range(6)]
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "train.jsonl").write_text(
        "".join(json.dumps({"messages": messages}) + "\n" for messages in conversations))
    (tmp_path / "raw" / "valid.jsonl").write_text(json.dumps({"messages": conversations[0]}))
    train, _, _ = build_datasets("sft", tmp_path / "raw", ours, 1024,
                                 num_workers=1)
    expected = set()
    for messages in conversations:
        reference = hf.apply_chat_template(messages, return_dict=True,
                                           return_assistant_tokens_mask=True)
        ids, mask = reference["input_ids"], reference["assistant_masks"]
        labels = [i if m else IGNORE_INDEX for i, m in zip(ids[1:], mask[1:])] + [IGNORE_INDEX]
        expected.add((tuple(ids), tuple(labels)))
    assert {(tuple(train[i]["input_ids"].tolist()), tuple(train[i]["labels"].tolist()))
            for i in range(len(train))} == expected


def test_generation_prompt_equals_transformers(pair):
    ours, hf, _ = pair
    rng = random.Random(7)
    for _ in range(5):
        messages = random_conversation(rng)[:-1]  # ends with the user's turn
        assert build_generation_prompt(ours, messages) == hf.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False)


def test_plain_text_and_stop_ids_follow_the_directory(pair):
    ours, hf, style = pair
    text = random_text(random.Random(3))
    assert ours.encode(text) == hf.encode(text)  # BOS where tokenizer.json adds it
    assert (ours.encode(text)[0] == ours.bos_token_id) == (style == "llama3")
    reference = GenerationConfig.from_pretrained(ours.name_or_path).eos_token_id
    assert set(stop_ids(ours)) == {hf.eos_token_id, *reference}


def test_text_never_becomes_a_special_id(pair):
    ours, hf, style = pair
    specials = STYLES[style]["specials"]
    special_ids = {ours.convert_tokens_to_ids(token) for token in specials}
    rng = random.Random(11)
    for _ in range(5):
        messages = random_conversation(rng, injected=[*specials, "\ue000", "\ue0000\ue001"])
        clean = [{**message, "content": "x"} for message in messages]
        ids, mask = render_conversation(ours, messages)
        clean_ids, clean_mask = render_conversation(ours, clean)
        # The same special ids, in the same order, as for harmless content: the template's.
        assert [i for i in ids if i in special_ids] == [i for i in clean_ids if i in special_ids]
        assert sum(mask) > 0
        # And the text is kept: the ids decode to what transformers renders.
        rendered = hf.apply_chat_template(messages, tokenize=False)
        assert ours.decode(ids) == rendered


@pytest.mark.parametrize("seed", range(3))
def test_demo_template_gives_the_chatml_renderer(tiny_hf_tokenizer_dir, seed):
    """The template path on utils.conversation's own template = its hand-written renderer
    (itself checked against transformers in tests/test_hf_interop.py)."""
    ours = load_tokenizer(tiny_hf_tokenizer_dir)
    template = ChatTemplate(CHAT_TEMPLATE, "demo", list(ours.special_token_ids), {},
                            ours.encode_batch, ours.convert_tokens_to_ids)
    rng = random.Random(seed)
    for _ in range(8):
        messages = random_conversation(rng, injected=["<|im_end|>", "\n"])
        assert template.ids_and_mask(messages) == render_conversation(ours, messages)


def test_fingerprint_covers_the_template(pair, tmp_path):
    """Another template renders other ids and masks from the same tokenizer.json: a cache or
    a run check keyed by the fingerprint must see the difference."""
    ours, _, _ = pair
    changed = tmp_path / "changed"
    ours.save_pretrained(changed)
    config = json.loads((changed / "tokenizer_config.json").read_text())
    if "chat_template" in config:
        config["chat_template"] = config["chat_template"].replace("message['role']", "'x'")
        (changed / "tokenizer_config.json").write_text(json.dumps(config))
    else:
        template = (changed / "chat_template.jinja").read_text()
        (changed / "chat_template.jinja").write_text(template.replace("message['role']", "'x'"))
    assert load_tokenizer(changed).fingerprint != ours.fingerprint
    assert load_tokenizer(ours.name_or_path).fingerprint == ours.fingerprint


def test_template_that_rewrites_earlier_turns_is_refused(tiny_hf_tokenizer_dir):
    ours = load_tokenizer(tiny_hf_tokenizer_dir)
    unstable = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] }}"
                "{% if loop.last %}{{ ' (last)' }}{% endif %}"
                "{{ '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}")
    template = ChatTemplate(unstable, "unstable", list(ours.special_token_ids), {},
                            ours.encode_batch, ours.convert_tokens_to_ids)
    messages = random_conversation(random.Random(0))
    with pytest.raises(ValueError, match="not prefix-stable") as error:
        template.ids_and_mask(messages)
    assert "\n" not in str(error.value)


def test_both_tokenizers_answer_the_protocol_and_only_a_pretrained_one_is_templated(
        pair, tiny_hf_tokenizer_dir):
    """The chat code tells a pretrained model's tokenizer from ours by the `TemplatedTokenizer`
    protocol (utils/tokenizer_protocol.py), not by probing attributes: ours renders ChatML."""
    pretrained, ours = pair[0], load_tokenizer(tiny_hf_tokenizer_dir)
    for tokenizer in (pretrained, ours):
        for member in [*Tokenizer.__annotations__, "encode", "encode_batch", "decode",
                       "convert_tokens_to_ids", "save_pretrained"]:
            assert hasattr(tokenizer, member), (type(tokenizer).__name__, member)
    assert isinstance(pretrained, TemplatedTokenizer)
    assert not isinstance(ours, TemplatedTokenizer)
    assert stop_ids(pretrained) == list(pretrained.stop_token_ids)
