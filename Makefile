# The two commands of the README. Both install what is missing first (scripts/bootstrap.sh),
# then configure and build with CMake + Ninja.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)

.PHONY: all bootstrap configure build run test mutants bench clean

all: build

bootstrap:
	@scripts/bootstrap.sh

configure: bootstrap
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) > /dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	$(BUILD_DIR)/csattn run

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# Checks that the CPU suite catches deliberate bugs (scripts/cpu-mutants.sh; CI runs it).
mutants: bootstrap
	@scripts/cpu-mutants.sh

bench: build
	$(BUILD_DIR)/csattn bench

clean:
	rm -rf $(BUILD_DIR) build-mutants
