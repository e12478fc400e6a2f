#!/usr/bin/env bash
# The GPU proof as one device call, sized to a lease of 15 minutes of device time (benchmarks/README.md):
#
#   here:    bash benchmarks/gpu_wheels.sh                 # .whl/: what the lent machine's image lacks
#   here:    git describe --always --dirty --abbrev=7      # the commit the device's copy is of (it has no .git)
#   device:  run(command="FLCTL_COMMIT=<that> bash benchmarks/gpu_lease.sh", carry=[".whl"], timeout_s=600)
#            and give_back at once
#   here:    tar xzf <files_at>/gpu-bench.tar.gz -C DIR && python benchmarks/bench_gpu.py collect DIR/gpu-bench
#
# The project's commit comes from the git repository this script lives in; FLCTL_COMMIT names it only where that
# has no .git (bench_gpu.py project_commit). machine.txt records it with the settings below, which collect reads.
# The sections run in the order the GPU issue needs their answers, each in a process of its own (a CUDA fault
# costs one section) with the smaller of its cap and what is left of LEASE_S; a configuration that would start
# with under 30 s left is named in the results as not measured. After each section everything measured so far is
# packed into $OUT/gpu-bench.tar.gz, so a call cut short still brings it back; a section killed at its cap keeps
# the configurations it finished (bench_gpu.py writes its file after each). SECTIONS="name:cap ..." and
# BENCH_ARGS (e.g. --small, to check this script on a CPU) override the plan; PYTHON the interpreter (python3),
# RESULTS the folder packed (/tmp/gpu-bench: the tarball's one folder, whatever its name). `diagnose` reruns the
# suite's first failing gpu test alone under CUDA_LAUNCH_BLOCKING=1, then TORCH_CUDA_SANITIZER=1 (one log each);
# with no such failure it says so and is done in seconds, leaving its time to the sections after it.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 3        # the project's root: .whl/, benchmarks/, its git tree
# The plan: every section in one call of at most 540 s (with ~20 s of set-up), in the order the GPU issue needs its
# answers: the suite to its end (138 s with 14 workers on an H100), CIFAR-10 (captured and compiled-captured, bf16),
# the ways K cells share the GPU, the 1,000-cell two-moons grid, UTKFace (so that the programme's hours include it).
# tests/test_benchmarks.py runs this plan on a CPU with --small. `diagnose`, `profile`, `precision` and `dpo` run
# when SECTIONS names them.
LEASE_S=${LEASE_S:-540}
SECTIONS=${SECTIONS:-suite:170 cifar:100 share:110 moons:90 utkface:50}
OUT=${OUT:-/tmp/gpu-lease-out}
results=${RESULTS:-/tmp/gpu-bench}
rm -rf "$results" && mkdir -p "$results" "$OUT"
start=$SECONDS
if ! "${PYTHON:-python3}" -c 'import optuna, sqlalchemy, submitit, cvxpy, flctl_tasks' 2>/dev/null; then   # lent machine
  # into the image's own environment (a bare machine each lease; its torch stays), flctl editable as in CI: tests
  # that set PYTHONPATH for their subprocesses still find flctl_tasks and the carried packages
  "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 3
  "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 3
fi
# PYTHONFAULTHANDLER: a section that dies of a signal (a segfault) prints every thread's Python stack to bench.log
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-0}
{ nvidia-smi -L; "${PYTHON:-python3}" -c 'import torch; print(torch.__version__, torch.cuda.is_available())'
  printf 'LEASE_S=%q\nSECTIONS=%q\nBENCH_ARGS=%q\n' "$LEASE_S" "$SECTIONS" "${BENCH_ARGS:-}"
  "${PYTHON:-python3}" benchmarks/bench_gpu.py commit; } > "$results/machine.txt" 2>&1
cat "$results/machine.txt"
echo "setup took $((SECONDS - start)) s" | tee -a "$results/machine.txt"
for entry in $SECTIONS; do
  name=${entry%%:*} cap=${entry#"${entry%%:*}"}
  cap=${cap#:} && cap=${cap:-$LEASE_S}          # "name" alone: no cap but the lease's
  left=$((LEASE_S - (SECONDS - start)))
  budget=$((cap < left ? cap : left)) && budget=$((budget > 0 ? budget : 0))   # 0: written as not measured
  extra=()
  # (the lease plan's own CPU test runs this script nested, at --small sizes: it measures nothing on a lease)
  [ "$name" = suite ] && extra=(--workers 14 --pytest-args
                                --deselect tests/test_records_readers.py::test_five_readers_read_the_records_folder_and_agree
                                --deselect tests/test_benchmarks.py::test_the_lease_plan_runs_every_section_on_a_cpu_and_collect_reads_it)
  echo "== $name: $budget s of $left s left" | tee -a "$results/bench.log"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  timeout -s KILL $((budget + 60)) "${PYTHON:-python3}" benchmarks/bench_gpu.py "$name" --out "$results" --budget-s "$budget" \
    ${BENCH_ARGS:-} "${extra[@]}" >> "$results/bench.log" 2>&1
  echo "rc=$? after $((SECONDS - start)) s" >> "$results/bench.log"
  tar czf "$OUT/.gpu-bench.tar.gz" -C "$(dirname "$results")" "$(basename "$results")" && mv "$OUT/.gpu-bench.tar.gz" "$OUT/gpu-bench.tar.gz"
done
tail -n 40 "$results/bench.log"
