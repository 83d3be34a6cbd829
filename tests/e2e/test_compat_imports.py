"""Private names of torch, Lightning, Hydra, OmegaConf and transformers: fenced and pinned.

Every private name the package uses must be registered in `_compat.PRIVATE_NAMES`: a scan of
the package's sources (below) finds each use and fails, naming file:line, on one that is not.
Each registered name must still exist where its entry says, so an upgrade that moves one fails
here, by name. The helpers of `_compat` are exercised too.

What the scan counts as a use of a private name (`_x`, `__x`; not `__x__`, nor the sunder
`_x_` that enum and Hydra make public):

- an attribute `obj._x` (or `getattr(obj, "_x")`, `setattr`, `hasattr`, `delattr`) that our own
  code does not define. Ours are the methods and class attributes of our classes, dataclass
  fields, `self._x = ...` and attributes set on our own functions; but `self._x` in one of our
  classes is foreign when a foreign base class defines or uses `_x` (read from its bytecode),
  and such a name is then foreign on any other receiver too. A chain rooted at an import is
  named in full (`torch._C._current_graph_task_id`); one into our own package is ours;
- a private method of one of our classes that a foreign base class has (a hook override);
- a private module or name imported from outside the package;
- `obj.attr = <a lambda, a function defined here, a partial>` on an object that is not `self`
  (a patch), and `Base.method(self, ...)` where Base is a foreign class that is not a direct
  base of the class (a bypass of the classes between).

Classes defined inside functions cannot be looked up, so every private method of theirs and
every `self._x` in them counts (when they have bases at all). Receivers are not typed: a foreign
object's `_x` that shares its name with an attribute of ours (`strategy._layout`) goes unseen.
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
