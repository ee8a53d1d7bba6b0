"""`python -m bench.gpu [ARGS]` = `python -m bench.ttft --device gpu [ARGS]` (see bench/ttft.py)."""

import sys

from bench.ttft import main

sys.exit(main(device="gpu"))
