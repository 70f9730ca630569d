"""Loaded at the start of every Python process that `course check` starts (it puts this folder
on PYTHONPATH): installs the finder that swaps the student's function in (course/swap.py)."""

from course.swap import install_finder

install_finder()
