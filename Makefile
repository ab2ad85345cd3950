# The two commands of the README, and the steps they are made of.
BUILD      ?= build
ASAN_BUILD ?= build-asan
MESON_TEST  = meson test --print-errorlogs --num-processes 2

.PHONY: check build build-asan test test-asan bootstrap clean

check: bootstrap
	@rm -f $(BUILD)/meson-logs/testlog.json $(ASAN_BUILD)/meson-logs/testlog-asan.json
	@$(MAKE) --no-print-directory test test-asan; rc=$$?; \
	  scripts/test-summary $(BUILD)/meson-logs/testlog.json \
	    $(ASAN_BUILD)/meson-logs/testlog-asan.json; exit $$rc

bootstrap:
	@scripts/bootstrap

$(BUILD)/build.ninja:
	meson setup $(BUILD) -Dtoolkit_include=$${AQUA_CUDA_INCLUDE:-/usr/local/cuda/include}

$(ASAN_BUILD)/build.ninja:
	meson setup $(ASAN_BUILD) -Db_sanitize=address,undefined -Db_lundef=false \
	  -Dtoolkit_include=$${AQUA_CUDA_INCLUDE:-/usr/local/cuda/include}

build: $(BUILD)/build.ninja
	ninja -C $(BUILD)

build-asan: $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD)

test: build
	$(MESON_TEST) -C $(BUILD)

test-asan: build-asan
	$(MESON_TEST) -C $(ASAN_BUILD) --setup=asan

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
