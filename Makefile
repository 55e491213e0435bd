# provisiond: the two commands a fresh machine needs are `make demo` and `make test`.
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: deps test test-fast demo demo-slurm lab-up lab-down bench

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

# The Slurm hand-off scenario in the lab (README "Hand-off: Slurm"): slurmctld and munged in
# the lab namespace, two debian12-compute VMs join, srun, then power saving end to end.
demo-slurm: deps
	PROVISIOND_NO_SKIP=1 $(PY) -m pytest -p no:cacheprovider -s tests/lab/test_handoff_slurm_lab.py

lab-up: deps
	$(PY) vm-lab/lab.py up --image tiny

lab-down:
	$(if $(wildcard $(PY)),$(PY),python3) vm-lab/lab.py down
