"""`python -m nodeflow_cli` runs `kubectl nodeflow`."""

import sys

from nodeflow_cli.main import main

sys.exit(main())
