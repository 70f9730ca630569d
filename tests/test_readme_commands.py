"""The command blocks of the README, docs/ and the course run as pasted: every command parses,
and they run in order.

The pages are README.md, then every docs/*.md in name order, then the course's chapters in
their order (PAGES): the README is the guide whose blocks build everything from nothing, and a
docs page's blocks may use what the README's made, never what another docs page made; a
chapter's may also use what earlier chapters made (chapter 7 resumes chapter 4's run). A
fenced ```bash block is either runnable (after `source .venv/bin/activate`, from the repo root,
as the README says once at the top) or a template, marked by a first line `# template: ...`,
whose placeholders are for the reader to replace: templates are neither parsed nor run. Two
checks of the runnable blocks:

1. Every command parses (fast, no work done). For each command (continuation lines joined,
comments dropped) the check is the real parser of what it calls:

    python -m MOD ... / python X.py ...   the module's own `__main__`, stopped right after its
                                          argparse parser accepted the options (ParsedOptions)
    python train_my_ddp.py ...            the trainer's option parser (trainer/command_line.py)
    torchrun ... X.py ...                 torchrun's own parser, then X.py's as above
    python monitor_process.py ... -- C    the supervisor's parser, then C as above
    make T                                T is a Makefile target
    curl ... -d JSON                      the body is JSON
    tensorboard ..., wandb ...            the tracker's CLI is installed

Every block also passes `bash -n`, and has no usage syntax (`[--flag]`, `...`) outside comments.

2. The blocks run, in page order, in a scratch copy of the working tree (tracked and
untracked files, no `.venv`, no data or runs), with the venv's bin first on PATH and HOME in
the scratch folder, offline (HF_HUB_OFFLINE=1, WANDB_MODE=offline): the demo corpus,
tokenizers and pretokenized data are built by the README's own commands (~30 s), and every
later command uses what the earlier ones made, as a reader's would (the README's blocks first,
then each docs page's). One change, the size
override the README states where the blocks begin: a command that starts a fresh training run
(`train_my_ddp.py` directly, under torchrun or under the monitor, without `--resume`) gets
SIZE_OVERRIDES appended, which win over the README's numbers because the last value of an
option counts; a `--resume` reads its run's saved config, so it needs none. A block whose first
line starts `# together:` (the master and the remote node of a multi-node run) runs its
commands at the same time and waits for all of them. Not run, only
parsed: a command whose comment starts `# by hand: <why>`, or every command of a block whose
first line is such a comment. They are `make demo` (11 minutes) and `make test` (this suite),
servers (`serve.py`, `tensorboard`, `resplot --watch`), `curl` to a server, and `wandb sync`
(an upload). It takes about 7 minutes (290 CPU-s) on 2 cores shared with other jobs, most of
it the short training runs and the chapters' smoke benches, and is marked `slow`: `make test`
and CI run it, `pytest -m "not slow"` leaves it out while iterating.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser as torchrun_parser

import monitor_process
from trainer.command_line import parse_command_line
from trainer.options import TrainingOptions

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# README first (it builds everything from nothing), then the reference pages in name order,
# then the course's chapters (numbered, so in reading order).
PAGES = [README, *sorted((REPO / "docs").glob("*.md")),
         *sorted((REPO / "course" / "chapters").glob("*.md"))]
TEMPLATE_MARK = "# template:"
TOGETHER_MARK = "# together:"  # a block whose commands run at the same time (the nodes of a run)
BY_HAND_MARK = "# by hand:"
SHELL_LANGUAGES = ("bash", "sh", "shell")
# Appended to every command that starts a fresh training run (module docstring; README top).
SIZE_OVERRIDES = ["--max_iters=2", "--eval_iters=1", "--max_new_tokens=4"]
COMMAND_TIMEOUT_S = 600  # one command; a 2-step run takes 5-80 s on 2 busy cores


class ParsedOptions(BaseException):  # not an Exception: no entry point's handler catches it
    """Raised by argparse right after it accepted a command line: stop before any work."""


def fenced_blocks(text: str, page: str) -> list[tuple[str, int, list[str]]]:
    """(language, line number of the opening fence, the block's lines) of every fenced block."""
    blocks, language, start, lines = [], None, 0, []
    for number, line in enumerate(text.splitlines(), start=1):
        fence = re.match(r"^```(\S*)\s*$", line)
        if fence and language is None:
            language, start, lines = fence.group(1), number, []
        elif line.startswith("```") and language is not None:
            blocks.append((language, start, lines))
            language = None
        elif language is not None:
            lines.append(line)
    assert language is None, f"{page}:{start}: unclosed code fence"
    return blocks


@dataclass(frozen=True)
class Block:
    where: str  # "page:line of the opening fence", as failures name it
    lines: list[str]


def runnable_blocks(page: Path) -> list[Block]:
    name = str(page.relative_to(REPO))
    return [Block(f"{name}:{start}", lines)
            for language, start, lines in fenced_blocks(page.read_text(encoding="utf-8"), name)
            if language in SHELL_LANGUAGES and not (lines and lines[0].startswith(TEMPLATE_MARK))]


@dataclass(frozen=True)
class Command:
    argv: list[str]
    by_hand: bool  # commented `# by hand: <why>`: parsed, never run by this test


def commands_of(lines: list[str]) -> list[Command]:
    """Each command of a block: continuations joined, comments and blank lines dropped."""
    block_by_hand = bool(lines) and lines[0].startswith(BY_HAND_MARK)
    joined = "\n".join(lines).replace("\\\n", " ")
    return [Command(argv, block_by_hand or BY_HAND_MARK in line)
            for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, flags=re.MULTILINE))


def run_until_parsed(argv: list[str], monkeypatch) -> None:
    """Run `python ARGV...` in this process as `__main__`, stopping once argparse accepted it."""
    parse_known_args = argparse.ArgumentParser.parse_known_args

    def parse_known_then_stop(self, args=None, namespace=None):
        parse_known_args(self, args, namespace)  # exits 2 with the parser's message if bad
        raise ParsedOptions

    def parse_then_stop(self, args=None, namespace=None):
        _, extras = parse_known_args(self, args, namespace)
        if extras:  # what parse_args adds to parse_known_args
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        raise ParsedOptions

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_then_stop)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    module = argv[1] if argv[0] == "-m" else None
    monkeypatch.setattr(sys, "argv", [module or argv[0], *argv[2 if module else 1:]])
    with warnings.catch_warnings(), pytest.raises(ParsedOptions):
        warnings.simplefilter("ignore", RuntimeWarning)  # "found in sys.modules": re-run as main
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(str(REPO / argv[0]), run_name="__main__")
    monkeypatch.undo()


def check_python(argv: list[str], monkeypatch) -> None:
    """`argv` without the leading `python`."""
    if argv[0] == "train_my_ddp.py":
        config_file, overrides = parse_command_line(argv[1:])
        assert config_file is None
        TrainingOptions.from_dict(overrides)  # unknown names and bad values raise
    elif argv[0] == "monitor_process.py":
        _, command = monitor_process.parse_args(argv[1:])
        check_command(command, monkeypatch)
    else:
        if argv[0] != "-m":
            assert (REPO / argv[0]).is_file(), argv[0]
        run_until_parsed(argv, monkeypatch)


def check_command(argv: list[str], monkeypatch) -> None:
    program = argv[0]
    if program == "python":
        check_python(argv[1:], monkeypatch)
    elif program == "torchrun":
        launch = torchrun_parser().parse_args(argv[1:])
        check_python([launch.training_script, *launch.training_script_args], monkeypatch)
    elif program == "make":
        assert set(argv[1:]) <= makefile_targets(), argv
    elif program == "curl":
        json.loads(argv[argv.index("-d") + 1])
    elif program in ("tensorboard", "wandb"):  # the trackers' own CLIs, from requirements.txt
        assert (Path(sys.executable).parent / program).is_file(), f"{program} is not installed"
    else:
        raise AssertionError(f"no check for {program!r}: add one to this test")


BLOCKS = [block for page in PAGES for block in runnable_blocks(page)]


def test_the_readme_has_command_blocks_and_says_to_activate_the_venv():
    assert len(runnable_blocks(README)) >= 6
    assert "source .venv/bin/activate" in README.read_text()


def test_the_docs_pages_and_chapters_are_read_too():
    """The reference pages' and the chapters' blocks are checked as the README's are (a moved
    block still runs)."""
    pages = {block.where.split(":")[0] for block in BLOCKS}
    assert len(pages) >= 3 and "course/chapters/00_demo.md" in pages, pages


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_every_command_of_a_runnable_block_parses(block, monkeypatch):
    script = "\n".join(block.lines)
    syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    for command in commands_of(block.lines):
        argv = command.argv
        usage_syntax = [arg for arg in argv if arg == "..." or re.match(r"^\[-", arg)]
        assert not usage_syntax, f"{block.where}: {usage_syntax} in {shlex.join(argv)}"
        check_command(argv, monkeypatch)


def test_a_bad_option_is_caught(monkeypatch):
    """The check itself can fail: a misspelt flag of a module and of the trainer."""
    with pytest.raises(SystemExit):
        check_command(["python", "-m", "tools.resplot", "out/x", "--wach", "3"], monkeypatch)
    with pytest.raises(ValueError, match="did you mean --max_iters"):
        check_command(["python", "train_my_ddp.py", "--max_iter=3"], monkeypatch)


def test_commands_are_split_and_by_hand_marks_read():
    """A `# by hand:` comment marks its command; as a block's first line, every command."""
    assert commands_of(["python a.py \\", "  --x 1  # note", "", "# only a comment",
                        "serve --y  # by hand: a server"]) == [
        Command(["python", "a.py", "--x", "1"], by_hand=False),
        Command(["serve", "--y"], by_hand=True)]
    assert all(c.by_hand for c in commands_of(["# by hand: needs a server", "curl -s x"]))


def scratch_copy(destination: Path) -> Path:
    """The working tree's tracked and untracked (not ignored) files, as they are now, copied to
    `destination`: the README's commands run there, so nothing is written into the repo."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file() and not source.is_symlink():  # not .venv's link, nor deleted files
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def with_size_overrides(argv: list[str]) -> list[str]:
    """A fresh training run cut to seconds; a --resume takes its sizes from the run's config."""
    if "train_my_ddp.py" in argv and "--resume" not in argv:
        return [*argv, *SIZE_OVERRIDES]
    return argv


def readme_environment(home: Path) -> dict[str, str]:
    """What `source .venv/bin/activate` gives, offline, with HOME (HF cache, wandb and
    matplotlib settings) in the scratch folder."""
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("WANDB_", "HF_", "PYTHON"))}
    venv_bin = Path(sys.executable).parent
    return {**environment, "PATH": f"{venv_bin}{os.pathsep}{environment.get('PATH', '')}",
            "VIRTUAL_ENV": str(venv_bin.parent), "HOME": str(home), "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "offline"}


@pytest.mark.slow
def test_the_runnable_blocks_run_in_order_in_a_scratch_copy(tmp_path):
    repo = scratch_copy(tmp_path / "repo")
    (tmp_path / "home").mkdir()
    environment = readme_environment(tmp_path / "home")
    for block in BLOCKS:
        commands = [with_size_overrides(command.argv) for command in commands_of(block.lines)
                    if not command.by_hand]
        together = bool(block.lines) and block.lines[0].startswith(TOGETHER_MARK)
        for group in [commands] if together else [[argv] for argv in commands]:
            logs = [tmp_path / f"command_{index}.log" for index in range(len(group))]
            running = [subprocess.Popen(argv, cwd=repo, env=environment,  # (files: no pipe
                                        stdout=log.open("w"), stderr=subprocess.STDOUT)  # fills)
                       for argv, log in zip(group, logs)]
            for argv, process, log in zip(group, running, logs):
                process.wait(timeout=COMMAND_TIMEOUT_S)
                assert process.returncode == 0, (
                    f"the block at {block.where}: `{shlex.join(argv)}` exited "
                    f"{process.returncode}:\n{log.read_text()[-3000:]}")
