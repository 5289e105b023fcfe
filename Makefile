# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The ray, video, multiagent, bench, atari, mujoco and export extras are installed too, so
# `make test` runs the Ray backend's, `tianji eval --video`'s, the multi-agent, Atari, MuJoCo
# and ONNX tests and the pyzmq and Stable-Baselines3 paths behind the published comparisons.
# constraints/cpu.txt pins the CPU torch 2.13.0 for this install path; the package itself
# admits newer torch.
PIP_INSTALL := $(PY) -m pip install --disable-pip-version-check -q -c constraints/cpu.txt

.PHONY: setup demo test test-fast lint clean

$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -e ".[dev,ray,video,multiagent,bench,atari,mujoco,export]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/tianji train examples/cartpole_ppo.toml --target-return 475 --max-seconds 300

# The quick tests run on two workers (pytest-xdist; docs/results/test-suite-time.md); the
# slow end-to-end ones then run one at a time, as their time limits and training targets
# assume a quiet machine.
test: setup
	$(PY) -m pytest -q -n 2 -m "not slow"
	$(PY) -m pytest -q -m slow

test-fast: setup
	$(PY) -m pytest -q -n 2 -m "not slow"

lint: setup
	$(VENV)/bin/ruff check tianji transports algorithms tests examples
	MYPY=$(abspath $(VENV))/bin/mypy tools/typecheck

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
