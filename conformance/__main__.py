"""`python -m conformance` is the `conformance` command."""

import sys

from conformance.run.cli import main

sys.exit(main())
