"""`python -m reports`: ingest the runs and render the dashboard (same as `conformance dashboard`)."""

import sys

from reports.dashboard import main

sys.exit(main())
