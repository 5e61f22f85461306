"""``PYTHONPATH=packages/rose-core/src python -m benchmarks.gpu.admission [--smoke] [--device cuda|cpu]``"""

import json

from .bench import main
from .report import print_table

result = main(watchdog=True)
print(json.dumps(result, separators=(",", ":")), flush=True)
print_table(result)
