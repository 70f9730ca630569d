"""The course: chapters that walk through z2all in the order the data flows, and exercises
that put the reader's own function into the real system, checked by the project's own tests.

Start at course/chapters/00_demo.md. Reading order of this package: `exercises` (what there
is to do), `workspace` (the file a student writes in), `swap` (how their function takes the
project's place), `checking` (running the reference tests), `cli` (`python -m course`).
"""
