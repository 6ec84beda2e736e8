"""Optional ground truth: compile the real train step for the cluster's TPU topology and read its memory.

libtpu compiles for a virtual TPU slice on a CPU host. jax and ray are imported only inside functions: the
control plane stays importable without them. Results are cached by trial id, topology and program (a hash of
the lowered step), because a large compile takes minutes. One module per idea: topology, lowering (and the
program hash), result (CompileResult), rejection (the compiler's refusal), compiling, cache (a directory or
gs://), capped (a compile told the chip is smaller), hostmem (the host memory a compile reserves), pool (many
compiles at once as Ray tasks), progressbar, verdicts, comparison. The tables are drawn by orchestrator.plan.render.
"""

from __future__ import annotations

from orchestrator.plan.aot import capped
from orchestrator.plan.aot.cache import cache_dir, cache_path, cached_any, cached_caps, compiled_memory
from orchestrator.plan.aot.comparison import Comparison, compare
from orchestrator.plan.aot.compiling import compile_memory
from orchestrator.plan.aot.hostmem import compile_host_bytes
from orchestrator.plan.aot.lowering import clear_lowered, lowered, program_version
from orchestrator.plan.aot.pool import compile_specs
from orchestrator.plan.aot.rejection import compiler_rejection
from orchestrator.plan.aot.result import CompileResult
from orchestrator.plan.aot.topology import CHIPS, available, devices, topology_name, topology_tag
from orchestrator.plan.aot.verdicts import verdict

__all__ = [
    "CHIPS",
    "CompileResult",
    "Comparison",
    "available",
    "cache_dir",
    "cache_path",
    "cached_any",
    "cached_caps",
    "capped",
    "clear_lowered",
    "compare",
    "compile_host_bytes",
    "compile_memory",
    "compile_specs",
    "compiled_memory",
    "compiler_rejection",
    "devices",
    "lowered",
    "program_version",
    "topology_name",
    "topology_tag",
    "verdict",
]
