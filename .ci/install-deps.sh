#!/usr/bin/env bash
# Install every system and Python dependency of provisiond, its tests and its lab on a
# Debian 12 machine (run as root). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  # build and runtime
  python3-venv gcc pkg-config libvirt-dev zstd cpio curl wget iproute2 util-linux procps
  openssh-client openssl
  # images: kernels from Debian, debootstrap, busybox for the tiny image
  debootstrap busybox-static dpkg-dev
  # images: layers packed as compressed read-only file systems (mounted at boot)
  squashfs-tools erofs-utils
  # boot: iPXE binaries served over TFTP/HTTP
  ipxe
  # tests: real DHCP/TFTP/DNS clients; bwrap for the systemd unit's file system sandbox
  dnsutils isc-dhcp-client tftp-hpa atftp bubblewrap
  # tests: the zsh completion script
  zsh
  # tests: the agent's units run by a real systemd in namespaces (tests/systemd_sandbox.py)
  systemd
  # bench: peers measured in the same run, and the HTTP load generator
  tftpd-hpa nginx-light wrk
  # tests: the status page in a real headless browser (Selenium drives /usr/bin/chromedriver)
  chromium chromium-driver
  # tests: an OCI distribution registry and skopeo to push to it (image import from registries)
  docker-registry skopeo
  # hand-off (Ansible): the site repository served by git daemon, ansible-pull as on the nodes
  git ansible-core
  # lab: QEMU, firmware, libvirt, RA sender
  qemu-system-x86 qemu-utils ipxe-qemu ovmf libvirt-daemon-system libvirt-clients dnsmasq-base
  # Slurm hand-off: slurmctld and munged on the lab's server side, the client commands,
  # slurmd for `slurmd -C` (package scripts start no daemon where policy-rc.d forbids it)
  slurmctld slurmd slurm-client munge
  # state store: etcd (the shared store of several boot servers) and etcdctl for its tests
  etcd-server etcd-client
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[lab,dev]"
echo "dependencies ready: .venv/bin/provisiond"
