"""provisiond: a stateless provisioning server for HPC clusters."""

__version__ = "0.1.0"
