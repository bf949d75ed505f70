#!/bin/sh
# Starts one podemu role in a container. Agents advertise their container IP, so peers and the
# coordinator reach them whatever the service is scaled to.
#   coordinator: PODEMU_TOPOLOGY (e.g. v3-32) or PODEMU_HOSTS / PODEMU_CORES_PER_HOST / PODEMU_HBM
#   agent:       PODEMU_COORDINATOR (default tcp://coordinator:7460), PODEMU_BACKING (none|host)
set -eu
role="${1:-coordinator}"
[ "$#" -gt 0 ] && shift
case "$role" in
coordinator)
	if [ -n "${PODEMU_TOPOLOGY:-}" ]; then
		set -- --topology "$PODEMU_TOPOLOGY" "$@"
	else
		set -- --hosts "${PODEMU_HOSTS:-4}" --cores-per-host "${PODEMU_CORES_PER_HOST:-2}" \
			--hbm "${PODEMU_HBM:-1G}" "$@"
	fi
	exec podemu-coordinator --listen tcp://0.0.0.0:7460 "$@"
	;;
agent)
	ip="${PODEMU_ADVERTISE_HOST:-$(hostname -i | awk '{print $1}')}"
	exec podemu-agent --coordinator "${PODEMU_COORDINATOR:-tcp://coordinator:7460}" \
		--listen tcp://0.0.0.0:7470 --control-listen tcp://0.0.0.0:7471 \
		--advertise-host "$ip" --backing "${PODEMU_BACKING:-none}" "$@"
	;;
*)
	exec "$role" "$@"
	;;
esac
