#!/usr/bin/env bash
# libpodemu.so exports exactly the pe_* API: nothing internal (protobuf, RPC, arena, status,
# TLS, logging) is visible to a program that links it. Usage: exports.sh LIBPODEMU_SO
set -euo pipefail
symbols=$(nm -D --defined-only "$1" | awk '{print $3}')
others=$(grep -v '^pe_' <<<"$symbols" || true)
if [ -n "$others" ]; then
	echo "FAIL: libpodemu.so exports $(wc -l <<<"$others") symbols beyond pe_*:" >&2
	head -20 <<<"$others" >&2
	exit 1
fi
echo "libpodemu.so exports $(grep -c '^pe_' <<<"$symbols") symbols, all pe_*"
