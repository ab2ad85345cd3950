#!/bin/bash
# Everything aqua checks on a GPU machine, from binaries built elsewhere: the driver-level tests
# (simcuda's Criterion suites, the cuda.h program, libaqua's driver loader) against the REAL
# CUDA driver, then tests/gpu/device-check (aquad, a producer and a consumer on GPU 0, BENCH
# figures, the PyTorch allocator where torch has CUDA). One summary line at the end.
#
#   tests/gpu/run.sh --bundle [BUILD]   here, after `ninja -C build`: gather the binaries, the
#                                       shared libraries they need (not libc, not libcuda) and
#                                       the aqua Python package into BUILD/gpu-bundle
#   tests/gpu/run.sh [BUILD]            on the GPU machine, from the repository root, with
#                                       BUILD/gpu-bundle carried: run everything there
#
# With the device tool (one H200, no network, no Debian packages; the bundle is about 27 MiB):
#   tests/gpu/run.sh --bundle build
#   run(command="tests/gpu/run.sh build", carry=["build/gpu-bundle"], timeout_s=540)
# It has not run on a GPU yet: 540 s leaves room for the 1 GiB device check (1.7 s with
# 256 MiB on simcuda) and the driver tests. Nothing is built on the GPU machine. Simulator-only tests
# skip themselves (AQUA_TEST_REAL_GPU).
set -u

bundle_mode=0
if [ "${1:-}" = "--bundle" ]; then
        bundle_mode=1
        shift
fi
build=${1:-build}
bundle=$build/gpu-bundle
tests="simcuda/test-simcuda-device simcuda/test-simcuda-vmm simcuda/test-simcuda-stream
       simcuda/test-simcuda-ipc libaqua/test-cuda-driver"

if [ $bundle_mode = 1 ]; then
        rm -rf "$bundle"
        mkdir -p "$bundle/bin" "$bundle/lib"
        for t in $tests simcuda/cuda-program daemon/aquad tests/aqua-agent tests/aqua-gpu-check; do
                cp "$build/$t" "$bundle/bin/" || exit 1
        done
        cp -L "$build/libaqua/libaqua.so.0" "$build/libaqua/libaqua-torch.so.0" "$bundle/lib/" || exit 1
        mkdir -p "$bundle/python" && cp -r python/aqua "$bundle/python/" || exit 1
        # The stub-linked build of the program, when the toolkit had a stub to link against.
        [ -x "$build/simcuda/cuda-program-stub" ] && cp "$build/simcuda/cuda-program-stub" "$bundle/bin/"
        for b in "$bundle"/bin/*; do
                ldd "$b" | awk '$3 ~ /^\// {print $1, $3}'
        done | sort -u | while read -r name path; do
                case $name in
                libc.so.*|libm.so.*|libresolv.so.*|libpthread.so.*|libdl.so.*|ld-linux*|libcuda.so.*) ;;
                *) cp -L "$path" "$bundle/lib/" ;;
                esac
        done
        du -sh "$bundle"
        echo "carry: $bundle"
        exit 0
fi

[ -d "$bundle/bin" ] || { echo "no $bundle: run tests/gpu/run.sh --bundle here first, then carry it" >&2; exit 2; }

# The real driver: the one ldconfig knows; it goes first so that nothing else named
# libcuda.so.1 (simcuda) can be picked up.
driver=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')
if [ -z "$driver" ]; then
        echo "no libcuda.so.1 known to ldconfig on this machine" >&2
        exit 2
fi
export LD_LIBRARY_PATH="$(dirname "$driver"):$PWD/$bundle/lib"
export AQUA_TEST_REAL_GPU=1
unset AQUA_CUDA_LIBRARY AQUA_SIM_DEVICES AQUA_SIM_TOPOLOGY AQUA_SIM_MACHINE
echo "driver: $driver"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null

fail=0 passed=0 failed=0
count() { if [ "$1" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fail=1; fi; }
for prog in cuda-program cuda-program-stub; do
        [ -x "$bundle/bin/$prog" ] || continue
        echo "== $prog (resolves $(ldd "$bundle/bin/$prog" | awk '/libcuda/ {print $3}'))"
        timeout 60 "$bundle/bin/$prog"
        count $?
done
out=$(mktemp)
for t in $tests; do
        name=$(basename "$t")
        echo "== $name"
        timeout 120 "$bundle/bin/$name" --tap=- --jobs=1 >"$out" 2>&1
        rc=$?
        grep -E '^(not ok|ok|#)|Assertion|expected' "$out" || true
        # Each test of the suite counts; a suite that died without its lines counts as failed.
        n_ok=$(grep -c '^ok ' "$out") n_bad=$(grep -c '^not ok ' "$out")
        passed=$((passed + n_ok)) failed=$((failed + n_bad))
        if [ "$rc" != 0 ]; then
                fail=1
                [ "$n_bad" = 0 ] && failed=$((failed + 1))
        fi
done
rm -f "$out"
echo "== device-check (aquad, a producer and a consumer on GPU 0)"
dc=$(mktemp)
AQUA_LIBRARY=$PWD/$bundle/lib/libaqua.so.0 PYTHONPATH=$PWD/$bundle/python \
        timeout 420 tests/gpu/device-check "$bundle/bin" "$bundle/lib" $((1 << 30)) | tee "$dc"
rc=${PIPESTATUS[0]}
line=$(grep '^device-check: [0-9]* passed, [0-9]* failed' "$dc" | tail -n 1)
if [ -n "$line" ]; then
        set -- $line
        passed=$((passed + $2)) failed=$((failed + $4))
fi
[ "$rc" = 0 ] || { fail=1; [ -n "$line" ] && [ "$4" != 0 ] || failed=$((failed + 1)); }
rm -f "$dc"
echo "== result: $([ $fail = 0 ] && echo PASS || echo FAIL)"
echo "$passed passed, $failed failed"
exit $fail
