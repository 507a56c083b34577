"""`python -m cg_dspy.cli ARGS`: the `contextguard` command."""

import sys

from cg_dspy.cli import main

sys.exit(main())
