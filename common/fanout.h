/* Runs one function for each of n items on its own thread and waits for all of them. */
#ifndef PODEMU_FANOUT_H
#define PODEMU_FANOUT_H

/*
 * Calls fn(i, arg) for i in [0, n) concurrently and returns when every call has returned. If a
 * thread cannot be created, that call runs on the calling thread instead, so every i runs
 * exactly once.
 */
void fanout_run(int n, void (*fn)(int i, void *arg), void *arg);

#endif
