# The two commands of the README, and the steps they are made of.
BUILD      ?= build
RELEASE_BUILD ?= build-release
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 20
MESON_TEST  = meson test --print-errorlogs --num-processes 2
CUDA_INCLUDE = -Dtoolkit_include=$${AQUA_CUDA_INCLUDE:-/usr/local/cuda/include}
LOGS = $(BUILD)/meson-logs/testlog.json $(RELEASE_BUILD)/meson-logs/testlog.json \
       $(ASAN_BUILD)/meson-logs/testlog-asan.json $(FUZZ_BUILD)/meson-logs/testlog.json
# The engines' own suites' counts (python-vllm-upstream, python-lmcache-upstream), which the
# summary prints per build.
UPSTREAM_LOGS = $(foreach b,$(BUILD) $(RELEASE_BUILD) $(ASAN_BUILD),\
                  $(b)/meson-logs/pytest-vllm-upstream.xml $(b)/meson-logs/pytest-lmcache-upstream.xml)

.PHONY: check build build-demo build-release build-asan test test-release test-asan fuzz fuzz-long \
        bootstrap clean demo

# Every suite in the normal (debugoptimized) build, again in a release build (deploy/README.md's
# install: -O3, no assertions, -Werror) and under ASan+UBSan, then the fuzzers for a bounded
# time when clang is there. The last line counts meson's results over all of them.
check: bootstrap
	@rm -f $(LOGS) $(UPSTREAM_LOGS)
	@rc=0; $(MAKE) --no-print-directory test || rc=1; \
	  $(MAKE) --no-print-directory test-release || rc=1; \
	  $(MAKE) --no-print-directory test-asan || rc=1; \
	  if command -v clang >/dev/null; then $(MAKE) --no-print-directory fuzz || rc=1; \
	  else echo "clang not found: fuzzing skipped"; fi; \
	  scripts/test-summary $(LOGS); exit $$rc

bootstrap:
	@scripts/bootstrap check

# The burst demo (examples/README.md): aquad, a producer and a consumer engine on (simulated) GPUs.
# Only what it runs: the Debian packages of the build and the demo, and the demo's programs.
DEMO_FIRST_RUN = on a fresh Debian 12 machine with 2 cores the first run took 74 s (apt-get 18 s \
                 for 18 packages, the build about 8 s, the demo 48 s) and 658 MiB of disk; later \
                 runs take the demo's time
DEMO_TARGETS = daemon/aquad aquactl/aquactl examples/engine/aqua-engine examples/engine/aqua-cases \
               examples/producer/aqua-producer simcuda/libcuda.so.1
demo:
	@echo "make demo: $(DEMO_FIRST_RUN)"
	@scripts/bootstrap demo
	@$(MAKE) --no-print-directory build-demo
	@AQUA_BUILD=$(CURDIR)/$(BUILD) examples/demo/run

build-demo: $(BUILD)/build.ninja
	meson setup --reconfigure $(BUILD) >/dev/null
	ninja -C $(BUILD) $(DEMO_TARGETS)

# The normal and ASan builds carry aquad's test switches (-Dtest_hooks); the release build,
# what installs, does not.
$(BUILD)/build.ninja:
	meson setup $(BUILD) -Dtest_hooks=true $(CUDA_INCLUDE)

$(RELEASE_BUILD)/build.ninja:
	meson setup $(RELEASE_BUILD) --buildtype=release $(CUDA_INCLUDE)

$(ASAN_BUILD)/build.ninja:
	meson setup $(ASAN_BUILD) -Db_sanitize=address,undefined -Db_lundef=false -Dtest_hooks=true \
	  $(CUDA_INCLUDE)

$(FUZZ_BUILD)/build.ninja:
	CC=clang meson setup $(FUZZ_BUILD) -Dfuzzing=true -Db_sanitize=address,undefined \
	  -Db_lundef=false -Dtests=disabled $(CUDA_INCLUDE)

build: $(BUILD)/build.ninja
	meson setup --reconfigure $(BUILD) >/dev/null
	ninja -C $(BUILD)

build-release: $(RELEASE_BUILD)/build.ninja
	meson setup --reconfigure $(RELEASE_BUILD) >/dev/null
	ninja -C $(RELEASE_BUILD)

build-asan: $(ASAN_BUILD)/build.ninja
	meson setup --reconfigure $(ASAN_BUILD) >/dev/null
	ninja -C $(ASAN_BUILD)

test: build
	$(MESON_TEST) -C $(BUILD)

test-release: build-release
	$(MESON_TEST) -C $(RELEASE_BUILD)

test-asan: build-asan
	$(MESON_TEST) -C $(ASAN_BUILD) --setup=asan

# libFuzzer on every parser's harness for FUZZ_SECONDS each, starting from the kept corpus.
fuzz: $(FUZZ_BUILD)/build.ninja
	meson configure $(FUZZ_BUILD) -Dfuzz_seconds=$(FUZZ_SECONDS)
	ninja -C $(FUZZ_BUILD)
	meson test -C $(FUZZ_BUILD) --suite fuzz --print-errorlogs --num-processes 1

# Every harness for FUZZ_SECONDS (make fuzz-long FUZZ_SECONDS=600), leak detection on, two at a
# time; what reaches new coverage is merged into the kept corpora (tests/fuzz/long).
fuzz-long: $(FUZZ_BUILD)/build.ninja
	meson configure $(FUZZ_BUILD) -Dfuzz_seconds=$(FUZZ_SECONDS)
	ninja -C $(FUZZ_BUILD)
	tests/fuzz/long $(FUZZ_BUILD) $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(RELEASE_BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
