#!/bin/sh
# Run a script with a Python that has PyTorch: $DSM_TORCH_PYTHON, else
# /usr/bin/python3 (Debian's python3-torch), else python3 on the PATH.
#   torch_python.sh SCRIPT [ARGS...]
for p in ${DSM_TORCH_PYTHON:-} /usr/bin/python3 python3; do
    if "$p" -c 'import torch' >/dev/null 2>&1; then exec "$p" "$@"; fi
done
echo "torch_python.sh: no Python with PyTorch (install python3-torch, or set DSM_TORCH_PYTHON)" >&2
exit 1
