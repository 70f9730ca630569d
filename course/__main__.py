import sys

from course.cli import entry

sys.exit(entry())
