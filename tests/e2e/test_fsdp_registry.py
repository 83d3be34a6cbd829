"""The FSDP strategies' registry names, in a fresh interpreter: `import lightning_dist` loads no
Lightning, yet afterwards `fsdp_tuned` and `fsdp2` are in Lightning's StrategyRegistry and
`L.Trainer(strategy="fsdp_tuned")` builds a TunedFSDPStrategy. (The FSDP building blocks in one
process are tests/unit/test_fsdp.py.)"""

from __future__ import annotations

import subprocess
import sys

from tests.repo import REPO_ROOT

# --- memory, resume, names ----------------------------------------------------------------------


def test_registry_names_after_import_without_loading_lightning():
    code = (
        "import sys, lightning_dist\n"
        "assert 'lightning.pytorch' not in sys.modules, 'import lightning_dist loaded Lightning'\n"
        "import lightning as L\n"
        "from lightning.pytorch.strategies import StrategyRegistry\n"
        "assert {'fsdp_tuned', 'fsdp2'} <= set(StrategyRegistry), StrategyRegistry.available_strategies()\n"
        "t = L.Trainer(strategy='fsdp_tuned', accelerator='cpu', devices=2, logger=False)\n"
        "assert type(t.strategy) is lightning_dist.TunedFSDPStrategy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
