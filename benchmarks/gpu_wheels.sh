#!/usr/bin/env bash
# What the lent GPU machine's image lacks, as Python 3.12 manylinux wheels in .whl/ (ignored by git) at
# requirements.lock's versions, for benchmarks/gpu_lease.sh. Run here, where pip reaches the package index; the
# lent machine reaches nothing. The names are the lock's packages missing from that image's package list (the
# device tool's KINDS.md, read 2026-11-26), with the packages they need in turn, and pytest, pytest-xdist and
# pytest-timeout at the lock's versions (the image has some pytest; pyproject needs one below 9.2 for xdist's
# --dist loadgroup, and the image's version is not known): about 45 MB of the 64 MiB a call
# may carry. Left out: duckdb and polars (the five-readers test, deselected there: 25 and 54 MB) and scs 3.3 (43 MB:
# 3.2.7 is 10 MB and cvxpy takes it). bitsandbytes (43 MB, for ``bench_gpu.py dpo``) comes only with --dpo, which
# leaves out cvxpy and its solvers (only polyfit imports them) and pytest: the DPO section is a call of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
names="optuna sqlalchemy greenlet alembic mako colorlog submitit psycopg psycopg-binary trl datasets dill multiprocess"
if [ "${1:-}" = --dpo ]; then
  names="$names bitsandbytes"
else
  names="$names cvxpy clarabel osqp qdldl highspy sparsediffpy cffi pycparser cooper-optim pytest pytest-xdist
         pytest-timeout"
fi
pins=()
for n in $names; do
  pin=$(grep -iE "^$n==" requirements.lock | sed 's/ *;.*//') || { echo "$n is not in requirements.lock" >&2; exit 2; }
  pins+=("$pin")
done
[ "${1:-}" = --dpo ] || pins+=("scs==3.2.7")
rm -rf .whl && mkdir .whl
platforms=()
for p in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34; do
  platforms+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${WHEELS_PYTHON:-3.12}" --implementation cp "${platforms[@]}" \
  -d .whl "${pins[@]}"
du -sh .whl
