#!/usr/bin/env bash
# Install what the VM lab needs on Debian 12 (run as root): QEMU, firmware, libvirt, iPXE,
# and into the Python environment the BMC emulators and libvirt bindings.
# Usage: vm-lab/install-deps.sh [PYTHON]   (default: .venv/bin/python if present, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  qemu-system-x86 qemu-utils ipxe ipxe-qemu ovmf          # VMs, PXE ROMs, UEFI firmware
  libvirt-daemon-system libvirt-clients libvirt-dev pkg-config gcc  # libvirtd, libvirt-python
  iproute2 util-linux procps bash                          # ip netns, unshare, timeout
  busybox-static cpio zstd debootstrap dpkg-dev            # images the lab boots
)
PIP_PACKAGES=("libvirt-python>=9" "sushy-tools>=1.0" "virtualbmc>=3.0" "sushy>=4.0" "pyghmi>=1.5")

if ! dpkg -s "${APT_PACKAGES[@]}" >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}"
fi

PY=${1:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
"$PY" -m pip install -q "${PIP_PACKAGES[@]}"

# libvirt re-probes QEMU on every call unless its qemu user can open /dev/kvm (LAB.md).
if [ -e /dev/kvm ]; then chgrp kvm /dev/kvm && chmod 0660 /dev/kvm; fi
echo "vm-lab dependencies ready ($PY)"
