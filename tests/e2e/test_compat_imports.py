"""`lightning_dist._compat` imports none of torch, Lightning, Hydra and OmegaConf: checked in a
fresh interpreter. (The registry of private names, the scan of the package's sources and the
pins are tests/unit/test_compat.py.)
"""

import sys

# --- the registry --------------------------------------------------------------------------------


def test_compat_imports_neither_torch_nor_lightning():
    import subprocess

    code = (
        "import sys, lightning_dist._compat\n"
        "assert not {'torch', 'lightning', 'hydra', 'omegaconf'} & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
