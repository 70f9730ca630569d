"""The clean stage's output is a function of its input and options only: making it faster
must not move one byte. The demo's raw corpus (build_demo_corpus --scale 0.05: 184 documents,
1 MB, every kind of planted dirt) is cleaned with the demo's options and with the defaults,
and the shards plus clean_report.json/.md are compared with digests of what the code wrote
before the speed work (issue 42).

How the digests were produced: on main at c43d5f9 (before the vectorized rules and MinHash),
this test's `output_digest` over the output of `clean_main(... "--num_workers", "0", ...)`
with the same arguments. If a change is *meant* to alter the output, recompute them the same
way and say why in the commit.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from data.build_demo_corpus import main as build_demo_corpus
from data_preprocess.clean_pretrain_data import main as clean_main

GOLDEN = {
    "demo_options": "73d917d6957e8310a1c054d45366d73dbed4f4217ff7d0c02c327b76b0a708cb",
    "defaults": "27a2849f0d93b2fc098452964ce94ec7ab8cbbe0c687c416276f794541f0ea52",
}


def output_digest(out: Path) -> str:
    """SHA-256 over every output file's relative path and bytes, the state folder aside."""
    digest = hashlib.sha256()
    for path in sorted(p for p in out.rglob("*") if p.is_file() and ".clean" not in p.parts):
        digest.update(path.relative_to(out).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    build_demo_corpus(["--out", str(root), "--scale", "0.05"])
    return root


@pytest.mark.parametrize("name, extra", [
    ("demo_options", ["--decontaminate", "{demo}/eval", "--min_stop_words", "1",
                      "--decontaminate_min_words", "4"]),  # tools/demo.py's clean stage
    ("defaults", []),
])
def test_output_is_byte_identical_to_before_the_speed_work(demo, tmp_path, name, extra):
    out = tmp_path / name
    clean_main(["--data_dir", str(demo / "pretrain_raw"), "--out_dir", str(out),
                "--num_workers", "0", *(arg.format(demo=demo) for arg in extra)])
    assert output_digest(out) == GOLDEN[name]

