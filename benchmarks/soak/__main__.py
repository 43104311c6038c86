"""``python -m benchmarks.soak``: see :mod:`benchmarks.soak.run`."""

from __future__ import annotations

import sys

from benchmarks.soak.run import main

sys.exit(main())
