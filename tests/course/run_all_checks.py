"""Every exercise's stub, reference and listed mistakes through `course check`, in one process.

    python -m tests.course.run_all_checks SHARD COUNT   ->  one JSON object per line:
    {"exercise", "case" ("stub" | "reference" | the mistake's slug), "code", "report"}

Runs the checks one after another in this process (torch and the collected test modules are
imported once); tests/course/test_exercises.py starts COUNT of these side by side.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from course.cli import check, header
from course.exercises import EXERCISES
from course.workspace import solution_source, stub_source


def cases(folder: Path) -> list[tuple[str, str, Path]]:
    found = []
    for exercise in EXERCISES:
        stub = folder / f"{exercise.name}_stub.py"
        stub.write_text(stub_source(exercise.target, header(exercise)), encoding="utf-8")
        reference = folder / f"{exercise.name}_reference.py"
        reference.write_text(solution_source(exercise.target), encoding="utf-8")
        found += [(exercise.name, "stub", stub), (exercise.name, "reference", reference)]
        found += [(exercise.name, mistake.path.stem, mistake.path)
                  for mistake in exercise.mistake_files()]
    return found


def main(shard: int, count: int) -> None:
    by_name = {exercise.name: exercise for exercise in EXERCISES}
    with tempfile.TemporaryDirectory() as folder:
        for index, (name, case, path) in enumerate(cases(Path(folder))):
            if index % count != shard:
                continue
            code, report = check(by_name[name], False, path)
            print(json.dumps({"exercise": name, "case": case, "code": code, "report": report}),
                  flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
