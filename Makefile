# Ondo's entry points. Each target installs what it is missing first
# (scripts/setup.sh), so a fresh clone needs nothing but `make app` or `make test`.

SHELL := /bin/bash
CARGO ?= cargo
export MLX_PYTHON := $(CURDIR)/.venv/bin/python

.PHONY: help setup app demo test lint test-rust test-ui test-e2e check-macos release dmg

help:
	@echo "make app      build and launch the desktop app (offers a built-in tiny model offline)"
	@echo "make demo     headless: make the tiny model, time one cold and one warm generation"
	@echo "make test     everything CI runs: lint, Rust, mlx-lm parity, UI, macOS type-check, e2e"
	@echo "               one part of it: make lint, test-rust, test-ui, test-e2e or check-macos"
	@echo "make release  optimised CLI and app binaries under target/release"
	@echo "make dmg      on a Mac: Ondo.app and its disk image, checked to start on a Mac that never built Ondo"

setup:
	@scripts/setup.sh test

app:
	@scripts/setup.sh app
	@cd ui && npm run --silent build
	$(CARGO) build --release -p ondo-app --features custom-protocol
	@scripts/launch-app.sh target/release/ondo-app

demo:
	@scripts/setup.sh core
	$(CARGO) run --release --quiet --bin ondo -- demo

release:
	@scripts/setup.sh app
	@cd ui && npm run --silent build
	$(CARGO) build --release --bin ondo
	$(CARGO) build --release -p ondo-app --features custom-protocol

# Apple Silicon only; README's "Mac release" says what it checks.
dmg:
	@scripts/make-dmg.sh

# `make test` runs every stage of scripts/test.sh; the targets after it run
# some of them, defined there once.
test: setup
	@scripts/test.sh

# rustfmt, clippy, and the UI's type check (svelte-check, tsc)
lint: setup
	@scripts/test.sh fmt clippy ui-check

# every Rust test, the comparisons with mlx-lm and Python's clients included
test-rust: setup
	@scripts/test.sh cargo-test

# the UI's unit tests (vitest) and its tests in a browser
test-ui: setup
	@scripts/test.sh ui-unit ui-browser

# the desktop app driven end to end (tests/e2e)
test-e2e: setup
	@scripts/test.sh e2e

# the macOS-only code, type-checked from Linux (scripts/check-macos.sh)
check-macos: setup
	@scripts/test.sh macos-check
