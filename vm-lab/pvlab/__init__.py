"""The provisiond VM lab: a network namespace, libvirt without systemd, PXE-booting domains,
Redfish and IPMI BMCs, and provisiond serving the boots. Everything it starts it stops."""
