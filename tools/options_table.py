"""The trainer's options table of docs/design.md §4, generated from the option dataclasses.

    python -m tools.options_table            # print the table
    python -m tools.options_table --write    # replace it in docs/design.md

The table sits between two marker comments in the design document; `tests/tools/
test_options_table.py` fails when the committed table differs from what this prints, so the
docs cannot drift from the code (torchtitan freezes its CLI the same way).
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import fields
from pathlib import Path

from optimizer import OptimizerConfig
from parallel.distributed_data_parallel import DistributedDataParallelConfig
from parallel.distributed_data_parallel.ddp_comm_hooks.powerSGD_hook import PowerSGDState
from trainer.command_line import HF_NAMES, type_name
from trainer.options import (
    GROUPS,
    OPTION_TYPES,
    PER_INVOCATION,
    RESUME_SAFE,
    default_value,
)
from trainer.parallelize import OPTION_FOR_FIELD
from utils.boolean_flags import add_boolean_flag
from utils.option_parser import OptionParser

DESIGN_DOC = Path(__file__).resolve().parents[1] / "docs" / "design.md"
START, END = "<!-- options-table:start -->", "<!-- options-table:end -->"
# The components trainer/parallelize.py fills from options of the same (or renamed) name.
COMPONENTS = (DistributedDataParallelConfig, OptimizerConfig, PowerSGDState)


def component_fields(option: str) -> list[str]:
    """`Component.field` for every component argument this option fills."""
    found = []
    for component in COMPONENTS:
        for name in inspect.signature(component).parameters:
            if OPTION_FOR_FIELD.get(name, name) == option:
                found.append(f"`{component.__name__}.{name}`")
    return found


def options_table() -> str:
    """Markdown: one row per option, in --help's order."""
    lines = [f"{len(OPTION_TYPES)} options in {len(GROUPS)} groups. ◦: may change on "
             "`--resume` without breaking bitwise identity; †: describes one invocation, never "
             "inherited.", "",
             "Each option is given as `--key value` or `--key=value`; a boolean as `--flag`, "
             "`--flag true|false` or `--no_flag` (`--no-flag`); an optional cleared with "
             "`--key none`; any name may be spelled with dashes (`--eval-interval 5`, as "
             "torchrun reads them; utils/option_parser.py, in every z2all tool). A config file "
             "(`.py`, `.json`, `.yaml`/`.yml`, `.toml`; trainer/config_formats.py), given first "
             "or as `--config FILE`, uses the same names, flat or nested under the group "
             "column's name. Hugging Face `TrainingArguments` and TRL names are not accepted but "
             "answered with z2all's: " + ", ".join(f"`{hf}` → `{ours}`"
                                                  for hf, (ours, _) in HF_NAMES.items()) + ".",
             "",
             "| group | option | type | default | meaning | defined in | sets |",
             "|---|---|---|---|---|---|---|"]
    for group, cls in GROUPS.items():
        module = cls.__module__.replace(".", "/") + ".py"
        for spec in fields(cls):
            name = spec.name
            marks = ("◦" if name in RESUME_SAFE else "") + ("†" if name in PER_INVOCATION else "")
            cells = [group, f"`{name}`" + (f" {marks}" if marks else ""),
                     type_name(OPTION_TYPES[name]), f"`{default_value(name)!r}`",
                     spec.metadata["help"], f"`{module}` `{cls.__name__}`",
                     ", ".join(component_fields(name))]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def with_table(document: str, table: str) -> str:
    """`document` with the text between the markers replaced by `table`."""
    if START not in document or END not in document:
        raise ValueError(f"{DESIGN_DOC}: the markers {START} / {END} are missing")
    head, rest = document.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = OptionParser(description=__doc__.splitlines()[0])
    add_boolean_flag(parser, "--write", help=f"update {DESIGN_DOC.name}")
    args = parser.parse_args(argv)
    table = options_table()
    if args.write:
        DESIGN_DOC.write_text(with_table(DESIGN_DOC.read_text(encoding="utf-8"), table),
                              encoding="utf-8")
        print(f"wrote the options table into {DESIGN_DOC}")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
