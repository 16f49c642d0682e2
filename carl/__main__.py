"""`python -m carl ...`: the `carl` command, for a process that has the interpreter but not the script."""

import sys

from carl.cli import main

sys.exit(main())
