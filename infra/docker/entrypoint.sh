#!/usr/bin/env bash
# Image entrypoint. `--check` (the default) proves the image can run a sweep: imports, the config tree, the ray
# CLI. Anything else is exec'd as given (`ray start ...`, `mlflow server ...`, `python -m orchestrator ...`).
set -euo pipefail
if (($# == 0)) || [[ $1 == --check ]]; then
    exec python "$(dirname "${BASH_SOURCE[0]}")/check_image.py"
fi
exec "$@"
