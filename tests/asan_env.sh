# Sourced by the shell tests that run programs built without AddressSanitizer (Python, an
# out-of-tree example) against libpodemu.so: under the sanitizer build that library loads only
# after the ASan runtime, and those programs' own leaks are not the library's.
# asan_preload LIB: exports what such a program needs to load LIB (nothing for a plain build).
asan_preload() {
	local asan
	asan=$(ldd "$1" 2>/dev/null | awk '/libasan/ {print $3}')
	if [ -n "$asan" ]; then
		export LD_PRELOAD="$asan" ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
	fi
}
