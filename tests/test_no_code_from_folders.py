"""Nothing in a tokenizer or model folder is ever executed: a planted .py file, wired in through
`auto_map` as transformers' remote code would be, is never imported by any tool that reads it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from model.convert_to_hf import main as convert_main
from tests.model.model_helpers import small_model
from tokenizer import load_tokenizer
from utils.checkpoint import save_checkpoint

REPO = Path(__file__).resolve().parent.parent


def plant(directory: Path, marker: Path) -> None:
    """A module that writes `marker` when imported, named by auto_map in both config files."""
    code = f"open({str(marker)!r}, 'a').write('imported from {directory.name}\\n')\n"
    for module in ("tokenization_evil", "modeling_evil", "configuration_evil", "__init__"):
        (directory / f"{module}.py").write_text(code)
    for config_name, auto_map in (
            ("tokenizer_config.json", {"AutoTokenizer": ["tokenization_evil.Evil", None]}),
            ("config.json", {"AutoConfig": "configuration_evil.Evil",
                             "AutoModelForCausalLM": "modeling_evil.Evil"})):
        config_file = directory / config_name
        if config_file.is_file():
            config = json.loads(config_file.read_text())
            config_file.write_text(json.dumps({**config, "auto_map": auto_map}))


def test_planted_code_never_runs(tmp_path, tiny_hf_tokenizer_dir):
    marker = tmp_path / "marker.txt"
    tokenizer_dir = tmp_path / "tokenizer"
    shutil.copytree(tiny_hf_tokenizer_dir, tokenizer_dir)
    plant(tokenizer_dir, marker)
    model = small_model("gqa", vocab_size=512)
    run = tmp_path / "run"
    save_checkpoint(run / "ckpt", 2, model.save_pretrained)
    (run / "config.json").write_text(json.dumps({"tokenizer_dir": str(tokenizer_dir)}))
    export = tmp_path / "hf_model"
    convert_main(["--ckpt", str(run), "--out", str(export), "--tokenizer_dir", str(tokenizer_dir)])
    assert not list(export.glob("*.py"))  # the export copies no code
    plant(export, marker)

    assert load_tokenizer(tokenizer_dir).encode("hi") == load_tokenizer(export).encode("hi")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    for ckpt in (export, run):
        result = subprocess.run(
            [sys.executable, "generate.py", "--ckpt", str(ckpt), "--dtype", "fp32",
             "--prompt", "hi",
             "--max_new_tokens", "3", "--device", "cpu"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    assert not marker.exists(), marker.read_text()
