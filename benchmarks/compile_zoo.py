"""Every shipped model through TorchInductor: the dense part compiled with inductor trains to
the losses of eager, as tests/integration/test_compile.py checks with inductor for three models
and aot_eager for the others (inductor's C++ code generation costs about 20 s per model on a
cold cache on 2 cores; see that test's docstring).

    python benchmarks/compile_zoo.py [--only deepfm_criteo,din_taobao]

Prints one line per model (its seconds, the compiled modules); exits 1 naming the first model
whose compiled losses differ from eager's (rtol 1e-5, atol 1e-6). Runs in ~5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    from tests.integration import test_compile
    from tzrun_tools.synth import synth_criteo
    from tzrun_tools.synth_taobao import synth_taobao

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated examples (default: every shipped model)")
    args = parser.parse_args(argv)
    if args.only:
        test_compile.EXAMPLES = {k: v for k, v in test_compile.EXAMPLES.items() if k in args.only.split(",")}
    rows = test_compile.STEPS * test_compile.ROWS
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        synth_criteo(root / "criteo", rows=rows, eval_rows=rows, seed=3, rows_per_file=rows, row_group_size=rows)
        synth_taobao(root / "taobao", rows=rows, eval_rows=rows, seed=3, rows_per_file=rows, row_group_size=rows)
        with torch._inductor.config.patch(compile_threads=1):
            test_compile._same_losses_compiled({"criteo": root / "criteo", "taobao": root / "taobao"}, root,
                                               inductor=tuple(test_compile.EXAMPLES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
