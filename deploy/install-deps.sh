#!/usr/bin/env bash
# Installs what podemu needs to build and test on Debian 12, idempotently: packages already
# present are not touched and apt is only called when something is missing.
# Usage: install-deps.sh [--build]
set -euo pipefail

# --build: only what building needs (an image's build stage); else the tests' tools too.
packages=(
	gcc libc6-dev make cmake pkg-config
	libprotobuf-c-dev protobuf-c-compiler
	libnng-dev libevent-dev libcmocka-dev
	# HTTPS for the coordinator's dashboard on a TLS pod (libevent's OpenSSL layer)
	libssl-dev
)
if [ "${1:-}" != "--build" ]; then
	packages+=(
		# JSON checks in the CLI tests, network namespaces for multi-host tests, libFuzzer
		python3 iproute2 procps openssl clang libclang-rt-14-dev bsdutils
		# the Python package's tests
		python3-numpy python3-pytest python3-yaml
		# the metrics and dashboard test: a Prometheus server (and promtool), headless Chromium
		prometheus chromium
		# the image test: podman (chroot isolation, no daemon) and a Debian 12 base from debootstrap
		podman debootstrap
		# Open MPI, the reference bench/versus_mpi.sh measures podemu against (and its test)
		libopenmpi-dev openmpi-bin
	)
fi

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done

if [ "${#missing[@]}" -eq 0 ]; then
	echo "install-deps: all ${#packages[@]} packages are installed"
	exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
	sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
