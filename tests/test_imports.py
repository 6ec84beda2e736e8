"""The control plane never imports jax at module top: a driver plans and schedules without it."""

import pkgutil
import subprocess
import sys

from drivers import ROOT

import orchestrator


def test_no_orchestrator_module_loads_jax():
    names = sorted(m.name for m in pkgutil.walk_packages(orchestrator.__path__, "orchestrator."))
    assert "orchestrator.plan.aot" in names and "orchestrator.tracking.store" in names  # the walk found them
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}:\n"
        "    if not n.endswith('__main__'):\n"
        "        importlib.import_module(n)\n"
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", out.stdout
