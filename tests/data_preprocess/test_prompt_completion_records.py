"""TRL's prompt/completion SFT records, plain (`{"prompt": "..", "completion": ".."}`) and
conversational (`{"prompt": [messages], "completion": [messages]}`), read by
`pretokenize_sft_data` and by the trainer's online SFT path: the same tokens as the conversation
written as messages, trained only on the completion (an assistant turn inside the prompt is
context)."""

from __future__ import annotations

import json

import pytest

from data_preprocess import pretokenize_chat
from tests.megatron_spec_reader import read_by_spec
from tests.pretrained_helpers import make_pretrained_tokenizer_dir
from tests.train_helpers import TINY_ARGS, train_losses
from train_my_ddp import main as train_main

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "What is 2 + 3?"}
REPLY = {"role": "assistant", "content": "It is 5."}
FOLLOW_UP = {"role": "user", "content": "And 2 + 4?"}
ANSWER = {"role": "assistant", "content": "6, of course."}
# (TRL record, the same conversation as messages, which assistant turns the prompt holds)
CASES = {
    "plain": ({"prompt": USER["content"], "completion": REPLY["content"]}, [USER, REPLY], 0),
    "conversational": ({"prompt": [SYSTEM, USER], "completion": [REPLY]},
                       [SYSTEM, USER, REPLY], 0),
    "multi-turn prompt": ({"prompt": [USER, REPLY, FOLLOW_UP], "completion": [ANSWER]},
                          [USER, REPLY, FOLLOW_UP, ANSWER], 1),
    "plain prompt, message completion": ({"prompt": USER["content"], "completion": [REPLY]},
                                          [USER, REPLY], 0),
}


def write_records(folder, records) -> None:
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def pretokenized(tmp_path, name, records, tokenizer_dir) -> tuple[list, list]:
    write_records(tmp_path / name, records)
    pretokenize_chat.main("sft", ["--data_dir", str(tmp_path / name), "--tokenizer_dir",
                                  str(tokenizer_dir), "--max_seq_len", "256", "--out_dir",
                                  str(tmp_path / f"{name}_pretok"), "--num_workers", "0"])
    ids = read_by_spec(tmp_path / f"{name}_pretok/train")["sequences"]
    mask = read_by_spec(tmp_path / f"{name}_pretok/train.mask")["sequences"]
    return ids[0].tolist(), mask[0].tolist()


@pytest.fixture(scope="module")
def llama3_style_tokenizer_dir(tiny_hf_tokenizer_dir, tmp_path_factory):
    """A pretrained tokenizer with its own chat template (utils/chat_template.py renders it)."""
    return make_pretrained_tokenizer_dir(
        tiny_hf_tokenizer_dir, tmp_path_factory.mktemp("pretrained") / "llama3", "llama3")


@pytest.mark.parametrize("tokenizer", ["ours", "llama3 template"])
@pytest.mark.parametrize("case", CASES)
def test_pretokenize_sft_data_reads_trl_records_as_their_conversation(
        case, tokenizer, tmp_path, tiny_hf_tokenizer_dir, llama3_style_tokenizer_dir):
    record, messages, context_replies = CASES[case]
    tokenizer_dir = tiny_hf_tokenizer_dir if tokenizer == "ours" else llama3_style_tokenizer_dir
    trl_ids, trl_mask = pretokenized(tmp_path, "trl", [record], tokenizer_dir)
    ids, mask = pretokenized(tmp_path, "messages", [{"messages": messages}], tokenizer_dir)
    assert trl_ids == ids
    trained_runs = "".join(map(str, mask)).split("0")
    assert len([run for run in trained_runs if run]) == 1 + context_replies
    if context_replies:  # the prompt's reply is context: only the last run stays trained
        first_run_end = mask.index(1) + mask[mask.index(1):].index(0)
        mask = [0] * first_run_end + mask[first_run_end:]
    assert trl_mask == mask


def test_the_trainer_reads_trl_records_online_as_their_conversations(tmp_path,
                                                                     tiny_hf_tokenizer_dir):
    """The online SFT path (raw records -> the trainer's cache): a step on TRL records has
    the loss of the same step on the same conversations as messages."""
    records = [case[0] for case in CASES.values() if not case[2]] * 4
    conversations = [{"messages": case[1]} for case in CASES.values() if not case[2]] * 4
    write_records(tmp_path / "trl", records)
    write_records(tmp_path / "messages", conversations)
    for name in ("trl", "messages"):
        assert train_main([*TINY_ARGS, "--task_type=sft", f"--data_dir={tmp_path / name}",
                           f"--tokenizer_dir={tiny_hf_tokenizer_dir}", "--max_iters=1",
                           "--eval_at_start=false", "--eval_interval=1",
                           f"--out_dir={tmp_path / (name + '_run')}"]) == 0
    losses = train_losses(tmp_path / "trl_run")
    assert losses and losses == train_losses(tmp_path / "messages_run")
