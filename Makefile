# provisiond: the two commands a fresh machine needs are `make demo` and `make test`.
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: deps test test-fast demo lab-up lab-down bench

deps: .venv/.deps-done

.venv/.deps-done: .ci/install-deps.sh pyproject.toml
	bash .ci/install-deps.sh
	touch $@

# Every test: unit, integration (real servers in namespaces) and lab (real VMs).
# pytest exits 5 when it collected no test; that fails this target too.
test: deps
	$(PY) -m pytest $(PYTEST_ARGS)

# Unit and integration tests only (no VMs, no debootstrap or Debian package downloads).
test-fast: deps
	$(PY) -m pytest -m "not lab and not slow" $(PYTEST_ARGS)

# The VM lab (vm-lab/): PXE-boots libvirt VMs from provisiond in a private namespace.
# DEMO_ARGS e.g. "--keep" (leave the lab up) or "--plan n1:bios,n2:uefi".
DEMO_ARGS ?=

demo: deps
	$(PY) vm-lab/demo.py $(DEMO_ARGS)

lab-up: deps
	$(PY) vm-lab/lab.py up --image tiny

lab-down:
	$(if $(wildcard $(PY)),$(PY),python3) vm-lab/lab.py down
