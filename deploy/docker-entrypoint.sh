#!/bin/sh
# Starts one podemu role (in a container, or anywhere: every address can be set). Agents
# advertise their container IP, so peers and the coordinator reach them whatever the service
# is scaled to. Every process presents the pod's secret, PODEMU_TOKEN.
#   coordinator: PODEMU_TOPOLOGY (e.g. v3-32) or PODEMU_HOSTS / PODEMU_CORES_PER_HOST /
#                PODEMU_HBM; PODEMU_LISTEN (default tcp://0.0.0.0:7460); PODEMU_HTTP_LISTEN
#                (HOST:PORT: metrics and dashboard, e.g. 0.0.0.0:9090; default none)
#   agent:       PODEMU_COORDINATOR (default tcp://coordinator:7460), PODEMU_BACKING
#                (none|host), PODEMU_HOST_INDEX (else the number ending the host name, as a
#                StatefulSet's pod-3 has; else any free index), PODEMU_LISTEN_HOST (default
#                0.0.0.0), PODEMU_DATA_PORT (7470), PODEMU_CONTROL_PORT (7471),
#                PODEMU_ADVERTISE_HOST (default: this host's first address)
#   anything else runs as a command (podemu status, podemu demo, ...).
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
	if [ -n "${PODEMU_HTTP_LISTEN:-}" ]; then
		set -- --http-listen "$PODEMU_HTTP_LISTEN" "$@"
	fi
	exec podemu-coordinator --listen "${PODEMU_LISTEN:-tcp://0.0.0.0:7460}" "$@"
	;;
agent)
	ip="${PODEMU_ADVERTISE_HOST:-$(hostname -i | awk '{print $1}')}"
	index="${PODEMU_HOST_INDEX:-}"
	if [ -z "$index" ]; then
		name="$(hostname)"
		case "${name##*-}" in
		'' | *[!0-9]*) ;;
		*) [ "$name" != "${name##*-}" ] && index="${name##*-}" ;;
		esac
	fi
	if [ -n "$index" ]; then
		set -- --host-index "$index" "$@"
	fi
	listen="${PODEMU_LISTEN_HOST:-0.0.0.0}"
	exec podemu-agent --coordinator "${PODEMU_COORDINATOR:-tcp://coordinator:7460}" \
		--listen "tcp://$listen:${PODEMU_DATA_PORT:-7470}" \
		--control-listen "tcp://$listen:${PODEMU_CONTROL_PORT:-7471}" \
		--advertise-host "$ip" --backing "${PODEMU_BACKING:-none}" "$@"
	;;
*)
	exec "$role" "$@"
	;;
esac
