"""`python -m hmmscope.sweep worker ...`: the worker process run_sweep starts (worker.main)."""

import sys

from .worker import main

sys.exit(main())
