/*
 * What touching memory costs on this machine, for the heap's choices (agent/hbm.h): a page's
 * first write, a write after MADV_DONTNEED gave it back, a write after MADV_POPULATE_WRITE
 * committed it, and the same as huge pages (MADV_HUGEPAGE). Each in microseconds per 4 KiB.
 *
 *   podemu-bench-page-touch [MIB]    (default 256)
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Microseconds per page to write one byte of each page of [p, p + n). */
static double touch(volatile unsigned char *p, size_t n)
{
	double t0 = now_s();
	for (size_t i = 0; i < n; i += 4096)
		p[i] = 1;
	return (now_s() - t0) * 1e6 / (double)(n / 4096);
}

static void measure(const char *kind, size_t n, int advice)
{
	size_t huge = (size_t)2 << 20;
	unsigned char *m = mmap(NULL, n + huge, PROT_READ | PROT_WRITE,
	                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	unsigned char *p = (unsigned char *)(((size_t)m + huge - 1) / huge * huge);
	if (advice >= 0 && madvise(p, n, advice) != 0)
		printf("%s: madvise refused, small pages\n", kind);
	double first = touch(p, n);
	madvise(p, n, MADV_DONTNEED);
	double again = touch(p, n);
	madvise(p, n, MADV_DONTNEED);
	double populated = -1;
#ifdef MADV_POPULATE_WRITE
	if (madvise(p, n, MADV_POPULATE_WRITE) == 0)
		populated = touch(p, n);
#endif
	printf(
	    "%-11s first write %6.2f  after MADV_DONTNEED %6.2f  after MADV_POPULATE_WRITE %6.2f "
	    "us per 4 KiB\n",
	    kind, first, again, populated);
	munmap(m, n + huge);
}

int main(int argc, char **argv)
{
	long mib = argc > 1 ? atol(argv[1]) : 256;
	if (mib < 2) {
		fprintf(stderr, "usage: podemu-bench-page-touch [MIB >= 2]\n");
		return 2;
	}
	size_t n = (size_t)mib << 20;
	measure("small pages", n, -1);
#ifdef MADV_HUGEPAGE
	measure("huge pages", n, MADV_HUGEPAGE);
#endif
	return 0;
}
