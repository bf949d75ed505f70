#!/usr/bin/env bash
# Builds the image of deploy/Dockerfile with podman (chroot isolation: no daemon, no
# privileges beyond root's, works where no container can run) and checks what it holds. The
# debian:12 base is made with debootstrap when podman has none (no registry needed).
# Usage: deploy/test-image.sh [TAG]   (run as root; podman and debootstrap from install-deps)
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-podemu:test}"
for tool in podman debootstrap; do
	command -v "$tool" >/dev/null || { echo "test-image: $tool is not installed" >&2; exit 1; }
done
if ! podman image exists debian:12; then
	root=$(mktemp -d /tmp/podemu-debian12-XXXXXX)
	trap 'rm -rf "$root"' EXIT
	echo "test-image: making debian:12 with debootstrap"
	debootstrap --variant=minbase bookworm "$root" >"$root.log" 2>&1 ||
		{ tail -20 "$root.log" >&2; exit 1; }
	rm -f "$root.log"
	tar -C "$root" -c . | podman import - debian:12 >/dev/null
fi
echo "test-image: building $tag"
podman build --isolation chroot -f deploy/Dockerfile -t "$tag" . >/tmp/podemu-image-build.log 2>&1 ||
	{ tail -30 /tmp/podemu-image-build.log >&2; exit 1; }
# What the image holds: the daemons, the CLI, the library and the entrypoint, and the runtime
# libraries they load (checked in the image's own root, without running a container).
mount=$(podman image mount "$tag")
trap 'podman image unmount "$tag" >/dev/null 2>&1 || true; rm -rf "${root:-/nonexistent}"' EXIT
for f in usr/local/bin/podemu usr/local/bin/podemu-coordinator usr/local/bin/podemu-agent \
	usr/local/bin/podemu-entrypoint usr/local/include/podemu/podemu.h; do
	[ -e "$mount/$f" ] || { echo "test-image: the image has no /$f" >&2; exit 1; }
done
for f in podemu podemu-coordinator podemu-agent; do
	missing=$(chroot "$mount" ldd "/usr/local/bin/$f" | grep "not found" || true)
	[ -z "$missing" ] || { echo "test-image: /usr/local/bin/$f: $missing" >&2; exit 1; }
done
chroot "$mount" /usr/local/bin/podemu-coordinator --help >/dev/null ||
	{ echo "test-image: the coordinator does not run in the image's root" >&2; exit 1; }
echo "test-image: $tag builds from deploy/Dockerfile; its binaries and libraries are complete"
